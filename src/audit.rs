//! The audit behind `summarizer check`: invariants over the whole database that must hold
//! whatever crashed, restarted or raced. Operators run it after an incident; the
//! reliability tests and the chaos run end with it.
//!
//! Each invariant is one store query (`crate::store::Invariant`) that returns the
//! sessions breaking it, so a clean database costs a handful of scans and a broken one
//! says where to look. This module owns which invariants there are, what they mean, and
//! the report.

use serde::Serialize;

use crate::store::{Invariant as Query, Store, StoreError};

/// One invariant: its name in reports, what a breach means, the store query that lists
/// the breaches, and what an operator can run to fix it, where there is such a command.
struct Invariant {
    name: &'static str,
    description: &'static str,
    query: Query,
    remedy: Option<&'static str>,
}

const INVARIANTS: &[Invariant] = &[
    Invariant {
        name: "duplicated_message",
        description: "a message is both in the history and in the archive, or archived twice",
        query: Query::DuplicatedMessage,
        remedy: None,
    },
    Invariant {
        name: "several_summaries",
        description: "a session's history holds more than one summary",
        query: Query::SeveralSummaries,
        remedy: None,
    },
    Invariant {
        name: "misplaced_summary",
        description: "a summary is not before every message of its session but system \
                      and pinned ones (and a pinned message's tool-call partners)",
        query: Query::MisplacedSummary,
        remedy: None,
    },
    // The three tool-call invariants pair calls and results as the planner does (see their
    // queries in `store::postgres::invariants` and `store::sqlite::invariants`).
    Invariant {
        name: "separated_tool_result",
        description: "a tool result in the history answers a call that was archived",
        query: Query::SeparatedToolResult,
        remedy: None,
    },
    Invariant {
        name: "unpaired_tool_result",
        description: "a tool result in the history has no earlier call of its id, so the \
                      planner cannot keep it with its call (the call is missing, comes \
                      later, or is hidden in tool_calls that are not an array)",
        query: Query::UnpairedToolResult,
        remedy: None,
    },
    Invariant {
        name: "tool_calls_not_an_array",
        description: "tool_calls is not a JSON array (a double-encoded string, or another \
                      shape written before the tool_calls_is_array constraint)",
        query: Query::ToolCallsNotAnArray,
        remedy: None,
    },
    Invariant {
        name: "compaction_without_usage_event",
        description: "archived messages whose compaction has no summarization usage event",
        query: Query::CompactionWithoutUsageEvent,
        remedy: None,
    },
    Invariant {
        name: "usage_event_mismatch",
        description: "a summarization usage event whose figures differ from its archive",
        query: Query::UsageEventMismatch,
        remedy: None,
    },
    Invariant {
        name: "cleared_without_original",
        description: "a tool result a compaction cleared (cleared_by) has no original in \
                      that compaction's archive, and the archive was not pruned",
        query: Query::ClearedWithoutOriginal,
        remedy: None,
    },
    Invariant {
        name: "summary_without_compaction",
        description: "a history holds a summary but its session has no compaction",
        query: Query::SummaryWithoutCompaction,
        remedy: None,
    },
    Invariant {
        name: "text_not_utf8",
        description: "a message's text is not valid UTF-8 (SQLite, written before the \
                      write refused it): the row cannot be read, so its session fails \
                      every turn with store_error and is never compacted",
        query: Query::TextNotUtf8,
        remedy: Some(
            "rewrite the named row's text as UTF-8 or delete it, with SQL (`UPDATE messages \
             SET content = '...' WHERE seq = N`, or `DELETE FROM messages WHERE seq = N`); \
             the session compacts again from its next turn",
        ),
    },
    Invariant {
        name: "unweighed_blocks",
        description: "a message holds blocks the weighing rule charges (an image, thinking, \
                      reasoning) but its block_chars says they weigh nothing, so the \
                      session's size leaves them out",
        query: Query::UnweighedBlocks,
        remedy: Some(
            "run `summarizer repair --apply`: it weighs them by the rule (docs/protocol.md, \
             \"Weights\"), and the counters follow",
        ),
    },
    Invariant {
        name: "counters_drift",
        description: "a session's counters differ from its messages",
        query: Query::CountersDrift,
        remedy: Some(
            "run `summarizer repair` to see the counters recomputed from the messages, \
             `summarizer repair --apply` to write them",
        ),
    },
];

/// How many examples of each breach a report keeps.
const EXAMPLES: usize = 5;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub sessions: i64,
    pub messages: i64,
    pub archived_messages: i64,
    pub compactions: i64,
    pub breaches: Vec<Breach>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Breach {
    pub invariant: &'static str,
    pub description: &'static str,
    pub count: usize,
    /// `session_id: detail`, the first few.
    pub examples: Vec<String>,
    /// A command that fixes this breach, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<&'static str>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.breaches.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "checked {} sessions, {} messages, {} archived messages, {} compactions",
            self.sessions, self.messages, self.archived_messages, self.compactions
        )?;
        for invariant in INVARIANTS {
            match self.breaches.iter().find(|b| b.invariant == invariant.name) {
                None => writeln!(f, "  ok      {}", invariant.name)?,
                Some(breach) => {
                    writeln!(
                        f,
                        "  BROKEN  {} ({}): {}",
                        breach.invariant, breach.count, breach.description
                    )?;
                    for example in &breach.examples {
                        writeln!(f, "          {example}")?;
                    }
                    if let Some(remedy) = breach.remedy {
                        writeln!(f, "          fix: {remedy}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Runs every invariant over the whole database.
///
/// # Errors
/// When the database is unreachable or a query fails.
pub async fn run(store: &dyn Store) -> Result<Report, StoreError> {
    let totals = store.check_totals().await?;
    let mut breaches = Vec::new();
    for invariant in INVARIANTS {
        let found = store.breaches(invariant.query).await?;
        if found.is_empty() {
            continue;
        }
        breaches.push(Breach {
            invariant: invariant.name,
            description: invariant.description,
            count: found.len(),
            examples: found
                .iter()
                .take(EXAMPLES)
                .map(|f| format!("{}: {}", f.session_id, f.detail))
                .collect(),
            remedy: invariant.remedy,
        });
    }
    Ok(Report {
        sessions: totals.sessions,
        messages: totals.messages,
        archived_messages: totals.archived_messages,
        compactions: totals.compactions,
        breaches,
    })
}

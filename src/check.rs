//! `summarizer check`: invariants over the whole database that must hold whatever
//! crashed, restarted or raced. Operators run it after an incident; the reliability tests
//! and the chaos run end with it.
//!
//! Each invariant is one query that returns the sessions breaking it, so a clean
//! database costs a handful of scans and a broken one says where to look.

use serde::Serialize;
use sqlx::Row;

use crate::store::{PgStore, StoreError};

/// One invariant, and the query that lists `(session_id, detail)` for each breach.
struct Invariant {
    name: &'static str,
    description: &'static str,
    sql: &'static str,
}

const INVARIANTS: &[Invariant] = &[
    Invariant {
        name: "duplicated_message",
        description: "a message is both in the history and in the archive, or archived twice",
        sql: "SELECT session_id, 'seq ' || seq FROM (
                  SELECT session_id, seq FROM messages WHERE NOT is_summary
                  UNION ALL
                  SELECT session_id, seq FROM archived_messages WHERE NOT is_summary
              ) AS everything
              GROUP BY session_id, seq HAVING count(*) > 1",
    },
    Invariant {
        name: "several_summaries",
        description: "a session's history holds more than one summary",
        sql: "SELECT session_id, count(*) || ' summaries' FROM messages WHERE is_summary
              GROUP BY session_id HAVING count(*) > 1",
    },
    Invariant {
        name: "misplaced_summary",
        description: "a summary is not before every non-system message of its session",
        sql: "SELECT s.session_id, 'summary seq ' || s.seq || ', message seq ' || min(m.seq)
              FROM messages s
              JOIN messages m ON m.session_id = s.session_id AND m.seq < s.seq
                  AND m.role <> 'system' AND NOT m.is_summary
              WHERE s.is_summary
              GROUP BY s.session_id, s.seq",
    },
    // The three tool-call invariants pair calls and results as the planner does: a result
    // answers the nearest earlier call of its id, and `tool_calls_array` reads the calls
    // of a stored value as `Message::calls` does (a double-encoded array included).
    Invariant {
        name: "separated_tool_result",
        description: "a tool result in the history answers a call that was archived",
        sql: "SELECT t.session_id, 'tool_call_id ' || t.tool_call_id
              FROM messages t
              WHERE t.tool_call_id IS NOT NULL
                AND NOT EXISTS (
                    SELECT 1 FROM messages c, jsonb_array_elements(tool_calls_array(c.tool_calls)) AS call
                    WHERE c.session_id = t.session_id AND c.seq < t.seq
                      AND c.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)
                AND EXISTS (
                    SELECT 1 FROM archived_messages a, jsonb_array_elements(tool_calls_array(a.tool_calls)) AS call
                    WHERE a.session_id = t.session_id
                      AND a.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)",
    },
    Invariant {
        name: "unpaired_tool_result",
        description: "a tool result in the history has no earlier call of its id, so the \
                      planner cannot keep it with its call (the call is missing, comes \
                      later, or is hidden in tool_calls that are not an array)",
        sql: "SELECT t.session_id, 'tool_call_id ' || t.tool_call_id
              FROM messages t
              WHERE t.tool_call_id IS NOT NULL
                AND NOT EXISTS (
                    SELECT 1 FROM messages c, jsonb_array_elements(tool_calls_array(c.tool_calls)) AS call
                    WHERE c.session_id = t.session_id AND c.seq < t.seq
                      AND c.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)
                AND NOT EXISTS (
                    SELECT 1 FROM archived_messages a, jsonb_array_elements(tool_calls_array(a.tool_calls)) AS call
                    WHERE a.session_id = t.session_id
                      AND a.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)",
    },
    Invariant {
        name: "tool_calls_not_an_array",
        description: "tool_calls is not a JSON array (a double-encoded string, or another \
                      shape written before the tool_calls_is_array constraint)",
        sql: "SELECT session_id, 'seq ' || seq || ': a JSON ' || jsonb_typeof(tool_calls)
              FROM messages
              WHERE jsonb_typeof(tool_calls) NOT IN ('array', 'null')",
    },
    Invariant {
        name: "compaction_without_usage_event",
        description: "archived messages whose compaction has no summarization usage event",
        sql: "SELECT DISTINCT a.session_id, 'compaction ' || a.compaction_id
              FROM archived_messages a
              LEFT JOIN usage_events u ON u.id = a.compaction_id
                  AND u.metadata @> '{\"summarization\": true}'
              WHERE u.id IS NULL",
    },
    Invariant {
        name: "usage_event_mismatch",
        description: "a summarization usage event whose figures differ from its archive",
        sql: "SELECT u.session_id, 'compaction ' || u.id || ': metadata says '
                     || (u.metadata ->> 'messages_removed') || ' msgs/'
                     || (u.metadata ->> 'chars_removed') || ' chars, archive holds '
                     || count(a.seq) || '/' || coalesce(sum(a.chars), 0)
              FROM usage_events u
              LEFT JOIN archived_messages a ON a.compaction_id = u.id
              WHERE u.metadata @> '{\"summarization\": true}'
                AND NOT u.metadata ? 'restored_at'
                AND NOT u.metadata ? 'archive_pruned_at'
              GROUP BY u.id
              HAVING count(a.seq) <> (u.metadata ->> 'messages_removed')::bigint
                  OR coalesce(sum(a.chars), 0) <> (u.metadata ->> 'chars_removed')::bigint",
    },
    Invariant {
        name: "summary_without_compaction",
        description: "a history holds a summary but its session has no compaction",
        sql: "SELECT m.session_id, 'summary seq ' || m.seq FROM messages m
              WHERE m.is_summary AND NOT EXISTS (
                  SELECT 1 FROM usage_events u WHERE u.session_id = m.session_id
                      AND u.metadata @> '{\"summarization\": true}'
                      AND NOT u.metadata ? 'restored_at')",
    },
    Invariant {
        name: "counters_drift",
        description: "a session's counters differ from its messages",
        sql: "SELECT s.session_id, 'counters ' || s.total_chars || '/' || s.message_count || '/'
                     || s.human_turns || ', messages ' || coalesce(m.chars, 0) || '/'
                     || coalesce(m.n, 0) || '/' || coalesce(m.turns, 0)
              FROM sessions s
              LEFT JOIN (
                  SELECT session_id, sum(chars) AS chars, count(*) AS n,
                         count(*) FILTER (WHERE role = 'user' AND NOT is_summary) AS turns
                  FROM messages GROUP BY session_id
              ) AS m ON m.session_id = s.session_id
              WHERE s.total_chars <> coalesce(m.chars, 0)
                 OR s.message_count <> coalesce(m.n, 0)
                 OR s.human_turns <> coalesce(m.turns, 0)",
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
pub async fn run(store: &PgStore) -> Result<Report, StoreError> {
    let pool = store.pool();
    let totals = sqlx::query(
        "SELECT (SELECT count(*) FROM sessions) AS sessions,
                (SELECT count(*) FROM messages) AS messages,
                (SELECT count(*) FROM archived_messages) AS archived,
                (SELECT count(*) FROM usage_events
                 WHERE metadata @> '{\"summarization\": true}') AS compactions",
    )
    .fetch_one(pool)
    .await?;
    let mut breaches = Vec::new();
    for invariant in INVARIANTS {
        let rows = sqlx::query(invariant.sql).fetch_all(pool).await?;
        if rows.is_empty() {
            continue;
        }
        let examples = rows
            .iter()
            .take(EXAMPLES)
            .map(|r| {
                let session: String = r.try_get(0)?;
                let detail: Option<String> = r.try_get(1)?;
                Ok(format!("{session}: {}", detail.unwrap_or_default()))
            })
            .collect::<Result<_, sqlx::Error>>()?;
        breaches.push(Breach {
            invariant: invariant.name,
            description: invariant.description,
            count: rows.len(),
            examples,
        });
    }
    Ok(Report {
        sessions: totals.try_get("sessions")?,
        messages: totals.try_get("messages")?,
        archived_messages: totals.try_get("archived")?,
        compactions: totals.try_get("compactions")?,
        breaches,
    })
}

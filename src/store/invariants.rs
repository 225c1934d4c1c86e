//! Invariants over the whole database ([`Invariants`]): `summarizer check` and
//! `summarizer repair`.

use std::fmt;

use async_trait::async_trait;

use super::StoreError;

#[async_trait]
pub trait Invariants: Send + Sync {
    /// How many sessions, messages, archived messages and compactions there are.
    async fn check_totals(&self) -> Result<Totals, StoreError>;

    /// Every breach of `invariant`; empty when it holds.
    async fn breaches(&self, invariant: Invariant) -> Result<Vec<Finding>, StoreError>;

    /// Sessions whose counters differ from their messages, by session id. Writes nothing.
    async fn counter_drift(&self) -> Result<Vec<CounterDrift>, StoreError>;

    /// Recomputes drifted counters from the messages and writes them; returns what it
    /// changed (stored before, actual after).
    async fn repair_counters(&self) -> Result<Vec<CounterDrift>, StoreError>;

    /// Weighs by the rule the blocks of every message [`Invariant::UnweighedBlocks`]
    /// finds (the counters follow, by their triggers); returns how many rows it weighed.
    async fn reweigh_blocks(&self) -> Result<u64, StoreError>;
}

/// An invariant the whole database must keep whatever crashed, restarted or raced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    /// A message is both in the history and in the archive, or archived twice.
    DuplicatedMessage,
    /// A session's history holds more than one summary.
    SeveralSummaries,
    /// A summary is not before every non-system message of its session.
    MisplacedSummary,
    /// A tool result in the history answers a call that was archived.
    SeparatedToolResult,
    /// A tool result in the history has no earlier call of its id, so the planner cannot
    /// keep it with its call.
    UnpairedToolResult,
    /// `tool_calls` is not a JSON array (double-encoded, or another shape written before
    /// the `tool_calls_is_array` constraint).
    ToolCallsNotAnArray,
    /// Archived messages whose compaction has no summarization usage event.
    CompactionWithoutUsageEvent,
    /// A summarization usage event whose figures differ from its archive.
    UsageEventMismatch,
    /// A tool result a compaction cleared whose original is not in that compaction's
    /// archive (and the archive was not pruned).
    ClearedWithoutOriginal,
    /// A history holds a summary but its session has no compaction.
    SummaryWithoutCompaction,
    /// A session's counters differ from its messages (`Store::counter_drift`).
    CountersDrift,
    /// A message's text is not valid UTF-8: SQLite stores any bytes cast to TEXT, and
    /// such a row cannot be read as text, so its session is never compacted.
    TextNotUtf8,
    /// A message holds blocks the weighing rule charges (an image, thinking, reasoning)
    /// but its `block_chars` says they weigh nothing: a writer set 0, so thresholds do
    /// not see them (`Invariants::reweigh_blocks` weighs them).
    UnweighedBlocks,
}

/// One breach of an invariant: where, and what an operator would look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub session_id: String,
    pub detail: String,
}

/// A breach query's row: the session (column 0) and the detail (column 1, NULL read as
/// empty), whatever the columns are called.
impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for Finding
where
    usize: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            session_id: row.try_get(0)?,
            detail: row.try_get::<Option<String>, _>(1)?.unwrap_or_default(),
        })
    }
}

/// The sizes a check report starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Totals {
    pub sessions: i64,
    pub messages: i64,
    pub archived_messages: i64,
    pub compactions: i64,
}

/// A session's counters: stored in `sessions`, or as its messages give them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionCounts {
    pub total_chars: i64,
    pub message_count: i64,
    pub human_turns: i64,
}

impl fmt::Display for SessionCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.total_chars, self.message_count, self.human_turns
        )
    }
}

/// A session whose stored counters differ from its messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterDrift {
    pub session_id: String,
    /// `None`: messages with no `sessions` row at all.
    pub stored: Option<SessionCounts>,
    pub actual: SessionCounts,
}

impl fmt::Display for CounterDrift {
    /// `session: stored -> actual`, counters as `chars/messages/human turns`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.stored {
            Some(stored) => write!(f, "{}: {stored} -> {}", self.session_id, self.actual),
            None => write!(f, "{}: no row -> {}", self.session_id, self.actual),
        }
    }
}

pub(super) fn drift_finding(drift: &CounterDrift) -> Finding {
    let stored = drift
        .stored
        .map_or_else(|| "none".to_owned(), |s| s.to_string());
    Finding {
        session_id: drift.session_id.clone(),
        detail: format!("counters {stored}, messages {}", drift.actual),
    }
}

/// A row of [`COUNTER_DRIFT`] or [`REPAIR_COUNTERS`] (and of their SQLite forms): the
/// stored counters (NULL without a `sessions` row) and those the messages give.
#[derive(sqlx::FromRow)]
pub(super) struct DriftRow {
    session_id: String,
    stored_chars: Option<i64>,
    stored_count: Option<i64>,
    stored_turns: Option<i64>,
    chars: i64,
    count: i64,
    turns: i64,
}

impl From<DriftRow> for CounterDrift {
    fn from(row: DriftRow) -> Self {
        let stored = match (row.stored_chars, row.stored_count, row.stored_turns) {
            (Some(total_chars), Some(message_count), Some(human_turns)) => Some(SessionCounts {
                total_chars,
                message_count,
                human_turns,
            }),
            _ => None,
        };
        Self {
            session_id: row.session_id,
            stored,
            actual: SessionCounts {
                total_chars: row.chars,
                message_count: row.count,
                human_turns: row.turns,
            },
        }
    }
}

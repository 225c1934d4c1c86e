//! The no-op path: a session's counters and settings in one primary-key read
//! ([`Counts`]), and the rows both backends decode them from; and the idle schedule the
//! counters' trigger keeps ([`Counts::claim_idle`]).

use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;
use super::settings::SettingsRow;
use crate::outcome::Reason;
use crate::overrides::SessionSettings;

#[async_trait]
pub trait Counts: Send + Sync {
    /// The session's counters and settings, in one primary-key read; `None` for a session
    /// with no row.
    async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError>;

    /// [`Counts::counters`](super::Counts::counters) of several sessions in one query, by session id; sessions
    /// with no row are left out.
    async fn counters_of(
        &self,
        session_ids: &[&str],
    ) -> Result<Vec<(String, Counters)>, StoreError>;

    /// Takes up to `limit` sessions into which no message was inserted for `idle_for`
    /// (by `sessions.idle_since`, the longest idle first) out of the idle schedule, and
    /// returns their ids: each idle period is claimed once across the fleet, and the
    /// next message the agent inserts starts another. When the schedule's oldest entry is
    /// idle for longer than `give_up_after`, takes up to a thousand such entries out
    /// instead, returning none (`Claimed::dropped` says how many). Reads the schedule's
    /// first entry alone when nothing is due, never waits for a row an agent's statement
    /// holds (skips it: its write starts a new period anyway), and writes only the rows
    /// it takes.
    async fn claim_idle(
        &self,
        idle_for: Duration,
        give_up_after: Duration,
        limit: i64,
    ) -> Result<Claimed, StoreError>;
}

/// What [`Counts::claim_idle`] took out of the idle schedule.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Claimed {
    /// The sessions to compact, idle longest first.
    pub sessions: Vec<String>,
    /// Sessions idle too long to be worth it, left as they are.
    pub dropped: u64,
}

impl Claimed {
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.dropped == 0
    }
}

/// How many stale entries one statement takes out of the idle schedule.
pub(super) const DROP_BATCH: i64 = 1000;

/// A session's counters, maintained by triggers on `messages`, and its settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Counters {
    pub total_chars: i64,
    pub message_count: i64,
    pub human_turns: i64,
    /// An LLM failure put the session in backoff, and it has not run out.
    pub backing_off: bool,
    /// The planner refused this very history before (`no_safe_boundary` or
    /// `nothing_to_compact`): same total chars and message count as then. It holds only
    /// for the keep it was planned with: see [`Counters::remembered_skip_for`].
    pub remembered_skip: Option<Reason>,
    /// The compaction in force (`sessions.last_compaction_id`), sent in every reply.
    pub last_compaction_id: Option<i64>,
    /// The `keep_chars` the remembered skip was planned with.
    pub skip_at_keep: Option<i64>,
    /// The chars per token measured at the session's last compaction; `None` before it.
    pub chars_per_token: Option<f64>,
    /// The largest tool output the session may hold that a compaction could evict
    /// (`sessions.largest_output_chars`): exact after a compaction, an upper bound between
    /// them.
    pub largest_output_chars: i64,
    /// The session's row of `session_settings`; all `None` without one.
    pub settings: SessionSettings,
}

impl Counters {
    /// The remembered skip, if it was planned with `keep_chars`: both reasons depend on
    /// the keep (it places the cut), and a request or the session's settings may ask
    /// for another one than the last event did.
    pub fn remembered_skip_for(&self, keep_chars: i64) -> Option<Reason> {
        self.remembered_skip
            .filter(|_| self.skip_at_keep == Some(keep_chars))
    }
}

/// The reasons a skip is remembered for: both depend on the history alone, so they hold
/// until it changes. (Threshold and turn counts are read from the counters anyway.)
pub(super) fn rememberable(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NoSafeBoundary | Reason::NothingToCompact | Reason::WithinKeep
    )
}

/// A counters query's row, as both backends select it (integers as 64-bit), so that one
/// decoding serves both: see `counters.rs` in either.
#[derive(sqlx::FromRow)]
pub(super) struct CountersRow {
    total_chars: i64,
    message_count: i64,
    human_turns: i64,
    backing_off: bool,
    /// Already NULL unless the counters are still those the skip was remembered at.
    skip_reason: Option<String>,
    skip_at_keep: Option<i64>,
    last_compaction_id: Option<i64>,
    chars_per_token: Option<f64>,
    largest_output_chars: i64,
    #[sqlx(flatten)]
    settings: SettingsRow,
}

impl From<CountersRow> for Counters {
    fn from(row: CountersRow) -> Self {
        Self {
            total_chars: row.total_chars,
            message_count: row.message_count,
            human_turns: row.human_turns,
            backing_off: row.backing_off,
            remembered_skip: row.skip_reason.as_deref().and_then(remembered),
            last_compaction_id: row.last_compaction_id,
            skip_at_keep: row.skip_at_keep,
            chars_per_token: row.chars_per_token,
            largest_output_chars: row.largest_output_chars,
            settings: row.settings.into(),
        }
    }
}

/// [`CountersRow`] with the session it belongs to, for [`Counts::counters_of`](super::Counts::counters_of).
#[derive(sqlx::FromRow)]
pub(super) struct SessionCountersRow {
    pub session_id: String,
    #[sqlx(flatten)]
    pub counters: CountersRow,
}

/// A `sessions.skip_reason` read back; an unknown one (written by a newer worker) is
/// ignored, so the session is planned as usual.
pub(super) fn remembered(reason: &str) -> Option<Reason> {
    [
        Reason::NoSafeBoundary,
        Reason::NothingToCompact,
        Reason::WithinKeep,
    ]
    .into_iter()
    .find(|r| r.as_str() == reason)
}

//! What both backends share: the records the worker, the CLI and `/stats` exchange with
//! a store, the errors a store returns, and the helpers both backends read their rows
//! with. Nothing here names a database; `postgres/` and `sqlite/` each say how their
//! dialect writes and reads these.
//!
//! One section per concern, in the order of the backends' files of the same names.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use summarizer_client::Recalled;

use crate::compaction::Loaded;
use crate::message::{Message, Role};
use crate::outcome::Reason;
use crate::overrides::{InvalidSetting, SessionSettings};

// Errors, counters, the lease and the commit
// ------------------------------------------

/// The database could not be reached, or a statement failed. Cheap to clone, so one
/// failed batch can be reported to every event in it.
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(Arc<sqlx::Error>);

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self(Arc::new(e))
    }
}

impl StoreError {
    /// The statement ran but a row it returned could not be decoded (text that is not
    /// UTF-8 in a SQLite file written before the write refused it): the database is up,
    /// and the same rows will fail the same way until an operator fixes them.
    pub fn is_undecodable_row(&self) -> bool {
        matches!(
            *self.0,
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)
        )
    }
}

/// Why a commit wrote nothing. The session is unchanged in every case.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Another worker took the lease over (ours had expired): it owns the session now.
    #[error("the session lease is no longer ours")]
    LeaseLost,
    /// The planned prefix changed during the LLM call (a message in it was deleted,
    /// edited, even to text of the same length, or inserted with an old seq).
    #[error("the planned prefix changed during summarization")]
    PrefixChanged,
    /// An agent's statement holds a row the commit would change (an edit, a pin, a
    /// delete in progress): the commit gives way rather than wait for it, since that
    /// statement waits for the session's row the commit holds (docs/protocol.md,
    /// "Concurrent writes").
    #[error("an agent is writing a message the compaction would change")]
    RowBusy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CommitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

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
    matches!(reason, Reason::NoSafeBoundary | Reason::NothingToCompact)
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
            settings: row.settings.into(),
        }
    }
}

/// [`CountersRow`] with the session it belongs to, for [`Store::counters_of`](super::Store::counters_of).
#[derive(sqlx::FromRow)]
pub(super) struct SessionCountersRow {
    pub session_id: String,
    #[sqlx(flatten)]
    pub counters: CountersRow,
}

/// A session's `session_settings` columns under the `settings_*` names both backends
/// select them as (NULLs without a row).
#[derive(sqlx::FromRow)]
pub(super) struct SettingsRow {
    settings_enabled: Option<bool>,
    settings_threshold_chars: Option<i64>,
    settings_keep_chars: Option<i64>,
    settings_model: Option<String>,
    settings_tool_output_clearing: Option<bool>,
    settings_tool_output_keep: Option<i64>,
    settings_threshold_tokens: Option<i64>,
}

impl From<SettingsRow> for SessionSettings {
    fn from(row: SettingsRow) -> Self {
        Self {
            enabled: row.settings_enabled,
            threshold_chars: row.settings_threshold_chars,
            keep_chars: row.settings_keep_chars,
            model: row.settings_model,
            tool_output_clearing: row.settings_tool_output_clearing,
            tool_output_keep: row.settings_tool_output_keep,
            threshold_tokens: row.settings_threshold_tokens,
        }
    }
}

/// A `messages` row as both backends select it: `seq, role, content` (NULL read as
/// empty), `tool_calls` (JSON), `tool_call_id, is_summary, chars` (64-bit), `pinned`.
#[derive(sqlx::FromRow)]
pub(super) struct MessageRow {
    seq: i64,
    role: String,
    content: String,
    tool_calls: Option<sqlx::types::Json<serde_json::Value>>,
    tool_call_id: Option<String>,
    is_summary: bool,
    chars: i64,
    pinned: bool,
}

impl TryFrom<MessageRow> for Message {
    type Error = sqlx::Error;

    /// Fails on a role this worker does not know (the schema's CHECK allows none).
    fn try_from(row: MessageRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            seq: row.seq,
            role: Role::from_str(&row.role).map_err(|e| sqlx::Error::Decode(e.into()))?,
            content: row.content,
            tool_calls: row.tool_calls.map(|json| json.0),
            tool_call_id: row.tool_call_id,
            is_summary: row.is_summary,
            chars: row.chars,
            pinned: row.pinned,
        })
    }
}

/// A [`MessageRow`] with the fingerprint the backend computed at load (`fingerprint`).
#[derive(sqlx::FromRow)]
pub(super) struct LoadedRow {
    #[sqlx(flatten)]
    message: MessageRow,
    fingerprint: String,
    cleared: bool,
}

/// The history from its rows, in `seq` order.
pub(super) fn loaded_from_rows(rows: Vec<LoadedRow>) -> Result<Loaded, sqlx::Error> {
    let mut loaded = Loaded {
        messages: Vec::with_capacity(rows.len()),
        fingerprints: Vec::with_capacity(rows.len()),
        cleared: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        loaded.messages.push(row.message.try_into()?);
        loaded.fingerprints.push(row.fingerprint);
        loaded.cleared.push(row.cleared);
    }
    Ok(loaded)
}

/// What a recall asks of a session's archive (`crate::recall` makes it from a request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecallQuery {
    /// The archived messages holding any of `terms` (case-insensitive substrings, each of
    /// 3 chars or more), at most `limit`, best first.
    Search { terms: Vec<String>, limit: usize },
    /// The archived messages of these seqs, in seq order.
    Seqs(Vec<i64>),
}

/// A recalled row as both backends select it.
#[derive(sqlx::FromRow)]
pub(super) struct RecalledRow {
    pub(super) seq: i64,
    role: String,
    tool_call_id: Option<String>,
    content: Option<String>,
    truncated: bool,
    compaction_id: i64,
    archived_at: String,
    tool_name: Option<String>,
}

impl From<RecalledRow> for Recalled {
    fn from(row: RecalledRow) -> Self {
        Self {
            seq: row.seq,
            role: row.role,
            tool_name: row.tool_name,
            tool_call_id: row.tool_call_id,
            content: row.content.unwrap_or_default(),
            truncated: row.truncated,
            compaction_id: row.compaction_id,
            archived_at: row.archived_at,
        }
    }
}

/// A compaction written by [`Store::commit`](crate::store::Store::commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The usage event's id, which is also the archive's `compaction_id`.
    pub compaction_id: i64,
    /// The session had a pending summary, now dropped: its LLM call was wasted.
    pub superseded: bool,
}

/// Whether `error` means the database could not be reached, or a SQLite file stayed
/// locked (worth waiting for), as opposed to a statement that failed.
pub fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        // A connection dropped during the handshake reads as a protocol error.
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        // SQLite: the file stayed locked (SQLITE_BUSY, SQLITE_LOCKED and their extended
        // codes) past the busy timeout.
        sqlx::Error::Database(e) if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
            e.code()
                .and_then(|code| code.parse::<i32>().ok())
                .is_some_and(|code| matches!(code & 0xff, 5 | 6))
        }
        // cannot_connect_now (starting up or shutting down), and connection exceptions.
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code == "57P03" || code.starts_with("08")),
        _ => false,
    }
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A `sessions.skip_reason` read back; an unknown one (written by a newer worker) is
/// ignored, so the session is planned as usual.
pub(super) fn remembered(reason: &str) -> Option<Reason> {
    [Reason::NoSafeBoundary, Reason::NothingToCompact]
        .into_iter()
        .find(|r| r.as_str() == reason)
}

// Settings
// --------

/// Why an edit of a session's settings wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The edit is wrong (an unknown key, a bad value, keep not below the threshold).
    #[error("{0}")]
    Invalid(#[from] InvalidSetting),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for SettingsError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

// Pending summaries
// -----------------

/// What the turn that crossed the threshold found: see `apply_pending_summary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// No pending summary: compact as usual.
    None,
    /// The session's lease is held (a compaction or a precompute in flight).
    Busy,
    /// A pending summary was dropped, for this reason; compact as usual.
    Discarded(Discard),
    /// The pending summary was written.
    Compacted {
        compaction_id: i64,
        messages_removed: i64,
        chars_removed: i64,
        messages_kept: i64,
        summary_chars: i64,
    },
}

/// Why a pending summary was dropped: the `reason` label of
/// `summarizer_precomputes_discarded_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// Older than `PRECOMPUTE_TTL_MS`.
    Expired,
    /// Planned with other limits, or another session model, than the turn's.
    SettingsChanged,
    /// A planned row was edited, deleted, or a row was added before the cut; or the
    /// message at the cut is no longer a human turn.
    PrefixChanged,
    /// A tool result appended after the plan answers a call in the planned prefix:
    /// applying it would archive the call and keep its result.
    PairingChanged,
    /// What would remain is still over the threshold: the session grew by more than the
    /// band since the plan.
    Outgrown,
    /// Overwritten, or deleted by a compaction that did not use it.
    Superseded,
}

impl Discard {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::SettingsChanged => "settings_changed",
            Self::PrefixChanged => "prefix_changed",
            Self::PairingChanged => "pairing_changed",
            Self::Outgrown => "outgrown",
            Self::Superseded => "superseded",
        }
    }
}

/// What [`Store::save_pending`](crate::store::Store::save_pending) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Saved {
    /// Written: the lease was still ours.
    pub saved: bool,
    /// Other sessions' pending summaries dropped for being older than the TTL.
    pub expired: i64,
    /// The session had a pending summary, which this one replaced.
    pub replaced: bool,
}

// Restore
// -------

/// Why a restore wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("no session {0:?}")]
    UnknownSession(String),
    #[error("nothing to restore: no archived compaction{}", .0.map(|id| format!(" {id} or later")).unwrap_or_default())]
    NothingToRestore(Option<i64>),
    /// The summary a compaction wrote is not where it left it (edited or deleted by hand).
    #[error("compaction {0}: its summary is no longer in the history; restore it by hand")]
    SummaryMissing(i64),
    /// An agent's statement holds a row the restore would change (Postgres): the restore
    /// gives way rather than wait for it (docs/protocol.md, "Concurrent writes").
    #[error("an agent is writing to the session; nothing was restored, try again")]
    Busy,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for RestoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// What a restore put back, and what it left archived.
#[derive(Clone, Debug, Serialize)]
pub struct Restored {
    /// Newest first, the order they were undone in.
    pub compactions: Vec<i64>,
    pub messages_restored: i64,
    /// Cleared originals a restore does not write back, oldest first per compaction: they
    /// stay archived (recall reaches them), and the row keeps what the agent made of it.
    pub not_restored: Vec<NotRestored>,
}

/// A cleared tool result's original that a restore left archived, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotRestored {
    pub compaction_id: i64,
    pub seq: i64,
    pub reason: NotRestoredReason,
}

/// Why a cleared original stays archived through a restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotRestoredReason {
    /// Its row was deleted since it was cleared (the agent removed the exchange).
    Deleted,
    /// Its row's text is no longer the placeholder: the agent's edit wins.
    Edited,
}

impl NotRestoredReason {
    /// The reason as [`crate::store::sql::UNRESTORABLE_CLEARED`] names it.
    pub fn from_sql(why: &str) -> Self {
        if why == "deleted" {
            Self::Deleted
        } else {
            Self::Edited
        }
    }

    /// What the CLI says of a row left archived for this reason.
    pub fn explain(self) -> &'static str {
        match self {
            Self::Deleted => "its row was deleted since it was cleared",
            Self::Edited => "its row was edited since it was cleared; the edit stays",
        }
    }
}

/// A session as an operator sees it.
#[derive(Clone, Debug, Serialize)]
pub struct SessionView {
    pub session_id: String,
    pub total_chars: i64,
    pub message_count: i64,
    pub human_turns: i64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<String>,
    pub failures: i64,
    pub retry_at: Option<String>,
    /// Its row of `session_settings` (`null` fields inherit the configuration).
    pub settings: SessionSettings,
    /// The newest compactions first: `(id, at, messages_removed, chars_removed, restored)`.
    pub compactions: Vec<CompactionView>,
}

/// A session's row as [`SessionView`] shows it (integers as 64-bit, instants as RFC 3339
/// text), as both backends select it.
#[derive(sqlx::FromRow)]
pub(super) struct SessionRow {
    total_chars: i64,
    message_count: i64,
    human_turns: i64,
    lease_owner: Option<String>,
    lease_expires_at: Option<String>,
    failures: i64,
    retry_at: Option<String>,
    #[sqlx(flatten)]
    settings: SettingsRow,
}

impl SessionView {
    pub(super) fn new(session_id: &str, row: SessionRow, compactions: Vec<CompactionView>) -> Self {
        Self {
            session_id: session_id.to_owned(),
            total_chars: row.total_chars,
            message_count: row.message_count,
            human_turns: row.human_turns,
            lease_owner: row.lease_owner,
            lease_expires_at: row.lease_expires_at,
            failures: row.failures,
            retry_at: row.retry_at,
            settings: row.settings.into(),
            compactions,
        }
    }
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct CompactionView {
    pub id: i64,
    pub at: String,
    pub model: String,
    pub messages_removed: i64,
    pub chars_removed: i64,
    pub restored: bool,
}

/// What a prune removed (or, in a dry run, would remove).
#[derive(Clone, Debug, Serialize)]
pub struct Pruned {
    pub compactions: i64,
    pub archived_messages: i64,
    pub dry_run: bool,
}

// Stats
// -----

/// `{"summary": {...}, "daily": [...]}`: the body of `GET /stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub summary: Stats,
    /// The last `days` days that saw a compaction or a failure, oldest first.
    pub daily: Vec<Day>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Compactions in force (restored ones no longer count).
    pub total_summarizations: i64,
    pub total_chars_compacted: i64,
    pub total_messages_compacted: i64,
    /// The tokenizer's count (`o200k_base`) of what the compactions in force removed;
    /// compactions written before token figures existed count as zero.
    pub total_tokens_compacted: i64,
    /// Tokens of every summarization call, restored ones included.
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub average_chars_removed: Option<f64>,
    /// Upper bounds of the histogram buckets (a factor of sqrt 2 wide) holding the
    /// median and the 95th percentile of compaction durations.
    pub p50_duration_ms: Option<f64>,
    pub p95_duration_ms: Option<f64>,
    /// `llm_error` and `conflict`, as the database saw them.
    pub failures_by_reason: BTreeMap<String, i64>,
    /// RFC 3339, UTC; `None` before the first summarization.
    pub last_summarization_at: Option<String>,
    /// The mean, over summarizations whose removed part had identifiers, of the share of
    /// them the summary kept (`facts_kept / facts_total`); restored ones included, as for
    /// tokens. `None` before the first such summarization (and with
    /// `SUMMARY_FACT_CHECK=off`, which records no figures).
    pub mean_fact_recall: Option<f64>,
    /// The same of the identifiers the summary states (`facts_stated / facts_total`: in
    /// a sentence or bullet, not a list of identifiers). `None` before the first
    /// summarization that recorded it.
    pub mean_statement_recall: Option<f64>,
    /// Compactions in force that were written from a pending summary
    /// (`SUMMARIZATION_PRECOMPUTE_AT`) ...
    pub total_precomputed: i64,
    /// ... and their share of all compactions in force; `None` before the first.
    pub precomputed_share: Option<f64>,
    /// Tool results cleared in place by the compactions in force
    /// (`TOOL_OUTPUT_CLEARING`) ...
    pub total_tool_outputs_cleared: i64,
    /// ... and the chars that saved.
    pub total_chars_cleared: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Day {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub compactions: i64,
    pub chars_removed: i64,
    pub messages_removed: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub failures: i64,
}

/// The columns of `summarization_stats` a report is made of, as both stores read them.
#[derive(sqlx::FromRow)]
pub(super) struct StatsRow {
    total_summarizations: i64,
    total_chars_compacted: i64,
    total_messages_compacted: i64,
    total_tokens_compacted: i64,
    prompt_tokens: i64,
    completion_tokens: i64,
    mean_fact_recall: Option<f64>,
    mean_statement_recall: Option<f64>,
    total_precomputed: i64,
    total_tool_outputs_cleared: i64,
    total_chars_cleared: i64,
    last_summarization_at: Option<String>,
}

/// The report from what the rollups hold: totals, failures by reason, the duration
/// histogram's buckets and the per-day series.
pub(super) fn report(
    totals: StatsRow,
    failures_by_reason: BTreeMap<String, i64>,
    buckets: &[(i16, i64)],
    daily: Vec<Day>,
) -> StatsReport {
    let total = totals.total_summarizations;
    let share = |n: i64| (total > 0).then(|| n as f64 / total as f64);
    StatsReport {
        summary: Stats {
            total_summarizations: total,
            total_chars_compacted: totals.total_chars_compacted,
            total_messages_compacted: totals.total_messages_compacted,
            total_tokens_compacted: totals.total_tokens_compacted,
            prompt_tokens: totals.prompt_tokens,
            completion_tokens: totals.completion_tokens,
            average_chars_removed: share(totals.total_chars_compacted),
            p50_duration_ms: percentile(buckets, 0.50),
            p95_duration_ms: percentile(buckets, 0.95),
            failures_by_reason,
            last_summarization_at: totals.last_summarization_at,
            mean_fact_recall: totals.mean_fact_recall,
            mean_statement_recall: totals.mean_statement_recall,
            total_precomputed: totals.total_precomputed,
            precomputed_share: share(totals.total_precomputed),
            total_tool_outputs_cleared: totals.total_tool_outputs_cleared,
            total_chars_cleared: totals.total_chars_cleared,
        },
        daily,
    }
}

/// The upper bound, in ms, of the bucket holding the `q` quantile: bucket `b` counts
/// durations under 2^(b/2) ms (see `duration_bucket` in migration 5).
pub(super) fn percentile(buckets: &[(i16, i64)], q: f64) -> Option<f64> {
    let total: i64 = buckets.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = (total as f64 * q).ceil().max(1.0);
    let mut seen = 0;
    buckets.iter().find_map(|&(bucket, n)| {
        seen += n;
        (seen as f64 >= rank).then(|| (2f64.powf(f64::from(bucket) / 2.0) * 10.0).round() / 10.0)
    })
}

/// The table `summarizer stats` and the demo print: the aggregates, then the per-day
/// series.
impl fmt::Display for StatsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self;
        let stats = &report.summary;
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let mut rows = vec![
            (
                "total_summarizations",
                stats.total_summarizations.to_string(),
            ),
            (
                "total_chars_compacted",
                stats.total_chars_compacted.to_string(),
            ),
            (
                "total_messages_compacted",
                stats.total_messages_compacted.to_string(),
            ),
            (
                "total_tokens_compacted",
                stats.total_tokens_compacted.to_string(),
            ),
            ("average_chars_removed", opt(stats.average_chars_removed)),
            (
                "mean_fact_recall",
                stats
                    .mean_fact_recall
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
            ),
            (
                "mean_statement_recall",
                stats
                    .mean_statement_recall
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
            ),
            ("total_precomputed", stats.total_precomputed.to_string()),
            (
                "total_tool_outputs_cleared",
                stats.total_tool_outputs_cleared.to_string(),
            ),
            ("total_chars_cleared", stats.total_chars_cleared.to_string()),
            (
                "precomputed_share",
                stats
                    .precomputed_share
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
            ),
            ("p50_duration_ms", opt(stats.p50_duration_ms)),
            ("p95_duration_ms", opt(stats.p95_duration_ms)),
            ("prompt_tokens", stats.prompt_tokens.to_string()),
            ("completion_tokens", stats.completion_tokens.to_string()),
            (
                "last_summarization_at",
                stats
                    .last_summarization_at
                    .clone()
                    .unwrap_or_else(|| "-".to_owned()),
            ),
        ];
        for (reason, n) in &stats.failures_by_reason {
            rows.push(("failures", format!("{reason} {n}")));
        }
        for (name, value) in &rows {
            writeln!(f, "{name:<26}{value:>26}")?;
        }
        if !report.daily.is_empty() {
            writeln!(
                f,
                "\n{:<12}{:>12}{:>14}{:>10}",
                "day", "compactions", "chars", "failures"
            )?;
            for d in &report.daily {
                writeln!(
                    f,
                    "{:<12}{:>12}{:>14}{:>10}",
                    d.day, d.compactions, d.chars_removed, d.failures
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_bucket_upper_bounds() {
        assert_eq!(percentile(&[], 0.5), None);
        // 40 ms falls in bucket 11 (< 45.3 ms), 1000 ms in bucket 20 (< 1024 ms).
        let buckets = [(11, 19), (20, 1)];
        assert_eq!(percentile(&buckets, 0.5), Some(45.3));
        assert_eq!(percentile(&buckets, 0.95), Some(45.3));
        assert_eq!(percentile(&buckets, 0.99), Some(1024.0));
    }
}

// Dead letters
// ------------

/// A job to keep: what it was and why it failed.
#[derive(Clone, Debug)]
pub struct NewDeadLetter<'a> {
    pub session_id: Option<&'a str>,
    pub subject: &'a str,
    pub msg_id: Option<&'a str>,
    pub payload: &'a str,
    pub last_error: &'a str,
    pub deliveries: i64,
    /// Stream, sequence and publish time: one dead letter per job (see migration 13).
    pub job_key: Option<&'a str>,
}

/// A dead letter as `summarizer dead-letters list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    pub id: i64,
    pub session_id: Option<String>,
    pub subject: String,
    pub msg_id: Option<String>,
    pub payload: String,
    pub last_error: String,
    pub deliveries: i64,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub replayed_at: Option<String>,
}

// Invariants (`summarizer check`)
// -------------------------------

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

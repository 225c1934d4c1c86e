//! The lease and the commit ([`Leases`]): taking a session for a compaction and loading
//! its history, giving it back after a skip or a failure, and writing a compaction's
//! [`Record`] in one fenced transaction.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;
use crate::compaction::{CountedAt, Loaded, Record};
use crate::message::{Message, Role};
use crate::outcome::Reason;

#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes the session's lease for `owner` for `duration` unless another owner holds
    /// an unexpired one, and loads its history with each message's fingerprint. `None`
    /// when another owner holds it (or the session has no row); no lease is taken when
    /// this fails.
    async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError>;

    /// Gives the lease up if `owner` still holds it; a no-op otherwise.
    async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError>;

    /// Gives the lease up after the planner refused the history `counted` describes with
    /// `keep_chars`, and remembers why when the reason depends on the history alone
    /// (`no_safe_boundary`, `nothing_to_compact`): until the counters change,
    /// [`Counts::counters`](super::Counts::counters) answers with it and, for the same keep, the worker neither
    /// takes the lease nor loads the history again. Whatever the reason, the session's
    /// largest evictable output becomes `counted`'s, while the counters still match it.
    async fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError>;

    /// Gives the lease up after a failure, counts it for today under `reason` and puts
    /// the session in backoff (`base x 2^failures`, capped at `max`; none for a zero
    /// `base`). `owner` is the lease this worker holds; `None` when the failing statement
    /// took none: the backoff is then set unless another worker holds a live lease.
    async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: Reason,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError>;

    /// The session's messages in `seq` order.
    async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError>;

    /// Replaces the planned prefix with the summary in one transaction: fenced on the
    /// lease and on the prefix's seqs, sizes and fingerprints; archives the prefix,
    /// writes the usage event, drops a pending summary and releases the lease.
    ///
    /// # Errors
    /// [`CommitError::LeaseLost`] or [`CommitError::PrefixChanged`] when writing would be
    /// wrong; nothing is written in any case.
    async fn commit(&self, summary: &Record<'_>) -> Result<Committed, CommitError>;
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

/// A compaction written by [`Leases::commit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The usage event's id, which is also the archive's `compaction_id`.
    pub compaction_id: i64,
    /// The session had a pending summary, now dropped: its LLM call was wasted.
    pub superseded: bool,
}

/// The rows a commit found where it planned to remove or clear: each one's seq, chars
/// and fingerprint, in seq order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Found {
    pub seqs: Vec<i64>,
    pub chars: Vec<i64>,
    pub fingerprints: Vec<String>,
}

impl Found {
    /// `rows` (seq, chars, fingerprint), in seq order.
    pub fn of(rows: impl IntoIterator<Item = (i64, i64, String)>) -> Self {
        let mut found = Self::default();
        for (seq, chars, fingerprint) in rows {
            found.seqs.push(seq);
            found.chars.push(chars);
            found.fingerprints.push(fingerprint);
        }
        found
    }
}

/// The commit's fence on what it removes, as both backends decide it: `prefix` (the rows
/// found in place of the planned prefix) must be exactly the record's, the same rows of
/// the same sizes in the same versions, so that an edit meanwhile, even one that keeps
/// every length, writes nothing. `Some` of the seq the summary takes (the first removed
/// message's: before every kept message and after any system message that preceded the
/// old part), `None` for a clearing alone, which removes nothing.
///
/// # Errors
/// [`CommitError::PrefixChanged`] when the rows differ from the plan, or a summary would
/// replace nothing (the planner always removes something; were it not to, nothing is
/// written).
pub(super) fn prefix_fence(
    record: &Record<'_>,
    prefix: &Found,
) -> Result<Option<i64>, CommitError> {
    let unchanged = prefix.seqs == record.removed_seqs
        && prefix.chars == record.removed_chars
        && prefix.fingerprints == record.removed_fingerprints;
    match prefix.seqs.first() {
        _ if !unchanged => Err(CommitError::PrefixChanged),
        Some(&first) => Ok(Some(first)),
        None if record.summarized => Err(CommitError::PrefixChanged),
        None => Ok(None),
    }
}

/// The same fence on the tool results the record clears in place: `found` (their rows as
/// the commit reads them) must be exactly those planned, unedited, so that an agent's
/// edit meanwhile is neither overwritten nor archived in place of the text it replaced.
///
/// # Errors
/// [`CommitError::PrefixChanged`] when they differ.
pub(super) fn cleared_fence(record: &Record<'_>, found: &Found) -> Result<(), CommitError> {
    let planned =
        Found::of((record.cleared.iter()).map(|c| (c.seq, c.chars, c.fingerprint.clone())));
    if *found == planned {
        Ok(())
    } else {
        Err(CommitError::PrefixChanged)
    }
}

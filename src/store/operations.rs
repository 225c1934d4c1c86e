//! What an operator does to one session ([`Operations`]): look at it, undo its
//! compactions from the archive, prune the archive.

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use super::StoreError;
use super::settings::SettingsRow;
use crate::overrides::SessionSettings;

#[async_trait]
pub trait Operations: Send + Sync {
    /// The session's counters, lease, backoff, settings and its last `limit`
    /// compactions; `None` for an unknown session.
    async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError>;

    /// Undoes the session's compactions from `from` (default: the newest only) to the
    /// newest, in one transaction; their usage events stay, marked `restored_at`.
    ///
    /// # Errors
    /// [`RestoreError`] saying why nothing was written.
    async fn restore(&self, session_id: &str, from: Option<i64>) -> Result<Restored, RestoreError>;

    /// Deletes archived messages older than `older_than` (counts only with `dry_run`);
    /// their usage events are marked `archive_pruned_at`.
    async fn prune_archive(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError>;
}

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
    /// The model calls the agent made (assistant messages inserted).
    pub model_turns: i64,
    /// When the agent last inserted a message, to the second, while the session is in
    /// the idle schedule; `None` once an idle pass took it (docs/protocol.md, "Idle
    /// compaction").
    pub idle_since: Option<String>,
    /// The tokens its compactions saved over its later model calls, before their cost
    /// (docs/protocol.md, "What compaction saves").
    pub tokens_saved: i64,
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
    model_turns: i64,
    idle_since: Option<String>,
    tokens_saved: i64,
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
            model_turns: row.model_turns,
            idle_since: row.idle_since,
            tokens_saved: row.tokens_saved,
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

/// A restore's steps in one backend's dialect, inside the one transaction that holds the
/// session ([`restore`] sequences them). Most are the same text in both dialects
/// (`sql.rs`); a backend writes the two that differ, putting removed messages back and
/// marking a usage event restored.
#[async_trait]
pub(super) trait RestoreSteps: Send {
    /// The compactions of `session_id` to undo from `from` (default: the newest), newest
    /// first ([`super::sql::RESTORABLE_COMPACTIONS`]).
    async fn restorable(
        &mut self,
        session_id: &str,
        from: Option<i64>,
    ) -> Result<Vec<i64>, sqlx::Error>;

    /// Whether `compaction` removed messages (and so wrote a summary), or only cleared.
    async fn removed_any(&mut self, compaction: i64) -> Result<bool, sqlx::Error>;

    /// Deletes the summary `compaction` wrote; how many rows that deleted.
    async fn delete_summary(
        &mut self,
        session_id: &str,
        compaction: i64,
    ) -> Result<u64, sqlx::Error>;

    /// Moves the messages `compaction` removed from the archive back to their seqs; how
    /// many.
    async fn put_back_removed(&mut self, compaction: i64) -> Result<u64, sqlx::Error>;

    /// The session's model turns and idle clock (`sessions.model_turns`, `idle_since`).
    async fn activity(&mut self, session_id: &str) -> Result<Activity, sqlx::Error>;

    /// Sets them back to `activity`.
    async fn keep_activity(
        &mut self,
        session_id: &str,
        activity: &Activity,
    ) -> Result<(), sqlx::Error>;

    /// The cleared originals of `compaction` that cannot go back, by seq, with why
    /// ([`super::sql::UNRESTORABLE_CLEARED`]).
    async fn unrestorable_cleared(
        &mut self,
        compaction: i64,
    ) -> Result<Vec<(i64, String)>, sqlx::Error>;

    /// Writes the other cleared originals back into their rows and deletes them from the
    /// archive; how many.
    async fn unclear(&mut self, compaction: i64) -> Result<u64, sqlx::Error>;

    /// Marks `compaction`'s usage event `restored_at` now.
    async fn mark_restored(&mut self, compaction: i64) -> Result<(), sqlx::Error>;

    /// Records the newest compaction not undone as the session's in force.
    async fn set_in_force(&mut self, session_id: &str) -> Result<(), sqlx::Error>;
}

/// What the counters' trigger counts of the agent's own writes: the model turns it made
/// and when it last wrote (as text, whatever the backend stores).
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Activity {
    pub model_turns: i64,
    pub idle_since: Option<String>,
}

/// The restore both backends run, in a transaction that already holds the session:
/// undoes its compactions from `from` (default: the newest only) to the newest, newest
/// first. Each one's summary leaves the history, its archived messages return to their
/// seqs, and its cleared tool results get their originals back where their rows still
/// hold its placeholder; an original whose row the agent deleted or edited since stays
/// archived, and is reported. The usage events stay, marked `restored_at`.
///
/// # Errors
/// [`RestoreError`] saying why nothing may be written (the caller rolls back).
pub(super) async fn restore(
    tx: &mut impl RestoreSteps,
    session_id: &str,
    from: Option<i64>,
) -> Result<Restored, RestoreError> {
    let compactions = tx.restorable(session_id, from).await?;
    if compactions.is_empty() {
        return Err(RestoreError::NothingToRestore(from));
    }
    // The messages put back are the agent's old turns, not new ones: the counters'
    // trigger counts them as model turns and as activity, which the restore takes back
    // (before it marks the events restored, which banks their savings by the turns).
    let activity = tx.activity(session_id).await?;
    let mut messages_restored = 0;
    let mut not_restored = Vec::new();
    for &compaction in &compactions {
        // Its summary took the seq of the first message it removed; a clearing alone
        // removed none and wrote none.
        if tx.removed_any(compaction).await?
            && tx.delete_summary(session_id, compaction).await? != 1
        {
            return Err(RestoreError::SummaryMissing(compaction));
        }
        let back = tx.put_back_removed(compaction).await?;
        tx.keep_activity(session_id, &activity).await?;
        let kept = tx.unrestorable_cleared(compaction).await?;
        not_restored.extend(kept.into_iter().map(|(seq, why)| NotRestored {
            compaction_id: compaction,
            seq,
            reason: NotRestoredReason::from_sql(&why),
        }));
        let uncleared = tx.unclear(compaction).await?;
        messages_restored += i64::try_from(back + uncleared).unwrap_or(i64::MAX);
        tx.mark_restored(compaction).await?;
    }
    tx.set_in_force(session_id).await?;
    Ok(Restored {
        compactions,
        messages_restored,
        not_restored,
    })
}

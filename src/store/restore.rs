//! Operator actions on one session: what it looks like, and putting compacted messages
//! back from the archive.

use serde::Serialize;
use sqlx::Row;

use super::{PgStore, StoreError};
use crate::overrides::SessionSettings;

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
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for RestoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// What a restore put back.
#[derive(Clone, Debug, Serialize)]
pub struct Restored {
    /// Newest first, the order they were undone in.
    pub compactions: Vec<i64>,
    pub messages_restored: i64,
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

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct CompactionView {
    pub id: i64,
    pub at: String,
    pub model: String,
    pub messages_removed: i64,
    pub chars_removed: i64,
    pub restored: bool,
}

/// `to_char` pattern for timestamps shown to operators (UTC, RFC 3339).
const RFC3339: &str = "YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"";

impl PgStore {
    /// The session's counters, lease, backoff and its last `limit` compactions.
    ///
    /// # Errors
    /// When the database is unreachable. `Ok(None)` for an unknown session.
    pub async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError> {
        let Some(row) = sqlx::query(
            "SELECT total_chars, message_count, human_turns, lease_owner,
                    to_char(lease_expires_at AT TIME ZONE 'UTC', $2) AS lease_expires_at,
                    failures, to_char(retry_at AT TIME ZONE 'UTC', $2) AS retry_at,
                    st.enabled AS settings_enabled,
                    st.threshold_chars AS settings_threshold_chars,
                    st.keep_chars AS settings_keep_chars, st.model AS settings_model
             FROM sessions LEFT JOIN session_settings AS st USING (session_id)
             WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(RFC3339)
        .fetch_optional(self.pool())
        .await?
        else {
            return Ok(None);
        };
        let compactions = sqlx::query_as(
            "SELECT id, to_char(created_at AT TIME ZONE 'UTC', $2) AS at, model,
                    coalesce((metadata ->> 'messages_removed')::bigint, 0) AS messages_removed,
                    coalesce((metadata ->> 'chars_removed')::bigint, 0) AS chars_removed,
                    metadata ? 'restored_at' AS restored
             FROM usage_events
             WHERE session_id = $1 AND metadata @> '{\"summarization\": true}'
             ORDER BY id DESC LIMIT $3",
        )
        .bind(session_id)
        .bind(RFC3339)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(Some(SessionView {
            session_id: session_id.to_owned(),
            total_chars: row.try_get("total_chars")?,
            message_count: row.try_get::<i32, _>("message_count")?.into(),
            human_turns: row.try_get::<i32, _>("human_turns")?.into(),
            lease_owner: row.try_get("lease_owner")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            failures: row.try_get::<i32, _>("failures")?.into(),
            retry_at: row.try_get("retry_at")?,
            settings: super::settings::settings_from(&row)?,
            compactions,
        }))
    }

    /// Undoes the session's compactions from `from` (default: the newest only) to the
    /// newest, newest first: each one's summary leaves the history and its archived
    /// messages return to their seqs. One transaction; the usage events stay, marked
    /// `restored_at`.
    ///
    /// # Errors
    /// [`RestoreError`] saying why nothing was written.
    pub async fn restore(
        &self,
        session_id: &str,
        from: Option<i64>,
    ) -> Result<Restored, RestoreError> {
        let mut tx = self.pool().begin().await?;
        // Locks out appends' counter updates and any commit for the session meanwhile.
        let found = sqlx::query("SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE")
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(RestoreError::UnknownSession(session_id.to_owned()));
        }
        let compactions: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT compaction_id FROM archived_messages
             WHERE session_id = $1
               AND compaction_id >= coalesce($2,
                   (SELECT max(compaction_id) FROM archived_messages WHERE session_id = $1))
             ORDER BY compaction_id DESC",
        )
        .bind(session_id)
        .bind(from)
        .fetch_all(&mut *tx)
        .await?;
        if compactions.is_empty() {
            return Err(RestoreError::NothingToRestore(from));
        }
        let mut messages_restored = 0;
        for &compaction in &compactions {
            // Its summary took the seq of the first message it removed.
            let summary = sqlx::query(
                "DELETE FROM messages WHERE session_id = $1 AND is_summary
                   AND seq = (SELECT min(seq) FROM archived_messages WHERE compaction_id = $2)",
            )
            .bind(session_id)
            .bind(compaction)
            .execute(&mut *tx)
            .await?;
            if summary.rows_affected() != 1 {
                return Err(RestoreError::SummaryMissing(compaction));
            }
            let back = sqlx::query(
                "WITH back AS (
                     DELETE FROM archived_messages WHERE compaction_id = $1 RETURNING *
                 )
                 INSERT INTO messages (session_id, seq, role, content, tool_calls, tool_call_id,
                                       is_summary, created_at, external_id, extra)
                 SELECT session_id, seq, role, content, tool_calls, tool_call_id, is_summary,
                        created_at, external_id, extra
                 FROM back",
            )
            .bind(compaction)
            .execute(&mut *tx)
            .await?;
            messages_restored += i64::try_from(back.rows_affected()).unwrap_or(i64::MAX);
            sqlx::query(
                "UPDATE usage_events
                 SET metadata = metadata || jsonb_build_object('restored_at', now())
                 WHERE id = $1",
            )
            .bind(compaction)
            .execute(&mut *tx)
            .await?;
        }
        // The compaction now in force is the newest one not undone (or none): clients
        // compare it with the one their state reflects and reload the history.
        sqlx::query(
            "UPDATE sessions SET last_compaction_id = (
                 SELECT max(compaction_id) FROM archived_messages WHERE session_id = $1
             )
             WHERE session_id = $1",
        )
        .bind(session_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Restored {
            compactions,
            messages_restored,
        })
    }
}

/// What a prune removed (or, in a dry run, would remove).
#[derive(Clone, Debug, Serialize)]
pub struct Pruned {
    pub compactions: i64,
    pub archived_messages: i64,
    pub dry_run: bool,
}

impl PgStore {
    /// Deletes archived messages archived more than `older_than` ago. Their usage events
    /// stay, marked `archive_pruned_at`: those compactions can no longer be restored.
    /// With `dry_run`, counts and writes nothing.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn prune_archive(
        &self,
        older_than: std::time::Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(
            "SELECT count(DISTINCT compaction_id) AS compactions, count(*) AS messages
             FROM archived_messages
             WHERE archived_at < now() - $1 * interval '1 millisecond'",
        )
        .bind(super::millis(older_than))
        .fetch_one(&mut *tx)
        .await?;
        let pruned = Pruned {
            compactions: row.try_get("compactions")?,
            archived_messages: row.try_get("messages")?,
            dry_run,
        };
        if !dry_run {
            sqlx::query(
                "WITH gone AS (
                     DELETE FROM archived_messages
                     WHERE archived_at < now() - $1 * interval '1 millisecond'
                     RETURNING compaction_id
                 )
                 UPDATE usage_events
                 SET metadata = metadata || jsonb_build_object('archive_pruned_at', now())
                 WHERE id IN (SELECT compaction_id FROM gone)",
            )
            .bind(super::millis(older_than))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(pruned)
    }
}

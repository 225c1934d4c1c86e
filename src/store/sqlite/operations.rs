//! Operator actions on one session, as on Postgres: what it
//! looks like, putting compacted messages back from the archive, and pruning the archive.

use std::time::Duration;

use sqlx::Row;

use super::{RFC3339, SqliteStore, now_ms};
use crate::store::model::{SessionRow, millis};
use crate::store::sql::{
    COMPACTION_REMOVED, DELETE_RESTORED_SUMMARY, DELETE_UNCLEARED, LAST_COMPACTION_IN_FORCE,
    RESTORABLE_COMPACTIONS, UNCLEAR, UNRESTORABLE_CLEARED,
};
use crate::store::{
    NotRestored, NotRestoredReason, Pruned, RestoreError, Restored, SessionView, StoreError,
};

/// An archived row archived before the cutoff `$1`, in unix milliseconds (2440587.5 is
/// the julian day of the unix epoch). julianday() reads any form of timestamp SQLite
/// parses, not only the one the column's default writes.
macro_rules! archived_before_sql {
    () => {
        "julianday(archived_at) < 2440587.5 + $1 / 86400000.0"
    };
}

impl SqliteStore {
    /// The session's counters, lease, backoff and its last `limit` compactions. The lease's
    /// and backoff's instants, stored as unix milliseconds, are shown as RFC 3339 text,
    /// as Postgres shows its timestamps.
    ///
    /// # Errors
    /// When the file cannot be read. `Ok(None)` for an unknown session.
    pub async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError> {
        let Some(row): Option<SessionRow> = sqlx::query_as(concat!(
            "SELECT total_chars, message_count, human_turns, lease_owner,
                    strftime($2, lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
                    failures, strftime($2, retry_at / 1000.0, 'unixepoch') AS retry_at, ",
            settings_columns_sql!(),
            "
             FROM sessions LEFT JOIN session_settings AS st USING (session_id)
             WHERE session_id = $1"
        ))
        .bind(session_id)
        .bind(RFC3339)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let compactions = sqlx::query_as(
            "SELECT id, coalesce(strftime($2, created_at), created_at) AS at, model,
                    coalesce(CAST(json_extract(metadata, '$.messages_removed') AS INTEGER), 0)
                        AS messages_removed,
                    coalesce(CAST(json_extract(metadata, '$.chars_removed') AS INTEGER), 0)
                        AS chars_removed,
                    json_type(metadata, '$.restored_at') IS NOT NULL AS restored
             FROM usage_events
             WHERE session_id = $1 AND json_type(metadata, '$.summarization') = 'true'
             ORDER BY id DESC LIMIT $3",
        )
        .bind(session_id)
        .bind(RFC3339)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(Some(SessionView::new(session_id, row, compactions)))
    }

    /// Undoes the session's compactions from `from` (default: the newest only) to the
    /// newest, newest first, as Postgres does. The whole restore holds the file's write
    /// lock (where Postgres locks the session's row), so no append or commit interleaves.
    /// The usage events stay, marked `restored_at` (RFC 3339 with milliseconds and `Z`,
    /// where Postgres writes microseconds and `+00:00`).
    ///
    /// # Errors
    /// [`RestoreError`] saying why nothing was written.
    pub async fn restore(
        &self,
        session_id: &str,
        from: Option<i64>,
    ) -> Result<Restored, RestoreError> {
        let mut tx = self.begin_write().await?;
        let found = sqlx::query("SELECT 1 FROM sessions WHERE session_id = $1")
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(RestoreError::UnknownSession(session_id.to_owned()));
        }
        let compactions: Vec<i64> = sqlx::query_scalar(RESTORABLE_COMPACTIONS)
            .bind(session_id)
            .bind(from)
            .fetch_all(&mut *tx)
            .await?;
        if compactions.is_empty() {
            return Err(RestoreError::NothingToRestore(from));
        }
        let mut messages_restored = 0;
        let mut not_restored = Vec::new();
        for &compaction in &compactions {
            // Its summary took the seq of the first message it removed; a clearing alone
            // removed none and wrote none.
            let removed: bool = sqlx::query_scalar(COMPACTION_REMOVED)
                .bind(compaction)
                .fetch_one(&mut *tx)
                .await?;
            if removed {
                let summary = sqlx::query(DELETE_RESTORED_SUMMARY)
                    .bind(session_id)
                    .bind(compaction)
                    .execute(&mut *tx)
                    .await?;
                if summary.rows_affected() != 1 {
                    return Err(RestoreError::SummaryMissing(compaction));
                }
            }
            // SQLite has no DELETE in a CTE: copy back, then delete, in the same
            // transaction. Each row gets a new row_version, as a new row gets a new xmin.
            let back = sqlx::query(concat!(
                "INSERT INTO messages (",
                message_columns_sql!(),
                ") SELECT ",
                message_columns_sql!(),
                " FROM archived_messages WHERE compaction_id = $1 AND NOT cleared ORDER BY seq"
            ))
            .bind(compaction)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM archived_messages WHERE compaction_id = $1 AND NOT cleared")
                .bind(compaction)
                .execute(&mut *tx)
                .await?;
            // A cleared row gets its original content back, in its place, unless the row
            // is gone or no longer holds the placeholder: that original stays archived.
            let kept: Vec<(i64, String)> = sqlx::query_as(UNRESTORABLE_CLEARED)
                .bind(compaction)
                .fetch_all(&mut *tx)
                .await?;
            not_restored.extend(kept.into_iter().map(|(seq, why)| NotRestored {
                compaction_id: compaction,
                seq,
                reason: NotRestoredReason::from_sql(&why),
            }));
            let uncleared = sqlx::query(UNCLEAR)
                .bind(compaction)
                .execute(&mut *tx)
                .await?;
            sqlx::query(DELETE_UNCLEARED)
                .bind(compaction)
                .execute(&mut *tx)
                .await?;
            messages_restored +=
                i64::try_from(back.rows_affected() + uncleared.rows_affected()).unwrap_or(i64::MAX);
            sqlx::query(
                "UPDATE usage_events
                 SET metadata = json_set(metadata, '$.restored_at', strftime($2, 'now'))
                 WHERE id = $1",
            )
            .bind(compaction)
            .bind(RFC3339)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(LAST_COMPACTION_IN_FORCE)
            .bind(session_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Restored {
            compactions,
            messages_restored,
            not_restored,
        })
    }

    /// Deletes archived messages archived more than `older_than` ago, marking their usage
    /// events `archive_pruned_at`, as Postgres does; with `dry_run`, counts and writes
    /// nothing. The cutoff is this process's clock, taken once.
    ///
    /// # Errors
    /// When the file cannot be read or written.
    pub async fn prune_archive(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError> {
        let cutoff_ms = now_ms().saturating_sub(millis(older_than));
        // A dry run too: it reads under the lock what it would delete, and writes nothing.
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(concat!(
            "SELECT count(DISTINCT compaction_id) AS compactions, count(*) AS messages
             FROM archived_messages WHERE ",
            archived_before_sql!()
        ))
        .bind(cutoff_ms)
        .fetch_one(&mut *tx)
        .await?;
        let pruned = Pruned {
            compactions: row.try_get("compactions")?,
            archived_messages: row.try_get("messages")?,
            dry_run,
        };
        if !dry_run {
            sqlx::query(concat!(
                "UPDATE usage_events
                 SET metadata = json_set(metadata, '$.archive_pruned_at', strftime($2, 'now'))
                 WHERE id IN (SELECT compaction_id FROM archived_messages WHERE ",
                archived_before_sql!(),
                ")"
            ))
            .bind(cutoff_ms)
            .bind(RFC3339)
            .execute(&mut *tx)
            .await?;
            sqlx::query(concat!(
                "DELETE FROM archived_messages WHERE ",
                archived_before_sql!()
            ))
            .bind(cutoff_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(pruned)
    }
}

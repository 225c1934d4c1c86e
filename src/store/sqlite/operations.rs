//! Operator actions on one session, as on Postgres: what it
//! looks like, putting compacted messages back from the archive, and pruning the archive.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::{RFC3339, SqliteStore, now_ms};
use crate::store::Operations;
use crate::store::millis;
use crate::store::operations::SessionRow;
use crate::store::operations::{self, Activity, RestoreSteps};
use crate::store::sql::{
    COMPACTION_REMOVED, DELETE_RESTORED_SUMMARY, DELETE_UNCLEARED, LAST_COMPACTION_IN_FORCE,
    RESTORABLE_COMPACTIONS, UNCLEAR, UNRESTORABLE_CLEARED,
};
use crate::store::{Pruned, RestoreError, Restored, SessionView, StoreError};

/// An archived row archived before the cutoff `$1`, in unix milliseconds (2440587.5 is
/// the julian day of the unix epoch). julianday() reads any form of timestamp SQLite
/// parses, not only the one the column's default writes.
macro_rules! archived_before_sql {
    () => {
        "julianday(archived_at) < 2440587.5 + $1 / 86400000.0"
    };
}

#[async_trait]
impl Operations for SqliteStore {
    /// The session's counters, lease, backoff and its last `limit` compactions. The lease's
    /// and backoff's instants, stored as unix milliseconds, are shown as RFC 3339 text,
    /// as Postgres shows its timestamps.
    ///
    /// # Errors
    /// When the file cannot be read. `Ok(None)` for an unknown session.
    async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError> {
        let Some(row): Option<SessionRow> = sqlx::query_as(concat!(
            "SELECT total_chars, message_count, human_turns, lease_owner,
                    strftime($2, lease_expires_at / 1000.0, 'unixepoch') AS lease_expires_at,
                    failures, strftime($2, retry_at / 1000.0, 'unixepoch') AS retry_at,
                    model_turns, strftime($2, idle_since / 1000.0, 'unixepoch') AS idle_since,
                    CAST(min(max(model_turns * tokens_saved_per_turn - tokens_saved_offset
                                 + tokens_saved_banked, -9e18), 9e18) AS INTEGER) AS tokens_saved, ",
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
    async fn restore(&self, session_id: &str, from: Option<i64>) -> Result<Restored, RestoreError> {
        let mut tx = self.begin_write().await?;
        let found = sqlx::query("SELECT 1 FROM sessions WHERE session_id = $1")
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(RestoreError::UnknownSession(session_id.to_owned()));
        }
        let restored = operations::restore(&mut SqliteRestore(&mut tx), session_id, from).await?;
        tx.commit().await?;
        Ok(restored)
    }

    /// Deletes archived messages archived more than `older_than` ago, marking their usage
    /// events `archive_pruned_at`, as Postgres does; with `dry_run`, counts and writes
    /// nothing. The cutoff is this process's clock, taken once.
    ///
    /// # Errors
    /// When the file cannot be read or written.
    async fn prune_archive(
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

/// [`operations::RestoreSteps`] on a SQLite write transaction.
struct SqliteRestore<'a>(&'a mut sqlx::SqliteConnection);

#[async_trait]
impl RestoreSteps for SqliteRestore<'_> {
    async fn restorable(
        &mut self,
        session_id: &str,
        from: Option<i64>,
    ) -> Result<Vec<i64>, sqlx::Error> {
        sqlx::query_scalar(RESTORABLE_COMPACTIONS)
            .bind(session_id)
            .bind(from)
            .fetch_all(&mut *self.0)
            .await
    }

    async fn removed_any(&mut self, compaction: i64) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(COMPACTION_REMOVED)
            .bind(compaction)
            .fetch_one(&mut *self.0)
            .await
    }

    async fn delete_summary(
        &mut self,
        session_id: &str,
        compaction: i64,
    ) -> Result<u64, sqlx::Error> {
        let deleted = sqlx::query(DELETE_RESTORED_SUMMARY)
            .bind(session_id)
            .bind(compaction)
            .execute(&mut *self.0)
            .await?;
        Ok(deleted.rows_affected())
    }

    /// SQLite has no DELETE in a CTE: copy back, then delete, in the same transaction.
    /// Each row gets a new row_version, as a new row gets a new xmin.
    async fn put_back_removed(&mut self, compaction: i64) -> Result<u64, sqlx::Error> {
        let back = sqlx::query(concat!(
            "INSERT INTO messages (",
            message_columns_sql!(),
            ") SELECT ",
            message_columns_sql!(),
            " FROM archived_messages WHERE compaction_id = $1 AND NOT cleared ORDER BY seq"
        ))
        .bind(compaction)
        .execute(&mut *self.0)
        .await?;
        sqlx::query("DELETE FROM archived_messages WHERE compaction_id = $1 AND NOT cleared")
            .bind(compaction)
            .execute(&mut *self.0)
            .await?;
        Ok(back.rows_affected())
    }

    async fn activity(&mut self, session_id: &str) -> Result<Activity, sqlx::Error> {
        sqlx::query_as(
            "SELECT model_turns, CAST(idle_since AS TEXT) AS idle_since FROM sessions
             WHERE session_id = $1",
        )
        .bind(session_id)
        .fetch_one(&mut *self.0)
        .await
    }

    async fn keep_activity(
        &mut self,
        session_id: &str,
        activity: &Activity,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE sessions SET model_turns = $2, idle_since = CAST($3 AS INTEGER)
             WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(activity.model_turns)
        .bind(activity.idle_since.as_deref())
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn unrestorable_cleared(
        &mut self,
        compaction: i64,
    ) -> Result<Vec<(i64, String)>, sqlx::Error> {
        sqlx::query_as(UNRESTORABLE_CLEARED)
            .bind(compaction)
            .fetch_all(&mut *self.0)
            .await
    }

    async fn unclear(&mut self, compaction: i64) -> Result<u64, sqlx::Error> {
        let uncleared = sqlx::query(UNCLEAR)
            .bind(compaction)
            .execute(&mut *self.0)
            .await?;
        sqlx::query(DELETE_UNCLEARED)
            .bind(compaction)
            .execute(&mut *self.0)
            .await?;
        Ok(uncleared.rows_affected())
    }

    /// RFC 3339 with milliseconds and `Z`, where Postgres writes microseconds and
    /// `+00:00`.
    async fn mark_restored(&mut self, compaction: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE usage_events
             SET metadata = json_set(metadata, '$.restored_at', strftime($2, 'now'))
             WHERE id = $1",
        )
        .bind(compaction)
        .bind(RFC3339)
        .execute(&mut *self.0)
        .await?;
        Ok(())
    }

    async fn set_in_force(&mut self, session_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(LAST_COMPACTION_IN_FORCE)
            .bind(session_id)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }
}

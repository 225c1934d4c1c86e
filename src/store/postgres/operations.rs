//! Operator actions on one session: what it looks like, and putting compacted messages
//! back from the archive.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::PgStore;
use crate::store::Operations;
use crate::store::millis;
use crate::store::operations::SessionRow;
use crate::store::operations::{self, Activity, RestoreSteps};
use crate::store::sql::{
    COMPACTION_REMOVED, DELETE_RESTORED_SUMMARY, DELETE_UNCLEARED, LAST_COMPACTION_IN_FORCE,
    RESTORABLE_COMPACTIONS, UNCLEAR, UNRESTORABLE_CLEARED,
};
use crate::store::{Pruned, RestoreError, Restored, SessionView, StoreError};

/// `to_char` pattern for timestamps shown to operators (UTC, RFC 3339).
const RFC3339: &str = "YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"";

#[async_trait]
impl Operations for PgStore {
    /// The session's counters, lease, backoff and its last `limit` compactions.
    ///
    /// # Errors
    /// When the database is unreachable. `Ok(None)` for an unknown session.
    async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError> {
        let Some(row): Option<SessionRow> = sqlx::query_as(concat!(
            "SELECT total_chars, message_count::bigint AS message_count,
                    human_turns::bigint AS human_turns, lease_owner,
                    to_char(lease_expires_at AT TIME ZONE 'UTC', $2) AS lease_expires_at,
                    failures::bigint AS failures, to_char(retry_at AT TIME ZONE 'UTC', $2) AS retry_at,
                    model_turns, to_char(idle_since AT TIME ZONE 'UTC', $2) AS idle_since,
                    least(greatest(model_turns::numeric * tokens_saved_per_turn
                                   - tokens_saved_offset + tokens_saved_banked, -9e18), 9e18)::bigint
                        AS tokens_saved, ",
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
        .fetch_all(&self.pool)
        .await?;
        Ok(Some(SessionView::new(session_id, row, compactions)))
    }

    /// Undoes the session's compactions from `from` (default: the newest only) to the
    /// newest, newest first: each one's summary leaves the history and its archived
    /// messages return to their seqs; a cleared tool result gets its original back
    /// where its row still holds the placeholder. One transaction; the usage events
    /// stay, marked `restored_at`. A cleared original whose row was deleted or edited
    /// since stays archived, and is named in [`Restored::not_restored`].
    ///
    /// # Errors
    /// [`RestoreError`] saying why nothing was written: [`RestoreError::Busy`] when an
    /// agent's statement holds a row it would change.
    async fn restore(&self, session_id: &str, from: Option<i64>) -> Result<Restored, RestoreError> {
        let mut tx = self.pool.begin().await?;
        // Locks out appends' counter updates and any commit for the session meanwhile.
        let found = sqlx::query("SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE")
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(RestoreError::UnknownSession(session_id.to_owned()));
        }
        // Then the rows it may change (summaries, cleared rows), without waiting: an
        // agent's statement holding one waits for the session's row, as the commit's
        // `fence_and_lock` explains.
        let locked = sqlx::query(
            "SELECT 1 FROM messages
             WHERE session_id = $1 AND (is_summary OR cleared_by IS NOT NULL)
             FOR UPDATE NOWAIT",
        )
        .bind(session_id)
        .execute(&mut *tx)
        .await;
        match locked {
            Err(e) if super::leases::is_lock_not_available(&e) => return Err(RestoreError::Busy),
            other => other?,
        };
        let restored = operations::restore(&mut PgRestore(&mut tx), session_id, from).await?;
        tx.commit().await?;
        Ok(restored)
    }

    /// Deletes archived messages archived more than `older_than` ago. Their usage events
    /// stay, marked `archive_pruned_at`: those compactions can no longer be restored.
    /// With `dry_run`, counts and writes nothing.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn prune_archive(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT count(DISTINCT compaction_id) AS compactions, count(*) AS messages
             FROM archived_messages
             WHERE archived_at < now() - $1 * interval '1 millisecond'",
        )
        .bind(millis(older_than))
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
            .bind(millis(older_than))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(pruned)
    }
}

/// [`operations::RestoreSteps`] on a Postgres transaction.
struct PgRestore<'a>(&'a mut sqlx::PgConnection);

#[async_trait]
impl RestoreSteps for PgRestore<'_> {
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

    /// One statement: the archived rows deleted and inserted back.
    async fn put_back_removed(&mut self, compaction: i64) -> Result<u64, sqlx::Error> {
        let back = sqlx::query(concat!(
            "WITH back AS (
                 DELETE FROM archived_messages WHERE compaction_id = $1 AND NOT cleared
                 RETURNING *
             )
             INSERT INTO messages (",
            message_columns_sql!(),
            ") SELECT ",
            message_columns_sql!(),
            " FROM back"
        ))
        .bind(compaction)
        .execute(&mut *self.0)
        .await?;
        Ok(back.rows_affected())
    }

    async fn activity(&mut self, session_id: &str) -> Result<Activity, sqlx::Error> {
        sqlx::query_as(
            "SELECT model_turns, idle_since::text AS idle_since FROM sessions
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
            "UPDATE sessions SET model_turns = $2, idle_since = $3::timestamptz
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

    async fn mark_restored(&mut self, compaction: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE usage_events
             SET metadata = metadata || jsonb_build_object('restored_at', now())
             WHERE id = $1",
        )
        .bind(compaction)
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

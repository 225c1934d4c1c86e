//! The counters: the no-op path's one primary-key read, alone or batched.

use super::{SqliteStore, now_ms};
use crate::store::Counts;
use crate::store::counters::{CountersRow, DROP_BATCH, SessionCountersRow};
use crate::store::{Claimed, Counters, StoreError};
use std::time::Duration;

use async_trait::async_trait;

/// A counters row ([`CountersRow`]) of the `sessions` row joined with its settings, as
/// `FROM` [`counters_joined_sql`] gives them, with the session's id. The backoff is read
/// against this process's clock: `$1` is now ([`now_ms`]).
macro_rules! counters_columns_sql {
    () => {
        concat!(
            "sessions.session_id, total_chars, message_count, human_turns, last_compaction_id,
             coalesce(retry_at > $1, 0) AS backing_off, chars_per_token, largest_output_chars, ",
            remembered_skip_columns_sql!(),
            ", ",
            settings_columns_sql!()
        )
    };
}

#[async_trait]
impl Counts for SqliteStore {
    /// The session's counters: one primary-key read (a second on `session_settings`' key,
    /// in the same statement). `None` for a session with no row.
    ///
    /// # Errors
    /// When the database fails.
    async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError> {
        let row: Option<CountersRow> = sqlx::query_as(concat!(
            "SELECT ",
            counters_columns_sql!(),
            counters_joined_sql!(),
            "WHERE sessions.session_id = $2"
        ))
        .bind(now_ms())
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Into::into))
    }

    /// The counters of `session_ids`, in one query (the ids as one JSON array).
    ///
    /// # Errors
    /// When the database fails.
    async fn counters_of(
        &self,
        session_ids: &[&str],
    ) -> Result<Vec<(String, Counters)>, StoreError> {
        let ids = serde_json::to_string(session_ids).map_err(|e| sqlx::Error::Encode(e.into()))?;
        let rows: Vec<SessionCountersRow> = sqlx::query_as(concat!(
            "SELECT ",
            counters_columns_sql!(),
            counters_joined_sql!(),
            "WHERE sessions.session_id IN (SELECT value FROM json_each($2))"
        ))
        .bind(now_ms())
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.session_id, row.counters.into()))
            .collect())
    }

    /// As Postgres's, by this process's clock; each statement is atomic under the
    /// file's writer lock, which a pass that finds nothing due does not take.
    ///
    /// # Errors
    /// When the database fails.
    async fn claim_idle(
        &self,
        idle_for: Duration,
        give_up_after: Duration,
        limit: i64,
    ) -> Result<Claimed, StoreError> {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let (due, stale) = (
            now.saturating_sub(ms(idle_for)).saturating_sub(1000),
            now.saturating_sub(ms(give_up_after)),
        );
        let oldest: Option<i64> =
            sqlx::query_scalar("SELECT min(idle_since) FROM sessions WHERE idle_since IS NOT NULL")
                .fetch_one(&self.pool)
                .await?;
        match oldest {
            Some(at) if at < stale => {
                let dropped = sqlx::query(
                    "UPDATE sessions SET idle_since = NULL
                     WHERE session_id IN (
                         SELECT session_id FROM sessions
                         WHERE idle_since < $1
                         ORDER BY idle_since
                         LIMIT $2
                     )",
                )
                .bind(stale)
                .bind(DROP_BATCH)
                .execute(&self.pool)
                .await?;
                Ok(Claimed {
                    sessions: Vec::new(),
                    dropped: dropped.rows_affected(),
                })
            }
            Some(at) if at <= due => {
                let sessions = sqlx::query_scalar(
                    "UPDATE sessions SET idle_since = NULL
                     WHERE session_id IN (
                         SELECT session_id FROM sessions
                         WHERE idle_since <= $1
                         ORDER BY idle_since
                         LIMIT $2
                     )
                     RETURNING session_id",
                )
                .bind(due)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(Claimed {
                    sessions,
                    dropped: 0,
                })
            }
            _ => Ok(Claimed::default()),
        }
    }
}

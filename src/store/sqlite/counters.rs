//! The counters: the no-op path's one primary-key read, alone or batched.

use super::{SqliteStore, now_ms};
use crate::store::Counts;
use crate::store::counters::{CountersRow, SessionCountersRow};
use crate::store::{Counters, StoreError};
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
}

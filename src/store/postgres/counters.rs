//! The counters: the no-op path's one primary-key read, alone or batched.

use super::PgStore;
use crate::store::Counts;
use crate::store::counters::{CountersRow, SessionCountersRow};
use crate::store::{Counters, StoreError};
use async_trait::async_trait;

/// A counters row ([`CountersRow`]) of the `sessions` row joined with its settings, as
/// `FROM` [`counters_joined_sql`] gives them. The backoff is read against the database's
/// clock.
macro_rules! counters_columns_sql {
    () => {
        concat!(
            "total_chars, message_count::bigint AS message_count,
             human_turns::bigint AS human_turns, last_compaction_id,
             coalesce(retry_at > now(), false) AS backing_off,
             chars_per_token::float8 AS chars_per_token, largest_output_chars, ",
            remembered_skip_columns_sql!(),
            ", ",
            settings_columns_sql!()
        )
    };
}

#[async_trait]
impl Counts for PgStore {
    /// The session's counters: one primary-key read (a second on `session_settings`' key,
    /// in the same statement). `None` for a session with no row.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError> {
        let row: Option<CountersRow> = sqlx::query_as(concat!(
            "SELECT ",
            counters_columns_sql!(),
            counters_joined_sql!(),
            "WHERE sessions.session_id = $1"
        ))
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Into::into))
    }

    /// The counters of `session_ids`, in one query: one primary-key lookup per session,
    /// whatever the table's size. The LIMIT keeps the lateral subquery from being
    /// flattened into a join, which the planner turned into a sequential scan of all
    /// sessions (hashed) for small tables, and a plain `session_id = ANY($1)` also went
    /// that way (profiled: 20% of the machine's CPU in Postgres at 26k no-op events/s).
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn counters_of(
        &self,
        session_ids: &[&str],
    ) -> Result<Vec<(String, Counters)>, StoreError> {
        let rows: Vec<SessionCountersRow> = sqlx::query_as(concat!(
            "SELECT wanted.session_id, s.*
             FROM unnest($1::text[]) AS wanted (session_id)
             CROSS JOIN LATERAL (
                 SELECT ",
            counters_columns_sql!(),
            counters_joined_sql!(),
            "WHERE sessions.session_id = wanted.session_id
                 LIMIT 1
             ) AS s"
        ))
        .bind(session_ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.session_id, row.counters.into()))
            .collect())
    }
}

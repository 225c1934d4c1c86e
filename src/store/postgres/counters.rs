//! The counters: the no-op path's one primary-key read, alone or batched.

use super::PgStore;
use crate::store::Counts;
use crate::store::counters::{CountersRow, DROP_BATCH, SessionCountersRow};
use crate::store::{Claimed, Counters, StoreError};
use std::time::Duration;

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
    /// that way (docs/benchmarks.md, "Figures behind the code").
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

    /// The age of the schedule's first entry (one index read) says what to do: nothing
    /// (none is due: no write), take stale entries out, or claim due ones in one
    /// statement: the oldest entries of `sessions_idle` locked (skipping those an
    /// agent's statement holds), taken out of the schedule and returned. `idle_since` is
    /// kept to the second: a second more is waited, so that no session is claimed before
    /// `idle_for` has passed.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn claim_idle(
        &self,
        idle_for: Duration,
        give_up_after: Duration,
        limit: i64,
    ) -> Result<Claimed, StoreError> {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let (due, stale) = (ms(idle_for).saturating_add(1000), ms(give_up_after));
        // Not `EXISTS (... WHERE idle_since <= $1)`: once the statement is prepared, its
        // generic plan cannot tell how many rows that bound takes, and scanned the table
        // (100 ms at a million sessions). A `min` reads the index's first entry.
        let oldest_ms: Option<i64> = sqlx::query_scalar(
            "SELECT floor(1000 * extract(epoch FROM statement_timestamp() - min(idle_since)))::bigint
             FROM sessions WHERE idle_since IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        match oldest_ms {
            Some(age) if age > stale => {
                let dropped = sqlx::query(
                    "UPDATE sessions SET idle_since = NULL
                     FROM (
                         SELECT session_id FROM sessions
                         WHERE idle_since < statement_timestamp() - $1 * interval '1 millisecond'
                         ORDER BY idle_since
                         LIMIT $2
                         FOR UPDATE SKIP LOCKED
                     ) AS stale
                     WHERE sessions.session_id = stale.session_id",
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
            Some(age) if age >= due => {
                let sessions = sqlx::query_scalar(
                    "UPDATE sessions SET idle_since = NULL
                     FROM (
                         SELECT session_id FROM sessions
                         WHERE idle_since <= statement_timestamp() - $1 * interval '1 millisecond'
                         ORDER BY idle_since
                         LIMIT $2
                         FOR UPDATE SKIP LOCKED
                     ) AS due
                     WHERE sessions.session_id = due.session_id
                     RETURNING sessions.session_id",
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

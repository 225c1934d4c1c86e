//! Dead letters (migration 13): jobs that failed `JETSTREAM_MAX_DELIVER` times, kept
//! for `summarizer dead-letters list|replay|purge`.

use super::PgStore;
use crate::store::DeadLetters;
use crate::store::sql::{INSERT_DEAD_LETTER, PURGE_DEAD_LETTERS, UNMARK_REPLAYED};
use crate::store::{DeadLetter, NewDeadLetter, StoreError};
use async_trait::async_trait;

#[async_trait]
impl DeadLetters for PgStore {
    /// Whether the session has a compaction made for the durable job `job_id` (its
    /// stream, sequence and publish time): that job delivered again after its commit
    /// (its worker died before the ack) is then done. A client's `request_id` is not
    /// the job's identity: a scheduler may send the same one every night.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn compacted_by_job(&self, session_id: &str, job_id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query_scalar(
            "SELECT EXISTS (
                 SELECT 1 FROM usage_events
                 WHERE session_id = $1 AND metadata ->> 'job_id' = $2
                   AND metadata @> '{\"summarization\": true}')",
        )
        .bind(session_id)
        .bind(job_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(done)
    }

    /// Keeps a job that will not be delivered again. Returns its id, or `None` when
    /// the same job (`job_key`) was kept already (its ack was lost).
    ///
    /// # Errors
    /// When the database fails; the caller must then leave the job in the stream.
    async fn dead_letter(&self, job: &NewDeadLetter<'_>) -> Result<Option<i64>, StoreError> {
        let id = sqlx::query_scalar(INSERT_DEAD_LETTER)
            .bind(job.session_id)
            .bind(job.subject)
            .bind(job.msg_id)
            .bind(job.payload)
            .bind(job.last_error)
            .bind(i32::try_from(job.deliveries).unwrap_or(i32::MAX))
            .bind(job.job_key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(id)
    }

    /// The dead letters, oldest first: those not replayed yet, or all with `all`.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn dead_letters(&self, all: bool) -> Result<Vec<DeadLetter>, StoreError> {
        let rows = sqlx::query_as(
            "SELECT id, session_id, subject, msg_id, payload, last_error,
                    deliveries::bigint AS deliveries,
                    to_char(created_at AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS created_at,
                    to_char(replayed_at AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS replayed_at
             FROM dead_letters WHERE $1 OR replayed_at IS NULL ORDER BY id",
        )
        .bind(all)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Marks a dead letter replayed, unless it was already: `false` then, and the
    /// caller must not publish it again.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn mark_replayed(&self, id: i64) -> Result<bool, StoreError> {
        let marked = sqlx::query(
            "UPDATE dead_letters SET replayed_at = now() WHERE id = $1 AND replayed_at IS NULL",
        )
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(marked == 1)
    }

    /// Undoes [`PgStore::mark_replayed`] when the publish failed.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn unmark_replayed(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query(UNMARK_REPLAYED)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Deletes dead letters: the replayed ones, or every one with `all`. Returns how
    /// many.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn purge_dead_letters(&self, all: bool) -> Result<u64, StoreError> {
        let deleted = sqlx::query(PURGE_DEAD_LETTERS)
            .bind(all)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(deleted)
    }
}

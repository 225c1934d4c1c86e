//! Jobs that failed for good ([`DeadLetters`]), kept for an operator to replay or purge.

use async_trait::async_trait;
use serde::Serialize;

use super::StoreError;

#[async_trait]
pub trait DeadLetters: Send + Sync {
    /// Whether the session has a compaction made for the durable job `job_id`: a job
    /// delivered again after its commit is then done.
    async fn compacted_by_job(&self, session_id: &str, job_id: &str) -> Result<bool, StoreError>;

    /// Keeps a job that will not be delivered again; `None` when the same job was kept
    /// already.
    async fn dead_letter(&self, job: &NewDeadLetter<'_>) -> Result<Option<i64>, StoreError>;

    /// The dead letters, oldest first: those not replayed yet, or all with `all`.
    async fn dead_letters(&self, all: bool) -> Result<Vec<DeadLetter>, StoreError>;

    /// Marks a dead letter replayed; `false` when it already was (do not publish it).
    async fn mark_replayed(&self, id: i64) -> Result<bool, StoreError>;

    /// Undoes [`DeadLetters::mark_replayed`] after a failed publish.
    async fn unmark_replayed(&self, id: i64) -> Result<(), StoreError>;

    /// Deletes the replayed dead letters (all of them with `all`); returns how many.
    async fn purge_dead_letters(&self, all: bool) -> Result<u64, StoreError>;
}

/// A job to keep: what it was and why it failed.
#[derive(Clone, Debug)]
pub struct NewDeadLetter<'a> {
    pub session_id: Option<&'a str>,
    pub subject: &'a str,
    pub msg_id: Option<&'a str>,
    pub payload: &'a str,
    pub last_error: &'a str,
    pub deliveries: i64,
    /// Stream, sequence and publish time: one dead letter per job (see migration 13).
    pub job_key: Option<&'a str>,
}

/// A dead letter as `summarizer dead-letters list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    pub id: i64,
    pub session_id: Option<String>,
    pub subject: String,
    pub msg_id: Option<String>,
    pub payload: String,
    pub last_error: String,
    pub deliveries: i64,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub replayed_at: Option<String>,
}

//! The session store: [`Store`] is the one interface the worker, the CLI and `/stats`
//! use, whichever database `DATABASE_URL` names.
//!
//! - `model.rs`: the records and errors both backends exchange with their callers, and
//!   the row decodings they share.
//! - `sql.rs`: the statements that are the same text in both dialects.
//! - `postgres/` ([`PgStore`]) and `sqlite/` ([`SqliteStore`]): the backends, as equals,
//!   each with one file per concern under the same name (`counters`, `commit`, `pending`,
//!   `restore`, `settings`, `stats`, `dead_letters`, `invariants`), so that diffing two
//!   files of the same name shows how the dialects differ. Neither imports the other.
//! - `batch.rs`: [`CounterReader`], which coalesces the threshold checks of concurrent
//!   events into one [`Store::counters_of`] per batch, over any store.
//!
//! Each backend implements the methods below as inherent methods of the same names (so a
//! test or the lab can call them on the concrete type), and its `impl Store` forwards to
//! them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::compaction::{CountedAt, Loaded, Record};
use crate::config::Limits;
use crate::message::Message;
use crate::outcome::Reason;
use crate::overrides::{Change, SessionSettings};

// First: its macros are spliced into both backends' statements.
#[macro_use]
mod sql;
mod batch;
mod model;
pub mod postgres;
pub mod sqlite;

pub use batch::CounterReader;
pub use model::{
    Applied, CommitError, Committed, CompactionView, CounterDrift, Counters, Day, DeadLetter,
    Discard, Finding, Invariant, NewDeadLetter, NotRestored, NotRestoredReason, Pruned,
    RecallQuery, RestoreError, Restored, Saved, SessionCounts, SessionView, SettingsError, Stats,
    StatsReport, StoreError, Totals, is_unreachable,
};
pub use postgres::{PgStore, RecallBudget};
pub use sqlite::SqliteStore;
pub use summarizer_client::Recalled;

/// A store shared by every task of a worker.
pub type SharedStore = Arc<dyn Store>;

/// Which database a URL names: SQLite for `sqlite:` URLs (`sqlite:///path/to/file.db`,
/// `sqlite::memory:`), Postgres for anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn of(url: &str) -> Self {
        if url.starts_with("sqlite:") {
            Self::Sqlite
        } else {
            Self::Postgres
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lazily connecting store for `url` (see [`Backend::of`]): the worker starts, and
/// reports the database as it finds it, even when it is not up yet.
///
/// # Errors
/// When `url` is not a valid URL for its backend.
pub fn connect_lazy(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<SharedStore, StoreError> {
    Ok(match Backend::of(url) {
        Backend::Postgres => Arc::new(PgStore::connect_lazy(
            url,
            max_connections,
            acquire_timeout,
        )?),
        Backend::Sqlite => Arc::new(SqliteStore::connect_lazy(
            url,
            max_connections,
            acquire_timeout,
        )?),
    })
}

/// What the worker, the CLI and `/stats` ask of a database. Every method is one short
/// transaction or less: none holds a connection across an LLM call, and none leaves a
/// partial write behind when it fails.
///
/// # Errors
/// Every method that reaches the database fails with [`StoreError`] (or an error that
/// wraps it) when the database is unreachable or a statement fails.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// The database behind this store.
    fn backend(&self) -> Backend;

    /// The pool's open and idle connections, for `/metrics`.
    fn connections(&self) -> (u32, usize);

    /// Closes the pool, waiting for connections in use to come back.
    async fn close(&self);

    /// Applies the backend's migrations (safe for a whole fleet starting at once).
    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError>;

    /// One round trip, for readiness probes.
    async fn ping(&self) -> Result<(), StoreError>;

    // Counters (`counters.rs`): the no-op path.

    /// The session's counters and settings, in one primary-key read; `None` for a session
    /// with no row.
    async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError>;

    /// [`Store::counters`] of several sessions in one query, by session id; sessions
    /// with no row are left out.
    async fn counters_of(
        &self,
        session_ids: &[&str],
    ) -> Result<Vec<(String, Counters)>, StoreError>;

    // The lease and the commit (`commit.rs`).

    /// Takes the session's lease for `owner` for `duration` unless another owner holds
    /// an unexpired one, and loads its history with each message's fingerprint. `None`
    /// when another owner holds it (or the session has no row); no lease is taken when
    /// this fails.
    async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError>;

    /// Gives the lease up if `owner` still holds it; a no-op otherwise.
    async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError>;

    /// Gives the lease up after the planner refused the history `counted` describes with
    /// `keep_chars`, and remembers why when the reason depends on the history alone
    /// (`no_safe_boundary`, `nothing_to_compact`): until the counters change,
    /// [`Store::counters`] answers with it and, for the same keep, the worker neither
    /// takes the lease nor loads the history again.
    async fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError>;

    /// Gives the lease up after a failure, counts it for today under `reason` and puts
    /// the session in backoff (`base x 2^failures`, capped at `max`; none for a zero
    /// `base`). `owner` is the lease this worker holds; `None` when the failing statement
    /// took none: the backoff is then set unless another worker holds a live lease.
    async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: Reason,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError>;

    /// The session's messages in `seq` order.
    async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError>;

    /// Replaces the planned prefix with the summary in one transaction: fenced on the
    /// lease and on the prefix's seqs, sizes and fingerprints; archives the prefix,
    /// writes the usage event, drops a pending summary and releases the lease.
    ///
    /// # Errors
    /// [`CommitError::LeaseLost`] or [`CommitError::PrefixChanged`] when writing would be
    /// wrong; nothing is written in any case.
    async fn commit(&self, summary: &Record<'_>) -> Result<Committed, CommitError>;

    // Pending summaries (`pending.rs`): `SUMMARIZATION_PRECOMPUTE_AT`.

    /// Takes the lease for a precompute and loads the history, unless another owner
    /// holds it or the session has a pending summary younger than `ttl` planned with the
    /// same limits and model. `None` when there is nothing to do.
    async fn take_lease_for_precompute(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Option<Loaded>, StoreError>;

    /// Stores `pending` (planned with `limits`) as the session's pending summary and
    /// gives the lease back, fenced on the lease; drops other sessions' pending summaries
    /// older than `ttl` on the way.
    async fn save_pending(
        &self,
        pending: &Record<'_>,
        limits: Limits,
        ttl: Duration,
    ) -> Result<Saved, StoreError>;

    /// Applies the session's pending summary if it was planned with the turn's limits and
    /// model, is younger than `ttl` and its prefix is unchanged; drops it otherwise and
    /// says why. `ids` are the request's id and the durable job's, if any.
    async fn apply_pending(
        &self,
        session_id: &str,
        ids: (&str, Option<&str>),
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Applied, StoreError>;

    // Restore (`restore.rs`): an operator's view and undo.

    /// The session's counters, lease, backoff, settings and its last `limit`
    /// compactions; `None` for an unknown session.
    async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError>;

    /// Undoes the session's compactions from `from` (default: the newest only) to the
    /// newest, in one transaction; their usage events stay, marked `restored_at`.
    ///
    /// # Errors
    /// [`RestoreError`] saying why nothing was written.
    async fn restore(&self, session_id: &str, from: Option<i64>) -> Result<Restored, RestoreError>;

    /// Deletes archived messages older than `older_than` (counts only with `dry_run`);
    /// their usage events are marked `archive_pruned_at`.
    async fn prune_archive(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError>;

    // Recall (`recall.rs`): the agent's own archive.

    /// The archived messages of `session_id` that `query` asks for, each cut at
    /// `max_chars` chars: a search's best first, a fetch's in seq order. Never another
    /// session's rows.
    async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError>;

    // Settings (`settings.rs`).

    /// The session's own settings; all `None` without a row.
    async fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError>;

    /// Applies `changes` to the session's settings, checked as a whole (`configured`
    /// stands in for what the session inherits), in one transaction; returns what was
    /// written.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] when the edit is wrong; nothing is written then.
    async fn change_session_settings(
        &self,
        session_id: &str,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, SettingsError>;

    // Stats (`stats.rs`).

    /// Counts a failure of `reason` for today in the rollup.
    async fn count_failure(&self, reason: Reason) -> Result<(), StoreError>;

    /// The aggregates behind `/stats`, with the last `days` days of series.
    async fn stats(&self, days: i32) -> Result<StatsReport, StoreError>;

    // Dead letters (`dead_letters.rs`): jobs that failed for good.

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

    /// Undoes [`Store::mark_replayed`] after a failed publish.
    async fn unmark_replayed(&self, id: i64) -> Result<(), StoreError>;

    /// Deletes the replayed dead letters (all of them with `all`); returns how many.
    async fn purge_dead_letters(&self, all: bool) -> Result<u64, StoreError>;

    // Invariants (`invariants.rs`): `summarizer check` and `summarizer repair`.

    /// How many sessions, messages, archived messages and compactions there are.
    async fn check_totals(&self) -> Result<Totals, StoreError>;

    /// Every breach of `invariant`; empty when it holds.
    async fn breaches(&self, invariant: Invariant) -> Result<Vec<Finding>, StoreError>;

    /// Sessions whose counters differ from their messages, by session id. Writes nothing.
    async fn counter_drift(&self) -> Result<Vec<CounterDrift>, StoreError>;

    /// Recomputes drifted counters from the messages and writes them; returns what it
    /// changed (stored before, actual after).
    async fn repair_counters(&self) -> Result<Vec<CounterDrift>, StoreError>;
}

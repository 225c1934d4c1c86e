//! [`Store`]: the one interface the worker, the CLI and `/stats` use, whichever database
//! `DATABASE_URL` names. Both backends implement it with inherent methods of the same
//! names and signatures ([`PgStore`] over Postgres, [`SqliteStore`] over a file), so each
//! backend's code reads on its own and the list below is the whole contract: a method one
//! of them lacks, or declares otherwise, does not compile.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Applied, CommitError, Committed, CountedAt, CounterDrift, Counters, DeadLetter, Finding,
    Invariant, Loaded, NewDeadLetter, NewSummary, PgStore, Pruned, RestoreError, Restored, Saved,
    SessionView, SettingsError, SqliteStore, StatsReport, StoreError, Totals,
};
use crate::config::Limits;
use crate::outcome::Reason;
use crate::overrides::{Change, SessionSettings};

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

/// Declares [`Store`] from one list of methods and implements it for both backends by
/// calling their inherent methods of the same name.
macro_rules! store {
    (
        $(
            $(#[$doc:meta])*
            fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
        )*
    ) => {
        #[async_trait]
        pub trait Store: Send + Sync + fmt::Debug {
            /// The database behind this store.
            fn backend(&self) -> Backend;
            /// The pool's open and idle connections, for `/metrics`.
            fn connections(&self) -> (u32, usize);
            /// Closes the pool, waiting for connections in use to come back.
            async fn close(&self);
            $( $(#[$doc])* async fn $name(&self $(, $arg: $ty)*) -> $ret; )*
        }

        #[async_trait]
        impl Store for PgStore {
            fn backend(&self) -> Backend {
                Backend::Postgres
            }
            fn connections(&self) -> (u32, usize) {
                (self.pool().size(), self.pool().num_idle())
            }
            async fn close(&self) {
                PgStore::close(self).await;
            }
            $( async fn $name(&self $(, $arg: $ty)*) -> $ret { PgStore::$name(self $(, $arg)*).await } )*
        }

        #[async_trait]
        impl Store for SqliteStore {
            fn backend(&self) -> Backend {
                Backend::Sqlite
            }
            fn connections(&self) -> (u32, usize) {
                (self.pool().size(), self.pool().num_idle())
            }
            async fn close(&self) {
                SqliteStore::close(self).await;
            }
            $( async fn $name(&self $(, $arg: $ty)*) -> $ret { SqliteStore::$name(self $(, $arg)*).await } )*
        }
    };
}

store! {
    /// Applies the backend's migrations.
    fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError>;
    /// One round trip, for readiness probes.
    fn ping(&self) -> Result<(), StoreError>;
    /// The session's counters and settings; `None` for a session with no row.
    fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError>;
    /// [`Store::counters`] of several sessions in one query, by session id.
    fn counters_of(&self, session_ids: &[&str]) -> Result<Vec<(String, Counters)>, StoreError>;
    /// Takes the session's lease unless another owner holds an unexpired one, and loads
    /// its history with each message's fingerprint. `None` when another owner holds it.
    fn take_lease_and_load(&self, session_id: &str, owner: &str, duration: Duration)
        -> Result<Option<Loaded>, StoreError>;
    /// Gives the lease up if `owner` still holds it.
    fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError>;
    /// Gives the lease up and remembers why the planner refused this history.
    fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError>;
    /// Gives the lease up after a failure and puts the session in backoff.
    fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: &str,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError>;
    /// The session's messages in `seq` order.
    fn messages(&self, session_id: &str) -> Result<Vec<crate::message::Message>, StoreError>;
    /// Replaces the planned prefix with the summary in one transaction, fenced on the
    /// lease and on the prefix's fingerprints.
    fn commit(&self, summary: &NewSummary<'_>) -> Result<Committed, CommitError>;
    /// Takes the lease for a precompute unless a fresh pending summary exists.
    fn take_lease_for_precompute(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Option<Loaded>, StoreError>;
    /// Stores a pending summary and gives the lease back, fenced on the lease.
    fn save_pending(&self, pending: &NewSummary<'_>, limits: Limits, ttl: Duration)
        -> Result<Saved, StoreError>;
    /// Applies the session's pending summary, or drops it and says why.
    fn apply_pending(
        &self,
        session_id: &str,
        ids: (&str, Option<&str>),
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Applied, StoreError>;
    /// Counts a failure of `reason` for today.
    fn count_failure(&self, reason: &str) -> Result<(), StoreError>;
    /// The aggregates behind `/stats`, with `days` days of series.
    fn stats(&self, days: i32) -> Result<StatsReport, StoreError>;
    /// A session's counters, lease, backoff, settings and last compactions.
    fn session(&self, session_id: &str, limit: i64) -> Result<Option<SessionView>, StoreError>;
    /// Undoes the session's compactions from `from` (default: the newest) on.
    fn restore(&self, session_id: &str, from: Option<i64>) -> Result<Restored, RestoreError>;
    /// Deletes archived messages older than `older_than`.
    fn prune_archive(&self, older_than: Duration, dry_run: bool) -> Result<Pruned, StoreError>;
    /// How many sessions, messages, archived messages and compactions there are.
    fn check_totals(&self) -> Result<Totals, StoreError>;
    /// Every breach of `invariant`.
    fn breaches(&self, invariant: Invariant) -> Result<Vec<Finding>, StoreError>;
    /// Sessions whose counters differ from their messages.
    fn counter_drift(&self) -> Result<Vec<CounterDrift>, StoreError>;
    /// Recomputes drifted counters and writes them.
    fn repair_counters(&self) -> Result<Vec<CounterDrift>, StoreError>;
    /// The session's own settings.
    fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError>;
    /// Applies `changes` to the session's settings.
    fn change_session_settings(&self, session_id: &str, changes: &[Change], configured: Limits)
        -> Result<SessionSettings, SettingsError>;
    /// Whether the session has a compaction made for the durable job `job_id`.
    fn compacted_by_job(&self, session_id: &str, job_id: &str) -> Result<bool, StoreError>;
    /// Keeps a job that failed for good; `None` when it is kept already.
    fn dead_letter(&self, job: &NewDeadLetter<'_>) -> Result<Option<i64>, StoreError>;
    /// The dead letters not replayed yet (all of them with `all`).
    fn dead_letters(&self, all: bool) -> Result<Vec<DeadLetter>, StoreError>;
    /// Marks a dead letter replayed; `false` when it already was.
    fn mark_replayed(&self, id: i64) -> Result<bool, StoreError>;
    /// Undoes [`Store::mark_replayed`] after a failed publish.
    fn unmark_replayed(&self, id: i64) -> Result<(), StoreError>;
    /// Deletes replayed dead letters (all of them with `all`).
    fn purge_dead_letters(&self, all: bool) -> Result<u64, StoreError>;
}

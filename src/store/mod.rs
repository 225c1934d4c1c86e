//! The session store: [`Store`] is the one interface the worker, the CLI and `/stats`
//! use, whichever database `DATABASE_URL` names.
//!
//! - One module per concern (`counters`, `leases`, `pending`, `operations`, `recall`,
//!   `settings`, `stats`, `dead_letters`, `invariants`): its trait, and the records and
//!   errors it exchanges with callers, and the row decodings both backends share.
//!   [`Store`] is their sum; `error` holds [`StoreError`].
//! - `sql.rs`: the statements that are the same text in both dialects.
//! - `postgres/` ([`PgStore`]) and `sqlite/` ([`SqliteStore`]): the backends, as equals,
//!   each implementing every concern's trait in its file of the same name, so that
//!   diffing two files of the same name shows how the dialects differ. Neither imports
//!   the other.
//! - `batch.rs`: [`CounterReader`], which coalesces the threshold checks of concurrent
//!   events into one [`Counts::counters_of`] per batch, over any store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

// First: its macros are spliced into both backends' statements.
#[macro_use]
mod sql;
mod batch;
mod counters;
mod dead_letters;
mod error;
mod invariants;
mod leases;
mod operations;
mod pending;
pub mod postgres;
mod recall;
mod settings;
pub mod sqlite;
mod stats;

pub use batch::CounterReader;
pub use counters::{Claimed, Counters, Counts};
pub use dead_letters::{DeadLetter, DeadLetters, NewDeadLetter};
pub use error::{StoreError, is_unreachable};
pub use invariants::{CounterDrift, Finding, Invariant, Invariants, SessionCounts, Totals};
pub use leases::{CommitError, Committed, Leases};
pub use operations::{
    CompactionView, NotRestored, NotRestoredReason, Operations, Pruned, RestoreError, Restored,
    SessionView,
};
pub use pending::{Applied, Discard, Pending, Saved};
pub use postgres::PgStore;
pub use recall::{Recall, RecallBudget, RecallQuery};
pub use settings::{SettingsError, SettingsTable};
pub use sqlite::SqliteStore;
pub use stats::{Aggregates, Day, Stats, StatsReport};
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

/// What the worker, the CLI and `/stats` ask of a database: the sum of one trait per
/// concern, each implemented by both backends in their file of that concern (so that a
/// method is written once per backend, and diffing two files of the same name shows how
/// the dialects differ). Every method is one short transaction or less: none holds a
/// connection across an LLM call, and none leaves a partial write behind when it fails.
/// Bring the traits into scope with `use crate::store::prelude::*`.
///
/// # Errors
/// Every method that reaches the database fails with [`StoreError`] (or an error that
/// wraps it) when the database is unreachable or a statement fails.
pub trait Store:
    Lifecycle
    + Counts
    + Leases
    + Pending
    + Operations
    + Recall
    + SettingsTable
    + Aggregates
    + DeadLetters
    + Invariants
    + fmt::Debug
{
}

impl<T> Store for T where
    T: Lifecycle
        + Counts
        + Leases
        + Pending
        + Operations
        + Recall
        + SettingsTable
        + Aggregates
        + DeadLetters
        + Invariants
        + fmt::Debug
{
}

/// The pool and the schema: what every backend has before any concern.
#[async_trait]
pub trait Lifecycle: Send + Sync {
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
}

/// Every concern's trait, unnamed: `use crate::store::prelude::*` lets a caller call any
/// [`Store`] method.
pub mod prelude {
    pub use super::{
        Aggregates as _, Counts as _, DeadLetters as _, Invariants as _, Leases as _,
        Lifecycle as _, Operations as _, Pending as _, Recall as _, SettingsTable as _,
    };
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

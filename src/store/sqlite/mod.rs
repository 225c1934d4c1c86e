//! SQLite: the embedded store for one node (`DATABASE_URL=sqlite:///path/to/file.db`).
//!
//! The same schema semantics as Postgres (migrations in `migrations/sqlite/`), with what
//! SQLite lacks stood in for:
//! - a message's fingerprint is its `row_version`, a random 64-bit value the row gets at
//!   insert and again at every update of its content (a trigger), where Postgres reads
//!   `xmin`: a row edited, or deleted and inserted again, has another one;
//! - the lease's and backoff's instants are unix milliseconds bound from this process
//!   (every process sharing the file shares the host's clock);
//! - writing transactions begin `IMMEDIATE`, taking the file's one write lock first, so
//!   two processes never both read and then both try to write; a busy timeout makes a
//!   writer wait for the lock instead of failing;
//! - within one process, writes take turns on an async mutex before they ask SQLite for
//!   the lock: SQLite's busy handler waits by sleeping and polling (1, 2, 5, ... 100 ms),
//!   so 64 compactions of one worker contending for the file left it idle between
//!   writers; in turn, they queue and each finds the lock free (other processes, and
//!   agents, still meet the busy handler).

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{Backend, Lifecycle, StoreError};

/// How long a statement waits for another connection's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// This process's writes, one at a time (see the module's doc).
    writes: Arc<Mutex<()>>,
}

impl SqliteStore {
    /// A lazily connecting pool over the file `url` names (created if missing, which is
    /// logged with its absolute path: a mistyped path would otherwise serve an empty
    /// database in silence), in WAL mode with a busy timeout and recursive triggers on
    /// (see the migration). `sqlite::memory:` is one private in-memory database, held by
    /// a single connection for the pool's life.
    ///
    /// # Errors
    /// When `url` is not a valid SQLite URL.
    pub fn connect_lazy(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let options = connect_options(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(false);
        let memory = is_memory(url);
        let file = options.get_filename();
        if !memory && !file.exists() {
            let path = std::path::absolute(file).unwrap_or_else(|_| file.to_owned());
            tracing::info!(path = %path.display(), "the SQLite file does not exist: creating it");
        }
        let pool = SqlitePoolOptions::new()
            // Each connection to `:memory:` is a database of its own: one connection,
            // kept for the pool's life, is the only way they all see the same one.
            .max_connections(if memory { 1 } else { max_connections })
            .min_connections(u32::from(memory))
            .idle_timeout(None::<Duration>)
            .max_lifetime(None::<Duration>)
            .acquire_timeout(acquire_timeout)
            .connect_lazy_with(options);
        Ok(Self::from_pool(pool))
    }

    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            pool,
            writes: Arc::default(),
        }
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// This process's turn to write: hold it over a statement or transaction that writes.
    /// Waits at most [`BUSY_TIMEOUT`], as SQLite waits for another process's lock: when
    /// another process (an agent's open transaction) holds the file, the writers queued
    /// here fail after that long, not one busy timeout after another.
    async fn write_turn(&self) -> Result<OwnedMutexGuard<()>, sqlx::Error> {
        tokio::time::timeout(BUSY_TIMEOUT, self.writes.clone().lock_owned())
            .await
            .map_err(|_| {
                sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the SQLite file stayed locked: no turn to write within the busy timeout",
                ))
            })
    }

    /// Begins a transaction that holds this process's write turn and the file's write
    /// lock from its first statement.
    async fn begin_write(&self) -> Result<WriteTx, sqlx::Error> {
        let turn = self.write_turn().await?;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx { tx, _turn: turn })
    }
}

/// How many times [`SqliteStore::migrate`] runs the migrations before it gives up.
const MIGRATION_ATTEMPTS: u32 = 5;

/// `url`'s options with what every connection of this project to a SQLite file sets: the
/// busy timeout, and recursive triggers on, without which SQLite fires no delete trigger
/// for a row that INSERT OR REPLACE removes and the session's counters would drift.
///
/// # Errors
/// When `url` is not a valid SQLite URL.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .busy_timeout(BUSY_TIMEOUT)
        .pragma("recursive_triggers", "ON"))
}

/// A writing transaction ([`SqliteStore::begin_write`]): a connection (`&mut *tx`) that
/// is rolled back when dropped uncommitted.
pub(super) struct WriteTx {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    _turn: OwnedMutexGuard<()>,
}

impl WriteTx {
    pub(super) async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl std::ops::Deref for WriteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

/// Removes the SQLite database at `path` with its WAL and shared-memory files, those that
/// exist: for the files the demo and the lab make and throw away.
pub fn remove_files(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// Whether `url` names an in-memory database.
fn is_memory(url: &str) -> bool {
    url.starts_with("sqlite::memory:") || url.contains("mode=memory")
}

/// Now, in unix milliseconds: the unit of the lease's and backoff's columns.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `strftime` for timestamps stored and shown as text: RFC 3339, UTC, milliseconds, the
/// form Postgres's columns are shown in (`2026-12-03T08:16:00.123Z`).
pub(super) const RFC3339: &str = "%Y-%m-%dT%H:%M:%fZ";

/// The session's lease is free: no owner, or its expiry has passed; `$now` is the
/// placeholder of now, in unix milliseconds.
macro_rules! lease_free_sql {
    ($now:literal) => {
        concat!("(lease_owner IS NULL OR lease_expires_at <= ", $now, ")")
    };
}

/// Counts a failure of the reason `$1` for today (UTC) in the rollup.
macro_rules! count_failure_sql {
    () => {
        "INSERT INTO failure_daily (day, reason, failures)
         VALUES (date('now'), $1, 1)
         ON CONFLICT (day, reason) DO UPDATE SET failures = failures + 1"
    };
}

// After the SQL macros, which they use.
mod counters;
mod dead_letters;
mod invariants;
mod leases;
mod operations;
mod pending;
mod recall;
mod settings;
mod stats;

#[async_trait]
impl Lifecycle for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn connections(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    /// Closes the pool, waiting for connections in use to come back.
    async fn close(&self) {
        self.pool.close().await;
    }

    /// Applies the migrations in `migrations/sqlite/`.
    ///
    /// sqlx takes no lock around SQLite migrations (its Postgres migrator holds an
    /// advisory lock): processes started at once on a new file each find nothing
    /// applied, and all but the first then fail on tables that exist. A failed run is
    /// tried again, a few times, after a pause: by then the first process has applied the
    /// migrations and a run finds nothing left to do. A migration that really fails fails
    /// every time and is reported after the last attempt.
    ///
    /// # Errors
    /// When the file cannot be opened or a migration fails.
    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        let mut attempts = 1;
        loop {
            match sqlx::migrate!("./migrations/sqlite").run(&self.pool).await {
                Err(e) if attempts < MIGRATION_ATTEMPTS => {
                    tracing::debug!(error = %e, "migrating the SQLite file; trying again");
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100 * fastrand::u64(1..=5))).await;
                }
                done => return done,
            }
        }
    }

    /// One round trip, for readiness probes.
    ///
    /// # Errors
    /// When the file cannot be opened.
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

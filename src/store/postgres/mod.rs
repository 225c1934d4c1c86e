//! Postgres ([`PgStore`]): the store a fleet shares.
//!
//! One file per concern, named as the store's concerns and SQLite's files are
//! (`counters`, `leases`, `pending`, `operations`, `recall`, `settings`, `stats`,
//! `dead_letters`, `invariants`), each implementing its concern's trait; this one holds
//! the pool, the migrations and [`Lifecycle`]. Each function is one or a few statements
//! named for exactly what they do, and none holds a connection longer than its own
//! statements: the worker calls the LLM between taking the lease
//! ([`crate::store::Leases::take_lease_and_load`]) and the commit, holding nothing but the
//! lease row's owner id.
//!
//! The commit fences on the content of what it removes, not only its shape: each
//! message's fingerprint (`fingerprint_sql!`) is computed by the database when the
//! history is loaded and again over the rows the commit deletes, so an edit that keeps
//! every length still writes nothing.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use super::{Backend, Lifecycle, StoreError};

/// One message's fingerprint, as SQL over a `messages` row: the row version's `xmin`,
/// the id of the transaction that wrote it. Any UPDATE writes a new row version, and a
/// row deleted and inserted again is a new one, so a message that is not exactly the one
/// loaded has another `xmin`, whatever its content and length; an UPDATE that writes the
/// same values also changes it, which only makes the commit give up (`conflict`) where
/// it need not. It costs nothing to read, where an md5 over each row's text cost the
/// load and the commit a third of a compaction's own cost (docs/benchmarks.md, "Figures
/// behind the code"). (Freezing keeps the value `xmin` reads; the
/// 32-bit id wraps around only over billions of transactions, not within a lease.)
/// Load and commit splice this same text, so they cannot disagree on what is read.
macro_rules! fingerprint_sql {
    () => {
        "xmin::text"
    };
}

/// After a `lease` CTE that returns the session's id when the lease was taken: the
/// session's messages in `seq` order with their fingerprints, as `leases::loaded_from` reads
/// them (no row: not leased; one row of NULLs, the LEFT JOIN: leased, no messages).
macro_rules! load_leased_sql {
    () => {
        concat!(
            "SELECT m.seq, m.role, coalesce(m.content, '') AS content, m.tool_calls,
                    m.tool_call_id, m.is_summary, m.chars::bigint AS chars, m.pinned, m.fingerprint,
                    m.cleared_by IS NOT NULL AS cleared
             FROM lease LEFT JOIN (
                 SELECT *, ",
            fingerprint_sql!(),
            " AS fingerprint FROM messages
             ) AS m ON m.session_id = lease.session_id
             ORDER BY m.seq"
        )
    };
}

// After the SQL macros, which they use.
mod counters;
mod dead_letters;
mod invariants;
mod leases;
mod pending;
mod recall;

mod operations;
mod settings;
mod stats;

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// A lazily connecting pool: the worker starts, and reports the database as it finds it,
    /// even when Postgres is not up yet.
    ///
    /// # Errors
    /// When `url` is not a valid Postgres URL.
    pub fn connect_lazy(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?.application_name("summarizer");
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(acquire_timeout)
            // A ping before every checkout is a round trip per query; a dead connection
            // instead fails its one statement (store_error, fail open) and is dropped.
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates the database `url` names unless it exists, through the `postgres` database
    /// of the same server. Returns whether it created it.
    ///
    /// # Errors
    /// When the server is unreachable or refuses.
    pub async fn create_database_if_missing(url: &str) -> Result<bool, StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        let name = options.get_database().unwrap_or("postgres").to_owned();
        let mut admin = options.database("postgres").connect().await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&name)
                .fetch_one(&mut admin)
                .await?;
        if !exists {
            // Identifiers cannot be bound; quote_ident makes the name safe to splice.
            let quoted: String = sqlx::query_scalar("SELECT quote_ident($1)")
                .bind(&name)
                .fetch_one(&mut admin)
                .await?;
            let create = format!("CREATE DATABASE {quoted}");
            match sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                .execute(&mut admin)
                .await
            {
                Ok(_) => {}
                // Another process created it meanwhile (duplicate_database).
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => return Err(e.into()),
            }
        }
        admin.close().await?;
        Ok(!exists)
    }
}

#[async_trait]
impl Lifecycle for PgStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn connections(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    /// Closes the pool, waiting for connections in use to come back.
    async fn close(&self) {
        self.pool.close().await;
    }

    /// Applies the migrations in `migrations/`. sqlx holds an advisory lock meanwhile, so
    /// a whole fleet may start at once.
    ///
    /// # Errors
    /// When the database is unreachable or a migration fails.
    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        sqlx::migrate!().run(&self.pool).await
    }

    /// One round trip, for readiness probes.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

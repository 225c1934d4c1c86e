//! Postgres ([`PgStore`]): the store a fleet shares.
//!
//! One file per concern, named as SQLite's are (`counters`, `commit`, `pending`,
//! `restore`, `settings`, `stats`, `dead_letters`, `invariants`); this one holds the
//! pool, the migrations and the [`Store`] impl. Each function is one or a few statements
//! named for exactly what they do, and none holds a connection longer than its own
//! statements: the worker calls the LLM between [`PgStore::take_lease_and_load`] and
//! [`PgStore::commit`] holding nothing but the lease row's owner id.
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

use super::{
    Applied, Backend, CommitError, Committed, CounterDrift, Counters, DeadLetter, Finding,
    Invariant, NewDeadLetter, Pruned, RecallQuery, Recalled, RestoreError, Restored, Saved,
    SessionView, SettingsError, StatsReport, Store, StoreError, Totals,
};
use crate::compaction::{CountedAt, Loaded, Record};
use crate::config::Limits;
use crate::message::Message;
use crate::outcome::Reason;
use crate::overrides::{Change, SessionSettings};

/// One message's fingerprint, as SQL over a `messages` row: the row version's `xmin`,
/// the id of the transaction that wrote it. Any UPDATE writes a new row version, and a
/// row deleted and inserted again is a new one, so a message that is not exactly the one
/// loaded has another `xmin`, whatever its content and length; an UPDATE that writes the
/// same values also changes it, which only makes the commit give up (`conflict`) where
/// it need not. It costs nothing to read, where an md5 over each row's text cost the
/// load and the commit about 1.5 ms each on a 1,000-message session (EXPLAIN ANALYZE),
/// a third of a compaction's own cost. (Freezing keeps the value `xmin` reads; the
/// 32-bit id wraps around only over billions of transactions, not within a lease.)
/// Load and commit splice this same text, so they cannot disagree on what is read.
macro_rules! fingerprint_sql {
    () => {
        "xmin::text"
    };
}

/// After a `lease` CTE that returns the session's id when the lease was taken: the
/// session's messages in `seq` order with their fingerprints, as `commit::loaded_from` reads
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
mod commit;
mod counters;
mod dead_letters;
mod invariants;
mod pending;
mod recall;
pub use recall::RecallBudget;
mod restore;
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

    /// Closes the pool, waiting for connections in use to come back.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Applies the migrations in `migrations/`. sqlx holds an advisory lock meanwhile, so
    /// a whole fleet may start at once.
    ///
    /// # Errors
    /// When the database is unreachable or a migration fails.
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        sqlx::migrate!().run(&self.pool).await
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

    /// One round trip, for readiness probes.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn connections(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    async fn close(&self) {
        PgStore::close(self).await;
    }

    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        PgStore::migrate(self).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        PgStore::ping(self).await
    }

    async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError> {
        PgStore::counters(self, session_id).await
    }

    async fn counters_of(
        &self,
        session_ids: &[&str],
    ) -> Result<Vec<(String, Counters)>, StoreError> {
        PgStore::counters_of(self, session_ids).await
    }

    async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        PgStore::take_lease_and_load(self, session_id, owner, duration).await
    }

    async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError> {
        PgStore::release_lease(self, session_id, owner).await
    }

    async fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError> {
        PgStore::release_lease_remembering(self, session_id, owner, reason, counted, keep_chars)
            .await
    }

    async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: Reason,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError> {
        PgStore::record_failure(self, session_id, owner, reason, base, max).await
    }

    async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        PgStore::messages(self, session_id).await
    }

    async fn commit(&self, summary: &Record<'_>) -> Result<Committed, CommitError> {
        PgStore::commit(self, summary).await
    }

    async fn take_lease_for_precompute(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        PgStore::take_lease_for_precompute(self, session_id, owner, duration, planned, ttl).await
    }

    async fn save_pending(
        &self,
        pending: &Record<'_>,
        limits: Limits,
        ttl: Duration,
    ) -> Result<Saved, StoreError> {
        PgStore::save_pending(self, pending, limits, ttl).await
    }

    async fn apply_pending(
        &self,
        session_id: &str,
        ids: (&str, Option<&str>),
        planned: (Limits, Option<&str>),
        ttl: Duration,
    ) -> Result<Applied, StoreError> {
        PgStore::apply_pending(self, session_id, ids, planned, ttl).await
    }

    async fn session(
        &self,
        session_id: &str,
        limit: i64,
    ) -> Result<Option<SessionView>, StoreError> {
        PgStore::session(self, session_id, limit).await
    }

    async fn restore(&self, session_id: &str, from: Option<i64>) -> Result<Restored, RestoreError> {
        PgStore::restore(self, session_id, from).await
    }

    async fn prune_archive(
        &self,
        older_than: Duration,
        dry_run: bool,
    ) -> Result<Pruned, StoreError> {
        PgStore::prune_archive(self, older_than, dry_run).await
    }

    async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError> {
        PgStore::recall(self, session_id, query, max_chars).await
    }

    async fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError> {
        PgStore::session_settings(self, session_id).await
    }

    async fn change_session_settings(
        &self,
        session_id: &str,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, SettingsError> {
        PgStore::change_session_settings(self, session_id, changes, configured).await
    }

    async fn count_failure(&self, reason: Reason) -> Result<(), StoreError> {
        PgStore::count_failure(self, reason).await
    }

    async fn stats(&self, days: i32) -> Result<StatsReport, StoreError> {
        PgStore::stats(self, days).await
    }

    async fn compacted_by_job(&self, session_id: &str, job_id: &str) -> Result<bool, StoreError> {
        PgStore::compacted_by_job(self, session_id, job_id).await
    }

    async fn dead_letter(&self, job: &NewDeadLetter<'_>) -> Result<Option<i64>, StoreError> {
        PgStore::dead_letter(self, job).await
    }

    async fn dead_letters(&self, all: bool) -> Result<Vec<DeadLetter>, StoreError> {
        PgStore::dead_letters(self, all).await
    }

    async fn mark_replayed(&self, id: i64) -> Result<bool, StoreError> {
        PgStore::mark_replayed(self, id).await
    }

    async fn unmark_replayed(&self, id: i64) -> Result<(), StoreError> {
        PgStore::unmark_replayed(self, id).await
    }

    async fn purge_dead_letters(&self, all: bool) -> Result<u64, StoreError> {
        PgStore::purge_dead_letters(self, all).await
    }

    async fn check_totals(&self) -> Result<Totals, StoreError> {
        PgStore::check_totals(self).await
    }

    async fn breaches(&self, invariant: Invariant) -> Result<Vec<Finding>, StoreError> {
        PgStore::breaches(self, invariant).await
    }

    async fn counter_drift(&self) -> Result<Vec<CounterDrift>, StoreError> {
        PgStore::counter_drift(self).await
    }

    async fn repair_counters(&self) -> Result<Vec<CounterDrift>, StoreError> {
        PgStore::repair_counters(self).await
    }
}

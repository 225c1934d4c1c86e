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

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{
    CommitError, Committed, CountedAt, Counters, Loaded, NewSummary, StoreError, millis,
    rememberable, remembered,
};
use crate::message::{Message, Role};
use crate::outcome::Reason;

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

    /// Closes the pool, waiting for connections in use to come back.
    pub async fn close(&self) {
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
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
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

/// A session's counters and settings, as [`counters_from`] reads them; `?1` is now
/// ([`now_ms`]). The remembered skip applies only while the counters are those it was
/// made at.
macro_rules! select_counters_sql {
    () => {
        "SELECT sessions.session_id, total_chars, message_count, human_turns, last_compaction_id,
           coalesce(retry_at > ?1, 0) AS backing_off,
           CASE WHEN skip_at_chars = total_chars AND skip_at_count = message_count
                THEN skip_reason END AS skip_reason,
           skip_at_keep,
           st.enabled AS settings_enabled, st.threshold_chars AS settings_threshold_chars,
           st.keep_chars AS settings_keep_chars, st.model AS settings_model
    FROM sessions LEFT JOIN session_settings AS st ON st.session_id = sessions.session_id "
    };
}

/// The session's lease is free: no owner, or its expiry has passed; `$now` is the
/// placeholder of now, in unix milliseconds.
macro_rules! lease_free_sql {
    ($now:literal) => {
        concat!("(lease_owner IS NULL OR lease_expires_at <= ", $now, ")")
    };
}

/// Counts a failure of the reason `?1` for today (UTC) in the rollup.
macro_rules! count_failure_sql {
    () => {
        "INSERT INTO failure_daily (day, reason, failures)
         VALUES (date('now'), ?1, 1)
         ON CONFLICT (day, reason) DO UPDATE SET failures = failures + 1"
    };
}

// After the SQL macros, which they use.
mod check;
mod dead_letters;
mod pending;
mod restore;
mod settings;
mod stats;
#[cfg(test)]
mod tests;

impl SqliteStore {
    /// One round trip, for readiness probes.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The session's counters: one primary-key read. `None` for a session with no row.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError> {
        let row = sqlx::query(concat!(
            select_counters_sql!(),
            "WHERE sessions.session_id = ?2"
        ))
        .bind(now_ms())
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| counters_from(&r))
            .transpose()
            .map_err(Into::into)
    }

    /// The counters of `session_ids`, in one query.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn counters_of(
        &self,
        session_ids: &[&str],
    ) -> Result<Vec<(String, Counters)>, StoreError> {
        let ids = serde_json::to_string(session_ids).map_err(|e| sqlx::Error::Encode(e.into()))?;
        let rows = sqlx::query(concat!(
            select_counters_sql!(),
            "WHERE sessions.session_id IN (SELECT value FROM json_each(?2))"
        ))
        .bind(now_ms())
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("session_id")?, counters_from(r)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Takes the session's lease for `owner` unless another owner holds an unexpired one,
    /// then loads the session's messages with their fingerprints. Two statements, where
    /// Postgres makes one: a message appended in between is loaded or not, and either
    /// way the commit fences on what was loaded.
    ///
    /// # Errors
    /// When the database fails; no lease is taken then.
    pub async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        let turn = self.write_turn().await?;
        let taken = sqlx::query(concat!(
            "UPDATE sessions SET lease_owner = ?2, lease_expires_at = ?3 + ?4
             WHERE session_id = ?1 AND ",
            lease_free_sql!("?3")
        ))
        .bind(session_id)
        .bind(owner)
        .bind(now_ms())
        .bind(millis(duration))
        .execute(&self.pool)
        .await?
        .rows_affected();
        drop(turn);
        self.load_if_leased(taken > 0, session_id, owner).await
    }

    /// After a statement that took the session's lease for `owner` (`leased`) or not:
    /// the history, or `None`. A failed load gives the lease back.
    async fn load_if_leased(
        &self,
        leased: bool,
        session_id: &str,
        owner: &str,
    ) -> Result<Option<Loaded>, StoreError> {
        if !leased {
            return Ok(None);
        }
        match self.load(session_id).await {
            Ok(loaded) => Ok(Some(loaded)),
            Err(e) => {
                // Not left holding a lease nobody will use.
                let _ = self.release_lease(session_id, owner).await;
                Err(e)
            }
        }
    }

    /// The session's messages in `seq` order, with their fingerprints.
    async fn load(&self, session_id: &str) -> Result<Loaded, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, role, coalesce(content, '') AS content, tool_calls, tool_call_id,
                    is_summary, chars, CAST(row_version AS TEXT) AS fingerprint
             FROM messages WHERE session_id = ?1 ORDER BY seq",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        let messages = rows.iter().map(message_from).collect::<Result<_, _>>()?;
        let fingerprints = rows
            .iter()
            .map(|r| r.try_get("fingerprint"))
            .collect::<Result<_, _>>()?;
        Ok(Loaded {
            messages,
            fingerprints,
        })
    }

    /// Gives the lease up if `owner` still holds it; a no-op otherwise.
    ///
    /// # Errors
    /// When the database fails; the lease then runs out by itself.
    pub async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError> {
        let _turn = self.write_turn().await?;
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
             WHERE session_id = ?1 AND lease_owner = ?2",
        )
        .bind(session_id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives the lease up and remembers why the planner refused the history `counted`
    /// describes, as [`super::PgStore::release_lease_remembering`] does.
    ///
    /// # Errors
    /// When the database fails; the lease then runs out by itself.
    pub async fn release_lease_remembering(
        &self,
        session_id: &str,
        owner: &str,
        reason: Reason,
        counted: CountedAt,
        keep_chars: i64,
    ) -> Result<(), StoreError> {
        if !rememberable(reason) {
            return self.release_lease(session_id, owner).await;
        }
        let _turn = self.write_turn().await?;
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 skip_reason = ?3, skip_at_chars = ?4, skip_at_count = ?5, skip_at_keep = ?6
             WHERE session_id = ?1 AND lease_owner = ?2",
        )
        .bind(session_id)
        .bind(owner)
        .bind(reason.as_str())
        .bind(counted.total_chars)
        .bind(counted.message_count)
        .bind(keep_chars)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives the lease up after a failure and puts the session in backoff, as
    /// [`super::PgStore::record_failure`] does (the same exponent cap of 30; a product
    /// past SQLite's integers becomes a real, and the cap at `max` applies to it).
    ///
    /// # Errors
    /// When the database fails; the lease then runs out by itself.
    pub async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: &str,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(count_failure_sql!())
            .bind(reason)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = failures + (failures < 2147483647),
                 retry_at = CASE WHEN ?3 > 0
                     THEN ?5 + min(?3 * (1 << min(failures, 30)), ?4)
                 END
             WHERE session_id = ?1
               AND (lease_owner = ?2
                    OR (?2 IS NULL AND (lease_owner IS NULL OR lease_expires_at <= ?5)))",
        )
        .bind(session_id)
        .bind(owner)
        .bind(millis(base))
        .bind(millis(max))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The session's messages in `seq` order.
    ///
    /// # Errors
    /// When the database fails.
    pub async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        Ok(self.load(session_id).await?.messages)
    }

    /// Replaces the planned prefix with the summary, in one transaction that holds the
    /// file's write lock from its first statement: fences on the lease, checks the prefix
    /// is exactly as planned (seqs, chars and row versions), writes the usage event,
    /// archives and deletes the prefix, drops a pending summary, inserts the summary in
    /// the prefix's place and releases the lease. Appends from other connections wait
    /// for it (busy timeout) and land after it.
    ///
    /// # Errors
    /// As [`super::PgStore::commit`]; nothing is written in any case.
    pub async fn commit(&self, summary: &NewSummary<'_>) -> Result<Committed, CommitError> {
        let mut tx = self.begin_write().await?;
        let fenced = sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = 0, retry_at = NULL
             WHERE session_id = ?1 AND lease_owner = ?2",
        )
        .bind(summary.session_id)
        .bind(summary.lease_owner)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if fenced == 0 {
            return Err(CommitError::LeaseLost);
        }
        let prefix = Prefix::read(&mut tx, summary.session_id, summary.cut_seq).await?;
        // Dropping the transaction rolls it back.
        let first_seq = match prefix.seqs.first() {
            Some(&first)
                if prefix.is(
                    summary.removed_seqs,
                    summary.removed_chars,
                    summary.removed_fingerprints,
                ) =>
            {
                first
            }
            _ => return Err(CommitError::PrefixChanged),
        };
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO usage_events
                 (session_id, model, prompt_tokens, completion_tokens, total_tokens, metadata)
             VALUES (?1, ?2, ?3, ?4, ?3 + ?4, ?5)
             RETURNING id",
        )
        .bind(summary.session_id)
        .bind(summary.model)
        .bind(summary.prompt_tokens)
        .bind(summary.completion_tokens)
        .bind(summary.event_metadata().to_string())
        .fetch_one(&mut *tx)
        .await?;
        let superseded = replace_prefix(&mut tx, summary.session_id, summary.cut_seq, id).await?;
        write_summary(&mut tx, summary.session_id, first_seq, summary.text, id).await?;
        tx.commit().await?;
        Ok(Committed {
            compaction_id: id,
            superseded,
        })
    }
}

/// The non-system messages before a cut, as the commit compares them with the plan.
struct Prefix {
    seqs: Vec<i64>,
    chars: Vec<i64>,
    versions: Vec<String>,
}

impl Prefix {
    async fn read(
        tx: &mut SqliteConnection,
        session_id: &str,
        cut_seq: i64,
    ) -> Result<Self, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT seq, chars, CAST(row_version AS TEXT) AS version FROM messages
             WHERE session_id = ?1 AND seq < ?2 AND role <> 'system' ORDER BY seq",
        )
        .bind(session_id)
        .bind(cut_seq)
        .fetch_all(tx)
        .await?;
        let mut prefix = Self {
            seqs: Vec::with_capacity(rows.len()),
            chars: Vec::with_capacity(rows.len()),
            versions: Vec::with_capacity(rows.len()),
        };
        for row in &rows {
            prefix.seqs.push(row.try_get("seq")?);
            prefix.chars.push(row.try_get("chars")?);
            prefix.versions.push(row.try_get("version")?);
        }
        Ok(prefix)
    }

    /// Exactly the planned prefix: the same rows, of the same sizes, in the same versions.
    fn is(&self, seqs: &[i64], chars: &[i64], versions: &[String]) -> bool {
        self.seqs == seqs && self.chars == chars && self.versions == versions
    }
}

/// Archives the non-system messages before `cut_seq` under `compaction_id` and deletes
/// them, and drops the session's pending summary: `true` when there was one.
async fn replace_prefix(
    tx: &mut SqliteConnection,
    session_id: &str,
    cut_seq: i64,
    compaction_id: i64,
) -> Result<bool, sqlx::Error> {
    sqlx::query(
        "INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
             tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra)
         SELECT ?3, session_id, seq, role, content, tool_calls, tool_call_id, is_summary,
             chars, created_at, external_id, extra
         FROM messages WHERE session_id = ?1 AND seq < ?2 AND role <> 'system'",
    )
    .bind(session_id)
    .bind(cut_seq)
    .bind(compaction_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM messages WHERE session_id = ?1 AND seq < ?2 AND role <> 'system'")
        .bind(session_id)
        .bind(cut_seq)
        .execute(&mut *tx)
        .await?;
    let pending = sqlx::query("DELETE FROM pending_summaries WHERE session_id = ?1")
        .bind(session_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    Ok(pending > 0)
}

/// Inserts the summary at `seq` (the first removed message's) and records the compaction
/// as the session's latest.
async fn write_summary(
    tx: &mut SqliteConnection,
    session_id: &str,
    seq: i64,
    text: &str,
    compaction_id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content, is_summary)
         VALUES (?1, ?2, 'user', ?3, 1)",
    )
    .bind(session_id)
    .bind(seq)
    .bind(text)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE sessions SET last_compaction_id = ?2 WHERE session_id = ?1")
        .bind(session_id)
        .bind(compaction_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

fn counters_from(row: &SqliteRow) -> Result<Counters, sqlx::Error> {
    Ok(Counters {
        total_chars: row.try_get("total_chars")?,
        message_count: row.try_get("message_count")?,
        human_turns: row.try_get("human_turns")?,
        backing_off: row.try_get("backing_off")?,
        remembered_skip: row
            .try_get::<Option<String>, _>("skip_reason")?
            .and_then(|reason| remembered(&reason)),
        skip_at_keep: row.try_get("skip_at_keep")?,
        settings: settings::settings_from(row)?,
        last_compaction_id: row.try_get("last_compaction_id")?,
    })
}

fn message_from(row: &SqliteRow) -> Result<Message, sqlx::Error> {
    let role: String = row.try_get("role")?;
    let tool_calls = row
        .try_get::<Option<String>, _>("tool_calls")?
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| sqlx::Error::Decode(e.into()))?;
    Ok(Message {
        seq: row.try_get("seq")?,
        role: Role::from_str(&role).map_err(|e| sqlx::Error::Decode(e.into()))?,
        content: row.try_get("content")?,
        tool_calls,
        tool_call_id: row.try_get("tool_call_id")?,
        is_summary: row.try_get("is_summary")?,
        chars: row.try_get("chars")?,
    })
}

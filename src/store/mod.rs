//! Postgres: the session store, the lease and the commit of a compaction.
//!
//! Each function is one or a few statements named for exactly what they do. None holds a
//! connection longer than its own statements: the worker calls the LLM between
//! [`PgStore::take_lease_and_load`] and [`PgStore::commit`] holding nothing but the lease row's
//! owner id.
//!
//! The commit fences on the content of what it removes, not only its shape: each message's
//! fingerprint (`fingerprint_sql!`) is computed by the database when the history is loaded and
//! again over the rows the commit deletes, so an edit that keeps every length still writes
//! nothing.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{ConnectOptions, Connection, PgPool, Row};

use crate::fact_check::Figures;
use crate::message::{Message, Role};
use crate::outcome::Reason;
use crate::overrides::SessionSettings;

/// The database could not be reached, or a statement failed. Cheap to clone, so one
/// failed batch can be reported to every event in it.
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(Arc<sqlx::Error>);

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self(Arc::new(e))
    }
}

impl StoreError {
    /// The statement ran but a row it returned could not be decoded (text that is not
    /// UTF-8 in a SQLite file written before the write refused it): the database is up,
    /// and the same rows will fail the same way until an operator fixes them.
    pub fn is_undecodable_row(&self) -> bool {
        matches!(
            *self.0,
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)
        )
    }
}

/// Why a commit wrote nothing. The session is unchanged in every case.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Another worker took the lease over (ours had expired): it owns the session now.
    #[error("the session lease is no longer ours")]
    LeaseLost,
    /// The planned prefix changed during the LLM call (a message in it was deleted,
    /// edited, even to text of the same length, or inserted with an old seq).
    #[error("the planned prefix changed during summarization")]
    PrefixChanged,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CommitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

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
/// session's messages in `seq` order with their fingerprints, as [`loaded_from`] reads
/// them (no row: not leased; one row of NULLs, the LEFT JOIN: leased, no messages).
macro_rules! load_leased_sql {
    () => {
        concat!(
            "SELECT m.seq, m.role, coalesce(m.content, '') AS content, m.tool_calls,
                    m.tool_call_id, m.is_summary, m.chars, m.fingerprint
             FROM lease LEFT JOIN (
                 SELECT *, ",
            fingerprint_sql!(),
            " AS fingerprint FROM messages
             ) AS m ON m.session_id = lease.session_id
             ORDER BY m.seq"
        )
    };
}

/// The counters columns of a `sessions` row joined with its `session_settings` (as
/// [`counters_from_sessions_sql`] joins them), as [`counters_from`] reads them. The
/// remembered skip applies only while the counters are still those it was made at.
macro_rules! counters_columns_sql {
    () => {
        "total_chars, message_count, human_turns, last_compaction_id,
         coalesce(retry_at > now(), false) AS backing_off,
         CASE WHEN skip_at_chars = total_chars AND skip_at_count = message_count
              THEN skip_reason END AS skip_reason,
         skip_at_keep,
         st.enabled AS settings_enabled, st.threshold_chars AS settings_threshold_chars,
         st.keep_chars AS settings_keep_chars, st.model AS settings_model"
    };
}

/// `FROM` for [`counters_columns_sql`]: the session's settings come with its counters,
/// in the same primary-key lookup (a second one on `session_settings`' key), so the
/// no-op path pays no extra round trip for them.
macro_rules! counters_from_sessions_sql {
    () => {
        " FROM sessions LEFT JOIN session_settings AS st ON st.session_id = sessions.session_id "
    };
}

mod api;
mod batch;
mod check;
mod dead_letters;
mod pending;
mod restore;
mod settings;
pub mod sqlite;
mod stats;

pub use api::{Backend, SharedStore, Store, connect_lazy};
pub use batch::CounterReader;
pub use check::{CounterDrift, Finding, Invariant, SessionCounts, Totals};
pub use dead_letters::{DeadLetter, NewDeadLetter};
pub use pending::{Applied, Discard, Saved};
pub use restore::{CompactionView, Pruned, RestoreError, Restored, SessionView};
pub use settings::SettingsError;
pub use sqlite::SqliteStore;
pub use stats::{Day, Stats, StatsReport};

/// A session's counters, maintained by triggers on `messages`, and its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counters {
    pub total_chars: i64,
    pub message_count: i64,
    pub human_turns: i64,
    /// An LLM failure put the session in backoff, and it has not run out.
    pub backing_off: bool,
    /// The planner refused this very history before (`no_safe_boundary` or
    /// `nothing_to_compact`): same total chars and message count as then. It holds only
    /// for the keep it was planned with: see [`Counters::remembered_skip_for`].
    pub remembered_skip: Option<Reason>,
    /// The compaction in force (`sessions.last_compaction_id`), sent in every reply.
    pub last_compaction_id: Option<i64>,
    /// The `keep_chars` the remembered skip was planned with.
    pub skip_at_keep: Option<i64>,
    /// The session's row of `session_settings`; all `None` without one.
    pub settings: SessionSettings,
}

impl Counters {
    /// The remembered skip, if it was planned with `keep_chars`: both reasons depend on
    /// the keep (it places the cut), and a request or the session's settings may ask
    /// for another one than the last event did.
    pub fn remembered_skip_for(&self, keep_chars: i64) -> Option<Reason> {
        self.remembered_skip
            .filter(|_| self.skip_at_keep == Some(keep_chars))
    }
}

/// The reasons a skip is remembered for: both depend on the history alone, so they hold
/// until it changes. (Threshold and turn counts are read from the counters anyway.)
fn rememberable(reason: Reason) -> bool {
    matches!(reason, Reason::NoSafeBoundary | Reason::NothingToCompact)
}

/// A session's history as the worker loaded it with the lease.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// In `seq` order.
    pub messages: Vec<Message>,
    /// Each message's fingerprint as the database computed it at load, in the same order:
    /// what the commit compares the rows it deletes with.
    pub fingerprints: Vec<String>,
}

impl Loaded {
    /// The counters this history gives: what a skip planned on it is remembered with.
    pub fn counted(&self) -> CountedAt {
        CountedAt {
            total_chars: self.messages.iter().map(|m| m.chars).sum(),
            message_count: i64::try_from(self.messages.len()).unwrap_or(i64::MAX),
        }
    }
}

/// A session's total chars and message count at some point: see [`Loaded::counted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountedAt {
    pub total_chars: i64,
    pub message_count: i64,
}

/// Everything the commit transaction writes, planned before the LLM call.
#[derive(Debug)]
pub struct NewSummary<'a> {
    pub session_id: &'a str,
    pub lease_owner: &'a str,
    /// The seq of the first kept message: everything older that is not `system` goes.
    pub cut_seq: i64,
    /// The removed messages' seqs, chars and fingerprints ([`Loaded::fingerprints`]),
    /// oldest first, as planned.
    pub removed_seqs: &'a [i64],
    pub removed_chars: &'a [i64],
    pub removed_fingerprints: &'a [String],
    pub text: &'a str,
    pub model: &'a str,
    /// The session's own model (`session_settings.model`), recorded in the usage event's
    /// metadata as `requested_model` when set.
    pub requested_model: Option<&'a str>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The prompt's version, when a prompt asked for the summary.
    pub prompt_version: Option<&'a str>,
    /// Why the fallback summarizer wrote it, when it did (`LLM_FALLBACK`).
    pub fallback_reason: Option<&'a str>,
    pub messages_kept: i64,
    /// The tokenizer's count of the removed part, and of the summary.
    pub tokens_removed: i64,
    pub summary_tokens: i64,
    /// The fact check's figures; `None` when `SUMMARY_FACT_CHECK=off`.
    pub facts: Option<Figures>,
    pub request_id: &'a str,
    /// The durable job that asked for it, if one did ([`crate::worker::Event::job_id`]).
    pub job_id: Option<&'a str>,
    /// Time since the lease was taken, for the duration histogram.
    pub duration_ms: i64,
}

/// A compaction written by [`Store::commit`](crate::store::Store::commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The usage event's id, which is also the archive's `compaction_id`.
    pub compaction_id: i64,
    /// The session had a pending summary, now dropped: its LLM call was wasted.
    pub superseded: bool,
}

impl NewSummary<'_> {
    /// The usage event's metadata that describes the summary itself (tokens, prompt,
    /// fallback, model asked for, facts), without the turn's figures: what a pending
    /// summary stores for the turn that applies it.
    pub fn summary_metadata(&self) -> serde_json::Value {
        let mut metadata = json!({
            "tokens_removed": self.tokens_removed,
            "summary_tokens": self.summary_tokens,
        });
        if let Some(version) = self.prompt_version {
            metadata["prompt_version"] = json!(version);
        }
        if let Some(reason) = self.fallback_reason {
            metadata["fallback"] = json!(true);
            metadata["fallback_reason"] = json!(reason);
        }
        if let Some(model) = self.requested_model {
            metadata["requested_model"] = json!(model);
        }
        if let Some(facts) = &self.facts {
            metadata["facts_total"] = json!(facts.total);
            metadata["facts_kept"] = json!(facts.kept);
            metadata["fact_retry"] = json!(facts.retry.is_some());
            if let Some(outcome) = facts.retry {
                metadata["fact_retry_outcome"] = json!(outcome.as_str());
            }
        }
        metadata
    }

    /// The usage event's whole metadata: [`NewSummary::summary_metadata`] and the turn's
    /// figures (what was removed and kept, the request, the duration).
    pub fn event_metadata(&self) -> serde_json::Value {
        let chars_removed: i64 = self.removed_chars.iter().sum();
        let mut metadata = self.summary_metadata();
        for (key, value) in [
            ("summarization", json!(true)),
            ("messages_removed", json!(self.removed_seqs.len())),
            ("chars_removed", json!(chars_removed)),
            ("messages_kept", json!(self.messages_kept)),
            (
                "summary_chars",
                json!(crate::message::char_count(self.text)),
            ),
            ("request_id", json!(self.request_id)),
            ("duration_ms", json!(self.duration_ms)),
        ] {
            metadata[key] = value;
        }
        if let Some(job_id) = self.job_id {
            metadata["job_id"] = json!(job_id);
        }
        metadata
    }
}

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

    /// The session's counters: one primary-key read. `None` for a session with no row.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn counters(&self, session_id: &str) -> Result<Option<Counters>, StoreError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            counters_columns_sql!(),
            counters_from_sessions_sql!(),
            "WHERE sessions.session_id = $1"
        ))
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| counters_from(&r))
            .transpose()
            .map_err(Into::into)
    }

    /// Takes the session's lease for `owner` unless another owner holds an unexpired one,
    /// and in the same round trip loads the session's messages in `seq` order, with their
    /// fingerprints. `None` when another owner holds the lease.
    ///
    /// # Errors
    /// When the database is unreachable; no lease is taken then.
    pub async fn take_lease_and_load(
        &self,
        session_id: &str,
        owner: &str,
        duration: Duration,
    ) -> Result<Option<Loaded>, StoreError> {
        // No row: not leased. One row of NULLs (the LEFT JOIN): leased, no messages.
        let rows = sqlx::query(concat!(
            "WITH lease AS (
                 UPDATE sessions
                 SET lease_owner = $2, lease_expires_at = now() + $3 * interval '1 millisecond'
                 WHERE session_id = $1
                   AND (lease_owner IS NULL OR lease_expires_at <= now())
                 RETURNING session_id
             )
             ",
            load_leased_sql!()
        ))
        .bind(session_id)
        .bind(owner)
        .bind(millis(duration))
        .fetch_all(&self.pool)
        .await?;
        loaded_from(&rows)
    }

    /// Gives the lease up if `owner` still holds it; a no-op otherwise.
    ///
    /// # Errors
    /// When the database is unreachable; the lease then runs out by itself.
    pub async fn release_lease(&self, session_id: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
             WHERE session_id = $1 AND lease_owner = $2",
        )
        .bind(session_id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives the lease up after the planner refused the history `counted` describes with
    /// `keep_chars`, and remembers why: until the counters change, [`PgStore::counters`]
    /// answers with the reason and, for the same keep, the worker neither takes the lease
    /// nor loads the history again. Reasons that do not depend on the history alone are
    /// not remembered (the lease is just released).
    ///
    /// # Errors
    /// When the database is unreachable; the lease then runs out by itself.
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
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 skip_reason = $3, skip_at_chars = $4, skip_at_count = $5, skip_at_keep = $6
             WHERE session_id = $1 AND lease_owner = $2",
        )
        .bind(session_id)
        .bind(owner)
        .bind(reason.as_str())
        .bind(counted.total_chars)
        .bind(i32::try_from(counted.message_count).unwrap_or(i32::MAX))
        .bind(keep_chars)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Gives the lease up after a failure and puts the session in backoff: no
    /// summarization before `base x 2^(failures so far)`, capped at `max`, has passed.
    /// A zero `base` records the failure without a backoff. The failure is counted for
    /// today under `reason` (`llm_error`, `store_error`). `owner` is the lease this
    /// worker holds; `None` when the failing statement took none (its transaction rolled
    /// back): the backoff is then set unless another worker holds a live lease.
    ///
    /// The exponent stops at 30 (`base` x 10^9, past any sensible `max`): `power(2, n)`
    /// overflows a double, and the statement fails, from n = 1024 on. The count itself
    /// stops at the integer column's limit for the same reason.
    ///
    /// # Errors
    /// When the database is unreachable; the lease then runs out by itself.
    pub async fn record_failure(
        &self,
        session_id: &str,
        owner: Option<&str>,
        reason: &str,
        base: Duration,
        max: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "WITH counted AS (
                 INSERT INTO failure_daily AS f (day, reason, failures)
                 VALUES ((now() AT TIME ZONE 'UTC')::date, $5, 1)
                 ON CONFLICT (day, reason) DO UPDATE SET failures = f.failures + 1
             )
             UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                 failures = failures + (failures < 2147483647)::integer,
                 retry_at = CASE WHEN $3 > 0
                     THEN now() + least($3 * power(2, least(failures, 30)), $4)
                                  * interval '1 millisecond'
                 END
             WHERE session_id = $1
               AND (lease_owner = $2
                    OR ($2::text IS NULL
                        AND (lease_owner IS NULL OR lease_expires_at <= now())))",
        )
        .bind(session_id)
        .bind(owner)
        .bind(millis(base))
        .bind(millis(max))
        .bind(reason)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The session's messages in `seq` order.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn messages(&self, session_id: &str) -> Result<Vec<Message>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, role, coalesce(content, '') AS content, tool_calls, tool_call_id,
                    is_summary, chars
             FROM messages WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(message_from)
            .collect::<Result<_, _>>()
            .map_err(Into::into)
    }

    /// Replaces the planned prefix with the summary, in one transaction: fences on the
    /// lease, archives and deletes the prefix (checking it is exactly as planned), inserts
    /// the summary in its place and the usage event, drops the session's pending summary
    /// (which the compaction made stale), and releases the lease.
    ///
    /// # Errors
    /// [`CommitError::LeaseLost`] or [`CommitError::PrefixChanged`] when writing would be
    /// wrong, [`CommitError::Store`] when the database fails; nothing is written in any case.
    pub async fn commit(&self, summary: &NewSummary<'_>) -> Result<Committed, CommitError> {
        let mut tx = self.pool.begin().await?;
        let metadata = summary.event_metadata();
        // One statement: the fence (which also locks the session row first, so appends,
        // whose trigger updates it, queue behind this transaction instead of deadlocking
        // with it), then, only if the lease is still ours, the usage event and the
        // archived, deleted prefix.
        let archived = sqlx::query(concat!(
            "WITH fence AS (
                 UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL,
                     failures = 0, retry_at = NULL
                 WHERE session_id = $1 AND lease_owner = $7
                 RETURNING session_id
             ), event AS (
                 INSERT INTO usage_events
                     (session_id, model, prompt_tokens, completion_tokens, total_tokens, metadata)
                 SELECT $1, $3, $4, $5, $4 + $5, $6 FROM fence
                 RETURNING id
             ), removed AS (
                 DELETE FROM messages
                 WHERE session_id = $1 AND seq < $2 AND role <> 'system'
                   AND EXISTS (SELECT 1 FROM fence)
                 RETURNING *, ",
            fingerprint_sql!(),
            " AS fingerprint
             ), archived AS (
                 INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
                     tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra)
                 SELECT (SELECT id FROM event), session_id, seq, role, content,
                     tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra
                 FROM removed
             ), superseded AS (
                 DELETE FROM pending_summaries
                 WHERE session_id = $1 AND EXISTS (SELECT 1 FROM fence)
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM fence) AS fenced,
                    EXISTS (SELECT 1 FROM superseded) AS superseded,
                    (SELECT id FROM event) AS id,
                    coalesce(array_agg(seq ORDER BY seq), '{}') AS seqs,
                    coalesce(array_agg(chars::bigint ORDER BY seq), '{}') AS chars,
                    coalesce(array_agg(fingerprint ORDER BY seq), '{}') AS fingerprints
             FROM removed"
        ))
        .bind(summary.session_id)
        .bind(summary.cut_seq)
        .bind(summary.model)
        .bind(summary.prompt_tokens)
        .bind(summary.completion_tokens)
        .bind(&metadata)
        .bind(summary.lease_owner)
        .fetch_one(&mut *tx)
        .await?;
        if !archived.try_get::<bool, _>("fenced")? {
            return Err(CommitError::LeaseLost);
        }
        let seqs: Vec<i64> = archived.try_get("seqs")?;
        let chars: Vec<i64> = archived.try_get("chars")?;
        let fingerprints: Vec<String> = archived.try_get("fingerprints")?;
        let unchanged = seqs == summary.removed_seqs
            && chars == summary.removed_chars
            && fingerprints == summary.removed_fingerprints;
        // Dropping the transaction rolls it back. (An empty plan never reaches here: the
        // planner always removes something; were it to, nothing would be written.)
        let first_seq = match seqs.first() {
            Some(&first) if unchanged => first,
            _ => return Err(CommitError::PrefixChanged),
        };

        let id: i64 = archived.try_get("id")?;
        // The summary takes the first removed message's seq: before every kept message,
        // and after any system message that preceded the old part. The same statement
        // records the compaction as the session's latest (its row is locked by the fence
        // already), so replies report it from the counters' read.
        sqlx::query(
            "WITH summary AS (
                 INSERT INTO messages (session_id, seq, role, content, is_summary)
                 VALUES ($1, $2, 'user', $3, true)
             )
             UPDATE sessions SET last_compaction_id = $4 WHERE session_id = $1",
        )
        .bind(summary.session_id)
        .bind(first_seq)
        .bind(summary.text)
        .bind(id)
        .execute(&mut *tx)
        .await?;

        tx.commit().await?;
        Ok(Committed {
            compaction_id: id,
            superseded: archived.try_get("superseded")?,
        })
    }
}

/// Whether `error` means the database could not be reached, or a SQLite file stayed
/// locked (worth waiting for), as opposed to a statement that failed.
pub fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        // A connection dropped during the handshake reads as a protocol error.
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        // SQLite: the file stayed locked (SQLITE_BUSY, SQLITE_LOCKED and their extended
        // codes) past the busy timeout.
        sqlx::Error::Database(e) if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
            e.code()
                .and_then(|code| code.parse::<i32>().ok())
                .is_some_and(|code| matches!(code & 0xff, 5 | 6))
        }
        // cannot_connect_now (starting up or shutting down), and connection exceptions.
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code == "57P03" || code.starts_with("08")),
        _ => false,
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The rows of a lease-and-load statement: none when the lease was not taken, one of
/// NULLs (the LEFT JOIN) for a leased session with no messages.
fn loaded_from(rows: &[PgRow]) -> Result<Option<Loaded>, StoreError> {
    if rows.is_empty() {
        return Ok(None);
    }
    if rows[0].try_get::<Option<i64>, _>("seq")?.is_none() {
        return Ok(Some(Loaded::default()));
    }
    let messages = rows.iter().map(message_from).collect::<Result<_, _>>()?;
    let fingerprints = rows
        .iter()
        .map(|r| r.try_get("fingerprint"))
        .collect::<Result<_, _>>()?;
    Ok(Some(Loaded {
        messages,
        fingerprints,
    }))
}

fn counters_from(row: &PgRow) -> Result<Counters, sqlx::Error> {
    Ok(Counters {
        total_chars: row.try_get("total_chars")?,
        message_count: row.try_get::<i32, _>("message_count")?.into(),
        human_turns: row.try_get::<i32, _>("human_turns")?.into(),
        backing_off: row.try_get("backing_off")?,
        remembered_skip: row
            .try_get::<Option<String>, _>("skip_reason")?
            .and_then(|reason| remembered(&reason)),
        skip_at_keep: row.try_get("skip_at_keep")?,
        settings: settings::settings_from(row)?,
        last_compaction_id: row.try_get("last_compaction_id")?,
    })
}

/// A `sessions.skip_reason` read back; an unknown one (written by a newer worker) is
/// ignored, so the session is planned as usual.
fn remembered(reason: &str) -> Option<Reason> {
    [Reason::NoSafeBoundary, Reason::NothingToCompact]
        .into_iter()
        .find(|r| r.as_str() == reason)
}

fn message_from(row: &PgRow) -> Result<Message, sqlx::Error> {
    let role: String = row.try_get("role")?;
    Ok(Message {
        seq: row.try_get("seq")?,
        role: Role::from_str(&role).map_err(|e| sqlx::Error::Decode(e.into()))?,
        content: row.try_get("content")?,
        tool_calls: row.try_get("tool_calls")?,
        tool_call_id: row.try_get("tool_call_id")?,
        is_summary: row.try_get("is_summary")?,
        chars: row.try_get::<i32, _>("chars")?.into(),
    })
}

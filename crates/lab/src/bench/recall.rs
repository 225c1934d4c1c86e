//! Recall at scale, on both stores in the same run: searches of one session's archive of
//! [`PER_SESSION`] messages, among a small archive and then among a large one, each
//! against a bare primary-key read of the same database; and searches of a session of
//! [`LOGS`] archived log dumps of 1.7 KB (the hostile case: a term every one of them
//! holds), alone and [`CONCURRENT`] at once. A search should cost about the same at both
//! sizes. The searches go through the store's own function (what a recall request runs
//! after decoding).
//!
//! The SQLite file is seeded with plain SQL and never analyzed, as a worker's file is
//! not: its planner runs without statistics, as in production.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::{PgPool, SqlitePool};
use summarizer::store::prelude::*;
use summarizer::store::{RecallQuery, SharedStore, SqliteStore, Store};

use super::load::{self, Measurement};
use crate::db::{Scratch, ScratchFile};

/// Archived messages per session, at every size.
pub const PER_SESSION: usize = 100;

/// The log session: this many archived tool results of about 1.7 KB (each after the
/// call it answers), every one holding [`LOGS_TERM`].
pub const LOGS: usize = 3_000;
const LOGS_SESSION: &str = "bench-recall-logs";
const LOGS_TERM: &str = "status=502";

/// Searches of the log session at once, as in the issue that found SQLite's searches
/// quadratic (all 40 timed out).
pub const CONCURRENT: usize = 40;

/// The compaction ids of the seeded archive start here, past any compaction the bench's
/// other scenarios made in the same database (the archive's key is compaction and seq).
const FIRST_COMPACTION: i64 = 1 << 40;
/// The log session's compactions and seqs, past the other sessions'.
const LOGS_COMPACTION: i64 = FIRST_COMPACTION + (1 << 30);
const LOGS_FIRST_SEQ: i64 = 1 << 40;

/// The figures at one archive size: Postgres's (flattened, as before SQLite's existed)
/// and SQLite's.
#[derive(Debug, Serialize)]
pub struct RecallFigures {
    pub rows: usize,
    pub sessions: usize,
    #[serde(flatten)]
    pub postgres: StoreFigures,
    pub sqlite: StoreFigures,
}

/// One store's figures at one size.
#[derive(Debug, Serialize)]
pub struct StoreFigures {
    /// A search for one identifier that one archived message of the session holds.
    pub identifier: Measurement,
    /// A search for two words that most of the session's messages hold.
    pub words: Measurement,
    /// A fetch of one seq.
    pub seqs: Measurement,
    /// A bare primary-key read of one archived row.
    pub primary_key: Measurement,
    /// `status=502`, limit 5, in the log session (which every one of its logs holds).
    pub logs: Measurement,
    /// The same, [`CONCURRENT`] at once ...
    pub logs_concurrent: Measurement,
    /// ... of which this many failed.
    pub logs_concurrent_failed: usize,
}

/// Seeds archived messages up to each of `sizes` in turn (ascending), [`PER_SESSION`]
/// to a session, beside the log session, in the Postgres database and in a SQLite file,
/// and measures `ops` of each kind at each size (a tenth more, untimed, first) on each.
///
/// # Errors
/// When a database refuses the seed or a query.
pub async fn measure(
    db: &Scratch,
    sizes: &[usize],
    ops: usize,
) -> anyhow::Result<Vec<RecallFigures>> {
    let file = ScratchFile::new(&format!(
        "summarizer-bench-recall-{:08x}",
        fastrand::u32(..)
    ));
    let lite = SqliteStore::connect_lazy(&file.url(), super::POOL, Duration::from_secs(30))?;
    lite.migrate().await.context("migrating the SQLite file")?;
    let lite_agents = file.agents(4).await?;
    seed_logs_postgres(&db.agents).await?;
    seed_logs_sqlite(&lite_agents).await?;
    let (postgres, sqlite): (SharedStore, SharedStore) =
        (Arc::new(db.store.clone()), Arc::new(lite.clone()));
    let mut figures = Vec::new();
    let mut seeded = 0;
    for &rows in sizes {
        let began = Instant::now();
        seed_postgres(&db.agents, seeded, rows).await?;
        let on_postgres = began.elapsed();
        seed_sqlite(&lite_agents, seeded, rows).await?;
        eprintln!(
            "recall: archive seeded to {rows} rows in {:.0} s on Postgres, {:.0} s on SQLite",
            on_postgres.as_secs_f64(),
            (began.elapsed() - on_postgres).as_secs_f64()
        );
        seeded = rows;
        let pg_agents = db.agents.clone();
        let postgres = at_size(&postgres, rows, ops, move |compaction, seq| {
            let pool = pg_agents.clone();
            async move { read_postgres(&pool, compaction, seq).await }
        })
        .await?;
        let agents = lite_agents.clone();
        let sqlite = at_size(&sqlite, rows, ops, move |compaction, seq| {
            let pool = agents.clone();
            async move { read_sqlite(&pool, compaction, seq).await }
        })
        .await?;
        figures.push(RecallFigures {
            rows,
            sessions: rows / PER_SESSION,
            postgres,
            sqlite,
        });
    }
    lite_agents.close().await;
    lite.close().await;
    Ok(figures)
}

/// Message n of session n / [`PER_SESSION`]: a line of log or prose with an identifier
/// of its own (`E-<n>`) and words every message shares. Both stores' seeds write it.
macro_rules! seeded_content {
    () => {
        "'step ' || n || ': E-' || n || ' on orders-db-' || (n % 7)
            || ' p99=' || (n % 900) || 'ms, the connection pool stayed saturated '
            || 'while retries piled up on checkout-api v2.' || (n % 9)"
    };
}

/// Archives messages `from..to` in Postgres.
async fn seed_postgres(pool: &PgPool, from: usize, to: usize) -> anyhow::Result<()> {
    const BATCH: usize = 100_000;
    for first in (from..to).step_by(BATCH) {
        let last = (first + BATCH).min(to);
        sqlx::query(concat!(
            "INSERT INTO archived_messages
                 (compaction_id, session_id, seq, role, content, is_summary, chars, created_at)
             SELECT $4 + n / $3, 'bench-recall-' || (n / $3), n,
                    CASE WHEN n % 3 = 0 THEN 'tool' ELSE 'assistant' END, ",
            seeded_content!(),
            ", false, 120, now()
             FROM generate_series($1::bigint, $2::bigint - 1) AS n"
        ))
        .bind(i64::try_from(first)?)
        .bind(i64::try_from(last)?)
        .bind(i64::try_from(PER_SESSION)?)
        .bind(FIRST_COMPACTION)
        .execute(pool)
        .await?;
    }
    sqlx::query("ANALYZE archived_messages")
        .execute(pool)
        .await?;
    Ok(())
}

/// Archives messages `from..to` in the SQLite file, a statement (a transaction) per
/// 100,000, as an agent's plain SQL would.
async fn seed_sqlite(pool: &SqlitePool, from: usize, to: usize) -> anyhow::Result<()> {
    const BATCH: usize = 100_000;
    for first in (from..to).step_by(BATCH) {
        let last = (first + BATCH).min(to);
        sqlx::query(concat!(
            "WITH RECURSIVE g (n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2 - 1)
             INSERT INTO archived_messages
                 (compaction_id, session_id, seq, role, content, is_summary, chars, created_at)
             SELECT ?4 + n / ?3, 'bench-recall-' || (n / ?3), n,
                    CASE WHEN n % 3 = 0 THEN 'tool' ELSE 'assistant' END, ",
            seeded_content!(),
            ", 0, 120, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
             FROM g"
        ))
        .bind(i64::try_from(first)?)
        .bind(i64::try_from(last)?)
        .bind(i64::try_from(PER_SESSION)?)
        .bind(FIRST_COMPACTION)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Log dump k of the log session: 15 access-log lines, about 1.7 KB, three of them
/// `status=502`.
fn log_dump(k: usize) -> String {
    (0..15)
        .map(|i| {
            let status = if (k + i).is_multiple_of(5) { 502 } else { 200 };
            format!(
                "2026-12-06T14:{:02}:{:02}.{:03}Z checkout-api-{} GET /api/v1/cart/{} \
                 status={status} upstream=10.43.7.{}:8080 duration_ms={}",
                (k + i) % 60,
                i,
                k % 1000,
                k % 7,
                k * 31 + i,
                i * 13 % 250,
                (k * 7 + i) % 30_000
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The log session's rows, call then result: (compaction, seq, role, content,
/// tool_calls, tool_call_id), 500 logs to a compaction.
fn log_rows() -> impl Iterator<
    Item = (
        i64,
        i64,
        &'static str,
        String,
        Option<String>,
        Option<String>,
    ),
> {
    (0..LOGS).flat_map(|k| {
        let compaction = LOGS_COMPACTION + (k / 500) as i64;
        let seq = LOGS_FIRST_SEQ + 2 * k as i64;
        let id = format!("call-{k}");
        let calls = serde_json::json!([{"id": id, "name": "get_logs", "arguments": {}}]);
        [
            (
                compaction,
                seq,
                "assistant",
                String::new(),
                Some(calls.to_string()),
                None,
            ),
            (compaction, seq + 1, "tool", log_dump(k), None, Some(id)),
        ]
    })
}

async fn seed_logs_postgres(pool: &PgPool) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    for (compaction, seq, role, content, calls, call_id) in log_rows() {
        sqlx::query(
            "INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
                 tool_calls, tool_call_id, is_summary, chars, created_at)
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, false, char_length($5), now())",
        )
        .bind(compaction)
        .bind(LOGS_SESSION)
        .bind(seq)
        .bind(role)
        .bind(content)
        .bind(calls)
        .bind(call_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn seed_logs_sqlite(pool: &SqlitePool) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    for (compaction, seq, role, content, calls, call_id) in log_rows() {
        sqlx::query(
            "INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
                 tool_calls, tool_call_id, is_summary, chars, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, length(?5),
                     strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
        )
        .bind(compaction)
        .bind(LOGS_SESSION)
        .bind(seq)
        .bind(role)
        .bind(content)
        .bind(calls)
        .bind(call_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn read_postgres(pool: &PgPool, compaction: i64, seq: i64) -> anyhow::Result<()> {
    sqlx::query("SELECT content FROM archived_messages WHERE compaction_id = $1 AND seq = $2")
        .bind(compaction)
        .bind(seq)
        .fetch_one(pool)
        .await?;
    Ok(())
}

async fn read_sqlite(pool: &SqlitePool, compaction: i64, seq: i64) -> anyhow::Result<()> {
    sqlx::query("SELECT content FROM archived_messages WHERE compaction_id = ?1 AND seq = ?2")
        .bind(compaction)
        .bind(seq)
        .fetch_one(pool)
        .await?;
    Ok(())
}

/// One store's figures among `rows` archived rows; `read` is its bare primary-key read
/// of an archived row (compaction, seq).
async fn at_size<R, Fut>(
    store: &SharedStore,
    rows: usize,
    ops: usize,
    read: R,
) -> anyhow::Result<StoreFigures>
where
    R: Fn(i64, i64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let pick = move |i: usize| {
        // Sessions and messages spread over the whole archive.
        let n = (i * 7_919) % rows;
        (format!("bench-recall-{}", n / PER_SESSION), n)
    };
    let warmup = ops / 10;
    let run = |query: fn(usize) -> RecallQuery| {
        let store = store.clone();
        load::run(1, ops, warmup, move |i| {
            let store = store.clone();
            let (session, n) = pick(i);
            async move { found(&*store, &session, &query(n)).await }
        })
    };
    let identifier = run(|n| RecallQuery::Search {
        terms: vec![format!("e-{n}")],
        limit: 5,
    })
    .await?;
    let words = run(|_| RecallQuery::Search {
        terms: vec!["connection".to_owned(), "saturated".to_owned()],
        limit: 5,
    })
    .await?;
    let seqs = run(|n| RecallQuery::Seqs(vec![n as i64])).await?;
    let primary_key = load::run(1, ops, warmup, move |i| {
        let (_, n) = pick(i);
        let read = read.clone();
        async move {
            read(
                FIRST_COMPACTION + i64::try_from(n / PER_SESSION)?,
                i64::try_from(n)?,
            )
            .await
        }
    })
    .await?;
    // Fewer: a search of the log session reads each of its 3,000 matches.
    let logs_ops = (ops / 15).max(20);
    let logs = logs_searches(store, 1, logs_ops, Arc::default()).await?;
    let logs_failed = Arc::new(AtomicUsize::new(0));
    let logs_concurrent =
        logs_searches(store, CONCURRENT, 4 * CONCURRENT, logs_failed.clone()).await?;
    Ok(StoreFigures {
        identifier,
        words,
        seqs,
        primary_key,
        logs,
        logs_concurrent,
        logs_concurrent_failed: logs_failed.load(Ordering::Relaxed),
    })
}

/// `total` searches of the log session, `concurrency` at once (a tenth more, untimed,
/// first). Alone, a search that fails fails the bench; at once, a timed search that
/// fails (the store's bounds ran out, or it found nothing) is counted in `failed`: how
/// many a burst leaves unanswered is the figure.
async fn logs_searches(
    store: &SharedStore,
    concurrency: usize,
    total: usize,
    failed: Arc<AtomicUsize>,
) -> anyhow::Result<Measurement> {
    let store = store.clone();
    load::run(concurrency, total, total / 10, move |i| {
        let (store, failed) = (store.clone(), failed.clone());
        async move {
            let query = RecallQuery::Search {
                terms: vec![LOGS_TERM.to_owned()],
                limit: 5,
            };
            match found(&*store, LOGS_SESSION, &query).await {
                Err(e) if concurrency > 1 => {
                    tracing::warn!(error = %e, "recall: a search of the log session failed");
                    if i < total {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                }
                done => done,
            }
        }
    })
    .await
}

/// Recalls `query` in `session`, which must find something.
async fn found(store: &dyn Store, session: &str, query: &RecallQuery) -> anyhow::Result<()> {
    let found = store.recall(session, query, 4_000).await?;
    anyhow::ensure!(!found.is_empty(), "nothing recalled for {session}");
    Ok(())
}

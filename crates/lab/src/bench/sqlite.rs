//! The embedded store's figures: the no-op and compaction paths of a worker
//! process on a SQLite file, beside SQLite's own bare primary-key read through a pool of
//! the worker's size, measured in the same run as the Postgres figures.
//!
//! The sessions are seeded in the file by a pool of the bench's own, with plain SQL, as
//! agents on the same host would write them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use sqlx::SqlitePool;
use summarizer::client::TurnClient;
use summarizer::outcome::Status;
use summarizer::store::prelude::*;
use summarizer::store::{SharedStore, SqliteStore};

use super::load::{self, Measurement};
use super::{CONCURRENCY, COST_WARMUP, POOL, Sizes, spawn_worker, turns, wait_ready, worker_cost};
use crate::db::ScratchFile;

#[derive(Debug, Serialize)]
pub struct SqliteFigures {
    /// Bare SQLite primary-key SELECT through a pool of the worker's size: 1, then 64.
    pub select: Vec<Measurement>,
    /// Our no-op path end to end on SQLite: 1, then 64.
    pub noop: Vec<Measurement>,
    /// One compaction per request, concurrency 64, the LLM answering after 200 ms.
    pub compactions: Measurement,
    /// The worker's own cost per 1,000-message compaction, in this process.
    pub worker_cost: Measurement,
}

pub async fn measure(
    tag: &str,
    sizes: &Sizes,
    nats: async_nats::Client,
    llm_url: &str,
) -> anyhow::Result<SqliteFigures> {
    let file = ScratchFile::new(&format!("summarizer-bench-{tag}"));
    let url = file.url();
    let store = SqliteStore::connect_lazy(&url, POOL, Duration::from_secs(30))?;
    store.migrate().await.context("migrating the SQLite file")?;
    let agents = file.agents(POOL).await?;
    let small = insert(&agents, "sqlite-small-", 1_000, 10, 200).await?;
    let over = insert(&agents, "sqlite-over-", sizes.compactions, 20, 4_000).await?;
    let thousand = insert(
        &agents,
        "sqlite-thousand-",
        sizes.cost_sessions + COST_WARMUP,
        1_000,
        100,
    )
    .await?;
    sqlx::query("ANALYZE").execute(&agents).await?;

    // The baseline: SQLite's own primary-key read, through a pool of the worker's size.
    let mut select = Vec::new();
    for concurrency in [1, CONCURRENCY] {
        let (pool, small) = (store.pool().clone(), Arc::new(small.clone()));
        let m = load::run(
            concurrency,
            sizes.ops(concurrency),
            sizes.warmup(concurrency),
            move |i| {
                let (pool, small) = (pool.clone(), small.clone());
                async move {
                    sqlx::query(
                        "SELECT total_chars, message_count FROM sessions WHERE session_id = ?1",
                    )
                    .bind(&small[i % small.len()])
                    .fetch_one(&pool)
                    .await?;
                    Ok(())
                }
            },
        )
        .await?;
        select.push(m);
    }

    let subject = format!("summarizer.bench.{tag}.sqlite.turn.starting");
    let mut worker = spawn_worker(&url, &subject, &format!("{tag}-sqlite"), llm_url)?;
    let client = TurnClient::new(nats, subject);
    wait_ready(&client, &small[0]).await?;
    let mut noop = Vec::new();
    for concurrency in [1, CONCURRENCY] {
        let m = turns(
            &client,
            concurrency,
            sizes.ops(concurrency),
            sizes.warmup(concurrency),
            Arc::new(small.clone()),
            Status::Skipped,
        )
        .await?;
        noop.push(m);
    }
    let compactions = turns(
        &client,
        CONCURRENCY,
        over.len(),
        0,
        Arc::new(over),
        Status::Compacted,
    )
    .await?;
    crate::worker_process::stop(&mut worker, "TERM").await;

    let shared: SharedStore = Arc::new(store.clone());
    let worker_cost = worker_cost(&shared, &thousand).await?;
    agents.close().await;
    store.close().await;
    Ok(SqliteFigures {
        select,
        noop,
        compactions,
        worker_cost,
    })
}

/// `sessions` sessions named `<prefix><n>` of `messages` messages of `chars` chars, a
/// human turn every fourth message, in one statement (the seqs follow the ORDER BY).
async fn insert(
    pool: &SqlitePool,
    prefix: &str,
    sessions: usize,
    messages: usize,
    chars: usize,
) -> anyhow::Result<Vec<String>> {
    sqlx::query(
        "WITH RECURSIVE s (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?2),
                        m (k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM m WHERE k < ?3 - 1)
         INSERT INTO messages (session_id, role, content)
         SELECT ?1 || n, CASE WHEN k % 4 = 0 THEN 'user' ELSE 'assistant' END,
                replace(hex(zeroblob(?4)), '00', 'x')
         FROM s, m ORDER BY n, k",
    )
    .bind(prefix)
    .bind(i64::try_from(sessions)?)
    .bind(i64::try_from(messages)?)
    .bind(i64::try_from(chars)?)
    .execute(pool)
    .await?;
    Ok((1..=sessions).map(|n| format!("{prefix}{n}")).collect())
}

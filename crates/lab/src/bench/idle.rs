//! What idle compaction's schedule costs at a million sessions (issue 38), on both stores
//! in the same run, each figure beside a bare primary-key read of `sessions`:
//! - a pass that finds nothing due: what every worker pays every 100 ms to 5 s with
//!   `SUMMARIZATION_IDLE_AFTER_MS` on, whatever the table's size;
//! - a claim of [`BATCH`] due sessions, per session claimed;
//! - an agent's append (one message, whose trigger keeps the schedule), with the
//!   schedule's index and without it: the price every write pays for the schedule;
//! - `/stats` with `tokens_saved_net`, its one pass over the compacted sessions.
//!
//! The sessions are seeded with plain SQL (a million in a full run), every one compacted
//! once (savings to sum) and written to a moment ago (in the schedule, not due), but a
//! few thousand idle for 90 minutes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde::Serialize;
use sqlx::{PgPool, SqlitePool};
use summarizer::store::prelude::*;
use summarizer::store::{SharedStore, SqliteStore};

use super::load::{self, Measurement};
use crate::db::{Scratch, ScratchFile};

/// The sessions in the table, and how many of them are due (idle for 90 minutes; a
/// multiple of [`BATCH`]).
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub sessions: usize,
    pub due: usize,
}

/// Sessions a claim takes, as a pass does.
const BATCH: i64 = 64;
/// The idle time the passes ask for, and when they give up on a session (as
/// `crate::config::Idle` works it out for this idle time).
const IDLE: Duration = Duration::from_secs(3600);
const GIVE_UP: Duration = Duration::from_secs(7200);

#[derive(Debug, Serialize)]
pub struct IdleFigures {
    pub sessions: usize,
    pub postgres: StoreFigures,
    pub sqlite: StoreFigures,
}

#[derive(Debug, Serialize)]
pub struct StoreFigures {
    /// A bare primary-key read of one session's row.
    pub primary_key: Measurement,
    /// A pass that finds nothing due.
    pub empty_pass: Measurement,
    /// A claim of [`BATCH`] due sessions (the latency is the statement's).
    pub claim: Measurement,
    /// One message appended to a session, without the schedule's index, then with it.
    pub append_unindexed: Measurement,
    pub append: Measurement,
    /// `/stats`, `tokens_saved_net` included.
    pub stats: Measurement,
}

impl StoreFigures {
    /// The claim's cost per session claimed, in microseconds.
    pub fn claim_per_session_us(&self) -> f64 {
        self.claim.p50_us / BATCH as f64
    }
}

/// Seeds both stores and measures `ops` of each kind (a tenth more, untimed, first).
///
/// # Errors
/// When a database refuses the seed or a query, or a claim takes other than it should.
pub async fn measure(db: &Scratch, scale: Scale, ops: usize) -> anyhow::Result<IdleFigures> {
    let file = ScratchFile::new(&format!("summarizer-bench-idle-{:08x}", fastrand::u32(..)));
    let lite = SqliteStore::connect_lazy(&file.url(), super::POOL, Duration::from_secs(30))?;
    lite.migrate().await.context("migrating the SQLite file")?;
    let lite_agents = file.agents(4).await?;

    seed_postgres(&db.agents, scale).await?;
    let postgres = on(
        Arc::new(db.store.clone()),
        scale,
        ops,
        Agents::Pg(db.agents.clone()),
    )
    .await?;
    seed_sqlite(&lite_agents, scale).await?;
    let sqlite = on(
        Arc::new(lite.clone()),
        scale,
        ops,
        Agents::Lite(lite_agents.clone()),
    )
    .await?;
    lite.close().await;
    lite_agents.close().await;
    let _ = std::fs::remove_file(&file.0);
    Ok(IdleFigures {
        sessions: scale.sessions,
        postgres,
        sqlite,
    })
}

async fn on(
    store: SharedStore,
    scale: Scale,
    ops: usize,
    agents: Agents,
) -> anyhow::Result<StoreFigures> {
    let warmup = ops / 10;
    let sessions = scale.sessions;
    let began = Instant::now();
    let phase =
        move |what: &str| eprintln!("idle: {what} at {:.0} s", began.elapsed().as_secs_f64());
    let session = move |i: usize| format!("bench-idle-{}", i % sessions);
    let a = agents.clone();
    let primary_key = load::run(1, ops, warmup, move |i| {
        let (a, id) = (a.clone(), session(i.wrapping_mul(7919)));
        async move { a.run(READ, Some(id)).await }
    })
    .await?;
    phase("primary-key reads measured");
    let s = store.clone();
    let claim = load::run(1, scale.due / BATCH as usize, 0, move |_| {
        let s = s.clone();
        async move {
            let claimed = s.claim_idle(IDLE, GIVE_UP, BATCH).await?;
            ensure!(
                claimed.sessions.len() == BATCH as usize,
                "claimed {claimed:?}"
            );
            Ok(())
        }
    })
    .await?;
    phase("claims measured");
    let s = store.clone();
    let empty_pass = load::run(1, ops, warmup, move |_| {
        let s = s.clone();
        async move {
            let claimed = s.claim_idle(IDLE, GIVE_UP, BATCH).await?;
            ensure!(claimed.is_empty(), "claimed {claimed:?} with none due");
            Ok(())
        }
    })
    .await?;
    // Each append writes to a session of its own, never written since the seed: the
    // worst case, where the trigger moves every row's `idle_since`.
    phase("empty passes measured");
    agents.run(DROP_INDEX, None).await?;
    let a = agents.clone();
    let append_unindexed = load::run(1, ops, warmup, move |i| {
        let (a, id) = (a.clone(), session(2 * i + 1));
        async move { a.run(APPEND, Some(id)).await }
    })
    .await?;
    phase("appends without the index measured");
    agents.run(CREATE_INDEX, None).await?;
    let a = agents.clone();
    let append = load::run(1, ops, warmup, move |i| {
        let (a, id) = (a.clone(), session(2 * (i + ops + warmup) + 1));
        async move { a.run(APPEND, Some(id)).await }
    })
    .await?;
    phase("appends measured");
    let s = store.clone();
    let stats = load::run(1, 20, 2, move |_| {
        let s = s.clone();
        async move {
            s.stats(30).await?;
            Ok(())
        }
    })
    .await?;
    Ok(StoreFigures {
        primary_key,
        empty_pass,
        claim,
        append_unindexed,
        append,
        stats,
    })
}

async fn seed_postgres(pool: &PgPool, scale: Scale) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO sessions (session_id, total_chars, message_count, human_turns,
                               model_turns, tokens_saved_per_turn, tokens_saved_offset,
                               idle_since)
         SELECT 'bench-idle-' || n, 2000, 10, 3, 20, 150, 1500,
                CASE WHEN n < $2 THEN now() - interval '90 minutes' ELSE now() END
         FROM generate_series(0, $1 - 1) AS n",
    )
    .bind(i64::try_from(scale.sessions)?)
    .bind(i64::try_from(scale.due)?)
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE sessions").execute(pool).await?;
    Ok(())
}

async fn seed_sqlite(pool: &SqlitePool, scale: Scale) -> anyhow::Result<()> {
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $1)
         INSERT INTO sessions (session_id, total_chars, message_count, human_turns,
                               model_turns, tokens_saved_per_turn, tokens_saved_offset,
                               idle_since)
         SELECT 'bench-idle-' || i, 2000, 10, 3, 20, 150, 1500,
                (CAST(strftime('%s', 'now') AS INTEGER) - CASE WHEN i < $2 THEN 5400 ELSE 0 END)
                * 1000
         FROM n",
    )
    .bind(i64::try_from(scale.sessions)?)
    .bind(i64::try_from(scale.due)?)
    .execute(pool)
    .await?;
    Ok(())
}

/// The agents' connections to either database: the same SQL runs on both.
#[derive(Clone)]
enum Agents {
    Pg(PgPool),
    Lite(SqlitePool),
}

const READ: &str = "SELECT total_chars FROM sessions WHERE session_id = $1";
const APPEND: &str =
    "INSERT INTO messages (session_id, role, content) VALUES ($1, 'assistant', 'ok')";
const DROP_INDEX: &str = "DROP INDEX sessions_idle";
const CREATE_INDEX: &str =
    "CREATE INDEX sessions_idle ON sessions (idle_since) WHERE idle_since IS NOT NULL";

impl Agents {
    /// Runs `sql`, with `session` as `$1` when it takes one.
    async fn run(&self, sql: &'static str, session: Option<String>) -> anyhow::Result<()> {
        match self {
            Self::Pg(pool) => {
                let query = sqlx::query(sql);
                match session {
                    Some(session) => query.bind(session),
                    None => query,
                }
                .execute(pool)
                .await?;
            }
            Self::Lite(pool) => {
                let query = sqlx::query(sql);
                match session {
                    Some(session) => query.bind(session),
                    None => query,
                }
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }
}

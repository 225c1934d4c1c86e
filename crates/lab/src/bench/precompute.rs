//! The turn that crosses the threshold, with and without a pending summary
//! (`SUMMARIZATION_PRECOMPUTE_AT`), against the bare commit it should cost.
//!
//! Agents append a turn of 4,000 chars, send the turn-starting request, then think for a
//! second, over and over, each on a session of its own, until each has seen `cycles`
//! compactions after a first, untimed one. A worker process runs with precompute off, then another with 0.8, the
//! fake LLM answering after 2 s and the seed's limits (60,000 / 20,000): the band above
//! 48,000 chars spans three turns, three seconds, enough for the 2 s summary. The
//! figure is the agent's wait at the turns that compacted. The baseline is a bare commit
//! of the same shape: one transaction, from a client of the same database, that writes
//! a usage event, archives and deletes 40,000 chars of a 60,000-char session and inserts
//! a summary in its place, with the schema's triggers. It runs five times a second while
//! the agents run with precompute on, so that both see the same load on the machine's
//! two cores (measured alone beforehand, it came out 0.8-1.4 ms from run to run, against
//! an agent-side figure taken under load: ratios from 2.1x to 5.5x for the same code).
//!
//! The fact check runs in `record` mode here: in `retry` mode the fake LLM's one summary
//! would be asked for twice, doubling the calls being counted for waste.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use sqlx::PgPool;
use tokio::time::Instant;

use super::load::{Measurement, percentile};
use super::{LIMITS, wait_ready};
use crate::db::Scratch;
use crate::fake_llm;
use crate::worker_process;
use summarizer::client::{Decision, TurnClient};
use summarizer::outcome::Status;

/// The fake LLM's latency here (the issue's).
const LLM_LATENCY: Duration = Duration::from_secs(2);
/// An agent's own time between turns.
const THINK: Duration = Duration::from_secs(1);
/// The chars one agent turn appends: a 400-char ask and a 3,600-char answer.
const TURN_CHARS: usize = 4_000;
const PRECOMPUTE_AT: &str = "0.8";

#[derive(Debug, Clone, Copy, Serialize)]
pub struct PrecomputeFigures {
    /// The agents' wait at compaction turns, precompute off.
    pub off: Measurement,
    /// The same with `SUMMARIZATION_PRECOMPUTE_AT=0.8`.
    pub on: Measurement,
    /// A bare compaction commit, sequentially.
    pub bare_commit: Measurement,
    /// With precompute on: LLM calls made, compactions written, and how many of them
    /// came from a pending summary.
    pub llm_calls: u64,
    pub compactions: i64,
    pub precomputed: i64,
    /// Turns over the threshold answered `busy` (the session's precompute still running):
    /// the agent proceeded uncompacted and the next turn applied the summary.
    pub busy: usize,
}

impl PrecomputeFigures {
    /// The LLM calls that wrote no compaction (pending summaries dropped), as a share
    /// of the calls made.
    pub fn wasted_share(&self) -> f64 {
        if self.llm_calls == 0 {
            return 0.0;
        }
        let used = u64::try_from(self.compactions).unwrap_or(0);
        self.llm_calls.saturating_sub(used) as f64 / self.llm_calls as f64
    }

    pub fn served_share(&self) -> f64 {
        if self.compactions == 0 {
            return 0.0;
        }
        self.precomputed as f64 / self.compactions as f64
    }
}

/// How much of it to run.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub agents: usize,
    pub cycles: usize,
    pub bare_commits: usize,
}

/// Runs both modes and the baseline.
///
/// # Errors
/// When a service fails, or a turn is answered other than skipped or compacted.
pub async fn measure(
    db: &Scratch,
    tag: &str,
    nats: async_nats::Client,
    scale: Scale,
) -> anyhow::Result<PrecomputeFigures> {
    seed_bare_commits(&db.agents, scale.bare_commits + BARE_WARMUP).await?;
    let llm = fake_llm::start(0.0, millis(LLM_LATENCY)..millis(LLM_LATENCY)).await?;
    let (off, _, _) = crossing_turns(db, tag, &nats, &llm.url, "0", scale).await?;
    let before = llm.answered();
    let running = Arc::new(AtomicBool::new(true));
    let baseline = tokio::spawn(paced_bare_commits(
        db.agents.clone(),
        scale.bare_commits,
        running.clone(),
    ));
    let on = crossing_turns(db, tag, &nats, &llm.url, PRECOMPUTE_AT, scale).await;
    running.store(false, Ordering::Relaxed);
    let bare_commit = baseline.await.context("the baseline panicked")??;
    let (on, sessions, busy) = on?;
    let llm_calls = llm.answered() - before;
    let (compactions, precomputed): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE metadata @> '{\"precomputed\": true}')
         FROM usage_events WHERE session_id = ANY($1)",
    )
    .bind(&sessions)
    .fetch_one(&db.agents)
    .await?;
    Ok(PrecomputeFigures {
        off,
        on,
        bare_commit,
        llm_calls,
        compactions,
        precomputed,
        busy,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A worker with `SUMMARIZATION_PRECOMPUTE_AT=at`, and the agents' compaction turns
/// against it; returns their wait, the sessions used and the busy answers.
async fn crossing_turns(
    db: &Scratch,
    tag: &str,
    nats: &async_nats::Client,
    llm_url: &str,
    at: &str,
    scale: Scale,
) -> anyhow::Result<(Measurement, Vec<String>, usize)> {
    let mode = if at == "0" { "off" } else { "on" };
    let subject = format!("summarizer.bench.{tag}.precompute-{mode}.turn.starting");
    let env: HashMap<&str, String> = HashMap::from([
        ("DATABASE_URL", db.url.clone()),
        ("NATS_SUBJECT", subject.clone()),
        ("NATS_QUEUE_GROUP", format!("summarizer-bench-{tag}-{mode}")),
        (
            "SUMMARIZATION_THRESHOLD_CHARS",
            LIMITS.threshold_chars.to_string(),
        ),
        ("SUMMARIZATION_KEEP_CHARS", LIMITS.keep_chars.to_string()),
        ("SUMMARIZATION_PRECOMPUTE_AT", at.to_owned()),
        // One per agent: they may all be in the band at once. With fewer, a session
        // whose precompute could not start until its last band turn is still being
        // summarized when it crosses, and that turn is answered busy.
        ("PRECOMPUTE_CONCURRENCY", scale.agents.to_string()),
        ("SUMMARY_FACT_CHECK", "record".into()),
        ("LLM_PROVIDER", "openai".into()),
        ("LLM_BASE_URL", llm_url.to_owned()),
        ("LLM_API_KEY", "bench".into()),
        ("HTTP_ADDR", String::new()),
        ("RUST_LOG", "warn".into()),
    ]);
    let mut worker = worker_process::spawn(&env)?;
    let client = TurnClient::new(nats.clone(), subject);
    let sessions: Vec<String> = (0..scale.agents)
        .map(|i| format!("bench-precompute-{mode}-{i}"))
        .collect();
    // 36,000 chars each to start: the first band turn is the fourth.
    for session in &sessions {
        for _ in 0..9 {
            append_turn(&db.agents, session).await?;
        }
    }
    wait_ready(&client, &sessions[0]).await?;
    let agents: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, session)| {
            let (client, pool, session) = (client.clone(), db.agents.clone(), session.clone());
            // Staggered, so that the agents do not all cross at once.
            let offset = THINK.mul_f64(i as f64 / scale.agents as f64);
            tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                agent(&client, &pool, &session, scale.cycles).await
            })
        })
        .collect();
    let (mut waits, mut busy) = (Vec::new(), 0);
    let started = Instant::now();
    for agent in agents {
        let (its_waits, its_busy) = agent.await.context("an agent panicked")??;
        waits.extend(its_waits);
        busy += its_busy;
    }
    let elapsed = started.elapsed();
    worker_process::stop(&mut worker, "TERM").await;
    waits.sort_unstable();
    let m = Measurement {
        concurrency: scale.agents,
        operations: waits.len(),
        throughput: waits.len() as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&waits, 0.50),
        p99_us: percentile(&waits, 0.99),
    };
    Ok((m, sessions, busy))
}

/// One agent: append a turn, ask, think, until `cycles` compactions and one more first;
/// returns its waits at the turns that compacted, and how many turns were answered busy.
async fn agent(
    client: &TurnClient,
    pool: &PgPool,
    session: &str,
    cycles: usize,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let (mut waits, mut busy) = (Vec::new(), 0);
    // Bounded: a cycle is about ten turns.
    for _ in 0..(cycles + 1) * 30 {
        append_turn(pool, session).await?;
        let asked = Instant::now();
        match client.turn_starting(session, Duration::from_secs(30)).await {
            Decision::Replied(reply) if reply.status == Status::Compacted => {
                waits.push(asked.elapsed());
                if waits.len() == cycles + 1 {
                    // The first compaction is a warm-up, as every figure has one: it is
                    // the first use of the worker's pooled connection for the statements
                    // (plans, catalog caches), which a long-running worker pays once.
                    waits.remove(0);
                    return Ok((waits, busy));
                }
            }
            Decision::Replied(reply) if reply.status == Status::Skipped => {}
            // An agent proceeds on busy, as on any answer.
            Decision::Replied(reply) if reply.status == Status::Busy => busy += 1,
            other => bail!("{session}: expected skipped or compacted, got {other:?}"),
        }
        tokio::time::sleep(THINK).await;
    }
    bail!(
        "{session}: {} compactions did not come within {} turns",
        cycles + 1,
        (cycles + 1) * 30
    )
}

async fn append_turn(pool: &PgPool, session: &str) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO messages (session_id, role, content)
         VALUES ($1, 'user', 'What does the pool say now? ' || repeat('q', $2)),
                ($1, 'assistant', 'The pool on orders-db is saturated at 14:01. '
                                  || repeat('a', $3))",
    )
    .bind(session)
    .bind(i32::try_from(TURN_CHARS / 10 - 28)?)
    .bind(i32::try_from(TURN_CHARS * 9 / 10 - 45)?)
    .execute(pool)
    .await?;
    Ok(())
}

/// Bare commits before the timed ones.
const BARE_WARMUP: usize = 5;
/// One bare commit every this long while the agents run.
const BARE_PACE: Duration = Duration::from_millis(200);

/// `n` sessions for bare commits: 15 turns of 4,000 chars, of which the first 10
/// turns' 20 messages go.
async fn seed_bare_commits(pool: &PgPool, n: usize) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content)
         SELECT 'bench-bare-' || s, m, CASE WHEN m % 2 = 0 THEN 'user' ELSE 'assistant' END,
                repeat('x', 2000)
         FROM generate_series(0, $1 - 1) AS s, generate_series(0, 29) AS m",
    )
    .bind(i32::try_from(n)?)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(())
}

/// Bare commits, one every [`BARE_PACE`], after [`BARE_WARMUP`] untimed ones, until
/// `running` is false or `n` are timed.
async fn paced_bare_commits(
    pool: PgPool,
    n: usize,
    running: Arc<AtomicBool>,
) -> anyhow::Result<Measurement> {
    let mut latencies = Vec::new();
    let started = Instant::now();
    for i in 0..n + BARE_WARMUP {
        if !running.load(Ordering::Relaxed) {
            break;
        }
        let began = Instant::now();
        bare_commit(&pool, i).await?;
        if i >= BARE_WARMUP {
            latencies.push(began.elapsed());
        }
        tokio::time::sleep(BARE_PACE.saturating_sub(began.elapsed())).await;
    }
    if latencies.is_empty() {
        bail!("the agents ended before a bare commit was timed");
    }
    latencies.sort_unstable();
    Ok(Measurement {
        concurrency: 1,
        operations: latencies.len(),
        throughput: latencies.len() as f64 / started.elapsed().as_secs_f64(),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
    })
}

/// One bare compaction commit, on the `i`-th seeded session.
async fn bare_commit(pool: &PgPool, i: usize) -> anyhow::Result<()> {
    let session = format!("bench-bare-{i}");
    let mut tx = pool.begin().await?;
    sqlx::query(
        "WITH event AS (
             INSERT INTO usage_events (session_id, model, metadata)
             VALUES ($1, 'bare', '{\"summarization\": true, \"chars_removed\": 40000,
                                    \"messages_removed\": 20, \"duration_ms\": 1}')
             RETURNING id
         ), removed AS (
             DELETE FROM messages WHERE session_id = $1 AND seq < 20 RETURNING *
         )
         INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
             tool_calls, tool_call_id, is_summary, chars, created_at)
         SELECT (SELECT id FROM event), session_id, seq, role, content, tool_calls,
             tool_call_id, is_summary, chars, created_at
         FROM removed",
    )
    .bind(&session)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content, is_summary)
         VALUES ($1, 0, 'user', repeat('s', 150), true)",
    )
    .bind(&session)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

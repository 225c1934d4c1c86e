//! `summarizer chaos`: a bounded fault run. Simulated agents append and ask on many
//! sessions while worker processes are killed and restarted at random and a fake LLM
//! fails a share of its calls. At the end, the invariant checker and the agents' own
//! ledger of what they appended must agree: nothing lost, duplicated or misplaced.
//!
//! Everything runs on this machine: its own database (dropped afterwards), a private
//! subject, a fake LLM on 127.0.0.1, and worker processes of this very binary.

mod agents;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Child;
use tokio::time::Instant;

use crate::db::Scratch;
use crate::worker_process;
use summarizer::check;
use summarizer::client::TurnClient;
use summarizer::config::Settings;

#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// How long agents run and workers are killed.
    #[arg(long, default_value_t = 120)]
    pub duration_secs: u64,
    /// Simulated agents, one session each.
    #[arg(long, default_value_t = 200)]
    pub sessions: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Share of LLM calls that fail with HTTP 500.
    #[arg(long, default_value_t = 0.2)]
    pub llm_failure_rate: f64,
    /// Mean time between two kills of a random worker.
    #[arg(long, default_value_t = 2000)]
    pub kill_every_ms: u64,
    /// How long an agent waits for the worker's answer before it proceeds.
    #[arg(long, default_value_t = 2000)]
    pub agent_timeout_ms: u64,
    /// Keep the run's database for inspection instead of dropping it.
    #[arg(long)]
    pub keep_database: bool,
}

/// Runs the chaos; returns whether every invariant held.
///
/// # Errors
/// When the run cannot be set up (services unreachable, workers cannot start).
pub async fn run(settings: &Settings, args: &ChaosArgs) -> anyhow::Result<bool> {
    if args.workers == 0 || args.sessions == 0 {
        bail!("--workers and --sessions must be positive");
    }
    let tag = format!("{:08x}", fastrand::u32(..));
    let db = Scratch::create(
        settings.database_url.expose(),
        &format!("summarizer_chaos_{tag}"),
        20,
    )
    .await
    .context("creating the chaos database")?;
    let (database_url, store) = (db.url.clone(), db.store.clone());

    let llm = crate::fake_llm::start(args.llm_failure_rate, 10..150).await?;
    let subject = format!("summarizer.chaos.{tag}.turn.starting");
    let env = worker_env(&database_url, &subject, &tag, &llm.url);
    let mut workers: Vec<Child> = (0..args.workers)
        .map(|_| worker_process::spawn(&env))
        .collect::<anyhow::Result<_>>()?;
    println!(
        "chaos {tag}: {} agents, {} workers, LLM failing {:.0}%, a kill every ~{} ms, for {} s",
        args.sessions,
        args.workers,
        args.llm_failure_rate * 100.0,
        args.kill_every_ms,
        args.duration_secs
    );

    let nats = summarizer::transport::connect_once(settings, "summarizer-chaos-agents").await?;
    let client = TurnClient::new(nats, subject);
    let stop = Arc::new(AtomicBool::new(false));
    let timeout = Duration::from_millis(args.agent_timeout_ms);
    let agents = agents::start(
        args.sessions,
        &tag,
        db.agents.clone(),
        client,
        timeout,
        stop.clone(),
    );

    let deadline = Instant::now() + Duration::from_secs(args.duration_secs);
    let mut kills = 0;
    while Instant::now() < deadline {
        let wait = Duration::from_millis(args.kill_every_ms).mul_f64(0.5 + fastrand::f64());
        tokio::time::sleep_until(deadline.min(Instant::now() + wait)).await;
        if Instant::now() >= deadline {
            break;
        }
        let victim = fastrand::usize(..workers.len());
        // Mostly crashes; sometimes a polite stop.
        let signal = if fastrand::f64() < 0.8 {
            "KILL"
        } else {
            "TERM"
        };
        worker_process::stop(&mut workers[victim], signal).await;
        workers[victim] = worker_process::spawn(&env)?;
        kills += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let ledger = agents.finish().await?;
    for worker in &mut workers {
        worker_process::stop(worker, "TERM").await;
    }

    let report = check::run(&store).await?;
    let audit = agents::audit(&db.agents, &ledger).await?;
    let clean = report.is_clean() && audit.is_clean(timeout);
    println!("\n{} worker kills; {}", kills, llm.summary());
    print!("{audit}");
    print!("{report}");
    println!(
        "{}",
        if clean {
            "chaos: every invariant held"
        } else {
            "chaos: INVARIANTS BROKEN"
        }
    );

    if args.keep_database {
        db.close().await;
        println!(
            "database kept: {}",
            summarizer::config::redact_url(&database_url)
        );
    } else {
        db.drop_database().await?;
    }
    Ok(clean)
}

/// Small limits and fast failure handling, so a short run sees many compactions, lease
/// takeovers and backoffs.
fn worker_env(
    database_url: &str,
    subject: &str,
    tag: &str,
    llm_url: &str,
) -> HashMap<String, String> {
    [
        ("DATABASE_URL", database_url),
        ("NATS_SUBJECT", subject),
        ("NATS_QUEUE_GROUP", &format!("summarizer-chaos-{tag}")),
        ("SUMMARIZATION_ENABLED", "true"),
        ("SUMMARIZATION_THRESHOLD_CHARS", "4000"),
        ("SUMMARIZATION_KEEP_CHARS", "1500"),
        ("LLM_PROVIDER", "openai"),
        ("LLM_BASE_URL", llm_url),
        ("LLM_API_KEY", "chaos"),
        ("LLM_MODEL", "chaos-model"),
        ("LLM_TIMEOUT_MS", "2000"),
        ("LLM_MAX_RETRIES", "1"),
        ("LLM_RETRY_MIN_DELAY_MS", "20"),
        ("LLM_RETRY_MAX_DELAY_MS", "100"),
        ("LLM_DEADLINE_MS", "3000"),
        ("LEASE_DURATION_MS", "4000"),
        ("FAILURE_BACKOFF_MS", "200"),
        ("FAILURE_BACKOFF_MAX_MS", "1000"),
        ("WORKER_CONCURRENCY", "16"),
        ("DATABASE_MAX_CONNECTIONS", "4"),
        ("SHUTDOWN_GRACE_MS", "3000"),
        ("HTTP_ADDR", ""),
        ("RUST_LOG", "error"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

//! `summarizer chaos`: a bounded fault run. Simulated agents append and ask on many
//! sessions while worker processes are killed and restarted at random and a fake LLM
//! fails a share of its calls. At the end, the invariant checker and the agents' own
//! ledger of what they appended must agree: nothing lost, duplicated or misplaced.
//!
//! Everything runs on this machine: its own database (dropped afterwards), a private
//! subject, a fake LLM on 127.0.0.1, and worker processes of this very binary.
//!
//! With `--database sqlite` the run's database is a SQLite file that every worker process
//! and every agent shares, as on one host.
//!
//! With `--transport jetstream` the agents publish a durable job per turn instead of
//! asking, to a stream of the run's own (deleted afterwards); after the kills stop, the
//! workers run until the stream is empty, which is the proof that every job was processed
//! or dead-lettered: a WorkQueue stream drops a job only when a worker acks it.

mod agents;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Child;
use tokio::time::Instant;

use crate::db::{AgentDb, AnyScratch};
use crate::worker_process;
use summarizer::audit;
use summarizer::client::{JobPublisher, TurnClient};
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
    /// `core`: agents ask with requests; `jetstream`: they publish durable jobs.
    #[arg(long, default_value = "core", value_parser = ["core", "jetstream"])]
    pub transport: String,
    /// `postgres`: a database beside `DATABASE_URL`'s; `sqlite`: a SQLite file shared by
    /// every process.
    #[arg(long, default_value = "postgres", value_parser = ["postgres", "sqlite"])]
    pub database: String,
}

/// How long the workers get, after the kills stop, to empty the job stream.
const JOBS_DRAIN: Duration = Duration::from_secs(60);

/// Runs the chaos; returns whether every invariant held.
///
/// # Errors
/// When the run cannot be set up (services unreachable, workers cannot start).
pub async fn run(settings: &Settings, args: &ChaosArgs) -> anyhow::Result<bool> {
    if args.workers == 0 || args.sessions == 0 {
        bail!("--workers and --sessions must be positive");
    }
    let tag = format!("{:08x}", fastrand::u32(..));
    let db = AnyScratch::create(
        settings.database_url.expose(),
        &format!("summarizer_chaos_{tag}"),
        20,
        args.database == "sqlite",
    )
    .await
    .context("creating the chaos database")?;
    let (database_url, store, agents_db) = (db.url(), db.store(), db.agents());

    let llm = crate::fake_llm::start(args.llm_failure_rate, 10..150).await?;
    let subject = format!("summarizer.chaos.{tag}.turn.starting");
    let jobs = args.transport == "jetstream";
    let mut env = worker_env(&database_url, &subject, &tag, &llm.url);
    let (stream, prefix) = (
        format!("CHAOS_{tag}"),
        format!("summarizer.chaos.{tag}.jobs"),
    );
    if jobs {
        for (k, v) in [
            ("TRANSPORT", "jetstream"),
            ("JETSTREAM_STREAM", stream.as_str()),
            ("JETSTREAM_CONSUMER", &format!("chaos-{tag}")),
            ("JETSTREAM_SUBJECT_PREFIX", prefix.as_str()),
            // A killed worker's jobs come back after this.
            ("JETSTREAM_ACK_WAIT_MS", "2000"),
        ] {
            env.insert(k.to_owned(), v.to_owned());
        }
    }
    let mut workers: Vec<Child> = (0..args.workers)
        .map(|_| worker_process::spawn(&env))
        .collect::<anyhow::Result<_>>()?;
    println!(
        "chaos {tag}: {} agents, {} workers on {}, LLM failing {:.0}%, a kill every ~{} ms, for {} s",
        args.sessions,
        args.workers,
        args.database,
        args.llm_failure_rate * 100.0,
        args.kill_every_ms,
        args.duration_secs
    );

    let nats = summarizer::transport::connect_once(settings, "summarizer-chaos-agents").await?;
    let asking = if jobs {
        // The stream is the workers' to create; agents must not publish before it exists.
        let job_settings = Settings::from_sources(
            None,
            Some(
                env.clone()
                    .into_iter()
                    .chain([("NATS_URL".to_owned(), settings.nats_url.expose().to_owned())])
                    .collect(),
            ),
        )?;
        summarizer::transport::jetstream::bind(&nats, &job_settings.jobs, &job_settings.subject)
            .await?;
        agents::Asking::Jobs(JobPublisher::new(nats.clone(), prefix.clone()))
    } else {
        agents::Asking::Requests(TurnClient::new(nats.clone(), subject))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let timeout = Duration::from_millis(args.agent_timeout_ms);
    let agents = agents::start(
        args.sessions,
        &tag,
        agents_db.clone(),
        asking,
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
    let jobs_report = if jobs {
        Some(drain_jobs(&nats, &stream, &agents_db).await)
    } else {
        None
    };
    for worker in &mut workers {
        worker_process::stop(worker, "TERM").await;
    }

    let report = audit::run(store.as_ref()).await?;
    let audit = agents::audit(&agents_db, &ledger).await?;
    let jobs_clean = match &jobs_report {
        Some(Ok(jobs)) => jobs.is_clean(),
        Some(Err(_)) => false,
        None => true,
    };
    let clean = report.is_clean() && audit.is_clean(timeout) && jobs_clean;
    println!("\n{} worker kills; {}", kills, llm.summary());
    print!("{audit}");
    match &jobs_report {
        Some(Ok(jobs)) => print!("{jobs}"),
        Some(Err(e)) => println!("jobs: could not be accounted for: {e:#}"),
        None => {}
    }
    print!("{report}");
    println!(
        "{}",
        if clean {
            "chaos: every invariant held"
        } else {
            "chaos: INVARIANTS BROKEN"
        }
    );

    if let Some(url) = db.finish(args.keep_database).await? {
        println!("database kept: {url}");
    }
    Ok(clean)
}

/// What became of the run's jobs.
struct JobsReport {
    published: u64,
    left_in_stream: u64,
    dead_letters: i64,
    /// Compactions recorded twice for one job (same session and request id).
    compacted_twice: i64,
}

impl JobsReport {
    fn is_clean(&self) -> bool {
        self.left_in_stream == 0 && self.compacted_twice == 0
    }
}

impl std::fmt::Display for JobsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "jobs: {} published, {} left in the stream, {} dead-lettered, {} compacted twice",
            self.published, self.left_in_stream, self.dead_letters, self.compacted_twice
        )
    }
}

/// Waits (bounded) for the workers to empty the run's stream, accounts for its jobs and
/// deletes it: the stream lives on the shared server.
async fn drain_jobs(
    nats: &async_nats::Client,
    stream: &str,
    db: &AgentDb,
) -> anyhow::Result<JobsReport> {
    let jetstream = async_nats::jetstream::new(nats.clone());
    let mut handle = jetstream.get_stream(stream).await?;
    let deadline = Instant::now() + JOBS_DRAIN;
    let state = loop {
        let state = handle.info().await?.state.clone();
        if state.messages == 0 || Instant::now() >= deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (dead_letters, compacted_twice) = db.dead_letters_and_twice_compacted().await?;
    jetstream.delete_stream(stream).await?;
    Ok(JobsReport {
        published: state.last_sequence,
        left_in_stream: state.messages,
        dead_letters,
        compacted_twice,
    })
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

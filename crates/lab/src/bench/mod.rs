//! `summarizer bench`: our paths against their raw baselines, measured in one run on one
//! machine, so the ratios mean something wherever it runs.
//!
//! It makes a database of its own (dropped afterwards), starts a worker process of this
//! binary on a private subject with a fake LLM answering after 200 ms, and measures:
//! a bare NATS request/reply echo and a bare Postgres primary-key SELECT (the baselines);
//! the no-op path end to end; the no-op path on a 10,000-message session; the compaction
//! path against the Little's-law bound; the worker's own cost per compaction without the
//! LLM; its cost to compact a 2 MB old part in chunks within the token budget, with an
//! LLM that answers at once; the turn that crosses the threshold with and without a
//! pending summary, against a bare commit (`precompute`); the worker's resident
//! memory; and the no-op and compaction paths on a SQLite file, against SQLite's own
//! bare primary-key read (`sqlite`).

mod idle;
mod load;
mod precompute;
mod recall;
mod report;
mod seed;
mod sqlite;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt};
use tokio::process::{Child, Command};

use crate::db::Scratch;
use crate::worker_process;
use summarizer::client::{Decision, TurnClient};
use summarizer::config::{Limits, Settings, ToolOutputs};
use summarizer::llm::LlmSummarizer;
use summarizer::llm::chat::{Chat, ChatRequest};
use summarizer::outcome::{Compaction, Outcome, Reason, Status};
use summarizer::store::prelude::*;
use summarizer::store::{PgStore, SharedStore};
use summarizer::summarizer::{LlmError, Summarizer, SummaryRequest};
use summarizer::summary::Summary;
use summarizer::usage::Meter;
use summarizer::worker::{Event, Policy, Worker};

pub use load::Measurement;
use report::Report;

/// The worker's concurrency and pool size during the run (the setting).
const CONCURRENCY: usize = 64;
const POOL: u32 = 16;
/// The fake LLM's latency on the compaction path.
const LLM_LATENCY: Duration = Duration::from_millis(200);
const LIMITS: Limits = Limits {
    threshold_chars: 60_000,
    keep_chars: 20_000,
};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A smoke run: a few hundred operations per figure, for CI.
    #[arg(long)]
    pub quick: bool,
    /// Internal: serve the NATS echo baseline on this subject.
    #[arg(long, hide = true)]
    pub serve_echo: Option<String>,
    /// Profiling aid: run only N no-op requests at concurrency 64 (attach a profiler to
    /// the worker meanwhile).
    #[arg(long, hide = true)]
    pub only_noop: Option<usize>,
    /// Run only the precompute scenario.
    #[arg(long, hide = true)]
    pub only_precompute: bool,
    /// Run only the SQLite scenario.
    #[arg(long, hide = true)]
    pub only_sqlite: bool,
    /// Run only the recall scenario.
    #[arg(long, hide = true)]
    pub only_recall: bool,
    /// Run only the idle schedule's scenario.
    #[arg(long, hide = true)]
    pub only_idle: bool,
}

/// How many operations each figure takes.
struct Sizes {
    only_noop: Option<usize>,
    usage_events: usize,
    sequential: usize,
    concurrent: usize,
    compactions: usize,
    cost_sessions: usize,
    /// 2 MB sessions compacted in chunks (one more, untimed, first).
    chunked_sessions: usize,
    precompute: precompute::Scale,
    only_precompute: bool,
    only_sqlite: bool,
    only_recall: bool,
    only_idle: bool,
    /// The archive sizes recall is measured at, ascending.
    recall: [usize; 2],
    /// The sessions the idle schedule is measured among.
    idle: idle::Scale,
}

impl Sizes {
    fn of(args: &BenchArgs) -> Self {
        if args.quick {
            Self {
                only_noop: args.only_noop,
                usage_events: 20_000,
                sequential: 200,
                concurrent: 2_000,
                compactions: 128,
                cost_sessions: 5,
                chunked_sessions: 2,
                precompute: precompute::Scale {
                    agents: 4,
                    cycles: 2,
                    bare_commits: 100,
                },
                only_precompute: args.only_precompute,
                only_sqlite: args.only_sqlite,
                only_recall: args.only_recall,
                only_idle: args.only_idle,
                recall: [2_000, 20_000],
                idle: idle::Scale {
                    sessions: 20_000,
                    due: 640,
                },
            }
        } else {
            Self {
                only_noop: args.only_noop,
                usage_events: 1_000_000,
                sequential: 3_000,
                concurrent: 100_000,
                compactions: 1_280,
                cost_sessions: 40,
                chunked_sessions: 10,
                precompute: precompute::Scale {
                    agents: 16,
                    cycles: 4,
                    bare_commits: 300,
                },
                only_precompute: args.only_precompute,
                only_sqlite: args.only_sqlite,
                only_recall: args.only_recall,
                only_idle: args.only_idle,
                recall: [10_000, 1_000_000],
                idle: idle::Scale {
                    sessions: 1_000_000,
                    due: 9_600,
                },
            }
        }
    }
}

/// Runs the benchmark and prints the report.
///
/// # Errors
/// When a service is unreachable or a measured operation fails.
pub async fn run(settings: &Settings, args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(subject) = &args.serve_echo {
        return serve_echo(settings, subject).await;
    }
    let sizes = Sizes::of(args);
    let tag = format!("{:08x}", fastrand::u32(..));
    let db = Scratch::create(
        settings.database_url.expose(),
        &format!("summarizer_bench_{tag}"),
        POOL,
    )
    .await
    .context("creating the bench database")?;
    let result = measure(settings, &sizes, &tag, &db).await;
    db.drop_database().await?;
    let report = result?;
    if args.json {
        let json = serde_json::json!({
            "machine": {
                "cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(0),
                "quick": args.quick,
            },
            "measurements": report,
            "targets": report.targets(),
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

async fn measure(
    settings: &Settings,
    sizes: &Sizes,
    tag: &str,
    db: &Scratch,
) -> anyhow::Result<Report> {
    let (database_url, store) = (db.url.as_str(), &db.store);
    let nats = || async { summarizer::transport::connect_once(settings, "summarizer-bench").await };
    if sizes.only_idle {
        return Ok(Report {
            idle: Some(idle::measure(db, sizes.idle, sizes.sequential).await?),
            ..Report::default()
        });
    }
    if sizes.only_recall {
        return Ok(Report {
            recall: recall::measure(db, &sizes.recall, sizes.sequential).await?,
            ..Report::default()
        });
    }
    if sizes.only_precompute {
        let figures = precompute::measure(db, tag, nats().await?, sizes.precompute).await?;
        return Ok(Report {
            precompute: Some(figures),
            ..Report::default()
        });
    }
    let seeded = seed::sessions(
        &db.agents,
        sizes.compactions,
        sizes.cost_sessions + COST_WARMUP,
        sizes.chunked_sessions + 1,
    )
    .await?;
    let llm = crate::fake_llm::start(
        0.0,
        LLM_LATENCY.as_millis() as u64..LLM_LATENCY.as_millis() as u64,
    )
    .await?;
    if sizes.only_sqlite {
        return Ok(Report {
            sqlite: Some(sqlite::measure(tag, sizes, nats().await?, &llm.url).await?),
            little_bound: CONCURRENCY as f64 / LLM_LATENCY.as_secs_f64(),
            ..Report::default()
        });
    }
    let subject = format!("summarizer.bench.{tag}.turn.starting");
    let mut worker = spawn_worker(database_url, &subject, tag, &llm.url)?;
    let client = TurnClient::new(nats().await?, subject);
    wait_ready(&client, &seeded.small[0]).await?;
    let pid = worker.id().context("the worker exited")?;
    let rss_idle = rss_kb(pid, "VmRSS")?;

    let mut report = Report::default();
    if let Some(total) = sizes.only_noop {
        let m = turns(
            &client,
            CONCURRENCY,
            total,
            0,
            Arc::new(seeded.small.clone()),
            Status::Skipped,
        )
        .await?;
        report.noop.push(m);
        worker_process::stop(&mut worker, "TERM").await;
        return Ok(report);
    }
    // Baselines.
    // The echo runs in a process of its own, as the worker does, so both round trips
    // cross the same process boundaries.
    let echo_subject = format!("summarizer.bench.{tag}.echo");
    let mut echo = Command::new(std::env::current_exe()?)
        .args(["bench", "--serve-echo", &echo_subject])
        .kill_on_drop(true)
        .spawn()
        .context("starting the echo server")?;
    let echo_client = nats().await?;
    wait_for_echo(&echo_client, &echo_subject).await?;
    let payload = summarizer::protocol::Request {
        session_id: seeded.small[0].clone(),
        request_id: Some("00000000".into()),
        ..Default::default()
    }
    .encode();
    for concurrency in [1, CONCURRENCY] {
        let (client, subject, payload) =
            (echo_client.clone(), echo_subject.clone(), payload.clone());
        let m = load::run(
            concurrency,
            sizes.ops(concurrency),
            sizes.warmup(concurrency),
            move |_| {
                let (client, subject, payload) = (client.clone(), subject.clone(), payload.clone());
                async move {
                    client.request(subject, payload.into()).await?;
                    Ok(())
                }
            },
        )
        .await?;
        report.nats_echo.push(m);
    }
    let baseline_pool = PgStore::connect_lazy(database_url, POOL, Duration::from_secs(30))?;
    for concurrency in [1, CONCURRENCY] {
        let (pool, small) = (baseline_pool.clone(), Arc::new(seeded.small.clone()));
        let m = load::run(
            concurrency,
            sizes.ops(concurrency),
            sizes.warmup(concurrency),
            move |i| {
                let (pool, small) = (pool.clone(), small.clone());
                async move {
                    pool.counters(&small[i % small.len()]).await?;
                    Ok(())
                }
            },
        )
        .await?;
        report.postgres_select.push(m);
    }
    baseline_pool.close().await;

    // Our no-op path, end to end.
    for concurrency in [1, CONCURRENCY] {
        let m = turns(
            &client,
            concurrency,
            sizes.ops(concurrency),
            sizes.warmup(concurrency),
            Arc::new(seeded.small.clone()),
            Status::Skipped,
        )
        .await?;
        report.noop.push(m);
    }
    for session in [&seeded.ten, &seeded.huge] {
        let m = turns(
            &client,
            1,
            sizes.sequential,
            sizes.warmup(1),
            Arc::new(vec![session.clone()]),
            Status::Skipped,
        )
        .await?;
        report.noop_by_length.push(m);
    }

    // The compaction path: every request compacts a session of its own (so no warm-up;
    // the no-op runs warmed the worker).
    let m = turns(
        &client,
        CONCURRENCY,
        seeded.over.len(),
        0,
        Arc::new(seeded.over.clone()),
        Status::Compacted,
    )
    .await?;
    report.compactions = Some(m);
    report.little_bound = CONCURRENCY as f64 / LLM_LATENCY.as_secs_f64();
    report.rss_idle_mb = rss_idle as f64 / 1024.0;
    report.rss_peak_mb = rss_kb(pid, "VmHWM")? as f64 / 1024.0;
    worker_process::stop(&mut worker, "TERM").await;

    report.precompute = Some(precompute::measure(db, tag, nats().await?, sizes.precompute).await?);
    let store: SharedStore = Arc::new(store.clone());
    report.worker_cost = Some(worker_cost(&store, &seeded.thousand).await?);
    let clearing = ToolOutputs {
        clearing: true,
        ..ToolOutputs::default()
    };
    report.clearing_cost = Some(tool_heavy_cost(&store, &seeded.tool_heavy.0, clearing).await?);
    report.tool_summary_cost =
        Some(tool_heavy_cost(&store, &seeded.tool_heavy.1, ToolOutputs::default()).await?);
    let (cost, requests) = chunked_cost(&store, &seeded.two_mb).await?;
    report.chunked_cost = Some(cost);
    report.chunked_requests = requests;
    report.stats = Some(stats_at_scale(db, sizes.usage_events).await?);
    report.usage_events = sizes.usage_events;
    report.recall = recall::measure(db, &sizes.recall, sizes.sequential).await?;
    report.idle = Some(idle::measure(db, sizes.idle, sizes.sequential).await?);
    // Last, so the Postgres figures are taken as they were before it existed.
    report.sqlite = Some(sqlite::measure(tag, sizes, nats().await?, &llm.url).await?);
    echo.kill().await?;
    Ok(report)
}

impl Sizes {
    fn ops(&self, concurrency: usize) -> usize {
        if concurrency == 1 {
            self.sequential
        } else {
            self.concurrent
        }
    }

    /// A tenth of the timed operations, untimed, first.
    fn warmup(&self, concurrency: usize) -> usize {
        self.ops(concurrency) / 10
    }
}

/// Untimed 1,000-message compactions before the timed ones.
const COST_WARMUP: usize = 3;

/// Turn-starting requests for `sessions` (the i-th op takes session i modulo their
/// number); every reply must have status `expect`.
async fn turns(
    client: &TurnClient,
    concurrency: usize,
    total: usize,
    warmup: usize,
    sessions: Arc<Vec<String>>,
    expect: Status,
) -> anyhow::Result<Measurement> {
    let client = client.clone();
    load::run(concurrency, total, warmup, move |i| {
        let (client, sessions) = (client.clone(), sessions.clone());
        async move {
            match client
                .turn_starting(&sessions[i % sessions.len()], Duration::from_secs(30))
                .await
            {
                Decision::Replied(reply) if reply.status == expect => Ok(()),
                other => bail!("expected {}, got {other:?}", expect.as_str()),
            }
        }
    })
    .await
}

/// The policy of the in-process workers: the bench's limits, no backoff.
fn in_process_policy() -> Policy {
    Policy {
        enabled: true,
        limits: LIMITS,
        threshold_tokens: 0,
        bounds: summarizer::config::Bounds::default(),
        lease_duration: Duration::from_secs(60),
        failure_backoff: Duration::ZERO,
        failure_backoff_max: Duration::ZERO,
        summary_max_chars: 6_000,
        // The default: quoting the user's words is part of writing a summary.
        user_words_chars: summarizer::summary::words::DEFAULT_CHARS,
        // The default: the fact check is part of the worker's cost per compaction.
        fact_check: summarizer::config::FactCheck::default(),
        llm_deadline: Duration::from_secs(60),
        concurrency: 64,
        precompute: summarizer::config::Precompute::default(),
        idle: summarizer::config::Idle::default(),
        // The default: redaction is part of the worker's cost per compaction.
        redact_secrets: true,
    }
}

/// The worker's own cost per compaction (load, plan, commit) on 1,000-message sessions,
/// in this process, with a summarizer that answers at once.
async fn worker_cost(store: &SharedStore, sessions: &[String]) -> anyhow::Result<Measurement> {
    let worker = Worker::new(
        store.clone(),
        Arc::new(Instant),
        in_process_policy(),
        Arc::default(),
    );
    compactions_cost(worker, sessions, |_| true).await
}

/// The worker's cost per compaction (load, plan, commit) of a session of tool steps,
/// clearing its old tool output (`tool_outputs` on: no summary is needed) or summarizing
/// its old part (off), in this process, with a summarizer that answers at once.
async fn tool_heavy_cost(
    store: &SharedStore,
    sessions: &[String],
    tool_outputs: ToolOutputs,
) -> anyhow::Result<Measurement> {
    let clearing = tool_outputs.clearing;
    let worker = Worker::new(
        store.clone(),
        Arc::new(Instant),
        in_process_policy(),
        Arc::default(),
    )
    .with_tool_outputs(tool_outputs);
    compactions_cost(worker, sessions, move |c| c.summarized != clearing).await
}

/// One compaction by `worker` of each of `sessions` (the last [`COST_WARMUP`] untimed,
/// first), each answered `compacted` as `expected` says.
async fn compactions_cost(
    worker: Worker,
    sessions: &[String],
    expected: impl Fn(&Compaction) -> bool + Clone + Send + Sync + 'static,
) -> anyhow::Result<Measurement> {
    let worker = Arc::new(worker);
    let sessions = Arc::new(sessions.to_vec());
    load::run(1, sessions.len() - COST_WARMUP, COST_WARMUP, move |i| {
        let (worker, sessions, expected) = (worker.clone(), sessions.clone(), expected.clone());
        async move {
            let event = Event::new(sessions[i].clone(), None);
            match worker.process(&event).await.outcome {
                Outcome::Compacted(c) if expected(&c) => Ok(()),
                other => bail!("expected a compaction of {}, got {other:?}", sessions[i]),
            }
        }
    })
    .await
}

/// The worker's cost to compact a 2 MB session whose old part is summarized in chunks:
/// load, plan, render, count and chunk within the default `LLM_MAX_INPUT_TOKENS`, then
/// commit, with the production `LlmSummarizer` over a provider that answers at once.
/// Returns it with the average number of requests per compaction.
async fn chunked_cost(
    store: &SharedStore,
    sessions: &[String],
) -> anyhow::Result<(Measurement, f64)> {
    let chat = InstantChat::default();
    let requests = chat.requests.clone();
    let summarizer =
        LlmSummarizer::with_budget(Box::new(chat), 100_000, 2_000, Duration::from_secs(600));
    let worker = Arc::new(Worker::new(
        store.clone(),
        Arc::new(summarizer),
        in_process_policy(),
        Arc::default(),
    ));
    let sessions = Arc::new(sessions.to_vec());
    let timed = sessions.len() - 1;
    let m = load::run(1, timed, 1, move |i| {
        let (worker, sessions) = (worker.clone(), sessions.clone());
        async move {
            let event = Event::new(sessions[i].clone(), None);
            match worker.process(&event).await.outcome {
                Outcome::Compacted(c) if c.chars_removed > 1_900_000 => Ok(()),
                other => bail!("expected a 2 MB compaction, got {other:?}"),
            }
        }
    })
    .await?;
    let per_compaction = requests.load(Ordering::Relaxed) as f64 / (timed + 1) as f64;
    Ok((m, per_compaction))
}

/// `GET /stats`'s query (the same function) over `events` usage events spread over 90
/// days, 50 times. The events are seeded through the scratch database's own pool: the
/// store has no statement for fake usage.
async fn stats_at_scale(db: &Scratch, events: usize) -> anyhow::Result<Measurement> {
    const BATCH: usize = 100_000;
    for first in (0..events).step_by(BATCH) {
        let last = (first + BATCH).min(events);
        sqlx::query(
            "INSERT INTO usage_events (session_id, model, prompt_tokens, completion_tokens,
                                       metadata, created_at)
             SELECT 'bench-stats-' || (n % 1000), 'bench', 100, 30,
                    jsonb_build_object('summarization', true, 'messages_removed', 10,
                                       'chars_removed', 1000, 'duration_ms', n % 5000),
                    now() - (n % 90) * interval '1 day'
             FROM generate_series($1::bigint, $2::bigint) AS n",
        )
        .bind(i64::try_from(first)?)
        .bind(i64::try_from(last)? - 1)
        .execute(&db.agents)
        .await?;
    }
    sqlx::query("ANALYZE usage_events")
        .execute(&db.agents)
        .await?;
    let store = db.store.clone();
    load::run(1, 50, 5, move |_| {
        let store = store.clone();
        async move {
            store.stats(30).await?;
            Ok(())
        }
    })
    .await
}

/// A summarizer that answers at once, so only the worker's own work is timed.
struct Instant;

impl Summarizer for Instant {
    fn summarize<'a>(
        &'a self,
        _request: SummaryRequest<'a>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        futures_util::future::ready(Ok(Summary {
            text: "**Investigating:** bench\n**Key findings:**\n- none\n**Ruled out:** nothing ruled out yet\n**Current state:** benchmarking".into(),
            model: "instant".into(),
            ..Summary::default()
        }))
        .boxed()
    }
}

/// A provider that answers every request at once with a valid summary, counting them.
#[derive(Default)]
struct InstantChat {
    requests: Arc<AtomicUsize>,
}

impl Chat for InstantChat {
    fn complete<'a>(
        &'a self,
        _request: &'a ChatRequest,
        _meter: Option<&'a Meter>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Instant.summarize(SummaryRequest::default())
    }
}

/// `summarizer bench --serve-echo SUBJECT`: the NATS baseline's server, answering every
/// request with its own payload, on a queue group, until killed.
async fn serve_echo(settings: &Settings, subject: &str) -> anyhow::Result<()> {
    let nats = summarizer::transport::connect_once(settings, "summarizer-bench-echo").await?;
    let mut requests = nats
        .queue_subscribe(subject.to_owned(), "bench-echo".into())
        .await?;
    while let Some(request) = requests.next().await {
        if let Some(reply) = request.reply {
            nats.publish(reply, request.payload).await?;
        }
    }
    Ok(())
}

async fn wait_for_echo(client: &async_nats::Client, subject: &str) -> anyhow::Result<()> {
    for _ in 0..300 {
        let request = async_nats::Request::new().timeout(Some(Duration::from_secs(1)));
        if client
            .send_request(subject.to_owned(), request)
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the echo server did not come up")
}

fn spawn_worker(
    database_url: &str,
    subject: &str,
    tag: &str,
    llm_url: &str,
) -> anyhow::Result<Child> {
    let env: HashMap<&str, String> = HashMap::from([
        ("DATABASE_URL", database_url.to_owned()),
        ("NATS_SUBJECT", subject.to_owned()),
        ("NATS_QUEUE_GROUP", format!("summarizer-bench-{tag}")),
        ("SUMMARIZATION_ENABLED", "true".into()),
        (
            "SUMMARIZATION_THRESHOLD_CHARS",
            LIMITS.threshold_chars.to_string(),
        ),
        ("SUMMARIZATION_KEEP_CHARS", LIMITS.keep_chars.to_string()),
        ("WORKER_CONCURRENCY", CONCURRENCY.to_string()),
        ("DATABASE_MAX_CONNECTIONS", POOL.to_string()),
        ("LLM_PROVIDER", "openai".into()),
        ("LLM_BASE_URL", llm_url.to_owned()),
        ("LLM_API_KEY", "bench".into()),
        ("HTTP_ADDR", String::new()),
        ("RUST_LOG", "warn".into()),
    ]);
    worker_process::spawn(&env)
}

async fn wait_ready(client: &TurnClient, session: &str) -> anyhow::Result<()> {
    for _ in 0..300 {
        if let Decision::Replied(reply) =
            client.turn_starting(session, Duration::from_secs(1)).await
        {
            if reply.reason == Reason::BelowThreshold {
                return Ok(());
            }
            bail!("the worker answered {reply:?} for a small session");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the worker did not come up within 30 s")
}

/// A `/proc/<pid>/status` field in kB (`VmRSS` now, `VmHWM` the peak).
fn rss_kb(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches(" kB").parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

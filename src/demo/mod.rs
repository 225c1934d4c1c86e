//! `summarizer demo`: the whole loop on one machine. A worker runs in-process on a
//! private subject; a scripted agent investigates an incident turn by turn, appending its
//! messages with plain SQL and asking the worker before each turn, as a real agent would.
//!
//! It runs on the database `DATABASE_URL` names, or on a temporary SQLite file with
//! `--database sqlite`, or when Postgres does not answer (it says so). It asks the worker
//! over NATS, or, when NATS does not answer within [`NATS_PATIENCE`] and the environment
//! (or `.env`) does not set `NATS_URL`, over the in-process transport
//! ([`crate::transport::in_process`]), the same worker behind it (it says so too): with
//! neither service installed, the demo still runs. A `NATS_URL` in the environment is the
//! user's own server, so the demo stops and names it rather than work around it; the
//! default URL, or one from a `--config` file, is only where a server might be.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::app::Application;
use crate::client::{Decision, TurnClient};
use crate::config::{Limits, Secret, Settings, redact_url};
use crate::message::{Message, Role};
use crate::store::{Backend, PgStore};
use crate::transport::in_process::{self, InProcessClient};
use sqlx::{PgPool, SqlitePool};

mod script;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Compact above this many chars (small, so a short script crosses it).
    #[arg(long, default_value_t = 5000)]
    threshold_chars: i64,
    /// Keep at least this many recent chars.
    #[arg(long, default_value_t = 2000)]
    keep_chars: i64,
    /// How long each turn waits for the worker.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// `sqlite`: a temporary SQLite file instead of `DATABASE_URL`; `postgres`:
    /// `DATABASE_URL` and no fallback. By default, `DATABASE_URL`, falling back to a
    /// temporary SQLite file when Postgres does not answer.
    #[arg(long, value_enum)]
    database: Option<DemoDatabase>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoDatabase {
    Postgres,
    Sqlite,
}

/// How long the demo waits for Postgres before falling back to SQLite.
const POSTGRES_PATIENCE: Duration = Duration::from_secs(5);
/// How long the demo waits for NATS before falling back to the in-process transport.
pub const NATS_PATIENCE: Duration = Duration::from_secs(3);

/// How the demo's agent reaches its worker.
enum Turns {
    Nats(TurnClient),
    InProcess(InProcessClient),
}

impl Turns {
    async fn turn_starting(&self, session: &str, timeout: Duration) -> Decision {
        match self {
            Self::Nats(client) => client.turn_starting(session, timeout).await,
            Self::InProcess(client) => client.turn_starting(session, timeout).await,
        }
    }
}

/// The agent's NATS connection, or `None` (said so) when NATS does not answer and
/// `NATS_URL` was not set explicitly (see the module doc).
///
/// # Errors
/// When an explicitly set NATS does not answer, or refuses the connection.
async fn connect_nats(settings: &Settings) -> anyhow::Result<Option<async_nats::Client>> {
    let explicit = std::env::var_os("NATS_URL").is_some();
    let connected = tokio::time::timeout(
        NATS_PATIENCE,
        crate::transport::connect_once(settings, "summarizer-demo-agent"),
    )
    .await;
    let why = match connected {
        Ok(Ok(client)) => return Ok(Some(client)),
        Ok(Err(e)) if explicit => return Err(e),
        Err(_) if explicit => bail!(
            "NATS at {} did not answer in {} s",
            redact_url(settings.nats_url.expose()),
            NATS_PATIENCE.as_secs()
        ),
        Ok(Err(e)) => format!("{e:#}"),
        Err(_) => format!("no answer in {} s", NATS_PATIENCE.as_secs()),
    };
    println!(
        "NATS at {} did not answer ({why}) and NATS_URL is not set; running the agent and \
         the worker in this process, over the in-process transport",
        redact_url(settings.nats_url.expose())
    );
    Ok(None)
}

/// Runs the demo; fails unless the worker compacted the session at least once.
///
/// # Errors
/// When a service is unreachable, or the script ends without a compaction.
pub async fn run(mut settings: Settings, args: DemoArgs) -> anyhow::Result<()> {
    if args.keep_chars >= args.threshold_chars || args.keep_chars <= 0 {
        bail!("--keep-chars must be positive and smaller than --threshold-chars");
    }
    let tag = format!("{:08x}", fastrand::u32(..));
    settings.enabled = true;
    settings.limits = Limits {
        threshold_chars: args.threshold_chars,
        keep_chars: args.keep_chars,
    };
    // A private subject: a fleet already running on this NATS does not take the demo's
    // events, and the demo's worker does not take the fleet's.
    settings.subject = format!("summarizer.demo.{tag}.turn.starting");
    settings.http_addr = None;
    // The agent's NATS connection first: a worker would wait for NATS without end, where
    // the demo should stop and say so, or do without it.
    let nats = connect_nats(&settings).await?;

    let (url, _temporary) =
        database_url(settings.database_url.expose(), args.database, &tag).await?;
    settings.database_url = Secret::new(url.clone());
    let app = Application::build(&settings).await?;
    let store = app.store().clone();
    // The agent's own connection, as a real agent has: it writes with plain SQL.
    let agent = Agent::connect(&url)?;
    let health = app.health();
    let shutdown = CancellationToken::new();
    let (client, mut worker) = match nats {
        Some(nats) => (
            Turns::Nats(TurnClient::new(nats, settings.subject.clone())),
            tokio::spawn(app.run_until_stopped(shutdown.clone())),
        ),
        None => {
            let (client, incoming) = in_process::channel(settings.concurrency);
            (
                Turns::InProcess(client),
                tokio::spawn(app.run_in_process(incoming, shutdown.clone())),
            )
        }
    };
    tokio::select! {
        () = health.wait_until_ready() => {}
        stopped = &mut worker => {
            stopped.context("worker task")??;
            bail!("the worker stopped before it was ready");
        }
    }

    let session = format!("demo-{tag}");
    println!(
        "summarizer demo: session {session}, compacting above {} chars, keeping {} (provider {:?})\n",
        args.threshold_chars, args.keep_chars, settings.llm.provider
    );

    let timeout = Duration::from_millis(args.timeout_ms);
    let mut compactions = 0;
    for (n, turn) in script::turns().iter().enumerate() {
        let before = store.messages(&session).await?;
        let decision = client.turn_starting(&session, timeout).await;
        print_decision(n + 1, &decision);
        if decision.compacted() {
            compactions += 1;
            if compactions == 1 {
                print_history("history before the first compaction", &before);
                print_history("history after it", &store.messages(&session).await?);
            }
        }
        for message in turn {
            append(&agent, &session, message).await?;
        }
    }
    let decision = client.turn_starting(&session, timeout).await;
    print_decision(script::turns().len() + 1, &decision);
    compactions += usize::from(decision.compacted());

    print_history("final history", &store.messages(&session).await?);
    println!("stats (all sessions in this database):");
    print!("{}", crate::tables::stats(&store.stats(30).await?));

    shutdown.cancel();
    worker.await.context("worker task")??;
    if compactions == 0 {
        bail!("the script ended without a compaction; is the threshold above the script's size?");
    }
    println!("\n{compactions} compactions; demo done");
    Ok(())
}

/// One scripted message, as the agent writes it.
pub struct Scripted {
    pub role: Role,
    pub content: String,
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
}

/// A SQLite file the demo made, removed (with its WAL) when the demo ends.
struct TemporaryFile(PathBuf);

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        crate::store::sqlite::remove_files(&self.0);
    }
}

/// The database the demo runs on: `configured` (creating the Postgres database if
/// missing), or a temporary SQLite file when asked to or when Postgres does not answer.
async fn database_url(
    configured: &str,
    asked: Option<DemoDatabase>,
    tag: &str,
) -> anyhow::Result<(String, Option<TemporaryFile>)> {
    let sqlite = || {
        let path = std::env::temp_dir().join(format!("summarizer-demo-{tag}.db"));
        println!(
            "using a temporary SQLite file: {} (removed at the end)",
            path.display()
        );
        (
            format!("sqlite://{}", path.display()),
            Some(TemporaryFile(path)),
        )
    };
    if asked == Some(DemoDatabase::Sqlite) {
        return Ok(sqlite());
    }
    if Backend::of(configured) == Backend::Sqlite {
        return Ok((configured.to_owned(), None));
    }
    let created = tokio::time::timeout(
        POSTGRES_PATIENCE,
        PgStore::create_database_if_missing(configured),
    )
    .await;
    match created {
        Ok(Ok(created)) => {
            if created {
                println!("created the database");
            }
            Ok((configured.to_owned(), None))
        }
        _ if asked == Some(DemoDatabase::Postgres) => {
            bail!("Postgres at {} did not answer", redact_url(configured))
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => crate::error_chain(&e),
                _ => format!("no answer in {} s", POSTGRES_PATIENCE.as_secs()),
            };
            println!(
                "Postgres at {} did not answer ({why}); falling back to SQLite",
                redact_url(configured)
            );
            Ok(sqlite())
        }
    }
}

/// The agent's own connection to the database.
enum Agent {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Agent {
    fn connect(url: &str) -> anyhow::Result<Self> {
        Ok(match Backend::of(url) {
            Backend::Postgres => Self::Postgres(PgPool::connect_lazy(url).context("DATABASE_URL")?),
            Backend::Sqlite => Self::Sqlite(SqlitePool::connect_lazy_with(
                crate::store::sqlite::connect_options(url).context("DATABASE_URL")?,
            )),
        })
    }
}

/// What an agent does after each step: a plain INSERT into the public table (in SQLite,
/// `tool_calls` is JSON text).
async fn append(agent: &Agent, session: &str, m: &Scripted) -> anyhow::Result<()> {
    let written = match agent {
        Agent::Postgres(pool) => sqlx::query(
            "INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(session)
        .bind(m.role.as_str())
        .bind(&m.content)
        .bind(&m.tool_calls)
        .bind(&m.tool_call_id)
        .execute(pool)
        .await
        .map(drop),
        Agent::Sqlite(pool) => sqlx::query(
            "INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(session)
        .bind(m.role.as_str())
        .bind(&m.content)
        .bind(m.tool_calls.as_ref().map(Value::to_string))
        .bind(&m.tool_call_id)
        .execute(pool)
        .await
        .map(drop),
    };
    written.context("appending a message")
}

fn print_decision(turn: usize, decision: &Decision) {
    let Decision::Replied(reply) = decision else {
        println!(
            "turn {turn:>2}: no reply ({}): proceeding",
            decision.reason()
        );
        return;
    };
    let figure = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    if decision.compacted() {
        println!(
            "turn {turn:>2}: compacted: session {} chars, removed {} msgs ({} chars), kept {} msgs, summary {} chars, {} ms",
            figure(reply.session_chars),
            figure(reply.messages_removed),
            figure(reply.chars_removed),
            figure(reply.messages_kept),
            figure(reply.summary_chars),
            reply.duration_ms
        );
    } else {
        println!(
            "turn {turn:>2}: {}/{}: session {} chars",
            reply.status.as_str(),
            reply.reason.as_str(),
            figure(reply.session_chars)
        );
    }
}

fn print_history(title: &str, messages: &[Message]) {
    let chars: i64 = messages.iter().map(|m| m.chars).sum();
    println!(
        "\n--- {title}: {} messages, {chars} chars ---",
        messages.len()
    );
    for m in messages {
        if m.is_summary {
            println!("  #{:<5} summary {:>5} chars", m.seq, m.chars);
            for line in m.content.lines() {
                println!("      | {line}");
            }
            continue;
        }
        let mut preview: String = m.content.split_whitespace().collect::<Vec<_>>().join(" ");
        for call in m.calls().iter() {
            let call = crate::message::ToolCall(call);
            let name = call.name().unwrap_or("(unnamed)");
            let args = call.arguments().unwrap_or_default();
            preview.push_str(&format!(" → {name}({args})"));
        }
        let preview: String = preview.chars().take(90).collect();
        let role = match m.role {
            Role::User => "human",
            other => other.as_str(),
        };
        println!("  #{:<5} {role:<9} {:>5} chars  {preview}", m.seq, m.chars);
    }
    println!();
}

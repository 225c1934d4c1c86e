//! The `summarizer` command line: `worker`, `migrate`, `stats`, `session`, `restore`,
//! `prune-archive`, `check`, `repair`, `turn`, `dead-letters`, `demo` and `eval`. (`bench` and `chaos` are the
//! lab's: `summarizer-lab`.)

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::app::Application;
use crate::client::{Decision, TurnClient};
use crate::config::{Settings, redact_url};
use crate::overrides::{self, Change, Overrides};
use crate::store::{SettingsError, SharedStore, Store};
use crate::{audit, demo, telemetry, transport};

/// Exit code for a configuration error (sysexits' EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "summarizer",
    version,
    about = "Keeps LLM-agent conversations inside their context window"
)]
pub struct Cli {
    /// A TOML file with settings, under the same names as the environment variables.
    #[arg(long, global = true, env = "SUMMARIZER_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve turn-starting events from NATS until SIGTERM or SIGINT.
    Worker,
    /// Apply the database migrations and exit.
    Migrate,
    /// Print the compaction aggregates.
    Stats {
        /// Print `{"summary": {...}, "daily": [...]}`, as `GET /stats` answers.
        #[arg(long)]
        json: bool,
        /// Days of the per-day series.
        #[arg(long, default_value_t = 30)]
        days: i32,
    },
    /// Show one session: counters, lease, backoff, settings, last compactions (JSON).
    /// With --set or --unset, change its settings instead and print them.
    Session {
        session_id: String,
        /// How many compactions to list, newest first.
        #[arg(long, default_value_t = 10)]
        compactions: i64,
        /// Set one of the session's settings: enabled=true|false, threshold_chars=N,
        /// keep_chars=N, model=NAME, tool_output_clearing=on|off, tool_output_keep=N,
        /// threshold_tokens=N.
        /// Repeatable; checked as a whole, nothing is written when one is wrong.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Make a setting inherit the configuration again (applied before --set).
        /// Repeatable.
        #[arg(long = "unset", value_name = "KEY")]
        unset: Vec<String>,
    },
    /// Put a session's compacted messages back and remove the summary: the newest
    /// compaction, or every one from --compaction on.
    Restore {
        session_id: String,
        /// The oldest compaction to undo (with every newer one).
        #[arg(long)]
        compaction: Option<i64>,
        /// Print what was restored, and what was not and why, as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete archived messages older than a duration (`30d`, `12h`); their compactions
    /// can no longer be restored.
    PruneArchive {
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Count what would go, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Check the whole database's invariants (nothing lost, duplicated or misplaced);
    /// exit 1 when one is broken.
    Check {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Recompute sessions' counters from their messages and print those that drifted
    /// (before -> after); writes nothing unless --apply.
    Repair {
        /// Write the recomputed counters.
        #[arg(long)]
        apply: bool,
    },
    /// Search what compaction archived from a session (`recall <session> <query>`), or
    /// fetch archived messages by seq (`recall <session> --seq N`), as the agent's recall
    /// requests do; read from the database, no worker needed.
    Recall {
        session_id: String,
        /// Words or identifiers to search for (terms of 3 chars or more).
        #[arg(required_unless_present = "seqs")]
        query: Option<String>,
        /// Fetch this archived message (repeatable) instead of searching.
        #[arg(long = "seq", conflicts_with = "query")]
        seqs: Vec<i64>,
        /// How many results a search returns, at most 50.
        #[arg(long, default_value_t = summarizer_client::recall::DEFAULT_LIMIT, conflicts_with = "seqs")]
        limit: usize,
        /// Each result's content is cut at this many chars, at most 20000.
        #[arg(long, default_value_t = summarizer_client::recall::DEFAULT_MAX_CHARS)]
        max_chars: usize,
        /// Print the reply as the recall subject answers it, in JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send one turn-starting request and print the reply (compacts by hand).
    Turn {
        session_id: String,
        /// How long to wait for a worker's reply.
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
    },
    /// Compact a session now, through the fleet, even below its threshold (a forced
    /// compaction: docs/protocol.md, "Forced compactions"), and print the reply. Exit 0
    /// when it compacted, 1 otherwise (skipped, busy, rejected, failed, no reply).
    Compact {
        session_id: String,
        /// The summary's focus: what it should keep first (at most 4,000 chars).
        #[arg(long)]
        instructions: Option<String>,
        /// Keep at least this many of the newest chars (clamped to the worker's bounds).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        keep_chars: Option<i64>,
        /// How long to wait for the reply; default: LLM_DEADLINE_MS and 10 s more, as a
        /// compaction may take the LLM's whole deadline.
        #[arg(long)]
        timeout_ms: Option<u64>,
    },
    /// The durable job queue's dead letters (TRANSPORT=jetstream|both): jobs that failed
    /// JETSTREAM_MAX_DELIVER times.
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
    /// Play a scripted incident investigation against an in-process worker.
    Demo(demo::DemoArgs),
    /// Measure how many facts the summarizers keep, on the corpus of scripted
    /// investigations (no database, no NATS).
    Eval(crate::eval::EvalArgs),
}

#[derive(Debug, Subcommand)]
enum DeadLetterAction {
    /// List them, oldest first: those not replayed yet, or all with --all.
    List {
        #[arg(long)]
        all: bool,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Publish them again to the job stream (payload and subject as first published, a
    /// new Nats-Msg-Id, no Reply-To): the given ids, or every one not replayed yet with
    /// --all. Each is replayed once.
    Replay {
        ids: Vec<i64>,
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
    /// Delete the replayed ones, or all with --all.
    Purge {
        #[arg(long)]
        all: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    run_command(cli.config.as_deref(), |settings| run(cli.command, settings))
}

/// Loads the settings (`.env`, the config file, the environment; exit 64 when they are
/// wrong), starts logging and the runtime, and runs `command` on it: the start of every
/// command, this binary's and the lab's.
pub fn run_command<F, Fut>(config: Option<&Path>, command: F) -> ExitCode
where
    F: FnOnce(Settings) -> Fut,
    Fut: Future<Output = anyhow::Result<ExitCode>>,
{
    if let Err(e) = dotenvy::dotenv()
        && !e.not_found()
    {
        eprintln!("summarizer: configuration error: .env: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let settings = match Settings::load(config) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("summarizer: configuration error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(settings.log_format, settings.secret_values());
    for warning in &settings.deprecated {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("summarizer: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command(settings)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("summarizer: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `summarizer worker`: serves until SIGTERM or SIGINT, then drains.
///
/// # Errors
/// When the worker cannot be built or a service refuses it for good.
pub async fn worker(settings: Settings) -> anyhow::Result<ExitCode> {
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let app = Application::build(&settings).await?;
    // On a runtime thread, not block_on's: the serving loop then shares threads with the
    // NATS connection task instead of trading wake-ups with it.
    tokio::spawn(app.run_until_stopped(shutdown))
        .await
        .context("worker task")??;
    Ok(ExitCode::SUCCESS)
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Worker => return worker(settings).await,
        Command::Migrate => {
            store(&settings)?.migrate().await.context("migrating")?;
            println!(
                "migrations applied to {}",
                redact_url(settings.database_url.expose())
            );
        }
        Command::Stats { json, days } => {
            let stats = store(&settings)?
                .stats(days)
                .await
                .context("reading stats")?;
            if json {
                println!("{}", serde_json::to_string(&stats)?);
            } else {
                print!("{}", crate::tables::stats(&stats));
            }
        }
        Command::Session {
            session_id,
            set,
            unset,
            ..
        } if !set.is_empty() || !unset.is_empty() => {
            return change_session(
                store(&settings)?.as_ref(),
                &settings,
                &session_id,
                &unset,
                &set,
            )
            .await;
        }
        Command::Session {
            session_id,
            compactions,
            ..
        } => {
            let store = store(&settings)?;
            match store.session(&session_id, compactions).await? {
                Some(view) => println!("{}", serde_json::to_string_pretty(&view)?),
                None => {
                    eprintln!("no session {session_id:?}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Command::Restore {
            session_id,
            compaction,
            json,
        } => {
            let restored = store(&settings)?.restore(&session_id, compaction).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&restored)?);
            } else {
                println!(
                    "restored compactions {:?} of {session_id:?}: {} messages back, summaries removed",
                    restored.compactions, restored.messages_restored
                );
                for kept in &restored.not_restored {
                    println!(
                        "not restored: seq {} of compaction {}: {}; its original stays \
                         archived (recall --seq {} reads it)",
                        kept.seq,
                        kept.compaction_id,
                        kept.reason.explain(),
                        kept.seq
                    );
                }
            }
        }
        Command::PruneArchive {
            older_than,
            dry_run,
        } => {
            let pruned = store(&settings)?.prune_archive(older_than, dry_run).await?;
            println!(
                "{} {} archived messages of {} compactions",
                if dry_run { "would delete" } else { "deleted" },
                pruned.archived_messages,
                pruned.compactions
            );
        }
        Command::Check { json } => {
            let report = audit::run(store(&settings)?.as_ref())
                .await
                .context("checking")?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{report}");
            }
            if !report.is_clean() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Repair { apply } => print!("{}", repair(store(&settings)?.as_ref(), apply).await?),
        Command::Recall {
            session_id,
            query,
            seqs,
            limit,
            max_chars,
            json,
        } => {
            let request = match query {
                Some(query) => summarizer_client::RecallRequest {
                    max_chars,
                    ..summarizer_client::RecallRequest::search(session_id, query, limit)
                },
                None => summarizer_client::RecallRequest {
                    max_chars,
                    ..summarizer_client::RecallRequest::seqs(session_id, seqs)
                },
            };
            let reply = crate::recall::answer(
                store(&settings)?.as_ref(),
                &request.encode(),
                settings.redact_secrets,
            )
            .await;
            return print_recall(&reply, json);
        }
        Command::Turn {
            session_id,
            timeout_ms,
        } => {
            let nats = transport::connect_once(&settings, "summarizer-turn").await?;
            let client = TurnClient::new(nats, settings.subject.clone());
            let decision = client
                .turn_starting(&session_id, Duration::from_millis(timeout_ms))
                .await;
            return Ok(print_decision(&decision));
        }
        Command::Compact {
            session_id,
            instructions,
            keep_chars,
            timeout_ms,
        } => {
            let timeout = timeout_ms.map_or(
                settings.llm.deadline + Duration::from_secs(10),
                Duration::from_millis,
            );
            let nats = transport::connect_once(&settings, "summarizer-compact").await?;
            let client = TurnClient::new(nats, settings.subject.clone());
            let overrides = crate::protocol::Overrides {
                keep_chars,
                ..crate::protocol::Overrides::default()
            };
            // Whoever runs the CLI runs the deployment: the operator.
            let decision = client
                .compact_with(
                    &session_id,
                    instructions.as_deref(),
                    crate::protocol::InstructionsFrom::Operator,
                    overrides,
                    timeout,
                )
                .await;
            let printed = print_decision(&decision);
            let compacted = matches!(
                &decision,
                Decision::Replied(reply) if reply.status == crate::outcome::Status::Compacted
            );
            return Ok(if compacted {
                printed
            } else {
                ExitCode::FAILURE
            });
        }
        Command::DeadLetters { action } => return dead_letters(&settings, action).await,
        Command::Demo(args) => demo::run(settings, args).await?,
        Command::Eval(args) => crate::eval::run(settings, args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a recall reply: as JSON, or each result under a line that says what it is.
/// Exit 0 with results or none, 64 (usage) for a request the recall refused, 1 when the
/// store failed.
fn print_recall(reply: &summarizer_client::RecallReply, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string(reply)?);
    }
    match reply.status {
        summarizer_client::RecallStatus::Ok => {}
        summarizer_client::RecallStatus::Rejected => {
            eprintln!(
                "summarizer: recall: {}",
                reply.message.as_deref().unwrap_or_default()
            );
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
        _ => {
            eprintln!(
                "summarizer: recall failed: {}",
                reply.message.as_deref().unwrap_or_default()
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    if !json {
        if reply.results.is_empty() {
            println!("nothing archived matches");
        }
        for r in &reply.results {
            let tool = r
                .tool_name
                .as_deref()
                .map(|t| format!(" {t}"))
                .unwrap_or_default();
            println!(
                "--- seq {} ({}{tool}), compaction {}, archived {}{}",
                r.seq,
                r.role,
                r.compaction_id,
                r.archived_at,
                if r.truncated { ", cut" } else { "" }
            );
            println!("{}", r.content);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `summarizer session <id> --set/--unset`: writes the session's settings and prints
/// them with the limits they give under this configuration; exit 64 (usage) when an edit
/// is wrong, with nothing written.
async fn change_session(
    store: &dyn Store,
    settings: &Settings,
    session_id: &str,
    unset: &[String],
    set: &[String],
) -> anyhow::Result<ExitCode> {
    let changes: Result<Vec<Change>, _> = (unset.iter().map(|key| Change::unset(key)))
        .chain(set.iter().map(|text| Change::set(text)))
        .collect();
    let written = match changes {
        Ok(changes) => {
            store
                .change_session_settings(session_id, &changes, settings.limits)
                .await
        }
        Err(invalid) => Err(invalid.into()),
    };
    let session = match written {
        Ok(session) => session,
        Err(SettingsError::Invalid(e)) => {
            eprintln!("summarizer: session settings: {e}; nothing written");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
        Err(SettingsError::Store(e)) => {
            return Err(e).context("writing the session's settings");
        }
    };
    let limits = overrides::limits(
        settings.limits,
        settings.bounds,
        &session,
        Overrides::default(),
    );
    let clearing = overrides::clearing(&settings.tool_outputs, &session, Overrides::default());
    let printed = serde_json::json!({
        "session_id": session_id,
        "settings": session,
        "effective": {
            "enabled": settings.enabled && !session.disabled(),
            "threshold_chars": limits.threshold_chars,
            "keep_chars": limits.keep_chars,
            "model": session.model.as_deref().unwrap_or(&settings.llm.model),
            "tool_output_clearing": clearing.is_some(),
            "tool_output_keep": clearing.unwrap_or(settings.tool_outputs.keep),
            "threshold_tokens": overrides::threshold_tokens(
                settings.threshold_tokens,
                settings.bounds,
                &session,
                Overrides::default(),
            ),
        },
    });
    println!("{}", serde_json::to_string_pretty(&printed)?);
    Ok(ExitCode::SUCCESS)
}

/// `summarizer dead-letters list|replay|purge`.
async fn dead_letters(settings: &Settings, action: DeadLetterAction) -> anyhow::Result<ExitCode> {
    let store = store(settings)?;
    match action {
        DeadLetterAction::List { all, json } => {
            let letters = store
                .dead_letters(all)
                .await
                .context("reading dead letters")?;
            if json {
                println!("{}", serde_json::to_string(&letters)?);
            } else {
                for d in &letters {
                    println!(
                        "{:>6}  {}  session={}  deliveries={}  replayed={}  error: {}",
                        d.id,
                        d.created_at,
                        d.session_id.as_deref().unwrap_or("-"),
                        d.deliveries,
                        d.replayed_at.as_deref().unwrap_or("no"),
                        crate::telemetry::Escaped::new(&d.last_error),
                    );
                }
                println!("{} dead letters", letters.len());
            }
        }
        DeadLetterAction::Replay { ids, all } => {
            let letters = store
                .dead_letters(false)
                .await
                .context("reading dead letters")?;
            let chosen: Vec<_> = letters
                .into_iter()
                .filter(|d| all || ids.contains(&d.id))
                .collect();
            if chosen.is_empty() {
                eprintln!("nothing to replay (replayed ones are not replayed again)");
                return Ok(ExitCode::FAILURE);
            }
            let nats = transport::connect_once(settings, "summarizer-dead-letters").await?;
            let jetstream = async_nats::jetstream::new(nats);
            let mut replayed = 0;
            for letter in chosen {
                if !store.mark_replayed(letter.id).await? {
                    continue;
                }
                let mut headers = async_nats::HeaderMap::new();
                let msg_id = format!(
                    "{}-replay-{}",
                    letter.msg_id.as_deref().unwrap_or("job"),
                    letter.id
                );
                headers.insert("Nats-Msg-Id", msg_id.as_str());
                let published = async {
                    jetstream
                        .publish_with_headers(
                            letter.subject.clone(),
                            headers,
                            letter.payload.clone().into(),
                        )
                        .await?
                        .await
                }
                .await;
                if let Err(e) = published {
                    store.unmark_replayed(letter.id).await?;
                    return Err(anyhow::anyhow!("replaying dead letter {}: {e}", letter.id));
                }
                replayed += 1;
            }
            println!("replayed {replayed} dead letters");
        }
        DeadLetterAction::Purge { all } => {
            let deleted = store.purge_dead_letters(all).await?;
            println!("deleted {deleted} dead letters");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `summarizer repair`'s report: the rows whose blocks were left unweighed, one line per
/// drifted session, then what was done. `--apply` weighs the rows first (their counters
/// follow), then recomputes what still drifts.
async fn repair(store: &dyn Store, apply: bool) -> anyhow::Result<String> {
    let mut out = String::new();
    if apply {
        let weighed = store.reweigh_blocks().await.context("weighing blocks")?;
        if weighed > 0 {
            out.push_str(&format!(
                "weighed the blocks of {weighed} messages by the rule\n"
            ));
        }
    } else {
        let unweighed = store
            .breaches(crate::store::Invariant::UnweighedBlocks)
            .await
            .context("reading weights")?;
        if !unweighed.is_empty() {
            out.push_str(&format!(
                "{} messages hold blocks that weigh nothing; dry run, nothing written: \
                 `summarizer repair --apply` weighs them\n",
                unweighed.len()
            ));
        }
    }
    let drifted = if apply {
        store
            .repair_counters()
            .await
            .context("repairing counters")?
    } else {
        store.counter_drift().await.context("reading counters")?
    };
    if drifted.is_empty() {
        out.push_str("every session's counters match its messages\n");
        return Ok(out);
    }
    out.push_str("session: chars/messages/human turns, stored -> from messages\n");
    for drift in &drifted {
        out.push_str(&format!("{drift}\n"));
    }
    out.push_str(&if apply {
        format!("repaired the counters of {} sessions\n", drifted.len())
    } else {
        format!(
            "{} sessions' counters drifted; dry run, nothing written: \
             `summarizer repair --apply` writes them\n",
            drifted.len()
        )
    });
    Ok(out)
}

fn store(settings: &Settings) -> anyhow::Result<SharedStore> {
    crate::store::connect_lazy(
        settings.database_url.expose(),
        1,
        settings.database_acquire_timeout,
    )
    .context("DATABASE_URL")
}

/// Prints the reply as JSON (exit 0), or why there was none (exit 1). Either way the
/// agent would proceed.
fn print_decision(decision: &Decision) -> ExitCode {
    match decision {
        Decision::Replied(reply) => {
            println!("{}", String::from_utf8_lossy(&reply.encode()));
            ExitCode::SUCCESS
        }
        Decision::TimedOut => {
            eprintln!("no reply within the timeout: the agent would proceed");
            ExitCode::FAILURE
        }
        Decision::NoWorkers => {
            eprintln!("no worker is serving the subject: the agent would proceed");
            ExitCode::FAILURE
        }
        Decision::Unavailable(why) => {
            eprintln!("NATS unavailable ({why}): the agent would proceed");
            ExitCode::FAILURE
        }
    }
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn stop_on_signal(shutdown: CancellationToken) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; SIGINT only");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutdown signal received");
    shutdown.cancel();
}

/// `30d`, `12h`, `90m`, `45s` (or a sum of them, `1d12h`).
///
/// # Errors
/// A message naming what cannot be read.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let mut total = 0u64;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(format!("unknown unit {c:?} in {text:?}; use d, h, m or s")),
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("a number must come before {c:?} in {text:?}"))?;
        total = total.saturating_add(n.saturating_mul(unit));
        digits.clear();
    }
    if !digits.is_empty() || total == 0 {
        return Err(format!(
            "{text:?} is not a duration such as 30d, 12h or 90m"
        ));
    }
    Ok(std::time::Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::parse_duration;

    #[test]
    fn durations_read_as_operators_write_them() {
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("1d12h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        for bad in ["", "30", "d", "3w", "0s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}

//! Simulated agents: each appends turns to its own session with plain SQL and asks the
//! fleet before every turn, keeping a ledger of exactly what it appended and how long it
//! waited. The audit compares the ledger with the database.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::db::AgentDb;
use summarizer::client::{JobPublisher, TurnClient};
use summarizer::protocol::Request;

/// An agent may be late by scheduling noise, never by much more than its timeout.
const WAIT_SLACK: Duration = Duration::from_millis(250);

/// What one agent did.
pub struct AgentLog {
    session: String,
    /// The content of every message it appended, in order; each is unique.
    appended: Vec<String>,
    longest_wait: Duration,
    decisions: HashMap<String, u64>,
}

pub struct Agents(Vec<JoinHandle<anyhow::Result<AgentLog>>>);

/// How agents ask the fleet: a request they wait for, or a durable job they publish.
#[derive(Clone)]
pub enum Asking {
    Requests(TurnClient),
    Jobs(JobPublisher),
}

pub fn start(
    sessions: usize,
    tag: &str,
    db: AgentDb,
    asking: Asking,
    timeout: Duration,
    stop: Arc<AtomicBool>,
) -> Agents {
    Agents(
        (0..sessions)
            .map(|n| {
                let agent = Agent {
                    session: format!("chaos-{tag}-{n}"),
                    db: db.clone(),
                    asking: asking.clone(),
                    timeout,
                };
                tokio::spawn(agent.run(stop.clone()))
            })
            .collect(),
    )
}

impl Agents {
    /// Waits for every agent to finish its current turn.
    pub async fn finish(self) -> anyhow::Result<Vec<AgentLog>> {
        let mut logs = Vec::with_capacity(self.0.len());
        for agent in self.0 {
            logs.push(agent.await.context("agent task")??);
        }
        Ok(logs)
    }
}

struct Agent {
    session: String,
    db: AgentDb,
    asking: Asking,
    timeout: Duration,
}

impl Agent {
    async fn run(self, stop: Arc<AtomicBool>) -> anyhow::Result<AgentLog> {
        let mut log = AgentLog {
            session: self.session.clone(),
            appended: Vec::new(),
            longest_wait: Duration::ZERO,
            decisions: HashMap::new(),
        };
        let mut turn = 0;
        while !stop.load(Ordering::Relaxed) {
            turn += 1;
            self.append_turn(turn, &mut log).await?;
            let started = Instant::now();
            let decision = match &self.asking {
                Asking::Requests(client) => client
                    .turn_starting(&self.session, self.timeout)
                    .await
                    .reason()
                    .to_owned(),
                // Each job names its turn, in its request id (which the usage event
                // records) and its Nats-Msg-Id: one compaction per job at most, and a
                // publish retried by NATS is stored once.
                Asking::Jobs(publisher) => {
                    let request = Request {
                        session_id: self.session.clone(),
                        request_id: Some(format!("job-{turn}")),
                        ..Request::default()
                    };
                    let msg_id = format!("{}-{turn}", self.session);
                    match publisher.publish(&request, Some(&msg_id), None).await {
                        Ok(_) => "job_published".to_owned(),
                        Err(e) => anyhow::bail!("{}: {e}", self.session),
                    }
                }
            };
            log.longest_wait = log.longest_wait.max(started.elapsed());
            *log.decisions.entry(decision).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..200))).await;
        }
        Ok(log)
    }

    /// A human ask, a tool call, its result and an answer: about 900 chars.
    async fn append_turn(&self, turn: u32, log: &mut AgentLog) -> anyhow::Result<()> {
        let s = &self.session;
        let call = format!("{s}-call-{turn}");
        let padding = "the pool stayed saturated while retries piled up; ".repeat(5);
        let messages = [
            (
                "user",
                format!(
                    "{s} turn {turn}: why is checkout-api slow at 14:{:02}?",
                    turn % 60
                ),
                None,
                None,
            ),
            (
                "assistant",
                format!("{s} turn {turn}: calling get_logs"),
                Some(json!([{"id": call, "name": "get_logs", "arguments": {"turn": turn}}])),
                None,
            ),
            (
                "tool",
                format!(
                    "{s} turn {turn}: 14:05:01 ERROR checkout-api pool exhausted 100/100 {padding}"
                ),
                None,
                Some(call.clone()),
            ),
            (
                "assistant",
                format!("{s} turn {turn}: the pool is exhausted; {padding}"),
                None,
                None,
            ),
        ];
        for (role, content, tool_calls, tool_call_id) in messages {
            self.db
                .append(
                    s,
                    role,
                    &content,
                    tool_calls.as_ref(),
                    tool_call_id.as_deref(),
                )
                .await
                .context("an agent's append")?;
            log.appended.push(content);
        }
        Ok(())
    }
}

/// The ledger against the database.
pub struct Audit {
    sessions: usize,
    appended: usize,
    lost: usize,
    duplicated: usize,
    misplaced: usize,
    longest_wait: Duration,
    decisions: BTreeMap<String, u64>,
    examples: Vec<String>,
}

impl Audit {
    pub fn is_clean(&self, timeout: Duration) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.misplaced == 0
            && self.longest_wait <= timeout + WAIT_SLACK
    }
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} sessions, {} messages appended: {} lost, {} duplicated, {} misplaced",
            self.sessions, self.appended, self.lost, self.duplicated, self.misplaced
        )?;
        writeln!(
            f,
            "longest agent wait: {} ms",
            self.longest_wait.as_millis()
        )?;
        let decisions: Vec<String> = self
            .decisions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "turn decisions: {}", decisions.join(", "))?;
        for example in &self.examples {
            writeln!(f, "  {example}")?;
        }
        Ok(())
    }
}

/// Every appended message must be in the history or the archive exactly once, in the
/// order the agent appended it.
///
/// # Errors
/// When the database cannot be read.
pub async fn audit(db: &AgentDb, ledger: &[AgentLog]) -> anyhow::Result<Audit> {
    let mut audit = Audit {
        sessions: ledger.len(),
        appended: 0,
        lost: 0,
        duplicated: 0,
        misplaced: 0,
        longest_wait: Duration::ZERO,
        decisions: BTreeMap::new(),
        examples: Vec::new(),
    };
    for log in ledger {
        audit.appended += log.appended.len();
        audit.longest_wait = audit.longest_wait.max(log.longest_wait);
        for (reason, n) in &log.decisions {
            *audit.decisions.entry(reason.clone()).or_default() += n;
        }
        let stored = db.everything(&log.session).await?;
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for content in &stored {
            *seen.entry(content.as_str()).or_default() += 1;
        }
        let lost = log
            .appended
            .iter()
            .filter(|c| !seen.contains_key(c.as_str()))
            .count();
        let duplicated = seen.values().filter(|&&n| n > 1).count();
        let misplaced = usize::from(lost == 0 && duplicated == 0 && stored != log.appended);
        if lost + duplicated + misplaced > 0 && audit.examples.len() < 5 {
            audit.examples.push(format!(
                "{}: {lost} lost, {duplicated} duplicated, order {}",
                log.session,
                if misplaced > 0 { "wrong" } else { "kept" }
            ));
        }
        audit.lost += lost;
        audit.duplicated += duplicated;
        audit.misplaced += misplaced;
    }
    Ok(audit)
}

//! `spawn_app()`: a worker running in-process against the real NATS and the store
//! `SUMMARIZER_TEST_STORE` selects (the real Postgres, or a SQLite file), with its own
//! database, its own subject and its own fake LLM (wiremock), plus helpers named for what
//! an agent or an operator does.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use summarizer::app::Application;
use summarizer::client::{Decision, TurnClient};
use summarizer::config::Settings;
use summarizer::health::Health;
use summarizer::protocol::Reply;
use summarizer::store::{Backend, SharedStore};
use summarizer::summarizer::Summarizer;
use summarizer_client::RecallClient;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

pub use crate::db::TestDb;

pub const ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const NATS_URL: &str = "nats://127.0.0.1:4222";
/// Test databases are named `summarizer_test_<unix seconds>_<random>` (SQLite files the
/// same, with `.db`); ones older than this are left over from earlier runs and dropped.
const STALE_AFTER_SECS: u64 = 30 * 60;

/// The store the suite runs against: `SUMMARIZER_TEST_STORE=postgres` (the default) or
/// `sqlite`.
pub fn backend() -> Backend {
    match std::env::var("SUMMARIZER_TEST_STORE").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("postgres") => Backend::Postgres,
        Ok("sqlite") => Backend::Sqlite,
        other => panic!("SUMMARIZER_TEST_STORE must be postgres or sqlite, not {other:?}"),
    }
}

/// The first line of a test that is about Postgres itself (its connections cut through a
/// proxy, its catalogs, its migrations' history): under SQLite it says why on stderr and
/// returns, passing. Every other test runs on both stores.
macro_rules! postgres_only {
    ($reason:literal) => {
        if $crate::helpers::backend() == summarizer::store::Backend::Sqlite {
            eprintln!("skipped on sqlite: {}", $reason);
            return;
        }
    };
}
pub(crate) use postgres_only;

/// `SUMMARIZATION_KEEP_CHARS` of the test workers; their threshold is 3000, which five
/// turns of [`TestApp::append_turn`] cross and three do not.
pub const KEEP: i64 = 1000;
pub const API_KEY: &str = "sk-test-4f1c9a-do-not-log";

pub const SUMMARY: &str = "**Investigating:** checkout-api slow\n**Key findings:**\n- pool exhausted at 14:01\n**Ruled out:** DNS\n**Current state:** checking the database";

pub struct TestApp {
    /// The test's own connection, for what agents and operators do with plain SQL.
    pub db: TestDb,
    /// The store over the test's database, as the worker and the CLI open it.
    pub store: SharedStore,
    pub database_url: String,
    pub llm: MockServer,
    /// The first in-process worker's HTTP address.
    pub http_addr: Option<SocketAddr>,
    pub client: TurnClient,
    /// Recall requests to this test's workers.
    pub recall: RecallClient,
    /// The settings every worker of this test starts from.
    env: HashMap<String, String>,
    workers: Vec<(CancellationToken, JoinHandle<anyhow::Result<()>>)>,
}

/// The environment a test worker runs with; tests override single entries.
/// The recall subject of a test whose turn subject is `subject`: its own, as the turn
/// subject is, so that no other test's worker (on the same queue group) answers it.
pub fn recall_subject(subject: &str) -> String {
    format!("{}.recall", subject.trim_end_matches(".turn.starting"))
}

pub fn test_env(database_url: &str, subject: &str, llm_url: &str) -> HashMap<String, String> {
    [
        ("DATABASE_URL", database_url),
        ("NATS_URL", NATS_URL),
        ("NATS_SUBJECT", subject),
        ("NATS_RECALL_SUBJECT", &recall_subject(subject)),
        ("SUMMARIZATION_THRESHOLD_CHARS", "3000"),
        ("SUMMARIZATION_KEEP_CHARS", "1000"),
        ("HTTP_ADDR", "127.0.0.1:0"),
        ("DATABASE_MAX_CONNECTIONS", "5"),
        ("LLM_PROVIDER", "openai"),
        ("LLM_BASE_URL", llm_url),
        ("LLM_API_KEY", API_KEY),
        ("LLM_MODEL", "fake-model"),
        ("LLM_TIMEOUT_MS", "3000"),
        ("LLM_MAX_RETRIES", "3"),
        ("LLM_RETRY_MIN_DELAY_MS", "10"),
        ("LLM_RETRY_MAX_DELAY_MS", "100"),
        ("LLM_DEADLINE_MS", "8000"),
        ("LEASE_DURATION_MS", "15000"),
        ("SHUTDOWN_GRACE_MS", "5000"),
        // Measured and recorded, never asked again: the fake LLM's one summary keeps few of
        // the test histories' facts, and most tests count requests. The fact check's own
        // tests (facts.rs) turn `retry` on.
        ("SUMMARY_FACT_CHECK", "record"),
        // No quotes of the user's words after the summary, so that the summaries the
        // tests compare are the fake LLM's; tests/api/words.rs turns them on.
        ("SUMMARY_USER_WORDS_CHARS", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// A worker whose settings are the test defaults with `overrides` applied.
pub async fn spawn_app_with(overrides: &[(&str, &str)]) -> TestApp {
    let mut app = setup(overrides).await;
    app.start_worker(&[]).await;
    app
}

/// A migrated database, a subject and a fake LLM, with no worker yet: for tests that
/// start their own, in-process or as processes.
pub async fn setup(overrides: &[(&str, &str)]) -> TestApp {
    let database_url = fresh_database().await;
    let subject = unique_subject();
    let llm = MockServer::start().await;
    let mut env = test_env(&database_url, &subject, &llm.uri());
    for (k, v) in overrides {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    let db = TestDb::connect(&database_url).await;
    let store = summarizer::store::connect_lazy(&database_url, 4, Duration::from_secs(30))
        .expect("a database URL");
    store.migrate().await.expect("migrations");
    let nats = async_nats::connect(NATS_URL).await.expect("NATS");
    // Recall goes to the workers' own NATS (a private one, for the job tests). That one
    // may not be up yet (the outage tests start it later) or may want credentials the
    // test gives its workers only (the access tests, which use no recall): connected in
    // the background, so that only a test that recalls through it depends on it.
    let recall_nats = match env["NATS_URL"].as_str() {
        NATS_URL => nats.clone(),
        other => async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(other)
            .await
            .expect("a NATS URL"),
    };
    TestApp {
        db,
        store,
        database_url,
        llm,
        http_addr: None,
        recall: RecallClient::new(recall_nats, recall_subject(&subject)),
        client: TurnClient::new(nats, subject),
        env,
        workers: Vec::new(),
    }
}

/// A new, empty database; the worker migrates it. Also drops stale ones. Under SQLite, a
/// file of its own (created when first opened).
pub async fn fresh_database() -> String {
    match backend() {
        Backend::Postgres => {
            let mut admin = PgConnection::connect(ADMIN_URL).await.expect("Postgres");
            let old: Vec<String> = sqlx::query_scalar(
                "SELECT datname FROM pg_database WHERE datname LIKE 'summarizer\\_test\\_%'",
            )
            .fetch_all(&mut admin)
            .await
            .unwrap();
            for name in old.into_iter().filter(|name| stale(name)) {
                let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
                    .execute(&mut admin)
                    .await;
            }
            let name = unique_database_name();
            let create = format!("CREATE DATABASE \"{name}\"");
            sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                .execute(&mut admin)
                .await
                .unwrap();
            format!("postgres://postgres@127.0.0.1:5432/{name}")
        }
        Backend::Sqlite => {
            // The files left over from earlier runs, with their `-wal` and `-shm`.
            let dir = sqlite_dir();
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("summarizer_test_") && stale(&name) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            new_database_url()
        }
    }
}

/// Whether a test database's name says it is older than [`STALE_AFTER_SECS`].
fn stale(name: &str) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let created = name.split('_').nth(2).and_then(|t| t.parse::<u64>().ok());
    created.is_some_and(|t| t + STALE_AFTER_SECS < now)
}

/// Where the SQLite test databases are: `summarizer-tests/` in the temporary directory.
fn sqlite_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("summarizer-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The URL of a database that does not exist yet, for commands that create their own
/// (`summarizer demo`): a Postgres database name nobody has, or a SQLite file not
/// written yet.
pub fn new_database_url() -> String {
    let name = unique_database_name();
    match backend() {
        Backend::Postgres => format!("postgres://postgres@127.0.0.1:5432/{name}"),
        Backend::Sqlite => format!(
            "sqlite://{}",
            sqlite_dir().join(format!("{name}.db")).display()
        ),
    }
}

pub fn unique_database_name() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    format!("summarizer_test_{now}_{:08x}", fastrand::u32(..))
}

pub fn unique_subject() -> String {
    format!("test.{:016x}.turn.starting", fastrand::u64(..))
}

/// A written summary without its recall note (`summary::finish`): what the
/// summarizer wrote.
pub fn without_note(written: &str) -> &str {
    written
        .split_once(&format!("\n\n{}", summarizer::summary::RECALL_NOTE_START))
        .map_or(written, |(summary, _)| summary)
}

/// Deterministic filler text of exactly `n` characters.
pub fn filler(n: usize) -> String {
    "the connection pool on orders-db stayed saturated while retries piled up "
        .chars()
        .cycle()
        .take(n)
        .collect()
}

/// A stored message as the tests compare them.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    pub seq: i64,
    pub role: String,
    pub content: Option<String>,
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
    pub is_summary: bool,
    pub chars: i64,
}

impl TestApp {
    /// This test's worker settings with `overrides` applied.
    pub fn env(&self, overrides: &[(&str, &str)]) -> HashMap<String, String> {
        let mut env = self.env.clone();
        for (k, v) in overrides {
            env.insert((*k).to_owned(), (*v).to_owned());
        }
        env
    }

    /// Starts one more in-process worker on this test's subject and waits until it is
    /// ready. Returns its health, for tests that watch it.
    pub async fn start_worker(&mut self, overrides: &[(&str, &str)]) -> Arc<Health> {
        let health = self.start_worker_unready(overrides).await;
        tokio::time::timeout(Duration::from_secs(10), health.wait_until_ready())
            .await
            .expect("the worker is ready within 10 s");
        health
    }

    /// Starts an in-process worker without waiting for it to be ready.
    pub async fn start_worker_unready(&mut self, overrides: &[(&str, &str)]) -> Arc<Health> {
        let settings =
            Settings::from_sources(None, Some(self.env(overrides))).expect("test settings");
        let app = Application::build(&settings).await.expect("worker starts");
        self.run_worker(app)
    }

    /// Starts an in-process worker that summarizes with `summarizer` instead of the
    /// configured provider, and waits until it is ready.
    pub async fn start_worker_with_summarizer(
        &mut self,
        summarizer: Arc<dyn Summarizer>,
        overrides: &[(&str, &str)],
    ) -> Arc<Health> {
        let settings =
            Settings::from_sources(None, Some(self.env(overrides))).expect("test settings");
        let app = Application::build_with_summarizer(&settings, summarizer)
            .await
            .expect("worker starts");
        let health = self.run_worker(app);
        tokio::time::timeout(Duration::from_secs(10), health.wait_until_ready())
            .await
            .expect("the worker is ready within 10 s");
        health
    }

    fn run_worker(&mut self, app: Application) -> Arc<Health> {
        self.http_addr = self.http_addr.or(app.http_addr());
        let health = app.health();
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(app.run_until_stopped(shutdown.clone()));
        self.workers.push((shutdown, worker));
        health
    }

    /// What an agent does: a plain INSERT into `messages`.
    pub async fn append(
        &self,
        session: &str,
        role: &str,
        content: &str,
        tool_calls: Option<Value>,
        tool_call_id: Option<&str>,
    ) {
        self.db
            .query(
                "INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(session)
            .bind(role)
            .bind(content)
            .bind(tool_calls)
            .bind(tool_call_id)
            .execute()
            .await
            .expect("append");
    }

    /// One human turn of about 760 chars: the ask, a tool call, its result, an answer.
    pub async fn append_turn(&self, session: &str, n: usize) {
        let call = format!("call-{n}");
        self.append(
            session,
            "user",
            &format!("Turn {n}: why is checkout-api slow? {}", filler(40)),
            None,
            None,
        )
        .await;
        let calls = json!([{"id": call, "name": "get_logs", "arguments": {"service": "checkout-api", "turn": n}}]);
        self.append(session, "assistant", "", Some(calls), None)
            .await;
        let result = format!(
            "14:{n:02}:01 ERROR checkout-api pool exhausted {}",
            filler(300)
        );
        self.append(session, "tool", &result, None, Some(&call))
            .await;
        let answer = format!("Finding {n}: pool at 100% {}", filler(250));
        self.append(session, "assistant", &answer, None, None).await;
    }

    /// A session over the threshold: `turns` turns of [`TestApp::append_turn`].
    pub async fn append_turns(&self, session: &str, turns: usize) {
        for n in 1..=turns {
            self.append_turn(session, n).await;
        }
    }

    /// Sends the turn-starting request and returns the reply; panics without one.
    pub async fn turn_starting(&self, session: &str) -> Reply {
        match self
            .client
            .turn_starting(session, Duration::from_secs(15))
            .await
        {
            Decision::Replied(reply) => reply,
            other => panic!("no reply for {session}: {other:?}"),
        }
    }

    /// Sends the request and waits up to a minute for the reply: for a turn whose
    /// compaction is large (tens of thousands of messages), which a debug build on a
    /// loaded two-core CI machine, the whole suite running beside it, has taken more
    /// than 15 s to answer (5 to 7 s alone). The timeout is a bound, not a measure.
    pub async fn turn_starting_large(&self, session: &str) -> Reply {
        match self
            .client
            .turn_starting(session, Duration::from_secs(60))
            .await
        {
            Decision::Replied(reply) => reply,
            other => panic!("no reply for {session}: {other:?}"),
        }
    }

    /// Sends the request from a task, for a test to act while the worker is busy with it.
    /// It waits up to a minute: the busy work may be a multi-megabyte compaction in a
    /// debug build on a loaded two-core machine (15 s was once too short under a
    /// concurrent build), and no test here expects this request to time out.
    pub fn turn_starting_in_background(&self, session: &str) -> JoinHandle<Decision> {
        let client = self.client.clone();
        let session = session.to_owned();
        tokio::spawn(async move {
            client
                .turn_starting(&session, Duration::from_secs(60))
                .await
        })
    }

    pub async fn send_raw(&self, payload: &[u8]) -> Reply {
        match self.client.send(payload, Duration::from_secs(15)).await {
            Decision::Replied(reply) => reply,
            other => panic!("no reply: {other:?}"),
        }
    }

    pub async fn messages(&self, session: &str) -> Vec<Stored> {
        self.rows(
            "SELECT seq, role, content, tool_calls, tool_call_id, is_summary,
                    CAST(chars AS BIGINT) AS chars
             FROM messages WHERE session_id = $1 ORDER BY seq",
            session,
        )
        .await
    }

    pub async fn archived(&self, session: &str) -> Vec<Stored> {
        self.rows(
            "SELECT seq, role, content, tool_calls, tool_call_id, is_summary,
                    CAST(chars AS BIGINT) AS chars
             FROM archived_messages WHERE session_id = $1 ORDER BY seq, compaction_id",
            session,
        )
        .await
    }

    async fn rows(&self, sql: &'static str, session: &str) -> Vec<Stored> {
        type Row = (
            i64,
            String,
            Option<String>,
            Option<Value>,
            Option<String>,
            bool,
            i64,
        );
        self.db
            .query(sql)
            .bind(session)
            .fetch_all::<Row>()
            .await
            .unwrap()
            .into_iter()
            .map(
                |(seq, role, content, tool_calls, tool_call_id, is_summary, chars)| Stored {
                    seq,
                    role,
                    content,
                    tool_calls,
                    tool_call_id,
                    is_summary,
                    chars,
                },
            )
            .collect()
    }

    /// `(id, model, prompt_tokens, completion_tokens, metadata)` of the session's usage events.
    pub async fn usage_events(
        &self,
        session: &str,
    ) -> Vec<(i64, String, Option<i32>, Option<i32>, Value)> {
        self.db
            .query(
                "SELECT id, model, prompt_tokens, completion_tokens, metadata
                 FROM usage_events WHERE session_id = $1 ORDER BY id",
            )
            .bind(session)
            .fetch_all()
            .await
            .unwrap()
    }

    pub async fn lease_owner(&self, session: &str) -> Option<String> {
        self.db
            .query("SELECT lease_owner FROM sessions WHERE session_id = $1")
            .bind(session)
            .scalar()
            .await
            .unwrap()
    }

    /// `summarizer check` over this test's database.
    pub async fn check(&self) -> summarizer::audit::Report {
        summarizer::audit::run(self.store.as_ref()).await.unwrap()
    }

    /// `GET /stats`, parsed.
    pub async fn stats(&self) -> Value {
        reqwest::get(format!(
            "http://{}/stats",
            self.http_addr.expect("an HTTP listener")
        ))
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap()
    }

    /// The fake LLM answers every request with `summary` after `delay`, folding an
    /// earlier summary in as a model should ([`Folding`]).
    pub async fn llm_answers(&self, summary: &str, delay: Duration) {
        Mock::given(method("POST"))
            .and(path("/chat/completions"))
            .respond_with(Folding {
                summary: summary.to_owned(),
                delay,
            })
            .mount(&self.llm)
            .await;
    }

    /// The fake LLM answers `first` to the first request and a good summary to the rest.
    pub async fn llm_first_then_summary(&self, first: ResponseTemplate) {
        Mock::given(method("POST"))
            .respond_with(first)
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&self.llm)
            .await;
        self.llm_answers(SUMMARY, Duration::ZERO).await;
    }

    pub async fn llm_requests(&self) -> usize {
        self.llm.received_requests().await.map_or(0, |r| r.len())
    }

    /// Waits (bounded) until the fake LLM has received `n` requests: a barrier on the
    /// worker being inside its LLM call.
    pub async fn until_llm_called(&self, n: usize) {
        let llm = &self.llm;
        eventually("the LLM to be called", || async move {
            llm.received_requests().await.map_or(0, |r| r.len()) >= n
        })
        .await;
    }

    /// Stops the in-process workers as SIGTERM would and waits for them to finish.
    pub async fn stop(mut self) {
        self.stop_workers().await;
    }

    /// [`TestApp::stop`], keeping the database and the fake LLM for the test to inspect.
    pub async fn stop_workers(&mut self) {
        for (shutdown, worker) in self.workers.drain(..) {
            shutdown.cancel();
            worker.await.unwrap().unwrap();
        }
    }
}

/// A fake model that answers `summary`, and when the transcript holds an earlier summary,
/// `summary` with a last bullet that states what came since: identifiers of the
/// transcript that `summary` does not hold (a dozen at most) and how many messages it
/// had. The worker refuses an answer that only echoes the earlier summary, so a fake
/// that answered the same text to every compaction would be asked again forever.
pub struct Folding {
    pub summary: String,
    pub delay: Duration,
}

impl wiremock::Respond for Folding {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let transcript: String = (body["messages"].as_array().into_iter().flatten())
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let text = match transcript.split_once("earlier summary]") {
            Some((_, rest)) => {
                // What follows the earlier summary: the messages after it.
                let since = rest.split_once("\n[").map_or("", |(_, after)| after);
                let own = summarizer::facts::FactSet::of_text(&self.summary);
                let found = summarizer::facts::FactSet::of_text(since);
                let new: Vec<&str> = (found.iter())
                    .map(|(_, fact)| fact)
                    .filter(|fact| !own.contains(fact))
                    .take(12)
                    .collect::<Vec<_>>();
                format!(
                    "{}\n- Since then ({} lines): {}",
                    self.summary,
                    since.lines().count(),
                    new.join("; ")
                )
            }
            None => self.summary.clone(),
        };
        completion(&text).set_delay(self.delay)
    }
}

/// A chat completion whose message is `summary`, with token usage.
pub fn completion(summary: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-test",
        "model": "fake-model-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": summary}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 812, "completion_tokens": 64, "total_tokens": 876}
    }))
}

/// Polls `condition` every 10 ms until it holds; panics after 10 s.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

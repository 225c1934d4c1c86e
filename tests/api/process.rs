//! The real binary: configuration errors, secrets in logs, SIGTERM, and the demo.

use std::process::Stdio;
use std::time::Duration;

use summarizer::client::{Decision, TurnClient};
use summarizer::outcome::Status;
use summarizer::store::Backend;
use summarizer::telemetry::{REJECTED_WARNING_INTERVAL, REJECTED_WARNINGS_PER_INTERVAL};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::fixtures::WorkerProcess;
use crate::helpers::{
    API_KEY, NATS_URL, SUMMARY, TestDb, backend, eventually, fresh_database, new_database_url,
    setup, test_env, unique_subject,
};

/// The binary with a clean environment, run from an empty directory (no `.env`).
pub fn summarizer(args: &[&str]) -> tokio::process::Command {
    let dir = std::env::temp_dir().join(format!("summarizer-test-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_summarizer"));
    command
        .args(args)
        .env_clear()
        .current_dir(dir)
        .kill_on_drop(true);
    command
}

/// Runs `command` to its end (at most `limit`), asserts it succeeded, returns its stdout.
async fn succeeds(mut command: tokio::process::Command, limit: Duration) -> String {
    let output = tokio::time::timeout(limit, command.output())
        .await
        .expect("the command stops by itself in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn invalid_settings_stop_the_worker_with_exit_code_64_naming_the_setting() {
    let cases = [
        ("SUMMARIZATION_KEEP_CHARS", "70000"),
        ("WORKER_CONCURRENCY", "0"),
        ("SUMMARIZATION_THRESHOLD_CHARS", "sixty thousand"),
        ("LLM_PROVIDER", "carrier-pigeon"),
    ];
    for (setting, value) in cases {
        let output = summarizer(&["worker"])
            .env(setting, value)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{setting}={value}: {stderr}"
        );
        assert!(stderr.contains(setting), "{stderr}");
    }
    let output = summarizer(&["worker"])
        .env("LLM_PROVIDER", "openai")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("LLM_API_KEY"));
}

#[tokio::test]
async fn a_prompt_file_without_the_headings_stops_the_worker_with_exit_code_64() {
    let dir = std::env::temp_dir().join(format!("summarizer-prompt-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompt.md");
    std::fs::write(&file, "Summarize the conversation in three sentences.").unwrap();

    let output = summarizer(&["worker"])
        .env("SUMMARY_PROMPT_FILE", &file)
        .output()
        .await
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("SUMMARY_PROMPT_FILE"), "{stderr}");
    assert!(stderr.contains("**Investigating:**"), "{stderr}");
}

#[tokio::test]
async fn the_api_key_never_reaches_the_logs_and_sigterm_exits_cleanly() {
    let database_url = fresh_database().await;
    let subject = unique_subject();
    let llm = MockServer::start().await;
    // A misbehaving proxy that echoes the key back in its error body.
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(502).set_body_string(format!("bad gateway for key {API_KEY}")),
        )
        .mount(&llm)
        .await;
    let log_path = std::env::temp_dir().join(format!("summarizer-log-{:08x}", fastrand::u32(..)));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut worker = summarizer(&["worker"])
        .envs(test_env(&database_url, &subject, &llm.uri()))
        .env("RUST_LOG", "debug")
        .env("LLM_MAX_RETRIES", "2")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();

    let nats = async_nats::connect(NATS_URL).await.unwrap();
    let client = TurnClient::new(nats, subject);
    // The worker is up (and has migrated) once it answers.
    eventually("the worker to serve", || async {
        matches!(
            client.turn_starting("probe", Duration::from_secs(5)).await,
            Decision::Replied(_)
        )
    })
    .await;
    let db = TestDb::connect(&database_url).await;
    for n in 0..12 {
        db.query("INSERT INTO messages (session_id, role, content) VALUES ('s', $1, $2)")
            .bind(if n % 2 == 0 { "user" } else { "assistant" })
            .bind(crate::helpers::filler(400))
            .execute()
            .await
            .unwrap();
    }
    let decision = client.turn_starting("s", Duration::from_secs(10)).await;
    assert_eq!(decision.reason(), "llm_error", "{decision:?}");
    assert!(
        llm.received_requests().await.unwrap().len() >= 3,
        "the key was sent and echoed"
    );

    let pid = worker.id().unwrap().to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), worker.wait())
        .await
        .expect("exits within the grace period")
        .unwrap();

    let logs = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    assert!(status.success(), "exit status {status}: {logs}");
    assert!(logs.contains("worker stopped"), "{logs}");
    assert!(
        logs.contains("bad gateway for key [redacted]"),
        "the echo was logged, scrubbed"
    );
    assert!(!logs.contains(API_KEY), "the API key leaked into the logs");
}

#[tokio::test]
async fn the_demo_runs_end_to_end_and_exits_zero() {
    // A database that does not exist yet: the demo makes it.
    let database_url = new_database_url();
    let mut demo = summarizer(&["demo"]);
    demo.env("DATABASE_URL", &database_url)
        .env("NATS_URL", NATS_URL);

    let stdout = succeeds(demo, Duration::from_secs(90)).await;

    match backend() {
        Backend::Postgres => assert!(stdout.contains("created the database"), "{stdout}"),
        // The store creates a missing file as it opens it, without a word.
        Backend::Sqlite => {
            let path = database_url.strip_prefix("sqlite://").unwrap();
            assert!(std::path::Path::new(path).exists(), "{path}");
            assert!(!stdout.contains("falling back"), "{stdout}");
        }
    }
    assert!(stdout.contains("history before the first compaction"));
    assert!(stdout.contains("**Investigating:**"));
    assert!(stdout.contains("total_summarizations"));
    assert!(stdout.contains("demo done"));
}

/// A Postgres URL where nothing listens: a free port, closed again.
fn dead_postgres_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("postgres://postgres:pw@127.0.0.1:{port}/summarizer")
}

/// Only NATS need run: `--database sqlite` ignores DATABASE_URL, and without the flag a
/// Postgres that does not answer is replaced by a temporary SQLite file, said so.
#[tokio::test]
async fn the_demo_runs_on_sqlite_without_postgres() {
    for args in [&["demo", "--database", "sqlite"][..], &["demo"][..]] {
        let mut demo = summarizer(args);
        demo.env("DATABASE_URL", dead_postgres_url())
            .env("NATS_URL", NATS_URL);

        let stdout = succeeds(demo, Duration::from_secs(90)).await;

        let file = stdout
            .lines()
            .find_map(|l| l.strip_prefix("using a temporary SQLite file: "))
            .and_then(|l| l.strip_suffix(" (removed at the end)"))
            .unwrap_or_else(|| panic!("no temporary file named in {stdout}"));
        assert!(
            !std::path::Path::new(file).exists(),
            "{file} was left behind"
        );
        assert_eq!(
            stdout.contains("did not answer"),
            args.len() == 1,
            "only the fallback says Postgres did not answer: {stdout}"
        );
        assert!(!stdout.contains(":pw@"), "{stdout}");
        assert!(stdout.contains("total_summarizations"), "{stdout}");
        assert!(stdout.contains("demo done"), "{stdout}");
    }
}

/// `--database postgres` does not fall back: it stops and names the unreachable server.
#[tokio::test]
async fn the_demo_on_postgres_stops_when_postgres_does_not_answer() {
    let mut demo = summarizer(&["demo", "--database", "postgres"]);
    demo.env("DATABASE_URL", dead_postgres_url())
        .env("NATS_URL", NATS_URL);

    let output = tokio::time::timeout(Duration::from_secs(30), demo.output())
        .await
        .expect("stops by itself")
        .unwrap();

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("did not answer"), "{stderr}");
    assert!(!stderr.contains(":pw@"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("SQLite"));
}

/// A worker process in text mode on a fresh test database, answering once it is ready.
async fn text_logging_worker(app: &crate::helpers::TestApp) -> WorkerProcess {
    let worker = WorkerProcess::spawn(&app.env(&[("HTTP_ADDR", ""), ("LOG_FORMAT", "text")]));
    worker.wait_for_log("worker ready").await;
    worker
}

#[tokio::test]
async fn line_breaks_and_bidi_controls_from_clients_are_escaped_in_text_logs() {
    let app = setup(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let forged = "s\u{2028}2026-01-01T00:00:00Z  INFO forged\u{2029}line\u{202e}desrever";
    app.append_turns(forged, 5).await;
    let mut worker = text_logging_worker(&app).await;

    let request = serde_json::json!({"session_id": forged, "request_id": "r\u{200f}\u{2066}x"});
    let reply = app.send_raw(request.to_string().as_bytes()).await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    // Control characters never pass validation; the rejection is one line all the same.
    let reply = app
        .send_raw(b"{\"session_id\": \"a\\nb\\r\\u001b[2Jc\"}")
        .await;
    assert_eq!(reply.status, Status::Rejected);
    worker.signal("TERM").await;
    assert!(worker.exit_status(Duration::from_secs(15)).await.success());

    let logs = worker.logs();
    for raw in [
        '\u{2028}', '\u{2029}', '\u{202e}', '\u{200f}', '\u{2066}', '\u{1b}', '\r',
    ] {
        assert!(!logs.contains(raw), "{raw:?} reached the log raw:\n{logs}");
    }
    let done: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("summarizer done"))
        .collect();
    assert_eq!(done.len(), 1, "{logs}");
    assert!(
        done[0].contains(r"s\u{2028}2026-01-01T00:00:00Z  INFO forged\u{2029}line\u{202e}desrever"),
        "{logs}"
    );
    assert!(done[0].contains(r"r\u{200f}\u{2066}x"), "{logs}");
    assert!(!logs.lines().any(|l| l.starts_with("2026-01-01")), "{logs}");
}

#[tokio::test]
async fn a_flood_of_malformed_requests_gets_every_reply_and_a_bounded_number_of_warnings() {
    const FLOOD: usize = 2_000;
    let app = setup(&[]).await;
    let mut worker = text_logging_worker(&app).await;

    let started = std::time::Instant::now();
    let app = &app;
    for batch in 0..FLOOD / 100 {
        let replies = futures_util::future::join_all((0..100).map(|n| {
            let payload = format!("garbage {batch}/{n}");
            async move { app.send_raw(payload.as_bytes()).await }
        }))
        .await;
        assert!(replies.iter().all(|r| r.status == Status::Rejected));
    }
    let elapsed = started.elapsed();
    worker.signal("TERM").await;
    assert!(worker.exit_status(Duration::from_secs(15)).await.success());

    let logs = worker.logs();
    let warnings = logs
        .lines()
        .filter(|l| l.contains("rejected request") || l.contains("rejected-request warnings"))
        .count();
    // Each started interval allows its burst plus one summary of the one before.
    let intervals = elapsed.as_secs_f64() / REJECTED_WARNING_INTERVAL.as_secs_f64();
    let bound = (intervals.floor() as usize + 1) * (REJECTED_WARNINGS_PER_INTERVAL + 1);
    assert!(
        (1..=bound).contains(&warnings),
        "{warnings} warning lines for {FLOOD} rejects in {elapsed:?}, at most {bound}"
    );
}

/// A port on 127.0.0.1 where nothing listens: free, closed again.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Neither NATS nor Postgres answers, and the environment sets no NATS_URL (the dead
/// URLs come from a config file): the demo says so twice and compacts anyway, over the
/// in-process transport on a temporary SQLite file.
#[tokio::test]
async fn the_demo_runs_with_neither_nats_nor_postgres() {
    let dir = std::env::temp_dir().join(format!("summarizer-demo-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("summarizer.toml");
    std::fs::write(
        &config,
        format!(
            "NATS_URL = \"nats://127.0.0.1:{}\"\nDATABASE_URL = \"{}\"\n",
            dead_port(),
            dead_postgres_url()
        ),
    )
    .unwrap();
    let demo = summarizer(&["--config", config.to_str().unwrap(), "demo"]);

    let stdout = succeeds(demo, Duration::from_secs(90)).await;
    std::fs::remove_dir_all(&dir).unwrap();

    assert!(stdout.contains("NATS_URL is not set"), "{stdout}");
    assert!(stdout.contains("over the in-process transport"), "{stdout}");
    assert!(stdout.contains("falling back to SQLite"), "{stdout}");
    assert!(stdout.contains(": compacted: session"), "{stdout}");
    assert!(stdout.contains("compactions; demo done"), "{stdout}");
}

/// A NATS_URL the environment sets is the user's own server: when it does not answer,
/// the demo stops and names it rather than work around it.
#[tokio::test]
async fn the_demo_stops_when_an_explicit_nats_url_does_not_answer() {
    let mut demo = summarizer(&["demo", "--database", "sqlite"]);
    demo.env("NATS_URL", format!("nats://127.0.0.1:{}", dead_port()));

    let output = tokio::time::timeout(Duration::from_secs(30), demo.output())
        .await
        .expect("stops by itself")
        .unwrap();

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("connecting to NATS at nats://127.0.0.1:"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("in-process"), "{stdout}");
}

//! No command of the binary prints a secret: every command runs as a process with
//! credentials in `DATABASE_URL` (userinfo, `?password=`, `?sslpassword=`,
//! percent-encoded), `NATS_URL` (user:password, a token as the user, an IPv6 host),
//! `LLM_BASE_URL` (user:password, `?api_key=`) and `LLM_API_KEY`, and all it writes to
//! stdout and stderr is searched for them.
//!
//! Under SQLite, `DATABASE_URL` names a file and carries no credentials (there is no
//! SQLite URL with a password to leak): the commands run on a SQLite file, and the
//! secrets searched for are those of NATS and the LLM, which are the same.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use futures_util::future::join_all;
use summarizer::client::TurnClient;
use summarizer::store::Backend;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::fixtures::{free_port, signal_pid};
use crate::helpers::{
    NATS_URL, TestDb, backend, eventually, fresh_database, new_database_url, unique_subject,
};

/// A distinctive part of every secret below, the same in its raw and percent-encoded
/// forms: none of them may appear in any output.
const SECRETS: [&str; 9] = [
    "pgpw-userinfo",
    "pgpw-query",
    "pgpw-ssl",
    "natspw-url",
    "natstoken-user",
    "llmpw-url",
    "llmtoken-query",
    "sk-apikey",
    "natspw-setting",
];

/// Every command and the arguments that make it print what it prints, short-lived.
const COMMANDS: &[&[&str]] = &[
    &["--help"],
    &["migrate"],
    &["stats"],
    &["stats", "--json"],
    &["session", "s"],
    &["restore", "s"],
    &["prune-archive", "--older-than", "1d", "--dry-run"],
    &["check"],
    &["check", "--json"],
    &["turn", "s", "--timeout-ms", "1000"],
    &["dead-letters", "list"],
    &["dead-letters", "list", "--json"],
    &["dead-letters", "replay", "--all"],
    &["dead-letters", "purge"],
    &["demo"],
];

/// The binary with exactly `env`, from an empty directory (no `.env`).
fn summarizer(args: &[&str], env: &HashMap<String, String>) -> tokio::process::Command {
    let dir = std::env::temp_dir().join(format!("summarizer-test-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_summarizer"));
    command
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(dir)
        .kill_on_drop(true);
    command
}

/// Everything `args` writes, stdout and stderr, whatever its exit status.
async fn output_of(args: &[&str], env: &HashMap<String, String>) -> String {
    let output = tokio::time::timeout(Duration::from_secs(120), summarizer(args, env).output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} stops by itself"))
        .unwrap();
    format!(
        "$ summarizer {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `worker` until its output contains `ready_when`, lets `meanwhile` act on it, then
/// stops it with SIGTERM; returns all it wrote.
async fn worker_output<F: Future<Output = ()>>(
    env: &HashMap<String, String>,
    ready_when: &str,
    meanwhile: F,
) -> String {
    let log = std::env::temp_dir().join(format!("summarizer-secrets-{:08x}", fastrand::u32(..)));
    let file = std::fs::File::create(&log).unwrap();
    let mut worker = summarizer(&["worker"], env)
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually(ready_when, || async { read().contains(ready_when) }).await;
    meanwhile.await;
    signal_pid(worker.id().unwrap(), "TERM").await;
    tokio::time::timeout(Duration::from_secs(15), worker.wait())
        .await
        .expect("the worker stops on SIGTERM")
        .unwrap();
    let logs = read();
    std::fs::remove_file(&log).unwrap();
    format!("$ summarizer worker\n{logs}")
}

/// Fails naming the secret and showing the output that printed it.
fn assert_no_secret(outputs: &[String]) {
    for output in outputs {
        for secret in SECRETS {
            assert!(!output.contains(secret), "{secret} was printed:\n{output}");
        }
    }
}

/// `url` with the secrets a Postgres URL can carry: a password in the userinfo and in
/// `?password=`, and `?sslpassword=`. Trust authentication: the server never asks for
/// them, so they are carried through every command without stopping it. A SQLite URL
/// carries none: it is returned as it is.
fn with_secrets(url: &str) -> String {
    match Backend::of(url) {
        Backend::Postgres => format!(
            "{}?password=pgpw-query&sslpassword=pgpw-ssl",
            url.replace("postgres@", "postgres:pgpw-userinfo@")
        ),
        Backend::Sqlite => url.to_owned(),
    }
}

fn env_of(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

#[tokio::test]
async fn no_command_prints_a_secret_when_the_services_are_unreachable() {
    let (pg, nats, llm) = (free_port(), free_port(), free_port());
    let database_url = match backend() {
        Backend::Postgres => format!(
            "postgres://app:pgpw-userinfo%2Fx%40y@127.0.0.1:{pg}/summarizer\
             ?sslpassword=pgpw-ssl&application_name=t&password=pgpw-query"
        ),
        // A file is never unreachable: the commands run on an empty one, with NATS and
        // the LLM unreachable (the worker waits for NATS, saying so).
        Backend::Sqlite => fresh_database().await,
    };
    let env = env_of(&[
        ("DATABASE_URL", database_url),
        ("DATABASE_ACQUIRE_TIMEOUT_MS", "300".into()),
        ("NATS_URL", format!("nats://bot:natspw-url@[::1]:{nats}")),
        ("NATS_USER", "bot".into()),
        ("NATS_PASSWORD", "natspw-setting".into()),
        ("LLM_PROVIDER", "openai".into()),
        (
            "LLM_BASE_URL",
            format!("http://llm:llmpw-url@127.0.0.1:{llm}/v1?api_key=llmtoken-query"),
        ),
        ("LLM_API_KEY", "sk-apikey-0123".into()),
        ("HTTP_ADDR", String::new()),
        ("RUST_LOG", "debug".into()),
    ]);
    let mut token_env = env.clone();
    token_env.insert(
        "NATS_URL".into(),
        format!("nats://natstoken-user@127.0.0.1:{nats}"),
    );
    token_env.remove("NATS_USER");
    token_env.remove("NATS_PASSWORD");

    let mut outputs = join_all(COMMANDS.iter().map(|args| output_of(args, &env))).await;
    outputs.push(output_of(&["turn", "s", "--timeout-ms", "1000"], &token_env).await);
    outputs.push(worker_output(&env, "unreachable, retrying", async {}).await);
    // A migrated database, so the worker goes on to wait for NATS and says so.
    let mut reachable_db = token_env.clone();
    reachable_db.insert("DATABASE_URL".into(), with_secrets(&fresh_database().await));
    outputs.push(worker_output(&reachable_db, "NATS at", async {}).await);
    // A configuration error quotes the setting it is about.
    let mut bad = env.clone();
    bad.insert(
        "LLM_BASE_URL".into(),
        "ftp://llm:llmpw-url@127.0.0.1/v1".into(),
    );
    outputs.push(output_of(&["worker"], &bad).await);

    assert!(
        outputs.iter().any(|o| o.contains("unreachable")),
        "{outputs:#?}"
    );
    assert!(
        outputs.iter().any(|o| o.contains("LLM_BASE_URL")),
        "{outputs:#?}"
    );
    assert_no_secret(&outputs);
}

#[tokio::test]
async fn no_command_prints_a_secret_against_the_real_services() {
    let database_url = fresh_database().await;
    let llm = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .mount(&llm)
        .await;
    let subject = unique_subject();
    let llm_url = llm.uri().replace("http://", "http://llm:llmpw-url@");
    let env = env_of(&[
        ("DATABASE_URL", with_secrets(&database_url)),
        (
            "NATS_URL",
            NATS_URL.replace("nats://", "nats://bot:natspw-url@"),
        ),
        ("NATS_SUBJECT", subject.clone()),
        ("SUMMARIZATION_THRESHOLD_CHARS", "3000".into()),
        ("SUMMARIZATION_KEEP_CHARS", "1000".into()),
        ("LLM_PROVIDER", "openai".into()),
        ("LLM_BASE_URL", format!("{llm_url}?api_key=llmtoken-query")),
        ("LLM_API_KEY", "sk-apikey-0123".into()),
        ("LLM_MAX_RETRIES", "1".into()),
        ("LLM_RETRY_MIN_DELAY_MS", "10".into()),
        ("HTTP_ADDR", String::new()),
        ("RUST_LOG", "debug".into()),
    ]);
    let mut outputs = vec![output_of(&["migrate"], &env).await];
    assert!(outputs[0].contains("migrations applied to"), "{outputs:?}");
    let db = TestDb::connect(&database_url).await;
    for n in 0..12 {
        db.query("INSERT INTO messages (session_id, role, content) VALUES ('s', $1, $2)")
            .bind(if n % 2 == 0 { "user" } else { "assistant" })
            .bind(crate::helpers::filler(400))
            .execute()
            .await
            .unwrap();
    }

    let nats = async_nats::connect(NATS_URL).await.unwrap();
    let client = TurnClient::new(nats, subject);
    outputs.push(
        worker_output(&env, "worker ready", async {
            let decision = client.turn_starting("s", Duration::from_secs(10)).await;
            assert_eq!(decision.reason(), "llm_error", "{decision:?}");
            outputs_during_worker(&env).await;
        })
        .await,
    );
    // The demo must compact: the built-in summarizer, the LLM's secrets still set.
    let mut demo = env.clone();
    demo.insert("LLM_PROVIDER".into(), "extractive".into());
    demo.insert("DATABASE_URL".into(), with_secrets(&new_database_url()));
    let others = COMMANDS.iter().filter(|args| args[0] != "demo");
    outputs.extend(join_all(others.map(|args| output_of(args, &env))).await);
    outputs.push(output_of(&["demo"], &demo).await);
    assert!(
        outputs.iter().any(|o| o.contains("demo done")),
        "{outputs:#?}"
    );
    assert_no_secret(&outputs);
}

/// The commands run while a worker serves: `turn` gets a reply.
async fn outputs_during_worker(env: &HashMap<String, String>) {
    let turn = output_of(&["turn", "s", "--timeout-ms", "5000"], env).await;
    assert!(turn.contains("\"status\""), "{turn}");
    assert_no_secret(&[turn]);
}

//! NATS authentication and TLS against private servers; bad credentials stop the worker
//! with a clear error and no secret in its output.

use std::path::Path;
use std::time::Duration;

use summarizer::client::{Decision, TurnClient};
use tokio::process::Command;

use crate::fixtures::{NatsServer, WorkerProcess};
use crate::helpers::{TestApp, setup};

/// Starts a worker on `nats` with `overrides` and asks it once through `client_options`.
async fn served(
    app: &mut TestApp,
    overrides: &[(&str, &str)],
    client: async_nats::ConnectOptions,
    url: &str,
) {
    app.start_worker(overrides).await;
    let nats = client.connect(url).await.expect("the test client connects");
    let client = TurnClient::new(nats, app.env(&[])["NATS_SUBJECT"].clone());
    let decision = client.turn_starting("anyone", Duration::from_secs(5)).await;
    assert!(matches!(decision, Decision::Replied(_)), "{decision:?}");
}

#[tokio::test]
async fn user_and_password_in_settings_or_in_the_url() {
    let nats = NatsServer::start(&["--user", "bot", "--pass", "s3cret-pass"]).await;
    let mut app = setup(&[("NATS_URL", &nats.url())]).await;
    let client =
        || async_nats::ConnectOptions::with_user_and_password("bot".into(), "s3cret-pass".into());
    served(
        &mut app,
        &[("NATS_USER", "bot"), ("NATS_PASSWORD", "s3cret-pass")],
        client(),
        &nats.url(),
    )
    .await;
    let in_url = format!("nats://bot:s3cret-pass@127.0.0.1:{}", nats.port);
    served(
        &mut app,
        &[("NATS_URL", &in_url), ("HTTP_ADDR", "")],
        client(),
        &nats.url(),
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn token_authentication() {
    let nats = NatsServer::start(&["--auth", "t0ken-value"]).await;
    let mut app = setup(&[("NATS_URL", &nats.url())]).await;
    let client = async_nats::ConnectOptions::with_token("t0ken-value".into());
    served(
        &mut app,
        &[("NATS_TOKEN", "t0ken-value")],
        client,
        &nats.url(),
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn bad_credentials_stop_the_worker_with_a_clear_error_and_no_secret_in_its_output() {
    let nats = NatsServer::start(&["--user", "bot", "--pass", "right-pass"]).await;
    let app = setup(&[]).await;
    let db_url = app
        .database_url
        .replace("postgres@", "postgres:db-pass-9x@");
    let mut worker = WorkerProcess::spawn(&app.env(&[
        ("NATS_URL", &nats.url()),
        ("NATS_USER", "bot"),
        ("NATS_PASSWORD", "wrong-pass-7q"),
        ("DATABASE_URL", &db_url),
        ("RUST_LOG", "debug"),
    ]));

    let status = worker.exit_status(Duration::from_secs(15)).await;

    let logs = worker.logs();
    assert!(!status.success());
    assert!(logs.contains("authorization violation"), "{logs}");
    assert!(
        !logs.contains("wrong-pass-7q") && !logs.contains("db-pass-9x"),
        "{logs}"
    );
}

/// A CA and a server certificate for 127.0.0.1, made with openssl in `dir`.
async fn certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let mut command = Command::new("openssl");
        command.args(args).current_dir(dir);
        async move {
            let output = command.output().await.expect("openssl is installed");
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=summarizer-test-ca",
    ])
    .await;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ])
    .await;
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ])
    .await;
}

#[tokio::test]
async fn tls_with_a_private_ca() {
    let dir = std::env::temp_dir().join(format!("summarizer-tls-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    certificates(&dir).await;
    let cert = dir.join("server.pem").display().to_string();
    let key = dir.join("server.key").display().to_string();
    let ca = dir.join("ca.pem").display().to_string();
    let nats = NatsServer::start(&["--tls", "--tlscert", &cert, "--tlskey", &key]).await;
    let mut app = setup(&[("NATS_URL", &nats.url())]).await;
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(dir.join("ca.pem"))
        .require_tls(true);

    served(
        &mut app,
        &[("NATS_TLS_CA_FILE", &ca), ("NATS_TLS_REQUIRED", "true")],
        client,
        &nats.url(),
    )
    .await;

    app.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

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
    // A Postgres password in DATABASE_URL (a SQLite URL names a file and has none).
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

/// A signed NATS JWT (`ed25519-nkey`) with `claims`, issued by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("{:032X}", fastrand::u128(..)),
        "iat": 1_700_000_000,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = b64.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = b64.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{signature}")
}

#[tokio::test]
async fn a_credentials_file_in_operator_mode() {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let limits = serde_json::json!({"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1});
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "acc",
        serde_json::json!({"limits": limits, "type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "worker",
        serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}),
    );

    let dir = std::env::temp_dir().join(format!("summarizer-creds-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("server.conf");
    std::fs::write(
        &config,
        format!(
            "operator: \"{operator_jwt}\"\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{account_jwt}\"\n}}\n",
            account.public_key()
        ),
    )
    .unwrap();
    let creds = dir.join("worker.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
    let nats = NatsServer::start(&["-c", &config.display().to_string()]).await;
    assert!(
        async_nats::connect(nats.url()).await.is_err(),
        "the server enforces credentials"
    );
    let mut app = setup(&[("NATS_URL", &nats.url())]).await;
    let client = async_nats::ConnectOptions::with_credentials_file(&creds)
        .await
        .unwrap();

    served(
        &mut app,
        &[("NATS_CREDS_FILE", &creds.display().to_string())],
        client,
        &nats.url(),
    )
    .await;

    app.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

//! NATS and Postgres go away and come back; the worker recovers by itself and never
//! half-writes. Only private servers are stopped: a nats-server on a free port, and a
//! proxy in front of the shared Postgres. (The NATS outages run on both stores; a SQLite
//! file has no connection to cut, so the proxy's tests are Postgres-only.)

use std::time::Duration;

use summarizer::client::{Decision, TurnClient};
use summarizer::outcome::{Reason, Status};
use tokio::time::Instant;

use crate::fixtures::{NatsServer, Proxy};
use crate::helpers::{SUMMARY, TestApp, eventually, postgres_only, setup};

/// A client of the private server, replying or not.
async fn ask(client: &TurnClient, session: &str) -> Decision {
    client.turn_starting(session, Duration::from_secs(2)).await
}

#[tokio::test]
async fn the_worker_rides_out_a_nats_restart_and_clients_fail_open_meanwhile() {
    let mut nats = NatsServer::start(&[]).await;
    let mut app = setup(&[("NATS_URL", &nats.url())]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let health = app.start_worker(&[]).await;
    let client = TurnClient::new(
        async_nats::connect(nats.url()).await.unwrap(),
        app.env(&[])["NATS_SUBJECT"].clone(),
    );
    app.append_turns("s", 3).await;
    assert!(matches!(ask(&client, "s").await, Decision::Replied(_)));

    nats.stop().await;
    eventually("the client to see the outage", || async {
        matches!(ask(&client, "s").await, Decision::Unavailable(_))
    })
    .await;
    let started = Instant::now();
    assert!(matches!(ask(&client, "s").await, Decision::Unavailable(_)));
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "failed open at once"
    );
    assert!(!health.readiness().await.nats_connected);

    nats.restart().await;
    app.append_turn("s", 4).await;
    app.append_turn("s", 5).await;
    eventually("the worker to resubscribe", || async {
        ask(&client, "s").await.compacted()
    })
    .await;
    assert!(health.readiness().await.ready);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    app.stop().await;
}

#[tokio::test]
async fn a_worker_started_before_nats_waits_and_connects_when_it_comes_up() {
    let port = crate::fixtures::free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut app = setup(&[("NATS_URL", &url)]).await;
    let health = app.start_worker_unready(&[]).await;
    eventually("the migrations", || async {
        health.readiness().await.migrations_applied
    })
    .await;
    let readiness = health.readiness().await;
    assert!(!readiness.ready && !readiness.subscribed, "{readiness:?}");
    let readyz = reqwest::get(format!("http://{}/readyz", app.http_addr.unwrap()))
        .await
        .unwrap();
    assert_eq!(readyz.status(), 503);

    let nats = NatsServer::start_on(port, &[]).await;
    tokio::time::timeout(Duration::from_secs(15), health.wait_until_ready())
        .await
        .expect("connected once NATS came up");
    let client = TurnClient::new(
        async_nats::connect(nats.url()).await.unwrap(),
        app.env(&[])["NATS_SUBJECT"].clone(),
    );
    assert!(matches!(
        ask(&client, "unknown").await,
        Decision::Replied(_)
    ));
    app.stop().await;
}

/// A worker whose Postgres connections go through `proxy`.
async fn worker_behind(proxy: &Proxy, app: &mut TestApp) {
    let url = proxy.database_url(&app.database_url);
    app.start_worker(&[
        ("DATABASE_URL", &url),
        ("DATABASE_ACQUIRE_TIMEOUT_MS", "1000"),
        ("LEASE_DURATION_MS", "1000"),
    ])
    .await;
}

#[tokio::test]
async fn cutting_postgres_at_each_step_never_half_writes_and_the_worker_recovers() {
    postgres_only!("cuts the Postgres connections through a TCP proxy");
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut app = setup(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    worker_behind(&proxy, &mut app).await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    // Where the cut happens: the threshold check, taking the lease, inside the commit.
    let steps = [
        "AS backing_off", // the counters read, alone or batched
        "SET lease_owner = $2, lease_expires_at",
        "INSERT INTO usage_events",
    ];
    for marker in steps {
        proxy.cut_on(marker);
        // Connections broken by the previous cut fail their next statement (and are
        // dropped) before a request gets as far as the marker: store_error all the same.
        for _attempt in 0..10 {
            match app.client.turn_starting("s", Duration::from_secs(10)).await {
                Decision::Replied(reply) => assert_eq!(
                    (reply.status, reply.reason),
                    (Status::Failed, Reason::StoreError),
                    "cut at {marker:?}: {reply:?}"
                ),
                other => assert_eq!(other, Decision::TimedOut, "cut at {marker:?}"),
            }
            if proxy.is_cut() {
                break;
            }
        }
        assert!(proxy.is_cut(), "the worker reached {marker:?}");
        assert_eq!(app.messages("s").await, before, "cut at {marker:?}");
        assert!(app.archived("s").await.is_empty());
        assert!(app.usage_events("s").await.is_empty());
        proxy.restore();
        // A lease taken before the cut runs out (LEASE_DURATION_MS=1000) before the
        // next step's request.
        eventually("the lease to be free", || async {
            (app.db)
                .query(
                    "SELECT lease_owner IS NULL OR lease_expires_at < now() FROM sessions WHERE session_id = 's'",
                )
                .scalar::<bool>()
                .await
                .unwrap()
        })
        .await;
    }

    // Recovered, once the connections the last cut broke have failed their statement.
    eventually("a compaction after the outage", || async {
        app.client
            .turn_starting("s", Duration::from_secs(10))
            .await
            .compacted()
    })
    .await;
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    app.stop().await;
}

#[tokio::test]
async fn a_worker_started_while_postgres_is_unreachable_is_not_ready_until_it_is() {
    postgres_only!("makes Postgres unreachable through a TCP proxy");
    let proxy = Proxy::start("127.0.0.1:5432").await;
    proxy.cut();
    let mut app = setup(&[]).await;
    let url = proxy.database_url(&app.database_url);
    let health = app
        .start_worker_unready(&[
            ("DATABASE_URL", &url),
            ("DATABASE_ACQUIRE_TIMEOUT_MS", "500"),
        ])
        .await;
    let readyz = format!("http://{}/readyz", app.http_addr.unwrap());

    let readiness: serde_json::Value = reqwest::get(&readyz).await.unwrap().json().await.unwrap();
    assert_eq!(readiness["ready"], false);
    assert_eq!(readiness["database_reachable"], false);

    proxy.restore();
    tokio::time::timeout(Duration::from_secs(15), health.wait_until_ready())
        .await
        .expect("ready once Postgres is reachable");
    assert_eq!(reqwest::get(&readyz).await.unwrap().status(), 200);
    app.stop().await;
}

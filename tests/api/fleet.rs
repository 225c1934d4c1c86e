//! A fleet of real worker processes: crashes, pauses, drains and storms, with nothing
//! lost and nothing compacted twice.

use std::time::Duration;

use summarizer::client::{Decision, TurnClient};
use summarizer::outcome::{Reason, Status};

use crate::fixtures::{WorkerProcess, signal_pid};
use crate::helpers::{NATS_URL, SUMMARY, TestApp, completion, eventually, setup};

/// The pid of the worker process holding the session's lease (`w-<pid>-<rand>/<rid>`).
async fn lease_holder_pid(app: &TestApp, session: &str) -> u32 {
    let owner = app.lease_owner(session).await.expect("a lease is held");
    owner.split('-').nth(1).unwrap().parse().unwrap()
}

/// Sends until a worker replies `compacted` (requests routed to a dead or paused worker
/// time out, and others are busy until the lease expires).
async fn until_compacted(app: &TestApp, session: &str) {
    let client = &app.client;
    eventually("a compaction", || async move {
        client
            .turn_starting(session, Duration::from_secs(1))
            .await
            .compacted()
    })
    .await;
}

/// What every fleet test ends with: one compaction, a complete archive, a clean check.
async fn assert_compacted_once(app: &TestApp, session: &str, original: &[crate::helpers::Stored]) {
    assert_eq!(app.usage_events(session).await.len(), 1);
    let mut rebuilt: Vec<_> = app
        .archived(session)
        .await
        .into_iter()
        .chain(
            app.messages(session)
                .await
                .into_iter()
                .filter(|m| !m.is_summary),
        )
        .collect();
    rebuilt.sort_by_key(|m| m.seq);
    assert_eq!(rebuilt, original);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn a_worker_killed_mid_compaction_is_taken_over_once_its_lease_expires() {
    let app = setup(&[("LEASE_DURATION_MS", "1500"), ("HTTP_ADDR", "")]).await;
    // The first answer is slow: its worker will crash or pause holding the lease.
    app.llm_first_then_summary(completion(SUMMARY).set_delay(Duration::from_secs(30)))
        .await;
    let workers: Vec<_> = (0..3)
        .map(|_| WorkerProcess::spawn(&app.env(&[])))
        .collect();
    for worker in &workers {
        worker.wait_for_log("worker ready").await;
    }
    app.append_turns("s", 5).await;
    let original = app.messages("s").await;

    let first = app
        .client
        .turn_starting("s", Duration::from_millis(500))
        .await;
    assert_eq!(
        first,
        Decision::TimedOut,
        "the first worker is stuck in its LLM call"
    );
    app.until_llm_called(1).await;
    let holder = lease_holder_pid(&app, "s").await;
    signal_pid(holder, "KILL").await;
    // While the dead worker's lease lasts, the others answer busy, never compact. (NATS
    // may not have dropped the dead worker's subscription yet: no reply is fine too.)
    match app
        .client
        .turn_starting("s", Duration::from_millis(500))
        .await
    {
        Decision::Replied(during) => assert_eq!(during.reason, Reason::InProgress, "{during:?}"),
        other => assert_eq!(other, Decision::TimedOut),
    }

    until_compacted(&app, "s").await;

    assert_compacted_once(&app, "s", &original).await;
    assert_eq!(app.llm_requests().await, 2);
}

#[tokio::test]
async fn a_paused_worker_that_lost_its_lease_cannot_commit() {
    let app = setup(&[
        ("LEASE_DURATION_MS", "500"),
        ("LLM_TIMEOUT_MS", "20000"),
        ("LLM_DEADLINE_MS", "20000"),
        ("HTTP_ADDR", ""),
    ])
    .await;
    app.llm_first_then_summary(completion(SUMMARY).set_delay(Duration::from_secs(2)))
        .await;
    let paused = WorkerProcess::spawn(&app.env(&[]));
    paused.wait_for_log("worker ready").await;
    app.append_turns("s", 5).await;
    let original = app.messages("s").await;

    let _gave_up = app
        .client
        .turn_starting("s", Duration::from_millis(200))
        .await;
    app.until_llm_called(1).await;
    paused.signal("STOP").await;
    eventually("the lease to expire", || app.db.lease_expired("s")).await;
    let other = WorkerProcess::spawn(&app.env(&[]));
    other.wait_for_log("worker ready").await;
    until_compacted(&app, "s").await;
    // Resumed, the first worker gets its (now stale) summary and tries to commit.
    paused.signal("CONT").await;
    paused
        .wait_for_log("nothing written: the session lease is no longer ours")
        .await;

    assert_compacted_once(&app, "s", &original).await;
}

#[tokio::test]
async fn sigterm_drains_in_flight_events_while_new_ones_go_to_the_other_workers() {
    let mut app = setup(&[("HTTP_ADDR", ""), ("SHUTDOWN_GRACE_MS", "8000")]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(1500)).await;
    let mut draining = WorkerProcess::spawn(&app.env(&[]));
    draining.wait_for_log("worker ready").await;
    let sessions = ["a", "b", "c", "d"];
    for session in sessions {
        app.append_turns(session, 5).await;
    }
    app.append_turns("after", 5).await;
    let in_flight: Vec<_> = sessions
        .iter()
        .map(|s| app.turn_starting_in_background(s))
        .collect();
    app.until_llm_called(sessions.len()).await;

    app.start_worker(&[]).await;
    draining.signal("TERM").await;
    draining.wait_for_log("draining: unsubscribed").await;
    let started = tokio::time::Instant::now();
    let after = app.turn_starting("after").await;
    let status = draining.exit_status(Duration::from_secs(10)).await;

    for request in in_flight {
        let decision = request.await.unwrap();
        assert!(
            decision.compacted(),
            "an in-flight event lost its reply: {decision:?}"
        );
    }
    assert_eq!(after.status, Status::Compacted);
    assert!(
        !draining.logs().contains("session_id=after"),
        "the draining worker took a new event"
    );
    assert!(status.success(), "exit status {status}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "drained within SHUTDOWN_GRACE_MS"
    );
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    app.stop().await;
}

#[tokio::test]
async fn a_storm_of_duplicate_requests_compacts_each_session_once() {
    let mut app = setup(&[("WORKER_CONCURRENCY", "64")]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(200)).await;
    app.start_worker(&[]).await;
    app.start_worker(&[("HTTP_ADDR", "")]).await;
    let sessions: Vec<String> = (0..20).map(|n| format!("storm-{n}")).collect();
    for session in &sessions {
        app.append_turns(session, 5).await;
    }
    let mut clients = Vec::new();
    for _ in 0..4 {
        let nats = async_nats::connect(NATS_URL).await.unwrap();
        clients.push(TurnClient::new(nats, app.env(&[])["NATS_SUBJECT"].clone()));
    }

    let requests: Vec<_> = (0..1000)
        .map(|n| {
            let client = clients[n % clients.len()].clone();
            let session = sessions[n % sessions.len()].clone();
            tokio::spawn(async move {
                client
                    .turn_starting(&session, Duration::from_secs(20))
                    .await
            })
        })
        .collect();
    let mut compacted = 0;
    for request in requests {
        match request.await.unwrap() {
            Decision::Replied(reply) if reply.status == Status::Compacted => compacted += 1,
            Decision::Replied(reply) => assert!(
                matches!(reply.reason, Reason::InProgress | Reason::BelowThreshold),
                "{reply:?}"
            ),
            other => panic!("no reply: {other:?}"),
        }
    }

    assert_eq!(compacted, sessions.len());
    for session in &sessions {
        assert_eq!(app.usage_events(session).await.len(), 1, "{session}");
    }
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    app.stop().await;
}

/// A whole fleet started at once on a new database: every worker migrates it or finds it
/// migrated, and serves. Found by a review on SQLite, whose migrations sqlx runs without
/// a lock: all workers but the first failed on tables that existed (Postgres's migrator
/// holds an advisory lock).
#[tokio::test]
async fn workers_started_at_once_on_a_new_database_all_serve() {
    let database_url = crate::helpers::fresh_database().await;
    let env = crate::helpers::test_env(
        &database_url,
        &crate::helpers::unique_subject(),
        "http://127.0.0.1:9",
    );
    let mut workers: Vec<WorkerProcess> = (0..4).map(|_| WorkerProcess::spawn(&env)).collect();

    for worker in &workers {
        worker.wait_for_log("worker ready").await;
    }
    for worker in &mut workers {
        assert!(
            worker.child.try_wait().unwrap().is_none(),
            "a worker exited: {}",
            worker.logs()
        );
    }
}

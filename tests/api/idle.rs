//! Idle compaction (`SUMMARIZATION_IDLE_AFTER_MS`; docs/protocol.md, "Idle compaction"):
//! a session the agent stopped writing to is compacted by the fleet over its idle
//! threshold, once per idle period, with no request; on both stores and both transports.

use serde_json::Value;
use summarizer::outcome::Status;

use crate::facts::metrics;
use crate::helpers::{SUMMARY, TestApp, eventually, spawn_app_with};
use crate::jobs::{jetstream_server, jobs_app};
use crate::precompute::metric;

/// Idle after a second; the test threshold is 3,000 chars, so the idle one is 1,500.
const IDLE: (&str, &str) = ("SUMMARIZATION_IDLE_AFTER_MS", "1000");

/// The session's place in the idle schedule (`None`: not in it).
async fn idle_since(app: &TestApp, session: &str) -> Option<String> {
    (app.db)
        .query("SELECT CAST(idle_since AS TEXT) FROM sessions WHERE session_id = $1")
        .bind(session)
        .scalar()
        .await
        .unwrap()
}

/// The session's usage events' metadata, once it has `n`.
async fn until_events(app: &TestApp, session: &str, n: usize) -> Vec<Value> {
    eventually(&format!("{n} usage event(s) of {session}"), || async {
        app.usage_events(session).await.len() >= n
    })
    .await;
    let events = app.usage_events(session).await;
    events.into_iter().map(|e| e.4).collect()
}

/// Three turns (about 2,300 chars): under the threshold, over half of it.
#[tokio::test]
async fn an_idle_session_over_its_idle_threshold_is_compacted_once_with_no_request() {
    let app = spawn_app_with(&[IDLE]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 3).await;
    assert!(
        idle_since(&app, "s").await.is_some(),
        "the agent's write schedules it"
    );

    let events = until_events(&app, "s", 1).await;

    assert_eq!(events[0]["idle"], true, "{}", events[0]);
    assert_eq!(events[0]["summarized"], true);
    assert_eq!(app.llm_requests().await, 1);
    // The compaction's own writes (its summary) start no idle period: the session left
    // the schedule when it was claimed, and is back only with the agent's next message.
    assert_eq!(idle_since(&app, "s").await, None);
    eventually("the compaction counted", || async {
        let text = metrics(&app).await;
        let series = "summarizer_idle_sessions_total{status=\"compacted\",reason=\"compacted\"} ";
        metric(&text, series) == 1.0
    })
    .await;
    assert!(app.check().await.is_clean());

    // What it archived is recalled as any compaction's.
    let found = (app.recall)
        .search("s", "pool exhausted", 5, std::time::Duration::from_secs(10))
        .await
        .unwrap();
    assert!(!found.is_empty(), "the archive of an idle compaction");

    // An operator's restore is not the agent's activity: no new period.
    app.store.restore("s", None).await.unwrap();
    assert_eq!(idle_since(&app, "s").await, None);

    // A new period: the agent writes, then stops again; the session is over its idle
    // threshold again, and compacted again.
    app.append_turn("s", 4).await;
    assert!(idle_since(&app, "s").await.is_some());
    let events = until_events(&app, "s", 2).await;
    assert_eq!(events[1]["idle"], true, "{}", events[1]);
    assert_eq!(app.llm_requests().await, 2);
}

/// A session below its idle threshold leaves the schedule without a compaction, so a
/// pass never reads it again until the agent writes; one whose compaction failed waits
/// for its next idle period too, and the agent's turn then finds it as always.
#[tokio::test]
async fn each_idle_period_is_claimed_once_whatever_came_of_it() {
    let app = spawn_app_with(&[IDLE]).await;
    app.llm_first_then_summary(wiremock::ResponseTemplate::new(400).set_body_string("bad request"))
        .await;
    app.append_turn("small", 1).await;
    app.append_turns("s", 3).await;

    eventually("both claimed", || async {
        idle_since(&app, "small").await.is_none() && idle_since(&app, "s").await.is_none()
    })
    .await;
    eventually("the failure counted", || async {
        let text = metrics(&app).await;
        metric(
            &text,
            "summarizer_idle_sessions_total{status=\"failed\",reason=\"llm_error\"} ",
        ) == 1.0
    })
    .await;
    eventually("the small session counted", || async {
        let text = metrics(&app).await;
        let series =
            "summarizer_idle_sessions_total{status=\"skipped\",reason=\"below_threshold\"} ";
        metric(&text, series) == 1.0
    })
    .await;
    assert_eq!(app.usage_events("s").await.len(), 0);
    assert_eq!(app.usage_events("small").await.len(), 0);
    assert_eq!(
        app.llm_requests().await,
        1,
        "one request in the period, not one per pass"
    );
}

/// Two workers, twenty idle sessions: each compacted exactly once (the claim is the
/// single flight of the period, the lease that of the compaction).
#[tokio::test]
async fn a_fleet_compacts_each_idle_session_once() {
    let mut app = spawn_app_with(&[IDLE]).await;
    app.start_worker(&[]).await;
    app.llm_answers(SUMMARY, std::time::Duration::from_millis(50))
        .await;
    let sessions: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    for session in &sessions {
        app.append_turns(session, 3).await;
    }

    for session in &sessions {
        let events = until_events(&app, session, 1).await;
        assert_eq!(events[0]["idle"], true);
    }

    for session in &sessions {
        eventually("no second compaction", || async {
            idle_since(&app, session).await.is_none()
        })
        .await;
        assert_eq!(app.usage_events(session).await.len(), 1, "{session}");
    }
    assert_eq!(app.llm_requests().await, 20);
    assert!(app.check().await.is_clean());
}

/// A turn over the threshold after an idle compaction is answered as always, from the
/// compacted session.
#[tokio::test]
async fn the_turn_after_an_idle_compaction_finds_the_session_compacted() {
    let app = spawn_app_with(&[IDLE]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 3).await;
    until_events(&app, "s", 1).await;

    app.append_turn("s", 4).await;
    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Skipped, "{reply:?}");
    assert!(reply.session_chars.unwrap() < 3000, "{reply:?}");
}

/// With the durable job queue as the transport, the idle passes run all the same.
#[tokio::test]
async fn idle_compaction_works_with_the_job_queue_too() {
    let nats = jetstream_server().await;
    let mut app = jobs_app(&nats, &[IDLE]).await;
    app.start_worker(&[]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 3).await;

    let events = until_events(&app, "s", 1).await;

    assert_eq!(events[0]["idle"], true, "{}", events[0]);
}

/// Off by default: nothing is claimed, the schedule just holds the sessions.
#[tokio::test]
async fn without_the_setting_no_session_is_compacted_idle() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 3).await;
    // A turn over the threshold still compacts: the worker is up and serving.
    app.append_turns("t", 5).await;
    assert_eq!(app.turn_starting("t").await.status, Status::Compacted);

    // Long enough for a pass to have claimed it (1 s and the schedule's second), were
    // the passes running: an absence has no event to wait for.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;

    assert!(idle_since(&app, "s").await.is_some());
    assert_eq!(app.usage_events("s").await.len(), 0);
}

/// A session idle for far longer than the idle time (written while the setting was off,
/// or while the fleet was down) leaves the schedule uncompacted: turning the setting on
/// does not summarize every old conversation at once.
#[tokio::test]
async fn a_session_idle_for_hours_is_given_up_not_compacted() {
    let app = spawn_app_with(&[IDLE]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("old", 3).await;
    let three_hours_ago = match crate::helpers::backend() {
        summarizer::store::Backend::Postgres => {
            "UPDATE sessions SET idle_since = idle_since - interval '3 hours' WHERE session_id = 'old'"
        }
        summarizer::store::Backend::Sqlite => {
            "UPDATE sessions SET idle_since = idle_since - 10800000 WHERE session_id = 'old'"
        }
    };
    app.db.query(three_hours_ago).execute().await.unwrap();
    app.append_turns("new", 3).await;

    until_events(&app, "new", 1).await;
    eventually("the old one given up", || async {
        let text = metrics(&app).await;
        let series = "summarizer_idle_sessions_total{status=\"skipped\",reason=\"stale\"} ";
        metric(&text, series) == 1.0
    })
    .await;

    assert_eq!(idle_since(&app, "old").await, None);
    assert_eq!(app.usage_events("old").await.len(), 0);
    assert_eq!(
        app.llm_requests().await,
        1,
        "the new session's summary alone"
    );
}

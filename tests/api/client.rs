//! The agent's side: the client always ends in "proceed", quickly when nobody listens and
//! at its timeout when the worker is slow; a late compaction still lands.

use std::time::Duration;

use summarizer::client::{Decision, TurnClient};
use tokio::time::Instant;

use crate::helpers::{NATS_URL, SUMMARY, eventually, spawn_app, unique_subject};

#[tokio::test]
async fn with_no_worker_running_the_client_proceeds_at_once() {
    let nats = async_nats::connect(NATS_URL).await.unwrap();
    let client = TurnClient::new(nats, unique_subject());
    let timeout = Duration::from_secs(5);

    let started = Instant::now();
    let decision = client.turn_starting("s", timeout).await;

    assert_eq!(decision, Decision::NoWorkers);
    assert_eq!(decision.reason(), "no_responders");
    assert!(!decision.compacted());
    assert!(
        started.elapsed() < timeout / 10,
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn with_a_slow_worker_the_client_proceeds_at_its_timeout_and_the_compaction_lands_later() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(1500)).await;
    app.append_turns("s", 5).await;
    let timeout = Duration::from_millis(300);

    let started = Instant::now();
    let decision = app.client.turn_starting("s", timeout).await;
    let waited = started.elapsed();

    assert_eq!(decision, Decision::TimedOut);
    assert!(waited >= timeout, "gave up early: {waited:?}");
    assert!(
        waited < Duration::from_millis(1500),
        "waited for the LLM: {waited:?}"
    );
    // The worker finishes after the agent gave up, and commits correctly.
    eventually("the late compaction", || async {
        !app.usage_events("s").await.is_empty()
    })
    .await;
    let after = app.messages("s").await;
    assert!(after[0].is_summary);
    let archived = app.archived("s").await;
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(
        metadata["messages_removed"].as_u64(),
        Some(archived.len() as u64)
    );
}

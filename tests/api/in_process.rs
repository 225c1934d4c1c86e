//! The in-process transport: the same worker and replies as core NATS over a channel,
//! on the test store; and the demo, which uses it when NATS does not answer.

use std::time::Duration;

use summarizer::app::Application;
use summarizer::client::Decision;
use summarizer::config::Settings;
use summarizer::outcome::{Reason, Status};
use summarizer::transport::in_process;
use tokio_util::sync::CancellationToken;

use crate::helpers::setup;

const WAIT: Duration = Duration::from_secs(15);

fn replied(decision: Decision) -> summarizer::protocol::Reply {
    match decision {
        Decision::Replied(reply) => reply,
        other => panic!("no reply: {other:?}"),
    }
}

/// A session over its threshold is compacted through the channel; a malformed request
/// is rejected and the worker goes on; after shutdown the worker's task ends and a
/// request fails open at once ("no workers"), as NATS says with nobody subscribed.
#[tokio::test]
async fn requests_over_the_in_process_transport_are_served_like_nats_ones() {
    let app = setup(&[("LLM_PROVIDER", "extractive")]).await;
    let settings = Settings::from_sources(None, Some(app.env(&[]))).unwrap();
    let worker = Application::build(&settings).await.unwrap();
    let health = worker.health();
    let (client, incoming) = in_process::channel(8);
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(worker.run_in_process(incoming, shutdown.clone()));
    tokio::time::timeout(WAIT, health.wait_until_ready())
        .await
        .expect("ready without NATS");

    app.append_turns("s-1", 6).await;
    let before = app.messages("s-1").await.len();
    let reply = replied(client.turn_starting("s-1", WAIT).await);
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    // What left the history is in the archive, and one summary took its place.
    let after = app.messages("s-1").await.len();
    assert!(after < before);
    assert_eq!(app.archived("s-1").await.len(), before - (after - 1));

    let reply = replied(client.send(b"not json", WAIT).await);
    assert_eq!(reply.status, Status::Rejected);
    assert!(
        reply
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("not valid JSON")
    );
    let reply = replied(client.turn_starting("s-1", WAIT).await);
    assert_eq!(reply.status, Status::Skipped);
    assert_eq!(reply.reason, Reason::BelowThreshold);

    shutdown.cancel();
    tokio::time::timeout(WAIT, served)
        .await
        .expect("stops within the grace period")
        .unwrap()
        .unwrap();
    assert!(!health.readiness().await.ready);
    assert_eq!(client.turn_starting("s-1", WAIT).await, Decision::NoWorkers);
}

//! One event cannot hurt the others: a panicking or CPU-heavy compaction, a drain with
//! NATS gone, a client reusing a request id. Each session still gets its own answer, and
//! no lease outlives the event that took it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use serde_json::json;
use summarizer::client::{Decision, TurnClient};
use summarizer::extractive::Extractive;
use summarizer::outcome::{Reason, Status};
use summarizer::protocol::Reply;
use summarizer::summarizer::{LlmError, Summarizer, SummaryRequest};
use summarizer::summary::Summary;
use tokio::task::JoinHandle;
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::fixtures::NatsServer;
use crate::helpers::{SUMMARY, TestApp, completion, eventually, setup, spawn_app_with};

/// The extractive summarizer, except that the first time it is given a message holding
/// `marker` it panics, as a bug in a summarizer would.
struct PanicsOnce {
    marker: &'static str,
    panicked: AtomicBool,
}

impl Summarizer for PanicsOnce {
    fn summarize<'a>(
        &'a self,
        request: SummaryRequest<'a>,
    ) -> BoxFuture<'a, Result<Summary, LlmError>> {
        async move {
            let marked = request.old.iter().any(|m| m.content.contains(self.marker));
            if marked && !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("the summarizer tripped over {}", self.marker);
            }
            Extractive::default().summarize(request).await
        }
        .boxed()
    }
}

fn replied(decision: Decision) -> Reply {
    match decision {
        Decision::Replied(reply) => reply,
        other => panic!("no reply: {other:?}"),
    }
}

/// Sends the turn-starting request with the given `request_id`, from a task.
fn turn_starting_as(app: &TestApp, session: &str, request_id: &str) -> JoinHandle<Reply> {
    let client = app.client.clone();
    let payload = json!({"session_id": session, "request_id": request_id}).to_string();
    tokio::spawn(async move {
        replied(
            client
                .send(payload.as_bytes(), Duration::from_secs(15))
                .await,
        )
    })
}

#[tokio::test]
async fn a_panicking_summarizer_fails_its_session_and_the_worker_serves_on() {
    // No backoff, so that the next turn may compact at once.
    let mut app = setup(&[("FAILURE_BACKOFF_MS", "0")]).await;
    let summarizer = Arc::new(PanicsOnce {
        marker: "PANIC-ME",
        panicked: AtomicBool::new(false),
    });
    let health = app.start_worker_with_summarizer(summarizer, &[]).await;
    app.append(
        "boom",
        "user",
        "PANIC-ME: why is checkout-api slow?",
        None,
        None,
    )
    .await;
    app.append_turns("boom", 5).await;
    app.append_turns("other", 5).await;
    app.append_turns("small", 1).await;

    let failed = app.turn_starting("boom").await;
    assert_eq!(
        (failed.status, failed.reason),
        (Status::Failed, Reason::LlmError),
        "{failed:?}"
    );
    assert_eq!(
        app.lease_owner("boom").await,
        None,
        "the lease was released"
    );
    assert!(
        app.archived("boom").await.is_empty(),
        "the session is unchanged"
    );

    let small = app.turn_starting("small").await;
    assert_eq!(small.reason, Reason::BelowThreshold, "{small:?}");
    let other = app.turn_starting("other").await;
    assert_eq!(other.status, Status::Compacted, "{other:?}");
    let again = app.turn_starting("boom").await;
    assert_eq!(again.status, Status::Compacted, "{again:?}");
    assert!(health.readiness().await.ready);
    assert_eq!(app.usage_events("boom").await.len(), 1);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    app.stop().await;
}

/// About `bytes` of log lines, each one distinct (the extractive summarizer used to
/// compare every line with every line kept before it).
fn log_dump(bytes: usize) -> String {
    let mut dump = String::with_capacity(bytes + 100);
    let mut n = 0;
    while dump.len() < bytes {
        dump.push_str(&format!(
            "2026-03-01T10:{:02}:{:02}.{:03}Z ERROR svc-{} request {n} failed: upstream reset\n",
            n / 60_000 % 60,
            n / 1000 % 60,
            n % 1000,
            n % 97
        ));
        n += 1;
    }
    dump
}

#[tokio::test]
async fn a_5_mb_tool_output_is_compacted_while_other_sessions_are_answered() {
    let app = spawn_app_with(&[("LLM_PROVIDER", "extractive")]).await;
    let dump = log_dump(5_000_000);
    app.append("big", "user", "Why does svc-1 keep failing?", None, None)
        .await;
    let call = json!([{"id": "dump", "name": "get_logs", "arguments": "{}"}]);
    app.append("big", "assistant", "", Some(call), None).await;
    app.append("big", "tool", &dump, None, Some("dump")).await;
    app.append(
        "big",
        "assistant",
        "The dump shows upstream resets.",
        None,
        None,
    )
    .await;
    for n in 2..=5 {
        app.append_turn("big", n).await;
    }
    app.append_turns("small", 1).await;

    let compaction = app.turn_starting_in_background("big");
    // From the lease on, the worker is loading, planning and summarizing 5 MB.
    eventually("the compaction to start", || async {
        app.lease_owner("big").await.is_some() || compaction.is_finished()
    })
    .await;
    for _ in 0..20 {
        let small = app.turn_starting("small").await;
        assert_eq!(
            (small.status, small.reason),
            (Status::Skipped, Reason::BelowThreshold)
        );
    }
    let compacted = compaction.await.unwrap();

    assert!(compacted.compacted(), "{compacted:?}");
    let messages = app.messages("big").await;
    assert!(messages[0].is_summary);
    let summary = messages[0].content.as_deref().unwrap();
    assert!(
        summary.starts_with("**Investigating:** Why does svc-1 keep failing?"),
        "{summary}"
    );
    let archived = app.archived("big").await;
    assert_eq!(archived[2].content.as_deref(), Some(dump.as_str()));
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn a_drain_with_nats_gone_still_finishes_the_compaction_in_flight() {
    let mut nats = NatsServer::start(&[]).await;
    let mut app = setup(&[("NATS_URL", &nats.url()), ("SHUTDOWN_GRACE_MS", "5000")]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(1500)).await;
    app.start_worker(&[]).await;
    let client = TurnClient::new(
        async_nats::connect(nats.url()).await.unwrap(),
        app.env(&[])["NATS_SUBJECT"].clone(),
    );
    app.append_turns("s", 5).await;
    let request =
        tokio::spawn(async move { client.turn_starting("s", Duration::from_secs(10)).await });
    app.until_llm_called(1).await;

    // NATS goes away, then SIGTERM: the unsubscribe cannot be confirmed, but the
    // compaction in flight must not wait on it.
    nats.stop().await;
    tokio::time::timeout(Duration::from_secs(15), app.stop_workers())
        .await
        .expect("the worker stops within the grace period and a margin");

    assert_eq!(
        app.usage_events("s").await.len(),
        1,
        "the compaction committed"
    );
    assert_eq!(app.lease_owner("s").await, None);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    request.abort();
}

#[tokio::test]
async fn a_second_event_with_the_same_request_id_is_busy() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 5).await;

    let first = turn_starting_as(&app, "s", "same-id");
    app.until_llm_called(1).await;
    let owner = app.lease_owner("s").await;
    let second = turn_starting_as(&app, "s", "same-id").await.unwrap();

    assert_eq!(
        (second.status, second.reason),
        (Status::Busy, Reason::InProgress)
    );
    assert_eq!(app.lease_owner("s").await, owner, "the lease is untouched");
    assert_eq!(first.await.unwrap().status, Status::Compacted);
    assert_eq!(app.usage_events("s").await.len(), 1);
}

#[tokio::test]
async fn a_reused_request_id_cannot_release_the_lease_of_the_event_that_took_over() {
    let mut app = setup(&[
        ("LEASE_DURATION_MS", "800"),
        ("LLM_TIMEOUT_MS", "10000"),
        ("FAILURE_BACKOFF_MS", "0"),
    ])
    .await;
    // The first call outlives its lease, then fails; the second is still running then.
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(400).set_delay(Duration::from_secs(2)))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    Mock::given(method("POST"))
        .respond_with(completion(SUMMARY).set_delay(Duration::from_millis(2800)))
        .mount(&app.llm)
        .await;
    app.start_worker(&[]).await;
    app.append_turns("s", 5).await;

    let first = turn_starting_as(&app, "s", "same-id");
    app.until_llm_called(1).await;
    let first_owner = app.lease_owner("s").await.unwrap();
    eventually("the first lease to expire", || app.db.lease_expired("s")).await;
    let second = turn_starting_as(&app, "s", "same-id");
    app.until_llm_called(2).await;
    let second_owner = app.lease_owner("s").await.unwrap();
    assert_ne!(
        second_owner, first_owner,
        "each event holds a lease of its own"
    );

    let first = first.await.unwrap();
    assert_eq!(
        (first.status, first.reason),
        (Status::Failed, Reason::LlmError)
    );
    assert_eq!(
        app.lease_owner("s").await.as_deref(),
        Some(second_owner.as_str()),
        "the first event's failure left the second event's lease alone"
    );
    let second = second.await.unwrap();
    assert_eq!(second.status, Status::Compacted, "{second:?}");
    assert_eq!(app.usage_events("s").await.len(), 1);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    app.stop().await;
}

#[tokio::test]
async fn a_compaction_still_running_when_the_grace_period_ends_gives_its_lease_back() {
    let mut app = setup(&[("SHUTDOWN_GRACE_MS", "300"), ("LLM_TIMEOUT_MS", "20000")]).await;
    app.llm_answers(SUMMARY, Duration::from_secs(20)).await;
    app.start_worker(&[]).await;
    app.append_turns("s", 5).await;
    let _gave_up = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    assert!(app.lease_owner("s").await.is_some());

    app.stop_workers().await;

    assert_eq!(
        app.lease_owner("s").await,
        None,
        "the abandoned compaction gave its lease back"
    );
    assert!(app.usage_events("s").await.is_empty());
    assert!(app.archived("s").await.is_empty());
}

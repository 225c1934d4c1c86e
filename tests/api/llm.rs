//! The fake LLM misbehaves; the worker retries what is worth retrying and otherwise
//! fails open with the session unchanged.

use std::time::Duration;

use summarizer::outcome::{Reason, Status};
use tokio::time::Instant;
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{SUMMARY, TestApp, completion, spawn_app, spawn_app_with};

/// Asserts the reply is `failed/llm_error` and that nothing was written.
async fn assert_failed_unchanged(
    app: &TestApp,
    session: &str,
    before: &[crate::helpers::Stored],
) -> String {
    let reply = app.turn_starting(session).await;
    assert_eq!(
        (reply.status, reply.reason),
        (Status::Failed, Reason::LlmError),
        "{reply:?}"
    );
    assert_eq!(app.messages(session).await, before);
    assert!(app.archived(session).await.is_empty());
    assert!(app.usage_events(session).await.is_empty());
    assert_eq!(
        app.lease_owner(session).await,
        None,
        "the lease is released"
    );
    reply.message.expect("a failure says why")
}

#[tokio::test]
async fn throttling_is_retried_after_the_retry_after_it_asks_for() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    Mock::given(method("POST"))
        .respond_with(completion(SUMMARY))
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;

    let started = Instant::now();
    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 2);
    // The backoff alone would have waited at most LLM_RETRY_MAX_DELAY_MS (100 ms).
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn server_errors_until_the_deadline_fail_open() {
    let app = spawn_app_with(&[
        ("LLM_MAX_RETRIES", "50"),
        ("LLM_RETRY_MIN_DELAY_MS", "50"),
        ("LLM_RETRY_MAX_DELAY_MS", "200"),
        ("LLM_DEADLINE_MS", "1500"),
    ])
    .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream overloaded"))
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let started = Instant::now();
    let message = assert_failed_unchanged(&app, "s", &before).await;

    assert!(
        message.contains("HTTP 500: upstream overloaded"),
        "{message}"
    );
    assert!(app.llm_requests().await >= 2, "retried");
    // No wait starts that would end past the deadline.
    assert!(
        started.elapsed() < Duration::from_millis(1500 + 1000),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(400).set_body_string("context_length_exceeded"))
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let message = assert_failed_unchanged(&app, "s", &before).await;

    assert!(message.contains("HTTP 400"), "{message}");
    assert_eq!(app.llm_requests().await, 1);
}

#[tokio::test]
async fn a_summary_without_the_template_headings_is_rejected() {
    let app = spawn_app().await;
    app.llm_answers(
        "The team looked at logs and found the pool was full.",
        Duration::ZERO,
    )
    .await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let message = assert_failed_unchanged(&app, "s", &before).await;

    assert!(
        message.contains("lacks the heading **Investigating:**"),
        "{message}"
    );
}

#[tokio::test]
async fn a_summary_longer_than_what_it_replaces_is_rejected() {
    let app = spawn_app().await;
    let long = format!("{SUMMARY}\n{}", crate::helpers::filler(5000));
    app.llm_answers(&long, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let message = assert_failed_unchanged(&app, "s", &before).await;

    assert!(
        message.contains("is not shorter than what it replaces"),
        "{message}"
    );
}

//! The fake LLM misbehaves; the worker retries what is worth retrying and otherwise
//! fails open with the session unchanged.

use std::time::Duration;

use summarizer::outcome::{Reason, Status};
use tokio::time::Instant;
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{SUMMARY, TestApp, completion, spawn_app, spawn_app_with, without_note};

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
    app.llm_first_then_summary(ResponseTemplate::new(429).insert_header("retry-after", "1"))
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

/// A throttling answer whose wait is absurdly long, in either header OpenAI-compatible
/// servers use.
const HUGE_WAITS: [(&str, &str); 2] = [
    ("retry-after", "100000000000000000000"),
    ("retry-after-ms", "1e30"),
];

#[tokio::test]
async fn an_absurd_retry_after_is_cut_to_the_cap_and_the_worker_keeps_serving() {
    for (header, value) in HUGE_WAITS {
        let app = spawn_app_with(&[("LLM_RETRY_AFTER_CAP_MS", "200")]).await;
        app.llm_first_then_summary(ResponseTemplate::new(429).insert_header(header, value))
            .await;
        app.append_turns("s", 5).await;
        app.append_turns("next", 5).await;

        let started = Instant::now();
        let reply = app.turn_starting("s").await;

        assert_eq!(reply.status, Status::Compacted, "{header}: {reply:?}");
        assert_eq!(app.llm_requests().await, 2, "{header}");
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "{header}: waited the cap, {:?}",
            started.elapsed()
        );
        assert_eq!(app.lease_owner("s").await, None, "{header}");
        let next = app.turn_starting("next").await;
        assert_eq!(next.status, Status::Compacted, "{header}: {next:?}");
    }
}

#[tokio::test]
async fn an_absurd_retry_after_past_the_deadline_fails_open_at_once() {
    for (header, value) in HUGE_WAITS {
        // The cap (30 s by default) is past the deadline (8 s): no wait can end in time.
        let app = spawn_app().await;
        app.llm_first_then_summary(ResponseTemplate::new(429).insert_header(header, value))
            .await;
        app.append_turns("s", 5).await;
        app.append_turns("next", 5).await;
        let before = app.messages("s").await;

        let started = Instant::now();
        let message = assert_failed_unchanged(&app, "s", &before).await;

        assert!(message.contains("HTTP 429"), "{header}: {message}");
        assert_eq!(app.llm_requests().await, 1, "{header}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{header}: {:?}",
            started.elapsed()
        );
        let next = app.turn_starting("next").await;
        assert_eq!(next.status, Status::Compacted, "{header}: {next:?}");
    }
}

#[tokio::test]
async fn retry_after_zero_keeps_the_retry_limit_and_the_minimum_delay() {
    // The test workers allow 3 retries, at least 10 ms apart.
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0"))
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let started = Instant::now();
    assert_failed_unchanged(&app, "s", &before).await;

    assert_eq!(app.llm_requests().await, 1 + 3);
    assert!(
        started.elapsed() >= Duration::from_millis(3 * 10),
        "{:?}",
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
        // (A context-length refusal is the one 400 that is retried, smaller: see budgets.rs.)
        .respond_with(ResponseTemplate::new(400).set_body_string(
            r#"{"error": {"message": "The model `fake-model` does not exist", "code": "model_not_found"}}"#,
        ))
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

    // Asked once more with what was wrong, then refused: a few words with no heading
    // are an acknowledgement, not a summary.
    assert_eq!(app.llm_requests().await, 2);
    assert!(
        message.contains("refused twice (acknowledgement)")
            && message.contains("no heading of the template"),
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

/// A fake LLM at the TCP level, for what wiremock cannot do: it reads the request, then
/// either resets the connection or sends headers and a body that trickles.
async fn raw_llm(trickle_body: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buf).await;
                if trickle_body {
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{";
                    let _ = socket.write_all(head.as_bytes()).await;
                    for _ in 0..100 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if socket.write_all(b" ").await.is_err() {
                            return;
                        }
                    }
                }
                // A zero linger makes the close a reset (RST), as a crashing proxy does;
                // it is deprecated because a non-zero one blocks on drop, which zero cannot.
                #[allow(deprecated)]
                let _ = socket.set_linger(Some(Duration::ZERO));
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn every_kind_of_llm_misbehaviour_fails_open_with_nothing_written() {
    let fast = [
        ("LLM_TIMEOUT_MS", "500"),
        ("LLM_MAX_RETRIES", "1"),
        ("LLM_DEADLINE_MS", "3000"),
    ];
    let reset = raw_llm(false).await;
    let trickle = raw_llm(true).await;
    let cases: Vec<(&str, Option<&str>, Option<ResponseTemplate>, &str)> = vec![
        (
            "connection closed",
            Some(&reset),
            None,
            "error sending request",
        ),
        (
            "body slower than the timeout",
            Some(&trickle),
            None,
            "timed out",
        ),
        (
            "slow headers",
            None,
            Some(completion(SUMMARY).set_delay(Duration::from_secs(3))),
            "timed out",
        ),
        (
            "garbage JSON",
            None,
            Some(ResponseTemplate::new(200).set_body_string("{\"choices\": [oops")),
            "not a chat completion",
        ),
        (
            "200 with an error body",
            None,
            Some(
                ResponseTemplate::new(200)
                    .set_body_string(r#"{"error": {"message": "overloaded"}}"#),
            ),
            "no message content",
        ),
        (
            "200 with no choices",
            None,
            Some(ResponseTemplate::new(200).set_body_string(r#"{"choices": []}"#)),
            "no message content",
        ),
        (
            "content that is a number",
            None,
            Some(
                ResponseTemplate::new(200)
                    .set_body_string(r#"{"choices": [{"message": {"content": 42}}]}"#),
            ),
            "not a chat completion",
        ),
        (
            "a huge error body that is not UTF-8",
            None,
            Some(ResponseTemplate::new(400).set_body_bytes(vec![0xff; 4 << 20])),
            "HTTP 400",
        ),
        (
            "an error body larger than the worker reads",
            None,
            Some(ResponseTemplate::new(400).set_body_bytes(vec![b'x'; 20 << 20])),
            "HTTP 400: xxx",
        ),
        (
            "a completion larger than the worker reads",
            None,
            Some(completion(&format!(
                "{SUMMARY}\n{}",
                "- a finding\n".repeat(2 << 20)
            ))),
            "larger than 8388608 bytes",
        ),
    ];
    for (what, base_url, response, says) in cases {
        let mut overrides = fast.to_vec();
        let app_llm_url;
        if let Some(url) = base_url {
            app_llm_url = url.to_owned();
            overrides.push(("LLM_BASE_URL", &app_llm_url));
        }
        let app = spawn_app_with(&overrides).await;
        if let Some(response) = response {
            Mock::given(method("POST"))
                .respond_with(response)
                .mount(&app.llm)
                .await;
        }
        app.append_turns("s", 5).await;
        let before = app.messages("s").await;

        let message = assert_failed_unchanged(&app, "s", &before).await;

        assert!(message.contains(says), "{what}: {message}");
        assert!(message.len() < 2000, "{what}: quoted in part only");
    }
}

#[tokio::test]
async fn a_poisoned_session_backs_off_while_others_proceed() {
    let app = spawn_app_with(&[("FAILURE_BACKOFF_MS", "60000"), ("LLM_MAX_RETRIES", "0")]).await;
    Mock::given(method("POST"))
        .and(wiremock::matchers::body_string_contains("poison"))
        .respond_with(ResponseTemplate::new(500))
        .with_priority(1)
        .mount(&app.llm)
        .await;
    Mock::given(method("POST"))
        .respond_with(completion(SUMMARY))
        .mount(&app.llm)
        .await;
    app.append("poisoned", "user", "poison pill", None, None)
        .await;
    app.append_turns("poisoned", 5).await;
    app.append_turns("healthy", 5).await;

    let first = app.turn_starting("poisoned").await;
    assert_eq!(first.reason, Reason::LlmError);
    let calls = app.llm_requests().await;
    let again = app.turn_starting("poisoned").await;

    assert_eq!(
        (again.status, again.reason),
        (Status::Skipped, Reason::BackingOff)
    );
    assert_eq!(
        app.llm_requests().await,
        calls,
        "no LLM call while backing off"
    );
    assert_eq!(app.turn_starting("healthy").await.status, Status::Compacted);

    // Once the backoff has run out (made so here), it tries again, and the next backoff
    // is twice as long.
    app.db.end_backoff("poisoned").await;
    assert_eq!(app.turn_starting("poisoned").await.reason, Reason::LlmError);
    let (failures, backoff_secs) = app.db.backoff("poisoned").await;
    assert_eq!(failures, 2);
    assert!((100.0..=120.0).contains(&backoff_secs), "{backoff_secs}");
}

/// A chat completion that stopped at `max_tokens`: it still has every heading.
fn cut_off() -> ResponseTemplate {
    let text = "**Investigating:** checkout 502s\n**Key findings:**\n- pool at 100/100\n\
                **Ruled out:** DNS\n**Current state:** requests wait up to 29.";
    ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "length"}],
    }))
}

#[tokio::test]
async fn an_answer_cut_off_at_the_output_limit_is_never_written() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .respond_with(cut_off())
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let message = assert_failed_unchanged(&app, "s", &before).await;

    assert!(message.contains("cut off at the output limit"), "{message}");
    // Asked again, shorter, twice: then a failure, counted as truncated.
    assert_eq!(app.llm_requests().await, 3);
    let metrics = reqwest::get(format!("http://{}/metrics", app.http_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("summarizer_llm_failures_total{cause=\"truncated\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_answer_cut_off_once_is_asked_again_and_the_whole_one_written() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .respond_with(cut_off())
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let summary = app.messages("s").await.remove(0);
    assert_eq!(without_note(summary.content.as_deref().unwrap()), SUMMARY);
    let requests = app.llm.received_requests().await.unwrap();
    let again: serde_json::Value = requests[1].body_json().unwrap();
    assert!(
        again["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("your previous answer was cut off"),
        "{again}"
    );
}

#[tokio::test]
async fn with_the_extractive_fallback_a_cut_off_answer_is_replaced_not_written() {
    let app = spawn_app_with(&[("LLM_FALLBACK", "extractive")]).await;
    Mock::given(method("POST"))
        .respond_with(cut_off())
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let summary = app.messages("s").await.remove(0);
    assert!(
        !summary.content.unwrap().contains("requests wait up to 29."),
        "the cut-off answer is not the summary"
    );
    let events = app.usage_events("s").await;
    assert!(
        events[0].4["fallback_reason"]
            .as_str()
            .unwrap()
            .contains("cut off"),
        "{:?}",
        events[0].4
    );
}

//! The second provider (Anthropic's Messages API), the extractive fallback, and the
//! prompt as it reaches the provider: each against a wiremock LLM.

use std::time::Duration;

use serde_json::{Value, json};
use summarizer::outcome::{Reason, Status};
use tokio::time::Instant;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{API_KEY, SUMMARY, TestApp, spawn_app_with, without_note};

const ANTHROPIC: [(&str, &str); 2] = [("LLM_PROVIDER", "anthropic"), ("LLM_MODEL", "claude-test")];

/// A Messages API answer whose text is `summary`, with token usage.
fn message(summary: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "msg_test", "type": "message", "role": "assistant",
        "model": "claude-test-2026",
        "content": [{"type": "text", "text": summary}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 812, "output_tokens": 64}
    }))
}

fn anthropic_error(status: u16, kind: &str, text: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "type": "error", "error": {"type": kind, "message": text}
    }))
}

/// The fake Anthropic API answers `first` once, then a good summary; only requests with
/// the key and version headers on the Messages path match.
async fn anthropic_first_then_summary(app: &TestApp, first: ResponseTemplate) {
    let matching = || {
        Mock::given(method("POST"))
            .and(path("/messages"))
            .and(header("x-api-key", API_KEY))
            .and(header("anthropic-version", "2023-06-01"))
    };
    matching()
        .respond_with(first)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    matching()
        .respond_with(message(SUMMARY))
        .mount(&app.llm)
        .await;
}

async fn request_bodies(app: &TestApp) -> Vec<Value> {
    let requests = app.llm.received_requests().await.unwrap();
    requests.iter().map(|r| r.body_json().unwrap()).collect()
}

#[tokio::test]
async fn anthropic_overloaded_then_ok_compacts() {
    let app = spawn_app_with(&ANTHROPIC).await;
    anthropic_first_then_summary(&app, anthropic_error(529, "overloaded_error", "Overloaded"))
        .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 2);
    let body = &request_bodies(&app).await[1];
    assert_eq!(body["model"], "claude-test");
    // SUMMARY_MAX_CHARS (6000) / 3: the summary's room, asked of every provider alike.
    assert_eq!(body["max_tokens"], 2000);
    assert!(
        body["system"]
            .as_str()
            .unwrap()
            .contains("**Current state:**")
    );
    assert_eq!(body["messages"][0]["role"], "user");
    let transcript = body["messages"][0]["content"].as_str().unwrap();
    assert!(transcript.contains("Turn 1: why is checkout-api slow?"));
    let events = app.usage_events("s").await;
    let (_, model, prompt_tokens, completion_tokens, metadata) = &events[0];
    assert_eq!(
        (model.as_str(), *prompt_tokens, *completion_tokens),
        ("claude-test-2026", Some(812), Some(64))
    );
    assert_eq!(metadata["prompt_version"], "default-v4");
    assert_eq!(metadata.get("fallback"), None);
    let written = app.messages("s").await.remove(0).content.unwrap();
    assert_eq!(without_note(&written), SUMMARY);
}

#[tokio::test]
async fn an_anthropic_spend_limit_is_tried_once() {
    let app = spawn_app_with(&ANTHROPIC).await;
    let limit = anthropic_error(
        429,
        "rate_limit_error",
        "Your organization has reached its monthly spend limit.",
    );
    anthropic_first_then_summary(&app, limit.insert_header("retry-after", "0")).await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Failed, Reason::LlmError),
        "{reply:?}"
    );
    assert!(reply.message.unwrap().contains("HTTP 429"));
    assert_eq!(app.llm_requests().await, 1, "not retried");
    assert_eq!(app.messages("s").await, before);
    assert!(app.usage_events("s").await.is_empty());
}

#[tokio::test]
async fn anthropic_throttling_waits_the_retry_after_it_asks_for() {
    let app = spawn_app_with(&ANTHROPIC).await;
    let throttled = anthropic_error(
        429,
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit",
    );
    anthropic_first_then_summary(&app, throttled.insert_header("retry-after", "1")).await;
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

/// The fake LLM fails every request with a 500 that echoes the key, as a broken proxy
/// might.
async fn llm_down(app: &TestApp) {
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(500).set_body_string(format!("upstream down, key {API_KEY}")),
        )
        .mount(&app.llm)
        .await;
}

#[tokio::test]
async fn with_the_extractive_fallback_a_session_is_compacted_while_the_llm_is_down() {
    let app = spawn_app_with(&[("LLM_FALLBACK", "extractive"), ("LLM_MAX_RETRIES", "1")]).await;
    llm_down(&app).await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(
        app.llm_requests().await,
        2,
        "the LLM was tried, with its retry"
    );
    let events = app.usage_events("s").await;
    let (_, model, _, _, metadata) = &events[0];
    assert_eq!(model, "extractive");
    assert_eq!(metadata["fallback"], true);
    let reason = metadata["fallback_reason"].as_str().unwrap();
    assert!(reason.contains("HTTP 500: upstream down"), "{reason}");
    assert!(!metadata.to_string().contains(API_KEY), "{metadata}");
    assert_eq!(metadata.get("prompt_version"), None, "no prompt wrote it");
    let after = app.messages("s").await;
    assert!(after[0].is_summary);
    assert!(after.len() < before.len());
    assert_eq!(
        app.archived("s").await.len(),
        reply.messages_removed.unwrap() as usize
    );
}

#[tokio::test]
async fn without_a_fallback_the_session_is_unchanged_while_the_llm_is_down() {
    let app = spawn_app_with(&[("LLM_FALLBACK", "none"), ("LLM_MAX_RETRIES", "1")]).await;
    llm_down(&app).await;
    app.append_turns("s", 5).await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Failed, Reason::LlmError),
        "{reply:?}"
    );
    assert_eq!(app.messages("s").await, before);
    assert!(app.archived("s").await.is_empty());
    assert!(app.usage_events("s").await.is_empty());
}

#[tokio::test]
async fn a_prompt_file_is_sent_as_the_system_prompt_and_its_version_recorded() {
    let dir = std::env::temp_dir().join(format!("summarizer-prompt-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompt.md");
    let text = format!(
        "You are the SRE team's scribe. Answer in this template:\n{}\n",
        summarizer::summary::TEMPLATE
    );
    std::fs::write(&file, &text).unwrap();
    let app = spawn_app_with(&[("SUMMARY_PROMPT_FILE", file.to_str().unwrap())]).await;
    std::fs::remove_dir_all(&dir).unwrap();
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append(
        "s",
        "system",
        "You are the checkout on-call agent.",
        None,
        None,
    )
    .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let body = &request_bodies(&app).await[0];
    assert_eq!(body["messages"][0]["content"], text.as_str());
    let transcript = body["messages"][1]["content"].as_str().unwrap();
    let context = transcript
        .lines()
        .position(|l| l.ends_with(" system message: context only, do not summarize]"))
        .expect("the system message is given as context");
    let next = transcript.lines().nth(context + 1).unwrap();
    assert_eq!(next, "You are the checkout on-call agent.");
    let events = app.usage_events("s").await;
    let version = events[0].4["prompt_version"].as_str().unwrap();
    assert!(version.starts_with("file:"), "{version}");
    let after = app.messages("s").await;
    assert_eq!(after[0].role, "system", "the system message stays first");
    assert!(after[1].is_summary);
}

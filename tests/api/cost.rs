//! What a compaction costs (docs/protocol.md, "What compaction costs"): every request it
//! made is counted, answered or not, with the tokens every answer reported (a cut-off
//! one, a refused one and the LLM's part of a fallback included) and the part of the
//! prompt read from the provider's cache; the usage event, `/stats` (totals and days)
//! and Prometheus all say so, on both stores.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use summarizer::outcome::Status;
use wiremock::matchers::method;
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::facts::metrics;
use crate::helpers::{SUMMARY, TestApp, eventually, spawn_app_with};
use crate::precompute::metric;

/// Answers the scripted responses in turn, the last one to every later request.
struct Script(Vec<ResponseTemplate>, AtomicUsize);

impl Script {
    fn new(answers: Vec<ResponseTemplate>) -> Self {
        Self(answers, AtomicUsize::new(0))
    }
}

impl Respond for Script {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.1.fetch_add(1, Ordering::Relaxed);
        self.0[n.min(self.0.len() - 1)].clone()
    }
}

/// An OpenAI completion of `text`, stopped for `finish_reason`, with this usage.
fn answer(
    text: &str,
    finish_reason: &str,
    (prompt, completion, cached): (i64, i64, i64),
) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "model": "fake-model-2026",
        "choices": [{"message": {"role": "assistant", "content": text},
                     "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}
    }))
}

async fn script(app: &TestApp, answers: Vec<ResponseTemplate>) {
    Mock::given(method("POST"))
        .respond_with(Script::new(answers))
        .mount(&app.llm)
        .await;
}

/// A usage event's cost columns and metadata.
#[derive(Debug, sqlx::FromRow)]
struct Event {
    // The token columns are 32-bit, as they always were; the cached one is 64-bit.
    prompt_tokens: Option<i32>,
    completion_tokens: Option<i32>,
    total_tokens: Option<i32>,
    cached_prompt_tokens: Option<i64>,
    metadata: String,
}

/// `(prompt_tokens, completion_tokens, total_tokens, cached_prompt_tokens, metadata)` of
/// the session's only usage event.
async fn the_event(
    app: &TestApp,
    session: &str,
) -> (Option<i64>, Option<i64>, Option<i64>, Option<i64>, Value) {
    let rows: Vec<Event> = app
        .db
        .query(
            "SELECT prompt_tokens, completion_tokens, total_tokens, cached_prompt_tokens,
                    CAST(metadata AS TEXT) AS metadata
             FROM usage_events WHERE session_id = $1 ORDER BY id",
        )
        .bind(session)
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one usage event: {rows:?}");
    let event = rows.into_iter().next().unwrap();
    let wide = |n: Option<i32>| n.map(i64::from);
    (
        wide(event.prompt_tokens),
        wide(event.completion_tokens),
        wide(event.total_tokens),
        event.cached_prompt_tokens,
        serde_json::from_str(&event.metadata).unwrap(),
    )
}

#[tokio::test]
async fn every_request_is_counted_with_every_answers_tokens_and_its_cached_part() {
    let app = spawn_app_with(&[
        ("LLM_RETRY_MIN_DELAY_MS", "10"),
        ("LLM_RETRY_MAX_DELAY_MS", "20"),
    ])
    .await;
    // A 503 (retried, no usage), an answer cut off at the output limit (asked again,
    // its tokens paid), then the summary.
    script(
        &app,
        vec![
            ResponseTemplate::new(503).set_body_string("overloaded"),
            answer("**Investigating:** checkout", "length", (500, 200, 400)),
            answer(SUMMARY, "stop", (812, 64, 700)),
        ],
    )
    .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 3);
    let (prompt, completion, total, cached, metadata) = the_event(&app, "s").await;
    assert_eq!(
        (prompt, completion, total, cached),
        (Some(1312), Some(264), Some(1576), Some(1100)),
        "the cut-off answer was paid for too"
    );
    assert_eq!(metadata["llm_requests"], 3, "the 503 was a request too");

    let stats = app.stats().await;
    let summary = &stats["summary"];
    assert_eq!(
        [
            &summary["prompt_tokens"],
            &summary["completion_tokens"],
            &summary["cached_prompt_tokens"],
            &summary["llm_requests"],
        ],
        [&json!(1312), &json!(264), &json!(1100), &json!(3)]
    );
    let today = stats["daily"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        [&today["cached_prompt_tokens"], &today["llm_requests"]],
        [&json!(1100), &json!(3)]
    );

    let metrics = metrics(&app).await;
    for (series, value) in [
        ("summarizer_llm_requests_total ", 3.0),
        ("summarizer_llm_tokens_total{kind=\"prompt\"} ", 1312.0),
        ("summarizer_llm_tokens_total{kind=\"completion\"} ", 264.0),
        (
            "summarizer_llm_tokens_total{kind=\"cached_prompt\"} ",
            1100.0,
        ),
    ] {
        assert_eq!(metric(&metrics, series), value, "{series}\n{metrics}");
    }
}

/// A provider that reports no usage, or no cached part: NULL, not 0, in the event, and
/// nothing added to the totals.
#[tokio::test]
async fn what_the_provider_does_not_report_stays_null() {
    let app = spawn_app_with(&[]).await;
    script(
        &app,
        vec![ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"content": SUMMARY}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 812, "completion_tokens": 64}
        }))],
    )
    .await;
    app.append_turns("s", 5).await;

    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);

    let (prompt, _, _, cached, metadata) = the_event(&app, "s").await;
    assert_eq!((prompt, cached), (Some(812), None));
    assert_eq!(metadata["llm_requests"], 1);
    assert_eq!(app.stats().await["summary"]["cached_prompt_tokens"], 0);
}

/// The LLM's answers that came to nothing (here two acknowledgements, refused by the
/// acceptance gate) are counted in the event of the summary the fallback wrote.
#[tokio::test]
async fn the_llm_part_of_a_fallback_is_counted() {
    let app = spawn_app_with(&[("LLM_FALLBACK", "extractive")]).await;
    script(
        &app,
        vec![answer("Sure, I will summarize it.", "stop", (812, 8, 0))],
    )
    .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let (prompt, completion, _, cached, metadata) = the_event(&app, "s").await;
    assert_eq!(metadata["fallback"], true, "{metadata}");
    assert_eq!(metadata["llm_requests"], 2, "{metadata}");
    assert_eq!(
        (prompt, completion, cached),
        (Some(1624), Some(16), Some(0))
    );
}

/// A summary prepared early keeps its cost until the turn that applies it writes the
/// event.
#[tokio::test]
async fn a_pending_summary_carries_its_cost_into_the_event_that_applies_it() {
    let app = spawn_app_with(&[("SUMMARIZATION_PRECOMPUTE_AT", "0.5")]).await;
    script(&app, vec![answer(SUMMARY, "stop", (812, 64, 512))]).await;
    app.append_turns("s", 3).await;
    app.turn_starting("s").await;
    eventually("a pending summary", || async {
        let pending: Option<i64> = (app.db)
            .query("SELECT cached_prompt_tokens FROM pending_summaries WHERE session_id = 's'")
            .scalar_optional()
            .await
            .unwrap();
        pending.is_some()
    })
    .await;

    app.append_turn("s", 4).await;
    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 1, "applied, not asked again");
    let (prompt, completion, _, cached, metadata) = the_event(&app, "s").await;
    assert_eq!(metadata["precomputed"], true, "{metadata}");
    assert_eq!(
        (prompt, completion, cached),
        (Some(812), Some(64), Some(512))
    );
    assert_eq!(metadata["llm_requests"], 1);
    let summary = &app.stats().await["summary"];
    assert_eq!(
        [&summary["cached_prompt_tokens"], &summary["llm_requests"]],
        [&json!(512), &json!(1)]
    );
}

/// A restore gives nothing back to the provider: the cost stays in the totals, as the
/// prompt and completion tokens always have.
#[tokio::test]
async fn a_restored_compaction_still_counts_what_it_cost() {
    let app = spawn_app_with(&[]).await;
    script(&app, vec![answer(SUMMARY, "stop", (812, 64, 100))]).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    let before = app.stats().await["summary"].clone();

    app.store.restore("s", None).await.unwrap();

    let after = app.stats().await["summary"].clone();
    assert_eq!(after["total_summarizations"], 0);
    for field in ["prompt_tokens", "cached_prompt_tokens", "llm_requests"] {
        assert_eq!(after[field], before[field], "{field}");
    }
}

/// A provider that reports absurd usage (beyond the 32-bit token columns, negative)
/// costs no compaction: the figures are capped (`usage::MAX_RECORDED_TOKENS`), never a
/// failed commit.
#[tokio::test]
async fn absurd_usage_is_clamped_not_a_failed_commit() {
    let app = spawn_app_with(&[]).await;
    script(
        &app,
        vec![ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"content": SUMMARY}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9_000_000_000_000_000_i64,
                      "completion_tokens": 9_000_000_000_000_000_i64,
                      "prompt_tokens_details": {"cached_tokens": -5}}
        }))],
    )
    .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let (prompt, completion, total, cached, _) = the_event(&app, "s").await;
    let max = summarizer::usage::MAX_RECORDED_TOKENS;
    assert_eq!(
        (prompt, completion, total, cached),
        (Some(max), Some(max), Some(2 * max), Some(0))
    );
    assert_eq!(app.stats().await["summary"]["prompt_tokens"], max);
    let metrics = metrics(&app).await;
    let series = "summarizer_llm_tokens_total{kind=\"completion\"} ";
    assert_eq!(metric(&metrics, series), max as f64, "{metrics}");
}

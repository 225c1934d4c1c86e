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
use crate::helpers::{SUMMARY, TestApp, spawn_app_with};
use crate::precompute::{metric, until_pending};

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
    until_pending(&app, "s").await;

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

/// The session's `model_turns`, and the usage events' `model_turns` in order.
async fn turns(app: &TestApp, session: &str) -> (i64, Vec<Option<i64>>) {
    let session_turns: i64 = (app.db)
        .query("SELECT model_turns FROM sessions WHERE session_id = $1")
        .bind(session)
        .scalar()
        .await
        .unwrap();
    let at_events: Vec<(Option<i64>,)> = (app.db)
        .query("SELECT model_turns FROM usage_events WHERE session_id = $1 ORDER BY id")
        .bind(session)
        .fetch_all()
        .await
        .unwrap();
    (session_turns, at_events.into_iter().map(|(t,)| t).collect())
}

/// The tokens a compaction's event says it took out of the context.
fn saved_per_turn(metadata: &Value) -> i64 {
    let count = |field: &str| metadata[field].as_i64().unwrap_or(0);
    count("tokens_removed") + count("tokens_cleared") - count("summary_tokens")
}

/// `tokens_saved_net` is the removed-less-summary tokens times the model turns made
/// after the compaction, less its cost: negative until the later turns pay for it. Each
/// assistant message the agent inserts is a turn; the summary, and the turns before the
/// compaction, are not.
#[tokio::test]
async fn net_savings_count_the_turns_after_each_compaction_less_its_cost() {
    let app = spawn_app_with(&[]).await;
    script(&app, vec![answer(SUMMARY, "stop", (812, 64, 0))]).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    let (_, _, _, _, metadata) = the_event(&app, "s").await;
    let saved = saved_per_turn(&metadata);
    assert!(saved > 0, "{metadata}");
    // Five turns of two model calls each (the tool call and the answer).
    assert_eq!(turns(&app, "s").await, (10, vec![Some(10)]));
    let net = |stats: &Value| stats["summary"]["tokens_saved_net"].as_i64().unwrap();
    assert_eq!(net(&app.stats().await), -(812 + 64), "nothing saved yet");

    app.append_turn("s", 6).await;
    app.append_turn("s", 7).await;

    assert_eq!(turns(&app, "s").await.0, 14);
    assert_eq!(net(&app.stats().await), 4 * saved - (812 + 64));
}

/// A restore stops a compaction's savings and keeps what it had saved; the messages it
/// puts back are old turns, not new ones; and the cost stays.
#[tokio::test]
async fn a_restore_banks_the_savings_so_far_and_adds_no_turns() {
    let app = spawn_app_with(&[]).await;
    script(&app, vec![answer(SUMMARY, "stop", (812, 64, 0))]).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    let (_, _, _, _, metadata) = the_event(&app, "s").await;
    let saved = saved_per_turn(&metadata);
    app.append_turn("s", 6).await;

    app.store.restore("s", None).await.unwrap();
    app.append_turn("s", 7).await;

    assert_eq!(turns(&app, "s").await, (14, vec![Some(10)]));
    let stats = app.stats().await;
    assert_eq!(
        stats["summary"]["tokens_saved_net"].as_i64().unwrap(),
        2 * saved - (812 + 64),
        "the two turns before the restore, not the two after"
    );
    assert!(app.check().await.is_clean());
}

/// Two compactions of one session each count from their own commit; a precomputed one
/// applied by a turn takes its turns when it is applied.
#[tokio::test]
async fn each_compaction_counts_from_its_own_commit() {
    let app = spawn_app_with(&[("SUMMARIZATION_PRECOMPUTE_AT", "0.5")]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 3).await;
    app.turn_starting("s").await;
    until_pending(&app, "s").await;
    app.append_turn("s", 4).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    for n in 5..=9 {
        app.append_turn("s", n).await;
    }
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    app.append_turn("s", 10).await;

    let events = app.usage_events("s").await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].4["precomputed"], true, "{}", events[0].4);
    assert_eq!(turns(&app, "s").await, (20, vec![Some(8), Some(18)]));
    let (first, second) = (saved_per_turn(&events[0].4), saved_per_turn(&events[1].4));
    let cost: i64 = events
        .iter()
        .map(|e| i64::from(e.2.unwrap() + e.3.unwrap()))
        .sum();
    assert_eq!(
        app.stats().await["summary"]["tokens_saved_net"]
            .as_i64()
            .unwrap(),
        first * 12 + second * 2 - cost
    );
}

/// A restore that undoes two compactions at once banks each one's savings from its own
/// commit to the restore.
#[tokio::test]
async fn a_restore_of_two_compactions_banks_each_from_its_own_commit() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    for n in 6..=9 {
        app.append_turn("s", n).await;
    }
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    app.append_turn("s", 10).await;
    let events = app.usage_events("s").await;
    assert_eq!(events.len(), 2);
    let first_id = events[0].0;

    let restored = app.store.restore("s", Some(first_id)).await.unwrap();
    assert_eq!(restored.compactions.len(), 2);
    app.append_turn("s", 11).await;

    assert_eq!(turns(&app, "s").await, (22, vec![Some(10), Some(18)]));
    let (first, second) = (saved_per_turn(&events[0].4), saved_per_turn(&events[1].4));
    let cost: i64 = (events.iter())
        .map(|e| i64::from(e.2.unwrap() + e.3.unwrap()))
        .sum();
    assert_eq!(
        app.stats().await["summary"]["tokens_saved_net"]
            .as_i64()
            .unwrap(),
        first * (20 - 10) + second * (20 - 18) - cost,
        "banked at the restore (20 turns), not after it"
    );
}

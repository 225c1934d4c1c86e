//! Old parts larger than the model's context: every request stays within
//! `LLM_MAX_INPUT_TOKENS`, large histories go in chunks, an oversize message is clipped,
//! and a budget over the model's real context shrinks until it fits. The fake LLM refuses
//! any request over its context with OpenAI's `context_length_exceeded`.

use serde_json::{Value, json};
use summarizer::compaction::tokens;
use summarizer::outcome::Status;
use summarizer::summary::HEADINGS;
use wiremock::matchers::{method, path};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::helpers::{SUMMARY, Stored, TestApp, completion, filler, setup};

/// A model whose context is `limit` tokens: a larger request is refused as OpenAI
/// refuses it, any other answered with [`SUMMARY`].
struct ContextLimit {
    limit: usize,
}

impl Respond for ContextLimit {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let tokens = request_tokens(request);
        if tokens <= self.limit {
            return completion(SUMMARY);
        }
        ResponseTemplate::new(400).set_body_json(json!({"error": {
            "message": format!(
                "This model's maximum context length is {} tokens. However, your messages \
                 resulted in {tokens} tokens. Please reduce the length of the messages.",
                self.limit
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded"
        }}))
    }
}

/// The tokens of a chat request's messages, counted with the worker's own tokenizer.
fn request_tokens(request: &Request) -> usize {
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| tokens::count(m["content"].as_str().unwrap()))
        .sum()
}

/// A worker with a token budget of `budget` in front of a model whose context is
/// `context` tokens. Deadline and lease are long: a debug build counts megabytes slowly.
async fn app_with_model(budget: usize, context: usize) -> TestApp {
    let budget = budget.to_string();
    let mut app = setup(&[
        ("LLM_MAX_INPUT_TOKENS", &budget),
        ("SUMMARY_MAX_CHARS", "1500"),
        ("LLM_DEADLINE_MS", "60000"),
        ("LEASE_DURATION_MS", "120000"),
        // What the prompt does with outputs the operator keeps whole: no eviction
        // (tests/api/wall.rs has those).
        ("TOOL_OUTPUT_MAX_CHARS", "0"),
    ])
    .await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(ContextLimit { limit: context })
        .mount(&app.llm)
        .await;
    app.start_worker(&[]).await;
    app
}

/// `turns` human turns, each a short question and an answer of about `answer_chars`
/// characters, written in one statement (a plain INSERT, as agents write).
async fn append_long_history(app: &TestApp, session: &str, turns: i64, answer_chars: usize) {
    let answer = filler(answer_chars);
    app.db
        .query(
            "WITH RECURSIVE turns (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM turns WHERE n < $2),
                  r (i, role) AS (VALUES (1, 'user'), (2, 'assistant'))
             INSERT INTO messages (session_id, role, content)
             SELECT $1, r.role, CASE r.role
                        WHEN 'user' THEN 'Turn ' || n || ': why is checkout-api slow?'
                        ELSE 'Finding ' || n || ': ' || $3 END
             FROM turns, r
             ORDER BY n, r.i",
        )
        .bind(session)
        .bind(turns)
        .bind(&answer)
        .execute()
        .await
        .unwrap();
}

/// The compaction's four promises: every request the model received was within the
/// budget, the archive holds every removed message unchanged, and the one summary in
/// the history keeps the template. Returns the LLM's requests.
async fn assert_compacted_within(
    app: &TestApp,
    session: &str,
    before: &[Stored],
    budget: usize,
) -> Vec<Request> {
    let requests = app.llm.received_requests().await.unwrap();
    for (i, request) in requests.iter().enumerate() {
        let tokens = request_tokens(request);
        assert!(tokens <= budget, "request {i} holds {tokens} tokens");
    }
    let after = app.messages(session).await;
    let summaries: Vec<_> = after.iter().filter(|m| m.is_summary).collect();
    assert_eq!(summaries.len(), 1);
    let summary = summaries[0].content.as_deref().unwrap();
    for heading in HEADINGS {
        assert!(
            summary.contains(heading),
            "{heading} missing from {summary}"
        );
    }
    // The summary takes a removed message's place (and perhaps its seq).
    let kept: Vec<i64> = after
        .iter()
        .filter(|m| !m.is_summary)
        .map(|m| m.seq)
        .collect();
    let removed: Vec<Stored> = before
        .iter()
        .filter(|m| !kept.contains(&m.seq))
        .cloned()
        .collect();
    assert!(!removed.is_empty());
    let archived = app.archived(session).await;
    assert_eq!(archived.len(), removed.len());
    for (archived, removed) in archived.iter().zip(&removed) {
        // Compared whole; reported by seq only (the messages are megabytes).
        assert!(
            archived == removed,
            "seq {} differs in the archive",
            removed.seq
        );
    }
    requests
}

#[tokio::test]
async fn a_two_megabyte_old_part_is_summarized_in_chunks_within_the_budget() {
    let app = app_with_model(20_000, 24_000).await;
    append_long_history(&app, "s", 500, 4_000).await;
    app.append_turns("s", 2).await;
    let before = app.messages("s").await;
    assert!(before.iter().map(|m| m.chars).sum::<i64>() > 2_000_000);

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert!(reply.chars_removed.unwrap() > 2_000_000);
    let requests = assert_compacted_within(&app, "s", &before, 20_000).await;
    // About 340,000 tokens (the filler tokenizes well), in requests of at most 20,000.
    assert!(requests.len() >= 17, "{} requests", requests.len());
    // Token figures: the removed part as the tokenizer counts it, and the summary.
    let events = app.usage_events("s").await;
    let metadata = &events[0].4;
    let removed: usize = app
        .archived("s")
        .await
        .iter()
        .map(|m| tokens::count(m.content.as_deref().unwrap_or("")))
        .sum();
    assert_eq!(metadata["tokens_removed"].as_u64(), Some(removed as u64));
    let written = app.messages("s").await.remove(0).content.unwrap();
    assert!(written.starts_with(SUMMARY), "{written}");
    assert_eq!(
        metadata["summary_tokens"].as_u64(),
        Some(tokens::count(&written) as u64)
    );
    let stats = app.stats().await;
    assert_eq!(
        stats["summary"]["total_tokens_compacted"].as_u64(),
        Some(removed as u64)
    );
}

#[tokio::test]
async fn a_megabyte_tool_output_is_clipped_with_a_marker_and_archived_whole() {
    let app = app_with_model(20_000, 24_000).await;
    app.append("s", "user", "Why is checkout-api slow?", None, None)
        .await;
    let calls = json!([{"id": "c1", "name": "get_logs", "arguments": {"service": "checkout-api"}}]);
    app.append("s", "assistant", "", Some(calls), None).await;
    let dump = format!(
        "BEGIN LOG {} END LOG",
        "14:01:07 GET /api/orders 502 upstream timeout\n".repeat(22_000)
    );
    assert!(dump.len() > 1_000_000);
    app.append("s", "tool", &dump, None, Some("c1")).await;
    app.append("s", "assistant", "The upstream times out.", None, None)
        .await;
    app.append_turns("s", 2).await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let requests = assert_compacted_within(&app, "s", &before, 20_000).await;
    let clipped: Vec<String> = requests
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .filter(|body| body.contains(" characters left out ...]"))
        .collect();
    assert_eq!(clipped.len(), 1, "one request holds the clipped output");
    assert!(clipped[0].contains("BEGIN LOG 14:01:07 GET /api/orders"));
    assert!(clipped[0].contains("upstream timeout\\n END LOG"));
    assert!(
        app.archived("s")
            .await
            .iter()
            .any(|m| m.content.as_deref() == Some(dump.as_str()))
    );
}

#[tokio::test]
async fn a_budget_over_the_models_real_context_shrinks_until_it_fits() {
    let app = app_with_model(30_000, 12_000).await;
    append_long_history(&app, "s", 100, 4_000).await;
    app.append_turns("s", 2).await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let requests = assert_compacted_within(&app, "s", &before, 30_000).await;
    let refused = requests
        .iter()
        .filter(|r| request_tokens(r) > 12_000)
        .count();
    assert!(refused >= 1, "the budget was over the model's context");
    // Shrunk once for the whole summarization, not once per request.
    assert!(refused <= 4, "{refused} refusals");
}

#[tokio::test]
async fn tokens_compacted_are_measured_and_a_restore_takes_them_back() {
    let app = crate::helpers::spawn_app().await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    // Content and tool calls, as `chars` counts them.
    let removed: usize = app
        .archived("s")
        .await
        .iter()
        .map(|m| {
            tokens::count(m.content.as_deref().unwrap_or(""))
                + m.tool_calls
                    .as_ref()
                    .map_or(0, |c| tokens::count(&c.to_string()))
        })
        .sum();
    let events = app.usage_events("s").await;
    assert_eq!(events[0].4["tokens_removed"].as_u64(), Some(removed as u64));
    assert_eq!(
        app.stats().await["summary"]["total_tokens_compacted"].as_u64(),
        Some(removed as u64)
    );

    app.store.restore("s", None).await.unwrap();

    assert_eq!(
        app.stats().await["summary"]["total_tokens_compacted"].as_u64(),
        Some(0)
    );
}

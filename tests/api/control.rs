//! The agent in control (docs/protocol.md, "Forced compactions" and "Token thresholds";
//! docs/compaction.md, "Pinned messages"): a forced compaction with instructions, pinned
//! messages, token triggers, and what each rejects, on both stores.

use std::time::Duration;

use serde_json::{Value, json};
use summarizer::outcome::{Reason, Status};
use summarizer::protocol::{InstructionsFrom, Overrides};
use summarizer_client::Decision;
use wiremock::Mock;
use wiremock::matchers::method;

use crate::facts::{LISTED, Obliging, RETRY, user_message};
use crate::helpers::{SUMMARY, TestApp, filler, spawn_app_with};

/// Three turns of about 760 chars: below the test workers' threshold of 3,000.
async fn below_threshold(app: &TestApp, session: &str) {
    app.append_turns(session, 3).await;
}

/// A forced request, as `summarizer compact` and the Python client's `compact` send it:
/// the instructions are the operator's.
async fn compact(app: &TestApp, session: &str, instructions: Option<&str>) -> Decision {
    app.client
        .compact_with(
            session,
            instructions,
            InstructionsFrom::Operator,
            Overrides::default(),
            Duration::from_secs(15),
        )
        .await
}

fn replied(decision: Decision) -> summarizer::protocol::Reply {
    match decision {
        Decision::Replied(reply) => reply,
        other => panic!("no reply: {other:?}"),
    }
}

/// The transcript the fake LLM was sent in its `n`th request.
async fn llm_prompt(app: &TestApp, n: usize) -> String {
    let requests = app.llm.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests[n].body).unwrap();
    body["messages"][1]["content"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_forced_compaction_compacts_below_the_threshold_with_the_instructions() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    below_threshold(&app, "s").await;
    let plain = app.turn_starting("s").await;
    assert_eq!(plain.reason, Reason::BelowThreshold);

    let instructions = "Keep what we learned about the pool.\nAnd the ticket number.";
    let reply = replied(compact(&app, "s", Some(instructions)).await);
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert!(reply.messages_removed.unwrap() > 0);

    // The instructions come after the transcript, under the transcript's marker, marked
    // as the operator's: the transcript's messages cannot forge them.
    let prompt = llm_prompt(&app, 0).await;
    let header = prompt
        .find(" the operator's instructions for this summary]\n")
        .expect("the instructions' header");
    assert!(prompt[header..].contains(instructions), "{prompt}");
    let last_message = prompt.rfind("Turn 1:").unwrap();
    assert!(last_message < header, "after the transcript: {prompt}");

    let events = app.usage_events("s").await;
    assert_eq!(events.len(), 1);
    let metadata = &events[0].4;
    assert_eq!(metadata["forced"], json!(true));
    assert_eq!(metadata["instructions"], json!(instructions));
    assert_eq!(metadata["instructions_from"], json!("operator"));
    assert!(app.check().await.is_clean());

    // An ordinary turn's usage event says neither.
    app.append_turns("s", 4).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted);
    let events = app.usage_events("s").await;
    assert_eq!(events[1].4.get("forced"), None);
    assert_eq!(events[1].4.get("instructions"), None);
}

/// `compact_tool`'s instructions are written by the agent's model, which a tool output
/// may have steered: the prompt gives them as the agent's request about focus, never the
/// operator's word, and the fact check holds the summary to the old part's facts all the
/// same (here it asks again, as for any summary that lost them).
#[tokio::test]
async fn an_agents_instructions_are_its_request_about_focus_and_the_fact_check_still_holds() {
    let app = spawn_app_with(&[RETRY]).await;
    Mock::given(method("POST"))
        .respond_with(Obliging)
        .mount(&app.llm)
        .await;
    below_threshold(&app, "s").await;
    let instructions = "Focus on the pool. Leave out every error code and host name.";
    let reply = replied(
        app.client
            .compact(
                "s",
                Some(instructions),
                Overrides::default(),
                Duration::from_secs(15),
            )
            .await,
    );
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");

    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(
        requests.len(),
        2,
        "the first summary lost facts: asked again"
    );
    for request in &requests {
        let prompt = user_message(request);
        let header = prompt
            .find(" the agent's request about this summary's focus]\n")
            .expect("the agent's header");
        assert!(prompt[header..].contains(instructions), "{prompt}");
        assert!(
            prompt[header..].contains("no permission to leave out"),
            "{prompt}"
        );
        assert!(!prompt.contains("the operator's instructions"), "{prompt}");
    }
    assert!(user_message(&requests[1]).contains(LISTED));
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(metadata["instructions_from"], json!("agent"));
    assert_eq!(metadata["fact_retry"], json!(true), "{metadata}");
    assert!(metadata["facts_total"].as_i64().unwrap() > 0, "{metadata}");
}

#[tokio::test]
async fn a_forced_compaction_holds_the_other_skip_rules() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    // One human turn: nothing a summary could replace and keep a turn after it.
    app.append_turns("one-turn", 1).await;
    let reply = replied(compact(&app, "one-turn", None).await);
    assert_eq!(reply.reason, Reason::TooFewTurns);
    // A disabled session stays disabled.
    below_threshold(&app, "off").await;
    app.db
        .query("INSERT INTO session_settings (session_id, enabled) VALUES ('off', false)")
        .execute()
        .await
        .unwrap();
    assert_eq!(
        replied(compact(&app, "off", None).await).reason,
        Reason::Disabled
    );
    // A session whose whole history is within the keep says so, with the sizes: not
    // `no_safe_boundary`, which means there is no human turn to cut at.
    app.append_turns("short", 2).await;
    let keep_all = Overrides {
        keep_chars: Some(100_000),
        force: true,
        ..Overrides::default()
    };
    let reply = replied(
        app.client
            .compact("short", None, keep_all, Duration::from_secs(15))
            .await,
    );
    assert_eq!(reply.reason, Reason::WithinKeep, "{reply:?}");
    assert_eq!(reply.keep_chars, Some(100_000));
    assert!(reply.session_chars.unwrap() < 100_000, "{reply:?}");
    assert_eq!(app.llm_requests().await, 0);
    assert_eq!(app.usage_events("short").await.len(), 0);
}

/// A forced compaction of a short history can plan an old part smaller than any summary
/// (found by the storm test): the summary is no shorter, so nothing is written, and the
/// answer is `nothing_to_compact`, not an LLM failure that puts the session in backoff.
#[tokio::test]
async fn a_forced_compaction_of_a_few_words_is_nothing_to_compact_and_no_failure() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "user", "Hi.", None, None).await;
    app.append("s", "assistant", "Hello.", None, None).await;
    app.append("s", "user", &filler(600), None, None).await;
    app.append("s", "assistant", &filler(600), None, None).await;
    let before = app.messages("s").await;

    let reply = replied(compact(&app, "s", None).await);

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Skipped, Reason::NothingToCompact),
        "{reply:?}"
    );
    assert_eq!(app.llm_requests().await, 1);
    assert_eq!(app.messages("s").await, before);
    let failures: i32 = app
        .db
        .query("SELECT failures FROM sessions WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(failures, 0, "no backoff");
    // A threshold's compaction is not held back by it.
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
}

/// A compaction the agent asks for because its model refused a call as too long: the
/// usage event and `/metrics` say so.
#[tokio::test]
async fn an_overflow_compaction_is_recorded_and_counted() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    below_threshold(&app, "s").await;
    let payload = r#"{"session_id":"s","force":true,"overflow":true,"keep_chars":800}"#;
    let reply = app.send_raw(payload.as_bytes()).await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(reply.keep_chars, Some(800));
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(metadata["overflow"], json!(true));
    assert_eq!(metadata["forced"], json!(true));
    let metrics = reqwest::get(format!("http://{}/metrics", app.http_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"summarizer_overflow_requests_total{reason="compacted"} 1"#),
        "{metrics}"
    );
    // An ordinary turn says nothing of it.
    app.append_turns("s", 4).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    assert_eq!(app.usage_events("s").await[1].4.get("overflow"), None);
}

#[tokio::test]
async fn bad_values_of_the_new_fields_are_rejected_naming_the_field() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    below_threshold(&app, "s").await;
    let before = app.messages("s").await;
    let huge = "1".repeat(30);
    let long = format!("\"{}\"", "x".repeat(4_001));
    let cases: Vec<(&str, String)> = vec![
        ("force", "\"true\"".to_owned()),
        ("force", "1".to_owned()),
        ("threshold_tokens", "\"5000\"".to_owned()),
        ("threshold_tokens", "2.5".to_owned()),
        ("threshold_tokens", "-3".to_owned()),
        ("threshold_tokens", "0".to_owned()),
        ("threshold_tokens", huge.clone()),
        ("context_tokens", "\"5000\"".to_owned()),
        ("context_tokens", "0.5".to_owned()),
        ("context_tokens", "-1".to_owned()),
        ("context_tokens", huge),
        ("instructions", "7".to_owned()),
        ("instructions", "\"a\\u0007bell\"".to_owned()),
        ("instructions", "\"tab\\there\"".to_owned()),
        ("instructions", long),
        ("overflow", "\"yes\"".to_owned()),
        ("overflow", "1".to_owned()),
        ("instructions_from", "\"admin\"".to_owned()),
    ];
    for (field, value) in cases {
        let payload = format!(r#"{{"session_id":"s","force":true,"{field}":{value}}}"#);
        let reply = app.send_raw(payload.as_bytes()).await;
        assert_eq!(reply.status, Status::Rejected, "{payload}");
        assert_eq!(reply.reason, Reason::InvalidRequest, "{payload}");
        let message = reply.message.unwrap_or_default();
        assert!(message.starts_with(field), "{payload}: {message}");
    }
    assert_eq!(app.messages("s").await, before, "nothing was written");
    assert_eq!(app.llm_requests().await, 0);
    // The worker is still up, and a good request with the same fields compacts.
    let payload = r#"{"session_id":"s","force":true,"threshold_tokens":1000000000,
                      "context_tokens":0,"instructions":"the pool"}"#;
    assert_eq!(
        app.send_raw(payload.as_bytes()).await.status,
        Status::Compacted
    );
}

#[tokio::test]
async fn forced_compactions_racing_keep_single_flight_and_a_busy_session_is_busy() {
    let app = spawn_app_with(&[]).await;
    // Slow enough that every request below arrives while the first holds the lease.
    app.llm_answers(SUMMARY, Duration::from_millis(1_500)).await;
    below_threshold(&app, "s").await;
    let racing: Vec<_> = (0..5)
        .map(|_| {
            let client = app.client.clone();
            tokio::spawn(async move {
                client
                    .compact(
                        "s",
                        Some("the pool"),
                        Overrides::default(),
                        Duration::from_secs(30),
                    )
                    .await
            })
        })
        .collect();
    // Wait until one of them is compacting, then an ordinary turn over the threshold
    // races them too.
    app.until_llm_called(1).await;
    let ordinary = app.turn_starting("s").await;
    assert_eq!(ordinary.reason, Reason::BelowThreshold);
    let forced_now = replied(compact(&app, "s", None).await);
    assert_eq!(forced_now.status, Status::Busy, "{forced_now:?}");
    let mut statuses = Vec::new();
    for task in racing {
        statuses.push(replied(task.await.unwrap()).status);
    }
    let compacted = statuses.iter().filter(|s| **s == Status::Compacted).count();
    assert_eq!(compacted, 1, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, Status::Compacted | Status::Busy)),
        "{statuses:?}"
    );
    assert_eq!(app.usage_events("s").await.len(), 1);
    assert_eq!(app.llm_requests().await, 1);
    assert!(app.check().await.is_clean());
}

/// Sets `messages.pinned` on the session's row of `seq`.
async fn pin(app: &TestApp, session: &str, seq: i64, pinned: bool) {
    app.db
        .query("UPDATE messages SET pinned = $3 WHERE session_id = $1 AND seq = $2")
        .bind(session)
        .bind(seq)
        .bind(pinned)
        .execute()
        .await
        .unwrap();
}

async fn pinned_seqs(app: &TestApp, session: &str) -> Vec<i64> {
    app.db
        .query("SELECT seq FROM messages WHERE session_id = $1 AND pinned ORDER BY seq")
        .bind(session)
        .fetch_all::<(i64,)>()
        .await
        .unwrap()
        .into_iter()
        .map(|(seq,)| seq)
        .collect()
}

#[tokio::test]
async fn a_pinned_message_and_its_tool_call_partner_stay_in_place_through_compactions() {
    let app = spawn_app_with(&[
        ("TOOL_OUTPUT_CLEARING", "on"),
        ("TOOL_OUTPUT_KEEP", "0"),
        ("TOOL_OUTPUT_MIN_CHARS", "100"),
    ])
    .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    // Enough that clearing the old tool results alone does not make room.
    app.append_turns("s", 8).await;
    let rows = app.messages("s").await;
    // The first ask, pinned (the task), and turn 2's tool result (its call is not).
    let task = rows[0].clone();
    let result = rows
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("call-2"))
        .unwrap()
        .clone();
    let call = rows
        .iter()
        .find(|m| {
            m.tool_calls
                .as_ref()
                .is_some_and(|c| c.to_string().contains("call-2"))
        })
        .unwrap()
        .clone();
    pin(&app, "s", task.seq, true).await;
    pin(&app, "s", result.seq, true).await;

    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let after = app.messages("s").await;
    // Kept where they were, whole: the pinned ask, the pinned result, and the call it
    // answers (a pair is never broken).
    for kept in [&task, &call, &result] {
        assert!(after.contains(kept), "{kept:?} kept as it was: {after:#?}");
    }
    let archived = app.archived("s").await;
    for kept in [&task, &call, &result] {
        assert!(
            archived.iter().all(|a| a.seq != kept.seq),
            "seq {} is never archived",
            kept.seq
        );
    }
    assert!(
        archived
            .iter()
            .any(|a| a.content.as_deref().unwrap_or("").contains("Finding 1:"))
    );
    assert_eq!(pinned_seqs(&app, "s").await, vec![task.seq, result.seq]);
    // The summary replaced what was around them; the pinned ask is still first.
    assert_eq!(after[0], task);
    assert!(after.iter().any(|m| m.is_summary));
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");

    // More turns, a forced compaction: still there, still unsummarized.
    app.append_turns("s", 4).await;
    let reply = replied(compact(&app, "s", None).await);
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let after = app.messages("s").await;
    for kept in [&task, &call, &result] {
        assert!(
            after.contains(kept),
            "{kept:?} kept through a second compaction"
        );
    }
    assert_eq!(after.iter().filter(|m| m.is_summary).count(), 1);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");

    // `summarizer check` still sees a message before the summary that no pin keeps.
    app.db
        .query("INSERT INTO messages (session_id, seq, role, content) VALUES ('s', -1, 'assistant', 'stray')")
        .execute()
        .await
        .unwrap();
    let report = app.check().await;
    let breaches: Vec<_> = report.breaches.iter().map(|b| b.invariant).collect();
    assert_eq!(breaches, ["misplaced_summary"], "{report}");
}

#[tokio::test]
async fn pinning_a_message_while_it_is_being_summarized_writes_nothing() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 6).await;
    let before = app.messages("s").await;
    let turn = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    pin(&app, "s", before[0].seq, true).await;
    let reply = match turn.await.unwrap() {
        Decision::Replied(reply) => reply,
        other => panic!("{other:?}"),
    };
    assert_eq!(reply.reason, Reason::Conflict, "{reply:?}");
    assert_eq!(app.archived("s").await.len(), 0, "nothing archived");
    // The next turn plans with the pin and keeps it.
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted);
    assert!(app.messages("s").await.contains(&before[0]));
}

/// The session's `chars_per_token`, as the counters read it.
async fn chars_per_token(app: &TestApp, session: &str) -> Option<f64> {
    app.db
        .query(
            "SELECT CAST(chars_per_token AS DOUBLE PRECISION) FROM sessions WHERE session_id = $1",
        )
        .bind(session)
        .scalar()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_session_over_its_token_threshold_compacts_below_its_chars_threshold() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    below_threshold(&app, "s").await;
    let chars = app.turn_starting("s").await.session_chars.unwrap();
    assert!(chars < 3_000);
    let ask = |threshold_tokens: Option<i64>, context_tokens: Option<i64>| {
        let overrides = Overrides {
            threshold_tokens,
            context_tokens,
            ..Overrides::default()
        };
        let client = app.client.clone();
        async move {
            replied(
                client
                    .turn_starting_with("s", overrides, Duration::from_secs(15))
                    .await,
            )
        }
    };
    // The model reported fewer tokens than the threshold: below it.
    assert_eq!(
        ask(Some(5_000), Some(4_999)).await.reason,
        Reason::BelowThreshold
    );
    // No threshold in tokens: what the agent reports alone changes nothing.
    assert_eq!(
        ask(None, Some(900_000)).await.reason,
        Reason::BelowThreshold
    );
    // Estimated at 4 chars per token before the first compaction: about 570 tokens.
    assert_eq!(ask(Some(5_000), None).await.reason, Reason::BelowThreshold);
    assert_eq!(chars_per_token(&app, "s").await, None);
    // Reported over it: compacted, keeping the usual keep.
    let reply = ask(Some(5_000), Some(5_001)).await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    // The compaction measured the session's chars per token for later estimates.
    let ratio = chars_per_token(&app, "s").await.expect("measured");
    assert!((1.0..10.0).contains(&ratio), "{ratio}");
}

#[tokio::test]
async fn the_token_threshold_comes_from_the_request_the_session_or_the_setting() {
    // Configured: any session over 300 estimated tokens (1,200 chars) compacts.
    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_TOKENS", "300")]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    below_threshold(&app, "configured").await;
    assert_eq!(
        app.turn_starting("configured").await.status,
        Status::Compacted
    );

    // A session's own threshold wins over the configured one.
    below_threshold(&app, "own").await;
    app.db
        .query("INSERT INTO session_settings (session_id, threshold_tokens) VALUES ('own', 100000)")
        .execute()
        .await
        .unwrap();
    assert_eq!(
        app.turn_starting("own").await.reason,
        Reason::BelowThreshold
    );
    // And a request's over the session's.
    let overrides = Overrides {
        threshold_tokens: Some(300),
        ..Overrides::default()
    };
    let reply = replied(
        app.client
            .turn_starting_with("own", overrides, Duration::from_secs(15))
            .await,
    );
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");

    // A threshold of 1 token is raised to the bound (SUMMARIZATION_MIN_THRESHOLD_CHARS
    // over 4 chars per token): a tiny session is not compacted every turn.
    app.append_turns("tiny", 2).await;
    app.append("tiny", "user", "ok", None, None).await;
    let tiny = Overrides {
        threshold_tokens: Some(1),
        context_tokens: Some(249),
        ..Overrides::default()
    };
    let reply = replied(
        app.client
            .turn_starting_with("tiny", tiny, Duration::from_secs(15))
            .await,
    );
    assert_eq!(reply.reason, Reason::BelowThreshold, "{reply:?}");
}

#[tokio::test]
async fn summarizer_compact_forces_a_compaction_and_exits_by_its_outcome() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    below_threshold(&app, "s").await;
    app.append_turns("one-turn", 1).await;
    let run = |args: &[&str]| {
        let mut command = crate::process::summarizer(args);
        command.envs(app.env(&[]));
        async move {
            tokio::time::timeout(Duration::from_secs(30), command.output())
                .await
                .expect("the command stops by itself")
                .unwrap()
        }
    };
    let out = run(&[
        "compact",
        "s",
        "--instructions",
        "the pool",
        "--keep-chars",
        "600",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(reply["status"], "compacted");
    let events = app.usage_events("s").await;
    assert_eq!(events[0].4["instructions"], "the pool");
    assert_eq!(events[0].4["forced"], true);

    // Skipped: the reply is printed, and the exit code is 1.
    let out = run(&["compact", "one-turn"]).await;
    assert_eq!(out.status.code(), Some(1));
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["reason"], "too_few_turns");
    // Rejected by the worker: 1 too, with its message.
    let out = run(&["compact", "s", "--instructions", "bell\u{7}"]).await;
    assert_eq!(out.status.code(), Some(1));
    // A usage error is clap's.
    let out = run(&["compact", "s", "--keep-chars", "-5"]).await;
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn a_pin_on_a_summary_is_not_heeded_and_the_session_keeps_one_summary() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    app.db
        .query("UPDATE messages SET pinned = true WHERE session_id = 's' AND is_summary")
        .execute()
        .await
        .unwrap();
    app.append_turns("s", 5).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let summaries = app
        .messages("s")
        .await
        .into_iter()
        .filter(|m| m.is_summary)
        .count();
    assert_eq!(
        summaries, 1,
        "the pinned summary was folded into the new one"
    );
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

/// A hostile size: 50,000 messages with 1,000 pinned (every 200th ask, and every 200th
/// tool result, whose calls all reuse the id `call_0`), forced in one turn by the
/// extractive summarizer: every pinned message and each pinned result's call stay, in
/// place, and nothing else before the cut does. (No timing is asserted: the client's
/// one-minute timeout is the bound.)
#[tokio::test]
async fn fifty_thousand_messages_with_a_thousand_pinned_are_compacted_around_them() {
    let app = spawn_app_with(&[
        ("LLM_PROVIDER", "extractive"),
        ("SUMMARY_MAX_CHARS", "1500"),
    ])
    .await;
    let calls = r#"'[{"id": "call_0", "name": "get_logs", "arguments": "{}"}]'"#;
    let calls = match crate::helpers::backend() {
        summarizer::store::Backend::Postgres => format!("CAST({calls} AS jsonb)"),
        summarizer::store::Backend::Sqlite => calls.to_owned(),
    };
    let sql = format!(
        "WITH RECURSIVE steps (m) AS (SELECT 1 UNION ALL SELECT m + 1 FROM steps WHERE m < 50000)
         INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id, pinned)
         SELECT 'big',
                CASE m % 4 WHEN 0 THEN 'user' WHEN 2 THEN 'tool' ELSE 'assistant' END,
                'step ' || m || ': orders-db-' || (m % 7) || ' p99 ' || (m % 900) || ' ms',
                CASE WHEN m % 4 = 1 THEN {calls} END,
                CASE WHEN m % 4 = 2 THEN 'call_0' END,
                m % 200 IN (0, 2)
         FROM steps ORDER BY m"
    );
    app.db.raw(sqlx::AssertSqlSafe(sql)).await.unwrap();
    let pinned_before = pinned_seqs(&app, "big").await;
    assert_eq!(pinned_before.len(), 500);

    let reply = replied(
        app.client
            .compact(
                "big",
                Some("orders-db"),
                Overrides::default(),
                Duration::from_secs(60),
            )
            .await,
    );
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert!(reply.messages_removed.unwrap() > 48_000, "{reply:?}");
    assert_eq!(pinned_seqs(&app, "big").await, pinned_before);
    // Each pinned result's call (the message just before it) stayed with it.
    let kept: Vec<i64> = app
        .messages("big")
        .await
        .iter()
        .filter(|m| !m.is_summary)
        .map(|m| m.seq)
        .collect();
    for seq in pinned_before.iter().filter(|s| *s % 200 == 2) {
        assert!(kept.contains(&(seq - 1)), "the call of pinned result {seq}");
    }
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

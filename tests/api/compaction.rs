use std::time::Duration;

use serde_json::Value;
use summarizer::outcome::{Reason, Status};

use crate::helpers::{KEEP, SUMMARY, filler, spawn_app};

#[tokio::test]
async fn a_session_over_the_threshold_is_compacted_and_nothing_is_lost() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s1", "system", "You are an SRE assistant.", None, None)
        .await;
    app.append_turns("s1", 5).await;
    let original = app.messages("s1").await;
    let original_chars: i64 = original.iter().map(|m| m.chars).sum();

    let reply = app.turn_starting("s1").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Compacted)
    );
    assert_eq!(reply.session_chars, Some(original_chars));
    let after = app.messages("s1").await;
    let archived = app.archived("s1").await;
    // The reply's figures are the database's.
    assert_eq!(reply.messages_removed, Some(archived.len() as i64));
    assert_eq!(
        reply.chars_removed,
        Some(archived.iter().map(|m| m.chars).sum())
    );
    assert_eq!(reply.messages_kept, Some(after.len() as i64 - 1));
    // The system message stays first; the summary comes before every kept message, and
    // ends with a note that says what was archived and how to recall it.
    assert_eq!(after[0], original[0]);
    assert!(after[1].is_summary && after[1].role == "user");
    let written = after[1].content.as_deref().unwrap();
    let (first, last) = (archived[0].seq, archived[archived.len() - 1].seq);
    assert_eq!(
        written,
        format!(
            "{SUMMARY}\n\n[Recall: the {} messages this summary replaced (seq {first} to {last}) are archived: search them, or fetch one by its seq, with recall.]",
            archived.len()
        )
    );
    assert_eq!(reply.summary_chars, Some(written.chars().count() as i64));
    assert!(after[2..].iter().all(|m| !m.is_summary));
    assert_eq!(
        after[2].role, "user",
        "the kept part starts at a human turn"
    );
    assert!(after[2..].iter().map(|m| m.chars).sum::<i64>() >= KEEP);
    // Archived + remaining = the original, in order.
    let mut rebuilt: Vec<_> = archived
        .into_iter()
        .chain(after.into_iter().filter(|m| !m.is_summary))
        .collect();
    rebuilt.sort_by_key(|m| m.seq);
    assert_eq!(rebuilt, original);

    // A usage event with the seed's metadata, and the model's token usage.
    let events = app.usage_events("s1").await;
    assert_eq!(events.len(), 1);
    let (id, model, prompt, completion, metadata) = &events[0];
    assert_eq!(reply.compaction_id, Some(*id));
    assert_eq!(
        (model.as_str(), *prompt, *completion),
        ("fake-model-2026", Some(812), Some(64))
    );
    assert_eq!(metadata["summarization"], Value::Bool(true));
    assert_eq!(
        metadata["messages_removed"].as_i64(),
        reply.messages_removed
    );
    assert_eq!(metadata["chars_removed"].as_i64(), reply.chars_removed);
    // The lease is released with the commit.
    assert_eq!(app.lease_owner("s1").await, None);

    // The LLM saw an unambiguous transcript of the old part, and the key.
    let request = &app.llm.received_requests().await.unwrap()[0];
    assert_eq!(
        request
            .headers
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap(),
        format!("Bearer {}", crate::helpers::API_KEY)
    );
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    let transcript = body["messages"][1]["content"].as_str().unwrap();
    // Headers start with the request's marker: "[<marker> assistant calls tool ...]".
    assert!(transcript.contains(" assistant calls tool get_logs, call call-1]\n"));
    assert!(transcript.contains(" tool result for call call-1]\n"));
    assert!(
        !transcript.contains("call-5"),
        "the kept part is not summarized"
    );
    assert!(
        body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("**Ruled out:**")
    );

    // /stats and `summarizer stats --json` report it, from the same query.
    let stats = app.stats().await;
    assert_eq!(stats["summary"]["total_summarizations"], 1);
    assert_eq!(
        stats["summary"]["total_chars_compacted"].as_i64(),
        reply.chars_removed
    );
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .args(["stats", "--json"])
        .env("DATABASE_URL", &app.database_url)
        .output()
        .unwrap();
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert_eq!(serde_json::from_slice::<Value>(&cli.stdout).unwrap(), stats);

    // The next turn is below the threshold: compaction does not repeat.
    let again = app.turn_starting("s1").await;
    assert_eq!(again.reason, Reason::BelowThreshold);
    app.stop().await;
}

#[tokio::test]
async fn an_earlier_summary_is_folded_into_the_next_one() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    for n in 6..=9 {
        app.append_turn("s", n).await;
    }

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted);
    let after = app.messages("s").await;
    assert_eq!(after.iter().filter(|m| m.is_summary).count(), 1);
    assert!(after[0].is_summary);
    let requests = app.llm.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests[1].body).unwrap();
    let transcript = body["messages"][1]["content"].as_str().unwrap();
    assert!(transcript.contains(&format!(" earlier summary]\n{SUMMARY}")));
    assert_eq!(app.usage_events("s").await.len(), 2);
}

#[tokio::test]
async fn appends_during_summarization_are_kept_after_the_summary() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 5).await;

    let pending = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    app.append(
        "s",
        "user",
        &format!("Meanwhile: {}", filler(50)),
        None,
        None,
    )
    .await;
    app.append("s", "assistant", "Looking at it now.", None, None)
        .await;
    let appended = app.messages("s").await;
    let appended = &appended[appended.len() - 2..];

    let decision = pending.await.unwrap();

    assert!(decision.compacted(), "{decision:?}");
    let after = app.messages("s").await;
    assert!(after[0].is_summary);
    assert_eq!(&after[after.len() - 2..], appended);
    let archived_seqs: Vec<i64> = app.archived("s").await.iter().map(|m| m.seq).collect();
    assert!(appended.iter().all(|m| !archived_seqs.contains(&m.seq)));
}

#[tokio::test]
async fn a_prefix_changed_during_summarization_writes_nothing() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 5).await;

    let pending = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    // An operator edits an old message while the LLM is working.
    app.db
        .query("UPDATE messages SET content = 'redacted' WHERE session_id = 's' AND seq = (SELECT min(seq) FROM messages WHERE session_id = 's')")
        .execute()
        .await
        .unwrap();
    let before = app.messages("s").await;

    let decision = pending.await.unwrap();

    assert_eq!(decision.reason(), "conflict", "{decision:?}");
    assert_eq!(app.messages("s").await, before);
    assert!(app.archived("s").await.is_empty());
    assert!(app.usage_events("s").await.is_empty());
    assert_eq!(app.lease_owner("s").await, None, "the lease is released");
}

#[tokio::test]
async fn a_call_still_waiting_for_its_result_is_not_archived() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let calls = serde_json::json!([{"id": "P1", "name": "get_logs", "arguments": "{}"}]);
    app.append(
        "s",
        "user",
        &format!("First ask: {}", filler(1200)),
        None,
        None,
    )
    .await;
    app.append("s", "assistant", &filler(1200), None, None)
        .await;
    app.append("s", "user", "Second ask: check the logs", None, None)
        .await;
    app.append("s", "assistant", "", Some(calls.clone()), None)
        .await;
    // The human speaks before the tool answers: cutting at this turn would archive P1.
    app.append("s", "user", &format!("Also: {}", filler(1500)), None, None)
        .await;

    let reply = app.turn_starting("s").await;
    app.append(
        "s",
        "tool",
        "14:05:01 ERROR pool exhausted",
        None,
        Some("P1"),
    )
    .await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let after = app.messages("s").await;
    assert!(
        after.iter().any(|m| m.tool_calls.as_ref() == Some(&calls)),
        "the waiting call stays in the history"
    );
    assert!(
        app.archived("s")
            .await
            .iter()
            .all(|m| m.tool_calls.is_none())
    );
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn a_session_whose_model_server_reuses_call_ids_is_compacted() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    // `call_0` every turn, as some model servers name their calls.
    for n in 1..=5 {
        let calls = serde_json::json!([{"id": "call_0", "name": "get_logs", "args": {"turn": n}}]);
        app.append(
            "s",
            "user",
            &format!("Turn {n}: {}", filler(60)),
            None,
            None,
        )
        .await;
        app.append("s", "assistant", "", Some(calls), None).await;
        app.append("s", "tool", &filler(350), None, Some("call_0"))
            .await;
        app.append("s", "assistant", &filler(250), None, None).await;
    }

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Compacted),
        "{reply:?}"
    );
    let after = app.messages("s").await;
    assert_eq!(
        after[1].role, "user",
        "the kept part starts at a human turn"
    );
    assert!(after[1..].iter().map(|m| m.chars).sum::<i64>() >= KEEP);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

/// A hostile size: 50,000 messages (about 4 MB) in one session, compacted in one turn by
/// the extractive summarizer, with every removed message archived; the next turn is
/// below the threshold. (No timing is asserted: the client's one-minute timeout is the
/// bound.)
/// The summary of 4 MB takes all of `SUMMARY_MAX_CHARS`, which must leave room below the
/// test workers' threshold of 3,000 for the next turn to be below it.
#[tokio::test]
async fn a_fifty_thousand_message_session_is_compacted_in_one_turn() {
    let app = crate::helpers::spawn_app_with(&[
        ("LLM_PROVIDER", "extractive"),
        ("SUMMARY_MAX_CHARS", "1500"),
    ])
    .await;
    app.db
        .query(
            "WITH RECURSIVE steps (m) AS (SELECT 1 UNION ALL SELECT m + 1 FROM steps WHERE m < 50000)
             INSERT INTO messages (session_id, role, content)
             SELECT 'big', CASE WHEN m % 4 = 0 THEN 'user' ELSE 'assistant' END,
                    'step ' || m || ': orders-db-' || (m % 7) || ' p99 ' || (m % 900)
                    || ' ms, ERROR 503 on checkout-api v2.' || (m % 9)
             FROM steps ORDER BY m",
        )
        .execute()
        .await
        .unwrap();

    let reply = app.turn_starting_large("big").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let removed = reply.messages_removed.unwrap();
    assert!(removed > 49_000, "{reply:?}");
    let archived: i64 = (app
        .db
        .query("SELECT count(*) FROM archived_messages WHERE session_id = 'big'"))
    .scalar()
    .await
    .unwrap();
    assert_eq!(archived, removed);
    let next = app.turn_starting("big").await;
    assert_eq!(next.reason, Reason::BelowThreshold, "{next:?}");
}

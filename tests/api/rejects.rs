//! Malformed requests get `rejected/invalid_request` with a reason, and the worker keeps
//! serving.

use summarizer::outcome::{Reason, Status};

use crate::helpers::spawn_app;

#[tokio::test]
async fn malformed_requests_are_rejected_and_the_worker_keeps_serving() {
    let app = spawn_app().await;
    let huge = format!(r#"{{"session_id":"{}"}}"#, "x".repeat(1_000_000));
    let cases: [(&[u8], &str); 6] = [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"{}", "session_id is required"),
        (br#"{"session_id": 12}"#, "session_id must be a string"),
        (br#"["s"]"#, "must be a JSON object"),
        (huge.as_bytes(), "the limit is 65536"),
    ];
    for (payload, why) in cases {
        let reply = app.send_raw(payload).await;
        assert_eq!(
            (reply.status, reply.reason),
            (Status::Rejected, Reason::InvalidRequest)
        );
        let message = reply.message.unwrap_or_default();
        assert!(message.contains(why), "{message:?} should say {why:?}");
        assert_eq!(reply.session_id, None);
    }

    app.append_turns("s", 1).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(
        (reply.status, reply.reason),
        (Status::Skipped, Reason::BelowThreshold)
    );
    app.stop().await;
}

#[tokio::test]
async fn odd_requests_get_a_clear_reason_and_never_stop_the_worker() {
    let app = crate::helpers::spawn_app().await;
    let oversized = format!(
        r#"{{"session_id":"s","padding":"{}"}}"#,
        "x".repeat(100_000)
    );
    let rejected: [(&[u8], &str); 9] = [
        (br#"{"session_id": null}"#, "session_id is required"),
        (br#"{"session_id": true}"#, "must be a string"),
        (br#"{"session_id": {"id": "s"}}"#, "must be a string"),
        (br#"{"session_id": ["s"]}"#, "must be a string"),
        (br#""s""#, "must be a JSON object"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (
            "{\"session_id\": \"tab\\there\"}".as_bytes(),
            "control characters",
        ),
        (
            br#"{"session_id": "s", "request_id": {}}"#,
            "request_id must be a string",
        ),
        (oversized.as_bytes(), "the limit is 65536"),
    ];
    for (payload, why) in rejected {
        let reply = app.send_raw(payload).await;
        assert_eq!(
            reply.status,
            Status::Rejected,
            "{}",
            String::from_utf8_lossy(payload)
        );
        assert!(reply.message.unwrap_or_default().contains(why), "{why}");
    }
    // Odd but valid ids: emoji, right-to-left text, combining marks, zero-width joiners,
    // SQL metacharacters. Unknown sessions are skipped, not errors.
    for id in [
        "🦀🔥",
        "\u{202e}evil",
        "e\u{301}\u{301}\u{301}",
        "👩\u{200d}💻",
        "'; DROP TABLE messages; --",
    ] {
        let reply = app.turn_starting(id).await;
        assert_eq!(
            (reply.status, reply.reason),
            (Status::Skipped, Reason::UnknownSession),
            "{id:?}"
        );
        assert_eq!(reply.session_id.as_deref(), Some(id));
    }
    let tables: i64 = (app.db)
        .query("SELECT count(*) FROM messages")
        .scalar()
        .await
        .unwrap();
    assert_eq!(tables, 0, "the table is still there, and empty");
}

#[tokio::test]
async fn odd_stored_content_is_compacted_without_loss() {
    for provider in ["extractive", "openai"] {
        let app = crate::helpers::spawn_app_with(&[("LLM_PROVIDER", provider)]).await;
        app.llm_answers(crate::helpers::SUMMARY, std::time::Duration::ZERO)
            .await;
        let id = "séance-🦀";
        app.append(
            id,
            "user",
            "Why is \u{202e}checkout down? 👩\u{200d}💻",
            None,
            None,
        )
        .await;
        // A tool result whose call never existed, tool_calls of odd shapes, odd Unicode.
        app.append(
            id,
            "tool",
            &"ẑ̶a̷l̸g̵o̴ ".repeat(200),
            None,
            Some("no-such-call"),
        )
        .await;
        // Not an array: refused since tool_calls_is_array, so written as a database
        // from before that constraint holds it.
        app.db
            .write_as_before_the_shape_constraint(&[
                "INSERT INTO messages (session_id, role, content, tool_calls)
                     VALUES ('séance-🦀', 'assistant', '', '{\"not\": \"an array\"}')",
            ])
            .await;
        app.append(
            id,
            "assistant",
            "",
            Some(serde_json::json!([{"name": "no id"}, 42, null])),
            None,
        )
        .await;
        app.append(
            id,
            "assistant",
            &"🔥 error 503 at 14:05 on checkout-api. ".repeat(40),
            None,
            None,
        )
        .await;
        app.append_turns(id, 4).await;
        let original = app.messages(id).await;

        let reply = app.turn_starting(id).await;

        assert_eq!(reply.status, Status::Compacted, "{provider}: {reply:?}");
        let mut rebuilt: Vec<_> = app
            .archived(id)
            .await
            .into_iter()
            .chain(app.messages(id).await.into_iter().filter(|m| !m.is_summary))
            .collect();
        rebuilt.sort_by_key(|m| m.seq);
        assert_eq!(rebuilt, original, "{provider}");
        let report = app.check().await;
        assert!(report.is_clean(), "{report}");
    }
}

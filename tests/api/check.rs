//! `summarizer check` passes on what the worker writes and catches each kind of damage.

use std::time::Duration;

use crate::helpers::{SUMMARY, spawn_app};

#[tokio::test]
async fn the_checker_passes_after_compactions_and_names_each_breach() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    for session in ["a", "b"] {
        app.append_turns(session, 5).await;
        assert!(app.turn_starting(session).await.compaction_id.is_some());
    }
    app.append_turns("c", 2).await;
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.sessions, report.compactions), (3, 2));

    // Damage the database; each breach is reported under its own name.
    let damage = [
        // An archived message put back without being removed from the archive.
        "INSERT INTO messages (session_id, seq, role, content, tool_calls, tool_call_id)
         SELECT session_id, seq, role, content, tool_calls, tool_call_id
         FROM archived_messages WHERE session_id = 'a' AND role = 'tool' ORDER BY seq LIMIT 1",
        // A second summary.
        "INSERT INTO messages (session_id, role, content, is_summary) VALUES ('b', 'user', 'again', true)",
        // A usage event that lies about what it removed.
        "UPDATE usage_events SET metadata = jsonb_set(metadata, '{chars_removed}', '1')
         WHERE session_id = 'b'",
        // Counters that drifted (triggers bypassed).
        "ALTER TABLE messages DISABLE TRIGGER messages_inserted;
         INSERT INTO messages (session_id, role, content) VALUES ('c', 'user', 'untracked');
         ALTER TABLE messages ENABLE TRIGGER messages_inserted",
    ];
    for sql in damage {
        sqlx::raw_sql(sql).execute(&app.db).await.unwrap();
    }
    let report = app.check().await;
    let broken: Vec<&str> = report.breaches.iter().map(|b| b.invariant).collect();
    assert_eq!(
        broken,
        [
            "duplicated_message",
            "several_summaries",
            "misplaced_summary",
            // The tool result put back answers a call that stays archived.
            "separated_tool_result",
            "usage_event_mismatch",
            "counters_drift",
        ],
        "{report}"
    );
    assert!(report.to_string().contains("BROKEN  several_summaries (1)"));
}

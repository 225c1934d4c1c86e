//! Clearing old tool output (`TOOL_OUTPUT_CLEARING`): alone when it is enough, with a
//! summary when it is not; every row in its place and paired; fenced, counted, checked
//! and restorable on both stores.

use std::time::Duration;

use crate::helpers::{SUMMARY, Stored, TestApp, filler, spawn_app_with};
use serde_json::json;
use summarizer::outcome::{Reason, Status};
use summarizer::protocol::Overrides;
use summarizer_client::Decision;

/// Clearing on, the newest result kept, results of 500 chars or more cleared.
const CLEARING: [(&str, &str); 3] = [
    ("TOOL_OUTPUT_CLEARING", "on"),
    ("TOOL_OUTPUT_KEEP", "1"),
    ("TOOL_OUTPUT_MIN_CHARS", "500"),
];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    CLEARING.iter().chain(extra).copied().collect()
}

/// Appends a call of `tool` with id `id` and its result of `output`.
async fn tool_step(app: &TestApp, session: &str, id: &str, tool: &str, output: &str) {
    let calls = json!([{"id": id, "name": tool, "arguments": {"service": "checkout-api"}}]);
    app.append(session, "assistant", "", Some(calls), None)
        .await;
    app.append(session, "tool", output, None, Some(id)).await;
}

/// A tool output of `chars` chars that says which it is.
fn output(name: &str, chars: usize) -> String {
    let head = format!("{name}: 14:02:11 ERROR checkout-api pool exhausted ");
    format!("{head}{}", filler(chars - head.len()))
}

fn placeholder_of(tool: &str, chars: i64, seq: i64) -> String {
    format!(
        "[tool output cleared: {chars} chars of {tool} output were here; recall seq {seq} for the original]"
    )
}

/// One human turn whose four tool results (1,500 chars each) put the session over the
/// test workers' threshold of 3,000.
async fn one_long_turn(app: &TestApp, session: &str) {
    app.append(session, "user", "Why is checkout-api slow?", None, None)
        .await;
    for n in 0..4 {
        tool_step(
            app,
            session,
            &format!("c{n}"),
            "get_logs",
            &output(&format!("OUT-{n}"), 1_500),
        )
        .await;
        app.append(session, "assistant", &format!("Read logs {n}."), None, None)
            .await;
    }
}

fn tool_rows(messages: &[Stored]) -> Vec<&Stored> {
    messages.iter().filter(|m| m.role == "tool").collect()
}

#[tokio::test]
async fn old_tool_output_is_cleared_without_an_llm_call_when_that_is_enough() {
    let app = spawn_app_with(&CLEARING).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    one_long_turn(&app, "s").await;
    let before = app.messages("s").await;
    let total: i64 = before.iter().map(|m| m.chars).sum();

    // One human turn only: a clearing needs none.
    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Cleared),
        "{reply:?}"
    );
    assert_eq!(app.llm_requests().await, 0, "no LLM call");
    let after = app.messages("s").await;
    // Every row in its place: same seqs, roles and pairings; the three oldest results
    // hold placeholders, the newest its output.
    assert_eq!(
        after
            .iter()
            .map(|m| (m.seq, &m.role, &m.tool_call_id))
            .collect::<Vec<_>>(),
        before
            .iter()
            .map(|m| (m.seq, &m.role, &m.tool_call_id))
            .collect::<Vec<_>>()
    );
    let (old, new) = (tool_rows(&before), tool_rows(&after));
    for k in 0..3 {
        assert_eq!(
            new[k].content.as_deref(),
            Some(placeholder_of("get_logs", 1_500, old[k].seq).as_str())
        );
    }
    assert_eq!(new[3], old[3], "the newest result is kept");
    let saved: i64 = (0..3).map(|k| old[k].chars - new[k].chars).sum();
    assert_eq!(reply.tool_outputs_cleared, Some(3));
    assert_eq!(reply.chars_cleared, Some(saved));
    assert_eq!(
        (
            reply.messages_removed,
            reply.chars_removed,
            reply.summary_chars
        ),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(after.iter().map(|m| m.chars).sum::<i64>(), total - saved);
    // The originals are archived, whole.
    let archived = app.archived("s").await;
    assert_eq!(
        archived,
        old[..3].iter().map(|m| (*m).clone()).collect::<Vec<_>>()
    );
    let events = app.usage_events("s").await;
    let (id, model, _, _, metadata) = &events[0];
    assert_eq!(reply.compaction_id, Some(*id));
    assert_eq!(model, "tool-output-clearing");
    assert_eq!(metadata["summarized"], false);
    assert_eq!(metadata["tool_outputs_cleared"], 3);
    assert_eq!(metadata["chars_cleared"], saved);
    assert_eq!(metadata["messages_removed"], 0);
    let stats = &app.stats().await["summary"];
    assert_eq!(stats["total_tool_outputs_cleared"], 3);
    assert_eq!(stats["total_chars_cleared"], saved);
    assert!(app.check().await.is_clean(), "{:?}", app.check().await);
    // Nothing more to do now.
    let next = app.turn_starting("s").await;
    assert_eq!(next.reason, Reason::BelowThreshold, "{next:?}");

    // A restore puts every original back exactly, in its place.
    let restored = app.store.restore("s", None).await.unwrap();
    assert_eq!(restored.messages_restored, 3);
    assert_eq!(app.messages("s").await, before);
    assert!(app.archived("s").await.is_empty());
    let stats = &app.stats().await["summary"];
    assert_eq!(stats["total_tool_outputs_cleared"], 0);
    assert_eq!(stats["total_chars_cleared"], 0);
    assert!(app.check().await.is_clean());
}

/// Two turns whose answers are long: clearing every result it may still leaves the
/// session over its threshold.
async fn two_long_turns(app: &TestApp, session: &str) {
    app.append(session, "user", "Why is checkout-api slow?", None, None)
        .await;
    for n in 0..2 {
        tool_step(
            app,
            session,
            &format!("a{n}"),
            "get_logs",
            &output(&format!("OLD-{n}"), 1_200),
        )
        .await;
    }
    app.append(
        session,
        "assistant",
        &format!("The pool is full. {}", filler(1_500)),
        None,
        None,
    )
    .await;
    app.append(session, "user", "And the database?", None, None)
        .await;
    for n in 0..3 {
        tool_step(
            app,
            session,
            &format!("b{n}"),
            "run_sql",
            &output(&format!("NEW-{n}"), 700),
        )
        .await;
    }
    app.append(
        session,
        "assistant",
        &format!("The replica is fine. {}", filler(1_200)),
        None,
        None,
    )
    .await;
}

#[tokio::test]
async fn when_clearing_is_not_enough_a_summary_of_the_cleared_history_is_written_with_it() {
    let app = spawn_app_with(&CLEARING).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    two_long_turns(&app, "s").await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Compacted),
        "{reply:?}"
    );
    // The LLM read placeholders, not the outputs.
    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    let body = String::from_utf8_lossy(&requests[0].body).into_owned();
    assert!(
        body.contains("[tool output cleared: 1200 chars of get_logs output"),
        "{body}"
    );
    assert!(
        !body.contains("OLD-0"),
        "the cleared output went to the LLM"
    );
    let after = app.messages("s").await;
    assert!(after[0].is_summary);
    // The kept part starts at the second turn: its two older results are cleared in
    // place, its newest kept.
    let kept = tool_rows(&after);
    let old_kept = tool_rows(&before)[2..].to_vec();
    assert_eq!(kept.len(), 3);
    for k in 0..2 {
        assert_eq!(
            kept[k].content.as_deref(),
            Some(placeholder_of("run_sql", 700, old_kept[k].seq).as_str())
        );
        assert_eq!(kept[k].tool_call_id, old_kept[k].tool_call_id);
    }
    assert_eq!(kept[2], old_kept[2]);
    assert_eq!(reply.tool_outputs_cleared, Some(2));
    // The old part is archived as it was stored, outputs and all; the cleared results'
    // originals beside it.
    let archived = app.archived("s").await;
    let removed = reply.messages_removed.unwrap() as usize;
    assert_eq!(archived.len(), removed + 2);
    let mut rebuilt: Vec<Stored> = archived;
    rebuilt.sort_by_key(|m| m.seq);
    assert!(
        rebuilt
            .iter()
            .any(|m| m.content.as_deref().is_some_and(|c| c.starts_with("OLD-0")))
    );
    assert_eq!(
        reply.chars_removed,
        Some(before[..removed].iter().map(|m| m.chars).sum())
    );
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(metadata["summarized"], true);
    assert_eq!(metadata["tool_outputs_cleared"], 2);
    assert!(app.check().await.is_clean(), "{:?}", app.check().await);

    app.store.restore("s", None).await.unwrap();
    assert_eq!(app.messages("s").await, before);
    assert!(app.check().await.is_clean());
}

#[tokio::test]
async fn an_agent_editing_a_result_being_cleared_gets_conflict_and_nothing_is_written() {
    let app = spawn_app_with(&CLEARING).await;
    app.llm_answers(SUMMARY, Duration::from_millis(1_500)).await;
    two_long_turns(&app, "s").await;
    let target = tool_rows(&app.messages("s").await)[2].seq;
    let pending = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;

    // During the LLM call, the agent rewrites a result the plan clears in place.
    app.db
        .query("UPDATE messages SET content = 'rewritten by the agent' WHERE session_id = 's' AND seq = $1")
        .bind(target)
        .execute()
        .await
        .unwrap();
    let edited = app.messages("s").await;

    let Decision::Replied(reply) = pending.await.unwrap() else {
        panic!("no reply");
    };
    assert_eq!(
        (reply.status, reply.reason),
        (Status::Skipped, Reason::Conflict),
        "{reply:?}"
    );
    assert_eq!(app.messages("s").await, edited, "nothing written");
    assert!(app.archived("s").await.is_empty());
    assert!(app.usage_events("s").await.is_empty());
}

#[tokio::test]
async fn the_request_wins_over_the_session_which_wins_over_the_setting() {
    // Configured on; this request says off: an ordinary summary, nothing cleared.
    let app = spawn_app_with(&CLEARING).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    two_long_turns(&app, "s").await;
    let off = Overrides {
        tool_output_clearing: Some(false),
        ..Overrides::default()
    };
    let Decision::Replied(reply) = app
        .client
        .turn_starting_with("s", off, Duration::from_secs(15))
        .await
    else {
        panic!("no reply");
    };
    assert_eq!(reply.reason, Reason::Compacted, "{reply:?}");
    assert_eq!(reply.tool_outputs_cleared, Some(0));
    assert!(!app.messages("s").await.iter().any(|m| {
        m.content
            .as_deref()
            .is_some_and(|c| c.starts_with("[tool output cleared"))
    }));

    // Configured off (the default); the session says on, with a keep of 0.
    let app = spawn_app_with(&[("TOOL_OUTPUT_MIN_CHARS", "500")]).await;
    one_long_turn(&app, "s").await;
    app.db
        .query("INSERT INTO session_settings (session_id, tool_output_clearing, tool_output_keep) VALUES ('s', $1, 0)")
        .bind(true)
        .execute()
        .await
        .unwrap();
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.reason, Reason::Cleared, "{reply:?}");
    assert_eq!(
        reply.tool_outputs_cleared,
        Some(4),
        "keep 0: the newest goes too"
    );

    // Configured off; the request says on.
    let app = spawn_app_with(&[("TOOL_OUTPUT_MIN_CHARS", "500")]).await;
    one_long_turn(&app, "s").await;
    let on = Overrides {
        tool_output_clearing: Some(true),
        ..Overrides::default()
    };
    let Decision::Replied(reply) = app
        .client
        .turn_starting_with("s", on, Duration::from_secs(15))
        .await
    else {
        panic!("no reply");
    };
    // TOOL_OUTPUT_KEEP is 3 here: the oldest of four goes. The session is still over
    // its threshold, but with one human turn no summary can be planned: the clearing is
    // written alone, for the room it makes.
    assert_eq!(reply.reason, Reason::Cleared, "{reply:?}");
    assert_eq!(reply.tool_outputs_cleared, Some(1));
}

#[tokio::test]
async fn excluded_tools_short_results_and_a_missing_call_are_left_alone() {
    let app = spawn_app_with(&with(&[(
        "TOOL_OUTPUT_EXCLUDE",
        " read_runbook , no_such_tool ",
    )]))
    .await;
    app.append("s", "user", "Why is checkout-api slow?", None, None)
        .await;
    tool_step(&app, "s", "r", "read_runbook", &output("RUNBOOK", 1_500)).await;
    tool_step(&app, "s", "q", "get_logs", &output("SHORT", 499)).await;
    // A result whose call is missing.
    app.append("s", "tool", &output("ORPHAN", 1_500), None, Some("nobody"))
        .await;
    tool_step(&app, "s", "g", "get_logs", &output("LOGS", 1_500)).await;
    tool_step(&app, "s", "n", "get_logs", &output("NEWEST", 1_500)).await;
    let before = app.messages("s").await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.tool_outputs_cleared, Some(1), "{reply:?}");
    let after = app.messages("s").await;
    let changed: Vec<i64> = (before.iter().zip(&after))
        .filter(|(b, a)| b != a)
        .map(|(b, _)| b.seq)
        .collect();
    let logs = before
        .iter()
        .find(|m| m.content.as_deref().is_some_and(|c| c.starts_with("LOGS")))
        .unwrap();
    assert_eq!(changed, [logs.seq]);
}

#[tokio::test]
async fn a_twenty_megabyte_result_is_cleared_and_comes_back_whole() {
    let app = spawn_app_with(&CLEARING).await;
    app.append("s", "user", "Dump the logs.", None, None).await;
    let huge = output("HUGE", 20_000_000);
    tool_step(&app, "s", "h", "get_logs", &huge).await;
    tool_step(&app, "s", "n", "get_logs", &output("NEWEST", 600)).await;

    let reply = app.turn_starting_large("s").await;

    assert_eq!(
        (reply.reason, reply.tool_outputs_cleared),
        (Reason::Cleared, Some(1)),
        "{reply:?}"
    );
    let archived = app.archived("s").await;
    assert_eq!(archived[0].content.as_deref(), Some(huge.as_str()));
    app.store.restore("s", None).await.unwrap();
    let restored = app.messages("s").await;
    assert_eq!(
        tool_rows(&restored)[0].content.as_deref(),
        Some(huge.as_str())
    );
}

#[tokio::test]
async fn ten_thousand_tool_results_are_cleared_in_one_compaction() {
    let app = spawn_app_with(&CLEARING).await;
    app.append("big", "user", "Check every node.", None, None)
        .await;
    // Calls and results in pairs, ids reused every 100 steps (a result pairs with the
    // nearest earlier call of its id). JSON is jsonb in Postgres, text in SQLite.
    let insert = |calls: &str| {
        format!(
            "WITH RECURSIVE steps (m) AS (SELECT 1 UNION ALL SELECT m + 1 FROM steps WHERE m < 20000)
             INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id)
             SELECT 'big',
                    CASE WHEN m % 2 = 1 THEN 'assistant' ELSE 'tool' END,
                    CASE WHEN m % 2 = 1 THEN '' ELSE 'node ' || m || ' ' || $1 END,
                    CASE WHEN m % 2 = 1 THEN {calls} END,
                    CASE WHEN m % 2 = 0 THEN 'call_' || (m / 2 % 100) END
             FROM steps ORDER BY m"
        )
    };
    let calls = "'[{\"id\": \"call_' || ((m + 1) / 2 % 100) || '\", \"name\": \"get_logs\", \"arguments\": {}}]'";
    let statement = match crate::helpers::backend() {
        summarizer::store::Backend::Postgres => insert(&format!("CAST({calls} AS jsonb)")),
        summarizer::store::Backend::Sqlite => insert(calls),
    };
    app.db
        .query(sqlx::AssertSqlSafe(statement))
        .bind(filler(600).as_str())
        .execute()
        .await
        .unwrap();

    let reply = app.turn_starting_large("big").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(reply.tool_outputs_cleared, Some(9_999), "{reply:?}");
    assert!(app.check().await.is_clean(), "{:?}", app.check().await);
}

#[tokio::test]
async fn a_tool_output_clearing_that_is_not_a_boolean_is_rejected_naming_it() {
    let app = spawn_app_with(&CLEARING).await;
    for bad in [r#""yes""#, "1", "[true]"] {
        let reply = app
            .send_raw(format!(r#"{{"session_id":"s","tool_output_clearing":{bad}}}"#).as_bytes())
            .await;
        assert_eq!(
            (reply.status, reply.reason),
            (Status::Rejected, Reason::InvalidRequest)
        );
        assert!(
            reply
                .message
                .as_deref()
                .is_some_and(|m| m.contains("tool_output_clearing must be a boolean")),
            "{reply:?}"
        );
    }
}

#[tokio::test]
async fn a_cleared_row_without_its_original_is_found_by_the_check() {
    let app = spawn_app_with(&CLEARING).await;
    one_long_turn(&app, "s").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::Cleared);
    let victim = app.archived("s").await[0].seq;
    app.db
        .query("DELETE FROM archived_messages WHERE session_id = 's' AND seq = $1")
        .bind(victim)
        .execute()
        .await
        .unwrap();

    let report = app.check().await;

    let names: Vec<&str> = report.breaches.iter().map(|b| b.invariant).collect();
    assert!(names.contains(&"cleared_without_original"), "{report:?}");
}

/// `summarizer restore` on this test's database, as an operator runs it.
fn restore_command(app: &TestApp, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .arg("restore")
        .args(args)
        .env("DATABASE_URL", &app.database_url)
        .output()
        .unwrap()
}

/// A clearing archived three originals; the agent then deleted one cleared exchange (the
/// call and its result: what the Python client does for a `RemoveMessage`). A restore
/// puts the other two back and leaves the third archived, saying so: it never deletes
/// an archived original it did not write back.
#[tokio::test]
async fn a_restore_keeps_archived_the_original_of_an_exchange_the_agent_deleted() {
    let app = spawn_app_with(&CLEARING).await;
    one_long_turn(&app, "s").await;
    let before = app.messages("s").await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.reason, Reason::Cleared, "{reply:?}");
    let compaction = reply.compaction_id.unwrap();
    let result = tool_rows(&before)[1].clone();
    let deleted = app
        .db
        .query("DELETE FROM messages WHERE session_id = 's' AND (seq = $1 OR seq = $2)")
        .bind(result.seq - 1)
        .bind(result.seq)
        .execute()
        .await
        .unwrap();
    assert_eq!(deleted, 2, "the call and its result");

    let out = restore_command(&app, &["s", "--json"]);

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(restored["messages_restored"], 2, "{restored}");
    assert_eq!(
        restored["not_restored"],
        json!([{"compaction_id": compaction, "seq": result.seq, "reason": "deleted"}])
    );
    // The other two originals are back in place; the third is still archived, whole,
    // and recall reads it.
    let expected: Vec<Stored> = (before.iter())
        .filter(|m| m.seq != result.seq && m.seq != result.seq - 1)
        .cloned()
        .collect();
    assert_eq!(app.messages("s").await, expected);
    assert_eq!(app.archived("s").await, vec![result.clone()]);
    let fetched = app
        .recall
        .fetch("s", &[result.seq], Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(fetched[0].content, result.content.clone().unwrap());
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    // The compaction is undone: nothing more to restore, none in force.
    let again = restore_command(&app, &["s"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to restore"));
    let in_force: Option<i64> = app
        .db
        .query("SELECT last_compaction_id FROM sessions WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(in_force, None);
}

/// An agent edited a cleared row's placeholder (plain SQL here; the Python client's
/// mirror of an edit in place does the same). A restore leaves the agent's text in the
/// row and the original in the archive, where recall finds it: it never writes over text
/// it did not write, and the text plain output says why.
#[tokio::test]
async fn a_restore_never_writes_the_original_over_an_agents_edit_of_a_placeholder() {
    let app = spawn_app_with(&CLEARING).await;
    one_long_turn(&app, "s").await;
    let before = app.messages("s").await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.reason, Reason::Cleared, "{reply:?}");
    let original = tool_rows(&before)[0].clone();
    let note = "agent's note: OUT-0 said the pool was exhausted at 14:02:11";
    app.db
        .query("UPDATE messages SET content = $1 WHERE session_id = 's' AND seq = $2")
        .bind(note)
        .bind(original.seq)
        .execute()
        .await
        .unwrap();
    // Pinning a cleared row does not make it the agent's: its text is still the placeholder.
    let pinned = tool_rows(&before)[1].seq;
    app.db
        .query("UPDATE messages SET pinned = true WHERE session_id = 's' AND seq = $1")
        .bind(pinned)
        .execute()
        .await
        .unwrap();

    let out = restore_command(&app, &["s"]);

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2 messages back"), "{text}");
    assert!(
        text.contains(&format!(
            "not restored: seq {} of compaction {}: its row was edited since it was cleared",
            original.seq,
            reply.compaction_id.unwrap()
        )),
        "{text}"
    );
    let after = app.messages("s").await;
    let row = after.iter().find(|m| m.seq == original.seq).unwrap();
    assert_eq!(row.content.as_deref(), Some(note), "the agent's edit stays");
    let back = after.iter().find(|m| m.seq == pinned).unwrap();
    assert_eq!(
        back.content,
        tool_rows(&before)[1].content,
        "the pinned one is back"
    );
    assert_eq!(app.archived("s").await, vec![original.clone()]);
    let found = app
        .recall
        .search("s", "OUT-0", 5, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(Some(found[0].content.clone()), original.content);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

/// A clearing saves what the placeholders no longer hold, in tokens, over every later
/// model call, and costs nothing: `tokens_saved_net` counts it (docs/protocol.md, "What
/// compaction saves").
#[tokio::test]
async fn a_clearing_alone_saves_its_cleared_tokens_over_every_later_turn() {
    let app = spawn_app_with(&CLEARING).await;
    one_long_turn(&app, "s").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::Cleared);
    let events = app.usage_events("s").await;
    let cleared = events[0].4["tokens_cleared"].as_i64().unwrap();
    // Three results of 1,500 chars of log lines, less their placeholders.
    assert!((300..3_000).contains(&cleared), "{}", events[0].4);

    for n in 0..3 {
        app.append("s", "assistant", &format!("Next {n}."), None, None)
            .await;
    }

    let stats = app.stats().await;
    assert_eq!(stats["summary"]["tokens_saved_net"], json!(3 * cleared));
}

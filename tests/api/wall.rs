//! The agent never hits the wall (docs/compaction.md, "Evicting one huge output", and
//! docs/protocol.md, "The schema"): what is not text weighs, and one tool output too large
//! to keep is evicted by the next turn, whatever the keep and the clearing settings say,
//! on both stores.

use std::time::Duration;

use serde_json::{Value, json};
use summarizer::outcome::{Reason, Status};

use crate::helpers::{SUMMARY, TestApp, TestDb, filler, fresh_database, spawn_app_with};

/// The seed's limits: 60,000 / 20,000.
const SEED: [(&str, &str); 2] = [
    ("SUMMARIZATION_THRESHOLD_CHARS", "60000"),
    ("SUMMARIZATION_KEEP_CHARS", "20000"),
];

/// A call of `tool` and its result `output`, as an agent appends them.
async fn tool_step(app: &TestApp, session: &str, id: &str, tool: &str, output: &str) {
    let calls = json!([{"id": id, "name": tool, "arguments": {"service": "checkout-api"}}]);
    app.append(session, "assistant", "", Some(calls), None)
        .await;
    app.append(session, "tool", output, None, Some(id)).await;
}

/// A log of `lines` lines, each naming its number, first and last lines telling.
fn log(lines: usize) -> String {
    (0..lines)
        .map(|n| match n {
            0 => "FIRST 14:02:11 checkout-api starting request replay".to_owned(),
            n if n == lines - 1 => "LAST 14:09:59 ERROR E-5417 pool exhausted".to_owned(),
            n => format!("14:0{}:{:02} INFO line {n} {}", n % 10, n % 60, filler(60)),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn total_chars(app: &TestApp, session: &str) -> i64 {
    app.db
        .query("SELECT total_chars FROM sessions WHERE session_id = $1")
        .bind(session)
        .scalar()
        .await
        .unwrap()
}

/// A seed-default session whose newest tool output is 200 KB: the output is inside the
/// keep and its turn is the only one that could be kept, so without eviction no summary
/// can bring the session under its threshold (no safe boundary, every turn). With
/// eviction, the next turn leaves it under the threshold, the output's first and last
/// lines in place and the original archived, recallable and restorable.
#[tokio::test]
async fn a_200_kb_newest_output_leaves_a_seed_default_session_under_its_threshold() {
    let app = spawn_app_with(&SEED).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    for n in 0..6 {
        app.append(
            "s",
            "user",
            &format!("Turn {n}: why 502? {}", filler(400)),
            None,
            None,
        )
        .await;
        tool_step(&app, "s", &format!("c{n}"), "get_metrics", &filler(2_000)).await;
        app.append(
            "s",
            "assistant",
            &format!("Finding {n}: {}", filler(600)),
            None,
            None,
        )
        .await;
    }
    app.append(
        "s",
        "user",
        "Dump the last hour of checkout-api logs.",
        None,
        None,
    )
    .await;
    let dump = log(2_800);
    assert!(dump.chars().count() > 200_000, "{}", dump.len());
    tool_step(&app, "s", "dump", "get_logs", &dump).await;
    let before = app.messages("s").await;
    let dumped = before
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("dump"))
        .unwrap();
    assert!(total_chars(&app, "s").await > 200_000);

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert!(total_chars(&app, "s").await <= 60_000, "{reply:?}");
    let after = app.messages("s").await;
    let evicted = after.iter().find(|m| m.seq == dumped.seq).unwrap();
    let text = evicted.content.clone().unwrap();
    assert!(text.starts_with("FIRST 14:02:11"), "{text:.200}");
    assert!(
        text.ends_with("LAST 14:09:59 ERROR E-5417 pool exhausted"),
        "{text:.200}"
    );
    assert!(
        text.contains(&format!(
            "[tool output cleared: {} chars of get_logs output were here, its first and last \
             lines around this note; recall seq {} for the original]",
            dumped.chars, dumped.seq
        )),
        "{}",
        &text[text.find("[tool output").unwrap_or(0)..]
    );
    assert!(evicted.chars < 2_500, "{}", evicted.chars);
    let fetched = app
        .recall
        .fetch("s", &[dumped.seq], Duration::from_secs(5))
        .await
        .unwrap();
    assert!(fetched[0].content.starts_with("FIRST 14:02:11"));
    assert!(fetched[0].truncated, "the original is whole in the archive");
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    // Nothing left to evict: the next turn is an ordinary one.
    let next = app.turn_starting("s").await;
    assert_eq!(next.reason, Reason::BelowThreshold, "{next:?}");
    // Restore puts the whole output back in place.
    while app.store.restore("s", None).await.is_ok() {}
    let restored = app.messages("s").await;
    let back = restored.iter().find(|m| m.seq == dumped.seq).unwrap();
    assert_eq!(back.content.as_deref(), Some(dump.as_str()));
}

/// Below the threshold, with clearing off and the output the newest: still evicted by the
/// next turn, with no LLM call; a turn after that has nothing to do.
#[tokio::test]
async fn an_output_over_the_maximum_is_evicted_below_the_threshold_without_an_llm_call() {
    let app = spawn_app_with(&[
        ("SUMMARIZATION_THRESHOLD_CHARS", "300000"),
        ("SUMMARIZATION_KEEP_CHARS", "20000"),
    ])
    .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    tool_step(&app, "s", "big", "read_config", &log(400)).await;
    let big = app.messages("s").await[2].clone();
    assert!(big.chars > 20_000);

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Cleared),
        "{reply:?}"
    );
    assert_eq!(reply.tool_outputs_cleared, Some(1));
    assert_eq!(app.llm_requests().await, 0);
    let metadata = &app.usage_events("s").await[0].4;
    assert_eq!(metadata["summarized"], json!(false));
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    assert!(app.check().await.is_clean());
}

/// The clearing settings do not change eviction: with clearing on, every result kept by
/// `TOOL_OUTPUT_KEEP`, and the tool excluded by `TOOL_OUTPUT_EXCLUDE`, the huge output is
/// still evicted by the next turn and the small one beside it left alone.
#[tokio::test]
async fn eviction_holds_whatever_the_clearing_settings_say() {
    let app = spawn_app_with(&[
        ("SUMMARIZATION_THRESHOLD_CHARS", "300000"),
        ("SUMMARIZATION_KEEP_CHARS", "20000"),
        ("TOOL_OUTPUT_CLEARING", "on"),
        ("TOOL_OUTPUT_KEEP", "50"),
        ("TOOL_OUTPUT_EXCLUDE", "read_config, get_logs"),
    ])
    .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "user", "Read the config, then the logs.", None, None)
        .await;
    tool_step(&app, "s", "small", "get_logs", &log(30)).await;
    tool_step(&app, "s", "big", "read_config", &log(400)).await;
    let before = app.messages("s").await;
    let small = before[2].clone();
    let big = before[4].clone();
    assert!(big.chars > 20_000 && small.chars < 20_000);

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Cleared),
        "{reply:?}"
    );
    assert_eq!(reply.tool_outputs_cleared, Some(1));
    assert_eq!(app.llm_requests().await, 0);
    let after = app.messages("s").await;
    let content = |seq: i64| {
        after
            .iter()
            .find(|m| m.seq == seq)
            .and_then(|m| m.content.clone())
            .unwrap()
    };
    assert_eq!(content(small.seq), small.content.unwrap());
    let evicted = content(big.seq);
    assert!(
        evicted.contains(&format!("recall seq {}", big.seq)),
        "{evicted}"
    );
    assert!(evicted.len() < 4_000, "{} chars left", evicted.len());
    assert_eq!(app.archived("s").await.len(), 1);
    assert!(app.check().await.is_clean());
}

/// `TOOL_OUTPUT_MAX_CHARS=0` turns it off; a pinned output is never evicted, and does
/// not make every turn load the session.
#[tokio::test]
async fn eviction_is_off_at_zero_and_never_touches_a_pinned_output() {
    let app = spawn_app_with(&[
        ("SUMMARIZATION_THRESHOLD_CHARS", "300000"),
        ("TOOL_OUTPUT_MAX_CHARS", "0"),
    ])
    .await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    tool_step(&app, "s", "big", "read_config", &log(400)).await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);

    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_CHARS", "300000")]).await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    tool_step(&app, "s", "big", "read_config", &log(400)).await;
    app.db
        .query("UPDATE messages SET pinned = true WHERE session_id = 's' AND role = 'tool'")
        .execute()
        .await
        .unwrap();
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    // The worker looked once and set the session's largest evictable output as it is:
    // none, so the next turns do not load the session again.
    assert_eq!(largest_output(&app, "s").await, 0);
    assert!(app.usage_events("s").await.is_empty());
}

async fn largest_output(app: &TestApp, session: &str) -> i64 {
    app.db
        .query("SELECT largest_output_chars FROM sessions WHERE session_id = $1")
        .bind(session)
        .scalar()
        .await
        .unwrap()
}

/// A result that answers no call (its call was deleted, or never written) cannot be
/// evicted, since the history would not pair: the planner says so once, and the turns
/// after it do not load the session for it. One with no `tool_call_id` is never counted.
#[tokio::test]
async fn an_unpaired_huge_output_is_looked_at_once() {
    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_CHARS", "300000")]).await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    app.append("s", "tool", &log(400), None, Some("ghost"))
        .await;
    app.append("s", "tool", &log(500), None, None).await;
    let ghost = app.messages("s").await[1].chars;
    assert_eq!(largest_output(&app, "s").await, ghost);

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.reason, Reason::BelowThreshold, "{reply:?}");
    assert_eq!(largest_output(&app, "s").await, 0);
    assert!(app.usage_events("s").await.is_empty());
    // A new output over the maximum raises it again, and is evicted.
    tool_step(&app, "s", "real", "read_config", &log(400)).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(
        (reply.status, reply.tool_outputs_cleared),
        (Status::Compacted, Some(1)),
        "{reply:?}"
    );
    // The commit's bound is SQL's, which cannot pair: one more look settles it.
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    assert_eq!(largest_output(&app, "s").await, 0);
    assert!(
        app.check()
            .await
            .breaches
            .iter()
            .all(|b| b.invariant == "unpaired_tool_result")
    );
}

/// Rows written before the weights existed are weighed by the migration that brought them
/// (Postgres 22, SQLite 10), the session's counters with them, and `summarizer check`
/// finds nothing to repair.
#[tokio::test]
async fn rows_written_before_the_weights_are_weighed_by_their_migration() {
    let url = fresh_database().await;
    let db = TestDb::connect(&url).await;
    match &db {
        TestDb::Postgres(pool) => sqlx::migrate!().run_to(20261202000021, pool).await,
        TestDb::Sqlite(pool) => {
            sqlx::migrate!("./migrations/sqlite")
                .run_to(20261203000009, pool)
                .await
        }
    }
    .unwrap();
    // An image by URL (the fixed charge, 6,400) and a thinking block (its 5 chars of text).
    let extra = json!({"type": "human", "data": {"content": [
        {"type": "text", "text": "see"},
        {"type": "image", "url": "https://example.com/screen.png"},
        {"type": "thinking", "thinking": "hmm.."},
    ]}});
    db.query(
        "INSERT INTO messages (session_id, role, content, extra) VALUES ('s', 'user', 'see', $1)",
    )
    .bind(extra)
    .execute()
    .await
    .unwrap();
    let before: i64 = db
        .query("SELECT total_chars FROM sessions WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(before, 3);

    let store = summarizer::store::connect_lazy(&url, 2, Duration::from_secs(30)).unwrap();
    store.migrate().await.unwrap();

    let (chars, weight): (i32, i32) = db
        .query("SELECT chars, block_chars FROM messages WHERE session_id = 's'")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!((chars, weight), (3 + 6_400 + 5, 6_400 + 5));
    let total: i64 = db
        .query("SELECT total_chars FROM sessions WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(total, i64::from(chars));
    let report = summarizer::audit::run(store.as_ref()).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// What is not text weighs: an image at the fixed charge when the writer gave no weight,
/// the writer's weight when it did, thinking by its text, an opaque compaction item by its
/// payload; the session's counters count them, a compaction archives the weight and a
/// restore puts it back.
#[tokio::test]
async fn blocks_that_are_not_text_weigh_in_the_sessions_size() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let screenshot = |text: &str| -> Value {
        json!({"type": "human", "data": {"content": [
            {"type": "text", "text": text},
            {"type": "image", "source_type": "base64", "mime_type": "image/png", "data": "iVBORw0KGgo="}
        ]}})
    };
    let thinking = json!({"type": "ai", "data": {"content": [
        {"type": "thinking", "thinking": "x".repeat(900), "signature": "sig"},
        {"type": "compaction", "encrypted_content": "e".repeat(500)},
        {"type": "compaction", "content": "Anthropic's: its text is in content."},
        {"type": "text", "text": "The pool is exhausted."}
    ]}});
    let insert = "INSERT INTO messages (session_id, role, content, extra) VALUES ($1, $2, $3, $4)";
    app.db
        .query(insert)
        .bind("s")
        .bind("user")
        .bind("Look at this.")
        .bind(screenshot("Look at this."))
        .execute()
        .await
        .unwrap();
    app.db
        .query(insert)
        .bind("s")
        .bind("assistant")
        .bind("The pool is exhausted.")
        .bind(thinking)
        .execute()
        .await
        .unwrap();
    app.db
        .query(
            "INSERT INTO messages (session_id, role, content, extra, block_chars)
             VALUES ('s', 'user', 'And this one.', $1, 1234)",
        )
        .bind(screenshot("And this one."))
        .execute()
        .await
        .unwrap();
    let rows = app.messages("s").await;
    let chars: Vec<i64> = rows.iter().map(|m| m.chars).collect();
    assert_eq!(chars, [13 + 6_400, 22 + 900 + 500, 13 + 1_234]);
    assert_eq!(total_chars(&app, "s").await, chars.iter().sum::<i64>());
    assert!(app.check().await.is_clean());

    // Over the test threshold (3,000) by the weights alone: a forced compaction archives
    // the rows with their weights, and a restore brings them back exactly.
    app.append_turns("s", 2).await;
    let before = app.messages("s").await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    app.store.restore("s", None).await.unwrap();
    assert_eq!(app.messages("s").await, before);
    assert!(app.check().await.is_clean());
}

// Where eviction meets the rest: edits, pins, restore, recall and odd shapes.

#[tokio::test]
async fn an_output_edited_past_the_maximum_is_evicted_by_the_next_turn() {
    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_CHARS", "300000")]).await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    tool_step(&app, "s", "c", "read_config", "port=8080").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    app.db
        .query("UPDATE messages SET content = $1 WHERE session_id = 's' AND role = 'tool'")
        .bind(log(400))
        .execute()
        .await
        .unwrap();
    assert!(largest_output(&app, "s").await > 20_000);
    let reply = app.turn_starting("s").await;
    assert_eq!(
        (reply.status, reply.tool_outputs_cleared),
        (Status::Compacted, Some(1)),
        "{reply:?}"
    );
    assert!(app.check().await.is_clean(), "{}", app.check().await);
}

#[tokio::test]
async fn a_pinned_then_unpinned_output_is_evicted_by_the_next_turn() {
    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_CHARS", "300000")]).await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    tool_step(&app, "s", "big", "read_config", &log(400)).await;
    app.db
        .query("UPDATE messages SET pinned = true WHERE session_id = 's' AND role = 'tool'")
        .execute()
        .await
        .unwrap();
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    assert_eq!(largest_output(&app, "s").await, 0);
    app.db
        .query("UPDATE messages SET pinned = false WHERE session_id = 's' AND role = 'tool'")
        .execute()
        .await
        .unwrap();
    assert!(largest_output(&app, "s").await > 20_000);
    let reply = app.turn_starting("s").await;
    assert_eq!(
        (reply.status, reply.tool_outputs_cleared),
        (Status::Compacted, Some(1)),
        "{reply:?}"
    );
    assert!(app.check().await.is_clean(), "{}", app.check().await);
}

#[tokio::test]
async fn restore_and_recall_after_an_eviction_put_everything_back() {
    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_CHARS", "300000")]).await;
    app.append("s", "user", "Read the config.", None, None)
        .await;
    let calls = json!([{"id": "big", "name": "screenshot_logs", "arguments": {}}]);
    app.append("s", "assistant", "", Some(calls), None).await;
    let extra = json!({"type": "tool", "data": {"content": [
        {"type": "text", "text": log(400)},
        {"type": "image", "source_type": "url", "url": "https://example.com/x.png"}
    ]}});
    app.db
        .query(
            "INSERT INTO messages (session_id, role, content, tool_call_id, extra, block_chars)
             VALUES ('s', 'tool', $1, 'big', $2, 777)",
        )
        .bind(log(400))
        .bind(extra.clone())
        .execute()
        .await
        .unwrap();
    let before = app.messages("s").await;
    let weights = || async {
        app.db
            .query("SELECT CAST(coalesce(block_chars, -1) AS BIGINT) FROM messages WHERE session_id = 's' ORDER BY seq")
            .fetch_all::<(i64,)>()
            .await
            .unwrap()
    };
    let weights_before = weights().await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let evicted = app.messages("s").await[2].clone();
    assert!(app.check().await.is_clean(), "{}", app.check().await);
    // Recall finds a line from the middle of the log.
    let found = app
        .recall
        .search("s", "line 200", 5, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(found.iter().any(|r| r.seq == evicted.seq), "{found:?}");
    app.store.restore("s", None).await.unwrap();
    assert_eq!(app.messages("s").await, before);
    assert_eq!(weights().await, weights_before);
    assert!(app.check().await.is_clean(), "{}", app.check().await);
}

#[tokio::test]
async fn odd_shapes_are_evicted_with_their_ends() {
    let app = spawn_app_with(&[("SUMMARIZATION_THRESHOLD_CHARS", "30000000")]).await;
    // One line of 5 MB, no newline; multibyte chars at every cut; CRLF lines.
    let one_line: String = "é€😀a".chars().cycle().take(5_000_000).collect();
    let crlf = (0..3000)
        .map(|n| format!("ligne {n} é€😀 {}", filler(20)))
        .collect::<Vec<_>>()
        .join("\r\n");
    for (i, output) in [one_line, crlf].iter().enumerate() {
        let session = format!("s{i}");
        app.append(&session, "user", "Read it.", None, None).await;
        tool_step(&app, &session, "big", "read", output).await;
        let reply = app.turn_starting_large(&session).await;
        assert_eq!(reply.status, Status::Compacted, "{reply:?}");
        let row = app.messages(&session).await[2].clone();
        assert!(row.chars < 2_500, "{}", row.chars);
        let fetched = app
            .recall
            .fetch(&session, &[row.seq], Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!fetched.is_empty());
        app.store.restore(&session, None).await.unwrap();
        assert_eq!(
            app.messages(&session).await[2].content.as_deref(),
            Some(output.as_str())
        );
    }
    assert!(app.check().await.is_clean(), "{}", app.check().await);
}

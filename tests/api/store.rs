//! The store under what operators and agents do to the database behind the worker's back:
//! same-length edits during a compaction, sessions that cannot be compacted, TRUNCATE,
//! counters edited by hand, and sessions that have failed thousands of times.

use std::time::Duration;

use summarizer::outcome::{Reason, Status};
use summarizer::store::CounterReader;
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{SUMMARY, TestApp, filler, spawn_app, spawn_app_with};

/// `(total_chars, message_count, human_turns)` of a session.
async fn counters(app: &TestApp, session: &str) -> (i64, i32, i32) {
    app.db
        .query("SELECT total_chars, message_count, human_turns FROM sessions WHERE session_id = $1")
        .bind(session)
        .fetch_one()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_same_length_edit_of_the_prefix_during_summarization_writes_nothing() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 5).await;
    let first_seq = app.messages("s").await[0].seq;

    let pending = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    // Same length, same seqs, different text: only the content tells the edit apart.
    app.db
        .query("UPDATE messages SET content = upper(content) WHERE session_id = 's' AND seq = $1")
        .bind(first_seq)
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

/// Two sessions the planner refuses, each with the reason it gives.
async fn uncompactable_sessions(app: &TestApp) -> [(&'static str, Reason); 2] {
    // The only later human turn is too recent to leave KEEP chars.
    app.append("no-boundary", "user", "First ask", None, None)
        .await;
    app.append("no-boundary", "assistant", &filler(4000), None, None)
        .await;
    app.append("no-boundary", "user", "Second ask", None, None)
        .await;
    // The old part would be just an earlier summary.
    app.db
        .query("INSERT INTO messages (session_id, role, content, is_summary) VALUES ('only-summary', 'user', $1, true)")
        .bind(format!("{SUMMARY}\n{}", filler(1500)))
        .execute()
        .await
        .unwrap();
    app.append("only-summary", "user", "Next ask", None, None)
        .await;
    app.append("only-summary", "assistant", &filler(2000), None, None)
        .await;
    app.append("only-summary", "user", "And?", None, None).await;
    [
        ("no-boundary", Reason::NoSafeBoundary),
        ("only-summary", Reason::NothingToCompact),
    ]
}

async fn hold_lease(app: &TestApp, session: &str) {
    app.db
        .hold_lease(session, "someone-else", Duration::from_secs(3600))
        .await;
}

#[tokio::test]
async fn an_uncompactable_session_is_answered_from_its_counters_until_they_change() {
    let app = spawn_app().await;
    for (session, reason) in uncompactable_sessions(&app).await {
        assert_eq!(app.turn_starting(session).await.reason, reason, "{session}");

        // Someone else holds the lease: a worker that took it would answer busy, one
        // that answers from the counters gives the same reason and leaves it alone.
        hold_lease(&app, session).await;
        let again = app.turn_starting(session).await;
        assert_eq!(
            (again.status, again.reason),
            (Status::Skipped, reason),
            "{session}"
        );
        assert_eq!(
            app.lease_owner(session).await.as_deref(),
            Some("someone-else")
        );

        // An append changes the counters: the worker plans again, so meets the lease.
        app.append(session, "assistant", "One more thing.", None, None)
            .await;
        assert_eq!(app.turn_starting(session).await.status, Status::Busy);
        app.db
            .query("UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL")
            .execute()
            .await
            .unwrap();
        assert_eq!(app.turn_starting(session).await.reason, reason, "{session}");
    }
    assert_eq!(app.llm_requests().await, 0);
}

#[tokio::test]
async fn counters_read_alone_or_batched_carry_the_remembered_skip() {
    let app = spawn_app().await;
    let sessions = uncompactable_sessions(&app).await;
    for (session, reason) in sessions {
        assert_eq!(app.turn_starting(session).await.reason, reason);
    }
    let reader = CounterReader::spawn(app.store.clone());

    // All polled at once: the first goes alone, the rest wait for it and go as a batch.
    let reads =
        futures_util::future::join_all((0..40).map(|i| reader.counters(sessions[i % 2].0))).await;

    for (i, read) in reads.into_iter().enumerate() {
        let counters = read.unwrap().unwrap();
        assert_eq!(
            counters.remembered_skip,
            Some(sessions[i % 2].1),
            "read {i}"
        );
    }
}

#[tokio::test]
async fn truncating_messages_zeroes_every_sessions_counters() {
    let app = spawn_app().await;
    app.append_turns("a", 2).await;
    app.append_turns("b", 1).await;

    // SQLite has no TRUNCATE: its truncate is an unqualified DELETE (which, as the table
    // has triggers, runs them for each row).
    app.db
        .raw(
            app.db
                .per_backend("TRUNCATE messages", "DELETE FROM messages"),
        )
        .await
        .unwrap();

    assert_eq!(counters(&app, "a").await, (0, 0, 0));
    assert_eq!(counters(&app, "b").await, (0, 0, 0));
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    // Appends afterwards count from zero.
    app.append("a", "user", "again", None, None).await;
    assert_eq!(counters(&app, "a").await, (5, 1, 1));
}

fn summarizer(database_url: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn drifted_counters_are_named_by_check_and_fixed_by_repair_only_with_apply() {
    let app = spawn_app().await;
    app.append_turns("s-drifted", 2).await;
    app.append_turns("s-ok", 1).await;
    app.append("s-rowless", "user", "hello", None, None).await;
    let right = counters(&app, "s-drifted").await;
    app.db
        .query("DELETE FROM sessions WHERE session_id = 's-rowless'")
        .execute()
        .await
        .unwrap();
    app.db
        .query(
            "UPDATE sessions SET total_chars = total_chars + 7, human_turns = 0
             WHERE session_id = 's-drifted'",
        )
        .execute()
        .await
        .unwrap();
    let drifted = counters(&app, "s-drifted").await;

    let report = app.check().await;
    let broken: Vec<&str> = report.breaches.iter().map(|b| b.invariant).collect();
    assert_eq!(broken, ["counters_drift"], "{report}");
    assert!(report.to_string().contains("summarizer repair"), "{report}");

    let dry = summarizer(&app.database_url, &["repair"]);
    assert!(dry.contains("s-drifted"), "{dry}");
    assert!(!dry.contains("s-ok"), "{dry}");
    assert!(dry.contains("s-rowless: no row -> 5/1/1"), "{dry}");
    assert!(
        dry.contains(&format!(
            "{}/{}/{} -> {}/{}/{}",
            drifted.0, drifted.1, drifted.2, right.0, right.1, right.2
        )),
        "{dry}"
    );
    assert!(
        dry.contains("--apply"),
        "a dry run says how to apply: {dry}"
    );
    assert_eq!(counters(&app, "s-drifted").await, drifted, "dry run");

    let applied = summarizer(&app.database_url, &["repair", "--apply"]);
    assert!(applied.contains("s-drifted"), "{applied}");
    assert_eq!(counters(&app, "s-drifted").await, right);
    assert_eq!(counters(&app, "s-rowless").await, (5, 1, 1));
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    let again = summarizer(&app.database_url, &["repair"]);
    assert!(!again.contains("s-drifted"), "{again}");
}

/// A writer that says a screenshot weighs nothing (`block_chars = 0`) hides it from the
/// thresholds: `check` names the row, `repair` says so, and `repair --apply` weighs it by
/// the rule, the session's counters with it.
#[tokio::test]
async fn blocks_a_writer_left_unweighed_are_named_by_check_and_weighed_by_repair() {
    let app = spawn_app().await;
    let screenshot = serde_json::json!({"type": "human", "data": {"content": [
        {"type": "text", "text": "Look."},
        {"type": "image", "source_type": "url", "url": "https://example.com/a.png"}
    ]}});
    app.db
        .query(
            "INSERT INTO messages (session_id, role, content, extra, block_chars)
             VALUES ('s-image', 'user', 'Look.', $1, 0)",
        )
        .bind(screenshot)
        .execute()
        .await
        .unwrap();
    app.append_turns("s-text", 1).await;
    assert_eq!(counters(&app, "s-image").await.0, 5);

    let report = app.check().await;
    let broken: Vec<&str> = report.breaches.iter().map(|b| b.invariant).collect();
    assert_eq!(broken, ["unweighed_blocks"], "{report}");
    assert!(report.to_string().contains("s-image: seq"), "{report}");

    let dry = summarizer(&app.database_url, &["repair"]);
    assert!(
        dry.contains("1 messages hold blocks that weigh nothing"),
        "{dry}"
    );
    assert_eq!(counters(&app, "s-image").await.0, 5, "dry run");

    let applied = summarizer(&app.database_url, &["repair", "--apply"]);
    assert!(
        applied.contains("weighed the blocks of 1 messages"),
        "{applied}"
    );
    assert_eq!(counters(&app, "s-image").await.0, 5 + 6_400);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn thousands_of_failures_back_off_for_the_maximum_without_a_store_error() {
    let app = spawn_app_with(&[
        ("FAILURE_BACKOFF_MS", "60000"),
        ("FAILURE_BACKOFF_MAX_MS", "900000"),
        ("LLM_MAX_RETRIES", "0"),
    ])
    .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&app.llm)
        .await;
    // Far past 2^1024 overflowing a double, and at the integer column's limit.
    for (session, failures) in [("many", 5000), ("most", i32::MAX)] {
        app.append_turns(session, 5).await;
        app.db
            .query("UPDATE sessions SET failures = $2 WHERE session_id = $1")
            .bind(session)
            .bind(failures)
            .execute()
            .await
            .unwrap();

        let reply = app.turn_starting(session).await;

        assert_eq!(
            (reply.status, reply.reason),
            (Status::Failed, Reason::LlmError),
            "{session}"
        );
        let (recorded, backoff_secs) = app.db.backoff(session).await;
        assert_eq!(recorded, failures.saturating_add(1), "{session}");
        assert!(
            (880.0..=900.0).contains(&backoff_secs),
            "{session}: {backoff_secs}"
        );
        assert_eq!(app.lease_owner(session).await, None, "{session}");
    }
}

//! Every skip reason of docs/compaction.md ("When and what is compacted"), produced by a real request over NATS.

use summarizer::outcome::{Reason, Status};

use crate::helpers::{SUMMARY, filler, spawn_app, spawn_app_with};

#[tokio::test]
async fn disabled_skips_at_once_without_reading_the_session() {
    let app = spawn_app_with(&[("SUMMARIZATION_ENABLED", "false")]).await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Skipped, Reason::Disabled)
    );
    assert_eq!(reply.session_chars, None, "no database read");
    assert_eq!(app.llm_requests().await, 0);
}

#[tokio::test]
async fn each_rule_gives_its_skip_reason_and_writes_nothing() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, std::time::Duration::ZERO).await;

    // below_threshold: 3 turns, about 2300 chars.
    app.append_turns("small", 3).await;
    // too_few_turns: one human ask, then a long answer.
    app.append("one-turn", "user", "Why is checkout slow?", None, None)
        .await;
    app.append("one-turn", "assistant", &filler(4000), None, None)
        .await;
    // no_safe_boundary: the only later human turn is too recent to leave KEEP chars.
    app.append("no-boundary", "user", "First ask", None, None)
        .await;
    app.append("no-boundary", "assistant", &filler(4000), None, None)
        .await;
    app.append("no-boundary", "user", "Second ask", None, None)
        .await;
    // nothing_to_compact: the old part would be just an earlier summary.
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

    let cases = [
        ("small", Reason::BelowThreshold),
        ("one-turn", Reason::TooFewTurns),
        ("no-boundary", Reason::NoSafeBoundary),
        ("only-summary", Reason::NothingToCompact),
        ("never-seen", Reason::UnknownSession),
    ];
    for (session, reason) in cases {
        let before = app.messages(session).await;
        let reply = app.turn_starting(session).await;
        assert_eq!(
            (reply.status, reply.reason),
            (Status::Skipped, reason),
            "{session}"
        );
        assert_eq!(reply.session_id.as_deref(), Some(session));
        assert_eq!(app.messages(session).await, before, "{session} unchanged");
    }
    assert_eq!(app.llm_requests().await, 0);
    let archived: i64 = (app.db)
        .query("SELECT count(*) FROM archived_messages")
        .scalar()
        .await
        .unwrap();
    assert_eq!(archived, 0);
    // A skip after taking the lease gives it back.
    assert_eq!(app.lease_owner("no-boundary").await, None);
}

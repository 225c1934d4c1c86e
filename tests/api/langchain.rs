//! What the Python client (clients/python) relies on: the LangChain columns survive a
//! compaction and a restore, and every reply names the compaction in force, so a client
//! that stopped waiting picks a late compaction up on its next turn.

use std::time::Duration;

use serde_json::{Value, json};
use summarizer::client::Decision;
use summarizer::outcome::{Reason, Status};

use crate::helpers::{SUMMARY, TestApp, eventually, spawn_app};

/// `(seq, external_id, extra)` of the session's rows in `table`.
async fn langchain_columns(
    app: &TestApp,
    table: &str,
    session: &str,
) -> Vec<(i64, Option<String>, Option<Value>)> {
    let sql =
        format!("SELECT seq, external_id, extra FROM {table} WHERE session_id = $1 ORDER BY seq");
    app.db
        .query(sqlx::AssertSqlSafe(sql))
        .bind(session)
        .fetch_all()
        .await
        .unwrap()
}

/// Tags every row of the session as the Python client writes them.
async fn tag_rows(app: &TestApp, session: &str) {
    app.db
        .query(app.db.per_backend(
            "UPDATE messages SET external_id = 'lc-' || seq,
                 extra = jsonb_build_object('type', 'ai', 'data', jsonb_build_object('seq', seq))
             WHERE session_id = $1",
            "UPDATE messages SET external_id = 'lc-' || seq,
                 extra = json_object('type', 'ai', 'data', json_object('seq', seq))
             WHERE session_id = $1",
        ))
        .bind(session)
        .execute()
        .await
        .unwrap();
}

#[tokio::test]
async fn every_reply_names_the_compaction_in_force() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("fresh", 1).await;
    app.append_turns("s", 5).await;

    let never = app.turn_starting("fresh").await;
    let compacted = app.turn_starting("s").await;
    let next = app.turn_starting("s").await;

    assert_eq!(never.reason, Reason::BelowThreshold);
    assert_eq!(never.latest_compaction_id, None);
    assert_eq!(compacted.status, Status::Compacted);
    assert!(compacted.compaction_id.is_some());
    assert_eq!(compacted.latest_compaction_id, compacted.compaction_id);
    assert_eq!(next.reason, Reason::BelowThreshold);
    assert_eq!(next.latest_compaction_id, compacted.compaction_id);
}

#[tokio::test]
async fn a_compaction_that_lands_after_the_timeout_is_named_by_the_next_below_threshold_reply() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::from_millis(800)).await;
    app.append_turns("s", 5).await;

    let first = app
        .client
        .turn_starting("s", Duration::from_millis(100))
        .await;
    assert_eq!(first, Decision::TimedOut);
    eventually("the late compaction", || async {
        !app.usage_events("s").await.is_empty()
    })
    .await;
    let next = app.turn_starting("s").await;

    assert_eq!(next.reason, Reason::BelowThreshold);
    assert_eq!(
        next.latest_compaction_id,
        Some(app.usage_events("s").await[0].0)
    );
}

#[tokio::test]
async fn the_archive_keeps_the_langchain_columns_and_restore_brings_them_back() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    tag_rows(&app, "s").await;
    let original = langchain_columns(&app, "messages", "s").await;

    let compacted = app.turn_starting("s").await;
    assert_eq!(compacted.status, Status::Compacted);
    let archived = langchain_columns(&app, "archived_messages", "s").await;
    assert!(!archived.is_empty());
    assert_eq!(archived[..], original[..archived.len()]);

    app.store.restore("s", None).await.unwrap();

    assert_eq!(langchain_columns(&app, "messages", "s").await, original);
    let after = app.turn_starting("s").await;
    // The restored history is over the threshold again: compacted anew, a new id.
    assert_ne!(after.latest_compaction_id, compacted.compaction_id);
}

#[tokio::test]
async fn a_restore_makes_the_replies_name_the_compaction_left_in_force() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    let first = app.turn_starting("s").await.compaction_id;
    for n in 6..=9 {
        app.append_turn("s", n).await;
    }
    let second = app.turn_starting("s").await.compaction_id;
    assert!(first.is_some() && second.is_some() && first != second);
    let store = &app.store;

    store.restore("s", second).await.unwrap();
    let last: Option<i64> = (app.db)
        .query("SELECT last_compaction_id FROM sessions WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(last, first);
    store.restore("s", first).await.unwrap();
    let last: Option<i64> = (app.db)
        .query("SELECT last_compaction_id FROM sessions WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(last, None);
}

#[tokio::test]
async fn an_external_id_is_unique_within_a_session_only_and_plain_rows_need_none() {
    let app = spawn_app().await;
    let insert = |session: &'static str, id: Option<&'static str>| {
        app.db
            .query(
                "INSERT INTO messages (session_id, role, content, external_id, extra)
                 VALUES ($1, 'user', 'hi', $2, $3)",
            )
            .bind(session)
            .bind(id)
            .bind(json!({"type": "human"}))
            .execute()
    };
    insert("a", Some("m1")).await.unwrap();
    insert("b", Some("m1")).await.unwrap();
    insert("a", None).await.unwrap();
    insert("a", None).await.unwrap();
    assert!(insert("a", Some("m1")).await.is_err());
}

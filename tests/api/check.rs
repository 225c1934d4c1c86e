//! `summarizer check` passes on what the worker writes and catches each kind of damage.

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::error::ErrorKind;
use summarizer::store::prelude::*;
use summarizer::store::{Backend, PgStore};

use crate::helpers::{SUMMARY, TestApp, TestDb, fresh_database, postgres_only, spawn_app};

/// Appends a message behind the counters' back: the trigger that counts it is off
/// meanwhile. (SQLite cannot disable a trigger: it is dropped and created again from its
/// own definition, in one transaction.)
async fn insert_untracked(app: &TestApp, session: &str, content: &str) {
    let insert = "INSERT INTO messages (session_id, role, content) VALUES ($1, 'user', $2)";
    match &app.db {
        TestDb::Postgres(_) => {
            app.db
                .raw("ALTER TABLE messages DISABLE TRIGGER messages_inserted")
                .await
                .unwrap();
            app.db
                .query(insert)
                .bind(session)
                .bind(content)
                .execute()
                .await
                .unwrap();
            app.db
                .raw("ALTER TABLE messages ENABLE TRIGGER messages_inserted")
                .await
                .unwrap();
        }
        TestDb::Sqlite(pool) => {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
            let trigger: String = sqlx::query_scalar(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'messages_inserted'",
            )
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            sqlx::raw_sql("DROP TRIGGER messages_inserted")
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query(insert)
                .bind(session)
                .bind(content)
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(trigger))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
}

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
        app.db.per_backend(
            "UPDATE usage_events SET metadata = jsonb_set(metadata, '{chars_removed}', '1')
             WHERE session_id = 'b'",
            "UPDATE usage_events SET metadata = json_set(metadata, '$.chars_removed', 1)
             WHERE session_id = 'b'",
        ),
    ];
    for sql in damage {
        app.db.raw(sql).await.unwrap();
    }
    // Counters that drifted (triggers bypassed).
    insert_untracked(&app, "c", "untracked").await;
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

#[tokio::test]
async fn tool_calls_that_are_not_an_array_are_rejected_naming_the_expected_shape() {
    let app = spawn_app().await;
    let calls = json!([{"id": "c1", "name": "get_logs", "arguments": "{}"}]);
    let insert = |tool_calls: Option<Value>| {
        app.db
            .query(
                "INSERT INTO messages (session_id, role, content, tool_calls)
                 VALUES ('s', 'assistant', '', $1)",
            )
            .bind(tool_calls)
            .execute()
    };

    // Double-encoded (the array as a JSON string), an object, a number.
    for bad in [
        Value::String(calls.to_string()),
        calls[0].clone(),
        json!(42),
    ] {
        let error = insert(Some(bad.clone())).await.unwrap_err();
        let error = error.as_database_error().unwrap();
        match app.db.backend() {
            Backend::Postgres => {
                assert_eq!(error.constraint(), Some("tool_calls_is_array"), "{bad}");
            }
            // sqlx-sqlite reports no constraint name (`constraint()` is always None); the
            // kind and the message say which constraint refused it.
            Backend::Sqlite => assert_eq!(error.kind(), ErrorKind::CheckViolation, "{bad}"),
        }
        assert!(error.message().contains("tool_calls_is_array"), "{error}");
    }
    // Each call shape agents write, and no calls at all.
    let langchain = json!([{"id": "c2", "name": "get_logs", "args": {}, "type": "tool_call"}]);
    let openai = json!([{"id": "c3", "type": "function",
                         "function": {"name": "get_logs", "arguments": "{}"}}]);
    for good in [
        Some(calls),
        Some(langchain),
        Some(openai),
        Some(Value::Null),
        None,
    ] {
        insert(good).await.unwrap();
    }
}

#[tokio::test]
async fn the_checker_flags_tool_calls_the_planner_cannot_pair() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("a", 5).await;
    assert!(app.turn_starting("a").await.compaction_id.is_some());
    assert!(app.check().await.is_clean());

    // A database from before the shape constraint, holding what agents wrote then.
    app.db
        .write_as_before_the_shape_constraint(&[
            // A double-encoded call: its result still pairs, but the value is flagged.
            r#"INSERT INTO messages (session_id, role, content, tool_calls) VALUES
                   ('legacy', 'assistant', '', '"[{\"id\": \"d1\", \"name\": \"get_logs\"}]"')"#,
            "INSERT INTO messages (session_id, role, content, tool_call_id) VALUES
                   ('legacy', 'tool', 'ok', 'd1')",
            // A call hidden in an object: its result cannot be paired.
            r#"INSERT INTO messages (session_id, role, content, tool_calls) VALUES
                   ('hidden', 'assistant', '', '{"id": "o1", "name": "get_logs"}')"#,
            "INSERT INTO messages (session_id, role, content, tool_call_id) VALUES
                   ('hidden', 'tool', 'ok', 'o1')",
        ])
        .await;
    let damage = [
        // The archive of 'a' holds its calls double-encoded (the array's text as a JSON
        // string), and a late result answers one of them: separated from its call,
        // whatever the shape the call was kept in.
        app.db.per_backend(
            "UPDATE archived_messages SET tool_calls = to_jsonb(tool_calls::text)
             WHERE session_id = 'a' AND tool_calls IS NOT NULL",
            "UPDATE archived_messages SET tool_calls = json_quote(tool_calls)
             WHERE session_id = 'a' AND tool_calls IS NOT NULL",
        ),
        "INSERT INTO messages (session_id, role, content, tool_call_id) VALUES
               ('a', 'tool', 'late', 'call-1')",
        // A later call of the same id does not answer an earlier result.
        r#"INSERT INTO messages (session_id, role, content, tool_calls) VALUES
               ('a', 'assistant', '', '[{"id": "call-1", "name": "get_logs"}]')"#,
    ];
    for sql in damage {
        app.db.raw(sql).await.unwrap();
    }

    let report = app.check().await;
    let broken: Vec<(&str, usize)> = report
        .breaches
        .iter()
        .map(|b| (b.invariant, b.count))
        .collect();
    assert_eq!(
        broken,
        [
            ("separated_tool_result", 1),
            ("unpaired_tool_result", 1),
            ("tool_calls_not_an_array", 2),
        ],
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains("a: tool_call_id call-1"), "{text}");
    assert!(text.contains("hidden: tool_call_id o1"), "{text}");
    assert!(text.contains("legacy: seq "), "{text}");
}

#[tokio::test]
async fn the_shape_constraint_is_added_over_rows_written_before_it() {
    postgres_only!("the history of the Postgres migrations and its catalog (pg_constraint)");
    let db = PgPool::connect(&fresh_database().await).await.unwrap();
    // The schema before the constraint, and a double-encoded row written then.
    sqlx::migrate!().run_to(20261202000005, &db).await.unwrap();
    let double_encoded = Value::String(json!([{"id": "d1", "name": "get_logs"}]).to_string());
    let insert = |tool_calls: Value| {
        sqlx::query(
            "INSERT INTO messages (session_id, role, tool_calls) VALUES ('s', 'assistant', $1)",
        )
        .bind(tool_calls)
        .execute(&db)
    };
    insert(double_encoded.clone()).await.unwrap();

    PgStore::from_pool(db.clone()).migrate().await.unwrap();

    // The old row stays as written; new ones of that shape are refused.
    let validated: bool = sqlx::query_scalar(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'tool_calls_is_array'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(!validated, "not validated over the old row");
    let stored: Value = sqlx::query_scalar("SELECT tool_calls FROM messages")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(stored, double_encoded);
    assert!(insert(double_encoded).await.is_err());
}

#[tokio::test]
async fn the_shape_constraint_is_validated_on_a_new_database() {
    postgres_only!("asks the Postgres catalog (pg_constraint); SQLite has no NOT VALID");
    let app = spawn_app().await;
    let validated: bool = app
        .db
        .query("SELECT convalidated FROM pg_constraint WHERE conname = 'tool_calls_is_array'")
        .scalar()
        .await
        .unwrap();
    assert!(validated);
}

/// Found by probing: on SQLite a plain-SQL agent could store bytes that are not UTF-8 as
/// TEXT, and every turn of that session then failed `store_error`, loading the rows, with
/// no backoff, while `summarizer check` passed. Now the write refuses such text (as
/// Postgres does); rows written before are named by the check with the fix, and their
/// session backs off instead of failing every turn.
#[tokio::test]
async fn text_that_is_not_utf8_is_refused_found_and_its_session_backs_off() {
    let app = spawn_app().await;
    let bad = "INSERT INTO messages (session_id, role, content)
               VALUES ('s', 'user', CAST(X'68FF69' AS TEXT))";
    let refused = match &app.db {
        // Postgres refuses the bytes themselves: a text parameter must be UTF-8.
        TestDb::Postgres(_) => app
            .db
            .query("INSERT INTO messages (session_id, role, content) VALUES ('s', 'user', convert_from('\\xff'::bytea, 'UTF8'))")
            .execute()
            .await
            .unwrap_err(),
        TestDb::Sqlite(_) => app
            .db
            .query(bad)
            .execute()
            .await
            .unwrap_err(),
    };
    assert!(
        refused.to_string().contains("UTF") || refused.to_string().contains("utf"),
        "{refused}"
    );
    let TestDb::Sqlite(_) = &app.db else {
        return;
    };

    // A file written before the write refused it.
    app.db
        .raw("DROP TRIGGER messages_text_is_utf8_on_insert")
        .await
        .unwrap();
    app.append_turns("s", 5).await;
    app.db.query(bad).execute().await.unwrap();
    let report = app.check().await;
    let breach = report
        .breaches
        .iter()
        .find(|b| b.invariant == "text_not_utf8")
        .expect("found");
    assert_eq!(breach.count, 1);
    assert!(
        breach.examples[0].starts_with("s: seq "),
        "{:?}",
        breach.examples
    );
    assert!(
        report
            .to_string()
            .contains("DELETE FROM messages WHERE seq"),
        "{report}"
    );

    let first = app.turn_starting("s").await;
    assert_eq!(
        (first.status, first.reason),
        (
            summarizer::outcome::Status::Failed,
            summarizer::outcome::Reason::StoreError
        ),
        "{first:?}"
    );
    assert_eq!(app.lease_owner("s").await, None, "the lease is given back");
    let second = app.turn_starting("s").await;
    assert_eq!(
        second.reason,
        summarizer::outcome::Reason::BackingOff,
        "{second:?}"
    );
}

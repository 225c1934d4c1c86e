//! Per-session (`session_settings`) and per-request (`threshold_chars`, `keep_chars`)
//! settings: precedence request, then session, then configuration; clamped to the
//! `SUMMARIZATION_MIN_*`/`MAX_*` bounds.
//!
//! The test workers' configured limits are threshold 3000, keep 1000. One turn of
//! `append_turn` is about 760 chars: four messages, the last two about 610 together.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{Value, json};
use summarizer::client::Decision;
use summarizer::outcome::{Reason, Status};
use summarizer::protocol::{Overrides, Reply};
use summarizer::store::CounterReader;

use crate::helpers::{SUMMARY, TestApp, spawn_app, spawn_app_with};

/// A turn-starting request with extra fields, sent as JSON.
async fn turn_starting_with(app: &TestApp, session: &str, extra: Value) -> Reply {
    let mut request = json!({"session_id": session});
    if let (Some(fields), Value::Object(extra)) = (request.as_object_mut(), extra) {
        fields.extend(extra);
    }
    app.send_raw(&serde_json::to_vec(&request).unwrap()).await
}

/// Chars of the session's messages that are not summaries: the kept part after a compaction.
async fn kept_chars(app: &TestApp, session: &str) -> i64 {
    (app.messages(session).await.iter())
        .filter(|m| !m.is_summary)
        .map(|m| m.chars)
        .sum()
}

async fn set_session(app: &TestApp, session: &str, columns: &str, values: &str) {
    let sql = format!(
        "INSERT INTO session_settings (session_id, {columns}) VALUES ('{session}', {values})"
    );
    app.db.raw(sqlx::AssertSqlSafe(sql)).await.unwrap();
}

#[tokio::test]
async fn a_request_threshold_below_the_configured_one_compacts_keeping_its_keep_chars() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    // Three turns, about 2300 chars: below the configured 3000.
    app.append_turns("s", 3).await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);

    // Through the Rust client, as an agent would.
    let overrides = Overrides {
        threshold_chars: Some(1500),
        keep_chars: Some(600),
        ..Overrides::default()
    };
    let reply = match (app.client)
        .turn_starting_with("s", overrides, Duration::from_secs(15))
        .await
    {
        Decision::Replied(reply) => reply,
        other => panic!("no reply: {other:?}"),
    };

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    // Keep 600 keeps the last turn alone; the configured 1000 would have kept two.
    assert_eq!(reply.messages_kept, Some(4));
    assert!(kept_chars(&app, "s").await >= 600);
}

#[tokio::test]
async fn request_overrides_are_clamped_to_the_configured_bounds() {
    let app = spawn_app_with(&[
        ("SUMMARIZATION_MIN_THRESHOLD_CHARS", "2000"),
        ("SUMMARIZATION_MAX_KEEP_CHARS", "700"),
    ])
    .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("two-turns", 2).await;
    app.append_turns("three-turns", 3).await;
    app.append_turns("five-turns", 5).await;

    // A threshold of 100 is raised to the minimum, 2000: two turns (about 1500 chars)
    // stay below it, three (about 2300) are above it.
    let low = json!({"threshold_chars": 100});
    let two = turn_starting_with(&app, "two-turns", low.clone()).await;
    let three = turn_starting_with(&app, "three-turns", low).await;
    // A keep of 2500 is lowered to the maximum, 700: the last turn alone is kept.
    let five = turn_starting_with(&app, "five-turns", json!({"keep_chars": 2500})).await;

    assert_eq!(two.reason, Reason::BelowThreshold, "{two:?}");
    assert_eq!(three.status, Status::Compacted, "{three:?}");
    assert_eq!(five.status, Status::Compacted, "{five:?}");
    assert_eq!(five.messages_kept, Some(4));
    assert!(kept_chars(&app, "five-turns").await >= 700);
}

/// The contract clamps sizes: a positive integer past 2^64 (which JSON parsers keep as a
/// float) is as large as any other past the bound, not a malformed request.
#[tokio::test]
async fn a_size_past_two_to_the_64_is_clamped_like_any_other() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    let huge = format!("1{}", "0".repeat(40));
    let payload = format!(
        r#"{{"session_id":"s","threshold_chars":18446744073709551616,"keep_chars":{huge}}}"#
    );
    let reply = app.send_raw(payload.as_bytes()).await;
    assert_eq!(reply.reason, Reason::BelowThreshold, "{reply:?}");
    assert_eq!(app.llm_requests().await, 0);
    // A keep as large is clamped to its bound (a forced compaction's keep is its own,
    // whatever the threshold), which holds this whole history.
    let forced = format!(r#"{{"session_id":"s","force":true,"keep_chars":{huge}}}"#);
    let reply = app.send_raw(forced.as_bytes()).await;
    assert_eq!(reply.reason, Reason::WithinKeep, "{reply:?}");
    assert_eq!(
        reply.keep_chars,
        Some(5_000_000),
        "SUMMARIZATION_MAX_KEEP_CHARS"
    );
}

#[tokio::test]
async fn a_request_override_that_is_not_an_integer_is_rejected() {
    let app = spawn_app().await;
    app.append_turns("s", 5).await;

    for (extra, says) in [
        (
            json!({"threshold_chars": "2000"}),
            "threshold_chars must be",
        ),
        (json!({"keep_chars": 600.5}), "keep_chars must be"),
        (json!({"keep_chars": 0}), "keep_chars must be"),
    ] {
        let reply = turn_starting_with(&app, "s", extra.clone()).await;
        assert_eq!(
            (reply.status, reply.reason),
            (Status::Rejected, Reason::InvalidRequest),
            "{extra}"
        );
        let message = reply.message.unwrap_or_default();
        assert!(message.contains(says), "{extra}: {message}");
    }
    assert_eq!(app.llm_requests().await, 0);
}

#[tokio::test]
async fn session_settings_take_effect_and_a_request_overrides_them() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    for session in ["tuned", "plain", "overridden"] {
        app.append_turns(session, 3).await;
    }
    for session in ["tuned", "overridden"] {
        set_session(&app, session, "threshold_chars, keep_chars", "1500, 600").await;
    }

    let tuned = app.turn_starting("tuned").await;
    let plain = app.turn_starting("plain").await;
    let overridden = turn_starting_with(&app, "overridden", json!({"threshold_chars": 5000})).await;

    assert_eq!(tuned.status, Status::Compacted, "{tuned:?}");
    assert_eq!(tuned.messages_kept, Some(4));
    assert_eq!(plain.reason, Reason::BelowThreshold);
    assert_eq!(overridden.reason, Reason::BelowThreshold);
}

#[tokio::test]
async fn session_settings_are_clamped_to_the_configured_bounds() {
    let app = spawn_app_with(&[("SUMMARIZATION_MIN_THRESHOLD_CHARS", "2000")]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("two-turns", 2).await;
    app.append_turns("three-turns", 3).await;
    for session in ["two-turns", "three-turns"] {
        set_session(&app, session, "threshold_chars, keep_chars", "100, 50").await;
    }

    assert_eq!(
        app.turn_starting("two-turns").await.reason,
        Reason::BelowThreshold
    );
    assert_eq!(
        app.turn_starting("three-turns").await.status,
        Status::Compacted
    );
}

#[tokio::test]
async fn a_session_disabled_in_session_settings_gets_skipped_disabled() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("off", 5).await;
    app.append_turns("on", 5).await;
    set_session(&app, "off", "enabled", "false").await;
    set_session(&app, "on", "enabled", "true").await;
    let before = app.messages("off").await;

    let off = turn_starting_with(&app, "off", json!({"threshold_chars": 1000})).await;

    assert_eq!(
        (off.status, off.reason),
        (Status::Skipped, Reason::Disabled)
    );
    assert_eq!(app.messages("off").await, before);
    assert_eq!(app.llm_requests().await, 0);
    assert_eq!(app.turn_starting("on").await.status, Status::Compacted);
}

#[tokio::test]
async fn the_session_model_summarizes_the_session_and_is_recorded_as_requested_model() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("custom", 5).await;
    app.append_turns("default", 5).await;
    set_session(&app, "custom", "model", "'gpt-custom'").await;

    let mut models = Vec::new();
    for session in ["custom", "default"] {
        assert_eq!(app.turn_starting(session).await.status, Status::Compacted);
        let requests = app.llm.received_requests().await.unwrap();
        let body: serde_json::Value = requests.last().unwrap().body_json().unwrap();
        models.push(body["model"].as_str().unwrap().to_owned());
    }

    // The session's own model is asked; another session gets LLM_MODEL.
    assert_eq!(models, ["gpt-custom", "fake-model"]);
    let custom = &app.usage_events("custom").await[0].4;
    let default = &app.usage_events("default").await[0].4;
    assert_eq!(custom["requested_model"], "gpt-custom");
    assert_eq!(default.get("requested_model"), None);
}

#[tokio::test]
async fn a_remembered_refusal_does_not_hold_for_a_smaller_keep() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    // With keep 1000, the only later human turn is too recent: no_safe_boundary, which
    // the worker remembers until the history changes.
    app.append("s", "user", "First ask", None, None).await;
    app.append("s", "assistant", &crate::helpers::filler(4000), None, None)
        .await;
    app.append("s", "user", "Second ask", None, None).await;
    app.append("s", "assistant", &crate::helpers::filler(700), None, None)
        .await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::NoSafeBoundary);

    // With keep 600 the second ask is a safe cut.
    let reply = turn_starting_with(&app, "s", json!({"keep_chars": 600})).await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
}

#[tokio::test]
async fn concurrent_requests_for_many_sessions_each_see_their_own_settings() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let sessions: Vec<String> = (0..30).map(|i| format!("s-{i}")).collect();
    for (i, session) in sessions.iter().enumerate() {
        app.append_turns(session, 3).await;
        match i % 3 {
            0 => set_session(&app, session, "enabled", "false").await,
            1 => set_session(&app, session, "threshold_chars, keep_chars", "1500, 600").await,
            _ => {}
        }
    }

    let replies = join_all(sessions.iter().map(|s| app.turn_starting(s))).await;

    for (i, reply) in replies.iter().enumerate() {
        let expected = match i % 3 {
            0 => Reason::Disabled,
            1 => Reason::Compacted,
            _ => Reason::BelowThreshold,
        };
        assert_eq!(reply.reason, expected, "session {i}: {reply:?}");
    }
}

#[tokio::test]
async fn counters_read_alone_or_batched_carry_each_sessions_settings() {
    let app = spawn_app().await;
    for i in 0..4 {
        app.append_turns(&format!("s-{i}"), 1).await;
        set_session(
            &app,
            &format!("s-{i}"),
            "threshold_chars, model",
            &format!("{}, 'model-{i}'", 2000 + i),
        )
        .await;
    }
    app.append_turns("plain", 1).await;
    let reader = CounterReader::spawn(app.store.clone());
    let ids: Vec<String> = (0..40)
        .map(|i| match i % 5 {
            4 => "plain".to_owned(),
            n => format!("s-{n}"),
        })
        .collect();

    // All polled at once: the first goes alone, the rest wait for it and go as a batch.
    let reads = join_all(ids.iter().map(|id| reader.counters(id))).await;

    for (i, read) in reads.into_iter().enumerate() {
        let settings = read.unwrap().unwrap().settings;
        match i % 5 {
            4 => assert_eq!(settings, Default::default(), "read {i}"),
            n => {
                assert_eq!(settings.threshold_chars, Some(2000 + n as i64), "read {i}");
                assert_eq!(settings.model.as_deref(), Some(&*format!("model-{n}")));
            }
        }
    }
}

fn summarizer(database_url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap()
}

async fn stored_settings(
    app: &TestApp,
    session: &str,
) -> Option<(Option<bool>, Option<i64>, Option<i64>, Option<String>)> {
    app.db
        .query(
            "SELECT enabled, threshold_chars, keep_chars, model FROM session_settings
             WHERE session_id = $1",
        )
        .bind(session)
        .fetch_optional()
        .await
        .unwrap()
}

#[tokio::test]
async fn session_set_writes_validated_settings_and_prints_them() {
    let app = spawn_app().await;
    app.append_turns("s", 1).await;

    let out = summarizer(
        &app.database_url,
        &[
            "session",
            "s",
            "--set",
            "threshold_chars=2000",
            "--set",
            "keep_chars=500",
            "--set",
            "model=gpt-x",
        ],
    );

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["settings"]["threshold_chars"], 2000);
    assert_eq!(printed["settings"]["keep_chars"], 500);
    assert_eq!(printed["settings"]["model"], "gpt-x");
    assert_eq!(printed["settings"]["enabled"], Value::Null);
    assert_eq!(
        stored_settings(&app, "s").await,
        Some((None, Some(2000), Some(500), Some("gpt-x".to_owned())))
    );

    let out = summarizer(
        &app.database_url,
        &["session", "s", "--unset", "model", "--set", "enabled=false"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stored_settings(&app, "s").await,
        Some((Some(false), Some(2000), Some(500), None))
    );

    // The session view shows them too.
    let view = summarizer(&app.database_url, &["session", "s"]);
    assert!(view.status.success());
    let view: Value = serde_json::from_slice(&view.stdout).unwrap();
    assert_eq!(view["settings"]["enabled"], false);
    assert_eq!(view["settings"]["threshold_chars"], 2000);
    assert_eq!(view["message_count"], 4);
}

#[tokio::test]
async fn session_set_refuses_bad_settings_and_writes_nothing() {
    let app = spawn_app().await;
    app.append_turns("s", 1).await;
    let ok = summarizer(
        &app.database_url,
        &["session", "s", "--set", "threshold_chars=2000"],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    for (args, says) in [
        (&["--set", "colour=blue"][..], "unknown setting \"colour\""),
        (
            &["--set", "keep_chars=2000"][..],
            "keep_chars (2000) must be smaller than threshold_chars (2000)",
        ),
        (
            &["--set", "keep_chars=600", "--set", "threshold_chars=500"][..],
            "must be smaller",
        ),
        (
            &["--set", "threshold_chars=-5"][..],
            "threshold_chars must be a positive integer",
        ),
        (
            &["--set", "enabled=maybe"][..],
            "enabled must be true or false",
        ),
        (&["--set", "keep_chars"][..], "key=value"),
        (&["--unset", "colour"][..], "unknown setting \"colour\""),
    ] {
        let mut all = vec!["session", "s"];
        all.extend_from_slice(args);
        let out = summarizer(&app.database_url, &all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(
            stored_settings(&app, "s").await,
            Some((None, Some(2000), None, None)),
            "{args:?}"
        );
    }
}

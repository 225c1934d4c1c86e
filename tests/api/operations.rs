//! Operator commands on a live database: `summarizer restore` and `summarizer session`.

use std::time::Duration;

use serde_json::{Value, json};
use summarizer::outcome::Status;

use crate::helpers::{SUMMARY, spawn_app};

fn summarizer(database_url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap()
}

#[tokio::test]
async fn restore_after_a_compaction_gives_back_the_original_history_exactly() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "system", "You are an SRE assistant.", None, None)
        .await;
    app.append_turns("s", 5).await;
    let original = app.messages("s").await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    assert_ne!(app.messages("s").await, original);

    let out = summarizer(&app.database_url, &["restore", "s"]);

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(app.messages("s").await, original);
    assert!(app.archived("s").await.is_empty());
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    // The compaction no longer counts; the LLM call it made still does.
    let stats = app.stats().await;
    assert_eq!(stats["summary"]["total_summarizations"], 0);
    assert_eq!(stats["summary"]["prompt_tokens"], 812);
    // And the session compacts again on the next turn.
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
}

#[tokio::test]
async fn restoring_an_older_compaction_undoes_every_later_one_too() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    let first = app.turn_starting("s").await.compaction_id.unwrap();
    for n in 6..=9 {
        app.append_turn("s", n).await;
    }
    let original: Vec<_> = {
        // Everything ever appended: the archive of the first compaction and the history
        // without its summary, in seq order.
        let mut all: Vec<_> = app
            .archived("s")
            .await
            .into_iter()
            .chain(
                app.messages("s")
                    .await
                    .into_iter()
                    .filter(|m| !m.is_summary),
            )
            .collect();
        all.sort_by_key(|m| m.seq);
        all
    };
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);

    let out = summarizer(
        &app.database_url,
        &["restore", "s", "--compaction", &first.to_string()],
    );

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("restored compactions"));
    assert_eq!(app.messages("s").await, original);
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");

    // Nothing left to restore: a clear error, nothing written.
    let again = summarizer(&app.database_url, &["restore", "s"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to restore"));
    assert_eq!(app.messages("s").await, original);
}

#[tokio::test]
async fn session_shows_counters_lease_and_compactions() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    let reply = app.turn_starting("s").await;

    let out = summarizer(&app.database_url, &["session", "s"]);

    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    let messages = app.messages("s").await;
    assert_eq!(view["message_count"], messages.len());
    assert_eq!(
        view["total_chars"],
        messages.iter().map(|m| m.chars).sum::<i64>()
    );
    assert_eq!(view["lease_owner"], Value::Null);
    assert_eq!(view["compactions"][0]["id"], reply.compaction_id.unwrap());
    assert_eq!(
        view["compactions"][0]["chars_removed"],
        reply.chars_removed.unwrap()
    );
    assert_eq!(view["compactions"][0]["restored"], false);
    // Five turns of two model calls; none since the compaction, which saved nothing yet;
    // the agent's last insert scheduled it for an idle pass.
    assert_eq!(view["model_turns"], 10);
    assert_eq!(view["tokens_saved"], 0);
    assert!(
        view["idle_since"].as_str().unwrap().ends_with('Z'),
        "{view}"
    );
    app.append("s", "assistant", "One more call.", None, None)
        .await;
    let view: Value =
        serde_json::from_slice(&summarizer(&app.database_url, &["session", "s"]).stdout).unwrap();
    let metadata = &app.usage_events("s").await[0].4;
    let saved =
        metadata["tokens_removed"].as_i64().unwrap() - metadata["summary_tokens"].as_i64().unwrap();
    assert_eq!(
        (&view["model_turns"], &view["tokens_saved"]),
        (&json!(11), &json!(saved))
    );
    let unknown = summarizer(&app.database_url, &["session", "nobody"]);
    assert!(!unknown.status.success());
}

#[tokio::test]
async fn prune_archive_deletes_only_old_archives_and_a_dry_run_nothing() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    for session in ["old", "new"] {
        app.append_turns(session, 5).await;
        assert_eq!(app.turn_starting(session).await.status, Status::Compacted);
    }
    // The "old" session's compaction happened 40 days ago (in SQLite, timestamps are
    // RFC 3339 text).
    app.db
        .query(app.db.per_backend(
            "UPDATE archived_messages SET archived_at = now() - interval '40 days'
             WHERE session_id = 'old'",
            "UPDATE archived_messages
             SET archived_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-40 days')
             WHERE session_id = 'old'",
        ))
        .execute()
        .await
        .unwrap();
    let old_archived = app.archived("old").await.len();

    let dry = summarizer(
        &app.database_url,
        &["prune-archive", "--older-than", "30d", "--dry-run"],
    );
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(String::from_utf8_lossy(&dry.stdout).contains(&format!(
        "would delete {old_archived} archived messages of 1 compactions"
    )));
    assert_eq!(app.archived("old").await.len(), old_archived);

    let real = summarizer(&app.database_url, &["prune-archive", "--older-than", "30d"]);
    assert!(
        real.status.success(),
        "{}",
        String::from_utf8_lossy(&real.stderr)
    );

    assert!(app.archived("old").await.is_empty());
    assert!(!app.archived("new").await.is_empty());
    let report = app.check().await;
    assert!(report.is_clean(), "{report}");
    let bad = summarizer(
        &app.database_url,
        &["prune-archive", "--older-than", "soon"],
    );
    assert_eq!(
        bad.status.code(),
        Some(2),
        "clap rejects an unreadable duration"
    );
}

#[tokio::test]
async fn metrics_count_events_compactions_and_llm_calls_without_session_ids() {
    let app = spawn_app().await;
    app.llm_first_then_summary(wiremock::ResponseTemplate::new(503))
        .await;
    app.append_turns("secret-session-name", 5).await;
    let compacted = app.turn_starting("secret-session-name").await;
    assert_eq!(compacted.status, Status::Compacted);
    app.turn_starting("secret-session-name").await;
    app.send_raw(b"not json").await;

    let response = reqwest::get(format!("http://{}/metrics", app.http_addr.unwrap()))
        .await
        .unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = response.text().await.unwrap();

    for line in [
        "summarizer_events_total{status=\"compacted\",reason=\"compacted\"} 1",
        "summarizer_events_total{status=\"skipped\",reason=\"below_threshold\"} 1",
        "summarizer_events_total{status=\"rejected\",reason=\"invalid_request\"} 1",
        "summarizer_llm_retries_total 1",
        &format!(
            "summarizer_chars_compacted_total {}",
            compacted.chars_removed.unwrap()
        ),
        "summarizer_compaction_duration_seconds_count 1",
        "summarizer_llm_duration_seconds_count 1",
        "summarizer_events_in_flight_limit 32",
        "summarizer_events_in_flight 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains("summarizer_db_pool_connections "), "{text}");
    assert!(
        !text.contains("secret-session-name"),
        "labels stay low-cardinality"
    );
}

#[tokio::test]
async fn stats_report_a_daily_series_failures_and_duration_percentiles() {
    let app = spawn_app().await;
    wiremock::Mock::given(wiremock::matchers::body_string_contains("poison"))
        .respond_with(wiremock::ResponseTemplate::new(400))
        .with_priority(1)
        .mount(&app.llm)
        .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("ok", 5).await;
    app.append("bad", "user", "poison", None, None).await;
    app.append_turns("bad", 5).await;
    let compacted = app.turn_starting("ok").await;
    assert_eq!(
        app.turn_starting("bad").await.reason,
        summarizer::outcome::Reason::LlmError
    );

    let stats = app.stats().await;

    let summary = &stats["summary"];
    assert_eq!(summary["total_summarizations"], 1);
    assert_eq!(
        summary["average_chars_removed"].as_f64(),
        compacted.chars_removed.map(|c| c as f64)
    );
    assert_eq!(summary["failures_by_reason"]["llm_error"], 1);
    let p50 = summary["p50_duration_ms"].as_f64().unwrap();
    // A bucket's upper bound is at most sqrt 2 above the time it holds, which is part of
    // the event's whole time.
    let event_ms = compacted.duration_ms.max(1) as f64;
    assert!(
        p50 > 0.0 && p50 <= 1.5 * event_ms,
        "{summary} vs {event_ms} ms"
    );
    assert!(summary["p95_duration_ms"].as_f64().unwrap() >= p50);
    let daily = stats["daily"].as_array().unwrap();
    assert_eq!(daily.len(), 1, "{stats}");
    assert_eq!(
        (
            daily[0]["compactions"].as_i64(),
            daily[0]["failures"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(daily[0]["chars_removed"].as_i64(), compacted.chars_removed);
}

//! What each mode and summarizer records, and the mean recall `/stats` and
//! `summarizer stats` report.

use std::time::Duration;

use serde_json::Value;
use summarizer::outcome::Status;
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use super::*;
use crate::helpers::{SUMMARY, completion, spawn_app_with};

#[tokio::test]
async fn record_measures_with_one_request_and_off_records_nothing() {
    for mode in ["record", "off"] {
        let app = spawn_app_with(&[("SUMMARY_FACT_CHECK", mode)]).await;
        Mock::given(method("POST"))
            .respond_with(Obliging)
            .mount(&app.llm)
            .await;
        app.append_turns("s", 5).await;

        let reply = app.turn_starting("s").await;

        assert_eq!(reply.status, Status::Compacted, "{mode}: {reply:?}");
        assert_eq!(app.llm_requests().await, 1, "{mode}: never asked again");
        assert_eq!(written_summary(&app, "s").await, SUMMARY, "{mode}");
        let events = app.usage_events("s").await;
        let metadata = &events[0].4;
        if mode == "record" {
            let facts = removed_facts(&app, "s").await;
            let recall = facts.recall(SUMMARY);
            assert!(recall.ratio() < 0.8, "{recall:?}");
            assert_eq!(figures(metadata), recorded(&recall));
            assert_eq!(metadata["fact_retry"], false);
            assert_eq!(metadata.get("fact_retry_outcome"), None);
        } else {
            for key in [
                "facts_total",
                "facts_kept",
                "facts_stated",
                "fact_retry",
                "fact_retry_outcome",
            ] {
                assert_eq!(metadata.get(key), None, "{key} in {metadata}");
            }
            let stats = app.stats().await;
            assert_eq!(stats["summary"]["mean_fact_recall"], Value::Null);
            assert_eq!(stats["summary"]["mean_statement_recall"], Value::Null);
        }
    }
}

/// A tool result naming `n` distinct hosts: more than any summary within
/// `SUMMARY_MAX_CHARS` can keep.
fn inventory(n: usize) -> String {
    (0..n)
        .map(|i| format!("node-{i:04}.internal 10.0.{}.{} up\n", i / 250, i % 250))
        .collect()
}

#[tokio::test]
async fn the_extractive_summarizer_is_never_asked_again_and_records_its_figures() {
    let app = spawn_app_with(&[
        RETRY,
        ("SUMMARY_MIN_FACT_RECALL", "1"),
        ("LLM_PROVIDER", "extractive"),
    ])
    .await;
    app.append("s", "user", "Which nodes are up?", None, None)
        .await;
    app.append("s", "tool", &inventory(1_000), None, Some("inv"))
        .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 0);
    let facts = removed_facts(&app, "s").await;
    let recall = facts.recall(&written_summary(&app, "s").await);
    assert!(
        recall.kept < recall.total,
        "below the minimum of 1: {recall:?}"
    );
    let events = app.usage_events("s").await;
    let (_, model, _, _, metadata) = &events[0];
    assert_eq!(model, "extractive");
    assert_eq!(figures(metadata), recorded(&recall));
    assert_eq!(metadata["fact_retry"], false);
    assert!(
        !metrics(&app)
            .await
            .contains("summarizer_fact_retries_total{")
    );
}

#[tokio::test]
async fn a_summary_the_extractive_fallback_wrote_is_not_asked_again() {
    let app = spawn_app_with(&[
        RETRY,
        ("SUMMARY_MIN_FACT_RECALL", "1"),
        ("LLM_FALLBACK", "extractive"),
        ("LLM_MAX_RETRIES", "0"),
    ])
    .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream down"))
        .mount(&app.llm)
        .await;
    app.append("s", "user", "Which nodes are up?", None, None)
        .await;
    app.append("s", "tool", &inventory(1_000), None, Some("inv"))
        .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(
        app.llm_requests().await,
        1,
        "the LLM that failed is not asked again"
    );
    let events = app.usage_events("s").await;
    let metadata = &events[0].4;
    assert_eq!(metadata["fallback"], true);
    let facts = removed_facts(&app, "s").await;
    let recall = facts.recall(&written_summary(&app, "s").await);
    assert!(
        recall.kept < recall.total,
        "below the minimum of 1: {recall:?}"
    );
    assert_eq!(figures(metadata), recorded(&recall));
    assert_eq!(metadata["fact_retry"], false);
}

fn summarizer_cli(database_url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .unwrap()
}

#[tokio::test]
async fn stats_and_the_cli_report_the_mean_recall_of_the_summaries_that_had_facts() {
    let app = spawn_app_with(&[("SUMMARY_FACT_CHECK", "record")]).await;
    assert_eq!(
        app.stats().await["summary"]["mean_fact_recall"],
        Value::Null
    );
    Mock::given(wiremock::matchers::body_string_contains("second session"))
        .respond_with(completion(VAGUE))
        .with_priority(1)
        .mount(&app.llm)
        .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("a", 5).await;
    app.append("b", "user", "The second session: why 502?", None, None)
        .await;
    app.append_turns("b", 5).await;
    assert_eq!(app.turn_starting("a").await.status, Status::Compacted);
    assert_eq!(app.turn_starting("b").await.status, Status::Compacted);
    let mut recalls = Vec::new();
    let mut stated = Vec::new();
    for session in ["a", "b"] {
        let metadata = &app.usage_events(session).await[0].4;
        let (total, kept, said) = figures(metadata);
        recalls.push(kept.unwrap() as f64 / total.unwrap() as f64);
        stated.push(said.unwrap() as f64 / total.unwrap() as f64);
    }
    assert_ne!(recalls[0], recalls[1], "two different recalls: {recalls:?}");
    assert_ne!(
        stated[0], stated[1],
        "two different statement recalls: {stated:?}"
    );
    // Events the mean leaves out: a part with no facts, a worker with the check off, a
    // malformed figure (which must not fail the insert either).
    app.db
        .query(
            "INSERT INTO usage_events (session_id, model, metadata) VALUES
                 ('x', 'm', '{\"summarization\": true, \"facts_total\": 0, \"facts_kept\": 0, \"facts_stated\": 0}'),
                 ('x', 'm', '{\"summarization\": true}'),
                 ('x', 'm', '{\"summarization\": true, \"facts_total\": \"many\", \"facts_kept\": 1, \"facts_stated\": 1}'),
                 ('x', 'm', '{\"summarization\": true, \"facts_total\": 4, \"facts_stated\": \"all\"}')",
        )
        .execute()
        .await
        .unwrap();
    let mean = (recalls[0] + recalls[1]) / 2.0;
    let stated_mean = (stated[0] + stated[1]) / 2.0;

    let stats = app.stats().await;
    let cli = summarizer_cli(&app.database_url, &["stats", "--json"]);
    let table = summarizer_cli(&app.database_url, &["stats"]);

    let reported = stats["summary"]["mean_fact_recall"].as_f64().unwrap();
    assert!((reported - mean).abs() < 1e-9, "{reported} vs {mean}");
    let reported_stated = stats["summary"]["mean_statement_recall"].as_f64().unwrap();
    assert!(
        (reported_stated - stated_mean).abs() < 1e-9,
        "{reported_stated} vs {stated_mean}"
    );
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        cli["summary"]["mean_fact_recall"],
        stats["summary"]["mean_fact_recall"]
    );
    assert_eq!(stats["summary"]["total_summarizations"], 6);
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("mean_fact_recall"))
        .unwrap_or_else(|| panic!("no mean_fact_recall row in\n{table}"));
    assert!(row.ends_with(&format!("{mean:.3}")), "{row}");
    let row = table
        .lines()
        .find(|l| l.starts_with("mean_statement_recall"))
        .unwrap_or_else(|| panic!("no mean_statement_recall row in\n{table}"));
    assert!(row.ends_with(&format!("{stated_mean:.3}")), "{row}");

    // A restore takes the compaction out of the totals, not its summary's recall.
    let restored = summarizer_cli(&app.database_url, &["restore", "a"]);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    let stats = app.stats().await;
    assert_eq!(stats["summary"]["total_summarizations"], 5);
    assert_eq!(
        stats["summary"]["mean_fact_recall"].as_f64(),
        Some(reported)
    );
    assert_eq!(
        stats["summary"]["mean_statement_recall"].as_f64(),
        Some(reported_stated)
    );
}

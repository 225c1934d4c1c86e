//! The fact check (`SUMMARY_FACT_CHECK`): each summary's recall of the removed part's
//! identifiers is recorded in its usage event and reported by `/stats`; in `retry` mode an
//! LLM summary below `SUMMARY_MIN_FACT_RECALL` is asked for once more, listing what it
//! lost, and the better of the two is written. The expected figures are measured here
//! from the archive (what was removed) and the summary as written.

use std::time::Duration;

use serde_json::{Value, json};
use summarizer::facts::{FactSet, Recall};
use summarizer::message::Message;
use summarizer::outcome::Status;
use summarizer::summary::HEADINGS;
use wiremock::matchers::method;
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::helpers::{SUMMARY, Stored, TestApp, completion, spawn_app_with};

const RETRY: (&str, &str) = ("SUMMARY_FACT_CHECK", "retry");

/// The header a second attempt's list of missing identifiers starts with.
const LISTED: &str = " identifiers a first summary left out]\n";

/// A summary in the template that keeps almost nothing of the test histories.
const VAGUE: &str = "**Investigating:** an outage\n**Key findings:**\n- things were slow\n**Ruled out:** nothing ruled out yet\n**Current state:** looking into it";

/// A model that does as it is told: [`SUMMARY`] at first; asked again, a summary with
/// every identifier listed (within `SUMMARY_MAX_CHARS`), and a usage of its own.
struct Obliging;

impl Respond for Obliging {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        obliging(request, HEADINGS.len())
    }
}

/// [`Obliging`]'s answer, with only the first `headings` of the template's four.
fn obliging(request: &Request, headings: usize) -> ResponseTemplate {
    let listed = listed(request);
    if listed.is_empty() {
        return completion(SUMMARY);
    }
    let mut findings = String::new();
    for fact in listed {
        if findings.len() + fact.len() > 5_000 {
            break;
        }
        findings.push_str(&format!("- saw {fact}\n"));
    }
    let sections = [
        "**Investigating:** checkout-api slow".to_owned(),
        format!("**Key findings:**\n{findings}"),
        "**Ruled out:** DNS".to_owned(),
        "**Current state:** checking the database".to_owned(),
    ];
    answer_with_usage(&sections[..headings].join("\n"))
}

/// A chat completion of `summary`, with a usage that tells it from [`completion`]'s
/// (812 prompt and 64 completion tokens).
fn answer_with_usage(summary: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "model": "fake-model-2026",
        "choices": [{"message": {"role": "assistant", "content": summary}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 100}
    }))
}

/// The request's user message: the transcript, and in a second attempt the list.
fn user_message(request: &Request) -> String {
    let body: Value = request.body_json().unwrap();
    body["messages"][1]["content"].as_str().unwrap().to_owned()
}

/// The request's transcript, up to its end, its random marker replaced by `M`.
fn transcript(request: &Request) -> String {
    let user = user_message(request);
    let marker = user
        .split_once("from [")
        .unwrap()
        .1
        .split_once(' ')
        .unwrap()
        .0;
    let user = user.replace(marker, "M");
    let end = user.rfind("[M end of transcript]").unwrap();
    user[..end].to_owned()
}

/// The identifiers a second attempt lists, in order; none in a first attempt.
fn listed(request: &Request) -> Vec<String> {
    let user = user_message(request);
    let Some((_, list)) = user.split_once(LISTED) else {
        return Vec::new();
    };
    list.lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(str::to_owned)
        .collect()
}

/// The fake LLM answers `first` to the first request and `then` to the rest.
async fn llm_answers_then(app: &TestApp, first: ResponseTemplate, then: impl Respond + 'static) {
    Mock::given(method("POST"))
        .respond_with(first)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.llm)
        .await;
    Mock::given(method("POST"))
        .respond_with(then)
        .mount(&app.llm)
        .await;
}

fn message(m: Stored) -> Message {
    Message {
        seq: m.seq,
        role: m.role.parse().unwrap(),
        content: m.content.unwrap_or_default(),
        tool_calls: m.tool_calls,
        tool_call_id: m.tool_call_id,
        is_summary: m.is_summary,
        chars: m.chars,
    }
}

/// The facts of what the session's compactions removed, from the archive.
async fn removed_facts(app: &TestApp, session: &str) -> FactSet {
    let old: Vec<Message> = app
        .archived(session)
        .await
        .into_iter()
        .map(message)
        .collect();
    FactSet::of_messages(&old)
}

/// The session's summary, as written.
async fn written_summary(app: &TestApp, session: &str) -> String {
    let messages = app.messages(session).await;
    assert!(messages[0].is_summary, "{messages:?}");
    messages[0].content.clone().unwrap()
}

/// `(facts_total, facts_kept)` of a usage event's metadata.
fn figures(metadata: &Value) -> (Option<u64>, Option<u64>) {
    (
        metadata["facts_total"].as_u64(),
        metadata["facts_kept"].as_u64(),
    )
}

fn recorded(recall: &Recall) -> (Option<u64>, Option<u64>) {
    (Some(recall.total as u64), Some(recall.kept as u64))
}

async fn metrics(app: &TestApp) -> String {
    reqwest::get(format!("http://{}/metrics", app.http_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_summary_that_drops_identifiers_is_asked_for_once_more_and_the_better_one_written() {
    let app = spawn_app_with(&[RETRY]).await;
    Mock::given(method("POST"))
        .respond_with(Obliging)
        .mount(&app.llm)
        .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let requests = app.llm.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2, "exactly one more request");
    let facts = removed_facts(&app, "s").await;
    let first = facts.recall(SUMMARY);
    assert!(
        first.ratio() < 0.8,
        "the first summary is below the minimum: {first:?}"
    );
    assert!(listed(&requests[0]).is_empty());
    assert_eq!(
        listed(&requests[1]),
        first.missing,
        "every missing identifier, in order"
    );
    assert_eq!(
        transcript(&requests[1]),
        transcript(&requests[0]),
        "the same transcript"
    );
    let written = written_summary(&app, "s").await;
    assert_ne!(written, SUMMARY, "the second, better summary is written");
    let kept = facts.recall(&written);
    assert!(kept.kept > first.kept, "{kept:?} vs {first:?}");
    let events = app.usage_events("s").await;
    let (_, _, prompt_tokens, completion_tokens, metadata) = &events[0];
    assert_eq!(
        (*prompt_tokens, *completion_tokens),
        (Some(812 + 900), Some(64 + 100)),
        "both calls are paid for"
    );
    assert_eq!(
        figures(metadata),
        recorded(&kept),
        "the written summary's figures"
    );
    assert_eq!(metadata["fact_retry"], true);
    assert_eq!(metadata["fact_retry_outcome"], "improved");
    let metrics = metrics(&app).await;
    for line in [
        "summarizer_fact_retries_total{outcome=\"improved\"} 1",
        "summarizer_fact_recall_count 1",
        "summarizer_llm_duration_seconds_count 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_second_summary_that_keeps_no_more_leaves_the_first() {
    let app = spawn_app_with(&[RETRY]).await;
    llm_answers_then(&app, completion(SUMMARY), answer_with_usage(VAGUE)).await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 2);
    assert_eq!(written_summary(&app, "s").await, SUMMARY);
    let facts = removed_facts(&app, "s").await;
    let events = app.usage_events("s").await;
    let (_, _, prompt_tokens, completion_tokens, metadata) = &events[0];
    assert_eq!(
        (*prompt_tokens, *completion_tokens),
        (Some(1712), Some(164))
    );
    assert_eq!(figures(metadata), recorded(&facts.recall(SUMMARY)));
    assert_eq!(metadata["fact_retry_outcome"], "not_improved");
}

/// A second answer that comes to nothing, and the usage the worker reads from it.
struct Failing {
    what: &'static str,
    answer: Box<dyn Fn(&Request) -> ResponseTemplate + Send + Sync>,
    usage: Option<(i32, i32)>,
}

#[tokio::test]
async fn a_second_attempt_that_fails_leaves_the_first_summary_and_the_compaction_succeeds() {
    let cases = [
        Failing {
            what: "HTTP 500 until the deadline",
            answer: Box::new(|_| ResponseTemplate::new(500).set_body_string("overloaded")),
            usage: None,
        },
        Failing {
            what: "a summary that lists every identifier but lacks a heading",
            answer: Box::new(|request| obliging(request, 3)),
            usage: Some((900, 100)),
        },
        Failing {
            what: "a summary longer than what it replaces",
            answer: Box::new(|_| {
                let long = "- 10.0.0.1:5432 reset\n".repeat(40_000);
                answer_with_usage(&format!("{SUMMARY}\n{long}"))
            }),
            usage: Some((900, 100)),
        },
        Failing {
            what: "a completion larger than the worker reads (8 MiB)",
            answer: Box::new(|_| {
                let endless = "- 10.0.0.1:5432 reset\n".repeat(1 << 20);
                answer_with_usage(&format!("{SUMMARY}\n{endless}"))
            }),
            usage: None,
        },
        Failing {
            what: "a body that is not a completion",
            answer: Box::new(|_| ResponseTemplate::new(200).set_body_string("{\"choices\": [oops")),
            usage: None,
        },
    ];
    for Failing {
        what,
        answer,
        usage,
    } in cases
    {
        let app = spawn_app_with(&[
            RETRY,
            ("LLM_MAX_RETRIES", "50"),
            ("LLM_RETRY_MIN_DELAY_MS", "50"),
            ("LLM_RETRY_MAX_DELAY_MS", "200"),
            ("LLM_DEADLINE_MS", "2000"),
        ])
        .await;
        llm_answers_then(&app, completion(SUMMARY), answer).await;
        app.append_turns("s", 5).await;

        let started = std::time::Instant::now();
        let reply = app.turn_starting("s").await;

        assert_eq!(reply.status, Status::Compacted, "{what}: {reply:?}");
        assert!(
            started.elapsed() < Duration::from_millis(2000 + 1500),
            "{what}: within the deadline, {:?}",
            started.elapsed()
        );
        assert!(app.llm_requests().await >= 2, "{what}");
        assert_eq!(written_summary(&app, "s").await, SUMMARY, "{what}");
        let facts = removed_facts(&app, "s").await;
        let events = app.usage_events("s").await;
        let (_, _, prompt_tokens, completion_tokens, metadata) = &events[0];
        let (extra_prompt, extra_completion) = usage.unwrap_or((0, 0));
        assert_eq!(
            (*prompt_tokens, *completion_tokens),
            (Some(812 + extra_prompt), Some(64 + extra_completion)),
            "{what}: an answer the check refused was paid for too"
        );
        assert_eq!(
            figures(metadata),
            recorded(&facts.recall(SUMMARY)),
            "{what}"
        );
        assert_eq!(
            (&metadata["fact_retry"], &metadata["fact_retry_outcome"]),
            (&json!(true), &json!("failed")),
            "{what}"
        );
        assert_eq!(app.lease_owner("s").await, None, "{what}");
        let backing_off: bool =
            sqlx::query_scalar("SELECT retry_at IS NOT NULL FROM sessions WHERE session_id = 's'")
                .fetch_one(&app.db)
                .await
                .unwrap();
        assert!(!backing_off, "{what}: a compaction, not a failure");
        let metrics = metrics(&app).await;
        let line = "summarizer_fact_retries_total{outcome=\"failed\"} 1";
        assert!(metrics.lines().any(|l| l == line), "{what}: {metrics}");
        let report = app.check().await;
        assert!(report.is_clean(), "{what}: {report}");
    }
}

#[tokio::test]
async fn no_second_attempt_starts_once_the_lease_is_three_quarters_gone() {
    // The first answer comes 800 ms into a 1 s lease: a second attempt could only end
    // after the lease, and another worker could take the session and the summary with it.
    let app = spawn_app_with(&[RETRY, ("LEASE_DURATION_MS", "1000")]).await;
    llm_answers_then(
        &app,
        completion(SUMMARY).set_delay(Duration::from_millis(800)),
        Obliging,
    )
    .await;
    app.append_turns("s", 5).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 1, "not asked again");
    assert_eq!(written_summary(&app, "s").await, SUMMARY);
    let metadata = &app.usage_events("s").await[0].4;
    let recall = removed_facts(&app, "s").await.recall(SUMMARY);
    assert!(recall.ratio() < 0.8, "{recall:?}");
    assert_eq!(figures(metadata), recorded(&recall));
    assert_eq!(metadata["fact_retry"], false);
}

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
                "fact_retry",
                "fact_retry_outcome",
            ] {
                assert_eq!(metadata.get(key), None, "{key} in {metadata}");
            }
            let stats = app.stats().await;
            assert_eq!(stats["summary"]["mean_fact_recall"], Value::Null);
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
    for session in ["a", "b"] {
        let metadata = &app.usage_events(session).await[0].4;
        let (total, kept) = figures(metadata);
        recalls.push(kept.unwrap() as f64 / total.unwrap() as f64);
    }
    assert_ne!(recalls[0], recalls[1], "two different recalls: {recalls:?}");
    // Events the mean leaves out: a part with no facts, a worker with the check off, a
    // malformed figure (which must not fail the insert either).
    sqlx::query(
        "INSERT INTO usage_events (session_id, model, metadata) VALUES
             ('x', 'm', '{\"summarization\": true, \"facts_total\": 0, \"facts_kept\": 0}'),
             ('x', 'm', '{\"summarization\": true}'),
             ('x', 'm', '{\"summarization\": true, \"facts_total\": \"many\", \"facts_kept\": 1}')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let mean = (recalls[0] + recalls[1]) / 2.0;

    let stats = app.stats().await;
    let cli = summarizer_cli(&app.database_url, &["stats", "--json"]);
    let table = summarizer_cli(&app.database_url, &["stats"]);

    let reported = stats["summary"]["mean_fact_recall"].as_f64().unwrap();
    assert!((reported - mean).abs() < 1e-9, "{reported} vs {mean}");
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
    assert_eq!(stats["summary"]["total_summarizations"], 5);
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("mean_fact_recall"))
        .unwrap_or_else(|| panic!("no mean_fact_recall row in\n{table}"));
    assert!(row.ends_with(&format!("{mean:.3}")), "{row}");

    // A restore takes the compaction out of the totals, not its summary's recall.
    let restored = summarizer_cli(&app.database_url, &["restore", "a"]);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    let stats = app.stats().await;
    assert_eq!(stats["summary"]["total_summarizations"], 4);
    assert_eq!(
        stats["summary"]["mean_fact_recall"].as_f64(),
        Some(reported)
    );
}

/// About `bytes` of log lines, every one naming its own host, request and time: some
/// three distinct identifiers a line.
fn distinct_log_lines(bytes: usize) -> String {
    let mut dump = String::with_capacity(bytes + 200);
    let mut n = 0u64;
    while dump.len() < bytes {
        dump.push_str(&format!(
            "2026-03-01T{:02}:{:02}:{:02}.{:03}Z ERROR host-{n}.internal request \
             req-{:08x} failed after {}ms\n",
            n / 3_600_000 % 24,
            n / 60_000 % 60,
            n / 1000 % 60,
            n % 1000,
            n.wrapping_mul(2_654_435_761) % (1 << 32),
            n % 5000
        ));
        n += 1;
    }
    dump
}

/// A hostile old part: a 5 MB tool output of more than 100,000 distinct identifiers,
/// with the check in `retry` mode. The worker runs on this test's one runtime thread,
/// so anything it did there for long would hold up a ticker beside it: extracting the
/// facts takes seconds in a debug build, measuring a summary against them about one.
#[tokio::test]
async fn a_5_mb_old_part_of_100k_identifiers_is_checked_without_holding_an_async_thread() {
    let app = spawn_app_with(&[
        RETRY,
        ("LLM_DEADLINE_MS", "100000"),
        ("LEASE_DURATION_MS", "200000"),
    ])
    .await;
    Mock::given(method("POST"))
        .respond_with(Obliging)
        .mount(&app.llm)
        .await;
    app.append("big", "user", "Why do requests fail?", None, None)
        .await;
    let call = json!([{"id": "dump", "name": "get_logs", "arguments": "{}"}]);
    app.append("big", "assistant", "", Some(call), None).await;
    app.append(
        "big",
        "tool",
        &distinct_log_lines(5_000_000),
        None,
        Some("dump"),
    )
    .await;
    app.append("big", "assistant", "Upstream resets.", None, None)
        .await;
    for n in 2..=5 {
        app.append_turn("big", n).await;
    }

    let client = app.client.clone();
    let compaction =
        tokio::spawn(async move { client.turn_starting("big", Duration::from_secs(180)).await });
    let mut late = Duration::ZERO;
    while !compaction.is_finished() {
        let tick = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        late = late.max(tick.elapsed().saturating_sub(Duration::from_millis(5)));
    }
    let reply = match compaction.await.unwrap() {
        summarizer::client::Decision::Replied(reply) => reply,
        other => panic!("no reply: {other:?}"),
    };

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    eprintln!(
        "5 MB compaction: {} ms, the runtime thread at most {late:?} late",
        reply.duration_ms
    );
    assert!(
        late < Duration::from_millis(750),
        "the thread was held {late:?}"
    );
    let facts = removed_facts(&app, "big").await;
    let first = facts.recall(SUMMARY);
    let written = facts.recall(&written_summary(&app, "big").await);
    assert!(facts.len() > 100_000, "{}", facts.len());
    let metadata = &app.usage_events("big").await[0].4;
    assert_eq!(figures(metadata), recorded(&written));
    assert_eq!(metadata["fact_retry_outcome"], "improved", "{metadata}");
    let requests = app.llm.received_requests().await.unwrap();
    let last = requests.last().unwrap();
    assert_eq!(
        listed(last),
        first.missing[..200],
        "the first 200 are listed"
    );
    let more = format!("({} more not listed", first.missing.len() - 200);
    assert!(user_message(last).contains(&more), "{more}");
    assert!(written.kept >= first.kept + 200, "{written:?}");
}

//! A hostile old part: megabytes of distinct identifiers.

use std::time::Duration;

use serde_json::json;
use summarizer::outcome::Status;
use wiremock::Mock;
use wiremock::matchers::method;

use super::*;
use crate::helpers::{SUMMARY, spawn_app_with};

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
/// facts takes about 3 s in a debug build.
#[tokio::test]
async fn a_5_mb_old_part_of_100k_identifiers_is_checked_without_holding_an_async_thread() {
    let app = spawn_app_with(&[
        RETRY,
        ("LLM_DEADLINE_MS", "100000"),
        ("LEASE_DURATION_MS", "200000"),
        // The 5 MB output is summarized, not evicted (tests/api/wall.rs evicts).
        ("TOOL_OUTPUT_MAX_CHARS", "0"),
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
    let metadata = &app.usage_events("big").await[0].4;
    assert_eq!(figures(metadata), recorded(&written));
    // The check weighs what the conversation established: the few identifiers the user
    // and the agent said and the dump's lines they relied on, not the 100,000 of the dump
    // that nobody did. The second attempt lists those few, and states them.
    let seen = metadata["facts_seen"].as_u64().unwrap();
    assert!(seen > 100_000, "{metadata}");
    assert!(facts.len() < 20, "{}", facts.len());
    assert_eq!(metadata["fact_retry_outcome"], "improved", "{metadata}");
    assert!(
        first.kept < written.kept && written.kept == facts.len(),
        "{metadata}"
    );
    let requests = app.llm.received_requests().await.unwrap();
    let lists: Vec<Vec<String>> = requests.iter().map(listed).collect();
    assert!(lists.iter().any(|l| !l.is_empty()) && lists.iter().all(|l| l.len() < 20));
}

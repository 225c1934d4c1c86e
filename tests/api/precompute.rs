//! `SUMMARIZATION_PRECOMPUTE_AT`: summaries prepared in the background before the
//! threshold and applied in one commit by the turn that crosses it.
//!
//! The test workers' threshold is 3000 and keep 1000; with the precompute at 0.5 a session
//! of three turns (about 2,300 chars) is in the band and a fourth crosses the threshold.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use serde_json::Value;
use summarizer::outcome::{Reason, Status};
use summarizer::summarizer::{LlmError, Summarizer, SummaryRequest};
use summarizer::summary::Summary;

use crate::fixtures::WorkerProcess;
use crate::helpers::{KEEP, SUMMARY, TestApp, eventually, setup, spawn_app_with, without_note};

const ON: (&str, &str) = ("SUMMARIZATION_PRECOMPUTE_AT", "0.5");

/// Three turns: in the band, below the threshold.
async fn in_the_band(app: &TestApp, session: &str) {
    app.append_turns(session, 3).await;
}

async fn pending_cut(app: &TestApp, session: &str) -> Option<i64> {
    app.db
        .query("SELECT cut_seq FROM pending_summaries WHERE session_id = $1")
        .bind(session)
        .scalar_optional()
        .await
        .unwrap()
}

pub async fn until_pending(app: &TestApp, session: &str) -> i64 {
    eventually("a pending summary", || async {
        pending_cut(app, session).await.is_some()
    })
    .await;
    pending_cut(app, session).await.unwrap()
}

/// `GET /metrics` of the first in-process worker.
async fn metrics(app: &TestApp) -> String {
    reqwest::get(format!("http://{}/metrics", app.http_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the metric line that starts with `series`, or 0 when it is absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn the_crossing_turn_is_compacted_from_the_pending_summary_without_an_llm_call() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "system", "You are an SRE assistant.", None, None)
        .await;
    in_the_band(&app, "s").await;

    let reply = app.turn_starting("s").await;
    assert_eq!(
        (reply.status, reply.reason),
        (Status::Skipped, Reason::BelowThreshold),
        "the band turn is answered as today"
    );
    let cut = until_pending(&app, "s").await;
    assert_eq!(
        app.llm_requests().await,
        1,
        "the summary is asked for early"
    );
    assert_eq!(
        app.lease_owner("s").await,
        None,
        "the precompute gave its lease back"
    );
    assert!(
        app.messages("s").await.iter().all(|m| !m.is_summary),
        "a pending summary is not applied"
    );

    app.append_turn("s", 4).await;
    let before = app.messages("s").await;
    let reply = app.turn_starting("s").await;

    assert_eq!(
        (reply.status, reply.reason),
        (Status::Compacted, Reason::Compacted)
    );
    assert_eq!(
        app.llm_requests().await,
        1,
        "no LLM call at the crossing turn"
    );
    // The planned prefix went: every non-system message before the cut, archived under
    // the one usage event, with the summary in its place.
    let after = app.messages("s").await;
    let archived = app.archived("s").await;
    let planned: Vec<_> = (before.iter())
        .filter(|m| m.seq < cut && m.role != "system")
        .cloned()
        .collect();
    assert_eq!(archived, planned);
    assert_eq!(reply.messages_removed, Some(planned.len() as i64));
    assert_eq!(
        reply.chars_removed,
        Some(planned.iter().map(|m| m.chars).sum())
    );
    assert_eq!(reply.messages_kept, Some(after.len() as i64 - 1));
    assert_eq!(after[0], before[0], "the system message stays");
    assert!(after[1].is_summary);
    assert_eq!(without_note(after[1].content.as_deref().unwrap()), SUMMARY);
    assert_eq!(after[1].seq, planned[0].seq);
    // The session grew since the precompute: the kept part is larger than KEEP, which
    // the rule allows ("at least KEEP").
    let kept: i64 = after[2..].iter().map(|m| m.chars).sum();
    assert!(kept >= KEEP + 700, "kept {kept}");
    let events = app.usage_events("s").await;
    assert_eq!(events.len(), 1);
    let (id, model, prompt, completion, metadata) = &events[0];
    assert_eq!(reply.compaction_id, Some(*id));
    assert_eq!(
        (model.as_str(), *prompt, *completion),
        ("fake-model-2026", Some(812), Some(64))
    );
    assert_eq!(metadata["precomputed"], Value::Bool(true));
    assert_eq!(metadata["summarization"], Value::Bool(true));
    assert_eq!(
        metadata["messages_removed"].as_i64(),
        reply.messages_removed
    );
    assert_eq!(metadata["chars_removed"].as_i64(), reply.chars_removed);
    assert_eq!(metadata["messages_kept"].as_i64(), reply.messages_kept);
    assert!(metadata["facts_total"].as_i64().unwrap() > 0);
    assert!(metadata["precompute_ms"].is_i64());
    assert_eq!(pending_cut(&app, "s").await, None, "applied once");
    assert_eq!(app.lease_owner("s").await, None);
    assert!(app.check().await.is_clean());

    let stats = &app.stats().await["summary"];
    assert_eq!(stats["total_precomputed"], 1);
    assert_eq!(stats["precomputed_share"], 1.0);
    let text = metrics(&app).await;
    assert_eq!(metric(&text, "summarizer_precomputes_started_total"), 1.0);
    assert_eq!(metric(&text, "summarizer_precomputes_used_total"), 1.0);
    assert_eq!(
        metric(
            &text,
            "summarizer_compaction_turn_duration_seconds_count{precomputed=\"true\"}"
        ),
        1.0
    );
    // Restoring it works as for any compaction.
    app.store.restore("s", None).await.unwrap();
    assert_eq!(app.messages("s").await, before);
}

#[tokio::test]
async fn an_edit_of_the_old_part_drops_the_pending_summary_and_the_turn_compacts_as_usual() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    in_the_band(&app, "s").await;
    app.turn_starting("s").await;
    let cut = until_pending(&app, "s").await;

    // The same text written again: same length, same content, another row version.
    app.db
        .query(
            "UPDATE messages SET content = content
             WHERE session_id = 's' AND seq = (SELECT min(seq) FROM messages WHERE session_id = 's')",
        )
        .execute()
        .await
        .unwrap();
    app.append_turn("s", 4).await;
    let before = app.messages("s").await;
    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 2, "summarized again, as usual");
    let events = app.usage_events("s").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].4.get("precomputed"), None);
    // The normal path planned the grown session: it removes more than the stale plan did.
    let archived = app.archived("s").await;
    assert!(archived.iter().any(|m| m.seq >= cut), "planned anew");
    let mut rebuilt: Vec<_> = archived
        .into_iter()
        .chain(
            app.messages("s")
                .await
                .into_iter()
                .filter(|m| !m.is_summary),
        )
        .collect();
    rebuilt.sort_by_key(|m| m.seq);
    assert_eq!(rebuilt, before, "nothing lost");
    assert_eq!(pending_cut(&app, "s").await, None);
    let text = metrics(&app).await;
    assert_eq!(
        metric(
            &text,
            "summarizer_precomputes_discarded_total{reason=\"prefix_changed\"}"
        ),
        1.0
    );
    assert_eq!(app.stats().await["summary"]["precomputed_share"], 0.0);
}

#[tokio::test]
async fn a_row_inserted_before_the_cut_drops_the_pending_summary() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    in_the_band(&app, "s").await;
    app.turn_starting("s").await;
    let cut = until_pending(&app, "s").await;
    // An agent that writes its own seqs puts a message into the old part.
    let first: i64 = app.messages("s").await[0].seq;
    assert!(first + 1 < cut);
    app.db
        .query("UPDATE messages SET seq = seq + 1000000 WHERE session_id = 's' AND seq = $1")
        .bind(first + 1)
        .execute()
        .await
        .unwrap();
    app.db
        .query("UPDATE messages SET seq = $1 WHERE session_id = 's' AND seq = $1 + 1000000")
        .bind(first + 1)
        .execute()
        .await
        .unwrap();
    app.append_turn("s", 4).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 2);
    assert_eq!(app.usage_events("s").await[0].4.get("precomputed"), None);
}

#[tokio::test]
async fn a_late_result_of_a_call_in_the_pending_prefix_drops_the_pending_summary() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    in_the_band(&app, "s").await;
    app.turn_starting("s").await;
    let cut = until_pending(&app, "s").await;
    let call_1 = app.messages("s").await;
    assert!(
        call_1
            .iter()
            .any(|m| m.seq < cut && m.tool_call_id.as_deref() == Some("call-1")),
        "the pending prefix holds call-1 and its result"
    );
    // The agent writes another result of call-1, then crosses the threshold.
    app.append(
        "s",
        "tool",
        "call-1, retried: pool at 100%",
        None,
        Some("call-1"),
    )
    .await;
    app.append_turn("s", 4).await;
    let reply = app.turn_starting("s").await;

    assert_ne!(reply.reason, Reason::Compacted, "not applied: {reply:?}");
    assert!(
        app.usage_events("s")
            .await
            .iter()
            .all(|e| e.4.get("precomputed").is_none()),
        "the pending summary was not applied"
    );
    assert_eq!(pending_cut(&app, "s").await, None, "and it is gone");
    let text = metrics(&app).await;
    assert_eq!(
        metric(
            &text,
            "summarizer_precomputes_discarded_total{reason=\"pairing_changed\"}"
        ),
        1.0
    );
    // Planned afresh, the call and both its results stay together.
    let report = app.check().await;
    assert!(report.is_clean(), "{report:?}");
    assert!(
        app.messages("s")
            .await
            .iter()
            .any(|m| m.tool_call_id.as_deref() == Some("call-1")),
        "the results of call-1 are live, so its call is too"
    );
}

/// A model server that names every call `call_0`: each kept result answers the kept
/// call of that id, not the archived ones, so the pending summary is applied.
#[tokio::test]
async fn reused_call_ids_in_the_kept_part_do_not_drop_the_pending_summary() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let app = &app;
    let turn = |n: usize| async move {
        let calls = serde_json::json!([{"id": "call_0", "name": "get_logs", "arguments": {}}]);
        app.append(
            "s",
            "user",
            &format!("Turn {n}: why? {}", crate::helpers::filler(40)),
            None,
            None,
        )
        .await;
        app.append("s", "assistant", "", Some(calls), None).await;
        app.append(
            "s",
            "tool",
            &format!("pool exhausted {}", crate::helpers::filler(300)),
            None,
            Some("call_0"),
        )
        .await;
        app.append(
            "s",
            "assistant",
            &format!("Finding {n} {}", crate::helpers::filler(330)),
            None,
            None,
        )
        .await;
    };
    for n in 1..=3 {
        turn(n).await;
    }
    app.turn_starting("s").await;
    until_pending(app, "s").await;
    turn(4).await;

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(
        app.llm_requests().await,
        1,
        "applied from the pending summary"
    );
    assert_eq!(app.usage_events("s").await[0].4["precomputed"], true);
    assert!(app.check().await.is_clean());
}

#[tokio::test]
async fn a_session_that_outgrew_its_pending_summary_is_compacted_as_usual() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    in_the_band(&app, "s").await;
    app.turn_starting("s").await;
    until_pending(&app, "s").await;
    // A log dump arrives: applying the pending summary would leave the session over its
    // threshold, and the agent would send that to its model.
    app.append("s", "user", "Here is the full log.", None, None)
        .await;
    app.append("s", "assistant", &crate::helpers::filler(6000), None, None)
        .await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 2, "summarized again, as usual");
    assert_eq!(app.usage_events("s").await[0].4.get("precomputed"), None);
    let text = metrics(&app).await;
    assert_eq!(
        metric(
            &text,
            "summarizer_precomputes_discarded_total{reason=\"outgrown\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn other_limits_or_an_expired_pending_summary_are_not_applied() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    for session in ["keep", "old"] {
        in_the_band(&app, session).await;
        app.turn_starting(session).await;
        until_pending(&app, session).await;
        app.append_turn(session, 4).await;
    }
    assert_eq!(app.llm_requests().await, 2);

    // The crossing turn asks for another keep: the pending summary was planned for 1000.
    let reply = app
        .send_raw(br#"{"session_id":"keep","keep_chars":1500}"#)
        .await;
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 3);
    let kept: i64 = (app.messages("keep").await.iter())
        .filter(|m| !m.is_summary)
        .map(|m| m.chars)
        .sum();
    assert!(kept >= 1500, "compacted with the turn's own keep: {kept}");

    // A pending summary older than PRECOMPUTE_TTL_MS (an hour by default). (SQLite keeps
    // its age in unix milliseconds, as the worker's clock reads it.)
    app.db
        .query(app.db.per_backend(
            "UPDATE pending_summaries SET created_at = now() - interval '61 minutes'
             WHERE session_id = 'old'",
            "UPDATE pending_summaries SET created_at = created_at - 61 * 60 * 1000
             WHERE session_id = 'old'",
        ))
        .execute()
        .await
        .unwrap();
    let reply = app.turn_starting("old").await;
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 4);
    for session in ["keep", "old"] {
        assert_eq!(
            app.usage_events(session).await[0].4.get("precomputed"),
            None
        );
        assert_eq!(pending_cut(&app, session).await, None);
    }
    let text = metrics(&app).await;
    for reason in ["settings_changed", "expired"] {
        let series = format!("summarizer_precomputes_discarded_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&text, &series), 1.0, "{reason}");
    }
}

#[tokio::test]
async fn the_band_turn_is_answered_before_the_precompute_ends_and_the_crossing_turn_is_busy_meanwhile()
 {
    let app = spawn_app_with(&[ON]).await;
    // Under the test workers' LLM_TIMEOUT_MS (3 s).
    app.llm_answers(SUMMARY, Duration::from_secs(2)).await;
    in_the_band(&app, "s").await;

    let reply = app.turn_starting("s").await;
    assert_eq!(reply.reason, Reason::BelowThreshold);
    app.until_llm_called(1).await;
    assert_eq!(
        pending_cut(&app, "s").await,
        None,
        "answered while the LLM still works"
    );

    // The session crosses while its summary is being prepared: the lease is held.
    app.append_turn("s", 4).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Busy);
    assert!(app.messages("s").await.iter().all(|m| !m.is_summary));

    until_pending(&app, "s").await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 1);
    assert_eq!(app.usage_events("s").await[0].4["precomputed"], true);
}

#[tokio::test]
async fn two_workers_never_precompute_one_session_twice() {
    let mut app = setup(&[ON]).await;
    app.start_worker(&[]).await;
    app.start_worker(&[]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(300)).await;
    in_the_band(&app, "s").await;

    // Band turns to both workers, before, during and after the precompute.
    let burst = |n: usize| {
        (0..n)
            .map(|_| app.turn_starting_in_background("s"))
            .collect::<Vec<_>>()
    };
    for reply in join_all(burst(20)).await {
        let reply = reply.unwrap();
        assert!(
            matches!(&reply, summarizer::client::Decision::Replied(r) if r.reason == Reason::BelowThreshold),
            "{reply:?}"
        );
    }
    until_pending(&app, "s").await;
    for reply in join_all(burst(20)).await {
        reply.unwrap();
    }
    let started: i64 = (app.db)
        .query("SELECT count(*) FROM pending_summaries WHERE session_id = 's'")
        .scalar()
        .await
        .unwrap();
    assert_eq!(started, 1);
    assert_eq!(
        app.llm_requests().await,
        1,
        "one precompute across the fleet"
    );
    app.append_turn("s", 4).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 1);
}

#[tokio::test]
async fn a_worker_killed_during_a_precompute_leaves_no_pending_row_and_the_session_compacts_later()
{
    let mut app = setup(&[ON, ("LEASE_DURATION_MS", "1500"), ("HTTP_ADDR", "")]).await;
    app.llm_first_then_summary(
        crate::helpers::completion(SUMMARY).set_delay(Duration::from_secs(30)),
    )
    .await;
    let worker = WorkerProcess::spawn(&app.env(&[]));
    worker.wait_for_log("worker ready").await;
    in_the_band(&app, "s").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    app.until_llm_called(1).await;
    assert!(
        app.lease_owner("s").await.is_some(),
        "the precompute holds the lease"
    );
    worker.signal("KILL").await;

    assert_eq!(pending_cut(&app, "s").await, None, "nothing half written");
    eventually("the dead precompute's lease to expire", || {
        app.db.lease_expired("s")
    })
    .await;
    app.start_worker(&[]).await;
    app.append_turn("s", 4).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted);
    assert_eq!(app.usage_events("s").await[0].4.get("precomputed"), None);
    assert!(app.check().await.is_clean());
}

/// A summarizer that panics: a bug in it must not take the worker or the lease down.
struct Panicking;

impl Summarizer for Panicking {
    fn summarize<'a>(&'a self, _: SummaryRequest<'a>) -> BoxFuture<'a, Result<Summary, LlmError>> {
        Box::pin(async { panic!("summarizer bug") })
    }
}

#[tokio::test]
async fn a_panicking_precompute_gives_the_lease_back_and_the_worker_serves_on() {
    let mut app = setup(&[ON, ("FAILURE_BACKOFF_MS", "0")]).await;
    app.start_worker_with_summarizer(Arc::new(Panicking), &[])
        .await;
    in_the_band(&app, "s").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    eventually("the lease to be given back", || async {
        app.lease_owner("s").await.is_none()
            && metric(
                &metrics(&app).await,
                "summarizer_precomputes_finished_total{outcome=\"failed\"}",
            ) == 1.0
    })
    .await;
    assert_eq!(pending_cut(&app, "s").await, None);
    // The worker still answers, this session and others.
    app.append_turns("other", 1).await;
    assert_eq!(
        app.turn_starting("other").await.reason,
        Reason::BelowThreshold
    );
}

#[tokio::test]
async fn with_precompute_off_no_summary_is_prepared() {
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    in_the_band(&app, "s").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    app.append_turn("s", 4).await;
    // The crossing turn compacted with its own LLM call, and nothing was ever pending:
    // had a precompute started at the band turn, its call would be counted here.
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    assert_eq!(app.llm_requests().await, 1);
    let pending: i64 = (app.db)
        .query("SELECT count(*) FROM pending_summaries")
        .scalar()
        .await
        .unwrap();
    assert_eq!(pending, 0);
    assert_eq!(app.usage_events("s").await[0].4.get("precomputed"), None);
    let text = metrics(&app).await;
    assert_eq!(metric(&text, "summarizer_precomputes_started_total"), 0.0);
    let stats = &app.stats().await["summary"];
    assert_eq!(stats["total_precomputed"], 0);
}

#[tokio::test]
async fn a_worker_stopped_during_a_precompute_gives_the_lease_back_and_writes_nothing() {
    let mut app = setup(&[ON]).await;
    app.start_worker(&[]).await;
    app.llm_answers(SUMMARY, Duration::from_secs(2)).await;
    in_the_band(&app, "s").await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    app.until_llm_called(1).await;
    assert!(app.lease_owner("s").await.is_some());

    // SIGTERM as the in-process worker gets it: no event is in flight, so the drain does
    // not wait for the background precompute (had it waited, the 2 s summary would have
    // been stored); it abandons it.
    app.stop_workers().await;
    assert_eq!(app.lease_owner("s").await, None);
    assert_eq!(pending_cut(&app, "s").await, None);
}

#[tokio::test]
async fn a_history_the_planner_refuses_is_not_loaded_again_on_every_band_turn() {
    let app = spawn_app_with(&[ON]).await;
    // Two human turns, the first answered at length: in the band (about 2,000 chars),
    // and no human turn after the first message leaves 1,000 chars kept.
    app.append("s", "user", "Why is checkout-api slow?", None, None)
        .await;
    app.append("s", "assistant", &crate::helpers::filler(1900), None, None)
        .await;
    app.append("s", "user", "And now?", None, None).await;
    app.append("s", "assistant", "Still slow.", None, None)
        .await;
    for _ in 0..3 {
        assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
        eventually("the precompute to end", || async {
            app.lease_owner("s").await.is_none()
                && metric(
                    &metrics(&app).await,
                    "summarizer_precomputes_finished_total{outcome=\"not_planned\"}",
                ) == 1.0
        })
        .await;
    }
    // The refusal was remembered with the session's counters: the next band turns on
    // the same history started nothing.
    let text = metrics(&app).await;
    assert_eq!(metric(&text, "summarizer_precomputes_started_total"), 1.0);
    assert_eq!(app.llm_requests().await, 0);
}

/// A hostile size: 50,000 messages (about 4 MB) and a 1 MB log dump in the old part,
/// prepared in the background and applied at the crossing turn: the pending row's
/// arrays hold every removed message, and the apply compares them all.
#[tokio::test]
async fn a_fifty_thousand_message_session_with_a_megabyte_dump_is_applied_from_its_pending_summary()
{
    let app = spawn_app_with(&[
        ON,
        ("LLM_PROVIDER", "extractive"),
        ("SUMMARY_MAX_CHARS", "1500"),
    ])
    .await;
    // The dump first: it is in the old part, which the precompute summarizes.
    app.append("big", "user", "Here is the log of the night.", None, None)
        .await;
    app.append(
        "big",
        "tool",
        &crate::helpers::filler(1_000_000),
        None,
        None,
    )
    .await;
    app.db
        .query(
            "WITH RECURSIVE steps (m) AS (SELECT 1 UNION ALL SELECT m + 1 FROM steps WHERE m < 50000)
             INSERT INTO messages (session_id, role, content)
             SELECT 'big', CASE WHEN m % 4 = 0 THEN 'user' ELSE 'assistant' END,
                    'step ' || m || ': orders-db-' || (m % 7) || ' p99 ' || (m % 900)
                    || ' ms, ERROR 503 on checkout-api v2.' || (m % 9)
             FROM steps ORDER BY m",
        )
        .execute()
        .await
        .unwrap();
    app.append("big", "user", "What now?", None, None).await;
    let total: i64 = (app.db)
        .query("SELECT total_chars FROM sessions WHERE session_id = 'big'")
        .scalar()
        .await
        .unwrap();
    // This session's own threshold puts it in the band, then a turn of 2x the band
    // crosses it.
    let threshold = total * 5 / 4;
    let ask = format!(r#"{{"session_id":"big","threshold_chars":{threshold}}}"#);
    let reply = app.send_raw(ask.as_bytes()).await;
    assert_eq!(reply.reason, Reason::BelowThreshold, "{reply:?}");
    // Bounded, and longer than `eventually`'s 10 s: a debug build summarizes 4 MB and
    // extracts its facts in several seconds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        // The planned prefix's length: an array in Postgres, a JSON array in SQLite.
        let planned: i64 = (app.db)
            .query(app.db.per_backend(
                "SELECT coalesce(max(cardinality(removed_seqs)), 0)::bigint FROM pending_summaries",
                "SELECT coalesce(max(json_array_length(removed_seqs)), 0) FROM pending_summaries",
            ))
            .scalar()
            .await
            .unwrap();
        if planned > 49_000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pending summary; metrics:\n{}",
            metrics(&app).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.append(
        "big",
        "assistant",
        &crate::helpers::filler((total / 2) as usize),
        None,
        None,
    )
    .await;
    app.append("big", "user", "And the root cause?", None, None)
        .await;

    let reply = app.send_raw(ask.as_bytes()).await;

    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert!(reply.messages_removed.unwrap() > 49_000, "{reply:?}");
    let events = app.usage_events("big").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].4["precomputed"], true);
    let archived: i64 = (app
        .db
        .query("SELECT count(*) FROM archived_messages WHERE session_id = 'big'"))
    .scalar()
    .await
    .unwrap();
    assert_eq!(Some(archived), reply.messages_removed);
    assert!(app.check().await.is_clean());
}

#[tokio::test]
async fn a_pending_summary_leaves_a_pinned_message_in_place_when_applied() {
    let app = spawn_app_with(&[ON]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    in_the_band(&app, "s").await;
    let task = app.messages("s").await[0].clone();
    app.db
        .query("UPDATE messages SET pinned = true WHERE session_id = 's' AND seq = $1")
        .bind(task.seq)
        .execute()
        .await
        .unwrap();
    app.turn_starting("s").await;
    until_pending(&app, "s").await;
    app.append_turn("s", 4).await;

    let reply = app.turn_starting("s").await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    assert_eq!(app.llm_requests().await, 1, "applied, not summarized again");
    let events = app.usage_events("s").await;
    assert_eq!(events[0].4["precomputed"], Value::Bool(true));
    let after = app.messages("s").await;
    assert_eq!(after[0], task, "the pinned ask stays first, unarchived");
    assert!(app.archived("s").await.iter().all(|a| a.seq != task.seq));
    assert!(app.check().await.is_clean());
}

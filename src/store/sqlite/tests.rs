//! The operator side against a fresh in-memory database: the migration's triggers, then
//! each method over rows written by hand, as an agent or a commit would write them.

use crate::store::prelude::*;
use std::time::Duration;

use sqlx::Row;

use crate::config::Limits;
use crate::outcome::Reason;
use crate::overrides::{Change, Key};
use crate::store::{
    Invariant, NewDeadLetter, RestoreError, SessionCounts, SettingsError, SqliteStore,
};

async fn store() -> SqliteStore {
    let store = SqliteStore::connect_lazy("sqlite::memory:", 1, Duration::from_secs(5))
        .expect("a valid URL");
    store.migrate().await.expect("the migration applies");
    store
}

async fn exec(store: &SqliteStore, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(store.pool())
        .await
        .expect("the statement runs");
}

async fn counts(store: &SqliteStore, session_id: &str) -> Option<SessionCounts> {
    sqlx::query(
        "SELECT total_chars, message_count, human_turns FROM sessions WHERE session_id = ?1",
    )
    .bind(session_id)
    .fetch_optional(store.pool())
    .await
    .expect("the read runs")
    .map(|r| SessionCounts {
        total_chars: r.get(0),
        message_count: r.get(1),
        human_turns: r.get(2),
    })
}

fn counted(total_chars: i64, message_count: i64, human_turns: i64) -> Option<SessionCounts> {
    Some(SessionCounts {
        total_chars,
        message_count,
        human_turns,
    })
}

async fn row_version(store: &SqliteStore, seq: i64) -> i64 {
    sqlx::query_scalar("SELECT row_version FROM messages WHERE seq = ?1")
        .bind(seq)
        .fetch_one(store.pool())
        .await
        .expect("the row exists")
}

/// Session `s`: a system prompt and four turns (seqs 1-5), then a compaction (usage
/// event 1) that archived seqs 2 and 3 and put its summary at seq 2.
async fn compacted_session(store: &SqliteStore) {
    exec(
        store,
        r#"
        INSERT INTO messages (session_id, role, content) VALUES
            ('s', 'system', 'be brief'), ('s', 'user', 'héllo'), ('s', 'assistant', 'hi'),
            ('s', 'user', 'more'), ('s', 'assistant', 'sure');
        INSERT INTO usage_events (session_id, model, prompt_tokens, completion_tokens,
                                  metadata)
        VALUES ('s', 'm', 100, 10, '{"summarization": true, "messages_removed": 2,
                "chars_removed": 7, "tokens_removed": 3, "duration_ms": 40,
                "request_id": "r1", "job_id": "J:1:1", "facts_total": 4, "facts_kept": 3}');
        INSERT INTO archived_messages (compaction_id, session_id, seq, role, content,
            tool_calls, tool_call_id, is_summary, chars, created_at, external_id, extra)
        SELECT 1, session_id, seq, role, content, tool_calls, tool_call_id, is_summary,
               chars, created_at, external_id, extra
        FROM messages WHERE seq IN (2, 3);
        DELETE FROM messages WHERE seq IN (2, 3);
        INSERT INTO messages (session_id, seq, role, content, is_summary)
        VALUES ('s', 2, 'user', 'summary', 1);
        UPDATE sessions SET last_compaction_id = 1 WHERE session_id = 's';
        "#,
    )
    .await;
}

#[tokio::test]
async fn triggers_count_characters_and_follow_moved_rows() {
    let store = store().await;
    exec(
        &store,
        "INSERT INTO messages (session_id, role, content) VALUES
             ('a', 'system', 'sys'), ('a', 'user', 'héllo'), ('a', 'assistant', 'hi');
         INSERT INTO messages (session_id, role, tool_calls)
             VALUES ('a', 'assistant', '[{\"id\":\"c1\"}]');",
    )
    .await;
    assert_eq!(counts(&store, "a").await, counted(3 + 5 + 2 + 13, 4, 1));

    let before = row_version(&store, 2).await;
    exec(
        &store,
        "UPDATE sessions SET skip_reason = 'nothing_to_compact'",
    )
    .await;
    exec(&store, "UPDATE messages SET content = 'hé' WHERE seq = 2").await;
    assert_ne!(
        row_version(&store, 2).await,
        before,
        "an edit is a new version"
    );
    assert_eq!(counts(&store, "a").await, counted(3 + 2 + 2 + 13, 4, 1));
    let skip: Option<String> = sqlx::query_scalar("SELECT skip_reason FROM sessions")
        .fetch_one(store.pool())
        .await
        .expect("the row exists");
    assert_eq!(skip, None, "an edit forgets the remembered refusal");

    let unrelated = row_version(&store, 3).await;
    exec(&store, "UPDATE messages SET row_version = row_version").await;
    exec(&store, "UPDATE sessions SET lease_owner = 'w'").await;
    assert_eq!(row_version(&store, 3).await, unrelated);

    exec(&store, "UPDATE messages SET session_id = 'b' WHERE seq = 2").await;
    assert_eq!(counts(&store, "a").await, counted(3 + 2 + 13, 3, 0));
    assert_eq!(counts(&store, "b").await, counted(2, 1, 1));
    exec(&store, "UPDATE messages SET is_summary = 1 WHERE seq = 2").await;
    assert_eq!(counts(&store, "b").await, counted(2, 1, 0));
    exec(&store, "DELETE FROM messages").await;
    assert_eq!(counts(&store, "a").await, counted(0, 0, 0));
    assert_eq!(counts(&store, "b").await, counted(0, 0, 0));
}

#[tokio::test]
async fn stats_read_the_rollups_of_hand_written_events() {
    let store = store().await;
    compacted_session(&store).await;
    exec(
        &store,
        r#"INSERT INTO usage_events (session_id, model, prompt_tokens, metadata)
           VALUES ('t', 'm', 5, '{"summarization": true, "precomputed": true,
                   "messages_removed": 1, "chars_removed": 3, "duration_ms": 1000}'),
                  ('t', 'm', 7, '{"agent": true}');"#,
    )
    .await;
    store
        .count_failure(Reason::LlmError)
        .await
        .expect("counted");
    store
        .count_failure(Reason::LlmError)
        .await
        .expect("counted");
    store
        .count_failure(Reason::Conflict)
        .await
        .expect("counted");

    let report = store.stats(7).await.expect("the stats read");
    let stats = &report.summary;
    assert_eq!(stats.total_summarizations, 2);
    assert_eq!(stats.total_chars_compacted, 10);
    assert_eq!(stats.total_messages_compacted, 3);
    assert_eq!(stats.total_tokens_compacted, 3);
    assert_eq!(stats.prompt_tokens, 105);
    assert_eq!(stats.completion_tokens, 10);
    assert_eq!(stats.average_chars_removed, Some(5.0));
    // 40 ms falls in bucket 11 (< 45.3 ms), 1000 ms in bucket 20 (< 1024 ms).
    assert_eq!(stats.p50_duration_ms, Some(45.3));
    assert_eq!(stats.p95_duration_ms, Some(1024.0));
    assert_eq!(stats.mean_fact_recall, Some(0.75));
    assert_eq!(stats.total_precomputed, 1);
    assert_eq!(stats.precomputed_share, Some(0.5));
    assert_eq!(stats.failures_by_reason.get("llm_error"), Some(&2));
    assert_eq!(stats.failures_by_reason.get("conflict"), Some(&1));
    let at = stats
        .last_summarization_at
        .as_deref()
        .expect("a summarization");
    assert_eq!(at.len(), "2026-12-03T08:16:00.123Z".len(), "{at}");
    assert!(at.ends_with('Z'), "{at}");
    assert_eq!(report.daily.len(), 1);
    let today = &report.daily[0];
    assert_eq!(today.day, at[..10]);
    assert_eq!((today.compactions, today.chars_removed), (2, 10));
    assert_eq!((today.messages_removed, today.failures), (3, 3));
    assert_eq!((today.prompt_tokens, today.completion_tokens), (105, 10));

    // A restored event stops counting as a compaction; its tokens still count.
    exec(
        &store,
        "UPDATE usage_events SET metadata = json_set(metadata, '$.restored_at', 'now')
         WHERE id = 2",
    )
    .await;
    let stats = store.stats(7).await.expect("the stats read").summary;
    assert_eq!(stats.total_summarizations, 1);
    assert_eq!(stats.total_precomputed, 0);
    assert_eq!(stats.prompt_tokens, 105);
    assert_eq!(stats.p95_duration_ms, Some(45.3));
}

#[tokio::test]
async fn a_hand_made_compaction_is_viewed_checked_and_restored() {
    let store = store().await;
    compacted_session(&store).await;
    let lease_ms = 1_733_213_760_123_i64;
    sqlx::query("UPDATE sessions SET lease_owner = 'w', lease_expires_at = ?1")
        .bind(lease_ms)
        .execute(store.pool())
        .await
        .expect("the lease is written");

    let view = store.session("s", 10).await.expect("read").expect("known");
    assert_eq!(
        (view.total_chars, view.message_count, view.human_turns),
        (23, 4, 1)
    );
    assert_eq!(
        view.lease_expires_at.as_deref(),
        Some("2024-12-03T08:16:00.123Z")
    );
    assert_eq!(view.retry_at, None);
    assert_eq!(view.compactions.len(), 1);
    let compaction = &view.compactions[0];
    assert_eq!((compaction.id, compaction.messages_removed), (1, 2));
    assert_eq!((compaction.chars_removed, compaction.restored), (7, false));
    assert!(store.session("nobody", 10).await.expect("read").is_none());
    assert!(store.compacted_by_job("s", "J:1:1").await.expect("read"));
    assert!(!store.compacted_by_job("s", "r1").await.expect("read"));

    for invariant in ALL_INVARIANTS {
        let found = store.breaches(invariant).await.expect("the check runs");
        assert_eq!(found, vec![], "{invariant:?}");
    }

    let restored = store.restore("s", None).await.expect("restored");
    assert_eq!(restored.compactions, vec![1]);
    assert_eq!(restored.messages_restored, 2);
    let history: Vec<(i64, String, bool)> =
        sqlx::query_as("SELECT seq, coalesce(content, ''), is_summary FROM messages ORDER BY seq")
            .fetch_all(store.pool())
            .await
            .expect("read");
    let contents: Vec<&str> = history.iter().map(|(_, c, _)| c.as_str()).collect();
    assert_eq!(contents, ["be brief", "héllo", "hi", "more", "sure"]);
    assert!(history.iter().all(|(_, _, summary)| !summary));
    let view = store.session("s", 10).await.expect("read").expect("known");
    assert_eq!(
        (view.total_chars, view.message_count, view.human_turns),
        (23, 5, 2)
    );
    assert!(view.compactions[0].restored);
    let last: Option<i64> = sqlx::query_scalar("SELECT last_compaction_id FROM sessions")
        .fetch_one(store.pool())
        .await
        .expect("read");
    assert_eq!(last, None);
    assert_eq!(
        store
            .stats(7)
            .await
            .expect("read")
            .summary
            .total_summarizations,
        0
    );
    for invariant in ALL_INVARIANTS {
        let found = store.breaches(invariant).await.expect("the check runs");
        assert_eq!(found, vec![], "{invariant:?}");
    }

    assert!(matches!(
        store.restore("s", None).await,
        Err(RestoreError::NothingToRestore(None))
    ));
    assert!(matches!(
        store.restore("nobody", None).await,
        Err(RestoreError::UnknownSession(_))
    ));
}

#[tokio::test]
async fn a_restore_without_its_summary_writes_nothing() {
    let store = store().await;
    compacted_session(&store).await;
    exec(&store, "DELETE FROM messages WHERE is_summary").await;
    assert!(matches!(
        store.restore("s", Some(1)).await,
        Err(RestoreError::SummaryMissing(1))
    ));
    assert_eq!(
        store.check_totals().await.expect("read").archived_messages,
        2
    );
    let found = store
        .breaches(Invariant::UsageEventMismatch)
        .await
        .expect("the check runs");
    assert_eq!(found, vec![]);
}

#[tokio::test]
async fn broken_invariants_are_found() {
    let store = store().await;
    compacted_session(&store).await;
    // A second summary; a result whose call (double-encoded) was archived; a result
    // with no call at all; a compaction whose archive holds less than it says.
    exec(
        &store,
        r#"
        INSERT INTO messages (session_id, role, content, is_summary)
            VALUES ('s', 'user', 'again', 1);
        INSERT INTO archived_messages (compaction_id, session_id, seq, role, tool_calls,
                                       is_summary, chars, created_at)
            VALUES (1, 's', 10, 'assistant', '"[{\"id\": \"c9\"}]"', 0, 0, 'x');
        INSERT INTO messages (session_id, role, content, tool_call_id) VALUES
            ('s', 'tool', 'result', 'c9'), ('s', 'tool', 'result', 'c0');
        "#,
    )
    .await;
    let detail = |invariant| {
        let store = store.clone();
        async move {
            store
                .breaches(invariant)
                .await
                .expect("the check runs")
                .into_iter()
                .map(|f| format!("{}: {}", f.session_id, f.detail))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        detail(Invariant::SeveralSummaries).await,
        ["s: 2 summaries"]
    );
    assert_eq!(
        detail(Invariant::MisplacedSummary).await,
        ["s: summary seq 6, message seq 4"]
    );
    assert_eq!(
        detail(Invariant::SeparatedToolResult).await,
        ["s: tool_call_id c9"]
    );
    assert_eq!(
        detail(Invariant::UnpairedToolResult).await,
        ["s: tool_call_id c0"]
    );
    assert_eq!(
        detail(Invariant::DuplicatedMessage).await,
        Vec::<String>::new()
    );
    assert_eq!(
        detail(Invariant::UsageEventMismatch).await,
        ["s: compaction 1: metadata says 2 msgs/7 chars, 0 cleared, archive holds 3/7, 0 cleared"]
    );
    // The CHECK refuses a double-encoded array: only a row written past it is found.
    exec(
        &store,
        r#"
        PRAGMA ignore_check_constraints = ON;
        INSERT INTO messages (session_id, role, tool_calls)
            VALUES ('s', 'assistant', '"[]"');
        PRAGMA ignore_check_constraints = OFF;
        "#,
    )
    .await;
    assert_eq!(
        detail(Invariant::ToolCallsNotAnArray).await,
        ["s: seq 9: a JSON string"]
    );
    exec(&store, "DELETE FROM usage_events").await;
    assert_eq!(
        detail(Invariant::CompactionWithoutUsageEvent).await,
        ["s: compaction 1"]
    );
    assert_eq!(
        detail(Invariant::SummaryWithoutCompaction).await,
        ["s: summary seq 2", "s: summary seq 6"]
    );
}

#[tokio::test]
async fn drifted_counters_are_found_and_repaired() {
    let store = store().await;
    exec(
        &store,
        "INSERT INTO messages (session_id, role, content) VALUES
             ('a', 'user', 'héllo'), ('b', 'user', 'x'), ('c', 'user', 'y');
         UPDATE sessions SET total_chars = 99, skip_reason = 'no_safe_boundary'
             WHERE session_id = 'a';
         DELETE FROM sessions WHERE session_id = 'b';
         INSERT INTO sessions (session_id, message_count) VALUES ('gone', 3);",
    )
    .await;
    let drift = store.counter_drift().await.expect("read");
    let shown: Vec<String> = drift.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "a: 99/1/1 -> 5/1/1",
            "b: no row -> 1/1/1",
            "gone: 0/3/0 -> 0/0/0"
        ]
    );
    let found = store
        .breaches(Invariant::CountersDrift)
        .await
        .expect("the check runs");
    assert_eq!(found[1].detail, "counters none, messages 1/1/1");

    let repaired = store.repair_counters().await.expect("repaired");
    assert_eq!(repaired, drift);
    assert_eq!(store.counter_drift().await.expect("read"), vec![]);
    assert_eq!(counts(&store, "a").await, counted(5, 1, 1));
    assert_eq!(counts(&store, "b").await, counted(1, 1, 1));
    let skip: Option<String> =
        sqlx::query_scalar("SELECT skip_reason FROM sessions WHERE session_id = 'a'")
            .fetch_one(store.pool())
            .await
            .expect("read");
    assert_eq!(skip, None);
    assert_eq!(store.repair_counters().await.expect("repaired"), vec![]);
}

#[tokio::test]
async fn settings_are_changed_as_a_whole() {
    let store = store().await;
    let configured = Limits {
        threshold_chars: 1000,
        keep_chars: 100,
    };
    let set = |key, value: &str| Change::Set(key, value.to_owned());
    let written = store
        .change_session_settings(
            "s",
            &[set(Key::ThresholdChars, "500"), set(Key::Enabled, "false")],
            configured,
        )
        .await
        .expect("written");
    assert_eq!(written.threshold_chars, Some(500));
    assert_eq!(store.session_settings("s").await.expect("read"), written);
    assert!(matches!(
        store
            .change_session_settings("s", &[set(Key::KeepChars, "600")], configured)
            .await,
        Err(SettingsError::Invalid(_))
    ));
    let written = store
        .change_session_settings(
            "s",
            &[set(Key::Model, "small"), Change::Unset(Key::Enabled)],
            configured,
        )
        .await
        .expect("written");
    assert_eq!(written.enabled, None);
    assert_eq!(written.model.as_deref(), Some("small"));
    assert_eq!(store.session_settings("s").await.expect("read"), written);
    assert_eq!(
        store.session_settings("other").await.expect("read"),
        Default::default()
    );
}

#[tokio::test]
async fn dead_letters_are_kept_once_replayed_and_purged() {
    let store = store().await;
    let job = NewDeadLetter {
        session_id: Some("s"),
        subject: "summarize",
        msg_id: None,
        payload: "{}",
        last_error: "boom",
        deliveries: 5,
        job_key: Some("stream:1:t"),
    };
    let id = store.dead_letter(&job).await.expect("kept").expect("new");
    assert_eq!(store.dead_letter(&job).await.expect("kept"), None);
    let listed = store.dead_letters(false).await.expect("read");
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id, listed[0].deliveries), (id, 5));
    assert!(listed[0].created_at.ends_with('Z'));
    assert!(store.mark_replayed(id).await.expect("marked"));
    assert!(!store.mark_replayed(id).await.expect("marked"));
    assert_eq!(store.dead_letters(false).await.expect("read"), vec![]);
    let all = store.dead_letters(true).await.expect("read");
    assert!(all[0].replayed_at.is_some());
    store.unmark_replayed(id).await.expect("unmarked");
    assert_eq!(store.purge_dead_letters(false).await.expect("purged"), 0);
    assert_eq!(store.purge_dead_letters(true).await.expect("purged"), 1);
}

#[tokio::test]
async fn pruning_removes_old_archives_only() {
    let store = store().await;
    compacted_session(&store).await;
    let pruned = store
        .prune_archive(Duration::from_secs(3600), false)
        .await
        .expect("pruned");
    assert_eq!((pruned.compactions, pruned.archived_messages), (0, 0));
    exec(
        &store,
        "UPDATE archived_messages SET archived_at = '2020-01-01T00:00:00.000Z'",
    )
    .await;
    let pruned = store
        .prune_archive(Duration::from_secs(3600), true)
        .await
        .expect("counted");
    assert_eq!((pruned.compactions, pruned.archived_messages), (1, 2));
    assert_eq!(
        store.check_totals().await.expect("read").archived_messages,
        2
    );
    store
        .prune_archive(Duration::from_secs(3600), false)
        .await
        .expect("pruned");
    let totals = store.check_totals().await.expect("read");
    assert_eq!((totals.archived_messages, totals.compactions), (0, 1));
    let marked: bool = sqlx::query_scalar(
        "SELECT json_type(metadata, '$.archive_pruned_at') = 'text' FROM usage_events",
    )
    .fetch_one(store.pool())
    .await
    .expect("read");
    assert!(marked);
    // A pruned compaction's figures no longer match an archive: not a breach.
    let found = store
        .breaches(Invariant::UsageEventMismatch)
        .await
        .expect("the check runs");
    assert_eq!(found, vec![]);
}

const ALL_INVARIANTS: [Invariant; 13] = [
    Invariant::DuplicatedMessage,
    Invariant::SeveralSummaries,
    Invariant::MisplacedSummary,
    Invariant::SeparatedToolResult,
    Invariant::UnpairedToolResult,
    Invariant::ToolCallsNotAnArray,
    Invariant::CompactionWithoutUsageEvent,
    Invariant::UsageEventMismatch,
    Invariant::ClearedWithoutOriginal,
    Invariant::SummaryWithoutCompaction,
    Invariant::CountersDrift,
    Invariant::TextNotUtf8,
    Invariant::UnweighedBlocks,
];

/// Found by a review: SQLite fires no delete trigger for a row that INSERT OR REPLACE
/// removes unless recursive triggers are on, which every connection of ours turns on.
#[tokio::test]
async fn a_replaced_row_leaves_the_counters_as_its_replacement_found_them() {
    let store = store().await;
    exec(
        &store,
        "INSERT INTO messages (session_id, role, content) VALUES ('s', 'user', 'hello');
         INSERT INTO messages (session_id, role, content) VALUES ('s', 'assistant', 'abc');
         INSERT OR REPLACE INTO messages (seq, session_id, role, content)
             VALUES (2, 's', 'assistant', 'WORLD!!');
         INSERT INTO messages (session_id, role, content, external_id)
             VALUES ('s', 'user', 'one', 'm-1');
         INSERT OR REPLACE INTO messages (session_id, role, content, external_id)
             VALUES ('s', 'user', 'other', 'm-1');",
    )
    .await;

    assert_eq!(counts(&store, "s").await, counted(5 + 7 + 5, 3, 2));
    assert!(store.counter_drift().await.expect("drift").is_empty());
}

/// Found by a review: what would make a session's size wrong, or its lease stuck, is
/// refused at the write, as Postgres refuses it.
#[tokio::test]
async fn text_that_would_count_wrong_and_text_instants_are_refused() {
    let store = store().await;
    exec(
        &store,
        "INSERT INTO messages (session_id, role, content) VALUES ('s', 'user', 'hello')",
    )
    .await;
    for (sql, value) in [
        // length() stops at a NUL: a dump starting with one would count no chars.
        (
            "INSERT INTO messages (session_id, role, content) VALUES ('s', 'tool', ?1)",
            format!("\u{0}{}", "x".repeat(100_000)),
        ),
        // A text instant sorts above every number: the lease would never run out.
        (
            "UPDATE sessions SET lease_owner = 'w', lease_expires_at = ?1",
            "2026-12-03 09:00:00".to_owned(),
        ),
        ("UPDATE sessions SET retry_at = ?1", "tomorrow".to_owned()),
    ] {
        let refused = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&value)
            .execute(store.pool())
            .await
            .expect_err(sql);
        assert!(
            refused.to_string().contains("CHECK constraint failed"),
            "{refused}"
        );
    }
    let bytes =
        sqlx::query("INSERT INTO messages (session_id, role, content) VALUES ('s', 'tool', ?1)")
            .bind(b"bytes are not text".as_slice())
            .execute(store.pool())
            .await;
    assert!(bytes.is_err());
    assert_eq!(counts(&store, "s").await, counted(5, 1, 1));
}

/// The duration histogram's buckets come from a lookup table (no math functions in the
/// bundled SQLite): the rollup trigger must put every duration where Postgres's
/// `duration_bucket` does, `least(60, floor(2 log2(greatest(ms, 1))) + 1)`, including at
/// the powers of two, where a table of rounded bounds would be off by one.
#[tokio::test]
async fn the_duration_buckets_are_postgres_s() {
    let store = store().await;
    let mut durations: Vec<i64> = (-3..=20_000).collect();
    for k in 15..62 {
        let power = 1_i64 << k;
        durations.extend([power - 1, power, power + 1]);
    }
    sqlx::query(
        "INSERT INTO usage_events (session_id, model, metadata)
         SELECT 's', 'm', json_object('summarization', json('true'), 'duration_ms', value)
         FROM json_each(?1)",
    )
    .bind(serde_json::to_string(&durations).expect("JSON"))
    .execute(store.pool())
    .await
    .expect("the events are written");

    let counted: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT bucket, sum(compactions) FROM compaction_duration_daily
         GROUP BY bucket ORDER BY bucket",
    )
    .fetch_all(store.pool())
    .await
    .expect("the histogram");
    let mut expected = std::collections::BTreeMap::<i64, i64>::new();
    for ms in durations {
        // Exact in f64 for these values: log2 of a power of two is an integer, and no
        // integer lies on an odd bucket's bound, 2^(k + 1/2).
        let bucket = ((2.0 * (ms.max(1) as f64).log2()).floor() as i64 + 1).min(60);
        *expected.entry(bucket).or_default() += 1;
    }
    assert_eq!(counted, expected.into_iter().collect::<Vec<_>>());
}

/// Inserts `bytes`, cast to TEXT as plain SQL can, into `column` of a new message.
async fn insert_text(store: &SqliteStore, column: &str, bytes: &[u8]) -> Result<(), sqlx::Error> {
    let sql = match column {
        "content" => {
            "INSERT INTO messages (session_id, role, content) VALUES ('s', 'user', CAST(?1 AS TEXT))"
        }
        "tool_call_id" => {
            "INSERT INTO messages (session_id, role, content, tool_call_id) VALUES ('s', 'tool', 'ok', CAST(?1 AS TEXT))"
        }
        "session_id" => {
            "INSERT INTO messages (session_id, role, content) VALUES (CAST(?1 AS TEXT), 'user', 'hi')"
        }
        other => panic!("no insert for {other}"),
    };
    sqlx::query(sql)
        .bind(bytes)
        .execute(store.pool())
        .await
        .map(|_| ())
}

/// Found by probing: SQLite takes any bytes cast to TEXT, and a row the worker cannot
/// decode failed every turn of its session with `store_error`. The write now refuses
/// exactly what Rust's decoder refuses: random byte strings, biased to the bytes where
/// UTF-8's rules are (leads, continuations, overlongs, surrogates, past U+10FFFF), and
/// text made invalid by a dropped byte.
#[tokio::test]
async fn the_write_refuses_exactly_the_text_that_is_not_utf8() {
    let store = store().await;
    let mut rng = fastrand::Rng::with_seed(20_261_203);
    const BYTES: [u8; 23] = [
        0x41, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1, 0xec, 0xed,
        0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xff,
    ];
    const CHARS: [char; 11] = [
        'A',
        'é',
        '€',
        '😀',
        '\u{7ff}',
        '\u{800}',
        '\u{ffff}',
        '\u{10000}',
        '\u{10ffff}',
        '\u{d7ff}',
        '\u{e000}',
    ];
    let (mut refused, mut accepted) = (0, 0);
    for case in 0..6_000 {
        let mut bytes: Vec<u8> = if case % 2 == 0 {
            (0..rng.usize(1..10))
                .map(|_| BYTES[rng.usize(..BYTES.len())])
                .collect()
        } else {
            let text: String = (0..rng.usize(1..6))
                .map(|_| CHARS[rng.usize(..CHARS.len())])
                .collect();
            text.into_bytes()
        };
        if case % 4 == 1 && bytes.len() > 1 {
            bytes.remove(rng.usize(..bytes.len()));
        }
        let valid = std::str::from_utf8(&bytes).is_ok();
        let column = ["content", "tool_call_id", "session_id"][case % 3];
        let written = insert_text(&store, column, &bytes).await;
        match (&written, valid) {
            (Ok(()), true) => accepted += 1,
            (Err(e), false) => {
                assert!(e.to_string().contains("not valid UTF-8"), "{e}");
                refused += 1;
            }
            _ => panic!("{column} {bytes:02x?}: valid {valid}, written {written:?}"),
        }
    }
    assert!(refused > 1_000 && accepted > 1_000, "{refused} {accepted}");
    // An update is held to it too, and nothing of the checks is left behind.
    exec(
        &store,
        "INSERT INTO messages (session_id, role, content) VALUES ('u', 'user', 'héllo')",
    )
    .await;
    let update =
        sqlx::query("UPDATE messages SET content = CAST(X'68C3' AS TEXT) WHERE session_id = 'u'")
            .execute(store.pool())
            .await;
    assert!(update.is_err(), "{update:?}");
    let scratch: i64 = sqlx::query_scalar("SELECT count(*) FROM utf8_scratch")
        .fetch_one(store.pool())
        .await
        .expect("read");
    assert_eq!(scratch, 0);
    let found = store
        .breaches(Invariant::TextNotUtf8)
        .await
        .expect("the check runs");
    assert_eq!(found, vec![]);
}

/// A file written before the write refused it: `summarizer check` names the row and the
/// columns; the report's remedy says how to fix them.
#[tokio::test]
async fn the_check_finds_text_written_before_the_write_refused_it() {
    let store = store().await;
    exec(&store, "DROP TRIGGER messages_text_is_utf8_on_insert").await;
    exec(
        &store,
        "INSERT INTO messages (session_id, role, content) VALUES ('s', 'user', 'fine é')",
    )
    .await;
    insert_text(&store, "content", b"bad \xff byte")
        .await
        .expect("no trigger");
    insert_text(&store, "tool_call_id", b"call-\xc3")
        .await
        .expect("no trigger");
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM messages ORDER BY seq")
        .fetch_all(store.pool())
        .await
        .expect("read");

    let found = store
        .breaches(Invariant::TextNotUtf8)
        .await
        .expect("the check runs");

    let details: Vec<(&str, String)> = found
        .iter()
        .map(|f| (f.session_id.as_str(), f.detail.clone()))
        .collect();
    assert_eq!(
        details,
        [
            ("s", format!("seq {}: content", seqs[1])),
            ("s", format!("seq {}: tool_call_id", seqs[2])),
        ]
    );
}

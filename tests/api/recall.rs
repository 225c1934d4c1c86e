//! Recall (`summarizer.recall`): the agent searches and fetches what compaction archived
//! from its own session, on both stores; never another session's rows, never an error
//! for a query that looks like syntax.

use std::time::Duration;

use serde_json::json;
use summarizer::outcome::{Reason, Status};
use summarizer_client::{RecallError, RecallRequest, Recalled};

use crate::helpers::{SUMMARY, TestApp, filler, spawn_app, spawn_app_with};

const WAIT: Duration = Duration::from_secs(10);

/// The identifiers the first turns state, as an investigation writes them.
const IDENTIFIERS: [&str; 6] = [
    "E-5417",
    "v4.12.6",
    "10.43.7.217:6432",
    "pgbouncer-14",
    "/etc/svc/conf.d/003-pool.yaml",
    "p99=2013ms",
];

/// A session whose first turns (one with a get_logs call and its result) state the
/// identifiers, then enough turns to cross the threshold; compacted once.
async fn compacted_session(app: &TestApp, session: &str) -> i64 {
    app.append(
        session,
        "user",
        "Checkout fails with E-5417 since the v4.12.6 rollout. Why?",
        None,
        None,
    )
    .await;
    let calls = json!([{"id": "c1", "name": "get_logs", "arguments": {"service": "pgbouncer"}}]);
    app.append(session, "assistant", "", Some(calls), None)
        .await;
    app.append(
        session,
        "tool",
        "14:02:11 ERROR pgbouncer-14 10.43.7.217:6432 pool full, config /etc/svc/conf.d/003-pool.yaml",
        None,
        Some("c1"),
    )
    .await;
    app.append(
        session,
        "assistant",
        "The connection pool is saturated: p99=2013ms while pgbouncer-14 refuses clients.",
        None,
        None,
    )
    .await;
    app.append_turns(session, 5).await;
    let reply = app.turn_starting(session).await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    reply.compaction_id.unwrap()
}

async fn search(app: &TestApp, session: &str, query: &str) -> Vec<Recalled> {
    app.recall.search(session, query, 5, WAIT).await.unwrap()
}

#[tokio::test]
async fn an_archived_fact_is_found_by_its_identifier_and_fetched_by_its_seq() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let compaction = compacted_session(&app, "s").await;
    let archived = app.archived("s").await;

    for identifier in IDENTIFIERS {
        let found = search(&app, "s", identifier).await;
        assert!(!found.is_empty(), "{identifier} not found");
        for r in &found {
            assert!(r.content.contains(identifier), "{identifier}: {r:?}");
            assert_eq!(r.compaction_id, compaction);
            assert!(!r.truncated);
            assert!(
                r.archived_at.ends_with('Z') && r.archived_at.contains('T'),
                "{r:?}"
            );
        }
        // A case of its own makes no difference.
        assert_eq!(search(&app, "s", &identifier.to_uppercase()).await, found);
    }
    let result = &search(&app, "s", "10.43.7.217:6432").await[0];
    assert_eq!(result.role, "tool");
    assert_eq!(result.tool_call_id.as_deref(), Some("c1"));
    assert_eq!(result.tool_name.as_deref(), Some("get_logs"));

    // A fetch gives exactly what was archived, in seq order.
    let seqs: Vec<i64> = archived.iter().map(|m| m.seq).take(4).collect();
    let fetched = app
        .recall
        .fetch("s", &[seqs[3], seqs[0]], WAIT)
        .await
        .unwrap();
    assert_eq!(
        fetched
            .iter()
            .map(|r| (r.seq, r.content.as_str()))
            .collect::<Vec<_>>(),
        [
            (seqs[0], archived[0].content.as_deref().unwrap()),
            (seqs[3], archived[3].content.as_deref().unwrap()),
        ]
    );
    // A seq that was never archived (a kept message, or none) is not an error.
    let kept = app.messages("s").await.last().unwrap().seq;
    assert!(
        app.recall
            .fetch("s", &[kept, 999_999], WAIT)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn words_find_the_messages_holding_most_of_them_first() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    compacted_session(&app, "s").await;

    // Every later turn's filler says "saturated"; one sentence says all three.
    let found = search(&app, "s", "saturated refuses clients").await;

    assert!(found.len() >= 2, "{found:?}");
    assert!(
        found[0]
            .content
            .starts_with("The connection pool is saturated"),
        "{found:?}"
    );
    assert!(found.iter().all(|r| {
        let text = r.content.to_lowercase();
        ["saturated", "refuses", "clients"]
            .iter()
            .any(|w| text.contains(w))
    }));
    // Among those that hold as many, the newest first.
    assert!(found[1].seq > found[2].seq, "{found:?}");
    assert_eq!(
        app.recall.search("s", "pool", 1, WAIT).await.unwrap().len(),
        1,
        "the limit"
    );
}

#[tokio::test]
async fn another_sessions_rows_are_never_returned() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    compacted_session(&app, "alpha").await;
    compacted_session(&app, "alphabet").await;
    compacted_session(&app, "a").await;
    let theirs: Vec<i64> = app
        .archived("alphabet")
        .await
        .iter()
        .map(|m| m.seq)
        .collect();

    for session in ["alpha", "a"] {
        let mine: Vec<i64> = app.archived(session).await.iter().map(|m| m.seq).collect();
        for r in search(&app, session, "E-5417").await {
            assert!(mine.contains(&r.seq), "{session}: {r:?}");
        }
        let fetched = app.recall.fetch(session, &theirs, WAIT).await.unwrap();
        assert!(
            fetched
                .iter()
                .all(|r| mine.contains(&r.seq) && !theirs.contains(&r.seq))
        );
    }
    assert!(search(&app, "nobody", "E-5417").await.is_empty());
}

#[tokio::test]
async fn query_syntax_and_sql_are_searched_as_text_never_an_error() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append(
        "s",
        "user",
        "Budget: 50% of pool_size for \"quoted\" OR body:secret NEAR(x)",
        None,
        None,
    )
    .await;
    compacted_session(&app, "s").await;

    for query in [
        "\"quoted\" OR body:secret",
        "NEAR(x) AND pool*",
        "'; DROP TABLE messages; --",
        "50% of_pool",
        "\\\\\\ %%% ___ \"\"\"",
        "session : \"\u{1f}s\u{1f}\"",
    ] {
        let found = app.recall.search("s", query, 10, WAIT).await;
        assert!(found.is_ok(), "{query}: {found:?}");
    }
    // `%` and `_` are themselves: "50%" is found where it is written, not as a pattern.
    let found = search(&app, "s", "50%").await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(search(&app, "s", "5_%").await.is_empty());
    assert!(!app.archived("s").await.is_empty(), "nothing dropped");
    assert!(app.check().await.is_clean());
}

#[tokio::test]
async fn bounds_are_enforced_and_a_malformed_request_is_rejected_naming_the_field() {
    let app = spawn_app_with(&[("SUMMARY_MAX_CHARS", "6000")]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append(
        "s",
        "user",
        &format!("Dump: E-5417 {}", filler(30_000)),
        None,
        None,
    )
    .await;
    compacted_session(&app, "s").await;

    let request = RecallRequest {
        max_chars: 100,
        ..RecallRequest::search("s", "E-5417", 50)
    };
    let found = app.recall.ask(&request, WAIT).await.unwrap();
    let long = found
        .iter()
        .find(|r| r.content.starts_with("Dump:"))
        .unwrap();
    assert!(long.truncated);
    assert_eq!(long.content.chars().count(), 100);
    let whole = app.recall.fetch("s", &[long.seq], WAIT).await.unwrap();
    assert_eq!(whole[0].content.chars().count(), 4_000, "the default cut");
    let request = RecallRequest {
        max_chars: 20_000,
        ..RecallRequest::seqs("s", vec![long.seq])
    };
    assert_eq!(
        app.recall.ask(&request, WAIT).await.unwrap()[0]
            .content
            .chars()
            .count(),
        20_000
    );

    for (payload, field) in [
        (r#"{"session_id":"s","query":"pool","limit":51}"#, "limit"),
        (
            r#"{"session_id":"s","seqs":[1],"max_chars":20001}"#,
            "max_chars",
        ),
        (r#"{"session_id":"s","query":"x"}"#, "query holds no term"),
        (r#"{"query":"pool"}"#, "session_id"),
        (r#"{"session_id":"s","seqs":"12"}"#, "seqs"),
        ("not json", "JSON object"),
    ] {
        let nats = async_nats::connect(crate::helpers::NATS_URL).await.unwrap();
        let subject = crate::helpers::recall_subject(&app.env(&[])["NATS_SUBJECT"]);
        let reply = nats
            .request(subject, payload.as_bytes().to_vec().into())
            .await
            .unwrap();
        let reply: summarizer_client::RecallReply = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(
            (reply.status.as_str(), reply.reason.map(Reason::as_str)),
            ("rejected", Some("invalid_request")),
            "{payload}"
        );
        assert!(
            reply.message.as_deref().unwrap().contains(field),
            "{payload}: {reply:?}"
        );
    }
    // The worker goes on.
    assert!(!search(&app, "s", "E-5417").await.is_empty());
}

#[tokio::test]
async fn a_cleared_result_is_recalled_whole_and_a_pruned_one_not_at_all() {
    let app = spawn_app_with(&[
        ("TOOL_OUTPUT_CLEARING", "on"),
        ("TOOL_OUTPUT_KEEP", "1"),
        ("TOOL_OUTPUT_MIN_CHARS", "500"),
    ])
    .await;
    app.append("s", "user", "What do the logs say?", None, None)
        .await;
    for n in 0..3 {
        let id = format!("c{n}");
        let calls = json!([{"id": id, "name": "get_logs", "arguments": {}}]);
        app.append("s", "assistant", "", Some(calls), None).await;
        let output = format!("E-54{n}7 at host-{n} {}", filler(1_500));
        app.append("s", "tool", &output, None, Some(&id)).await;
    }
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.reason, Reason::Cleared, "{reply:?}");
    let placeholder = app.messages("s").await[2].clone();
    assert!(
        placeholder
            .content
            .as_deref()
            .unwrap()
            .starts_with("[tool output cleared")
    );

    let found = search(&app, "s", "E-5407").await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].seq, placeholder.seq);
    assert_eq!(found[0].tool_name.as_deref(), Some("get_logs"));
    let fetched = app
        .recall
        .fetch("s", &[placeholder.seq], WAIT)
        .await
        .unwrap();
    assert!(
        fetched[0].content.starts_with("E-5407 at host-0"),
        "{fetched:?}"
    );

    // Pruning removes what can be recalled.
    app.store
        .prune_archive(Duration::ZERO, false)
        .await
        .unwrap();
    assert!(search(&app, "s", "E-5407").await.is_empty());
    assert!(
        app.recall
            .fetch("s", &[placeholder.seq], WAIT)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_cli_searches_and_fetches_as_the_agent_does() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    compacted_session(&app, "s").await;
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_summarizer"))
            .arg("recall")
            .args(args)
            .env("DATABASE_URL", &app.database_url)
            .output()
            .unwrap()
    };

    let out = cli(&["s", "pgbouncer-14", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: summarizer_client::RecallReply = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply.results, search(&app, "s", "pgbouncer-14").await);
    let seq = reply.results[0].seq;
    let out = cli(&["s", "--seq", &seq.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("--- seq {seq} (")), "{text}");
    assert!(text.contains("pgbouncer-14"), "{text}");
    let out = cli(&["s", "x"]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a query with no term is a usage error"
    );
    // Neither a query nor a seq, or a limit on a fetch: clap's usage errors, which
    // name what is wrong.
    for (args, says) in [
        (&["s"][..], "<QUERY>"),
        (&["s", "--seq", "1", "--limit", "3"][..], "--limit"),
    ] {
        let out = cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_store_that_fails_answers_failed_store_error() {
    let (url, store) = match crate::helpers::backend() {
        summarizer::store::Backend::Postgres => {
            ("postgres://postgres@127.0.0.1:1/none", "postgres")
        }
        summarizer::store::Backend::Sqlite => {
            ("sqlite:///nonexistent-dir-for-recall/x.db", "sqlite")
        }
    };
    let unreachable = summarizer::store::connect_lazy(url, 1, Duration::from_millis(300)).unwrap();
    let reply = summarizer::recall::answer(
        unreachable.as_ref(),
        &RecallRequest::search("s", "E-5417", 5).encode(),
        true,
    )
    .await;
    assert_eq!(
        (reply.status.as_str(), reply.reason.map(Reason::as_str)),
        ("failed", Some("store_error")),
        "{store}: {reply:?}"
    );
    assert!(reply.results.is_empty());
}

#[tokio::test]
async fn with_no_worker_recall_fails_with_a_typed_error() {
    let app = crate::helpers::setup(&[]).await;
    let err = app.recall.search("s", "E-5417", 5, WAIT).await.unwrap_err();
    assert_eq!(err, RecallError::NoWorkers, "NATS says so at once");
}

/// On Postgres, a search whose ranking would run out of time (a term that most of a very
/// large archive holds) returns the newest messages holding every term, then the newest
/// holding any: what the ranking would have put first, found through the indexes alone.
/// The budget that skips the ranking stands for one it ran out of; with the default
/// budget the ranking answers the same.
#[tokio::test]
async fn a_search_too_broad_to_rank_in_time_answers_from_the_indexes() {
    use summarizer::store::{PgStore, RecallBudget, RecallQuery};
    if crate::helpers::backend() != summarizer::store::Backend::Postgres {
        return;
    }
    let app = spawn_app().await;
    let pg = PgStore::connect_lazy(&app.database_url, 2, WAIT).unwrap();
    // seq 1 holds both terms; 2..=40 the common one; 41..=60 neither; another session
    // holds both, newer.
    sqlx::query(
        "INSERT INTO archived_messages
             (compaction_id, session_id, seq, role, content, is_summary, chars, created_at)
         SELECT 1, 's', n, 'tool',
                CASE WHEN n = 1 THEN 'request E-4711 timed out'
                     WHEN n <= 40 THEN 'request ' || n || ' timed out'
                     ELSE 'all quiet' END,
                false, 24, now()
         FROM generate_series(1, 60) AS n
         UNION ALL SELECT 2, 'other', 99, 'tool', 'request E-4711 timed out', false, 24, now()",
    )
    .execute(pg.pool())
    .await
    .unwrap();
    let query = |terms: &[&str]| RecallQuery::Search {
        terms: terms.iter().map(|t| (*t).to_owned()).collect(),
        limit: 3,
    };
    let skip_ranking = RecallBudget {
        ranked_ms: None,
        ..RecallBudget::default()
    };
    for budget in [skip_ranking, RecallBudget::default()] {
        let seqs = |found: Vec<Recalled>| found.iter().map(|r| r.seq).collect::<Vec<_>>();
        let both = pg
            .recall_within("s", &query(&["request", "e-4711"]), 100, budget)
            .await
            .unwrap();
        assert_eq!(seqs(both), [1, 40, 39], "{budget:?}");
        let one = pg
            .recall_within("s", &query(&["timed"]), 100, budget)
            .await
            .unwrap();
        assert_eq!(seqs(one), [40, 39, 38], "{budget:?}");
        let none = pg
            .recall_within("s", &query(&["nowhere"]), 100, budget)
            .await
            .unwrap();
        assert!(none.is_empty(), "{budget:?}");
    }
}

/// A cleared result's original stays recallable when a later summary removes its
/// placeholder (whose archived copy is never a result), until a restore puts each back.
#[tokio::test]
async fn a_cleared_results_original_outlives_its_placeholder_until_restored() {
    let app = spawn_app_with(&[
        ("TOOL_OUTPUT_CLEARING", "on"),
        ("TOOL_OUTPUT_KEEP", "1"),
        ("TOOL_OUTPUT_MIN_CHARS", "500"),
    ])
    .await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append("s", "user", "What do the logs say?", None, None)
        .await;
    for n in 0..3 {
        let id = format!("c{n}");
        let calls = json!([{"id": id, "name": "get_logs", "arguments": {}}]);
        app.append("s", "assistant", "", Some(calls), None).await;
        let output = format!("E-54{n}7 at host-{n} {}", filler(1_500));
        app.append("s", "tool", &output, None, Some(&id)).await;
    }
    assert_eq!(app.turn_starting("s").await.reason, Reason::Cleared);
    let seq = app.messages("s").await[2].seq;
    app.append_turns("s", 8).await;
    let reply = app.turn_starting("s").await;
    assert_eq!(reply.reason, Reason::Compacted, "{reply:?}");
    assert!(app.messages("s").await.iter().all(|m| m.seq != seq));

    // The placeholder is archived again (by the summary) but is never a result.
    let copies = app.archived("s").await;
    assert!(
        copies.iter().any(|m| m.seq == seq
            && (m.content.as_deref()).is_some_and(|c| c.starts_with("[tool output cleared"))),
        "{copies:?}"
    );
    let placeholders = search(&app, "s", "\"tool output cleared\"").await;
    assert!(
        placeholders
            .iter()
            .all(|r| !r.content.starts_with("[tool output cleared")),
        "{placeholders:?}"
    );
    let original = |found: Vec<Recalled>| {
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].content.starts_with("E-5407 at host-0"),
            "{found:?}"
        );
    };
    original(search(&app, "s", "E-5407").await);
    original(app.recall.fetch("s", &[seq], WAIT).await.unwrap());

    // Undoing the summary puts the placeholder back in the history; the original stays
    // archived under the clearing ...
    app.store.restore("s", None).await.unwrap();
    original(app.recall.fetch("s", &[seq], WAIT).await.unwrap());
    // ... until that is undone too: then nothing of it is archived.
    app.store.restore("s", None).await.unwrap();
    assert!(search(&app, "s", "E-5407").await.is_empty());
    assert!(
        app.recall
            .fetch("s", &[seq], WAIT)
            .await
            .unwrap()
            .is_empty()
    );
    let restored = app.messages("s").await;
    let back = restored.iter().find(|m| m.seq == seq).unwrap();
    assert!(
        back.content
            .as_deref()
            .unwrap()
            .starts_with("E-5407 at host-0")
    );
}

/// A fetch of 50 seqs of 20,000 chars each, most of them escaped six bytes to the char
/// in JSON (a tool dumped control characters), is far past NATS's 1 MiB `max_payload`:
/// the results share the room (`RecallReply::encode_within`), and the agent gets every
/// result instead of waiting out its timeout for a reply NATS refused.
#[tokio::test]
async fn a_fetch_too_large_for_one_nats_message_is_cut_to_fit() {
    let app = spawn_app().await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    let dump = "\u{1}".repeat(20_000);
    for n in 0..50 {
        let call = format!("dump-{n}");
        app.append(
            "s",
            "user",
            &format!("Turn {n}: dump the ring buffer"),
            None,
            None,
        )
        .await;
        let calls = json!([{"id": call, "name": "dump_ring", "arguments": {}}]);
        app.append("s", "assistant", "", Some(calls), None).await;
        app.append("s", "tool", &dump, None, Some(&call)).await;
    }
    app.append_turns("s", 3).await;
    let reply = app.turn_starting_large("s").await;
    assert_eq!(reply.status, Status::Compacted, "{reply:?}");
    let dumps: Vec<i64> = (app.archived("s").await.iter())
        .filter(|m| m.content.as_deref() == Some(dump.as_str()))
        .map(|m| m.seq)
        .take(50)
        .collect();
    assert!(dumps.len() >= 40, "{}", dumps.len());
    let asked = RecallRequest {
        max_chars: summarizer_client::recall::MAX_MAX_CHARS,
        ..RecallRequest::seqs("s", dumps.clone())
    };
    let found = app.recall.ask(&asked, WAIT).await.unwrap();
    assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), dumps);
    for r in &found {
        assert!(dump.starts_with(&r.content));
        assert_eq!(r.truncated, r.content.len() < dump.len(), "seq {}", r.seq);
    }
    let sent: usize = found.iter().map(|r| r.content.len() * 6).sum();
    assert!(sent <= 1 << 20, "{sent} bytes of content in one reply");
    assert!(found.iter().any(|r| r.truncated));
}

/// Archives `(seq, content)` rows of `session` under compaction 1, as a compaction
/// would have, in SQL both stores run.
async fn archive_rows(app: &TestApp, session: &str, rows: &[(i64, String)]) {
    for (seq, content) in rows {
        app.db
            .query(
                "INSERT INTO archived_messages
                     (compaction_id, session_id, seq, role, content, is_summary, chars,
                      created_at)
                 VALUES (1, $1, $2, 'tool', $3, $4, $5, CURRENT_TIMESTAMP)",
            )
            .bind(session)
            .bind(*seq)
            .bind(content)
            .bind(false)
            .bind(i64::try_from(content.chars().count()).unwrap())
            .execute()
            .await
            .unwrap();
    }
}

/// Both stores rank a search the same way: by how many of its terms a message holds,
/// then the newest. SQLite ranked by FTS5's BM25, which put the one message holding a
/// rare identifier above twenty holding two of the three terms (and weighed each term by
/// how many rows of every session hold it, a cost that grew with the whole archive).
#[tokio::test]
async fn a_search_ranks_by_how_many_terms_a_message_holds_on_either_store() {
    let app = spawn_app().await;
    let mut rows = vec![(1, "E-4711 in the gateway log".to_owned())];
    rows.extend((2..=21).map(|n| (n, format!("request {n} timed out"))));
    archive_rows(&app, "s", &rows).await;
    archive_rows(
        &app,
        "other",
        &[(99, "request E-4711 timed out".to_owned())],
    )
    .await;

    let found = app
        .recall
        .search("s", "E-4711 request timed", 3, WAIT)
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [21, 20, 19],
        "{found:?}"
    );
    let found = app.recall.search("s", "E-4711", 3, WAIT).await.unwrap();
    assert_eq!(found.iter().map(|r| r.seq).collect::<Vec<_>>(), [1]);
}

/// On SQLite too, a search whose ranking runs out of time answers from the index: the
/// newest messages holding every term, then the newest holding any, as on Postgres
/// (`a_search_too_broad_to_rank_in_time_answers_from_the_indexes`, the same rows and
/// answers). SQLite has no statement timeout: each step's statement is interrupted by the
/// connection's progress handler at its deadline.
#[tokio::test]
async fn on_sqlite_a_search_too_broad_to_rank_in_time_answers_from_the_index() {
    use summarizer::store::{RecallBudget, RecallQuery, SqliteStore};
    if crate::helpers::backend() != summarizer::store::Backend::Sqlite {
        return;
    }
    let app = spawn_app().await;
    let rows: Vec<(i64, String)> = (1..=60)
        .map(|n| {
            let content = match n {
                1 => "request E-4711 timed out".to_owned(),
                2..=40 => format!("request {n} timed out"),
                _ => "all quiet".to_owned(),
            };
            (n, content)
        })
        .collect();
    archive_rows(&app, "s", &rows).await;
    archive_rows(
        &app,
        "other",
        &[(99, "request E-4711 timed out".to_owned())],
    )
    .await;
    let lite = SqliteStore::connect_lazy(&app.database_url, 2, WAIT).unwrap();
    let query = |terms: &[&str]| RecallQuery::Search {
        terms: terms.iter().map(|t| (*t).to_owned()).collect(),
        limit: 3,
    };
    let skip_ranking = RecallBudget {
        ranked_ms: None,
        ..RecallBudget::default()
    };
    let no_time_to_rank = RecallBudget {
        ranked_ms: Some(0),
        ..RecallBudget::default()
    };
    for budget in [skip_ranking, no_time_to_rank, RecallBudget::default()] {
        let seqs = |found: Vec<Recalled>| found.iter().map(|r| r.seq).collect::<Vec<_>>();
        let both = lite
            .recall_within("s", &query(&["request", "e-4711"]), 100, budget)
            .await
            .unwrap();
        assert_eq!(seqs(both), [1, 40, 39], "{budget:?}");
        let one = lite
            .recall_within("s", &query(&["timed"]), 100, budget)
            .await
            .unwrap();
        assert_eq!(seqs(one), [40, 39, 38], "{budget:?}");
        let none = lite
            .recall_within("s", &query(&["nowhere"]), 100, budget)
            .await
            .unwrap();
        assert!(none.is_empty(), "{budget:?}");
    }
}

//! The agent's own writes racing the worker's: agents append, pin, edit in place and
//! delete messages with plain SQL (what the Python client's mirror does too) while forced
//! compactions and precompute applies run on the same sessions. docs/protocol.md
//! ("Concurrent writes") promises that the agent's write succeeds and a compaction that
//! meets it either commits first or gives up (`skipped/conflict`), and that nothing is
//! lost. On Postgres an agent's UPDATE or DELETE locks its row and then, through the
//! counters' trigger, the session's row; a commit that locked the session's row first
//! and then waited for a message row deadlocked with it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;
use summarizer::outcome::{Reason, Status};
use summarizer::protocol::{InstructionsFrom, Overrides};
use summarizer_client::{Decision, TurnClient};
use tokio::time::Instant;

use crate::db::TestDb;
use crate::helpers::{SUMMARY, eventually, filler, postgres_only, spawn_app_with};

/// Long enough for hundreds of compactions to meet the agents' writes, and bounded.
const STORM: Duration = Duration::from_secs(20);
const SESSIONS: usize = 3;

/// What one agent did and saw. Rows are told apart by a tag at the start of their text.
#[derive(Default, Debug)]
struct Agent {
    appended: BTreeSet<String>,
    /// Tags of rows the agent's DELETE removed (it said so with RETURNING).
    deleted: BTreeSet<String>,
    /// Tags of rows the agent's UPDATE edited, with how many times.
    edited: BTreeMap<String, usize>,
    statements: usize,
    /// Every statement of the agent's that failed, and why.
    failures: Vec<String>,
    replies: Vec<(Status, Reason, Option<String>)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_writing_during_compactions_never_deadlock_and_lose_nothing() {
    let app = spawn_app_with(&[
        ("SUMMARIZATION_PRECOMPUTE_AT", "0.5"),
        ("WORKER_CONCURRENCY", "8"),
        ("DATABASE_MAX_CONNECTIONS", "20"),
        // The fake LLM answers in 20 ms; on a machine loaded by the rest of the suite
        // that can take seconds, and a timeout here is not what this test is about.
        ("LLM_TIMEOUT_MS", "20000"),
        ("LLM_DEADLINE_MS", "30000"),
        // Idle passes race the agents too: a session is due once the second it was last
        // written in is over (the schedule's resolution), which happens between an
        // agent's rounds.
        ("SUMMARIZATION_IDLE_AFTER_MS", "1"),
        // Over the keep is enough: the forced compactions keep the sessions small.
        ("SUMMARIZATION_IDLE_THRESHOLD_CHARS", "1"),
    ])
    .await;
    app.llm_answers(SUMMARY, Duration::from_millis(20)).await;
    let until = Instant::now() + STORM;
    let mut agents = Vec::new();
    let mut forcers = Vec::new();
    for s in 0..SESSIONS {
        let session = format!("storm-{s}");
        agents.push(tokio::spawn(agent(
            app.db.clone(),
            app.client.clone(),
            session.clone(),
            until,
        )));
        forcers.push(tokio::spawn(forcer(app.client.clone(), session, until)));
    }
    let mut agents_seen = Vec::new();
    for agent in agents {
        agents_seen.push(agent.await.unwrap());
    }
    let mut forced = Vec::new();
    for forcer in forcers {
        forced.extend(forcer.await.unwrap());
    }

    for (s, agent) in agents_seen.iter().enumerate() {
        assert!(
            agent.failures.is_empty(),
            "storm-{s}: {} of {} agent statements failed: {:?}",
            agent.failures.len(),
            agent.statements,
            &agent.failures[..agent.failures.len().min(5)]
        );
    }
    let replies = agents_seen.iter().flat_map(|a| &a.replies).chain(&forced);
    let failed: Vec<_> = replies
        .clone()
        .filter(|(status, reason, _)| {
            matches!(status, Status::Failed | Status::Rejected) || !expected(*reason)
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} replies failed or gave an unexpected reason: {failed:?}",
        failed.len()
    );
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, reason, _) in replies.clone() {
        *reasons.entry(reason.as_str()).or_default() += 1;
    }
    eprintln!("storm: replies by reason {reasons:?}");
    let conflicts = replies
        .clone()
        .filter(|(_, reason, _)| *reason == Reason::Conflict)
        .count();

    // Nothing lost: every row an agent appended and did not delete is in the history or
    // the archive, with its last edit; a row it deleted is in neither.
    let mut compactions = 0;
    let mut precomputed = 0;
    let mut forced_commits = 0;
    let mut idle_commits = 0;
    for (s, agent) in agents_seen.iter().enumerate() {
        let session = format!("storm-{s}");
        let mut stored: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for row in app
            .messages(&session)
            .await
            .into_iter()
            .chain(app.archived(&session).await)
        {
            let text = row.content.unwrap_or_default();
            if let Some(tag) = tag_of(&text) {
                stored.entry(tag).or_default().push(text);
            }
        }
        for tag in &agent.appended {
            let copies = stored.get(tag);
            if agent.deleted.contains(tag) {
                assert!(
                    copies.is_none(),
                    "{session}: deleted {tag} is stored: {copies:?}"
                );
                continue;
            }
            let copies = copies.unwrap_or_else(|| panic!("{session}: {tag} is lost"));
            if let Some(&edits) = agent.edited.get(tag) {
                let edited = "(edited)".repeat(edits);
                assert!(
                    copies.iter().any(|text| text.ends_with(&edited)),
                    "{session}: {tag} lost its {edits} edits: {copies:?}"
                );
            }
        }
        for (_, _, _, _, metadata) in app.usage_events(&session).await {
            compactions += 1;
            precomputed += usize::from(metadata["precomputed"] == json!(true));
            forced_commits += usize::from(metadata["forced"] == json!(true));
            idle_commits += usize::from(metadata["idle"] == json!(true));
        }
    }
    let statements: usize = agents_seen.iter().map(|a| a.statements).sum();
    eprintln!(
        "storm: {statements} agent statements, {compactions} compactions \
         ({forced_commits} forced, {idle_commits} idle, {precomputed} from pending summaries), \
         {conflicts} conflicts"
    );
    let text = crate::facts::metrics(&app).await;
    let idle_taken: f64 = (text.lines())
        .filter(|line| line.starts_with("summarizer_idle_sessions_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    for line in text
        .lines()
        .filter(|l| l.starts_with("summarizer_idle_sessions_total{"))
    {
        eprintln!("storm: {line}");
    }
    assert!(idle_taken >= 1.0, "no idle pass met the agents\n{text}");
    assert!(
        !text.contains("summarizer_idle_sessions_total{status=\"failed\""),
        "{text}"
    );
    // The storm met the worker's writes: not a run where nothing raced.
    assert!(
        forced_commits >= 3,
        "{forced_commits} forced compactions committed"
    );
    // On Postgres, where the deadlock was, a pending summary's apply met the agents too.
    // (On SQLite, with one writer at a time, the agents' writes can keep every pending
    // summary stale on a loaded machine: none applied is a pass there.)
    if crate::helpers::backend() == summarizer::store::Backend::Postgres {
        assert!(precomputed >= 1, "no pending summary was applied");
    }
    let report = app.check().await;
    assert!(report.is_clean(), "{report:?}");
}

/// Whether a reply's reason is one a storm may give: a commit, a conflict with the
/// agents' writes, another compaction of the session under way, or one of the skip rules
/// (which the agents' deletes and pins can make true at any moment; a forced compaction
/// sent before the agent's first insert finds no session). A backoff too: a background
/// compaction (a precompute, an idle pass) answers no one, and its LLM failure on a
/// loaded machine (the fake refused twice by the acceptance gate, or out of time) backs
/// the session off; the turns then say so. That is the LLM's side, which this test is
/// not about: a store error or a deadlock is a `failed` reply or an agent statement
/// that failed, and either fails it. Never anything unknown.
fn expected(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::Compacted
            | Reason::Cleared
            | Reason::Conflict
            | Reason::InProgress
            | Reason::BelowThreshold
            | Reason::TooFewTurns
            | Reason::NoSafeBoundary
            | Reason::WithinKeep
            | Reason::NothingToCompact
            | Reason::UnknownSession
            | Reason::BackingOff
    )
}

/// The tag at the start of a stored row's text: `[storm-0/17]`.
fn tag_of(text: &str) -> Option<String> {
    let end = text.find(']')?;
    text.starts_with("[storm-").then(|| text[..=end].to_owned())
}

/// An agent on `session` until `until`: each round appends a turn (a question and an
/// answer), asks whether to compact as an agent does before a turn, then pins or unpins,
/// edits or deletes a few of its rows, in one statement or one at a time.
async fn agent(db: TestDb, client: TurnClient, session: String, until: Instant) -> Agent {
    let mut seen = Agent::default();
    let mut n = 0;
    while Instant::now() < until {
        for role in ["user", "assistant"] {
            n += 1;
            let tag = format!("[{session}/{n}]");
            let text = format!("{tag} {role} says {} ", filler(60));
            let appended = db
                .query("INSERT INTO messages (session_id, role, content) VALUES ($1, $2, $3)")
                .bind(&session)
                .bind(role)
                .bind(text)
                .execute()
                .await;
            seen.record(appended.map(|_| ()));
            seen.appended.insert(tag);
        }
        let decision = client
            .turn_starting(&session, Duration::from_secs(15))
            .await;
        seen.replied(decision);
        let picked: Vec<(i64, String)> = match db
            .query(
                "SELECT seq, content FROM messages
                 WHERE session_id = $1 AND NOT is_summary ORDER BY random() LIMIT 3",
            )
            .bind(&session)
            .fetch_all()
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                seen.failures.push(format!("picking rows: {e}"));
                continue;
            }
        };
        let seqs: Vec<i64> = picked.iter().map(|(seq, _)| *seq).collect();
        let one_statement = fastrand::bool();
        let op = fastrand::u8(0..10);
        let groups: Vec<Vec<i64>> = if one_statement {
            vec![seqs]
        } else {
            seqs.into_iter().map(|seq| vec![seq]).collect()
        };
        for group in groups {
            let seqs = json!(group);
            let returned = match op {
                // Pins come and go, so that most of each history stays compactable.
                0..=3 => {
                    db.query(db.per_backend(
                        "UPDATE messages SET pinned = NOT pinned
                         WHERE session_id = $1 AND NOT is_summary
                           AND seq IN (SELECT jsonb_array_elements_text($2)::bigint)
                         RETURNING content",
                        "UPDATE messages SET pinned = NOT pinned
                         WHERE session_id = $1 AND NOT is_summary
                           AND seq IN (SELECT value FROM json_each($2))
                         RETURNING content",
                    ))
                    .bind(&session)
                    .bind(seqs)
                    .fetch_all::<(String,)>()
                    .await
                }
                4..=7 => db
                    .query(db.per_backend(
                        "UPDATE messages SET content = content || '(edited)'
                         WHERE session_id = $1 AND NOT is_summary
                           AND seq IN (SELECT jsonb_array_elements_text($2)::bigint)
                         RETURNING content",
                        "UPDATE messages SET content = content || '(edited)'
                         WHERE session_id = $1 AND NOT is_summary
                           AND seq IN (SELECT value FROM json_each($2))
                         RETURNING content",
                    ))
                    .bind(&session)
                    .bind(seqs)
                    .fetch_all::<(String,)>()
                    .await
                    .inspect(|rows| {
                        for (text,) in rows {
                            if let Some(tag) = tag_of(text) {
                                *seen.edited.entry(tag).or_default() += 1;
                            }
                        }
                    }),
                _ => db
                    .query(db.per_backend(
                        "DELETE FROM messages
                         WHERE session_id = $1 AND NOT is_summary
                           AND seq IN (SELECT jsonb_array_elements_text($2)::bigint)
                         RETURNING content",
                        "DELETE FROM messages
                         WHERE session_id = $1 AND NOT is_summary
                           AND seq IN (SELECT value FROM json_each($2))
                         RETURNING content",
                    ))
                    .bind(&session)
                    .bind(seqs)
                    .fetch_all::<(String,)>()
                    .await
                    .inspect(|rows| {
                        seen.deleted
                            .extend(rows.iter().filter_map(|(text,)| tag_of(text)));
                    }),
            };
            seen.record(returned.map(|_| ()));
        }
    }
    seen
}

impl Agent {
    fn record(&mut self, result: Result<(), sqlx::Error>) {
        self.statements += 1;
        if let Err(e) = result {
            self.failures.push(e.to_string());
        }
    }

    /// A reply, or a failure when none came: a worker that hangs on a lock answers
    /// nothing within the 15 s a request waits, and that is a failure here too.
    fn replied(&mut self, decision: Decision) {
        match decision {
            Decision::Replied(reply) => {
                self.replies
                    .push((reply.status, reply.reason, reply.message));
            }
            other => self.failures.push(format!("turn request: {other:?}")),
        }
    }
}

/// Forced compactions of `session`, one after another, until `until`: the operator's
/// `summarizer compact` in a loop.
async fn forcer(
    client: TurnClient,
    session: String,
    until: Instant,
) -> Vec<(Status, Reason, Option<String>)> {
    let mut replies = Vec::new();
    while Instant::now() < until {
        let decision = client
            .compact_with(
                &session,
                Some("Keep the tags."),
                InstructionsFrom::Operator,
                Overrides::default(),
                Duration::from_secs(15),
            )
            .await;
        match decision {
            Decision::Replied(reply) => {
                replies.push((reply.status, reply.reason, reply.message));
            }
            // No reply within 15 s: a hang, which the caller counts as a failure.
            other => replies.push((
                Status::Failed,
                Reason::Other,
                Some(format!("forced compaction: {other:?}")),
            )),
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..40))).await;
    }
    replies
}

/// An agent's statement that has locked a row of the prefix (here an open transaction
/// that read it `FOR UPDATE`, the moment before its trigger asks for the session's row)
/// is never waited for: the commit gives way at once, `skipped/conflict`, and writes
/// nothing, while that transaction is still open. Before, the commit waited on the row
/// while holding the session's, and the agent's trigger waited on that: a deadlock.
#[tokio::test]
async fn a_commit_gives_way_to_an_agent_holding_a_row_it_would_archive() {
    postgres_only!("row locks: SQLite has one writer at a time, and nothing to wait on");
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::from_millis(500)).await;
    app.append_turns("s", 5).await;
    let first = app.messages("s").await[0].seq;
    let turn = app.turn_starting_in_background("s");
    app.until_llm_called(1).await;
    let TestDb::Postgres(pool) = &app.db else {
        unreachable!("postgres_only");
    };
    let mut agent = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM messages WHERE session_id = 's' AND seq = $1 FOR UPDATE")
        .bind(first)
        .execute(&mut *agent)
        .await
        .unwrap();

    let decision = turn.await.unwrap();

    assert_eq!(decision.reason(), "conflict", "{decision:?}");
    agent.rollback().await.unwrap();
    assert!(app.messages("s").await.iter().all(|m| !m.is_summary));
    assert!(app.archived("s").await.is_empty());
    assert_eq!(app.lease_owner("s").await, None, "the lease is given back");
    // The next turn, with the row free, compacts.
    assert!(app.turn_starting("s").await.status == Status::Compacted);
}

/// The same for a pending summary's apply (`apply_pending_summary`): it gives way to the
/// agent, dropping the pending summary as the agent's write makes it stale, and the turn
/// compacts afresh, which gives way too.
#[tokio::test]
async fn a_pending_summary_gives_way_to_an_agent_holding_a_row_of_its_prefix() {
    postgres_only!("row locks: SQLite has one writer at a time, and nothing to wait on");
    let app = spawn_app_with(&[("SUMMARIZATION_PRECOMPUTE_AT", "0.5")]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 3).await;
    assert_eq!(app.turn_starting("s").await.reason, Reason::BelowThreshold);
    eventually("a pending summary", || async {
        pending_summaries(&app).await == 1
    })
    .await;
    app.append_turn("s", 4).await;
    let first = app.messages("s").await[0].seq;
    let TestDb::Postgres(pool) = &app.db else {
        unreachable!("postgres_only");
    };
    let mut agent = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM messages WHERE session_id = 's' AND seq = $1 FOR UPDATE")
        .bind(first)
        .execute(&mut *agent)
        .await
        .unwrap();

    let reply = app.turn_starting("s").await;

    assert_eq!(reply.reason, Reason::Conflict, "{reply:?}");
    assert_eq!(
        pending_summaries(&app).await,
        0,
        "the stale summary is dropped"
    );
    agent.rollback().await.unwrap();
    assert!(app.usage_events("s").await.is_empty());
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
}

async fn pending_summaries(app: &crate::helpers::TestApp) -> i64 {
    app.db
        .query("SELECT count(*) FROM pending_summaries")
        .scalar()
        .await
        .unwrap()
}

/// `summarizer restore` gives way too: it says an agent is writing and writes nothing,
/// instead of waiting on the agent's row while holding the session's.
#[tokio::test]
async fn a_restore_gives_way_to_an_agent_holding_a_row_it_would_change() {
    postgres_only!("row locks: SQLite has one writer at a time, and nothing to wait on");
    let app = spawn_app_with(&[]).await;
    app.llm_answers(SUMMARY, Duration::ZERO).await;
    app.append_turns("s", 5).await;
    assert_eq!(app.turn_starting("s").await.status, Status::Compacted);
    let compacted = app.messages("s").await;
    let summary = compacted.iter().find(|m| m.is_summary).unwrap().seq;
    let TestDb::Postgres(pool) = &app.db else {
        unreachable!("postgres_only");
    };
    let mut agent = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM messages WHERE session_id = 's' AND seq = $1 FOR UPDATE")
        .bind(summary)
        .execute(&mut *agent)
        .await
        .unwrap();

    let busy = app.store.restore("s", None).await;

    assert!(
        matches!(busy, Err(summarizer::store::RestoreError::Busy)),
        "{busy:?}"
    );
    agent.rollback().await.unwrap();
    assert_eq!(app.messages("s").await, compacted, "nothing written");
    assert!(app.store.restore("s", None).await.is_ok());
}

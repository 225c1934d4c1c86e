//! Recall at scale: searches of one session's archive of [`PER_SESSION`] messages, among
//! a small archive and then among a large one, each against a bare primary-key read of
//! the same database in the same run: a search should cost about the same at both sizes.
//! The searches go through the store's own function (what a recall request runs after
//! decoding), at concurrency 1.

use std::sync::Arc;

use serde::Serialize;
use summarizer::store::RecallQuery;

use super::load::{self, Measurement};
use crate::db::Scratch;

/// Archived messages per session, at every size.
pub const PER_SESSION: usize = 100;

/// The compaction ids of the seeded archive start here, past any compaction the bench's
/// other scenarios made in the same database (the archive's key is compaction and seq).
const FIRST_COMPACTION: i64 = 1 << 40;

/// The figures at one archive size.
#[derive(Debug, Serialize)]
pub struct RecallFigures {
    pub rows: usize,
    pub sessions: usize,
    /// A search for one identifier that one archived message of the session holds.
    pub identifier: Measurement,
    /// A search for two words that most of the session's messages hold.
    pub words: Measurement,
    /// A fetch of one seq.
    pub seqs: Measurement,
    /// A bare primary-key read of one archived row.
    pub primary_key: Measurement,
}

/// Seeds archived messages up to each of `sizes` in turn (ascending), [`PER_SESSION`]
/// to a session, and measures `ops` of each kind at each size (a tenth more, untimed,
/// first).
///
/// # Errors
/// When the database refuses the seed or a query.
pub async fn measure(
    db: &Scratch,
    sizes: &[usize],
    ops: usize,
) -> anyhow::Result<Vec<RecallFigures>> {
    let mut figures = Vec::new();
    let mut seeded = 0;
    for &rows in sizes {
        seed(db, seeded, rows).await?;
        seeded = rows;
        figures.push(at_size(db, rows, ops).await?);
    }
    Ok(figures)
}

/// Archives messages `from..to`: message n of session n / [`PER_SESSION`], a line of log
/// or prose with an identifier of its own (`E-<n>`) and words every message shares.
async fn seed(db: &Scratch, from: usize, to: usize) -> anyhow::Result<()> {
    const BATCH: usize = 100_000;
    for first in (from..to).step_by(BATCH) {
        let last = (first + BATCH).min(to);
        sqlx::query(
            "INSERT INTO archived_messages
                 (compaction_id, session_id, seq, role, content, is_summary, chars, created_at)
             SELECT $4 + n / $3, 'bench-recall-' || (n / $3), n,
                    CASE WHEN n % 3 = 0 THEN 'tool' ELSE 'assistant' END,
                    'step ' || n || ': E-' || n || ' on orders-db-' || (n % 7)
                        || ' p99=' || (n % 900) || 'ms, the connection pool stayed saturated '
                        || 'while retries piled up on checkout-api v2.' || (n % 9),
                    false, 120, now()
             FROM generate_series($1::bigint, $2::bigint - 1) AS n",
        )
        .bind(i64::try_from(first)?)
        .bind(i64::try_from(last)?)
        .bind(i64::try_from(PER_SESSION)?)
        .bind(FIRST_COMPACTION)
        .execute(&db.agents)
        .await?;
    }
    sqlx::query("ANALYZE archived_messages")
        .execute(&db.agents)
        .await?;
    Ok(())
}

async fn at_size(db: &Scratch, rows: usize, ops: usize) -> anyhow::Result<RecallFigures> {
    let store = Arc::new(db.store.clone());
    let pick = move |i: usize| {
        // Sessions and messages spread over the whole archive.
        let n = (i * 7_919) % rows;
        (format!("bench-recall-{}", n / PER_SESSION), n)
    };
    let warmup = ops / 10;
    let run = |query: fn(usize) -> RecallQuery| {
        let store = store.clone();
        load::run(1, ops, warmup, move |i| {
            let store = store.clone();
            let (session, n) = pick(i);
            async move {
                let found = store.recall(&session, &query(n), 4_000).await?;
                anyhow::ensure!(!found.is_empty(), "nothing recalled for {session}");
                Ok(())
            }
        })
    };
    let identifier = run(|n| RecallQuery::Search {
        terms: vec![format!("e-{n}")],
        limit: 5,
    })
    .await?;
    let words = run(|_| RecallQuery::Search {
        terms: vec!["connection".to_owned(), "saturated".to_owned()],
        limit: 5,
    })
    .await?;
    let seqs = run(|n| RecallQuery::Seqs(vec![n as i64])).await?;
    let agents = db.agents.clone();
    let primary_key = load::run(1, ops, warmup, move |i| {
        let agents = agents.clone();
        let (_, n) = pick(i);
        async move {
            sqlx::query(
                "SELECT content FROM archived_messages WHERE compaction_id = $1 AND seq = $2",
            )
            .bind(FIRST_COMPACTION + i64::try_from(n / PER_SESSION)?)
            .bind(i64::try_from(n)?)
            .fetch_one(&agents)
            .await?;
            Ok(())
        }
    })
    .await?;
    Ok(RecallFigures {
        rows,
        sessions: rows / PER_SESSION,
        identifier,
        words,
        seqs,
        primary_key,
    })
}

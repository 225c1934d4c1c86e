//! The agent's own archive ([`Recall`]): a search or a fetch of what compaction removed.

use std::future::Future;

use async_trait::async_trait;
use summarizer_client::Recalled;

use super::StoreError;

#[async_trait]
pub trait Recall: Send + Sync {
    /// The archived messages of `session_id` that `query` asks for, each cut at
    /// `max_chars` chars: a search's best first, a fetch's in seq order. Never another
    /// session's rows.
    async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError>;
}

/// What a recall asks of a session's archive (`crate::recall` makes it from a request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecallQuery {
    /// The archived messages holding any of `terms` (case-insensitive substrings, each of
    /// 3 chars or more), at most `limit`, best first.
    Search { terms: Vec<String>, limit: usize },
    /// The archived messages of these seqs, in seq order.
    Seqs(Vec<i64>),
}

/// A recalled row as both backends select it.
#[derive(sqlx::FromRow)]
pub(super) struct RecalledRow {
    pub(super) seq: i64,
    role: String,
    tool_call_id: Option<String>,
    content: Option<String>,
    truncated: bool,
    compaction_id: i64,
    archived_at: String,
    tool_name: Option<String>,
}

impl From<RecalledRow> for Recalled {
    fn from(row: RecalledRow) -> Self {
        Self {
            seq: row.seq,
            role: row.role,
            tool_name: row.tool_name,
            tool_call_id: row.tool_call_id,
            content: row.content.unwrap_or_default(),
            truncated: row.truncated,
            compaction_id: row.compaction_id,
            archived_at: row.archived_at,
        }
    }
}

/// How long each step of a search may take (see [`bounded`]).
#[derive(Clone, Copy, Debug)]
pub struct RecallBudget {
    /// The ranked search: ranking reads every message of the session that holds a term,
    /// and a term that most of a very large archive holds (`timed` in 50,000 archived
    /// log dumps of 2 KB: 3.4 s) would hold a connection the turn path needs. `None`
    /// skips it (for tests of what replaces it).
    pub ranked_ms: Option<u32>,
    /// Then the search for the messages holding every term ...
    pub all_terms_ms: u32,
    /// ... and the newest-first search that fills the results up.
    pub newest_ms: u32,
}

impl Default for RecallBudget {
    /// 3 s at most in all, within the clients' default 5 s timeout.
    fn default() -> Self {
        Self {
            ranked_ms: Some(800),
            all_terms_ms: 700,
            newest_ms: 1_500,
        }
    }
}

/// How a search step ranks what it finds: see [`bounded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ranking {
    /// The most terms held, then the newest: reads every match.
    Relevance,
    /// The newest of the messages holding every term: the index intersects the terms,
    /// so a rare one keeps this cheap however common the others are.
    AllTerms,
    /// The newest matches: reads the session's rows newest first, and stops at the limit.
    Newest,
}

/// A search as both backends bound it: ranked by relevance when that takes at most
/// `budget.ranked_ms`; when it would take longer (a term that most of a very large
/// archive holds), the best that can be found in bounded time instead: the newest
/// messages holding every term (the ranking's top, when a rare term narrows them; skipped
/// for one term), then the newest holding any, up to `limit` in all. `step` runs one
/// ranking within its time, in the backend's dialect.
///
/// # Errors
/// The first error a step fails with, or the last step's running out of time when it
/// had found nothing.
pub(super) async fn bounded<F, Fut>(
    step: F,
    session_id: &str,
    terms: usize,
    limit: i64,
    budget: RecallBudget,
) -> Result<Vec<RecalledRow>, sqlx::Error>
where
    F: Fn(Ranking, u32) -> Fut,
    Fut: Future<Output = Result<Step, sqlx::Error>>,
{
    if let Some(ms) = budget.ranked_ms {
        if let Step::Found(found) = step(Ranking::Relevance, ms).await? {
            return Ok(found);
        }
        tracing::info!(
            session_id,
            "recall: ranking every match would take over {ms} ms; \
             returning the newest that hold every term, then any"
        );
    }
    let mut found = Vec::new();
    if terms > 1
        && let Step::Found(rows) = step(Ranking::AllTerms, budget.all_terms_ms).await?
    {
        found = rows;
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if found.len() < limit {
        let newest = match step(Ranking::Newest, budget.newest_ms).await? {
            Step::Found(rows) => rows,
            // What the step before found is an answer, if not a full one.
            Step::OutOfTime(_) if !found.is_empty() => Vec::new(),
            Step::OutOfTime(e) => return Err(e),
        };
        for row in newest {
            if found.len() == limit {
                break;
            }
            if !found.iter().any(|f| f.seq == row.seq) {
                found.push(row);
            }
        }
    }
    Ok(found)
}

/// What one step of a bounded search came to.
pub(super) enum Step {
    Found(Vec<RecalledRow>),
    /// It ran out of its time (the database's own error for that).
    OutOfTime(sqlx::Error),
}

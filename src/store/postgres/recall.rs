//! Recall: the session's archived messages that a search's terms match, or that a fetch
//! names by seq (docs/protocol.md, "Recall"). A search is served by the trigram index on
//! the archived text (migration 17) or the session's own rows, whichever the planner
//! finds cheaper; either way no other session's row is read into a result.

use super::PgStore;
use crate::store::Recall;
use crate::store::recall::{self, Ranking, RecallBudget, RecallQuery, RecalledRow, Step};
use crate::store::{Recalled, StoreError};
use async_trait::async_trait;

/// Columns of a recalled row as [`RecalledRow`] reads them, `$N` being the max chars:
/// the content cut there, whether it was, and for a tool result the name of the call it
/// answers (the nearest earlier call of its id, archived or still in the history).
macro_rules! recalled_columns_sql {
    ($max:literal) => {
        concat!(
            "a.seq, a.role, a.tool_call_id, left(a.content, ",
            $max,
            ") AS content,
             coalesce(char_length(a.content) > ",
            $max,
            ", false) AS truncated, a.compaction_id,
             to_char(a.archived_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
                 AS archived_at,
             CASE WHEN a.tool_call_id IS NOT NULL THEN (
                 SELECT call ->> 'name'
                 FROM (SELECT c.seq, c.tool_calls FROM archived_messages c
                       WHERE c.session_id = a.session_id AND c.seq < a.seq
                         AND c.tool_calls IS NOT NULL
                       UNION ALL
                       SELECT m.seq, m.tool_calls FROM messages m
                       WHERE m.session_id = a.session_id AND m.seq < a.seq
                         AND m.tool_calls IS NOT NULL) AS c,
                      jsonb_array_elements(tool_calls_array(c.tool_calls)) AS call
                 WHERE call ->> 'id' = a.tool_call_id
                 ORDER BY c.seq DESC LIMIT 1)
             END AS tool_name"
        )
    };
}

impl PgStore {
    /// [`Self::recall`], a search bounded by `budget` (see [`Self::bounded_search`]).
    ///
    /// # Errors
    /// When the database is unreachable, or a search ran out of time at every step.
    pub async fn recall_within(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
        budget: RecallBudget,
    ) -> Result<Vec<Recalled>, StoreError> {
        let max_chars = i32::try_from(max_chars).unwrap_or(i32::MAX);
        let rows: Vec<RecalledRow> = match query {
            RecallQuery::Search { terms, limit } => {
                // Each term as an ILIKE pattern, its own `%`, `_` and `\` escaped: the
                // query is matched as text, never read as syntax.
                let patterns: Vec<String> = terms
                    .iter()
                    .map(|t| format!("%{}%", like_escaped(t)))
                    .collect();
                let search = Search {
                    session_id,
                    patterns: &patterns,
                    max_chars,
                    limit: i64::try_from(*limit).unwrap_or(i64::MAX),
                };
                self.bounded_search(&search, budget).await?
            }
            RecallQuery::Seqs(seqs) => {
                sqlx::query_as(concat!(
                    "SELECT DISTINCT ON (a.seq) ",
                    recalled_columns_sql!("$3"),
                    " FROM archived_messages a
                     WHERE a.session_id = $1 AND a.seq = ANY ($2) AND a.cleared_by IS NULL
                     ORDER BY a.seq, a.cleared DESC, a.compaction_id DESC"
                ))
                .bind(session_id)
                .bind(seqs)
                .bind(max_chars)
                .fetch_all(&self.pool)
                .await?
            }
        };
        Ok(rows.into_iter().map(Recalled::from).collect())
    }
}

/// One search's terms and bounds.
struct Search<'a> {
    session_id: &'a str,
    /// One ILIKE pattern per term.
    patterns: &'a [String],
    max_chars: i32,
    limit: i64,
}

impl PgStore {
    /// A search bounded by `budget` ([`recall::bounded`]), each step in a transaction
    /// of its own with a statement timeout.
    async fn bounded_search(
        &self,
        search: &Search<'_>,
        budget: RecallBudget,
    ) -> Result<Vec<RecalledRow>, sqlx::Error> {
        let steps = |ranking, timeout_ms| async move {
            match self.search(search, ranking, timeout_ms).await {
                Err(e) if is_canceled(&e) => Ok(Step::OutOfTime(e)),
                found => found.map(Step::Found),
            }
        };
        let terms = search.patterns.len();
        recall::bounded(steps, search.session_id, terms, search.limit, budget).await
    }

    /// One search, in a transaction of its own whose statement timeout is `timeout_ms`.
    async fn search(
        &self,
        search: &Search<'_>,
        ranking: Ranking,
        timeout_ms: u32,
    ) -> Result<Vec<RecalledRow>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        // $1 the session, $2 the max chars, $3 the limit, $4 the patterns (an array), or
        // for every term one pattern from $4 on: `ILIKE ALL (array)` is not indexable,
        // a conjunction of `ILIKE`s is (the trigram index intersects them).
        let any = "left(a.content, 1000000) ILIKE ANY ($4::text[])".to_owned();
        let (matching, order) = match ranking {
            Ranking::Relevance => (
                any,
                "(SELECT count(*) FROM unnest($4::text[]) AS p
                  WHERE left(a.content, 1000000) ILIKE p) DESC,
                 a.compaction_id DESC, a.seq DESC",
            ),
            Ranking::AllTerms => (
                (4..4 + search.patterns.len())
                    .map(|n| format!("left(a.content, 1000000) ILIKE ${n}"))
                    .collect::<Vec<_>>()
                    .join(" AND "),
                "a.compaction_id DESC, a.seq DESC",
            ),
            // The session's index read backwards: the trigram index, which cannot give
            // rows in order, is left out.
            Ranking::Newest => {
                sqlx::query("SET LOCAL enable_bitmapscan = off")
                    .execute(&mut *tx)
                    .await?;
                (any, "a.seq DESC")
            }
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET LOCAL statement_timeout = {timeout_ms}"
        )))
        .execute(&mut *tx)
        .await?;
        let sql = format!(
            concat!(
                "SELECT ",
                recalled_columns_sql!("$2"),
                " FROM archived_messages a
                 WHERE a.session_id = $1 AND a.cleared_by IS NULL AND ({})
                 ORDER BY {}
                 LIMIT $3"
            ),
            matching, order
        );
        let query = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(search.session_id)
            .bind(search.max_chars)
            .bind(search.limit);
        let query = if ranking == Ranking::AllTerms {
            (search.patterns.iter()).fold(query, |q, p| q.bind(p))
        } else {
            query.bind(search.patterns)
        };
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }
}

/// Whether the statement was canceled by its timeout.
fn is_canceled(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("57014"))
}

/// `text` for a LIKE pattern: `\`, `%` and `_` escaped with `\`, Postgres's default.
fn like_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[async_trait]
impl Recall for PgStore {
    /// The archived messages of `session_id` that `query` asks for, each cut at
    /// `max_chars`: a search's best first (the most of its terms held, then the newest),
    /// a fetch's in seq order. A copy of a cleared result's placeholder (archived when a
    /// later summary removed it) is never a result: its original is.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError> {
        (self.recall_within(session_id, query, max_chars, RecallBudget::default())).await
    }
}

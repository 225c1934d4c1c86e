//! Recall, as Postgres answers it (see its `recall.rs`), over the FTS5 trigram index of
//! the archive (SQLite migration 5). A search's terms and the session are phrases of
//! index queries, so the index finds the session's matching rows without reading any
//! other row, and each statement runs under a time limit with the same bounded fallback
//! as Postgres.
//!
//! Every search names the index first in a `CROSS JOIN`, which SQLite never reorders:
//! left to choose, its planner (with no statistics, as a worker's file has none) read
//! the session's archived rows and ran the whole index query again for each one, so a
//! search cost the square of the session's archive. Nor is a search ranked by FTS5's
//! `bm25`, whose weight of a term counts the rows that hold it across every session, so
//! that a small session's search slowed with every other session's archive. It ranks, as
//! Postgres does, by how many of the terms a message holds, then the newest. (The
//! figures: docs/benchmarks.md, "SQLite recall, index first".)

use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

use super::SqliteStore;
use crate::store::Recall;
use crate::store::recall::{self, Ranking, RecallQuery, RecalledRow, Step};
use crate::store::{RecallBudget, Recalled, StoreError};

/// Columns of a recalled row as [`RecalledRow`] reads them, `?2` being the max chars:
/// the content cut there, whether it was, and for a tool result the name of the call it
/// answers (the nearest earlier call of its id, archived or still in the history). Each
/// of the two lookups reads the session's rows newest first from just before the result
/// and stops at the first call of that id (usually the message before it).
const RECALLED_COLUMNS: &str = "a.seq, a.role, a.tool_call_id, substr(a.content, 1, ?2) AS content,
     coalesce(length(a.content) > ?2, 0) AS truncated, a.compaction_id, a.archived_at,
     CASE WHEN a.tool_call_id IS NOT NULL THEN (
         SELECT json_extract(call.value, '$.name')
         FROM (SELECT seq, tool_calls FROM (
                   SELECT c.seq, c.tool_calls FROM archived_messages c
                   WHERE c.session_id = a.session_id AND c.seq < a.seq
                     AND c.tool_calls IS NOT NULL
                     AND EXISTS (SELECT 1 FROM json_each(c.tool_calls) AS j
                                 WHERE j.type = 'object'
                                   AND json_extract(j.value, '$.id') = a.tool_call_id)
                   ORDER BY c.seq DESC LIMIT 1)
               UNION ALL
               SELECT seq, tool_calls FROM (
                   SELECT m.seq, m.tool_calls FROM messages m
                   WHERE m.session_id = a.session_id AND m.seq < a.seq
                     AND m.tool_calls IS NOT NULL
                     AND EXISTS (SELECT 1 FROM json_each(m.tool_calls) AS j
                                 WHERE j.type = 'object'
                                   AND json_extract(j.value, '$.id') = a.tool_call_id)
                   ORDER BY m.seq DESC LIMIT 1)
               ORDER BY seq DESC LIMIT 1) AS c,
              json_each(c.tool_calls) AS call
         WHERE call.type = 'object' AND json_extract(call.value, '$.id') = a.tool_call_id
         LIMIT 1)
     END AS tool_name";

/// How many SQLite VM instructions run between two looks at a search's deadline: often
/// enough that a search stops soon after it, rarely enough that the clock reads cost
/// nothing measurable (docs/benchmarks.md, "Figures behind the code").
const CHECK_EVERY: i32 = 1_000;

impl SqliteStore {
    /// [`Self::recall`], a search bounded by `budget`, as
    /// [`crate::store::PgStore::recall_within`].
    ///
    /// # Errors
    /// When the file cannot be read, or a search ran out of time at every step.
    pub async fn recall_within(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
        budget: RecallBudget,
    ) -> Result<Vec<Recalled>, StoreError> {
        let max_chars = i64::try_from(max_chars).unwrap_or(i64::MAX);
        let rows: Vec<RecalledRow> = match query {
            RecallQuery::Search { terms, limit } => {
                let search = Search {
                    session_id,
                    terms,
                    max_chars,
                    limit: i64::try_from(*limit).unwrap_or(i64::MAX),
                };
                self.bounded_search(&search, budget).await?
            }
            RecallQuery::Seqs(seqs) => {
                let sql = format!(
                    "SELECT {RECALLED_COLUMNS}
                     FROM archived_messages a
                     WHERE a.session_id = ?1 AND a.cleared_by IS NULL
                       AND a.seq IN (SELECT value FROM json_each(?3))
                       AND a.id = (SELECT b.id FROM archived_messages b
                                   WHERE b.session_id = a.session_id AND b.seq = a.seq
                                     AND b.cleared_by IS NULL
                                   ORDER BY b.cleared DESC, b.compaction_id DESC LIMIT 1)
                     ORDER BY a.seq"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(session_id)
                    .bind(max_chars)
                    .bind(serde_json::to_string(seqs).unwrap_or_else(|_| "[]".to_owned()))
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
    terms: &'a [String],
    max_chars: i64,
    limit: i64,
}

impl SqliteStore {
    /// A search bounded by `budget` ([`recall::bounded`]), each step on a connection
    /// whose statements SQLite interrupts at the step's deadline.
    async fn bounded_search(
        &self,
        search: &Search<'_>,
        budget: RecallBudget,
    ) -> Result<Vec<RecalledRow>, sqlx::Error> {
        let steps = |ranking, timeout_ms| async move {
            match self.search(search, ranking, timeout_ms).await {
                Err(e) if is_interrupted(&e) => Ok(Step::OutOfTime(e)),
                found => found.map(Step::Found),
            }
        };
        let terms = search.terms.len();
        recall::bounded(steps, search.session_id, terms, search.limit, budget).await
    }

    /// One search, on a connection whose statements SQLite interrupts after `timeout_ms`.
    async fn search(
        &self,
        search: &Search<'_>,
        ranking: Ranking,
        timeout_ms: u32,
    ) -> Result<Vec<RecalledRow>, sqlx::Error> {
        let sql = search_sql(ranking);
        let matching = matching(search, ranking);
        let mut conn =
            TimeLimited::acquire(&self.pool, Duration::from_millis(u64::from(timeout_ms))).await?;
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(search.session_id)
            .bind(search.max_chars)
            .bind(search.limit)
            .bind(matching)
            .fetch_all(conn.connection())
            .await;
        conn.release().await?;
        rows
    }
}

/// The statement of one ranking: `?1` the session, `?2` the max chars, `?3` the limit,
/// `?4` the index queries ([`Ranking::Relevance`]: a JSON array of one per term;
/// [`Ranking::AllTerms`]: one) or the terms ([`Ranking::Newest`]: a JSON array).
///
/// The best `limit` are found first, then their columns: the tool name's lookup and the
/// cut content cost a read each, for the results only. Each `CROSS JOIN` keeps its left
/// side the outer loop: the index is read once, never once per archived row.
fn search_sql(ranking: Ranking) -> String {
    let (best, order) = match ranking {
        Ranking::Relevance => (
            "WITH held (id, terms) AS MATERIALIZED (
                 SELECT s.rowid, count(*)
                 FROM json_each(?4) AS q CROSS JOIN archived_search AS s
                 WHERE archived_search MATCH q.value
                 GROUP BY s.rowid),
             best (id, terms) AS MATERIALIZED (
                 SELECT a.id, h.terms
                 FROM held AS h CROSS JOIN archived_messages AS a ON a.id = h.id
                 WHERE a.session_id = ?1 AND a.cleared_by IS NULL
                 ORDER BY h.terms DESC, a.compaction_id DESC, a.seq DESC
                 LIMIT ?3)",
            "best.terms DESC, a.compaction_id DESC, a.seq DESC",
        ),
        Ranking::AllTerms => (
            "WITH best (id) AS MATERIALIZED (
                 SELECT a.id
                 FROM archived_search AS s CROSS JOIN archived_messages AS a ON a.id = s.rowid
                 WHERE archived_search MATCH ?4 AND a.session_id = ?1 AND a.cleared_by IS NULL
                 ORDER BY a.compaction_id DESC, a.seq DESC
                 LIMIT ?3)",
            "a.compaction_id DESC, a.seq DESC",
        ),
        // As Postgres's: the session's index read backwards, each row matched as text,
        // so that a term most rows hold ends the read after a few rows. `lower` folds
        // ASCII letters only (the index folds every letter): here a letter beyond ASCII
        // matches only in the case the term writes it.
        Ranking::Newest => (
            "WITH best (id) AS MATERIALIZED (
                 SELECT a.id
                 FROM archived_messages AS a
                 WHERE a.session_id = ?1 AND a.cleared_by IS NULL
                   AND EXISTS (SELECT 1 FROM json_each(?4) AS t
                               WHERE instr(lower(substr(a.content, 1, 1000000)),
                                           lower(t.value)) > 0)
                 ORDER BY a.seq DESC
                 LIMIT ?3)",
            "a.seq DESC",
        ),
    };
    format!(
        "{best}
         SELECT {RECALLED_COLUMNS}
         FROM best CROSS JOIN archived_messages AS a ON a.id = best.id
         ORDER BY {order}"
    )
}

/// `?4` of [`search_sql`].
fn matching(search: &Search<'_>, ranking: Ranking) -> String {
    match ranking {
        Ranking::Relevance => json_array(
            &(search.terms.iter())
                .map(|t| term_in_session(search.session_id, t))
                .collect::<Vec<_>>(),
        ),
        Ranking::AllTerms => every_term_in_session(search.session_id, search.terms),
        Ranking::Newest => json_array(search.terms),
    }
}

/// Whether SQLite interrupted the statement (the time limit's progress handler).
fn is_interrupted(error: &sqlx::Error) -> bool {
    // SQLITE_INTERRUPT.
    matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("9"))
}

/// A pooled connection whose statements SQLite interrupts (`SQLITE_INTERRUPT`) once a
/// deadline has passed, through its progress handler: SQLite has no statement timeout.
/// [`Self::release`] removes the handler before the connection goes back to the pool.
struct TimeLimited {
    conn: Option<PoolConnection<Sqlite>>,
}

impl TimeLimited {
    async fn acquire(pool: &SqlitePool, limit: Duration) -> Result<Self, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        let deadline = Instant::now() + limit;
        (conn.lock_handle().await?)
            .set_progress_handler(CHECK_EVERY, move || Instant::now() < deadline);
        Ok(Self { conn: Some(conn) })
    }

    fn connection(&mut self) -> &mut SqliteConnection {
        // Only `release` and `drop` take it, and both consume the value.
        self.conn
            .as_mut()
            .expect("the connection is held until released")
    }

    /// Removes the time limit; the connection goes back to the pool.
    async fn release(mut self) -> Result<(), sqlx::Error> {
        match self.conn.take() {
            Some(conn) => without_limit(conn).await,
            None => Ok(()),
        }
    }
}

impl Drop for TimeLimited {
    /// Dropped unreleased (the search's future was dropped): the statement may still be
    /// running on the connection's thread, and stops at the deadline at the latest. The
    /// limit is removed after it, before any other statement runs on the connection;
    /// without a runtime to do that, the connection is closed instead.
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        let _ = without_limit(conn).await;
                    });
                }
                Err(_) => conn.close_on_drop(),
            }
        }
    }
}

/// `conn` without its time limit, back to the pool; closed when the limit could not be
/// removed, so that no later statement on it is interrupted.
async fn without_limit(mut conn: PoolConnection<Sqlite>) -> Result<(), sqlx::Error> {
    let removed = match conn.lock_handle().await {
        Ok(mut handle) => {
            handle.remove_progress_handler();
            Ok(())
        }
        Err(e) => Err(e),
    };
    if removed.is_err() {
        conn.close_on_drop();
    }
    removed
}

/// `text` as an FTS5 phrase: quoted, its own quotes doubled, so that no operator, quote
/// or column name in it is read as FTS5 syntax.
fn phrase(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// The session as a phrase of the index's `session` column (its id between two unit
/// separators, as the migration indexes it).
fn session_phrase(session_id: &str) -> String {
    format!("session : {}", phrase(&format!("\u{1f}{session_id}\u{1f}")))
}

/// The index query for the session's rows holding `term`.
fn term_in_session(session_id: &str, term: &str) -> String {
    format!("{} AND body : {}", session_phrase(session_id), phrase(term))
}

/// The index query for the session's rows holding every one of `terms`.
fn every_term_in_session(session_id: &str, terms: &[String]) -> String {
    let every: Vec<String> = terms.iter().map(|t| phrase(t)).collect();
    format!(
        "{} AND body : ({})",
        session_phrase(session_id),
        every.join(" AND ")
    )
}

fn json_array(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

#[async_trait]
impl Recall for SqliteStore {
    /// As Postgres's ([`crate::store::Recall::recall`]): a search's best first (the most of its terms
    /// held, then the newest), a fetch's in seq order.
    ///
    /// # Errors
    /// When the file cannot be read, or a search ran out of time at every step.
    async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError> {
        (self.recall_within(session_id, query, max_chars, RecallBudget::default())).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Ranking, Search, SqliteStore, TimeLimited};
    use crate::store::prelude::*;
    use crate::store::{RecallBudget, RecallQuery};

    #[test]
    fn every_term_and_the_session_are_quoted_phrases() {
        let terms = ["E-5417".to_owned(), "a\" OR body:x".to_owned()];
        assert_eq!(
            super::term_in_session("s\"1", &terms[1]),
            "session : \"\u{1f}s\"\"1\u{1f}\" AND body : \"a\"\" OR body:x\""
        );
        assert_eq!(
            super::every_term_in_session("s\"1", &terms),
            "session : \"\u{1f}s\"\"1\u{1f}\" AND body : (\"E-5417\" AND \"a\"\" OR body:x\")"
        );
    }

    /// A fresh store (one connection), with 300 archived log lines in session `s` (the
    /// even seqs) and as many in `other`, each holding `timed`, seqs 42 and 43 `E-4711`
    /// too, and no statistics: a worker's
    /// file has none (nothing runs ANALYZE), and its planner then drove the search from
    /// the session's rows.
    async fn archive() -> SqliteStore {
        let store = SqliteStore::connect_lazy("sqlite::memory:", 1, Duration::from_secs(5))
            .expect("a valid URL");
        store.migrate().await.expect("the migration applies");
        sqlx::query(
            "WITH RECURSIVE n (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < 600)
             INSERT INTO archived_messages
                 (compaction_id, session_id, seq, role, content, is_summary, chars, created_at)
             SELECT 1 + n / 100, CASE WHEN n % 2 = 0 THEN 's' ELSE 'other' END, n, 'tool',
                    'GET /cart/' || n || ' status=502 request '
                        || CASE WHEN n IN (42, 43) THEN 'E-4711 ' ELSE '' END || 'timed out',
                    0, 40,
                    '2026-12-06T00:00:00Z'
             FROM n",
        )
        .execute(store.pool())
        .await
        .expect("the archive is written");
        store
    }

    fn search<'a>(terms: &'a [String]) -> Search<'a> {
        Search {
            session_id: "s",
            terms,
            max_chars: 100,
            limit: 3,
        }
    }

    /// What each search statement reads first and how, from SQLite's EXPLAIN QUERY PLAN
    /// with its parameters bound as a search binds them.
    async fn plan(store: &SqliteStore, ranking: Ranking, terms: &[String]) -> Vec<String> {
        let (sql, matching) = (
            super::search_sql(ranking),
            super::matching(&search(terms), ranking),
        );
        sqlx::query_as::<_, (i64, i64, i64, String)>(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {sql}"
        )))
        .bind("s")
        .bind(100_i64)
        .bind(3_i64)
        .bind(matching)
        .fetch_all(store.pool())
        .await
        .expect("the plan")
        .into_iter()
        .map(|(_, _, _, detail)| detail)
        .collect()
    }

    /// The quadratic search: SQLite read the session's archived rows by its index and,
    /// for each, ran the whole index query again (`INDEX 0:=M2`, a MATCH with the rowid
    /// given). Every index search now reads the index once, first, and the archive by
    /// primary key.
    #[tokio::test]
    async fn the_index_is_read_once_and_first_by_every_index_search() {
        let store = archive().await;
        let terms = ["request".to_owned(), "timed".to_owned()];
        for ranking in [Ranking::Relevance, Ranking::AllTerms] {
            let plan = plan(&store, ranking, &terms).await;
            let reads: Vec<&String> = (plan.iter())
                .filter(|d| d.starts_with("SCAN") || d.starts_with("SEARCH"))
                .collect();
            let index = (reads.iter())
                .position(|d| d.starts_with("SCAN s VIRTUAL TABLE"))
                .unwrap_or_else(|| panic!("{ranking:?}: no read of the index: {plan:#?}"));
            assert!(
                !reads[index].contains(":="),
                "{ranking:?}: the index is queried once per row: {plan:#?}"
            );
            assert!(
                reads[..index]
                    .iter()
                    .all(|d| d.starts_with("SCAN q VIRTUAL TABLE")),
                "{ranking:?}: something is read before the index: {plan:#?}"
            );
            assert!(
                (reads[index + 1..].iter())
                    .all(|d| !d.contains("archived_messages_session (session_id=?)")),
                "{ranking:?}: the session's rows are read beside the index: {plan:#?}"
            );
        }
        // The last resort reads the session's rows newest first, never the index.
        let plan = plan(&store, Ranking::Newest, &terms).await;
        assert!(
            plan.iter()
                .any(|d| d.contains("archived_messages_session (session_id=?)")),
            "{plan:#?}"
        );
        assert!(
            !plan.iter().any(|d| d.contains("VIRTUAL TABLE INDEX 0:")),
            "{plan:#?}"
        );
    }

    fn query(terms: &[&str]) -> RecallQuery {
        RecallQuery::Search {
            terms: terms.iter().map(|t| (*t).to_owned()).collect(),
            limit: 3,
        }
    }

    fn seqs(found: Vec<crate::store::Recalled>) -> Vec<i64> {
        found.iter().map(|r| r.seq).collect()
    }

    /// A ranked search out of time is interrupted (a budget of 0 ms: at SQLite's first
    /// look at the clock) and answered by the fallback, on a store of one connection,
    /// which runs on with no limit left on it.
    #[tokio::test]
    async fn a_search_out_of_time_is_interrupted_and_its_connection_runs_on() {
        let store = archive().await;
        let terms = ["timed".to_owned()];
        let interrupted = store.search(&search(&terms), Ranking::Relevance, 0).await;
        assert!(
            interrupted.as_ref().is_err_and(super::is_interrupted),
            "{:?}",
            interrupted.map(|rows| rows.len())
        );
        let out_of_time = RecallBudget {
            ranked_ms: Some(0),
            ..RecallBudget::default()
        };
        let ranked = RecallBudget::default();
        for budget in [out_of_time, ranked] {
            let both = store
                .recall_within("s", &query(&["request", "e-4711"]), 100, budget)
                .await
                .expect("answered");
            assert_eq!(seqs(both), [42, 600, 598], "{budget:?}");
            let one = store
                .recall_within("s", &query(&["timed"]), 100, budget)
                .await
                .expect("answered");
            assert_eq!(seqs(one), [600, 598, 596], "{budget:?}");
        }
        // The last step out of time too, having found nothing (no row holds the term, so
        // it reads them all): the search fails.
        let none = RecallBudget {
            ranked_ms: None,
            all_terms_ms: 0,
            newest_ms: 0,
        };
        let failed = (store.recall_within("s", &query(&["nowhere"]), 100, none)).await;
        assert!(failed.is_err(), "{failed:?}");
        // The one connection has no limit left: a long statement runs to its end.
        let counted: i64 = sqlx::query_scalar(
            "WITH RECURSIVE n (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < 100000)
             SELECT count(*) FROM n",
        )
        .fetch_one(store.pool())
        .await
        .expect("not interrupted");
        assert_eq!(counted, 100_000);
    }

    /// A search's future dropped while its limit is on (a recall request abandoned): the
    /// limit is taken off the connection before anything else runs on it.
    #[tokio::test]
    async fn a_limit_left_behind_by_a_dropped_search_is_removed() {
        let store = archive().await;
        let limited = TimeLimited::acquire(store.pool(), Duration::ZERO)
            .await
            .expect("the one connection");
        drop(limited);
        let counted: i64 = sqlx::query_scalar(
            "WITH RECURSIVE n (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < 100000)
             SELECT count(*) FROM n",
        )
        .fetch_one(store.pool())
        .await
        .expect("not interrupted");
        assert_eq!(counted, 100_000);
    }
}

//! Recall, as Postgres answers it (see its `recall.rs`), over the FTS5 trigram index of
//! the archive (SQLite migration 5): a search's terms and the session are phrases of one
//! index query, so a search costs an index lookup whatever the archive's size.

use super::SqliteStore;
use crate::store::model::{RecallQuery, RecalledRow};
use crate::store::{Recalled, StoreError};

/// Columns of a recalled row as [`RecalledRow`] reads them, `$3` being the max chars.
/// SQLite keeps `tool_calls` as JSON text that is always an array (its CHECK).
const RECALLED_COLUMNS: &str = "a.seq, a.role, a.tool_call_id, substr(a.content, 1, $3) AS content,
     coalesce(length(a.content) > $3, 0) AS truncated, a.compaction_id, a.archived_at,
     CASE WHEN a.tool_call_id IS NOT NULL THEN (
         SELECT json_extract(call.value, '$.name')
         FROM (SELECT c.seq, c.tool_calls FROM archived_messages c
               WHERE c.session_id = a.session_id AND c.seq < a.seq AND c.tool_calls IS NOT NULL
               UNION ALL
               SELECT m.seq, m.tool_calls FROM messages m
               WHERE m.session_id = a.session_id AND m.seq < a.seq AND m.tool_calls IS NOT NULL)
              AS c, json_each(c.tool_calls) AS call
         WHERE call.type = 'object' AND json_extract(call.value, '$.id') = a.tool_call_id
         ORDER BY c.seq DESC LIMIT 1)
     END AS tool_name";

impl SqliteStore {
    /// As [`crate::store::PgStore::recall`]: a search's best first (FTS5's bm25 over the
    /// terms, then the newest), a fetch's in seq order.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError> {
        let max_chars = i64::try_from(max_chars).unwrap_or(i64::MAX);
        let rows: Vec<RecalledRow> = match query {
            RecallQuery::Search { terms, limit } => {
                let matching = match_expression(session_id, terms);
                // The best `limit` matches first, then their columns: the tool name's
                // lookup and the cut content cost a read each, for the results only
                // (SQLite would compute them for every match it sorts).
                let sql = format!(
                    "SELECT {RECALLED_COLUMNS}
                     FROM (SELECT a.id, bm25(archived_search, 0.0, 1.0) AS rank
                           FROM archived_search s JOIN archived_messages a ON a.id = s.rowid
                           WHERE archived_search MATCH $2 AND a.session_id = $1
                             AND a.cleared_by IS NULL
                           ORDER BY rank, a.compaction_id DESC, a.seq DESC
                           LIMIT $4) AS best
                     JOIN archived_messages a ON a.id = best.id
                     ORDER BY best.rank, a.compaction_id DESC, a.seq DESC"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(session_id)
                    .bind(matching)
                    .bind(max_chars)
                    .bind(i64::try_from(*limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool)
                    .await?
            }
            RecallQuery::Seqs(seqs) => {
                let sql = format!(
                    "SELECT {RECALLED_COLUMNS}
                     FROM archived_messages a
                     WHERE a.session_id = $1 AND a.cleared_by IS NULL
                       AND a.seq IN (SELECT value FROM json_each($2))
                       AND a.id = (SELECT b.id FROM archived_messages b
                                   WHERE b.session_id = a.session_id AND b.seq = a.seq
                                     AND b.cleared_by IS NULL
                                   ORDER BY b.cleared DESC, b.compaction_id DESC LIMIT 1)
                     ORDER BY a.seq"
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(session_id)
                    .bind(serde_json::to_string(seqs).unwrap_or_else(|_| "[]".to_owned()))
                    .bind(max_chars)
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        Ok(rows.into_iter().map(Recalled::from).collect())
    }
}

/// The FTS5 query for `terms` in `session_id`'s rows: the session as a phrase of the
/// `session` column, and any of the terms as a phrase of `body`. Every phrase is quoted
/// with its own quotes doubled, so that no operator, quote or column name in a term is
/// read as FTS5 syntax.
fn match_expression(session_id: &str, terms: &[String]) -> String {
    let phrase = |text: &str| format!("\"{}\"", text.replace('"', "\"\""));
    let any: Vec<String> = terms.iter().map(|t| phrase(t)).collect();
    format!(
        "session : {} AND body : ({})",
        phrase(&format!("\u{1f}{session_id}\u{1f}")),
        any.join(" OR ")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_term_and_the_session_are_quoted_phrases() {
        assert_eq!(
            super::match_expression("s\"1", &["E-5417".to_owned(), "a\" OR body:x".to_owned()]),
            "session : \"\u{1f}s\"\"1\u{1f}\" AND body : (\"E-5417\" OR \"a\"\" OR body:x\")"
        );
    }
}

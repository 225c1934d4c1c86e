//! The queries behind `summarizer check` and `summarizer repair` on SQLite: the same
//! invariants as on Postgres, each one query listing the sessions that break it, in
//! SQLite's JSON functions.

use async_trait::async_trait;
use sqlx::Row;

use super::SqliteStore;
use crate::store::Invariants;
use crate::store::invariants::{DriftRow, drift_finding};
use crate::store::{CounterDrift, Finding, Invariant, StoreError, Totals};

/// The calls of `<alias>.tool_calls` as the worker reads them (`Message::calls`), as
/// Postgres's `tool_calls_array` function does: an array as is, a JSON string holding an
/// array decoded, anything else `[]`. Nested CASEs, because only CASE promises to test
/// before it reads, and json_type fails on text that is not JSON.
macro_rules! tool_calls_array_sql {
    ($alias:literal) => {
        concat!(
            "CASE WHEN NOT json_valid(",
            $alias,
            ".tool_calls) THEN '[]'
                  WHEN json_type(",
            $alias,
            ".tool_calls) = 'array' THEN ",
            $alias,
            ".tool_calls
                  WHEN json_type(",
            $alias,
            ".tool_calls) = 'text' THEN
                      CASE WHEN NOT json_valid(json_extract(",
            $alias,
            ".tool_calls, '$')) THEN '[]'
                           WHEN json_type(json_extract(",
            $alias,
            ".tool_calls, '$')) = 'array'
                           THEN json_extract(",
            $alias,
            ".tool_calls, '$')
                           ELSE '[]' END
                  ELSE '[]' END"
        )
    };
}

/// Whether a message `<alias>` of the session of `t` makes the call `t` answers: its
/// calls as `jsonb_array_elements(tool_calls_array(...))` gives them in Postgres, an
/// element's `id` read only from an object (as `call ->> 'id'` reads it).
macro_rules! calls_of_sql {
    ($table:literal, $alias:literal) => {
        concat!(
            "SELECT 1 FROM ",
            $table,
            " ",
            $alias,
            ", json_each(",
            tool_calls_array_sql!($alias),
            ") AS call
             WHERE ",
            $alias,
            ".session_id = t.session_id AND ",
            $alias,
            ".tool_calls IS NOT NULL
               AND CASE WHEN call.type = 'object' THEN json_extract(call.value, '$.id') END
                   = t.tool_call_id"
        )
    };
}

/// `(session_id, detail)` for each breach of `invariant`, as Postgres lists them. `None` for [`Invariant::CountersDrift`], read through
/// [`SqliteStore::counter_drift`].
fn breaches_sql(invariant: Invariant) -> Option<&'static str> {
    Some(match invariant {
        Invariant::DuplicatedMessage => {
            "SELECT session_id, 'seq ' || seq FROM (
                 SELECT session_id, seq FROM messages WHERE NOT is_summary
                 UNION ALL
                 SELECT session_id, seq FROM archived_messages
                 WHERE NOT is_summary AND NOT cleared
             ) AS everything
             GROUP BY session_id, seq HAVING count(*) > 1"
        }
        Invariant::SeveralSummaries => {
            "SELECT session_id, count(*) || ' summaries' FROM messages WHERE is_summary
             GROUP BY session_id HAVING count(*) > 1"
        }
        // As on Postgres: a pinned message and the rows of its tool-call exchange stay
        // where they are; exchanges are worked out only for the rows before a summary and
        // the pinned rows of their sessions.
        Invariant::MisplacedSummary => concat!(
            "WITH before AS (
                 SELECT s.session_id, s.seq AS summary_seq, m.seq, m.pinned,
                        m.tool_calls, m.tool_call_id
                 FROM messages s
                 JOIN messages m ON m.session_id = s.session_id AND m.seq < s.seq
                     AND m.role <> 'system' AND NOT m.is_summary
                 WHERE s.is_summary
             ), rows AS (
                 SELECT session_id, seq, pinned, tool_calls, tool_call_id FROM before
                 UNION
                 SELECT session_id, seq, pinned, tool_calls, tool_call_id FROM messages
                 WHERE pinned AND session_id IN (SELECT session_id FROM before)
             ), exchange AS (
                 SELECT r.session_id, r.seq, r.pinned,
                        CASE WHEN json_array_length(",
            tool_calls_array_sql!("r"),
            ") > 0 THEN r.seq
                             ELSE (SELECT max(c.seq)
                                   FROM messages c, json_each(",
            tool_calls_array_sql!("c"),
            ") AS call
                                   WHERE c.session_id = r.session_id AND c.seq < r.seq
                                     AND json_type(call.value, '$.id') = 'text'
                                     AND json_extract(call.value, '$.id') = r.tool_call_id)
                        END AS call_seq
                 FROM rows r
             )
             SELECT b.session_id, 'summary seq ' || b.summary_seq || ', message seq ' || min(b.seq)
             FROM before b
             WHERE NOT b.pinned AND NOT EXISTS (
                 SELECT 1 FROM exchange e
                 JOIN exchange p ON p.session_id = e.session_id AND p.pinned
                                AND p.call_seq = e.call_seq
                 WHERE e.session_id = b.session_id AND e.seq = b.seq)
             GROUP BY b.session_id, b.summary_seq"
        ),
        Invariant::SeparatedToolResult => concat!(
            "SELECT t.session_id, 'tool_call_id ' || t.tool_call_id
             FROM messages t
             WHERE t.tool_call_id IS NOT NULL
               AND NOT EXISTS (",
            calls_of_sql!("messages", "c"),
            " AND c.seq < t.seq)
               AND EXISTS (",
            calls_of_sql!("archived_messages", "a"),
            ")"
        ),
        Invariant::UnpairedToolResult => concat!(
            "SELECT t.session_id, 'tool_call_id ' || t.tool_call_id
             FROM messages t
             WHERE t.tool_call_id IS NOT NULL
               AND NOT EXISTS (",
            calls_of_sql!("messages", "c"),
            " AND c.seq < t.seq)
               AND NOT EXISTS (",
            calls_of_sql!("archived_messages", "a"),
            ")"
        ),
        // The table's CHECK refuses these rows, so this finds none unless the check was
        // bypassed (`PRAGMA ignore_check_constraints`). Types are named as jsonb_typeof
        // names them.
        Invariant::ToolCallsNotAnArray => {
            "SELECT session_id, 'seq ' || seq || ': ' ||
                    CASE WHEN NOT json_valid(tool_calls) THEN 'not JSON'
                         ELSE 'a JSON ' || CASE json_type(tool_calls)
                             WHEN 'text' THEN 'string' WHEN 'integer' THEN 'number'
                             WHEN 'real' THEN 'number' WHEN 'true' THEN 'boolean'
                             WHEN 'false' THEN 'boolean' ELSE json_type(tool_calls) END
                    END
             FROM messages
             WHERE tool_calls IS NOT NULL
               AND CASE WHEN json_valid(tool_calls)
                        THEN json_type(tool_calls) NOT IN ('array', 'null') ELSE 1 END"
        }
        Invariant::CompactionWithoutUsageEvent => {
            "SELECT DISTINCT a.session_id, 'compaction ' || a.compaction_id
             FROM archived_messages a
             LEFT JOIN usage_events u ON u.id = a.compaction_id
                 AND json_type(u.metadata, '$.summarization') = 'true'
             WHERE u.id IS NULL"
        }
        Invariant::UsageEventMismatch => {
            "SELECT u.session_id, 'compaction ' || u.id || ': metadata says '
                    || json_extract(u.metadata, '$.messages_removed') || ' msgs/'
                    || json_extract(u.metadata, '$.chars_removed') || ' chars, '
                    || coalesce(json_extract(u.metadata, '$.tool_outputs_cleared'), 0)
                    || ' cleared, archive holds '
                    || count(a.seq) FILTER (WHERE NOT a.cleared) || '/'
                    || coalesce(sum(a.chars) FILTER (WHERE NOT a.cleared), 0) || ', '
                    || count(a.seq) FILTER (WHERE a.cleared) || ' cleared'
             FROM usage_events u
             LEFT JOIN archived_messages a ON a.compaction_id = u.id
             WHERE json_type(u.metadata, '$.summarization') = 'true'
               AND json_type(u.metadata, '$.restored_at') IS NULL
               AND json_type(u.metadata, '$.archive_pruned_at') IS NULL
             GROUP BY u.id
             HAVING count(a.seq) FILTER (WHERE NOT a.cleared)
                        <> CAST(json_extract(u.metadata, '$.messages_removed') AS INTEGER)
                 OR coalesce(sum(a.chars) FILTER (WHERE NOT a.cleared), 0)
                        <> CAST(json_extract(u.metadata, '$.chars_removed') AS INTEGER)
                 OR count(a.seq) FILTER (WHERE a.cleared)
                        <> coalesce(CAST(json_extract(u.metadata, '$.tool_outputs_cleared')
                                         AS INTEGER), 0)"
        }
        Invariant::ClearedWithoutOriginal => {
            "SELECT m.session_id, 'seq ' || m.seq || ', cleared by compaction ' || m.cleared_by
             FROM messages m
             WHERE m.cleared_by IS NOT NULL
               AND NOT EXISTS (
                   SELECT 1 FROM archived_messages a
                   WHERE a.compaction_id = m.cleared_by AND a.seq = m.seq AND a.cleared)
               AND NOT EXISTS (
                   SELECT 1 FROM usage_events u
                   WHERE u.id = m.cleared_by
                     AND json_type(u.metadata, '$.archive_pruned_at') IS NOT NULL)"
        }
        Invariant::SummaryWithoutCompaction => {
            "SELECT m.session_id, 'summary seq ' || m.seq FROM messages m
             WHERE m.is_summary AND NOT EXISTS (
                 SELECT 1 FROM usage_events u WHERE u.session_id = m.session_id
                     AND json_type(u.metadata, '$.summarization') = 'true'
                     AND json_type(u.metadata, '$.restored_at') IS NULL)"
        }
        Invariant::UnweighedBlocks => concat!(
            "SELECT session_id, 'seq ' || seq || ': blocks the rule weighs, the row says 0'
             FROM messages WHERE ",
            unweighed_sql!()
        ),
        Invariant::CountersDrift | Invariant::TextNotUtf8 => return None,
    })
}

/// The rows whose `block_chars` is 0 though they hold a block the weighing rule charges:
/// an image, a file, or thinking or reasoning with a payload (the rule is the
/// `messages_weigh_blocks` trigger's, schema migration 10).
macro_rules! unweighed_sql {
    () => {
        "extra IS NOT NULL AND coalesce(block_chars, 0) = 0 AND (
             EXISTS (
                 SELECT 1 FROM json_each(CASE WHEN json_type(extra, '$.data.content') = 'array'
                                              THEN json_extract(extra, '$.data.content')
                                              ELSE '[]' END) AS b
                 WHERE b.type = 'object'
                   AND json_extract(b.value, '$.type') NOT LIKE '%text'
                   AND json_extract(b.value, '$.type') NOT IN ('tool_use', 'tool_call',
                       'tool_call_chunk', 'function_call', 'server_tool_use',
                       'server_tool_call', 'invalid_tool_call')
                   AND (json_extract(b.value, '$.type') NOT IN ('thinking', 'redacted_thinking',
                                                                'reasoning', 'compaction')
                        OR length(coalesce(json_extract(b.value, '$.thinking'),
                                           json_extract(b.value, '$.data'),
                                           json_extract(b.value, '$.encrypted_content'),
                                           json_extract(b.value, '$.reasoning'),
                                           json_extract(b.value, '$.text'), '')) > 0))
             OR length(coalesce(json_extract(extra, '$.data.additional_kwargs.reasoning.encrypted_content'),
                                json_extract(extra, '$.data.additional_kwargs.reasoning.text'),
                                '')) > 0)"
    };
}
use unweighed_sql;

/// The text columns of `messages`, in the order [`TEXT_NOT_UTF8_SQL`] reads them.
const TEXT_COLUMNS: [&str; 6] = [
    "content",
    "tool_calls",
    "tool_call_id",
    "external_id",
    "extra",
    "session_id",
];

/// Every row holding a byte outside ASCII (the others are valid UTF-8), its seq and the
/// bytes of [`TEXT_COLUMNS`].
const TEXT_NOT_UTF8_SQL: &str = "SELECT seq, CAST(content AS BLOB), CAST(tool_calls AS BLOB),
        CAST(tool_call_id AS BLOB), CAST(external_id AS BLOB), CAST(extra AS BLOB),
        CAST(session_id AS BLOB)
    FROM messages
    WHERE (coalesce(content, '') || char(10) || coalesce(tool_calls, '') || char(10)
           || coalesce(tool_call_id, '') || char(10) || coalesce(external_id, '')
           || char(10) || coalesce(extra, '') || char(10) || session_id)
          GLOB '*[^' || char(1) || '-' || char(127) || ']*'
    ORDER BY seq";

/// The rows of `messages` whose text is not valid UTF-8, as Rust's decoder (the one the
/// worker reads rows with) judges it. The write refuses such text
/// (`migrations/sqlite/20261203000002_utf8_text.sql`); this finds rows written before.
async fn text_not_utf8(pool: &sqlx::SqlitePool) -> Result<Vec<Finding>, sqlx::Error> {
    let rows = sqlx::query(TEXT_NOT_UTF8_SQL).fetch_all(pool).await?;
    let mut found = Vec::new();
    for row in &rows {
        let seq: i64 = row.try_get(0)?;
        let mut bad = Vec::new();
        for (i, column) in TEXT_COLUMNS.iter().enumerate() {
            let bytes: Option<Vec<u8>> = row.try_get(i + 1)?;
            if bytes.is_some_and(|b| std::str::from_utf8(&b).is_err()) {
                bad.push(*column);
            }
        }
        if !bad.is_empty() {
            let session: Option<Vec<u8>> = row.try_get(TEXT_COLUMNS.len())?;
            found.push(Finding {
                session_id: String::from_utf8_lossy(&session.unwrap_or_default()).into_owned(),
                detail: format!("seq {seq}: {}", bad.join(", ")),
            });
        }
    }
    Ok(found)
}

/// Every session whose stored counters differ from its messages, and every session with
/// messages but no row, in the columns [`DriftRow`] reads (stored counters NULL without
/// a row). (FULL JOIN: SQLite 3.39.)
macro_rules! counter_drift_sql {
    () => {
        "SELECT coalesce(s.session_id, m.session_id) AS session_id,
                s.total_chars AS stored_chars, s.message_count AS stored_count,
                s.human_turns AS stored_turns,
                coalesce(m.chars, 0) AS chars, coalesce(m.n, 0) AS count,
                coalesce(m.turns, 0) AS turns
         FROM sessions s
         FULL JOIN (
             SELECT session_id, sum(chars) AS chars, count(*) AS n,
                    count(*) FILTER (WHERE role = 'user' AND NOT is_summary) AS turns
             FROM messages GROUP BY session_id
         ) AS m ON m.session_id = s.session_id
         WHERE s.session_id IS NULL
            OR s.total_chars <> coalesce(m.chars, 0)
            OR s.message_count <> coalesce(m.n, 0)
            OR s.human_turns <> coalesce(m.turns, 0)
         ORDER BY 1"
    };
}

#[async_trait]
impl Invariants for SqliteStore {
    /// How many sessions, messages, archived messages and compactions there are.
    ///
    /// # Errors
    /// When the file cannot be read.
    async fn check_totals(&self) -> Result<Totals, StoreError> {
        let totals = sqlx::query_as(check_totals_sql!(
            "SELECT count(*) FROM usage_events WHERE json_type(metadata, '$.summarization') = 'true'"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(totals)
    }

    /// Every breach of `invariant`; empty when it holds. The same invariants and details
    /// as on Postgres; `tool_calls_not_an_array` can only find rows written with the
    /// table's CHECK bypassed.
    ///
    /// # Errors
    /// When the file cannot be read or the query fails.
    async fn breaches(&self, invariant: Invariant) -> Result<Vec<Finding>, StoreError> {
        if invariant == Invariant::TextNotUtf8 {
            return Ok(text_not_utf8(&self.pool).await?);
        }
        let Some(sql) = breaches_sql(invariant) else {
            let drift = self.counter_drift().await?;
            return Ok(drift.iter().map(drift_finding).collect());
        };
        Ok(sqlx::query_as(sql).fetch_all(&self.pool).await?)
    }

    /// Sessions whose counters differ from their messages, by session id. Writes
    /// nothing.
    ///
    /// # Errors
    /// When the file cannot be read.
    async fn counter_drift(&self) -> Result<Vec<CounterDrift>, StoreError> {
        let rows: Vec<DriftRow> = sqlx::query_as(counter_drift_sql!())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Recomputes drifted counters from the messages and writes them (creating missing
    /// rows), returning what it changed, stored (before) and actual (after). One
    /// transaction holding the file's write lock from the drift's read to the write, so
    /// no append falls between them (Postgres locks the drifted rows instead).
    ///
    /// # Errors
    /// When the file cannot be written; nothing is written then.
    async fn repair_counters(&self) -> Result<Vec<CounterDrift>, StoreError> {
        let mut tx = self.begin_write().await?;
        let rows: Vec<DriftRow> = sqlx::query_as(counter_drift_sql!())
            .fetch_all(&mut *tx)
            .await?;
        let repaired: Vec<CounterDrift> = rows.into_iter().map(Into::into).collect();
        if !repaired.is_empty() {
            sqlx::query(concat!(
                "INSERT INTO sessions (session_id, total_chars, message_count, human_turns)
                 SELECT session_id, chars, count, turns FROM (",
                counter_drift_sql!(),
                ")
                 WHERE true -- the upsert's ON CONFLICT, not a join's
                 ON CONFLICT (session_id) DO UPDATE SET
                     total_chars = excluded.total_chars,
                     message_count = excluded.message_count,
                     human_turns = excluded.human_turns,
                     skip_reason = NULL"
            ))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(repaired)
    }

    /// Sets the unweighed rows' `block_chars` to NULL: the weighing trigger weighs them
    /// by the rule, and the counters' trigger counts the new weight.
    ///
    /// # Errors
    /// When the file cannot be written; nothing is written then.
    async fn reweigh_blocks(&self) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(concat!(
            "UPDATE messages SET block_chars = NULL WHERE ",
            unweighed_sql!()
        ))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }
}

//! The queries behind `summarizer check` and `summarizer repair`: each invariant is one
//! query listing the sessions that break it, and a session's counters are recomputed
//! from its messages. They return plain data; `crate::audit` decides what a breach means
//! and writes the report.

use super::PgStore;
use crate::store::Invariants;
use crate::store::invariants::{DriftRow, drift_finding};
use crate::store::{CounterDrift, Finding, Invariant, StoreError, Totals};
use async_trait::async_trait;

/// `(session_id, detail)` for each breach of `invariant`. `None` for
/// [`Invariant::CountersDrift`], which is read through [`PgStore::counter_drift`].
fn breaches_sql(invariant: Invariant) -> Option<&'static str> {
    use Invariant as I;
    Some(match invariant {
            I::DuplicatedMessage => {
                "SELECT session_id, 'seq ' || seq FROM (
                     SELECT session_id, seq FROM messages WHERE NOT is_summary
                     UNION ALL
                     SELECT session_id, seq FROM archived_messages
                     WHERE NOT is_summary AND NOT cleared
                 ) AS everything
                 GROUP BY session_id, seq HAVING count(*) > 1"
            }
            I::SeveralSummaries => {
                "SELECT session_id, count(*) || ' summaries' FROM messages WHERE is_summary
                 GROUP BY session_id HAVING count(*) > 1"
            }
            // A pinned message stays where it is, and so do its tool-call partners: the
            // rows of its exchange (a call's row, and the results that answer it, each the
            // nearest earlier call of its id). Exchanges are worked out only for the rows
            // before a summary and the pinned rows of their sessions: few, in a healthy
            // store, whatever the sessions' lengths.
            I::MisplacedSummary => {
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
                            CASE WHEN jsonb_array_length(tool_calls_array(r.tool_calls)) > 0
                                 THEN r.seq
                                 ELSE (SELECT max(c.seq)
                                       FROM messages c,
                                            jsonb_array_elements(tool_calls_array(c.tool_calls)) AS call
                                       WHERE c.session_id = r.session_id AND c.seq < r.seq
                                         AND call ->> 'id' = r.tool_call_id)
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
            }
            // The tool-call queries pair calls and results as the planner does: a result
            // answers the nearest earlier call of its id, and `tool_calls_array` reads the
            // calls of a stored value as `Message::calls` does (a double-encoded array
            // included).
            I::SeparatedToolResult => {
                "SELECT t.session_id, 'tool_call_id ' || t.tool_call_id
                 FROM messages t
                 WHERE t.tool_call_id IS NOT NULL
                   AND NOT EXISTS (
                       SELECT 1 FROM messages c, jsonb_array_elements(tool_calls_array(c.tool_calls)) AS call
                       WHERE c.session_id = t.session_id AND c.seq < t.seq
                         AND c.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)
                   AND EXISTS (
                       SELECT 1 FROM archived_messages a, jsonb_array_elements(tool_calls_array(a.tool_calls)) AS call
                       WHERE a.session_id = t.session_id
                         AND a.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)"
            }
            I::UnpairedToolResult => {
                "SELECT t.session_id, 'tool_call_id ' || t.tool_call_id
                 FROM messages t
                 WHERE t.tool_call_id IS NOT NULL
                   AND NOT EXISTS (
                       SELECT 1 FROM messages c, jsonb_array_elements(tool_calls_array(c.tool_calls)) AS call
                       WHERE c.session_id = t.session_id AND c.seq < t.seq
                         AND c.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)
                   AND NOT EXISTS (
                       SELECT 1 FROM archived_messages a, jsonb_array_elements(tool_calls_array(a.tool_calls)) AS call
                       WHERE a.session_id = t.session_id
                         AND a.tool_calls IS NOT NULL AND call ->> 'id' = t.tool_call_id)"
            }
            I::ToolCallsNotAnArray => {
                "SELECT session_id, 'seq ' || seq || ': a JSON ' || jsonb_typeof(tool_calls)
                 FROM messages
                 WHERE jsonb_typeof(tool_calls) NOT IN ('array', 'null')"
            }
            I::CompactionWithoutUsageEvent => {
                "SELECT DISTINCT a.session_id, 'compaction ' || a.compaction_id
                 FROM archived_messages a
                 LEFT JOIN usage_events u ON u.id = a.compaction_id
                     AND u.metadata @> '{\"summarization\": true}'
                 WHERE u.id IS NULL"
            }
            // The archive holds what the compaction removed, and the originals of what it
            // cleared (`cleared`), each counted against its figures.
            I::UsageEventMismatch => {
                "SELECT u.session_id, 'compaction ' || u.id || ': metadata says '
                        || (u.metadata ->> 'messages_removed') || ' msgs/'
                        || (u.metadata ->> 'chars_removed') || ' chars, '
                        || coalesce(u.metadata ->> 'tool_outputs_cleared', '0')
                        || ' cleared, archive holds '
                        || count(a.seq) FILTER (WHERE NOT a.cleared) || '/'
                        || coalesce(sum(a.chars) FILTER (WHERE NOT a.cleared), 0) || ', '
                        || count(a.seq) FILTER (WHERE a.cleared) || ' cleared'
                 FROM usage_events u
                 LEFT JOIN archived_messages a ON a.compaction_id = u.id
                 WHERE u.metadata @> '{\"summarization\": true}'
                   AND NOT u.metadata ? 'restored_at'
                   AND NOT u.metadata ? 'archive_pruned_at'
                 GROUP BY u.id
                 HAVING count(a.seq) FILTER (WHERE NOT a.cleared)
                            <> (u.metadata ->> 'messages_removed')::bigint
                     OR coalesce(sum(a.chars) FILTER (WHERE NOT a.cleared), 0)
                            <> (u.metadata ->> 'chars_removed')::bigint
                     OR count(a.seq) FILTER (WHERE a.cleared)
                            <> coalesce((u.metadata ->> 'tool_outputs_cleared')::bigint, 0)"
            }
            I::ClearedWithoutOriginal => {
                "SELECT m.session_id, 'seq ' || m.seq || ', cleared by compaction ' || m.cleared_by
                 FROM messages m
                 WHERE m.cleared_by IS NOT NULL
                   AND NOT EXISTS (
                       SELECT 1 FROM archived_messages a
                       WHERE a.compaction_id = m.cleared_by AND a.seq = m.seq AND a.cleared)
                   AND NOT EXISTS (
                       SELECT 1 FROM usage_events u
                       WHERE u.id = m.cleared_by AND u.metadata ? 'archive_pruned_at')"
            }
            I::SummaryWithoutCompaction => {
                "SELECT m.session_id, 'summary seq ' || m.seq FROM messages m
                 WHERE m.is_summary AND NOT EXISTS (
                     SELECT 1 FROM usage_events u WHERE u.session_id = m.session_id
                         AND u.metadata @> '{\"summarization\": true}'
                         AND NOT u.metadata ? 'restored_at')"
            }
            I::CountersDrift => return None,
            // A UTF8 database refuses invalid text at the write: nothing to find.
            I::TextNotUtf8 => "SELECT NULL::text, NULL::text WHERE false",
            I::UnweighedBlocks => {
                "SELECT session_id, 'seq ' || seq || ': its blocks weigh '
                        || block_chars_of(extra) || ' chars by the rule, the row says 0'
                 FROM messages
                 WHERE extra IS NOT NULL AND coalesce(block_chars, 0) = 0
                   AND block_chars_of(extra) > 0"
            }
        })
}

/// Every session whose stored counters differ from its messages, and every session with
/// messages but no row: `session_id`, the stored counters (NULL without a row), the
/// counters its messages give.
const COUNTER_DRIFT: &str = "
    SELECT coalesce(s.session_id, m.session_id) AS session_id,
           s.total_chars AS stored_chars, s.message_count::bigint AS stored_count,
           s.human_turns::bigint AS stored_turns,
           coalesce(m.chars, 0) AS chars, coalesce(m.n, 0) AS count,
           coalesce(m.turns, 0) AS turns
    FROM sessions s
    FULL JOIN (
        SELECT session_id, sum(chars)::bigint AS chars, count(*) AS n,
               count(*) FILTER (WHERE role = 'user' AND NOT is_summary) AS turns
        FROM messages GROUP BY session_id
    ) AS m ON m.session_id = s.session_id
    WHERE s.session_id IS NULL
       OR s.total_chars <> coalesce(m.chars, 0)
       OR s.message_count <> coalesce(m.n, 0)
       OR s.human_turns <> coalesce(m.turns, 0)
    ORDER BY 1";

/// Recomputes the counters of the sessions in `$1` from their messages and writes those
/// that differ (creating missing rows), returning the same columns as [`COUNTER_DRIFT`]
/// with the counters as they were before. The snapshot is taken after the caller locked
/// the rows, so an append either is counted here or adds itself after, never both.
const REPAIR_COUNTERS: &str = "
    WITH actual AS (
        SELECT wanted.session_id, coalesce(sum(m.chars), 0)::bigint AS chars,
               count(m.seq) AS n,
               count(*) FILTER (WHERE m.role = 'user' AND NOT m.is_summary) AS turns
        FROM unnest($1::text[]) AS wanted (session_id)
        LEFT JOIN messages m ON m.session_id = wanted.session_id
        GROUP BY wanted.session_id
    ), written AS (
        INSERT INTO sessions AS s (session_id, total_chars, message_count, human_turns)
        SELECT session_id, chars, n, turns FROM actual
        ORDER BY session_id
        ON CONFLICT (session_id) DO UPDATE SET
            total_chars = excluded.total_chars,
            message_count = excluded.message_count,
            human_turns = excluded.human_turns,
            skip_reason = NULL
        WHERE (s.total_chars, s.message_count, s.human_turns)
              IS DISTINCT FROM (excluded.total_chars, excluded.message_count, excluded.human_turns)
        RETURNING s.session_id
    )
    SELECT a.session_id, s.total_chars AS stored_chars, s.message_count::bigint AS stored_count,
           s.human_turns::bigint AS stored_turns, a.chars, a.n AS count, a.turns
    FROM written w
    JOIN actual a ON a.session_id = w.session_id
    LEFT JOIN sessions s ON s.session_id = w.session_id
    ORDER BY 1";

#[async_trait]
impl Invariants for PgStore {
    /// How many sessions, messages, archived messages and compactions there are.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn check_totals(&self) -> Result<Totals, StoreError> {
        let totals = sqlx::query_as(check_totals_sql!(
            "SELECT count(*) FROM usage_events WHERE metadata @> '{\"summarization\": true}'"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(totals)
    }

    /// Every breach of `invariant`; empty when it holds.
    ///
    /// # Errors
    /// When the database is unreachable or the query fails.
    async fn breaches(&self, invariant: Invariant) -> Result<Vec<Finding>, StoreError> {
        let Some(sql) = breaches_sql(invariant) else {
            let drift = self.counter_drift().await?;
            return Ok(drift.iter().map(drift_finding).collect());
        };
        Ok(sqlx::query_as(sql).fetch_all(&self.pool).await?)
    }

    /// Sessions whose counters differ from their messages (a bypassed or disabled
    /// trigger, a restore from an old dump), by session id. Writes nothing.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn counter_drift(&self) -> Result<Vec<CounterDrift>, StoreError> {
        let rows: Vec<DriftRow> = sqlx::query_as(COUNTER_DRIFT).fetch_all(&self.pool).await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Recomputes drifted counters from the messages and writes them, in one transaction
    /// that locks the drifted rows first: appends meanwhile wait for it and then count
    /// themselves on top. Returns what it changed, stored (before) and actual (after).
    /// A session that drifted back into line meanwhile is left alone and not returned.
    ///
    /// # Errors
    /// When the database is unreachable; nothing is written then.
    async fn repair_counters(&self) -> Result<Vec<CounterDrift>, StoreError> {
        let drifted: Vec<String> = self
            .counter_drift()
            .await?
            .into_iter()
            .map(|d| d.session_id)
            .collect();
        if drifted.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        // In session order, as the counting trigger updates them: no deadlock with a
        // multi-session append.
        sqlx::query(
            "SELECT session_id FROM sessions WHERE session_id = ANY($1)
             ORDER BY session_id FOR UPDATE",
        )
        .bind(&drifted)
        .execute(&mut *tx)
        .await?;
        let rows: Vec<DriftRow> = sqlx::query_as(REPAIR_COUNTERS)
            .bind(&drifted)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Sets the unweighed rows' `block_chars` to NULL: the weighing trigger weighs them
    /// by the rule, and the counters' trigger counts the new weight.
    ///
    /// # Errors
    /// When the database is unreachable; nothing is written then.
    async fn reweigh_blocks(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE messages SET block_chars = NULL
             WHERE extra IS NOT NULL AND coalesce(block_chars, 0) = 0
               AND block_chars_of(extra) > 0",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

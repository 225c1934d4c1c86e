//! The aggregates behind `GET /stats` and `summarizer stats`: totals, a per-day series,
//! failures by reason and duration percentiles, all read from the daily rollups that the
//! usage-event triggers keep (migration 5), so they cost a row per day, not per event.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::PgStore;
use crate::outcome::Reason;
use crate::store::Aggregates;
use crate::store::sql::{DURATION_BUCKETS, FAILURES_BY_REASON};
use crate::store::stats::{StatsRow, report};
use crate::store::{StatsReport, StoreError};

#[async_trait]
impl Aggregates for PgStore {
    /// Counts a failure of `reason` for today in the rollup.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn count_failure(&self, reason: Reason) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO failure_daily AS f (day, reason, failures)
             VALUES ((now() AT TIME ZONE 'UTC')::date, $1, 1)
             ON CONFLICT (day, reason) DO UPDATE SET failures = f.failures + 1",
        )
        .bind(reason.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The aggregates, with a per-day series over the last `days` days.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn stats(&self, days: i32) -> Result<StatsReport, StoreError> {
        let totals: StatsRow = sqlx::query_as(
            "SELECT total_summarizations, total_chars_compacted, total_messages_compacted,
                    total_tokens_compacted, prompt_tokens, completion_tokens, mean_fact_recall,
                    mean_statement_recall,
                    total_precomputed, total_tool_outputs_cleared, total_chars_cleared,
                    cached_prompt_tokens, llm_requests,
                    to_char(last_summarization_at AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS last_summarization_at
             FROM summarization_stats",
        )
        .fetch_one(&self.pool)
        .await?;
        // One pass over the sessions (docs/benchmarks.md: what it costs at a million).
        let tokens_saved: i64 = sqlx::query_scalar(
            "SELECT least(greatest(coalesce(sum(model_turns::numeric * tokens_saved_per_turn
                                                - tokens_saved_offset + tokens_saved_banked), 0),
                                   -9e18), 9e18)::bigint
             FROM sessions
             WHERE tokens_saved_per_turn <> 0 OR tokens_saved_offset <> 0
                OR tokens_saved_banked <> 0",
        )
        .fetch_one(&self.pool)
        .await?;
        let failures: BTreeMap<String, i64> =
            sqlx::query_as::<_, (String, i64)>(FAILURES_BY_REASON)
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .collect();
        let buckets: Vec<(i16, i64)> = sqlx::query_as(DURATION_BUCKETS)
            .fetch_all(&self.pool)
            .await?;
        let daily = sqlx::query_as(
            "SELECT to_char(d.day, 'YYYY-MM-DD') AS day,
                    coalesce(c.compactions, 0) AS compactions,
                    coalesce(c.chars_removed, 0) AS chars_removed,
                    coalesce(c.messages_removed, 0) AS messages_removed,
                    coalesce(c.prompt_tokens, 0) AS prompt_tokens,
                    coalesce(c.completion_tokens, 0) AS completion_tokens,
                    coalesce(c.cached_prompt_tokens, 0) AS cached_prompt_tokens,
                    coalesce(c.llm_requests, 0) AS llm_requests,
                    coalesce(f.failures, 0)::bigint AS failures
             FROM (SELECT day FROM compaction_daily UNION SELECT day FROM failure_daily) AS d
             LEFT JOIN compaction_daily AS c ON c.day = d.day
             LEFT JOIN (SELECT day, sum(failures) AS failures FROM failure_daily GROUP BY day)
                 AS f ON f.day = d.day
             WHERE d.day > (now() AT TIME ZONE 'UTC')::date - $1
             ORDER BY d.day",
        )
        .bind(days)
        .fetch_all(&self.pool)
        .await?;
        Ok(report(totals, tokens_saved, failures, &buckets, daily))
    }
}

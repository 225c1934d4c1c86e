//! The aggregates behind `GET /stats` and `summarizer stats`, read from the daily rollups
//! that the usage-event triggers keep, as on Postgres.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::{RFC3339, SqliteStore};
use crate::outcome::Reason;
use crate::store::Aggregates;
use crate::store::sql::{DURATION_BUCKETS, FAILURES_BY_REASON};
use crate::store::stats::{StatsRow, report};
use crate::store::{StatsReport, StoreError};

#[async_trait]
impl Aggregates for SqliteStore {
    /// Counts a failure of `reason` for today (UTC) in the rollup.
    ///
    /// # Errors
    /// When the file cannot be written.
    async fn count_failure(&self, reason: Reason) -> Result<(), StoreError> {
        let _turn = self.write_turn().await?;
        sqlx::query(count_failure_sql!())
            .bind(reason.as_str())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The aggregates, with a per-day series over the last `days` days: the same report
    /// as Postgres's. `last_summarization_at` is the stored text put in the one RFC 3339
    /// form (milliseconds, `Z`).
    ///
    /// # Errors
    /// When the file cannot be read.
    async fn stats(&self, days: i32) -> Result<StatsReport, StoreError> {
        let totals: StatsRow = sqlx::query_as(
            "SELECT total_summarizations, total_chars_compacted, total_messages_compacted,
                    total_tokens_compacted, prompt_tokens, completion_tokens, mean_fact_recall,
                    mean_statement_recall,
                    total_precomputed, total_tool_outputs_cleared, total_chars_cleared,
                    cached_prompt_tokens, llm_requests,
                    coalesce(strftime($1, last_summarization_at), last_summarization_at)
                        AS last_summarization_at
             FROM summarization_stats",
        )
        .bind(RFC3339)
        .fetch_one(&self.pool)
        .await?;
        // One pass over the sessions; `total` is a float, where an integer sum could
        // overflow.
        let tokens_saved: f64 = sqlx::query_scalar(
            "SELECT total(model_turns * tokens_saved_per_turn - tokens_saved_offset
                          + tokens_saved_banked)
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
        // Days are 'YYYY-MM-DD' text, which compares as the dates do.
        let daily = sqlx::query_as(
            "SELECT d.day,
                    coalesce(c.compactions, 0) AS compactions,
                    coalesce(c.chars_removed, 0) AS chars_removed,
                    coalesce(c.messages_removed, 0) AS messages_removed,
                    coalesce(c.prompt_tokens, 0) AS prompt_tokens,
                    coalesce(c.completion_tokens, 0) AS completion_tokens,
                    coalesce(c.cached_prompt_tokens, 0) AS cached_prompt_tokens,
                    coalesce(c.llm_requests, 0) AS llm_requests,
                    coalesce(f.failures, 0) AS failures
             FROM (SELECT day FROM compaction_daily UNION SELECT day FROM failure_daily) AS d
             LEFT JOIN compaction_daily AS c ON c.day = d.day
             LEFT JOIN (SELECT day, sum(failures) AS failures FROM failure_daily GROUP BY day)
                 AS f ON f.day = d.day
             WHERE d.day > date('now', printf('%d days', -$1))
             ORDER BY d.day",
        )
        .bind(days)
        .fetch_all(&self.pool)
        .await?;
        Ok(report(
            totals,
            tokens_saved as i64,
            failures,
            &buckets,
            daily,
        ))
    }
}

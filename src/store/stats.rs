//! The aggregates behind `/stats` and `summarizer stats` ([`Aggregates`]), read from the
//! daily rollups, and the failures counted into them.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::outcome::Reason;

#[async_trait]
pub trait Aggregates: Send + Sync {
    /// Counts a failure of `reason` for today in the rollup.
    async fn count_failure(&self, reason: Reason) -> Result<(), StoreError>;

    /// The aggregates behind `/stats`, with the last `days` days of series.
    async fn stats(&self, days: i32) -> Result<StatsReport, StoreError>;
}

/// `{"summary": {...}, "daily": [...]}`: the body of `GET /stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub summary: Stats,
    /// The last `days` days that saw a compaction or a failure, oldest first.
    pub daily: Vec<Day>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Compactions in force (restored ones no longer count).
    pub total_summarizations: i64,
    pub total_chars_compacted: i64,
    pub total_messages_compacted: i64,
    /// The tokenizer's count (`o200k_base`) of what the compactions in force removed;
    /// compactions written before token figures existed count as zero.
    pub total_tokens_compacted: i64,
    /// Tokens of every summarization request (chunks, second asks, retries after a
    /// cut-off answer and the LLM's part of a fallback), as the provider reported them,
    /// restored compactions included: docs/protocol.md, "What compaction costs".
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// Of `prompt_tokens`, the part the provider read from its prompt cache (0 where it
    /// reported none).
    pub cached_prompt_tokens: i64,
    /// Requests sent to the provider, retried ones included.
    pub llm_requests: i64,
    /// For each compaction, the tokens it took out of the context (removed and cleared
    /// in place, less its summary) times the model turns its session made after it
    /// (until it was restored), summed, less what every summarization cost
    /// (`prompt_tokens` + `completion_tokens`): docs/protocol.md, "What compaction
    /// saves". Negative while the compactions have not yet paid for themselves.
    pub tokens_saved_net: i64,
    pub average_chars_removed: Option<f64>,
    /// Upper bounds of the histogram buckets (a factor of sqrt 2 wide) holding the
    /// median and the 95th percentile of compaction durations.
    pub p50_duration_ms: Option<f64>,
    pub p95_duration_ms: Option<f64>,
    /// `llm_error` and `conflict`, as the database saw them.
    pub failures_by_reason: BTreeMap<String, i64>,
    /// RFC 3339, UTC; `None` before the first summarization.
    pub last_summarization_at: Option<String>,
    /// The mean, over summarizations whose removed part had identifiers, of the share of
    /// them the summary kept (`facts_kept / facts_total`); restored ones included, as for
    /// tokens. `None` before the first such summarization (and with
    /// `SUMMARY_FACT_CHECK=off`, which records no figures).
    pub mean_fact_recall: Option<f64>,
    /// The same of the identifiers the summary states (`facts_stated / facts_total`: in
    /// a sentence or bullet, not a list of identifiers). `None` before the first
    /// summarization that recorded it.
    pub mean_statement_recall: Option<f64>,
    /// Compactions in force that were written from a pending summary
    /// (`SUMMARIZATION_PRECOMPUTE_AT`) ...
    pub total_precomputed: i64,
    /// ... and their share of all compactions in force; `None` before the first.
    pub precomputed_share: Option<f64>,
    /// Tool results cleared in place by the compactions in force
    /// (`TOOL_OUTPUT_CLEARING`) ...
    pub total_tool_outputs_cleared: i64,
    /// ... and the chars that saved.
    pub total_chars_cleared: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Day {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub compactions: i64,
    pub chars_removed: i64,
    pub messages_removed: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_prompt_tokens: i64,
    pub llm_requests: i64,
    pub failures: i64,
}

/// The columns of `summarization_stats` a report is made of, as both stores read them.
#[derive(sqlx::FromRow)]
pub(super) struct StatsRow {
    total_summarizations: i64,
    total_chars_compacted: i64,
    total_messages_compacted: i64,
    total_tokens_compacted: i64,
    prompt_tokens: i64,
    completion_tokens: i64,
    mean_fact_recall: Option<f64>,
    mean_statement_recall: Option<f64>,
    total_precomputed: i64,
    total_tool_outputs_cleared: i64,
    total_chars_cleared: i64,
    cached_prompt_tokens: i64,
    llm_requests: i64,
    last_summarization_at: Option<String>,
}

/// The report from what the rollups hold: totals, failures by reason, the duration
/// histogram's buckets and the per-day series; and the tokens the compactions saved
/// before their cost (the sessions' `tokens_saved_*`, summed).
pub(super) fn report(
    totals: StatsRow,
    tokens_saved: i64,
    failures_by_reason: BTreeMap<String, i64>,
    buckets: &[(i16, i64)],
    daily: Vec<Day>,
) -> StatsReport {
    let total = totals.total_summarizations;
    let share = |n: i64| (total > 0).then(|| n as f64 / total as f64);
    StatsReport {
        summary: Stats {
            total_summarizations: total,
            total_chars_compacted: totals.total_chars_compacted,
            total_messages_compacted: totals.total_messages_compacted,
            total_tokens_compacted: totals.total_tokens_compacted,
            prompt_tokens: totals.prompt_tokens,
            completion_tokens: totals.completion_tokens,
            cached_prompt_tokens: totals.cached_prompt_tokens,
            llm_requests: totals.llm_requests,
            tokens_saved_net: tokens_saved
                .saturating_sub(totals.prompt_tokens)
                .saturating_sub(totals.completion_tokens),
            average_chars_removed: share(totals.total_chars_compacted),
            p50_duration_ms: percentile(buckets, 0.50),
            p95_duration_ms: percentile(buckets, 0.95),
            failures_by_reason,
            last_summarization_at: totals.last_summarization_at,
            mean_fact_recall: totals.mean_fact_recall,
            mean_statement_recall: totals.mean_statement_recall,
            total_precomputed: totals.total_precomputed,
            precomputed_share: share(totals.total_precomputed),
            total_tool_outputs_cleared: totals.total_tool_outputs_cleared,
            total_chars_cleared: totals.total_chars_cleared,
        },
        daily,
    }
}

/// The upper bound, in ms, of the bucket holding the `q` quantile: bucket `b` counts
/// durations under 2^(b/2) ms (see `duration_bucket` in migration 5).
pub(super) fn percentile(buckets: &[(i16, i64)], q: f64) -> Option<f64> {
    let total: i64 = buckets.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = (total as f64 * q).ceil().max(1.0);
    let mut seen = 0;
    buckets.iter().find_map(|&(bucket, n)| {
        seen += n;
        (seen as f64 >= rank).then(|| (2f64.powf(f64::from(bucket) / 2.0) * 10.0).round() / 10.0)
    })
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_bucket_upper_bounds() {
        assert_eq!(percentile(&[], 0.5), None);
        // 40 ms falls in bucket 11 (< 45.3 ms), 1000 ms in bucket 20 (< 1024 ms).
        let buckets = [(11, 19), (20, 1)];
        assert_eq!(percentile(&buckets, 0.5), Some(45.3));
        assert_eq!(percentile(&buckets, 0.95), Some(45.3));
        assert_eq!(percentile(&buckets, 0.99), Some(1024.0));
    }
}

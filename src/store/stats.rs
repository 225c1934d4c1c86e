//! The aggregates behind `GET /stats` and `summarizer stats`: totals, a per-day series,
//! failures by reason and duration percentiles, all read from the daily rollups that the
//! usage-event triggers keep (migration 5), so they cost a row per day, not per event.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{PgStore, StoreError};

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
    /// Tokens of every summarization call, restored ones included.
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
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
    /// Compactions in force that were written from a pending summary
    /// (`SUMMARIZATION_PRECOMPUTE_AT`) ...
    pub total_precomputed: i64,
    /// ... and their share of all compactions in force; `None` before the first.
    pub precomputed_share: Option<f64>,
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
    pub failures: i64,
}

impl PgStore {
    /// Counts a failure of `reason` for today in the rollup.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn count_failure(&self, reason: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO failure_daily AS f (day, reason, failures)
             VALUES ((now() AT TIME ZONE 'UTC')::date, $1, 1)
             ON CONFLICT (day, reason) DO UPDATE SET failures = f.failures + 1",
        )
        .bind(reason)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The aggregates, with a per-day series over the last `days` days.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn stats(&self, days: i32) -> Result<StatsReport, StoreError> {
        let totals: Totals = sqlx::query_as(
            "SELECT total_summarizations, total_chars_compacted, total_messages_compacted,
                    total_tokens_compacted, prompt_tokens, completion_tokens, mean_fact_recall,
                    total_precomputed,
                    to_char(last_summarization_at AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS last_summarization_at
             FROM summarization_stats",
        )
        .fetch_one(self.pool())
        .await?;
        let failures: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
            "SELECT reason, sum(failures)::bigint FROM failure_daily GROUP BY reason",
        )
        .fetch_all(self.pool())
        .await?
        .into_iter()
        .collect();
        let buckets: Vec<(i16, i64)> = sqlx::query_as(
            "SELECT bucket, sum(compactions)::bigint FROM compaction_duration_daily
             GROUP BY bucket HAVING sum(compactions) > 0 ORDER BY bucket",
        )
        .fetch_all(self.pool())
        .await?;
        let daily = sqlx::query_as(
            "SELECT to_char(d.day, 'YYYY-MM-DD') AS day,
                    coalesce(c.compactions, 0) AS compactions,
                    coalesce(c.chars_removed, 0) AS chars_removed,
                    coalesce(c.messages_removed, 0) AS messages_removed,
                    coalesce(c.prompt_tokens, 0) AS prompt_tokens,
                    coalesce(c.completion_tokens, 0) AS completion_tokens,
                    coalesce(f.failures, 0)::bigint AS failures
             FROM (SELECT day FROM compaction_daily UNION SELECT day FROM failure_daily) AS d
             LEFT JOIN compaction_daily AS c ON c.day = d.day
             LEFT JOIN (SELECT day, sum(failures) AS failures FROM failure_daily GROUP BY day)
                 AS f ON f.day = d.day
             WHERE d.day > (now() AT TIME ZONE 'UTC')::date - $1
             ORDER BY d.day",
        )
        .bind(days)
        .fetch_all(self.pool())
        .await?;
        Ok(report(totals, failures, &buckets, daily))
    }
}

/// The columns of `summarization_stats` a report is made of, as both stores read them.
#[derive(sqlx::FromRow)]
pub(super) struct Totals {
    total_summarizations: i64,
    total_chars_compacted: i64,
    total_messages_compacted: i64,
    total_tokens_compacted: i64,
    prompt_tokens: i64,
    completion_tokens: i64,
    mean_fact_recall: Option<f64>,
    total_precomputed: i64,
    last_summarization_at: Option<String>,
}

/// The report from what the rollups hold: totals, failures by reason, the duration
/// histogram's buckets and the per-day series.
pub(super) fn report(
    totals: Totals,
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
            average_chars_removed: share(totals.total_chars_compacted),
            p50_duration_ms: percentile(buckets, 0.50),
            p95_duration_ms: percentile(buckets, 0.95),
            failures_by_reason,
            last_summarization_at: totals.last_summarization_at,
            mean_fact_recall: totals.mean_fact_recall,
            total_precomputed: totals.total_precomputed,
            precomputed_share: share(totals.total_precomputed),
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

/// The table `summarizer stats` and the demo print: the aggregates, then the per-day
/// series.
impl fmt::Display for StatsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self;
        let stats = &report.summary;
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let mut rows = vec![
            (
                "total_summarizations",
                stats.total_summarizations.to_string(),
            ),
            (
                "total_chars_compacted",
                stats.total_chars_compacted.to_string(),
            ),
            (
                "total_messages_compacted",
                stats.total_messages_compacted.to_string(),
            ),
            (
                "total_tokens_compacted",
                stats.total_tokens_compacted.to_string(),
            ),
            ("average_chars_removed", opt(stats.average_chars_removed)),
            (
                "mean_fact_recall",
                stats
                    .mean_fact_recall
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
            ),
            ("total_precomputed", stats.total_precomputed.to_string()),
            (
                "precomputed_share",
                stats
                    .precomputed_share
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
            ),
            ("p50_duration_ms", opt(stats.p50_duration_ms)),
            ("p95_duration_ms", opt(stats.p95_duration_ms)),
            ("prompt_tokens", stats.prompt_tokens.to_string()),
            ("completion_tokens", stats.completion_tokens.to_string()),
            (
                "last_summarization_at",
                stats
                    .last_summarization_at
                    .clone()
                    .unwrap_or_else(|| "-".to_owned()),
            ),
        ];
        for (reason, n) in &stats.failures_by_reason {
            rows.push(("failures", format!("{reason} {n}")));
        }
        for (name, value) in &rows {
            writeln!(f, "{name:<26}{value:>26}")?;
        }
        if !report.daily.is_empty() {
            writeln!(
                f,
                "\n{:<12}{:>12}{:>14}{:>10}",
                "day", "compactions", "chars", "failures"
            )?;
            for d in &report.daily {
                writeln!(
                    f,
                    "{:<12}{:>12}{:>14}{:>10}",
                    d.day, d.compactions, d.chars_removed, d.failures
                )?;
            }
        }
        Ok(())
    }
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

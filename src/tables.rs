//! What the CLI and the demo print for people: the aggregates as a table. The store
//! gives records; how they read on a terminal is decided here.

use std::fmt::Write;

use crate::store::StatsReport;

/// The table `summarizer stats` and the demo print: the aggregates, then the per-day
/// series.
pub fn stats(report: &StatsReport) -> String {
    let mut f = String::new();
    {
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
            (
                "mean_statement_recall",
                stats
                    .mean_statement_recall
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
            ),
            ("total_precomputed", stats.total_precomputed.to_string()),
            (
                "total_tool_outputs_cleared",
                stats.total_tool_outputs_cleared.to_string(),
            ),
            ("total_chars_cleared", stats.total_chars_cleared.to_string()),
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
                "cached_prompt_tokens",
                stats.cached_prompt_tokens.to_string(),
            ),
            ("llm_requests", stats.llm_requests.to_string()),
            ("tokens_saved_net", stats.tokens_saved_net.to_string()),
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
            // Writing to a String cannot fail.
            let _ = writeln!(f, "{name:<26}{value:>26}");
        }
        if !report.daily.is_empty() {
            let _ = writeln!(
                f,
                "\n{:<12}{:>12}{:>14}{:>10}{:>10}{:>14}{:>14}",
                "day", "compactions", "chars", "failures", "requests", "prompt", "cached"
            );
            for d in &report.daily {
                let _ = writeln!(
                    f,
                    "{:<12}{:>12}{:>14}{:>10}{:>10}{:>14}{:>14}",
                    d.day,
                    d.compactions,
                    d.chars_removed,
                    d.failures,
                    d.llm_requests,
                    d.prompt_tokens,
                    d.cached_prompt_tokens
                );
            }
        }
    }
    f
}

//! The fact check as the worker runs it (`SUMMARY_FACT_CHECK`): the identifiers the old
//! part established (what the user and the agent said, and the tool-output lines they
//! relied on: [`FactSet::established_in`]) are extracted while the summarizer works, how
//! many of them the summary states (inside a statement, not a list; the user's words the
//! worker quotes count) is measured, and in `retry` mode an LLM
//! summary below `SUMMARY_MIN_FACT_RECALL` is asked for once more with each fact it did
//! not state listed beside the sentence it was said in. The decisions are
//! [`crate::fact_check`]'s; this is the asking, the timing and the logging.
//!
//! Nothing here fails a compaction: a second attempt that errs, runs out of time or is
//! refused by the template check leaves the first summary, which had passed it.

use std::sync::Arc;

use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::Worker;
use crate::compaction::Plan;
use crate::config::FactCheckMode;
use crate::fact_check::{self, Checked, Figures, RetryOutcome};
use crate::facts::{FactSet, Recall};
use crate::summarizer::{LlmError, SummaryRequest};
use crate::summary;
use crate::summary::Summary;

/// Old parts larger than this are extracted on the blocking pool, where the extraction
/// also overlaps the summarizer's call: at the extractor's speed (docs/benchmarks.md,
/// "Figures behind the code"), 8 KiB take under a millisecond, as long as a task should
/// hold an async thread.
const OFF_THREAD_CHARS: i64 = 8 * 1024;

/// The old part's facts, on their way.
pub(super) enum Extraction {
    /// `SUMMARY_FACT_CHECK=off`.
    Off,
    Done(Arc<FactSet>),
    /// Running on the blocking pool.
    Running(JoinHandle<FactSet>),
}

impl Worker {
    /// Starts extracting the facts of `plan`'s old part: on the blocking pool when it is
    /// large, so that the extraction overlaps the summarizer's call.
    pub(super) fn extract_facts(&self, plan: &Plan) -> Extraction {
        if self.policy.fact_check.mode == FactCheckMode::Off {
            return Extraction::Off;
        }
        if plan.chars_removed <= OFF_THREAD_CHARS {
            return Extraction::Done(Arc::new(FactSet::established_in(&plan.old)));
        }
        let old = Arc::clone(&plan.old);
        Extraction::Running(tokio::task::spawn_blocking(move || {
            FactSet::established_in(&old)
        }))
    }

    /// The summary to write, its text, and the figures its usage event records: the
    /// first summary (which passed the template check), or a second attempt that keeps
    /// more facts and ends by `retry_by` (see `Worker::retry_deadline`), asked as the
    /// first `request` was (its meter and transcript marker).
    pub(super) async fn check_facts(
        &self,
        rid: &str,
        plan: &Plan,
        extraction: Extraction,
        (summary, text): (Summary, String),
        (retry_by, request): (Instant, SummaryRequest<'_>),
    ) -> (Summary, String, Option<Figures>) {
        let facts = match extraction {
            Extraction::Off => None,
            Extraction::Done(facts) => Some(facts),
            Extraction::Running(task) => joined(task.await).map(Arc::new),
        };
        let recall = match &facts {
            Some(facts) => recall(facts, &self.as_written(plan, &text)).await,
            None => None,
        };
        let (Some(facts), Some(recall)) = (facts, recall) else {
            return (summary, text, None);
        };
        let first = Checked {
            summary,
            text,
            recall,
        };
        let (kept, retry) = if self.asks_again(&first, &facts) {
            self.ask_again(rid, plan, &facts, first, (retry_by, request))
                .await
        } else {
            (first, None)
        };
        let figures = Figures::of(&kept.recall, retry, facts.weighing());
        (kept.summary, kept.text, Some(figures))
    }

    /// Whether `first` is worth a second attempt ([`fact_check::asks_again`]).
    fn asks_again(&self, first: &Checked, facts: &FactSet) -> bool {
        let max_chars = usize::try_from(self.policy.summary_max_chars).unwrap_or(usize::MAX);
        fact_check::asks_again(self.policy.fact_check, first, facts, max_chars)
    }

    /// One more attempt, listing what `first` lost: the better of the two, and how the
    /// attempt went (`None` when the summarizer cannot do better than it did).
    async fn ask_again(
        &self,
        rid: &str,
        plan: &Plan,
        facts: &Arc<FactSet>,
        first: Checked,
        (retry_by, request): (Instant, SummaryRequest<'_>),
    ) -> (Checked, Option<RetryOutcome>) {
        if Instant::now() >= retry_by {
            // A request that could only be cut short would be paid for and thrown away.
            tracing::warn!(
                "[{rid}] summarizer: the summary stated {} of {} identifiers, but no time is \
                 left to ask once more; keeping it",
                first.recall.stated,
                first.recall.total
            );
            return (first, None);
        }
        let missing = facts.said_in(
            &plan.old,
            &first.recall.missing,
            crate::prompt::MAX_LISTED_FACTS,
        );
        if !self.summarizer.can_do_better(plan.model.as_deref()) {
            tracing::info!(
                "[{rid}] summarizer: the summary stated {} of {} identifiers; not asking \
                 again, as this model's last second attempts stated no more",
                first.recall.stated,
                first.recall.total
            );
            return (first, None);
        }
        let again = self.summarizer.summarize(request.again(&missing));
        let total = first.recall.total;
        tracing::info!(
            "[{rid}] summarizer: the summary stated {} of {total} identifiers, below \
             SUMMARY_MIN_FACT_RECALL ({}); asking once more",
            first.recall.stated,
            self.policy.fact_check.min_recall
        );
        let started = Instant::now();
        let answered = tokio::time::timeout_at(retry_by, again)
            .await
            .unwrap_or_else(|_| {
                Err(LlmError::Transient {
                    cause: "out of time: LLM_DEADLINE_MS reached, or too little of the lease \
                            left"
                        .to_owned(),
                    retry_after: None,
                })
            });
        self.metrics.llm_took(started.elapsed().as_secs_f64());
        let (kept, outcome) = match self.second_checked(plan, facts, answered).await {
            Ok(second) => fact_check::better(first, second),
            Err(why) => {
                tracing::warn!(
                    "[{rid}] summarizer: the second attempt failed, keeping the first \
                     summary: {why}"
                );
                (first, RetryOutcome::Failed)
            }
        };
        self.metrics.fact_retried(outcome);
        if outcome != RetryOutcome::Failed {
            (self.summarizer).retried(plan.model.as_deref(), outcome == RetryOutcome::Improved);
        }
        if outcome != RetryOutcome::Failed {
            tracing::info!(
                "[{rid}] summarizer: second attempt {}: writing the summary that states {} of \
                 {total} identifiers",
                outcome.as_str().replace('_', " "),
                kept.recall.stated
            );
        }
        (kept, Some(outcome))
    }

    /// What the agent will read of a summary `text` of `plan`: with the user's words the
    /// worker quotes after it (`summary::finish`), which state facts too.
    fn as_written(&self, plan: &Plan, text: &str) -> String {
        let words = summary::words::section(&plan.old, self.policy.user_words_chars);
        if words.is_empty() {
            text.to_owned()
        } else {
            format!("{text}\n\n{words}")
        }
    }

    /// The second attempt's answer, checked against the template and measured.
    async fn second_checked(
        &self,
        plan: &Plan,
        facts: &Arc<FactSet>,
        answered: Result<Summary, LlmError>,
    ) -> Result<Checked, String> {
        let summary = answered.map_err(|e| e.to_string())?;
        let checked = summary::accept(
            &summary.text,
            plan.chars_removed,
            self.policy.summary_max_chars,
        );
        let text = match checked {
            Ok(text) => text,
            Err(rejected) => return Err(rejected.to_string()),
        };
        match recall(facts, &self.as_written(plan, &text)).await {
            Some(recall) => Ok(Checked {
                summary,
                text,
                recall,
            }),
            None => Err("the fact check was cancelled at shutdown".to_owned()),
        }
    }
}

/// Recall against more facts than this is measured on the blocking pool: at its cost a
/// fact (docs/benchmarks.md, "Figures behind the code"), this many take about a
/// millisecond in a debug build.
const RECALL_OFF_THREAD_FACTS: usize = 2_000;

/// How much of `facts` `text` keeps; `None` only when the runtime is shutting down.
/// The summary's own facts are extracted too, so a long one (`SUMMARY_MAX_CHARS` may be
/// set high) goes to the blocking pool as well.
async fn recall(facts: &Arc<FactSet>, text: &str) -> Option<Recall> {
    let small = text.len() as i64 <= OFF_THREAD_CHARS;
    if small && facts.len() <= RECALL_OFF_THREAD_FACTS {
        return Some(facts.recall(text));
    }
    let (facts, text) = (Arc::clone(facts), text.to_owned());
    joined(tokio::task::spawn_blocking(move || facts.recall(&text)).await)
}

/// A blocking task's result. A panic goes on unwinding: the compaction's task catches it
/// (see `Worker::compact_in_task`). `None` when the runtime cancelled the task at
/// shutdown.
fn joined<T>(result: Result<T, JoinError>) -> Option<T> {
    match result {
        Ok(done) => Some(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

//! A compaction, as the worker sequences it: take the lease (loading the history with
//! it), plan ([`compaction::plan`], on the blocking pool for a large history), summarize
//! with no connection held and check the summary (its template, its facts), then commit
//! the [`Record`] in one fenced transaction, giving the lease back whatever happens.
//! Each runs as a task of its own, so that a slow or panicking one fails its event alone.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::task::JoinError;
use tokio::time::Instant;
use tracing::Instrument;

use super::{
    Compacting, Event, Job, Worker, lease_not_released, llm_failure, panic_message, store_failure,
};
use crate::compaction::{self, Loaded, Plan, Record, Turn, Written, clearing, tokens};
use crate::message::char_count;
use crate::outcome::{Compaction, Outcome, Reason};
use crate::prompt;
use crate::redact;
use crate::store::{CommitError, StoreError};
use crate::summarizer::SummaryRequest;
use crate::summary;
use crate::summary::Summary;
use crate::usage::Meter;

impl Event {
    /// This event's side of a compaction's record, under the lease `owner`.
    pub(super) fn turn<'a>(&'a self, owner: &'a str) -> Turn<'a> {
        Turn {
            session_id: &self.session_id,
            lease_owner: owner,
            request_id: &self.request_id,
            job_id: self.job_id.as_deref(),
            forced: self.overrides.force,
            overflow: self.overrides.overflow,
            idle: self.idle,
        }
    }
}

/// Milliseconds since `started`, for the record's duration.
pub(super) fn elapsed_ms(started: Instant) -> i64 {
    i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX)
}

impl Worker {
    /// Runs [`Worker::lease_and_compact`] as a task of its own, so that a slow or
    /// CPU-heavy compaction never stalls the serving task's other events, and a panic
    /// in it fails this event alone. A panic is answered `failed/llm_error` (the wire
    /// contract has no reason for a bug; the summarizer is where one is likeliest) and
    /// the lease is released with a backoff, as after an LLM failure, so that a session
    /// that trips a bug is not retried every turn.
    pub(super) async fn compact_in_task(self: &Arc<Self>, event: &Event, job: Job) -> Outcome {
        let owner = self.new_lease_owner();
        let task = {
            let (worker, event, owner) = (self.clone(), event.clone(), owner.clone());
            let abandon = self.abandon.clone();
            self.tasks.spawn(
                async move {
                    let _compacting = Compacting::new(&worker.compacting);
                    tokio::select! {
                        outcome = worker.lease_and_compact(&event, &owner, job) => outcome,
                        () = abandon.cancelled() => worker.abandoned(&event, &owner).await,
                    }
                }
                .in_current_span(),
            )
        };
        match task.await {
            Ok(outcome) => outcome,
            Err(e) => self.compaction_died(event, &owner, e).await,
        }
    }

    /// A lease owner no client can choose or repeat: the worker's id and a number this
    /// process never hands out twice.
    pub(super) fn new_lease_owner(&self) -> String {
        let n = self.events.fetch_add(1, Ordering::Relaxed);
        format!("{}/{n:x}", self.id)
    }

    /// The compaction task panicked (or was cancelled with the runtime): the session is
    /// unchanged, since the commit is one transaction, and the lease is given back.
    async fn compaction_died(&self, event: &Event, owner: &str, error: JoinError) -> Outcome {
        let rid = &event.request_id;
        let detail = if error.is_panic() {
            format!(
                "the compaction panicked: {}",
                panic_message(error.into_panic())
            )
        } else {
            "the compaction task was cancelled".to_owned()
        };
        tracing::error!("[{rid}] summarizer: compaction failed, session unchanged: {detail}");
        if let Err(e) = self.release_backing_off(event, owner).await {
            lease_not_released(rid, &e);
        }
        Outcome::Failed {
            reason: Reason::LlmError,
            detail,
        }
    }

    /// The grace period ended with this compaction still running: it is dropped (an open
    /// transaction rolls back) and its lease given back, so that the session need not
    /// wait for the lease to expire.
    pub(super) async fn abandoned(&self, event: &Event, owner: &str) -> Outcome {
        let rid = &event.request_id;
        tracing::warn!("[{rid}] summarizer: abandoned at shutdown, session unchanged");
        if let Err(e) = self.store.release_lease(&event.session_id, owner).await {
            lease_not_released(rid, &e);
        }
        Outcome::Failed {
            reason: Reason::LlmError,
            detail: "abandoned at shutdown".to_owned(),
        }
    }

    /// Gives the lease back after a failure and puts the session in backoff, so that a
    /// session that keeps failing is not summarized again on every turn.
    pub(super) async fn release_backing_off(
        &self,
        event: &Event,
        owner: &str,
    ) -> Result<(), StoreError> {
        self.store
            .record_failure(
                &event.session_id,
                Some(owner),
                Reason::LlmError,
                self.policy.failure_backoff,
                self.policy.failure_backoff_max,
            )
            .await
    }

    /// Takes the lease (loading the messages with it), compacts, and gives the lease back
    /// unless the commit did.
    async fn lease_and_compact(&self, event: &Event, owner: &str, job: Job) -> Outcome {
        let started = Instant::now();
        let loaded = match self
            .store
            .take_lease_and_load(&event.session_id, owner, self.policy.lease_duration)
            .await
        {
            Ok(Some(loaded)) => loaded,
            Ok(None) => return Outcome::Busy,
            // Rows that cannot be decoded fail the same way at every turn: the session
            // backs off instead (`summarizer check` names the rows). Whether the failed
            // load's lease stuck depends on the store, so none is named.
            Err(e) if e.is_undecodable_row() => {
                let backoff = self.store.record_failure(
                    &event.session_id,
                    None,
                    Reason::StoreError,
                    self.policy.failure_backoff,
                    self.policy.failure_backoff_max,
                );
                if let Err(released) = backoff.await {
                    lease_not_released(&event.request_id, &released);
                }
                return store_failure(event, "loading the history", &e);
            }
            Err(e) => return store_failure(event, "taking the lease", &e),
        };
        let counted = loaded.counted();
        let keep_chars = job.limits.keep_chars;
        let outcome = self.compact(event, owner, loaded, job, started).await;
        // The commit released the lease on success; otherwise it would block the session
        // until it expires. An LLM failure also starts the session's backoff.
        let released = match &outcome {
            Outcome::Compacted(_) => {
                self.metrics
                    .compaction_took(started.elapsed().as_secs_f64());
                Ok(())
            }
            Outcome::Failed {
                reason: Reason::LlmError,
                ..
            } => self.release_backing_off(event, owner).await,
            Outcome::Skipped(reason) => {
                self.store
                    .release_lease_remembering(
                        &event.session_id,
                        owner,
                        *reason,
                        counted,
                        keep_chars,
                    )
                    .await
            }
            _ => self.store.release_lease(&event.session_id, owner).await,
        };
        if let Err(e) = released {
            lease_not_released(&event.request_id, &e);
        }
        outcome
    }

    /// Plans, summarizes and commits the loaded history, holding the lease taken at
    /// `leased` (or just after).
    async fn compact(
        &self,
        event: &Event,
        owner: &str,
        loaded: Loaded,
        job: Job,
        leased: Instant,
    ) -> Outcome {
        let started = Instant::now();
        let rid = &event.request_id;
        let rules = job.clearing.map(|keep| clearing::Rules {
            keep,
            min_chars: self.tool_outputs.min_chars,
            exclude: self.tool_outputs.exclude.clone(),
        });
        let plan = match plan_with_tokens(loaded, job, rules, self.policy.redact_secrets).await {
            Ok(plan) => plan,
            Err(outcome) => return outcome,
        };
        if !plan.cleared.is_empty() {
            tracing::info!(
                "[{rid}] summarizer: session={} chars, clearing {} tool outputs ({} chars){}",
                plan.session_chars,
                plan.cleared.len(),
                plan.cleared.iter().map(|c| c.saved).sum::<i64>(),
                if plan.summarized {
                    ""
                } else {
                    ", no summary needed"
                }
            );
        }
        if !plan.summarized {
            let record = Record::new(&plan, event.turn(owner), None, elapsed_ms(started));
            return self.commit(event, &record, 0, started).await;
        }
        tracing::info!(
            "[{rid}] summarizer: session={} chars, removing {} msgs ({} chars), keeping {} msgs",
            plan.session_chars,
            plan.old.len(),
            plan.chars_removed,
            plan.messages_kept
        );
        let written = match self.write_summary(rid, &plan, leased).await {
            Ok(written) => written,
            Err(failed) => return failed,
        };
        let record = Record::new(
            &plan,
            event.turn(owner),
            Some(&written),
            elapsed_ms(started),
        );
        self.commit(event, &record, plan.chars_removed, started)
            .await
    }

    /// The summary of `plan`'s old part, checked against the template and for its facts
    /// (the fact check overlaps the summarizer's call). `Err` is the `failed/llm_error`
    /// outcome, already logged and counted.
    pub(super) async fn write_summary(
        &self,
        rid: &str,
        plan: &Plan,
        leased: Instant,
    ) -> Result<Written, Outcome> {
        let facts = self.extract_facts(plan);
        let retry_by = self.retry_deadline(Instant::now(), leased);
        // Every request of this compaction is counted into one meter, and repeats one
        // transcript marker, so that a second attempt's prompt starts as the first's did.
        let meter = Meter::new();
        let marker = prompt::draw_marker(&plan.context, &plan.old);
        let request = plan.request().metered(&meter).marked(&marker);
        let first = self.summarize_and_check(rid, plan, request).await?;
        let (summary, text, facts) = self
            .check_facts(rid, plan, facts, first, (retry_by, request))
            .await;
        let text = summary::finish(
            text,
            &plan.old,
            &plan.removed_seqs,
            (plan.chars_removed, self.policy.summary_max_chars),
            self.policy.user_words_chars,
        );
        // The summarizer saw no secret, but a model can make one up or copy one from its
        // own prompt: the text written passes the same rule.
        let mut redacted = plan.redacted.clone();
        let text = if self.policy.redact_secrets {
            redact::redact(&text, &mut redacted).into_owned()
        } else {
            text
        };
        Ok(Written {
            summary,
            usage: meter.total(),
            text,
            facts,
            redacted,
        })
    }

    /// Asks the summarizer for the old part's summary and checks it against the
    /// template. `Err` is the `failed/llm_error` outcome, already logged and counted, or
    /// `skipped/nothing_to_compact` for a forced compaction's summary no shorter than
    /// the old part.
    /// (The fact check comes after: see `Worker::check_facts`.)
    async fn summarize_and_check(
        &self,
        rid: &str,
        plan: &Plan,
        request: SummaryRequest<'_>,
    ) -> Result<(Summary, String), Outcome> {
        let asked = Instant::now();
        let summarized = self.summarizer.summarize(request).await;
        self.metrics.llm_took(asked.elapsed().as_secs_f64());
        let summary = summarized.map_err(|e| {
            self.metrics.llm_failed(e.metric_cause());
            llm_failure(rid, e.to_string())
        })?;
        match summary::accept(
            &summary.text,
            plan.chars_removed,
            self.policy.summary_max_chars,
        ) {
            Ok(text) => Ok((summary, text)),
            // A forced compaction of a short history: its old part may be smaller than
            // any summary, which is nothing a summary could shorten, not a failure of the
            // LLM's and no reason to back off. (An old part a threshold planned is large:
            // a summary longer than it is the model's failure.)
            Err(e @ summary::Rejected::NotShorter { .. }) if plan.forced => {
                tracing::info!("[{rid}] summarizer: nothing to compact, {e}");
                Err(Outcome::Skipped(Reason::NothingToCompact))
            }
            Err(e) => {
                self.metrics.llm_failed("invalid_summary");
                Err(llm_failure(rid, e.to_string()))
            }
        }
    }

    /// When a second attempt at the summary (the fact check's) must have ended, for a
    /// summarization that starts `now` under a lease taken at `leased`: within
    /// `LLM_DEADLINE_MS` of the first attempt's start, as one summarization, and with a
    /// quarter of the lease left for the commit, so that asking again can never cost the
    /// lease and with it the first summary (`LEASE_DURATION_MS` may be set below the
    /// deadline; that is only warned about).
    fn retry_deadline(&self, now: Instant, leased: Instant) -> Instant {
        let lease = self.policy.lease_duration;
        (now + self.policy.llm_deadline).min(leased + (lease - lease / 4))
    }

    /// Writes the summary in one fenced transaction; a lost lease or a changed prefix
    /// writes nothing and is answered `skipped/conflict`.
    async fn commit(
        &self,
        event: &Event,
        new: &Record<'_>,
        chars_removed: i64,
        started: Instant,
    ) -> Outcome {
        let rid = &event.request_id;
        let compaction_id = match self.store.commit(new).await {
            Ok(committed) => {
                if committed.superseded {
                    self.metrics
                        .precomputes_discarded(crate::store::Discard::Superseded.as_str(), 1);
                }
                committed.compaction_id
            }
            Err(CommitError::Store(e)) => return store_failure(event, "committing", &e),
            Err(conflict) => {
                tracing::info!("[{rid}] summarizer: nothing written: {conflict}");
                if let Err(e) = self.store.count_failure(Reason::Conflict).await {
                    tracing::warn!(
                        "[{rid}] could not count the conflict: {}",
                        crate::error_chain(&e)
                    );
                }
                return Outcome::Skipped(Reason::Conflict);
            }
        };
        if let Some(facts) = new.facts.filter(|f| f.total > 0) {
            self.metrics
                .fact_recall(facts.kept as f64 / facts.total as f64);
        }
        let chars_cleared = new.chars_cleared();
        if !new.cleared.is_empty() {
            self.metrics.cleared(new.cleared.len(), chars_cleared);
        }
        let summary_chars = char_count(new.text);
        if new.summarized {
            tracing::info!(
                "[{rid}] summarizer done: -{chars_removed} chars, summary {summary_chars} chars, {}ms",
                started.elapsed().as_millis()
            );
        } else {
            tracing::info!(
                "[{rid}] summarizer done: -{chars_cleared} chars cleared from {} tool outputs, no summary, {}ms",
                new.cleared.len(),
                started.elapsed().as_millis()
            );
        }
        Outcome::Compacted(Compaction {
            compaction_id,
            messages_removed: new.removed_seqs.len() as i64,
            chars_removed,
            messages_kept: new.messages_kept,
            summary_chars,
            summarized: new.summarized,
            tool_outputs_cleared: new.cleared.len() as i64,
            chars_cleared,
        })
    }
}

/// Histories larger than this are planned on the blocking pool. Planning counts the
/// removed part's tokens: at the tokenizer's speed (docs/benchmarks.md, "Figures behind
/// the code") 64 KiB take about a millisecond, as long as a task should hold an async
/// thread; below it the hop would cost more than it saves.
const PLAN_OFF_THREAD_CHARS: i64 = 64 * 1024;

/// [`compaction::plan`] with the tokenizer loaded (it counts what is removed), for `job`'s
/// limits and model, clearing old tool output first under `clearing` when given, and
/// with what the summarizer will see redacted under `redact_secrets` (`REDACT_SECRETS`,
/// see [`Plan::redact_secrets`]); on the blocking pool for a large history. `Err` is the
/// outcome to answer: the skip reason, or a failure.
pub(super) async fn plan_with_tokens(
    loaded: Loaded,
    job: Job,
    clearing: Option<clearing::Rules>,
    redact_secrets: bool,
) -> Result<Plan, Outcome> {
    tokens::ensure_loaded().await;
    let (limits, evict_over) = (job.limits, job.evict_over);
    let (model, instructions, forced) = (job.model, job.instructions, job.forced);
    let chars: i64 = loaded.messages.iter().map(|m| m.chars).sum();
    let planning = move || {
        let mut plan = Plan {
            model,
            instructions,
            forced,
            ..compaction::plan(loaded, limits, clearing.as_ref(), evict_over)?
        };
        if redact_secrets {
            plan.redact_secrets();
        }
        Ok(plan)
    };
    off_thread(chars, planning).await?.map_err(Outcome::Skipped)
}

/// `work` (the plan, the redaction), on the blocking pool for a history over
/// [`PLAN_OFF_THREAD_CHARS`]. `Err` is the failure to answer when the runtime shuts down
/// first.
async fn off_thread<T: Send + 'static>(
    chars: i64,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Outcome> {
    if chars <= PLAN_OFF_THREAD_CHARS {
        return Ok(work());
    }
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => Ok(done),
        // The compaction's task catches the panic (see `Worker::compact_in_task`).
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The blocking pool cancels a task only when the runtime shuts down.
        Err(_) => Err(Outcome::Failed {
            reason: Reason::LlmError,
            detail: "planning was cancelled at shutdown".to_owned(),
        }),
    }
}

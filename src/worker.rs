//! One turn-starting event, start to finish: [`Worker::process`] is the step the NATS
//! loop calls and the tests call directly.
//!
//! The order is chosen so the common case is cheap and nothing is held across the LLM
//! call: read the counters and the session's settings (one primary-key read), work out
//! the event's limits (request, then session, then configuration: [`crate::overrides`]),
//! take the lease, load and plan, summarize with no connection held, check the summary's
//! facts (`facts`: perhaps asking once more), then commit in one fenced transaction.
//!
//! With `SUMMARIZATION_PRECOMPUTE_AT` set, a session nearing its threshold is summarized
//! in the background (`precompute`), and the turn that crosses the threshold only
//! applies that summary: one database call instead of an LLM call.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::clearing;
use crate::config::{Bounds, FactCheck, Limits, Precompute, ToolOutputs};
use crate::fact_check::Figures;
use crate::llm::tokens;
use crate::message::{Message, Role, char_count};
use crate::metrics::Metrics;
use crate::outcome::{Compaction, Outcome, Reason};
use crate::overrides::{self, Overrides};
use crate::planner;
use crate::protocol::Instructions;
use crate::store::{
    Applied, ClearedRow, CommitError, CounterReader, Counters, Loaded, NewSummary, SharedStore,
    StoreError,
};
use crate::summarizer::{Summarizer, SummaryRequest};
use crate::summary;
use crate::summary::Summary;

mod facts;
mod precompute;

/// What a worker needs to know of the settings.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub enabled: bool,
    /// The configured limits, for events that ask for none of their own.
    pub limits: Limits,
    /// `SUMMARIZATION_THRESHOLD_TOKENS`, for sessions and events that set none; 0: off.
    pub threshold_tokens: i64,
    /// The range a request's or session's own limits are clamped into.
    pub bounds: Bounds,
    pub lease_duration: Duration,
    pub failure_backoff: Duration,
    pub failure_backoff_max: Duration,
    /// `SUMMARY_MAX_CHARS`: a longer summary is refused.
    pub summary_max_chars: i64,
    /// `SUMMARY_FACT_CHECK` and `SUMMARY_MIN_FACT_RECALL`.
    pub fact_check: FactCheck,
    /// `LLM_DEADLINE_MS`: the fact check's second attempt at a summary must end within
    /// it too, counted from the first's start (see `Worker::retry_deadline`).
    pub llm_deadline: Duration,
    /// `WORKER_CONCURRENCY`: precomputes give way when half of it is compacting.
    pub concurrency: usize,
    /// `SUMMARIZATION_PRECOMPUTE_AT` and its bounds.
    pub precompute: Precompute,
}

/// A validated event.
#[derive(Clone, Debug)]
pub struct Event {
    pub session_id: String,
    /// The sender's id, or one made up for the logs: 8 hex digits.
    pub request_id: String,
    /// The limits the request asks for, not yet clamped, and whether it forces a
    /// compaction and the token count it reports.
    pub overrides: Overrides,
    /// The request's focus for the summary (`instructions`, already checked), with who
    /// wrote it.
    pub instructions: Option<Instructions>,
    /// A durable job's own identity (stream, sequence, publish time; see `transport::jetstream`),
    /// recorded in the usage event so that a redelivery of the same job is recognised.
    /// `None` for requests.
    pub job_id: Option<String>,
}

impl Event {
    pub fn new(session_id: String, request_id: Option<String>) -> Self {
        Self {
            session_id,
            request_id: request_id.unwrap_or_else(new_request_id),
            overrides: Overrides::default(),
            instructions: None,
            job_id: None,
        }
    }

    /// The event a decoded request asks for.
    pub fn from_request(request: crate::protocol::Request) -> Self {
        Self {
            overrides: request.overrides,
            instructions: request.focus(),
            ..Self::new(request.session_id, request.request_id)
        }
    }

    pub fn with_overrides(self, overrides: Overrides) -> Self {
        Self { overrides, ..self }
    }

    pub fn with_job_id(self, job_id: Option<String>) -> Self {
        Self { job_id, ..self }
    }
}

/// What one compaction runs with, worked out from the request, the session's settings
/// and the configuration before the lease is taken.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Job {
    limits: Limits,
    /// `session_settings.model`, when the session has one.
    model: Option<String>,
    /// When the compaction clears old tool output first: the newest results it keeps
    /// (`TOOL_OUTPUT_KEEP`, or the session's). `None`: it does not clear.
    clearing: Option<usize>,
    /// The request forced it: `limits.threshold_chars` is 0, so the planner does not
    /// refuse a session below its threshold.
    forced: bool,
    /// The request's focus for the summary.
    instructions: Option<Instructions>,
}

pub use summarizer_client::new_request_id;

/// The outcome of one event and what the reply reports beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processed {
    pub outcome: Outcome,
    /// The session's size when it was checked; `None` when it was not read.
    pub session_chars: Option<i64>,
    /// The session's compaction in force when it was checked (`None` when it has none or
    /// was not read); a compaction's reply reports itself instead.
    pub latest_compaction_id: Option<i64>,
    pub duration: Duration,
}

/// What the counters read told of the session, for the reply.
#[derive(Clone, Copy, Debug)]
struct Checked {
    session_chars: i64,
    /// The compaction in force (`sessions.last_compaction_id`).
    latest_compaction_id: Option<i64>,
}

pub struct Worker {
    store: SharedStore,
    metrics: Arc<Metrics>,
    counters: CounterReader,
    summarizer: Arc<dyn Summarizer>,
    policy: Policy,
    /// Distinguishes this process's leases from other workers' in `sessions.lease_owner`.
    id: String,
    /// Numbers this process's compactions, so each holds a lease owner of its own.
    events: AtomicU64,
    /// The compactions running as tasks of their own, for the drain to wait on.
    tasks: TaskTracker,
    /// Fired when the grace period is over: running compactions give their leases back.
    abandon: CancellationToken,
    /// Compactions (not precomputes) running now: precomputes give way to them.
    compacting: AtomicUsize,
    /// The sessions this worker is precomputing, at most `PRECOMPUTE_CONCURRENCY`.
    precomputing: Mutex<HashSet<String>>,
    /// `TOOL_OUTPUT_*`: clearing old tool output before a summary.
    tool_outputs: ToolOutputs,
}

impl Worker {
    /// Starts the worker's batching task: call it inside the runtime.
    pub fn new(
        store: SharedStore,
        summarizer: Arc<dyn Summarizer>,
        policy: Policy,
        metrics: Arc<Metrics>,
    ) -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned());
        Self {
            counters: CounterReader::spawn(store.clone()),
            metrics,
            store,
            summarizer,
            policy,
            id: format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..)),
            events: AtomicU64::new(0),
            tasks: TaskTracker::new(),
            abandon: CancellationToken::new(),
            compacting: AtomicUsize::new(0),
            precomputing: Mutex::new(HashSet::new()),
            tool_outputs: ToolOutputs::default(),
        }
    }

    /// With clearing of old tool output configured as `tool_outputs` (off by default).
    #[must_use]
    pub fn with_tool_outputs(mut self, tool_outputs: ToolOutputs) -> Self {
        self.tool_outputs = tool_outputs;
        self
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store this worker compacts in (recall requests read its archive).
    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// Answers one event. The cheap part (the counters) runs on the caller's task; a
    /// compaction runs as a task of its own (see `Worker::compact_in_task`).
    pub async fn process(self: &Arc<Self>, event: &Event) -> Processed {
        let started = Instant::now();
        let (outcome, checked, precomputed) = self.decide(event).await;
        let duration = started.elapsed();
        if matches!(outcome, Outcome::Compacted(_)) {
            self.metrics
                .compaction_turn_took(precomputed, duration.as_secs_f64());
        }
        Processed {
            outcome,
            session_chars: checked.map(|c| c.session_chars),
            latest_compaction_id: checked.and_then(|c| c.latest_compaction_id),
            duration,
        }
    }

    /// Called once the serving loop has stopped: cancels the compactions still running
    /// (their events were abandoned when the grace period ran out), which rolls back
    /// what they had not committed and gives their leases back, and waits up to
    /// `within` for that.
    pub async fn abandon_compactions(&self, within: Duration) {
        self.tasks.close();
        if self.tasks.is_empty() {
            return;
        }
        tracing::warn!(
            running = self.tasks.len(),
            "abandoning the compactions still running; releasing their leases"
        );
        self.abandon.cancel();
        if tokio::time::timeout(within, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some leases were not released in time; they will expire");
        }
    }

    /// The outcome, the counters when they were read, and whether the outcome is a
    /// pending summary applied.
    async fn decide(self: &Arc<Self>, event: &Event) -> (Outcome, Option<Checked>, bool) {
        if !self.policy.enabled {
            return (Outcome::Skipped(Reason::Disabled), None, false);
        }
        let counters = match self.counters.counters(&event.session_id).await {
            Ok(Some(counters)) => counters,
            Ok(None) => return (Outcome::Skipped(Reason::UnknownSession), None, false),
            Err(e) => return (store_failure(event, "reading the session", &e), None, false),
        };
        let (outcome, checked) = self.decide_on(event, counters).await;
        match outcome {
            Decided::Done(outcome) => (outcome, checked, false),
            Decided::Precomputed(outcome) => (outcome, checked, true),
        }
    }

    /// [`Worker::decide`] once the counters are read.
    async fn decide_on(
        self: &Arc<Self>,
        event: &Event,
        counters: Counters,
    ) -> (Decided, Option<Checked>) {
        use Decided::Done;
        let checked = Some(Checked {
            session_chars: counters.total_chars,
            latest_compaction_id: counters.last_compaction_id,
        });
        if counters.settings.disabled() {
            return (Done(Outcome::Skipped(Reason::Disabled)), checked);
        }
        let request = event.overrides;
        let limits = overrides::with_token_threshold(
            overrides::limits(
                self.policy.limits,
                self.policy.bounds,
                &counters.settings,
                request,
            ),
            counters.total_chars,
            overrides::session_tokens(
                counters.total_chars,
                counters.chars_per_token,
                request.context_tokens,
            ),
            overrides::threshold_tokens(
                self.policy.threshold_tokens,
                self.policy.bounds,
                &counters.settings,
                request,
            ),
        );
        let clearing = overrides::clearing(&self.tool_outputs, &counters.settings, request);
        let forced = request.force;
        let below = !forced && counters.total_chars <= limits.threshold_chars;
        let skip = if below {
            Some(Reason::BelowThreshold)
        } else if counters.human_turns < 2 && clearing.is_none() {
            // A clearing needs no human turn: one long first turn of tool output is
            // where it helps most.
            Some(Reason::TooFewTurns)
        } else if counters.backing_off {
            Some(Reason::BackingOff)
        } else {
            // The planner refused this very history, with this keep, before: no lease,
            // no load.
            counters.remembered_skip_for(limits.keep_chars)
        };
        let job = Job {
            // Forced: below the threshold is no reason to skip; every other rule holds.
            limits: if forced {
                Limits {
                    threshold_chars: 0,
                    ..limits
                }
            } else {
                limits
            },
            model: counters.settings.model.clone(),
            clearing,
            forced,
            instructions: event.instructions.clone(),
        };
        // A session whose compactions clear first is not precomputed: its next
        // compaction may need no summary at all.
        if below
            && clearing.is_none()
            && self
                .policy
                .precompute
                .wanted(counters.total_chars, limits.threshold_chars)
            && counters.human_turns >= 2
            && !counters.backing_off
            && counters.remembered_skip_for(limits.keep_chars).is_none()
        {
            // In the background: the reply goes out now.
            self.start_precompute(event, job.clone());
        }
        if let Some(reason) = skip {
            return (Done(Outcome::Skipped(reason)), checked);
        }
        // A forced or instructed compaction writes its own summary: a pending one was
        // written without the instructions, and for another threshold.
        if self.policy.precompute.enabled()
            && job.clearing.is_none()
            && !job.forced
            && job.instructions.is_none()
            && let Some(outcome) = self.apply_pending(event, &job).await
        {
            return (outcome, checked);
        }
        // Boxed: the compaction's state machine is kilobytes, and kept inline it made every
        // event's future that large, no-op or not (memmove topped the worker's profile).
        (
            Done(Box::pin(self.compact_in_task(event, job)).await),
            checked,
        )
    }

    /// At a turn over the threshold: writes the session's pending summary if it still
    /// fits (`Decided::Precomputed`), or answers busy while another worker holds the
    /// lease. `None`: no pending summary, or one dropped as stale; compact as usual.
    async fn apply_pending(&self, event: &Event, job: &Job) -> Option<Decided> {
        let rid = &event.request_id;
        let applied = self
            .store
            .apply_pending(
                &event.session_id,
                (rid, event.job_id.as_deref()),
                (job.limits, job.model.as_deref()),
                self.policy.precompute.ttl,
            )
            .await;
        match applied {
            Ok(Applied::None) => None,
            Ok(Applied::Busy) => Some(Decided::Done(Outcome::Busy)),
            Ok(Applied::Discarded(reason)) => {
                tracing::info!(
                    "[{rid}] summarizer: pending summary dropped ({}); compacting now",
                    reason.as_str()
                );
                self.metrics.precomputes_discarded(reason.as_str(), 1);
                None
            }
            Ok(Applied::Compacted {
                compaction_id,
                messages_removed,
                chars_removed,
                messages_kept,
                summary_chars,
            }) => {
                self.metrics.precompute_used();
                tracing::info!(
                    "[{rid}] summarizer done from a pending summary: -{chars_removed} chars, \
                     summary {summary_chars} chars"
                );
                Some(Decided::Precomputed(Outcome::Compacted(Compaction {
                    compaction_id,
                    messages_removed,
                    chars_removed,
                    messages_kept,
                    summary_chars,
                    summarized: true,
                    tool_outputs_cleared: 0,
                    chars_cleared: 0,
                })))
            }
            Err(e) => Some(Decided::Done(store_failure(
                event,
                "applying the pending summary",
                &e,
            ))),
        }
    }

    /// Runs [`Worker::lease_and_compact`] as a task of its own, so that a slow or
    /// CPU-heavy compaction never stalls the serving task's other events, and a panic
    /// in it fails this event alone. A panic is answered `failed/llm_error` (the wire
    /// contract has no reason for a bug; the summarizer is where one is likeliest) and
    /// the lease is released with a backoff, as after an LLM failure, so that a session
    /// that trips a bug is not retried every turn.
    async fn compact_in_task(self: &Arc<Self>, event: &Event, job: Job) -> Outcome {
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
    fn new_lease_owner(&self) -> String {
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
    async fn abandoned(&self, event: &Event, owner: &str) -> Outcome {
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
    async fn release_backing_off(&self, event: &Event, owner: &str) -> Result<(), StoreError> {
        self.store
            .record_failure(
                &event.session_id,
                Some(owner),
                "llm_error",
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
                    "store_error",
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
        let plan = match plan_with_tokens(loaded, job, rules).await {
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
            let new = plan.clearing_only(event, owner, started);
            return self.commit(event, &new, 0, started).await;
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
        let new = written.new_summary(event, owner, &plan, started);
        self.commit(event, &new, plan.chars_removed, started).await
    }

    /// The summary of `plan`'s old part, checked against the template and for its facts
    /// (the fact check overlaps the summarizer's call). `Err` is the `failed/llm_error`
    /// outcome, already logged and counted.
    async fn write_summary(
        &self,
        rid: &str,
        plan: &Plan,
        leased: Instant,
    ) -> Result<Written, Outcome> {
        let facts = self.extract_facts(plan);
        let retry_by = self.retry_deadline(Instant::now(), leased);
        let first = self.summarize_and_check(rid, plan).await?;
        let (summary, text, facts) = self.check_facts(rid, plan, facts, first, retry_by).await;
        Ok(Written {
            summary,
            text: with_recall_note(
                text,
                &plan.removed_seqs,
                plan.chars_removed,
                self.policy.summary_max_chars,
            ),
            facts,
        })
    }

    /// Asks the summarizer for the old part's summary and checks it against the
    /// template. `Err` is the `failed/llm_error` outcome, already logged and counted.
    /// (The fact check comes after: see `Worker::check_facts`.)
    async fn summarize_and_check(
        &self,
        rid: &str,
        plan: &Plan,
    ) -> Result<(Summary, String), Outcome> {
        let asked = Instant::now();
        let summarized = self.summarizer.summarize(plan.request()).await;
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
        new: &NewSummary<'_>,
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
                if let Err(e) = self.store.count_failure("conflict").await {
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

/// `summary` with a last line that tells the model reading it that the messages it
/// replaced are archived and can be recalled (docs/protocol.md, "Recall"): their number
/// and seqs, which a fetch names. The template's sections come first, untouched. The
/// note is an aid, not part of what was checked: when it would take the summary past
/// `max_chars` (`SUMMARY_MAX_CHARS`) or to the length of the `replaced_chars` it
/// replaces, the summary goes without it.
pub fn with_recall_note(
    summary: String,
    removed_seqs: &[i64],
    replaced_chars: i64,
    max_chars: i64,
) -> String {
    let (Some(first), Some(last)) = (removed_seqs.first(), removed_seqs.last()) else {
        return summary;
    };
    let noted = format!(
        "{summary}\n\n{RECALL_NOTE_START} the {} messages this summary replaced (seq {first} to \
         {last}) are archived: search them, or fetch one by its seq, with recall.]",
        removed_seqs.len()
    );
    let chars = i64::try_from(noted.chars().count()).unwrap_or(i64::MAX);
    if chars > max_chars || chars >= replaced_chars {
        return summary;
    }
    noted
}

/// How the recall note of a summary starts.
pub const RECALL_NOTE_START: &str = "[Recall:";

/// How [`Worker::decide_on`] answered.
enum Decided {
    Done(Outcome),
    /// A pending summary was written (`SUMMARIZATION_PRECOMPUTE_AT`).
    Precomputed(Outcome),
}

/// Counts a compaction running (see `Worker::compacting`) until dropped.
struct Compacting<'a>(&'a AtomicUsize);

impl<'a> Compacting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Compacting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A summary written for a plan and checked: what a commit or a pending summary stores.
struct Written {
    summary: Summary,
    text: String,
    /// The fact check's figures; `None` when it is off.
    facts: Option<Figures>,
}

impl Written {
    /// The commit's (or the pending summary's) record of this summary of `plan`, for
    /// `event` under the lease `owner`, with the time since `started`.
    fn new_summary<'a>(
        &'a self,
        event: &'a Event,
        owner: &'a str,
        plan: &'a Plan,
        started: Instant,
    ) -> NewSummary<'a> {
        NewSummary {
            session_id: &event.session_id,
            lease_owner: owner,
            cut_seq: plan.cut_seq,
            removed_seqs: &plan.removed_seqs,
            kept_seqs: &plan.kept_seqs,
            removed_chars: &plan.removed_chars,
            removed_fingerprints: &plan.removed_fingerprints,
            text: &self.text,
            model: &self.summary.model,
            requested_model: plan.model.as_deref(),
            prompt_tokens: self.summary.prompt_tokens,
            completion_tokens: self.summary.completion_tokens,
            prompt_version: self.summary.prompt_version.as_deref(),
            fallback_reason: self.summary.fallback_reason.as_deref(),
            messages_kept: plan.messages_kept,
            tokens_removed: plan.tokens_removed,
            summary_tokens: i64::try_from(tokens::count(&self.text)).unwrap_or(i64::MAX),
            facts: self.facts,
            request_id: &event.request_id,
            job_id: event.job_id.as_deref(),
            duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            summarized: true,
            cleared: &plan.cleared,
            forced: event.overrides.force,
            instructions: event.instructions.as_ref(),
        }
    }
}

/// A planned compaction, with what the log line, the summarizer and the commit need.
#[derive(Debug)]
struct Plan {
    /// The messages the summary replaces, oldest first; shared with the fact check's
    /// work on the blocking pool.
    old: Arc<[Message]>,
    /// The system messages before the cut, which stay: the summarizer's context.
    context: Vec<Message>,
    session_chars: i64,
    chars_removed: i64,
    messages_kept: i64,
    cut_seq: i64,
    removed_seqs: Vec<i64>,
    /// The pinned messages (and their tool-call partners) before the cut, which stay.
    kept_seqs: Vec<i64>,
    removed_chars: Vec<i64>,
    /// The removed rows' fingerprints at load, which the commit checks.
    removed_fingerprints: Vec<String>,
    /// The tokenizer's count of what is removed (see [`removed_tokens`]).
    tokens_removed: i64,
    /// The model the session asks to be summarized with (`session_settings.model`).
    model: Option<String>,
    /// The request's focus for the summary (`instructions`).
    instructions: Option<Instructions>,
    /// The tool results cleared in place (docs/compaction.md, "Clearing old tool output").
    cleared: Vec<ClearedRow>,
    /// `false`: the clearing is the whole compaction; nothing else is removed and no
    /// summary written.
    summarized: bool,
}

impl Plan {
    /// What the summarizer is asked for a first summary of the old part.
    fn request(&self) -> SummaryRequest<'_> {
        SummaryRequest {
            old: &self.old,
            context: &self.context,
            model: self.model.as_deref(),
            instructions: self.instructions.as_ref(),
            missing: &[],
        }
    }

    /// The commit's record of a clearing alone, for `event` under the lease `owner`.
    fn clearing_only<'a>(
        &'a self,
        event: &'a Event,
        owner: &'a str,
        started: Instant,
    ) -> NewSummary<'a> {
        NewSummary {
            session_id: &event.session_id,
            lease_owner: owner,
            cut_seq: self.cut_seq,
            removed_seqs: &[],
            kept_seqs: &[],
            removed_chars: &[],
            removed_fingerprints: &[],
            text: "",
            model: CLEARING_MODEL,
            requested_model: None,
            prompt_tokens: None,
            completion_tokens: None,
            prompt_version: None,
            fallback_reason: None,
            messages_kept: self.messages_kept,
            tokens_removed: 0,
            summary_tokens: 0,
            facts: None,
            request_id: &event.request_id,
            job_id: event.job_id.as_deref(),
            duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            summarized: false,
            cleared: &self.cleared,
            forced: event.overrides.force,
            // No summary was written, so none was focused.
            instructions: None,
        }
    }
}

/// The usage event's `model` for a clearing alone, which asked no model.
pub const CLEARING_MODEL: &str = "tool-output-clearing";

/// Histories larger than this are planned on the blocking pool. Planning counts the
/// removed part's tokens, at some tens of MB/s: 64 KiB take about a millisecond, which
/// is as long as a task should hold an async thread; below it the hop would cost more
/// than it saves.
const PLAN_OFF_THREAD_CHARS: i64 = 64 * 1024;

/// [`plan_off_thread`] with the tokenizer loaded (it counts what is removed), for `job`'s
/// limits and model, clearing old tool output first under `clearing` when given.
async fn plan_with_tokens(
    loaded: Loaded,
    job: Job,
    clearing: Option<clearing::Rules>,
) -> Result<Plan, Outcome> {
    tokens::ensure_loaded().await;
    let plan = plan_off_thread(loaded, job.limits, clearing).await?;
    Ok(Plan {
        model: job.model,
        instructions: job.instructions,
        ..plan
    })
}

/// [`plan`], on the blocking pool for a large history.
/// `Err` is the outcome to answer: the skip reason, or a failure.
async fn plan_off_thread(
    loaded: Loaded,
    limits: Limits,
    clearing: Option<clearing::Rules>,
) -> Result<Plan, Outcome> {
    let chars: i64 = loaded.messages.iter().map(|m| m.chars).sum();
    let planned = if chars <= PLAN_OFF_THREAD_CHARS {
        plan(loaded, limits, clearing.as_ref())
    } else {
        match tokio::task::spawn_blocking(move || plan(loaded, limits, clearing.as_ref())).await {
            Ok(planned) => planned,
            // The compaction's task catches the panic (see `Worker::compact_in_task`).
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The blocking pool cancels a task only when the runtime shuts down.
            Err(_) => {
                return Err(Outcome::Failed {
                    reason: Reason::LlmError,
                    detail: "planning was cancelled at shutdown".to_owned(),
                });
            }
        }
    };
    planned.map_err(Outcome::Skipped)
}

/// Plans the compaction of the loaded history and moves the old part out of it.
///
/// With `clearing`, old tool results are cleared first ([`clearing::plan`], down to the
/// keep). When that brings the session to its threshold or below, the clearing is the
/// whole compaction; when it does not, the summary's split is planned on the history as
/// cleared (the summarizer reads the placeholders, not the outputs), and the results
/// cleared in the kept part are cleared in place. A clearing is written even when no
/// summary can be planned after it (no safe boundary, say): it still makes room.
fn plan(
    loaded: Loaded,
    limits: Limits,
    clearing: Option<&clearing::Rules>,
) -> Result<Plan, Reason> {
    let Loaded {
        mut messages,
        fingerprints,
        cleared,
    } = loaded;
    let session_chars: i64 = messages.iter().map(|m| m.chars).sum();
    let clearing = match clearing {
        Some(rules) if session_chars > limits.threshold_chars => {
            clearing::plan(&messages, &cleared, rules, limits.keep_chars)
        }
        _ => clearing::Clearing::default(),
    };
    if clearing.is_empty() {
        let split = planner::plan(&messages, limits)?;
        return Ok(summary_plan(
            split,
            messages,
            &fingerprints,
            Cleared::default(),
        ));
    }
    // The rows as stored (the commit compares their chars), then the history as the
    // clearing leaves it, the originals kept aside for the removed part's tokens.
    let stored_chars: Vec<i64> = messages.iter().map(|m| m.chars).collect();
    let mut rows = Vec::with_capacity(clearing.cleared.len());
    let mut originals = Vec::with_capacity(clearing.cleared.len());
    for c in &clearing.cleared {
        let m = &mut messages[c.index];
        rows.push(ClearedRow {
            seq: m.seq,
            chars: m.chars,
            fingerprint: fingerprints.get(c.index).cloned().unwrap_or_default(),
            placeholder: c.placeholder.clone(),
            saved: c.saved,
        });
        originals.push((
            c.index,
            std::mem::replace(&mut m.content, c.placeholder.clone()),
        ));
        m.chars -= c.saved;
    }
    let split = match planner::plan(&messages, limits) {
        Ok(split) if session_chars - clearing.saved() > limits.threshold_chars => split,
        // At the threshold or below once cleared, or no summary to plan: the clearing
        // is the compaction.
        _ => {
            return Ok(Plan {
                old: Vec::new().into(),
                context: Vec::new(),
                session_chars,
                chars_removed: 0,
                messages_kept: messages.len() as i64,
                cut_seq: i64::MIN,
                removed_seqs: Vec::new(),
                kept_seqs: Vec::new(),
                removed_chars: Vec::new(),
                removed_fingerprints: Vec::new(),
                tokens_removed: 0,
                model: None,
                instructions: None,
                cleared: rows,
                summarized: false,
            });
        }
    };
    // A result in the old part goes with it (archived whole, as removed: a tool result
    // is never a system message, so it is removed exactly when it is before the cut);
    // one in the kept part is cleared in place.
    let (removed_originals, _): (Vec<_>, Vec<_>) =
        originals.into_iter().partition(|(i, _)| *i < split.cut);
    let in_place = rows
        .into_iter()
        .zip(&clearing.cleared)
        .filter(|(_, c)| c.index >= split.cut)
        .map(|(row, _)| row)
        .collect();
    let cleared = Cleared {
        in_place,
        stored_chars: Some(&stored_chars),
        removed_originals,
    };
    let mut plan = summary_plan(split, messages, &fingerprints, cleared);
    plan.session_chars = session_chars;
    Ok(plan)
}

/// What a clearing changed of a history the summary's split was planned on.
#[derive(Default)]
struct Cleared<'a> {
    /// The results cleared in place, in the kept part.
    in_place: Vec<ClearedRow>,
    /// Every row's chars as stored, when some were cleared.
    stored_chars: Option<&'a [i64]>,
    /// The original content of the cleared results the old part removes, by index.
    removed_originals: Vec<(usize, String)>,
}

/// The summary's plan for `split` of `messages` (as cleared, when `cleared` says so).
fn summary_plan(
    split: planner::Split,
    messages: Vec<Message>,
    fingerprints: &[String],
    cleared: Cleared<'_>,
) -> Plan {
    let removed_seqs = split.removed(&messages).map(|m| m.seq).collect();
    let kept_seqs = split.kept.iter().map(|&i| messages[i].seq).collect();
    let removed_chars: Vec<i64> = match cleared.stored_chars {
        Some(stored) => split.removed.iter().map(|&i| stored[i]).collect(),
        None => split.removed(&messages).map(|m| m.chars).collect(),
    };
    let removed_fingerprints = (split.removed.iter())
        .filter_map(|&i| fingerprints.get(i).cloned())
        .collect();
    // What leaves the context is the cleared results' own text, not their placeholders.
    let tokens_removed = removed_tokens(split.removed(&messages))
        + (cleared.removed_originals.iter())
            .map(|(i, original)| {
                i64::try_from(tokens::count(original)).unwrap_or(i64::MAX)
                    - i64::try_from(tokens::count(&messages[*i].content)).unwrap_or(0)
            })
            .sum::<i64>();
    Plan {
        tokens_removed,
        removed_fingerprints,
        session_chars: messages.iter().map(|m| m.chars).sum(),
        chars_removed: removed_chars.iter().sum(),
        messages_kept: split.messages_kept(&messages) as i64,
        cut_seq: messages[split.cut].seq,
        context: (messages[..split.cut].iter())
            .filter(|m| m.role == Role::System)
            .cloned()
            .collect(),
        removed_seqs,
        kept_seqs,
        removed_chars,
        old: take_removed(messages, &split.removed).into(),
        model: None,
        instructions: None,
        cleared: cleared.in_place,
        summarized: true,
    }
}

/// The tokens of the removed messages' content and tool calls: what `chars` measures
/// (docs/protocol.md, "The schema"), in `o200k_base` tokens, for the usage event.
fn removed_tokens<'a>(removed: impl Iterator<Item = &'a Message>) -> i64 {
    let tokens: usize = removed
        .map(|m| {
            let calls = m.tool_calls.as_ref().map_or(0, |c| match c {
                serde_json::Value::String(text) => tokens::count(text),
                other => tokens::count(&other.to_string()),
            });
            tokens::count(&m.content) + calls
        })
        .sum();
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

/// Moves the removed messages out of `messages`, oldest first.
fn take_removed(messages: Vec<Message>, removed: &[usize]) -> Vec<Message> {
    let mut next = removed.iter().peekable();
    messages
        .into_iter()
        .enumerate()
        .filter(|(i, _)| next.next_if_eq(&i).is_some())
        .map(|(_, m)| m)
        .collect()
}

fn llm_failure(rid: &str, detail: String) -> Outcome {
    tracing::warn!("[{rid}] summarizer: LLM failed, session unchanged: {detail}");
    Outcome::Failed {
        reason: Reason::LlmError,
        detail,
    }
}

fn lease_not_released(rid: &str, error: &dyn std::error::Error) {
    tracing::warn!(
        "[{rid}] could not release the lease; it will expire: {}",
        crate::error_chain(error)
    );
}

/// The text a panic was raised with, when it was a string.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_owned(), |text| (*text).to_owned()),
    }
}

fn store_failure(event: &Event, doing: &str, error: &dyn std::error::Error) -> Outcome {
    let detail = format!("{doing}: {}", crate::error_chain(error));
    tracing::error!(
        "[{}] summarizer: store failed, session unchanged: {detail}",
        event.request_id
    );
    Outcome::Failed {
        reason: Reason::StoreError,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recall_note_names_the_seqs_unless_it_would_not_fit() {
        let summary = "**Investigating:** x".to_owned();
        let noted = with_recall_note(summary.clone(), &[4, 5, 9], 10_000, 6_000);
        assert!(noted.starts_with(&format!("{summary}\n\n{RECALL_NOTE_START}")));
        assert!(noted.contains("the 3 messages this summary replaced (seq 4 to 9)"));
        let chars = noted.chars().count() as i64;
        // At exactly SUMMARY_MAX_CHARS it fits; a char less and the summary goes alone,
        // as it does when the note would make it as long as what it replaced.
        assert_eq!(
            with_recall_note(summary.clone(), &[4, 5, 9], 10_000, chars),
            noted
        );
        assert_eq!(
            with_recall_note(summary.clone(), &[4, 5, 9], 10_000, chars - 1),
            summary
        );
        assert_eq!(
            with_recall_note(summary.clone(), &[4, 5, 9], chars, 6_000),
            summary
        );
        assert_eq!(
            with_recall_note(summary.clone(), &[], 10_000, 6_000),
            summary
        );
    }
}

//! One turn-starting event, start to finish: [`Worker::process`] is the step the NATS
//! loop calls and the tests call directly.
//!
//! The order is chosen so the common case is cheap and nothing is held across the LLM
//! call: read the counters and the session's settings (one primary-key read), decide
//! what to do from them, the policy and the request alone ([`decide`], no I/O), then,
//! when it is to compact (`compact`): take the lease, load and plan, summarize with no
//! connection held, check the summary's facts (`facts`: perhaps asking once more), and
//! commit in one fenced transaction.
//!
//! With `SUMMARIZATION_PRECOMPUTE_AT` set, a session nearing its threshold is summarized
//! in the background (`precompute`), and the turn that crosses the threshold only
//! applies that summary: one database call instead of an LLM call.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Bounds, FactCheck, Idle, Limits, Precompute, ToolOutputs};
use crate::metrics::Metrics;
use crate::outcome::{Compaction, Outcome, Reason};
use crate::overrides::{self, Overrides};
use crate::protocol::Instructions;
use crate::store::{Applied, CounterReader, Counters, SharedStore};
use crate::summarizer::Summarizer;

mod compact;
mod facts;
mod idle;
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
    /// `SUMMARY_USER_WORDS_CHARS`: the user's words quoted after each summary.
    pub user_words_chars: usize,
    /// `SUMMARY_FACT_CHECK` and `SUMMARY_MIN_FACT_RECALL`.
    pub fact_check: FactCheck,
    /// `LLM_DEADLINE_MS`: the fact check's second attempt at a summary must end within
    /// it too, counted from the first's start (see `Worker::retry_deadline`).
    pub llm_deadline: Duration,
    /// `WORKER_CONCURRENCY`: precomputes give way when half of it is compacting.
    pub concurrency: usize,
    /// `SUMMARIZATION_PRECOMPUTE_AT` and its bounds.
    pub precompute: Precompute,
    /// `SUMMARIZATION_IDLE_AFTER_MS` and `SUMMARIZATION_IDLE_THRESHOLD_CHARS`.
    pub idle: Idle,
    /// `REDACT_SECRETS`: what the summarizer sees and the summary written have their
    /// secrets replaced (see [`crate::redact`]).
    pub redact_secrets: bool,
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
    /// An idle pass's, not an agent's (`SUMMARIZATION_IDLE_AFTER_MS`): the session is
    /// compacted over its idle threshold, and nobody waits for the answer.
    pub idle: bool,
}

impl Event {
    pub fn new(session_id: String, request_id: Option<String>) -> Self {
        Self {
            session_id,
            request_id: request_id.unwrap_or_else(new_request_id),
            overrides: Overrides::default(),
            instructions: None,
            job_id: None,
            idle: false,
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
    /// `TOOL_OUTPUT_MAX_CHARS`: tool results larger than this are evicted whatever the
    /// rest of the job does; 0 is off.
    evict_over: i64,
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
    /// The keep the event ran with, once the session was read and not disabled.
    pub keep_chars: Option<i64>,
    pub duration: Duration,
}

/// What the counters read told of the session, for the reply.
#[derive(Clone, Copy, Debug)]
struct Checked {
    session_chars: i64,
    /// The compaction in force (`sessions.last_compaction_id`).
    latest_compaction_id: Option<i64>,
    /// The keep the event's limits gave.
    keep_chars: Option<i64>,
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

/// What to do with an event, worked out from the policy, the session's counters and the
/// request alone: [`decide`].
#[derive(Debug, PartialEq, Eq)]
struct Decision {
    /// What to answer, or to do before answering.
    action: Action,
    /// The keep the event's limits gave (`None` for a disabled session, which has none).
    keep_chars: Option<i64>,
    /// A summary to prepare in the background (`SUMMARIZATION_PRECOMPUTE_AT`), whatever
    /// the answer: the session is below its threshold and nearing it.
    precompute: Option<Job>,
}

#[derive(Debug, PartialEq, Eq)]
enum Action {
    Skip(Reason),
    /// Compact with `job`: from the session's pending summary first when `pending_first`
    /// (if it has one that still fits), else afresh.
    Compact {
        job: Job,
        pending_first: bool,
    },
}

/// What `event` asks of a session with `counters`, under `policy` (clearing configured
/// as `tool_outputs`). The rules, in order: a disabled session is skipped; one at or
/// below its threshold is skipped unless the request forces it; then one with fewer
/// than two human turns (unless its compaction clears tool output first: one long first
/// turn of tool output is where that helps most), one backing off after an LLM failure,
/// or one whose very history the planner refused with this keep before (no lease, no
/// load) is skipped. The same rules but the threshold decide whether a session below it
/// is worth a precompute. A forced or instructed compaction writes its own summary: a
/// pending one was written without the instructions, and for another threshold. An idle
/// pass's event has the session's idle threshold for its threshold
/// ([`Idle::threshold`]), and neither applies nor prepares a pending summary (one is
/// prepared for the turn's threshold).
fn decide(
    policy: &Policy,
    tool_outputs: &ToolOutputs,
    counters: &Counters,
    event: &Event,
) -> Decision {
    if counters.settings.disabled() {
        return Decision {
            action: Action::Skip(Reason::Disabled),
            keep_chars: None,
            precompute: None,
        };
    }
    let request = event.overrides;
    let mut limits = overrides::for_event(
        (policy.limits, policy.threshold_tokens),
        policy.bounds,
        &counters.settings,
        request,
        (counters.total_chars, counters.chars_per_token),
    );
    if event.idle {
        limits.threshold_chars = (policy.idle).threshold(limits.threshold_chars, limits.keep_chars);
    }
    let clearing = overrides::clearing(tool_outputs, &counters.settings, request);
    let forced = request.force;
    let evict_over = tool_outputs.max_chars;
    // A tool output too large to keep is evicted by the next turn, over the threshold or
    // not: the counters say when the session may hold one.
    let evicting = evict_over > 0 && counters.largest_output_chars > evict_over;
    let below = !forced && !evicting && counters.total_chars <= limits.threshold_chars;
    let blocked = if counters.human_turns < 2 && clearing.is_none() && !evicting {
        Some(Reason::TooFewTurns)
    } else if counters.backing_off {
        Some(Reason::BackingOff)
    } else {
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
        evict_over,
        instructions: event.instructions.clone(),
    };
    // A session whose compactions clear first is not precomputed: its next compaction
    // may need no summary at all.
    let precompute = (below
        && !event.idle
        && clearing.is_none()
        && blocked.is_none()
        && (policy.precompute).wanted(counters.total_chars, limits.threshold_chars))
    .then(|| job.clone());
    let action = match (below, blocked) {
        (true, _) => Action::Skip(Reason::BelowThreshold),
        (false, Some(reason)) => Action::Skip(reason),
        (false, None) => Action::Compact {
            pending_first: policy.precompute.enabled()
                && job.clearing.is_none()
                && !job.forced
                && !evicting
                && !event.idle
                && job.instructions.is_none(),
            job,
        },
    };
    Decision {
        action,
        keep_chars: Some(limits.keep_chars),
        precompute,
    }
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

    /// Whether what it derives, recall replies included, has its secrets redacted
    /// (`REDACT_SECRETS`).
    pub fn redacts_secrets(&self) -> bool {
        self.policy.redact_secrets
    }

    /// Answers one event. The cheap part (the counters) runs on the caller's task; a
    /// compaction runs as a task of its own (see `Worker::compact_in_task`).
    pub async fn process(self: &Arc<Self>, event: &Event) -> Processed {
        let started = Instant::now();
        let (outcome, checked, precomputed) = self.decide(event).await;
        let duration = started.elapsed();
        // What an agent waited: an idle pass's compaction kept no one waiting.
        if matches!(outcome, Outcome::Compacted(_)) && !event.idle {
            self.metrics
                .compaction_turn_took(precomputed, duration.as_secs_f64());
        }
        if event.overrides.overflow {
            self.metrics.overflow(outcome.reason());
        }
        Processed {
            keep_chars: checked.and_then(|c| c.keep_chars),
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
            // Still fired: an idle session being decided starts no compaction after this.
            self.abandon.cancel();
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
        let decision = decide(&self.policy, &self.tool_outputs, &counters, event);
        let checked = Some(Checked {
            session_chars: counters.total_chars,
            latest_compaction_id: counters.last_compaction_id,
            keep_chars: decision.keep_chars,
        });
        if let Some(job) = decision.precompute {
            // In the background: the reply goes out now.
            self.start_precompute(event, job);
        }
        let (job, pending_first) = match decision.action {
            Action::Skip(reason) => return (Outcome::Skipped(reason), checked, false),
            Action::Compact { job, pending_first } => (job, pending_first),
        };
        if pending_first && let Some(decided) = self.apply_pending(event, &job).await {
            return match decided {
                Decided::Done(outcome) => (outcome, checked, false),
                Decided::Precomputed(outcome) => (outcome, checked, true),
            };
        }
        // Boxed: the compaction's state machine is kilobytes, and kept inline it made every
        // event's future that large, no-op or not (memmove topped the worker's profile).
        (
            Box::pin(self.compact_in_task(event, job)).await,
            checked,
            false,
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
}

/// How [`Worker::apply_pending`] answered.
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
mod tests;

//! Prometheus metrics, served as OpenMetrics text on `GET /metrics`.
//!
//! `prometheus-client` (the Prometheus project's own Rust client) rather than the
//! `metrics` facade: an explicit registry owned by the worker, no global recorder, so two
//! workers in one test process keep separate figures. Labels stay low-cardinality: status,
//! reason and cause, never a session or request id.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::fact_check::RetryOutcome;
use crate::outcome::{Outcome, Reason};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    status: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrecomputedLabels {
    precomputed: &'static str,
}

type TurnHistograms = Family<PrecomputedLabels, Histogram, fn() -> Histogram>;

/// 1 ms to about 33 s: a commit to an LLM call with retries, as the agent waits for it.
fn turn_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Recall is a fraction, and what matters is near the top: did a summary keep 80%, 90%,
/// all of the facts.
const RECALL_BUCKETS: [f64; 9] = [0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0];

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    events: Family<EventLabels, Counter>,
    compaction_seconds: Histogram,
    llm_seconds: Histogram,
    llm_retries: Counter,
    llm_requests: Counter,
    llm_tokens: Family<KindLabels, Counter>,
    llm_failures: Family<CauseLabels, Counter>,
    chars_compacted: Counter,
    clearings: Counter,
    tool_outputs_cleared: Counter,
    chars_cleared: Counter,
    fact_recall: Histogram,
    fact_retries: Family<OutcomeLabels, Counter>,
    answers_refused: Family<RuleLabels, Counter>,
    precomputes_started: Counter,
    precomputes_finished: Family<OutcomeLabels, Counter>,
    precomputes_used: Counter,
    precomputes_discarded: Family<ReasonLabels, Counter>,
    compaction_turn_seconds: TurnHistograms,
    jobs: Family<OutcomeLabels, Counter>,
    job_redeliveries: Counter,
    dead_letters: Counter,
    recalls: Family<OutcomeLabels, Counter>,
    overflows: Family<ReasonLabels, Counter>,
    idle_sessions: Family<EventLabels, Counter>,
    in_flight: Gauge,
    lease_conflicts: Counter,
    pool_connections: Gauge,
    pool_idle: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Metrics {
    /// The registry, with `concurrency` as the in-flight limit it reports.
    pub fn new(concurrency: usize) -> Self {
        let mut registry = Registry::with_prefix("summarizer");
        let events = Family::<EventLabels, Counter>::default();
        // 5 ms to about 160 s: commits alone to slow LLMs with retries.
        let compaction_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        let llm_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        let llm_retries = Counter::default();
        let llm_requests = Counter::default();
        let llm_tokens = Family::<KindLabels, Counter>::default();
        let llm_failures = Family::<CauseLabels, Counter>::default();
        let chars_compacted = Counter::default();
        let clearings = Counter::default();
        let tool_outputs_cleared = Counter::default();
        let chars_cleared = Counter::default();
        let fact_recall = Histogram::new(RECALL_BUCKETS);
        let fact_retries = Family::<OutcomeLabels, Counter>::default();
        let answers_refused = Family::<RuleLabels, Counter>::default();
        let precomputes_started = Counter::default();
        let precomputes_finished = Family::<OutcomeLabels, Counter>::default();
        let precomputes_used = Counter::default();
        let precomputes_discarded = Family::<ReasonLabels, Counter>::default();
        let compaction_turn_seconds = TurnHistograms::new_with_constructor(turn_histogram);
        let jobs = Family::<OutcomeLabels, Counter>::default();
        let job_redeliveries = Counter::default();
        let dead_letters = Counter::default();
        let recalls = Family::<OutcomeLabels, Counter>::default();
        let overflows = Family::<ReasonLabels, Counter>::default();
        let idle_sessions = Family::<EventLabels, Counter>::default();
        let in_flight: Gauge = Gauge::default();
        let limit: Gauge = Gauge::default();
        limit.set(i64::try_from(concurrency).unwrap_or(i64::MAX));
        let lease_conflicts = Counter::default();
        let pool_connections: Gauge = Gauge::default();
        let pool_idle: Gauge = Gauge::default();
        let r = &mut registry;
        r.register(
            "events",
            "Turn-starting events answered, by status and reason",
            events.clone(),
        );
        r.register(
            "compaction_duration_seconds",
            "Time from taking the lease to the commit of a compaction",
            compaction_seconds.clone(),
        );
        r.register(
            "llm_duration_seconds",
            "Time of one summarization call, retries included",
            llm_seconds.clone(),
        );
        r.register(
            "llm_retries",
            "LLM attempts retried after a transient failure",
            llm_retries.clone(),
        );
        r.register(
            "llm_requests",
            "Requests sent to the LLM provider, retries included, answered or not",
            llm_requests.clone(),
        );
        r.register(
            "llm_tokens",
            "Tokens the LLM provider reported, by kind: prompt, completion, and \
             cached_prompt (the part of prompt read from its prompt cache)",
            llm_tokens.clone(),
        );
        r.register(
            "llm_failures",
            "Summarizations that failed, by cause",
            llm_failures.clone(),
        );
        r.register(
            "chars_compacted",
            "Characters removed from histories by compactions",
            chars_compacted.clone(),
        );
        r.register(
            "clearings",
            "Compactions that cleared old tool output (TOOL_OUTPUT_CLEARING), with or without a summary",
            clearings.clone(),
        );
        r.register(
            "tool_outputs_cleared",
            "Tool results whose content a compaction replaced with a placeholder",
            tool_outputs_cleared.clone(),
        );
        r.register(
            "chars_cleared",
            "Characters saved by clearing tool output",
            chars_cleared.clone(),
        );
        r.register(
            "fact_recall",
            "Share of the removed part's identifiers each written summary kept",
            fact_recall.clone(),
        );
        r.register(
            "fact_retries",
            "Second attempts at a summary that lost identifiers, by outcome",
            fact_retries.clone(),
        );
        r.register(
            "answers_refused",
            "LLM answers not written as a summary, by the rule they broke (docs/compaction.md, \"The acceptance gate\")",
            answers_refused.clone(),
        );
        r.register(
            "precomputes_started",
            "Summaries prepared in the background before the threshold (SUMMARIZATION_PRECOMPUTE_AT)",
            precomputes_started.clone(),
        );
        r.register(
            "precomputes_finished",
            "Background precomputes that ended, by outcome: saved, failed, not_planned, lease_lost",
            precomputes_finished.clone(),
        );
        r.register(
            "precomputes_used",
            "Compactions written from a pending summary at the turn that crossed the threshold",
            precomputes_used.clone(),
        );
        r.register(
            "precomputes_discarded",
            "Pending summaries dropped unused (their LLM call wasted), by reason",
            precomputes_discarded.clone(),
        );
        r.register(
            "compaction_turn_duration_seconds",
            "What the agent waited at a turn that compacted, with and without a pending summary",
            compaction_turn_seconds.clone(),
        );
        r.register(
            "jobs",
            "JetStream jobs settled, by outcome: acked, nacked, terminated, dead_lettered",
            jobs.clone(),
        );
        r.register(
            "job_redeliveries",
            "JetStream jobs delivered again (after a nak, an ack wait or a worker's death)",
            job_redeliveries.clone(),
        );
        r.register(
            "dead_letters",
            "JetStream jobs moved to the dead_letters table after JETSTREAM_MAX_DELIVER deliveries",
            dead_letters.clone(),
        );
        r.register(
            "recalls",
            "Recall requests answered, by outcome: ok, rejected, failed",
            recalls.clone(),
        );
        r.register(
            "overflow_requests",
            "Compactions asked for because the agent's model refused a call as too long \
             (\"overflow\": true), by the reason answered",
            overflows.clone(),
        );
        r.register(
            "idle_sessions",
            "Sessions an idle pass took (SUMMARIZATION_IDLE_AFTER_MS), by what it did with \
             them: compacted, or skipped and why",
            idle_sessions.clone(),
        );
        r.register(
            "events_in_flight",
            "Events being processed now",
            in_flight.clone(),
        );
        r.register(
            "events_in_flight_limit",
            "WORKER_CONCURRENCY: the most events in flight at once",
            limit,
        );
        r.register(
            "lease_conflicts",
            "Events that found the session leased by another worker (busy)",
            lease_conflicts.clone(),
        );
        r.register(
            "db_pool_connections",
            "Open connections in the database pool",
            pool_connections.clone(),
        );
        r.register(
            "db_pool_idle_connections",
            "Idle connections in the database pool",
            pool_idle.clone(),
        );
        Self {
            registry,
            events,
            compaction_seconds,
            llm_seconds,
            llm_retries,
            llm_requests,
            llm_tokens,
            llm_failures,
            chars_compacted,
            clearings,
            tool_outputs_cleared,
            chars_cleared,
            fact_recall,
            fact_retries,
            answers_refused,
            precomputes_started,
            precomputes_finished,
            precomputes_used,
            precomputes_discarded,
            compaction_turn_seconds,
            jobs,
            job_redeliveries,
            dead_letters,
            recalls,
            overflows,
            idle_sessions,
            in_flight,
            lease_conflicts,
            pool_connections,
            pool_idle,
        }
    }

    /// Counts an answered event.
    pub fn event(&self, outcome: &Outcome) {
        let labels = EventLabels {
            status: outcome.status().as_str(),
            reason: outcome.reason().as_str(),
        };
        self.events.get_or_create(&labels).inc();
        match outcome {
            Outcome::Compacted(c) => {
                self.chars_compacted
                    .inc_by(u64::try_from(c.chars_removed).unwrap_or(0));
            }
            Outcome::Busy => {
                self.lease_conflicts.inc();
            }
            _ => {}
        }
    }

    pub fn compaction_took(&self, seconds: f64) {
        self.compaction_seconds.observe(seconds);
    }

    pub fn llm_took(&self, seconds: f64) {
        self.llm_seconds.observe(seconds);
    }

    /// A request to the LLM provider is on its way.
    pub fn llm_requested(&self) {
        self.llm_requests.inc();
    }

    /// An answer's usage, as the provider reported it, each figure at most
    /// [`MAX_RECORDED_TOKENS`](crate::usage::MAX_RECORDED_TOKENS): a provider reporting
    /// nonsense cannot wrap a counter around.
    pub fn llm_answered(&self, usage: crate::usage::Reported) {
        for (kind, tokens) in [
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
            ("cached_prompt", usage.cached_prompt_tokens),
        ] {
            let tokens = tokens.map(|t| t.min(crate::usage::MAX_RECORDED_TOKENS));
            if let Some(tokens) = tokens.and_then(|t| u64::try_from(t).ok()) {
                self.llm_tokens
                    .get_or_create(&KindLabels { kind })
                    .inc_by(tokens);
            }
        }
    }

    pub fn llm_retried(&self) {
        self.llm_retries.inc();
    }

    /// `cause`: `transient` (retries exhausted), `rejected` (4xx), `invalid_response`,
    /// `invalid_summary` (failed the template check).
    pub fn llm_failed(&self, cause: &'static str) {
        self.llm_failures
            .get_or_create(&CauseLabels { cause })
            .inc();
    }

    /// The recall of a written summary whose old part had facts.
    pub fn fact_recall(&self, ratio: f64) {
        self.fact_recall.observe(ratio);
    }

    /// Counts a second attempt at a summary that lost identifiers, by how it went.
    pub fn fact_retried(&self, outcome: RetryOutcome) {
        self.fact_retries
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Counts an LLM answer the acceptance gate refused, by the rule it broke.
    pub fn answer_refused(&self, rule: &'static str) {
        self.answers_refused
            .get_or_create(&RuleLabels { rule })
            .inc();
    }

    pub fn precompute_started(&self) {
        self.precomputes_started.inc();
    }

    /// `outcome`: `saved`, `failed`, `not_planned`, `lease_lost`.
    pub fn precompute_finished(&self, outcome: &'static str) {
        self.precomputes_finished
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// A compaction cleared `outputs` tool results, saving `chars`.
    pub fn cleared(&self, outputs: usize, chars: i64) {
        self.clearings.inc();
        self.tool_outputs_cleared.inc_by(outputs as u64);
        self.chars_cleared.inc_by(u64::try_from(chars).unwrap_or(0));
    }

    pub fn precompute_used(&self) {
        self.precomputes_used.inc();
    }

    /// `n` pending summaries dropped unused for `reason` (see `store::Discard`).
    pub fn precomputes_discarded(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.precomputes_discarded
                .get_or_create(&ReasonLabels { reason })
                .inc_by(n);
        }
    }

    /// What the agent waited, the event's whole processing, at a turn that compacted.
    pub fn compaction_turn_took(&self, precomputed: bool, seconds: f64) {
        let precomputed = if precomputed { "true" } else { "false" };
        self.compaction_turn_seconds
            .get_or_create(&PrecomputedLabels { precomputed })
            .observe(seconds);
    }

    /// A job settled: `acked`, `nacked`, `terminated` or `dead_lettered`.
    pub fn job(&self, outcome: &'static str) {
        self.jobs.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn job_redelivered(&self) {
        self.job_redeliveries.inc();
    }

    pub fn dead_lettered(&self) {
        self.dead_letters.inc();
    }

    /// A recall request answered: `ok`, `rejected` or `failed`.
    pub fn recalled(&self, outcome: &'static str) {
        self.recalls.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// A compaction asked for after a context overflow, answered with `reason`.
    pub fn overflow(&self, reason: Reason) {
        let reason = reason.as_str();
        self.overflows.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// A session an idle pass took, and what it did with it.
    pub fn idle_session(&self, outcome: &Outcome) {
        let labels = EventLabels {
            status: outcome.status().as_str(),
            reason: outcome.reason().as_str(),
        };
        self.idle_sessions.get_or_create(&labels).inc();
    }

    /// Sessions an idle pass left as they were, idle for too long to be worth it.
    pub fn idle_sessions_given_up(&self, n: u64) {
        let labels = EventLabels {
            status: "skipped",
            reason: "stale",
        };
        self.idle_sessions.get_or_create(&labels).inc_by(n);
    }

    /// Marks an event in flight until the guard drops.
    pub fn in_flight(&self) -> InFlightGuard<'_> {
        self.in_flight.inc();
        InFlightGuard(&self.in_flight)
    }

    /// The registry as OpenMetrics text, with the pool's figures read now.
    pub fn render(&self, (open, idle): (u32, usize)) -> String {
        self.pool_connections.set(i64::from(open));
        self.pool_idle.set(i64::try_from(idle).unwrap_or(i64::MAX));
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

pub struct InFlightGuard<'a>(&'a Gauge);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

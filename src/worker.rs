//! One turn-starting event, start to finish: [`Worker::process`] is the step the NATS
//! loop calls and the tests call directly.
//!
//! The order is chosen so the common case is cheap and nothing is held across the LLM
//! call: read the counters (one primary-key read), take the lease, load and plan,
//! summarize with no connection held, then commit in one fenced transaction.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Limits;
use crate::llm::{LlmError, Summarizer};
use crate::message::{Message, char_count};
use crate::metrics::Metrics;
use crate::outcome::{Compaction, Outcome, Reason};
use crate::planner;
use crate::store::{CommitError, CounterReader, Loaded, NewSummary, PgStore};
use crate::summary;

/// What a worker needs to know of the settings.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub enabled: bool,
    pub limits: Limits,
    pub lease_duration: Duration,
    pub failure_backoff: Duration,
    pub failure_backoff_max: Duration,
}

/// A validated event.
#[derive(Clone, Debug)]
pub struct Event {
    pub session_id: String,
    /// The sender's id, or one made up for the logs: 8 hex digits.
    pub request_id: String,
}

impl Event {
    pub fn new(session_id: String, request_id: Option<String>) -> Self {
        Self {
            session_id,
            request_id: request_id.unwrap_or_else(new_request_id),
        }
    }
}

pub fn new_request_id() -> String {
    format!("{:08x}", fastrand::u32(..))
}

/// The outcome of one event and what the reply reports beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processed {
    pub outcome: Outcome,
    /// The session's size when it was checked; `None` when it was not read.
    pub session_chars: Option<i64>,
    pub duration: Duration,
}

pub struct Worker {
    store: PgStore,
    metrics: Arc<Metrics>,
    counters: CounterReader,
    summarizer: Arc<dyn Summarizer>,
    policy: Policy,
    /// Distinguishes this process's leases from other workers' in `sessions.lease_owner`.
    id: String,
}

impl Worker {
    /// Starts the worker's batching task: call it inside the runtime.
    pub fn new(
        store: PgStore,
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
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub async fn process(&self, event: &Event) -> Processed {
        let started = Instant::now();
        let (outcome, session_chars) = self.decide(event).await;
        Processed {
            outcome,
            session_chars,
            duration: started.elapsed(),
        }
    }

    async fn decide(&self, event: &Event) -> (Outcome, Option<i64>) {
        if !self.policy.enabled {
            return (Outcome::Skipped(Reason::Disabled), None);
        }
        let counters = match self.counters.counters(&event.session_id).await {
            Ok(Some(counters)) => counters,
            Ok(None) => return (Outcome::Skipped(Reason::UnknownSession), None),
            Err(e) => return (store_failure(event, "reading the session", &e), None),
        };
        let chars = Some(counters.total_chars);
        if counters.total_chars <= self.policy.limits.threshold_chars {
            return (Outcome::Skipped(Reason::BelowThreshold), chars);
        }
        if counters.human_turns < 2 {
            return (Outcome::Skipped(Reason::TooFewTurns), chars);
        }
        if counters.backing_off {
            return (Outcome::Skipped(Reason::BackingOff), chars);
        }
        // The planner refused this very history before: no lease, no load.
        if let Some(reason) = counters.remembered_skip {
            return (Outcome::Skipped(reason), chars);
        }

        // Boxed: the compaction's state machine is kilobytes, and kept inline it made every
        // event's future that large, no-op or not (memmove topped the worker's profile).
        (Box::pin(self.lease_and_compact(event)).await, chars)
    }

    /// Takes the lease (loading the messages with it), compacts, and gives the lease back
    /// unless the commit did.
    async fn lease_and_compact(&self, event: &Event) -> Outcome {
        let started = Instant::now();
        let owner = format!("{}/{}", self.id, event.request_id);
        let loaded = match self
            .store
            .take_lease_and_load(&event.session_id, &owner, self.policy.lease_duration)
            .await
        {
            Ok(Some(loaded)) => loaded,
            Ok(None) => return Outcome::Busy,
            Err(e) => return store_failure(event, "taking the lease", &e),
        };
        let counted = loaded.counted();
        let outcome = self.compact(event, &owner, loaded).await;
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
            } => {
                self.store
                    .record_failure(
                        &event.session_id,
                        &owner,
                        self.policy.failure_backoff,
                        self.policy.failure_backoff_max,
                    )
                    .await
            }
            Outcome::Skipped(reason) => {
                self.store
                    .release_lease_remembering(&event.session_id, &owner, *reason, counted)
                    .await
            }
            _ => self.store.release_lease(&event.session_id, &owner).await,
        };
        if let Err(e) = released {
            tracing::warn!(
                "[{}] could not release the lease; it will expire: {}",
                event.request_id,
                crate::error_chain(&e)
            );
        }
        outcome
    }

    /// Plans, summarizes and commits the loaded history, holding the lease.
    async fn compact(&self, event: &Event, owner: &str, loaded: Loaded) -> Outcome {
        let started = Instant::now();
        let rid = &event.request_id;
        let Loaded {
            messages,
            fingerprints,
        } = loaded;
        let split = match planner::plan(&messages, self.policy.limits) {
            Ok(split) => split,
            Err(reason) => return Outcome::Skipped(reason),
        };
        let total: i64 = messages.iter().map(|m| m.chars).sum();
        let chars_removed = split.chars_removed(&messages);
        let messages_kept = split.messages_kept(&messages) as i64;
        let cut_seq = messages[split.cut].seq;
        let (removed_seqs, removed_chars) =
            split.removed(&messages).map(|m| (m.seq, m.chars)).unzip();
        let removed_fingerprints = (split.removed.iter())
            .filter_map(|&i| fingerprints.get(i).cloned())
            .collect();
        tracing::info!(
            "[{rid}] summarizer: session={total} chars, removing {} msgs ({chars_removed} chars), keeping {messages_kept} msgs",
            split.removed.len()
        );
        let old = take_removed(messages, &split.removed);

        let asked = Instant::now();
        let summarized = self.summarizer.summarize(&old).await;
        self.metrics.llm_took(asked.elapsed().as_secs_f64());
        let summary = match summarized {
            Ok(summary) => summary,
            Err(e) => {
                self.metrics.llm_failed(match e {
                    LlmError::Transient { .. } => "transient",
                    LlmError::Rejected { .. } => "rejected",
                    LlmError::Invalid(_) => "invalid_response",
                });
                return llm_failure(rid, e.to_string());
            }
        };
        let text = match summary::check(&summary.text, chars_removed) {
            Ok(text) => text,
            Err(e) => {
                self.metrics.llm_failed("invalid_summary");
                return llm_failure(rid, e.to_string());
            }
        };
        let new = NewSummary {
            session_id: &event.session_id,
            lease_owner: owner,
            cut_seq,
            removed_seqs,
            removed_chars,
            removed_fingerprints,
            text: &text,
            model: &summary.model,
            prompt_tokens: summary.prompt_tokens,
            completion_tokens: summary.completion_tokens,
            messages_kept,
            request_id: rid,
            duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        };
        let compaction_id = match self.store.commit(&new).await {
            Ok(id) => id,
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
        let summary_chars = char_count(&text);
        tracing::info!(
            "[{rid}] summarizer done: -{chars_removed} chars, summary {summary_chars} chars, {}ms",
            started.elapsed().as_millis()
        );
        Outcome::Compacted(Compaction {
            compaction_id,
            messages_removed: new.removed_seqs.len() as i64,
            chars_removed,
            messages_kept,
            summary_chars,
        })
    }
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

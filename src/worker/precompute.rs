//! Summaries prepared before the threshold (`SUMMARIZATION_PRECOMPUTE_AT`).
//!
//! A turn that finds its session above `at` x threshold (and below it) is answered
//! `skipped/below_threshold` at once; meanwhile a background task takes the session's
//! lease, plans the split the threshold would produce, summarizes the old part exactly
//! as a compaction would (fact check included) and stores the result in
//! `pending_summaries`, giving the lease back in the same statement. The turn that
//! crosses the threshold applies it (`Worker::apply_pending`).
//!
//! The rules, and why:
//! - **Never on the reply's path.** Starting one is a few atomic operations; everything
//!   else happens in a task of its own, whose failures are logged and counted, never
//!   answered.
//! - **Single flight across the fleet.** It holds the session's lease, the same one a
//!   compaction takes, and does not take it while the session has a fresh pending
//!   summary for the same limits and model: a session is precomputed once per
//!   approach to its threshold, whichever workers its turns reach.
//! - **Bounded, and behind real compactions.** At most `PRECOMPUTE_CONCURRENCY` per
//!   worker; none is started while half of `WORKER_CONCURRENCY` is compacting, and when
//!   none can start the turn is answered all the same (a later turn tries again). A
//!   precompute never makes a compaction wait except for its own session, which
//!   answers `busy` while it runs, as for any lease held.
//! - **An LLM failure backs the session off**, as a compaction's does: without a
//!   backoff every turn in the band would ask a failing provider again.
//! - **Shutdown abandons it**: the lease is given back and nothing is written (the one
//!   statement that writes a pending row is all or nothing).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::Instrument;

use super::compact::{elapsed_ms, plan_with_tokens};
use super::{Event, Job, Worker, panic_message};
use crate::compaction::Record;
use crate::config::Limits;
use crate::outcome::Outcome;

impl Worker {
    /// Starts preparing `event`'s session's summary for `job`, in the background, unless
    /// this worker is already precomputing it, has no precompute to spare, or is busy
    /// compacting.
    pub(super) fn start_precompute(self: &Arc<Self>, event: &Event, job: Job) {
        if self.abandon.is_cancelled() || self.tasks.is_closed() {
            return;
        }
        let busy_compacting = self.compacting.load(Ordering::Relaxed);
        if busy_compacting * 2 >= self.policy.concurrency {
            return;
        }
        {
            let mut running = self
                .precomputing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if running.len() >= self.policy.precompute.concurrency
                || !running.insert(event.session_id.clone())
            {
                return;
            }
        }
        let owner = self.new_lease_owner();
        let (worker, event) = (self.clone(), event.clone());
        self.tasks.spawn(
            async move {
                // A task of its own inside this one, so that a panic is caught here and
                // the lease given back.
                let inner = {
                    let (worker, event, owner) = (worker.clone(), event.clone(), owner.clone());
                    let abandon = worker.abandon.clone();
                    tokio::spawn(
                        async move {
                            tokio::select! {
                                () = worker.precompute(&event, &owner, job) => {}
                                _ = abandon.cancelled() => {
                                    worker.abandoned(&event, &owner).await;
                                }
                            }
                        }
                        .in_current_span(),
                    )
                };
                if let Err(e) = inner.await {
                    let detail = if e.is_panic() {
                        panic_message(e.into_panic())
                    } else {
                        "cancelled".to_owned()
                    };
                    tracing::error!(
                        "[{}] precompute failed, nothing written: {detail}",
                        event.request_id
                    );
                    worker.metrics.precompute_finished("failed");
                    if let Err(e) = worker.release_backing_off(&event, &owner).await {
                        super::lease_not_released(&event.request_id, &e);
                    }
                }
                worker
                    .precomputing
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&event.session_id);
            }
            .in_current_span(),
        );
    }

    /// Takes the lease, plans, summarizes and stores the pending summary.
    async fn precompute(&self, event: &Event, owner: &str, job: Job) {
        let started = Instant::now();
        let rid = &event.request_id;
        let precompute = self.policy.precompute;
        let taken = self
            .store
            .take_lease_for_precompute(
                &event.session_id,
                owner,
                self.policy.lease_duration,
                (job.limits, job.model.as_deref()),
                precompute.ttl,
            )
            .await;
        let loaded = match taken {
            Ok(Some(loaded)) => loaded,
            // Leased elsewhere, or prepared already: nothing to do.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("[{rid}] precompute not started: {}", crate::error_chain(&e));
                return;
            }
        };
        self.metrics.precompute_started();
        let limits = job.limits;
        // The split the threshold would produce: the planner's cut depends on the keep
        // alone, the threshold only gates it, and this session is still below it.
        // A pending summary replaces a prefix and clears nothing (a clearing is written
        // by the turn that compacts).
        let planning = Job {
            limits: Limits {
                threshold_chars: 0,
                ..limits
            },
            evict_over: 0,
            ..job
        };
        let counted = loaded.counted();
        let plan = match plan_with_tokens(loaded, planning, None, self.policy.redact_secrets).await
        {
            Ok(plan) => plan,
            Err(outcome) => {
                tracing::debug!("[{rid}] precompute: nothing to prepare ({outcome:?})");
                self.metrics.precompute_finished("not_planned");
                // A refusal the planner will repeat for this very history (no safe
                // boundary, nothing to compact) is remembered, as a compaction's is: the
                // band's next turns on it take no lease and load nothing.
                let released = match outcome {
                    Outcome::Skipped(reason) => {
                        self.store
                            .release_lease_remembering(
                                &event.session_id,
                                owner,
                                reason,
                                counted,
                                limits.keep_chars,
                            )
                            .await
                    }
                    _ => self.store.release_lease(&event.session_id, owner).await,
                };
                if let Err(e) = released {
                    super::lease_not_released(rid, &e);
                }
                return;
            }
        };
        tracing::info!(
            "[{rid}] precompute: session={} chars, preparing the summary of {} msgs ({} chars)",
            plan.session_chars,
            plan.old.len(),
            plan.chars_removed,
        );
        let written = match self.write_summary(rid, &plan, started).await {
            Ok(written) => written,
            Err(Outcome::Failed { detail, .. }) => {
                tracing::warn!("[{rid}] precompute failed, nothing prepared: {detail}");
                self.metrics.precompute_finished("failed");
                if let Err(e) = self.release_backing_off(event, owner).await {
                    super::lease_not_released(rid, &e);
                }
                return;
            }
            Err(other) => {
                tracing::warn!("[{rid}] precompute: nothing prepared ({other:?})");
                self.metrics.precompute_finished("failed");
                if let Err(e) = self.store.release_lease(&event.session_id, owner).await {
                    super::lease_not_released(rid, &e);
                }
                return;
            }
        };
        let pending = Record::new(
            &plan,
            event.turn(owner),
            Some(&written),
            elapsed_ms(started),
        );
        match self
            .store
            .save_pending(&pending, limits, precompute.ttl)
            .await
        {
            Ok(saved) => {
                let outcome = if saved.saved { "saved" } else { "lease_lost" };
                self.metrics.precompute_finished(outcome);
                self.metrics.precomputes_discarded(
                    crate::store::Discard::Expired.as_str(),
                    u64::try_from(saved.expired).unwrap_or(0),
                );
                if saved.replaced {
                    self.metrics
                        .precomputes_discarded(crate::store::Discard::Superseded.as_str(), 1);
                }
                tracing::info!(
                    "[{rid}] precompute {outcome}: summary {} chars, {}ms",
                    crate::message::char_count(&written.text),
                    started.elapsed().as_millis()
                );
            }
            Err(e) => {
                tracing::warn!(
                    "[{rid}] precompute: the pending summary was not stored: {}",
                    crate::error_chain(&e)
                );
                self.metrics.precompute_finished("failed");
                if let Err(e) = self.store.release_lease(&event.session_id, owner).await {
                    super::lease_not_released(rid, &e);
                }
            }
        }
    }
}

//! Compaction of sessions left idle (`SUMMARIZATION_IDLE_AFTER_MS`; docs/protocol.md,
//! "Idle compaction").
//!
//! A provider's prompt cache lives for minutes: once a session has been idle past it,
//! its next turn pays the full price of its context anyway, so that is when compacting
//! costs the agent nothing. Each worker runs idle passes; a pass takes the sessions idle
//! for `after` out of the schedule the counters' trigger keeps (`sessions.idle_since`,
//! set by every message the agent inserts; [`crate::store::Counts::claim_idle`]) and
//! compacts each over its idle threshold as a turn would, with that threshold
//! ([`crate::config::Idle::threshold`]).
//!
//! The rules, and why:
//! - **Once per idle period, across the fleet.** A claim takes the session out of the
//!   schedule in the statement that reads it; only the agent's next message puts it
//!   back. A compaction's own writes (its summary, its placeholders) are not the agent's
//!   and start no period, nor does a restore. A session claimed by a worker that then
//!   stops waits for its next period.
//! - **Single flight, as any compaction**: it takes the session's lease; a turn that
//!   arrives meanwhile answers `busy`, and one already compacting makes the idle pass
//!   skip (`busy`).
//! - **No scan.** A pass reads the schedule's partial index from its oldest entry and
//!   stops at the first that is not due; a session claimed below its idle threshold
//!   leaves the schedule all the same, so the index holds only sessions written to since
//!   their last pass.
//! - **Bounded, behind the turns.** At most half of `WORKER_CONCURRENCY` idle sessions
//!   at once per worker (at least one); a pass claims only as many as it has free
//!   slots, so that a claimed session starts at once (its agent may come back) and an
//!   idle worker takes what a busy one cannot.
//! - **Not the long abandoned.** A session idle for longer than
//!   [`crate::config::Idle::give_up_after`] leaves the schedule uncompacted: it was
//!   written before the fleet watched (the setting just turned on, or the fleet down).
//! - **Shutdown stops the passes** and abandons their compactions with the others.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{Event, Worker};
use crate::outcome::Outcome;

/// The most sessions claimed per statement: a pass claims again at once while a claim
/// comes back full.
const CLAIM_BATCH: usize = 64;

/// How often a worker looks for idle sessions: a tenth of the idle time, from 100 ms to
/// 5 s. A session is compacted between `after` and `after` + this (+ 1 s, the schedule's
/// resolution) after the agent's last message.
pub(super) fn pass_interval(after: Duration) -> Duration {
    (after / 10).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

impl Worker {
    /// Runs idle passes until `shutdown` fires; returns at once when idle compaction is
    /// off. The compactions it started are the worker's, abandoned with the others at
    /// shutdown (`Worker::abandon_compactions`).
    pub async fn run_idle_passes(self: Arc<Self>, shutdown: CancellationToken) {
        let idle = self.policy.idle;
        if !self.policy.enabled || !idle.enabled() {
            return;
        }
        let slots = Arc::new(Semaphore::new((self.policy.concurrency / 2).max(1)));
        let every = pass_interval(idle.after);
        tracing::info!(
            after_ms = idle.after.as_millis(),
            every_ms = every.as_millis(),
            "idle compaction on"
        );
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            if !self.idle_pass(&slots, &shutdown).await {
                return;
            }
        }
    }

    /// Claims the due sessions, as many at a time as there are free slots (so that no
    /// claimed session waits for one while its agent may come back), and starts each in
    /// a slot of its own; `false` once `shutdown` fired.
    async fn idle_pass(
        self: &Arc<Self>,
        slots: &Arc<Semaphore>,
        shutdown: &CancellationToken,
    ) -> bool {
        let idle = self.policy.idle;
        loop {
            let first = tokio::select! {
                biased;
                () = shutdown.cancelled() => return false,
                permit = slots.clone().acquire_owned() => permit,
            };
            let Ok(first) = first else { return false };
            let mut permits = vec![first];
            while permits.len() < CLAIM_BATCH {
                match slots.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            let asked = permits.len();
            let claimed = tokio::select! {
                biased;
                () = shutdown.cancelled() => return false,
                claimed = self.store.claim_idle(
                    idle.after,
                    idle.give_up_after(),
                    i64::try_from(asked).unwrap_or(i64::MAX),
                ) => claimed,
            };
            let claimed = match claimed {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(
                        "idle pass: reading the schedule failed, trying at the next pass: {}",
                        crate::error_chain(&e)
                    );
                    return true;
                }
            };
            if claimed.dropped > 0 {
                tracing::info!(
                    dropped = claimed.dropped,
                    "idle pass: sessions idle for longer than {} s left as they are",
                    idle.give_up_after().as_secs()
                );
                self.metrics.idle_sessions_given_up(claimed.dropped);
            }
            let more = claimed.dropped > 0 || claimed.sessions.len() == asked;
            for (session_id, permit) in claimed.sessions.into_iter().zip(permits) {
                let worker = self.clone();
                self.tasks.spawn(async move {
                    worker.compact_idle(session_id).await;
                    drop(permit);
                });
            }
            if !more {
                return true;
            }
        }
    }

    /// One idle session, decided and compacted as a turn's would be, with its idle
    /// threshold; the outcome is logged and counted, nobody is answered.
    async fn compact_idle(self: &Arc<Self>, session_id: String) {
        if self.abandon.is_cancelled() {
            // Shutting down: the session waits for its next idle period.
            return;
        }
        let event = Event {
            idle: true,
            ..Event::new(session_id, None)
        };
        let processed = self.process(&event).await;
        let outcome = &processed.outcome;
        self.metrics.idle_session(outcome);
        let rid = &event.request_id;
        match outcome {
            Outcome::Compacted(c) => tracing::info!(
                "[{rid}] summarizer: idle session {} compacted: -{} chars, summary {} chars",
                event.session_id,
                c.chars_removed,
                c.summary_chars
            ),
            Outcome::Failed { detail, .. } => tracing::warn!(
                "[{rid}] summarizer: idle session {} not compacted: {detail}",
                event.session_id
            ),
            _ => tracing::debug!(
                "[{rid}] idle session {} left as it is: {}",
                event.session_id,
                outcome.reason().as_str()
            ),
        }
    }
}

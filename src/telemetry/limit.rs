//! A bound on repetitive warnings. A client sending garbage as fast as it can must not
//! turn the worker's log into a copy of its traffic (20,000 malformed requests once gave
//! 20,116 warning lines): a burst is logged, the rest of the interval is counted and
//! summed up in one line when the next warning is logged. Metrics still count each one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many rejected-request warnings are logged per interval ...
pub const REJECTED_WARNINGS_PER_INTERVAL: usize = 10;
/// ... of this length; the rest are counted and summed up in one line.
pub const REJECTED_WARNING_INTERVAL: Duration = Duration::from_secs(10);

static REJECTED: WarningLimit =
    WarningLimit::new(REJECTED_WARNINGS_PER_INTERVAL, REJECTED_WARNING_INTERVAL);

/// Logs the warning for a malformed request, within [`REJECTED_WARNINGS_PER_INTERVAL`]
/// per [`REJECTED_WARNING_INTERVAL`].
pub fn warn_rejected_request(rid: &str, why: &dyn std::fmt::Display) {
    match REJECTED.check(Instant::now()) {
        Verdict::Suppress => {}
        Verdict::Log { suppressed } => {
            if suppressed > 0 {
                tracing::warn!(
                    target: "summarizer::transport",
                    "summarizer: suppressed {suppressed} rejected-request warnings in the last {} s",
                    REJECTED_WARNING_INTERVAL.as_secs()
                );
            }
            tracing::warn!(
                target: "summarizer::transport",
                "[{rid}] summarizer: rejected request: {why}"
            );
        }
    }
}

/// What to do with one more warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, after a line saying how many were `suppressed` since the last one logged.
    Log {
        suppressed: u64,
    },
    Suppress,
}

/// At most `burst` warnings per `interval`; the interval starts with its first warning.
#[derive(Debug)]
pub struct WarningLimit {
    burst: usize,
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    started: Option<Instant>,
    logged: usize,
    suppressed: u64,
}

impl WarningLimit {
    pub const fn new(burst: usize, interval: Duration) -> Self {
        Self {
            burst,
            interval,
            state: Mutex::new(State {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    pub fn check(&self, now: Instant) -> Verdict {
        // A poisoned lock only means another thread panicked mid-update of plain
        // counters; they are still usable.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let expired = state
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= self.interval);
        if expired {
            state.started = Some(now);
            state.logged = 0;
        }
        if state.logged < self.burst {
            state.logged += 1;
            Verdict::Log {
                suppressed: std::mem::take(&mut state.suppressed),
            }
        } else {
            state.suppressed += 1;
            Verdict::Suppress
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_the_rest_counted_and_reported_with_the_next_one() {
        let limit = WarningLimit::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let verdicts: Vec<Verdict> = (0..1000).map(|_| limit.check(t0)).collect();
        assert_eq!(verdicts[..3], [Verdict::Log { suppressed: 0 }; 3]);
        assert!(verdicts[3..].iter().all(|v| *v == Verdict::Suppress));
        assert_eq!(
            limit.check(t0 + Duration::from_secs(9)),
            Verdict::Suppress,
            "the interval is not over"
        );
        assert_eq!(
            limit.check(t0 + Duration::from_secs(10)),
            Verdict::Log { suppressed: 998 }
        );
        assert_eq!(
            limit.check(t0 + Duration::from_secs(11)),
            Verdict::Log { suppressed: 0 }
        );
    }

    #[test]
    fn a_steady_trickle_under_the_limit_is_all_logged() {
        let limit = WarningLimit::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        for n in 0..100 {
            let now = t0 + Duration::from_millis(600 * n);
            assert_eq!(limit.check(now), Verdict::Log { suppressed: 0 }, "{n}");
        }
    }
}

//! When an LLM call is tried again, and how long the worker waits first.
//!
//! [`next_wait`] is the whole policy as a pure function of the backoff's next step, the
//! server's `Retry-After`, a jitter draw and the time left; [`with_retries`] runs it
//! around any attempt. The HTTP client passes its request as the attempt; tests pass a
//! fake one and run under paused tokio time, so no test sleeps for real.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;

use crate::config::LlmSettings;
use crate::summarizer::LlmError;

/// The limits every retry loop keeps (the `LLM_*` retry settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt: at most `1 + max_retries` attempts in all.
    pub max_retries: usize,
    /// The backoff's first step, and the shortest wait a server's `Retry-After` gets.
    pub min_delay: Duration,
    /// The backoff's longest step.
    pub max_delay: Duration,
    /// The longest wait a server's `Retry-After` gets.
    pub retry_after_cap: Duration,
    /// Every attempt and every wait together.
    pub deadline: Duration,
}

impl From<&LlmSettings> for RetryPolicy {
    fn from(settings: &LlmSettings) -> Self {
        Self {
            max_retries: settings.max_retries,
            min_delay: settings.retry_min_delay,
            max_delay: settings.retry_max_delay,
            retry_after_cap: settings.retry_after_cap,
            deadline: settings.deadline,
        }
    }
}

/// The wait before the next attempt, or `None` to give up now.
///
/// - `backoff` is the exponential backoff's next step; it is `None` once `max_retries`
///   retries are spent, and then nothing, not even a server's `Retry-After`, buys
///   another attempt.
/// - A server's `retry_after` is clamped to `[min_delay, retry_after_cap]`: `0` would
///   have the worker hammer a throttling server, a huge one would park the session.
///   Should the cap be below the floor, the floor wins.
/// - Without one, the wait is the backoff scaled by `jitter` (full jitter; a draw in
///   `[0, 1]`, anything else is clamped into it).
/// - `None` when the wait would not end before the deadline, `left` from now: failing
///   now frees the session for the next turn sooner than a doomed attempt would.
pub fn next_wait(
    policy: &RetryPolicy,
    backoff: Option<Duration>,
    retry_after: Option<Duration>,
    jitter: f64,
    left: Duration,
) -> Option<Duration> {
    let backoff = backoff?;
    let wait = match retry_after {
        Some(asked) => asked.clamp(
            policy.min_delay,
            policy.retry_after_cap.max(policy.min_delay),
        ),
        None => jittered(backoff, jitter),
    };
    (wait < left).then_some(wait)
}

/// `backoff` scaled by `jitter`, which is clamped into `[0, 1]` (NaN counts as 0) so
/// that the product cannot overflow and the conversion cannot panic.
fn jittered(backoff: Duration, jitter: f64) -> Duration {
    let jitter = if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    };
    // Never larger than `backoff` itself, but f64 rounding could push a product near
    // `Duration::MAX` over it: keep the unscaled step then.
    Duration::try_from_secs_f64(backoff.as_secs_f64() * jitter)
        .map_or(backoff, |wait| wait.min(backoff))
}

/// Runs `attempt` until it succeeds, fails with a non-transient error, or
/// [`next_wait`] gives up. `attempt` gets the time left before the deadline, to bound its
/// own timeout; `on_retry` hears of each retry (the attempt number that failed, its
/// error, the wait) before its wait.
///
/// # Errors
/// The last attempt's error.
pub async fn with_retries<T, A, Fut, N>(
    policy: &RetryPolicy,
    mut attempt: A,
    mut on_retry: N,
) -> Result<T, LlmError>
where
    A: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, LlmError>>,
    N: FnMut(u32, &LlmError, Duration),
{
    let deadline = Instant::now() + policy.deadline;
    let left = move || deadline.saturating_duration_since(Instant::now());
    // Atomic rather than a Cell: the retry future must stay Send.
    let attempts = AtomicU32::new(0);
    // The last retried error's cause. A wait ends before the deadline, but on a busy
    // machine the next attempt may start a moment after it: that attempt is not made,
    // and the error that was being retried is the one reported, not "deadline reached".
    let retried: Mutex<Option<String>> = Mutex::new(None);
    let backoff = ExponentialBuilder::default()
        .with_min_delay(policy.min_delay)
        .with_max_delay(policy.max_delay)
        .with_max_times(policy.max_retries);
    (|| {
        let left = left();
        let cause = retried
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let attempt = match cause {
            Some(cause) if left.is_zero() => Err(LlmError::Transient {
                cause,
                retry_after: None,
            }),
            _ => {
                attempts.fetch_add(1, Ordering::Relaxed);
                Ok(attempt(left))
            }
        };
        async move { attempt?.await }
    })
    .retry(backoff)
    .when(LlmError::is_transient)
    .adjust(|error, backoff| {
        next_wait(
            policy,
            backoff,
            error.retry_after(),
            fastrand::f64(),
            left(),
        )
    })
    .notify(|error, wait| {
        *retried.lock().unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
        on_retry(attempts.load(Ordering::Relaxed), error, wait);
    })
    .await
}

#[cfg(test)]
mod tests;

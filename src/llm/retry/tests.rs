use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// The shipped defaults: 4 retries, backoff 0.5 s to 10 s, `Retry-After` up to 30 s,
/// 90 s in all.
fn defaults() -> RetryPolicy {
    RetryPolicy {
        max_retries: 4,
        min_delay: 500 * MS,
        max_delay: 10_000 * MS,
        retry_after_cap: 30_000 * MS,
        deadline: 90_000 * MS,
    }
}

fn throttled(retry_after: Option<Duration>) -> LlmError {
    LlmError::Transient {
        cause: "HTTP 429".to_owned(),
        retry_after,
    }
}

const PLENTY: Duration = Duration::from_secs(3600);

#[test]
fn a_retry_after_of_zero_is_raised_to_the_minimum_delay() {
    let wait = next_wait(
        &defaults(),
        Some(500 * MS),
        Some(Duration::ZERO),
        0.3,
        PLENTY,
    );
    assert_eq!(wait, Some(500 * MS));
}

#[test]
fn a_retry_after_above_the_cap_is_cut_to_the_cap() {
    let wait = next_wait(
        &defaults(),
        Some(500 * MS),
        Some(Duration::MAX),
        0.3,
        PLENTY,
    );
    assert_eq!(wait, Some(30_000 * MS));
}

#[test]
fn a_retry_after_within_the_bounds_is_honoured_as_asked() {
    let wait = next_wait(&defaults(), Some(500 * MS), Some(2_000 * MS), 0.3, PLENTY);
    assert_eq!(wait, Some(2_000 * MS));
}

#[test]
fn a_cap_below_the_minimum_delay_leaves_the_minimum() {
    let policy = RetryPolicy {
        retry_after_cap: 100 * MS,
        ..defaults()
    };
    let wait = next_wait(&policy, Some(500 * MS), Some(Duration::ZERO), 0.3, PLENTY);
    assert_eq!(wait, Some(500 * MS));
}

#[test]
fn no_retry_after_leaves_the_jittered_backoff() {
    let wait = next_wait(&defaults(), Some(4_000 * MS), None, 0.25, PLENTY);
    assert_eq!(wait, Some(1_000 * MS));
}

#[test]
fn once_the_retries_are_spent_not_even_the_server_buys_another_attempt() {
    for asked in [None, Some(Duration::ZERO), Some(1_000 * MS)] {
        assert_eq!(next_wait(&defaults(), None, asked, 0.5, PLENTY), None);
    }
}

#[test]
fn no_wait_ends_past_the_deadline() {
    assert_eq!(
        next_wait(
            &defaults(),
            Some(500 * MS),
            Some(2_000 * MS),
            0.5,
            2_000 * MS
        ),
        None
    );
    assert_eq!(
        next_wait(
            &defaults(),
            Some(500 * MS),
            Some(2_000 * MS),
            0.5,
            2_001 * MS
        ),
        Some(2_000 * MS)
    );
}

fn duration(max_ms: u64) -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0..=max_ms).prop_map(Duration::from_millis),
        Just(Duration::ZERO),
        Just(Duration::MAX),
        any::<(u64, u32)>().prop_map(|(s, n)| Duration::new(s, n % 1_000_000_000)),
    ]
}

fn policy() -> impl Strategy<Value = RetryPolicy> {
    (
        0..10usize,
        0..2_000u64,
        0..20_000u64,
        0..60_000u64,
        0..120_000u64,
    )
        .prop_map(|(max_retries, min, max, cap, deadline)| RetryPolicy {
            max_retries,
            min_delay: Duration::from_millis(min),
            max_delay: Duration::from_millis(min.max(max)),
            retry_after_cap: Duration::from_millis(cap),
            deadline: Duration::from_millis(deadline),
        })
}

fn jitter() -> impl Strategy<Value = f64> {
    prop_oneof![0.0..=1.0f64, any::<f64>()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_wait_keeps_the_limits(
        policy in policy(),
        backoff in proptest::option::of(duration(20_000)),
        retry_after in proptest::option::of(duration(100_000)),
        jitter in jitter(),
        left in duration(120_000),
    ) {
        let wait = next_wait(&policy, backoff, retry_after, jitter, left);
        let Some(wait) = wait else { return Ok(()) };
        prop_assert!(backoff.is_some(), "a retry past max_retries");
        prop_assert!(wait < left, "{wait:?} ends past the deadline ({left:?} left)");
        match retry_after {
            Some(_) => {
                let cap = policy.retry_after_cap.max(policy.min_delay);
                prop_assert!(policy.min_delay <= wait && wait <= cap, "{wait:?}");
            }
            None => prop_assert!(Some(wait) <= backoff, "{wait:?}"),
        }
    }
}

/// Runs [`with_retries`] over a fake attempt that fails with `error(n)` for attempt `n`
/// (from 1) and succeeds once that is `None`. Returns the attempts, the waits and the
/// (virtual) time it all took. Gives up after 1000 attempts, so a loop that ignores its
/// limits fails the test rather than hanging it.
async fn run(
    policy: &RetryPolicy,
    error: impl Fn(u32) -> Option<LlmError>,
) -> (Result<(), LlmError>, u32, Vec<Duration>) {
    let attempts = AtomicU32::new(0);
    let mut waits = Vec::new();
    let result = with_retries(
        policy,
        |_left| {
            let n = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            let outcome = if n >= 1000 { None } else { error(n) };
            async move { outcome.map_or(Ok(()), Err) }
        },
        |_, _, wait| waits.push(wait),
    )
    .await;
    (result, attempts.load(Ordering::Relaxed), waits)
}

#[tokio::test(start_paused = true)]
async fn retry_after_zero_gives_one_plus_max_retries_attempts_at_the_minimum_delay() {
    let started = Instant::now();
    let (result, attempts, waits) =
        run(&defaults(), |_| Some(throttled(Some(Duration::ZERO)))).await;

    assert!(
        matches!(result, Err(LlmError::Transient { .. })),
        "{result:?}"
    );
    assert_eq!(attempts, 1 + 4);
    assert_eq!(waits, vec![500 * MS; 4]);
    assert_eq!(started.elapsed(), 4 * 500 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_huge_retry_after_waits_the_cap_and_keeps_the_attempt_limit() {
    let policy = RetryPolicy {
        max_retries: 1,
        ..defaults()
    };
    let started = Instant::now();
    let (result, attempts, waits) = run(&policy, |_| Some(throttled(Some(Duration::MAX)))).await;

    assert!(result.is_err());
    assert_eq!(attempts, 2);
    assert_eq!(waits, vec![30_000 * MS]);
    assert_eq!(started.elapsed(), 30_000 * MS);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_before_a_wait_would_end_past_the_deadline() {
    let policy = RetryPolicy {
        max_retries: 100,
        deadline: 5_500 * MS,
        ..defaults()
    };
    let started = Instant::now();
    let (result, attempts, _) = run(&policy, |_| Some(throttled(Some(1_000 * MS)))).await;

    assert!(result.is_err());
    // At 0 s, 1 s, ... 5 s; a sixth wait would end at 6 s, past 5.5 s.
    assert_eq!(attempts, 6);
    assert_eq!(started.elapsed(), 5_000 * MS);
}

#[tokio::test(start_paused = true)]
async fn the_backoff_alone_keeps_the_attempt_limit_and_the_deadline() {
    let (result, attempts, waits) = run(&defaults(), |_| Some(throttled(None))).await;

    assert!(result.is_err());
    assert_eq!(attempts, 1 + 4);
    // Exponential from 0.5 s, each step scaled by a jitter draw.
    for (wait, step) in waits.iter().zip([500, 1_000, 2_000, 4_000]) {
        assert!(*wait <= step * MS, "{waits:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_after_throttling_is_returned() {
    let (result, attempts, waits) =
        run(&defaults(), |n| (n < 3).then(|| throttled(Some(MS)))).await;

    assert!(result.is_ok(), "{result:?}");
    assert_eq!(attempts, 3);
    assert_eq!(waits, vec![500 * MS; 2]);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_request_is_tried_once() {
    let rejected = |_| {
        Some(LlmError::Rejected {
            status: 400,
            body: "context_length_exceeded".to_owned(),
        })
    };
    let (result, attempts, waits) = run(&defaults(), rejected).await;

    assert!(matches!(
        result,
        Err(LlmError::Rejected { status: 400, .. })
    ));
    assert_eq!((attempts, waits.len()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_told_the_time_left() {
    let policy = RetryPolicy {
        max_retries: 2,
        deadline: 10_000 * MS,
        ..defaults()
    };
    let mut lefts = Vec::new();
    let _ = with_retries(
        &policy,
        |left| {
            lefts.push(left);
            async { Err::<(), _>(throttled(Some(1_000 * MS))) }
        },
        |_, _, _| {},
    )
    .await;

    assert_eq!(lefts, vec![10_000 * MS, 9_000 * MS, 8_000 * MS]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the servers ask for, the loop keeps the attempt limit and the deadline,
    /// and each wait for a server keeps the clamp.
    #[test]
    fn the_loop_keeps_its_limits_whatever_the_server_asks(
        policy in policy(),
        asks in prop::collection::vec(proptest::option::of(duration(100_000)), 1..12),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (attempts, waits, elapsed) = runtime.block_on(async {
            let started = Instant::now();
            let (_, attempts, waits) =
                run(&policy, |n| Some(throttled(asks[(n as usize - 1) % asks.len()]))).await;
            (attempts, waits, started.elapsed())
        });
        prop_assert!(attempts as usize <= 1 + policy.max_retries, "{attempts} attempts");
        prop_assert!(elapsed <= policy.deadline, "{elapsed:?}");
        for (n, wait) in waits.iter().enumerate() {
            if asks[n % asks.len()].is_some() {
                let cap = policy.retry_after_cap.max(policy.min_delay);
                prop_assert!(policy.min_delay <= *wait && *wait <= cap, "{wait:?}");
            }
        }
    }
}

/// A wait ends before the deadline, but the next attempt may start after it (here the
/// thread is held past the deadline before the wait, as a busy machine would): the
/// error being retried is reported, not the late attempt's "deadline reached".
/// Real time, since paused time never runs late.
#[tokio::test]
async fn an_attempt_due_after_the_deadline_reports_the_error_being_retried() {
    let policy = RetryPolicy {
        max_retries: 5,
        min_delay: MS,
        max_delay: MS,
        retry_after_cap: MS,
        deadline: 50 * MS,
    };
    let attempts = AtomicU32::new(0);
    let result: Result<(), LlmError> = with_retries(
        &policy,
        |left| {
            attempts.fetch_add(1, Ordering::Relaxed);
            let cause = if left.is_zero() {
                "deadline reached"
            } else {
                "HTTP 500: upstream overloaded"
            };
            async move {
                Err(LlmError::Transient {
                    cause: cause.to_owned(),
                    retry_after: None,
                })
            }
        },
        |_, _, _| std::thread::sleep(80 * MS),
    )
    .await;

    assert_eq!(
        result.unwrap_err().to_string(),
        "HTTP 500: upstream overloaded"
    );
    assert_eq!(attempts.load(Ordering::Relaxed), 1);
}

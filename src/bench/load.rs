//! Closed-loop load: `concurrency` tasks each run the operation back to back until
//! `total` have run; latencies are kept whole, so percentiles are exact.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Measurement {
    pub concurrency: usize,
    pub operations: usize,
    /// Operations per second over the whole run.
    pub throughput: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Runs `operation(i)` for `i` in `0..total`, `concurrency` at a time. The operation
/// returns false when it did not do what was measured; any such run is an error.
///
/// # Errors
/// When an operation fails.
pub async fn run<F, Fut>(
    concurrency: usize,
    total: usize,
    operation: F,
) -> anyhow::Result<Measurement>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let operation = Arc::new(operation);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (operation, next) = (operation.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, anyhow::Error>(latencies);
                    }
                    let began = Instant::now();
                    operation(i).await?;
                    latencies.push(began.elapsed());
                }
            })
        })
        .collect();
    let mut latencies: Vec<Duration> = Vec::with_capacity(total);
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Measurement {
        concurrency,
        operations: total,
        throughput: total as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
    })
}

/// The `q` quantile of sorted `latencies`, in microseconds.
pub fn percentile(latencies: &[Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[index].as_secs_f64() * 1e6
}

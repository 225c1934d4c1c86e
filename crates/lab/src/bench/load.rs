//! Closed-loop load: `concurrency` tasks each run the operation back to back until
//! `total` have run; latencies are kept whole, so percentiles are exact.

use std::future::Future;
use std::ops::Range;
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

/// Runs `warmup` untimed operations (indices `total..total + warmup`, so that a caller
/// can give them inputs of their own), then times `operation(i)` for `i` in `0..total`,
/// `concurrency` at a time.
///
/// # Errors
/// When an operation fails: it did not do what was measured.
pub async fn run<F, Fut>(
    concurrency: usize,
    total: usize,
    warmup: usize,
    operation: F,
) -> anyhow::Result<Measurement>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let operation = Arc::new(operation);
    each(concurrency, total..total + warmup, operation.clone()).await?;
    let started = Instant::now();
    let mut latencies = each(concurrency, 0..total, operation).await?;
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

/// The latency of `operation(i)` for each `i` of `indices`, `concurrency` at a time.
async fn each<F, Fut>(
    concurrency: usize,
    indices: Range<usize>,
    operation: Arc<F>,
) -> anyhow::Result<Vec<Duration>>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(indices.start));
    let end = indices.end;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (operation, next) = (operation.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return Ok::<_, anyhow::Error>(latencies);
                    }
                    let began = Instant::now();
                    operation(i).await?;
                    latencies.push(began.elapsed());
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(indices.len());
    for task in tasks {
        latencies.extend(task.await??);
    }
    Ok(latencies)
}

/// The `q` quantile of sorted `latencies`, in microseconds.
pub fn percentile(latencies: &[Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[index].as_secs_f64() * 1e6
}

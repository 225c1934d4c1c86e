//! The durable job queue (`TRANSPORT=jetstream` or `both`): turn-starting requests
//! published to a JetStream WorkQueue stream, pulled by one durable consumer the fleet
//! shares, so that a job published while no worker runs, or held by a worker that dies,
//! is processed all the same.
//!
//! What a job gets, and why:
//! - **Processed as a request** ([`Worker::process`]), and answered the same way on its
//!   `Reply-To` header, if it has one (a pulled message has no NATS reply of its own).
//! - **Acked after the outcome is final**: after the commit, or after a decision
//!   (below the threshold, too few turns, no safe boundary, nothing to compact, unknown
//!   session, disabled). The ack is confirmed by the server (`double_ack`); one that is
//!   lost only means a redelivery, which finds the work done (a compaction's prefix is
//!   gone once committed, so it is never applied twice).
//! - **Nacked with a delay** when the outcome is transient: an LLM or store failure, a
//!   prefix that changed meanwhile (`conflict`), a lease held by another worker
//!   (`busy`), a session in backoff after a failure. The delay doubles per delivery from
//!   1 s up to a minute, so another worker retries it later.
//! - **Processed once**: a job delivered again whose own identity (its stream, stream
//!   sequence and publish time, recorded as the usage event's `job_id`) already has a
//!   compaction of its session (its worker died between the commit and the ack) is
//!   acked without being processed again. The client's `request_id` never decides
//!   this: a scheduler may send the same one with every job.
//! - **Dead-lettered** when it fails on its `JETSTREAM_MAX_DELIVER`-th delivery or a
//!   later one: a row in `dead_letters` (`summarizer dead-letters list|replay|purge`), a
//!   metric, and an ack, which removes it from the stream. Busy and backing off are not
//!   failures of the job and never end in a dead letter themselves; a job that keeps
//!   taking workers down (never answered at all) is dead-lettered at ten times the
//!   limit.
//! - **Terminated** when it is malformed: it can never succeed.
//! - **Kept alive**: while it runs longer than half of `JETSTREAM_ACK_WAIT_MS`, a
//!   progress ack (`+WPI`) goes out every half of it, so a long LLM call is not handed to
//!   another worker.
//! - **At most `WORKER_CONCURRENCY` in flight** per worker: each pull asks for no more
//!   than the room left.
//! - **Drain**: SIGTERM stops pulling, nacks what was pulled but not started, and lets
//!   what runs finish within the grace period; what is still running then is nacked.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::Client;
use async_nats::jetstream::consumer::pull::{self, Batch};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::message::{AckKind, Message};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Jobs;
use crate::outcome::{Outcome, Reason};
use crate::protocol::{Reply, Request};
use crate::store::{NewDeadLetter, SharedStore};
use crate::worker::{Event, Worker};
use summarizer_client::jobs::REPLY_TO_HEADER;

/// The consumer's `max_ack_pending` when this worker creates it: room for a fleet of
/// 300 workers at the default `WORKER_CONCURRENCY` (see docs/operations.md on sizing).
const MAX_ACK_PENDING: i64 = 10_000;
/// How long a pull waits for jobs when the stream is empty.
const PULL_EXPIRES: Duration = Duration::from_secs(5);
/// The stream's duplicate window for `Nats-Msg-Id`.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// A job delivered this many times `JETSTREAM_MAX_DELIVER` is dead-lettered on arrival,
/// whatever its deliveries' outcomes: it keeps taking workers down (never answered), or
/// has waited out busy leases and backoffs far longer than any compaction takes (50
/// deliveries at the default are some 44 minutes of nak delays, past the default
/// 15-minute backoff ceiling).
const POISON_DELIVERIES: i64 = 10;
/// How long the drain waits for jobs still in the pull's buffer.
const DRAIN_READ: Duration = Duration::from_millis(200);

/// A stream that exists but cannot be the job queue: waiting will not change it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(String);

/// Creates the stream and the consumer, or binds them if they exist (their stored
/// configuration is not changed: operators may have tuned it; a consumer's own
/// `ack_wait` is the one that counts, see [`JobServer::ack_wait`]).
///
/// # Errors
/// [`Unusable`] when the stream exists with subjects that overlap `request_subject` (it
/// would answer requests with its publish acks) or without work-queue retention (acked
/// jobs would stay); otherwise when JetStream is not enabled on the server, or refuses
/// the stream (another stream already takes these subjects).
pub async fn bind(
    client: &Client,
    jobs: &Jobs,
    request_subject: &str,
) -> anyhow::Result<PullConsumer> {
    let jetstream = async_nats::jetstream::new(client.clone());
    let stream = jetstream
        .get_or_create_stream(stream::Config {
            name: jobs.stream.clone(),
            subjects: vec![jobs.stream_subjects()],
            retention: RetentionPolicy::WorkQueue,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .with_context(|| format!("creating or binding the JetStream stream {}", jobs.stream))?;
    let config = &stream.cached_info().config;
    if let Some(subject) = (config.subjects.iter())
        .find(|s| summarizer_client::jobs::subjects_overlap(s, request_subject))
    {
        return Err(Unusable(format!(
            "the existing stream {} takes {subject}, which overlaps NATS_SUBJECT \
             ({request_subject}): it would answer requests with its publish acks",
            jobs.stream
        ))
        .into());
    }
    if config.retention != RetentionPolicy::WorkQueue {
        return Err(Unusable(format!(
            "the existing stream {} does not have work-queue retention: acked jobs would \
             stay in it",
            jobs.stream
        ))
        .into());
    }
    let consumer = stream
        .get_or_create_consumer(
            &jobs.consumer,
            pull::Config {
                durable_name: Some(jobs.consumer.clone()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: jobs.ack_wait,
                // Unlimited: the worker dead-letters (and removes) a failing job itself.
                // A server-side limit would leave it in the stream, never delivered.
                max_deliver: -1,
                max_ack_pending: MAX_ACK_PENDING,
                ..Default::default()
            },
        )
        .await
        .with_context(|| {
            format!(
                "creating or binding the JetStream consumer {}",
                jobs.consumer
            )
        })?;
    let ack_wait = consumer.cached_info().config.ack_wait;
    if ack_wait != jobs.ack_wait {
        tracing::warn!(
            "the consumer {} exists with an ack wait of {} ms, not JETSTREAM_ACK_WAIT_MS; \
             it is the one that counts (change it with `nats consumer edit`)",
            jobs.consumer,
            ack_wait.as_millis()
        );
    }
    Ok(consumer)
}

pub struct JobServer {
    pub client: Client,
    pub consumer: PullConsumer,
    pub worker: Arc<Worker>,
    pub store: SharedStore,
    pub jobs: Jobs,
    pub concurrency: usize,
    pub shutdown_grace: Duration,
}

impl JobServer {
    /// The bound consumer's ack wait: the server redelivers by it, whatever this
    /// worker's `JETSTREAM_ACK_WAIT_MS` says.
    pub fn ack_wait(&self) -> Duration {
        let ack_wait = self.consumer.cached_info().config.ack_wait;
        if ack_wait.is_zero() {
            self.jobs.ack_wait
        } else {
            ack_wait
        }
    }

    /// Pulls and processes jobs until `shutdown` fires, then drains (see the module).
    pub async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let abandon = CancellationToken::new();
        let mut in_flight = FuturesUnordered::new();
        let mut batch: Option<Batch> = None;
        let mut deadline: Option<Instant> = None;
        let mut pull_failures = 0u32;
        loop {
            let draining = deadline.is_some();
            if draining && in_flight.is_empty() {
                break;
            }
            let room = this.concurrency.saturating_sub(in_flight.len());
            if batch.is_none() && room > 0 && !draining {
                match this
                    .consumer
                    .batch()
                    .max_messages(room)
                    .expires(PULL_EXPIRES)
                    .messages()
                    .await
                {
                    Ok(pulled) => {
                        batch = Some(pulled);
                        pull_failures = 0;
                    }
                    Err(e) => {
                        pull_failures += 1;
                        if pull_failures == 1 || pull_failures.is_power_of_two() {
                            tracing::warn!(error = %e, failures = pull_failures, "could not pull jobs; retrying");
                        }
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                            () = shutdown.cancelled() => {}
                        }
                        if shutdown.is_cancelled() && deadline.is_none() {
                            deadline = Some(Instant::now() + this.shutdown_grace);
                        }
                        continue;
                    }
                }
            }
            tokio::select! {
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                next = next_job(&mut batch), if batch.is_some() && !draining => match next {
                    Some(Ok(message)) => in_flight.push(handle(this.clone(), message, abandon.clone())),
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "pull ended");
                        batch = None;
                    }
                    None => batch = None,
                },
                () = shutdown.cancelled(), if !draining => {
                    tracing::info!(in_flight = in_flight.len(), "draining jobs: no more pulls");
                    deadline = Some(Instant::now() + this.shutdown_grace);
                    if let Some(pulled) = batch.take() {
                        nak_unstarted(pulled).await;
                    }
                }
                () = sleep_until_opt(deadline) => {
                    tracing::warn!(
                        in_flight = in_flight.len(),
                        "shutdown grace period over; nacking the jobs still running"
                    );
                    abandon.cancel();
                    // Each gives its job back at once.
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while in_flight.next().await.is_some() {}
                    })
                    .await;
                    break;
                }
            }
        }
    }
}

/// The next job of the current pull.
async fn next_job(
    batch: &mut Option<Batch>,
) -> Option<Result<Message, Box<dyn std::error::Error + Send + Sync>>> {
    match batch {
        Some(batch) => batch.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Gives back, at once, the jobs a pull delivered that were not started.
async fn nak_unstarted(mut pulled: Batch) {
    while let Ok(Some(Ok(message))) = tokio::time::timeout(DRAIN_READ, pulled.next()).await {
        if let Err(e) = message.ack_with(AckKind::Nak(None)).await {
            tracing::warn!(error = %e, "could not give back a job at shutdown; it returns after the ack wait");
        }
    }
}

/// What happens to a job after its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    Ack,
    /// Transient: deliver again later, and dead-letter at the limit.
    Retry,
    /// Not the job's failure (a lease held elsewhere, a session in backoff): deliver
    /// again later, never dead-letter for it.
    Busy,
}

fn settle(outcome: &Outcome) -> Settle {
    match outcome {
        // Neither is the job's failure: another worker holds the lease, or the session
        // waits out the backoff of an earlier failure (up to FAILURE_BACKOFF_MAX_MS,
        // longer than a few nak delays).
        Outcome::Busy | Outcome::Skipped(Reason::BackingOff) => Settle::Busy,
        Outcome::Failed { .. } | Outcome::Skipped(Reason::Conflict) => Settle::Retry,
        _ => Settle::Ack,
    }
}

/// The delay before a job nacked on its `delivered`-th delivery comes again: 1 s,
/// doubling, at most a minute.
fn retry_delay(delivered: i64) -> Duration {
    let exponent = u32::try_from(delivered.clamp(1, 7) - 1).unwrap_or(6);
    Duration::from_secs(2u64.pow(exponent)).min(Duration::from_secs(60))
}

/// Processes one job and settles it.
async fn handle(server: Arc<JobServer>, message: Message, abandon: CancellationToken) {
    let worker = &server.worker;
    let _in_flight = worker.metrics().in_flight();
    let delivered = message.info().map_or(1, |info| info.delivered);
    if delivered > 1 {
        worker.metrics().job_redelivered();
    }
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    let (reply_to, msg_id) = (header(REPLY_TO_HEADER), header("Nats-Msg-Id"));
    let request = match Request::decode(&message.payload) {
        Ok(request) => request,
        Err(invalid) => {
            let rejected = super::reject(worker, &invalid);
            reply(&server.client, reply_to.as_deref(), &rejected).await;
            finish(&message, AckKind::Term, "terminated", worker).await;
            return;
        }
    };
    let job_id = job_id(&message);
    let event = Event::from_request(request).with_job_id(job_id.clone());
    let rid = event.request_id.clone();
    let span =
        tracing::info_span!("job", request_id = %rid, session_id = %event.session_id, delivered);
    async {
        if delivered > POISON_DELIVERIES * server.jobs.max_deliver {
            let error = format!("delivered {delivered} times without an answer (workers stopped or crashed while it ran)");
            dead_letter(&server, &message, &event.session_id, msg_id.as_deref(), &error, delivered).await;
            return;
        }
        // Delivered again after its commit (the worker died before the ack): done.
        if delivered > 1
            && let Some(job_id) = job_id.as_deref()
        {
            match server.store.compacted_by_job(&event.session_id, job_id).await {
                Ok(true) => {
                    tracing::info!("job already compacted its session before; acking");
                    finish(&message, AckKind::Ack, "acked", worker).await;
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("could not look the job up: {}", crate::error_chain(&e)),
            }
        }
        let processing = worker.process(&event);
        tokio::pin!(processing);
        let half = server.ack_wait() / 2;
        let mut progress = tokio::time::interval_at(Instant::now() + half, half);
        let processed = loop {
            tokio::select! {
                processed = &mut processing => break processed,
                _ = progress.tick() => {
                    if let Err(e) = message.ack_with(AckKind::Progress).await {
                        tracing::warn!(error = %e, "could not send the job's progress");
                    }
                }
                () = abandon.cancelled() => {
                    finish(&message, AckKind::Nak(None), "nacked", worker).await;
                    return;
                }
            }
        };
        worker.metrics().event(&processed.outcome);
        let answer = super::reply_to_processed(&event, &processed);
        reply(&server.client, reply_to.as_deref(), &answer).await;
        match settle(&processed.outcome) {
            Settle::Ack => finish(&message, AckKind::Ack, "acked", worker).await,
            Settle::Retry if delivered >= server.jobs.max_deliver => {
                let error = match &processed.outcome {
                    Outcome::Failed { detail, .. } => detail.clone(),
                    other => format!("{}/{}", other.status().as_str(), other.reason().as_str()),
                };
                dead_letter(&server, &message, &event.session_id, msg_id.as_deref(), &error, delivered).await;
            }
            Settle::Retry | Settle::Busy => {
                finish(&message, AckKind::Nak(Some(retry_delay(delivered))), "nacked", worker).await;
            }
        }
    }
    .instrument(span)
    .await;
}

/// The job's own identity: its stream, stream sequence and publish time (a stream
/// deleted and created again starts its sequences over). The same for every delivery of
/// the job, and for no other job; `None` for a message without JetStream metadata.
fn job_id(message: &Message) -> Option<String> {
    message.info().ok().map(|info| {
        format!(
            "{}:{}:{}",
            info.stream,
            info.stream_sequence,
            info.published.unix_timestamp_nanos()
        )
    })
}

/// Keeps the job in `dead_letters` and removes it from the stream. If it cannot be
/// kept, it stays in the stream (nacked) and comes again.
async fn dead_letter(
    server: &JobServer,
    message: &Message,
    session_id: &str,
    msg_id: Option<&str>,
    error: &str,
    delivered: i64,
) {
    let worker = &server.worker;
    let job_key = job_id(message);
    let kept = server
        .store
        .dead_letter(&NewDeadLetter {
            session_id: Some(session_id),
            subject: message.subject.as_str(),
            msg_id,
            payload: &String::from_utf8_lossy(&message.payload),
            last_error: error,
            deliveries: delivered,
            job_key: job_key.as_deref(),
        })
        .await;
    match kept {
        Ok(None) => {
            tracing::info!("job dead-lettered already (its ack was lost); acking");
            finish(message, AckKind::Ack, "acked", worker).await;
        }
        Ok(Some(id)) => {
            tracing::warn!(
                dead_letter = id,
                deliveries = delivered,
                "job dead-lettered: {error}"
            );
            worker.metrics().dead_lettered();
            finish(message, AckKind::Ack, "dead_lettered", worker).await;
        }
        Err(e) => {
            tracing::error!(
                "could not dead-letter the job; it stays in the stream: {}",
                crate::error_chain(&e)
            );
            finish(
                message,
                AckKind::Nak(Some(retry_delay(delivered))),
                "nacked",
                worker,
            )
            .await;
        }
    }
}

/// Settles the job; an ack is confirmed by the server.
async fn finish(message: &Message, kind: AckKind, outcome: &'static str, worker: &Worker) {
    let sent = match kind {
        AckKind::Ack => message.double_ack().await,
        other => message.ack_with(other).await,
    };
    match sent {
        Ok(()) => worker.metrics().job(outcome),
        Err(e) => tracing::warn!(
            error = %e,
            "could not settle the job ({outcome}); it will be delivered again after the ack wait"
        ),
    }
}

async fn reply(client: &Client, to: Option<&str>, reply: &Reply) {
    if let Some(to) = to
        && let Err(e) = client.publish(to.to_owned(), reply.encode().into()).await
    {
        tracing::warn!(error = %e, "could not publish the job's reply");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Compaction;

    #[test]
    fn decisions_are_acked_and_transient_outcomes_retried() {
        for reason in [
            Reason::BelowThreshold,
            Reason::TooFewTurns,
            Reason::NoSafeBoundary,
            Reason::NothingToCompact,
            Reason::UnknownSession,
            Reason::Disabled,
        ] {
            assert_eq!(settle(&Outcome::Skipped(reason)), Settle::Ack, "{reason:?}");
        }
        let compacted = Outcome::Compacted(Compaction {
            compaction_id: 1,
            messages_removed: 1,
            chars_removed: 1,
            messages_kept: 1,
            summary_chars: 1,
            summarized: true,
            tool_outputs_cleared: 0,
            chars_cleared: 0,
        });
        assert_eq!(settle(&compacted), Settle::Ack);
        assert_eq!(settle(&Outcome::Skipped(Reason::Conflict)), Settle::Retry);
        assert_eq!(settle(&Outcome::Skipped(Reason::BackingOff)), Settle::Busy);
        let failed = Outcome::Failed {
            reason: Reason::LlmError,
            detail: String::new(),
        };
        assert_eq!(settle(&failed), Settle::Retry);
        assert_eq!(settle(&Outcome::Busy), Settle::Busy);
    }

    #[test]
    fn the_retry_delay_doubles_up_to_a_minute() {
        let delays: Vec<u64> = (0..10).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}

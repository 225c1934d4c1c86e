//! Core NATS requests: serves the turn subject on the queue group, at most `WORKER_CONCURRENCY`
//! events at once, and drains on shutdown.
//!
//! The next event is read only while fewer than `WORKER_CONCURRENCY` are in flight, so a
//! saturated worker leaves events queued in NATS's client buffer rather than starting
//! more work than it may run.

use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::{Client, Subscriber};
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use summarizer_client::RecallStatus;

use crate::health::Health;
use crate::worker::Worker;

pub struct Server {
    pub client: Client,
    pub subscriber: Subscriber,
    pub worker: Arc<Worker>,
    pub health: Arc<Health>,
    pub concurrency: usize,
    pub shutdown_grace: Duration,
    /// What the subscription's requests are.
    pub serves: Serves,
}

/// The requests a [`Server`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serves {
    /// Turn-starting requests (`NATS_SUBJECT`).
    Turns,
    /// Recall requests (`NATS_RECALL_SUBJECT`), answered from the store alone.
    Recalls,
}

impl Server {
    /// Serves until `shutdown` fires, then stops taking events, lets NATS hand over what
    /// it already routed here, finishes in-flight events within the grace period and
    /// flushes their replies.
    ///
    /// Events run as futures of this one task rather than as tasks of their own: the
    /// common event is a no-op answered from the counters, and polling them together
    /// saves a spawn and the cross-thread wake-ups that dominated the no-op path's
    /// profile. A compaction runs as a task of its own (see [`Worker::process`]), so a
    /// slow, CPU-heavy or panicking one holds up nothing here.
    ///
    /// The drain is polled alongside the events, never awaited in place: with NATS
    /// unreachable, confirming the unsubscribe can take the whole grace period, and the
    /// events in flight must go on meanwhile.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut in_flight = FuturesUnordered::new();
        let mut drain = None;
        let mut confirming: Option<BoxFuture<'static, ()>> = None;
        let mut subscribed = true;
        while subscribed || !in_flight.is_empty() {
            if drain
                .as_ref()
                .is_some_and(|d: &Drain| d.is_idle(&self.client))
                && in_flight.is_empty()
            {
                tracing::warn!(
                    "draining: NATS is unreachable, so no more events can arrive; stopping"
                );
                break;
            }
            let room = in_flight.len() < self.concurrency;
            let unsubscribe = drain.as_ref().is_some_and(|d| !d.unsubscribed);
            tokio::select! {
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                step = next_step(&mut self.subscriber, unsubscribe), if subscribed && (room || unsubscribe) => match step {
                    Step::Event(Some(message)) => in_flight.push(handle(self.worker.clone(), self.client.clone(), message, self.serves)),
                    // Drained (or the connection closed for good).
                    Step::Event(None) => {
                        subscribed = false;
                        // The drain's own round trip ended it: the server has the unsubscribe.
                        if confirming.take().is_some() {
                            tracing::info!("draining: unsubscribed; finishing in-flight events");
                        }
                    }
                    Step::Unsubscribed(result) => {
                        if let Err(e) = result {
                            tracing::warn!(error = %e, "could not drain the subscription");
                        }
                        if let Some(drain) = &mut drain {
                            drain.unsubscribed = true;
                            confirming = Some(confirm_unsubscribe(self.client.clone(), drain.deadline).boxed());
                        }
                    }
                },
                () = shutdown.cancelled(), if drain.is_none() => {
                    self.health.set_draining();
                    drain = Some(Drain::new(self.shutdown_grace));
                }
                () = poll_opt(&mut confirming), if confirming.is_some() => confirming = None,
                () = sleep_until_opt(drain.as_ref().map(|d| d.deadline)) => {
                    tracing::warn!(
                        in_flight = in_flight.len(),
                        "shutdown grace period over; abandoning in-flight events (their agents proceed on timeout)"
                    );
                    break;
                }
            }
        }
        // Dropping an event's future leaves its compaction task running: the caller has
        // those give their leases back (`Worker::abandon_compactions`) once every
        // transport has stopped, then flushes the replies.
    }
}

/// The drain's progress, from the shutdown signal on.
struct Drain {
    deadline: Instant,
    /// The unsubscribe is queued in the client (not necessarily at the server yet).
    unsubscribed: bool,
}

impl Drain {
    fn new(grace: Duration) -> Self {
        Self {
            deadline: Instant::now() + grace,
            unsubscribed: false,
        }
    }

    /// Whether nothing more can arrive: the unsubscribe is queued and the connection is
    /// down, so NATS can route nothing here; waiting out the grace period for the
    /// unsubscribe's confirmation would only delay the exit.
    fn is_idle(&self, client: &Client) -> bool {
        self.unsubscribed && client.connection_state() != State::Connected
    }
}

/// What the subscription gave: an event (or its end), or the drain's unsubscribe queued.
enum Step {
    Event(Option<async_nats::Message>),
    Unsubscribed(Result<(), async_nats::UnsubscribeError>),
}

/// One step on the subscription: queue the unsubscribe when `unsubscribe`, else read the
/// next event. One function, because both need the subscriber mutably.
async fn next_step(subscriber: &mut Subscriber, unsubscribe: bool) -> Step {
    if unsubscribe {
        Step::Unsubscribed(subscriber.drain().await)
    } else {
        Step::Event(subscriber.next().await)
    }
}

/// Makes sure the server has the unsubscribe (a round trip), so that from the log line
/// on, new events go to the other workers.
async fn confirm_unsubscribe(client: Client, deadline: Instant) {
    match tokio::time::timeout_at(deadline, client.flush()).await {
        Ok(Ok(())) => tracing::info!("draining: unsubscribed; finishing in-flight events"),
        _ => tracing::warn!(
            "draining: the unsubscribe may not have reached NATS; finishing in-flight events"
        ),
    }
}

async fn poll_opt(future: &mut Option<BoxFuture<'static, ()>>) {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Answers one request and publishes the reply. Never panics on input: a bad request
/// gets a `rejected` reply and the loop goes on.
async fn handle(worker: Arc<Worker>, client: Client, message: async_nats::Message, serves: Serves) {
    let reply = match serves {
        Serves::Turns => super::answer(&worker, &message.payload).await.encode(),
        Serves::Recalls => {
            let reply = crate::recall::answer(
                worker.store().as_ref(),
                &message.payload,
                worker.redacts_secrets(),
            )
            .await;
            worker.metrics().recalled(match reply.status {
                RecallStatus::Ok => "ok",
                RecallStatus::Rejected => "rejected",
                RecallStatus::Failed | RecallStatus::Other => "failed",
            });
            reply.encode_within(client.server_info().max_payload)
        }
    };
    // A request without a reply subject was fire-and-forget: processed, not answered.
    if let Some(to) = message.reply
        && let Err(e) = client.publish(to, reply.into()).await
    {
        tracing::warn!(error = %e, "could not publish the reply");
    }
}

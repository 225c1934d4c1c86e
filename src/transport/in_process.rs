//! The request transport over a channel: the same requests, the same [`Worker`] and the
//! same replies as core NATS ([`super::requests`]), for an agent that runs in the worker's
//! own process. The demo uses it when no NATS answers; nothing else need be installed.
//!
//! It keeps the request path's rules: at most `WORKER_CONCURRENCY` events in flight (the
//! next request is read only when there is room, so a saturated worker leaves requests
//! queued in the channel), a malformed request gets a `rejected` reply, and on shutdown
//! it stops taking requests, answers those already queued and in flight within the grace
//! period, and ends. The client side fails open as [`crate::client::TurnClient`] does:
//! whatever goes wrong, the decision is "proceed".

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Decision;
use crate::health::Health;
use crate::protocol::{Reply, Request};
use crate::worker::Worker;

/// One request and where its reply goes.
struct Call {
    payload: Vec<u8>,
    reply: oneshot::Sender<Reply>,
}

/// What an agent holds to ask the in-process worker; cheap to clone.
#[derive(Clone, Debug)]
pub struct InProcessClient {
    calls: mpsc::Sender<Call>,
}

/// The worker's end of the channel, for [`InProcessServer`].
#[derive(Debug)]
pub struct Incoming {
    calls: mpsc::Receiver<Call>,
}

/// A connected client and server end; `capacity` requests may wait in the channel.
pub fn channel(capacity: usize) -> (InProcessClient, Incoming) {
    let (calls, receiver) = mpsc::channel(capacity.max(1));
    (InProcessClient { calls }, Incoming { calls: receiver })
}

impl InProcessClient {
    /// Asks whether `session_id` needs compacting before the next turn, waiting at most
    /// `timeout`, as [`crate::client::TurnClient::turn_starting`] does over NATS.
    pub async fn turn_starting(&self, session_id: &str, timeout: Duration) -> Decision {
        let request = Request {
            session_id: session_id.to_owned(),
            request_id: Some(summarizer_client::new_request_id()),
            ..Request::default()
        };
        self.send(&request.encode(), timeout).await
    }

    /// Sends `payload` as it is. [`Decision::NoWorkers`] when no server runs (it stopped,
    /// or never started), as NATS says when nobody is subscribed; [`Decision::TimedOut`]
    /// when no reply came within `timeout`.
    pub async fn send(&self, payload: &[u8], timeout: Duration) -> Decision {
        let (reply, answer) = oneshot::channel();
        let call = Call {
            payload: payload.to_vec(),
            reply,
        };
        let asked = async {
            self.calls.send(call).await.ok()?;
            answer.await.ok()
        };
        match tokio::time::timeout(timeout, asked).await {
            Err(_elapsed) => Decision::TimedOut,
            Ok(None) => Decision::NoWorkers,
            Ok(Some(reply)) => Decision::Replied(reply),
        }
    }
}

/// Serves [`Incoming`] requests with a worker until shutdown.
pub struct InProcessServer {
    pub incoming: Incoming,
    pub worker: Arc<Worker>,
    pub health: Arc<Health>,
    pub concurrency: usize,
    pub shutdown_grace: Duration,
}

impl InProcessServer {
    /// Serves until `shutdown` fires, then stops taking requests (a client's later
    /// request is answered "no workers"), answers those already queued and in flight
    /// within the grace period, and returns. Events run as futures of this task, as on
    /// the NATS path; a compaction runs as a task of its own.
    pub async fn run(mut self, shutdown: CancellationToken) {
        self.health.set_serving_in_process();
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        let mut deadline: Option<Instant> = None;
        while open || !in_flight.is_empty() {
            let room = in_flight.len() < self.concurrency;
            tokio::select! {
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                call = self.incoming.calls.recv(), if open && room => match call {
                    Some(call) => in_flight.push(handle(self.worker.clone(), call)),
                    // Closed and emptied (shutdown), or every client is gone.
                    None if deadline.is_some() => open = false,
                    None => {
                        open = false;
                        // Nobody can ask any more; wait for shutdown after what runs.
                        while let Some(()) = in_flight.next().await {}
                        shutdown.cancelled().await;
                    }
                },
                () = shutdown.cancelled(), if deadline.is_none() => {
                    self.health.set_draining();
                    self.incoming.calls.close();
                    deadline = Some(Instant::now() + self.shutdown_grace);
                }
                () = sleep_until_opt(deadline) => {
                    tracing::warn!(
                        in_flight = in_flight.len(),
                        "shutdown grace period over; abandoning in-flight events (their agents proceed)"
                    );
                    break;
                }
            }
        }
    }
}

/// Answers one request; a client that gave up meanwhile simply gets nothing.
async fn handle(worker: Arc<Worker>, call: Call) {
    let reply = super::answer(&worker, &call.payload).await;
    let _ = call.reply.send(reply);
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

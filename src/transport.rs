//! NATS: serves the turn subject on the queue group, at most `WORKER_CONCURRENCY`
//! events at once, and drains on shutdown.
//!
//! The next event is read only while fewer than `WORKER_CONCURRENCY` are in flight, so a
//! saturated worker leaves events queued in NATS's client buffer rather than starting
//! more work than it may run.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use async_nats::connection::State;
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Subscriber};
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{Settings, redact_url, url_credentials};
use crate::health::{Health, StartBackoff};
use crate::outcome::Outcome;
use crate::protocol::{InvalidRequest, Reply, Request};
use crate::worker::{Event, Processed, Worker, new_request_id};

pub struct Server {
    pub client: Client,
    pub subscriber: Subscriber,
    pub worker: Arc<Worker>,
    pub health: Arc<Health>,
    pub concurrency: usize,
    pub shutdown_grace: Duration,
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
                    Step::Event(Some(message)) => in_flight.push(handle(self.worker.clone(), self.client.clone(), message)),
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

/// Flushes the replies, unless NATS is unreachable: a flush would then wait for a
/// reconnection that may never come, and the replies are lost anyway.
pub async fn flush_replies(client: &Client) {
    {
        if client.connection_state() != State::Connected {
            tracing::warn!("NATS is unreachable: replies not yet sent are lost");
            return;
        }
        match tokio::time::timeout(ABANDON_WAIT, client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not flush replies"),
            Err(_) => tracing::warn!("could not flush replies in time"),
        }
    }
}

/// How long, after the serving loop, abandoned compactions get to give their leases
/// back, and the replies to be flushed: a few round trips each.
pub const ABANDON_WAIT: Duration = Duration::from_secs(2);

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

/// Decodes, processes and answers one event. Never panics on input: a bad request gets a
/// `rejected` reply and the loop goes on.
async fn handle(worker: Arc<Worker>, client: Client, message: async_nats::Message) {
    let _in_flight = worker.metrics().in_flight();
    let reply = match Request::decode(&message.payload) {
        Ok(request) => {
            let event = Event::new(request.session_id, request.request_id)
                .with_overrides(request.overrides);
            let span = tracing::info_span!(
                "event",
                request_id = %event.request_id,
                session_id = %event.session_id
            );
            let processed = worker.process(&event).instrument(span).await;
            worker.metrics().event(&processed.outcome);
            reply_to_processed(&event, &processed)
        }
        Err(invalid) => reject(&worker, &invalid),
    };
    // A request without a reply subject was fire-and-forget: processed, not answered.
    if let Some(to) = message.reply
        && let Err(e) = client.publish(to, reply.encode().into()).await
    {
        tracing::warn!(error = %e, "could not publish the reply");
    }
}

/// The reply to a processed event (a request or a job).
pub fn reply_to_processed(event: &Event, processed: &Processed) -> Reply {
    Reply::new(
        &processed.outcome,
        Some(&event.session_id),
        Some(&event.request_id),
        processed.session_chars,
        processed.duration.as_millis() as u64,
    )
    .with_latest_compaction_id(processed.latest_compaction_id)
}

/// Logs (rate-limited) and counts an event that could not be decoded, and returns its
/// `rejected` reply, under an id made up for it.
pub fn reject(worker: &Worker, invalid: &InvalidRequest) -> Reply {
    let rid = new_request_id();
    crate::telemetry::warn_rejected_request(&rid, invalid);
    let outcome = Outcome::Rejected {
        detail: invalid.to_string(),
    };
    worker.metrics().event(&outcome);
    Reply::new(&outcome, None, Some(&rid), None, 0)
}

/// The connect options `settings` ask for: name, authentication and TLS.
///
/// # Errors
/// When the credentials file cannot be read.
pub async fn connect_options(settings: &Settings, name: &str) -> anyhow::Result<ConnectOptions> {
    let auth = &settings.nats_auth;
    let mut options = ConnectOptions::new().name(name);
    if let Some(path) = &auth.creds_file {
        options = options
            .credentials_file(path)
            .await
            .with_context(|| format!("NATS_CREDS_FILE: reading {}", path.display()))?;
    }
    // async-nats ignores credentials in the URL; NATS_USER/NATS_PASSWORD win over them.
    let from_url = url_credentials(settings.nats_url.expose());
    if let Some(user) = &auth.user {
        options = options.user_and_password(user.clone(), auth.password.expose().to_owned());
    } else if let Some((user, password)) = from_url {
        options = options.user_and_password(user.to_owned(), password.to_owned());
    }
    if !auth.token.is_empty() {
        options = options.token(auth.token.expose().to_owned());
    }
    if let Some(ca) = &auth.tls_ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&auth.tls_cert_file, &auth.tls_key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options.require_tls(auth.tls_required))
}

/// Connects to NATS, waiting with backoff while the server is unreachable (it may start
/// after the worker). Returns `None` when `shutdown` fires first.
///
/// # Errors
/// When retrying cannot help: bad credentials, a TLS failure, an unparsable URL.
pub async fn connect(
    settings: &Settings,
    name: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Client>> {
    let url = redact_url(settings.nats_url.expose());
    let mut backoff = StartBackoff::default();
    loop {
        let options = connect_options(settings, name).await?;
        let error = match options.connect(settings.nats_url.expose()).await {
            Ok(client) => return Ok(Some(client)),
            Err(e) => e,
        };
        match error.kind() {
            ConnectErrorKind::Io | ConnectErrorKind::TimedOut | ConnectErrorKind::Dns => {}
            _ => bail!(
                "connecting to NATS at {url}: {}",
                crate::error_chain(&error)
            ),
        }
        if !backoff
            .wait(&format!("NATS at {url}"), &error, shutdown)
            .await
        {
            return Ok(None);
        }
    }
}

/// Connects to NATS once, without waiting for a server that is not up: for commands and
/// tools, which report the failure rather than wait.
///
/// # Errors
/// When the server is unreachable or refuses the connection.
pub async fn connect_once(settings: &Settings, name: &str) -> anyhow::Result<Client> {
    connect_options(settings, name)
        .await?
        .connect(settings.nats_url.expose())
        .await
        .with_context(|| {
            format!(
                "connecting to NATS at {}",
                redact_url(settings.nats_url.expose())
            )
        })
}

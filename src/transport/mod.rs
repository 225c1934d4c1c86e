//! The transports events arrive by, side by side: [`requests`] serves core NATS requests
//! on the turn subject (`TRANSPORT=core`), [`jetstream`] durable jobs from the work-queue
//! stream (`TRANSPORT=jetstream`); `both` runs the two. [`in_process`] serves the same
//! requests over a channel, for an agent in the worker's own process (the demo without
//! NATS). What they share is here: the
//! connection to NATS, the reply to an event, the rejection of a malformed one, and the
//! flush of replies at shutdown.

pub mod in_process;
pub mod jetstream;
pub mod requests;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use async_nats::connection::State;
use async_nats::{Client, ConnectErrorKind, ConnectOptions};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{Settings, redact_url, url_credentials};
use crate::health::StartBackoff;
use crate::outcome::Outcome;
use crate::protocol::{InvalidRequest, Reply, Request};
use crate::worker::{Event, Processed, Worker, new_request_id};

pub use in_process::InProcessServer;
pub use jetstream::JobServer;
pub use requests::{Server, Serves};

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

/// Decodes and processes one request, as any request transport receives it, and returns
/// its reply. Never panics on input: a bad request gets a `rejected` reply.
pub async fn answer(worker: &Arc<Worker>, payload: &[u8]) -> Reply {
    let _in_flight = worker.metrics().in_flight();
    match Request::decode(payload) {
        Ok(request) => {
            let event = Event::from_request(request);
            let span = tracing::info_span!(
                "event",
                request_id = %event.request_id,
                session_id = %event.session_id
            );
            let processed = worker.process(&event).instrument(span).await;
            worker.metrics().event(&processed.outcome);
            reply_to_processed(&event, &processed)
        }
        Err(invalid) => reject(worker, &invalid),
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
    .with_keep_chars(processed.keep_chars)
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

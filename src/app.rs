//! Wiring: builds a worker from [`Settings`] (database, migrations, summarizer, NATS,
//! HTTP) and runs it until a shutdown signal.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Settings, redact_url};
use crate::store::PgStore;
use crate::transport::Server;
use crate::worker::{Policy, Worker};
use crate::{http, llm};

pub struct Application {
    store: PgStore,
    server: Server,
    http: Option<TcpListener>,
}

impl Application {
    /// Connects to Postgres and runs the migrations, connects to NATS and subscribes, and
    /// binds the HTTP listener. When this returns, the worker is receiving events.
    ///
    /// # Errors
    /// When a service is unreachable, a migration fails or the HTTP address is taken.
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        tracing::info!("effective configuration: {}", settings.redacted());
        let store = PgStore::connect_lazy(
            settings.database_url.expose(),
            settings.database_max_connections,
        )
        .context("DATABASE_URL")?;
        store.migrate().await.with_context(|| {
            format!(
                "running migrations on {}",
                redact_url(settings.database_url.expose())
            )
        })?;

        let summarizer = llm::from_settings(&settings.llm)?;
        let policy = Policy {
            enabled: settings.enabled,
            limits: settings.limits,
            lease_duration: settings.lease_duration,
        };
        let worker = Arc::new(Worker::new(store.clone(), Arc::from(summarizer), policy));

        let nats_url = settings.nats_url.expose();
        let client = async_nats::ConnectOptions::new()
            .name("summarizer-worker")
            .connect(nats_url)
            .await
            .with_context(|| format!("connecting to NATS at {}", redact_url(nats_url)))?;
        let subscriber = client
            .queue_subscribe(settings.subject.clone(), settings.queue_group.clone())
            .await
            .context("subscribing")?;
        // The server has the subscription once the flush returns: events sent from now on
        // reach this worker.
        client.flush().await.context("subscribing")?;

        let http = match settings.http_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("HTTP_ADDR: binding {addr}"))?,
            ),
            None => None,
        };
        tracing::info!(
            worker = worker.id(),
            subject = %settings.subject,
            queue_group = %settings.queue_group,
            concurrency = settings.concurrency,
            http = ?http.as_ref().and_then(|l| l.local_addr().ok()),
            "worker ready"
        );
        let server = Server {
            client,
            subscriber,
            worker,
            concurrency: settings.concurrency,
            shutdown_grace: settings.shutdown_grace,
        };
        Ok(Self {
            store,
            server,
            http,
        })
    }

    /// The bound HTTP address (useful with port 0).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// Serves until `shutdown` fires, then drains: see [`Server::run`].
    ///
    /// # Errors
    /// When the HTTP server fails.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let http = self.http.map(|listener| {
            let router = http::router(self.store.clone());
            let stop = shutdown.clone().cancelled_owned();
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stop)
                    .await
            })
        });
        self.server.run(shutdown).await;
        if let Some(http) = http {
            http.await
                .context("HTTP server task")?
                .context("HTTP server")?;
        }
        self.store.pool().close().await;
        tracing::info!("worker stopped");
        Ok(())
    }
}

//! Wiring: builds a worker from [`Settings`] and runs it until a shutdown signal.
//!
//! Building never waits on a service. Running starts HTTP first (so `/readyz` can say
//! "not ready"), then waits with backoff for Postgres (migrations) and NATS, subscribes,
//! and serves. A worker started before its services therefore comes up by itself.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use sqlx::migrate::MigrateError;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Settings, redact_url};
use crate::health::{Health, StartBackoff};

use crate::metrics::Metrics;
use crate::store::{SharedStore, is_unreachable};
use crate::summarizer::Summarizer;
use crate::transport::in_process::Incoming;
use crate::transport::jetstream::{self, JobServer};
use crate::transport::{self, InProcessServer, Server, Serves};
use crate::worker::{Policy, Worker};
use crate::{http, llm};

pub struct Application {
    settings: Settings,
    metrics: Arc<Metrics>,
    store: SharedStore,
    worker: Arc<Worker>,
    health: Arc<Health>,
    http: Option<TcpListener>,
}

impl Application {
    /// Validates the wiring and binds the HTTP listener; connects to nothing yet.
    ///
    /// # Errors
    /// When `DATABASE_URL` is not a Postgres or SQLite URL, the summarizer cannot be built, or the
    /// HTTP address is taken.
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let metrics = Arc::new(Metrics::new(settings.concurrency));
        let summarizer = llm::from_settings(&settings.llm, metrics.clone())?;
        Self::build_with(settings, Arc::from(summarizer), metrics).await
    }

    /// [`Application::build`] with a summarizer of the caller's choosing instead of the
    /// one `LLM_PROVIDER` names: the seam tests use to inject summarizers that misbehave
    /// in ways a real provider cannot be made to on demand (a panic, say).
    ///
    /// # Errors
    /// As [`Application::build`].
    pub async fn build_with_summarizer(
        settings: &Settings,
        summarizer: Arc<dyn Summarizer>,
    ) -> anyhow::Result<Self> {
        let metrics = Arc::new(Metrics::new(settings.concurrency));
        Self::build_with(settings, summarizer, metrics).await
    }

    async fn build_with(
        settings: &Settings,
        summarizer: Arc<dyn Summarizer>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        tracing::info!("effective configuration: {}", settings.redacted());
        if settings.lease_duration <= settings.llm.deadline {
            tracing::warn!(
                "LEASE_DURATION_MS is not longer than LLM_DEADLINE_MS: a slow LLM call may \
                 outlive its lease and another worker pay for the same summary (fencing keeps \
                 the result correct)"
            );
        }
        let store = crate::store::connect_lazy(
            settings.database_url.expose(),
            settings.database_max_connections,
            settings.database_acquire_timeout,
        )
        .context("DATABASE_URL")?;
        let policy = Policy {
            enabled: settings.enabled,
            limits: settings.limits,
            threshold_tokens: settings.threshold_tokens,
            bounds: settings.bounds,
            lease_duration: settings.lease_duration,
            failure_backoff: settings.failure_backoff,
            failure_backoff_max: settings.failure_backoff_max,
            summary_max_chars: i64::try_from(settings.llm.summary_max_chars).unwrap_or(i64::MAX),
            user_words_chars: settings.llm.user_words_chars,
            fact_check: settings.fact_check,
            llm_deadline: settings.llm.deadline,
            concurrency: settings.concurrency,
            precompute: settings.precompute,
            idle: settings.idle,
            redact_secrets: settings.redact_secrets,
        };
        let worker = Arc::new(
            Worker::new(store.clone(), summarizer, policy, metrics.clone())
                .with_tool_outputs(settings.tool_outputs.clone()),
        );
        let http = match settings.http_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("HTTP_ADDR: binding {addr}"))?,
            ),
            None => None,
        };
        Ok(Self {
            settings: settings.clone(),
            metrics,
            health: Arc::new(Health::new(store.clone())),
            store,
            worker,
            http,
        })
    }

    /// The bound HTTP address (useful with port 0).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Serves until `shutdown` fires, then drains: see [`Server::run`].
    ///
    /// # Errors
    /// When a service refuses the worker for good (bad NATS credentials, a failed
    /// migration) or the HTTP server fails.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        self.run(shutdown, None).await
    }

    /// [`Application::run_until_stopped`], serving the requests of `incoming` (the
    /// in-process transport: an agent in this process) instead of NATS.
    ///
    /// # Errors
    /// As [`Application::run_until_stopped`].
    pub async fn run_in_process(
        self,
        incoming: Incoming,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        self.run(shutdown, Some(incoming)).await
    }

    async fn run(
        mut self,
        shutdown: CancellationToken,
        incoming: Option<Incoming>,
    ) -> anyhow::Result<()> {
        // HTTP stops with the worker, also when the worker stops on an error.
        let stop_http = shutdown.child_token();
        let http = self.http.take().map(|listener| {
            let router = http::router(
                self.store.clone(),
                self.health.clone(),
                self.metrics.clone(),
            );
            let stop = stop_http.clone().cancelled_owned();
            tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stop)
                    .await
            })
        });
        let served = match incoming {
            Some(incoming) => self.serve_in_process(incoming, &shutdown).await,
            None => self.serve(&shutdown).await,
        };
        stop_http.cancel();
        if let Some(http) = http {
            http.await
                .context("HTTP server task")?
                .context("HTTP server")?;
        }
        self.store.close().await;
        served?;
        tracing::info!("worker stopped");
        Ok(())
    }

    async fn serve(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        if !self.migrate(shutdown).await? {
            return Ok(());
        }
        let settings = &self.settings;
        let Some(client) = transport::connect(settings, "summarizer-worker", shutdown).await?
        else {
            return Ok(());
        };
        let transport = settings.jobs.transport;
        // The job stream first: once subscribed to requests, this worker gets its share
        // of them, and must not then wait for JetStream before answering them.
        let jobs = if transport.serves_jobs() {
            let Some(consumer) = self.bind_jobs(&client, shutdown).await? else {
                return Ok(());
            };
            Some(JobServer {
                client: client.clone(),
                consumer,
                worker: self.worker.clone(),
                store: self.store.clone(),
                jobs: settings.jobs.clone(),
                concurrency: settings.concurrency,
                shutdown_grace: settings.shutdown_grace,
            })
        } else {
            None
        };
        let server = |subscriber, serves| Server {
            client: client.clone(),
            subscriber,
            worker: self.worker.clone(),
            health: self.health.clone(),
            concurrency: settings.concurrency,
            shutdown_grace: settings.shutdown_grace,
            serves,
        };
        let requests = if transport.serves_requests() {
            let subscriber = client
                .queue_subscribe(settings.subject.clone(), settings.queue_group.clone())
                .await
                .context("subscribing")?;
            Some(server(subscriber, Serves::Turns))
        } else {
            None
        };
        // Recall is a request whatever the transport of turns: every worker serves it.
        let recalls = client
            .queue_subscribe(
                settings.recall_subject.clone(),
                settings.queue_group.clone(),
            )
            .await
            .context("subscribing to recall requests")?;
        // A search holds a database connection for up to 3 s (a very large archive): at
        // most a quarter of the pool's connections, so that turns always find theirs.
        let recalls = Server {
            concurrency: recall_concurrency(settings.database_max_connections),
            ..server(recalls, Serves::Recalls)
        };
        // The server has the subscriptions once the flush returns: requests sent from now
        // on reach this worker.
        client.flush().await.context("subscribing")?;
        self.health.set_subscribed(client.clone());
        tracing::info!(
            worker = self.worker.id(),
            store = %self.store.backend(),
            transport = transport.as_str(),
            subject = %settings.subject,
            recall_subject = %settings.recall_subject,
            queue_group = %settings.queue_group,
            jobs = %settings.jobs.stream_subjects(),
            concurrency = settings.concurrency,
            "worker ready"
        );
        let serve_requests = async {
            if let Some(server) = requests {
                server.run(shutdown.clone()).await;
            }
        };
        let serve_jobs = async {
            if let Some(server) = jobs {
                server.run(shutdown.clone()).await;
            }
        };
        tokio::join!(
            serve_requests,
            serve_jobs,
            recalls.run(shutdown.clone()),
            self.worker.clone().run_idle_passes(shutdown.clone()),
        );
        // Compactions whose events were abandoned give their leases back.
        self.worker
            .abandon_compactions(transport::ABANDON_WAIT)
            .await;
        transport::flush_replies(&client).await;
        Ok(())
    }

    async fn serve_in_process(
        &self,
        incoming: Incoming,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        if !self.migrate(shutdown).await? {
            return Ok(());
        }
        let server = InProcessServer {
            incoming,
            worker: self.worker.clone(),
            health: self.health.clone(),
            concurrency: self.settings.concurrency,
            shutdown_grace: self.settings.shutdown_grace,
        };
        tracing::info!(
            worker = self.worker.id(),
            store = %self.store.backend(),
            transport = "in_process",
            concurrency = self.settings.concurrency,
            "worker ready"
        );
        tokio::join!(
            server.run(shutdown.clone()),
            self.worker.clone().run_idle_passes(shutdown.clone()),
        );
        self.worker
            .abandon_compactions(transport::ABANDON_WAIT)
            .await;
        Ok(())
    }

    /// Creates or binds the job stream and consumer, waiting with backoff while
    /// JetStream does not answer. `None` when `shutdown` fired first.
    async fn bind_jobs(
        &self,
        client: &async_nats::Client,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<async_nats::jetstream::consumer::PullConsumer>> {
        let mut backoff = StartBackoff::default();
        loop {
            let bound = jetstream::bind(client, &self.settings.jobs, &self.settings.subject).await;
            let error = match bound {
                Ok(consumer) => return Ok(Some(consumer)),
                Err(e) if e.is::<jetstream::Unusable>() => return Err(e),
                Err(e) => e,
            };
            if !backoff
                .wait("the JetStream job stream", &*error, shutdown)
                .await
            {
                return Ok(None);
            }
        }
    }

    /// Applies the migrations, waiting with backoff while the database is unreachable.
    /// Returns false when `shutdown` fired first.
    async fn migrate(&self, shutdown: &CancellationToken) -> anyhow::Result<bool> {
        let url = redact_url(self.settings.database_url.expose());
        let mut backoff = StartBackoff::default();
        loop {
            let error = match self.store.migrate().await {
                Ok(()) => {
                    self.health.set_migrated();
                    return Ok(true);
                }
                Err(e) => e,
            };
            let unreachable = match &error {
                MigrateError::Execute(e) => is_unreachable(e),
                _ => false,
            };
            if !unreachable {
                return Err(error).with_context(|| format!("running migrations on {url}"));
            }
            if !backoff
                .wait(
                    &format!("{} at {url}", self.store.backend()),
                    &error,
                    shutdown,
                )
                .await
            {
                return Ok(false);
            }
        }
    }
}

/// How many recall requests a worker answers at once: a quarter of its database
/// connections, at least one.
fn recall_concurrency(database_max_connections: u32) -> usize {
    usize::try_from(database_max_connections / 4)
        .unwrap_or(usize::MAX)
        .max(1)
}

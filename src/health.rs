//! Readiness: what `GET /readyz` reports. The worker is ready when the migrations are
//! applied, it is subscribed on a connected NATS, the database answers, and it is not
//! draining.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::connection::State;
use serde::Serialize;

use crate::store::SharedStore;

/// How long the readiness probe waits for the database.
const DATABASE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The wait between attempts to reach a service at start: from 100 ms, doubling up to
/// 5 s, cut short by shutdown. The worker stays up and not ready meanwhile.
#[derive(Debug)]
pub struct StartBackoff {
    wait: Duration,
}

impl Default for StartBackoff {
    fn default() -> Self {
        Self {
            wait: Duration::from_millis(100),
        }
    }
}

impl StartBackoff {
    /// Logs that `service` is unreachable and why, then waits. Returns false when
    /// `shutdown` fired first.
    pub async fn wait(
        &mut self,
        service: &str,
        error: &(dyn std::error::Error + Send + Sync),
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> bool {
        tracing::warn!(
            retry_in_ms = self.wait.as_millis() as u64,
            "{service} unreachable, retrying: {}",
            crate::error_chain(error)
        );
        let waited = tokio::select! {
            () = tokio::time::sleep(self.wait) => true,
            () = shutdown.cancelled() => false,
        };
        self.wait = (self.wait * 2).min(Duration::from_secs(5));
        waited
    }
}

#[derive(Debug)]
pub struct Health {
    store: SharedStore,
    migrated: AtomicBool,
    draining: AtomicBool,
    /// Set once subscribed; its connection state is read live.
    nats: OnceLock<async_nats::Client>,
    /// Serving over the in-process transport, which has no connection to lose: it
    /// counts as subscribed and connected.
    in_process: AtomicBool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub migrations_applied: bool,
    pub subscribed: bool,
    pub nats_connected: bool,
    pub database_reachable: bool,
    pub draining: bool,
}

impl Health {
    pub fn new(store: SharedStore) -> Self {
        Self {
            store,
            migrated: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            nats: OnceLock::new(),
            in_process: AtomicBool::new(false),
        }
    }

    pub fn set_migrated(&self) {
        self.migrated.store(true, Ordering::Relaxed);
    }

    pub fn set_subscribed(&self, client: async_nats::Client) {
        let _ = self.nats.set(client);
    }

    pub fn set_serving_in_process(&self) {
        self.in_process.store(true, Ordering::Relaxed);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Returns once [`Health::readiness`] says ready; for in-process callers (the demo,
    /// tests) that must not send before the worker subscribed.
    pub async fn wait_until_ready(&self) {
        while !self.readiness().await.ready {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn readiness(&self) -> Readiness {
        let database_reachable = tokio::time::timeout(DATABASE_PROBE_TIMEOUT, self.store.ping())
            .await
            .is_ok_and(|ping| ping.is_ok());
        let migrations_applied = self.migrated.load(Ordering::Relaxed);
        let in_process = self.in_process.load(Ordering::Relaxed);
        let subscribed = in_process || self.nats.get().is_some();
        let nats_connected = in_process
            || self
                .nats
                .get()
                .is_some_and(|c| c.connection_state() == State::Connected);
        let draining = self.draining.load(Ordering::Relaxed);
        Readiness {
            ready: migrations_applied
                && subscribed
                && nats_connected
                && database_reachable
                && !draining,
            migrations_applied,
            subscribed,
            nats_connected,
            database_reachable,
            draining,
        }
    }
}

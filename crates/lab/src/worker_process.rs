//! Worker processes of this very binary, for the commands that run a fleet on one
//! machine (`chaos`, `bench`).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

/// Starts `summarizer worker` with `env` over the inherited environment; its stdout is
/// dropped, its stderr (warnings and errors) kept. Killed if the handle is dropped.
///
/// # Errors
/// When this binary cannot be found or started.
pub fn spawn<K: AsRef<str>, V: AsRef<str>>(env: &HashMap<K, V>) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding this binary")?;
    Command::new(exe)
        .arg("worker")
        .envs(env.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting a worker")
}

/// Sends `signal` (`TERM`, `KILL`, ...) and waits for the exit; a worker that outlives
/// ten seconds is killed.
pub async fn stop(worker: &mut Child, signal: &str) {
    if let Some(pid) = worker.id() {
        let _ = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(10), worker.wait())
        .await
        .is_err()
    {
        let _ = worker.kill().await;
    }
}

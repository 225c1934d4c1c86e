//! Fault fixtures that never touch the shared services: a private `nats-server` on a free
//! port, a TCP proxy in front of Postgres that a test can cut, and real worker processes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::AbortHandle;

use crate::helpers::eventually;

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).await.is_ok()
}

/// A private `nats-server`, killed on drop.
pub struct NatsServer {
    pub port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts `nats-server -a 127.0.0.1 -p <free port> <args>`.
    pub async fn start(args: &[&str]) -> Self {
        Self::start_on(free_port(), args).await
    }

    pub async fn start_on(port: u16, args: &[&str]) -> Self {
        let mut server = Self {
            port,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
        };
        server.restart().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it again on the same port, and waits until it accepts connections.
    pub async fn restart(&mut self) {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server is installed");
        self.child = Some(child);
        let port = self.port;
        eventually("nats-server to listen", || listening(port)).await;
    }

    /// Kills it (an outage), and waits until the port is closed.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
        let port = self.port;
        eventually(
            "nats-server to stop",
            || async move { !listening(port).await },
        )
        .await;
    }
}

/// A TCP proxy to Postgres. Cutting it drops every connection through it and refuses new
/// ones until it is restored; it can also cut itself when a client sends a marker (a
/// piece of SQL), which stops the worker exactly at that statement.
#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
}

#[derive(Default)]
struct ProxyState {
    cut: bool,
    marker: Option<Vec<u8>>,
    connections: Vec<AbortHandle>,
}

impl ProxyState {
    fn cut(&mut self) {
        self.cut = true;
        self.marker = None;
        for connection in self.connections.drain(..) {
            connection.abort();
        }
    }
}

impl Proxy {
    pub async fn start(target: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Self {
            addr: listener.local_addr().unwrap(),
            state: Arc::default(),
        };
        let state = proxy.state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut guard = state.lock().unwrap();
                if guard.cut {
                    continue; // dropped: refused
                }
                let task = tokio::spawn(pipe(client, target, state.clone()));
                guard.connections.push(task.abort_handle());
            }
        });
        proxy
    }

    /// A Postgres URL through the proxy. Without TLS and statement caching, every
    /// statement's SQL crosses the wire in clear, where a marker can see it.
    pub fn database_url(&self, database_url: &str) -> String {
        let db = database_url.rsplit('/').next().unwrap();
        format!(
            "postgres://postgres@{}/{db}?sslmode=disable&statement-cache-capacity=0",
            self.addr
        )
    }

    pub fn cut(&self) {
        self.state.lock().unwrap().cut();
    }

    /// Cuts when a client next sends `marker`, before it reaches Postgres.
    pub fn cut_on(&self, marker: &str) {
        self.state.lock().unwrap().marker = Some(marker.as_bytes().to_vec());
    }

    pub fn restore(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = false;
        state.marker = None;
    }

    pub fn is_cut(&self) -> bool {
        self.state.lock().unwrap().cut
    }
}

async fn pipe(client: TcpStream, target: &str, state: Arc<Mutex<ProxyState>>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = client_read.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            {
                let mut guard = state.lock().unwrap();
                let hit = guard
                    .marker
                    .as_ref()
                    .is_some_and(|m| buf[..n].windows(m.len()).any(|w| w == m.as_slice()));
                if hit {
                    guard.cut();
                    return;
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let downstream = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        () = upstream => {}
        _ = downstream => {}
    }
}

/// A `summarizer worker` process with its logs in a file.
pub struct WorkerProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl WorkerProcess {
    pub fn spawn(env: &HashMap<String, String>) -> Self {
        let log =
            std::env::temp_dir().join(format!("summarizer-worker-{:08x}.log", fastrand::u32(..)));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_summarizer"))
            .arg("worker")
            .env_clear()
            .envs(env)
            .env("HOSTNAME", "w")
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn signal(&self, signal: &str) {
        signal_pid(self.pid(), signal).await;
    }

    pub async fn wait_for_log(&self, text: &str) {
        eventually(text, || async { self.logs().contains(text) }).await;
    }

    /// Waits for the exit; panics after `limit`.
    pub async fn exit_status(&mut self, limit: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .expect("the worker exits in time")
            .unwrap()
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `kill -<signal> <pid>`.
pub async fn signal_pid(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

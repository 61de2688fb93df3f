//! `up`'s own nats-server and data dir: a lock so one `up` owns a data dir, a current
//! broker binary (installed into the cache when the one on `PATH` is too old), and a
//! supervisor thread that restarts the broker when it dies and stops it on exit. The
//! broker requires a user and password of every client (in its 0600 config file, never
//! on its command line), also after a restart.

use anyhow::{Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use streamgate_bus::local::{ensure_current, free_port, LocalAuth, LocalNats};
use tokio::sync::watch;

/// Holds `<data dir>/up.lock` for as long as it lives: a second `up` on the same data
/// dir would start a second broker on the same store and overwrite `up.json`.
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock, or explains who holds it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock> {
        use std::io::Write as _;
        let path = data_dir.join("up.lock");
        let mut file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if file.try_lock().is_err() {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another `streamgate up`".to_owned()
            } else {
                format!("another `streamgate up` (pid {holder})")
            };
            anyhow::bail!(
                "{who} is already serving {}: stop it first, or give this one its own \
                 --data-dir",
                data_dir.display()
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(DataDirLock { _file: file })
    }
}

/// How many times the broker may die within [`RESTART_WINDOW`] before `up` gives up.
const MAX_RESTARTS: usize = 3;
const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How often the supervisor looks at the broker process.
const POLL: Duration = Duration::from_millis(200);

/// The local broker, owned by a supervisor thread.
pub struct SupervisedNats {
    url: String,
    stop: mpsc::Sender<Duration>,
    thread: Option<std::thread::JoinHandle<()>>,
    failed: watch::Receiver<Option<String>>,
}

impl SupervisedNats {
    /// Finds (or installs) a current nats-server and starts it on a free loopback port
    /// with its store in `store`, requiring `auth` of every client. The supervisor thread
    /// spawns it, so the broker is tied to that thread's life (no orphan when `up` is
    /// SIGKILLed).
    pub async fn start(store: PathBuf, auth: LocalAuth) -> Result<SupervisedNats> {
        let binary = tokio::task::spawn_blocking(ensure_current).await??;
        if let Some(line) = &binary.installed {
            eprintln!("{line}");
        }
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = mpsc::channel();
        let (failed_tx, failed_rx) = watch::channel(None);
        let thread = std::thread::Builder::new()
            .name("nats-supervisor".into())
            .spawn(move || {
                let server = match spawn_with_retries(&binary.path, &store, &auth) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(server.url()));
                supervise(server, &stop_rx, &failed_tx);
            })?;
        let url = ready_rx
            .await
            .context("the nats-server supervisor ended")??;
        Ok(SupervisedNats {
            url,
            stop: stop_tx,
            thread: Some(thread),
            failed: failed_rx,
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Resolves with the reason once the supervisor has given up on the broker.
    pub async fn failed(&self) -> String {
        let mut rx = self.failed.clone();
        loop {
            if let Some(reason) = rx.borrow_and_update().clone() {
                return reason;
            }
            if rx.changed().await.is_err() {
                // The supervisor ended without a failure: it was stopped.
                return std::future::pending().await;
            }
        }
    }

    /// Stops the broker cleanly (SIGTERM, then SIGKILL after `patience`).
    pub async fn stop(mut self, patience: Duration) {
        let _ = self.stop.send(patience);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

fn spawn_with_retries(binary: &Path, store: &Path, auth: &LocalAuth) -> Result<LocalNats> {
    let mut last = None;
    // A free port can be taken between choosing it and the server binding it.
    for _ in 0..5 {
        match LocalNats::spawn_tied_to_thread_with_auth(binary, free_port()?, store, auth.clone()) {
            Ok(n) => return Ok(n),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("nats-server did not start"), Into::into))
}

/// Watches the broker until told to stop: a broker that exits is restarted on the same
/// port and store (clients reconnect by themselves); one that keeps dying, or cannot
/// start again, is reported through `failed` and left down.
fn supervise(
    mut server: LocalNats,
    stop: &mpsc::Receiver<Duration>,
    failed: &watch::Sender<Option<String>>,
) {
    let mut deaths: Vec<Instant> = Vec::new();
    loop {
        match stop.recv_timeout(POLL) {
            Ok(patience) => {
                server.stop(patience);
                return;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                server.stop(Duration::from_secs(2));
                return;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if server.is_running() {
            continue;
        }
        let now = Instant::now();
        deaths.retain(|t| now.duration_since(*t) < RESTART_WINDOW);
        deaths.push(now);
        let log = server.store_dir().join("nats-server.log");
        if deaths.len() > MAX_RESTARTS {
            let _ = failed.send(Some(format!(
                "nats-server exited {} times within {}s; giving up (its log: {})",
                deaths.len(),
                RESTART_WINDOW.as_secs(),
                log.display()
            )));
            return;
        }
        eprintln!("warning: nats-server exited; restarting it on the same port and store");
        if let Err(e) = server.restart() {
            let _ = failed.send(Some(format!(
                "nats-server exited and could not be restarted: {e}"
            )));
            return;
        }
        tracing::info!("nats-server restarted");
    }
}

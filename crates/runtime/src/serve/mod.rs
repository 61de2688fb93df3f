//! One way to start a server, shared by every service: gRPC servers
//! ([`grpc::start`]: the service behind an auth interceptor, health, reflection) and
//! HTTP servers ([`http::start`]: an axum router), both with optional TLS (certificate +
//! key; a client CA turns on mTLS) and the same connection limits.
//!
//! Limits ([`Limits`]), so idle or slow peers cannot exhaust file descriptors:
//! - at most `max_connections` open connections per server: beyond it a new connection
//!   closes the one that has been silent longest (connected, no byte sent), else waits
//!   for one to close (the kernel's backlog holds the rest) — a flood of idle
//!   connections cannot keep a peer that speaks out;
//! - at most `max_connections_per_ip` of them from one peer address: at its share, the
//!   peer's own longest-silent connection makes room, else its new one is refused;
//! - `header_read_timeout`: a connection's first byte (counted from accept), a TLS
//!   handshake and (HTTP/1) a request's headers must arrive within it, else the
//!   connection is closed;
//! - `idle_timeout`: a connection on which no byte moved either way for this long is
//!   closed (HTTP/2 and gRPC connections are pinged at a third of it, so a live peer on a
//!   quiet stream stays connected; SSE pages get keep-alive comments).
//!
//! # Layout
//! - [`ServeArgs`]: the flags and `STREAMGATE_*` variables every service binary
//!   flattens in: `--tls-cert`, `--tls-key`, `--tls-client-ca`, `--max-connections`,
//!   `--header-read-timeout-secs`, `--conn-idle-timeout-secs`.
//! - [`tls`]: PEM files into rustls/tonic server configs, and [`tls::ClientTlsArgs`]
//!   (`--ca`, `--client-cert`, `--client-key`) for the CLI clients.
//! - [`grpc`], [`http`]: the two server kinds.
//! - `conn`: the accepted connection with its limit permit and idle timer.
//! - `counted`: every response counted by server and status.
//! - [`listen`] (this file): the listening socket every server binds, with a backlog
//!   that holds a burst of connections.

mod conn;
mod counted;
pub mod grpc;
pub mod http;
pub mod tls;

use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
pub use tls::{ClientTlsArgs, TlsError, TlsFiles};

/// Connection limits of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Open connections of one peer address at most (at it, the peer's longest-silent
    /// connection makes room, else the new one is refused).
    pub max_connections_per_ip: usize,
    /// Time for the TLS handshake and an HTTP/1 request's headers.
    pub header_read_timeout: Duration,
    /// A connection with no traffic for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_connections_per_ip: 512,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// How a server is started: TLS (none: plaintext) and limits.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Certificate, key and optional client CA.
    pub tls: Option<TlsFiles>,
    /// Connection limits.
    pub limits: Limits,
}

/// Server flags of every service binary.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TLS certificate chain (PEM) of this service's servers; with --tls-key turns TLS on.
    #[arg(long, env = "STREAMGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert (keep it mode 0600).
    #[arg(long, env = "STREAMGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate(s) (PEM) that client certificates must chain to: turns on mTLS
    /// (clients without such a certificate are refused at the handshake).
    #[arg(long, env = "STREAMGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Open connections per server at most (more wait in the kernel's backlog).
    #[arg(long, env = "STREAMGATE_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,
    /// Open connections of one peer address per server at most (default: half of
    /// --max-connections). Behind a proxy every client has the proxy's address: raise it
    /// to --max-connections there.
    #[arg(long, env = "STREAMGATE_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<usize>,
    /// Seconds for a TLS handshake and an HTTP request's headers.
    #[arg(
        long,
        env = "STREAMGATE_HEADER_READ_TIMEOUT_SECS",
        default_value_t = 10
    )]
    pub header_read_timeout_secs: u64,
    /// Seconds without traffic after which a connection is closed.
    #[arg(long, env = "STREAMGATE_CONN_IDLE_TIMEOUT_SECS", default_value_t = 120)]
    pub conn_idle_timeout_secs: u64,
}

impl ServeArgs {
    /// The options these flags describe.
    pub fn options(&self) -> ServeOptions {
        ServeOptions {
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                }),
                _ => None,
            },
            limits: Limits {
                max_connections: self.max_connections.max(1),
                max_connections_per_ip: self
                    .max_connections_per_ip
                    .unwrap_or(self.max_connections / 2)
                    .clamp(1, self.max_connections.max(1)),
                header_read_timeout: Duration::from_secs(self.header_read_timeout_secs.max(1)),
                idle_timeout: Duration::from_secs(self.conn_idle_timeout_secs.max(1)),
            },
        }
    }
}

/// A server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS files are unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The reflection service could not be built.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// A bound server: its address, and the task that serves until shutdown (then drains
/// its connections). Spawn the task.
pub struct Serving {
    /// The bound address (port 0 resolved).
    pub addr: SocketAddr,
    /// Serves until the shutdown token fires and the connections are drained.
    pub task: BoxFuture<'static, Result<(), ServeError>>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving").field("addr", &self.addr).finish()
    }
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    listen(addr).map_err(|source| ServeError::Bind { addr, source })
}

/// Connections the kernel holds for a server before it accepts them. Beyond the
/// backlog a new connection's handshake is dropped and the client tries again only after
/// a second (TCP's first retransmission): with the 128 a plain bind gets, 200 webhook
/// channels connecting to one receiver at once waited a second each, 1% of all ops
/// (docs/performance.md, twenty-second stop). The kernel caps it at `net.core.somaxconn`.
pub const BACKLOG: u32 = 4096;

/// A TCP listener on `addr` with [`BACKLOG`] (address reuse as `TcpListener::bind` sets
/// it). For every server a service or the CLI starts.
pub fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

//! What every streamgate service process needs, in one place so the services do not
//! repeat it: telemetry, configuration files, graceful shutdown, and gRPC plumbing
//! (operator/channel bearer-token auth, health, reflection).
//!
//! # Layout
//! - [`clock`]: `now_ms`, the wall clock in ms since the Unix epoch.
//! - [`telemetry`]: logging, Prometheus metrics, OpenTelemetry span export.
//! - [`metrics`]: the catalogue of every metric and its help text.
//! - [`config`]: `KEY=VALUE` config files that back flags and environment variables.
//! - [`nats`]: the shared bus flags ([`nats::NatsArgs`]: `--nats` server lists and NATS
//!   credentials) and connecting with them.
//! - [`shutdown`]: SIGINT/SIGTERM into a cancellation token.
//! - [`startup`]: starting again while a fresh JetStream cluster still times out.
//! - [`rpc`]: bearer-token interceptors (server and client), health and reflection.
//! - [`serve`]: starting gRPC and HTTP servers the one shared way: auth interceptor,
//!   health, reflection, TLS/mTLS, connection limit, header-read and idle timeouts.
#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod metrics;
pub mod nats;
pub mod rpc;
pub mod serve;
pub mod shutdown;
pub mod startup;
pub mod telemetry;

pub use nats::NatsArgs;
pub use telemetry::{init as init_telemetry, TelemetryArgs, TelemetryConfig};

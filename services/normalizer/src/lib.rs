//! The streamgate normalizer service: ingest front doors land raw provider bytes in
//! SG_RAW; the worker turns each run's chunks into canonical events on SG_EVENTS.
//!
//! A run is `(tenant, run id)`: a run id is unique only within its tenant (docs/architecture.md
//! §3). The run table, the open-run registry (KV key `<partition>.<tenant>.<run>`) and the
//! one-request-per-run ingest lock are all keyed by both, so the same run id under two
//! tenants is ingested and normalized as two independent runs.
//!
//! # Layout
//! - [`cli`]: the service's flags and `run` (binary and `streamgate normalizer`).
//! - [`config`]: worker settings.
//! - [`runs`]: the in-flight run table (one adapter per run, rebuilt from SG_RAW when
//!   needed).
//! - [`worker`]: the SG_RAW consumer loops, one per partition this replica holds a
//!   lease on (replicas split the partitions; `streamgate_bus::lease`).
//! - [`open_runs`]: runs started and not closed, per partition (KV), so an abandoned
//!   run is closed by whichever replica owns its partition later.
//! - [`ingest`]: the gRPC and HTTP front doors over one [`ingest::Ingestor`], and who
//!   may write which tenant ([`ingest::auth`]: bearer tokens scoped to tenants).
//! - [`gateway`]: following a live OpenClaw gateway over WebSocket (`--follow-gateway`),
//!   its agent events routed by run into the `openclaw-events` family.
//! - [`service`]: everything above started together; the doors through
//!   `streamgate_runtime::serve` (health, reflection, TLS/mTLS, connection limits).
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod gateway;
pub mod ingest;
pub mod open_runs;
pub mod runs;
pub mod service;
pub mod worker;

pub use config::NormalizerConfig;
pub use service::{start, Listeners, Running};

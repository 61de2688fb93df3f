//! The system tests: streamgate as a whole, against a real `nats-server` (spawned per
//! test, clusters on loopback), a real PostgreSQL, child processes of this build, the
//! real consumers of its encodings (Node, Python) and headless Chromium.
//!
//! One test binary for all of them: each binary links the whole workspace, so one link
//! instead of fifteen. Tests still run two at a time (one per core), as they did within
//! each binary before. The broker-free tests (`normalize_cli`, `metrics_catalogue`) stay
//! binaries of their own: they are the fast tier (`scripts/test.sh --fast`).
//!
//! # Layout
//! - [`common`]: the shared harness — captures and their reference output, a whole
//!   pipeline in-process or as killable child processes, ingest, archive reads, waits.
//! - [`cdp`]: a headless Chromium driven over the DevTools protocol (shared with the
//!   projector's web page tests).
//! - One module per capability: [`pipeline`] (ingest → archive → replay), [`tenants`],
//!   [`leases`], [`cluster`], [`tracing`], [`tls_cli`], [`nats_front_door`],
//!   [`agent_runtimes`], [`follow_gateway`], [`projector_archive`], [`run_stream_encodings`],
//!   [`clients`], [`tail`], [`up`], [`manifests`].
//!
//! Run one capability with a filter: `cargo test --test system -- up::`.

#[path = "../../services/projector/tests/projector/cdp.rs"]
mod cdp;
mod common;

mod agent_runtimes;
mod clients;
mod cluster;
mod follow_gateway;
mod leases;
mod manifests;
mod nats_front_door;
mod pipeline;
mod projector_archive;
mod run_stream_encodings;
mod tail;
mod tenants;
mod tls_cli;
mod tracing;
mod up;

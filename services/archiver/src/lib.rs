//! The streamgate archiver service: a durable consumer of SG_EVENTS (and optionally
//! SG_RAW) that commits every event to the archive before acknowledging it, and the
//! operator-only `ArchiveService` that replays what it holds.
//!
//! # Layout
//! - [`accounting`]: the price table and what runs cost.
//! - [`cli`]: the service's flags and `run` (binary and `streamgate archiver`).
//! - [`consumer`]: SG_EVENTS (and SG_RAW) → store, ack after commit.
//! - [`retention`]: per-tenant retention policies and their scheduled enforcement.
//! - [`replay`]: the `ArchiveService` gRPC implementation.
//! - [`history`]: `verify` and `backfill` (re-normalizing archived raw chunks, new
//!   generations).
//! - [`erase`]: erasing a run, session or tenant from the broker and the archive.
//! - [`genai`]: runs as OpenTelemetry GenAI traces over OTLP (batch and continuous).
//! - [`thinking`]: the opt-in search over thinking (`--search-thinking`).
//! - [`convert`]: archive records and folds → protobuf replies.
//! - [`service`]: consumer and gRPC server started together.
#![forbid(unsafe_code)]

pub mod accounting;
pub mod cli;
pub mod consumer;
pub mod convert;
pub mod erase;
pub mod genai;
pub mod history;
pub mod replay;
pub mod retention;
pub mod service;
pub mod thinking;

pub use consumer::{CommitHook, ConsumerConfig};
pub use service::{start, ArchiverListen, Running};

//! The streamgate projector service: one chat channel fed from `SG_EVENTS`. Every run the
//! channel sees is folded by the pure projection core into ops (typing, draft upsert,
//! settle, final, …) that the delivery engine executes on the channel's sink, with the
//! delivery state in JetStream KV so a restarted projector neither repeats a final nor
//! duplicates a draft (docs/architecture.md §3, §4, §6; spec §7.3).
//!
//! # Layout
//! - [`config`]: [`ChannelConfig`] (sink, tier, filters, default settings, budgets, rate
//!   limits) and the `kind=target` channel shorthand used by `streamgate up`.
//! - [`kv`]: the KV buckets — `SG_DELIVERY` as a [`streamgate_sinks::StateStore`], active
//!   run markers, and `SG_SETTINGS` per-chat overrides.
//! - [`channel`]: [`Channel`], one file per job — the run table (one `RunProjection`
//!   per run, rebuilds of in-flight runs), crash recovery, settings changes, and the
//!   per-partition consumer loops.
//! - [`grpc`]: `ProjectorService` (Subscribe / GetDraft / ListActiveRuns / SetSettings).
//! - [`web`]: the tier-T2 web sink and its self-contained page with SSE.
//! - [`run_stream`]: `GET /v1/runs/{tenant}/{run}/events`, one run's display-safe events
//!   over SSE from `SG_EVENTS`, resumable by seq (served beside the web page).
//! - [`service`]: everything started together ([`start`]).
//! - [`cli`]: flags and `run` for the binary.
//! - [`error`]: [`ProjectorError`], every failure.
//!
//! # Decisions
//! - One projector process (or `streamgate up` task set) serves one channel; several
//!   channels are several instances, each with its own bearer token and one durable
//!   consumer per partition, `sg-projector-<channel>-pNN` (filter
//!   `sg.evt.<tenant|*>.<p>.*`).
//! - Replicas: a channel's replicas split its partitions with leases in `SG_LEASES`
//!   (group `projector.<channel>`, [`streamgate_bus::lease`]), so every run is rendered by
//!   one replica, in order. Acquiring a partition runs crash recovery over that
//!   partition's markers, then consumes from its durable's ack floor; a released
//!   partition drains (messages in hand, then a bounded wait for the engine to execute
//!   what was queued) before its lease goes; a lost one is aborted. Either way its runs
//!   leave this replica's memory and the next owner rebuilds them.
//! - Local answers: `ListActiveRuns`, `GetDraft`, the web page and `Subscribe`'s live
//!   tail cover the runs of the partitions this replica holds. A run on another
//!   replica's partition is `NOT_FOUND` for `GetDraft`, and `Subscribe` replays it from
//!   `SG_EVENTS` but does not follow it live here; clients that need every run ask every
//!   replica (or reconnect until they reach the one holding it).
//! - Acks: a message is acked once its ops are handed to the engine. Before a run's
//!   first op an active-run marker is stored in KV; it is removed only after the run's
//!   terminal ops were executed (engine flushed). The replica that acquires a partition
//!   (after a restart, another replica's crash or a rebalance) rebuilds every marked run
//!   of it from `SG_EVENTS` and hands its durable ops (final, settle, notices) to the
//!   engine again; the KV delivery state (`final_delivered`, `settled`, …) turns
//!   everything already done into a no-op, so nothing queued-but-unsent is lost and
//!   nothing sent is repeated. Not flushing per event keeps one chat's 429s from
//!   stalling every other chat on the channel.
//! - Rebuild: a run first seen at seq > 1 (restart, redelivery) is rebuilt from its own
//!   earlier messages in `SG_EVENTS` with their ops discarded; the KV delivery state
//!   makes every re-issued op idempotent. The archive is never read.
//! - Settings: each replica caches per-chat settings and watches `SG_SETTINGS`, so a
//!   `/reasoning` or `/verbose` change through any replica re-renders the chat's runs on
//!   every replica without a restart. Writes are compare-and-set on the key's revision
//!   (two replicas changing different flags at once both win), and cached values carry
//!   that revision so an older value never replaces a newer one.
//! - Crash recovery settles a run as interrupted only when it has no terminal event and
//!   its last event is older than `orphan_after`: a projector restart alone does not
//!   mean the agent died, and the live run must still get its final.
#![forbid(unsafe_code)]

pub mod channel;
pub mod cli;
pub mod config;
pub mod error;
pub mod grpc;
pub mod kv;
pub mod run_stream;
pub mod service;
pub mod web;

pub use channel::Channel;
pub use config::{ChannelConfig, ChannelSink};
pub use error::ProjectorError;
pub use service::{start, Running};

//! The canonical streamgate event grammar (spec §3): what every wire adapter produces and
//! every consumer (archiver, projector, CLI) reads. No I/O lives here.
//!
//! # Layout
//! - [`event`]: typed events and their canonical JSON line `{"seq","stream","data"}`.
//! - [`line`]: the canonical JSON line written straight into bytes (text events by hand,
//!   the rest through serde; the same bytes either way), and the scan for the bytes a
//!   JSON string must escape, which the wire adapters' frame readers share.
//! - [`json`]: provider objects (usage, tool arguments, diagnostic detail) kept verbatim.
//! - [`clock`]: the wall clock in epoch milliseconds, and as UTC dates.
//! - [`envelope`]: the routing fields around an event on the bus and in the archive.
//! - [`batch`]: the live form of a run (thinking tokens as a separate update) versus its
//!   batch (golden) form, and the fold between them (spec §3.2).
//! - [`fold`]: the deterministic run-state fold (final text, thinking segments, tool
//!   items, usage, status) shared by replay and projection.
//! - [`ids`]: the rule for tenant, run and session ids at every front door.
//! - [`invariants`]: the spec's conformance invariants I1–I10 as a checker.
//! - [`timeline`]: segment and item spans (seq and ingest time) for replay.
//! - [`usage`]: token counts out of every provider's usage object (accounting).
#![forbid(unsafe_code)]

pub mod batch;
pub mod clock;
pub mod envelope;
pub mod event;
pub mod fold;
pub mod ids;
pub mod invariants;
pub mod json;
pub mod line;
pub mod timeline;
pub mod usage;

/// The version of the event grammar this build emits and reads, recorded with every
/// archived run (docs/architecture.md §5, governable history). Bump it when the shape or meaning of
/// an event changes, so an archive can tell which runs were written under the older rules.
pub const GRAMMAR_VERSION: u32 = 1;

pub use batch::fold_token_updates;
pub use envelope::{Envelope, RunEvent};
pub use event::{
    Assistant, AssistantPhase, Diagnostic, Event, EventData, Item, ItemPhase, Lifecycle,
    LifecyclePhase, RunStatus, SegmentPhase, SegmentStatus, StopReason, Stream, Thinking,
    ThinkingVariant,
};
pub use fold::RunState;
pub use invariants::{check, FrameAccount, Violation};
pub use json::Json;
pub use timeline::{timeline, EntryKind, TimelineEntry};

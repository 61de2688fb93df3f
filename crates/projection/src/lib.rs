//! The projection core: what a channel shows for a run, as a pure function of the run's
//! events, the chat's settings and the channel's tier (DESIGN §6). Sinks execute the
//! resulting ops; nothing here does I/O.
//!
//! # Layout
//! - [`settings`]: `/reasoning`, `/verbose`, delivery mode, budgets, tiers.
//! - [`ops`]: what a sink is asked to do (typing, draft upsert, settle, final, …).
//! - [`projection`]: [`RunProjection`], the per-(channel, run) state machine
//!   `(draft state, event, settings, tier) → ops`, with mid-turn re-render, crash
//!   recovery and reconnect support.
//! - `render` (private): the draft text from the folded run state — truth tables
//!   (spec §4.3), tiers (§7.1–7.2), overflow elision (§7.2), settle summary.
//! - [`redact`]: display-safe tool details for `/verbose full` (secrets masked, paths
//!   shortened, length capped).
//!
//! # Rendering at a glance
//! - Draft (T1, T2): commentary + item rows interleaved by `seq`; thinking as a
//!   `> 🧠 …` blockquote per `/reasoning`; item rows `emoji name status[ — detail]`.
//! - T2 status line (spec tier C): thinking blocks + one `⏳ item · last line` line;
//!   `/reasoning stream` → `on` and `/verbose full` → `on`, declared by a notice.
//! - T0 and `delivery: final_only`: no draft at all; final answer and errors only.
//! - Finals are exactly once, verbatim, never empty; silent tokens
//!   ([`SILENT_TOKENS`]) produce nothing.
#![forbid(unsafe_code)]

pub mod ops;
pub mod projection;
pub mod redact;
mod render;
pub mod settings;

pub use ops::{DraftKey, Op};
pub use projection::{
    RunProjection, INCOMPLETE, INTERRUPTED, PAUSED, REJECT_PLACEHOLDER, TRUNCATED_SUFFIX,
    TYPING_EVERY_EVENTS,
};
pub use render::{is_silent, SILENT_TOKENS};
pub use settings::{Budgets, Delivery, Reasoning, Settings, Tier, Verbose};

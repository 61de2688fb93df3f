//! The projection core: what a channel shows for a run, as a pure function of the run's
//! events, the chat's settings and the channel's tier (docs/architecture.md §6). Sinks execute the
//! resulting ops; nothing here does I/O.
//!
//! # Layout
//! - [`settings`]: `/reasoning`, `/verbose`, delivery mode, budgets, tiers, and the ACP
//!   dedupe plan's knobs (tag visibility, repeat suppression; issue #13).
//! - `status` (private): the status lines of enabled `lifecycle/update` tags (plan,
//!   usage, mode, …), latest per tag, at the foot of the draft.
//! - [`live`]: the structured live view T1 drafts carry for natively streaming surfaces
//!   (the answer as an append-only text, tool rows as tasks, thinking or not).
//! - [`ops`]: what a sink is asked to do (typing, draft upsert, settle, final, …).
//! - [`projection`]: [`RunProjection`], the per-(channel, run) state machine
//!   `(draft state, event, settings, tier) → ops`, with mid-turn re-render, crash
//!   recovery and reconnect support.
//! - `safe_text` (private): an open thinking segment's display-safe text, redacted as it
//!   streams and kept as bounded ends, so rendering a delta costs O(delta).
//! - `render` (private): the draft text from the folded run state — truth tables
//!   (spec §4.3), tiers (§7.1–7.2), overflow elision (§7.2), settle summary.
//! - [`redact`]: the one redactor for every channel surface (drafts, thinking, tool rows,
//!   notices, settles, `ProjectorService` events; final answers verbatim), and
//!   display-safe tool details for `/verbose full` (secrets masked, paths
//!   shortened, length capped).
//!
//! # Rendering decisions (spec lines in brackets)
//! - Draft (T1, T2): commentary + item rows interleaved by `seq` [§4.3 always-on rows];
//!   thinking as a `> 🧠 …` blockquote [§7.2 T1]: `on` at segment end, `stream` live,
//!   redacted markers as `> 🧠 thought privately (N tok)` [§4.3]. Item rows are
//!   `emoji name status` (⏳ ✅ ❌), plus `— detail` under `/verbose full`, made display-safe
//!   by [`redact`]. The draft is created by the first event that renders into it, never
//!   for liveness alone [§11 liveness].
//! - T2 full surface: as T1, without the per-lane budgets, with `[raw]`/`[summary]`
//!   labels [§7.2 T2 "variant labels"]. T2 status line (spec tier C): thinking blocks +
//!   one `⏳ current item · last commentary line`; `/reasoning stream` → `on` (and
//!   `/verbose full` → `on`) declared by one notice [§7.2 TUI].
//! - Tag visibility [§3.4: lifecycle/update is a diagnostic, not rendered by default]:
//!   message chunks and tool calls/updates shown; thought chunks follow `/reasoning`;
//!   plan, usage, commands, mode, config, session info and any other update code hidden
//!   unless enabled, then one display-safe `📋 plan: 2/5 done · …`-style line per tag
//!   (latest wins) at the draft's foot, capped at `maxStatusChars`. Hidden tags change
//!   nothing the draft shows, so they make no edit.
//! - Repeat suppression (default on): an update that changes nothing the draft shows
//!   (same status line, same usage tuple, same tool snapshot) makes no edit; off, every
//!   shown status or tool update re-sends the draft.
//! - T0 and `delivery: final_only`: no draft; the final answer and errors only
//!   (final_only: all of it at the terminal event, or at the crash-recovery settle); T0
//!   declares its clamp [§7.2 T0] and gets one `Typing` (its "working…", if the sink has
//!   one).
//! - Clamp notices go out once per run, just before the run's first visible op, so a
//!   silent run stays silent.
//! - `Typing`: first event, then every [`TYPING_EVERY_EVENTS`] events, never on the
//!   terminal one.
//! - Finals: exactly once, verbatim, never blank [§3.5 zero-text]; truncated finals carry
//!   [`TRUNCATED_SUFFIX`] [§4.3]; the final replaces the draft's copy of its segment
//!   [§3.5]. Final answers equal to one of [`SILENT_TOKENS`] produce nothing.
//! - Settle [§7.2]: `🧠 n segments · m tools · k s` (what the draft showed; `k` from the
//!   envelopes' ingest times via [`RunProjection::apply_run_event`], omitted without
//!   them), or `Dismiss` when the draft showed nothing [§4.3 degenerate-draft rule].
//!   Paused → `⏸️ paused · …`; unknown incomplete end → `⚠️ incomplete · …` [§7.2 T2];
//!   errors → notice + `❌ error · …`; Reject → `Retract` + `⛔ response withdrawn …`
//!   [§3.5 destructive settle]; crash → `⚠️ agent interrupted` [§7.3].
//! - Overflow [§7.2]: thinking shrinks head+tail first, item rows drop to name + status,
//!   thinking may then be fully elided, commentary goes last (oldest first), then the
//!   oldest rows, then a hard cut: a draft never exceeds `draft_max_chars`, never splits.
#![forbid(unsafe_code)]

pub mod live;
pub mod ops;
pub mod projection;
pub mod redact;
mod render;
pub mod safe_events;
mod safe_text;
pub mod settings;
mod status;

pub use live::{Live, LivePlan, LiveTask, LiveText, Outcome};
pub use ops::{DraftKey, Op};
pub use projection::{
    RunProjection, ERRORED, INCOMPLETE, INTERRUPTED, PAUSED, REJECT_PLACEHOLDER, TEXT_WINDOW_BYTES,
    TRUNCATED_SUFFIX, TYPING_EVERY_EVENTS,
};
pub use render::{is_silent, SILENT_TOKENS};
pub use safe_events::EventRedactor;
pub use settings::{
    parse_shown, tags, BadTagVisibility, Budgets, Delivery, Reasoning, Settings, TagVisibility,
    Tier, Verbose, DEFAULT_STATUS_CHARS,
};

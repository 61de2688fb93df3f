//! What the projection asks a sink to do. Ops are idempotent by key: a sink (or the
//! delivery engine) that sees the same op twice produces one effect.

use crate::live::Live;
use serde::{Deserialize, Serialize};

/// Identity of the one draft of a run on a channel: `channel + tenant + run` (a run has
/// one activity draft; it never splits). A run id is unique only within its tenant, so
/// the tenant is part of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DraftKey {
    /// The run.
    pub run_id: String,
    /// The run's tenant; empty for a projection made without one
    /// ([`crate::RunProjection::new`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
}

/// One thing for a sink to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Show (or refresh) the native typing / working indicator.
    Typing,
    /// Create the draft if it does not exist yet, else replace its whole text (latest
    /// wins: a sink may coalesce consecutive upserts). `seq` is the last event rendered.
    Draft {
        /// The run's draft.
        key: DraftKey,
        /// Full rendered text of the draft (already within the budget).
        text: String,
        /// Last event seq folded into this rendering.
        seq: u64,
        /// The same moment as structured facts, for surfaces that stream natively
        /// (T1 only; see [`crate::live`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        live: Option<Box<Live>>,
    },
    /// Final state of the draft: replace it with `text` (summary line, paused/error
    /// state, or the Reject placeholder). Sent at most once per run.
    Settle {
        /// The run's draft.
        key: DraftKey,
        /// Settled text.
        text: String,
        /// Last event seq.
        seq: u64,
    },
    /// Remove the draft (it had nothing worth keeping: degenerate-draft rule).
    Dismiss {
        /// The run's draft.
        key: DraftKey,
    },
    /// The final answer, on the reliable path, exactly once per run. Carries the answer
    /// text exactly as the event had it; `suffix` is the channel line to append (e.g.
    /// "⚠️ truncated (token limit)").
    Final {
        /// The run's draft (the final replaces its segment rendering).
        key: DraftKey,
        /// The answer, verbatim.
        text: String,
        /// True when the answer was cut by a token limit.
        truncated: bool,
        /// Visible suffix line, when the tier shows one.
        suffix: Option<String>,
        /// Seq of the final-answer event (the reply-path idempotency key).
        seq: u64,
    },
    /// Reject path (destructive settle): already-rendered text of the rejected segment
    /// must be replaced with `placeholder`.
    Retract {
        /// The run's draft.
        key: DraftKey,
        /// "⛔ response withdrawn (provider safety stop)".
        placeholder: String,
        /// Last event seq.
        seq: u64,
    },
    /// A standalone notice (errors, declared setting clamps).
    Notice {
        /// The run.
        key: DraftKey,
        /// Notice text.
        text: String,
        /// Seq that caused it.
        seq: u64,
    },
}

impl Op {
    /// The wire name used by the webhook sink (`typing`, `draft`, `settle`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Typing => "typing",
            Op::Draft { .. } => "draft",
            Op::Settle { .. } => "settle",
            Op::Dismiss { .. } => "dismiss",
            Op::Final { .. } => "final",
            Op::Retract { .. } => "retract",
            Op::Notice { .. } => "notice",
        }
    }
}

//! The spec's §3.5 finality dispatch, written once.
//!
//! Every family classifies its own stop signal (F1 `stop_reason`, F2 `finish_reason`,
//! F3 terminal event + `incomplete_details.reason`, Gemini `finishReason`, ollama
//! `done_reason`, codex turn status, …) into one [`Path`]. The path then decides the
//! two things §3.5 fixes for every family alike:
//!
//! - whether the turn's last text segment is re-tagged as the final answer, and with
//!   which `truncated` flag ([`Path::final_answer`]; zero text still means no event);
//! - the terminal `lifecycle` event: phase, normalized reason and run status
//!   ([`Path::lifecycle`], [`Path::emit`]).
//!
//! | Path | final answer | lifecycle |
//! |---|---|---|
//! | [`Path::Finalize`] | yes | `end`, reason as given, `completed` |
//! | [`Path::Truncate`] | yes, `truncated` | `end`, `truncated`, `incomplete` |
//! | [`Path::Reject`] | no (destructive settle) | `error`, reason as given, `incomplete` |
//! | [`Path::Suspend`] | no | `end`, `paused`, `incomplete` |
//! | [`Path::Yield`] | no (tool turn) | `end`, `tool_use`, `completed` |
//! | [`Path::Incomplete`] | no (unknown signal, conservative) | `end`, reason as given, `incomplete` |
//! | [`Path::Dead`] | no | `error`, reason as given, `incomplete` |
//!
//! What each family closes before the terminal event (open thinking, pending tools) and
//! which text it re-tags stays with the family: those are wire-specific.

use crate::emitter::Emitter;
use streamgate_grammar::{Diagnostic, Json, Lifecycle, LifecyclePhase, RunStatus, StopReason};

/// The §3.5 exit a terminal signal selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// Clean stop: the last text segment becomes the final answer. The reason is
    /// `completed` or a more specific clean one (`stop_sequence`).
    Finalize(StopReason),
    /// Token/output limit: the final answer carries `truncated: true`.
    Truncate,
    /// Safety stop (`refusal`, `content_filter`): no final answer; the streamed text is
    /// retracted downstream.
    Reject(StopReason),
    /// `pause_turn`: no final answer, the draft is paused.
    Suspend,
    /// The turn yields to tool execution: no final answer, the agent loop continues.
    Yield,
    /// A stop signal the family does not know: end `incomplete`, no final answer.
    Incomplete(Option<StopReason>),
    /// In-band error, abort or `stream_closed`: no final answer, `lifecycle/error`.
    Dead(StopReason),
}

impl Path {
    /// `Some(truncated)` when this path re-tags the last text segment as the final
    /// answer; `None` when it must not emit one.
    pub fn final_answer(&self) -> Option<bool> {
        match self {
            Path::Finalize(_) => Some(false),
            Path::Truncate => Some(true),
            _ => None,
        }
    }

    /// The path ends the run in `lifecycle/error` (Reject, Dead).
    pub fn is_error(&self) -> bool {
        matches!(self, Path::Reject(_) | Path::Dead(_))
    }

    /// The terminal lifecycle event for this path.
    pub fn lifecycle(self, usage: Option<Json>, diagnostic: Option<Diagnostic>) -> Lifecycle {
        let (phase, reason, status) = match self {
            Path::Finalize(r) => (LifecyclePhase::End, Some(r), RunStatus::Completed),
            Path::Truncate => (
                LifecyclePhase::End,
                Some(StopReason::Truncated),
                RunStatus::Incomplete,
            ),
            Path::Reject(r) | Path::Dead(r) => {
                (LifecyclePhase::Error, Some(r), RunStatus::Incomplete)
            }
            Path::Suspend => (
                LifecyclePhase::End,
                Some(StopReason::Paused),
                RunStatus::Incomplete,
            ),
            Path::Yield => (
                LifecyclePhase::End,
                Some(StopReason::ToolUse),
                RunStatus::Completed,
            ),
            Path::Incomplete(r) => (LifecyclePhase::End, r, RunStatus::Incomplete),
        };
        Lifecycle {
            reason,
            status: Some(status),
            usage,
            diagnostic,
            ..Lifecycle::new(phase)
        }
    }

    /// Emits the terminal lifecycle event for this path.
    pub fn emit(
        self,
        usage: Option<Json>,
        diagnostic: Option<Diagnostic>,
        out: &mut Emitter,
    ) -> Option<u64> {
        out.emit(self.lifecycle(usage, diagnostic))
    }
}

/// Emits the synthetic terminal event for a stream that ended with no terminal frame
/// (spec §3.4 stream death: the Dead path with reason `stream_closed`).
pub fn stream_closed(out: &mut Emitter) -> Option<u64> {
    Path::Dead(StopReason::StreamClosed).emit(None, None, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_finalize_and_truncate_release_a_final_answer() {
        assert_eq!(
            Path::Finalize(StopReason::Completed).final_answer(),
            Some(false)
        );
        assert_eq!(Path::Truncate.final_answer(), Some(true));
        for p in [
            Path::Reject(StopReason::Refusal),
            Path::Suspend,
            Path::Yield,
            Path::Incomplete(None),
            Path::Dead(StopReason::Error),
        ] {
            assert_eq!(p.final_answer(), None, "{p:?}");
        }
    }

    #[test]
    fn error_paths_end_in_lifecycle_error() {
        let l = Path::Dead(StopReason::StreamClosed).lifecycle(None, None);
        assert_eq!(l.phase, LifecyclePhase::Error);
        assert_eq!(l.status, Some(RunStatus::Incomplete));
        let l = Path::Yield.lifecycle(None, None);
        assert_eq!(l.phase, LifecyclePhase::End);
        assert_eq!(l.status, Some(RunStatus::Completed));
    }
}

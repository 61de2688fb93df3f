//! The run stream as the Vercel AI SDK's UI message stream, protocol v1
//! (`?format=ai-sdk`; the response carries `x-vercel-ai-ui-message-stream: v1`): what a
//! `useChat` / `readUIMessageStream` client reads. One JSON chunk per SSE message, then
//! `data: [DONE]`. Every chunk an event causes carries the event's seq as its SSE `id`,
//! so a dropped client resumes with `Last-Event-ID` like on the canonical stream.
//!
//! The mapping (from [`PartOp`]s; `docs/run-stream.md` has the whole table):
//! `start` (message id = run id) and `start-step` first; reasoning, text and tool parts
//! as `reasoning-*`, `text-*`, `tool-input-start/delta/available` (dynamic tools: a run
//! names its tools at run time) and `tool-output-available` / `tool-output-error`; at
//! the end `finish-step` and `finish` with a finish reason, or `error` for a dead turn.

use super::parts::PartOp;
use serde_json::{json, Value};
use streamgate_grammar::StopReason;

/// The response header naming the protocol.
pub(super) const HEADER: (&str, &str) = ("x-vercel-ai-ui-message-stream", "v1");

/// The AI SDK's finish reason for a canonical stop reason.
fn finish_reason(reason: Option<&StopReason>) -> &'static str {
    match reason {
        None | Some(StopReason::Completed | StopReason::StopSequence | StopReason::Paused) => {
            "stop"
        }
        Some(StopReason::Truncated) => "length",
        Some(StopReason::ToolUse) => "tool-calls",
        Some(StopReason::Refusal | StopReason::ContentFilter) => "content-filter",
        Some(StopReason::Error | StopReason::StreamClosed) => "error",
        Some(StopReason::Other(_)) => "other",
    }
}

/// The chunks of one part op, for run `run_id`.
pub(super) fn chunks(op: &PartOp, run_id: &str) -> Vec<Value> {
    match op {
        PartOp::RunStart => vec![
            json!({"type": "start", "messageId": run_id}),
            json!({"type": "start-step"}),
        ],
        PartOp::ReasoningStart { id } => vec![json!({"type": "reasoning-start", "id": id})],
        PartOp::ReasoningDelta { id, delta } => {
            vec![json!({"type": "reasoning-delta", "id": id, "delta": delta})]
        }
        PartOp::ReasoningEnd { id } => vec![json!({"type": "reasoning-end", "id": id})],
        PartOp::TextStart { id } => vec![json!({"type": "text-start", "id": id})],
        PartOp::TextDelta { id, delta } => {
            vec![json!({"type": "text-delta", "id": id, "delta": delta})]
        }
        PartOp::TextEnd { id } => vec![json!({"type": "text-end", "id": id})],
        PartOp::ToolStart { id, name } => vec![json!({
            "type": "tool-input-start", "toolCallId": id, "toolName": name, "dynamic": true
        })],
        PartOp::ToolArgs { id, delta } => vec![json!({
            "type": "tool-input-delta", "toolCallId": id, "inputTextDelta": delta
        })],
        PartOp::ToolEnd { id, name, input } => vec![json!({
            "type": "tool-input-available", "toolCallId": id, "toolName": name,
            "input": input, "dynamic": true
        })],
        PartOp::ToolOutput { id, output } => vec![json!({
            "type": "tool-output-available", "toolCallId": id, "output": output, "dynamic": true
        })],
        PartOp::ToolError { id, error } => vec![json!({
            "type": "tool-output-error", "toolCallId": id, "errorText": error, "dynamic": true
        })],
        PartOp::RunEnd {
            error: Some(error), ..
        } => vec![
            json!({"type": "finish-step"}),
            json!({"type": "error", "errorText": error}),
        ],
        PartOp::RunEnd {
            reason,
            error: None,
        } => vec![
            json!({"type": "finish-step"}),
            json!({"type": "finish", "finishReason": finish_reason(reason.as_ref())}),
        ],
    }
}

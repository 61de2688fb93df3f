//! The run stream as AG-UI events (`?format=ag-ui`): what CopilotKit, LangGraph, Mastra,
//! Pydantic AI and other AG-UI clients read. One event per SSE message (`data:` the
//! event JSON); every event an input event causes carries its seq as the SSE `id`.
//!
//! The mapping (from [`PartOp`]s; `docs/run-stream.md` has the whole table):
//! `RUN_STARTED` (thread = the run's session, else the run), `REASONING_*` for
//! reasoning, `TEXT_MESSAGE_*` for text, `TOOL_CALL_START/ARGS/END` and
//! `TOOL_CALL_RESULT` for tools, the turn as one step (`STEP_STARTED` /
//! `STEP_FINISHED`), and `RUN_FINISHED` or `RUN_ERROR` at the end.

use super::parts::PartOp;
use serde_json::{json, Value};

/// The step name of the turn.
const STEP: &str = "turn";

/// The events of one part op, for run `run_id` in thread `thread_id`; `ts` is the
/// event's ingest time (ms).
pub(super) fn events(op: &PartOp, thread_id: &str, run_id: &str, ts: i64) -> Vec<Value> {
    let mut out = match op {
        PartOp::RunStart => vec![
            json!({"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}),
            json!({"type": "STEP_STARTED", "stepName": STEP}),
        ],
        PartOp::ReasoningStart { id } => vec![
            json!({"type": "REASONING_START", "messageId": id}),
            json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"}),
        ],
        PartOp::ReasoningDelta { id, delta } => {
            vec![json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": delta})]
        }
        PartOp::ReasoningEnd { id } => vec![
            json!({"type": "REASONING_MESSAGE_END", "messageId": id}),
            json!({"type": "REASONING_END", "messageId": id}),
        ],
        PartOp::TextStart { id } => {
            vec![json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"})]
        }
        PartOp::TextDelta { id, delta } => {
            vec![json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta})]
        }
        PartOp::TextEnd { id } => vec![json!({"type": "TEXT_MESSAGE_END", "messageId": id})],
        PartOp::ToolStart { id, name } => vec![json!({
            "type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": name
        })],
        PartOp::ToolArgs { id, delta } => {
            vec![json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": delta})]
        }
        PartOp::ToolEnd { id, .. } => vec![json!({"type": "TOOL_CALL_END", "toolCallId": id})],
        PartOp::ToolOutput { id, output } => vec![json!({
            "type": "TOOL_CALL_RESULT", "messageId": format!("{id}-result"), "toolCallId": id,
            "content": content(output), "role": "tool"
        })],
        PartOp::ToolError { id, error } => vec![json!({
            "type": "TOOL_CALL_RESULT", "messageId": format!("{id}-result"), "toolCallId": id,
            "content": error, "role": "tool"
        })],
        PartOp::RunEnd {
            error: Some(error), ..
        } => vec![json!({"type": "RUN_ERROR", "message": error})],
        PartOp::RunEnd { error: None, .. } => vec![
            json!({"type": "STEP_FINISHED", "stepName": STEP}),
            json!({"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}),
        ],
    };
    for e in &mut out {
        e["timestamp"] = json!(ts);
    }
    out
}

/// A tool result as AG-UI's string content: a string as it is, anything else as JSON.
fn content(output: &Value) -> String {
    match output {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

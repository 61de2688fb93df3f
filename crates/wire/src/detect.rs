//! Family detection from a stream's first frames (`--family auto`).
//!
//! Each family has a recognisable opening: Anthropic's `message_start`, a Chat Completions
//! `chat.completion.chunk`, a Responses `response.*` event, Gemini `candidates`, claude-cli
//! `system`/`stream_event` envelopes with a session id, ollama's `created_at` + `done`, and
//! codex's JSON-RPC `method`/`result` objects, `codex exec --json`'s dotted
//! `thread.*`/`turn.*`/`item.*` event types, OpenClaw's `runId` + `stream` envelopes. Frames that say nothing (comments, pings,
//! `[DONE]`) are skipped.

use crate::adapter::Family;
use crate::framing::Frame;
use serde_json::Value;

/// How many frames detection may look at before giving up.
pub const MAX_SNIFF_FRAMES: usize = 32;

/// The family a frame reveals, if any.
pub fn sniff(frame: &Frame<'_>) -> Option<Family> {
    if let Some(event) = frame.event {
        if event.starts_with("message_") || event.starts_with("content_block_") {
            return Some(Family::F1);
        }
        if event.starts_with("response.") {
            return Some(Family::F3);
        }
    }
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(frame.data) else {
        return None;
    };
    if obj.contains_key("runId") && obj.contains_key("stream") {
        return Some(Family::OpenClawEvents);
    }
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    if kind.starts_with("response.") {
        return Some(Family::F3);
    }
    if ["thread.", "turn.", "item."]
        .iter()
        .any(|p| kind.starts_with(p))
    {
        return Some(Family::CodexExec);
    }
    if matches!(
        kind,
        "message_start" | "content_block_start" | "ping" | "error"
    ) && !obj.contains_key("session_id")
    {
        return Some(Family::F1);
    }
    if obj.contains_key("session_id")
        && matches!(
            kind,
            "system" | "stream_event" | "assistant" | "user" | "result" | "rate_limit_event"
        )
    {
        return Some(Family::F1e);
    }
    if obj.contains_key("choices")
        || obj.get("object").and_then(Value::as_str) == Some("chat.completion.chunk")
    {
        return Some(Family::F2);
    }
    if obj.contains_key("candidates") || obj.contains_key("usageMetadata") {
        return Some(Family::F5);
    }
    if obj.contains_key("created_at") && obj.contains_key("done") {
        return Some(Family::OllamaNative);
    }
    if obj.contains_key("method") || obj.contains_key("jsonrpc") || obj.contains_key("result") {
        return Some(Family::CodexAppServer);
    }
    None
}

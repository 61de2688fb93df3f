//! Family detection from a stream's first frames (`--family auto`).
//!
//! Each family has a recognisable opening: Anthropic's `message_start`, a Chat Completions
//! `chat.completion.chunk`, a Responses `response.*` event, Gemini `candidates`, claude-cli
//! `system`/`stream_event` envelopes with a session id, ollama's `created_at` + `done`, and
//! `codex exec --json`'s dotted `thread.*`/`turn.*`/`item.*` event types (and its top-level
//! `{"type":"error","message":…}` line), OpenClaw's `runId` + `stream` envelopes, ACP's
//! JSON-RPC ([`is_acp`]), and codex app-server's JSON-RPC `method`/`result` objects (any
//! other JSON-RPC). Frames that say nothing (comments, pings, `[DONE]`) are skipped.

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
    if kind == "error" && is_codex_exec_error(frame, &obj) {
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
    if is_acp(&obj) {
        return Some(Family::Acp);
    }
    if obj.contains_key("method") || obj.contains_key("jsonrpc") || obj.contains_key("result") {
        return Some(Family::CodexAppServer);
    }
    None
}

/// `codex exec --json`'s fatal line, `{"type":"error","message":"…"}`: a JSONL line with
/// a `message` string. Anthropic's SSE error has an `error` object and an SSE event name.
fn is_codex_exec_error(frame: &Frame<'_>, obj: &serde_json::Map<String, Value>) -> bool {
    frame.event.is_none()
        && !obj.contains_key("error")
        && !obj.contains_key("session_id")
        && obj.get("message").is_some_and(Value::is_string)
}

/// ACP JSON-RPC: a method of ACP's namespaces (`session/update`, `session/prompt`,
/// `fs/*`, `terminal/*`, …), `initialize` with an integer `protocolVersion` (codex
/// app-server's has none: its methods are `thread/*`, `turn/*`, `item/*`), or a
/// response carrying ACP's `stopReason`, or its `protocolVersion` or top-level
/// `sessionId` with the `jsonrpc` tag (codex app-server's server side never sends
/// `jsonrpc`, and nests its session id in `thread`).
pub fn is_acp(obj: &serde_json::Map<String, Value>) -> bool {
    let params = obj.get("params");
    if let Some(method) = obj.get("method").and_then(Value::as_str) {
        let acp_namespace = ["session/", "fs/", "terminal/"]
            .iter()
            .any(|p| method.starts_with(p));
        let versioned = params
            .and_then(|p| p.get("protocolVersion"))
            .is_some_and(Value::is_u64);
        return acp_namespace || (method == "initialize" && versioned);
    }
    let Some(Value::Object(result)) = obj.get("result") else {
        return false;
    };
    result.get("stopReason").is_some_and(Value::is_string)
        || (obj.contains_key("jsonrpc")
            && (result.get("protocolVersion").is_some_and(Value::is_u64)
                || result.get("sessionId").is_some_and(Value::is_string)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(data: &str) -> Option<Family> {
        sniff(&Frame { event: None, data })
    }

    #[test]
    fn a_codex_exec_error_line_is_not_anthropic() {
        assert_eq!(
            line(r#"{"type":"error","message":"stream disconnected"}"#),
            Some(Family::CodexExec)
        );
        // Anthropic's error: an `error` object, on an SSE `event: error`.
        let f1 = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(line(f1), Some(Family::F1));
        let framed = Frame {
            event: Some("error"),
            data: r#"{"type":"error","message":"x"}"#,
        };
        assert_eq!(sniff(&framed), Some(Family::F1));
    }
}

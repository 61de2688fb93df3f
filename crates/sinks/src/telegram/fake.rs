//! Fake Telegram Bot API.

use crate::fakes::{maybe_delay, Gate, Message, Shared};
use crate::text::{measure, utf16_unit};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

const LIMIT: usize = 4096;
const TAGS: &[&str] = &[
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "code",
    "pre",
    "a",
    "blockquote",
    "tg-spoiler",
    "span",
];

#[derive(Clone)]
struct Ctx {
    shared: Shared,
    token: String,
}

pub(crate) fn router(shared: Shared, token: String) -> Router {
    Router::new()
        .route("/{bot}/{method}", post(handle))
        .with_state(Ctx { shared, token })
}

/// Visible text of Telegram HTML, or the API's parse error.
pub fn parse_html(raw: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut stack: Vec<String> = Vec::new();
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        match c {
            '&' => {
                let end = rest.find(';').ok_or("unclosed entity")?;
                let ent = &rest[1..end];
                let decoded = match ent {
                    "amp" => '&',
                    "lt" => '<',
                    "gt" => '>',
                    "quot" => '"',
                    _ => ent
                        .strip_prefix('#')
                        .and_then(|n| n.parse::<u32>().ok())
                        .and_then(char::from_u32)
                        .ok_or_else(|| format!("unsupported entity &{ent};"))?,
                };
                out.push(decoded);
                rest = &rest[end + 1..];
            }
            '<' => {
                let end = rest.find('>').ok_or("unclosed start tag")?;
                let inner = &rest[1..end];
                if let Some(name) = inner.strip_prefix('/') {
                    if stack.pop().as_deref() != Some(name.trim()) {
                        return Err(format!("unmatched end tag {name}"));
                    }
                } else {
                    let name = inner.split_whitespace().next().unwrap_or("");
                    if !TAGS.contains(&name) {
                        return Err(format!("unsupported start tag \"{name}\""));
                    }
                    stack.push(name.to_owned());
                }
                rest = &rest[end + 1..];
            }
            '>' => return Err("unexpected end of tag".into()),
            _ => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    if let Some(open) = stack.pop() {
        return Err(format!("unclosed tag {open}"));
    }
    Ok(out)
}

fn bad(desc: &str) -> (StatusCode, Value) {
    (
        StatusCode::BAD_REQUEST,
        json!({"ok": false, "error_code": 400, "description": format!("Bad Request: {desc}")}),
    )
}

fn ok(result: Value) -> (StatusCode, Value) {
    (StatusCode::OK, json!({"ok": true, "result": result}))
}

fn chat_of(body: &Value) -> String {
    match body.get("chat_id") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => String::new(),
    }
}

/// Where a posted message or draft lands: the chat, or `<chat>/<thread>` with a
/// `message_thread_id` (a message id stays unique per chat, so edits name the chat).
fn place_of(body: &Value) -> String {
    let chat = chat_of(body);
    match body.get("message_thread_id").and_then(Value::as_i64) {
        Some(t) => format!("{chat}/{t}"),
        None => chat,
    }
}

fn render(body: &Value) -> Result<(String, String), (StatusCode, Value)> {
    let raw = body
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let text = if body.get("parse_mode").and_then(Value::as_str) == Some("HTML") {
        parse_html(&raw).map_err(|e| bad(&format!("can't parse entities: {e}")))?
    } else {
        raw.clone()
    };
    if text.trim().is_empty() {
        return Err(bad("message text is empty"));
    }
    if measure(&text, utf16_unit) > LIMIT {
        return Err(bad("message is too long"));
    }
    Ok((raw, text))
}

async fn handle(
    State(ctx): State<Ctx>,
    Path((bot, method)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (status, reply) = if bot.strip_prefix("bot") != Some(ctx.token.as_str()) {
        (
            StatusCode::UNAUTHORIZED,
            json!({"ok": false, "error_code": 401, "description": "Unauthorized"}),
        )
    } else {
        match ctx.shared.gate(ctx.shared.behavior.retry_after_secs.ceil()) {
            Gate::RateLimited(secs) => {
                let n = secs.ceil().max(1.0) as u64;
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    json!({"ok": false, "error_code": 429,
                        "description": format!("Too Many Requests: retry after {n}"),
                        "parameters": {"retry_after": n}}),
                )
            }
            Gate::Proceed => apply(&ctx.shared, &method, &body),
        }
    };
    ctx.shared.record(&method, &body, status.as_u16());
    if status == StatusCode::OK && method == "sendMessage" {
        maybe_delay(&ctx.shared).await;
    }
    (status, Json(reply)).into_response()
}

/// `sendMessageDraft`: private chats only (a user's id, positive), a non-zero
/// `draft_id`, text of 0–4096 characters after entity parsing (empty shows the
/// "Thinking…" placeholder).
fn send_draft(shared: &Shared, chat: &str, place: &str, body: &Value) -> (StatusCode, Value) {
    if !chat.parse::<i64>().is_ok_and(|id| id > 0) {
        return bad("drafts can be sent only to private chats");
    }
    let draft_id = body.get("draft_id").and_then(Value::as_i64).unwrap_or(0);
    if draft_id == 0 {
        return bad("draft_id must be non-zero");
    }
    let raw = body.get("text").and_then(Value::as_str).unwrap_or("");
    let text = if body.get("parse_mode").and_then(Value::as_str) == Some("HTML") {
        match parse_html(raw) {
            Ok(t) => t,
            Err(e) => return bad(&format!("can't parse entities: {e}")),
        }
    } else {
        raw.to_owned()
    };
    if measure(&text, utf16_unit) > LIMIT {
        return bad("message is too long");
    }
    shared.upsert_draft(place, draft_id, &text);
    ok(json!(true))
}

fn apply(shared: &Shared, method: &str, body: &Value) -> (StatusCode, Value) {
    let chat = chat_of(body);
    let mid = body
        .get("message_id")
        .and_then(Value::as_i64)
        .map(|n| n.to_string())
        .unwrap_or_default();
    match method {
        "sendMessage" => match render(body) {
            Err(e) => e,
            Ok((raw, text)) => {
                let id = shared.next_id();
                shared.push_message(Message {
                    id: id.to_string(),
                    chat: place_of(body),
                    text: text.clone(),
                    raw,
                    deleted: false,
                    edits: 0,
                });
                ok(json!({"message_id": id, "chat": {"id": chat}, "text": text}))
            }
        },
        "editMessageText" => match render(body) {
            Err(e) => e,
            Ok((raw, text)) => {
                let r = shared.with_message(&chat, &mid, |m| {
                    if m.raw == raw {
                        false
                    } else {
                        m.raw = raw;
                        m.text = text.clone();
                        m.edits += 1;
                        true
                    }
                });
                match r {
                    None => bad("message to edit not found"),
                    Some(false) => bad(
                        "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
                    ),
                    Some(true) => ok(json!({"message_id": mid, "text": text})),
                }
            }
        },
        "deleteMessage" => match shared.with_message(&chat, &mid, |m| m.deleted = true) {
            None => bad("message to delete not found"),
            Some(()) => ok(json!(true)),
        },
        "sendMessageDraft" => send_draft(shared, &chat, &place_of(body), body),
        "sendChatAction" => ok(json!(true)),
        _ => (
            StatusCode::NOT_FOUND,
            json!({"ok": false, "error_code": 404, "description": "Not Found"}),
        ),
    }
}

//! Fake Slack Web API (`chat.postMessage`, `chat.update`, `chat.delete`).

use super::{maybe_delay, Gate, Message, Shared};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

const LIMIT: usize = 40_000;

#[derive(Clone)]
struct Ctx {
    shared: Shared,
    token: String,
}

pub(super) fn router(shared: Shared, token: String) -> Router {
    Router::new()
        .route("/api/{method}", post(handle))
        .with_state(Ctx { shared, token })
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

fn fail(error: &str) -> Value {
    json!({"ok": false, "error": error})
}

async fn handle(
    State(ctx): State<Ctx>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if auth != Some(ctx.token.as_str()) {
        ctx.shared.record(&method, &body, 200);
        return Json(fail("invalid_auth")).into_response();
    }
    if let Gate::RateLimited(secs) = ctx.shared.gate(ctx.shared.behavior.retry_after_secs) {
        ctx.shared.record(&method, &body, 429);
        let mut r = (StatusCode::TOO_MANY_REQUESTS, Json(fail("ratelimited"))).into_response();
        if let Ok(v) = HeaderValue::from_str(&format!("{}", secs.ceil().max(1.0) as u64)) {
            r.headers_mut().insert("retry-after", v);
        }
        return r;
    }
    let channel = body
        .get("channel")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let ts = body
        .get("ts")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let raw = body
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let shared = &ctx.shared;
    let text_error = if raw.chars().count() > LIMIT {
        Some("msg_too_long")
    } else if raw.trim().is_empty() {
        Some("no_text")
    } else {
        None
    };
    let v = match method.as_str() {
        "chat.postMessage" => match text_error {
            Some(e) => fail(e),
            None => {
                let ts = format!("1700000000.{:06}", shared.next_id());
                shared.push_message(Message {
                    id: ts.clone(),
                    chat: channel.clone(),
                    text: unescape(&raw),
                    raw: raw.clone(),
                    deleted: false,
                    edits: 0,
                });
                json!({"ok": true, "channel": channel, "ts": ts, "message": {"text": raw}})
            }
        },
        "chat.update" => match text_error {
            Some(e) => fail(e),
            None => {
                let done = shared.with_message(&channel, &ts, |m| {
                    m.text = unescape(&raw);
                    m.raw = raw.clone();
                    m.edits += 1;
                });
                match done {
                    None => fail("message_not_found"),
                    Some(()) => json!({"ok": true, "channel": channel, "ts": ts, "text": raw}),
                }
            }
        },
        "chat.delete" => match shared.with_message(&channel, &ts, |m| m.deleted = true) {
            None => fail("message_not_found"),
            Some(()) => json!({"ok": true, "channel": channel, "ts": ts}),
        },
        _ => fail("unknown_method"),
    };
    shared.record(&method, &body, 200);
    if method == "chat.postMessage" && v.get("ok") == Some(&Value::Bool(true)) {
        maybe_delay(shared).await;
    }
    Json(v).into_response()
}

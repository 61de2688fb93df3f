//! Fake Slack Web API: `chat.postMessage`, `chat.update`, `chat.delete`, the streaming
//! methods (`chat.startStream` / `appendStream` / `stopStream`, with stream states,
//! expiry and `message_not_in_streaming_state`) and `assistant.threads.setStatus`.

use crate::fakes::{maybe_delay, Gate, Message, Shared, Stream};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const LIMIT: usize = 40_000;
/// Limit of one `markdown_text`.
const MARKDOWN_LIMIT: usize = 12_000;

#[derive(Clone)]
struct Ctx {
    shared: Shared,
    token: String,
    /// Per method: when its current tier window started and the calls it took.
    tiers: Arc<Mutex<HashMap<String, (Instant, u32)>>>,
}

pub(crate) fn router(shared: Shared, token: String) -> Router {
    Router::new()
        .route("/api/{method}", post(handle))
        .with_state(Ctx {
            shared,
            token,
            tiers: Arc::default(),
        })
}

/// Calls per minute of a method's rate-limit tier (Slack's documented minimums: Tier 2
/// 20+, Tier 3 50+, Tier 4 100+); `chat.postMessage` has its own per-channel limit.
fn tier(method: &str) -> Option<u32> {
    match method {
        "chat.startStream" | "chat.stopStream" => Some(20),
        "chat.update" | "chat.delete" | "assistant.threads.setStatus" => Some(50),
        "chat.appendStream" => Some(100),
        _ => None,
    }
}

/// With [`crate::fakes::Behavior::slack_tier_window`] set (the stand-in for a minute), a method
/// called more often than its tier allows in one window is refused until the window
/// ends: the seconds left.
fn over_tier(ctx: &Ctx, method: &str) -> Option<f64> {
    let window = ctx.shared.behavior.slack_tier_window?;
    let limit = tier(method)?;
    let mut tiers = ctx.tiers.lock().ok()?;
    let now = Instant::now();
    let slot = tiers.entry(method.to_owned()).or_insert((now, 0));
    if now.duration_since(slot.0) >= window {
        *slot = (now, 0);
    }
    slot.1 += 1;
    (slot.1 > limit).then(|| (window - now.duration_since(slot.0)).as_secs_f64())
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
    let channel = body
        .get("channel")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    // Slack limits "per API method per app per workspace", `chat.postMessage` also per
    // channel; its Retry-After is whole seconds, and the window is what it says.
    let scope = match method.as_str() {
        "chat.postMessage" => format!("{method} {channel}"),
        _ => method.clone(),
    };
    let retry_after = ctx.shared.behavior.retry_after_secs.ceil().max(1.0);
    let limited = match ctx.shared.gate_scoped(&scope, retry_after) {
        Gate::RateLimited(secs) => Some(secs),
        Gate::Proceed => over_tier(&ctx, &method),
    };
    if let Some(secs) = limited {
        ctx.shared.record(&method, &body, 429);
        let mut r = (StatusCode::TOO_MANY_REQUESTS, Json(fail("ratelimited"))).into_response();
        if let Ok(v) = HeaderValue::from_str(&format!("{}", secs.ceil().max(1.0) as u64)) {
            r.headers_mut().insert("retry-after", v);
        }
        return r;
    }
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
            None if streaming(shared, &ts) => fail("cant_update_message"),
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
        "chat.startStream" => start_stream(shared, &channel, &body),
        "chat.appendStream" | "chat.stopStream" => {
            append_stream(shared, &channel, &ts, &body, method == "chat.stopStream")
        }
        "assistant.threads.setStatus" => set_status(shared, &body),
        _ => fail("unknown_method"),
    };
    shared.record(&method, &body, 200);
    // Message-creating calls (a stream's stop delivers the final answer) may be held
    // after they took effect.
    let creates = matches!(method.as_str(), "chat.postMessage" | "chat.stopStream");
    if creates && v.get("ok") == Some(&Value::Bool(true)) {
        maybe_delay(shared).await;
    }
    Json(v).into_response()
}

/// Whether `ts` is a stream still streaming (an idle one past the TTL has ended).
fn streaming(shared: &Shared, ts: &str) -> bool {
    let ttl = shared.behavior.slack_stream_ttl;
    let mut r = shared.lock();
    let Some(s) = r.streams.iter_mut().find(|s| s.id == ts) else {
        return false;
    };
    if ttl.is_some_and(|t| s.at.elapsed() >= t) {
        s.streaming = false;
    }
    s.streaming
}

/// The markdown a streaming call adds (its `markdown_text` and `markdown_text` chunks),
/// applying task and plan chunks to `stream`; `Err` names a refused argument.
fn apply_chunks(body: &Value, stream: &mut Stream) -> Result<String, &'static str> {
    let mut text = String::new();
    let mut add = |t: &str| {
        if t.chars().count() > MARKDOWN_LIMIT {
            return Err("msg_too_long");
        }
        text.push_str(t);
        Ok(())
    };
    if let Some(t) = body.get("markdown_text").and_then(Value::as_str) {
        add(t)?;
    }
    for chunk in body
        .get("chunks")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        let field = |k: &str| chunk.get(k).and_then(Value::as_str).unwrap_or("");
        match field("type") {
            "markdown_text" => add(field("text"))?,
            "task_update" => {
                let (id, status) = (field("id"), field("status"));
                if id.is_empty()
                    || !["pending", "in_progress", "complete", "error"].contains(&status)
                {
                    return Err("invalid_chunks");
                }
                stream.tasks.insert(
                    id.to_owned(),
                    (field("title").to_owned(), status.to_owned()),
                );
            }
            "plan_update" => stream.plan = Some(field("title").to_owned()),
            _ => return Err("invalid_chunks"),
        }
    }
    Ok(text)
}

fn start_stream(shared: &Shared, channel: &str, body: &Value) -> Value {
    if let Some(e) = &shared.behavior.slack_refuse_streams {
        return fail(e);
    }
    let arg = |k: &str| {
        body.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let Some(thread_ts) = arg("thread_ts") else {
        return fail("invalid_arguments");
    };
    let dm = channel.starts_with('D');
    if !dm && (arg("recipient_user_id").is_none() || arg("recipient_team_id").is_none()) {
        return fail("invalid_arguments");
    }
    let ts = format!("1700000000.{:06}", shared.next_id());
    let mut stream = Stream {
        id: ts.clone(),
        chat: channel.to_owned(),
        thread_ts: thread_ts.to_owned(),
        streaming: true,
        tasks: Default::default(),
        plan: None,
        at: Instant::now(),
    };
    let raw = match apply_chunks(body, &mut stream) {
        Ok(raw) => raw,
        Err(e) => return fail(e),
    };
    shared.push_message(Message {
        id: ts.clone(),
        chat: channel.to_owned(),
        text: unescape(&raw),
        raw,
        deleted: false,
        edits: 0,
    });
    shared.lock().streams.push(stream);
    json!({"ok": true, "channel": channel, "ts": ts})
}

fn append_stream(shared: &Shared, channel: &str, ts: &str, body: &Value, stop: bool) -> Value {
    let live = streaming(shared, ts);
    let mut r = shared.lock();
    let Some(i) = r
        .streams
        .iter()
        .position(|s| s.id == ts && s.chat == channel)
    else {
        return fail("message_not_found");
    };
    if !live {
        return fail("message_not_in_streaming_state");
    }
    let mut stream = r.streams[i].clone();
    let raw = match apply_chunks(body, &mut stream) {
        Ok(raw) => raw,
        Err(e) => return fail(e),
    };
    let Some(m) = r.messages.iter_mut().find(|m| m.id == ts && !m.deleted) else {
        return fail("message_not_found");
    };
    if (m.raw.chars().count() + raw.chars().count()) > LIMIT {
        return fail("msg_too_long");
    }
    m.raw.push_str(&raw);
    m.text = unescape(&m.raw);
    stream.at = Instant::now();
    stream.streaming = !stop;
    r.streams[i] = stream;
    json!({"ok": true, "channel": channel, "ts": ts})
}

fn set_status(shared: &Shared, body: &Value) -> Value {
    let arg = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let (channel, thread_ts) = (arg("channel_id"), arg("thread_ts"));
    if channel.is_empty() || thread_ts.is_empty() {
        return fail("invalid_arguments");
    }
    shared
        .lock()
        .statuses
        .push((channel, thread_ts, arg("status")));
    json!({"ok": true})
}

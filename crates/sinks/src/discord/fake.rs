//! Fake Discord webhook API.

use crate::fakes::{maybe_delay, Gate, Message, Shared};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{patch, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;

const LIMIT: usize = 2000;

#[derive(Clone)]
struct Ctx {
    shared: Shared,
    id: String,
    token: String,
}

pub(crate) fn router(shared: Shared, id: String, token: String) -> Router {
    Router::new()
        .route("/webhooks/{id}/{token}", post(execute))
        .route(
            "/webhooks/{id}/{token}/messages/{mid}",
            patch(edit).delete(delete),
        )
        .with_state(Ctx { shared, id, token })
}

fn reply(status: StatusCode, v: Value) -> Response {
    if status == StatusCode::NO_CONTENT {
        return status.into_response();
    }
    (status, Json(v)).into_response()
}

/// The webhook's bucket (`Behavior::discord_bucket`): `Ok(headers)` stating what is left
/// when the request may go, `Err(429)` (with the same headers, scope `user`) when the
/// bucket is spent.
fn bucket(ctx: &Ctx) -> Result<HeaderMap, Box<Response>> {
    let mut headers = HeaderMap::new();
    let Some((limit, window)) = ctx.shared.behavior.discord_bucket else {
        return Ok(headers);
    };
    let now = std::time::Instant::now();
    let (start, used, admitted) = {
        let mut r = ctx.shared.lock();
        let (start, used) = match r.bucket_window {
            Some((start, used)) if now.duration_since(start) < window => (start, used),
            _ => (now, 0),
        };
        let admitted = used < limit;
        let used = if admitted { used + 1 } else { used };
        r.bucket_window = Some((start, used));
        (start, used, admitted)
    };
    let reset_after = window
        .saturating_sub(now.duration_since(start))
        .as_secs_f64();
    for (k, v) in [
        ("x-ratelimit-bucket", format!("wh-{}", ctx.id)),
        ("x-ratelimit-limit", limit.to_string()),
        (
            "x-ratelimit-remaining",
            limit.saturating_sub(used).to_string(),
        ),
        ("x-ratelimit-reset-after", format!("{reset_after:.3}")),
    ] {
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.insert(k, v);
        }
    }
    if admitted {
        return Ok(headers);
    }
    let mut r = too_many(reset_after.max(0.001));
    headers.insert("x-ratelimit-scope", HeaderValue::from_static("user"));
    r.headers_mut().extend(headers);
    Err(Box::new(r))
}

fn too_many(secs: f64) -> Response {
    let mut r = (
        StatusCode::TOO_MANY_REQUESTS,
        Json(
            json!({"message": "You are being rate limited.", "retry_after": secs, "global": false}),
        ),
    )
        .into_response();
    let header = format!("{}", secs.ceil().max(1.0) as u64);
    if let Ok(v) = HeaderValue::from_str(&header) {
        r.headers_mut().insert("retry-after", v);
    }
    r
}

/// `response` with the bucket's headers added.
fn with_headers(mut response: Response, headers: HeaderMap) -> Response {
    response.headers_mut().extend(headers);
    response
}

fn unknown_webhook() -> (StatusCode, Value) {
    (
        StatusCode::UNAUTHORIZED,
        json!({"message": "Invalid Webhook Token", "code": 50027}),
    )
}

fn unknown_message() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"message": "Unknown Message", "code": 10008}),
    )
}

fn check_content(body: &Value) -> Result<String, (StatusCode, Value)> {
    let content = body
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if content.chars().count() > LIMIT {
        return Err((
            StatusCode::BAD_REQUEST,
            json!({"message": "Invalid Form Body", "code": 50035, "errors": {"content": {"_errors": [
                {"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}}}),
        ));
    }
    if content.trim().is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            json!({"message": "Cannot send an empty message", "code": 50006}),
        ));
    }
    Ok(content)
}

async fn execute(
    State(ctx): State<Ctx>,
    Path((id, token)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let chat = q.get("thread_id").cloned().unwrap_or_default();
    if id != ctx.id || token != ctx.token {
        let (s, v) = unknown_webhook();
        ctx.shared.record("execute", &body, s.as_u16());
        return reply(s, v);
    }
    if let Gate::RateLimited(secs) = ctx.shared.gate(ctx.shared.behavior.retry_after_secs) {
        ctx.shared.record("execute", &body, 429);
        return too_many(secs);
    }
    let limits = match bucket(&ctx) {
        Ok(h) => h,
        Err(r) => {
            ctx.shared.record("execute", &body, 429);
            return *r;
        }
    };
    let (status, v) = match check_content(&body) {
        Err(e) => e,
        Ok(content) => {
            let mid = (1_100_000_000_000_000_000u64 + ctx.shared.next_id()).to_string();
            ctx.shared.push_message(Message {
                id: mid.clone(),
                chat: chat.clone(),
                text: content.clone(),
                raw: content.clone(),
                deleted: false,
                edits: 0,
            });
            let wait = q.get("wait").map(String::as_str) == Some("true");
            if wait {
                (
                    StatusCode::OK,
                    json!({"id": mid, "content": content, "channel_id": chat, "webhook_id": ctx.id}),
                )
            } else {
                (StatusCode::NO_CONTENT, Value::Null)
            }
        }
    };
    ctx.shared.record("execute", &body, status.as_u16());
    if status.is_success() {
        maybe_delay(&ctx.shared).await;
    }
    with_headers(reply(status, v), limits)
}

async fn edit(
    State(ctx): State<Ctx>,
    Path((id, token, mid)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let chat = q.get("thread_id").cloned().unwrap_or_default();
    let (status, v) = if id != ctx.id || token != ctx.token {
        unknown_webhook()
    } else if let Gate::RateLimited(secs) = ctx.shared.gate(ctx.shared.behavior.retry_after_secs) {
        ctx.shared.record("edit", &body, 429);
        return too_many(secs);
    } else {
        match check_content(&body) {
            Err(e) => e,
            Ok(content) => {
                let done = ctx.shared.with_message(&chat, &mid, |m| {
                    m.text = content.clone();
                    m.raw = content.clone();
                    m.edits += 1;
                });
                match done {
                    None => unknown_message(),
                    Some(()) => (StatusCode::OK, json!({"id": mid, "content": content})),
                }
            }
        }
    };
    ctx.shared.record("edit", &body, status.as_u16());
    reply(status, v)
}

async fn delete(
    State(ctx): State<Ctx>,
    Path((id, token, mid)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let chat = q.get("thread_id").cloned().unwrap_or_default();
    let (status, v) = if id != ctx.id || token != ctx.token {
        unknown_webhook()
    } else if let Gate::RateLimited(secs) = ctx.shared.gate(ctx.shared.behavior.retry_after_secs) {
        ctx.shared.record("delete", &Value::Null, 429);
        return too_many(secs);
    } else {
        match ctx.shared.with_message(&chat, &mid, |m| m.deleted = true) {
            None => unknown_message(),
            Some(()) => (StatusCode::NO_CONTENT, Value::Null),
        }
    };
    ctx.shared.record("delete", &Value::Null, status.as_u16());
    reply(status, v)
}

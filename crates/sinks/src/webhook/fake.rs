//! Fake webhook receiver: verifies `X-Streamgate-Signature`, dedupes on
//! `Idempotency-Key` (as a well-behaved receiver must), keeps the applied ops.

use crate::fakes::{maybe_delay, Gate, Shared};
use crate::webhook::verify;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Clone)]
struct Ctx {
    shared: Shared,
    secret: String,
}

pub(crate) fn router(shared: Shared, secret: String) -> Router {
    Router::new()
        .route("/hook", post(handle))
        .with_state(Ctx { shared, secret })
}

async fn handle(State(ctx): State<Ctx>, headers: HeaderMap, raw: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let api = body
        .get("op")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    let sig = headers
        .get("x-streamgate-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !verify(ctx.secret.as_bytes(), &raw, sig) {
        ctx.shared.record(&api, &body, 401);
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "bad signature"})),
        )
            .into_response();
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        ctx.shared.record(&api, &body, 400);
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "no Idempotency-Key"})),
        )
            .into_response();
    };
    let refusing = ctx
        .shared
        .behavior
        .refuse_status
        .filter(|_| !ctx.shared.lock().recovered);
    if let Some(status) = refusing {
        let chat = body.get("chat").and_then(Value::as_str).unwrap_or("");
        let refused = &ctx.shared.behavior.refuse_chats;
        if refused.is_empty() || refused.iter().any(|c| c == chat) {
            ctx.shared.record(&api, &body, status);
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            return (code, Json(json!({"error": "refused"}))).into_response();
        }
    }
    if let Gate::RateLimited(secs) = ctx.shared.gate(ctx.shared.behavior.retry_after_secs) {
        ctx.shared.record(&api, &body, 429);
        let mut r = StatusCode::TOO_MANY_REQUESTS.into_response();
        if let Ok(v) = HeaderValue::from_str(&format!("{secs}")) {
            r.headers_mut().insert("retry-after", v);
        }
        return r;
    }
    let fresh = {
        let mut r = ctx.shared.lock();
        if r.seen_keys.insert(key) {
            r.events.push(body.clone());
            true
        } else {
            r.duplicates += 1;
            false
        }
    };
    ctx.shared.record(&api, &body, 200);
    if fresh && api == "final" {
        maybe_delay(&ctx.shared).await;
    }
    Json(json!({"ok": true, "duplicate": !fresh})).into_response()
}

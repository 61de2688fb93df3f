//! HTTP ingest: `POST /v1/ingest/{tenant}/{run}?family=f1[&session=…][&chunk_bytes=N]`
//! with the provider stream as the (chunked) request body:
//!
//! ```sh
//! curl --data-binary @capture.sse 'http://127.0.0.1:7311/v1/ingest/acme/run-1?family=f1'
//! ```
//!
//! The body is cut into chunks as it arrives (at most `chunk_bytes` each) and published
//! with at most a window of chunks in flight per request ([`flow::DEFAULT_WINDOW`] unless
//! configured): more of the body is
//! read only while the window has room, so a slow broker slows the sender and a request
//! holds at most about `window × chunk_bytes` of its body in memory, however large the
//! body ([`super::flow`]). Once every chunk is acknowledged, the end of the body writes a
//! `normal` close marker — or `abnormal` when the body breaks off. The reply says how
//! many chunks were stored.
//!
//! Ids that break the id rule get 400; a run another request is ingesting right now
//! (or an already closed run) gets 409. When the broker cannot take chunks right now (a
//! stream leader being elected, no responders, ack timeouts) the answer is 503 with
//! `Retry-After` (seconds): send the same request again then. A broker refusal that
//! repeating cannot fix is 502. `Authorization: Bearer <token>` is matched with the
//! scheme in any case; a missing or unknown token gets 401, a token for other tenants
//! 403 ([`super::auth`]).
//!
//! Resending is safe: a POST to a run that already has chunks stored (a request that
//! failed part-way) is taken as the same body sent again — it is cut the same way (send
//! the same `chunk_bytes`) and the chunks already stored are skipped, so the run gets
//! every byte once. The reply's `chunks` counts the chunks this request stored.

use super::auth::IngestAuth;
use super::flow::Window;
use super::{IngestError, Ingestor, RunSpec, RETRY_AFTER};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use streamgate_bus::raw::CloseKind;
use streamgate_bus::trace::{self, TraceContext};
use tracing::Instrument as _;

/// Default chunk size for HTTP bodies.
pub const DEFAULT_CHUNK_BYTES: usize = 16 * 1024;

#[derive(Clone)]
struct AppState {
    ingestor: Ingestor,
    auth: IngestAuth,
}

/// Query parameters of an ingest request.
#[derive(Debug, Deserialize)]
struct IngestQuery {
    family: Option<String>,
    session: Option<String>,
    dialect: Option<String>,
    chunk_bytes: Option<usize>,
}

/// The ingest routes; every request's bearer token must grant its tenant (`auth`).
pub fn router(ingestor: Ingestor, auth: IngestAuth) -> Router {
    Router::new()
        .route("/v1/ingest/{tenant}/{run}", post(ingest))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .with_state(AppState { ingestor, auth })
}

/// The status of a failed `put`: the broker's fault unless the request was wrong; a
/// broker that is only temporarily unavailable gets 503 with `Retry-After`.
fn put_error(e: IngestError) -> Response {
    let code = match e {
        IngestError::Invalid(_) | IngestError::Id(_) => StatusCode::BAD_REQUEST,
        IngestError::Closed(_) | IngestError::Busy(_) => StatusCode::CONFLICT,
        IngestError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        IngestError::Broker(_) => StatusCode::BAD_GATEWAY,
    };
    let transient = e.is_transient();
    let mut resp = error(code, e.to_string());
    if transient {
        metrics::counter!("streamgate_ingest_unavailable_total", "transport" => "http")
            .increment(1);
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(RETRY_AFTER.as_secs().max(1)),
        );
    }
    resp
}

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

async fn ingest(
    State(st): State<AppState>,
    Path((tenant, run_id)): Path<(String, String)>,
    Query(q): Query<IngestQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let span = streamgate_runtime::hop_span!("ingest", transport = "http", tenant = %tenant, run = %run_id);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let incoming = TraceContext::parse(
        header(trace::HDR_TRACEPARENT),
        header(trace::HDR_TRACESTATE),
    );
    let trace = trace::follow(&span, incoming);
    ingest_body(st, tenant, run_id, q, headers, body, trace)
        .instrument(span)
        .await
}

async fn ingest_body(
    st: AppState,
    tenant: String,
    run_id: String,
    q: IngestQuery,
    headers: HeaderMap,
    body: Body,
    trace: Option<TraceContext>,
) -> Response {
    let trace = trace.as_ref();
    if let Err(e) = st.auth.check_http(&headers, &tenant) {
        return e.into_response();
    }
    let spec = RunSpec {
        tenant,
        run_id,
        session_key: q.session,
        family: q.family.unwrap_or_else(|| "auto".to_owned()),
        dialect: q.dialect,
    };
    if let Err(e) = Ingestor::check(&spec) {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    // One request per run at a time; the claim is released when this handler returns
    // (or is dropped with a broken connection).
    let _claim = match st.ingestor.claim(&spec.tenant, &spec.run_id) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::CONFLICT, e.to_string()),
    };
    let chunk_bytes = q
        .chunk_bytes
        .unwrap_or(DEFAULT_CHUNK_BYTES)
        .clamp(1, 4 << 20);
    let point = match st.ingestor.resume_point(&spec.tenant, &spec.run_id).await {
        Ok(p) => p,
        Err(e) => return put_error(e),
    };
    if point.closed {
        return error(
            StatusCode::CONFLICT,
            IngestError::Closed(spec.run_id.clone()).to_string(),
        );
    }
    let mut window = Window::new(st.ingestor.window());
    let cut = Cut {
        chunk_bytes,
        stored: point.next_chunk,
    };
    let sent = send_body(&st.ingestor, &spec, &mut window, cut, body, trace).await;
    // Every chunk acknowledged (or failed) before the answer or the close marker.
    let drained = window.drain().await;
    let Sent {
        next,
        bytes_in,
        close,
    } = match sent.and_then(|b| drained.map(|()| b)) {
        Ok(b) => b,
        Err(e) => return put_error(e),
    };
    if let Err(e) = st
        .ingestor
        .put(&spec, next, Bytes::new(), Some(close), trace)
        .await
    {
        return put_error(e);
    }
    Json(serde_json::json!({
        "tenant": spec.tenant,
        "run_id": spec.run_id,
        "chunks": next.saturating_sub(point.next_chunk),
        "bytes": bytes_in,
        "close": close.as_str(),
    }))
    .into_response()
}

/// What was read of a body and sent.
struct Sent {
    /// The next chunk index (the close marker's).
    next: u64,
    /// Bytes read.
    bytes_in: u64,
    /// How the body ended.
    close: CloseKind,
}

/// How a body is cut into chunks.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// Bytes per chunk (the last may be shorter).
    chunk_bytes: usize,
    /// Chunks of the run already stored: the body's first chunks up to this index are a
    /// resend and are skipped.
    stored: u64,
}

/// Sends chunk `index` through `window` unless it is already stored.
async fn send_chunk(
    ingestor: &Ingestor,
    spec: &RunSpec,
    window: &mut Window,
    (index, cut): (u64, Cut),
    part: Bytes,
    trace: Option<&TraceContext>,
) -> Result<(), IngestError> {
    if index < cut.stored {
        return Ok(());
    }
    window.make_room().await?;
    window.push(ingestor.send(spec, index, part, None, trace).await?);
    Ok(())
}

/// Reads the body and sends it in chunks of `cut.chunk_bytes` through `window`,
/// skipping the chunks already stored: the body is read only while the window has room
/// (acks that come back meanwhile are taken at once). Returns when the whole body was
/// sent; acks may still be in flight.
async fn send_body(
    ingestor: &Ingestor,
    spec: &RunSpec,
    window: &mut Window,
    cut: Cut,
    body: Body,
    trace: Option<&TraceContext>,
) -> Result<Sent, IngestError> {
    let chunk_bytes = cut.chunk_bytes;
    let mut next = 0;
    let mut pending = BytesMut::new();
    let mut stream = body.into_data_stream();
    let mut close = CloseKind::Normal;
    let mut bytes_in = 0u64;
    loop {
        let frame = tokio::select! {
            biased;
            Some(ack) = window.next_ack(), if !window.is_empty() => {
                ack?;
                continue;
            }
            frame = stream.next(), if !window.is_full() => frame,
        };
        match frame {
            Some(Ok(data)) => {
                bytes_in += data.len() as u64;
                pending.extend_from_slice(&data);
                while pending.len() >= chunk_bytes {
                    let part = pending.split_to(chunk_bytes).freeze();
                    send_chunk(ingestor, spec, window, (next, cut), part, trace).await?;
                    next += 1;
                }
            }
            Some(Err(_)) => {
                close = CloseKind::Abnormal;
                break;
            }
            None => break,
        }
    }
    if !pending.is_empty() {
        window.make_room().await?;
        window.push(
            ingestor
                .send(spec, next, pending.freeze(), None, trace)
                .await?,
        );
        next += 1;
    }
    Ok(Sent {
        next,
        bytes_in,
        close,
    })
}

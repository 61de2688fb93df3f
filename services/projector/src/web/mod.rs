//! The built-in tier-T2 web channel: a [`WebSink`] that keeps recent runs in memory
//! ([`runs::Runs`]: live and ended, bounded by count and age) and an axum server with
//! the page that lists them and follows one live over SSE.
//!
//! Routes:
//! - `GET /` — the page; `GET /assets/app.js`, `GET /assets/app.css` — its script and
//!   styles (files beside this module, compiled in with `include_str!`; no CDN);
//! - `GET /api/runs` — the run list, newest first (JSON; each row names its `tenant` and
//!   `run_id`);
//! - `GET /api/runs/{run}?tenant=<t>` — what the page shows of one run
//!   ([`runs::RunView`], JSON);
//! - `GET /runs/{run}/events?tenant=<t>` — SSE: the run's view now, then again whenever
//!   it changed, at most ~10 per second (latest wins: a page never queues stale drafts);
//! - `GET /v1/runs/{tenant}/{run}/events` — the run stream ([`crate::run_stream`]): the
//!   run's display-safe events, resumable by seq.
//!
//! A run is `(tenant, run id)`: the same run id under two tenants is two records. Without
//! `?tenant=` a URL names the only tenant's run of that id (nothing while several
//! tenants have one); the page always sends the tenant.
//!
//! Model output is untrusted: answers and commentary are rendered from markdown on the
//! server and sanitized ([`markdown`]); the page inserts only that HTML and sets every
//! other string as text.
//!
//! The sink does nothing slow: each op updates one in-memory record and bumps a version
//! (markdown is rendered when a page asks, not per op), so the channel's consumers keep
//! their own pace whatever the pages do.

pub mod access;
pub mod markdown;
pub mod runs;

use crate::channel::Channel;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use futures::Stream;
use runs::{RunView, Runs};
use std::convert::Infallible;
use std::sync::Arc;
use streamgate_grammar::{EventData, SegmentPhase};
use streamgate_projection::{DraftKey, Op, Tier};
use streamgate_sinks::{ChatTarget, DeliveryState, Pacing, Rate, Sink, SinkError};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLES: &str = include_str!("assets/app.css");

/// The web channel's sink: idempotent by the delivery state like every sink, recording
/// each op into the run's record for the page.
pub struct WebSink {
    channel: String,
    runs: Runs,
}

impl WebSink {
    /// A web sink for channel `channel`.
    pub fn new(channel: impl Into<String>) -> Arc<WebSink> {
        Arc::new(WebSink {
            channel: channel.into(),
            runs: Runs::default(),
        })
    }

    /// The runs the page can show.
    pub fn runs(&self) -> &Runs {
        &self.runs
    }
}

impl Sink for WebSink {
    fn channel(&self) -> &str {
        &self.channel
    }

    fn kind(&self) -> &'static str {
        "web"
    }

    fn tier(&self) -> Tier {
        Tier::T2 { status_line: false }
    }

    /// No chat API to protect, but every executed op costs a delivery-state load and
    /// save in KV: 20 ops a second per chat (drafts coalesce latest-wins in between)
    /// keeps the page live — each run's stream coalesces to ~10 snapshots a second
    /// anyway — without a KV round trip per event. A 1/s pace made the page lag a second
    /// behind; no pace at all cost a 20 MiB ingest ~25% more time on 2 cores.
    fn pacing(&self) -> Pacing {
        Pacing {
            per_chat: Some(Rate::new(20.0, 20)),
            per_sink: None,
            concurrency: 16,
        }
    }

    fn execute<'a>(
        &'a self,
        chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let record = |run: &DraftKey| self.runs.apply(run, &chat.chat_id, op);
            match op {
                Op::Typing => {}
                Op::Draft { key, text, seq } => {
                    if state.settled || state.draft_text.as_deref() == Some(text) {
                        return Ok(());
                    }
                    record(key);
                    state.draft_text = Some(text.clone());
                    state.last_rendered_seq = Some(*seq);
                }
                Op::Settle { key, text, seq } => {
                    if state.settled {
                        return Ok(());
                    }
                    record(key);
                    state.draft_text = Some(text.clone());
                    state.last_rendered_seq = Some(*seq);
                    state.settled = true;
                }
                Op::Dismiss { key } => {
                    if state.dismissed {
                        return Ok(());
                    }
                    record(key);
                    state.dismissed = true;
                    state.settled = true;
                }
                Op::Final { key, .. } => {
                    if state.final_delivered {
                        return Ok(());
                    }
                    record(key);
                    state.final_delivered = true;
                }
                Op::Retract { key, .. } => {
                    if state.retracted {
                        return Ok(());
                    }
                    record(key);
                    state.retracted = true;
                }
                Op::Notice { key, seq, .. } => {
                    if !state.notices_sent.insert(*seq) {
                        return Ok(());
                    }
                    record(key);
                }
            }
            Ok(())
        })
    }
}

/// Follows the channel's events for what ops do not carry: when each thinking segment
/// started and ended (the page's "Thought for N s"). Lagging behind drops timings,
/// never events of the channel.
pub async fn follow_thinking(channel: Arc<Channel>, sink: Arc<WebSink>, stop: CancellationToken) {
    let mut rx = channel.subscribe_events();
    loop {
        let ev = tokio::select! {
            () = stop.cancelled() => return,
            ev = rx.recv() => ev,
        };
        match ev {
            Ok(ev) => {
                if let EventData::Thinking(t) = &ev.event.data {
                    sink.runs.thinking_at(
                        (&ev.envelope.tenant, &ev.envelope.run_id),
                        t.id.as_deref(),
                        t.phase == Some(SegmentPhase::Start),
                        ev.envelope.ts_ms,
                    );
                }
            }
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

#[derive(Clone)]
struct AppState {
    sink: Arc<WebSink>,
    shutdown: CancellationToken,
}

/// The web page's router. SSE streams end when `shutdown` fires: a graceful shutdown
/// waits for open connections, and an open page would otherwise hold the process up
/// (the page's `EventSource` reconnects to the next instance by itself).
///
/// Every route is behind [`access::guard`]: loopback host names only on a loopback
/// page, and the channel token when `access` has one.
pub fn router(
    sink: Arc<WebSink>,
    shutdown: CancellationToken,
    access: access::PageAccess,
    channel: Arc<Channel>,
) -> Router {
    let run_stream = crate::run_stream::router(channel, shutdown.clone());
    Router::new()
        .route("/", get(page))
        .route("/assets/app.js", get(script))
        .route("/assets/app.css", get(styles))
        .route("/api/runs", get(list))
        .route("/api/runs/{run}", get(one))
        .route("/runs/{run}/events", get(run_events))
        .with_state(AppState { sink, shutdown })
        .merge(run_stream)
        .layer(axum::middleware::from_fn_with_state(access, access::guard))
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn styles() -> Response {
    asset("text/css; charset=utf-8", STYLES)
}

async fn list(State(s): State<AppState>) -> Json<Vec<runs::RunRow>> {
    Json(s.sink.runs.list())
}

/// `?tenant=`: the run's tenant (absent: the only tenant with a run of that id).
#[derive(Debug, Default, serde::Deserialize)]
struct TenantQuery {
    #[serde(default)]
    tenant: String,
}

async fn one(
    State(s): State<AppState>,
    Path(run): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Response {
    match s.sink.runs.view(&q.tenant, &run) {
        Some(v) => Json(v).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn sse_of(v: &RunView) -> SseEvent {
    let data = serde_json::to_string(v).unwrap_or_else(|_| "{}".to_owned());
    SseEvent::default().id(v.version.to_string()).data(data)
}

async fn run_events(
    State(s): State<AppState>,
    Path(run): Path<String>,
    Query(q): Query<TenantQuery>,
) -> impl IntoResponse {
    let tenant = q.tenant;
    let mut changed = s.sink.runs.watch();
    let sink = s.sink.clone();
    let stop = s.shutdown.clone();
    let stream = async_stream(move |tx| async move {
        let mut sent = 0u64;
        loop {
            let version = sink.runs.version(&tenant, &run);
            if version != sent {
                if let Some(v) = sink.runs.view(&tenant, &run) {
                    sent = v.version;
                    if tx.send(sse_of(&v)).await.is_err() {
                        return;
                    }
                }
                // Coalesce: whatever changes meanwhile goes out as one snapshot.
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(runs::MIN_PUSH_INTERVAL) => {}
                }
                continue;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                // The page went away: no task waits for a change that nobody reads.
                () = tx.closed() => return,
                r = changed.changed() => if r.is_err() { return },
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// A stream fed by a task (ends when the task returns or the client goes).
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Result<SseEvent, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<SseEvent>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(f(tx));
    futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}

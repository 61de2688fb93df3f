//! The built-in tier-T2 web channel: a [`WebSink`] that keeps the run list
//! ([`runs::Runs`]: live and ended, bounded by count and age) and an axum server with
//! the page, which is a client of the run stream: it lists runs and follows one live
//! from its events.
//!
//! Routes:
//! - `GET /` — the page; `GET /assets/…` — its script, styles and the vendored
//!   highlighter (files in `assets/`, compiled in with `include_str!`; no CDN);
//! - `GET /api/runs` — the run list, newest first (JSON; each row names its `tenant` and
//!   `run_id`); `GET /api/runs/events` — the same list pushed over SSE whenever it
//!   changes (at most every [`runs::MIN_PUSH_INTERVAL`]);
//! - `POST /api/render` — markdown (the body, untrusted) as sanitized HTML
//!   ([`markdown`]): the page folds a run's events itself and asks the server to render
//!   each answer and commentary block, so no model text becomes HTML in the browser;
//! - `GET /v1/runs/{tenant}/{run}/events`, `GET /v1/runs` — the run stream
//!   ([`crate::run_stream`]): what the page shows of a run, event by event.
//!
//! A run is `(tenant, run id)`: the same run id under two tenants is two runs.
//!
//! The sink does nothing slow: each op updates one list row and bumps a version, so the
//! channel's consumers keep their own pace whatever the pages do.
//!
//! # Layout
//! - this file: the sink and the routes;
//! - [`runs`]: the run list; [`seed`]: the list after a restart, from `SG_EVENTS`;
//! - [`markdown`]: markdown → sanitized HTML; [`access`]: who may open the page;
//! - `assets/`: `index.html`, `app.css`, `app.js` (the page), `fold.js` (a run's events
//!   folded into what the page shows), `highlight.min.js` + `highlight.css` (vendored
//!   highlight.js 11, BSD-3-Clause, `assets/highlight.LICENSE`).

pub mod access;
pub mod markdown;
pub mod runs;
pub mod seed;

use crate::channel::Channel;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use futures::Stream;
use runs::Runs;
use std::convert::Infallible;
use std::sync::Arc;
use streamgate_projection::{DraftKey, Op, Tier};
use streamgate_sinks::{ChatTarget, DeliveryState, Pacing, Rate, Sink, SinkError, TextDigest};
use tokio_util::sync::CancellationToken;

const PAGE: &str = include_str!("assets/index.html");
/// The page's files: path under `/assets/`, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("assets/app.js")),
    ("fold.js", JS, include_str!("assets/fold.js")),
    (
        "highlight.min.js",
        JS,
        include_str!("assets/highlight.min.js"),
    ),
    ("app.css", CSS, include_str!("assets/app.css")),
    ("highlight.css", CSS, include_str!("assets/highlight.css")),
];
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

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
                Op::Draft { key, text, seq, .. } => {
                    let digest = TextDigest::of(text);
                    if state.settled || digest.is_in(&state.draft_digest) {
                        return Ok(());
                    }
                    record(key);
                    state.draft_digest = Some(digest);
                    state.last_rendered_seq = Some(*seq);
                }
                Op::Settle { key, text, seq } => {
                    if state.settled {
                        return Ok(());
                    }
                    record(key);
                    state.draft_digest = Some(TextDigest::of(text));
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

#[derive(Clone)]
struct AppState {
    sink: Arc<WebSink>,
    shutdown: CancellationToken,
}

/// The web page's router. SSE streams end when `shutdown` fires: a graceful shutdown
/// waits for open connections, and an open page would otherwise hold the process up
/// (the page reconnects to the next instance by itself).
///
/// Every route is behind [`access::guard`]: loopback host names only on a loopback
/// page, and the channel token when `access` has one.
pub fn router(
    sink: Arc<WebSink>,
    shutdown: CancellationToken,
    access: access::PageAccess,
    channel: Arc<Channel>,
) -> Router {
    let cors = crate::run_stream::cors(&channel.config().cors_origins);
    let run_stream = crate::run_stream::router(channel, shutdown.clone());
    let router = Router::new()
        .route("/", get(page))
        .route("/assets/{file}", get(asset))
        .route("/api/runs", get(list))
        .route("/api/runs/events", get(list_events))
        .route("/api/render", post(render))
        .with_state(AppState { sink, shutdown })
        .merge(run_stream)
        .layer(axum::middleware::from_fn_with_state(access, access::guard));
    // Outermost: a preflight is answered before the guard asks for a credential.
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, kind, body)) => (
            [
                (header::CONTENT_TYPE, *kind),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn list(State(s): State<AppState>) -> Json<Vec<runs::RunRow>> {
    Json(s.sink.runs.list())
}

/// Markdown from the page (a block of a run it folded) as sanitized HTML.
async fn render(body: String) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markdown::render(&body),
    )
        .into_response()
}

/// The run list now, then again whenever it changed (coalesced: latest wins).
async fn list_events(State(s): State<AppState>) -> impl IntoResponse {
    let mut changed = s.sink.runs.watch();
    let sink = s.sink.clone();
    let stop = s.shutdown.clone();
    let stream = async_stream(move |tx| async move {
        let mut sent: Option<Vec<runs::RunRow>> = None;
        loop {
            let rows = sink.runs.list();
            if sent.as_ref() != Some(&rows) {
                let data = serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned());
                if tx.send(SseEvent::default().data(data)).await.is_err() {
                    return;
                }
                sent = Some(rows);
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(runs::MIN_PUSH_INTERVAL) => {}
            }
            tokio::select! {
                () = stop.cancelled() => return,
                // The page went away: no task waits for a change that nobody reads.
                () = tx.closed() => return,
                r = changed.changed() => if r.is_err() { return },
                // Relative times and age eviction move without ops.
                () = tokio::time::sleep(std::time::Duration::from_secs(30)) => {}
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

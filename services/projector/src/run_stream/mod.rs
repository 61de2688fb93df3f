//! The run stream (docs/architecture.md §6): one run's display-safe events over HTTP, for any
//! application that wants to follow a run live.
//!
//! `GET /v1/runs/{tenant}/{run}/events` answers Server-Sent Events, one canonical event
//! per message (`data:` is the event as `streamgate replay --json` prints it, envelope
//! included; `id:` is its seq):
//! - **resumable**: `Last-Event-ID: <seq>` (what `EventSource` sends on its own after a
//!   drop) or `?after=<seq>` starts after that seq — no gap, no duplicate;
//! - **from `SG_EVENTS`**, not from this replica's memory: an ordered consumer on the
//!   run's subject, so the stream is the same whichever replica serves it, across a
//!   projector restart or a move of the run to another replica, and for ended runs while
//!   the stream still holds them (never the archive: that is operator-only);
//! - **waits** for a run that has not started yet, up to `?wait=<secs>` (default
//!   [`DEFAULT_WAIT`], at most [`MAX_WAIT`]), then ends with an `event: error`;
//! - **ends** after the run's terminal event; heartbeat comments every
//!   [`HEARTBEAT`] keep proxies from closing a quiet stream;
//! - **display-safe** like every channel surface: thinking, commentary and tool text
//!   pass through the projection's one redactor on each lane's accumulated text (events
//!   before the resume point still prime it), final answers verbatim;
//! - only runs the channel shows (its tenant and session filters), behind the channel's
//!   credential (the router is mounted behind the channel's access guard);
//! - in three encodings (`?format=`): `canonical` (the default, above), `ai-sdk` (the
//!   Vercel AI SDK UI message stream v1, [`ai_sdk`]) and `ag-ui` (AG-UI events,
//!   [`ag_ui`]); both of the latter are spelled from one part model ([`parts`]), and
//!   every message an event causes carries that event's seq as its `id`.
//!
//! # Layout
//! - this file: the route, the follow of `SG_EVENTS`, the encoder switch;
//! - [`list`]: `GET /v1/runs`, the channel's runs (cursor paged);
//! - [`parts`]: canonical events as reasoning, text and tool parts;
//! - [`ai_sdk`], [`ag_ui`]: one module per encoding.

mod ag_ui;
mod ai_sdk;
mod list;
mod parts;

use crate::channel::Channel;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt as _;
use std::sync::Arc;
use std::time::Duration;
use streamgate_bus::subject::RunAddr;
use streamgate_bus::{events, EVENTS_STREAM};
use streamgate_grammar::{ids::RunRef, RunEvent};
use streamgate_projection::EventRedactor;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a stream waits for a run that has not started, by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// The longest wait a client may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);
/// Interval of the heartbeat comments.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

#[derive(Clone)]
struct RunStreamState {
    channel: Arc<Channel>,
    shutdown: CancellationToken,
}

/// The origins of `--cors-origin`, checked: each `http://` or `https://` plus a host
/// (and port), nothing else; `*` is refused (a channel's runs are not for every site).
pub fn check_origins(origins: &[String]) -> anyhow::Result<Vec<String>> {
    origins
        .iter()
        .map(|o| o.trim().trim_end_matches('/'))
        .filter(|o| !o.is_empty())
        .map(|o| {
            let rest = o
                .strip_prefix("https://")
                .or_else(|| o.strip_prefix("http://"))
                .ok_or_else(|| {
                    anyhow::anyhow!("--cors-origin {o:?}: an origin is http(s)://host[:port]")
                })?;
            let ok = !rest.is_empty()
                && rest
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
            anyhow::ensure!(
                ok,
                "--cors-origin {o:?}: an origin is http(s)://host[:port], no path"
            );
            Ok(o.to_owned())
        })
        .collect()
}

/// CORS for the run stream when the channel names origins: their browser apps may GET
/// it with `Authorization` and `Last-Event-ID` (preflights answered before any auth) and
/// read the AI SDK header; the page's cookie is never sent across origins (no
/// credentials mode). `tower-http`'s layer, not a hand-written one.
pub fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{header, HeaderName, HeaderValue, Method};
    let allowed: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    if allowed.is_empty() {
        return None;
    }
    Some(
        tower_http::cors::CorsLayer::new()
            .allow_origin(allowed)
            .allow_methods([Method::GET])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("last-event-id"),
            ])
            .expose_headers([HeaderName::from_static("x-vercel-ai-ui-message-stream")])
            .max_age(Duration::from_secs(600)),
    )
}

/// The channel's bearer token on a request to the run stream served beside
/// `ProjectorService` (channels without a web page): 401 with a JSON body naming the rule
/// when it is missing or wrong; no check when the channel has no token.
pub async fn require_bearer(
    State(token): State<Option<Arc<str>>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match streamgate_runtime::rpc::check_bearer(given, &token) {
        Ok(()) => next.run(req).await,
        Err(e) => (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            Json(serde_json::json!({ "error": format!("the channel's token is required: {e}"), "code": "unauthorized" })),
        )
            .into_response(),
    }
}

/// The run-stream routes of `channel`. Streams end when `shutdown` fires (a client
/// resumes from its last seq on the next instance).
pub fn router(channel: Arc<Channel>, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/v1/runs", get(list::list))
        .route("/v1/runs/{tenant}/{run}/events", get(events_route))
        .route("/v1/runs/{tenant}/{run}/stream", get(resume_route))
        .with_state(RunStreamState { channel, shutdown })
}

#[derive(Debug, Default, serde::Deserialize)]
struct StreamQuery {
    after: Option<u64>,
    wait: Option<u64>,
    #[serde(default)]
    format: Format,
}

/// How the run stream spells events.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Format {
    /// One canonical event per message.
    #[default]
    Canonical,
    /// The Vercel AI SDK UI message stream v1.
    AiSdk,
    /// AG-UI events.
    AgUi,
}

/// One stream's encoder: the format and, for part-based formats, the run's part state.
struct Encoder {
    format: Format,
    parts: parts::Parts,
}

impl Encoder {
    /// The messages of one display-safe event; `send` false only updates the state (an
    /// event at or before the resume point).
    fn encode(&mut self, ev: &RunEvent, send: bool) -> Vec<SseEvent> {
        let id = ev.event.seq.to_string();
        let data: Vec<String> = match self.format {
            Format::Canonical => vec![ev.to_json()],
            Format::AiSdk | Format::AgUi => {
                let ops = self.parts.apply(ev);
                let env = &ev.envelope;
                let thread = env.session_key.as_deref().unwrap_or(&env.run_id);
                ops.iter()
                    .flat_map(|op| match self.format {
                        Format::AgUi => ag_ui::events(op, thread, &env.run_id, env.ts_ms),
                        _ => ai_sdk::chunks(op, &env.run_id),
                    })
                    .map(|v| v.to_string())
                    .collect()
            }
        };
        if !send {
            return Vec::new();
        }
        let mut out: Vec<SseEvent> = data
            .into_iter()
            .map(|d| SseEvent::default().id(id.clone()).data(d))
            .collect();
        if ev.event.is_terminal() && self.format == Format::AiSdk {
            out.push(SseEvent::default().data("[DONE]"));
        }
        out
    }

    /// How the stream says it ends early (not the run's end), with a code a client can
    /// act on.
    fn error(&self, end: &StreamEnd) -> Vec<SseEvent> {
        let (code, msg) = (end.code(), end.message());
        match self.format {
            Format::Canonical => vec![SseEvent::default()
                .event("error")
                .data(serde_json::json!({ "error": msg, "code": code }).to_string())],
            Format::AiSdk => vec![
                SseEvent::default().data(
                    serde_json::json!({"type": "error", "errorText": format!("{code}: {msg}")})
                        .to_string(),
                ),
                SseEvent::default().data("[DONE]"),
            ],
            Format::AgUi => vec![SseEvent::default().data(
                serde_json::json!({"type": "RUN_ERROR", "message": msg, "code": code}).to_string(),
            )],
        }
    }
}

/// Why a stream ends before its run's terminal event.
#[derive(Debug)]
enum StreamEnd {
    /// No event arrived within the wait (`not_started`): the run has not started, or the
    /// event stream no longer holds it.
    NotStarted(Duration),
    /// The run is outside the channel's tenant or session filters (`not_shown`).
    NotShown,
    /// The event stream could not be read (`unavailable`).
    Unavailable(String),
    /// The projector is stopping (`shutting_down`): reconnect with `Last-Event-ID`.
    ShuttingDown,
}

impl StreamEnd {
    fn code(&self) -> &'static str {
        match self {
            StreamEnd::NotStarted(_) => "not_started",
            StreamEnd::NotShown => "not_shown",
            StreamEnd::Unavailable(_) => "unavailable",
            StreamEnd::ShuttingDown => "shutting_down",
        }
    }

    fn message(&self) -> String {
        match self {
            StreamEnd::NotStarted(wait) => format!(
                "the run did not start within {} s (or the event stream no longer holds it)",
                wait.as_secs()
            ),
            StreamEnd::NotShown => "this run is not shown on this channel".to_owned(),
            StreamEnd::Unavailable(e) => format!("event stream unavailable: {e}"),
            StreamEnd::ShuttingDown => {
                "projector shutting down: reconnect with Last-Event-ID".to_owned()
            }
        }
    }
}

fn bad_request(msg: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": msg })),
    )
        .into_response()
}

async fn events_route(
    State(s): State<RunStreamState>,
    Path((tenant, run)): Path<(String, String)>,
    Query(q): Query<StreamQuery>,
    headers: HeaderMap,
) -> Response {
    let run = match RunRef::new(&tenant, &run) {
        Ok(run) => run,
        Err(e) => return bad_request(e.to_string()),
    };
    let last_event_id = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => match v.trim().parse::<u64>() {
            Ok(seq) => Some(seq),
            Err(_) => return bad_request("Last-Event-ID must be an event seq".to_owned()),
        },
        Some(Err(_)) => return bad_request("Last-Event-ID must be an event seq".to_owned()),
    };
    let after = last_event_id.or(q.after).unwrap_or(0);
    let wait = q
        .wait
        .map_or(DEFAULT_WAIT, Duration::from_secs)
        .min(MAX_WAIT);
    follow_response(&s, &run, q.format, after, wait)
}

/// The answer of a channel that does not show `tenant`'s runs, if it does not.
fn other_tenant(s: &RunStreamState, tenant: &str) -> Option<Response> {
    let cfg = s.channel.config();
    cfg.tenant.as_deref().is_some_and(|t| t != tenant).then(|| {
        (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": "this channel shows another tenant's runs", "code": "other_tenant" })),
        )
            .into_response()
    })
}

/// The run stream of `run` in `format`, after seq `after`, waiting `wait` for its start.
fn follow_response(
    s: &RunStreamState,
    run: &RunRef,
    format: Format,
    after: u64,
    wait: Duration,
) -> Response {
    if let Some(refused) = other_tenant(s, &run.tenant) {
        return refused;
    }
    let follow = Follow {
        subject: RunAddr::new(run, s.channel.config().partitions).events_subject(),
        after,
        wait,
    };
    let (tx, rx) = mpsc::channel(64);
    let (channel, stop) = (s.channel.clone(), s.shutdown.clone());
    tokio::spawn(async move {
        let mut encoder = Encoder {
            format,
            parts: parts::Parts::default(),
        };
        let end = tokio::select! {
            end = follow.run(&channel, &mut encoder, &tx) => end,
            () = stop.cancelled() => Some(StreamEnd::ShuttingDown),
            () = tx.closed() => None,
        };
        if let Some(end) = end {
            for e in encoder.error(&end) {
                let _ = tx.send(e).await;
            }
        }
    });
    let stream =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT));
    match format {
        Format::AiSdk => ([ai_sdk::HEADER], sse).into_response(),
        _ => sse.into_response(),
    }
}

/// `GET /v1/runs/{tenant}/{run}/stream`: the AI SDK's resume request. A `useChat` with
/// `resume: true` and `api: "<channel>/v1/runs/<tenant>"` asks `{api}/{chatId}/stream` on
/// mount (`DefaultChatTransport.reconnectToStream`); the chat id is the run id. A run in
/// flight answers its whole UI message stream so far and then live (the SDK rebuilds the
/// message from `start`); a run that ended, or that has not started, answers 204 — no
/// active stream, as the SDK expects (a finished run is read with `?format=ai-sdk`).
async fn resume_route(
    State(s): State<RunStreamState>,
    Path((tenant, run)): Path<(String, String)>,
) -> Response {
    let run = match RunRef::new(&tenant, &run) {
        Ok(run) => run,
        Err(e) => return bad_request(e.to_string()),
    };
    if let Some(refused) = other_tenant(&s, &run.tenant) {
        return refused;
    }
    let subject = RunAddr::new(&run, s.channel.config().partitions).events_subject();
    match in_flight(&s.channel, &subject).await {
        Ok(true) => follow_response(&s, &run, Format::AiSdk, 0, DEFAULT_WAIT),
        Ok(false) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": format!("event stream unavailable: {e}"), "code": "unavailable" })),
        )
            .into_response(),
    }
}

/// Whether the run on `subject` has events and its last one is not terminal.
async fn in_flight(channel: &Channel, subject: &str) -> Result<bool, String> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let stream = channel
        .jetstream()
        .get_stream(EVENTS_STREAM)
        .await
        .map_err(|e| e.to_string())?;
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(m) => Ok(events::decode_message(Some(&m.headers), &m.payload)
            .map_err(|e| e.to_string())?
            .last()
            .is_some_and(|ev| !ev.event.is_terminal())),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// One client's follow of one run.
struct Follow {
    subject: String,
    /// Send events after this seq.
    after: u64,
    /// How long to wait for a run's first event.
    wait: Duration,
}

impl Follow {
    /// Sends the run's events after `self.after`, display-safe, until its terminal
    /// event; `Some(reason)` when it ends otherwise (told to the client as an error).
    async fn run(
        &self,
        channel: &Channel,
        encoder: &mut Encoder,
        tx: &mpsc::Sender<SseEvent>,
    ) -> Option<StreamEnd> {
        let js = channel.jetstream();
        let stream = match js.get_stream(EVENTS_STREAM).await {
            Ok(s) => s,
            Err(e) => return Some(StreamEnd::Unavailable(e.to_string())),
        };
        let consumer = match stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: self.subject.clone(),
                deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
        {
            Ok(c) => c,
            Err(e) => return Some(StreamEnd::Unavailable(e.to_string())),
        };
        let mut messages = match consumer.messages().await {
            Ok(m) => m,
            Err(e) => return Some(StreamEnd::Unavailable(e.to_string())),
        };
        let mut redactor = EventRedactor::new();
        let mut started = false;
        loop {
            let next = if started {
                messages.next().await
            } else {
                match tokio::time::timeout(self.wait, messages.next()).await {
                    Ok(next) => next,
                    Err(_) => return Some(StreamEnd::NotStarted(self.wait)),
                }
            };
            let msg = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Some(StreamEnd::Unavailable(format!("interrupted: {e}"))),
                None => return Some(StreamEnd::Unavailable("ended".to_owned())),
            };
            let evs = match events::decode_msg(&msg) {
                Ok(evs) => evs,
                Err(e) => {
                    tracing::warn!(subject = %self.subject, error = %e, "undecodable event skipped");
                    continue;
                }
            };
            for ev in evs {
                if !started {
                    started = true;
                    let env = &ev.envelope;
                    if !channel
                        .config()
                        .accepts(&env.tenant, env.session_key.as_deref())
                    {
                        return Some(StreamEnd::NotShown);
                    }
                }
                match self.send(&mut redactor, encoder, &ev, tx).await {
                    Sent::More => {}
                    Sent::Terminal => return None,
                    Sent::Gone => return None,
                }
            }
        }
    }

    /// Sends one event (or only primes the redactor and the encoder with it, at or
    /// before the resume point).
    async fn send(
        &self,
        redactor: &mut EventRedactor,
        encoder: &mut Encoder,
        ev: &RunEvent,
        tx: &mpsc::Sender<SseEvent>,
    ) -> Sent {
        let Some(event) = redactor.apply(&ev.event) else {
            return Sent::More; // a seq seen already
        };
        let terminal = ev.event.is_terminal();
        let safe = RunEvent {
            envelope: ev.envelope.clone(),
            event,
        };
        let fresh = ev.event.seq > self.after;
        for sse in encoder.encode(&safe, fresh) {
            if tx.send(sse).await.is_err() {
                return Sent::Gone;
            }
        }
        if terminal {
            Sent::Terminal
        } else {
            Sent::More
        }
    }
}

enum Sent {
    More,
    Terminal,
    Gone,
}

//! Following a live OpenClaw gateway: a WebSocket client that announces the
//! `tool-events` capability, routes every `agent` event by `runId` into its own run and
//! ingests each run as the `openclaw-events` family (one payload per line), so that a
//! run's archive equals `streamgate normalize --family openclaw-events` of its events.
//!
//! # Layout
//! - [`protocol`]: the gateway's frames (the `connect` request, `hello-ok`, events).
//! - [`router`]: events → runs (dedupe of re-deliveries, terminal events, bad ids).
//! - [`feed`]: one task per run, batching its queued lines into chunks.
//! - [`sink`]: where chunks land ([`sink::RunSink`]; the normalizer's own ingestor,
//!   or the IngestService over gRPC in `streamgate follow-gateway`).
//! - [`backoff`]: capped exponential backoff with jitter.
//!
//! [`follow`] keeps the connection: when it drops (or never comes up) it reconnects
//! after a backoff, logging each attempt without the token. Runs left open by a
//! dropped connection stay open and continue with the events that come after the
//! reconnect. Frames that are not the protocol's, and agent events that cannot be routed,
//! are logged and skipped; other events (ticks, presence, chat, …) are ignored.

pub mod backoff;
pub mod feed;
pub mod protocol;
pub mod router;
pub mod sink;

use backoff::Backoff;
use futures::{SinkExt as _, StreamExt as _};
use protocol::Incoming;
use router::Router;
use sink::RunSink;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// What to follow and how.
#[derive(Debug, Clone)]
pub struct FollowConfig {
    /// The gateway's WebSocket URL (`ws://` or `wss://`).
    pub url: String,
    /// The gateway token (`auth.token` of the `connect` request).
    pub token: Option<String>,
    /// The tenant the runs are ingested under.
    pub tenant: String,
    /// Lines queued per run at most.
    pub queue: usize,
    /// How runs are fed.
    pub feed: feed::FeedConfig,
    /// First wait before a reconnect.
    pub reconnect_base: Duration,
    /// Longest wait between reconnects.
    pub reconnect_cap: Duration,
    /// Stop with [`FollowError::Connect`] when the first connection fails, instead of
    /// retrying until the gateway is there (a person at the command line wants the
    /// error; a service started before its gateway wants the retries).
    pub fail_first_connect: bool,
}

impl FollowConfig {
    /// Defaults for `url`: tenant `default`, 1024 lines per run, reconnects from 0.5 s
    /// up to 30 s.
    pub fn new(url: impl Into<String>) -> FollowConfig {
        FollowConfig {
            url: url.into(),
            token: None,
            tenant: "default".to_owned(),
            queue: 1024,
            feed: feed::FeedConfig::default(),
            reconnect_base: Duration::from_millis(500),
            reconnect_cap: Duration::from_secs(30),
            fail_first_connect: false,
        }
    }
}

/// Following could not start.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The URL is not a `ws://` or `wss://` URL.
    #[error("not a WebSocket URL (ws:// or wss://): {0}")]
    Url(String),
    /// The tenant breaks the id rule.
    #[error(transparent)]
    Tenant(#[from] streamgate_grammar::ids::IdError),
    /// The gateway refused the connect request (a wrong token), or the first connection
    /// failed and [`FollowConfig::fail_first_connect`] is set: following stops. A
    /// connection lost later is retried with backoff.
    #[error("cannot follow the gateway {gateway}: {reason}")]
    Connect {
        /// The gateway, as logged (no query).
        gateway: String,
        /// What failed.
        reason: String,
    },
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("WebSocket: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("the gateway refused the connect request: {0}")]
    Refused(String),
}

/// A connection up this long (after the gateway's greeting) counts as healthy: the
/// reconnect backoff starts over after it.
const STABLE: Duration = Duration::from_secs(30);

/// Largest WebSocket message and frame read from the gateway (an agent event carrying a
/// large tool result is one frame). A larger one ends the connection; the reconnect
/// backoff keeps that from repeating fast.
const MAX_WS_MESSAGE: usize = 64 << 20;

fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_WS_MESSAGE))
        .max_frame_size(Some(MAX_WS_MESSAGE))
}

/// The URL as logged: without its query (where a token could hide).
pub fn shown_url(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

/// Follows the gateway until `cancel`, then lets every run's feeder store what is
/// queued.
pub async fn follow<S: RunSink>(
    cfg: FollowConfig,
    sink: S,
    cancel: CancellationToken,
) -> Result<(), FollowError> {
    if !(cfg.url.starts_with("ws://") || cfg.url.starts_with("wss://")) {
        return Err(FollowError::Url(shown_url(&cfg.url).to_owned()));
    }
    let tenant = streamgate_grammar::ids::TenantId::new(cfg.tenant.as_str())?;
    let gateway = shown_url(&cfg.url).to_owned();
    let mut router = Router::new(sink, tenant, cfg.queue, cfg.feed.clone(), cancel.clone());
    let mut backoff = Backoff::new(cfg.reconnect_base, cfg.reconnect_cap);
    let mut ever_greeted = false;
    loop {
        let mut hello = None;
        let ended = tokio::select! {
            r = session(&cfg, &mut router, &mut hello) => r,
            () = cancel.cancelled() => break,
        };
        ever_greeted |= hello.is_some();
        // The backoff starts over only after a connection that stayed up: a gateway that
        // greets and then sends a frame this follower cannot read (over the size limit)
        // would otherwise be reconnected to several times a second.
        if hello.is_some_and(|t: Instant| t.elapsed() >= STABLE) {
            backoff.reset();
        }
        match &ended {
            Ok(()) => {
                tracing::info!(%gateway, open_runs = router.open_runs(), "gateway connection closed")
            }
            Err(e) => {
                tracing::warn!(%gateway, error = %e, open_runs = router.open_runs(), "gateway connection failed")
            }
        }
        // A refused connect request (a wrong token) is refused again on every retry; a
        // first connection that failed is the person's wrong URL, when they asked so.
        let give_up = match ended {
            Err(e @ SessionError::Refused(_)) => Some(e),
            Err(e) if !ever_greeted && cfg.fail_first_connect => Some(e),
            _ => None,
        };
        if let Some(e) = give_up {
            router.finish().await;
            return Err(FollowError::Connect {
                gateway,
                reason: e.to_string(),
            });
        }
        let delay = backoff.next_delay();
        tracing::info!(%gateway, attempt = backoff.attempts(), delay_ms = delay.as_millis() as u64, "reconnecting to the gateway");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = cancel.cancelled() => break,
        }
    }
    router.finish().await;
    Ok(())
}

/// One connection: connect, handshake, route events until it ends.
/// `hello` is set when the gateway greets.
async fn session<S: RunSink>(
    cfg: &FollowConfig,
    router: &mut Router<S>,
    hello: &mut Option<Instant>,
) -> Result<(), SessionError> {
    let (mut ws, _) =
        tokio_tungstenite::connect_async_with_config(cfg.url.as_str(), Some(ws_config()), false)
            .await?;
    ws.send(Message::text(protocol::connect_frame(cfg.token.as_deref())))
        .await?;
    while let Some(msg) = ws.next().await {
        let text = match msg? {
            Message::Text(t) => t,
            Message::Close(_) => return Ok(()),
            Message::Binary(_) => {
                tracing::debug!("gateway sent a binary frame; ignored");
                continue;
            }
            _ => continue,
        };
        match protocol::parse(&text) {
            Incoming::Hello => {
                tracing::info!(gateway = %shown_url(&cfg.url), "connected to the gateway");
                *hello = Some(std::time::Instant::now());
            }
            Incoming::Refused(e) => return Err(SessionError::Refused(e)),
            Incoming::Agent(payload) => {
                router.route(payload).await;
            }
            Incoming::OtherEvent(name) => tracing::debug!(event = %name, "gateway event ignored"),
            Incoming::Other => tracing::debug!("gateway frame ignored"),
            Incoming::Malformed(e) => {
                metrics::counter!("streamgate_gateway_frames_malformed_total").increment(1);
                tracing::warn!(error = %e, "gateway frame is not a protocol frame; skipped");
            }
        }
    }
    Ok(())
}

//! Slack sink runtime.

use super::chat::SlackChat;
use super::config::{SlackConfig, Streaming};
use crate::editable_chat::{Edited, MessageApi, Streamed};
use crate::format::Target;
use crate::http::{self, Secret};
use crate::sink::DeliveryState;
use crate::sink::{ChatTarget, Pacing, Rate, SinkError};
use crate::text::{slack_mrkdwn, slack_unit, Unit};
use futures::future::BoxFuture;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use streamgate_projection::Op;

/// Slack's `text` limit (longer texts are truncated or refused), counted on the
/// escaped text.
pub const SLACK_LIMIT: usize = 40_000;

/// Slack Web API sink. `ChatTarget::chat_id` is `<channel>[/<thread_ts>[/<user>]]`
/// ([`SlackChat`]): a channel (`C…`) or DM (`D…`) id, a thread in it, and the user the
/// thread answers.
#[derive(Debug)]
pub struct SlackSink {
    name: String,
    base_url: String,
    token: Secret,
    client: reqwest::Client,
    pub(super) streaming: Streaming,
    pub(super) team_id: Option<String>,
    /// Chats with a stream open on this replica: their `Typing` sets no status (Slack
    /// shows the stream itself).
    pub(super) open_streams: Mutex<HashSet<String>>,
    /// Rate-limit holds by scope ([`limit_scope`]): a 429's `Retry-After` applies to
    /// every chat calling that method with this token, so no chat calls it before the
    /// hold ends (Slack counts calls refused early against the app too).
    holds: Mutex<HashMap<String, Instant>>,
}

/// The scope a Slack rate limit holds in: "per API method per app per workspace", and
/// `chat.postMessage` also per channel (about one message per second each).
fn limit_scope(method: &str, body: &Value) -> String {
    match (method, body.get("channel").and_then(Value::as_str)) {
        ("chat.postMessage", Some(channel)) => format!("{method} {channel}"),
        _ => method.to_owned(),
    }
}

/// A failed Web API call.
pub(super) enum Fail {
    /// `message_not_found`.
    NotFound,
    /// `message_not_in_streaming_state`: the stream was stopped or expired.
    NotStreaming,
    Sink(SinkError),
}

pub(super) fn plain(f: Fail) -> SinkError {
    match f {
        Fail::Sink(e) => e,
        Fail::NotFound => SinkError::Permanent("slack: message_not_found".into()),
        Fail::NotStreaming => SinkError::Permanent("slack: message_not_in_streaming_state".into()),
    }
}

impl SlackSink {
    /// Build the sink (and its HTTP client).
    pub fn new(config: SlackConfig) -> Result<SlackSink, SinkError> {
        let timeout = http::secs(config.timeout_secs).unwrap_or(http::DEFAULT_TIMEOUT);
        Ok(SlackSink {
            name: config.name,
            base_url: config.base_url.trim_end_matches('/').to_owned(),
            token: config.bot_token,
            client: http::client(timeout)?,
            streaming: config.streaming,
            team_id: config.team_id,
            open_streams: Mutex::new(HashSet::new()),
            holds: Mutex::new(HashMap::new()),
        })
    }

    /// How long the scope's last 429 still holds, if it does.
    fn held(&self, scope: &str, now: Instant) -> Option<Duration> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.retain(|_, until| *until > now);
        holds.get(scope).map(|until| *until - now)
    }

    fn hold(&self, scope: String, until: Instant) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let slot = holds.entry(scope).or_insert(until);
        *slot = (*slot).max(until);
    }

    pub(super) async fn call(&self, method: &str, body: Value) -> Result<Value, Fail> {
        let scope = limit_scope(method, &body);
        if let Some(retry_after) = self.held(&scope, Instant::now()) {
            return Err(Fail::Sink(SinkError::RateLimited { retry_after }));
        }
        let resp = self
            .client
            .post(format!("{}/{method}", self.base_url))
            .bearer_auth(self.token.expose())
            .json(&body)
            .send()
            .await
            .map_err(|e| Fail::Sink(http::transport_error(e)))?;
        let status = resp.status();
        let header_retry = http::retry_after_header(resp.headers());
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Fail::Sink(http::transport_error(e)))?;
        let v: Option<Value> = serde_json::from_slice(&bytes).ok();
        let error = v
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if status == StatusCode::TOO_MANY_REQUESTS || error == "ratelimited" {
            let retry_after = header_retry.unwrap_or(http::DEFAULT_RETRY_AFTER);
            self.hold(scope, Instant::now() + retry_after);
            return Err(Fail::Sink(SinkError::RateLimited { retry_after }));
        }
        let Some(v) = v else {
            return Err(Fail::Sink(http::status_error(status, method)));
        };
        if v.get("ok").and_then(Value::as_bool) == Some(true) {
            return Ok(v);
        }
        let msg = format!("slack {method}: {error}");
        Err(match error.as_str() {
            "message_not_found" => Fail::NotFound,
            "message_not_in_streaming_state" => Fail::NotStreaming,
            "msg_too_long" => Fail::Sink(SinkError::TooLarge(msg)),
            "internal_error" | "fatal_error" | "service_unavailable" | "request_timeout" => {
                Fail::Sink(SinkError::Transient(msg))
            }
            _ if status.is_server_error() => Fail::Sink(SinkError::Transient(msg)),
            _ => Fail::Sink(SinkError::Permanent(msg)),
        })
    }
}

impl MessageApi for SlackSink {
    fn channel(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        super::KIND
    }

    /// Slack: `chat.postMessage` allows about one message per second per channel with
    /// short bursts. `chat.update`/`chat.delete` are Tier 3 (50+ per minute per app,
    /// not published exactly): those are left to Slack's 429 `Retry-After`, which the
    /// engine honours, rather than guessed.
    fn pacing(&self) -> Pacing {
        Pacing {
            per_chat: Some(Rate::new(1.0, 3)),
            per_sink: None,
            concurrency: 4,
        }
    }

    fn limit(&self) -> usize {
        SLACK_LIMIT
    }

    fn unit(&self) -> Unit {
        slack_unit
    }

    fn target(&self) -> Target {
        Target::Slack
    }

    fn plain(&self, text: &str) -> String {
        slack_mrkdwn(text)
    }

    fn send<'a>(
        &'a self,
        chat: &'a ChatTarget,
        text: &'a str,
    ) -> BoxFuture<'a, Result<String, SinkError>> {
        Box::pin(async move {
            let slack = SlackChat::parse(&chat.chat_id);
            let mut body = json!({
                "channel": slack.channel,
                "text": text,
                "mrkdwn": true,
                "unfurl_links": false,
                "unfurl_media": false,
            });
            if let Some(ts) = slack.thread_ts {
                body["thread_ts"] = json!(ts);
            }
            let v = self.call("chat.postMessage", body).await.map_err(plain)?;
            v.get("ts")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| SinkError::Permanent("chat.postMessage: no ts".into()))
        })
    }

    fn edit<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<Edited, SinkError>> {
        Box::pin(async move {
            let channel = SlackChat::parse(&chat.chat_id).channel;
            let body = json!({"channel": channel, "ts": id, "text": text});
            match self.call("chat.update", body).await {
                Ok(_) => Ok(Edited::Applied),
                Err(Fail::NotFound) => Ok(Edited::NotFound),
                Err(f) => Err(plain(f)),
            }
        })
    }

    fn delete<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let channel = SlackChat::parse(&chat.chat_id).channel;
            let body = json!({"channel": channel, "ts": id});
            match self.call("chat.delete", body).await {
                Ok(_) | Err(Fail::NotFound) => Ok(()),
                Err(f) => Err(plain(f)),
            }
        })
    }

    /// In a thread, the assistant status ("is thinking…"); elsewhere nothing: the Web API
    /// has no bot typing indicator (only the retired RTM had one).
    fn typing<'a>(&'a self, chat: &'a ChatTarget) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(self.set_status(chat, super::stream::THINKING))
    }

    fn stream<'a>(
        &'a self,
        chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<Streamed, SinkError>> {
        Box::pin(super::stream::execute(self, chat, op, state))
    }
}

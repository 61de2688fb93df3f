//! Slack sink runtime.

use super::config::SlackConfig;
use crate::format::Target;
use crate::http::{self, Secret};
use crate::sink::{ChatTarget, Pacing, Rate, SinkError};
use crate::t1::{Edited, MessageApi};
use crate::text::{slack_mrkdwn, slack_unit, Unit};
use futures::future::BoxFuture;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Slack's `text` limit (longer texts are truncated or refused), counted on the
/// escaped text.
pub const SLACK_LIMIT: usize = 40_000;

/// Slack Web API sink. `ChatTarget::chat_id` is the Slack channel id (`C…`).
#[derive(Debug)]
pub struct SlackSink {
    name: String,
    base_url: String,
    token: Secret,
    client: reqwest::Client,
}

enum Fail {
    NotFound,
    Sink(SinkError),
}

fn plain(f: Fail) -> SinkError {
    match f {
        Fail::Sink(e) => e,
        Fail::NotFound => SinkError::Permanent("slack: message_not_found".into()),
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
        })
    }

    async fn call(&self, method: &str, body: Value) -> Result<Value, Fail> {
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
            let body = json!({
                "channel": chat.chat_id,
                "text": text,
                "mrkdwn": true,
                "unfurl_links": false,
                "unfurl_media": false,
            });
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
            let body = json!({"channel": chat.chat_id, "ts": id, "text": text});
            match self.call("chat.update", body).await {
                Ok(_) => Ok(Edited::Applied),
                Err(Fail::NotFound) => Ok(Edited::NotFound),
                Err(Fail::Sink(e)) => Err(e),
            }
        })
    }

    fn delete<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let body = json!({"channel": chat.chat_id, "ts": id});
            match self.call("chat.delete", body).await {
                Ok(_) | Err(Fail::NotFound) => Ok(()),
                Err(Fail::Sink(e)) => Err(e),
            }
        })
    }

    fn typing<'a>(&'a self, _chat: &'a ChatTarget) -> BoxFuture<'a, Result<(), SinkError>> {
        // The Web API has no bot typing indicator (only the retired RTM had one).
        Box::pin(async { Ok(()) })
    }
}

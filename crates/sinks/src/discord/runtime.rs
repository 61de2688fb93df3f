//! Discord sink runtime.

use super::config::DiscordConfig;
use super::ratelimit::{Hold, Limits};
use crate::editable_chat::{Edited, MessageApi};
use crate::format::Target;
use crate::http::{self, Secret};
use crate::sink::{ChatTarget, Pacing, SinkError};
use crate::text::{char_unit, Unit};
use futures::future::BoxFuture;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Instant;

/// Discord's message content limit, in characters.
pub const DISCORD_LIMIT: usize = 2000;

/// Discord webhook sink. `ChatTarget::chat_id` is a thread id, or empty for the
/// webhook's own channel.
#[derive(Debug)]
pub struct DiscordSink {
    name: String,
    base_url: String,
    webhook_id: String,
    token: Secret,
    client: reqwest::Client,
    limits: Limits,
}

impl DiscordSink {
    /// Build the sink (and its HTTP client).
    pub fn new(config: DiscordConfig) -> Result<DiscordSink, SinkError> {
        let timeout = http::secs(config.timeout_secs).unwrap_or(http::DEFAULT_TIMEOUT);
        Ok(DiscordSink {
            name: config.name,
            base_url: config.base_url.trim_end_matches('/').to_owned(),
            webhook_id: config.webhook_id,
            token: config.webhook_token,
            client: http::client(timeout)?,
            limits: Limits::new(config.invalid_request_budget),
        })
    }

    /// Returns `Ok(None)` for 404 (unknown message) so callers decide what it means.
    async fn call(
        &self,
        method: Method,
        suffix: &str,
        chat: &ChatTarget,
        body: Option<Value>,
    ) -> Result<Option<Value>, SinkError> {
        let mut url = format!(
            "{}/webhooks/{}/{}{suffix}",
            self.base_url,
            self.webhook_id,
            self.token.expose()
        );
        if !chat.chat_id.is_empty() {
            url.push(if suffix.contains('?') { '&' } else { '?' });
            url.push_str("thread_id=");
            url.push_str(&chat.chat_id);
        }
        // The route as Discord buckets it: the message id is a parameter, not a route.
        let route = match suffix.split_once("/messages/") {
            Some(_) => format!("{method} /messages/{{id}}"),
            None => format!("{method} {suffix}"),
        };
        match self.limits.admit(&route, Instant::now()) {
            Ok(()) => {}
            Err(Hold::Wait(retry_after)) => return Err(SinkError::RateLimited { retry_after }),
            Err(Hold::Budget { count }) => {
                return Err(SinkError::Transient(format!(
                    "discord: {count} invalid requests in 10 minutes (the budget; Discord bans at 10,000): not sending until the window frees up"
                )))
            }
        }
        let mut req = self.client.request(method.clone(), url);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.map_err(http::transport_error)?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let header_retry = http::retry_after_header(&headers);
        let bytes = resp.bytes().await.map_err(http::transport_error)?;
        let v: Option<Value> = serde_json::from_slice(&bytes).ok();
        // The body's float seconds are more precise than the header's.
        let retry_after = v
            .as_ref()
            .and_then(|v| v.get("retry_after"))
            .and_then(Value::as_f64)
            .and_then(http::secs)
            .or(header_retry);
        let global = v
            .as_ref()
            .and_then(|v| v.get("global"))
            .and_then(Value::as_bool)
            == Some(true);
        self.limits.observe(
            &route,
            status.as_u16(),
            &headers,
            global,
            retry_after,
            Instant::now(),
        );
        if status.is_success() {
            return Ok(Some(v.unwrap_or(Value::Null)));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after = retry_after.unwrap_or(http::DEFAULT_RETRY_AFTER);
            return Err(SinkError::RateLimited { retry_after });
        }
        if status == StatusCode::NOT_FOUND && suffix.starts_with("/messages/") {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&bytes);
        if status == StatusCode::BAD_REQUEST
            && (text.contains("BASE_TYPE_MAX_LENGTH") || text.contains("or fewer in length"))
        {
            return Err(SinkError::TooLarge(format!("discord {method}: {text}")));
        }
        let code = v
            .as_ref()
            .and_then(|v| v.get("code"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let e = http::status_error(status, &format!("discord {method} (code {code})"));
        Err(e)
    }
}

fn content(text: &str) -> Value {
    // Never ping: model output must not be able to @everyone a server.
    json!({"content": text, "allowed_mentions": {"parse": []}})
}

impl MessageApi for DiscordSink {
    fn channel(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        super::KIND
    }

    /// Discord: no fixed rate — each response states its bucket's remaining requests
    /// and reset ([`super::ratelimit`]), and a request to an exhausted bucket waits for
    /// the reset; only the requests in flight are bounded.
    fn pacing(&self) -> Pacing {
        Pacing {
            per_chat: None,
            per_sink: None,
            concurrency: 4,
        }
    }

    fn limit(&self) -> usize {
        DISCORD_LIMIT
    }

    fn unit(&self) -> Unit {
        char_unit
    }

    fn target(&self) -> Target {
        Target::Discord
    }

    fn plain(&self, text: &str) -> String {
        text.to_owned()
    }

    fn send<'a>(
        &'a self,
        chat: &'a ChatTarget,
        text: &'a str,
    ) -> BoxFuture<'a, Result<String, SinkError>> {
        Box::pin(async move {
            let v = self
                .call(Method::POST, "?wait=true", chat, Some(content(text)))
                .await?
                .unwrap_or(Value::Null);
            v.get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| SinkError::Permanent("discord execute: no message id".into()))
        })
    }

    fn edit<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<Edited, SinkError>> {
        Box::pin(async move {
            let path = format!("/messages/{id}");
            Ok(
                match self
                    .call(Method::PATCH, &path, chat, Some(content(text)))
                    .await?
                {
                    Some(_) => Edited::Applied,
                    None => Edited::NotFound,
                },
            )
        })
    }

    fn delete<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let path = format!("/messages/{id}");
            self.call(Method::DELETE, &path, chat, None).await?;
            Ok(())
        })
    }

    fn typing<'a>(&'a self, _chat: &'a ChatTarget) -> BoxFuture<'a, Result<(), SinkError>> {
        // Webhooks have no typing endpoint (that needs a bot token): a declared no-op.
        Box::pin(async { Ok(()) })
    }
}

//! Telegram sink runtime.

use super::config::{DraftMode, TelegramConfig};
use crate::editable_chat::{Edited, MessageApi};
use crate::format::Target;
use crate::http::{self, Secret};
use crate::sink::{ChatTarget, Pacing, Rate, SinkError};
use crate::text::{telegram_html, utf16_unit, Unit};
use futures::future::BoxFuture;
use serde_json::{json, Value};

/// Telegram's message text limit (after entity parsing), in UTF-16 units.
pub const TELEGRAM_LIMIT: usize = 4096;

/// Telegram Bot API sink.
#[derive(Debug)]
pub struct TelegramSink {
    name: String,
    base_url: String,
    token: Secret,
    client: reqwest::Client,
    drafts: DraftMode,
}

/// How a failed call ended, before the op semantics decide what it means.
enum Fail {
    NotModified,
    NotFound,
    Sink(SinkError),
}

impl TelegramSink {
    /// Build the sink (and its HTTP client).
    pub fn new(config: TelegramConfig) -> Result<TelegramSink, SinkError> {
        let timeout = http::secs(config.timeout_secs).unwrap_or(http::DEFAULT_TIMEOUT);
        Ok(TelegramSink {
            name: config.name,
            base_url: config.base_url.trim_end_matches('/').to_owned(),
            token: config.bot_token,
            client: http::client(timeout)?,
            drafts: config.drafts,
        })
    }

    async fn call(&self, method: &str, body: Value) -> Result<Value, Fail> {
        // The token is in the path; errors below never include the URL.
        let url = format!("{}/bot{}/{method}", self.base_url, self.token.expose());
        let resp = self
            .client
            .post(url)
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
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            return Err(Fail::Sink(http::status_error(status, method)));
        };
        if v.get("ok").and_then(Value::as_bool) == Some(true) {
            return Ok(v.get("result").cloned().unwrap_or(Value::Null));
        }
        let code = v
            .get("error_code")
            .and_then(Value::as_u64)
            .unwrap_or(u64::from(status.as_u16()));
        let desc = v
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let lower = desc.to_ascii_lowercase();
        if code == 429 {
            let retry_after = v
                .pointer("/parameters/retry_after")
                .and_then(Value::as_f64)
                .and_then(http::secs)
                .or(header_retry)
                .unwrap_or(http::DEFAULT_RETRY_AFTER);
            return Err(Fail::Sink(SinkError::RateLimited { retry_after }));
        }
        if lower.contains("message is not modified") {
            return Err(Fail::NotModified);
        }
        if lower.contains("message to edit not found")
            || lower.contains("message to delete not found")
            || lower.contains("message_id_invalid")
        {
            return Err(Fail::NotFound);
        }
        let msg = format!("telegram {method}: {code} {desc}");
        Err(Fail::Sink(if lower.contains("too long") {
            SinkError::TooLarge(msg)
        } else if code >= 500 {
            SinkError::Transient(msg)
        } else {
            SinkError::Permanent(msg)
        }))
    }
}

/// A chat address: the chat, and the topic (`message_thread_id`) when the target names
/// one as `<chat>/<thread>` — a forum topic, or a thread of a private chat with topics.
fn address(chat: &ChatTarget) -> (&str, Option<i64>) {
    match chat.chat_id.rsplit_once('/') {
        Some((id, thread)) => match thread.parse::<i64>() {
            Ok(t) => (id, Some(t)),
            Err(_) => (chat.chat_id.as_str(), None),
        },
        None => (chat.chat_id.as_str(), None),
    }
}

/// Telegram takes numeric ids as numbers and `@channel` names as strings.
fn chat_id(chat: &ChatTarget) -> Value {
    let (id, _) = address(chat);
    match id.parse::<i64>() {
        Ok(n) => json!(n),
        Err(_) => json!(id),
    }
}

/// `body` with the target's `message_thread_id`, for the calls that post into a chat
/// (edits and deletes name the message, which already belongs to its topic).
fn in_thread(chat: &ChatTarget, mut body: Value) -> Value {
    if let (Some(thread), Some(map)) = (address(chat).1, body.as_object_mut()) {
        map.insert("message_thread_id".into(), json!(thread));
    }
    body
}

fn message_id(id: &str) -> Result<i64, SinkError> {
    id.parse::<i64>()
        .map_err(|_| SinkError::Permanent(format!("not a telegram message id: {id}")))
}

fn plain(f: Fail) -> SinkError {
    match f {
        Fail::Sink(e) => e,
        Fail::NotModified => SinkError::Permanent("unexpected `not modified`".into()),
        Fail::NotFound => SinkError::Permanent("message not found".into()),
    }
}

impl MessageApi for TelegramSink {
    fn channel(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        super::KIND
    }

    /// Telegram: about one message per second in a chat (short bursts tolerated) and
    /// 30 per second over all chats of the bot.
    fn pacing(&self) -> Pacing {
        Pacing {
            per_chat: Some(Rate::new(1.0, 3)),
            per_sink: Some(Rate::new(30.0, 30)),
            concurrency: 8,
        }
    }

    fn limit(&self) -> usize {
        TELEGRAM_LIMIT
    }

    fn unit(&self) -> Unit {
        utf16_unit
    }

    fn target(&self) -> Target {
        Target::Telegram
    }

    fn plain(&self, text: &str) -> String {
        telegram_html(text)
    }

    fn send<'a>(
        &'a self,
        chat: &'a ChatTarget,
        text: &'a str,
    ) -> BoxFuture<'a, Result<String, SinkError>> {
        Box::pin(async move {
            let body = in_thread(
                chat,
                json!({
                    "chat_id": chat_id(chat),
                    "text": text,
                    "parse_mode": "HTML",
                    "link_preview_options": {"is_disabled": true},
                }),
            );
            let result = self.call("sendMessage", body).await.map_err(plain)?;
            result
                .get("message_id")
                .and_then(Value::as_i64)
                .map(|id| id.to_string())
                .ok_or_else(|| SinkError::Permanent("sendMessage: no message_id".into()))
        })
    }

    fn edit<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<Edited, SinkError>> {
        Box::pin(async move {
            let body = json!({
                "chat_id": chat_id(chat),
                "message_id": message_id(id)?,
                "text": text,
                "parse_mode": "HTML",
                "link_preview_options": {"is_disabled": true},
            });
            match self.call("editMessageText", body).await {
                // "message is not modified": it already shows this text, i.e. success.
                Ok(_) | Err(Fail::NotModified) => Ok(Edited::Applied),
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
            let body = json!({"chat_id": chat_id(chat), "message_id": message_id(id)?});
            match self.call("deleteMessage", body).await {
                Ok(_) | Err(Fail::NotFound) => Ok(()),
                Err(f) => Err(plain(f)),
            }
        })
    }

    /// Private chats (a user's id is positive; groups, supergroups and channels are
    /// negative or `@name`) get Bot API 9.5's native drafts unless configured otherwise;
    /// a `<chat>/<thread>` target drafts in that thread.
    fn native_drafts(&self, chat: &ChatTarget) -> bool {
        match self.drafts {
            DraftMode::Edit => false,
            DraftMode::Native => true,
            DraftMode::Auto => address(chat).0.parse::<i64>().is_ok_and(|id| id > 0),
        }
    }

    fn native_draft<'a>(
        &'a self,
        chat: &'a ChatTarget,
        draft_id: i64,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let body = in_thread(
                chat,
                json!({
                    "chat_id": chat_id(chat),
                    "draft_id": draft_id,
                    "text": text,
                    "parse_mode": "HTML",
                }),
            );
            self.call("sendMessageDraft", body)
                .await
                .map(|_| ())
                .map_err(plain)
        })
    }

    fn typing<'a>(&'a self, chat: &'a ChatTarget) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let body = in_thread(chat, json!({"chat_id": chat_id(chat), "action": "typing"}));
            self.call("sendChatAction", body)
                .await
                .map(|_| ())
                .map_err(plain)
        })
    }
}

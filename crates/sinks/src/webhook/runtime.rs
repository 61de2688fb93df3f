//! Webhook sink runtime.

use super::config::WebhookConfig;
use crate::http::{self, Secret};
use crate::sink::{ChatTarget, DeliveryState, Pacing, Sink, SinkError};
use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use sha2::Sha256;
use streamgate_projection::{DraftKey, Op, Tier};

/// Header carrying `sha256=<hex HMAC-SHA256 of the body>`.
pub const SIGNATURE_HEADER: &str = "X-Streamgate-Signature";

type HmacSha256 = Hmac<Sha256>;

/// `sha256=<hex>` signature of `body` under `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail; fall back to an empty
    // signature rather than panic if a future `hmac` changes that.
    match HmacSha256::new_from_slice(secret) {
        Ok(mut mac) => {
            mac.update(body);
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        }
        Err(_) => String::new(),
    }
}

/// Check a signature header value in constant time (for receivers and the fake).
pub fn verify(secret: &[u8], body: &[u8], header: &str) -> bool {
    let Some(hex_sig) = header.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig) else {
        return false;
    };
    match HmacSha256::new_from_slice(secret) {
        Ok(mut mac) => {
            mac.update(body);
            mac.verify_slice(&sig).is_ok()
        }
        Err(_) => false,
    }
}

fn run_and_seq(op: &Op) -> (Option<&DraftKey>, Option<u64>) {
    match op {
        Op::Typing => (None, None),
        Op::Dismiss { key } => (Some(key), None),
        Op::Draft { key, seq, .. }
        | Op::Settle { key, seq, .. }
        | Op::Final { key, seq, .. }
        | Op::Retract { key, seq, .. }
        | Op::Notice { key, seq, .. } => (Some(key), Some(*seq)),
    }
}

/// `<channel>/<tenant>/<run>/<op>/<seq>`: the same op always gets the same key (retries
/// included), and the same run id under two tenants gets two keys (a run id is unique
/// only within its tenant). An op whose draft key names no tenant gets
/// `<channel>/<run>/<op>/<seq>`. A run has one dismiss (seq `0`); typing has no run
/// (`-`) and no seq — it is never retried, so it gets the current time in ms to stay
/// distinct. The key is a valid header value whatever the ids hold: every byte outside
/// printable ASCII, and `%`, is percent-encoded (`café` → `caf%C3%A9`), in the header
/// and the payload alike.
pub fn idempotency_key(channel: &str, op: &Op) -> String {
    header_safe(&raw_key(channel, op))
}

/// `text` with every byte outside printable ASCII (and `%`) percent-encoded.
fn header_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn raw_key(channel: &str, op: &Op) -> String {
    let (draft, seq) = run_and_seq(op);
    let run = draft.map(|d| match d.tenant.as_str() {
        "" => d.run_id.clone(),
        tenant => format!("{tenant}/{}", d.run_id),
    });
    let seq = match (op, seq) {
        (_, Some(s)) => s,
        (Op::Typing, None) => streamgate_grammar::clock::now_ms_u64(),
        _ => 0,
    };
    format!(
        "{channel}/{}/{}/{seq}",
        run.as_deref().unwrap_or("-"),
        op.name()
    )
}

/// The JSON object POSTed for `op`: `op`, `channel`, `chat`, `run_id`, `tenant` (when the
/// op names one), `seq`, `key`
/// (the idempotency key) and the op's own fields (`text`, `truncated`, `suffix`,
/// `placeholder`). A final's `text` is the answer exactly as the event had it.
pub fn payload(channel: &str, chat: &ChatTarget, op: &Op, key: &str) -> Value {
    let (draft, seq) = run_and_seq(op);
    let mut m = Map::new();
    m.insert("op".into(), json!(op.name()));
    m.insert("channel".into(), json!(channel));
    m.insert("chat".into(), json!(chat.chat_id));
    m.insert("run_id".into(), json!(draft.map(|d| &d.run_id)));
    if let Some(d) = draft.filter(|d| !d.tenant.is_empty()) {
        m.insert("tenant".into(), json!(d.tenant));
    }
    m.insert("seq".into(), json!(seq));
    m.insert("key".into(), json!(key));
    match op {
        Op::Typing | Op::Dismiss { .. } => {}
        Op::Draft { text, .. } | Op::Settle { text, .. } | Op::Notice { text, .. } => {
            m.insert("text".into(), json!(text));
        }
        Op::Final {
            text,
            truncated,
            suffix,
            ..
        } => {
            m.insert("text".into(), json!(text));
            m.insert("truncated".into(), json!(truncated));
            m.insert("suffix".into(), json!(suffix));
        }
        Op::Retract { placeholder, .. } => {
            m.insert("text".into(), json!(placeholder));
            m.insert("placeholder".into(), json!(placeholder));
        }
    }
    Value::Object(m)
}

/// Generic webhook sink.
#[derive(Debug)]
pub struct WebhookSink {
    name: String,
    url: String,
    secret: Secret,
    tier: Tier,
    max_in_flight: usize,
    client: reqwest::Client,
}

impl WebhookSink {
    /// Build the sink (and its HTTP client).
    pub fn new(config: WebhookConfig) -> Result<WebhookSink, SinkError> {
        let timeout = http::secs(config.timeout_secs).unwrap_or(http::DEFAULT_TIMEOUT);
        if config.max_in_flight == 0 {
            return Err(SinkError::Permanent(
                "webhook max_in_flight must be at least 1".into(),
            ));
        }
        Ok(WebhookSink {
            name: config.name,
            url: config.url,
            secret: config.secret,
            tier: config.tier,
            max_in_flight: config.max_in_flight,
            client: http::client(timeout)?,
        })
    }

    async fn post(&self, chat: &ChatTarget, op: &Op) -> Result<(), SinkError> {
        let key = idempotency_key(&self.name, op);
        // A run id with a control character cannot go in a header: no retry will fix
        // that, so it is a permanent refusal, not a transport error.
        let key_header = reqwest::header::HeaderValue::from_str(&key).map_err(|_| {
            SinkError::Permanent(format!(
                "Idempotency-Key `{}` is not a valid header value",
                key.escape_debug()
            ))
        })?;
        let body = serde_json::to_vec(&payload(&self.name, chat, op, &key))
            .map_err(|e| SinkError::Permanent(format!("webhook payload: {e}")))?;
        let signature = sign(self.secret.expose().as_bytes(), &body);
        let resp = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header("Idempotency-Key", key_header)
            .body(body)
            .send()
            .await
            .map_err(http::transport_error)?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after =
                http::retry_after_header(resp.headers()).unwrap_or(http::DEFAULT_RETRY_AFTER);
            return Err(SinkError::RateLimited { retry_after });
        }
        Err(http::status_error(status, "webhook"))
    }
}

impl Sink for WebhookSink {
    fn channel(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        super::KIND
    }

    fn tier(&self) -> Tier {
        self.tier
    }

    /// A webhook has no chat API limits to follow: no pace, only the configured bound
    /// on requests in flight; a 429 with `Retry-After` is still honoured.
    fn pacing(&self) -> Pacing {
        Pacing::unpaced(self.max_in_flight)
    }

    fn execute<'a>(
        &'a self,
        chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            // Same local idempotency as the chat sinks; the receiver's dedupe on the
            // Idempotency-Key closes the lost-response window that state cannot.
            match op {
                Op::Final { .. } if state.final_delivered => return Ok(()),
                Op::Settle { .. } if state.settled => return Ok(()),
                Op::Notice { seq, .. } if state.notices_sent.contains(seq) => return Ok(()),
                Op::Draft { seq, .. }
                    if state.settled
                        || state.final_delivered
                        || state.last_rendered_seq.is_some_and(|s| *seq < s) =>
                {
                    return Ok(())
                }
                _ => {}
            }
            self.post(chat, op).await?;
            match op {
                Op::Final { .. } => state.final_delivered = true,
                Op::Settle { seq, .. } => {
                    state.settled = true;
                    state.last_rendered_seq = Some(*seq);
                }
                Op::Draft { seq, .. } => state.last_rendered_seq = Some(*seq),
                Op::Dismiss { .. } => state.dismissed = true,
                Op::Retract { .. } => state.retracted = true,
                Op::Notice { seq, .. } => {
                    state.notices_sent.insert(*seq);
                }
                Op::Typing => {}
            }
            Ok(())
        })
    }
}

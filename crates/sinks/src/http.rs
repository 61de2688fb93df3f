//! HTTP plumbing shared by the chat-API sinks: the client, secrets that never print,
//! and the mapping from transport failures to [`SinkError`].

use crate::sink::SinkError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A credential (bot token, webhook token, HMAC secret). `Debug` and `Display` print
/// `<redacted>` so configs can be logged; only the sink reads the value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wrap a credential.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The credential itself; call only where it goes on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Default per-request timeout of the sinks' HTTP client.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// The HTTP client every sink uses: rustls, a request timeout, no redirects (a chat
/// API that redirects is misconfigured, and a redirect could carry the token elsewhere).
pub fn client(timeout: Duration) -> Result<reqwest::Client, SinkError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("streamgate-sinks/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| SinkError::Permanent(format!("http client: {}", e.without_url())))
}

/// Transport errors are transient; a request that could not be built (a header value
/// with a control character, a bad URL) is permanent — it would fail the same way
/// forever. The URL is stripped first: Telegram and Discord carry their token in the
/// path, and reqwest's `Display` would print it.
pub fn transport_error(e: reqwest::Error) -> SinkError {
    if e.is_builder() {
        return SinkError::Permanent(format!("request not built: {}", e.without_url()));
    }
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "transport"
    };
    SinkError::Transient(format!("{kind}: {}", e.without_url()))
}

/// `Retry-After` as seconds (integer or decimal); HTTP-date forms are not used by the
/// chat APIs and fall back to `None`.
pub fn retry_after_header(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .and_then(secs)
}

/// Seconds as a duration, rejecting negative, NaN and absurd values.
pub fn secs(s: f64) -> Option<Duration> {
    if (0.0..86_400.0).contains(&s) {
        Some(Duration::from_secs_f64(s))
    } else {
        None
    }
}

/// Map a non-success HTTP status without a more specific API error to a `SinkError`.
pub fn status_error(status: reqwest::StatusCode, what: &str) -> SinkError {
    let msg = format!("{what}: HTTP {}", status.as_u16());
    if status.as_u16() == 413 {
        SinkError::TooLarge(msg)
    } else if status.is_server_error() || status.as_u16() == 408 {
        SinkError::Transient(msg)
    } else {
        SinkError::Permanent(msg)
    }
}

/// Rate-limit fallback when the API said 429 but not for how long.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

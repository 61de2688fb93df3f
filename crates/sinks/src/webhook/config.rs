//! Webhook sink configuration.

use crate::http::Secret;
use serde::{Deserialize, Serialize};
use streamgate_projection::Tier;

/// Configuration of one webhook channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookConfig {
    /// Channel name ([`crate::ChatTarget::channel`]); also the payload's `channel`.
    pub name: String,
    /// Where ops are POSTed.
    pub url: String,
    /// HMAC-SHA256 key for `X-Streamgate-Signature` (redacted in `Debug`).
    pub secret: Secret,
    /// Tier the receiver wants ops for (default T1: every op, drafts included).
    #[serde(default = "default_tier")]
    pub tier: Tier,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// Requests in flight to the receiver at once, over all chats (at least 1). Every
    /// chat's ops still go one after the other; this bounds how many chats are served
    /// at the same moment. With many concurrent runs a low bound is where their ops
    /// queue (16 in flight: queued→sent p50 89 ms at 2,000 runs; 128: 33 ms).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
}

/// A receiver we know nothing about takes this many requests at once; its 429 with
/// `Retry-After` still slows us down.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

fn default_max_in_flight() -> usize {
    DEFAULT_MAX_IN_FLIGHT
}

fn default_tier() -> Tier {
    Tier::T1
}

fn default_timeout_secs() -> f64 {
    crate::http::DEFAULT_TIMEOUT.as_secs_f64()
}

impl WebhookConfig {
    /// A config with defaults for everything but name, URL and secret.
    pub fn new(
        name: impl Into<String>,
        url: impl Into<String>,
        secret: impl Into<String>,
    ) -> WebhookConfig {
        WebhookConfig {
            name: name.into(),
            url: url.into(),
            secret: Secret::new(secret),
            tier: default_tier(),
            timeout_secs: default_timeout_secs(),
            max_in_flight: default_max_in_flight(),
        }
    }
}

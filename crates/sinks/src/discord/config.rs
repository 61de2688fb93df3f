//! Discord sink configuration.

use crate::http::Secret;
use serde::{Deserialize, Serialize};

/// Configuration of one Discord webhook channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscordConfig {
    /// Channel name ([`crate::ChatTarget::channel`]).
    pub name: String,
    /// Webhook id (the snowflake in the webhook URL).
    pub webhook_id: String,
    /// Webhook token (redacted in `Debug`).
    pub webhook_token: Secret,
    /// API base; tests point it at a local fake.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// Invalid requests (401, 403, 429) per 10 minutes after which the sink stops
    /// sending until the window frees up; Discord bans the IP at 10,000.
    #[serde(default = "default_invalid_request_budget")]
    pub invalid_request_budget: usize,
}

fn default_invalid_request_budget() -> usize {
    1_000
}

/// Discord's public API endpoint (v10).
pub fn default_base_url() -> String {
    "https://discord.com/api/v10".to_owned()
}

fn default_timeout_secs() -> f64 {
    crate::http::DEFAULT_TIMEOUT.as_secs_f64()
}

impl DiscordConfig {
    /// A config with defaults for everything but the name and the webhook.
    pub fn new(
        name: impl Into<String>,
        webhook_id: impl Into<String>,
        webhook_token: impl Into<String>,
    ) -> DiscordConfig {
        DiscordConfig {
            name: name.into(),
            webhook_id: webhook_id.into(),
            webhook_token: Secret::new(webhook_token),
            base_url: default_base_url(),
            timeout_secs: default_timeout_secs(),
            invalid_request_budget: default_invalid_request_budget(),
        }
    }
}

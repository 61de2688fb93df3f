//! Slack sink configuration.

use crate::http::Secret;
use serde::{Deserialize, Serialize};

/// Configuration of one Slack workspace channel set (one bot token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlackConfig {
    /// Channel name ([`crate::ChatTarget::channel`]).
    pub name: String,
    /// Bot token `xoxb-…` (redacted in `Debug`).
    pub bot_token: Secret,
    /// Web API base; tests point it at a local fake.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// How runs are shown in threads: `auto` streams them natively
    /// (`chat.startStream` … `chat.stopStream`) where Slack allows it, `off` posts and
    /// updates a message everywhere.
    #[serde(default)]
    pub streaming: Streaming,
    /// The workspace (`T…`) of the users streams go to: Slack requires it, with the
    /// user from the chat id (`C…/<thread_ts>/U…`), to stream outside a DM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
}

/// `streaming` setting of a Slack channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Streaming {
    /// Stream in threads where Slack allows it (a DM thread, or a channel thread with a
    /// recipient user and `team_id`); post + update elsewhere.
    #[default]
    Auto,
    /// Always post + update.
    Off,
}

/// Slack's public Web API endpoint.
pub fn default_base_url() -> String {
    "https://slack.com/api".to_owned()
}

fn default_timeout_secs() -> f64 {
    crate::http::DEFAULT_TIMEOUT.as_secs_f64()
}

impl SlackConfig {
    /// A config with defaults for everything but the name and the token.
    pub fn new(name: impl Into<String>, bot_token: impl Into<String>) -> SlackConfig {
        SlackConfig {
            name: name.into(),
            bot_token: Secret::new(bot_token),
            base_url: default_base_url(),
            timeout_secs: default_timeout_secs(),
            streaming: Streaming::default(),
            team_id: None,
        }
    }
}

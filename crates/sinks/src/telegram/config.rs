//! Telegram sink configuration.

use crate::http::Secret;
use serde::{Deserialize, Serialize};

/// Configuration of one Telegram bot channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelegramConfig {
    /// Channel name ([`crate::ChatTarget::channel`]).
    pub name: String,
    /// Bot token from BotFather (redacted in `Debug`).
    pub bot_token: Secret,
    /// API base; tests point it at a local fake.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// How drafts are shown: `auto` (native `sendMessageDraft` previews in private
    /// chats, a sent-and-edited message in groups and channels), `native` or `edit`
    /// everywhere.
    #[serde(default)]
    pub drafts: DraftMode,
}

/// How a Telegram channel shows a run's draft.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftMode {
    /// Native drafts in private chats (a positive chat id: a user), send + edit elsewhere.
    #[default]
    Auto,
    /// Native drafts everywhere (a chat that refuses them falls back to send + edit).
    Native,
    /// A message that is sent, edited and deleted, everywhere.
    Edit,
}

impl std::str::FromStr for DraftMode {
    type Err = String;
    fn from_str(s: &str) -> Result<DraftMode, String> {
        match s {
            "auto" => Ok(DraftMode::Auto),
            "native" => Ok(DraftMode::Native),
            "edit" => Ok(DraftMode::Edit),
            other => Err(format!(
                "drafts must be auto, native or edit, not `{other}`"
            )),
        }
    }
}

/// Telegram's public Bot API endpoint.
pub fn default_base_url() -> String {
    "https://api.telegram.org".to_owned()
}

fn default_timeout_secs() -> f64 {
    crate::http::DEFAULT_TIMEOUT.as_secs_f64()
}

impl TelegramConfig {
    /// A config with defaults for everything but the name and the token.
    pub fn new(name: impl Into<String>, bot_token: impl Into<String>) -> TelegramConfig {
        TelegramConfig {
            name: name.into(),
            bot_token: Secret::new(bot_token),
            base_url: default_base_url(),
            timeout_secs: default_timeout_secs(),
            drafts: DraftMode::default(),
        }
    }
}

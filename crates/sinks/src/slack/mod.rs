//! Slack Web API sink: `chat.postMessage` / `chat.update` / `chat.delete` with a bot
//! token, mrkdwn escaping, 40 000-char messages. Bots have no typing indicator in the
//! Web API, so `Typing` is a no-op here.

mod config;
mod runtime;
#[cfg(all(test, feature = "fakes"))]
mod tests;

pub use config::SlackConfig;
pub use runtime::SlackSink;

/// Registered kind name.
pub const KIND: &str = "slack";

//! Slack Web API sink: `chat.postMessage` / `chat.update` / `chat.delete` with a bot
//! token, mrkdwn escaping, 40 000-char messages; in threads, runs stream natively
//! (`chat.startStream` … `chat.stopStream`, tools as task cards) and `Typing` is the
//! assistant status ("is thinking…").
//!
//! # Layout
//! - `config`: [`SlackConfig`] (`streaming: auto|off`, `team_id`).
//! - `chat`: the chat id `<channel>[/<thread_ts>[/<user>]]`.
//! - `runtime`: [`SlackSink`], the Web API calls and the send + edit primitives.
//! - `stream`: native streams in threads, fed by the drafts' live facts.

mod chat;
mod config;
#[cfg(feature = "fakes")]
pub mod fake;
pub mod format;
mod runtime;
mod stream;
#[cfg(all(test, feature = "fakes"))]
mod stream_tests;
#[cfg(all(test, feature = "fakes"))]
mod tests;

pub use config::{SlackConfig, Streaming};
pub use runtime::SlackSink;

/// Registered kind name.
pub const KIND: &str = "slack";

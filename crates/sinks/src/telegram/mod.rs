//! Telegram Bot API sink: `sendMessage` / `editMessageText` / `deleteMessage` with
//! `parse_mode=HTML`, `sendChatAction` for typing; 4096-unit messages.

mod config;
#[cfg(feature = "fakes")]
pub mod fake;
pub mod format;
mod runtime;
#[cfg(all(test, feature = "fakes"))]
mod tests;

pub use config::{DraftMode, TelegramConfig};
pub use runtime::TelegramSink;

/// Registered kind name.
pub const KIND: &str = "telegram";

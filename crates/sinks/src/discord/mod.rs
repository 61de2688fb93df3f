//! Discord webhook sink: execute (`POST /webhooks/{id}/{token}?wait=true`), edit
//! (`PATCH …/messages/{id}`) and delete; 2000-char messages. Webhooks cannot show a
//! typing indicator, so `Typing` is a no-op here. Pacing follows the rate-limit headers
//! of every response ([`ratelimit`]).

mod config;
#[cfg(feature = "fakes")]
pub mod fake;
pub mod format;
mod ratelimit;
mod runtime;
#[cfg(all(test, feature = "fakes"))]
mod tests;

pub use config::DiscordConfig;
pub use runtime::DiscordSink;

/// Registered kind name.
pub const KIND: &str = "discord";

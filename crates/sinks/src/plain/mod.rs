//! Plain-text sink (tier T0, append-only): writes the final answer, notices and
//! retraction placeholders as lines to any `AsyncWrite`. Drafts, typing, settle and
//! dismiss have no append-only rendering and are accepted as no-ops.

mod config;
mod runtime;
#[cfg(test)]
mod tests;

pub use config::{PlainConfig, PlainTarget};
pub use runtime::PlainSink;

/// Registered kind name.
pub const KIND: &str = "plain";

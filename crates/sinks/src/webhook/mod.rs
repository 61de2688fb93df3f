//! Generic webhook sink: one signed JSON object per op, with a stable
//! `Idempotency-Key` so the receiver can make every op — the final included — exactly
//! once even when we retry after a lost response.

mod config;
#[cfg(feature = "fakes")]
pub mod fake;
mod runtime;
#[cfg(all(test, feature = "fakes"))]
mod tests;

pub use config::{WebhookConfig, DEFAULT_MAX_IN_FLIGHT};
pub use runtime::{idempotency_key, payload, sign, verify, WebhookSink, SIGNATURE_HEADER};

/// Registered kind name.
pub const KIND: &str = "webhook";

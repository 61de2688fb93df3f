//! Chat-channel sinks and the delivery engine: executes the projection's [`Op`]s
//! (typing, draft upsert, settle, dismiss, final, retract, notice) against Telegram,
//! Discord, Slack, a generic signed webhook, or a plain text stream — with rate limits,
//! latest-wins draft coalescing, retries, a circuit breaker, and exactly-once finals.
//!
//! # Layout
//! One folder per sink, each with `config.rs` (serde config, secrets redacted),
//! `runtime.rs` (the [`Sink`] impl), `format.rs` (how model markdown looks in that chat),
//! `fake.rs` (a local server that behaves like the platform's API, feature `fakes`) and
//! `tests.rs` (the sink against its fake) side by side, registered by name in
//! [`SinkConfig`] / [`KINDS`] — like Vector's components:
//! - [`telegram`]: Bot API, `parse_mode=HTML`, 4096 UTF-16 units.
//! - [`discord`]: webhook execute/edit/delete, 2000 chars.
//! - [`slack`]: Web API `chat.*`, mrkdwn, 40 000 chars.
//! - [`webhook`]: one HMAC-signed JSON object per op with an `Idempotency-Key`.
//! - [`plain`]: tier T0, append-only lines to any `AsyncWrite`.
//!
//! Shared pieces: [`sink`] (the contract: [`Sink`], [`ChatTarget`], [`DeliveryState`],
//! [`SinkError`]), [`delivery`] (the engine, [`StateStore`]), [`format`] (model markdown
//! → each chat's format, split at its limit without breaking a code block or a tag; the
//! renderer and packer, with each target's look in its sink's `format.rs`),
//! `editable_chat` (the op semantics of chats with editable messages, written once over
//! the four message primitives Telegram, Discord and Slack each implement),
//! [`text`] (measuring, escaping of projection text), [`http`] (client, [`Secret`]),
//! and `fakes` (feature `fakes`):
//! local axum servers that behave like the chat APIs, for tests here and end-to-end
//! tests of the projector.
//!
//! # Semantics every T1 sink shares
//! Drafts are created lazily, edited in place, never split (the projection budgets
//! them; an over-limit draft is cut with `…` as a last guard). A `Final` is sent as new
//! message(s) under the settled draft, split only when over the channel's limit, with
//! progress recorded per part. Drafts and finals are model markdown, rendered by
//! [`format`] (Telegram HTML, Slack mrkdwn, Discord markdown); settle summaries,
//! notices and placeholders are projection text, only escaped. See [`delivery`] for exactly-once and its residual window.
#![forbid(unsafe_code)]

#[cfg(all(test, feature = "fakes"))]
mod conformance;
pub mod delivery;
pub mod discord;
mod editable_chat;
#[cfg(feature = "fakes")]
pub mod fakes;
pub mod format;
pub mod http;
pub mod plain;
pub mod sink;
pub mod slack;
pub mod telegram;
#[cfg(test)]
mod testutil;
pub mod text;
pub mod webhook;

pub use delivery::{
    BreakerState, Delivery, DeliveryConfig, DeliveryError, MemoryStore, Parked, StateKey,
    StateStore, StoreError,
};
pub use http::Secret;
pub use sink::{ChatTarget, DeliveryState, Pacing, Rate, Sink, SinkError, TextDigest};

use serde::{Deserialize, Serialize};
use std::sync::Arc;
pub use streamgate_projection::Op;

/// Names of the registered sink kinds (the `kind` tag of [`SinkConfig`]).
pub const KINDS: &[&str] = &[
    telegram::KIND,
    discord::KIND,
    slack::KIND,
    webhook::KIND,
    plain::KIND,
];

/// A sink's configuration, tagged by kind: `{"kind": "telegram", "name": …, …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SinkConfig {
    /// [`telegram::TelegramConfig`].
    Telegram(telegram::TelegramConfig),
    /// [`discord::DiscordConfig`].
    Discord(discord::DiscordConfig),
    /// [`slack::SlackConfig`].
    Slack(slack::SlackConfig),
    /// [`webhook::WebhookConfig`].
    Webhook(webhook::WebhookConfig),
    /// [`plain::PlainConfig`].
    Plain(plain::PlainConfig),
}

impl SinkConfig {
    /// The registered kind name.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Telegram(_) => telegram::KIND,
            SinkConfig::Discord(_) => discord::KIND,
            SinkConfig::Slack(_) => slack::KIND,
            SinkConfig::Webhook(_) => webhook::KIND,
            SinkConfig::Plain(_) => plain::KIND,
        }
    }

    /// Build the sink this config describes.
    pub fn build(&self) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(match self.clone() {
            SinkConfig::Telegram(c) => Arc::new(telegram::TelegramSink::new(c)?),
            SinkConfig::Discord(c) => Arc::new(discord::DiscordSink::new(c)?),
            SinkConfig::Slack(c) => Arc::new(slack::SlackSink::new(c)?),
            SinkConfig::Webhook(c) => Arc::new(webhook::WebhookSink::new(c)?),
            SinkConfig::Plain(c) => match c.target {
                plain::PlainTarget::Stdout => {
                    Arc::new(plain::PlainSink::new(c.name, tokio::io::stdout()))
                }
                plain::PlainTarget::Stderr => {
                    Arc::new(plain::PlainSink::new(c.name, tokio::io::stderr()))
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_parse_by_kind_and_never_print_secrets() {
        let c: Result<SinkConfig, _> =
            serde_json::from_str(r#"{"kind":"telegram","name":"tg","bot_token":"123:SECRET"}"#);
        let Ok(c) = c else {
            panic!("telegram config did not parse");
        };
        assert_eq!(c.kind(), "telegram");
        assert!(!format!("{c:?}").contains("SECRET"));
        assert!(KINDS.contains(&c.kind()));
        let w: Result<SinkConfig, _> = serde_json::from_str(
            r#"{"kind":"webhook","name":"hook","url":"http://127.0.0.1:1/","secret":"s3cr3t"}"#,
        );
        assert!(w.is_ok_and(|w| !format!("{w:?}").contains("s3cr3t")));
    }
}

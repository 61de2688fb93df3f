//! A channel's configuration, and the `kind=target` shorthand (`streamgate up --channel`).

use crate::error::ProjectorError;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use streamgate_projection::{Settings, Tier};
use streamgate_sinks::{plain, telegram, webhook, DeliveryConfig, SinkConfig};

/// What executes the channel's ops.
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelSink {
    /// A registered sink (Telegram, Discord, Slack, webhook, plain).
    Sink(SinkConfig),
    /// The built-in web page (tier T2): an HTTP server on `listen` (port 0 = any).
    Web {
        /// Listen address of the page.
        listen: SocketAddr,
    },
}

impl ChannelSink {
    /// The sink kind (`web` for the built-in page).
    pub fn kind(&self) -> &'static str {
        match self {
            ChannelSink::Sink(s) => s.kind(),
            ChannelSink::Web { .. } => "web",
        }
    }
}

/// The web page's delivery tunables: quick retries (the "sink" is this process's
/// memory) and a deep lane. Its pace is the web sink's own (`WebSink::pacing`).
pub fn web_delivery() -> DeliveryConfig {
    DeliveryConfig {
        retry_base: Duration::from_millis(50),
        retry_max: Duration::from_secs(1),
        lane_capacity: 4096,
        ..DeliveryConfig::default()
    }
}

/// The web page's rendering defaults: thinking shown once each segment closes (the page
/// keeps it collapsed after the answer); `/reasoning` still overrides per chat.
pub fn web_settings() -> Settings {
    Settings {
        reasoning: streamgate_projection::Reasoning::On,
        ..Settings::default()
    }
}

/// One channel: which events, rendered how, delivered where.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Channel name: the durable consumers are `sg-projector-<name>-pNN`, KV keys start
    /// with it.
    pub name: String,
    /// The sink.
    pub sink: ChannelSink,
    /// Tier override (default: the sink's own tier).
    pub tier: Option<Tier>,
    /// Only this tenant's runs (default: every tenant).
    pub tenant: Option<String>,
    /// Only these session keys (empty: every session).
    pub sessions: Vec<String>,
    /// Every run goes to this chat (e.g. the Telegram chat id of `telegram=<token>@<chat>`).
    pub fixed_chat: Option<String>,
    /// Session key → chat id; unmapped sessions use the session key itself as chat id.
    pub chat_map: HashMap<String, String>,
    /// Chat of runs without a session key (and no fixed chat).
    pub default_chat: String,
    /// Default rendering settings (budgets included); `SG_SETTINGS` overrides per chat.
    pub settings: Settings,
    /// Rate limits, retries, breaker of the delivery engine.
    pub delivery: DeliveryConfig,
    /// Bearer token of this channel's `ProjectorService` (`None`: no auth, local only).
    pub token: Option<String>,
    /// Origins (`https://app.example`) whose browser apps may call the run stream across
    /// origins (CORS, bearer token only, never the page's cookie); empty: none.
    pub cors_origins: Vec<String>,
    /// A run without a terminal event whose last event is older than this is orphaned
    /// and settles to "agent interrupted" (spec §7.3).
    pub orphan_after: Duration,
    /// Partition count of the deployment.
    pub partitions: u32,
    /// JetStream ack wait of the durable consumers (must exceed a final's delivery time).
    pub ack_wait: Duration,
    /// Partition lease TTL (`SG_LEASES`, group `projector.<name>`): a replica that dies
    /// hands its partitions over this long after its last renewal. Applies when the
    /// bucket is created (see `streamgate_bus::lease`).
    pub lease_ttl: Duration,
    /// JetStream replicas of the buckets this channel creates (`SG_DELIVERY`,
    /// `SG_SETTINGS`, `SG_LEASES`) and of `SG_RAW`/`SG_EVENTS` should it be the first
    /// service to start: 1 on a single server, 3 in a cluster. Existing streams are never
    /// changed by a projector.
    pub replicas: usize,
    /// TLS and connection limits of the `ProjectorService` server and the web page.
    pub serve: streamgate_runtime::serve::ServeOptions,
    /// The NATS connection lease renewals go over: one of their own, so that consuming
    /// and delivering on the main connection never hold a renewal back (a starved
    /// renewal loses the partition). `None`: the main connection (tests).
    pub lease_nats: Option<async_nats::Client>,
}

impl ChannelConfig {
    /// A channel with default settings around `sink`.
    pub fn new(name: impl Into<String>, sink: ChannelSink) -> ChannelConfig {
        let web = matches!(sink, ChannelSink::Web { .. });
        ChannelConfig {
            name: name.into(),
            sink,
            tier: None,
            tenant: None,
            sessions: Vec::new(),
            fixed_chat: None,
            chat_map: HashMap::new(),
            default_chat: "default".to_owned(),
            settings: if web {
                web_settings()
            } else {
                Settings::default()
            },
            delivery: if web {
                web_delivery()
            } else {
                DeliveryConfig::default()
            },
            token: None,
            cors_origins: Vec::new(),
            serve: Default::default(),
            orphan_after: Duration::from_secs(300),
            partitions: streamgate_bus::DEFAULT_PARTITIONS,
            ack_wait: Duration::from_secs(120),
            lease_ttl: streamgate_bus::lease::DEFAULT_LEASE_TTL,
            replicas: 1,
            lease_nats: None,
        }
    }

    /// The chat a run of `session_key` goes to.
    pub fn chat_for(&self, session_key: Option<&str>) -> String {
        if let Some(c) = &self.fixed_chat {
            return c.clone();
        }
        match session_key {
            Some(s) => self
                .chat_map
                .get(s)
                .cloned()
                .unwrap_or_else(|| s.to_owned()),
            None => self.default_chat.clone(),
        }
    }

    /// Whether runs of `tenant` / `session_key` belong to this channel.
    pub fn accepts(&self, tenant: &str, session_key: Option<&str>) -> bool {
        if self.tenant.as_deref().is_some_and(|t| t != tenant) {
            return false;
        }
        self.sessions.is_empty()
            || session_key.is_some_and(|s| self.sessions.iter().any(|x| x == s))
    }

    /// The lease group of the channel's replicas: `projector.<name>` (name KV-encoded).
    pub fn lease_group(&self) -> String {
        streamgate_bus::lease::group_key(&["projector", &self.name])
    }

    /// The durable consumer of one partition: `<durable_name>-pNN`, consumed by the
    /// replica holding the partition's lease.
    pub fn partition_durable(&self, partition: u32) -> String {
        streamgate_bus::subject::partition_durable(&self.durable_name(), self.partitions, partition)
    }

    /// The `SG_EVENTS` filter of one partition: `sg.evt.<tenant or *>.<p>.*`.
    pub fn partition_filter(&self, partition: u32) -> String {
        let tenant = self.tenant.as_deref().map_or(
            std::borrow::Cow::Borrowed("*"),
            streamgate_bus::subject::encode_token,
        );
        format!("sg.evt.{tenant}.{partition}.*")
    }

    /// Prefix of the channel's durable consumer names: `sg-projector-<name>` with
    /// characters NATS forbids in consumer names replaced by `_` (each partition's
    /// consumer adds `-pNN`, see [`ChannelConfig::partition_durable`]).
    pub fn durable_name(&self) -> String {
        let safe: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("sg-projector-{safe}")
    }
}

/// Parses the `kind=target` shorthand:
/// - `web=<addr>` (e.g. `web=127.0.0.1:0`),
/// - `webhook=<url>` (signing secret from `secret`),
/// - `telegram=<bot token>@<chat id>`,
/// - `plain=stdout|stderr`,
/// - `json=<SinkConfig JSON>` (any registered sink).
///
/// Returns the channel config named `name` (the fixed chat is set for Telegram). Errors
/// never echo the target: it may hold a bot token.
pub fn parse_channel_spec(
    name: &str,
    spec: &str,
    secret: Option<&str>,
) -> Result<ChannelConfig, ProjectorError> {
    let Some((kind, target)) = spec.split_once('=') else {
        return Err(ProjectorError::Config(
            "channel must be <kind>=<target> (web, webhook, telegram, plain, json)".into(),
        ));
    };
    let mut fixed_chat = None;
    let sink = match kind {
        "web" => ChannelSink::Web {
            listen: target
                .parse()
                .map_err(|_| ProjectorError::Config("web=<ip:port> expected".into()))?,
        },
        "webhook" => {
            let secret = secret.filter(|s| !s.is_empty()).ok_or_else(|| {
                ProjectorError::Config("a webhook channel needs a signing secret".into())
            })?;
            ChannelSink::Sink(SinkConfig::Webhook(webhook::WebhookConfig::new(
                name, target, secret,
            )))
        }
        "telegram" => {
            let Some((token, chat)) = target.rsplit_once('@') else {
                return Err(ProjectorError::Config(
                    "telegram=<bot token>@<chat id> expected".into(),
                ));
            };
            fixed_chat = Some(chat.to_owned());
            ChannelSink::Sink(SinkConfig::Telegram(telegram::TelegramConfig::new(
                name, token,
            )))
        }
        "plain" => ChannelSink::Sink(SinkConfig::Plain(plain::PlainConfig {
            name: name.to_owned(),
            target: match target {
                "stderr" => plain::PlainTarget::Stderr,
                _ => plain::PlainTarget::Stdout,
            },
        })),
        "json" => {
            let cfg: SinkConfig = serde_json::from_str(target)
                .map_err(|e| ProjectorError::Config(format!("sink JSON: {e}")))?;
            ChannelSink::Sink(cfg)
        }
        _ => {
            return Err(ProjectorError::Config(format!(
                "unknown channel kind `{kind}` (web, webhook, telegram, plain, json)"
            )))
        }
    };
    let mut cfg = ChannelConfig::new(name, sink);
    cfg.fixed_chat = fixed_chat;
    Ok(cfg)
}

/// Renames a registered sink config to `name`, so its `channel()` matches the channel.
pub(crate) fn with_name(sink: &SinkConfig, name: &str) -> SinkConfig {
    let mut s = sink.clone();
    match &mut s {
        SinkConfig::Telegram(c) => c.name = name.to_owned(),
        SinkConfig::Discord(c) => c.name = name.to_owned(),
        SinkConfig::Slack(c) => c.name = name.to_owned(),
        SinkConfig::Webhook(c) => c.name = name.to_owned(),
        SinkConfig::Plain(c) => c.name = name.to_owned(),
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthand_parses_and_never_echoes_tokens() {
        let t = parse_channel_spec("tg", "telegram=123:SECRET@-100", None);
        let Ok(t) = t else {
            panic!("telegram spec did not parse");
        };
        assert_eq!(t.fixed_chat.as_deref(), Some("-100"));
        assert!(!format!("{:?}", t.sink).contains("SECRET"));
        assert!(parse_channel_spec("w", "web=127.0.0.1:0", None).is_ok());
        assert!(parse_channel_spec("h", "webhook=http://x/", None).is_err());
        let e = parse_channel_spec("tg", "telegram=123:SECRET", None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains("SECRET"));
    }

    #[test]
    fn chats_and_filters() {
        let mut c = ChannelConfig::new(
            "c",
            ChannelSink::Web {
                listen: ([127, 0, 0, 1], 0).into(),
            },
        );
        assert_eq!(c.chat_for(Some("s1")), "s1");
        assert_eq!(c.chat_for(None), "default");
        c.chat_map.insert("s1".into(), "chat-9".into());
        assert_eq!(c.chat_for(Some("s1")), "chat-9");
        c.tenant = Some("t".into());
        assert!(!c.accepts("u", None));
        c.sessions = vec!["s1".into()];
        assert!(c.accepts("t", Some("s1")));
        assert!(!c.accepts("t", Some("s2")));
        assert_eq!(c.durable_name(), "sg-projector-c");
        assert_eq!(c.partition_durable(7), "sg-projector-c-p07");
        assert_eq!(c.partition_filter(7), "sg.evt.t.7.*");
        c.tenant = Some("a b".into());
        assert_eq!(c.partition_filter(31), "sg.evt.a%20b.31.*");
        c.tenant = None;
        assert_eq!(c.partition_filter(0), "sg.evt.*.0.*");
        c.name = "tg.main".into();
        assert_eq!(c.lease_group(), "projector.tg=2Emain");
    }
}

//! The projector's command line: flags with `STREAMGATE_*` environment fallbacks (and
//! `--config` files, see `streamgate_runtime::config`).

use crate::config::parse_channel_spec;
use crate::start;
use clap::Parser;
use std::net::SocketAddr;
use std::time::Duration;
use streamgate_projection::{Delivery, Reasoning, Settings, TagVisibility, Tier, Verbose};
use streamgate_runtime::serve::ServeArgs;
use streamgate_runtime::{init_telemetry, NatsArgs, TelemetryArgs};

/// Projector service: one chat channel fed from SG_EVENTS.
#[derive(Debug, Clone, Parser)]
#[command(name = "streamgate-projector", version)]
pub struct Args {
    /// Config file of STREAMGATE_*=value lines.
    #[arg(long, env = "STREAMGATE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// NATS servers and credentials.
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Channel name (durable consumer `sg-projector-<name>`, KV key prefix).
    #[arg(long, env = "STREAMGATE_CHANNEL_NAME")]
    pub name: String,
    /// The sink as `<kind>=<target>`: `web=127.0.0.1:8080`, `webhook=<url>`,
    /// `telegram=<bot token>@<chat>`, `plain=stdout`, or `json=<SinkConfig JSON>`.
    #[arg(long, env = "STREAMGATE_CHANNEL_SINK", hide_env_values = true)]
    pub sink: String,
    /// Webhook signing secret.
    #[arg(long, env = "STREAMGATE_CHANNEL_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Tier override: T0, T1, T2 (or A, B, C, D).
    #[arg(long, env = "STREAMGATE_CHANNEL_TIER")]
    pub tier: Option<Tier>,
    /// Only this tenant's runs.
    #[arg(long, env = "STREAMGATE_CHANNEL_TENANT")]
    pub tenant: Option<String>,
    /// Only these session keys (repeatable / comma separated).
    #[arg(long, env = "STREAMGATE_CHANNEL_SESSIONS", value_delimiter = ',')]
    pub session: Vec<String>,
    /// Send every run to this chat.
    #[arg(long, env = "STREAMGATE_CHANNEL_CHAT")]
    pub chat: Option<String>,
    /// Session → chat mappings `session=chat` (repeatable / comma separated).
    #[arg(long, env = "STREAMGATE_CHANNEL_CHAT_MAP", value_delimiter = ',')]
    pub chat_map: Vec<String>,
    /// Default `/reasoning`: off, on, stream.
    #[arg(long, env = "STREAMGATE_REASONING", default_value = "off")]
    pub reasoning: Reasoning,
    /// Default `/verbose`: off, on, full.
    #[arg(long, env = "STREAMGATE_VERBOSE", default_value = "on")]
    pub verbose: Verbose,
    /// Draft size budget (characters); `--max-turn-chars` wins when both are set.
    #[arg(long, env = "STREAMGATE_DRAFT_MAX_CHARS")]
    pub draft_max_chars: Option<usize>,
    /// The ACP dedupe plan's knobs: the channel's defaults (per chat: `SetSettings`).
    #[command(flatten)]
    pub knobs: KnobArgs,
    /// Requests per second per chat, replacing the sink's own per-chat limit (default:
    /// the API's documented limit; none for webhook and web).
    #[arg(long, env = "STREAMGATE_RATE_PER_SEC")]
    pub rate_per_sec: Option<f64>,
    /// Token bucket burst per chat (with --rate-per-sec; default 3).
    #[arg(long, env = "STREAMGATE_RATE_BURST")]
    pub burst: Option<u32>,
    /// Seconds without events after which a run without terminal is orphaned.
    #[arg(long, env = "STREAMGATE_ORPHAN_AFTER_SECS", default_value_t = 300)]
    pub orphan_after_secs: u64,
    /// Partitions of the deployment.
    #[arg(long, env = "STREAMGATE_PARTITIONS", default_value_t = streamgate_bus::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Partition lease TTL in seconds: the channel's replicas split the partitions with
    /// leases in SG_LEASES, and a replica that dies hands its partitions over this long
    /// after its last renewal. Takes effect when the bucket is created; an existing
    /// bucket keeps its TTL.
    #[arg(long, env = "STREAMGATE_LEASE_TTL", default_value_t = 10)]
    pub lease_ttl: u64,
    /// JetStream replicas of the KV buckets the channel creates (1 on a single server,
    /// 3 in a cluster); SG_RAW/SG_EVENTS get it only if the channel creates them.
    #[arg(long, env = "STREAMGATE_REPLICAS", default_value_t = 1)]
    pub replicas: usize,
    /// ProjectorService listen address.
    #[arg(
        long,
        env = "STREAMGATE_PROJECTOR_GRPC",
        default_value = "0.0.0.0:7330"
    )]
    pub grpc: SocketAddr,
    /// The channel's bearer token for ProjectorService.
    #[arg(long, env = "STREAMGATE_CHANNEL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// An origin (`https://app.example`) whose browser apps may call the run stream
    /// across origins with the channel's token (repeat, or comma-separate in the
    /// variable); none by default.
    #[arg(
        long = "cors-origin",
        env = "STREAMGATE_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// TLS and connection limits of the ProjectorService server and the web page.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Logs, metrics and span export.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl Args {
    /// The channel configuration these flags describe.
    pub fn channel_config(&self) -> anyhow::Result<crate::ChannelConfig> {
        let mut c = parse_channel_spec(&self.name, &self.sink, self.secret.as_deref())?;
        c.tier = self.tier;
        c.tenant = self.tenant.clone();
        c.sessions = self.session.clone();
        if self.chat.is_some() {
            c.fixed_chat = self.chat.clone();
        }
        for m in &self.chat_map {
            let Some((s, chat)) = m.split_once('=') else {
                anyhow::bail!("--chat-map takes session=chat");
            };
            c.chat_map.insert(s.to_owned(), chat.to_owned());
        }
        c.settings = Settings {
            reasoning: self.reasoning,
            verbose: self.verbose,
            ..Settings::default()
        };
        if let Some(n) = self.draft_max_chars {
            c.settings.budgets.draft_max_chars = n;
        }
        self.knobs.apply(&mut c.settings);
        if let Some(r) = self.rate_per_sec {
            // An operator override of the sink's own per-chat limit (e.g. a raised
            // Telegram limit); without it each sink paces by the API's real limits.
            c.delivery.chat_rate = Some(streamgate_sinks::Rate::new(r, self.burst.unwrap_or(3)));
        }
        c.orphan_after = Duration::from_secs(self.orphan_after_secs);
        c.partitions = self.partitions;
        c.lease_ttl = Duration::from_secs(self.lease_ttl.max(1));
        c.replicas = self.replicas.max(1);
        c.token = self.token.clone().filter(|t| !t.is_empty());
        c.cors_origins = crate::run_stream::check_origins(&self.cors_origins)?;
        c.serve = self.serve.options();
        Ok(c)
    }
}

/// The ACP dedupe plan's projection knobs as a channel's defaults (issue #13): flags
/// with `STREAMGATE_*` fallbacks, shared by `streamgate-projector` and `streamgate up`
/// (every channel). Unset flags keep the channel's own default; a chat overrides any of
/// them through `SetSettings` / `streamgate settings`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KnobArgs {
    /// deliveryMode: `live` (drafts, then the final) or `final_only` (the final answer
    /// and errors only, at the turn's end).
    #[arg(long, env = "STREAMGATE_DELIVERY_MODE")]
    pub delivery_mode: Option<Delivery>,
    /// repeatSuppression: `true` (default: a repeated status line, usage tuple or tool
    /// snapshot makes no draft edit) or `false`.
    #[arg(long, env = "STREAMGATE_REPEAT_SUPPRESSION")]
    pub repeat_suppression: Option<bool>,
    /// tagVisibility overrides: `plan=show,usage_update=show,agent_message_chunk=hide`
    /// (ACP update tags; default: message chunks and tool calls/updates shown, thought
    /// chunks follow /reasoning, everything else hidden).
    #[arg(long, env = "STREAMGATE_TAG_VISIBILITY")]
    pub tag_visibility: Option<TagVisibility>,
    /// maxTurnChars: the draft's budget for one turn (never above the sink's limit).
    #[arg(long, env = "STREAMGATE_MAX_TURN_CHARS")]
    pub max_turn_chars: Option<usize>,
    /// maxToolSummaryChars: a tool row's detail under /verbose full.
    #[arg(long, env = "STREAMGATE_MAX_TOOL_SUMMARY_CHARS")]
    pub max_tool_summary_chars: Option<usize>,
    /// maxStatusChars: one status line (plan, usage, mode, … when shown).
    #[arg(long, env = "STREAMGATE_MAX_STATUS_CHARS")]
    pub max_status_chars: Option<usize>,
}

impl KnobArgs {
    /// The set flags as overrides of a channel's settings, the same kind a chat's
    /// `SetSettings` stores (an unset flag overrides nothing).
    pub fn overrides(&self) -> crate::kv::SettingsOverride {
        crate::kv::SettingsOverride {
            delivery: self.delivery_mode,
            suppress_repeats: self.repeat_suppression,
            tag_visibility: self.tag_visibility.clone().unwrap_or_default(),
            max_turn_chars: self.max_turn_chars,
            max_tool_summary_chars: self.max_tool_summary_chars,
            max_status_chars: self.max_status_chars,
            ..Default::default()
        }
    }

    /// Lays the set flags over `s`.
    pub fn apply(&self, s: &mut Settings) {
        *s = self.overrides().apply(s);
    }
}

/// Runs the channel until SIGINT/SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    init_telemetry(&args.telemetry.config("streamgate-projector"))?;
    let mut cfg = args.channel_config()?;
    let shutdown = streamgate_runtime::shutdown::on_signal();
    let nats = args.nats.connect().await?;
    // Leases on a connection of their own: consuming and delivering never delay a
    // renewal.
    cfg.lease_nats = Some(args.nats.connect().await?);
    let mut running = streamgate_runtime::startup::retry_timeouts("projector", || {
        start(nats.clone(), cfg.clone(), Some(args.grpc), shutdown.clone())
    })
    .await?;
    tracing::info!(grpc = ?running.grpc, web = ?running.web, member = %running.member, "projector running");
    if let Some(web) = running.web {
        let scheme = if args.serve.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        println!("web channel: {scheme}://{web}/");
    }
    while let Some(done) = running.tasks.join_next().await {
        done??;
    }
    streamgate_runtime::telemetry::flush().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knob_flags_set_the_channel_defaults() {
        let args = Args::try_parse_from([
            "streamgate-projector",
            "--name",
            "c",
            "--sink",
            "plain=stdout",
            "--delivery-mode",
            "final_only",
            "--repeat-suppression",
            "false",
            "--tag-visibility",
            "plan=show,agent_message_chunk=hide",
            "--max-turn-chars",
            "900",
            "--max-tool-summary-chars",
            "40",
            "--max-status-chars",
            "50",
        ]);
        let Ok(args) = args else {
            panic!("flags did not parse: {args:?}");
        };
        let Ok(c) = args.channel_config() else {
            panic!("no channel config");
        };
        let s = c.settings;
        assert_eq!(s.delivery, Delivery::FinalOnly);
        assert!(!s.suppress_repeats);
        assert!(s.tag_visibility.shown("plan") && !s.tag_visibility.shown("agent_message_chunk"));
        assert_eq!(
            (
                s.budgets.draft_max_chars,
                s.budgets.item_detail_chars,
                s.budgets.status_chars
            ),
            (900, 40, 50)
        );
        assert!(Args::try_parse_from([
            "streamgate-projector",
            "--name",
            "c",
            "--sink",
            "plain=stdout",
            "--tag-visibility",
            "plan",
        ])
        .is_err());
    }
}

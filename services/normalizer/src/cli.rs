//! The normalizer service's command line: flags with `STREAMGATE_*` environment fallbacks
//! (and `--config` files, see `streamgate_runtime::config`). Shared by the service binary
//! and `streamgate normalizer`.

use crate::{start, Listeners, NormalizerConfig};
use clap::Parser;
use std::net::SocketAddr;
use std::time::Duration;
use streamgate_runtime::serve::ServeArgs;
use streamgate_runtime::{init_telemetry, NatsArgs, TelemetryArgs};

/// Normalizer service: ingest front doors and the SG_RAW → SG_EVENTS worker.
#[derive(Debug, Clone, Parser)]
#[command(name = "streamgate-normalizer", version)]
pub struct Args {
    /// Config file of STREAMGATE_*=value lines.
    #[arg(long, env = "STREAMGATE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// NATS servers and credentials.
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Partitions of the deployment (fixed for its lifetime).
    #[arg(long, env = "STREAMGATE_PARTITIONS", default_value_t = streamgate_bus::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// JetStream replicas for SG_RAW and SG_EVENTS.
    #[arg(long, env = "STREAMGATE_REPLICAS", default_value_t = 1)]
    pub replicas: usize,
    /// gRPC ingest listen address.
    #[arg(long, env = "STREAMGATE_INGEST_GRPC", default_value = "0.0.0.0:7310")]
    pub grpc: SocketAddr,
    /// HTTP ingest listen address.
    #[arg(long, env = "STREAMGATE_INGEST_HTTP", default_value = "0.0.0.0:7311")]
    pub http: SocketAddr,
    /// Bearer token of the ingest front doors that may write every tenant.
    #[arg(long, env = "STREAMGATE_INGEST_TOKEN", hide_env_values = true)]
    pub ingest_token: Option<String>,
    /// Token file of ingest tokens scoped to tenants: lines `<token> <tenant>[,…]` or
    /// `<token> *` (mode 0600; see `streamgate_normalizer::ingest::auth`).
    #[arg(long, env = "STREAMGATE_INGEST_TOKENS")]
    pub ingest_tokens: Option<std::path::PathBuf>,
    /// Seconds without a chunk before a run is closed with a timeout marker.
    #[arg(long, env = "STREAMGATE_IDLE_TIMEOUT_SECS", default_value_t = 120)]
    pub idle_timeout_secs: u64,
    /// Runs whose adapter state stays in memory.
    #[arg(long, env = "STREAMGATE_MAX_OPEN_RUNS", default_value_t = 10_000)]
    pub max_open_runs: usize,
    /// Bytes of one open run's final-answer candidate kept in memory: an answer that
    /// grows past it keeps its head and says it was cut (SG_RAW keeps every byte).
    #[arg(long, env = "STREAMGATE_MAX_FINAL_BYTES", default_value_t = streamgate_wire::families::final_text::FINAL_TEXT_CAP)]
    pub max_final_bytes: usize,
    /// Bytes of every open run's final-answer candidate together in this process.
    #[arg(long, env = "STREAMGATE_FINAL_BYTES_BUDGET", default_value_t = streamgate_wire::families::final_text::FINAL_TEXT_BUDGET)]
    pub final_bytes_budget: usize,
    /// Seconds the broker waits for an ack before redelivering a raw chunk: how long
    /// chunks held by a crashed replica wait before the partition's next owner gets them.
    #[arg(long, env = "STREAMGATE_ACK_WAIT_SECS", default_value_t = 10)]
    pub ack_wait_secs: u64,
    /// Partition lease TTL in seconds: replicas split the partitions with leases in
    /// SG_LEASES, and a replica that dies hands its partitions over this long after its
    /// last renewal. Takes effect when the bucket is created; an existing bucket keeps
    /// its TTL.
    #[arg(long, env = "STREAMGATE_LEASE_TTL", default_value_t = 10)]
    pub lease_ttl: u64,
    /// TLS and connection limits of the front doors.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Chunk publishes one ingest request keeps in flight before waiting for acks.
    #[arg(long, env = "STREAMGATE_INGEST_WINDOW", default_value_t = crate::ingest::flow::DEFAULT_WINDOW)]
    pub ingest_window: usize,
    /// OpenClaw gateways to follow (`ws://` or `wss://` URLs; repeat the flag, or
    /// comma-separate in the environment): their agent events are ingested as
    /// `openclaw-events` runs ([`crate::gateway`]).
    #[arg(
        long = "follow-gateway",
        env = "STREAMGATE_FOLLOW_GATEWAY",
        value_delimiter = ','
    )]
    pub follow_gateway: Vec<String>,
    /// File holding the token of the followed gateways (mode 0600).
    #[arg(long, env = "STREAMGATE_FOLLOW_GATEWAY_TOKEN_FILE")]
    pub follow_gateway_token_file: Option<std::path::PathBuf>,
    /// Tenant the followed gateways' runs are ingested under.
    #[arg(
        long,
        env = "STREAMGATE_FOLLOW_GATEWAY_TENANT",
        default_value = "default"
    )]
    pub follow_gateway_tenant: String,
    /// Logs, metrics and span export.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// Runs the service until SIGINT/SIGTERM, draining in-flight work.
pub async fn run(args: Args) -> anyhow::Result<()> {
    init_telemetry(&args.telemetry.config("streamgate-normalizer"))?;
    let shutdown = streamgate_runtime::shutdown::on_signal();
    let followers = gateway_followers(&args)?;
    let nats = args.nats.connect().await?;
    let mut cfg = NormalizerConfig {
        idle_timeout: Duration::from_secs(args.idle_timeout_secs),
        max_open_runs: args.max_open_runs,
        ack_wait: Duration::from_secs(args.ack_wait_secs.max(1)),
        lease_ttl: Duration::from_secs(args.lease_ttl.max(1)),
        // Leases on a connection of their own: ingest and normalization never delay a
        // renewal.
        lease_nats: Some(args.nats.connect().await?),
        ingest_window: args.ingest_window.max(1),
        max_final_bytes: args.max_final_bytes,
        final_bytes_budget: args.final_bytes_budget,
        ..NormalizerConfig::default()
    };
    cfg.streams.replicas = args.replicas;
    let listeners = Listeners {
        grpc: Some(args.grpc),
        http: Some(args.http),
        ingest_token: args.ingest_token,
        ingest_tokens: args.ingest_tokens,
        partitions: args.partitions,
        serve: args.serve.options(),
    };
    let mut running = streamgate_runtime::startup::retry_timeouts("normalizer", || {
        start(
            nats.clone(),
            cfg.clone(),
            listeners.clone(),
            shutdown.clone(),
        )
    })
    .await?;
    tracing::info!(grpc = ?running.grpc, http = ?running.http, member = %running.member, "normalizer listening");
    for cfg in followers {
        let (ingestor, stop) = (running.ingestor.clone(), shutdown.clone());
        tracing::info!(gateway = %crate::gateway::shown_url(&cfg.url), "following gateway");
        running.tasks.spawn(async move {
            crate::gateway::follow(cfg, ingestor, stop).await?;
            Ok(())
        });
    }
    while let Some(done) = running.tasks.join_next().await {
        done??;
    }
    streamgate_runtime::telemetry::flush().await;
    Ok(())
}

/// One follower per `--follow-gateway` (they land runs through the service's own
/// ingestor and stop with the service).
fn gateway_followers(args: &Args) -> anyhow::Result<Vec<crate::gateway::FollowConfig>> {
    if args.follow_gateway.is_empty() {
        return Ok(Vec::new());
    }
    let token = match &args.follow_gateway_token_file {
        None => None,
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?
                .trim()
                .to_owned(),
        ),
    };
    Ok(args
        .follow_gateway
        .iter()
        .map(|url| crate::gateway::FollowConfig {
            token: token.clone(),
            tenant: args.follow_gateway_tenant.clone(),
            ..crate::gateway::FollowConfig::new(url.trim())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_gateway_flags_make_one_follower_per_url_with_the_token_file() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("gateway.token");
        std::fs::write(&token, "gw-token\n").unwrap();
        let args = Args::try_parse_from([
            "streamgate-normalizer",
            "--follow-gateway",
            "ws://a:18789",
            "--follow-gateway",
            "wss://b/gw?x=1",
            "--follow-gateway-token-file",
            token.to_str().unwrap(),
            "--follow-gateway-tenant",
            "acme",
        ])
        .unwrap();
        let followers = gateway_followers(&args).unwrap();
        let urls: Vec<&str> = followers.iter().map(|f| f.url.as_str()).collect();
        assert_eq!(urls, ["ws://a:18789", "wss://b/gw?x=1"]);
        for f in &followers {
            assert_eq!(f.token.as_deref(), Some("gw-token"));
            assert_eq!(f.tenant, "acme");
        }
        let none = Args::try_parse_from(["streamgate-normalizer"]).unwrap();
        assert!(gateway_followers(&none).unwrap().is_empty());
    }
}

//! The archiver service's command line: flags with `STREAMGATE_*` environment fallbacks
//! (and `--config` files, see `streamgate_runtime::config`). Shared by the service binary
//! and `streamgate archiver`.

use crate::{start, ArchiverListen, ConsumerConfig};
use clap::Parser;
use std::net::SocketAddr;
use streamgate_runtime::serve::ServeArgs;
use streamgate_runtime::{init_telemetry, NatsArgs, TelemetryArgs};

/// Archiver service: SG_EVENTS into the archive, operator-only gRPC replay.
#[derive(Debug, Clone, Parser)]
#[command(name = "streamgate-archiver", version)]
pub struct Args {
    /// Config file of STREAMGATE_*=value lines.
    #[arg(long, env = "STREAMGATE_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// NATS servers and credentials.
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Archive: a SQLite path (`sqlite:///var/lib/streamgate/archive.db`, parameters
    /// `?synchronous=normal` and a new archive's `?page_size=4096`) or a PostgreSQL URL
    /// (`postgres://user@host/db`).
    #[arg(long, env = "STREAMGATE_ARCHIVE_URL", hide_env_values = true)]
    pub archive: String,
    /// Also archive raw chunks from SG_RAW.
    #[arg(long, env = "STREAMGATE_ARCHIVE_RAW")]
    pub archive_raw: bool,
    /// Retention policies: `<tenant>:strip=<N>d,drop=<M>d`, `;`-separated, `*` for every
    /// tenant without its own (strip: thinking text and tool payloads become stubs with
    /// sizes and hashes, raw chunks go; drop: the run goes).
    #[arg(long, env = "STREAMGATE_RETENTION", default_value = "")]
    pub retention: crate::retention::Policies,
    /// Seconds between retention passes.
    #[arg(
        long,
        env = "STREAMGATE_RETENTION_INTERVAL_SECS",
        default_value_t = 3600
    )]
    pub retention_interval_secs: u64,
    /// Prices per million tokens: `<model or prefix*>:input=<p>,output=<p>,cache_read=<p>,cache_write=<p>`,
    /// `;`-separated (cost in `runs --stats`, GetRun and ListRuns).
    #[arg(long, env = "STREAMGATE_PRICES", default_value = "")]
    pub prices: crate::accounting::Prices,
    /// Currency of `--prices`.
    #[arg(long, env = "STREAMGATE_PRICE_CURRENCY", default_value = "USD")]
    pub price_currency: String,
    /// Send every run that ends as an OpenTelemetry GenAI trace to this OTLP/gRPC
    /// endpoint (`http://collector:4317`).
    #[command(flatten)]
    pub export: crate::genai::follow::ExportArgs,
    /// Index the thinking of ended runs for `streamgate runs --search … --thinking`
    /// (reasoning is sensitive: off unless asked for; retention and erasure cover it).
    #[arg(long, env = "STREAMGATE_SEARCH_THINKING")]
    pub search_thinking: bool,
    /// Partitions of the deployment.
    #[arg(long, env = "STREAMGATE_PARTITIONS", default_value_t = streamgate_bus::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// ArchiveService listen address.
    #[arg(long, env = "STREAMGATE_ARCHIVE_GRPC", default_value = "0.0.0.0:7320")]
    pub grpc: SocketAddr,
    /// Operator bearer token (required).
    #[arg(long, env = "STREAMGATE_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: String,
    /// Events per archive transaction at most.
    #[arg(long, env = "STREAMGATE_ARCHIVE_BATCH", default_value_t = 1024)]
    pub batch: usize,
    /// Milliseconds between the starts of two archive commits at least (of events, and
    /// of raw chunks with `--archive-raw`): what arrives meanwhile joins the next one, so
    /// a modest load does not rewrite each run's pages (and fsync) hundreds of times a
    /// second. 0: commit as soon as anything arrives; at most 60000 (a minute), and at
    /// most half of `--ack-wait-secs`.
    #[arg(
        long,
        env = "STREAMGATE_ARCHIVE_COMMIT_INTERVAL_MS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(0..=60_000)
    )]
    pub commit_interval_ms: u64,
    /// Seconds the broker waits for an ack before redelivering an event: how long events
    /// held by a crashed replica wait before another one takes them.
    #[arg(long, env = "STREAMGATE_ACK_WAIT_SECS", default_value_t = 10)]
    pub ack_wait_secs: u64,
    /// TLS and connection limits of the ArchiveService server.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Logs, metrics and span export.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// Refuses a commit interval longer than half the ack wait: the broker keeps delivering
/// while the archiver waits to commit, so what it took at the start of a wait would be
/// delivered again, to every replica, before it could be acknowledged.
fn commits_within_ack_wait(commit_interval_ms: u64, ack_wait_secs: u64) -> anyhow::Result<()> {
    let ack_wait_ms = ack_wait_secs.max(1).saturating_mul(1000);
    anyhow::ensure!(
        commit_interval_ms.saturating_mul(2) <= ack_wait_ms,
        "--commit-interval-ms {commit_interval_ms} is more than half of --ack-wait-secs \
         {ack_wait_secs} ({ack_wait_ms} ms): what the archiver takes while it waits to commit \
         would be redelivered before it is acknowledged; lower the interval or raise the ack wait"
    );
    Ok(())
}

/// Runs the service until SIGINT/SIGTERM, draining in-flight work.
pub async fn run(args: Args) -> anyhow::Result<()> {
    commits_within_ack_wait(args.commit_interval_ms, args.ack_wait_secs)?;
    init_telemetry(&args.telemetry.config("streamgate-archiver"))?;
    let shutdown = streamgate_runtime::shutdown::on_signal();
    let nats = args.nats.connect().await?;
    let store = streamgate_archive::open_store(&args.archive).await?;
    let consumer = ConsumerConfig {
        batch: args.batch,
        commit_interval: std::time::Duration::from_millis(args.commit_interval_ms),
        ack_wait: std::time::Duration::from_secs(args.ack_wait_secs.max(1)),
        archive_raw: args.archive_raw,
        retention: args.retention.clone(),
        retention_interval: std::time::Duration::from_secs(args.retention_interval_secs.max(1)),
        export_otlp: args.export.config(),
        search_thinking: args.search_thinking,
        ..ConsumerConfig::default()
    };
    let listen = ArchiverListen {
        grpc: Some(args.grpc),
        operator_token: args.operator_token,
        partitions: args.partitions,
        serve: args.serve.options(),
        prices: args.prices.clone(),
        currency: args.price_currency.clone(),
    };
    let mut running = streamgate_runtime::startup::retry_timeouts("archiver", || {
        start(
            nats.clone(),
            store.clone(),
            consumer.clone(),
            listen.clone(),
            shutdown.clone(),
        )
    })
    .await?;
    tracing::info!(grpc = ?running.grpc, "archiver listening");
    while let Some(done) = running.tasks.join_next().await {
        done??;
    }
    streamgate_runtime::telemetry::flush().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::commits_within_ack_wait;

    #[test]
    fn a_commit_interval_past_half_the_ack_wait_is_refused_with_both_flags_named() {
        assert!(commits_within_ack_wait(10, 10).is_ok());
        assert!(commits_within_ack_wait(5_000, 10).is_ok());
        assert!(commits_within_ack_wait(60_000, 120).is_ok());
        let e = commits_within_ack_wait(5_001, 10).unwrap_err().to_string();
        assert!(e.contains("--commit-interval-ms 5001"), "{e}");
        assert!(e.contains("--ack-wait-secs 10"), "{e}");
        // An ack wait of 0 is taken as 1 s, as the consumer does.
        assert!(commits_within_ack_wait(500, 0).is_ok());
        assert!(commits_within_ack_wait(501, 0).is_err());
    }
}

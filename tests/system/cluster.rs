//! Clustered JetStream, end to end: a real 3-node nats-server cluster on loopback
//! (testkit `NatsCluster`), streams and KV buckets at R3, and the normalizer, archiver and
//! a webhook projector channel (against the local fake receiver) running in this process,
//! each on a client that knows every node.
//!
//! The producer side is the documented contract: a chunk put may fail (or time out)
//! while the cluster elects a new leader, and the producer puts it again with the same
//! chunk index (JetStream dedupes on `Nats-Msg-Id`). Each test counts those retries.
//!
//! One test runs the normalizers as real processes instead:
//! (f) `normalizer_process_sigkilled_mid_load`: two `streamgate normalizer` children on
//! every node (`--replicas 3 --lease-ttl 3`); one is SIGKILLed mid-load and the
//! survivor takes its partitions once the leases run out.
//!
//! What every test checks at the end: every acknowledged run is archived exactly as
//! `streamgate normalize` prints it (seq 1..=n, each once), and — where a channel runs —
//! the webhook receiver applied exactly one `final` per run.

use crate::common;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use streamgate_archive::Store;
use streamgate_archiver::{ArchiverListen, ConsumerConfig};
use streamgate_bus::{DEFAULT_PARTITIONS, EVENTS_STREAM, RAW_STREAM};
use streamgate_normalizer::ingest::Ingestor;
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_projector::{ChannelConfig, ChannelSink};
use streamgate_sinks::fakes::{Behavior, FakeServer};
use streamgate_sinks::webhook;
use streamgate_testkit::NatsCluster;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const REPLICAS: usize = 3;
const SECRET: &str = "whsec-cluster";
const CHANNEL: &str = "hook";
/// How long the whole load may take to be archived and delivered.
const SETTLE: Duration = Duration::from_secs(45);

/// The capture every run carries (a thinking block and a final answer).
const CAPTURE: &str = "f1/end-turn.sse";

type Tasks = JoinSet<anyhow::Result<()>>;

/// One cluster test at a time: each runs three nats-servers and a loaded pipeline, and
/// two of those at once on a 2-core box only measure the box.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A service (or replica) started in this process.
struct Svc {
    stop: CancellationToken,
    tasks: Tasks,
    partitions: Option<watch::Receiver<BTreeSet<u32>>>,
}

impl Svc {
    fn held(&self) -> BTreeSet<u32> {
        self.partitions
            .as_ref()
            .map(|p| p.borrow().clone())
            .unwrap_or_default()
    }

    /// Graceful stop: drain, release leases.
    async fn stop(mut self) {
        self.stop.cancel();
        let all = async { while self.tasks.join_next().await.is_some() {} };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .expect("service did not stop within 30 s");
    }

    /// A crash: every task aborted, nothing released or acknowledged.
    async fn crash(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

impl Drop for Svc {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Short lease TTL and ack wait so that a crashed replica's partitions move within a
/// few seconds; R3 streams, lease and open-run buckets.
fn normalizer_cfg() -> NormalizerConfig {
    let mut cfg = NormalizerConfig {
        lease_ttl: Duration::from_secs(3),
        ack_wait: Duration::from_secs(3),
        ..NormalizerConfig::default()
    };
    cfg.streams.replicas = REPLICAS;
    cfg
}

async fn start_normalizer(cluster: &NatsCluster) -> Svc {
    let stop = CancellationToken::new();
    let running = streamgate_normalizer::start(
        cluster.client().await,
        normalizer_cfg(),
        Listeners {
            grpc: None,
            http: None,
            ingest_token: None,
            partitions: DEFAULT_PARTITIONS,
            ..Default::default()
        },
        stop.clone(),
    )
    .await
    .expect("start normalizer");
    Svc {
        stop,
        tasks: running.tasks,
        partitions: Some(running.partitions),
    }
}

async fn start_archiver(cluster: &NatsCluster, store: Arc<dyn Store>) -> Svc {
    let stop = CancellationToken::new();
    let running = streamgate_archiver::start(
        cluster.client().await,
        store,
        ConsumerConfig::default(),
        ArchiverListen {
            grpc: None,
            operator_token: TOKEN.into(),
            partitions: DEFAULT_PARTITIONS,
            ..Default::default()
        },
        stop.clone(),
    )
    .await
    .expect("start archiver");
    Svc {
        stop,
        tasks: running.tasks,
        partitions: None,
    }
}

/// A webhook channel with R3 buckets, fast retries and a short lease TTL.
fn hook_channel(fake: &FakeServer) -> ChannelConfig {
    let mut c = ChannelConfig::new(
        CHANNEL,
        ChannelSink::Sink(streamgate_sinks::SinkConfig::Webhook(
            webhook::WebhookConfig::new(CHANNEL, fake.base_url.clone(), SECRET),
        )),
    );
    c.replicas = REPLICAS;
    c.lease_ttl = Duration::from_secs(3);
    c.ack_wait = Duration::from_secs(3);
    c.delivery.retry_base = Duration::from_millis(50);
    c.delivery.retry_max = Duration::from_millis(500);
    c
}

async fn start_projector(cluster: &NatsCluster, fake: &FakeServer) -> Svc {
    let stop = CancellationToken::new();
    let running = streamgate_projector::start(
        cluster.client().await,
        hook_channel(fake),
        None,
        stop.clone(),
    )
    .await
    .expect("start projector channel");
    Svc {
        stop,
        tasks: running.tasks,
        partitions: Some(running.partitions),
    }
}

/// The cluster, the archive, and a producer.
struct Env {
    cluster: NatsCluster,
    js: async_nats::jetstream::Context,
    ingestor: Ingestor,
    store: Arc<dyn Store>,
    _store: TestStore,
}

impl Env {
    async fn start(backend: Backend) -> Env {
        let cluster = NatsCluster::start().await;
        let js = cluster.jetstream().await;
        let test_store = TestStore::new(backend).await;
        let store = test_store.open().await;
        Env {
            ingestor: Ingestor::new(js.clone(), DEFAULT_PARTITIONS),
            cluster,
            js,
            store,
            _store: test_store,
        }
    }

    /// Replicas of a stream as created.
    async fn stream_replicas(&self, stream: &str) -> usize {
        let s = self.js.get_stream(stream).await.expect("stream");
        s.cached_info().config.num_replicas
    }
}

/// What the producer did.
#[derive(Default)]
struct Load {
    /// Runs whose every chunk and close marker were acknowledged.
    acked: AtomicUsize,
    /// Puts that failed or timed out and were made again.
    retries: AtomicU64,
}

/// Puts one chunk until JetStream acknowledges it (each attempt bounded by 5 s).
async fn put_retrying(
    ingestor: &Ingestor,
    spec: &streamgate_normalizer::ingest::RunSpec,
    index: u64,
    body: Bytes,
    close: Option<streamgate_bus::raw::CloseKind>,
    load: &Load,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = ingestor.put(spec, index, body.clone(), close, None);
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => assert!(
                Instant::now() < deadline,
                "run {}: chunk {index} never acknowledged: {e}",
                spec.run_id
            ),
            Err(_) => assert!(
                Instant::now() < deadline,
                "run {}: chunk {index} never acknowledged (timeouts)",
                spec.run_id
            ),
        }
        load.retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Ingests one run: every chunk, then the close marker.
async fn ingest_run(ingestor: &Ingestor, run: &str, chunks: &[Bytes], load: &Load) {
    let spec = spec(run, "f1");
    for (i, c) in chunks.iter().enumerate() {
        put_retrying(ingestor, &spec, i as u64, c.clone(), None, load).await;
    }
    let close = Some(streamgate_bus::raw::CloseKind::Normal);
    let end = chunks.len() as u64;
    put_retrying(ingestor, &spec, end, Bytes::new(), close, load).await;
    load.acked.fetch_add(1, Ordering::Relaxed);
}

/// Ingests `runs` (each the capture in `chunks`, then the close marker), `concurrency`
/// runs at a time.
fn spawn_load(
    ingestor: Ingestor,
    runs: Vec<String>,
    chunks: Arc<Vec<Bytes>>,
    concurrency: usize,
    load: Arc<Load>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        futures::stream::iter(runs)
            .for_each_concurrent(concurrency, |run| {
                let (ingestor, chunks, load) = (&ingestor, chunks.clone(), load.clone());
                async move { ingest_run(ingestor, &run, &chunks, &load).await }
            })
            .await;
    })
}

/// Ingests runs `<prefix>-000`, `<prefix>-001`, … until `stop` fires (no new run starts
/// after that; every started run is finished); returns the runs ingested.
fn spawn_open_load(
    ingestor: Ingestor,
    prefix: &'static str,
    chunks: Arc<Vec<Bytes>>,
    concurrency: usize,
    load: Arc<Load>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let started = std::sync::Mutex::new(Vec::new());
        futures::stream::iter(0..)
            .take_while(|_| futures::future::ready(!stop.is_cancelled()))
            .for_each_concurrent(concurrency, |i| {
                let run = format!("{prefix}-{i:04}");
                started.lock().unwrap().push(run.clone());
                let (ingestor, chunks, load) = (&ingestor, chunks.clone(), load.clone());
                async move { ingest_run(ingestor, &run, &chunks, &load).await }
            })
            .await;
        started.into_inner().unwrap()
    })
}

async fn wait_for(what: &str, patience: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !f() {
        assert!(Instant::now() < deadline, "{what} not within {patience:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn run_ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

/// The capture in small chunks (a fixed split: every run the same).
fn chunks() -> (Vec<u8>, Arc<Vec<Bytes>>) {
    let bytes = fixture(CAPTURE);
    let chunks = split(&bytes, &mut rng(7), 160);
    (bytes, Arc::new(chunks))
}

/// Every run archived exactly as normalize prints it, each event once.
async fn assert_archived(store: &dyn Store, runs: &[String], bytes: &[u8], ctx: &str) {
    let want = expected("f1", bytes);
    let deadline = Instant::now() + SETTLE;
    for run in runs {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = wait_run(store, run, want.len(), left.max(Duration::from_secs(1))).await;
        assert_archive_eq(run, &got, &want, ctx);
    }
}

/// Applied `final` ops per run id (the fake keeps each `Idempotency-Key` once).
fn finals(fake: &FakeServer) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for e in fake.events() {
        if e.get("op").and_then(|v| v.as_str()) == Some("final") {
            let run = e.get("run_id").and_then(|v| v.as_str()).unwrap_or("");
            *m.entry(run.to_owned()).or_default() += 1;
        }
    }
    m
}

/// Runs whose `final` request was sent more than once (each repeat carried the same
/// `Idempotency-Key` and was not applied again; `assert_finals_once` checks that).
fn finals_resent(fake: &FakeServer) -> usize {
    let mut sent: HashMap<String, usize> = HashMap::new();
    for c in fake.calls() {
        if c.api == "final" {
            let run = c.body.get("run_id").and_then(|v| v.as_str()).unwrap_or("");
            *sent.entry(run.to_owned()).or_default() += 1;
        }
    }
    sent.values().filter(|n| **n > 1).count()
}

/// Every run got its final, once.
async fn assert_finals_once(fake: &FakeServer, runs: &[String], ctx: &str) {
    let want: BTreeSet<&str> = runs.iter().map(String::as_str).collect();
    let deadline = Instant::now() + SETTLE;
    loop {
        let f = finals(fake);
        if want.iter().all(|r| f.contains_key(*r)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ctx}: finals of {} of {} runs within {SETTLE:?}",
            want.iter().filter(|r| f.contains_key(**r)).count(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Negative window, not a wait: a late repeat of a final gets 500 ms to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let f = finals(fake);
    let twice: Vec<_> = f.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "{ctx}: a final applied more than once: {twice:?}"
    );
    let unknown: Vec<_> = f.keys().filter(|r| !want.contains(r.as_str())).collect();
    assert!(
        unknown.is_empty(),
        "{ctx}: finals of unknown runs: {unknown:?}"
    );
}

/// Asks the cluster to move `stream`'s leadership to node `to` (leader stepdown with a
/// preferred placement); true when it ends up there.
async fn move_leader(env: &Env, stream: &str, to: usize) -> bool {
    let client = env.cluster.client().await;
    let body = serde_json::json!({"placement": {"preferred": env.cluster.name(to)}});
    for _ in 0..5 {
        let _ = client
            .request(
                format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                body.to_string().into(),
            )
            .await;
        let leader = env
            .cluster
            .stream_leader(&env.js, stream, Duration::from_secs(10))
            .await;
        if leader == to {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    false
}

/// (a) The node leading SG_RAW (and SG_EVENTS, moved there first) is SIGKILLed while
/// 150 runs are being ingested: producers retry through the election, and every
/// acknowledged run is archived completely, once, with exactly one webhook final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_leader_killed_mid_load() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut env = Env::start(Backend::Sqlite).await;
    let fake = FakeServer::webhook(SECRET, Behavior::default())
        .await
        .expect("fake webhook");
    let _normalizer = start_normalizer(&env.cluster).await;
    let _archiver = start_archiver(&env.cluster, env.store.clone()).await;
    let _projector = start_projector(&env.cluster, &fake).await;
    wait_normalizer(&env.js, "sg-normalizer").await;
    wait_consumer(&env.js, EVENTS_STREAM, "sg-archiver").await;
    wait_projector(&env.js, CHANNEL).await;
    assert_eq!(env.stream_replicas(RAW_STREAM).await, REPLICAS);
    assert_eq!(env.stream_replicas(EVENTS_STREAM).await, REPLICAS);

    let patience = Duration::from_secs(15);
    let victim = env
        .cluster
        .stream_leader(&env.js, RAW_STREAM, patience)
        .await;
    let both = move_leader(&env, EVENTS_STREAM, victim).await;

    let (bytes, chunks) = chunks();
    let runs = run_ids("lead", 150);
    let load = Arc::new(Load::default());
    let producer = spawn_load(env.ingestor.clone(), runs.clone(), chunks, 16, load.clone());
    wait_for("40 runs acknowledged", SETTLE, || {
        load.acked.load(Ordering::Relaxed) >= 40
    })
    .await;
    let acked_before = load.acked.load(Ordering::Relaxed);
    env.cluster.kill(victim);
    let killed_at = Instant::now();
    let new_raw = env
        .cluster
        .stream_leader(&env.js, RAW_STREAM, patience)
        .await;
    assert_ne!(new_raw, victim, "SG_RAW still led by the killed node");
    tokio::time::timeout(SETTLE, producer)
        .await
        .expect("load not acknowledged in time")
        .expect("producer");
    let ingest_done = killed_at.elapsed();
    assert_archived(&*env.store, &runs, &bytes, "leader killed").await;
    assert_finals_once(&fake, &runs, "leader killed").await;
    eprintln!(
        "killed n{victim} (led SG_RAW{}) after {acked_before} of {} runs; {} retried puts; \
         load acked {ingest_done:?} after the kill; {} finals resent (deduped by key); \
         total {:?}",
        if both { " and SG_EVENTS" } else { "" },
        runs.len(),
        load.retries.load(Ordering::Relaxed),
        finals_resent(&fake),
        t0.elapsed()
    );
}

/// (b) The webhook channel scales 1 → 3 → 1 replicas while runs are being ingested (the
/// load goes on until 30 runs after each step, ~100 runs in all): the
/// joining replicas take partitions, the leaving ones hand them back, and every run's
/// final is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projector_scales_one_three_one_mid_load() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let env = Env::start(Backend::Sqlite).await;
    let fake = FakeServer::webhook(SECRET, Behavior::default())
        .await
        .expect("fake webhook");
    let _normalizer = start_normalizer(&env.cluster).await;
    let _archiver = start_archiver(&env.cluster, env.store.clone()).await;
    let first = start_projector(&env.cluster, &fake).await;
    wait_normalizer(&env.js, "sg-normalizer").await;
    wait_consumer(&env.js, EVENTS_STREAM, "sg-archiver").await;
    wait_projector(&env.js, CHANNEL).await;

    let (bytes, chunks) = chunks();
    let load = Arc::new(Load::default());
    let enough = CancellationToken::new();
    let producer = spawn_open_load(
        env.ingestor.clone(),
        "scale",
        chunks,
        8,
        load.clone(),
        enough.clone(),
    );
    wait_for("30 runs acknowledged", SETTLE, || {
        load.acked.load(Ordering::Relaxed) >= 30
    })
    .await;
    let second = start_projector(&env.cluster, &fake).await;
    let third = start_projector(&env.cluster, &fake).await;
    wait_for("the joining replicas to hold partitions", SETTLE, || {
        !second.held().is_empty() && !third.held().is_empty()
    })
    .await;
    let at_three = (first.held().len(), second.held().len(), third.held().len());
    let acked_at_three = load.acked.load(Ordering::Relaxed);
    wait_for("30 more runs acknowledged", SETTLE, || {
        load.acked.load(Ordering::Relaxed) >= acked_at_three + 30
    })
    .await;
    second.stop().await;
    third.stop().await;
    wait_for(
        "the first replica to hold every partition again",
        SETTLE,
        || first.held().len() == DEFAULT_PARTITIONS as usize,
    )
    .await;
    let acked_at_one = load.acked.load(Ordering::Relaxed);
    wait_for("30 more runs acknowledged at one replica", SETTLE, || {
        load.acked.load(Ordering::Relaxed) >= acked_at_one + 30
    })
    .await;
    enough.cancel();
    let runs = tokio::time::timeout(SETTLE, producer)
        .await
        .expect("load not acknowledged in time")
        .expect("producer");
    assert_finals_once(&fake, &runs, "projector 1→3→1").await;
    assert_archived(&*env.store, &runs, &bytes, "projector 1→3→1").await;
    eprintln!(
        "partitions at 3 replicas {at_three:?} (after {acked_at_three} runs), back to 1 after \
         {acked_at_one} runs, {} runs in all; {} retried puts; {} repeated webhook requests \
         deduped, {} of them finals; total {:?}",
        runs.len(),
        load.retries.load(Ordering::Relaxed),
        fake.duplicates(),
        finals_resent(&fake),
        t0.elapsed()
    );
}

/// (c) Two normalizer replicas split the partitions; one is aborted mid-load (tasks
/// dropped abruptly: nothing acknowledged, no lease released). The survivor takes its
/// partitions once the leases run out, rebuilds the runs in flight, and the archive is
/// complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normalizer_replica_crashes_mid_load() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let env = Env::start(Backend::Postgres).await;
    let survivor = start_normalizer(&env.cluster).await;
    let victim = start_normalizer(&env.cluster).await;
    let _archiver = start_archiver(&env.cluster, env.store.clone()).await;
    wait_normalizer(&env.js, "sg-normalizer").await;
    wait_consumer(&env.js, EVENTS_STREAM, "sg-archiver").await;
    wait_for("both replicas to hold partitions", SETTLE, || {
        !survivor.held().is_empty() && !victim.held().is_empty()
    })
    .await;
    let victim_held = victim.held();

    let (bytes, chunks) = chunks();
    let runs = run_ids("crash", 150);
    let load = Arc::new(Load::default());
    let producer = spawn_load(env.ingestor.clone(), runs.clone(), chunks, 16, load.clone());
    wait_for("40 runs acknowledged", SETTLE, || {
        load.acked.load(Ordering::Relaxed) >= 40
    })
    .await;
    let acked_before = load.acked.load(Ordering::Relaxed);
    victim.crash().await;
    let crashed_at = Instant::now();
    wait_for("the survivor to hold every partition", SETTLE, || {
        survivor.held().len() == DEFAULT_PARTITIONS as usize
    })
    .await;
    let takeover = crashed_at.elapsed();
    tokio::time::timeout(SETTLE, producer)
        .await
        .expect("load not acknowledged in time")
        .expect("producer");
    assert_archived(&*env.store, &runs, &bytes, "normalizer crash").await;
    eprintln!(
        "crashed the replica holding {victim_held:?} after {acked_before} runs; survivor \
         held all after {takeover:?}; {} retried puts; total {:?}",
        load.retries.load(Ordering::Relaxed),
        t0.elapsed()
    );
}

/// `streamgate normalizer` as a child process on every cluster node, with R3 buckets, a
/// 3 s lease TTL and ack wait (the streams are made at R3 before it starts).
fn normalizer_proc_args(cluster: &NatsCluster) -> Vec<String> {
    let mut args = normalizer_args(&cluster.urls(), 600);
    args.extend(
        [
            "--replicas",
            "3",
            "--lease-ttl",
            "3",
            "--ack-wait-secs",
            "3",
        ]
        .map(String::from),
    );
    args
}

/// Lease owners of the normalizer partitions: (member → partitions held).
async fn normalizer_members(
    js: &async_nats::jetstream::Context,
) -> std::collections::BTreeMap<String, BTreeSet<u32>> {
    let mut by_member = std::collections::BTreeMap::<String, BTreeSet<u32>>::new();
    let group = streamgate_normalizer::worker::lease_group();
    for (p, member) in lease_owners(js, &group).await {
        by_member.entry(member).or_default().insert(p);
    }
    by_member
}

/// (f) Two normalizer replicas run as `streamgate normalizer` processes and split the
/// partitions; one is SIGKILLed (`Child::kill`) while 150 runs are being ingested into
/// SG_RAW: no drain, no lease released, nothing acknowledged. The survivor takes every
/// partition once the killed one's leases run out (3 s TTL), rebuilds the runs in
/// flight, and every run is archived complete, once, with exactly one webhook final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normalizer_process_sigkilled_mid_load() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let env = Env::start(Backend::Sqlite).await;
    let settings = streamgate_bus::StreamSettings {
        replicas: REPLICAS,
        ..Default::default()
    };
    streamgate_bus::ensure_streams(&env.js, &settings)
        .await
        .expect("R3 streams");
    let fake = FakeServer::webhook(SECRET, Behavior::default())
        .await
        .expect("fake webhook");
    let logs = tempfile::tempdir().expect("log dir");
    let args = normalizer_proc_args(&env.cluster);
    let _archiver = start_archiver(&env.cluster, env.store.clone()).await;
    let _projector = start_projector(&env.cluster, &fake).await;
    // One replica first: it makes the R3 lease and open-run buckets (a replica whose
    // start-up JetStream requests time out exits, and two of them making R3 buckets at
    // once on a busy 2-core box do time out); the second joins and takes its share.
    let mut survivor = Service::spawn("survivor", &args, logs.path());
    let deadline = Instant::now() + SETTLE;
    loop {
        survivor.assert_running();
        let m = normalizer_members(&env.js).await;
        if m.values().map(BTreeSet::len).sum::<usize>() == DEFAULT_PARTITIONS as usize {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first replica holding every partition not within {SETTLE:?}: {m:?}\n{}",
            tail(&survivor.log_text(), 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut victim = Service::spawn("victim", &args, logs.path());
    assert_eq!(env.stream_replicas(RAW_STREAM).await, REPLICAS);
    assert_eq!(env.stream_replicas(EVENTS_STREAM).await, REPLICAS);

    // Both replicas hold partitions; a member id carries its process id (`-<pid>-`).
    let of = |s: &Service| format!("-{}-", s.pid().expect("running"));
    let (survivor_id, victim_id) = (of(&survivor), of(&victim));
    let deadline = Instant::now() + SETTLE;
    let victim_held = loop {
        survivor.assert_running();
        victim.assert_running();
        let m = normalizer_members(&env.js).await;
        let all: usize = m.values().map(BTreeSet::len).sum();
        let held = |id: &str| m.iter().any(|(member, _)| member.contains(id));
        if m.len() == 2 && all == DEFAULT_PARTITIONS as usize && held(&survivor_id) {
            if let Some((_, p)) = m.iter().find(|(member, _)| member.contains(&victim_id)) {
                break p.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "two replicas holding every partition not within {SETTLE:?}: {m:?}\n{}\n{}",
            tail(&survivor.log_text(), 20),
            tail(&victim.log_text(), 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(env.stream_replicas("KV_SG_LEASES").await, REPLICAS);
    wait_normalizer(&env.js, "sg-normalizer").await;
    wait_consumer(&env.js, EVENTS_STREAM, "sg-archiver").await;
    wait_projector(&env.js, CHANNEL).await;

    let (bytes, chunks) = chunks();
    let runs = run_ids("sigkill", 150);
    let load = Arc::new(Load::default());
    let producer = spawn_load(env.ingestor.clone(), runs.clone(), chunks, 16, load.clone());
    wait_for("40 runs acknowledged", SETTLE, || {
        load.acked.load(Ordering::Relaxed) >= 40
    })
    .await;
    let acked_before = load.acked.load(Ordering::Relaxed);
    let victim_pid = victim.pid().expect("victim pid");
    victim.kill();
    let killed_at = Instant::now();
    let deadline = killed_at + SETTLE;
    loop {
        survivor.assert_running();
        let m = normalizer_members(&env.js).await;
        let all = m.values().next().map_or(0, BTreeSet::len);
        if m.len() == 1
            && all == DEFAULT_PARTITIONS as usize
            && m.keys().all(|k| k.contains(&survivor_id))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the survivor holding every partition not within {SETTLE:?}: {m:?}\n{}",
            tail(&survivor.log_text(), 20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let takeover = killed_at.elapsed();
    tokio::time::timeout(SETTLE, producer)
        .await
        .expect("load not acknowledged in time")
        .expect("producer");
    assert_archived(&*env.store, &runs, &bytes, "normalizer SIGKILLed").await;
    assert_finals_once(&fake, &runs, "normalizer SIGKILLed").await;
    survivor.assert_running();
    eprintln!(
        "SIGKILLed pid {victim_pid} (held {victim_held:?}) after {acked_before} of {} runs; \
         survivor held all after {takeover:?}; {} retried puts; {} finals resent (deduped by \
         key); total {:?}",
        runs.len(),
        load.retries.load(Ordering::Relaxed),
        finals_resent(&fake),
        t0.elapsed()
    );
}

/// `streamgate up --nats <every node> --replicas 3` makes its streams and every KV
/// bucket (leases, open runs, a channel's delivery state and settings) at R3; without
/// `--nats` it refuses replicas its single local server cannot hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_on_a_cluster_makes_everything_r3() {
    let _serial = SERIAL.lock().await;
    let cluster = NatsCluster::start().await;
    let js = cluster.jetstream().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join(".streamgate");
    let err_log = dir.path().join("up.err");
    let up = |extra: &[&str]| {
        std::process::Command::new(bin())
            .args(["up", "--quiet", "--data-dir"])
            .arg(&data)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err_log).expect("up.err"))
            .spawn()
            .expect("spawn streamgate up")
    };
    let refused = up(&["--replicas", "3"]).wait().expect("up exits");
    let err = std::fs::read_to_string(&err_log).unwrap_or_default();
    assert!(!refused.success(), "up --replicas 3 without --nats ran");
    assert!(err.contains("--replicas 3 needs --nats"), "{err}");

    let urls = cluster.urls();
    let mut running = Graceful(up(&["--nats", &urls, "--replicas", "3"]));
    let deadline = Instant::now() + PATIENCE;
    while !data.join("up.json").exists() {
        if let Ok(Some(s)) = running.0.try_wait() {
            panic!(
                "streamgate up exited with {s}:\n{}",
                std::fs::read_to_string(&err_log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no up.json after {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for stream in [
        RAW_STREAM,
        EVENTS_STREAM,
        "KV_SG_LEASES",
        "KV_SG_OPEN_RUNS",
        "KV_SG_DELIVERY",
        "KV_SG_SETTINGS",
    ] {
        let s = js
            .get_stream(stream)
            .await
            .unwrap_or_else(|e| panic!("{stream}: {e}"));
        assert_eq!(s.cached_info().config.num_replicas, 3, "{stream}");
    }
    let stopped = running.stop(Duration::from_secs(15));
    assert!(
        stopped.is_some_and(|s| s.success()),
        "up did not stop cleanly"
    );
}

/// The normalizer with its gRPC and HTTP front doors on loopback (leases on a connection
/// of their own, as the service binary runs them).
async fn start_front_doors(
    cluster: &NatsCluster,
) -> (Svc, std::net::SocketAddr, std::net::SocketAddr) {
    let stop = CancellationToken::new();
    let cfg = NormalizerConfig {
        lease_nats: Some(cluster.client().await),
        ..normalizer_cfg()
    };
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let running = streamgate_normalizer::start(
        cluster.client().await,
        cfg,
        Listeners {
            grpc: Some(any),
            http: Some(any),
            ingest_token: None,
            partitions: DEFAULT_PARTITIONS,
            ..Default::default()
        },
        stop.clone(),
    )
    .await
    .expect("start normalizer");
    let (grpc, http) = (running.grpc.unwrap(), running.http.unwrap());
    let svc = Svc {
        stop,
        tasks: running.tasks,
        partitions: Some(running.partitions),
    };
    (svc, grpc, http)
}

/// One `streamgate ingest` of the capture as `run` over gRPC, at a recorded pace; its
/// exit status and stderr.
async fn cli_ingest(grpc: std::net::SocketAddr, run: String) -> (String, bool, String) {
    let capture = root().join("fixtures").join(CAPTURE);
    let out = tokio::process::Command::new(bin())
        .arg("ingest")
        .arg(&capture)
        .args(["--run", &run, "--tenant", TENANT, "--family", "f1"])
        .args(["--session", &format!("session-{run}")])
        .args(["--addr", &grpc.to_string(), "--chunk-bytes", "96"])
        .args(["--pace", "recorded", "--retry-secs", "60"])
        .output()
        .await
        .expect("run streamgate ingest");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (run, out.status.success(), stderr)
}

/// HTTP answers while probing: (status, Retry-After) of each small ingest that failed,
/// and how many succeeded.
#[derive(Default)]
struct Probe {
    ok: usize,
    failed: Vec<(u16, Option<String>)>,
}

/// Ingests small fresh runs over HTTP until `stop`, noting every answer; counts each
/// accepted one in `accepted` and each refused one in `refused` as it goes.
fn spawn_http_probe(
    http: std::net::SocketAddr,
    stop: CancellationToken,
    accepted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Probe> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let body = fixture(CAPTURE);
        let mut probe = Probe::default();
        for i in 0.. {
            if stop.is_cancelled() {
                break;
            }
            let url = format!("http://{http}/v1/ingest/{TENANT}/probe-{i:04}?family=f1");
            let sent = client.post(url).body(body.clone()).send();
            match tokio::time::timeout(Duration::from_secs(20), sent).await {
                Ok(Ok(r)) if r.status().is_success() => {
                    probe.ok += 1;
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Ok(r)) => {
                    let after = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    probe.failed.push((r.status().as_u16(), after));
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(e)) => panic!("HTTP probe {i}: {e}"),
                Err(_) => panic!("HTTP probe {i}: no answer within 20 s"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        probe
    })
}

/// (e) The SG_RAW leader (SG_EVENTS' too) is SIGKILLed while `streamgate ingest`
/// processes send runs over gRPC and small runs are posted over HTTP, and a second node
/// with it, restarted once an HTTP ingest was refused (so the election cannot end before
/// a probe has landed in it): during the election HTTP answers 503 with `Retry-After`,
/// the CLI says once that it retries, and every CLI run lands in the archive complete,
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_retries_through_a_leader_election() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut env = Env::start(Backend::Sqlite).await;
    let (_normalizer, grpc, http) = start_front_doors(&env.cluster).await;
    let _archiver = start_archiver(&env.cluster, env.store.clone()).await;
    wait_normalizer(&env.js, "sg-normalizer").await;
    wait_consumer(&env.js, EVENTS_STREAM, "sg-archiver").await;
    let patience = Duration::from_secs(15);
    let victim = env
        .cluster
        .stream_leader(&env.js, RAW_STREAM, patience)
        .await;
    move_leader(&env, EVENTS_STREAM, victim).await;

    // CLI runs, 4 at a time, until a while after the new leader is known.
    let stop = CancellationToken::new();
    let cli = {
        let stop = stop.clone();
        tokio::spawn(async move {
            futures::stream::iter(0..)
                .take_while(|_| futures::future::ready(!stop.is_cancelled()))
                .map(|i| cli_ingest(grpc, format!("cli-{i:03}")))
                .buffer_unordered(4)
                .collect::<Vec<_>>()
                .await
        })
    };
    let accepted = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let probe = spawn_http_probe(http, stop.clone(), accepted.clone(), refused.clone());
    // Both front doors carry load before the kill: an HTTP ingest accepted, and the first
    // CLI run's events archived.
    wait_for("an HTTP ingest accepted before the kill", SETTLE, || {
        accepted.load(Ordering::Relaxed) >= 1
    })
    .await;
    wait_some(&*env.store, "cli-000", 1).await;
    // The election is held open until a probe has landed in it: a second node goes down
    // with the leader, so the one left cannot win a vote (one of three is no quorum) and
    // SG_RAW has no leader until that node is back. With the leader alone killed, the
    // window was whatever the survivors took to elect, and under full-suite load the
    // probe (one small request at a time, in a process sharing two cores with three
    // servers and the CLI runs) at times had no request in it and saw no 503.
    let held = (0..env.cluster.len())
        .find(|&i| i != victim)
        .expect("a second node");
    let refused_before = refused.load(Ordering::Relaxed);
    env.cluster.kill(victim);
    env.cluster.kill(held);
    let killed_at = Instant::now();
    wait_for(
        "an HTTP ingest refused while SG_RAW has no quorum",
        SETTLE,
        || refused.load(Ordering::Relaxed) > refused_before,
    )
    .await;
    let held_for = killed_at.elapsed();
    // Two of three again: the election can end, on the survivor or the restarted node.
    env.cluster.restart(held);
    // SETTLE, not `patience`: the restarted node recovers its store first, and the
    // survivor's next campaign may be a whole election timeout away.
    let leader = env.cluster.stream_leader(&env.js, RAW_STREAM, SETTLE).await;
    assert_ne!(leader, victim, "SG_RAW still led by the killed node");
    let elected = killed_at.elapsed();
    // Ingest goes on through the new leader before the load stops.
    let accepted_at_election = accepted.load(Ordering::Relaxed);
    wait_for(
        "an HTTP ingest accepted after the new leader was elected",
        SETTLE,
        || accepted.load(Ordering::Relaxed) > accepted_at_election,
    )
    .await;
    stop.cancel();
    let runs = tokio::time::timeout(SETTLE + SETTLE, cli)
        .await
        .expect("CLI runs did not end in time")
        .expect("CLI driver");
    let probe = probe.await.expect("HTTP probe");

    let failed: Vec<_> = runs.iter().filter(|(_, ok, _)| !ok).collect();
    assert!(failed.is_empty(), "CLI runs failed: {failed:#?}");
    let retried = runs
        .iter()
        .filter(|(_, _, err)| err.contains("retrying"))
        .count();
    for (run, _, err) in &runs {
        assert!(
            err.matches("retrying for up to").count() <= 1,
            "{run}: the retry notice is said once: {err}"
        );
    }
    let bad: Vec<_> = probe
        .failed
        .iter()
        .filter(|(code, after)| *code != 503 || after.is_none())
        .collect();
    assert!(
        bad.is_empty(),
        "HTTP answers other than 503 + Retry-After: {bad:?}"
    );
    assert!(
        !probe.failed.is_empty(),
        "no HTTP 503 seen during the election (it took {elected:?})"
    );
    let (bytes, _) = chunks();
    let ids: Vec<String> = runs.iter().map(|(r, _, _)| r.clone()).collect();
    assert_archived(&*env.store, &ids, &bytes, "ingest through an election").await;
    eprintln!(
        "killed n{victim} (n{held} down for {held_for:?}, until an HTTP ingest was refused): \
         new SG_RAW leader after {elected:?}; {} CLI runs all landed, {retried} of them \
         retried; HTTP: {} ok, {} answered 503 + Retry-After; total {:?}",
        runs.len(),
        probe.ok,
        probe.failed.len(),
        t0.elapsed()
    );
}

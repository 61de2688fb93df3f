//! Shared helpers of the end-to-end tests: captures and their reference output, a whole
//! pipeline in-process or as killable child processes, ingest, and archive reads.
#![allow(dead_code)]

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use streamgate_archive::{ArchivedEvent, RunStatusKind, Store};
use streamgate_archiver::{ArchiverListen, ConsumerConfig};
use streamgate_bus::raw::{publish_raw_with, CloseKind, RawChunk};
use streamgate_bus::subject::RunAddr;
use streamgate_bus::{DEFAULT_PARTITIONS, EVENTS_STREAM, RAW_STREAM};
use streamgate_normalizer::ingest::{Ingestor, RunSpec};
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_proto::v1::archive_service_client::ArchiveServiceClient;
use streamgate_runtime::rpc::SendBearer;
pub use streamgate_testkit::wait_until;
use streamgate_testkit::{NatsServer, PgDatabase};
use streamgate_wire::{normalize_bytes, Close, FamilyChoice, Normalizer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Tenant of every test run.
pub const TENANT: &str = "e2e";
/// Upper bound for anything the pipeline should do "soon" on a loaded CI box. Tests poll
/// and normally finish far sooner.
pub const PATIENCE: Duration = Duration::from_secs(90);
/// Operator token of the in-process and child archivers.
pub const TOKEN: &str = "e2e-operator-token";

// ---------------------------------------------------------------------------------------
// captures and reference output
// ---------------------------------------------------------------------------------------

/// One capture to push through the pipeline.
#[derive(Debug, Clone)]
pub struct Case {
    /// Where it comes from (for messages).
    pub name: String,
    /// Wire family id (`f1`, …).
    pub family: String,
    /// The provider bytes.
    pub bytes: Vec<u8>,
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_index(index: &Path, base: &Path, origin: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(index)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", index.display()));
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            assert!(cols.len() >= 3, "bad row in {}: {line:?}", index.display());
            let path = base.join(cols[2]);
            Case {
                name: format!("{origin}: {}", cols[0]),
                family: cols[1].to_owned(),
                bytes: std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())),
            }
        })
        .collect()
}

/// Every own fixture (`fixtures/*/index.tsv`) and, when `$STREAMGATE_CORPUS` is set,
/// every row of the shared corpus.
pub fn all_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let fixtures = root().join("fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .expect("fixtures dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("index.tsv").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        out.extend(read_index(&dir.join("index.tsv"), &dir, "fixture"));
    }
    if let Some(corpus) = std::env::var_os("STREAMGATE_CORPUS").filter(|c| !c.is_empty()) {
        let corpus = PathBuf::from(corpus);
        out.extend(read_index(&corpus.join("index.tsv"), &corpus, "corpus"));
    }
    out
}

/// A fixture by path under `fixtures/`.
pub fn fixture(path: &str) -> Vec<u8> {
    let p = root().join("fixtures").join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The family as the normalizer parses it.
pub fn choice(family: &str) -> FamilyChoice {
    family
        .parse()
        .unwrap_or_else(|e| panic!("family {family:?}: {e}"))
}

/// What `streamgate normalize` prints for a capture, as JSON values.
pub fn expected(family: &str, bytes: &[u8]) -> Vec<Value> {
    normalize_bytes(choice(family), bytes, 0)
        .events
        .iter()
        .map(|e| serde_json::to_value(e).expect("event to JSON"))
        .collect()
}

/// The reference output of a run fed `bytes` and then closed with `close`.
pub fn expected_closed(family: &str, bytes: &[u8], close: Close) -> Vec<Value> {
    let mut n = Normalizer::new(choice(family));
    n.feed(bytes);
    let mut out: Vec<Value> = n
        .drain()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    n.close(close);
    out.extend(n.drain().map(|e| serde_json::to_value(e).unwrap()));
    out
}

/// The seed of this test's randomness: `$E2E_SEED`, else a fresh one. Printed so that a
/// failing run can be reproduced.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("E2E_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed} (reproduce with E2E_SEED={seed})");
    seed
}

/// A seeded RNG.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Splits `bytes` into chunks of random sizes in `1..=max`.
pub fn split(bytes: &[u8], rng: &mut StdRng, max: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let n = rng.random_range(1..=max.max(1));
        let end = (pos + n).min(bytes.len());
        out.push(Bytes::copy_from_slice(&bytes[pos..end]));
        pos = end;
    }
    out
}

// ---------------------------------------------------------------------------------------
// ingest
// ---------------------------------------------------------------------------------------

/// The run spec of a test run.
pub fn spec(run: &str, family: &str) -> RunSpec {
    RunSpec::new(TENANT, run, Some(&format!("session-{run}")), family, None).unwrap()
}

/// Lands one chunk, retrying while the broker is unreachable (tests kill it on purpose).
pub async fn put(
    ingestor: &Ingestor,
    spec: &RunSpec,
    index: u64,
    body: Bytes,
    close: Option<CloseKind>,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match ingestor.put(spec, index, body.clone(), close, None).await {
            Ok(_) => return,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "run {}: chunk {index} not accepted: {e}",
                    spec.run_id
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Lands `chunks[from..to]` (indices `from..to`), in order.
pub async fn put_range(
    ingestor: &Ingestor,
    spec: &RunSpec,
    chunks: &[Bytes],
    from: usize,
    to: usize,
) {
    for (i, c) in chunks.iter().enumerate().take(to).skip(from) {
        put(ingestor, spec, i as u64, c.clone(), None).await;
    }
}

/// Lands every chunk and the normal close marker.
pub async fn put_run(ingestor: &Ingestor, spec: &RunSpec, chunks: &[Bytes]) {
    put_range(ingestor, spec, chunks, 0, chunks.len()).await;
    put(
        ingestor,
        spec,
        chunks.len() as u64,
        Bytes::new(),
        Some(CloseKind::Normal),
    )
    .await;
}

/// Ingests every run at once, each `(run id, capture, chunks)` under its own spec.
pub async fn put_runs(ingestor: &Ingestor, runs: &[(String, Case, Vec<Bytes>)]) {
    futures::future::join_all(runs.iter().map(|(run, case, chunks)| async move {
        put_run(ingestor, &spec(run, &case.family), chunks).await
    }))
    .await;
}

/// The raw messages `put_run` would store, as values (to re-publish identical ones).
pub fn raw_chunks(spec: &RunSpec, chunks: &[Bytes], ts_ms: i64) -> Vec<RawChunk> {
    let addr = RunAddr::parse(&spec.tenant, &spec.run_id, DEFAULT_PARTITIONS).unwrap();
    let mut out: Vec<RawChunk> = chunks
        .iter()
        .enumerate()
        .map(|(i, b)| RawChunk {
            addr: addr.clone(),
            session_key: spec.session_key.clone().map(String::from),
            family: spec.family.clone(),
            dialect: None,
            chunk: i as u64,
            ingest_ts_ms: ts_ms,
            close: None,
            body: b.clone(),
        })
        .collect();
    out.push(RawChunk {
        addr,
        session_key: spec.session_key.clone().map(String::from),
        family: spec.family.clone(),
        dialect: None,
        chunk: chunks.len() as u64,
        ingest_ts_ms: ts_ms,
        close: Some(CloseKind::Normal),
        body: Bytes::new(),
    });
    out
}

/// Publishes raw messages through the bus crate; returns how many JetStream called
/// duplicates.
pub async fn publish_all(js: &async_nats::jetstream::Context, raws: &[RawChunk]) -> usize {
    let mut dup = 0;
    for r in raws {
        if publish_raw_with(js, r, None)
            .await
            .expect("publish raw")
            .duplicate
        {
            dup += 1;
        }
    }
    dup
}

/// Publishes raw messages WITHOUT `Nats-Msg-Id`: what a producer retrying after the
/// dedupe window looks like to the broker (every copy is stored again).
pub async fn publish_without_msg_id(js: &async_nats::jetstream::Context, raws: &[RawChunk]) {
    for r in raws {
        let mut headers = async_nats::HeaderMap::new();
        for (name, values) in r.headers().iter() {
            if name.to_string().eq_ignore_ascii_case("Nats-Msg-Id") {
                continue;
            }
            for v in values {
                headers.insert(name.clone(), v.clone());
            }
        }
        js.publish_with_headers(r.addr.raw_subject(), headers, r.body.clone())
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }
}

// ---------------------------------------------------------------------------------------
// archive
// ---------------------------------------------------------------------------------------

/// The archived events as golden JSON values.
pub fn as_json(events: &[ArchivedEvent]) -> Vec<Value> {
    events
        .iter()
        .map(|e| serde_json::to_value(&e.event.event).expect("event to JSON"))
        .collect()
}

/// Waits until `run` (of [`TENANT`]) has its terminal event archived and at least `want`
/// events, then returns every archived event of the run.
pub async fn wait_run(
    store: &dyn Store,
    run: &str,
    want: usize,
    patience: Duration,
) -> Vec<ArchivedEvent> {
    wait_run_in(store, TENANT, run, want, patience).await
}

/// [`wait_run`] for the run `run` of `tenant`.
pub async fn wait_run_in(
    store: &dyn Store,
    tenant: &str,
    run: &str,
    want: usize,
    patience: Duration,
) -> Vec<ArchivedEvent> {
    let deadline = Instant::now() + patience;
    loop {
        let rec = store.get_run(tenant, run).await.expect("get_run");
        if let Some(r) = &rec {
            if r.status != RunStatusKind::Open && r.event_count as usize >= want {
                return store
                    .events_after(tenant, run, 0, 0)
                    .await
                    .expect("events_after");
            }
        }
        assert!(
            Instant::now() < deadline,
            "run {tenant}/{run} not complete in the archive after {patience:?} (want {want} events); runs row: {rec:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the archive holds at least `n` events of `run`.
pub async fn wait_some(store: &dyn Store, run: &str, n: u64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let rec = store.get_run(TENANT, run).await.expect("get_run");
        if rec.as_ref().is_some_and(|r| r.event_count >= n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {run}: fewer than {n} events archived after {PATIENCE:?}: {rec:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts the archive holds exactly the reference events, seq 1..=n, once each, with the
/// run's envelope.
pub fn assert_archive_eq(run: &str, got: &[ArchivedEvent], want: &[Value], ctx: &str) {
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.event.event.seq, i as u64 + 1, "{ctx}: run {run}: seqs");
        assert_eq!(e.event.envelope.run_id, run, "{ctx}: run id");
        assert_eq!(e.event.envelope.tenant, TENANT, "{ctx}: tenant");
        assert_eq!(
            e.event.envelope.session_key.as_deref(),
            Some(format!("session-{run}").as_str()),
            "{ctx}: session key"
        );
    }
    let got = as_json(got);
    if let Some(i) = (0..got.len().min(want.len())).find(|&i| got[i] != want[i]) {
        panic!(
            "{ctx}: run {run}: event {} differs\n archived: {}\n expected: {}",
            i + 1,
            got[i],
            want[i]
        );
    }
    assert_eq!(
        got.len(),
        want.len(),
        "{ctx}: run {run}: archived {} events, normalize prints {}",
        got.len(),
        want.len()
    );
}

/// Waits until a durable consumer exists (its service is consuming): `durable` itself or,
/// for the normalizer's partitions, an incarnation of it (`streamgate_bus::incarnation`).
pub async fn wait_consumer(js: &async_nats::jetstream::Context, stream: &str, durable: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if current_consumer(js, stream, durable).await.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "consumer {durable} on {stream} never appeared"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The consumer serving `durable` now (itself or its newest incarnation), if any.
pub async fn current_consumer(
    js: &async_nats::jetstream::Context,
    stream: &str,
    durable: &str,
) -> Option<async_nats::jetstream::consumer::Info> {
    streamgate_bus::incarnation::current(js, stream, durable)
        .await
        .ok()
        .flatten()
}

/// The normalizer's durable consumers, one per partition (`sg-normalizer-pNN`, each
/// served by an incarnation of its own).
pub fn normalizer_durables(prefix: &str) -> Vec<String> {
    (0..DEFAULT_PARTITIONS)
        .map(|p| streamgate_bus::subject::partition_durable(prefix, DEFAULT_PARTITIONS, p))
        .collect()
}

/// The consumers serving each normalizer partition now, by partition (one each once
/// the owners settled: a new owner deletes the ones before it).
pub async fn normalizer_incarnations(
    js: &async_nats::jetstream::Context,
) -> Vec<Vec<async_nats::jetstream::consumer::Info>> {
    let stream = js.get_stream(RAW_STREAM).await.expect("SG_RAW");
    let mut out = Vec::new();
    for base in normalizer_durables("sg-normalizer") {
        let list = streamgate_bus::incarnation::list(&stream, &base)
            .await
            .expect("list consumers");
        out.push(list);
    }
    out
}

/// Waits until each normalizer partition has exactly one consumer — for the partitions
/// in `made_after.0`, one created after `made_after.1` (by a replica started then; until
/// it made its own, the one its partitions' last owner left is there) — and returns
/// their names.
pub async fn settled_normalizer_incarnations(
    js: &async_nats::jetstream::Context,
    made_after: (&BTreeSet<u32>, SystemTime),
) -> Vec<String> {
    let (newer, since) = made_after;
    let since = since
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i128;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = normalizer_incarnations(js).await;
        let settled = now.iter().enumerate().all(|(p, list)| {
            list.len() == 1
                && (!newer.contains(&(p as u32)) || list[0].created.unix_timestamp_nanos() > since)
        });
        let names: Vec<Vec<String>> = now
            .iter()
            .map(|list| list.iter().map(|c| c.name.clone()).collect())
            .collect();
        if settled {
            return names.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "normalizer partitions never settled on one consumer each: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the normalizer consumes every partition (each partition's durable
/// consumer exists, created by the replica holding its lease).
pub async fn wait_normalizer(js: &async_nats::jetstream::Context, prefix: &str) {
    for durable in normalizer_durables(prefix) {
        wait_consumer(js, RAW_STREAM, &durable).await;
    }
}

/// Waits until a projector channel consumes every partition (each partition's durable
/// consumer `sg-projector-<channel>-pNN` exists).
pub async fn wait_projector(js: &async_nats::jetstream::Context, channel: &str) {
    let cfg = streamgate_projector::ChannelConfig::new(
        channel,
        streamgate_projector::ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    for p in 0..cfg.partitions {
        wait_consumer(js, EVENTS_STREAM, &cfg.partition_durable(p)).await;
    }
}

/// Waits until both services have consumed and acknowledged everything on the bus.
pub async fn wait_quiet(js: &async_nats::jetstream::Context) {
    let deadline = Instant::now() + PATIENCE;
    let mut stable = 0;
    let mut consumers: Vec<(&str, String)> = normalizer_durables("sg-normalizer")
        .into_iter()
        .map(|d| (RAW_STREAM, d))
        .collect();
    consumers.push((EVENTS_STREAM, "sg-archiver".to_owned()));
    loop {
        let mut idle = true;
        for (stream, durable) in &consumers {
            let info = current_consumer(js, stream, durable)
                .await
                .expect("consumer info");
            idle &= info.num_pending == 0 && info.num_ack_pending == 0;
        }
        // Twice in a row: the normalizer's publishes land on SG_EVENTS before it acks.
        stable = if idle { stable + 1 } else { 0 };
        if stable >= 3 {
            return;
        }
        assert!(Instant::now() < deadline, "pipeline never went quiet");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An ArchiveService client with the given bearer token (or none).
pub async fn archive_client(
    addr: SocketAddr,
    token: Option<&str>,
) -> ArchiveServiceClient<InterceptedService<Channel, SendBearer>> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the ArchiveService");
    ArchiveServiceClient::with_interceptor(channel, SendBearer::new(token))
        .max_decoding_message_size(64 << 20)
}

// ---------------------------------------------------------------------------------------
// the pipeline in one process
// ---------------------------------------------------------------------------------------

/// Archive backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite file in a temp dir.
    Sqlite,
    /// A fresh PostgreSQL database.
    Postgres,
}

/// A store for a test: its URL, plus what keeps it alive.
pub struct TestStore {
    /// `sqlite://…` or `postgres://…`.
    pub url: String,
    _dir: tempfile::TempDir,
    _pg: Option<PgDatabase>,
}

impl TestStore {
    /// A fresh, empty store.
    pub async fn new(backend: Backend) -> TestStore {
        let dir = tempfile::tempdir().expect("temp dir");
        let (url, pg) = match backend {
            Backend::Sqlite => (
                format!("sqlite://{}", dir.path().join("archive.db").display()),
                None,
            ),
            Backend::Postgres => {
                let db = PgDatabase::create().await;
                (db.url().to_owned(), Some(db))
            }
        };
        TestStore {
            url,
            _dir: dir,
            _pg: pg,
        }
    }

    /// Opens it.
    pub async fn open(&self) -> Arc<dyn Store> {
        streamgate_archive::open_store(&self.url)
            .await
            .unwrap_or_else(|e| panic!("open store {}: {e}", self.url))
    }
}

/// nats-server + normalizer + archiver, the services in this process.
pub struct Pipeline {
    /// The broker (killable).
    pub nats: NatsServer,
    /// JetStream on a reconnecting client.
    pub js: async_nats::jetstream::Context,
    /// The NATS front door.
    pub ingestor: Ingestor,
    /// The archive the archiver writes.
    pub store: Arc<dyn Store>,
    /// gRPC IngestService.
    pub ingest_grpc: SocketAddr,
    /// gRPC ArchiveService.
    pub archive_grpc: SocketAddr,
    normalizer_cfg: NormalizerConfig,
    normalizer_stop: CancellationToken,
    normalizer: Option<tokio::task::JoinSet<anyhow::Result<()>>>,
    normalizer_partitions: Option<watch::Receiver<BTreeSet<u32>>>,
    archiver_stop: CancellationToken,
    _archiver: tokio::task::JoinSet<anyhow::Result<()>>,
    _store: TestStore,
}

impl Pipeline {
    /// Starts everything with default settings.
    pub async fn start(backend: Backend) -> Pipeline {
        Self::start_with(backend, NormalizerConfig::default()).await
    }

    /// Starts everything with these normalizer settings.
    pub async fn start_with(backend: Backend, cfg: NormalizerConfig) -> Pipeline {
        let nats = NatsServer::start();
        let client = nats.client().await;
        let js = async_nats::jetstream::new(client.clone());
        let test_store = TestStore::new(backend).await;
        let store = test_store.open().await;
        let archiver_stop = CancellationToken::new();
        let archiver = streamgate_archiver::start(
            client.clone(),
            store.clone(),
            ConsumerConfig::default(),
            ArchiverListen {
                grpc: Some("127.0.0.1:0".parse().unwrap()),
                operator_token: TOKEN.into(),
                partitions: DEFAULT_PARTITIONS,
                ..Default::default()
            },
            archiver_stop.clone(),
        )
        .await
        .expect("start archiver");
        let mut p = Pipeline {
            ingestor: Ingestor::new(js.clone(), DEFAULT_PARTITIONS),
            js,
            nats,
            store,
            ingest_grpc: "127.0.0.1:0".parse().unwrap(),
            archive_grpc: archiver.grpc.expect("archive gRPC address"),
            normalizer_cfg: cfg,
            normalizer_stop: CancellationToken::new(),
            normalizer: None,
            normalizer_partitions: None,
            archiver_stop,
            _archiver: archiver.tasks,
            _store: test_store,
        };
        p.start_normalizer().await;
        wait_normalizer(&p.js, &p.normalizer_cfg.durable).await;
        wait_consumer(&p.js, EVENTS_STREAM, "sg-archiver").await;
        p
    }

    async fn start_normalizer(&mut self) {
        self.normalizer_stop = CancellationToken::new();
        let running = streamgate_normalizer::start(
            self.nats.client().await,
            self.normalizer_cfg.clone(),
            Listeners {
                grpc: Some("127.0.0.1:0".parse().unwrap()),
                http: None,
                ingest_token: None,
                partitions: DEFAULT_PARTITIONS,
                ..Default::default()
            },
            self.normalizer_stop.clone(),
        )
        .await
        .expect("start normalizer");
        self.ingest_grpc = running.grpc.expect("ingest gRPC address");
        self.normalizer = Some(running.tasks);
        self.normalizer_partitions = Some(running.partitions);
    }

    /// The partitions the pipeline's own normalizer holds right now.
    pub fn normalizer_partitions(&self) -> BTreeSet<u32> {
        self.normalizer_partitions
            .as_ref()
            .map(|p| p.borrow().clone())
            .unwrap_or_default()
    }

    /// The normalizer settings the pipeline was started with.
    pub fn normalizer_config(&self) -> &NormalizerConfig {
        &self.normalizer_cfg
    }

    /// Stops the normalizer gracefully (drain) and starts a fresh one: every in-memory
    /// run is forgotten.
    pub async fn restart_normalizer(&mut self) {
        self.normalizer_stop.cancel();
        if let Some(mut tasks) = self.normalizer.take() {
            while let Some(r) = tasks.join_next().await {
                r.expect("normalizer task").expect("normalizer task result");
            }
        }
        self.start_normalizer().await;
    }
}

/// One more normalizer replica in this process (the worker only: no front doors).
pub struct NormalizerReplica {
    /// Its member id in the `normalizer` lease group.
    pub member: String,
    partitions: watch::Receiver<BTreeSet<u32>>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<anyhow::Result<()>>,
}

impl NormalizerReplica {
    /// Starts a replica on its own client.
    pub async fn start(nats: &NatsServer, cfg: NormalizerConfig) -> NormalizerReplica {
        let stop = CancellationToken::new();
        let running = streamgate_normalizer::start(
            nats.client().await,
            cfg,
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
        .expect("start normalizer replica");
        NormalizerReplica {
            member: running.member,
            partitions: running.partitions,
            stop,
            tasks: running.tasks,
        }
    }

    /// The partitions it holds right now.
    pub fn held(&self) -> BTreeSet<u32> {
        self.partitions.borrow().clone()
    }

    /// Graceful stop: every partition drains and its lease is released.
    pub async fn stop(mut self) {
        self.stop.cancel();
        while let Some(r) = self.tasks.join_next().await {
            r.expect("normalizer task").expect("normalizer task result");
        }
    }

    /// A crash: every task aborted, nothing released (the leases run out by TTL).
    pub async fn crash(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Owner (member id) of each partition lease of `group` in `SG_LEASES`.
pub async fn lease_owners(
    js: &async_nats::jetstream::Context,
    group: &str,
) -> std::collections::BTreeMap<u32, String> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(kv) = js.get_key_value(streamgate_bus::lease::LEASE_BUCKET).await else {
        return out;
    };
    for p in 0..DEFAULT_PARTITIONS {
        let key = streamgate_bus::lease::partition_key(group, DEFAULT_PARTITIONS, p);
        if let Ok(Some(v)) = kv.get(key).await {
            out.insert(p, String::from_utf8_lossy(&v).into_owned());
        }
    }
    out
}

/// Redeliveries each normalizer partition consumer counts (0 everywhere: every raw
/// message was taken once, by the replica holding its partition).
pub async fn normalizer_redeliveries(js: &async_nats::jetstream::Context) -> u64 {
    let mut total = 0;
    for durable in normalizer_durables("sg-normalizer") {
        let info = current_consumer(js, RAW_STREAM, &durable)
            .await
            .expect("consumer info");
        total += info.num_redelivered as u64;
    }
    total
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.normalizer_stop.cancel();
        self.archiver_stop.cancel();
    }
}

// ---------------------------------------------------------------------------------------
// services as child processes
// ---------------------------------------------------------------------------------------

/// The `streamgate` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_streamgate"))
}

/// A `streamgate <subcommand>` child process that can be SIGKILLed and started again with
/// the same flags. Killed on drop.
pub struct Service {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Service {
    /// Starts `streamgate <args…>` with its output in `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, args: &[String], log_dir: &Path) -> Service {
        let mut s = Service {
            name: name.into(),
            args: args.to_vec(),
            log: log_dir.join(format!("{name}.log")),
            child: None,
        };
        s.start();
        s
    }

    /// Starts it (again).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("service log");
        let child = Command::new(bin())
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.name));
        self.child = Some(child);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Panics (with the log) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("{} exited with {status}:\n{}", self.name, self.log_text());
            }
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The process output so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Flags of a child normalizer.
pub fn normalizer_args(nats_url: &str, idle_timeout_secs: u64) -> Vec<String> {
    [
        "normalizer",
        "--nats",
        nats_url,
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--idle-timeout-secs",
        &idle_timeout_secs.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// Flags of a child archiver.
pub fn archiver_args(nats_url: &str, archive_url: &str) -> Vec<String> {
    [
        "archiver",
        "--nats",
        nats_url,
        "--archive",
        archive_url,
        "--grpc",
        "127.0.0.1:0",
        "--operator-token",
        TOKEN,
    ]
    .map(String::from)
    .to_vec()
}

/// nats-server in-process-owned, normalizer and archiver as child processes.
pub struct ProcPipeline {
    /// The broker (killable).
    pub nats: NatsServer,
    /// JetStream on a reconnecting client.
    pub js: async_nats::jetstream::Context,
    /// The NATS front door.
    pub ingestor: Ingestor,
    /// A reader of the archive the child archiver writes.
    pub store: Arc<dyn Store>,
    /// `streamgate normalizer`.
    pub normalizer: Service,
    /// `streamgate archiver`.
    pub archiver: Service,
    _store: TestStore,
    _logs: tempfile::TempDir,
}

impl ProcPipeline {
    /// Starts the broker, provisions the streams, starts both services and waits until
    /// they consume.
    pub async fn start(backend: Backend) -> ProcPipeline {
        let (nats, js) = NatsServer::with_streams().await;
        let test_store = TestStore::new(backend).await;
        let logs = tempfile::tempdir().expect("log dir");
        let archiver = Service::spawn(
            "archiver",
            &archiver_args(&nats.url(), &test_store.url),
            logs.path(),
        );
        let normalizer = Service::spawn(
            "normalizer",
            &normalizer_args(&nats.url(), 600),
            logs.path(),
        );
        wait_normalizer(&js, "sg-normalizer").await;
        // The archiver has run the migrations once its consumer exists.
        wait_consumer(&js, EVENTS_STREAM, "sg-archiver").await;
        let store = test_store.open().await;
        ProcPipeline {
            ingestor: Ingestor::new(js.clone(), DEFAULT_PARTITIONS),
            js,
            nats,
            store,
            normalizer,
            archiver,
            _store: test_store,
            _logs: logs,
        }
    }

    /// Both services' logs, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- normalizer ---\n{}\n--- archiver ---\n{}",
            tail(&self.normalizer.log_text(), 40),
            tail(&self.archiver.log_text(), 40)
        )
    }
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A child (e.g. `streamgate up`) stopped with SIGINT on drop so that it can take its own
/// children down, and SIGKILLed if it does not exit in time.
pub struct Graceful(pub Child);

impl Graceful {
    /// SIGINT, then wait up to `patience` (SIGKILL after that).
    pub fn stop(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.0.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        None
    }
}

impl Drop for Graceful {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.stop(Duration::from_secs(10));
        }
    }
}

// ---------------------------------------------------------------------------------------
// a webhook channel in front of the pipeline
// ---------------------------------------------------------------------------------------

/// A webhook projector channel on the pipeline's bus, delivering to a fake receiver that
/// dedupes on `Idempotency-Key` as a real one would; consuming once this returns. Cancel
/// the token to stop it.
pub struct WebhookChannel {
    pub fake: streamgate_sinks::fakes::FakeServer,
    pub stop: tokio_util::sync::CancellationToken,
    pub projector: streamgate_projector::Running,
}

impl WebhookChannel {
    pub async fn start(p: &Pipeline, channel: &str, secret: &str) -> WebhookChannel {
        use streamgate_projector::{ChannelConfig, ChannelSink};
        use streamgate_sinks::{fakes, webhook, SinkConfig};
        let fake = fakes::FakeServer::webhook(secret, fakes::Behavior::default())
            .await
            .expect("fake webhook receiver");
        let mut cfg = ChannelConfig::new(
            channel,
            ChannelSink::Sink(SinkConfig::Webhook(webhook::WebhookConfig::new(
                channel,
                fake.base_url.clone(),
                secret,
            ))),
        );
        cfg.delivery.retry_base = Duration::from_millis(50);
        cfg.delivery.retry_max = Duration::from_millis(500);
        let stop = tokio_util::sync::CancellationToken::new();
        let projector = streamgate_projector::start(p.nats.client().await, cfg, None, stop.clone())
            .await
            .expect("start projector");
        wait_projector(&p.js, channel).await;
        WebhookChannel {
            fake,
            stop,
            projector,
        }
    }
}

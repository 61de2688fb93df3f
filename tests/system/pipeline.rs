//! End-to-end acceptance tests of the streamgate pipeline: provider bytes → NATS JetStream
//! `SG_RAW` → normalizer → `SG_EVENTS` → archiver (SQLite or PostgreSQL) → operator gRPC
//! replay. Everything is real: a `nats-server` per test (file store), a PostgreSQL
//! database per test, the services either in this process or as `streamgate` child
//! processes that are SIGKILLed on purpose. What each test proves:
//!
//! - `every_capture_is_archived_as_normalized_{sqlite,postgres}`: every own fixture and
//!   every shared-corpus capture (`$STREAMGATE_CORPUS`), ingested through NATS in random
//!   chunk sizes (seeded; the seed is printed), many runs at once, ends in the archive
//!   exactly equal (seq, stream, data as JSON values) to what `streamgate normalize`
//!   prints for the capture — on both archive backends.
//! - `evicted_runs_are_rebuilt_exactly`: with more runs in flight than the normalizer
//!   keeps in memory (`max_open_runs`), runs are evicted and rebuilt from `SG_RAW` again
//!   and again, and still archive exactly as normalized.
//! - `duplicate_ingest_changes_nothing`: a closed run's identical raw messages published
//!   again (inside the dedupe window; without message ids, as after the window; to a
//!   restarted normalizer that forgot the run) and re-sent through the gRPC
//!   IngestService from chunk 0 add no event: every gRPC ack says duplicate, the archive
//!   rows are unchanged, and re-inserting the archived batch is counted as duplicates
//!   with no conflict.
//! - `late_duplicates_do_not_reopen_a_closed_run`: late copies of a closed run's middle
//!   chunks (after the dedupe window) reaching a restarted normalizer leave SG_RAW with
//!   one close marker and the archive without conflicts (docs/architecture.md §3: nothing relies
//!   on the dedupe window).
//! - `normalizer_sigkill_mid_run`, `archiver_sigkill_mid_batch_{sqlite,postgres}`,
//!   `nats_server_killed_mid_run`: a large run is ingested while the normalizer process,
//!   the archiver process or nats-server is SIGKILLed after the first events were
//!   archived and started again; the archive ends complete, equal to the normalize
//!   output, every seq exactly once. (After an archiver or normalizer SIGKILL, what the
//!   dead process held unacknowledged comes back only after the consumers' 30 s ack wait;
//!   the archiver tests therefore take ~30 s.)
//! - `events_the_broker_refused_are_published_again`: SG_EVENTS refuses new messages for
//!   a while (full, `discard: new`) while 96 runs are ingested one after another; the
//!   failed batches come again from a new consumer incarnation and every run still
//!   archives exactly as normalized, each seq once.
//! - `abandoned_run_is_closed_once_by_timeout`: a run whose producer vanishes (no close
//!   marker) gets exactly one terminal event, `lifecycle/error` with reason
//!   `stream_closed`; the timeout close marker is in `SG_RAW`, so replaying the raw chunks
//!   reproduces the archived run.
//! - `follow_replay_is_gapless_while_ingesting`: `ReplayEvents` with `follow`, started
//!   while the run is still open (from seq 0 and from a seq in the middle), delivers every
//!   later seq exactly once, in order, ending with the terminal event.
//! - `answer_deltas_are_archived_before_the_usage_frame`: F1 and F3 thinking captures
//!   ingested up to (not including) the usage frame already have every answer delta in
//!   the archive while the run is open (no event waits for the thinking-token count);
//!   after the rest, the archived run folded to the batch form equals its golden.
//! - `archive_requires_the_operator_token`: every ArchiveService RPC without a token or
//!   with a wrong one is `UNAUTHENTICATED`; run ids breaking the id rule are
//!   `INVALID_ARGUMENT` and leave the archiver serving.
//! - `archiver_start_keeps_the_deployment_stream_settings`: starting the archiver does
//!   not reset the stream settings (limits, dedupe window) the deployment provisioned.
//! - `longest_ids_reach_a_channel`: a run whose tenant, run id and session are each the
//!   longest the id rule allows (256 bytes, every byte escaped in subjects and KV keys)
//!   is archived and its final answer delivered by a projector channel (its delivery
//!   state in `SG_DELIVERY` says so): every derived key stays inside NATS' limits.
//! - `raw_messages_breaking_the_id_rule_are_terminated`: raw messages published straight
//!   to NATS with a control character, an empty id or a 257-byte id in their subject or
//!   session are terminated by the normalizer: no event, no stuck consumer, and a good
//!   run of the same partition behind them is archived.
//! - `up_demo_smoke`: `streamgate up --demo` (the README run command) with an old
//!   nats-server first on `PATH` and an empty cache exits 0 and prints every demo run's
//!   final answer.
//! - `up_ingest_replay_cli`: `streamgate up`, then `streamgate ingest` and
//!   `streamgate replay --json` found through the data dir's `up.json`, print the same
//!   events as `streamgate normalize`.

use crate::common;

use bytes::Bytes;
use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};
use streamgate_archive::{InsertOutcome, RunStatusKind};
use streamgate_bus::raw::CloseKind;
use streamgate_bus::{StreamSettings, DEFAULT_PARTITIONS, EVENTS_STREAM};
use streamgate_normalizer::NormalizerConfig;
use streamgate_proto::v1;
use streamgate_proto::v1::ingest_service_client::IngestServiceClient;
use streamgate_testkit::NatsServer;
use streamgate_wire::Close;
use tonic::Code;

// ---------------------------------------------------------------------------------------
// 1. every capture, through NATS, equals the offline normalizer
// ---------------------------------------------------------------------------------------

async fn every_capture(backend: Backend) {
    let cases = all_cases();
    assert!(cases.len() >= 10, "only {} captures found", cases.len());
    through_nats(
        backend,
        cases,
        NormalizerConfig::default(),
        &[1, 7, 64, 512, 4096],
    )
    .await;
}

/// Ingests every case as its own run, all at once, in random chunks whose maximum size is
/// picked per run from `sizes`; checks each archived run against `normalize`.
async fn through_nats(backend: Backend, cases: Vec<Case>, cfg: NormalizerConfig, sizes: &[usize]) {
    let seed = seed("through_nats");
    let mut rng = rng(seed);
    let p = Pipeline::start_with(backend, cfg).await;
    let started = Instant::now();
    let runs: Vec<(String, Case, Vec<Bytes>)> = cases
        .into_iter()
        .enumerate()
        .map(|(i, case)| {
            // Chunk sizes from single bytes to whole frames, capped so no run needs more
            // than ~1500 publishes.
            let max = sizes[rand::Rng::random_range(&mut rng, 0..sizes.len())]
                .max(case.bytes.len() / 1500);
            let chunks = split(&case.bytes, &mut rng, max);
            (format!("case-{i:03}"), case, chunks)
        })
        .collect();
    put_runs(&p.ingestor, &runs).await;
    for (run, case, chunks) in &runs {
        let want = expected(&case.family, &case.bytes);
        let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
        assert_archive_eq(
            run,
            &got,
            &want,
            &format!(
                "{} ({} chunks, seed {seed}, {backend:?})",
                case.name,
                chunks.len()
            ),
        );
    }
    eprintln!(
        "{} runs archived and checked in {:?} ({backend:?})",
        runs.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_capture_is_archived_as_normalized_sqlite() {
    every_capture(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_capture_is_archived_as_normalized_postgres() {
    every_capture(Backend::Postgres).await;
}

/// More runs in flight than the normalizer keeps in memory: runs are evicted and rebuilt
/// from SG_RAW over and over, and still archive exactly as normalized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_runs_are_rebuilt_exactly() {
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| c.name.starts_with("fixture"))
        .take(16)
        .collect();
    let cfg = NormalizerConfig {
        max_open_runs: 3,
        ..NormalizerConfig::default()
    };
    through_nats(Backend::Sqlite, cases, cfg, &[16, 64]).await;
}

// ---------------------------------------------------------------------------------------
// 2. duplicates
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_ingest_changes_nothing() {
    let seed = seed("duplicate_ingest_changes_nothing");
    let mut rng = rng(seed);
    let mut p = Pipeline::start(Backend::Sqlite).await;
    let bytes = fixture("f1/tool-use.sse");
    let want = expected("f1", &bytes);
    let chunks = split(&bytes, &mut rng, 96);
    let run = "dup-run";
    let sp = spec(run, "f1");
    let raws = raw_chunks(&sp, &chunks, 1_700_000_000_000);

    assert_eq!(publish_all(&p.js, &raws).await, 0, "first ingest");
    let first = wait_run(&*p.store, run, want.len(), PATIENCE).await;
    assert_archive_eq(run, &first, &want, &format!("first ingest, seed {seed}"));
    let row = p.store.get_run(TENANT, run).await.unwrap().unwrap();

    // The identical messages again: JetStream's dedupe window drops every one.
    assert_eq!(
        publish_all(&p.js, &raws).await,
        raws.len(),
        "every re-published raw message is a duplicate"
    );
    // As after the dedupe window: the broker stores the copies; the normalizer knows
    // the run is closed.
    publish_without_msg_id(&p.js, &raws).await;
    wait_quiet(&p.js).await;
    // A normalizer that never saw the run gets it all again from chunk 0.
    p.restart_normalizer().await;
    publish_without_msg_id(&p.js, &raws).await;
    wait_quiet(&p.js).await;

    // The gRPC front door, re-sent from chunk 0 with the close.
    let mut ingest = IngestServiceClient::connect(format!("http://{}", p.ingest_grpc))
        .await
        .expect("connect IngestService");
    let msgs: Vec<v1::IngestChunk> = raws
        .iter()
        .map(|r| v1::IngestChunk {
            tenant: TENANT.into(),
            run_id: run.into(),
            session_key: sp.session_key.clone().map(String::from),
            family: "f1".into(),
            dialect: None,
            chunk: r.chunk,
            body: r.body.to_vec(),
            close: r.close.map(|c| c.as_str().to_owned()),
        })
        .collect();
    let mut acks = ingest
        .ingest(futures::stream::iter(msgs.clone()))
        .await
        .expect("ingest call")
        .into_inner();
    let mut got_acks = Vec::new();
    while let Some(a) = acks.message().await.expect("ack stream") {
        got_acks.push(a);
    }
    assert_eq!(got_acks.len(), msgs.len(), "one ack per message");
    for a in &got_acks {
        assert!(a.duplicate, "re-sent chunk acknowledged as new: {a:?}");
        assert_eq!(a.stream_seq, 0, "re-sent chunk stored: {a:?}");
    }
    assert!(got_acks.last().unwrap().close, "last ack is the close");
    wait_quiet(&p.js).await;

    let after = p.store.events_after(TENANT, run, 0, 0).await.unwrap();
    assert_eq!(
        after, first,
        "archive rows changed by duplicates (seed {seed})"
    );
    let row_after = p.store.get_run(TENANT, run).await.unwrap().unwrap();
    assert_eq!(row_after, row, "runs row changed by duplicates");
    assert_eq!(row_after.event_count as usize, want.len());
    assert_eq!(p.store.conflicts_total(), 0, "conflicts");

    // The store itself: the whole batch again is all duplicates.
    let outcome = p.store.insert_batch(&first).await.unwrap();
    assert_eq!(
        outcome,
        InsertOutcome {
            inserted: 0,
            duplicates: first.len() as u64,
            conflicts: 0
        }
    );
    assert_eq!(
        p.store.events_after(TENANT, run, 0, 0).await.unwrap(),
        first
    );
}

/// docs/architecture.md §3: no step relies on JetStream's dedupe window. A restarted normalizer
/// that gets late copies of a closed run's middle chunks (after the window) must not treat the run
/// as open again: no timeout close marker, no second terminal event, no conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_duplicates_do_not_reopen_a_closed_run() {
    let seed = seed("late_duplicates_do_not_reopen_a_closed_run");
    let mut rng = rng(seed);
    let mut cfg = NormalizerConfig {
        idle_timeout: Duration::from_secs(1),
        idle_check: Duration::from_millis(100),
        ..NormalizerConfig::default()
    };
    // A short window stands for "long after the run closed".
    cfg.streams.duplicate_window = Duration::from_secs(1);
    let mut p = Pipeline::start_with(Backend::Sqlite, cfg).await;
    let bytes = fixture("f1/tool-use.sse");
    let want = expected("f1", &bytes);
    let chunks = split(&bytes, &mut rng, 96);
    assert!(chunks.len() >= 3);
    let run = "late-dup";
    let raws = raw_chunks(&spec(run, "f1"), &chunks, 1_700_000_000_000);
    publish_all(&p.js, &raws).await;
    let first = wait_run(&*p.store, run, want.len(), PATIENCE).await;
    assert_archive_eq(run, &first, &want, &format!("first ingest, seed {seed}"));

    p.restart_normalizer().await;
    // Past the dedupe window, then the middle chunks again (no chunk 0, no close). The
    // broker's window is a clock with nothing to poll: this sleep outlasts it (1 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(publish_all(&p.js, &raws[1..raws.len() - 1]).await, 0);
    // The late copies are consumed; then a negative window longer than the idle timeout:
    // a reaper that thinks the run is open fires in it.
    wait_quiet(&p.js).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_quiet(&p.js).await;

    let mut client = archive_client(p.archive_grpc, Some(TOKEN)).await;
    let mut raw = client
        .raw_chunks(v1::RawChunksRequest {
            run_id: run.into(),
            tenant: TENANT.into(),
        })
        .await
        .expect("RawChunks")
        .into_inner();
    let mut markers = Vec::new();
    while let Some(c) = raw.message().await.expect("raw stream") {
        if let Some(k) = c.close {
            markers.push(k);
        }
    }
    assert_eq!(markers, ["normal"], "close markers in SG_RAW (seed {seed})");
    assert_eq!(
        p.store.conflicts_total(),
        0,
        "conflicting events (seed {seed})"
    );
    assert_eq!(
        p.store.events_after(TENANT, run, 0, 0).await.unwrap(),
        first
    );
}

// ---------------------------------------------------------------------------------------
// 3. crashes
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Normalizer,
    Archiver,
    Nats,
}

/// A single run big enough that it is still in flight when the first events land.
fn big_capture() -> (&'static str, Vec<u8>) {
    let bytes = streamgate_wire::synth::inflate(&fixture("f2/deepseek-thinking.sse"), 384 * 1024);
    ("f2", bytes)
}

async fn crash_mid_run(backend: Backend, victim: Victim) {
    let seed = seed(&format!("crash {victim:?}"));
    let mut rng = rng(seed);
    let (family, bytes) = big_capture();
    let want = expected(family, &bytes);
    assert!(
        want.len() > 1000,
        "capture too small: {} events",
        want.len()
    );
    let chunks = split(&bytes, &mut rng, 4096);
    let mut p = ProcPipeline::start(backend).await;
    let run = "crash-run";
    let sp = spec(run, family);
    let third = chunks.len() / 3;
    let started = Instant::now();

    // The first third, then wait for the first archived events: the run is in flight.
    put_range(&p.ingestor, &sp, &chunks, 0, third).await;
    wait_some(&*p.store, run, 1).await;
    let before = p.store.get_run(TENANT, run).await.unwrap().unwrap();
    assert_eq!(before.status, RunStatusKind::Open);
    match victim {
        Victim::Normalizer => p.normalizer.kill(),
        Victim::Archiver => p.archiver.kill(),
        Victim::Nats => p.nats.kill(),
    }
    eprintln!(
        "killed {victim:?} with {} of {} events archived",
        before.event_count,
        want.len()
    );
    match victim {
        Victim::Nats => {
            // Let the services see the broken connection before the broker is back.
            tokio::time::sleep(Duration::from_millis(300)).await;
            p.nats.restart();
            put_range(&p.ingestor, &sp, &chunks, third, chunks.len()).await;
        }
        Victim::Normalizer | Victim::Archiver => {
            // The second third lands while the victim is down; the rest after.
            put_range(&p.ingestor, &sp, &chunks, third, 2 * third).await;
            match victim {
                Victim::Normalizer => p.normalizer.start(),
                _ => p.archiver.start(),
            }
            put_range(&p.ingestor, &sp, &chunks, 2 * third, chunks.len()).await;
        }
    }
    put(
        &p.ingestor,
        &sp,
        chunks.len() as u64,
        Bytes::new(),
        Some(CloseKind::Normal),
    )
    .await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let got = loop {
        p.normalizer.assert_running();
        p.archiver.assert_running();
        let rec = p.store.get_run(TENANT, run).await.unwrap();
        if rec.as_ref().is_some_and(|r| {
            r.status != RunStatusKind::Open && r.event_count as usize >= want.len()
        }) {
            break p.store.events_after(TENANT, run, 0, 0).await.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{victim:?} killed: run not complete after 60 s (seed {seed}); runs row: {rec:?}\n{}",
            p.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_archive_eq(
        run,
        &got,
        &want,
        &format!("{victim:?} killed, {backend:?}, seed {seed}"),
    );
    // Not waiting for the bus to go quiet: what the killed instance held unacknowledged
    // is redelivered only after the consumers' ack wait (30 s); the archive key makes
    // those redeliveries no-ops (see `duplicate_ingest_changes_nothing`).
    let row = p.store.get_run(TENANT, run).await.unwrap().unwrap();
    assert_eq!(row.event_count as usize, want.len(), "no duplicates");
    assert_eq!(row.status, RunStatusKind::Ended);
    if std::env::var_os("E2E_LOGS").is_some() {
        eprintln!("{}", p.logs());
    }
    eprintln!(
        "{victim:?} crash: {} events, {} chunks, recovered in {:?}",
        want.len(),
        chunks.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normalizer_sigkill_mid_run() {
    crash_mid_run(Backend::Sqlite, Victim::Normalizer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiver_sigkill_mid_batch_sqlite() {
    crash_mid_run(Backend::Sqlite, Victim::Archiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiver_sigkill_mid_batch_postgres() {
    crash_mid_run(Backend::Postgres, Victim::Archiver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_killed_mid_run() {
    crash_mid_run(Backend::Postgres, Victim::Nats).await;
}

/// SG_EVENTS refuses every new message for a while (full, with `discard: new`) while
/// runs are ingested one after another, so a partition's backlog is several batches of
/// runs in a row: every failed batch's runs are forgotten and its chunks delivered
/// again from a new consumer incarnation, and every run archives exactly as normalized,
/// each seq once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_the_broker_refused_are_published_again() {
    use async_nats::jetstream::stream::DiscardPolicy;
    let seed = seed("refused");
    let mut rng = rng(seed);
    let p = Pipeline::start(Backend::Sqlite).await;
    let family = "f2";
    let bytes = streamgate_wire::synth::inflate(&fixture("f2/deepseek-thinking.sse"), 24 * 1024);
    let want = expected(family, &bytes);
    let runs: Vec<(String, Vec<Bytes>)> = (0..96)
        .map(|i| (format!("refused-{i:02}"), split(&bytes, &mut rng, 768)))
        .collect();
    // One run through first: SG_EVENTS holds messages, the pipeline is up.
    put_run(&p.ingestor, &spec(&runs[0].0, family), &runs[0].1).await;
    wait_run(&*p.store, &runs[0].0, want.len(), PATIENCE).await;
    let names = |incarnations: Vec<Vec<async_nats::jetstream::consumer::Info>>| {
        incarnations
            .into_iter()
            .flatten()
            .map(|c| c.name)
            .collect::<BTreeSet<_>>()
    };
    let before = names(normalizer_incarnations(&p.js).await);

    // Full: no events message is stored until the limit is lifted.
    let mut events = p.js.get_stream(EVENTS_STREAM).await.unwrap();
    let info = events.info().await.unwrap().clone();
    let open = info.config.clone();
    let full = async_nats::jetstream::stream::Config {
        max_messages: i64::try_from(info.state.messages).unwrap(),
        discard: DiscardPolicy::New,
        ..open.clone()
    };
    p.js.update_stream(full).await.unwrap();
    let refused =
        p.js.publish("sg.evt.probe", Bytes::from_static(b"x"))
            .await
            .unwrap()
            .await;
    assert!(refused.is_err(), "a full SG_EVENTS still took a message");
    // The other runs one after another: each partition's backlog is runs in a row,
    // several batches long.
    for (run, chunks) in &runs[1..] {
        put_run(&p.ingestor, &spec(run, family), chunks).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    p.js.update_stream(open).await.unwrap();

    for (run, chunks) in &runs {
        let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
        let ctx = format!("{} chunks, seed {seed}", chunks.len());
        assert_archive_eq(run, &got, &want, &ctx);
        let row = p.store.get_run(TENANT, run).await.unwrap().unwrap();
        assert_eq!(
            row.event_count as usize,
            want.len(),
            "no duplicates ({ctx})"
        );
    }
    // The refusal failed batches: their partitions took their chunks again from a new
    // consumer incarnation (the failure path, not a retry that went through).
    let after = names(normalizer_incarnations(&p.js).await);
    assert!(
        after.difference(&before).next().is_some(),
        "no partition started over: {before:?} → {after:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 4. a producer that vanishes
// ---------------------------------------------------------------------------------------

fn is_terminal(v: &Value) -> bool {
    v["stream"] == "lifecycle" && (v["data"]["phase"] == "end" || v["data"]["phase"] == "error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_run_is_closed_once_by_timeout() {
    let seed = seed("abandoned_run_is_closed_once_by_timeout");
    let mut rng = rng(seed);
    let p = Pipeline::start_with(
        Backend::Sqlite,
        NormalizerConfig {
            idle_timeout: Duration::from_secs(1),
            idle_check: Duration::from_millis(100),
            ..NormalizerConfig::default()
        },
    )
    .await;
    let full = fixture("f1/end-turn.sse");
    let bytes = &full[..full.len() / 2];
    let want = expected_closed("f1", bytes, Close::Timeout);
    let chunks = split(bytes, &mut rng, 64);
    let run = "abandoned";
    let sp = spec(run, "f1");
    put_range(&p.ingestor, &sp, &chunks, 0, chunks.len()).await;

    let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
    assert_archive_eq(run, &got, &want, &format!("timeout close, seed {seed}"));
    let json = as_json(&got);
    let terminals: Vec<&Value> = json.iter().filter(|v| is_terminal(v)).collect();
    assert_eq!(terminals.len(), 1, "terminal events: {terminals:?}");
    assert_eq!(terminals[0], json.last().unwrap(), "terminal is last");
    assert_eq!(terminals[0]["data"]["phase"], "error");
    assert_eq!(terminals[0]["data"]["reason"], "stream_closed");

    // Negative window, longer than the idle timeout again: no second marker, no second
    // terminal.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_quiet(&p.js).await;
    assert_eq!(p.store.events_after(TENANT, run, 0, 0).await.unwrap(), got);

    // The close marker is a raw message: replaying SG_RAW reproduces the run.
    let mut client = archive_client(p.archive_grpc, Some(TOKEN)).await;
    let mut raw = client
        .raw_chunks(v1::RawChunksRequest {
            run_id: run.into(),
            tenant: TENANT.into(),
        })
        .await
        .expect("RawChunks")
        .into_inner();
    let mut stored = Vec::new();
    while let Some(c) = raw.message().await.expect("raw stream") {
        stored.push(c);
    }
    assert_eq!(stored.len(), chunks.len() + 1, "chunks + one close marker");
    let marker = stored.last().unwrap();
    assert_eq!(marker.close.as_deref(), Some("timeout"));
    assert_eq!(marker.chunk, chunks.len() as u64);
    assert!(marker.body.is_empty());
    let mut n = streamgate_wire::Normalizer::new(choice("f1"));
    let mut replayed = Vec::new();
    for c in &stored {
        n.feed(&c.body);
        if c.close.is_some() {
            n.close(Close::Timeout);
        }
        replayed.extend(n.drain().map(|e| serde_json::to_value(e).unwrap()));
    }
    assert_eq!(replayed, json, "replaying SG_RAW reproduces the archive");
}

/// The producer vanishes and the normalizer restarts before the run went idle: the new
/// normalizer never sees a chunk of the run, yet closes it once (from `SG_OPEN_RUNS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_run_is_closed_once_across_a_normalizer_restart() {
    let seed = seed("abandoned_run_is_closed_once_across_a_normalizer_restart");
    let mut rng = rng(seed);
    let mut p = Pipeline::start_with(
        Backend::Sqlite,
        NormalizerConfig {
            idle_timeout: Duration::from_secs(3),
            idle_check: Duration::from_millis(100),
            ..NormalizerConfig::default()
        },
    )
    .await;
    let full = fixture("f1/end-turn.sse");
    let bytes = &full[..full.len() / 2];
    let want = expected_closed("f1", bytes, Close::Timeout);
    let chunks = split(bytes, &mut rng, 64);
    let run = "abandoned-restart";
    let sp = spec(run, "f1");
    put_range(&p.ingestor, &sp, &chunks, 0, chunks.len()).await;
    wait_some(&*p.store, run, 1).await;
    // Every chunk is acknowledged; the replica that saw them goes away.
    wait_quiet(&p.js).await;
    p.restart_normalizer().await;

    let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
    assert_archive_eq(
        run,
        &got,
        &want,
        &format!("timeout after restart, seed {seed}"),
    );
    let json = as_json(&got);
    let terminals: Vec<&Value> = json.iter().filter(|v| is_terminal(v)).collect();
    assert_eq!(terminals.len(), 1, "terminal events: {terminals:?}");
    assert_eq!(terminals[0]["data"]["reason"], "stream_closed");

    // Closed runs leave the registry, and nothing more happens after another timeout
    // (a negative window longer than the 3 s idle timeout).
    tokio::time::sleep(Duration::from_secs(4)).await;
    wait_quiet(&p.js).await;
    assert_eq!(p.store.events_after(TENANT, run, 0, 0).await.unwrap(), got);
    // The registry keeps a closed run's tombstone only as long as its raw chunks: the
    // bucket does not grow by a run forever.
    let max_age = |name: &'static str| {
        let js = p.js.clone();
        async move {
            js.get_stream(name)
                .await
                .unwrap()
                .cached_info()
                .config
                .max_age
        }
    };
    let raw_age = max_age(streamgate_bus::RAW_STREAM).await;
    assert!(raw_age > Duration::ZERO);
    assert_eq!(max_age("KV_SG_OPEN_RUNS").await, raw_age);
    let open = streamgate_normalizer::open_runs::OpenRuns::open(
        &p.js,
        DEFAULT_PARTITIONS,
        &streamgate_bus::StreamSettings::default(),
    )
    .await
    .unwrap();
    let addr =
        streamgate_bus::subject::RunAddr::parse(&sp.tenant, run, DEFAULT_PARTITIONS).unwrap();
    assert!(
        !open
            .in_partition(addr.partition)
            .await
            .unwrap()
            .contains(&addr),
        "a closed run is still registered as open"
    );
}

// ---------------------------------------------------------------------------------------
// 5. follow
// ---------------------------------------------------------------------------------------

async fn follow(addr: std::net::SocketAddr, run: String, after_seq: u64) -> Vec<v1::ArchivedEvent> {
    let mut client = archive_client(addr, Some(TOKEN)).await;
    let mut stream = client
        .replay_events(v1::ReplayEventsRequest {
            run_id: run,
            after_seq,
            follow: true,
            tenant: TENANT.into(),
            generation: None,
        })
        .await
        .expect("ReplayEvents")
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = stream.message().await.expect("replay stream") {
        out.push(e);
    }
    out
}

fn replayed_json(events: &[v1::ArchivedEvent]) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            let ev = streamgate_grammar::RunEvent::try_from(e.event.clone().expect("event"))
                .expect("decodable event");
            serde_json::to_value(&ev.event).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_replay_is_gapless_while_ingesting() {
    let seed = seed("follow_replay_is_gapless_while_ingesting");
    let mut rng = rng(seed);
    let p = Pipeline::start(Backend::Sqlite).await;
    let bytes = streamgate_wire::synth::inflate(&fixture("f2/deepseek-thinking.sse"), 24 * 1024);
    let want = expected("f2", &bytes);
    let chunks = split(&bytes, &mut rng, 512);
    let run = "followed";
    let sp = spec(run, "f2");
    let half = chunks.len() / 2;

    // A follower from the start, opened as the run begins.
    put_range(&p.ingestor, &sp, &chunks, 0, 1).await;
    let from_start = tokio::spawn(follow(p.archive_grpc, run.into(), 0));
    // Paced, like a live provider.
    for i in 1..half {
        put_range(&p.ingestor, &sp, &chunks, i, i + 1).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A follower from the middle of what is archived; the run is provably open (no close
    // marker was sent yet).
    wait_some(&*p.store, run, 4).await;
    let archived = p.store.get_run(TENANT, run).await.unwrap().unwrap();
    assert_eq!(archived.status, RunStatusKind::Open);
    let mid = archived.event_count / 2;
    let from_mid = tokio::spawn(follow(p.archive_grpc, run.into(), mid));
    for i in half..chunks.len() {
        put_range(&p.ingestor, &sp, &chunks, i, i + 1).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    put(
        &p.ingestor,
        &sp,
        chunks.len() as u64,
        Bytes::new(),
        Some(CloseKind::Normal),
    )
    .await;

    for (name, task, after) in [("from 0", from_start, 0), ("from mid", from_mid, mid)] {
        let got = tokio::time::timeout(PATIENCE, task)
            .await
            .unwrap_or_else(|_| panic!("follower {name} did not end (seed {seed})"))
            .expect("follower task");
        let seqs: Vec<u64> = got.iter().map(|e| e.event.as_ref().unwrap().seq).collect();
        let want_seqs: Vec<u64> = (after + 1..=want.len() as u64).collect();
        assert_eq!(seqs, want_seqs, "follower {name}: seqs (seed {seed})");
        assert_eq!(
            replayed_json(&got),
            want[after as usize..].to_vec(),
            "follower {name}: events (seed {seed})"
        );
        assert!(is_terminal(want.last().unwrap()));
    }
}

// ---------------------------------------------------------------------------------------
// 5b. live first, nothing held
// ---------------------------------------------------------------------------------------

/// A thinking capture, the text of its usage frame, and its golden file.
struct Thinking {
    family: &'static str,
    capture: std::path::PathBuf,
    golden: std::path::PathBuf,
    usage_frame: &'static str,
}

fn thinking_captures() -> Vec<Thinking> {
    let f = |family, capture: &str, golden: &str, usage_frame| Thinking {
        family,
        capture: root().join("fixtures").join(capture),
        golden: root().join("fixtures").join(golden),
        usage_frame,
    };
    let mut out = vec![
        f(
            "f1",
            "f1/redacted.sse",
            "f1/redacted.expected.jsonl",
            r#""type":"message_delta""#,
        ),
        f(
            "f3",
            "f3/reasoning.sse",
            "f3/reasoning.expected.jsonl",
            r#""type":"response.completed""#,
        ),
    ];
    if let Some(corpus) = std::env::var_os("STREAMGATE_CORPUS").filter(|c| !c.is_empty()) {
        let corpus = std::path::PathBuf::from(corpus);
        out.push(Thinking {
            family: "f1",
            capture: corpus.join("captures/anthropic/02-thinking-stream.sse"),
            golden: corpus.join("expected/f1__anthropic_02_thinking_stream_sse.jsonl"),
            usage_frame: r#""type":"message_delta""#,
        });
    }
    out
}

fn is_answer_delta(v: &Value) -> bool {
    v["stream"] == "assistant" && v["data"].get("delta").is_some()
}

/// Issue 10, "live first": a thinking run ingested up to (not including) its usage frame
/// already has every answer delta archived while the run is still open — nothing waits
/// behind the thinking segment's end marker for the token count. After the rest, the
/// archived run folded to the batch form (spec §3.2) equals its golden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_deltas_are_archived_before_the_usage_frame() {
    let seed = seed("answer_deltas_are_archived_before_the_usage_frame");
    let mut rng = rng(seed);
    let p = Pipeline::start(Backend::Sqlite).await;
    for (i, case) in thinking_captures().into_iter().enumerate() {
        let name = case.capture.display().to_string();
        let bytes = std::fs::read(&case.capture).unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = std::str::from_utf8(&bytes).unwrap();
        let at = text.find(case.usage_frame).expect("usage frame");
        let cut = text[..at].rfind("\n\n").map_or(0, |i| i + 2);
        let want = expected(case.family, &bytes);
        let deltas = want.iter().filter(|v| is_answer_delta(v)).count();
        assert!(deltas > 0, "{name}: no answer deltas");

        let mut chunks = split(&bytes[..cut], &mut rng, 64);
        let first = chunks.len();
        chunks.extend(split(&bytes[cut..], &mut rng, 64));
        let run = format!("live-{i}");
        let sp = spec(&run, case.family);

        // Everything but the usage frame and what follows it.
        put_range(&p.ingestor, &sp, &chunks, 0, first).await;
        let live = expected_prefix(case.family, &bytes[..cut]);
        wait_some(&*p.store, &run, live.len() as u64).await;
        let archived = p.store.events_after(TENANT, &run, 0, 0).await.unwrap();
        let row = p.store.get_run(TENANT, &run).await.unwrap().unwrap();
        assert_eq!(row.status, RunStatusKind::Open, "{name}: run still open");
        let got = as_json(&archived);
        assert_eq!(
            got.iter().filter(|v| is_answer_delta(v)).count(),
            deltas,
            "{name} (seed {seed}): answer deltas archived before the usage frame"
        );
        assert_eq!(
            got[..],
            want[..got.len()],
            "{name} (seed {seed}): live prefix"
        );
        assert!(
            !got.iter().any(|v| v["stream"] == "thinking"
                && v["data"].get("tokens").is_some()
                && v["data"].get("phase").is_none()),
            "{name}: a tokens update before usage"
        );

        // The usage frame and the rest.
        put_range(&p.ingestor, &sp, &chunks, first, chunks.len()).await;
        put(
            &p.ingestor,
            &sp,
            chunks.len() as u64,
            Bytes::new(),
            Some(CloseKind::Normal),
        )
        .await;
        let all = wait_run(&*p.store, &run, want.len(), PATIENCE).await;
        assert_archive_eq(&run, &all, &want, &format!("{name}, seed {seed}"));
        let events: Vec<streamgate_grammar::Event> =
            all.iter().map(|e| e.event.event.clone()).collect();
        let folded: Vec<Value> = streamgate_grammar::fold_token_updates(&events)
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        let golden: Vec<Value> = std::fs::read_to_string(&case.golden)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(folded, golden, "{name}: archived run, folded, vs golden");
        assert!(
            folded.len() < want.len(),
            "{name}: no tokens update to fold"
        );
    }
}

/// What `normalize` has emitted after `bytes` without the stream's end.
fn expected_prefix(family: &str, bytes: &[u8]) -> Vec<Value> {
    let mut n = streamgate_wire::Normalizer::new(choice(family));
    n.feed(bytes);
    n.drain()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------
// 6. auth
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_requires_the_operator_token() {
    let p = Pipeline::start(Backend::Sqlite).await;
    let run = "secret-run";
    put_run(
        &p.ingestor,
        &spec(run, "f1"),
        &[Bytes::from(fixture("f1/end-turn.sse"))],
    )
    .await;
    wait_run(&*p.store, run, 1, PATIENCE).await;

    let mut ok = archive_client(p.archive_grpc, Some(TOKEN)).await;
    ok.list_runs(v1::ListRunsRequest::default())
        .await
        .expect("the operator token works");

    for token in [None, Some("wrong-token"), Some("")] {
        let mut c = archive_client(p.archive_grpc, token).await;
        let id = || run.to_owned();
        let codes = [
            (
                "ListRuns",
                c.list_runs(v1::ListRunsRequest::default()).await.err(),
            ),
            (
                "GetRun",
                c.get_run(v1::GetRunRequest {
                    run_id: id(),
                    tenant: TENANT.into(),
                })
                .await
                .err(),
            ),
            (
                "ReplayEvents",
                c.replay_events(v1::ReplayEventsRequest {
                    run_id: id(),
                    after_seq: 0,
                    follow: false,
                    tenant: TENANT.into(),
                    generation: None,
                })
                .await
                .err(),
            ),
            (
                "ReplayJournal",
                c.replay_journal(v1::ReplayJournalRequest {
                    after_journal_seq: 0,
                    limit: 0,
                })
                .await
                .err(),
            ),
            (
                "ReplayState",
                c.replay_state(v1::ReplayStateRequest {
                    run_id: id(),
                    at_seq: 0,
                    tenant: TENANT.into(),
                    generation: None,
                })
                .await
                .err(),
            ),
            (
                "ReplayTimeline",
                c.replay_timeline(v1::ReplayTimelineRequest {
                    run_id: id(),
                    tenant: TENANT.into(),
                    generation: None,
                })
                .await
                .err(),
            ),
            (
                "RawChunks",
                c.raw_chunks(v1::RawChunksRequest {
                    run_id: id(),
                    tenant: TENANT.into(),
                })
                .await
                .err(),
            ),
            ("Verify", c.verify(v1::VerifyRequest::default()).await.err()),
            (
                "Erase",
                c.erase(v1::EraseRequest {
                    tenant: TENANT.into(),
                    scope: Some(v1::erase_request::Scope::RunId(id())),
                    actor: String::new(),
                })
                .await
                .err(),
            ),
            (
                "RunStats",
                c.run_stats(v1::RunStatsRequest::default()).await.err(),
            ),
            (
                "Retention",
                c.retention(v1::RetentionRequest { apply: true })
                    .await
                    .err(),
            ),
            (
                "ListErasures",
                c.list_erasures(v1::ListErasuresRequest::default())
                    .await
                    .err(),
            ),
            (
                "Backfill",
                c.backfill(v1::BackfillRequest {
                    scope: None,
                    apply: true,
                })
                .await
                .err(),
            ),
        ];
        for (rpc, err) in codes {
            let code = err.map(|s| s.code());
            assert_eq!(
                code,
                Some(Code::Unauthenticated),
                "{rpc} with token {token:?}"
            );
        }
    }

    // Run ids breaking the id rule are refused before they become NATS subjects (a
    // 4 KiB one would drop the archiver's connection); the archiver still serves after.
    for bad in ["r".repeat(4100), "r\n1".into(), String::new()] {
        let err = ok
            .raw_chunks(v1::RawChunksRequest {
                run_id: bad.clone(),
                tenant: TENANT.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with("run id: "), "{err:?}");
        let err = ok
            .replay_events(v1::ReplayEventsRequest {
                run_id: bad,
                after_seq: 0,
                follow: true,
                tenant: TENANT.into(),
                generation: None,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    // Erase names its ids by the same rule, before anything is removed.
    use v1::erase_request::Scope;
    for (tenant, scope, rule) in [
        ("t\n", Scope::All(true), "tenant: "),
        (TENANT, Scope::RunId("r\n1".into()), "run id: "),
        (TENANT, Scope::SessionKey("s".repeat(300)), "session"),
    ] {
        let err = ok
            .erase(v1::EraseRequest {
                tenant: tenant.into(),
                scope: Some(scope),
                actor: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with(rule), "{err:?}");
    }
    let mut raw = ok
        .raw_chunks(v1::RawChunksRequest {
            run_id: run.into(),
            tenant: TENANT.into(),
        })
        .await
        .expect("raw chunks after refused ids")
        .into_inner();
    assert!(raw.message().await.expect("a raw chunk").is_some());
}

// ---------------------------------------------------------------------------------------
// stream settings
// ---------------------------------------------------------------------------------------

/// The normalizer provisions SG_RAW and SG_EVENTS with the deployment's settings; an
/// archiver (re)starting later must not reset them to its own defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiver_start_keeps_the_deployment_stream_settings() {
    let nats = NatsServer::start();
    let js = nats.jetstream().await;
    let custom = StreamSettings {
        raw_max_age: Duration::from_secs(3600),
        events_max_age: Duration::from_secs(7200),
        duplicate_window: Duration::from_secs(30),
        ..StreamSettings::default()
    };
    streamgate_bus::ensure_streams(&js, &custom).await.unwrap();
    let store = TestStore::new(Backend::Sqlite).await;
    let logs = tempfile::tempdir().unwrap();
    let mut archiver = Service::spawn(
        "archiver",
        &archiver_args(&nats.url(), &store.url),
        logs.path(),
    );
    wait_consumer(&js, streamgate_bus::EVENTS_STREAM, "sg-archiver").await;
    archiver.assert_running();
    for (name, wanted) in [
        (streamgate_bus::RAW_STREAM, custom.raw_config()),
        (streamgate_bus::EVENTS_STREAM, custom.events_config()),
    ] {
        let mut stream = js.get_stream(name).await.unwrap();
        let cfg = stream.info().await.unwrap().config.clone();
        assert_eq!(
            (cfg.max_age, cfg.duplicate_window),
            (wanted.max_age, wanted.duplicate_window),
            "{name} settings changed by the archiver"
        );
    }
}

// ---------------------------------------------------------------------------------------
// the CLI: streamgate up, ingest, replay
// ---------------------------------------------------------------------------------------

/// Runs a command to completion within `patience`; returns (success, stdout, stderr).
fn run_cmd(mut cmd: Command, dir: &std::path::Path, tag: &str) -> (bool, String, String) {
    let out = dir.join(format!("{tag}.out"));
    let err = dir.join(format!("{tag}.err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {tag}: {e}"));
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{tag} did not finish in {PATIENCE:?}:\n{}\n{}",
                std::fs::read_to_string(&out).unwrap_or_default(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.success(),
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default(),
    )
}

/// The captures `streamgate up --demo` ingests (src/cli/up.rs).
const DEMO: &[(&str, &str)] = &[
    ("f1", "f1/redacted.sse"),
    ("f1", "f1/tool-use.sse"),
    ("f1e", "f1e/thinking.jsonl"),
    ("f2", "f2/deepseek-thinking.sse"),
    ("f2", "f2/openrouter-dual-lane.sse"),
    ("f3", "f3/reasoning.sse"),
    ("f5", "f5/thinking.sse"),
    ("ollama-native", "ollama-native/text.jsonl"),
    ("codex-appserver", "codex-appserver/reasoning.jsonl"),
];

/// The README's run command as a fresh machine of this kind runs it: an old (2.9)
/// nats-server first on `PATH`, no `STREAMGATE_NATS_SERVER`, an empty cache. `up` must
/// find or install a current server by itself, show every final and exit 0.
#[test]
fn up_demo_smoke() {
    let dir = tempfile::tempdir().unwrap();
    let old_bin = dir.path().join("old-bin");
    std::fs::create_dir_all(&old_bin).unwrap();
    let old_server = old_bin.join("nats-server");
    if std::path::Path::new("/usr/sbin/nats-server").exists() {
        std::os::unix::fs::symlink("/usr/sbin/nats-server", &old_server).unwrap();
    } else {
        std::fs::write(
            &old_server,
            "#!/bin/sh\necho 'nats-server: v2.9.10'\nexit 1\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&old_server, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        old_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(bin());
    cmd.args(["up", "--demo", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("PATH", path)
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .env_remove("STREAMGATE_NATS_SERVER")
        .env_remove("RUST_LOG")
        .current_dir(dir.path());
    let (ok, stdout, stderr) = run_cmd(cmd, dir.path(), "up-demo");
    assert!(ok, "streamgate up --demo failed:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "demo: {} runs normalized, archived and shown",
            DEMO.len()
        )),
        "stderr:\n{stderr}"
    );
    // Library INFO chatter stays out of the terminal by default.
    assert!(
        !stderr.contains(" INFO "),
        "INFO lines in up's terminal:\n{stderr}"
    );
    let mut finals = 0;
    for (family, path) in DEMO {
        for ev in expected(family, &fixture(path)) {
            if ev["stream"] == "assistant" && ev["data"]["phase"] == "final_answer" {
                if let Some(text) = ev["data"]["text"].as_str() {
                    let first = text.lines().next().unwrap_or_default();
                    assert!(
                        stdout.contains(first),
                        "final answer of {path} ({first:?}) not printed:\n{stdout}"
                    );
                    finals += 1;
                }
            }
        }
    }
    assert!(finals >= 5, "only {finals} final answers in the demo");
    assert!(
        !dir.path().join("data/up.json").exists(),
        "up.json left behind"
    );
}

/// Starts `streamgate up --quiet <extra>` in `dir` and waits for its `up.json`.
fn start_up(dir: &std::path::Path, extra: &[&str]) -> Graceful {
    let out = std::fs::File::create(dir.join("up.out")).unwrap();
    let err = std::fs::File::create(dir.join("up.err")).unwrap();
    let mut up = Graceful(
        Command::new(bin())
            .args(["up", "--quiet"])
            .args(extra)
            .current_dir(dir)
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn streamgate up"),
    );
    let up_json = dir.join(".streamgate/up.json");
    let deadline = Instant::now() + PATIENCE;
    while !up_json.exists() {
        if let Ok(Some(s)) = up.0.try_wait() {
            panic!(
                "streamgate up exited with {s}:\n{}",
                std::fs::read_to_string(dir.join("up.err")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no up.json after {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    up
}

/// The partition count the running `up` in `dir` announces.
fn up_partitions(dir: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(dir.join(".streamgate/up.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["partitions"].as_u64().unwrap()
}

/// A data dir keeps the partition count it was created with: a plain `up` adopts it, and
/// an explicit different count is refused with the fix in the message (not a silent
/// re-routing that would strand runs).
#[test]
fn up_keeps_the_partition_count_of_its_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let stop = |mut up: Graceful| {
        let status = up.stop(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "up did not stop cleanly"
        );
    };
    let up = start_up(dir.path(), &["--partitions", "4", "--no-web"]);
    assert_eq!(up_partitions(dir.path()), 4);
    stop(up);
    let _ = std::fs::remove_file(dir.path().join(".streamgate/up.json"));

    let up = start_up(dir.path(), &["--no-web"]);
    assert_eq!(up_partitions(dir.path()), 4, "a plain up changed the count");
    stop(up);
    let _ = std::fs::remove_file(dir.path().join(".streamgate/up.json"));

    let refused = Command::new(bin())
        .args(["up", "--quiet", "--no-web", "--partitions", "8"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!refused.status.success(), "up started with another count");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("created for 4 partitions") && stderr.contains("STREAMGATE_PARTITIONS"),
        "{stderr}"
    );
}

#[test]
fn up_ingest_replay_cli() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = start_up(dir.path(), &[]);

    let capture = root().join("fixtures/f1/tool-use.sse");
    let mut ingest = Command::new(bin());
    ingest
        .args([
            "ingest",
            "--family",
            "f1",
            "--run",
            "r1",
            "--chunk-bytes",
            "64",
        ])
        .arg(&capture)
        .current_dir(dir.path());
    let (ok, _, stderr) = run_cmd(ingest, dir.path(), "ingest");
    assert!(ok, "streamgate ingest failed:\n{stderr}");

    let mut replay = Command::new(bin());
    replay
        .args(["replay", "r1", "--json", "--follow"])
        .current_dir(dir.path());
    let (ok, replayed, stderr) = run_cmd(replay, dir.path(), "replay");
    assert!(ok, "streamgate replay failed:\n{stderr}");

    let mut normalize = Command::new(bin());
    normalize
        .args(["normalize", "--family", "f1"])
        .arg(&capture)
        .current_dir(dir.path());
    let (ok, normalized, stderr) = run_cmd(normalize, dir.path(), "normalize");
    assert!(ok, "streamgate normalize failed:\n{stderr}");

    let golden = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                serde_json::json!({"seq": v["seq"], "stream": v["stream"], "data": v["data"]})
            })
            .collect()
    };
    let want = golden(&normalized);
    assert!(!want.is_empty());
    assert_eq!(golden(&replayed), want, "replay --json vs normalize");
    for line in replayed.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["run_id"], "r1");
        assert_eq!(v["tenant"], "default");
    }

    let status = up.stop(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "streamgate up did not stop cleanly on SIGINT: {status:?}\n{}",
        std::fs::read_to_string(dir.path().join("up.err")).unwrap_or_default()
    );
}

// ---------------------------------------------------------------------------------------
// ids at the limit of the id rule
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_ids_reach_a_channel() {
    let p = Pipeline::start(Backend::Sqlite).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let _projector = streamgate_projector::start(
        p.nats.client().await,
        streamgate_projector::ChannelConfig::new(
            "web",
            streamgate_projector::ChannelSink::Web {
                listen: ([127, 0, 0, 1], 0).into(),
            },
        ),
        None,
        stop.clone(),
    )
    .await
    .expect("start projector");
    wait_projector(&p.js, "web").await;
    // 256 bytes each, none of them subject- or key-safe: 768 bytes once escaped.
    let run = format!("{}.", "中".repeat(85));
    let spec = v1_spec("é".repeat(128), run.clone(), Some("🦀".repeat(64)));
    for id in [
        spec.tenant.as_str(),
        spec.run_id.as_str(),
        spec.session_key.as_ref().unwrap().as_str(),
    ] {
        assert_eq!(id.len(), streamgate_grammar::ids::MAX_ID_BYTES);
    }
    let bytes = fixture("f1/end-turn.sse");
    put_run(&p.ingestor, &spec, &[Bytes::from(bytes.clone())]).await;
    let want = expected("f1", &bytes);
    let got = wait_run_in(&*p.store, &spec.tenant, &run, want.len(), PATIENCE).await;
    assert_eq!(as_json(&got), want, "256-byte ids: archived events");
    let env = &got[0].event.envelope;
    assert_eq!(
        (env.tenant.as_str(), env.session_key.as_deref()),
        (spec.tenant.as_str(), spec.session_key.as_deref())
    );

    let kv =
        p.js.get_key_value(streamgate_projector::kv::DELIVERY_BUCKET)
            .await
            .expect("delivery bucket");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let delivered = streamgate_bus::kv::current(&kv, "")
            .await
            .expect("read SG_DELIVERY")
            .into_iter()
            .filter(|e| !e.deleted && !e.key.starts_with("active."))
            .filter(|e| {
                e.key
                    .rsplit('.')
                    .next()
                    .and_then(streamgate_bus::kv::untoken)
                    .as_deref()
                    == Some(run.as_str())
            })
            .filter_map(|e| {
                serde_json::from_slice::<streamgate_sinks::DeliveryState>(&e.value).ok()
            })
            .any(|s| s.final_delivered);
        if delivered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the channel never delivered the final answer of the 256-byte run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
}

fn v1_spec(
    tenant: String,
    run_id: String,
    session_key: Option<String>,
) -> streamgate_normalizer::ingest::RunSpec {
    streamgate_normalizer::ingest::RunSpec::new(
        &tenant,
        &run_id,
        session_key.as_deref(),
        "f1",
        None,
    )
    .unwrap()
}

/// Raw messages breaking the id rule are passed over (acknowledged with their batch,
/// never redelivered, no event), and the good runs behind them go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_messages_breaking_the_id_rule_are_passed_over() {
    let p = Pipeline::start(Backend::Sqlite).await;
    let long = "r".repeat(257);
    let bad: Vec<(&str, &str, Option<&str>)> = vec![
        (TENANT, "bad\n1", None),
        (TENANT, &long, None),
        ("", "bad-tenant", None),
        (TENANT, "bad-session", Some("s\r\nX: 1")),
    ];
    let bytes = fixture("f1/end-turn.sse");
    let mut partitions = BTreeSet::new();
    for (tenant, run, session) in &bad {
        // Published by hand: a `RunAddr` cannot hold such ids, and `publish_raw` refuses
        // such a session. The subject and headers are written the way a foreign producer
        // would.
        use streamgate_bus::subject::{encode_token, partition_of};
        let raw = streamgate_bus::raw::RawChunk {
            addr: streamgate_bus::subject::RunAddr::parse("placeholder", "placeholder", 1).unwrap(),
            session_key: session.map(str::to_owned),
            family: "f1".into(),
            dialect: None,
            chunk: 0,
            ingest_ts_ms: 1,
            close: None,
            body: Bytes::from(bytes.clone()),
        };
        let partition = partition_of(run, DEFAULT_PARTITIONS);
        partitions.insert(partition);
        let subject = format!(
            "sg.raw.{}.{partition}.{}",
            encode_token(tenant),
            encode_token(run)
        );
        let mut headers = raw.headers();
        headers.insert(streamgate_bus::raw::HDR_TENANT, &*encode_token(tenant));
        headers.insert(streamgate_bus::raw::HDR_RUN, &*encode_token(run));
        p.js.publish_with_headers(subject, headers, raw.body.clone())
            .await
            .expect("publish")
            .await
            .expect("stored in SG_RAW");
    }
    // A good run behind them in each of their partitions.
    let mut good = Vec::new();
    for i in 0.. {
        let run = format!("good-{i}");
        if partitions.remove(&streamgate_bus::subject::partition_of(
            &run,
            DEFAULT_PARTITIONS,
        )) {
            put_run(
                &p.ingestor,
                &spec(&run, "f1"),
                &[Bytes::from(bytes.clone())],
            )
            .await;
            good.push(run);
        }
        if partitions.is_empty() {
            break;
        }
    }
    let want = expected("f1", &bytes);
    for run in &good {
        let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
        assert_archive_eq(run, &got, &want, "behind bad ids");
    }
    // Nothing left pending or unacknowledged anywhere, and no event for a bad id.
    wait_quiet(&p.js).await;
    for (tenant, run, _) in &bad {
        assert!(
            p.store
                .get_run(tenant, run)
                .await
                .expect("get_run")
                .is_none(),
            "{run:?} was archived"
        );
    }
}

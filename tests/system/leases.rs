//! Normalizer replicas under partition leases (docs/architecture.md §4), end to end on a real
//! nats-server and archive:
//!
//! - `two_normalizers_split_the_partitions_and_each_run_is_normalized_once`: two replicas
//!   in this process split the partitions half and half; every capture, ingested in random
//!   chunks, ends in the archive exactly as `streamgate normalize` prints it (seq 1..n,
//!   once each). Each run was normalized by exactly one replica: the partition sets did
//!   not change while the runs went through (only a partition's holder consumes it), no
//!   partition consumer ever redelivered a raw message and none was made again (each
//!   chunk was taken once).
//! - `a_sigkilled_normalizer_hands_its_partitions_to_the_survivor_after_the_ttl`: two
//!   `streamgate normalizer` processes; one is SIGKILLed mid-ingest, with runs of its
//!   partitions in flight. Its leases (visible in `SG_LEASES`) pass to the survivor once
//!   their TTL ran out, and every run still archives complete and duplicate-free.
//! - `partition_consumers_deleted_mid_ingest_are_made_again_and_nothing_is_lost`: every
//!   partition's consumer (an incarnation, acknowledged in order) is deleted while runs
//!   are half ingested; the workers make new ones from their ack floors and every run
//!   still archives complete.

use crate::common;

use bytes::Bytes;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use streamgate_bus::subject::partition_of;
use streamgate_bus::{DEFAULT_PARTITIONS, EVENTS_STREAM, RAW_STREAM};

/// Partitions each of two replicas holds once they split them.
const HALF: usize = DEFAULT_PARTITIONS as usize / 2;

/// Every case as its own run with random chunks: `(run id, case, chunks)`.
fn runs(seed: u64) -> Vec<(String, Case, Vec<Bytes>)> {
    let mut rng = rng(seed);
    let cases = all_cases();
    assert!(cases.len() >= 10, "only {} captures found", cases.len());
    cases
        .into_iter()
        .enumerate()
        .map(|(i, case)| {
            let max = [1, 7, 64, 512][i % 4].max(case.bytes.len() / 1500);
            let chunks = split(&case.bytes, &mut rng, max);
            (format!("lease-{i:03}"), case, chunks)
        })
        .collect()
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_normalizers_split_the_partitions_and_each_run_is_normalized_once() {
    let seed = seed("two_normalizers_split_the_partitions");
    let p = Pipeline::start(Backend::Sqlite).await;
    let b_started = std::time::SystemTime::now();
    let b = NormalizerReplica::start(&p.nats, p.normalizer_config().clone()).await;
    eventually("the replicas split the partitions half and half", || {
        let (x, y) = (p.normalizer_partitions(), b.held());
        x.len() == HALF && y.len() == HALF && x.is_disjoint(&y)
    })
    .await;
    let (held_a, held_b) = (p.normalizer_partitions(), b.held());
    let consumers = settled_normalizer_incarnations(&p.js, (&held_b, b_started)).await;

    let runs = runs(seed);
    put_runs(&p.ingestor, &runs).await;
    let mut per_replica = BTreeMap::new();
    for (run, case, chunks) in &runs {
        let want = expected(&case.family, &case.bytes);
        let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
        assert_archive_eq(
            run,
            &got,
            &want,
            &format!("{} ({} chunks, seed {seed})", case.name, chunks.len()),
        );
        let part = partition_of(run, DEFAULT_PARTITIONS);
        let owner = if held_a.contains(&part) { "a" } else { "b" };
        assert!(
            held_a.contains(&part) != held_b.contains(&part),
            "partition {part} held by both or neither"
        );
        *per_replica.entry(owner).or_insert(0) += 1;
    }
    wait_quiet(&p.js).await;
    // Nothing moved while the runs went through: each partition — so each run — had one
    // holder, the only replica consuming it.
    assert_eq!(
        (p.normalizer_partitions(), b.held()),
        (held_a, held_b.clone()),
        "partitions moved during the test"
    );
    assert_eq!(
        normalizer_redeliveries(&p.js).await,
        0,
        "a raw chunk was delivered twice (seed {seed})"
    );
    // Nor did any worker start its partition over (a gap, a failed batch): the same
    // consumer incarnations took every chunk.
    assert_eq!(
        settled_normalizer_incarnations(&p.js, (&held_b, b_started)).await,
        consumers,
        "a partition's consumer was made again (seed {seed})"
    );
    assert_eq!(p.store.conflicts_total(), 0);
    eprintln!(
        "{} runs, normalized per replica: {per_replica:?} (seed {seed})",
        runs.len()
    );
    assert_eq!(per_replica.len(), 2, "one replica normalized nothing");
    b.stop().await;
    eventually("the pipeline's normalizer took b's partitions", || {
        p.normalizer_partitions().len() == DEFAULT_PARTITIONS as usize
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_normalizer_hands_its_partitions_to_the_survivor_after_the_ttl() {
    let seed = seed("a_sigkilled_normalizer_hands_its_partitions");
    let (nats, js) = streamgate_testkit::NatsServer::with_streams().await;
    let store = TestStore::new(Backend::Sqlite).await;
    let logs = tempfile::tempdir().unwrap();
    let _archiver = Service::spawn(
        "archiver",
        &archiver_args(&nats.url(), &store.url),
        logs.path(),
    );
    let ttl_secs = 3;
    let normalizer = |name: &str| {
        let mut args = normalizer_args(&nats.url(), 600);
        args.extend(["--lease-ttl".to_owned(), ttl_secs.to_string()]);
        Service::spawn(name, &args, logs.path())
    };
    let mut survivor = normalizer("normalizer-1");
    let mut victim = normalizer("normalizer-2");
    wait_consumer(&js, EVENTS_STREAM, "sg-archiver").await;
    let reader = store.open().await;
    let group = streamgate_normalizer::worker::lease_group();
    let member_of = |s: &Service| format!("-{}-", s.pid().unwrap());
    let (survivor_id, victim_id) = (member_of(&survivor), member_of(&victim));
    // Ownership as the bucket records it: half the partitions under each process's member id.
    let deadline = Instant::now() + PATIENCE;
    let victim_parts: BTreeSet<u32> = loop {
        let owners = lease_owners(&js, &group).await;
        let of = |id: &str| -> BTreeSet<u32> {
            owners
                .iter()
                .filter(|(_, o)| o.contains(id))
                .map(|(p, _)| *p)
                .collect()
        };
        let (s, v) = (of(&survivor_id), of(&victim_id));
        if s.len() == HALF && v.len() == HALF {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the two processes never split the partitions: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    wait_normalizer(&js, "sg-normalizer").await;

    let ingestor = streamgate_normalizer::ingest::Ingestor::new(js.clone(), DEFAULT_PARTITIONS);
    let runs = runs(seed);
    let on_victim: Vec<&String> = runs
        .iter()
        .map(|(run, _, _)| run)
        .filter(|run| victim_parts.contains(&partition_of(run, DEFAULT_PARTITIONS)))
        .collect();
    assert!(!on_victim.is_empty(), "no run on the victim's partitions");
    // The first half of every run, then wait until a run of the victim's is in flight.
    let halves = runs.iter().map(|(run, case, chunks)| {
        let ingestor = ingestor.clone();
        let sp = spec(run, &case.family);
        async move { put_range(&ingestor, &sp, chunks, 0, chunks.len() / 2).await }
    });
    futures::future::join_all(halves).await;
    let longest = runs
        .iter()
        .filter(|(run, _, _)| on_victim.contains(&run))
        .max_by_key(|(_, _, chunks)| chunks.len())
        .map(|(run, _, _)| run.clone())
        .unwrap();
    wait_some(&*reader, &longest, 1).await;
    survivor.assert_running();
    victim.kill();
    let killed = Instant::now();
    eprintln!("SIGKILLed the normalizer holding {victim_parts:?}");

    let rest = runs.iter().map(|(run, case, chunks)| {
        let ingestor = ingestor.clone();
        let sp = spec(run, &case.family);
        async move {
            put_range(&ingestor, &sp, chunks, chunks.len() / 2, chunks.len()).await;
            put(
                &ingestor,
                &sp,
                chunks.len() as u64,
                Bytes::new(),
                Some(streamgate_bus::raw::CloseKind::Normal),
            )
            .await;
        }
    });
    futures::future::join_all(rest).await;

    let deadline = Instant::now() + PATIENCE;
    loop {
        let owners = lease_owners(&js, &group).await;
        if owners.len() == DEFAULT_PARTITIONS as usize
            && owners.values().all(|o| o.contains(&survivor_id))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the survivor never took the dead replica's partitions: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "survivor holds all {DEFAULT_PARTITIONS} partitions {:?} after the kill (lease TTL {ttl_secs} s)",
        killed.elapsed()
    );
    for (run, case, chunks) in &runs {
        survivor.assert_running();
        let want = expected(&case.family, &case.bytes);
        let got = wait_run(&*reader, run, want.len(), PATIENCE).await;
        assert_archive_eq(
            run,
            &got,
            &want,
            &format!(
                "{} ({} chunks, seed {seed}, victim's: {})",
                case.name,
                chunks.len(),
                on_victim.contains(&run)
            ),
        );
        let row = reader.get_run(TENANT, run).await.unwrap().unwrap();
        assert_eq!(row.event_count as usize, want.len(), "{run}: duplicates");
    }
    assert_eq!(
        reader.conflicts_total(),
        0,
        "conflicting events (seed {seed})"
    );
    if std::env::var_os("E2E_LOGS").is_some() {
        eprintln!("{}", tail(&survivor.log_text(), 60));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_consumers_deleted_mid_ingest_are_made_again_and_nothing_is_lost() {
    let p = Pipeline::start(Backend::Sqlite).await;
    wait_normalizer(&p.js, "sg-normalizer").await;
    let runs = runs(7);
    // The first half of every run's chunks.
    futures::future::join_all(runs.iter().map(|(run, case, chunks)| {
        let spec = spec(run, &case.family);
        let ingestor = &p.ingestor;
        async move { put_range(ingestor, &spec, chunks, 0, chunks.len() / 2).await }
    }))
    .await;
    let raw = p.js.get_stream(RAW_STREAM).await.expect("SG_RAW");
    let mut deleted = Vec::new();
    for base in normalizer_durables("sg-normalizer") {
        let now = current_consumer(&p.js, RAW_STREAM, &base)
            .await
            .expect("a consumer per partition");
        assert_ne!(now.name, base, "served by an incarnation of its own");
        raw.delete_consumer(&now.name).await.expect("delete");
        deleted.push(now.name);
    }
    // The rest, and the close markers.
    futures::future::join_all(runs.iter().map(|(run, case, chunks)| {
        let spec = spec(run, &case.family);
        let ingestor = &p.ingestor;
        async move {
            put_range(ingestor, &spec, chunks, chunks.len() / 2, chunks.len()).await;
            put(
                ingestor,
                &spec,
                chunks.len() as u64,
                Bytes::new(),
                Some(streamgate_bus::raw::CloseKind::Normal),
            )
            .await;
        }
    }))
    .await;
    for (run, case, chunks) in &runs {
        let want = expected(&case.family, &case.bytes);
        let got = wait_run(&*p.store, run, want.len(), PATIENCE).await;
        assert_archive_eq(
            run,
            &got,
            &want,
            &format!("{} ({} chunks)", case.name, chunks.len()),
        );
    }
    wait_quiet(&p.js).await;
    for (base, old) in normalizer_durables("sg-normalizer").iter().zip(&deleted) {
        let now = current_consumer(&p.js, RAW_STREAM, base)
            .await
            .expect("made again");
        assert_ne!(&now.name, old, "{base} was made again");
    }
    assert_eq!(p.store.conflicts_total(), 0);
}

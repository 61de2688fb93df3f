//! Archive insert throughput for both backends.
//!
//! ```text
//! cargo run --release -p streamgate-archive --example insert_bench -- \
//!     [--events N] [--batch N] [--runs N] [--writers N] [--backend sqlite|postgres|both]
//! ```
//!
//! Events are generated up front like `SG_EVENTS` delivers them: `--runs` runs streaming
//! concurrently, their events interleaved on the journal, so every batch touches many
//! runs. Each run is `lifecycle/start`, assistant deltas, `lifecycle/end` with usage.
//! The timed part is only `insert_batch`; with `--writers N` that many tasks insert
//! disjoint batches concurrently (archiver replicas / in-flight batches). PostgreSQL uses
//! a fresh database on `$STREAMGATE_PG_URL` (default the local trust-auth server), dropped
//! afterwards; SQLite a file in a temp dir.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;
use streamgate_archive::{open_store, ArchivedEvent, Store};

struct Args {
    events: usize,
    batch: usize,
    runs: usize,
    writers: usize,
    backend: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        events: 200_000,
        batch: 1_000,
        runs: 100,
        writers: 1,
        backend: "both".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let num = || value.parse::<usize>().expect("a number");
        match flag.as_str() {
            "--events" => a.events = num(),
            "--batch" => a.batch = num(),
            "--runs" => a.runs = num(),
            "--writers" => a.writers = num(),
            "--backend" => a.backend = value.clone(),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// The journal: `runs` concurrent runs, interleaved round-robin, `events` in total.
fn journal(events: usize, runs: usize) -> Vec<ArchivedEvent> {
    let per_run = events.div_ceil(runs).max(3) as u64;
    let mut lanes: Vec<std::vec::IntoIter<ArchivedEvent>> = (0..runs)
        .map(|r| {
            common::whole_run(
                &format!("tenant-{}", r % 4),
                &format!("bench-run-{r:05}"),
                1_700_000_000_000 + r as i64,
                per_run - 2,
                0,
            )
            .into_iter()
        })
        .collect();
    let mut out = Vec::with_capacity(events);
    while out.len() < events {
        let before = out.len();
        for lane in lanes.iter_mut() {
            if let Some(mut e) = lane.next() {
                e.journal_seq = out.len() as u64 + 1;
                out.push(e);
                if out.len() == events {
                    break;
                }
            }
        }
        if out.len() == before {
            break;
        }
    }
    out
}

async fn bench(name: &str, store: Arc<dyn Store>, events: &[ArchivedEvent], args: &Args) {
    let batches: Vec<Vec<ArchivedEvent>> = events.chunks(args.batch).map(<[_]>::to_vec).collect();
    let batches = Arc::new(batches);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let store = store.clone();
        let batches = batches.clone();
        let writers = args.writers;
        tasks.push(tokio::spawn(async move {
            let mut inserted = 0u64;
            for b in batches.iter().skip(w).step_by(writers) {
                inserted += store.insert_batch(b).await.expect("insert").inserted;
            }
            inserted
        }));
    }
    let mut inserted = 0;
    for t in tasks {
        inserted += t.await.expect("writer task");
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(inserted, events.len() as u64, "every event is new");
    println!(
        "{name:>8}: {inserted} events in {secs:.2}s = {:.0} events/s (batch {}, {} runs, {} writer(s))",
        inserted as f64 / secs,
        args.batch,
        args.runs,
        args.writers
    );
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let events = journal(args.events, args.runs);
    let payload_bytes: usize = events.iter().map(|e| e.event.event.to_json().len()).sum();
    println!(
        "{} events, {:.0} payload bytes/event on average",
        events.len(),
        payload_bytes as f64 / events.len() as f64
    );
    if args.backend == "sqlite" || args.backend == "both" {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("bench.db").display());
        let store = open_store(&url).await.expect("open sqlite");
        bench("sqlite", store, &events, &args).await;
    }
    if args.backend == "postgres" || args.backend == "both" {
        let db = common::PgDb::create().await;
        let store = open_store(db.url()).await.expect("open postgres");
        bench("postgres", store.clone(), &events, &args).await;
        drop(store);
    }
}

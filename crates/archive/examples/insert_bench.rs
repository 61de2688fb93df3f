//! Archive insert throughput for both backends.
//!
//! ```text
//! cargo run --release -p streamgate-archive --example insert_bench -- \
//!     [--events N] [--batch N] [--runs N] [--writers N] [--backend sqlite|postgres|both] \
//!     [--run-events N] [--provenance none|apart|joined] [--history N]
//! ```
//!
//! Events are generated up front like `SG_EVENTS` delivers them: `--runs` runs streaming
//! concurrently, their events interleaved on the journal, so every batch touches many
//! runs. With `--run-events N` each run has N events and is followed by a new one in its
//! place (runs starting all the time, as in `streamgate bench pipeline`: 268); without,
//! each of the `--runs` runs lasts the whole journal. Each run is `lifecycle/start`,
//! assistant deltas, `lifecycle/end` with usage.
//!
//! The timed part is only the store's calls; with `--writers N` that many tasks insert
//! disjoint batches concurrently (archiver replicas / in-flight batches). With
//! `--provenance` each batch also stamps what made its runs, as the archiver does:
//! `apart` in a second transaction (`record_provenance`, the archiver up to 2026-12-03),
//! `joined` in the same one (`insert_batch_with_provenance`, the archiver since).
//! With `--history N` the archive first holds N finished runs of earlier chats (untimed),
//! and every run has a session key of its own, as in production: a live run's `runs` row
//! and index entries then lie among theirs instead of on the few pages a fresh archive
//! has. SQLite's line also gives the bytes this process wrote to storage per event in
//! the timed part (`/proc/self/io`; the WAL, its checkpoints and the fsyncs' metadata).
//! PostgreSQL uses a fresh database on `$STREAMGATE_PG_URL` (default the local trust-auth
//! server), dropped afterwards; SQLite a file in a temp dir.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;
use streamgate_archive::{open_store, ArchivedEvent, Provenance, RunProvenance, Store};

struct Args {
    events: usize,
    batch: usize,
    runs: usize,
    writers: usize,
    backend: String,
    provenance: String,
    run_events: Option<usize>,
    history: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        events: 200_000,
        batch: 1_000,
        runs: 100,
        writers: 1,
        backend: "both".into(),
        provenance: "none".into(),
        run_events: None,
        history: 0,
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
            "--provenance" => a.provenance = value.clone(),
            "--run-events" => a.run_events = Some(num()),
            "--history" => a.history = num(),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// The journal: `runs` lanes of runs of `per_run` events each (or one run per lane
/// lasting the whole journal), interleaved round-robin, `events` in total.
fn journal(events: usize, runs: usize, per_run: Option<usize>) -> Vec<ArchivedEvent> {
    let per_run = per_run.unwrap_or(events.div_ceil(runs)).max(3) as u64;
    let run = |lane: usize, k: usize| {
        common::whole_run(
            &format!("tenant-{}", lane % 4),
            &format!("bench-run-{lane:05}-{k:05}"),
            1_700_000_000_000 + lane as i64,
            per_run - 2,
            0,
        )
        .into_iter()
    };
    let mut lanes: Vec<(usize, std::vec::IntoIter<ArchivedEvent>)> =
        (0..runs).map(|lane| (0, run(lane, 0))).collect();
    let mut out = Vec::with_capacity(events);
    while out.len() < events {
        for (lane, (k, events_left)) in lanes.iter_mut().enumerate() {
            let mut e = match events_left.next() {
                Some(e) => e,
                None => {
                    *k += 1;
                    *events_left = run(lane, *k);
                    events_left.next().expect("a run has events")
                }
            };
            e.journal_seq = out.len() as u64 + 1;
            out.push(e);
            if out.len() == events {
                break;
            }
        }
    }
    out
}

/// A session key of its own for a run, spread over the key space as chat ids are.
fn session_of(run_id: &str) -> String {
    let h = run_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("chat-{h:016x}")
}

/// Gives every event the session key of its run ([`session_of`]).
fn own_sessions(events: &mut [ArchivedEvent]) {
    for e in events {
        let envelope = &mut e.event.envelope;
        envelope.session_key = Some(session_of(&envelope.run_id));
    }
}

/// `n` finished runs of three events each, before the journal's first (untimed).
fn history(n: usize) -> Vec<ArchivedEvent> {
    let mut out: Vec<ArchivedEvent> = (0..n)
        .flat_map(|i| {
            common::whole_run(
                &format!("tenant-{}", i % 4),
                &format!("old-run-{i:07}"),
                1_600_000_000_000 + i as i64,
                1,
                0,
            )
        })
        .collect();
    own_sessions(&mut out);
    out
}

/// Bytes this process has written to storage (Linux; 0 elsewhere).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes: ")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One stamp per run of the batch, as the archiver reads them off its messages.
fn provenances(batch: &[ArchivedEvent]) -> Vec<RunProvenance> {
    let runs: std::collections::BTreeSet<(&str, &str)> = batch
        .iter()
        .map(|e| {
            (
                e.event.envelope.tenant.as_str(),
                e.event.envelope.run_id.as_str(),
            )
        })
        .collect();
    runs.into_iter()
        .map(|(tenant, run_id)| RunProvenance {
            tenant: tenant.to_owned(),
            run_id: run_id.to_owned(),
            provenance: Provenance {
                adapter: "bench".to_owned(),
                adapter_version: 1,
                grammar_version: 1,
            },
        })
        .collect()
}

/// One batch, with its provenance as `--provenance` says.
async fn insert(store: &dyn Store, batch: &[ArchivedEvent], mode: &str) -> u64 {
    let runs = provenances(batch);
    let outcome = match mode {
        "none" => store.insert_batch(batch).await,
        "apart" => match store.insert_batch(batch).await {
            Ok(outcome) => store.record_provenance(&runs).await.map(|()| outcome),
            Err(e) => Err(e),
        },
        "joined" => store.insert_batch_with_provenance(batch, &runs).await,
        other => panic!("--provenance is none, apart or joined, not {other}"),
    };
    outcome.expect("insert").inserted
}

async fn bench(name: &str, store: Arc<dyn Store>, events: &[ArchivedEvent], args: &Args) {
    let batches: Vec<Vec<ArchivedEvent>> = events.chunks(args.batch).map(<[_]>::to_vec).collect();
    let batches = Arc::new(batches);
    for old in history(args.history).chunks(3_000) {
        store.insert_batch(old).await.expect("history");
    }
    let written = written_bytes();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let store = store.clone();
        let batches = batches.clone();
        let writers = args.writers;
        let mode = args.provenance.clone();
        tasks.push(tokio::spawn(async move {
            let mut inserted = 0u64;
            let mut took = Vec::new();
            for b in batches.iter().skip(w).step_by(writers) {
                let one = Instant::now();
                inserted += insert(&*store, b, &mode).await;
                took.push(one.elapsed());
            }
            (inserted, took)
        }));
    }
    let (mut inserted, mut took) = (0, Vec::new());
    for t in tasks {
        let (n, times) = t.await.expect("writer task");
        inserted += n;
        took.extend(times);
    }
    let secs = started.elapsed().as_secs_f64();
    // Each insert from its call to its reply: a stall of the writer (a checkpoint inside a
    // commit) shows in the tail, which the mean per batch hides.
    took.sort_unstable();
    let at = |q: f64| {
        took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    // The store's own process writes only for SQLite; PostgreSQL's server writes its own.
    let written = match name {
        "sqlite" => format!(
            ", {:.0} bytes written per event",
            written_bytes().saturating_sub(written) as f64 / inserted.max(1) as f64
        ),
        _ => String::new(),
    };
    assert_eq!(inserted, events.len() as u64, "every event is new");
    println!(
        "{name:>8}: {inserted} events in {secs:.2}s = {:.0} events/s, {:.2} ms per batch \
         (batch {}, {} runs, {} writer(s), provenance {}, history {}){written}; \
         each insert p50 {:.2} / p99 {:.2} / max {:.2} ms",
        inserted as f64 / secs,
        secs * 1000.0 / batches.len() as f64,
        args.batch,
        args.runs,
        args.writers,
        args.provenance,
        args.history,
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let mut events = journal(args.events, args.runs, args.run_events);
    if args.history > 0 {
        own_sessions(&mut events);
    }
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

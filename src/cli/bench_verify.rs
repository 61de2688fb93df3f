//! `streamgate bench verify`: `streamgate verify`'s throughput on an archive of a given
//! size, on this machine.
//!
//! It fills a fresh SQLite archive (in a temp dir unless `--dir`) with runs of bundled
//! captures of several families, each grown to `--run-kib` and archived the way the live
//! pipeline archives a run (4 KiB raw chunks, the events each chunk yields, the close
//! marker), until the database file reaches `--mib`. Then it verifies every run with the
//! archiver's engine — the code the ArchiveService's `Verify` runs — and prints runs/s and
//! MB/s of raw bytes re-normalized, with the engine's peak memory growth.

use anyhow::Result;
use std::path::PathBuf;
use std::time::Instant;
use streamgate_archive::{open_store, ArchivedEvent, RawChunkRecord, Store};
use streamgate_archiver::history::verify::verify_run;
use streamgate_archiver::history::{runs_in_scope, Scope, Verdict};
use streamgate_grammar::{Envelope, RunEvent};
use streamgate_wire::{Close, FamilyChoice, Normalizer};

/// Flags of `streamgate bench verify`.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// Archive size to fill to, MiB (the SQLite file).
    #[arg(long, default_value_t = 1024)]
    pub mib: u64,
    /// Size each run's capture is grown to, KiB.
    #[arg(long, default_value_t = 64)]
    pub run_kib: usize,
    /// Directory for the archive (kept); default: a directory under the system's temp
    /// dir, removed after.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The bundled captures runs are made of: (family, bytes).
const CAPTURES: &[(&str, &[u8])] = &[
    ("f1", include_bytes!("../../fixtures/f1/tool-use.sse")),
    (
        "f2",
        include_bytes!("../../fixtures/f2/deepseek-thinking.sse"),
    ),
    ("f3", include_bytes!("../../fixtures/f3/compaction.sse")),
    (
        "openclaw-events",
        include_bytes!("../../fixtures/openclaw-events/answer.jsonl"),
    ),
];

/// Raw chunk size, as the HTTP front door cuts a body at most.
const CHUNK: usize = 4096;
/// Runs per insert transaction while filling.
const RUNS_PER_BATCH: usize = 64;
/// The broker's default message limit: what live events are cut to.
const MAX_PAYLOAD: usize = 1 << 20;

/// Runs the benchmark and prints its figures.
pub async fn verify(args: VerifyArgs) -> Result<()> {
    let temp = std::env::temp_dir().join(format!("streamgate-bench-verify-{}", std::process::id()));
    let dir = args.dir.clone().unwrap_or_else(|| temp.clone());
    std::fs::create_dir_all(&dir)?;
    let result = run(&args, &dir).await;
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    result
}

async fn run(args: &VerifyArgs, dir: &std::path::Path) -> Result<()> {
    let path = dir.join("bench-archive.db");
    let store = open_store(&format!("sqlite://{}?synchronous=normal", path.display())).await?;
    let grown: Vec<(&str, Vec<u8>)> = CAPTURES
        .iter()
        .map(|(f, b)| (*f, streamgate_wire::synth::inflate(b, args.run_kib << 10)))
        .collect();

    let started = Instant::now();
    let (filled, raw) = fill(&*store, &path, &grown, args.mib << 20).await?;
    let size = std::fs::metadata(&path)?.len();
    println!(
        "filled {:.0} MiB archive: {filled} runs, {:.0} MiB raw, in {:.0} s",
        size as f64 / f64::from(1 << 20),
        raw as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64()
    );

    let rss0 = peak_rss_kib();
    let started = Instant::now();
    // The run list first (a few thousand records), then each run as `Verify` does it.
    let mut runs = Vec::new();
    runs_in_scope(&*store, &Scope::default(), |page| {
        runs.extend(page);
        async { Ok(true) }
    })
    .await?;
    let (mut checked, mut identical, mut raw_bytes) = (0u64, 0u64, 0u64);
    for run in &runs {
        let (report, _) = verify_run(&*store, run, MAX_PAYLOAD, false).await?;
        checked += 1;
        identical += u64::from(report.verdict == Verdict::Identical);
        raw_bytes += report.raw_bytes;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "verify: {checked} runs ({identical} identical) in {secs:.1} s = {:.0} runs/s, {:.1} MB/s of raw; peak RSS +{} MiB",
        checked as f64 / secs,
        raw_bytes as f64 / 1e6 / secs,
        peak_rss_kib().saturating_sub(rss0) / 1024
    );
    Ok(())
}

/// Archives runs until the file reaches `target` bytes; returns (runs, raw bytes).
async fn fill(
    store: &dyn Store,
    path: &std::path::Path,
    captures: &[(&str, Vec<u8>)],
    target: u64,
) -> Result<(u64, u64)> {
    let (mut runs, mut raw) = (0u64, 0u64);
    loop {
        let mut chunks = Vec::new();
        let mut events = Vec::new();
        for _ in 0..RUNS_PER_BATCH {
            let (family, bytes) = &captures[runs as usize % captures.len()];
            let run_id = format!("bench-{runs:08}");
            archive_run(&run_id, family, bytes, &mut chunks, &mut events);
            raw += bytes.len() as u64;
            runs += 1;
        }
        store.insert_raw(&chunks).await?;
        store.insert_batch(&events).await?;
        if std::fs::metadata(path)?.len() >= target {
            return Ok((runs, raw));
        }
    }
}

/// A run as the live pipeline archives it.
fn archive_run(
    run_id: &str,
    family: &str,
    bytes: &[u8],
    chunks: &mut Vec<RawChunkRecord>,
    events: &mut Vec<ArchivedEvent>,
) {
    let mut n = Normalizer::new(family.parse().unwrap_or(FamilyChoice::Auto));
    let pieces: Vec<&[u8]> = bytes.chunks(CHUNK).collect();
    for i in 0..=pieces.len() {
        let close = i == pieces.len();
        let body = pieces.get(i).copied().unwrap_or_default();
        let ts = 1_700_000_000_000 + i as i64;
        n.feed(body);
        if close {
            n.close(Close::Normal);
        }
        chunks.push(RawChunkRecord {
            tenant: "bench".into(),
            run_id: run_id.into(),
            chunk: i as u64,
            family: family.into(),
            ingest_ts_ms: ts,
            close: close.then(|| "normal".to_owned()),
            body: body.to_vec(),
        });
        let envelope = Envelope {
            tenant: "bench".into(),
            session_key: None,
            run_id: run_id.into(),
            ts_ms: ts,
        };
        let mut produced: Vec<RunEvent> = n
            .drain()
            .map(|event| RunEvent {
                envelope: envelope.clone(),
                event,
            })
            .collect();
        streamgate_wire::oversize::fit(&mut produced, MAX_PAYLOAD);
        events.extend(produced.into_iter().map(|event| ArchivedEvent {
            event,
            journal_seq: 1,
        }));
    }
}

/// This process's peak resident set (`VmHWM`), KiB; 0 where /proc is unavailable.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

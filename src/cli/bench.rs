//! `streamgate bench pipeline`: the whole pipeline under load on this machine.
//!
//! It starts a private nats-server, the normalizer and the archiver (SQLite in a temp dir
//! unless `--archive` names a store), measures a raw JetStream publish baseline, then has
//! N producers replay a capture concurrently at full speed, in frames of `--chunk-bytes`,
//! through the HTTP front door (`--door direct`: a chunk per frame through the ingestor,
//! as gRPC and NATS producers send) beside the broker-only floor
//! ([`super::bench_baseline`]), and reports events/s
//! archived, ingest→archive-commit latency (p50/p99, from each event's ingest time to
//! the commit of its batch) and the CPU time each event cost this process and
//! nats-server (steadier than events/s on a machine whose speed drifts).

use super::bench_baseline::{self, Acks};
use super::bench_proc::{context_switches, cpu_seconds, storage_bytes, thread_times, ThreadTimes};
use anyhow::{Context, Result};
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use streamgate_archiver::{ArchiverListen, CommitHook, ConsumerConfig};
use streamgate_bus::local::{free_port, nats_server_binary, LocalNats};
use streamgate_bus::raw::CloseKind;
use streamgate_normalizer::ingest::flow::Window;
use streamgate_normalizer::ingest::{Ingestor, RunSpec};
use streamgate_normalizer::{Listeners, NormalizerConfig};

/// Flags of `streamgate bench pipeline`.
#[derive(Debug, Clone, clap::Args)]
pub struct PipelineArgs {
    /// Concurrent runs (producers).
    #[arg(long, default_value_t = 32)]
    pub runs: usize,
    /// Runs each producer replays, one after another. The default, 32, is a few seconds of
    /// full-speed work: fewer rounds end before the pipeline reaches a steady state, and
    /// their figures mostly measure start-up and the last run's drain.
    #[arg(long, default_value_t = 32)]
    pub rounds: usize,
    /// Capture each run replays (default: a bundled reasoning capture grown to ~64 KiB).
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Family of `--capture`.
    #[arg(long, default_value = "auto")]
    pub family: String,
    /// Bytes per frame a producer sends (and per message of the baseline).
    #[arg(long, default_value_t = 1024)]
    pub chunk_bytes: usize,
    /// The front door the producers hand their runs to.
    #[arg(long, value_enum, default_value_t = Door::Http)]
    pub door: Door,
    /// Archive URL (default: SQLite in a temp dir; a new SQLite archive's page size with
    /// `?page_size=4096`, whose effect the `disk` line shows).
    #[arg(long)]
    pub archive: Option<String>,
    /// Messages for the raw JetStream publish baseline.
    #[arg(long, default_value_t = 100_000)]
    pub baseline_messages: usize,
    /// Offered load in events/s across all producers (0 = full speed). Latency is only
    /// meaningful below saturation: at full speed it measures the backlog.
    #[arg(long, default_value_t = 0, conflicts_with = "percent_of_max")]
    pub rate: u64,
    /// Measure the maximum first (a full-speed run), then offer this percentage of it (a
    /// second run, fresh servers): the latency at a given share of what this machine can
    /// do, in one command. 80 is the yardstick of docs/performance.md.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub percent_of_max: Option<u8>,
    /// Measure the maximum first, then offer each of these percentages of it in turn
    /// (`--sweep 10,30,50,80`, a fresh deployment each), and print what an event costs
    /// and how long it waits at each: batches, and so the work per event, shrink with
    /// the load (docs/performance.md, twenty-third stop).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = clap::value_parser!(u8).range(1..=100),
        conflicts_with_all = ["rate", "percent_of_max", "repeat"]
    )]
    pub sweep: Vec<u8>,
    /// Partitions of the bench deployment: the normalizer runs one durable consumer per
    /// partition, so this is the broker's consumer count.
    #[arg(long, default_value_t = streamgate_bus::DEFAULT_PARTITIONS)]
    pub partitions: u32,
    /// The archiver's shortest time between two commits, ms (the service's
    /// `--commit-interval-ms`; default: the service's default; at most 60000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub commit_interval_ms: Option<u64>,
    /// Archive the raw chunks too, as `streamgate up` and the Kubernetes manifests do
    /// (the archiver's `--archive-raw`): a second consumer on `SG_RAW` and its writes.
    #[arg(long)]
    pub archive_raw: bool,
    /// Also print latency second by second (commit time), to tell stalls from steady
    /// queueing, and the normalizer's hop (ingest → events published) apart from the
    /// archiver's. The hop is read by a subscriber on SG_EVENTS' subjects, which costs the
    /// broker one more delivery per events message.
    #[arg(long)]
    pub timeline: bool,
    /// Runs of the whole benchmark (each on a fresh nats-server and archive), followed by
    /// the min / median / max of their figures: on a noisy machine one run says little.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
}

/// How `bench pipeline`'s producers hand their runs to the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Door {
    /// A POST per run to the normalizer's HTTP ingest, the body streamed in frames of
    /// `--chunk-bytes` (as a gateway relays a provider's stream): the door cuts the
    /// chunks, and joins the lines that arrive while its previous publish is in flight.
    Http,
    /// Each frame a chunk of its own, numbered by the producer and published by the
    /// ingestor in this process (as gRPC and NATS producers do).
    Direct,
}

/// The headline figures of one run, for [`pipeline`]'s summary over `--repeat` runs.
#[derive(Debug, Clone, Copy)]
struct Figures {
    events_per_s: f64,
    ratio_pct: f64,
    /// The relay floor with an ack per message and with one per pull, % of the baseline.
    floor_pct: [f64; 2],
    /// Ingest→commit latency, p50 and p99, ms.
    p50_ms: i64,
    p99_ms: i64,
    /// CPU time per archived event during the pipeline, µs: this process (the services
    /// and the bench's producers) and nats-server. On a machine whose speed drifts, far
    /// steadier than events/s for comparing builds.
    cpu_us_per_event: [f64; 2],
    /// Bytes this process (the archive) sent to storage per archived event; NaN where
    /// it cannot be read.
    archive_bytes_per_event: f64,
}

const DEFAULT_CAPTURE: &[u8] = include_bytes!("../../fixtures/f2/deepseek-thinking.sse");

/// Runs the benchmark `--repeat` times, printing each run's figures, then their spread.
pub async fn pipeline(args: PipelineArgs) -> Result<()> {
    if !args.sweep.is_empty() {
        return sweep(&args).await;
    }
    let runs = args.repeat.max(1);
    let mut all = Vec::with_capacity(runs);
    for i in 1..=runs {
        if runs > 1 {
            println!("== run {i} of {runs}");
        }
        all.push(match args.percent_of_max {
            None => pipeline_once(&args).await?,
            Some(pct) => at_percent_of_max(&args, pct).await?,
        });
    }
    if runs > 1 {
        let spread = |f: fn(&Figures) -> f64| {
            let mut v: Vec<f64> = all.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            (v[0], v[v.len() / 2], v[v.len() - 1])
        };
        let (lo, mid, hi) = spread(|f| f.events_per_s);
        println!(
            "summary   {runs} runs, min / median / max: {lo:.0} / {mid:.0} / {hi:.0} events/s"
        );
        let (lo, mid, hi) = spread(|f| f.ratio_pct);
        println!("summary   ratio {lo:.1} / {mid:.1} / {hi:.1}% of the baseline");
        let (lo, mid, hi) = spread(|f| f.floor_pct[0]);
        let (lo1, mid1, hi1) = spread(|f| f.floor_pct[1]);
        println!(
            "summary   floor {lo:.0} / {mid:.0} / {hi:.0}% (an ack per message), {lo1:.0} / {mid1:.0} / {hi1:.0}% (an ack per pull)"
        );
        let (lo, mid, hi) = spread(|f| f.cpu_us_per_event[0]);
        let (lo1, mid1, hi1) = spread(|f| f.cpu_us_per_event[1]);
        println!(
            "summary   cpu per event {lo:.2} / {mid:.2} / {hi:.2} µs (this process), {lo1:.2} / {mid1:.2} / {hi1:.2} µs (nats-server)"
        );
        let (lo, mid, hi) = spread(|f| f.p99_ms as f64);
        let at = args
            .percent_of_max
            .map_or(String::new(), |p| format!(" at {p}% of the maximum"));
        println!("summary   ingest→commit p99{at} {lo:.0} / {mid:.0} / {hi:.0} ms");
        let (lo, mid, hi) = spread(|f| f.archive_bytes_per_event);
        println!(
            "summary   archive writes to storage{at} {lo:.0} / {mid:.0} / {hi:.0} bytes per event"
        );
    }
    Ok(())
}

/// A full-speed run, then one run at each `--sweep` percentage of the events/s it
/// reached; prints each run's figures, then one line per load.
async fn sweep(args: &PipelineArgs) -> Result<()> {
    let full = PipelineArgs {
        rate: 0,
        sweep: Vec::new(),
        ..args.clone()
    };
    println!("-- the maximum (full speed)");
    let max = pipeline_once(&full).await?;
    let mut rows = vec![("full speed".to_owned(), max)];
    for &pct in &args.sweep {
        let rate = share_of(&max, pct);
        println!("-- {pct}% of the maximum: {rate} events/s");
        let paced = pipeline_once(&PipelineArgs {
            rate,
            ..full.clone()
        })
        .await?;
        rows.push((format!("{pct}%, {rate}/s"), paced));
    }
    println!(
        "sweep     load: events/s archived; ingest→commit p50 / p99; CPU per event, this process + nats-server; the box busy (% of a core)"
    );
    for (load, f) in &rows {
        let [process, broker] = f.cpu_us_per_event;
        println!(
            "sweep     {load}: {:.0} events/s; {} / {} ms; {process:.2} + {broker:.2} µs; {:.0}%",
            f.events_per_s,
            f.p50_ms,
            f.p99_ms,
            (process + broker) * f.events_per_s / 1e4
        );
    }
    Ok(())
}

/// `pct`% of the events/s a full-speed run reached: the rate a paced run is offered.
fn share_of(max: &Figures, pct: u8) -> u64 {
    (max.events_per_s * f64::from(pct) / 100.0).round().max(1.0) as u64
}

/// A full-speed run, then a run offered `pct`% of the events/s it reached; returns the
/// first one's throughput figures with the second one's latency.
async fn at_percent_of_max(args: &PipelineArgs, pct: u8) -> Result<Figures> {
    let full = PipelineArgs {
        rate: 0,
        ..args.clone()
    };
    println!("-- the maximum (full speed)");
    let max = pipeline_once(&full).await?;
    let rate = share_of(&max, pct);
    println!(
        "-- {pct}% of the maximum ({:.0} events/s): {rate} events/s",
        max.events_per_s
    );
    let paced = pipeline_once(&PipelineArgs { rate, ..full }).await?;
    Ok(Figures {
        p50_ms: paced.p50_ms,
        p99_ms: paced.p99_ms,
        archive_bytes_per_event: paced.archive_bytes_per_event,
        ..max
    })
}

/// One run of the benchmark: prints its figures and returns the headline ones.
async fn pipeline_once(args: &PipelineArgs) -> Result<Figures> {
    let tmp = std::env::temp_dir().join(format!("sg-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let nats_server = LocalNats::spawn(&nats_server_binary()?, free_port()?, &tmp.join("nats"))?;
    let nats = async_nats::connect(nats_server.url()).await?;
    let js = async_nats::jetstream::new(nats.clone());

    let (capture, family) = match &args.capture {
        Some(p) => (
            std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
            args.family.clone(),
        ),
        None => (
            streamgate_wire::synth::inflate(DEFAULT_CAPTURE, 64 << 10),
            "f2".to_owned(),
        ),
    };
    let choice: streamgate_wire::FamilyChoice = family.parse().map_err(anyhow::Error::msg)?;
    let events_per_run = streamgate_wire::normalize_bytes(choice, &capture, 0)
        .events
        .len();
    let total_runs = args.runs * args.rounds;
    let total_events = events_per_run * total_runs;
    println!(
        "capture: {} bytes, {events_per_run} events per run; {} producers × {} rounds = {total_runs} runs, {total_events} events",
        capture.len(),
        args.runs,
        args.rounds
    );

    // The archive first: a bad `--archive` stops the benchmark before its baseline.
    let archive_url = args
        .archive
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", tmp.join("archive.db").display()));
    let store = streamgate_archive::open_store(&archive_url).await?;

    // 1. Baseline: raw JetStream publishes of chunk-sized messages, acks pipelined.
    let baseline = bench_baseline::publish(&js, args.baseline_messages, args.chunk_bytes).await?;
    println!("baseline  JetStream publish (file store, acked): {baseline:.0} msgs/s");
    // The floor under any design that stores a chunk and consumes it from JetStream.
    let mut floor = [0.0; 2];
    for (pct, acks) in floor.iter_mut().zip([Acks::EachMessage, Acks::EachBatch]) {
        let consumer_nats = async_nats::connect(nats_server.url()).await?;
        let rate = bench_baseline::relay(
            &js,
            consumer_nats,
            args.baseline_messages,
            args.chunk_bytes,
            acks,
        )
        .await?;
        *pct = 100.0 * rate / baseline.max(1.0);
        println!(
            "floor     publish + pull + ack, no processing ({}): {rate:.0} msgs/s = {pct:.0}% of the baseline",
            acks.label()
        );
    }

    // 2. The pipeline. Its services' own histograms split a chunk's time by step (none
    // when a recorder is already installed).
    let steps = install_step_recorder();
    let shutdown = tokio_util::sync::CancellationToken::new();
    // (commit time, ingest→commit latency) of every archived event, in ms.
    let latencies = Arc::new(Mutex::new(Vec::<(i64, i64)>::with_capacity(total_events)));
    let commits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook = {
        let (latencies, commits) = (latencies.clone(), commits.clone());
        CommitHook(Arc::new(move |batch| {
            commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let now = streamgate_runtime::clock::now_ms();
            if let Ok(mut l) = latencies.lock() {
                l.extend(batch.iter().map(|e| (now, now - e.event.envelope.ts_ms)));
            }
        }))
    };
    // The services and the producers each on a connection of their own, as deployed (one
    // process each): one shared connection would serialize the whole pipeline's traffic
    // through one socket and one reader task.
    let normalizer = streamgate_normalizer::start(
        async_nats::connect(nats_server.url()).await?,
        NormalizerConfig::default(),
        Listeners {
            grpc: None,
            http: (args.door == Door::Http).then(|| ([127, 0, 0, 1], 0).into()),
            ingest_token: Some(BENCH_TOKEN.to_owned()),
            partitions: args.partitions,
            ..Default::default()
        },
        shutdown.clone(),
    )
    .await?;
    let door = match normalizer.http {
        Some(addr) => Producers::Http {
            client: reqwest::Client::new(),
            base: format!("http://{addr}/v1/ingest/bench"),
        },
        None => Producers::Direct(Box::new(Ingestor::new(js.clone(), args.partitions))),
    };
    let archiver = streamgate_archiver::start(
        async_nats::connect(nats_server.url()).await?,
        store,
        ConsumerConfig {
            on_commit: Some(hook),
            archive_raw: args.archive_raw,
            commit_interval: args.commit_interval_ms.map_or(
                ConsumerConfig::default().commit_interval,
                std::time::Duration::from_millis,
            ),
            ..ConsumerConfig::default()
        },
        ArchiverListen {
            grpc: None,
            operator_token: "bench".into(),
            partitions: args.partitions,
            ..Default::default()
        },
        shutdown.clone(),
    )
    .await?;

    let hop = if args.timeline {
        Some(HopProbe::start(nats_server.url()).await?)
    } else {
        None
    };

    let capture = Bytes::from(capture);
    let frames_per_run = capture.len().div_ceil(args.chunk_bytes.max(1));
    // The frames and the close marker (the pacing below counts both).
    let chunks_per_run = frames_per_run + 1;
    // Each producer sends one chunk per tick; the tick makes the producers together
    // offer `rate` events/s.
    let tick = (args.rate > 0).then(|| {
        let chunks_per_sec =
            args.rate as f64 * chunks_per_run as f64 / events_per_run.max(1) as f64;
        Duration::from_secs_f64(args.runs as f64 / chunks_per_sec)
    });
    let cpu_before = [cpu_seconds(None), cpu_seconds(nats_server.pid())];
    let stored_before = [storage_bytes(None), storage_bytes(nats_server.pid())];
    let threads_before = [thread_times(None), thread_times(nats_server.pid())];
    let switches_before = [context_switches(None), context_switches(nats_server.pid())];
    let started = Instant::now();
    let mut producers = tokio::task::JoinSet::new();
    // Run ids of their own per benchmark run, so that a run on an archive an earlier one
    // filled (`--archive`) inserts its events rather than finding them all there.
    let runs_of = format!("bench-{}", streamgate_runtime::clock::now_ms());
    for p in 0..args.runs {
        let (door, capture, family, runs_of) = (
            door.clone(),
            capture.clone(),
            family.clone(),
            runs_of.clone(),
        );
        let (rounds, chunk_bytes) = (args.rounds, args.chunk_bytes.max(1));
        // Each producer's ticks start at its own share of the tick: independent runs are
        // not in step, and producers ticking together would offer every run's chunk at
        // once (a burst of `--runs` chunks a tick, which at hundreds of runs is most of
        // the latency measured).
        let phase = tick.map(|t| t.mul_f64(p as f64 / args.runs as f64));
        producers.spawn(async move {
            let mut pace = tick.zip(phase).map(|(t, phase)| {
                let mut i = tokio::time::interval_at(tokio::time::Instant::now() + phase, t);
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                i
            });
            for r in 0..rounds {
                let run = format!("{runs_of}-{p}-{r}");
                door.send_run(&run, &family, &capture, chunk_bytes, pace.as_mut())
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = producers.join_next().await {
        r??;
    }
    let ingested = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = latencies.lock().map(|l| l.len()).unwrap_or(0);
        if done >= total_events {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {done} of {total_events} events archived after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let cpu_after = [cpu_seconds(None), cpu_seconds(nats_server.pid())];
    let stored_after = [storage_bytes(None), storage_bytes(nats_server.pid())];
    // Bytes sent to storage during the run: this process (the archive), nats-server.
    let written = [0, 1].map(|i| Some(stored_after[i]?.saturating_sub(stored_before[i]?)));
    let threads_after = [thread_times(None), thread_times(nats_server.pid())];
    let switches_after = [context_switches(None), context_switches(nats_server.pid())];
    shutdown.cancel();
    for mut t in [normalizer.tasks, archiver.tasks] {
        while let Some(r) = t.join_next().await {
            r??;
        }
    }
    let committed = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    let mut l: Vec<i64> = committed.iter().map(|&(_, lat)| lat).collect();
    l.sort_unstable();
    let pct = |p: f64| percentile(&l, p);
    let secs = elapsed.as_secs_f64();
    if args.rate > 0 {
        println!("offered   {} events/s", args.rate);
    }
    let raw_mb_s = (capture.len() * total_runs) as f64 / secs / 1e6;
    println!(
        "pipeline  {:.0} events/s archived ({total_events} events in {secs:.2} s; ingest took {:.2} s; {raw_mb_s:.1} MB/s raw)",
        total_events as f64 / secs,
        ingested.as_secs_f64(),
    );
    // The yardstick of docs/performance.md: the raw input the pipeline archives against
    // the bytes JetStream alone publishes in messages of the producers' frame size. The
    // HTTP door joins frames (the `door` line says how many per raw message), so its
    // messages are larger than the baseline's: the ratio is the pipeline's throughput
    // against publishing the frames as they come, not a like-for-like broker cost.
    let broker_mb_s = baseline * args.chunk_bytes as f64 / 1e6;
    let figures = Figures {
        events_per_s: total_events as f64 / secs,
        ratio_pct: 100.0 * raw_mb_s / broker_mb_s.max(f64::MIN_POSITIVE),
        floor_pct: floor,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        cpu_us_per_event: [0, 1].map(|i| match (cpu_before[i], cpu_after[i]) {
            (Some(b), Some(a)) => (a - b) * 1e6 / total_events.max(1) as f64,
            _ => f64::NAN,
        }),
        archive_bytes_per_event: written[0]
            .map_or(f64::NAN, |b| b as f64 / total_events.max(1) as f64),
    };
    if broker_mb_s > 0.0 {
        println!(
            "ratio     {raw_mb_s:.1} MB/s raw = {:.1}% of the baseline's {broker_mb_s:.1} MB/s (the floor above: {:.0}% / {:.0}%)",
            figures.ratio_pct, floor[0], floor[1]
        );
    }
    println!(
        "latency   ingest→archive-commit p50 {} ms, p99 {} ms, max {} ms",
        pct(0.50),
        pct(0.99),
        l.last().copied().unwrap_or(0)
    );
    if let Some(steady) = after_start(&committed, START_MS) {
        println!(
            "latency   after the first {} s of commits: p50 {} ms, p99 {} ms ({} events; the start, while the batches grow, left out)",
            START_MS / 1000,
            percentile(&steady, 0.50),
            percentile(&steady, 0.99),
            steady.len()
        );
    }
    let [own, broker] = figures.cpu_us_per_event;
    println!(
        "cpu       {own:.2} µs per event in this process (services and producers), {broker:.2} µs in nats-server: {:.0}% and {:.0}% of a core",
        own * total_events as f64 / secs / 1e4,
        broker * total_events as f64 / secs / 1e4,
    );
    if let Some(line) = threads_line(&threads_before, &threads_after, secs) {
        println!("{line}");
    }
    if let Some(line) = switches_line(switches_before, switches_after, total_events) {
        println!("{line}");
    }
    if let Some(line) = disk_line(written, total_events, capture.len() * total_runs) {
        println!("{line}");
    }
    let commits = commits.load(std::sync::atomic::Ordering::Relaxed).max(1);
    println!(
        "archive   {commits} batches committed ({:.0} events each, {:.0} per second)",
        total_events as f64 / commits as f64,
        commits as f64 / secs
    );
    if let Some(steps) = steps {
        print_steps(&steps.render());
    }
    print_stored(
        &js,
        total_runs * frames_per_run,
        args.chunk_bytes,
        total_runs * capture.len(),
    )
    .await;
    if let Some(hop) = hop {
        let mut published = hop.stop(total_events).await;
        published.sort_unstable();
        if published.is_empty() {
            println!("hops      the events subscriber saw no events");
        } else {
            println!(
                "hops      ingest→events published p50 {} ms, p99 {} ms (the normalizer; {} of {total_events} events seen); commit p50 {} ms, p99 {} ms after ingest (the archiver adds the rest)",
                percentile(&published, 0.50),
                percentile(&published, 0.99),
                published.len(),
                pct(0.50),
                pct(0.99)
            );
        }
        print_timeline(&committed);
    }
    drop(nats_server);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(figures)
}

/// The `disk` line: what this process (the archive: its database and WAL) and
/// nats-server (its stores) sent to storage over the run (`written`, bytes), in MB and
/// in bytes per event, beside the raw input's bytes per event — the write amplification an operator's disk
/// sees. Commits write every page they touch whole, so a light load, with many small
/// commits, writes far more per event than full speed does.
fn disk_line(written: [Option<u64>; 2], events: usize, raw_bytes: usize) -> Option<String> {
    let [Some(own), Some(broker)] = written else {
        return None;
    };
    let per_event = |b: u64| b as f64 / events.max(1) as f64;
    Some(format!(
        "disk      {:.1} MB written to storage by this process (the archive), {:.1} MB by nats-server: {:.0} and {:.0} bytes per event, for {:.0} raw bytes per event",
        own as f64 / 1e6,
        broker as f64 / 1e6,
        per_event(own),
        per_event(broker),
        raw_bytes as f64 / events.max(1) as f64,
    ))
}

/// The `threads` line: per thread name (this process, then nats-server), the share of a
/// core it ran and the share of a core's time it was runnable but waited for one, over
/// the run. Waiting is the box's saturation made visible: every hop a thread serves is
/// that much later, whatever its batching (a thread made during the run counts whole). A
/// name whose threads run at another nice value than the process says how far (the
/// archive's writer and WAL syncer ask for ten steps ahead where the process may:
/// `sqlite/priority.rs`).
fn threads_line(before: &[ThreadTimes; 2], after: &[ThreadTimes; 2], secs: f64) -> Option<String> {
    let mut parts = Vec::new();
    for (who, (b, a)) in ["", "nats-server: "].iter().zip(before.iter().zip(after)) {
        let mut first = true;
        for (name, now) in a {
            let was = b.get(name).copied().unwrap_or_default();
            let share = |now: f64, was: f64| 100.0 * (now - was).max(0.0) / secs;
            let (ran, waited) = (share(now.ran, was.ran), share(now.waited, was.waited));
            if ran < 1.0 {
                continue;
            }
            let prefix = if std::mem::take(&mut first) { *who } else { "" };
            let nice = match now.nice {
                0 => String::new(),
                n if n < 0 => format!(" ({} nice steps ahead)", -n),
                n => format!(" ({n} nice steps behind)"),
            };
            parts.push(format!("{prefix}{name} {ran:.0}% / {waited:.0}%{nice}"));
        }
    }
    (!parts.is_empty()).then(|| {
        format!(
            "threads   ran / waited for a core, in % of one core: {}",
            parts.join(", ")
        )
    })
}

/// The `switches` line: context switches per archived event over the run, voluntary +
/// involuntary, of this process and of nats-server ([`context_switches`]). Voluntary
/// ones count hand-overs: a message passed from one thread to the next wakes a sleeping
/// one, so a light load, with a message or two per few events, pays several per event
/// and full speed a fraction of one. Involuntary ones count the box's saturation.
fn switches_line(
    before: [Option<[u64; 2]>; 2],
    after: [Option<[u64; 2]>; 2],
    events: usize,
) -> Option<String> {
    let per_event = |i: usize| -> Option<[f64; 2]> {
        let (b, a) = (before[i]?, after[i]?);
        Some([0, 1].map(|k| a[k].saturating_sub(b[k]) as f64 / events.max(1) as f64))
    };
    let ([own_v, own_i], [nats_v, nats_i]) = (per_event(0)?, per_event(1)?);
    Some(format!(
        "switches  {own_v:.2} + {own_i:.2} per event in this process, {nats_v:.2} + {nats_i:.2} in nats-server (voluntary: a thread sleeps until its next message; involuntary: the scheduler takes its core)"
    ))
}

/// Prints the messages the broker stored per raw chunk: the events messages (one per run
/// and consumer batch, fewer when a pull brings several chunks of a run) and the KV
/// records (open runs, leases) — the broker work the ratio sets against one publish.
async fn print_stored(
    js: &async_nats::jetstream::Context,
    frames: usize,
    frame_bytes: usize,
    raw_bytes: usize,
) {
    let mut stored = Vec::new();
    for name in [
        streamgate_bus::RAW_STREAM.to_owned(),
        streamgate_bus::EVENTS_STREAM.to_owned(),
        format!("KV_{}", streamgate_bus::kv::OPEN_RUNS_BUCKET),
        format!("KV_{}", streamgate_bus::lease::LEASE_BUCKET),
    ] {
        let messages = match js.get_stream(&name).await {
            Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        };
        stored.push((name, messages));
    }
    let raw = stored[0].1.max(1) as f64;
    let parts: Vec<String> = stored
        .iter()
        .map(|(name, n)| format!("{name} {n} ({:.2} per raw)", *n as f64 / raw))
        .collect();
    println!("stored    {}", parts.join(", "));
    // Raw messages are the runs' chunks and one close marker per run.
    println!(
        "door      {frames} frames sent, {:.2} per raw message: {:.0} bytes per raw message on average, the baseline's {frame_bytes}",
        frames as f64 / raw,
        raw_bytes as f64 / raw
    );
}

/// Prints where a chunk's time goes between ingest and commit, from the services' own
/// histograms: how long its chunk waited to be taken from each consumer (since ingest),
/// and how long each step of a consumer batch took, p50 / p99.
fn print_steps(rendered: &str) {
    let line = |service: &str, wait: &str, batch: &str, steps: &[&str]| {
        let mut parts = Vec::new();
        if let Some((p50, p99)) = quantiles_ms(rendered, wait, None) {
            parts.push(format!("pulled {p50:.1} / {p99:.1} ms after ingest"));
        }
        for step in steps {
            let label = format!("step=\"{step}\"");
            if let Some((p50, p99)) = quantiles_ms(rendered, batch, Some(&label)) {
                parts.push(format!("{step} {p50:.1} / {p99:.1}"));
            }
        }
        if !parts.is_empty() {
            println!("steps     {service} (p50 / p99): {}", parts.join(", "));
        }
    };
    line(
        "normalizer",
        "streamgate_normalizer_pull_wait_seconds",
        "streamgate_normalizer_batch_seconds",
        &["apply", "publish", "ack"],
    );
    line(
        "archiver  ",
        "streamgate_archiver_pull_wait_seconds",
        "streamgate_archiver_batch_seconds",
        &["decode", "commit", "ack"],
    );
}

/// Installs a Prometheus recorder whose `_seconds` histograms have fine buckets, for
/// the benches to read their services' step times from (`None` when a recorder is
/// already installed). Buckets, not the exporter's default summaries: a summary's
/// quantiles cover a rolling window, and a bench's first seconds fell out of it.
pub(crate) fn install_step_recorder() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
            &step_buckets(),
        )
        .ok()?
        .install_recorder()
        .ok()
}

/// 0.1 ms to 10 s: 0.1 ms apart up to 1 ms, 1 ms apart up to 100 ms, then 10% apart.
fn step_buckets() -> Vec<f64> {
    let mut ms: Vec<f64> = (1..10).map(|i| f64::from(i) / 10.0).collect();
    ms.extend((1..=100).map(f64::from));
    while ms.last().is_some_and(|&last| last < 10_000.0) {
        let next = ms.last().map_or(100.0, |last| (last * 1.1).round());
        ms.push(next);
    }
    ms.into_iter().map(|ms| ms / 1000.0).collect()
}

/// The p50 and p99, in ms, of the `_seconds` histogram `metric` (of its series with
/// `label`, when given; summed over several series) in a Prometheus rendering, read from
/// its buckets as PromQL's `histogram_quantile` does (linear within a bucket).
pub(crate) fn quantiles_ms(
    rendered: &str,
    metric: &str,
    label: Option<&str>,
) -> Option<(f64, f64)> {
    let bucket_name = format!("{metric}_bucket{{");
    // (upper bound in s, cumulative count), summed over the series.
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in rendered.lines().filter(|l| l.starts_with(&bucket_name)) {
        if label.is_some_and(|label| !line.contains(label)) {
            continue;
        }
        let le = line.split("le=\"").nth(1)?.split('"').next()?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let count: f64 = line.rsplit(' ').next()?.parse().ok()?;
        match buckets.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, total)) => *total += count,
            None => buckets.push((le, count)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let quantile = |q: f64| {
        let rank = q * total;
        let mut below = (0.0, 0.0);
        for &(bound, count) in &buckets {
            if count >= rank {
                if bound.is_infinite() {
                    return below.0 * 1000.0;
                }
                let share = if count > below.1 {
                    (rank - below.1) / (count - below.1)
                } else {
                    1.0
                };
                return (below.0 + (bound - below.0) * share) * 1000.0;
            }
            below = (bound, count);
        }
        below.0 * 1000.0
    };
    Some((quantile(0.5), quantile(0.99)))
}

/// Ingest → events-published latency of every event, from a core subscriber on
/// SG_EVENTS' subjects: the time each events message reached the broker's subscribers
/// against its events' ingest time.
struct HopProbe {
    latencies: Arc<Mutex<Vec<i64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl HopProbe {
    async fn start(url: String) -> Result<HopProbe> {
        let client = async_nats::connect(url).await?;
        let mut messages = client.subscribe(streamgate_bus::EVENTS_SUBJECTS).await?;
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let seen = latencies.clone();
        let task = tokio::spawn(async move {
            let _client = client; // kept for as long as the subscription
            while let Some(msg) = futures::StreamExt::next(&mut messages).await {
                let now = streamgate_runtime::clock::now_ms();
                let Ok(events) = streamgate_bus::events::decode_msg(&msg) else {
                    continue;
                };
                if let Ok(mut l) = seen.lock() {
                    l.extend(events.iter().map(|e| now - e.envelope.ts_ms));
                }
            }
        });
        Ok(HopProbe { latencies, task })
    }

    /// Waits (a second at most) until `expected` events were seen — the last messages may
    /// still be on their way to the subscriber — then stops. A core subscriber can miss
    /// messages when it falls behind, or see a re-published one twice: the caller prints
    /// how many it saw.
    async fn stop(self, expected: usize) -> Vec<i64> {
        let seen = || self.latencies.lock().map(|l| l.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(1);
        while seen() < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.task.abort();
        self.latencies
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }
}

/// The `p` quantile (0..=1) of sorted values; 0 when there are none.
pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0)
}

/// How much of a run's start [`after_start`] leaves out, in ms of commit time.
const START_MS: i64 = 3000;

/// The sorted latencies of the events committed `skip_ms` or later after the first
/// commit: the steady part of a run, apart from its start, where a pipeline near its
/// capacity begins with small batches, falls behind and catches up (docs/performance.md,
/// nineteenth stop). `None` for a run too short to have one (under twice `skip_ms`).
fn after_start(committed: &[(i64, i64)], skip_ms: i64) -> Option<Vec<i64>> {
    let first = committed.iter().map(|&(at, _)| at).min()?;
    let last = committed.iter().map(|&(at, _)| at).max()?;
    if last - first < 2 * skip_ms {
        return None;
    }
    let mut steady: Vec<i64> = committed
        .iter()
        .filter(|&&(at, _)| at - first >= skip_ms)
        .map(|&(_, lat)| lat)
        .collect();
    steady.sort_unstable();
    Some(steady)
}

/// Latency per second of commit time: events, p50, p99, max.
fn print_timeline(committed: &[(i64, i64)]) {
    let Some(start) = committed.iter().map(|&(at, _)| at).min() else {
        return;
    };
    let mut seconds: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for &(at, lat) in committed {
        seconds.entry((at - start) / 1000).or_default().push(lat);
    }
    println!("second    events   p50   p99   max (ms)");
    for (second, mut lat) in seconds {
        lat.sort_unstable();
        println!(
            "{second:>6} {:>9} {:>5} {:>5} {:>5}",
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat.last().copied().unwrap_or(0)
        );
    }
}

/// The ingest token of the bench's normalizer.
const BENCH_TOKEN: &str = "bench";

/// Where the producers send their runs ([`Door`]).
#[derive(Clone)]
enum Producers {
    Http {
        client: reqwest::Client,
        base: String,
    },
    Direct(Box<Ingestor>),
}

impl Producers {
    /// Sends one run of `capture` in frames of `chunk_bytes`, one per `pace` tick when
    /// paced, and its close.
    async fn send_run(
        &self,
        run: &str,
        family: &str,
        capture: &Bytes,
        chunk_bytes: usize,
        pace: Option<&mut tokio::time::Interval>,
    ) -> anyhow::Result<()> {
        match self {
            Producers::Direct(ingestor) => {
                let spec = RunSpec::new("bench", run, None, family, None)?;
                put_capture(ingestor, &spec, capture, chunk_bytes, pace).await
            }
            Producers::Http { client, base } => {
                post_capture(client, base, run, family, capture, chunk_bytes, pace).await
            }
        }
    }
}

/// POSTs `capture` to the HTTP ingest at `base` as run `run`, streaming it in frames of
/// `chunk_bytes` (each sent once the door reads the one before, paced when `pace`).
async fn post_capture(
    client: &reqwest::Client,
    base: &str,
    run: &str,
    family: &str,
    capture: &Bytes,
    chunk_bytes: usize,
    mut pace: Option<&mut tokio::time::Interval>,
) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let request = client
        .post(format!("{base}/{run}?family={family}"))
        .bearer_auth(BENCH_TOKEN)
        .body(reqwest::Body::wrap_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .send();
    let frames = async move {
        for frame in frames_of(capture, chunk_bytes) {
            if let Some(t) = pace.as_mut() {
                t.tick().await;
            }
            if tx.send(Ok(frame)).await.is_err() {
                break; // The request ended early: its answer says why.
            }
        }
    };
    let (response, ()) = tokio::join!(request, frames);
    let response = response?;
    let status = response.status();
    anyhow::ensure!(
        status.is_success(),
        "ingest of {run} answered {status}: {}",
        response.text().await.unwrap_or_default()
    );
    Ok(())
}

/// `capture` cut in frames of `chunk_bytes` (at least 1), as a producer sends it.
fn frames_of(capture: &Bytes, chunk_bytes: usize) -> impl Iterator<Item = Bytes> + '_ {
    let chunk_bytes = chunk_bytes.max(1);
    (0..capture.len())
        .step_by(chunk_bytes)
        .map(move |start| capture.slice(start..(start + chunk_bytes).min(capture.len())))
}

/// Ingests `capture` as the run `spec`, a chunk per frame of `chunk_bytes` (each after a
/// tick of `pace`, when pacing), then closes it: the direct producer loop of `bench
/// pipeline` and `bench cluster`. Like the gRPC and HTTP front doors, it keeps the
/// ingestor's window of publishes in flight ([`Window`]) instead of waiting for each
/// chunk's ack: a producer waiting out one broker round trip per chunk measures that
/// round trip, not the pipeline.
pub(crate) async fn put_capture(
    ingestor: &Ingestor,
    spec: &RunSpec,
    capture: &Bytes,
    chunk_bytes: usize,
    mut pace: Option<&mut tokio::time::Interval>,
) -> anyhow::Result<()> {
    let mut window = Window::new(ingestor.window());
    let mut chunk = 0u64;
    for frame in frames_of(capture, chunk_bytes) {
        if let Some(t) = pace.as_mut() {
            t.tick().await;
        }
        window.make_room().await?;
        window.push(ingestor.send(spec, chunk, frame, None, None).await?);
        chunk += 1;
    }
    window.make_room().await?;
    window.push(
        ingestor
            .send(spec, chunk, Bytes::new(), Some(CloseKind::Normal), None)
            .await?,
    );
    window.drain().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_quantiles_are_read_from_the_buckets_of_every_series() {
        // Two series of one histogram: 60 observations ≤ 1 ms and 40 in (1, 2] ms, all
        // told; the p99 falls in the second bucket, the p50 in the first.
        let rendered = "\
# TYPE x_seconds histogram
x_seconds_bucket{step=\"apply\",le=\"0.001\"} 50
x_seconds_bucket{step=\"apply\",le=\"0.002\"} 80
x_seconds_bucket{step=\"apply\",le=\"+Inf\"} 80
x_seconds_bucket{step=\"ack\",le=\"0.001\"} 10
x_seconds_bucket{step=\"ack\",le=\"0.002\"} 20
x_seconds_bucket{step=\"ack\",le=\"+Inf\"} 20
x_seconds_sum{step=\"apply\"} 0.1
x_seconds_count{step=\"apply\"} 80
";
        let (p50, p99) = quantiles_ms(rendered, "x_seconds", None).unwrap();
        assert!((p50 - 50.0 / 60.0).abs() < 1e-9, "{p50}");
        assert!((p99 - (1.0 + 39.0 / 40.0)).abs() < 1e-9, "{p99}");
        let (p50, _) = quantiles_ms(rendered, "x_seconds", Some("step=\"ack\"")).unwrap();
        assert!((p50 - 1.0).abs() < 1e-9, "{p50}");
        assert_eq!(quantiles_ms(rendered, "y_seconds", None), None);
    }

    #[test]
    fn the_disk_line_reads_bytes_per_event_for_each_process() {
        let line = disk_line([Some(2_000_000), Some(500_000)], 1_000, 250_000).unwrap();
        assert_eq!(
            line,
            "disk      2.0 MB written to storage by this process (the archive), 0.5 MB by nats-server: 2000 and 500 bytes per event, for 250 raw bytes per event"
        );
        assert_eq!(disk_line([None, Some(1)], 1, 1), None);
    }

    #[test]
    fn the_switches_line_reads_each_kind_per_event_for_each_process() {
        let line = switches_line(
            [Some([100, 10]), Some([50, 0])],
            [Some([2_100, 510]), Some([1_050, 100])],
            1_000,
        );
        assert_eq!(
            line.as_deref(),
            Some(
                "switches  2.00 + 0.50 per event in this process, 1.00 + 0.10 in nats-server \
                 (voluntary: a thread sleeps until its next message; involuntary: the scheduler \
                 takes its core)"
            )
        );
        // A thread that ended during the run took its counts: never below zero.
        let fewer = switches_line(
            [Some([10, 10]), Some([0, 0])],
            [Some([5, 5]), Some([0, 0])],
            1,
        );
        assert_eq!(
            fewer.as_deref().map(|l| &l[..38]),
            Some("switches  0.00 + 0.00 per event in thi")
        );
        assert_eq!(
            switches_line([None, Some([0, 0])], [None, Some([1, 1])], 1),
            None
        );
    }

    #[test]
    fn after_the_start_keeps_the_events_committed_later_sorted() {
        // (commit time, latency) in ms; the first commit at 1000.
        let committed = [(1000, 300), (2500, 200), (4000, 40), (5000, 60), (7100, 50)];
        assert_eq!(after_start(&committed, 3000), Some(vec![40, 50, 60]));
        assert_eq!(after_start(&committed[..4], 3000), None, "too short");
        assert_eq!(after_start(&[], 3000), None);
    }

    #[test]
    fn the_threads_line_shows_each_name_s_share_of_a_core_over_the_run() {
        use crate::cli::bench_proc::ThreadTime;
        let at = |pairs: &[(&str, [f64; 2])]| -> ThreadTimes {
            pairs
                .iter()
                .map(|(n, [ran, waited])| {
                    let nice = if *n == "writer" { -10 } else { 0 };
                    let t = ThreadTime {
                        ran: *ran,
                        waited: *waited,
                        nice,
                    };
                    ((*n).to_owned(), t)
                })
                .collect()
        };
        let before = [
            at(&[("writer", [1.0, 0.5])]),
            at(&[("nats-server", [2.0, 0.0])]),
        ];
        let after = [
            // The writer ran 1 s and waited 0.5 s in 2 s; a new thread counts whole; an
            // idle one is left out.
            at(&[
                ("writer", [2.0, 1.0]),
                ("worker", [0.4, 0.2]),
                ("idle", [0.01, 0.0]),
            ]),
            at(&[("nats-server", [3.0, 1.0])]),
        ];
        assert_eq!(
            threads_line(&before, &after, 2.0).as_deref(),
            Some(
                "threads   ran / waited for a core, in % of one core: worker 20% / 10%, \
                 writer 50% / 25% (10 nice steps ahead), nats-server: nats-server 50% / 50%"
            )
        );
        assert_eq!(threads_line(&before, &before, 2.0), None);
    }

    #[test]
    fn step_buckets_rise_from_a_tenth_of_a_millisecond_to_ten_seconds() {
        let b = step_buckets();
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(b.first(), Some(&0.0001));
        assert!(b.last().is_some_and(|&last| last >= 10.0));
    }
}

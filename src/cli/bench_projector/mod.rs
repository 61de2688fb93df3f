//! `streamgate bench projector`: one projector channel under load. N runs' events (a
//! bundled reasoning + tool capture, normalized) are published to SG_EVENTS as fast as the
//! broker takes them; the channel is a signed webhook to an in-process receiver. Reports
//! events/s through the projector (until every final arrived) and event→sink latency
//! p50/p99 of the ops delivered (from the publish of the event an op renders to the
//! receiver seeing it; drafts are coalesced latest-wins, so not every event has an op).
//! `--sink web` measures the web channel at its pages instead ([`web_page`]);
//! `--channels N` spreads the runs over N webhook channels in the one process, each a
//! tenant of its own, and prints what the process and nats-server spent meanwhile.

mod web_page;

use anyhow::Result;
use axum::routing::post;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use streamgate_bus::local::{free_port, nats_server_binary, LocalNats};
use streamgate_bus::subject::RunAddr;
use streamgate_grammar::{Envelope, RunEvent};

/// The tenant of the bench's runs.
const BENCH_TENANT: &str = "bench";
use streamgate_projector::{ChannelConfig, ChannelSink};
use streamgate_sinks::webhook::WebhookConfig;
use streamgate_sinks::{Secret, SinkConfig};

/// Runs published together per tick with `--spread`.
const SPREAD_GROUP: usize = 50;

/// Flags of `streamgate bench projector`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProjectorArgs {
    /// Concurrent runs.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Chats the runs are spread over (run r goes to chat r mod N; default: one chat
    /// per run). `--chats 1` is one busy chat (with `--channels`, one per channel: a
    /// chat belongs to its tenant).
    #[arg(long)]
    pub chats: Option<usize>,
    /// Size the bundled capture is grown to, KiB (more events per run).
    #[arg(long, default_value_t = 16)]
    pub capture_kib: usize,
    /// Per-chat send rate override (requests/s); by default the webhook sink's own
    /// pacing applies: none, only bounded concurrency.
    #[arg(long)]
    pub chat_rate: Option<f64>,
    /// The channel: `webhook` (a signed webhook to an in-process receiver) or `web`
    /// (the web page, watched by one SSE client per run).
    #[arg(long, default_value = "webhook")]
    pub sink: BenchSink,
    /// Events/s offered over all runs (0: as fast as the broker takes them). Latency
    /// below saturation is measured with a rate under the events/s a run without it
    /// reports.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Publish each round's events spread evenly over the round, [`SPREAD_GROUP`] runs
    /// at a time, instead of every run's at once. Independent live runs do not emit in
    /// lockstep: with all at once, an event's latency includes publishing the whole
    /// round (2,000 acked publishes) before it, so it grows with `--runs` by itself.
    #[arg(long)]
    pub spread: bool,
    /// Requests in flight to the webhook receiver at once (the sink's `max_in_flight`).
    #[arg(long, default_value_t = streamgate_sinks::webhook::DEFAULT_MAX_IN_FLIGHT)]
    pub webhook_in_flight: usize,
    /// Webhook channels in the one projector process, each a tenant of its own (run r
    /// goes to channel r mod N): what many channels cost, each with its partition
    /// consumers, leases and lag reports on the one broker.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub channels: u16,
}

/// Which channel `bench projector` loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSink {
    /// A signed webhook.
    Webhook,
    /// The web page.
    Web,
}

const CAPTURE: &[u8] = include_bytes!("../../../fixtures/f2/deepseek-thinking.sse");

type Seen = Arc<Mutex<Vec<(String, u64, String, Instant)>>>;

/// Runs the benchmark.
pub async fn projector(args: ProjectorArgs) -> Result<()> {
    anyhow::ensure!(
        args.channels == 1 || args.sink == BenchSink::Webhook,
        "--channels applies to the webhook sink"
    );
    // The projector's own histograms split the latency by hop (none when a recorder is
    // already installed).
    let hops = crate::cli::bench::install_step_recorder();
    let tmp = std::env::temp_dir().join(format!("sg-bench-proj-{}", std::process::id()));
    let nats_server = LocalNats::spawn(&nats_server_binary()?, free_port()?, &tmp.join("nats"))?;
    let nats = async_nats::connect(nats_server.url()).await?;
    let js = async_nats::jetstream::new(nats.clone());
    streamgate_bus::ensure_streams(&js, &streamgate_bus::StreamSettings::default()).await?;

    // The webhook receiver: records (run, seq, op, arrival).
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let app = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/hook",
            post(move |body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                        let run = v["run_id"].as_str().unwrap_or_default().to_owned();
                        let seq = v["seq"].as_u64().unwrap_or(0);
                        let op = v["op"].as_str().unwrap_or_default().to_owned();
                        if let Ok(mut s) = seen.lock() {
                            s.push((run, seq, op, Instant::now()));
                        }
                    }
                    "ok"
                }
            }),
        )
    };
    let listener = streamgate_runtime::serve::listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let hook = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut running = Vec::with_capacity(args.channels.into());
    for c in 0..args.channels {
        let cfg = channel_config(&args, c, hook);
        running.push(
            streamgate_projector::service::start(nats.clone(), cfg, None, shutdown.clone()).await?,
        );
    }
    // Measured once every channel holds its partitions: their leases and consumers are
    // the channels' start, not the load.
    for r in &mut running {
        let all = |held: &std::collections::BTreeSet<u32>| {
            held.len() == streamgate_bus::DEFAULT_PARTITIONS as usize
        };
        tokio::time::timeout(Duration::from_secs(60), r.partitions.wait_for(all))
            .await
            .map_err(|_| anyhow::anyhow!("a channel did not take its partitions in 60 s"))??;
    }

    let capture = streamgate_wire::synth::inflate(CAPTURE, args.capture_kib << 10);
    let events =
        streamgate_wire::normalize_bytes(streamgate_wire::Family::F2.into(), &capture, 0).events;
    let total = events.len() * args.runs;
    let chats = args.chats.unwrap_or(args.runs).max(1);
    let run_ids: Vec<String> = (0..args.runs).map(|r| format!("proj-bench-{r}")).collect();
    let pages = match running.first().and_then(|r| r.web) {
        Some(web) => Some(web_page::open_pages(web, BENCH_TENANT, &run_ids).await?),
        None => None,
    };
    let final_seq = events
        .iter()
        .find(|e| {
            matches!(&e.data, streamgate_grammar::EventData::Assistant(a)
                if a.phase == Some(streamgate_grammar::AssistantPhase::FinalAnswer))
        })
        .map_or(0, |e| e.seq);
    let mut published: HashMap<(String, u64), Instant> = HashMap::with_capacity(total);
    let cpu_before = [
        crate::cli::bench_proc::cpu_seconds(None),
        crate::cli::bench_proc::cpu_seconds(nats_server.pid()),
    ];
    let started = Instant::now();
    // One round publishes an event of every run: at `rate`, a round every runs/rate s,
    // in one group of every run or (`--spread`) in groups spaced evenly over the round.
    let group = if args.spread {
        SPREAD_GROUP.min(args.runs.max(1))
    } else {
        args.runs.max(1)
    };
    let mut pace = (args.rate > 0).then(|| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(group as f64 / args.rate as f64));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    // Interleave runs event by event, like concurrent live turns.
    for (ev, runs) in events.iter().flat_map(|ev| {
        (0..args.runs)
            .step_by(group)
            .map(move |from| (ev, from..(from + group).min(args.runs)))
    }) {
        if let Some(t) = pace.as_mut() {
            t.tick().await;
        }
        let mut batch = Vec::with_capacity(runs.len());
        for (r, run_id) in runs.clone().zip(&run_ids[runs]) {
            let tenant = tenant_of(&args, r);
            let re = RunEvent {
                envelope: Envelope {
                    tenant: tenant.clone(),
                    session_key: Some(format!("chat-{}", r % chats)),
                    run_id: run_id.clone(),
                    ts_ms: streamgate_runtime::clock::now_ms(),
                },
                event: ev.clone(),
            };
            batch.push((
                RunAddr::parse(&tenant, run_id, streamgate_bus::DEFAULT_PARTITIONS)?,
                re,
            ));
        }
        let now = Instant::now();
        let sends = batch.iter().map(|(addr, re)| {
            streamgate_bus::events::publish_events(&js, addr, std::slice::from_ref(re))
        });
        for r in futures::future::join_all(sends).await {
            r?;
        }
        for (_, re) in &batch {
            published.insert((re.envelope.run_id.clone(), re.event.seq), now);
        }
    }
    let published_in = started.elapsed();
    if let Some(pages) = pages {
        web_page::wait_finals(&pages, args.runs, Duration::from_secs(300)).await?;
        let finished = started.elapsed();
        shutdown.cancel();
        drop(running);
        report_pages(
            &pages, &published, &run_ids, final_seq, finished, total, &args,
        );
        drop(nats_server);
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let finished = loop {
        let finals = seen
            .lock()
            .map(|s| s.iter().filter(|x| x.2 == "final").count())
            .unwrap_or(0);
        if finals >= args.runs {
            break started.elapsed();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {finals} of {} finals arrived",
            args.runs
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let cpu_after = [
        crate::cli::bench_proc::cpu_seconds(None),
        crate::cli::bench_proc::cpu_seconds(nats_server.pid()),
    ];
    shutdown.cancel();
    drop(running);
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let mut lat: Vec<f64> = seen
        .iter()
        .filter_map(|(run, seq, _, at)| {
            published
                .get(&(run.clone(), *seq))
                .map(|p| at.duration_since(*p).as_secs_f64() * 1000.0)
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let finals: Vec<f64> = seen
        .iter()
        .filter(|x| x.2 == "final")
        .filter_map(|(run, seq, _, at)| {
            published
                .get(&(run.clone(), *seq))
                .map(|p| at.duration_since(*p).as_secs_f64() * 1000.0)
        })
        .collect();
    println!(
        "projector {} runs in {chats} chats on {} channel(s), {total} events published in {:.2} s; every final delivered after {:.2} s → {:.0} events/s",
        args.runs,
        args.channels,
        published_in.as_secs_f64(),
        finished.as_secs_f64(),
        total as f64 / finished.as_secs_f64()
    );
    if args.rate > 0 {
        println!(
            "offered   {} events/s ({}); published at {:.0} events/s",
            args.rate,
            if args.spread {
                format!("each round in groups of {SPREAD_GROUP} runs")
            } else {
                "every run's event of a round at once".to_owned()
            },
            total as f64 / published_in.as_secs_f64()
        );
    }
    // How many of each op: a draft's edits coalesce while its chat is busy, so the count
    // shows how much coalescing the load got.
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for (_, _, op, _) in &seen {
        *kinds.entry(op.as_str()).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "delivery  {} webhook ops ({}); event→sink latency p50 {:.1} ms, p99 {:.1} ms; finals p50 {:.1} ms",
        seen.len(),
        kinds.join(", "),
        pct(0.5),
        pct(0.99),
        {
            let mut f = finals;
            f.sort_by(|a, b| a.total_cmp(b));
            f.get(f.len() / 2).copied().unwrap_or(0.0)
        }
    );
    if let ([Some(p0), Some(n0)], [Some(p1), Some(n1)]) = (cpu_before, cpu_after) {
        let secs = finished.as_secs_f64().max(1e-9);
        println!(
            "cpu       {:.0}% of a core in this process (projector, receiver, publisher), {:.0}% in nats-server, over the {:.2} s",
            100.0 * (p1 - p0) / secs,
            100.0 * (n1 - n0) / secs,
            secs
        );
    }
    if let Some(h) = hops {
        print_hops(&h.render());
    }
    drop(nats_server);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// Channel `c` of `--channels`: the one channel `bench` (webhook or web page), or
/// webhook `bench-c` for the runs of tenant `bench-c` ([`tenant_of`]).
fn channel_config(args: &ProjectorArgs, c: u16, hook: SocketAddr) -> ChannelConfig {
    let name = tenant_of(args, c.into());
    let sink = match args.sink {
        BenchSink::Webhook => ChannelSink::Sink(SinkConfig::Webhook(WebhookConfig {
            name: name.clone(),
            url: format!("http://{hook}/hook"),
            secret: Secret::new("bench"),
            tier: streamgate_projection::Tier::T1,
            timeout_secs: 10.0,
            max_in_flight: args.webhook_in_flight,
        })),
        BenchSink::Web => ChannelSink::Web {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        },
    };
    let mut cfg = ChannelConfig::new(&name, sink);
    cfg.delivery.chat_rate = args.chat_rate.map(|r| streamgate_sinks::Rate::new(r, 10));
    if args.channels > 1 {
        cfg.tenant = Some(name);
    }
    cfg
}

/// The tenant of run `r` (and the name of channel `r`): [`BENCH_TENANT`], or with
/// `--channels` its channel's own.
fn tenant_of(args: &ProjectorArgs, r: usize) -> String {
    if args.channels == 1 {
        BENCH_TENANT.to_owned()
    } else {
        format!("bench-{}", r % usize::from(args.channels))
    }
}

/// Prints the per-hop latency the projector recorded: event (its timestamp at publish)
/// → op submitted to the delivery engine, and op queued → executed at the sink, p50 and
/// p99 of each (from the recorder's summaries).
fn print_hops(rendered: &str) {
    for (hop, metric) in [
        (
            "event→submit",
            "streamgate_projector_event_to_submit_seconds",
        ),
        ("queued→sent", "streamgate_delivery_latency_seconds"),
    ] {
        if let Some((p50, p99)) = crate::cli::bench::quantiles_ms(rendered, metric, None) {
            println!("hop       {hop}: p50 {p50:.1} ms, p99 {p99:.1} ms");
        }
    }
    let steps: Vec<String> = ["load", "slot", "request", "save"]
        .into_iter()
        .filter_map(|step| {
            let label = format!("step=\"{step}\"");
            crate::cli::bench::quantiles_ms(
                rendered,
                "streamgate_delivery_step_seconds",
                Some(&label),
            )
            .map(|(p50, p99)| format!("{step} {p50:.1} / {p99:.1}"))
        })
        .collect();
    if !steps.is_empty() {
        println!("steps     delivery (p50 / p99 ms): {}", steps.join(", "));
    }
}

/// Prints the web page figures (its run stream): first event and final shown, p50/p99 over runs.
fn report_pages(
    pages: &web_page::Pages,
    published: &HashMap<(String, u64), Instant>,
    runs: &[String],
    final_seq: u64,
    finished: Duration,
    total: usize,
    args: &ProjectorArgs,
) {
    let pages = pages.lock().map(|p| p.clone()).unwrap_or_default();
    let mut first = Vec::new();
    let mut finals = Vec::new();
    for run in runs {
        let Some(t) = pages.get(run) else { continue };
        let since = |seq: u64, at: Option<Instant>| {
            Some(
                at?.duration_since(*published.get(&(run.clone(), seq))?)
                    .as_secs_f64()
                    * 1000.0,
            )
        };
        first.extend(since(1, t.first));
        finals.extend(since(final_seq, t.final_shown));
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(((v.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "projector (web page) {} runs, {total} events; every page showed its final after {:.2} s → {:.0} events/s",
        args.runs,
        finished.as_secs_f64(),
        total as f64 / finished.as_secs_f64()
    );
    println!(
        "pages     first event→on the run stream p50 {:.1} ms, p99 {:.1} ms; final event→final shown p50 {:.1} ms, p99 {:.1} ms",
        pct(&mut first, 0.5),
        pct(&mut first, 0.99),
        pct(&mut finals, 0.5),
        pct(&mut finals, 0.99)
    );
}

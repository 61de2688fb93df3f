//! `streamgate export`: a tenant's archived runs over a time range — as JSONL (one line
//! per run: the run's record and its events), or as OpenTelemetry GenAI traces sent to an
//! OTLP endpoint (`--otlp`, `streamgate_archiver::genai`).
//!
//! Runs are read a page at a time and each run's events one run at a time, so memory
//! holds one run whatever the range. Open runs are left out of traces (a trace is written
//! once a run has ended) but included in JSONL.

use super::archive_client::{run_json, ArchiveTarget, Client};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use streamgate_grammar::ids::DEFAULT_TENANT;
use streamgate_grammar::RunEvent;
use streamgate_proto::v1::{ListRunsRequest, ReplayEventsRequest, Run};

/// Flags of `streamgate export`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// Only this tenant's runs.
    #[arg(long, default_value = DEFAULT_TENANT)]
    pub tenant: String,
    /// Runs of every tenant (instead of `--tenant`).
    #[arg(long, conflicts_with = "tenant")]
    pub all_tenants: bool,
    /// Only runs started within this long ago (`12h`, `7d`) or since this time in ms
    /// since the Unix epoch.
    #[arg(long, value_parser = super::history::parse_since)]
    pub since: Option<i64>,
    /// Only runs started before this time, ms since the Unix epoch.
    #[arg(long)]
    pub until: Option<i64>,
    /// Write the JSONL here (default: standard output).
    #[arg(long, short, conflicts_with = "otlp")]
    pub output: Option<PathBuf>,
    /// Send each ended run as an OpenTelemetry GenAI trace to this OTLP/gRPC endpoint
    /// (`http://collector:4317`) instead of writing JSONL.
    #[arg(long)]
    pub otlp: Option<String>,
    /// Put message content in the traces (the final answer, tool arguments and
    /// results): off by default, as the conventions ask.
    #[arg(long, requires = "otlp")]
    pub content: bool,
    #[command(flatten)]
    target: ArchiveTarget,
}

/// Runs per OTLP export request.
const RUNS_PER_REQUEST: usize = 50;

/// Runs `streamgate export`.
pub async fn run(args: ExportArgs) -> Result<()> {
    let mut client = args.target.connect().await?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut otlp = match &args.otlp {
        Some(endpoint) => {
            Some(streamgate_archiver::genai::Exporter::connect(endpoint, args.content).await?)
        }
        None => None,
    };
    let mut request = ListRunsRequest {
        tenant: (!args.all_tenants).then(|| args.tenant.clone()),
        since_ts_ms: args.since,
        until_ts_ms: args.until,
        limit: 500,
        ..Default::default()
    };
    let (mut runs, mut traces) = (0u64, 0u64);
    loop {
        let page = client.list_runs(request.clone()).await?.into_inner();
        for run in &page.runs {
            let events = events_of(&mut client, run).await?;
            runs += 1;
            match otlp.as_mut() {
                Some(exporter) if run.status != "open" => {
                    exporter.add(run, &events);
                    traces += 1;
                    if exporter.pending() >= RUNS_PER_REQUEST {
                        exporter.flush().await?;
                    }
                }
                Some(_) => {}
                None => {
                    let line = serde_json::json!({
                        "run": run_json(run),
                        // Each event's canonical line as it is, not parsed and re-encoded.
                        "events": events
                            .iter()
                            .map(|e| serde_json::value::RawValue::from_string(e.to_json()))
                            .collect::<Result<Vec<_>, _>>()?,
                    });
                    serde_json::to_writer(&mut out, &line)?;
                    out.write_all(b"\n")?;
                }
            }
        }
        match page.next_cursor {
            Some(c) => request.cursor = Some(c),
            None => break,
        }
    }
    out.flush()?;
    if let Some(mut exporter) = otlp {
        exporter.flush().await?;
        eprintln!("streamgate: exported {traces} ended runs of {runs} as traces");
    } else if args.output.is_some() {
        eprintln!("streamgate: exported {runs} runs");
    }
    Ok(())
}

/// Every event of a run, in seq order.
async fn events_of(client: &mut Client, run: &Run) -> Result<Vec<RunEvent>> {
    let mut stream = client
        .replay_events(ReplayEventsRequest {
            run_id: run.run_id.clone(),
            tenant: run.tenant.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut events = Vec::new();
    while let Some(e) = stream.message().await? {
        if let Some(ev) = e.event {
            events.push(RunEvent::try_from(ev)?);
        }
    }
    Ok(events)
}

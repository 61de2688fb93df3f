//! The archiver's continuous export: every run that has ended is sent once as a trace.
//!
//! A pass every [`FollowConfig::every`] lists ended runs the archive has not marked
//! exported (`runs.exported_at_ms`), sends their traces and marks them only once the
//! endpoint took them: at-least-once, and a run sent twice (a crash between sending and
//! marking, two replicas in the same pass) is the same trace, which backends
//! deduplicate by its ids. Runs that started before `since_ts_ms` are left to
//! `streamgate export --otlp`, so turning export on does not flood the endpoint with
//! the whole archive.

use super::Exporter;
use std::sync::Arc;
use std::time::Duration;
use streamgate_archive::{RunFilter, Store};
use streamgate_grammar::RunEvent;
use tokio_util::sync::CancellationToken;

/// Runs per pass at most.
const PASS_RUNS: u32 = 200;
/// Events per archive page while reading a run.
const PAGE: u32 = 1000;

/// Settings of the continuous export.
#[derive(Debug, Clone)]
pub struct FollowConfig {
    /// OTLP/gRPC endpoint, e.g. `http://collector:4317`.
    pub endpoint: String,
    /// Put message content in the traces.
    pub content: bool,
    /// Time between passes.
    pub every: Duration,
    /// Only runs that started at or after this time (ms since the Unix epoch).
    pub since_ts_ms: i64,
}

/// The flags of the continuous export (archiver and `streamgate up`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ExportArgs {
    /// Send every run that ends as an OpenTelemetry GenAI trace to this OTLP/gRPC
    /// endpoint (`http://collector:4317`).
    #[arg(long, env = "STREAMGATE_EXPORT_OTLP")]
    pub export_otlp: Option<String>,
    /// Put message content (answers, tool arguments and results) in those traces.
    #[arg(long, env = "STREAMGATE_EXPORT_OTLP_CONTENT")]
    pub export_otlp_content: bool,
    /// Milliseconds between export passes.
    #[arg(
        long,
        env = "STREAMGATE_EXPORT_OTLP_INTERVAL_MS",
        default_value_t = 2000
    )]
    pub export_otlp_interval_ms: u64,
    /// At start, runs that began up to this many seconds earlier are exported too; older
    /// ones are left to `streamgate export --otlp`.
    #[arg(
        long,
        env = "STREAMGATE_EXPORT_OTLP_BACKLOG_SECS",
        default_value_t = 3600
    )]
    pub export_otlp_backlog_secs: u64,
}

impl ExportArgs {
    /// The export's settings, when an endpoint is set.
    pub fn config(&self) -> Option<FollowConfig> {
        let endpoint = self.export_otlp.clone().filter(|e| !e.is_empty())?;
        let backlog =
            i64::try_from(self.export_otlp_backlog_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        Some(FollowConfig {
            endpoint,
            content: self.export_otlp_content,
            every: Duration::from_millis(self.export_otlp_interval_ms.max(100)),
            since_ts_ms: streamgate_runtime::clock::now_ms().saturating_sub(backlog),
        })
    }
}

/// Exports ended runs until `shutdown`.
pub async fn run(
    store: Arc<dyn Store>,
    cfg: FollowConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::info!(endpoint = %cfg.endpoint, "exporting ended runs as GenAI traces");
    let mut exporter: Option<Exporter> = None;
    let mut tick = tokio::time::interval(cfg.every.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        if exporter.is_none() {
            match Exporter::connect(&cfg.endpoint, cfg.content).await {
                Ok(e) => exporter = Some(e),
                Err(e) => {
                    metrics::counter!("streamgate_archiver_otlp_export_errors_total").increment(1);
                    tracing::warn!(error = %format!("{e:#}"), "OTLP endpoint unreachable; next pass retries");
                    continue;
                }
            }
        }
        let Some(exp) = exporter.as_mut() else {
            continue;
        };
        if let Err(e) = pass(&*store, exp, &cfg).await {
            metrics::counter!("streamgate_archiver_otlp_export_errors_total").increment(1);
            tracing::warn!(error = %format!("{e:#}"), "trace export failed; next pass retries");
            exporter = None;
        }
    }
}

/// One pass: the ended, unexported runs (up to [`PASS_RUNS`]) sent and marked.
async fn pass(
    store: &dyn Store,
    exporter: &mut Exporter,
    cfg: &FollowConfig,
) -> anyhow::Result<()> {
    let page = store
        .list_runs(&RunFilter {
            since_ts_ms: Some(cfg.since_ts_ms),
            unexported: true,
            limit: PASS_RUNS,
            ..RunFilter::default()
        })
        .await?;
    let ended: Vec<_> = page
        .runs
        .into_iter()
        .filter(|r| r.status != streamgate_archive::RunStatusKind::Open)
        .collect();
    if ended.is_empty() {
        return Ok(());
    }
    for run in &ended {
        let events = events_of(store, &run.tenant, &run.run_id).await?;
        exporter.add(&crate::convert::run(run), &events);
    }
    exporter.flush().await?;
    let done: Vec<(String, String)> = ended
        .iter()
        .map(|r| (r.tenant.clone(), r.run_id.clone()))
        .collect();
    store
        .mark_exported(&done, streamgate_runtime::clock::now_ms())
        .await?;
    metrics::counter!("streamgate_archiver_otlp_exported_runs_total").increment(done.len() as u64);
    Ok(())
}

/// Every event of a run, read from the archive page by page.
pub(crate) async fn events_of(
    store: &dyn Store,
    tenant: &str,
    run_id: &str,
) -> Result<Vec<RunEvent>, streamgate_archive::ArchiveError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events_after(tenant, run_id, after, PAGE).await?;
        let full = page.len() == PAGE as usize;
        if let Some(last) = page.last() {
            after = last.event.event.seq;
        }
        out.extend(page.into_iter().map(|e| e.event));
        if !full {
            return Ok(out);
        }
    }
}

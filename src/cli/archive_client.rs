//! `streamgate runs` and `streamgate replay`: operator clients of the ArchiveService.
//!
//! A run is `(tenant, run id)`: a run id is unique only within its tenant. Both commands
//! take `--tenant` (default `default`, like `streamgate ingest`); `runs --all-tenants`
//! lists every tenant's runs.

use super::discover::{with_hint, Instance};
use anyhow::{Context, Result};
use std::path::PathBuf;
use streamgate_grammar::ids::DEFAULT_TENANT;
use streamgate_grammar::RunEvent;
use streamgate_proto::v1::archive_service_client::ArchiveServiceClient;
use streamgate_proto::v1::{
    ListRunsRequest, ReplayEventsRequest, ReplayStateRequest, ReplayTimelineRequest,
};
use streamgate_runtime::rpc::SendBearer;
use streamgate_runtime::serve::ClientTlsArgs;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// How to reach the archive.
#[derive(Debug, Clone, clap::Args)]
pub struct ArchiveTarget {
    /// ArchiveService address (default: the local `streamgate up`).
    #[arg(long, env = "STREAMGATE_ARCHIVE_ADDR")]
    pub addr: Option<String>,
    /// Operator bearer token (default: the local instance's).
    #[arg(long, env = "STREAMGATE_OPERATOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Data dir of the local instance to find.
    #[arg(long, default_value = super::discover::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// TLS to the ArchiveService.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

/// A connected ArchiveService client with the operator token.
pub type Client = ArchiveServiceClient<InterceptedService<Channel, SendBearer>>;

impl ArchiveTarget {
    /// Connects to the archive (the local instance's when no address is given).
    pub async fn connect(&self) -> Result<Client> {
        let (addr, token, hint) = match (&self.addr, &self.token) {
            (Some(a), t) => (a.clone(), t.clone(), None),
            (None, t) => {
                let inst = Instance::read(&self.data_dir)?;
                let hint = inst.tls_hint(&self.tls);
                (
                    inst.archive_grpc,
                    t.clone().or(Some(inst.operator_token)),
                    hint,
                )
            }
        };
        let channel = self
            .tls
            .endpoint(&addr)?
            .connect()
            .await
            .with_context(|| with_hint(format!("cannot reach the archive at {addr}"), hint))?;
        Ok(
            ArchiveServiceClient::with_interceptor(channel, SendBearer::new(token.as_deref()))
                .max_decoding_message_size(64 << 20),
        )
    }
}

/// Flags of `streamgate runs`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunsArgs {
    /// Only this tenant's runs.
    #[arg(long, default_value = DEFAULT_TENANT)]
    pub tenant: String,
    /// Runs of every tenant (instead of `--tenant`).
    #[arg(long, conflicts_with = "tenant")]
    pub all_tenants: bool,
    /// Only this session.
    #[arg(long)]
    pub session: Option<String>,
    /// Only runs in this state: open, ended, failed.
    #[arg(long)]
    pub status: Option<String>,
    /// At most this many runs.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Full-text search: runs whose final answer holds these words in this order, best
    /// match first, each with the matching part of its answer.
    #[arg(long)]
    pub search: Option<String>,
    /// With --search: search the runs' thinking instead of their answers (indexed only
    /// when the archiver runs with --search-thinking).
    #[arg(long, requires = "search")]
    pub thinking: bool,
    /// Accounting instead of runs: per tenant, model and UTC day the runs, tokens
    /// (input/output/reasoning/cache), mean time to first token and duration, and cost
    /// from the archiver's price table.
    #[arg(long, conflicts_with = "search")]
    pub stats: bool,
    /// With --stats: only runs started within this many days.
    #[arg(long, requires = "stats")]
    pub days: Option<u32>,
    #[command(flatten)]
    target: ArchiveTarget,
}

/// Runs `streamgate runs`.
pub async fn runs(args: RunsArgs) -> Result<()> {
    let mut client = args.target.connect().await?;
    if args.stats {
        return stats(&mut client, &args).await;
    }
    let reply = client
        .list_runs(ListRunsRequest {
            tenant: (!args.all_tenants).then_some(args.tenant),
            session_key: args.session,
            status: args.status,
            limit: args.limit,
            search: args.search.clone(),
            search_thinking: args.thinking,
            ..Default::default()
        })
        .await?
        .into_inner();
    if args.json {
        for r in &reply.runs {
            println!("{}", run_json(r));
        }
        return Ok(());
    }
    if reply.runs.is_empty() {
        eprintln!("no runs match");
        return Ok(());
    }
    println!(
        "{:<19}  {:<28} {:<10} {:<7} {:<14} {:>6}  {:<24} {:<16} GEN",
        "STARTED (UTC)", "RUN", "TENANT", "STATUS", "REASON", "EVENTS", "MODEL", "MADE BY"
    );
    for r in reply.runs {
        let made_by = match (&r.adapter, r.adapter_version) {
            (Some(a), Some(v)) => format!("{a}@{v}"),
            _ => "-".to_owned(),
        };
        println!(
            "{:<19}  {:<28} {:<10} {:<7} {:<14} {:>6}  {:<24} {:<16} {}",
            streamgate_runtime::clock::utc_datetime(r.first_ts_ms),
            r.run_id,
            r.tenant,
            r.status,
            r.stop_reason.unwrap_or_default(),
            r.event_count,
            r.model.unwrap_or_default(),
            made_by,
            r.generation
        );
        if let Some(snippet) = &r.snippet {
            println!("    {}", snippet.replace('\n', " "));
        }
    }
    Ok(())
}

/// A run as `runs --json` prints it (and `export` writes it).
pub fn run_json(r: &streamgate_proto::v1::Run) -> serde_json::Value {
    serde_json::json!({
        "tenant": r.tenant, "run_id": r.run_id, "session_key": r.session_key,
        "provider": r.provider, "model": r.model, "status": r.status,
        "stop_reason": r.stop_reason, "first_seq": r.first_seq, "last_seq": r.last_seq,
        "first_ts_ms": r.first_ts_ms, "last_ts_ms": r.last_ts_ms, "event_count": r.event_count,
        "usage": r.usage_json.as_deref().and_then(|u| serde_json::from_str::<serde_json::Value>(u).ok()),
        "adapter": r.adapter, "adapter_version": r.adapter_version,
        "grammar_version": r.grammar_version, "generation": r.generation,
        "snippet": r.snippet,
        "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
        "reasoning_tokens": r.reasoning_tokens, "cache_read_tokens": r.cache_read_tokens,
        "cache_write_tokens": r.cache_write_tokens, "ttft_ms": r.ttft_ms,
        "ttfa_ms": r.ttfa_ms, "duration_ms": r.duration_ms, "cost": r.cost,
    })
}

/// `streamgate runs --stats`.
async fn stats(client: &mut Client, args: &RunsArgs) -> Result<()> {
    let since = args.days.map(|d| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_millis() as i64);
        now - i64::from(d) * 86_400_000
    });
    let reply = client
        .run_stats(streamgate_proto::v1::RunStatsRequest {
            tenant: (!args.all_tenants).then(|| args.tenant.clone()),
            since_ts_ms: since,
            until_ts_ms: None,
        })
        .await?
        .into_inner();
    if !args.json {
        println!(
            "{:<10} {:<10} {:<24} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10}",
            "DAY",
            "TENANT",
            "MODEL",
            "RUNS",
            "INPUT",
            "OUTPUT",
            "REASONING",
            "CACHE RD",
            "TTFT ms",
            "DUR ms",
            "COST"
        );
    }
    for r in reply.rows {
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "day": r.day, "tenant": r.tenant, "model": r.model, "runs": r.runs,
                    "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                    "reasoning_tokens": r.reasoning_tokens, "cache_read_tokens": r.cache_read_tokens,
                    "cache_write_tokens": r.cache_write_tokens, "mean_ttft_ms": r.mean_ttft_ms,
                    "mean_duration_ms": r.mean_duration_ms, "cost": r.cost, "currency": reply.currency,
                })
            );
        } else {
            println!(
                "{:<10} {:<10} {:<24} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10}",
                r.day,
                r.tenant,
                r.model,
                r.runs,
                r.input_tokens,
                r.output_tokens,
                r.reasoning_tokens,
                r.cache_read_tokens,
                r.mean_ttft_ms
                    .map_or_else(|| "-".to_owned(), |t| t.to_string()),
                r.mean_duration_ms,
                r.cost
                    .map_or_else(|| "-".to_owned(), |c| format!("{c:.4} {}", reply.currency)),
            );
        }
    }
    Ok(())
}

/// Flags of `streamgate replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The run.
    pub run: String,
    /// The run's tenant (a run id is unique only within its tenant).
    #[arg(long, default_value = DEFAULT_TENANT)]
    pub tenant: String,
    /// Only events after this seq.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Keep following live events until the run ends.
    #[arg(long)]
    pub follow: bool,
    /// Print the folded state instead of events.
    #[arg(long, conflicts_with_all = ["timeline", "follow"])]
    pub state: bool,
    /// Print the timeline instead of events.
    #[arg(long, conflicts_with = "follow")]
    pub timeline: bool,
    /// Machine-readable output (events: the golden line shape plus envelope fields).
    #[arg(long)]
    pub json: bool,
    /// Read an older generation of the run (a backfill keeps the events it replaced):
    /// 1 is what the normalizer made live.
    #[arg(long, conflicts_with = "follow")]
    pub generation: Option<u32>,
    #[command(flatten)]
    target: ArchiveTarget,
}

/// Runs `streamgate replay`.
pub async fn replay(args: ReplayArgs) -> Result<()> {
    let mut client = args.target.connect().await?;
    if args.state {
        let s = client
            .replay_state(ReplayStateRequest {
                run_id: args.run.clone(),
                at_seq: 0,
                tenant: args.tenant.clone(),
                generation: args.generation,
            })
            .await?
            .into_inner();
        let v = serde_json::json!({
            "tenant": s.tenant, "run_id": s.run_id, "at_seq": s.at_seq, "provider": s.provider, "model": s.model,
            "status": s.status, "stop_reason": s.stop_reason, "final_text": s.final_text,
            "final_truncated": s.final_truncated,
            "thinking": s.thinking.iter().map(|t| serde_json::json!({
                "id": t.id, "variant": t.variant, "text": t.text, "tokens": t.tokens,
                "first_seq": t.first_seq, "last_seq": t.last_seq})).collect::<Vec<_>>(),
            "items": s.items.iter().map(|i| serde_json::json!({
                "id": i.id, "kind": i.kind, "name": i.name, "status": i.status,
                "arguments": i.arguments_json.as_deref().and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok()),
                "first_seq": i.first_seq, "last_seq": i.last_seq})).collect::<Vec<_>>(),
            "usage": s.usage_json.as_deref().and_then(|u| serde_json::from_str::<serde_json::Value>(u).ok()),
        });
        if args.json {
            println!("{v}");
        } else {
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        return Ok(());
    }
    if args.timeline {
        let t = client
            .replay_timeline(ReplayTimelineRequest {
                run_id: args.run.clone(),
                tenant: args.tenant.clone(),
                generation: args.generation,
            })
            .await?
            .into_inner();
        for e in t.entries {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"kind": e.kind, "id": e.id, "label": e.label,
                        "start_seq": e.start_seq, "end_seq": e.end_seq,
                        "start_ts_ms": e.start_ts_ms, "end_ts_ms": e.end_ts_ms, "duration_ms": e.duration_ms})
                );
            } else {
                println!(
                    "{:>5}..{:<5} {:<13} {:<20} {:>6} ms",
                    e.start_seq, e.end_seq, e.kind, e.label, e.duration_ms
                );
            }
        }
        return Ok(());
    }
    let mut events = client
        .replay_events(ReplayEventsRequest {
            run_id: args.run.clone(),
            after_seq: args.after,
            follow: args.follow,
            tenant: args.tenant.clone(),
            generation: args.generation,
        })
        .await?
        .into_inner();
    let mut any = false;
    while let Some(e) = events.message().await? {
        any = true;
        let Some(ev) = e.event else { continue };
        let ev = RunEvent::try_from(ev)?;
        if args.json {
            println!("{}", ev.to_json());
        } else {
            println!("{}", crate::terminal::line(&ev));
        }
    }
    if !any && args.after == 0 {
        match args.generation {
            Some(g) => anyhow::bail!(
                "no generation {g} of run `{}` of tenant `{}` in the archive",
                args.run,
                args.tenant
            ),
            None => anyhow::bail!(
                "no events for run `{}` of tenant `{}` in the archive",
                args.run,
                args.tenant
            ),
        }
    }
    Ok(())
}

//! `streamgate verify` and `streamgate backfill`: operator clients of the ArchiveService's
//! `Verify` and `Backfill` (docs/architecture.md §5, governable history).
//!
//! Both print one line per run as the archiver finishes it (`--json`: one object per
//! run), a progress line on a terminal's stderr, and a summary with throughput. Exit
//! codes are for CI: `verify` fails (1) when a run differs; `backfill` fails when a run
//! differs and was not rewritten (a dry run, an open run, a race).

use super::archive_client::ArchiveTarget;
use anyhow::{bail, Result};
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use streamgate_proto::v1::{BackfillRequest, VerifyReport, VerifyRequest};

/// Which runs (flags shared by both commands).
#[derive(Debug, Clone, clap::Args)]
pub struct ScopeArgs {
    /// Only this tenant's runs (default: every tenant's; with `--run`, `default`).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this run.
    #[arg(long)]
    pub run: Option<String>,
    /// Only runs started within this long ago (`90s`, `30m`, `12h`, `7d`) or since this
    /// time in ms since the Unix epoch.
    #[arg(long, value_parser = parse_since)]
    pub since: Option<i64>,
    /// Only runs of this wire family (`f1`, `f2`, `ollama-native`, …).
    #[arg(long)]
    pub family: Option<String>,
    /// One JSON object per run.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    target: ArchiveTarget,
}

impl ScopeArgs {
    fn request(&self) -> VerifyRequest {
        VerifyRequest {
            tenant: self.tenant.clone(),
            run_id: self.run.clone(),
            since_ts_ms: self.since,
            family: self.family.clone(),
        }
    }
}

/// Flags of `streamgate backfill`.
#[derive(Debug, Clone, clap::Args)]
pub struct BackfillArgs {
    /// Write the new generations (without it: a dry run that reports what would be
    /// written).
    #[arg(long)]
    pub apply: bool,
    #[command(flatten)]
    pub scope: ScopeArgs,
}

/// `--since`: a duration ago, or an absolute time in ms.
pub(crate) fn parse_since(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let (n, unit) = s.split_at(s.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| {
        format!("`{s}` is neither a duration (90s, 30m, 12h, 7d) nor ms since the epoch")
    })?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("`{s}`: the unit must be s, m, h or d")),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Ok(now - (secs as i64) * 1000)
}

/// Runs `streamgate verify`.
pub async fn verify(args: ScopeArgs) -> Result<ExitCode> {
    let mut client = args.target.connect().await?;
    let reports = client.verify(args.request()).await?.into_inner();
    let tally = print_reports(reports, args.json).await?;
    tally.summary("verified");
    Ok(if tally.differs > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs `streamgate backfill`.
pub async fn backfill(args: BackfillArgs) -> Result<ExitCode> {
    let mut client = args.scope.target.connect().await?;
    let reports = client
        .backfill(BackfillRequest {
            scope: Some(args.scope.request()),
            apply: args.apply,
        })
        .await?
        .into_inner();
    let tally = print_reports(reports, args.scope.json).await?;
    tally.summary(if args.apply {
        "backfilled"
    } else {
        "checked (dry run)"
    });
    if !args.apply && tally.differs > 0 {
        eprintln!(
            "streamgate: dry run: add --apply to write the {} new generation(s)",
            tally.differs
        );
    }
    Ok(if tally.differs > tally.written {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Counts over the reports.
#[derive(Default)]
struct Tally {
    runs: u64,
    identical: u64,
    differs: u64,
    no_raw: u64,
    written: u64,
    raw_bytes: u64,
    started: Option<Instant>,
}

impl Tally {
    fn add(&mut self, r: &VerifyReport) {
        self.runs += 1;
        self.raw_bytes += r.raw_bytes;
        match r.verdict.as_str() {
            "identical" => self.identical += 1,
            "differs" => self.differs += 1,
            _ => self.no_raw += 1,
        }
        if r.written_generation.is_some() {
            self.written += 1;
        }
    }

    fn summary(&self, verb: &str) {
        let secs = self
            .started
            .map_or(0.0, |t| t.elapsed().as_secs_f64())
            .max(1e-3);
        let mb = self.raw_bytes as f64 / 1e6;
        eprintln!(
            "{verb} {} runs ({mb:.1} MB raw) in {secs:.1} s — {:.0} runs/s, {:.1} MB/s: {} identical, {} differ{}, {} without raw chunks",
            self.runs,
            self.runs as f64 / secs,
            mb / secs,
            self.identical,
            self.differs,
            if self.written > 0 { format!(" ({} rewritten)", self.written) } else { String::new() },
            self.no_raw,
        );
        if self.no_raw > 0 {
            eprintln!("  runs without raw chunks cannot be verified: run the archiver with --archive-raw to keep them");
        }
    }
}

async fn print_reports(mut reports: tonic::Streaming<VerifyReport>, json: bool) -> Result<Tally> {
    let mut tally = Tally {
        started: Some(Instant::now()),
        ..Tally::default()
    };
    let progress = std::io::stderr().is_terminal();
    let mut shown = Instant::now();
    while let Some(r) = reports.message().await? {
        tally.add(&r);
        if progress {
            // Clear the progress line before a report line.
            eprint!("\r\x1b[K");
        }
        if json {
            println!("{}", report_json(&r));
        } else if r.verdict != "identical" || r.written_generation.is_some() {
            print_report(&r);
        } else {
            println!("identical  {}/{}  g{}", r.tenant, r.run_id, r.generation);
        }
        if progress && shown.elapsed() > Duration::from_millis(200) {
            shown = Instant::now();
            eprint!(
                "  {} runs, {:.1} MB raw…",
                tally.runs,
                tally.raw_bytes as f64 / 1e6
            );
            let _ = std::io::stderr().flush();
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    if tally.runs == 0 {
        bail!("no run matches (check --tenant, --run, --since and --family)");
    }
    Ok(tally)
}

fn print_report(r: &VerifyReport) {
    let made = |m: &Option<String>| m.clone().unwrap_or_else(|| "unrecorded".to_owned());
    match r.verdict.as_str() {
        "no_raw_chunks" => println!("no raw     {}/{}  g{}", r.tenant, r.run_id, r.generation),
        _ => {
            let action = match (&r.written_generation, r.skipped.as_deref()) {
                (Some(g), _) => format!("  → wrote g{g}"),
                (None, Some("open")) => "  (open: not rewritten)".to_owned(),
                (None, Some(why)) => format!("  ({why}: not rewritten)"),
                (None, None) => String::new(),
            };
            println!(
                "DIFFERS    {}/{}  g{} made by {}, today {}: first at seq {} in {} ({} event{}){action}",
                r.tenant,
                r.run_id,
                r.generation,
                made(&r.made_by),
                made(&r.made_today),
                r.first_seq.unwrap_or(0),
                r.differs_in.join(", "),
                r.differing_events,
                if r.differing_events == 1 { "" } else { "s" },
            );
            let show = |s: &Option<String>| match s {
                Some(line) if line.chars().count() > 240 => {
                    format!("{}…", line.chars().take(240).collect::<String>())
                }
                Some(line) => line.clone(),
                None => "(none)".to_owned(),
            };
            println!("  archived:     {}", show(&r.archived_json));
            println!("  renormalized: {}", show(&r.renormalized_json));
        }
    }
}

fn report_json(r: &VerifyReport) -> serde_json::Value {
    serde_json::json!({
        "tenant": r.tenant, "run_id": r.run_id, "verdict": r.verdict,
        "generation": r.generation, "made_by": r.made_by, "made_today": r.made_today,
        "first_seq": r.first_seq, "archived": r.archived_json, "renormalized": r.renormalized_json,
        "differs_in": r.differs_in, "differing_events": r.differing_events,
        "raw_bytes": r.raw_bytes, "events": r.events, "open": r.open,
        "written_generation": r.written_generation, "skipped": r.skipped,
    })
}

/// Flags of `streamgate erase`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["run", "session", "all", "audit"])))]
pub struct EraseArgs {
    /// The tenant whose runs go (a run id is unique only within its tenant).
    #[arg(long, default_value = streamgate_grammar::ids::DEFAULT_TENANT)]
    pub tenant: String,
    /// Erase this run.
    #[arg(long)]
    pub run: Option<String>,
    /// Erase every run of this chat session.
    #[arg(long)]
    pub session: Option<String>,
    /// Erase every run of the tenant (needs --yes).
    #[arg(long)]
    pub all: bool,
    /// Confirms --all.
    #[arg(long)]
    pub yes: bool,
    /// Who asks, for the audit record (default: $USER).
    #[arg(long)]
    pub actor: Option<String>,
    /// List the erasure audit instead (newest first; ids appear as SHA-256 of
    /// `<tenant>/<id>`).
    #[arg(long)]
    pub audit: bool,
    #[command(flatten)]
    target: ArchiveTarget,
}

/// Runs `streamgate erase`.
pub async fn erase(args: EraseArgs) -> Result<()> {
    use streamgate_proto::v1::{erase_request::Scope, EraseRequest, ListErasuresRequest};
    let mut client = args.target.connect().await?;
    if args.audit {
        let reply = client
            .list_erasures(ListErasuresRequest {
                tenant: Some(args.tenant),
                limit: 0,
            })
            .await?
            .into_inner();
        for e in reply.erasures {
            println!(
                "#{:<5} {} {:<8} {:<10} {} runs, {} events, {} raw chunks  by {}{}",
                e.id,
                e.at_ms,
                e.scope,
                e.tenant,
                e.run_hashes.len(),
                e.events,
                e.raw_chunks,
                e.actor,
                if e.scope_hash.is_empty() {
                    String::new()
                } else {
                    format!("  ({})", e.scope_hash)
                },
            );
        }
        return Ok(());
    }
    let scope = match (args.run, args.session, args.all) {
        (Some(run), _, _) => Scope::RunId(run),
        (None, Some(session), _) => Scope::SessionKey(session),
        (None, None, true) if args.yes => Scope::All(true),
        (None, None, _) => bail!(
            "--all erases every run of tenant `{}` from every store: add --yes to confirm",
            args.tenant
        ),
    };
    let actor = args
        .actor
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    let r = client
        .erase(EraseRequest {
            tenant: args.tenant.clone(),
            scope: Some(scope),
            actor,
        })
        .await?
        .into_inner();
    println!(
        "erased {} run{} of tenant `{}`: {} events, {} raw chunks, {} broker messages (audit #{})",
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        args.tenant,
        r.events,
        r.raw_chunks,
        r.bus_messages,
        r.audit_id
    );
    if r.open_runs > 0 {
        eprintln!(
            "streamgate: {} of them were still open: if their provider streams on, erase them again once they end",
            r.open_runs
        );
    }
    Ok(())
}

/// Flags of `streamgate retention`.
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// Run one pass of the policies now (without it: show them and what is due).
    #[arg(long)]
    pub apply: bool,
    #[command(flatten)]
    target: ArchiveTarget,
}

/// Runs `streamgate retention`.
pub async fn retention(args: RetentionArgs) -> Result<()> {
    let mut client = args.target.connect().await?;
    let r = client
        .retention(streamgate_proto::v1::RetentionRequest { apply: args.apply })
        .await?
        .into_inner();
    if r.policies.is_empty() {
        println!("no retention policy: the archive keeps everything (set STREAMGATE_RETENTION, e.g. `*:strip=30d,drop=365d`)");
        return Ok(());
    }
    for p in &r.policies {
        println!("policy {p}");
    }
    if r.applied {
        println!(
            "stripped {} runs ({} events now stubs), dropped {} runs ({} events)",
            r.stripped_runs, r.stripped_events, r.dropped_runs, r.dropped_events
        );
    } else {
        println!(
            "due now: {} runs to strip, {} runs ({} events) to drop — `--apply` runs it now; the archiver also does on its schedule",
            r.stripped_runs, r.dropped_runs, r.dropped_events
        );
    }
    Ok(())
}

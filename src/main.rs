//! `streamgate`: the command-line front of streamgate.
//!
//! # Layout
//! - `cli::normalize`: offline normalization of a capture file to canonical JSONL.
//! - `cli::conform`: golden conformance over a corpus folder (`index.tsv`).
//! - `cli::synth`: large single-run captures for benchmarks.
//! - `cli::up`: the whole pipeline in one process (`streamgate up`).
//! - `cli::ingest`, `cli::archive_client`, `cli::history`: clients of the ingest and
//!   archive services (`verify` and `backfill` in `cli::history`).
//! - `cli::follow_gateway`: follows a live OpenClaw gateway into ingest runs.
//! - `cli::tail`: the terminal channel as a client of a projector channel.
//! - `cli::discover`: how clients find a local `streamgate up`.
//! - `terminal`: the terminal channel's rendering (used by `up` and `tail`).
#![forbid(unsafe_code)]

mod cli;
mod terminal;

/// mimalloc instead of the C library's malloc, for measured performance: the adapters
/// and the services allocate per frame and per message, and glibc's malloc and free took
/// a quarter of this process's CPU in the pipeline bench (docs/performance.md: 12% more
/// events per second, `normalize` 8–13% faster at the same peak memory).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Turns every LLM provider's streaming wire format into one canonical event grammar.
#[derive(Debug, Parser)]
#[command(name = "streamgate", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Normalize a raw capture offline and print its events as JSONL (the golden shape).
    Normalize {
        /// Wire family: f1, f1e, f2, f3, f5, ollama-native, codex-appserver, codex-exec,
        /// openclaw-events, acp, or auto.
        #[arg(long, default_value = "auto")]
        family: String,
        /// Write the adapter's side-channel transcript (opaque material) here as JSONL.
        #[arg(long)]
        transcript: Option<PathBuf>,
        /// The capture file (`-` for standard input).
        capture: PathBuf,
    },
    /// Check every case of a conformance corpus against its golden events.
    Conform {
        /// Folder holding `index.tsv`, `captures/` and `expected/`.
        #[arg(long)]
        corpus: PathBuf,
    },
    /// Run the whole pipeline locally: nats-server, normalizer, archiver (SQLite), and a
    /// terminal channel.
    Up(cli::up::UpArgs),
    /// Send a capture to the ingest service as one run.
    Ingest(cli::ingest::IngestArgs),
    /// Follow a live OpenClaw gateway over WebSocket: each of its agent runs is ingested
    /// as an `openclaw-events` run.
    FollowGateway(cli::follow_gateway::FollowGatewayArgs),
    /// List archived runs (operator).
    Runs(cli::archive_client::RunsArgs),
    /// Replay a run from the archive (operator).
    Replay(cli::archive_client::ReplayArgs),
    /// Re-normalize archived raw chunks with this build's adapters and report, per run,
    /// whether the archive holds exactly what they yield (operator; exit 1 when a run
    /// differs).
    Verify(cli::history::ScopeArgs),
    /// Verify, and with --apply write each differing run's re-normalization as its new
    /// generation; the old one stays readable (`replay --generation N`) (operator).
    Backfill(cli::history::BackfillArgs),
    /// Erase a run, a session or every run of a tenant from every store (archive, broker
    /// streams, projector state), leaving an audit record without content (operator).
    Erase(cli::history::EraseArgs),
    /// Show the archive's retention policies and what they make due, or apply them now
    /// (operator).
    Retention(cli::history::RetentionArgs),
    /// Export a tenant's runs over a time range as JSONL (each run with its events), or
    /// as OpenTelemetry GenAI traces to an OTLP endpoint (operator).
    Export(cli::export::ExportArgs),
    /// Follow a channel's runs live in this terminal (status line and final answers),
    /// through the channel's ProjectorService.
    Tail(cli::tail::TailArgs),
    /// Show or change a chat's `/reasoning` and `/verbose` on a running channel.
    Settings(cli::settings::SettingsArgs),
    /// List a running channel's parked finals (retries ran out), or send them again.
    Parked(cli::parked::ParkedArgs),
    /// Run the normalizer service (same flags as `streamgate-normalizer`).
    Normalizer(streamgate_normalizer::cli::Args),
    /// Run the archiver service (same flags as `streamgate-archiver`).
    Archiver(streamgate_archiver::cli::Args),
    /// Run one channel's projector service (same flags as `streamgate-projector`).
    Projector(streamgate_projector::cli::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Grow a capture into a large single-run capture (for benchmarks and load tests).
    Synth {
        /// The capture to grow.
        capture: PathBuf,
        /// Target size in MiB.
        #[arg(long, default_value_t = 100)]
        mib: usize,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
}

/// Runs an async subcommand on a fresh runtime; the offline commands need none.
fn block_on(
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<ExitCode> {
    block_on_code(async { fut.await.map(|()| ExitCode::SUCCESS) })
}

/// [`block_on`] for a subcommand that chooses its exit code.
fn block_on_code(
    fut: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(fut)
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// N concurrent runs through the whole pipeline: events/s and ingest→commit latency,
    /// next to a raw JetStream publish baseline.
    Pipeline(cli::bench::PipelineArgs),
    /// One projector channel (signed webhook to a local receiver) under N concurrent runs:
    /// events/s and event→sink latency.
    Projector(cli::bench_projector::ProjectorArgs),
    /// The pipeline on a 3-node loopback nats-server cluster (R3) with a webhook channel
    /// at 1 and then 3 projector replicas: events/s ingest→archived and event→webhook
    /// latency for each.
    Cluster(cli::bench_cluster::ClusterArgs),
    /// `streamgate verify` on an archive filled to a given size: runs/s and MB/s of raw.
    Verify(cli::bench_verify::VerifyArgs),
    /// serde_json validation of every JSON document in a capture: the baseline
    /// `scripts/bench-adapters.sh` times beside each adapter.
    Json(cli::bench_json::JsonArgs),
}

/// Ends the process quietly when stdout is a closed pipe (`streamgate replay r1 | head`).
/// Rust ignores SIGPIPE, so `println!` panics there instead of the process dying like a
/// Unix filter; restoring SIGPIPE would need `unsafe` (forbidden here), so the panic that
/// a write to a closed stdout raises becomes a silent exit.
fn exit_quietly_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    exit_quietly_on_closed_pipe();
    if let Err(e) = streamgate_runtime::config::load_env_file_from_args() {
        eprintln!("streamgate: {e}");
        return ExitCode::FAILURE;
    }
    let args = Args::parse();
    // Only the commands whose output is stdout end quietly on a closed pipe: a broken
    // pipe anywhere else (a socket the server closed, say a refused TLS client
    // certificate) is an error, never a silent success.
    let prints = matches!(
        args.command,
        Command::Runs(_)
            | Command::Replay(_)
            | Command::Verify(_)
            | Command::Export(_)
            | Command::Backfill(_)
            | Command::Tail(_)
            | Command::Normalize { .. }
            | Command::Conform { .. }
    );
    let result = match args.command {
        Command::Up(a) => block_on(cli::up::run(a)),
        Command::Bench(BenchCommand::Pipeline(a)) => block_on(cli::bench::pipeline(a)),
        Command::Bench(BenchCommand::Projector(a)) => block_on(cli::bench_projector::projector(a)),
        Command::Bench(BenchCommand::Cluster(a)) => block_on(cli::bench_cluster::cluster(a)),
        Command::Bench(BenchCommand::Verify(a)) => block_on(cli::bench_verify::verify(a)),
        Command::Bench(BenchCommand::Json(a)) => {
            cli::bench_json::json(a).map(|()| ExitCode::SUCCESS)
        }
        Command::Ingest(a) => block_on(cli::ingest::run(a)),
        Command::FollowGateway(a) => block_on(cli::follow_gateway::run(a)),
        Command::Runs(a) => block_on(cli::archive_client::runs(a)),
        Command::Replay(a) => block_on(cli::archive_client::replay(a)),
        Command::Verify(a) => block_on_code(cli::history::verify(a)),
        Command::Backfill(a) => block_on_code(cli::history::backfill(a)),
        Command::Erase(a) => block_on(cli::history::erase(a)),
        Command::Retention(a) => block_on(cli::history::retention(a)),
        Command::Export(a) => block_on(cli::export::run(a)),
        Command::Tail(a) => block_on(cli::tail::run(a)),
        Command::Settings(a) => block_on(cli::settings::run(a)),
        Command::Parked(a) => block_on(cli::parked::run(a)),
        Command::Normalizer(a) => block_on(streamgate_normalizer::cli::run(a)),
        Command::Archiver(a) => block_on(streamgate_archiver::cli::run(a)),
        Command::Projector(a) => block_on(streamgate_projector::cli::run(a)),
        Command::Normalize {
            family,
            transcript,
            capture,
        } => cli::normalize::run(&family, transcript.as_deref(), &capture),
        Command::Conform { corpus } => cli::conform::run(&corpus),
        Command::Synth {
            capture,
            mib,
            output,
        } => cli::synth::run(&capture, mib, &output),
    };
    match result {
        Ok(code) => code,
        Err(e) if prints && is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("streamgate: {}", human(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error as a person reads it: its chain joined by ": ", leaving out a cause the
/// message before it already says (error types that print their source, such as an
/// io::Error wrapped with its own text), and a gRPC status as its message and code name
/// instead of tonic's `status: '…', message: "…"` form.
fn human(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = match cause.downcast_ref::<tonic::Status>() {
            Some(s) if s.message().is_empty() => format!("{:?}", s.code()),
            Some(s) => format!("{} ({:?})", s.message(), s.code()),
            None => cause.to_string(),
        };
        let said = parts
            .last()
            .is_some_and(|prev| prev.contains(text.as_str()));
        if !text.is_empty() && !said {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// True when `e` came from writing to a closed pipe.
fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn errors_read_once_and_statuses_read_as_their_message() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        let e = anyhow::Error::new(io).context("binding 127.0.0.1:7320: Address already in use");
        assert_eq!(human(&e), "binding 127.0.0.1:7320: Address already in use");
        let status = tonic::Status::failed_precondition("run r1 is already closed");
        let e = anyhow::Error::new(status).context("ingest r1");
        assert_eq!(
            human(&e),
            "ingest r1: run r1 is already closed (FailedPrecondition)"
        );
    }
}

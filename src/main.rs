//! `streamgate`: the command-line front of streamgate.
//!
//! # Layout
//! - `cli::normalize`: offline normalization of a capture file to canonical JSONL.
//! - `cli::conform`: golden conformance over a corpus folder (`index.tsv`).
//! - `cli::synth`: large single-run captures for benchmarks.
#![forbid(unsafe_code)]

mod cli;

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
        /// Wire family: f1, f1e, f2, f3, f5, ollama-native, codex-appserver, or auto.
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

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
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
        Err(e) => {
            eprintln!("streamgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

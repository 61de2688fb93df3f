//! `streamgate-archiver`: the archiver service as its own process (for Kubernetes).
//!
//! Configuration: flags, or `STREAMGATE_*` environment variables, or a `--config` file of
//! `STREAMGATE_*=value` lines (flag > environment > file).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    streamgate_runtime::config::load_env_file_from_args()?;
    streamgate_archiver::cli::run(streamgate_archiver::cli::Args::parse()).await
}

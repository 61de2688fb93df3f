//! `streamgate-projector`: one chat channel's projector as its own process.
//!
//! Configuration: flags, or `STREAMGATE_*` environment variables, or a `--config` file of
//! `STREAMGATE_*=value` lines (flag > environment > file).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    streamgate_runtime::config::load_env_file_from_args()?;
    streamgate_projector::cli::run(streamgate_projector::cli::Args::parse()).await
}

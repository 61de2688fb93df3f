//! `streamgate-normalizer`: the normalizer service as its own process (for Kubernetes).
//!
//! Configuration: flags, or `STREAMGATE_*` environment variables, or a `--config` file of
//! `STREAMGATE_*=value` lines (flag > environment > file).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    streamgate_runtime::config::load_env_file_from_args()?;
    streamgate_normalizer::cli::run(streamgate_normalizer::cli::Args::parse()).await
}

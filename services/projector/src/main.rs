//! `streamgate-projector`: one chat channel's projector as its own process.
//!
//! Configuration: flags, or `STREAMGATE_*` environment variables, or a `--config` file of
//! `STREAMGATE_*=value` lines (flag > environment > file).

use clap::Parser;

/// mimalloc instead of the C library's malloc, for measured performance
/// (docs/performance.md: the pipeline moves 12% more events per second with it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // The config file's variables are exported while the process is still single-threaded
    // (setting the environment races with threads reading it): before the tokio runtime
    // and its worker threads start.
    streamgate_runtime::config::load_env_file_from_args()?;
    let args = streamgate_projector::cli::Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(streamgate_projector::cli::run(args))
}

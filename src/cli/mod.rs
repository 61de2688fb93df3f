//! Subcommands.

pub mod archive_client;
pub mod bench;
pub mod bench_baseline;
pub mod bench_cluster;
pub mod bench_json;
pub mod bench_proc;
pub mod bench_projector;
pub mod bench_verify;
pub mod channel_client;
pub mod conform;
pub mod discover;
pub mod export;
pub mod follow_gateway;
pub mod history;
pub mod ingest;
pub mod normalize;
pub mod parked;
pub mod settings;
pub mod synth;
pub mod tail;
pub mod up;

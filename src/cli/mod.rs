//! Subcommands.

pub mod archive_client;
pub mod bench;
pub mod bench_projector;
pub mod conform;
pub mod discover;
pub mod ingest;
pub mod normalize;
pub mod synth;
pub mod tail;
pub mod up;

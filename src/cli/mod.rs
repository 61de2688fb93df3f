//! Subcommands.

pub mod conform;
pub mod normalize;
pub mod synth;

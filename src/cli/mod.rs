//! Subcommands.

pub mod conform;
pub mod normalize;

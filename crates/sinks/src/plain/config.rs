//! Plain sink configuration.

use serde::{Deserialize, Serialize};

/// Where a configured plain sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlainTarget {
    /// Standard output.
    #[default]
    Stdout,
    /// Standard error.
    Stderr,
}

/// Configuration of one plain-text channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlainConfig {
    /// Channel name ([`crate::ChatTarget::channel`]).
    pub name: String,
    /// Output stream.
    #[serde(default)]
    pub target: PlainTarget,
}

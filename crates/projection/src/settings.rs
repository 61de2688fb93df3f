//! Presentation settings (spec §4.1): they change pixels, never the record.

use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// `/reasoning`: how the thinking lane renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reasoning {
    /// Thinking is not rendered.
    #[default]
    Off,
    /// Rendered once per segment, at segment end.
    On,
    /// Rendered live in the draft, then settled.
    Stream,
}

/// `/verbose`: how tool activity renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verbose {
    /// Liveness indicator only.
    #[default]
    Off,
    /// Tool name + status rows.
    On,
    /// Rows plus display-safe argument/result summaries.
    Full,
}

/// Delivery mode (ACP-style knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Drafts stream live, then the final answer.
    #[default]
    Live,
    /// Only the final answer (and errors) are delivered.
    FinalOnly,
}

/// Channel capability tier (DESIGN §6; RFC 0015 names, spec v0.4 letters accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Tier {
    /// Editable draft + durable messages (spec "A": Telegram, Discord, Slack).
    T1,
    /// Native rich surface (spec "B": web UI). `status_line` = the spec "C" clamp (TUI).
    T2 {
        /// Single status line instead of a full event UI (spec tier "C").
        status_line: bool,
    },
    /// Append-only / persist-only (spec "D": plain text, webhooks without edit).
    T0,
}

/// An unknown tier name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tier `{0}` (expected T0, T1, T2, or A, B, C, D)")]
pub struct UnknownTier(pub String);

impl FromStr for Tier {
    type Err = UnknownTier;
    fn from_str(s: &str) -> Result<Tier, UnknownTier> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "T1" | "A" => Tier::T1,
            "T2" | "B" => Tier::T2 { status_line: false },
            "C" | "T2C" | "T2-STATUS" => Tier::T2 { status_line: true },
            "T0" | "D" => Tier::T0,
            _ => return Err(UnknownTier(s.to_owned())),
        })
    }
}

/// Character budgets of a draft (spec §7.2 overflow rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// Hard size of one draft message (Discord 2000, Telegram 4096).
    pub draft_max_chars: usize,
    /// Budget of one thinking segment before head+tail elision.
    pub thinking_chars: usize,
    /// Budget of one tool row's detail.
    pub item_detail_chars: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            draft_max_chars: 2000,
            thinking_chars: 600,
            item_detail_chars: 120,
        }
    }
}

/// Everything that decides rendering for one chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// `/reasoning`.
    pub reasoning: Reasoning,
    /// `/verbose`.
    pub verbose: Verbose,
    /// Live drafts or final only.
    pub delivery: Delivery,
    /// Size budgets.
    pub budgets: Budgets,
    /// Suppress a commentary line identical to the previous one (ACP repeat suppression).
    pub suppress_repeats: bool,
    /// Render variant tags (`raw`/`summary`) on thinking blocks.
    pub show_variant_tags: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            reasoning: Reasoning::Off,
            verbose: Verbose::On,
            delivery: Delivery::Live,
            budgets: Budgets::default(),
            suppress_repeats: true,
            show_variant_tags: false,
        }
    }
}

impl FromStr for Reasoning {
    type Err = String;
    fn from_str(s: &str) -> Result<Reasoning, String> {
        match s {
            "off" => Ok(Reasoning::Off),
            "on" => Ok(Reasoning::On),
            "stream" => Ok(Reasoning::Stream),
            _ => Err(format!("/reasoning takes off, on or stream, not `{s}`")),
        }
    }
}

impl FromStr for Verbose {
    type Err = String;
    fn from_str(s: &str) -> Result<Verbose, String> {
        match s {
            "off" => Ok(Verbose::Off),
            "on" => Ok(Verbose::On),
            "full" => Ok(Verbose::Full),
            _ => Err(format!("/verbose takes off, on or full, not `{s}`")),
        }
    }
}

impl std::fmt::Display for Reasoning {
    /// The chat command's spelling (`off`, `on`, `stream`), as [`FromStr`] reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reasoning::Off => "off",
            Reasoning::On => "on",
            Reasoning::Stream => "stream",
        })
    }
}

impl std::fmt::Display for Verbose {
    /// The chat command's spelling (`off`, `on`, `full`), as [`FromStr`] reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verbose::Off => "off",
            Verbose::On => "on",
            Verbose::Full => "full",
        })
    }
}

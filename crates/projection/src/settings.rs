//! Presentation settings (spec §4.1): they change pixels, never the record.
//!
//! Besides `/reasoning` and `/verbose`, the ACP dedupe plan's knobs (issue #13), for
//! every channel and every wire family: [`TagVisibility`] (which update tags render),
//! `suppress_repeats` (`repeatSuppression`), [`Delivery`] (`deliveryMode`) and the
//! [`Budgets`] (`maxTurnChars` = `draft_max_chars`, `maxToolSummaryChars` =
//! `item_detail_chars`, `maxStatusChars` = `status_chars`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::str::FromStr;

/// The update tags of [`TagVisibility`]: ACP `sessionUpdate` kinds, mapped onto the
/// canonical events of every family. The four content tags name event streams; every
/// other tag is a `lifecycle` `phase:"update"` event whose `diagnostic.code` is the tag
/// (what the ACP adapter emits; other families' update diagnostics such as
/// `unknown_frame` are tags the same way). A `lifecycle/update` with `usage` but no
/// diagnostic counts as [`tags::USAGE_UPDATE`].
pub mod tags {
    /// Assistant text (`assistant` commentary in the draft; the final answer is always
    /// delivered).
    pub const AGENT_MESSAGE_CHUNK: &str = "agent_message_chunk";
    /// Thinking (`thinking`); by default it follows `/reasoning`.
    pub const AGENT_THOUGHT_CHUNK: &str = "agent_thought_chunk";
    /// Item start (`item` `phase:"start"`): without it, no tool rows at all.
    pub const TOOL_CALL: &str = "tool_call";
    /// Item update/end: without it, tool rows stay as they started (no progress edits).
    pub const TOOL_CALL_UPDATE: &str = "tool_call_update";
    /// ACP plan (`{entries:[{content, status, priority}]}`).
    pub const PLAN: &str = "plan";
    /// Context usage (`{used, size, cost?}`, or the lifecycle `usage`).
    pub const USAGE_UPDATE: &str = "usage_update";
    /// Slash commands the agent offers (`{availableCommands:[…]}`).
    pub const AVAILABLE_COMMANDS_UPDATE: &str = "available_commands_update";
    /// Session mode (`{currentModeId}`).
    pub const CURRENT_MODE_UPDATE: &str = "current_mode_update";
    /// Session config options (`{configOptions:[…]}`).
    pub const CONFIG_OPTION_UPDATE: &str = "config_option_update";
    /// Session title (`{title?}`).
    pub const SESSION_INFO_UPDATE: &str = "session_info_update";
    /// The user's own prompt echoed back.
    pub const USER_MESSAGE_CHUNK: &str = "user_message_chunk";

    /// Tags of the canonical event lanes (assistant text, thinking, tool items), not of
    /// `lifecycle/update` status lines.
    pub const EVENT_LANES: [&str; 4] = [
        AGENT_MESSAGE_CHUNK,
        AGENT_THOUGHT_CHUNK,
        TOOL_CALL,
        TOOL_CALL_UPDATE,
    ];
    /// The tags shown by default (minimal noise); every other tag is hidden by default,
    /// and [`AGENT_THOUGHT_CHUNK`] follows `/reasoning`.
    pub const SHOWN_BY_DEFAULT: [&str; 3] = [AGENT_MESSAGE_CHUNK, TOOL_CALL, TOOL_CALL_UPDATE];

    /// Every tag the projection names (for listings: `SetSettings` echoes these).
    pub const KNOWN: [&str; 11] = [
        AGENT_MESSAGE_CHUNK,
        AGENT_THOUGHT_CHUNK,
        TOOL_CALL,
        TOOL_CALL_UPDATE,
        PLAN,
        USAGE_UPDATE,
        AVAILABLE_COMMANDS_UPDATE,
        CURRENT_MODE_UPDATE,
        CONFIG_OPTION_UPDATE,
        SESSION_INFO_UPDATE,
        USER_MESSAGE_CHUNK,
    ];
}

/// `tagVisibility`: explicit per-tag overrides (`tag → shown`) over the minimal-noise
/// defaults ([`tags::SHOWN_BY_DEFAULT`] shown, everything else hidden). Serialized as a
/// JSON object of the overrides only (`{"plan":true}`), so an empty map is "all
/// defaults" and settings stored before the knob existed read unchanged.
///
/// [`tags::AGENT_THOUGHT_CHUNK`] has no fixed default: absent, thinking follows
/// `/reasoning`; `false` hides thinking even under `/reasoning on|stream`; `true` shows
/// it (as `on`) when `/reasoning` is `off` (see [`Settings::effective_reasoning`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TagVisibility(pub BTreeMap<String, bool>);

/// A malformed `tag=show|hide` list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tag visibility takes tag=show|hide[,tag=show|hide…] (on/off, true/false), not `{0}`")]
pub struct BadTagVisibility(pub String);

impl TagVisibility {
    /// The default of `tag` (`None` for thought chunks: they follow `/reasoning`).
    pub fn default_of(tag: &str) -> Option<bool> {
        if tag == tags::AGENT_THOUGHT_CHUNK {
            None
        } else {
            Some(tags::SHOWN_BY_DEFAULT.contains(&tag))
        }
    }

    /// The explicit override of `tag`, if any.
    pub fn get(&self, tag: &str) -> Option<bool> {
        self.0.get(tag).copied()
    }

    /// Whether `tag` renders (thought chunks: see [`Settings::effective_reasoning`]).
    pub fn shown(&self, tag: &str) -> bool {
        self.get(tag)
            .or_else(|| TagVisibility::default_of(tag))
            .unwrap_or(false)
    }

    /// `self` with `other`'s overrides laid over it (per tag).
    pub fn merged(&self, other: &TagVisibility) -> TagVisibility {
        let mut m = self.0.clone();
        m.extend(other.0.iter().map(|(k, v)| (k.clone(), *v)));
        TagVisibility(m)
    }

    /// Parses `plan=show,usage_update=on,agent_message_chunk=hide` (also `true/false`,
    /// `1/0`); blank entries are skipped.
    pub fn parse_list(list: &str) -> Result<TagVisibility, BadTagVisibility> {
        let mut m = BTreeMap::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (tag, v) = entry
                .split_once('=')
                .ok_or_else(|| BadTagVisibility(entry.to_owned()))?;
            let shown = parse_shown(v).ok_or_else(|| BadTagVisibility(entry.to_owned()))?;
            let tag = tag.trim();
            if tag.is_empty() {
                return Err(BadTagVisibility(entry.to_owned()));
            }
            m.insert(tag.to_owned(), shown);
        }
        Ok(TagVisibility(m))
    }
}

/// `show|on|true|1` → shown, `hide|off|false|0` → hidden.
pub fn parse_shown(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "show" | "shown" | "on" | "true" | "1" | "yes" => Some(true),
        "hide" | "hidden" | "off" | "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

impl FromStr for TagVisibility {
    type Err = BadTagVisibility;
    fn from_str(s: &str) -> Result<TagVisibility, BadTagVisibility> {
        TagVisibility::parse_list(s)
    }
}

impl std::fmt::Display for TagVisibility {
    /// The list form [`TagVisibility::parse_list`] reads (`plan=show,usage_update=hide`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{k}={}", if *v { "show" } else { "hide" }))
            .collect();
        f.write_str(&parts.join(","))
    }
}

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

/// Delivery mode (`deliveryMode`, ACP-style knob).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Drafts stream live, then the final answer.
    #[default]
    Live,
    /// Only the final answer (and errors) are delivered, all at the terminal event.
    FinalOnly,
}

impl FromStr for Delivery {
    type Err = String;
    fn from_str(s: &str) -> Result<Delivery, String> {
        match s {
            "live" => Ok(Delivery::Live),
            "final_only" | "final-only" => Ok(Delivery::FinalOnly),
            _ => Err(format!("delivery mode takes live or final_only, not `{s}`")),
        }
    }
}

impl std::fmt::Display for Delivery {
    /// `live` or `final_only`, as [`FromStr`] reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Delivery::Live => "live",
            Delivery::FinalOnly => "final_only",
        })
    }
}

/// Channel capability tier (docs/architecture.md §6; RFC 0015 names, spec v0.4 letters accepted).
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
    /// Hard size of one draft message (Discord 2000, Telegram 4096): `maxTurnChars`,
    /// the draft's budget for one turn (a channel never sets it above its sink's limit).
    pub draft_max_chars: usize,
    /// Budget of one thinking segment before head+tail elision.
    pub thinking_chars: usize,
    /// Budget of one tool row's detail (`maxToolSummaryChars`).
    pub item_detail_chars: usize,
    /// Cap of one status line (`maxStatusChars`): plan, usage, mode, … when enabled by
    /// [`TagVisibility`].
    #[serde(default = "default_status_chars")]
    pub status_chars: usize,
}

/// Default `maxStatusChars`.
pub const DEFAULT_STATUS_CHARS: usize = 120;

fn default_status_chars() -> usize {
    DEFAULT_STATUS_CHARS
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            draft_max_chars: 2000,
            thinking_chars: 600,
            item_detail_chars: 120,
            status_chars: DEFAULT_STATUS_CHARS,
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
    /// `repeatSuppression`: a commentary line identical to the previous one is not shown
    /// twice, and a repeated status line, usage tuple or tool snapshot (an update that
    /// changes nothing the draft shows) makes no draft edit. Off: each such update
    /// re-sends the draft.
    pub suppress_repeats: bool,
    /// Render variant tags (`raw`/`summary`) on thinking blocks.
    pub show_variant_tags: bool,
    /// `tagVisibility`: per update tag, shown or hidden (overrides over the defaults).
    #[serde(default)]
    pub tag_visibility: TagVisibility,
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
            tag_visibility: TagVisibility::default(),
        }
    }
}

impl Settings {
    /// `/reasoning` as [`TagVisibility`] leaves it: an explicit `agent_thought_chunk`
    /// `false` hides thinking (`off`), an explicit `true` shows it (`on`) when
    /// `/reasoning` is `off`; otherwise `/reasoning` itself.
    pub fn effective_reasoning(&self) -> Reasoning {
        match (
            self.tag_visibility.get(tags::AGENT_THOUGHT_CHUNK),
            self.reasoning,
        ) {
            (Some(false), _) => Reasoning::Off,
            (Some(true), Reasoning::Off) => Reasoning::On,
            (_, r) => r,
        }
    }

    /// Whether update tag `tag` renders ([`TagVisibility::shown`]; thought chunks by
    /// [`Settings::effective_reasoning`]).
    pub fn shows(&self, tag: &str) -> bool {
        if tag == tags::AGENT_THOUGHT_CHUNK {
            self.effective_reasoning() != Reasoning::Off
        } else {
            self.tag_visibility.shown(tag)
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

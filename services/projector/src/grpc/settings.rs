//! `SetSettings` ↔ per-chat overrides: the request's fields as a [`SettingsOverride`]
//! (empty or unset = unchanged, as before the knobs), the reply as the chat's resulting
//! [`Settings`].

use crate::kv::SettingsOverride;
use streamgate_projection::{parse_shown, tags, Settings, TagVisibility};
use streamgate_proto::v1;
use tonic::Status;

/// The change a request asks for, and the tags it resets to the channel default.
pub(super) fn change_of(
    req: &v1::SetSettingsRequest,
) -> Result<(SettingsOverride, Vec<String>), Status> {
    fn parsed<T: std::str::FromStr<Err = String>>(v: &str) -> Result<Option<T>, Status> {
        match v {
            "" => Ok(None),
            v => v.parse().map(Some).map_err(Status::invalid_argument),
        }
    }
    fn chars(v: Option<u32>, name: &str, zero_ok: bool) -> Result<Option<usize>, Status> {
        match v {
            Some(0) if !zero_ok => Err(Status::invalid_argument(format!("{name} must be > 0"))),
            v => Ok(v.map(|n| usize::try_from(n).unwrap_or(usize::MAX))),
        }
    }
    let mut shown = TagVisibility::default();
    let mut reset = Vec::new();
    for (tag, v) in &req.tag_visibility {
        if tag.trim().is_empty() {
            return Err(Status::invalid_argument("tag_visibility: empty tag"));
        }
        match (v.as_str(), parse_shown(v)) {
            ("default", _) => reset.push(tag.clone()),
            (_, Some(b)) => {
                shown.0.insert(tag.clone(), b);
            }
            (_, None) => {
                return Err(Status::invalid_argument(format!(
                    "tag_visibility {tag}: show, hide or default, not `{v}`"
                )))
            }
        }
    }
    let o = SettingsOverride {
        reasoning: parsed(&req.reasoning)?,
        verbose: parsed(&req.verbose)?,
        delivery: parsed(&req.delivery_mode)?,
        suppress_repeats: req.repeat_suppression,
        tag_visibility: shown,
        max_turn_chars: chars(req.max_turn_chars, "max_turn_chars", false)?,
        max_tool_summary_chars: chars(req.max_tool_summary_chars, "max_tool_summary_chars", true)?,
        max_status_chars: chars(req.max_status_chars, "max_status_chars", false)?,
    };
    Ok((o, reset))
}

/// The reply: the chat's resulting settings, every known tag's visibility spelled out.
pub(super) fn reply_of(s: &Settings, rerendered: u32) -> v1::SetSettingsReply {
    let word = |b: bool| if b { "show" } else { "hide" }.to_owned();
    let mut names: Vec<String> = tags::KNOWN.iter().map(|t| (*t).to_owned()).collect();
    names.extend(s.tag_visibility.0.keys().cloned());
    let mut vis: std::collections::HashMap<String, String> = names
        .into_iter()
        .map(|t| {
            let w = word(s.tag_visibility.shown(&t));
            (t, w)
        })
        .collect();
    if s.tag_visibility.get(tags::AGENT_THOUGHT_CHUNK).is_none() {
        vis.insert(tags::AGENT_THOUGHT_CHUNK.to_owned(), "reasoning".to_owned());
    }
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    v1::SetSettingsReply {
        reasoning: s.reasoning.to_string(),
        verbose: s.verbose.to_string(),
        rerendered,
        delivery_mode: s.delivery.to_string(),
        repeat_suppression: s.suppress_repeats,
        tag_visibility: vis,
        max_turn_chars: n(s.budgets.draft_max_chars),
        max_tool_summary_chars: n(s.budgets.item_detail_chars),
        max_status_chars: n(s.budgets.status_chars),
    }
}

//! OpenAI codex agent runtime wire families.
//!
//! - [`app_server`]: `codex app-server` JSON-RPC notifications (`codex-appserver`).
//! - [`exec`]: `codex exec --json` JSONL thread events (`codex-exec`).
//!
//! Both share the Responses item shapes in [`super::response_items`].

pub mod app_server;
pub mod exec;

pub use app_server::CodexAppServerAdapter;
pub use exec::CodexExecAdapter;

use super::error_objects::error_message;

use crate::emitter::Emitter;
use serde::Deserialize;
use serde_json::value::RawValue;
use streamgate_grammar::{Assistant, AssistantPhase, SegmentStatus};

/// The `item` of an item event, parsed; a missing or unreadable one makes the whole
/// frame a `malformed_frame` (and `None`).
fn parse_item<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
    data: &str,
    out: &mut Emitter,
) -> Option<T> {
    let item = raw.and_then(|r| serde_json::from_str::<T>(r.get()).ok());
    if item.is_none() {
        out.malformed_frame(data);
    }
    item
}

/// A settled agent message that is commentary: one `completed` snapshot.
fn commentary_snapshot(id: String, text: String) -> Assistant {
    Assistant {
        id: Some(id),
        phase: Some(AssistantPhase::Commentary),
        text: Some(text),
        status: Some(SegmentStatus::Completed),
        ..Assistant::default()
    }
}

/// Test helper: normalizes `lines` (one JSONL line each) as `family`, checks the
/// events against the grammar and returns them as JSON values.
#[cfg(test)]
fn run_lines(family: crate::adapter::Family, lines: &[&str]) -> Vec<serde_json::Value> {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let n = crate::normalizer::normalize_bytes(family.into(), text.as_bytes(), 0);
    assert_eq!(streamgate_grammar::check(&n.events, &[], None), vec![]);
    n.events
        .iter()
        .map(|e| serde_json::from_str(&e.to_json()).unwrap())
        .collect()
}

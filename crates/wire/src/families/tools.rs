//! Tool-row helpers shared by the agent-runtime families (codex, OpenClaw): reading an
//! optional raw JSON field and closing the tool rows a run left open.

use crate::emitter::Emitter;
use serde_json::value::RawValue;
use streamgate_grammar::{Item, ItemPhase, Json};

/// The raw field as JSON when it is there and not `null`.
pub(crate) fn present(raw: Option<&RawValue>) -> Option<Json> {
    raw.filter(|r| r.get() != "null").map(Json::from_raw)
}

/// Ends every still-open tool row (id, name) with `status`, in the order they opened,
/// and empties the list (a settled or dead run leaves no tool open).
pub(crate) fn end_open_tools(tools: &mut Vec<(String, String)>, status: &str, out: &mut Emitter) {
    for (id, name) in std::mem::take(tools) {
        out.emit(Item {
            phase: ItemPhase::End,
            id: Some(id),
            kind: "tool".into(),
            name: Some(name),
            status: Some(status.into()),
            ..Item::default()
        });
    }
}

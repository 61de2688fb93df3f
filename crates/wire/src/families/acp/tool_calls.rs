//! ACP tool calls: one `item` per `toolCallId`, merged across `tool_call` and
//! `tool_call_update` (an update carries only the fields that changed).
//!
//! - `kind` is ACP's tool kind (`read`, `edit`, `delete`, `move`, `search`, `execute`,
//!   `think`, `fetch`, `switch_mode`); absent or `other` becomes `tool`.
//! - `name` and `title` are ACP's `title`.
//! - `status` is ACP's, verbatim (`pending`, `in_progress`, `completed`, `failed`; the
//!   grammar's status is an open set and ACP already uses its names).
//! - `input` ← `rawInput`, `output` ← `content` (content blocks, diffs, terminals),
//!   `result` ← `rawOutput`, `meta` ← `{"locations": …}`.
//!
//! A v2 `tool_call_content_chunk` appends one content entry to the call's `content`:
//! a text block goes out as `output_delta` (a tool row shows output as it streams), any
//! other entry (a diff, a terminal, an image) as the call's whole `output` so far; the
//! call's `item/end` carries every entry, the replaced `content` first.
//!
//! The first sighting of an id is `item/start` (a `tool_call_update` for an unknown id
//! starts the item too, as ACP v2 only has upserts); later sightings are `item/update`
//! with the item's identity and the fields that changed; `completed`/`failed` is
//! `item/end` carrying the whole merged item. A call that arrives already settled gets
//! its start and its end at once.

use super::update::Update;
use crate::emitter::Emitter;
use crate::families::tools::present;
use serde::Serialize;
use serde_json::value::RawValue;
use streamgate_grammar::{Item, ItemPhase, Json};

/// The merged state of one tool call.
#[derive(Debug)]
pub(super) struct ToolCall {
    id: String,
    kind: String,
    title: Option<String>,
    status: String,
    input: Option<Json>,
    output: Option<Json>,
    /// Content entries appended by `tool_call_content_chunk` after `output` was set.
    appended: Vec<Json>,
    result: Option<Json>,
    meta: Option<Json>,
    ended: bool,
}

/// The fields one update touched.
#[derive(Default)]
struct Changes {
    input: Option<Json>,
    output: Option<Json>,
    result: Option<Json>,
    meta: Option<Json>,
}

fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed")
}

fn grammar_kind(kind: Option<&str>) -> Option<String> {
    kind.map(|k| match k {
        "" | "other" => "tool".to_owned(),
        k => k.to_owned(),
    })
}

fn locations_meta(locations: Option<&RawValue>) -> Option<Json> {
    #[derive(Serialize)]
    struct Meta<'a> {
        locations: &'a RawValue,
    }
    let locations = locations.filter(|l| l.get() != "null")?;
    Some(Json::from_value(&Meta { locations }))
}

impl ToolCall {
    fn new(id: String) -> ToolCall {
        ToolCall {
            id,
            kind: "tool".to_owned(),
            title: None,
            // ACP's default status.
            status: "pending".to_owned(),
            input: None,
            output: None,
            appended: Vec::new(),
            result: None,
            meta: None,
            ended: false,
        }
    }

    /// Applies the fields the update carries; returns what changed.
    fn merge(&mut self, u: &Update<'_>) -> Changes {
        if let Some(k) = grammar_kind(u.kind.as_deref()) {
            self.kind = k;
        }
        if let Some(t) = u.title.as_deref() {
            self.title = Some(t.to_owned());
        }
        if let Some(s) = u.status.as_deref() {
            self.status = s.to_owned();
        }
        let changes = Changes {
            input: present(u.raw_input),
            output: present(u.content),
            result: present(u.raw_output),
            meta: locations_meta(u.locations),
        };
        if changes.output.is_some() {
            // A replaced `content` drops what chunks appended before it.
            self.appended.clear();
        }
        for (mine, new) in [
            (&mut self.input, &changes.input),
            (&mut self.output, &changes.output),
            (&mut self.result, &changes.result),
            (&mut self.meta, &changes.meta),
        ] {
            if new.is_some() {
                mine.clone_from(new);
            }
        }
        changes
    }

    /// The item's identity (id, kind, name, title, status) in `phase`.
    fn identity(&self, phase: ItemPhase) -> Item {
        Item {
            phase,
            id: Some(self.id.clone()),
            kind: self.kind.clone(),
            name: self.title.clone(),
            title: self.title.clone(),
            status: Some(self.status.clone()),
            ..Item::default()
        }
    }

    /// `content` with the appended chunks after it.
    fn merged_output(&self) -> Option<Json> {
        if self.appended.is_empty() {
            return self.output.clone();
        }
        let mut entries = match self.output.as_ref().map(Json::to_value) {
            Some(serde_json::Value::Array(items)) => items,
            Some(other) => vec![other],
            None => Vec::new(),
        };
        entries.extend(self.appended.iter().map(Json::to_value));
        Some(Json::from_value(&entries))
    }

    /// The whole merged item in `phase`.
    fn whole(&self, phase: ItemPhase) -> Item {
        Item {
            input: self.input.clone(),
            output: self.merged_output(),
            result: self.result.clone(),
            meta: self.meta.clone(),
            ..self.identity(phase)
        }
    }
}

/// The tool calls of one turn.
#[derive(Debug, Default)]
pub(super) struct ToolCalls {
    calls: Vec<ToolCall>,
}

impl ToolCalls {
    /// A `tool_call` or `tool_call_update`: merges it into its item and emits the
    /// item event(s) it implies. `false` when the update names no `toolCallId`.
    pub(super) fn apply(&mut self, u: &Update<'_>, out: &mut Emitter) -> bool {
        let Some(id) = u.tool_call_id.as_deref() else {
            return false;
        };
        let at = match self.calls.iter().position(|c| c.id == id) {
            Some(at) => at,
            None => {
                let mut call = ToolCall::new(id.to_owned());
                call.merge(u);
                out.emit(call.whole(ItemPhase::Start));
                end_if_settled(&mut call, out);
                self.calls.push(call);
                return true;
            }
        };
        let call = &mut self.calls[at];
        let changes = call.merge(u);
        if !call.ended && is_terminal(&call.status) {
            end_if_settled(call, out);
            return true;
        }
        out.emit(Item {
            input: changes.input,
            output: changes.output,
            result: changes.result,
            meta: changes.meta,
            ..call.identity(ItemPhase::Update)
        });
        true
    }

    /// A v2 `tool_call_content_chunk`: appends its entry to the call (starting the call
    /// when the id is new). `false` when it names no `toolCallId` or carries no content.
    pub(super) fn append_content(&mut self, u: &Update<'_>, out: &mut Emitter) -> bool {
        #[derive(serde::Deserialize)]
        struct Entry<'a> {
            #[serde(rename = "type", borrow)]
            ty: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow)]
            content: Option<super::update::Block<'a>>,
        }
        let (Some(id), Some(content)) = (u.tool_call_id.as_deref(), present(u.content)) else {
            return false;
        };
        let at = match self.calls.iter().position(|c| c.id == id) {
            Some(at) => at,
            None => {
                let call = ToolCall::new(id.to_owned());
                out.emit(call.whole(ItemPhase::Start));
                self.calls.push(call);
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[at];
        let text = serde_json::from_str::<Entry<'_>>(content.get())
            .ok()
            .filter(|e| e.ty.as_deref() == Some("content"))
            .and_then(|e| e.content)
            .filter(|b| matches!(b.ty.as_deref(), Some("text") | None))
            .and_then(|b| b.text.map(std::borrow::Cow::into_owned));
        call.appended.push(content);
        let update = match text {
            Some(text) => Item {
                output_delta: Some(text),
                ..call.identity(ItemPhase::Update)
            },
            None => Item {
                output: call.merged_output(),
                ..call.identity(ItemPhase::Update)
            },
        };
        out.emit(update);
        true
    }

    /// Ends every call still open with `status` (the turn settled or died first).
    pub(super) fn end_open(&mut self, status: &str, out: &mut Emitter) {
        for call in self.calls.iter_mut().filter(|c| !c.ended) {
            call.status = status.to_owned();
            call.ended = true;
            out.emit(call.whole(ItemPhase::End));
        }
    }
}

fn end_if_settled(call: &mut ToolCall, out: &mut Emitter) {
    if !call.ended && is_terminal(&call.status) {
        call.ended = true;
        out.emit(call.whole(ItemPhase::End));
    }
}

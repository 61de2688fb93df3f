//! Tool calls that arrive whole (id, name and arguments in one frame), as in Gemini
//! `functionCall` parts and ollama-native `tool_calls`: `item/start` carries the input at
//! once; `item/end` repeats it as `arguments` when the turn settles. A call whose
//! arguments stream in parts (Vertex) starts without input and gets it by `item/update`.

use crate::emitter::Emitter;
use crate::families::finality::Path;
use crate::families::segments::TurnSegments;
use streamgate_grammar::{Item, ItemPhase, Json};

struct Call {
    id: Option<String>,
    index: u64,
    name: Option<String>,
    args: Option<Json>,
}

/// The calls of a turn that started and have not ended yet.
#[derive(Default)]
pub struct WholeCalls {
    open: Vec<Call>,
}

impl std::fmt::Debug for WholeCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WholeCalls({} open)", self.open.len())
    }
}

impl WholeCalls {
    /// Calls started so far in this turn (the next call's default index).
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when no call is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Emits `item/start` with the whole input and remembers the call.
    pub fn start(
        &mut self,
        out: &mut Emitter,
        id: Option<String>,
        index: u64,
        name: Option<String>,
        args: Option<Json>,
    ) {
        out.emit(Item {
            phase: ItemPhase::Start,
            id: id.clone(),
            index: Some(index),
            kind: "tool".to_owned(),
            name: name.clone(),
            status: Some("in_progress".to_owned()),
            input: args.clone(),
            ..Item::default()
        });
        self.open.push(Call {
            id,
            index,
            name,
            args,
        });
    }

    /// The name of the call started last.
    pub fn last_name(&self) -> Option<&str> {
        self.open.last().and_then(|c| c.name.as_deref())
    }

    /// More of the last call arrived (its arguments streamed in parts): emits
    /// `item/update` with what is new — a late name, the arguments so far — and keeps it
    /// for `item/end`.
    pub fn update_last(&mut self, out: &mut Emitter, name: Option<String>, input: Option<Json>) {
        let Some(call) = self.open.last_mut() else {
            return;
        };
        if name.is_some() {
            call.name.clone_from(&name);
        }
        if input.is_some() {
            call.args.clone_from(&input);
        }
        out.emit(Item {
            phase: ItemPhase::Update,
            id: call.id.clone(),
            index: Some(call.index),
            kind: "tool".to_owned(),
            name: call.name.clone(),
            status: Some("in_progress".to_owned()),
            input,
            ..Item::default()
        });
    }

    /// Emits `item/end` with `status` for every open call, in start order.
    pub fn end_all(&mut self, out: &mut Emitter, status: &str) {
        for call in self.open.drain(..) {
            out.emit(Item {
                phase: ItemPhase::End,
                id: call.id,
                index: Some(call.index),
                kind: "tool".to_owned(),
                name: call.name,
                status: Some(status.to_owned()),
                arguments: call.args,
                ..Item::default()
            });
        }
    }

    /// Settles the turn's calls and text on `path` (spec §3.5): the calls end
    /// `completed` on the Yield path (the client runs them) and `failed` on every other,
    /// then the last text segment is re-tagged as the final answer where the path keeps
    /// one. Thinking must already be closed; the terminal lifecycle event is the
    /// caller's.
    pub fn settle(&mut self, segments: &mut TurnSegments, path: &Path, out: &mut Emitter) {
        let status = if *path == Path::Yield {
            "completed"
        } else {
            "failed"
        };
        self.end_all(out, status);
        if let Some(truncated) = path.final_answer() {
            segments.finalize(out, truncated);
        }
    }
}

//! OpenAI Responses API SSE (spec §6 F3 column, evidence `openai-families.md` §B).
//!
//! Segment identity is composite (§3.1, §7.3): `item_id:content_index` for output text,
//! refusal and raw reasoning parts, `item_id:summary_index` for reasoning summaries.
//! Text streams as commentary; finality is positional and resolved at the terminal
//! frame (§3.5): `response.completed` re-tags the last segment of the last assistant
//! `message` item as the final answer, unless the turn yields: its last output item is a
//! call the client executes (`function_call`, `custom_tool_call` and the calls of
//! [`calls`]) or an MCP approval request the user must answer.
//! `response.incomplete` branches on `incomplete_details.reason` (§3.4).
//!
//! Thinking-token counts only arrive with the terminal usage
//! (`usage.output_tokens_details.reasoning_tokens`), so a thinking `end` marker goes out
//! without `tokens` when its segment ends, and at the terminal frame every such segment
//! gets one tokens-only update (§3.2); segments that end within the terminal frame
//! itself carry the count on their marker.
//!
//! The pieces the codex envelopes share with F3 (response-item parsing, argument JSON,
//! unsupported-frame reporting, final-answer events) live in
//! [`crate::families::response_items`]; the terminal dispatch in
//! [`crate::families::finality`].

mod calls;
mod delta_frame;

use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::final_text::FinalText;
use crate::families::finality::{stream_closed, Path};
use crate::families::response_items::{
    args_json, commentary_delta, final_answer, parse_parts, unsupported, RawItem,
};
use crate::families::same_frame::SameFrame;
use crate::framing::Frame;
use calls::{classify_call, parse_item, tool_shape, CallFields, ToolShape, AWAITING_APPROVAL};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::json::deserialize_present as present;
use streamgate_grammar::{
    Assistant, AssistantPhase, Diagnostic, Item, ItemPhase, Json, Lifecycle, LifecyclePhase,
    SegmentPhase, SegmentStatus, StopReason, Thinking, ThinkingVariant,
};

/// Transcript kind for F3 `reasoning.encrypted_content` (opaque replay state, §2).
pub const ENCRYPTED_REASONING_KIND: &str = "openai_reasoning_encrypted";

// ---------------------------------------------------------------------------------------
// wire shapes (parsed once per frame; strings borrow unless they carry escapes)
// ---------------------------------------------------------------------------------------

/// Every field any catalogued F3 event carries that the adapter reads (the delta frames
/// are read by [`delta_frame`] first).
#[derive(Debug, Default, Deserialize)]
struct Ev<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default)]
    content_index: Option<u64>,
    #[serde(default)]
    summary_index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    part: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    annotation: Option<&'a RawValue>,
    #[serde(borrow, default)]
    code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

/// Just the event type, for frames whose other fields did not fit [`Ev`].
#[derive(Deserialize)]
struct TypeOnly<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
}

/// The `response` object of lifecycle frames (only what the adapter reads).
#[derive(Deserialize)]
struct ResponseHead<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    /// Kept verbatim, `null` included (the start event carries `"usage":null`).
    #[serde(default, deserialize_with = "present")]
    usage: Option<Json>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    incomplete_details: Option<IncompleteDetails<'a>>,
    #[serde(borrow, default)]
    output: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct IncompleteDetails<'a> {
    #[serde(borrow, default)]
    reason: Option<Cow<'a, str>>,
}

/// `incomplete_details.reason` values that mean a token/output limit (Truncate path).
fn is_token_limit(reason: &str) -> bool {
    matches!(
        reason,
        "max_output_tokens"
            | "max_tokens"
            | "max_completion_tokens"
            | "max_prompt_tokens"
            | "output_limit"
            | "token_limit"
            | "length"
    )
}

/// `incomplete_details.reason` values that mean a safety stop (Reject path).
fn is_content_filter(reason: &str) -> bool {
    matches!(
        reason,
        "content_filter" | "safety" | "content_policy" | "refusal"
    )
}

/// The §3.5 path of `response.incomplete` by its `incomplete_details.reason`, with the
/// provider's word kept as a diagnostic.
fn incomplete_path(reason: Option<String>) -> (Path, Option<Diagnostic>) {
    match reason {
        Some(r) if is_token_limit(&r) => (
            Path::Truncate,
            Some(Diagnostic::new("incomplete_reason", Some(Json::string(&r)))),
        ),
        Some(r) if is_content_filter(&r) => (
            Path::Reject(StopReason::ContentFilter),
            Some(Diagnostic::new("incomplete_reason", Some(Json::string(&r)))),
        ),
        other => (
            Path::Incomplete(Some(StopReason::Other("incomplete".into()))),
            Some(Diagnostic::new(
                "unknown_incomplete_reason",
                Some(
                    other
                        .as_deref()
                        .map(Json::string)
                        .unwrap_or_else(Json::null),
                ),
            )),
        ),
    }
}

/// `usage.output_tokens_details.reasoning_tokens`, when present.
fn reasoning_tokens(usage: &Json) -> Option<u64> {
    #[derive(Deserialize)]
    struct Usage {
        #[serde(default)]
        output_tokens_details: Option<Details>,
    }
    #[derive(Deserialize)]
    struct Details {
        #[serde(default)]
        reasoning_tokens: Option<u64>,
    }
    serde_json::from_str::<Option<Usage>>(usage.get())
        .ok()
        .flatten()?
        .output_tokens_details?
        .reasoning_tokens
}

// ---------------------------------------------------------------------------------------
// adapter state
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ItemKind {
    /// `message`; `true` when it is the assistant's (not an input echo).
    Message(bool),
    Reasoning,
    FunctionCall,
    /// Built-in tool call with its item `kind` (`search`, `command`).
    Builtin(&'static str),
    /// A call the client executes (`computer_call`, `local_shell_call`,
    /// `apply_patch_call`, a client-executed `tool_search_call`): a tool item.
    ClientCall,
    /// A server-executed `tool_search_call`: a tool item that stays open for its
    /// `tool_search_output`.
    ServerSearch,
    /// `tool_search_output`: the result of its search call.
    SearchOutput,
    /// `mcp_approval_request`: a tool item waiting for the user's approval.
    Approval,
}

impl ItemKind {
    /// A response that ends on an item of this kind waits for the client (a call to run,
    /// an approval to give): the turn yields instead of finalizing.
    fn awaits_client(self) -> bool {
        matches!(
            self,
            ItemKind::FunctionCall | ItemKind::ClientCall | ItemKind::Approval
        )
    }

    /// Items of this kind open a tool item.
    fn is_call(self) -> bool {
        matches!(
            self,
            ItemKind::FunctionCall
                | ItemKind::Builtin(_)
                | ItemKind::ClientCall
                | ItemKind::ServerSearch
                | ItemKind::Approval
        )
    }
}

#[derive(Debug)]
struct OutItem {
    id: String,
    output_index: u64,
    kind: ItemKind,
    done: bool,
    /// Reasoning that produced displayable text (raw or summary).
    displayable: bool,
    /// Encrypted reasoning material was diverted to the transcript.
    encrypted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Text,
    Refusal,
    Raw,
    Summary,
}

#[derive(Debug)]
struct Segment {
    item_id: String,
    index: u64,
    lane: Lane,
    /// Composite id `item_id:index`.
    id: String,
    /// Accumulated text (answer lanes only: reasoning text is not retained), bounded.
    text: FinalText,
    /// A delta or snapshot reached the bus.
    emitted: bool,
    /// Thinking `end` marker emitted.
    ended: bool,
}

#[derive(Debug)]
struct Tool {
    item_id: String,
    call_id: String,
    name: Option<String>,
    title: Option<String>,
    index: Option<u64>,
    kind: &'static str,
    /// The output item it came from.
    source: ItemKind,
    args: String,
    /// The call's result, when the response carries it (`tool_search_output`).
    result: Option<Json>,
    ended: bool,
}

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct F3Adapter {
    started: bool,
    terminated: bool,
    usage: Option<Json>,
    items: Vec<OutItem>,
    segments: Vec<Segment>,
    tools: Vec<Tool>,
    /// Thinking segments (variant, id) whose `end` marker went out before usage: each gets
    /// a tokens-only update once `reasoning_tokens` arrives.
    waiting_tokens: Vec<(ThinkingVariant, String)>,
    /// The first item id seen at each `output_index` ([`F3Adapter::canonical_id`]).
    ids_by_output: std::collections::BTreeMap<u64, String>,
    /// The last delta frames read, for the next ones like them ([`delta_frame::keep`]).
    same: SameFrame<delta_frame::Shape>,
}

impl F3Adapter {
    /// The id an item goes by: the first id seen at its `output_index`. An item keeps its
    /// output index for the whole response, but some gateways (GitHub Copilot's) send a
    /// new `item_id` on every event; without this every delta became a segment of its
    /// own and the final answer matched none of them (docs/families.md).
    fn canonical_id(&mut self, output_index: u64, id: &str) -> String {
        self.canonical_id_if_other(output_index, id)
            .unwrap_or_else(|| id.to_owned())
    }

    /// [`F3Adapter::canonical_id`] when it is not `id` itself; `None` (no copy) when it is,
    /// as it nearly always is: the per-delta path.
    fn canonical_id_if_other(&mut self, output_index: u64, id: &str) -> Option<String> {
        let first = self
            .ids_by_output
            .entry(output_index)
            .or_insert_with(|| id.to_owned());
        (first != id).then(|| first.clone())
    }
}

impl Adapter for F3Adapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        let data = frame.data.trim();
        if data == "[DONE]" {
            out.consumed();
            return;
        }
        if self.terminated {
            // After the terminal frame (e.g. `response.failed` after `error`): the run is
            // settled; the frame only confirms it.
            out.consumed();
            return;
        }
        // Read in place and handed on by reference: `Ev` is some 350 bytes, and moving it
        // through a `Result` and into `dispatch` was a tenth of the family's time (`perf`).
        let mut ev = Ev::default();
        if !delta_frame::read_delta(&mut self.same, data, &mut ev) {
            ev = match serde_json::from_str(data) {
                Ok(ev) => ev,
                Err(_) => {
                    unreadable(frame.event, data, out);
                    return;
                }
            };
        }
        if let (Some(oi), Some(id)) = (ev.output_index, ev.item_id.as_deref()) {
            if let Some(canonical) = self.canonical_id_if_other(oi, id) {
                ev.item_id = Some(Cow::Owned(canonical));
            }
        }
        // Taken out of the event so it can be matched on while the event is handed on.
        let ty = match ev.ty.take() {
            Some(t) => t,
            None => match frame.event {
                Some(e) => Cow::Borrowed(e),
                None => {
                    out.unknown_frame("frame", data);
                    return;
                }
            },
        };
        self.dispatch(&ty, &ev, data, out);
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.terminated {
            return;
        }
        self.terminated = true;
        self.close_thinking(out);
        self.send_tokens(out);
        self.end_tools(out, "failed");
        stream_closed(out);
    }
}

impl F3Adapter {
    fn dispatch(&mut self, ty: &str, ev: &Ev<'_>, data: &str, out: &mut Emitter) {
        match ty {
            "response.created" => self.on_created(ev, out),
            "response.in_progress" => {
                // A heartbeat snapshot: dropped (§6 keepalives row).
                self.start_from(ev, out, false);
                out.consumed();
            }
            "response.queued" => {
                self.start_from(ev, out, false);
                out.diagnostic("response_queued", None);
            }
            "response.output_item.added" => self.on_item_added(ev, data, out),
            "response.output_item.done" => self.on_item_done(ev, data, out),
            "response.content_part.added" | "response.content_part.done" => {
                self.on_content_part(ty, ev, out)
            }
            "response.output_text.delta" => self.on_text_delta(ev, Lane::Text, out),
            "response.refusal.delta" => self.on_text_delta(ev, Lane::Refusal, out),
            "response.output_text.done" => {
                let text = ev.text.as_deref();
                self.on_text_done(ev, Lane::Text, text, out)
            }
            "response.refusal.done" => {
                let text = ev.refusal.as_deref().or(ev.text.as_deref());
                self.on_text_done(ev, Lane::Refusal, text, out)
            }
            "response.reasoning_text.delta" => self.on_thinking_delta(ev, Lane::Raw, out),
            "response.reasoning_summary_text.delta" => {
                self.on_thinking_delta(ev, Lane::Summary, out)
            }
            "response.reasoning_text.done" => self.on_thinking_done(ev, Lane::Raw, out),
            "response.reasoning_summary_text.done" => self.on_thinking_done(ev, Lane::Summary, out),
            "response.reasoning_summary_part.added" => out.consumed(),
            "response.reasoning_summary_part.done" => {
                // Closes the summary segment when `summary_text.done` did not.
                let (item, idx) = (ev.item_id.as_deref().unwrap_or(""), ev.summary_index);
                if let Some(si) = self.find_segment(item, idx.unwrap_or(0), Lane::Summary) {
                    self.end_thinking(si, out);
                }
                out.consumed();
            }
            "response.function_call_arguments.delta" => self.on_args_delta(ev, out),
            "response.function_call_arguments.done" => self.on_args_done(ev, out),
            "response.output_text.annotation.added" => {
                let detail = ev.annotation.map(Json::from_raw);
                out.diagnostic("output_text_annotation", detail);
            }
            "response.completed" => self.on_terminal_response(ev, true, out),
            "response.incomplete" => self.on_terminal_response(ev, false, out),
            "response.failed" => self.on_failed(ev, out),
            "error" => self.on_error(ev, data, out),
            _ => self.on_other(ty, ev, data, out),
        }
    }

    // -- lifecycle ----------------------------------------------------------------------

    fn on_created(&mut self, ev: &Ev<'_>, out: &mut Emitter) {
        if self.started {
            out.consumed();
            return;
        }
        self.start_from(ev, out, true);
        if !self.started {
            // No response object: still the run's start.
            self.started = true;
            out.emit(Lifecycle {
                provider: Some("openai".into()),
                ..Lifecycle::new(LifecyclePhase::Start)
            });
        }
    }

    /// Emits `lifecycle/start` from a frame's response snapshot, once.
    fn start_from(&mut self, ev: &Ev<'_>, out: &mut Emitter, with_usage: bool) {
        if self.started {
            return;
        }
        let Some(head) = ev
            .response
            .and_then(|r| serde_json::from_str::<ResponseHead<'_>>(r.get()).ok())
        else {
            return;
        };
        self.started = true;
        out.emit(Lifecycle {
            provider: Some("openai".into()),
            model: head.model.map(Cow::into_owned),
            id: head.id.map(Cow::into_owned),
            usage: if with_usage { head.usage } else { None },
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    fn on_terminal_response(&mut self, ev: &Ev<'_>, completed: bool, out: &mut Emitter) {
        let head = ev
            .response
            .and_then(|r| serde_json::from_str::<ResponseHead<'_>>(r.get()).ok());
        // Whether the response's last output item waits for the client.
        let mut last_awaits: Option<bool> = None;
        let mut reason: Option<String> = None;
        if let Some(head) = head {
            if let Some(u) = head.usage.filter(|u| !u.is_null()) {
                out.saw_usage();
                self.usage = Some(u);
            }
            reason = head
                .incomplete_details
                .and_then(|d| d.reason)
                .map(Cow::into_owned);
            if let Some(output) = head.output {
                for (i, raw) in output.iter().enumerate() {
                    if let Some(item) = parse_item(raw) {
                        last_awaits = Some(awaits_client(&item, raw));
                        self.settle_snapshot_item(&item, i as u64, raw, out);
                    }
                }
            }
        }
        let (path, diagnostic) = if completed {
            let awaits = last_awaits.or_else(|| {
                self.items
                    .iter()
                    .max_by_key(|i| i.output_index)
                    .map(|i| i.kind.awaits_client())
            });
            if awaits == Some(true) {
                (Path::Yield, None)
            } else {
                (Path::Finalize(StopReason::Completed), None)
            }
        } else {
            incomplete_path(reason)
        };
        self.finish(path, diagnostic, out);
    }

    fn finish(&mut self, path: Path, diagnostic: Option<Diagnostic>, out: &mut Emitter) {
        self.terminated = true;
        self.close_thinking(out);
        self.send_tokens(out);
        let tool_status = match &path {
            Path::Finalize(_) | Path::Yield => "completed",
            Path::Reject(_) | Path::Dead(_) => "failed",
            Path::Truncate | Path::Suspend | Path::Incomplete(_) => "incomplete",
        };
        self.end_tools(out, tool_status);
        if let Some(truncated) = path.final_answer() {
            self.emit_final(out, truncated);
        }
        path.emit(self.usage.clone(), diagnostic, out);
    }

    /// Dead path: closes what is open, then the error event.
    fn die(&mut self, out: &mut Emitter, diagnostic: Diagnostic) {
        self.finish(Path::Dead(StopReason::Error), Some(diagnostic), out);
    }

    fn on_failed(&mut self, ev: &Ev<'_>, out: &mut Emitter) {
        #[derive(Deserialize)]
        struct ErrorHead<'a> {
            #[serde(borrow, default)]
            message: Option<Cow<'a, str>>,
        }
        let head = ev
            .response
            .and_then(|r| serde_json::from_str::<ResponseHead<'_>>(r.get()).ok());
        let error = head.as_ref().and_then(|h| h.error);
        if let Some(u) = head.and_then(|h| h.usage).filter(|u| !u.is_null()) {
            out.saw_usage();
            self.usage = Some(u);
        }
        let message = error
            .and_then(|e| serde_json::from_str::<ErrorHead<'_>>(e.get()).ok())
            .and_then(|e| e.message)
            .map(Cow::into_owned);
        self.die(
            out,
            Diagnostic {
                code: "response_failed".into(),
                message,
                detail: error.map(Json::from_raw),
            },
        );
    }

    fn on_error(&mut self, ev: &Ev<'_>, data: &str, out: &mut Emitter) {
        #[derive(Deserialize)]
        struct ErrorBody<'a> {
            #[serde(borrow, default)]
            code: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            message: Option<Cow<'a, str>>,
        }
        // Nested `{"error":{…}}` (observed) or the flat SDK shape (`code`, `message`).
        let (code, message, detail) = match ev.error.and_then(|e| {
            serde_json::from_str::<ErrorBody<'_>>(e.get())
                .ok()
                .map(|b| (e, b))
        }) {
            Some((raw, body)) => (
                body.code.map(Cow::into_owned),
                body.message.map(Cow::into_owned),
                Json::from_raw(raw),
            ),
            None => (
                ev.code.as_deref().map(str::to_owned),
                ev.message.as_deref().map(str::to_owned),
                Json::parse(data).unwrap_or_else(Json::null),
            ),
        };
        self.die(
            out,
            Diagnostic {
                code: code.unwrap_or_else(|| "provider_error".into()),
                message,
                detail: Some(detail),
            },
        );
    }

    fn on_other(&mut self, ty: &str, ev: &Ev<'_>, data: &str, out: &mut Emitter) {
        const UNSUPPORTED: [&str; 7] = [
            "response.audio.",
            "response.output_audio",
            "response.image_generation_call.",
            "response.mcp_call",
            "response.mcp_list_tools.",
            "response.mcp_approval",
            "response.custom_tool_call_input.",
        ];
        const BUILTIN: [&str; 4] = [
            "response.web_search_call.",
            "response.file_search_call.",
            "response.code_interpreter_call.",
            "response.code_interpreter_call_code.",
        ];
        if UNSUPPORTED.iter().any(|p| ty.starts_with(p)) {
            unsupported(out, ty);
        } else if BUILTIN.iter().any(|p| ty.starts_with(p)) {
            // Status beats (`searching`, `interpreting`, …) only confirm the open item;
            // code deltas are the item's input.
            match (ty.ends_with("code.delta"), ev.delta.as_deref()) {
                (true, Some(d)) if !d.is_empty() => {
                    let item_id = ev.item_id.as_deref().unwrap_or("");
                    if let Some(ti) = self.tools.iter().position(|t| t.item_id == item_id) {
                        let t = &self.tools[ti];
                        out.emit(Item {
                            phase: ItemPhase::Update,
                            id: Some(t.call_id.clone()),
                            index: t.index,
                            kind: t.kind.into(),
                            name: t.name.clone(),
                            status: Some("in_progress".into()),
                            input_delta: Some(d.to_owned()),
                            ..Item::default()
                        });
                    } else {
                        out.consumed();
                    }
                }
                _ => out.consumed(),
            }
        } else {
            out.unknown_frame(ty, data);
        }
    }

    // -- output items -------------------------------------------------------------------

    fn item_index(&self, id: &str) -> Option<usize> {
        self.items.iter().rposition(|i| i.id == id)
    }

    fn ensure_item(&mut self, id: &str, output_index: u64, kind: ItemKind) -> usize {
        match self.item_index(id) {
            Some(i) => i,
            None => {
                self.items.push(OutItem {
                    id: id.to_owned(),
                    output_index,
                    kind,
                    done: false,
                    displayable: false,
                    encrypted: false,
                });
                self.items.len() - 1
            }
        }
    }

    fn on_item_added(&mut self, ev: &Ev<'_>, data: &str, out: &mut Emitter) {
        let Some((raw, item)) = ev.item.and_then(|r| parse_item(r).map(|i| (r, i))) else {
            out.malformed_frame(data);
            return;
        };
        let output_index = ev.output_index.unwrap_or(self.items.len() as u64);
        let fallback = output_index.to_string();
        let id = self.canonical_id(output_index, item.id.as_deref().unwrap_or(&fallback));
        let kind = match classify(&item, raw) {
            Some(k) => k,
            None => {
                self.unhandled_item(&item, data, out);
                return;
            }
        };
        let ii = self.ensure_item(&id, output_index, kind);
        match kind {
            k if k.is_call() => {
                let shape = tool_shape(kind, &item, raw);
                self.start_tool(&item, shape, &id, output_index, kind, out);
            }
            // The loaded tools arrive complete with `output_item.done`.
            ItemKind::SearchOutput => out.consumed(),
            ItemKind::Reasoning => {
                if let Some(enc) = item.encrypted_content.as_deref() {
                    self.record_encrypted(ii, enc, out);
                } else {
                    out.consumed();
                }
            }
            _ => out.consumed(),
        }
    }

    fn unhandled_item(&mut self, item: &RawItem<'_>, data: &str, out: &mut Emitter) {
        let kind = item.kind();
        if is_unsupported_item(kind) {
            unsupported(out, kind);
        } else {
            out.unknown_frame(kind, data);
        }
    }

    fn on_item_done(&mut self, ev: &Ev<'_>, data: &str, out: &mut Emitter) {
        let Some(raw) = ev.item else {
            out.malformed_frame(data);
            return;
        };
        let Some(item) = parse_item(raw) else {
            out.malformed_frame(data);
            return;
        };
        if classify(&item, raw).is_none() {
            self.unhandled_item(&item, data, out);
            return;
        }
        let output_index = ev.output_index.unwrap_or(self.items.len() as u64);
        let before = out.next_seq();
        self.settle_snapshot_item(&item, output_index, raw, out);
        if out.next_seq() == before {
            out.consumed();
        }
    }

    /// Applies a complete item snapshot (`output_item.done` or `response.completed`
    /// output): fills text the deltas missed, closes reasoning and tool items. Emits only
    /// what the deltas did not already put on the bus.
    fn settle_snapshot_item(
        &mut self,
        item: &RawItem<'_>,
        output_index: u64,
        raw: &RawValue,
        out: &mut Emitter,
    ) {
        let Some(kind) = classify(item, raw) else {
            return;
        };
        let fallback = output_index.to_string();
        let id = self.canonical_id(output_index, item.id.as_deref().unwrap_or(&fallback));
        let ii = self.ensure_item(&id, output_index, kind);
        if self.items[ii].done {
            return;
        }
        self.items[ii].done = true;
        match kind {
            ItemKind::Message(_) => self.settle_message(item, &id),
            ItemKind::Reasoning => self.settle_reasoning(item, ii, id, out),
            ItemKind::SearchOutput => self.settle_search_output(item, raw, out),
            _ => {
                let shape = tool_shape(kind, item, raw);
                self.settle_tool(item, shape, &id, output_index, kind, out)
            }
        }
    }

    /// A message snapshot replaces the accumulated text of its answer segments.
    fn settle_message(&mut self, item: &RawItem<'_>, id: &str) {
        for (ci, part) in parse_parts(item.content).iter().enumerate() {
            let lane = match part.ty.as_deref() {
                Some("output_text") => Lane::Text,
                Some("refusal") => Lane::Refusal,
                _ => continue,
            };
            if let Some(body) = part.body().filter(|b| !b.is_empty()) {
                let si = self.ensure_segment(id, ci as u64, lane);
                let seg = &mut self.segments[si];
                if !seg.text.matches(body) {
                    seg.text.set(body);
                }
            }
        }
    }

    fn settle_reasoning(&mut self, item: &RawItem<'_>, ii: usize, id: String, out: &mut Emitter) {
        if let Some(enc) = item.encrypted_content.as_deref() {
            self.record_encrypted(ii, enc, out);
        }
        for (lane, parts) in [
            (Lane::Summary, parse_parts(item.summary)),
            (Lane::Raw, parse_parts(item.content)),
        ] {
            for (pi, part) in parts.iter().enumerate() {
                let Some(body) = part.body().filter(|b| !b.is_empty()) else {
                    continue;
                };
                let si = self.ensure_segment(&id, pi as u64, lane);
                if !self.segments[si].emitted {
                    self.items[ii].displayable = true;
                    self.snapshot_thinking(si, lane, body, out);
                }
                self.end_thinking(si, out);
            }
        }
        self.close_item_thinking(&id, out);
        let it = &self.items[ii];
        if it.encrypted && !it.displayable {
            // Encrypted-only reasoning: a content-free marker (§3.2).
            out.emit(Thinking::marker(
                ThinkingVariant::Redacted,
                SegmentPhase::Start,
                Some(id.clone()),
            ));
            self.end_marker(ThinkingVariant::Redacted, id, out);
        }
    }

    /// Snapshot-only reasoning: emitted once (start marker + text), never dropped.
    fn snapshot_thinking(&mut self, si: usize, lane: Lane, body: &str, out: &mut Emitter) {
        let seg = &mut self.segments[si];
        seg.emitted = true;
        let variant = thinking_variant(lane);
        let sid = seg.id.clone();
        out.emit(Thinking::marker(
            variant,
            SegmentPhase::Start,
            Some(sid.clone()),
        ));
        out.emit(Thinking {
            id: Some(sid),
            variant,
            phase: None,
            delta: None,
            text: Some(body.to_owned()),
            tokens: None,
        });
    }

    fn settle_tool(
        &mut self,
        item: &RawItem<'_>,
        shape: ToolShape,
        id: &str,
        output_index: u64,
        kind: ItemKind,
        out: &mut Emitter,
    ) {
        let input = shape.input.clone();
        let ti = match self.tools.iter().position(|t| t.item_id == id) {
            Some(ti) => ti,
            None => self.start_tool(item, shape, id, output_index, kind, out),
        };
        if let Some(args) = input {
            let t = &mut self.tools[ti];
            if t.args != args {
                t.args = args;
            }
        }
        if kind == ItemKind::ServerSearch {
            // Stays open for its `tool_search_output` (or the terminal frame).
            return;
        }
        let status = match (kind, item.status.as_deref()) {
            (ItemKind::Approval, _) => AWAITING_APPROVAL,
            (_, Some("failed")) => "failed",
            (_, Some("incomplete")) => "incomplete",
            _ => "completed",
        };
        self.end_tool(ti, status, out);
    }

    /// A `tool_search_output` ends its search call (by `call_id`, else the latest open
    /// server-executed search) with the loaded tools as the result; with no open search
    /// call it is an `orphan_tool_result`.
    fn settle_search_output(&mut self, item: &RawItem<'_>, raw: &RawValue, out: &mut Emitter) {
        let call_id = item.call_id.as_deref();
        let open = |t: &Tool| !t.ended && t.source == ItemKind::ServerSearch;
        let ti = self
            .tools
            .iter()
            .rposition(|t| open(t) && call_id.is_some_and(|c| t.call_id == c))
            .or_else(|| self.tools.iter().rposition(open));
        let Some(ti) = ti else {
            let detail = serde_json::json!({ "type": item.kind(), "call_id": call_id });
            out.diagnostic("orphan_tool_result", Some(Json::from_value(&detail)));
            return;
        };
        self.tools[ti].result = CallFields::parse(raw).tools.map(Json::from_raw);
        let status = match item.status.as_deref() {
            Some("failed") => "failed",
            Some("incomplete") => "incomplete",
            _ => "completed",
        };
        self.end_tool(ti, status, out);
    }

    fn record_encrypted(&mut self, ii: usize, material: &str, out: &mut Emitter) {
        let it = &mut self.items[ii];
        if it.encrypted {
            // The same blob again (added, then done, then the completed snapshot).
            out.consumed();
            return;
        }
        it.encrypted = true;
        out.transcript(ENCRYPTED_REASONING_KIND, Some(&it.id), material);
    }

    // -- tools --------------------------------------------------------------------------

    fn start_tool(
        &mut self,
        item: &RawItem<'_>,
        shape: ToolShape,
        item_id: &str,
        output_index: u64,
        kind: ItemKind,
        out: &mut Emitter,
    ) -> usize {
        if let Some(ti) = self.tools.iter().position(|t| t.item_id == item_id) {
            out.consumed();
            return ti;
        }
        let tool = Tool {
            item_id: item_id.to_owned(),
            call_id: item.call_id.as_deref().unwrap_or(item_id).to_owned(),
            name: shape.name,
            title: shape.title,
            index: Some(output_index),
            kind: shape.kind,
            source: kind,
            args: shape.input.unwrap_or_default(),
            result: None,
            ended: false,
        };
        out.emit(Item {
            phase: ItemPhase::Start,
            id: Some(tool.call_id.clone()),
            index: tool.index,
            kind: tool.kind.into(),
            name: tool.name.clone(),
            title: tool.title.clone(),
            status: Some("in_progress".into()),
            input: (!tool.args.is_empty()).then(|| args_json(&tool.args)),
            ..Item::default()
        });
        self.tools.push(tool);
        self.tools.len() - 1
    }

    /// The tool for an argument frame; a call whose `output_item.added` was missed is
    /// opened here (its id is the only one known).
    fn tool_for(&mut self, ev: &Ev<'_>, out: &mut Emitter) -> usize {
        let item_id = ev.item_id.as_deref().unwrap_or("");
        if let Some(ti) = self.tools.iter().position(|t| t.item_id == item_id) {
            return ti;
        }
        let index = ev.output_index;
        self.ensure_item(
            item_id,
            index.unwrap_or(self.items.len() as u64),
            ItemKind::FunctionCall,
        );
        let tool = Tool {
            item_id: item_id.to_owned(),
            call_id: item_id.to_owned(),
            name: None,
            title: None,
            index,
            kind: "tool",
            source: ItemKind::FunctionCall,
            args: String::new(),
            result: None,
            ended: false,
        };
        out.emit(Item {
            phase: ItemPhase::Start,
            id: Some(tool.call_id.clone()),
            index,
            kind: "tool".into(),
            status: Some("in_progress".into()),
            ..Item::default()
        });
        self.tools.push(tool);
        self.tools.len() - 1
    }

    fn on_args_delta(&mut self, ev: &Ev<'_>, out: &mut Emitter) {
        let Some(delta) = ev.delta.as_deref().filter(|d| !d.is_empty()) else {
            out.consumed();
            return;
        };
        let ti = self.tool_for(ev, out);
        let t = &mut self.tools[ti];
        if t.ended {
            out.consumed();
            return;
        }
        t.args.push_str(delta);
        out.emit(Item {
            phase: ItemPhase::Update,
            id: Some(t.call_id.clone()),
            index: t.index,
            kind: t.kind.into(),
            name: t.name.clone(),
            status: Some("in_progress".into()),
            input_delta: Some(delta.to_owned()),
            ..Item::default()
        });
    }

    fn on_args_done(&mut self, ev: &Ev<'_>, out: &mut Emitter) {
        let ti = self.tool_for(ev, out);
        if let Some(args) = ev.arguments.as_deref() {
            let t = &mut self.tools[ti];
            if t.args != args {
                // The snapshot is authoritative (a delta was lost or reordered).
                t.args.clear();
                t.args.push_str(args);
            }
        }
        let before = out.next_seq();
        self.end_tool(ti, "completed", out);
        if out.next_seq() == before {
            out.consumed();
        }
    }

    fn end_tool(&mut self, ti: usize, status: &str, out: &mut Emitter) {
        let Some(t) = self.tools.get_mut(ti) else {
            return;
        };
        if t.ended {
            return;
        }
        t.ended = true;
        let arguments = (t.kind == "tool").then(|| args_json(&t.args));
        out.emit(Item {
            phase: ItemPhase::End,
            id: Some(t.call_id.clone()),
            index: t.index,
            kind: t.kind.into(),
            name: t.name.clone(),
            title: t.title.clone(),
            status: Some(status.into()),
            arguments,
            result: t.result.take(),
            ..Item::default()
        });
    }

    fn end_tools(&mut self, out: &mut Emitter, status: &str) {
        for ti in 0..self.tools.len() {
            self.end_tool(ti, status, out);
        }
    }

    // -- text and reasoning segments ----------------------------------------------------

    fn find_segment(&self, item_id: &str, index: u64, lane: Lane) -> Option<usize> {
        let thinking = matches!(lane, Lane::Raw | Lane::Summary);
        // Most frames hit the segment the previous frame used: search from the back.
        self.segments.iter().rposition(|s| {
            s.index == index
                && s.item_id == item_id
                && (s.lane == lane || (!thinking && matches!(s.lane, Lane::Text | Lane::Refusal)))
        })
    }

    fn ensure_segment(&mut self, item_id: &str, index: u64, lane: Lane) -> usize {
        if let Some(si) = self.find_segment(item_id, index, lane) {
            return si;
        }
        self.segments.push(Segment {
            item_id: item_id.to_owned(),
            index,
            lane,
            id: format!("{item_id}:{index}"),
            text: FinalText::default(),
            emitted: false,
            ended: false,
        });
        self.segments.len() - 1
    }

    fn on_content_part(&mut self, ty: &str, ev: &Ev<'_>, out: &mut Emitter) {
        #[derive(Deserialize)]
        struct PartType<'a> {
            #[serde(borrow, rename = "type", default)]
            ty: Option<Cow<'a, str>>,
        }
        let part_type = ev
            .part
            .and_then(|p| serde_json::from_str::<PartType<'_>>(p.get()).ok())
            .and_then(|p| p.ty.map(Cow::into_owned));
        match part_type.as_deref() {
            Some("output_text" | "refusal") => out.consumed(),
            Some("reasoning_text") => {
                if ty.ends_with(".done") {
                    let item = ev.item_id.as_deref().unwrap_or("");
                    let idx = ev.content_index.unwrap_or(0);
                    if let Some(si) = self.find_segment(item, idx, Lane::Raw) {
                        self.end_thinking(si, out);
                    }
                }
                out.consumed();
            }
            Some(other) => unsupported(out, &format!("{ty}:{other}")),
            None => unsupported(out, ty),
        }
    }

    fn on_text_delta(&mut self, ev: &Ev<'_>, lane: Lane, out: &mut Emitter) {
        let Some(delta) = ev.delta.as_deref().filter(|d| !d.is_empty()) else {
            out.consumed();
            return;
        };
        let item_id = ev.item_id.as_deref().unwrap_or("");
        self.note_message(item_id, ev.output_index);
        let si = self.ensure_segment(item_id, ev.content_index.unwrap_or(0), lane);
        let seg = &mut self.segments[si];
        seg.lane = lane;
        seg.text.push_str(delta);
        seg.emitted = true;
        out.emit(commentary_delta(&seg.id, delta));
    }

    /// Remembers a message item first seen through its text frames.
    fn note_message(&mut self, item_id: &str, output_index: Option<u64>) {
        if self.item_index(item_id).is_none() {
            let oi = output_index.unwrap_or(self.items.len() as u64);
            self.ensure_item(item_id, oi, ItemKind::Message(true));
        }
    }

    fn on_text_done(&mut self, ev: &Ev<'_>, lane: Lane, text: Option<&str>, out: &mut Emitter) {
        let item_id = ev.item_id.as_deref().unwrap_or("");
        self.note_message(item_id, ev.output_index);
        let si = self.ensure_segment(item_id, ev.content_index.unwrap_or(0), lane);
        let seg = &mut self.segments[si];
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            out.consumed();
            return;
        };
        if !seg.text.matches(text) {
            // The snapshot is authoritative for the final answer.
            let had = seg.emitted;
            seg.text.set(text);
            if had {
                out.diagnostic("snapshot_mismatch", Some(Json::string(&seg.id)));
                return;
            }
        }
        if !seg.emitted {
            // Snapshot-only text: shown once as commentary; finality still resolves at
            // the terminal frame.
            seg.emitted = true;
            out.emit(Assistant {
                id: Some(seg.id.clone()),
                phase: Some(AssistantPhase::Commentary),
                text: Some(seg.text.text()),
                status: Some(SegmentStatus::Completed),
                ..Assistant::default()
            });
            return;
        }
        out.consumed();
    }

    fn on_thinking_delta(&mut self, ev: &Ev<'_>, lane: Lane, out: &mut Emitter) {
        let Some(delta) = ev.delta.as_deref().filter(|d| !d.is_empty()) else {
            out.consumed();
            return;
        };
        let item_id = ev.item_id.as_deref().unwrap_or("");
        let index = match lane {
            Lane::Summary => ev.summary_index,
            _ => ev.content_index,
        }
        .unwrap_or(0);
        let ii = match self.item_index(item_id) {
            Some(ii) => ii,
            None => self.ensure_item(
                item_id,
                ev.output_index.unwrap_or(self.items.len() as u64),
                ItemKind::Reasoning,
            ),
        };
        self.items[ii].displayable = true;
        let si = self.ensure_segment(item_id, index, lane);
        let seg = &mut self.segments[si];
        let variant = thinking_variant(lane);
        if !seg.emitted {
            seg.emitted = true;
            out.emit(Thinking::marker(
                variant,
                SegmentPhase::Start,
                Some(seg.id.clone()),
            ));
        }
        out.emit(Thinking::delta(
            variant,
            delta.to_owned(),
            Some(seg.id.clone()),
        ));
    }

    fn on_thinking_done(&mut self, ev: &Ev<'_>, lane: Lane, out: &mut Emitter) {
        let item_id = ev.item_id.as_deref().unwrap_or("");
        let index = match lane {
            Lane::Summary => ev.summary_index,
            _ => ev.content_index,
        }
        .unwrap_or(0);
        let si = self.ensure_segment(item_id, index, lane);
        if !self.segments[si].emitted {
            if let Some(text) = ev.text.as_deref().filter(|t| !t.is_empty()) {
                // Snapshot-only reasoning is valid (§3.2) and is never dropped.
                if let Some(ii) = self.item_index(item_id) {
                    self.items[ii].displayable = true;
                }
                let seg = &mut self.segments[si];
                seg.emitted = true;
                let variant = thinking_variant(lane);
                out.emit(Thinking::marker(
                    variant,
                    SegmentPhase::Start,
                    Some(seg.id.clone()),
                ));
                out.emit(Thinking {
                    id: Some(seg.id.clone()),
                    variant,
                    phase: None,
                    delta: None,
                    text: Some(text.to_owned()),
                    tokens: None,
                });
            }
        }
        let before = out.next_seq();
        self.end_thinking(si, out);
        if out.next_seq() == before {
            out.consumed();
        }
    }

    /// Emits the `end` marker of an open thinking segment.
    fn end_thinking(&mut self, si: usize, out: &mut Emitter) {
        let Some(seg) = self.segments.get_mut(si) else {
            return;
        };
        if !seg.emitted || seg.ended || !matches!(seg.lane, Lane::Raw | Lane::Summary) {
            return;
        }
        seg.ended = true;
        let (variant, id) = (thinking_variant(seg.lane), seg.id.clone());
        self.end_marker(variant, id, out);
    }

    /// A thinking `end` marker: with `reasoning_tokens` when usage already came (the
    /// terminal frame), else without, the count to follow as an update
    /// ([`Self::send_tokens`]).
    fn end_marker(&mut self, variant: ThinkingVariant, id: String, out: &mut Emitter) {
        let mut marker = Thinking::marker(variant, SegmentPhase::End, Some(id.clone()));
        if self.usage.is_some() {
            marker.tokens = self.usage.as_ref().and_then(reasoning_tokens);
        } else {
            self.waiting_tokens.push((variant, id));
        }
        out.emit(marker);
    }

    fn close_item_thinking(&mut self, item_id: &str, out: &mut Emitter) {
        for si in 0..self.segments.len() {
            if self.segments[si].item_id == item_id {
                self.end_thinking(si, out);
            }
        }
    }

    fn close_thinking(&mut self, out: &mut Emitter) {
        for si in 0..self.segments.len() {
            self.end_thinking(si, out);
        }
    }

    /// The run is ending: every segment that ended before usage gets `reasoning_tokens`
    /// as one tokens-only update (none when usage has no count, or never came).
    fn send_tokens(&mut self, out: &mut Emitter) {
        let waiting = std::mem::take(&mut self.waiting_tokens);
        let Some(tokens) = self.usage.as_ref().and_then(reasoning_tokens) else {
            return;
        };
        for (variant, id) in waiting {
            out.emit(Thinking::tokens_update(variant, Some(id), tokens));
        }
    }

    fn emit_final(&mut self, out: &mut Emitter, truncated: bool) {
        let last_message = self
            .items
            .iter()
            .filter(|i| i.kind == ItemKind::Message(true))
            .max_by_key(|i| i.output_index);
        let Some(msg) = last_message else {
            return;
        };
        let seg = self
            .segments
            .iter()
            .filter(|s| {
                s.item_id == msg.id
                    && matches!(s.lane, Lane::Text | Lane::Refusal)
                    && !s.text.is_empty()
            })
            .max_by_key(|s| s.index);
        if let Some(seg) = seg {
            seg.text.report_cut(out);
            out.emit(final_answer(&seg.id, &seg.text.text(), truncated));
        }
    }
}

/// Reports a frame neither reading took: an unknown event when it has a type, else a
/// malformed frame.
fn unreadable(event: Option<&str>, data: &str, out: &mut Emitter) {
    match serde_json::from_str::<TypeOnly<'_>>(data) {
        Ok(t) => {
            out.unknown_frame(t.ty.as_deref().or(event).unwrap_or("frame"), data);
        }
        Err(_) => {
            out.malformed_frame(data);
        }
    }
}

fn thinking_variant(lane: Lane) -> ThinkingVariant {
    match lane {
        Lane::Summary => ThinkingVariant::Summary,
        _ => ThinkingVariant::Raw,
    }
}

/// Phase-1 out-of-scope item types (spec §6): audio, image generation, MCP, custom tools.
fn is_unsupported_item(kind: &str) -> bool {
    kind.starts_with("mcp_")
        || matches!(
            kind,
            "image_generation_call" | "custom_tool_call" | "audio" | "output_audio"
        )
}

/// The adapter's view of an output item type; `None` for unsupported/unknown types.
fn classify(item: &RawItem<'_>, raw: &RawValue) -> Option<ItemKind> {
    Some(match item.kind() {
        "message" => ItemKind::Message(item.role.as_deref().is_none_or(|r| r == "assistant")),
        "reasoning" => ItemKind::Reasoning,
        "function_call" => ItemKind::FunctionCall,
        "web_search_call" | "file_search_call" => ItemKind::Builtin("search"),
        "code_interpreter_call" => ItemKind::Builtin("command"),
        other => return classify_call(other, raw),
    })
}

/// A response ending on this item waits for the client: a call the client runs (the
/// Phase-1 unsupported `custom_tool_call` included) or an approval to give.
fn awaits_client(item: &RawItem<'_>, raw: &RawValue) -> bool {
    match classify(item, raw) {
        Some(kind) => kind.awaits_client(),
        None => item.kind() == "custom_tool_call",
    }
}

#[cfg(test)]
mod tests {
    use crate::adapter::Family;
    use crate::normalizer::normalize_bytes;
    use proptest::prelude::*;
    use streamgate_grammar::{check, EventData};

    fn run(sse: &str) -> Vec<serde_json::Value> {
        let n = normalize_bytes(Family::F3.into(), sse.as_bytes(), 7);
        assert_eq!(check(&n.events, &[], None), vec![]);
        n.events
            .iter()
            .map(|e| serde_json::from_str(&e.to_json()).unwrap())
            .collect()
    }

    fn frame(json: &str) -> String {
        format!("data: {json}\n\n")
    }

    #[test]
    fn content_parts_of_one_item_are_distinct_segments_and_the_last_is_final() {
        let mut s = String::new();
        s +=
            &frame(r#"{"type":"response.created","response":{"id":"r","model":"m","usage":null}}"#);
        s += &frame(
            r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"msg","type":"message","role":"assistant","content":[]}}"#,
        );
        s += &frame(
            r#"{"type":"response.output_text.delta","item_id":"msg","output_index":0,"content_index":0,"delta":"a"}"#,
        );
        s += &frame(
            r#"{"type":"response.output_text.delta","item_id":"msg","output_index":0,"content_index":1,"delta":"b"}"#,
        );
        s += &frame(
            r#"{"type":"response.completed","response":{"id":"r","output":[],"usage":null}}"#,
        );
        let ev = run(&s);
        assert_eq!(ev[1]["data"]["id"], "msg:0");
        assert_eq!(ev[2]["data"]["id"], "msg:1");
        assert_eq!(ev[3]["data"]["phase"], "final_answer");
        assert_eq!(ev[3]["data"]["id"], "msg:1");
        assert_eq!(ev[3]["data"]["text"], "b");
    }

    #[test]
    fn thinking_end_goes_out_at_once_and_reasoning_tokens_follow_as_one_update() {
        let mut s = String::new();
        s += &frame(
            r#"{"type":"response.reasoning_summary_text.delta","item_id":"rs","output_index":0,"summary_index":0,"delta":"x"}"#,
        );
        s += &frame(
            r#"{"type":"response.reasoning_summary_text.done","item_id":"rs","output_index":0,"summary_index":0,"text":"x"}"#,
        );
        s += &frame(
            r#"{"type":"response.output_text.delta","item_id":"msg","output_index":1,"content_index":0,"delta":"y"}"#,
        );
        s += &frame(
            r#"{"type":"response.completed","response":{"usage":{"output_tokens_details":{"reasoning_tokens":9}}}}"#,
        );
        let ev = run(&s);
        assert_eq!(ev[2]["data"]["phase"], "end");
        assert_eq!(ev[2]["data"].get("tokens"), None);
        assert_eq!(ev[2]["seq"], 3);
        assert_eq!(ev[3]["data"]["delta"], "y");
        // The update comes with the usage, before the terminal frame's own events.
        assert_eq!(
            ev[4]["data"],
            serde_json::json!({"id":"rs:0","variant":"summary","tokens":9})
        );
        assert_eq!(ev[4]["stream"], "thinking");
        assert_eq!(ev.last().unwrap()["data"]["phase"], "end");
        assert_eq!(
            ev.iter()
                .filter(|e| e["data"].get("tokens").is_some())
                .count(),
            1
        );
    }

    #[test]
    fn function_call_yield_has_no_final_answer() {
        let mut s = String::new();
        s += &frame(
            r#"{"type":"response.output_text.delta","item_id":"msg","output_index":0,"content_index":0,"delta":"Checking"}"#,
        );
        s += &frame(
            r#"{"type":"response.output_item.added","output_index":1,"item":{"id":"fc","type":"function_call","call_id":"c","name":"f","arguments":""}}"#,
        );
        s += &frame(
            r#"{"type":"response.completed","response":{"output":[{"type":"message","id":"msg"},{"type":"function_call","id":"fc","call_id":"c","name":"f","arguments":"{}"}]}}"#,
        );
        let ev = run(&s);
        let last = ev.last().unwrap();
        assert_eq!(last["data"]["reason"], "tool_use");
        assert!(ev.iter().all(|e| e["data"]["phase"] != "final_answer"));
        // The snapshot closed the call with its arguments.
        assert!(ev.iter().any(
            |e| e["data"]["phase"] == "end" && e["data"]["arguments"] == serde_json::json!({})
        ));
    }

    #[test]
    fn a_client_tool_search_yields_and_an_orphan_search_output_is_reported() {
        let mut s = String::new();
        s += &frame(
            r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"ts","type":"tool_search_call","call_id":"c1","execution":"client","arguments":{"query":"crm"}}}"#,
        );
        s += &frame(
            r#"{"type":"response.output_item.done","output_index":1,"item":{"id":"to","type":"tool_search_output","call_id":"c9","tools":[]}}"#,
        );
        s += &frame(
            r#"{"type":"response.completed","response":{"output":[{"id":"ts","type":"tool_search_call","call_id":"c1","execution":"client","arguments":{"query":"crm"}}]}}"#,
        );
        let ev = run(&s);
        assert_eq!(ev[0]["data"]["input"], serde_json::json!({"query":"crm"}));
        assert_eq!(ev[1]["data"]["diagnostic"]["code"], "orphan_tool_result");
        assert_eq!(ev[2]["data"]["phase"], "end");
        assert_eq!(
            ev[2]["data"]["arguments"],
            serde_json::json!({"query":"crm"})
        );
        assert_eq!(ev.last().unwrap()["data"]["reason"], "tool_use");
    }

    #[test]
    fn a_response_ending_on_a_server_search_output_finalizes() {
        let mut s = String::new();
        s += &frame(
            r#"{"type":"response.output_item.done","output_index":0,"item":{"id":"ts","type":"tool_search_call","execution":"server","arguments":{}}}"#,
        );
        s += &frame(
            r#"{"type":"response.output_text.delta","item_id":"m","output_index":1,"content_index":0,"delta":"none found"}"#,
        );
        s += &frame(r#"{"type":"response.completed","response":{"output":[]}}"#);
        let ev = run(&s);
        // The search stayed open for its output; the terminal frame ends it.
        assert_eq!(ev[0]["data"]["phase"], "start");
        assert_eq!(ev[1]["data"]["delta"], "none found");
        assert_eq!(ev[2]["data"]["phase"], "end");
        assert_eq!(ev[3]["data"]["phase"], "final_answer");
        assert_eq!(ev.last().unwrap()["data"]["reason"], "completed");
    }

    #[test]
    fn encrypted_blob_stays_in_the_transcript() {
        let s = frame(
            r#"{"type":"response.output_item.done","output_index":0,"item":{"id":"rs","type":"reasoning","summary":[],"encrypted_content":"SECRET-SECRET-SECRET"}}"#,
        );
        let n = normalize_bytes(Family::F3.into(), s.as_bytes(), 0);
        assert_eq!(n.transcript.len(), 1);
        assert!(n.events.iter().all(|e| !e.to_json().contains("SECRET")));
        assert!(
            matches!(&n.events[0].data, EventData::Thinking(t) if t.variant.as_str() == "redacted")
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for family in [Family::F3, Family::CodexAppServer] {
                let n = normalize_bytes(family.into(), &bytes, 3);
                prop_assert!(check(&n.events, &[], None).is_empty());
            }
        }

        #[test]
        fn shuffled_known_frames_never_break_invariants(order in proptest::collection::vec(0usize..8, 0..24)) {
            const FRAMES: [&str; 8] = [
                r#"{"type":"response.output_text.delta","item_id":"m","content_index":0,"delta":"a"}"#,
                r#"{"type":"response.reasoning_text.delta","item_id":"r","content_index":0,"delta":"b"}"#,
                r#"{"type":"response.reasoning_text.done","item_id":"r","content_index":0,"text":"b"}"#,
                r#"{"type":"response.output_item.added","output_index":1,"item":{"id":"f","type":"function_call","call_id":"c","name":"n"}}"#,
                r#"{"type":"response.function_call_arguments.delta","item_id":"f","delta":"{"}"#,
                r#"{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_tokens"}}}"#,
                r#"{"type":"error","error":{"message":"x"}}"#,
                r#"{"type":"response.completed","response":{"usage":{"output_tokens_details":{"reasoning_tokens":1}}}}"#,
            ];
            let s: String = order.iter().map(|&i| frame(FRAMES[i])).collect();
            let n = normalize_bytes(Family::F3.into(), s.as_bytes(), 5);
            prop_assert!(check(&n.events, &[], None).is_empty());
        }
    }
}

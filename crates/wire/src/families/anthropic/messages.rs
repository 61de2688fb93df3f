//! Anthropic Messages SSE (spec §6 F1 column, §3.5 F1 dispatch rows).
//!
//! The per-message state machine lives in [`MessageMachine`] so the claude-cli envelope
//! (`f1e`) drives the very same rules for its inner `stream_event` frames; only what
//! differs between the two — the run's lifecycle start, finality and terminal event — is
//! left to the outer adapter, which gets a [`Step`] back for every inner event.

use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::final_text::FinalText;
use crate::families::finality::{stream_closed, Path};
use crate::framing::Frame;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Assistant, AssistantPhase, Diagnostic, Item, ItemPhase, Json, Lifecycle, LifecyclePhase,
    SegmentPhase, SegmentStatus, StopReason, Thinking, ThinkingVariant,
};

/// Transcript kind for `signature_delta` material (spec §6: adapter transcript only).
pub const SIGNATURE_KIND: &str = "anthropic_signature_delta";
/// Transcript kind for the opaque `data` of a `redacted_thinking` block.
pub const REDACTED_KIND: &str = "anthropic_redacted_thinking";
/// Transcript kind for `citations_delta` material (spec §6: provisional, transcript-only).
pub const CITATION_KIND: &str = "anthropic_citations_delta";
/// Transcript kind for server-tool result blocks: they carry `encrypted_content` needed
/// for replay, so only a display-safe summary goes on the bus.
pub const TOOL_RESULT_KIND: &str = "anthropic_server_tool_result";
/// Transcript kind for a compaction block's `encrypted_content` (opaque replay state).
pub const COMPACTION_KIND: &str = "anthropic_compaction";

/// Open content blocks kept at once; the wire sends one at a time, so more than this is
/// hostile input and extra blocks are ignored (memory stays bounded).
const MAX_OPEN_BLOCKS: usize = 64;
/// Deferred tool calls waiting for their result (server tools, claude-cli tools).
const MAX_PENDING_TOOLS: usize = 256;

// ---------------------------------------------------------------------------------------
// wire shapes (parsed once per frame, borrowing from the frame)
// ---------------------------------------------------------------------------------------

/// One Anthropic streaming event (`message_start`, `content_block_delta`, …), flat: every
/// variant's fields are optional so one borrowed parse serves all of them.
#[derive(Debug, Deserialize)]
pub struct WireEvent<'a> {
    /// Event type.
    #[serde(rename = "type", borrow)]
    pub ty: Cow<'a, str>,
    /// Content block index (`content_block_*`).
    #[serde(default)]
    pub index: Option<u64>,
    /// `message_start` envelope.
    #[serde(default, borrow)]
    pub message: Option<MessageHead<'a>>,
    /// `content_block_start` stub, kept raw: parsed only when a block opens (rare).
    #[serde(default, borrow)]
    pub content_block: Option<&'a RawValue>,
    /// `content_block_delta` / `message_delta` payload.
    #[serde(default, borrow)]
    pub delta: Option<Delta<'a>>,
    /// Cumulative usage (`message_delta`).
    #[serde(default, borrow)]
    pub usage: Option<&'a RawValue>,
    /// In-band `error` body.
    #[serde(default, borrow)]
    pub error: Option<&'a RawValue>,
}

/// The frame nearly every long run is made of — a text, thinking or tool-argument delta
/// as Anthropic writes it — read by its exact template ([`exact_frame`]) into a
/// [`TemplateDelta`], without the rest of a [`WireEvent`] (moving the whole event through
/// returns was a fifth of `normalize`'s time); `None` for any other frame, which is then
/// read the generic way (docs/performance.md has the measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
pub(crate) fn hot_delta(data: &str) -> Option<TemplateDelta<'_>> {
    let mut c = Cursor::new(data);
    let delta = delta_template(&mut c)?;
    c.whitespace();
    c.end()?;
    Some(delta)
}

/// [`hot_delta`]'s template, read from `c` on (the claude-cli envelope holds it too).
pub(crate) fn delta_template<'a>(c: &mut Cursor<'a>) -> Option<TemplateDelta<'a>> {
    c.literal(r#"{"type":"content_block_delta","index":"#)?;
    let index = c.uint()?;
    let kind = c.one_of([
        r#","delta":{"type":"text_delta","text":"#,
        r#","delta":{"type":"thinking_delta","thinking":"#,
        r#","delta":{"type":"input_json_delta","partial_json":"#,
    ])?;
    let value = c.string()?;
    c.literal("}")?;
    c.whitespace();
    c.literal("}")?;
    Some(TemplateDelta { index, kind, value })
}

/// A content delta read by its template: the block index, which of the template's three
/// delta types, and its one value. Small on purpose: a [`Delta`] is some 200 bytes, and
/// returning one through the readers' `Option`s was 6% of `normalize`'s time in copies
/// (`perf`); [`TemplateDelta::delta`] builds it once, where it is used.
pub(crate) struct TemplateDelta<'a> {
    pub index: u64,
    kind: usize,
    value: Cow<'a, str>,
}

impl<'a> TemplateDelta<'a> {
    /// The [`Delta`] the generic reading makes of the same frame.
    pub(crate) fn delta(self) -> Delta<'a> {
        let value = Some(self.value);
        match self.kind {
            0 => Delta {
                ty: Some(Cow::Borrowed("text_delta")),
                text: value,
                ..Delta::default()
            },
            1 => Delta {
                ty: Some(Cow::Borrowed("thinking_delta")),
                thinking: value,
                ..Delta::default()
            },
            _ => Delta {
                ty: Some(Cow::Borrowed("input_json_delta")),
                partial_json: value,
                ..Delta::default()
            },
        }
    }
}

/// The `message` object of `message_start`.
#[derive(Debug, Deserialize)]
pub struct MessageHead<'a> {
    /// Message id.
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    /// Model name.
    #[serde(default, borrow)]
    pub model: Option<Cow<'a, str>>,
    /// Initial usage snapshot.
    #[serde(default, borrow)]
    pub usage: Option<&'a RawValue>,
}

/// A content or message delta (all fields optional, union of both shapes).
#[derive(Debug, Default, Deserialize)]
pub struct Delta<'a> {
    /// Delta type (content deltas only).
    #[serde(rename = "type", default, borrow)]
    pub ty: Option<Cow<'a, str>>,
    /// `text_delta`.
    #[serde(default, borrow)]
    pub text: Option<Cow<'a, str>>,
    /// `thinking_delta`.
    #[serde(default, borrow)]
    pub thinking: Option<Cow<'a, str>>,
    /// `signature_delta`.
    #[serde(default, borrow)]
    pub signature: Option<Cow<'a, str>>,
    /// `input_json_delta`.
    #[serde(default, borrow)]
    pub partial_json: Option<Cow<'a, str>>,
    /// `citations_delta`.
    #[serde(default, borrow)]
    pub citation: Option<&'a RawValue>,
    /// `compaction_delta`: a piece of the compaction summary.
    #[serde(default, borrow)]
    pub content: Option<Cow<'a, str>>,
    /// `compaction_delta`: opaque state to send back with the summary (replay).
    #[serde(default, borrow)]
    pub encrypted_content: Option<Cow<'a, str>>,
    /// `message_delta` stop reason.
    #[serde(default, borrow)]
    pub stop_reason: Option<Cow<'a, str>>,
}

/// A content block: a `content_block_start` stub, or a completed block inside a
/// claude-cli `assistant`/`user` snapshot.
#[derive(Debug, Deserialize)]
pub struct Block<'a> {
    /// Block type.
    #[serde(rename = "type", borrow)]
    pub ty: Cow<'a, str>,
    /// Tool call id.
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    /// Tool name.
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// Tool input (a stub `{}` at block start).
    #[serde(default, borrow)]
    pub input: Option<&'a RawValue>,
    /// Text (stub `""` at block start).
    #[serde(default, borrow)]
    pub text: Option<Cow<'a, str>>,
    /// Thinking text (stub `""` at block start).
    #[serde(default, borrow)]
    pub thinking: Option<Cow<'a, str>>,
    /// Thinking signature (stub `""` at block start; full in snapshots).
    #[serde(default, borrow)]
    pub signature: Option<Cow<'a, str>>,
    /// `redacted_thinking` opaque payload.
    #[serde(default, borrow)]
    pub data: Option<Cow<'a, str>>,
    /// Owning call of a `*_tool_result` block.
    #[serde(default, borrow)]
    pub tool_use_id: Option<Cow<'a, str>>,
    /// Result content of a `*_tool_result` block.
    #[serde(default, borrow)]
    pub content: Option<&'a RawValue>,
    /// Error flag of a claude-cli `tool_result` block.
    #[serde(default)]
    pub is_error: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// the shared per-message machine
// ---------------------------------------------------------------------------------------

/// What the outer adapter must decide after an inner event.
#[derive(Debug)]
pub enum Step<'e, 'a> {
    /// Fully handled (events, transcript or `consumed` already recorded).
    Done,
    /// `message_start`: the outer adapter owns the run's `lifecycle/start`. Nothing was
    /// recorded for the frame yet.
    Start(&'e MessageHead<'a>),
    /// `message_stop`: the message is over; holds are released. Nothing was recorded for
    /// the frame yet.
    Stop,
    /// In-band `error` with its body. Nothing was recorded for the frame yet.
    Error(Option<&'a RawValue>),
}

/// Classifies an F1 `stop_reason` into its §3.5 path (dispatch table, F1 row). An
/// unknown or missing stop reason ends `incomplete` with no final answer.
pub fn dispatch(stop_reason: Option<&str>) -> Path {
    match stop_reason {
        Some("end_turn") => Path::Finalize(StopReason::Completed),
        Some("stop_sequence") => Path::Finalize(StopReason::StopSequence),
        Some("max_tokens") => Path::Truncate,
        // §4.3: refusal is a `lifecycle` error (destructive settle downstream).
        Some("refusal") => Path::Reject(StopReason::Refusal),
        Some("pause_turn") => Path::Suspend,
        Some("tool_use") => Path::Yield,
        other => Path::Incomplete(other.map(StopReason::parse)),
    }
}

/// Emits the final answer (when `path` has one and there is text) and the terminal
/// lifecycle event. `final_text` is the final segment's id and text.
pub fn settle(
    path: Path,
    final_text: Option<(Option<String>, String)>,
    usage: Option<Json>,
    out: &mut Emitter,
) {
    if let Some(truncated) = path.final_answer() {
        // Zero-text finalize (spec §3.5): no empty final message, ever.
        if let Some((id, text)) = final_text.filter(|(_, t)| !t.is_empty()) {
            out.emit(Assistant {
                id,
                phase: Some(AssistantPhase::FinalAnswer),
                text: Some(text),
                status: Some(SegmentStatus::Completed),
                truncated: truncated.then_some(true),
                ..Assistant::default()
            });
        }
    }
    path.emit(usage, None, out);
}

/// The diagnostic for a provider error body (`{"type":…,"message":…}`): code = the
/// error type, message, and the body verbatim as detail.
pub fn error_diagnostic(body: Option<&RawValue>) -> Diagnostic {
    #[derive(Deserialize)]
    struct ErrorBody<'a> {
        #[serde(rename = "type", default, borrow)]
        ty: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        message: Option<Cow<'a, str>>,
    }
    let parsed = body.and_then(|b| serde_json::from_str::<ErrorBody<'_>>(b.get()).ok());
    let (code, message) = match parsed {
        Some(e) => (
            e.ty.map_or_else(|| "error".to_owned(), Cow::into_owned),
            e.message.map(Cow::into_owned),
        ),
        None => ("error".to_owned(), None),
    };
    Diagnostic {
        code,
        message,
        detail: body.map(Json::from_raw),
    }
}

/// Emits the `lifecycle/error` (Dead path) for an in-band provider error.
pub fn emit_error(body: Option<&RawValue>, usage: Option<Json>, out: &mut Emitter) {
    Path::Dead(StopReason::Error).emit(usage, Some(error_diagnostic(body)), out);
}

/// Options that differ between plain F1 and the claude-cli envelope.
#[derive(Debug, Clone, Copy, Default)]
pub struct MachineOptions {
    /// Client `tool_use` calls end only when their result arrives (claude-cli runs the
    /// tools itself and reports results in `user` frames); plain F1 ends them at block
    /// stop, since the result belongs to the caller's next request.
    pub defer_client_tools: bool,
}

#[derive(Debug)]
enum BlockKind {
    Text,
    /// `started`: the `raw` start marker was emitted (on the first non-empty delta;
    /// a block that never gets one is the signature-only = redacted case).
    Thinking {
        started: bool,
    },
    Redacted,
    Tool {
        id: String,
        name: String,
        args: String,
        deferred: bool,
    },
    /// A `compaction` block (context management): its summary, bounded, is reported
    /// when the block closes ([`COMPACTION_SUMMARY_MAX`]).
    Compaction {
        summary: String,
        cut: bool,
    },
    /// Structural or already-reported blocks: their deltas and stop are consumed.
    Quiet,
}

/// A compaction summary is session state, not the reply: reported as a diagnostic whose
/// text is cut here (the raw stream keeps it whole).
const COMPACTION_SUMMARY_MAX: usize = 64 * 1024;

/// Appends `piece` to a compaction summary within [`COMPACTION_SUMMARY_MAX`].
fn push_summary(summary: &mut String, cut: &mut bool, piece: &str) {
    let room = COMPACTION_SUMMARY_MAX.saturating_sub(summary.len());
    if piece.len() <= room {
        summary.push_str(piece);
        return;
    }
    let mut end = room;
    while !piece.is_char_boundary(end) {
        end -= 1;
    }
    summary.push_str(&piece[..end]);
    *cut = true;
}

#[derive(Debug)]
struct OpenBlock {
    index: u64,
    kind: BlockKind,
}

#[derive(Debug)]
struct PendingTool {
    id: String,
    name: String,
    index: Option<u64>,
}

/// The F1 per-message state machine: content blocks, thinking markers with back-filled
/// tokens, tool items, the trailing text run and the latest usage.
#[derive(Debug, Default)]
pub struct MessageMachine {
    opts: MachineOptions,
    blocks: Vec<OpenBlock>,
    /// Text of the trailing run of text blocks (the final-answer candidate, bounded):
    /// cleared when any other content block opens, since text followed by more blocks is
    /// commentary.
    run_text: FinalText,
    /// Index of the last text block of the run.
    run_id: Option<u64>,
    /// The last thinking segment that ended before usage gave `thinking_tokens`: it gets
    /// them as a tokens-only update when usage arrives (spec §3.2).
    thinking_waiting: Option<(ThinkingVariant, String)>,
    /// Thinking tokens already known when a marker is closed (late blocks).
    thinking_tokens: Option<u64>,
    pending_tools: Vec<PendingTool>,
    stop_reason: Option<String>,
    usage: Option<Json>,
}

impl MessageMachine {
    /// A machine with the given options.
    pub fn new(opts: MachineOptions) -> MessageMachine {
        MessageMachine {
            opts,
            ..MessageMachine::default()
        }
    }

    /// The stop reason of the current message, once `message_delta` gave it.
    pub fn stop_reason(&self) -> Option<&str> {
        self.stop_reason.as_deref()
    }

    /// The latest cumulative usage (from `message_delta`, else `message_start`).
    pub fn usage(&self) -> Option<&Json> {
        self.usage.as_ref()
    }

    /// The final-answer candidate: the trailing text run and its segment id (a cut
    /// candidate is reported on `out`).
    pub fn take_final(&mut self, out: &mut Emitter) -> Option<(Option<String>, String)> {
        self.run_text.report_cut(out);
        let empty = self.run_text.is_empty();
        let text = self.run_text.take();
        let id = self.run_id.take().map(|i| i.to_string());
        (!empty).then_some((id, text))
    }

    /// Handles one inner event. `raw` is the event's JSON (for diagnostics).
    pub fn handle<'e, 'a>(
        &mut self,
        ev: &'e WireEvent<'a>,
        raw: &str,
        out: &mut Emitter,
    ) -> Step<'e, 'a> {
        match ev.ty.as_ref() {
            "message_start" => {
                // A new message: per-message state restarts (claude-cli runs several).
                self.stop_reason = None;
                self.run_text.clear();
                self.run_id = None;
                self.thinking_tokens = None;
                if let Some(usage) = ev.message.as_ref().and_then(|m| m.usage) {
                    self.usage = Some(Json::from_raw(usage));
                    out.saw_usage();
                }
                match &ev.message {
                    Some(m) => return Step::Start(m),
                    None => out.unknown_frame("message_start", raw),
                };
            }
            "content_block_start" => self.block_start(ev, raw, out),
            "content_block_delta" => self.block_delta(ev, raw, out),
            "content_block_stop" => self.block_stop(ev.index, raw, out),
            "message_delta" => {
                if let Some(reason) = ev.delta.as_ref().and_then(|d| d.stop_reason.as_ref()) {
                    self.stop_reason = Some(reason.clone().into_owned());
                }
                if let Some(usage) = ev.usage {
                    self.usage = Some(Json::from_raw(usage));
                    out.saw_usage();
                    if let Some(tokens) = thinking_tokens(usage) {
                        self.thinking_tokens = Some(tokens);
                        if let Some((variant, id)) = self.thinking_waiting.take() {
                            out.emit(Thinking::tokens_update(variant, Some(id), tokens));
                        }
                    }
                }
                out.consumed();
            }
            "message_stop" => {
                self.thinking_waiting = None;
                return Step::Stop;
            }
            "ping" => out.consumed(),
            "error" => return Step::Error(ev.error),
            other => {
                out.unknown_frame(other, raw);
            }
        }
        Step::Done
    }

    fn block_start(&mut self, ev: &WireEvent<'_>, raw: &str, out: &mut Emitter) {
        let (Some(index), Some(stub)) = (ev.index, ev.content_block) else {
            out.unknown_frame("content_block_start", raw);
            return;
        };
        let block: Block<'_> = match serde_json::from_str(stub.get()) {
            Ok(b) => b,
            Err(_) => {
                out.malformed_frame(raw);
                return;
            }
        };
        if self.blocks.len() >= MAX_OPEN_BLOCKS {
            out.diagnostic("too_many_open_blocks", None);
            return;
        }
        let ty = block.ty.as_ref();
        if ty != "text" && ty != "fallback" {
            // More content follows the text run: it was commentary.
            self.run_text.clear();
            self.run_id = None;
        }
        let kind = match ty {
            "text" => {
                let mut emitted = false;
                if let Some(text) = block.text.filter(|t| !t.is_empty()) {
                    self.text_delta(index, text.into_owned(), out);
                    emitted = true;
                }
                if !emitted {
                    out.consumed();
                }
                BlockKind::Text
            }
            "thinking" => self.thinking_start(index, &block, out),
            "redacted_thinking" => {
                out.emit(Thinking::marker(
                    ThinkingVariant::Redacted,
                    SegmentPhase::Start,
                    Some(index.to_string()),
                ));
                if let Some(data) = block.data.filter(|d| !d.is_empty()) {
                    out.transcript(REDACTED_KIND, Some(&index.to_string()), &data);
                }
                BlockKind::Redacted
            }
            "tool_use" | "server_tool_use" | "mcp_tool_use" => self.tool_start(index, &block, out),
            "fallback" => {
                out.diagnostic("model_fallback", Some(Json::from_raw(stub)));
                BlockKind::Quiet
            }
            "compaction" => {
                let (mut summary, mut cut) = (String::new(), false);
                let start = block
                    .content
                    .and_then(|c| serde_json::from_str::<String>(c.get()).ok());
                push_summary(&mut summary, &mut cut, start.as_deref().unwrap_or_default());
                out.consumed();
                BlockKind::Compaction { summary, cut }
            }
            t if t.ends_with("_tool_result") => {
                self.tool_result_start(index, &block, stub, out);
                BlockKind::Quiet
            }
            _ => {
                out.unknown_frame("content_block_start", raw);
                BlockKind::Quiet
            }
        };
        self.blocks.push(OpenBlock { index, kind });
    }

    fn thinking_start(&mut self, index: u64, block: &Block<'_>, out: &mut Emitter) -> BlockKind {
        let mut started = false;
        if let Some(text) = block.thinking.as_deref().filter(|t| !t.is_empty()) {
            self.thinking_delta(index, &mut started, text.to_owned(), out);
        }
        if let Some(sig) = block.signature.as_deref().filter(|s| !s.is_empty()) {
            out.transcript(SIGNATURE_KIND, Some(&index.to_string()), sig);
        }
        if !started {
            // The start marker waits for the first reasoning text: until then the
            // block may turn out to be signature-only (= redacted, spec §3.2).
            out.consumed();
        }
        BlockKind::Thinking { started }
    }

    fn tool_start(&mut self, index: u64, block: &Block<'_>, out: &mut Emitter) -> BlockKind {
        let deferred = block.ty != "tool_use" || self.opts.defer_client_tools;
        let id = block.id.as_deref().unwrap_or_default().to_owned();
        let name = block.name.as_deref().unwrap_or_default().to_owned();
        out.emit(Item {
            phase: ItemPhase::Start,
            id: Some(id.clone()),
            index: Some(index),
            kind: "tool".to_owned(),
            name: Some(name.clone()),
            status: Some("in_progress".to_owned()),
            input: block.input.map(Json::from_raw),
            ..Item::default()
        });
        BlockKind::Tool {
            id,
            name,
            args: String::new(),
            deferred,
        }
    }

    /// A server tool's result block: the raw block to the transcript, the call resolved.
    fn tool_result_start(
        &mut self,
        index: u64,
        block: &Block<'_>,
        stub: &RawValue,
        out: &mut Emitter,
    ) {
        self.server_tool_result(Some(&index.to_string()), block, stub, out);
    }

    /// A server tool's `*_tool_result` block (streamed, or whole in a claude-cli
    /// snapshot): the block to the transcript (it carries replay state), its owning call
    /// ended with a display-safe summary, `failed` on an error result.
    pub fn server_tool_result(
        &mut self,
        segment: Option<&str>,
        block: &Block<'_>,
        raw: &RawValue,
        out: &mut Emitter,
    ) {
        out.transcript(TOOL_RESULT_KIND, segment, raw.get());
        let failed = block.is_error == Some(true) || is_error_content(block.content);
        let summary = block.content.map(result_summary);
        self.resolve_tool(
            block.tool_use_id.as_deref().unwrap_or_default(),
            failed,
            summary,
            out,
        );
    }

    fn block_delta(&mut self, ev: &WireEvent<'_>, raw: &str, out: &mut Emitter) {
        let (Some(index), Some(delta)) = (ev.index, ev.delta.as_ref()) else {
            out.unknown_frame("content_block_delta", raw);
            return;
        };
        self.content_delta(index, delta, raw, out);
    }

    /// A `content_block_delta` of block `index`: what [`MessageMachine::handle`] does with
    /// one (its step is always [`Step::Done`]).
    pub(crate) fn content_delta(
        &mut self,
        index: u64,
        delta: &Delta<'_>,
        raw: &str,
        out: &mut Emitter,
    ) {
        let ty = delta.ty.as_deref().unwrap_or_default();
        // Signature material never reaches the bus, whatever block it claims to be for.
        if ty == "signature_delta" {
            match &delta.signature {
                Some(sig) => out.transcript(SIGNATURE_KIND, Some(&index.to_string()), sig),
                None => out.consumed(),
            }
            return;
        }
        if ty == "citations_delta" {
            // Spec §6 (provisional): transcript-only plus `unsupported_frame`.
            let material = delta.citation.map_or("null", RawValue::get);
            out.transcript(CITATION_KIND, Some(&index.to_string()), material);
            out.diagnostic("unsupported_frame", Some(Json::string("citations_delta")));
            return;
        }
        let Some(pos) = self.blocks.iter().position(|b| b.index == index) else {
            out.unknown_frame("content_block_delta", raw);
            return;
        };
        let mut started_now = false;
        match (&mut self.blocks[pos].kind, ty) {
            (BlockKind::Text, "text_delta") => match &delta.text {
                Some(t) if !t.is_empty() => {
                    let text = t.clone().into_owned();
                    self.text_delta(index, text, out);
                }
                // Empty deltas carry nothing (I9: no empty assistant text).
                _ => out.consumed(),
            },
            (BlockKind::Thinking { started }, "thinking_delta") => match &delta.thinking {
                Some(t) if !t.is_empty() => {
                    let mut s = *started;
                    self.thinking_delta(index, &mut s, t.clone().into_owned(), out);
                    started_now = s;
                }
                _ => out.consumed(),
            },
            (BlockKind::Tool { id, name, args, .. }, "input_json_delta") => {
                match &delta.partial_json {
                    Some(p) if !p.is_empty() => {
                        args.push_str(p);
                        out.emit(Item {
                            phase: ItemPhase::Update,
                            id: Some(id.clone()),
                            index: Some(index),
                            kind: "tool".to_owned(),
                            name: Some(name.clone()),
                            status: Some("in_progress".to_owned()),
                            input_delta: Some(p.clone().into_owned()),
                            ..Item::default()
                        });
                    }
                    _ => out.consumed(),
                }
            }
            (BlockKind::Compaction { summary, cut }, "compaction_delta") => {
                push_summary(summary, cut, delta.content.as_deref().unwrap_or_default());
                match &delta.encrypted_content {
                    Some(state) => out.transcript(COMPACTION_KIND, Some(&index.to_string()), state),
                    None => out.consumed(),
                }
            }
            (BlockKind::Quiet, _) => out.consumed(),
            _ => {
                out.unknown_frame("content_block_delta", raw);
            }
        }
        if started_now {
            if let Some(OpenBlock {
                kind: BlockKind::Thinking { started },
                ..
            }) = self.blocks.get_mut(pos)
            {
                *started = true;
            }
        }
    }

    fn text_delta(&mut self, index: u64, text: String, out: &mut Emitter) {
        self.run_text.push_str(&text);
        self.run_id = Some(index);
        out.emit(Assistant {
            id: Some(index.to_string()),
            phase: Some(AssistantPhase::Commentary),
            delta: Some(text),
            status: Some(SegmentStatus::InProgress),
            ..Assistant::default()
        });
    }

    fn thinking_delta(&mut self, index: u64, started: &mut bool, text: String, out: &mut Emitter) {
        let id = index.to_string();
        if !*started {
            *started = true;
            out.emit(Thinking::marker(
                ThinkingVariant::Raw,
                SegmentPhase::Start,
                Some(id.clone()),
            ));
        }
        out.emit(Thinking::delta(ThinkingVariant::Raw, text, Some(id)));
    }

    fn block_stop(&mut self, index: Option<u64>, raw: &str, out: &mut Emitter) {
        let Some(pos) = index.and_then(|i| self.blocks.iter().position(|b| b.index == i)) else {
            out.unknown_frame("content_block_stop", raw);
            return;
        };
        let block = self.blocks.remove(pos);
        if !self.close_block(block, false, out) {
            out.consumed();
        }
    }

    /// Closes one block; `cut` when the stream died with it open. Returns whether an
    /// event was emitted.
    fn close_block(&mut self, block: OpenBlock, cut: bool, out: &mut Emitter) -> bool {
        let id = block.index.to_string();
        match block.kind {
            BlockKind::Text | BlockKind::Quiet => false,
            BlockKind::Compaction { summary, cut } => {
                let detail = serde_json::json!({ "summary": summary, "cut": cut });
                out.diagnostic("compaction", Some(Json::from_value(&detail)));
                true
            }
            BlockKind::Thinking { started: false } if cut => false,
            BlockKind::Thinking { started } => {
                let variant = if started {
                    ThinkingVariant::Raw
                } else {
                    // Opened, got only a signature, closed: the redacted case (§3.2).
                    out.emit(Thinking::marker(
                        ThinkingVariant::Redacted,
                        SegmentPhase::Start,
                        Some(id.clone()),
                    ));
                    ThinkingVariant::Redacted
                };
                self.end_thinking(variant, id, cut, out);
                true
            }
            BlockKind::Redacted => {
                self.end_thinking(ThinkingVariant::Redacted, id, cut, out);
                true
            }
            BlockKind::Tool {
                id: call_id,
                name,
                args,
                deferred,
            } => {
                let arguments = if args.is_empty() {
                    Some(Json::parse("{}").unwrap_or_else(Json::null))
                } else {
                    Json::parse(&args)
                };
                let failed = cut || arguments.is_none();
                let phase = if deferred && !failed {
                    ItemPhase::Update
                } else {
                    ItemPhase::End
                };
                let status = match (failed, phase) {
                    (true, _) => "failed",
                    (false, ItemPhase::End) => "completed",
                    _ => "in_progress",
                };
                if phase == ItemPhase::Update && self.pending_tools.len() < MAX_PENDING_TOOLS {
                    self.pending_tools.push(PendingTool {
                        id: call_id.clone(),
                        name: name.clone(),
                        index: Some(block.index),
                    });
                }
                out.emit(Item {
                    phase,
                    id: Some(call_id),
                    index: Some(block.index),
                    kind: "tool".to_owned(),
                    name: Some(name),
                    status: Some(status.to_owned()),
                    arguments,
                    ..Item::default()
                });
                true
            }
        }
    }

    fn end_thinking(&mut self, variant: ThinkingVariant, id: String, cut: bool, out: &mut Emitter) {
        let mut marker = Thinking::marker(variant, SegmentPhase::End, Some(id.clone()));
        marker.tokens = self.thinking_tokens;
        out.emit(marker);
        // Usage (with `thinking_tokens`) normally arrives after the block (spec §3.2): the
        // count follows as a tokens-only update. Only the message's last segment gets the
        // message total; an earlier one keeps its marker without tokens.
        if !cut && self.thinking_tokens.is_none() {
            self.thinking_waiting = Some((variant, id));
        }
    }

    /// Registers a tool call (already announced with `item/start`) that ends only when
    /// its result arrives (claude-cli snapshot-only runs).
    pub fn defer_tool(&mut self, id: String, name: String, index: Option<u64>) {
        if self.pending_tools.len() < MAX_PENDING_TOOLS {
            self.pending_tools.push(PendingTool { id, name, index });
        }
    }

    /// Ends a deferred tool call with its result (`failed` on an error result). Unknown
    /// ids are reported as a diagnostic. Returns nothing; always leaves a trace.
    pub fn resolve_tool(
        &mut self,
        tool_use_id: &str,
        failed: bool,
        result: Option<Json>,
        out: &mut Emitter,
    ) {
        let Some(pos) = self.pending_tools.iter().position(|t| t.id == tool_use_id) else {
            let detail = serde_json::json!({ "tool_use_id": tool_use_id });
            out.diagnostic("orphan_tool_result", Some(Json::from_value(&detail)));
            return;
        };
        let tool = self.pending_tools.remove(pos);
        out.emit(Item {
            phase: ItemPhase::End,
            id: Some(tool.id),
            index: tool.index,
            kind: "tool".to_owned(),
            name: Some(tool.name),
            status: Some(if failed { "failed" } else { "completed" }.to_owned()),
            result,
            ..Item::default()
        });
    }

    /// The run is over (terminal frame or stream death): closes open blocks and ends tool
    /// calls still waiting for a result with `status`; a waiting thinking segment gets no
    /// tokens any more.
    pub fn close_all(&mut self, pending_status: &str, out: &mut Emitter) {
        for block in std::mem::take(&mut self.blocks) {
            self.close_block(block, true, out);
        }
        for tool in std::mem::take(&mut self.pending_tools) {
            out.emit(Item {
                phase: ItemPhase::End,
                id: Some(tool.id),
                index: tool.index,
                kind: "tool".to_owned(),
                name: Some(tool.name),
                status: Some(pending_status.to_owned()),
                ..Item::default()
            });
        }
        self.thinking_waiting = None;
    }
}

/// `usage.output_tokens_details.thinking_tokens`, parsed from the (small) usage object.
fn thinking_tokens(usage: &RawValue) -> Option<u64> {
    #[derive(Deserialize)]
    struct Usage {
        #[serde(default)]
        output_tokens_details: Option<Details>,
    }
    #[derive(Deserialize)]
    struct Details {
        #[serde(default)]
        thinking_tokens: Option<u64>,
    }
    serde_json::from_str::<Usage>(usage.get())
        .ok()?
        .output_tokens_details?
        .thinking_tokens
}

/// True when a server-tool result's content is an error object (`*_tool_result_error`).
fn is_error_content(content: Option<&RawValue>) -> bool {
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", default, borrow)]
        ty: Option<Cow<'a, str>>,
    }
    content
        .and_then(|c| serde_json::from_str::<Typed<'_>>(c.get()).ok())
        .and_then(|t| t.ty)
        .is_some_and(|t| t.ends_with("_error"))
}

/// A display-safe summary of server-tool result content: per entry only `type`, `title`,
/// `url` and `error_code` (opaque `encrypted_*` fields stay in the transcript).
fn result_summary(content: &RawValue) -> Json {
    use serde_json::{Map, Value};
    const KEEP: [&str; 4] = ["type", "title", "url", "error_code"];
    fn keep(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| KEEP.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<String, Value>>(),
            ),
            other => other.clone(),
        }
    }
    let summary = match serde_json::from_str::<Value>(content.get()) {
        Ok(Value::Array(items)) => Value::Array(items.iter().map(keep).collect()),
        Ok(v) => keep(&v),
        Err(_) => Value::Null,
    };
    Json::from_value(&summary)
}

// ---------------------------------------------------------------------------------------
// the F1 adapter
// ---------------------------------------------------------------------------------------

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct F1Adapter {
    inner: MessageMachine,
    started: bool,
    done: bool,
    /// The id of the run's `message_start` (a gateway repeating it is recognised).
    start_id: Option<String>,
}

impl F1Adapter {
    /// A `message_start` repeating the run's first one (same message id).
    fn repeated_start(&self, ev: &WireEvent<'_>) -> bool {
        self.started
            && ev.ty == "message_start"
            && self.start_id.is_some()
            && ev.message.as_ref().and_then(|m| m.id.as_deref()) == self.start_id.as_deref()
    }
}

impl Adapter for F1Adapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.done {
            // After the terminal event nothing may follow it (I7): a documented drop.
            out.consumed();
            return;
        }
        if let Some(hot) = hot_delta(frame.data) {
            // What `handle` does with a content_block_delta, without building the event.
            let index = hot.index;
            self.inner
                .content_delta(index, &hot.delta(), frame.data, out);
            return;
        }
        let ev: WireEvent<'_> = match serde_json::from_str(frame.data) {
            Ok(ev) => ev,
            Err(_) => {
                out.malformed_frame(frame.data);
                return;
            }
        };
        if self.repeated_start(&ev) {
            // Gateways (LiteLLM, bifrost) send the same `message_start` twice: a
            // documented drop, and the message's state stays as it is.
            out.consumed();
            return;
        }
        match self.inner.handle(&ev, frame.data, out) {
            Step::Done => {}
            Step::Start(head) => {
                if self.started {
                    // Another message while the run's message is open (seen behind
                    // Vertex): the gateway spliced a restart in. The open message is
                    // abandoned — its open blocks close, its tools fail — and the turn
                    // goes on with the new one (docs/families.md).
                    self.inner.close_all("failed", out);
                    let detail = serde_json::json!({
                        "previous": self.start_id,
                        "id": head.id.as_deref(),
                    });
                    out.diagnostic("message_restarted", Some(Json::from_value(&detail)));
                    self.start_id = head.id.as_deref().map(str::to_owned);
                    return;
                }
                self.started = true;
                self.start_id = head.id.as_deref().map(str::to_owned);
                out.emit(Lifecycle {
                    provider: Some("anthropic".to_owned()),
                    model: head.model.as_deref().map(str::to_owned),
                    id: head.id.as_deref().map(str::to_owned),
                    usage: head.usage.map(Json::from_raw),
                    ..Lifecycle::new(LifecyclePhase::Start)
                });
            }
            Step::Stop => {
                self.done = true;
                self.inner.close_all("incomplete", out);
                let path = dispatch(self.inner.stop_reason());
                let final_text = self.inner.take_final(out);
                let usage = self.inner.usage().cloned();
                settle(path, final_text, usage, out);
            }
            Step::Error(body) => {
                self.done = true;
                self.inner.close_all("failed", out);
                emit_error(body, self.inner.usage().cloned(), out);
            }
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.done {
            return;
        }
        self.done = true;
        // Stream death (spec §3.4): no `message_stop`, so no final answer.
        self.inner.close_all("failed", out);
        stream_closed(out);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::normalizer::normalize_bytes;
    use crate::Family;
    use streamgate_grammar::{Event, EventData};

    fn run(sse: &str) -> Vec<Event> {
        normalize_bytes(Family::F1.into(), sse.as_bytes(), 7).events
    }

    fn sse(frames: &[&str]) -> String {
        frames.iter().map(|f| format!("data: {f}\n\n")).collect()
    }

    const START: &str =
        r#"{"type":"message_start","message":{"id":"m","model":"x","usage":{"input_tokens":1}}}"#;

    #[test]
    fn thinking_end_goes_out_at_once_and_tokens_follow_with_usage() {
        let events = run(&sse(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"a"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"b"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3,"output_tokens_details":{"thinking_tokens":2}}}"#,
            r#"{"type":"message_stop"}"#,
        ]));
        let EventData::Thinking(end) = &events[3].data else {
            panic!("{events:?}")
        };
        assert_eq!(end.phase, Some(SegmentPhase::End));
        assert_eq!(end.tokens, None, "usage has not arrived yet");
        assert!(
            matches!(&events[4].data, EventData::Assistant(a) if a.delta.as_deref() == Some("b"))
        );
        // `message_delta` brings the count: one tokens-only update for segment 0.
        assert_eq!(
            events[5].data,
            EventData::Thinking(Thinking::tokens_update(
                ThinkingVariant::Raw,
                Some("0".into()),
                2
            ))
        );
        assert_eq!(streamgate_grammar::check(&events, &[], None), vec![]);
        let batch = streamgate_grammar::fold_token_updates(&events);
        assert_eq!(batch.len(), events.len() - 1);
        assert!(matches!(&batch[3].data, EventData::Thinking(t) if t.tokens == Some(2)));
    }

    #[test]
    fn text_before_a_tool_is_not_final() {
        let events = run(&sse(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"let me check"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
            r#"{"type":"message_stop"}"#,
        ]));
        assert!(!events.iter().any(
            |e| matches!(&e.data, EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer))
        ));
    }

    #[test]
    fn consecutive_text_blocks_form_one_final_answer() {
        let events = run(&sse(&[
            START,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"b"}}"#,
            r#"{"type":"content_block_stop","index":1}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
            r#"{"type":"message_stop"}"#,
        ]));
        let fin = events
            .iter()
            .find_map(|e| match &e.data {
                EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => Some(a),
                _ => None,
            })
            .expect("final answer");
        assert_eq!(fin.text.as_deref(), Some("ab"));
        assert_eq!(fin.id.as_deref(), Some("1"));
    }

    #[test]
    fn garbage_never_panics_and_ends_once() {
        let inputs = [
            "data: {\"type\":\"content_block_delta\",\"index\":99}\n\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\"}}\n\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}\n\n",
            "data: not json\n\n",
            "data: {\"type\":\"message_stop\"}\n\ndata: {\"type\":\"ping\"}\n\n",
        ];
        for input in inputs {
            let n = normalize_bytes(Family::F1.into(), input.as_bytes(), 3);
            let problems = streamgate_grammar::invariants::check(&n.events, &[], Some(n.account));
            assert!(problems.is_empty(), "{input}: {problems:?}");
        }
    }

    /// What the template reading and the generic reading make of `frame`: `None` when the
    /// template leaves it to the generic reading, else both readings' `Debug` text.
    fn both_readings(frame: &str) -> Option<(String, String)> {
        let hot = hot_delta(frame)?;
        let index = hot.index;
        Some((format!("{index} {:?}", hot.delta()), generic_delta(frame)))
    }

    /// The generic reading of a content delta frame: its index and delta (and nothing else
    /// in the event).
    fn generic_delta(frame: &str) -> String {
        let ev = serde_json::from_str::<WireEvent<'_>>(frame).expect(frame);
        assert_eq!(ev.ty, "content_block_delta", "{frame}");
        assert!(
            ev.message.is_none() && ev.content_block.is_none(),
            "{frame}"
        );
        assert!(ev.usage.is_none() && ev.error.is_none(), "{frame}");
        format!("{} {:?}", ev.index.unwrap(), ev.delta.unwrap())
    }

    /// The delta frames read by their exact template become the `WireEvent` the generic
    /// reading makes of them — plain and escaped text, every delta kind — and every
    /// other shape is left to the generic reading.
    #[test]
    fn delta_frames_read_by_template_are_read_as_serde_reads_them() {
        let delta = |index: &str, kind: &str, field: &str, value: &str| {
            format!(
                r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"{kind}","{field}":{value}}}}}"#
            )
        };
        for frame in [
            delta("0", "text_delta", "text", r#""Hello""#),
            delta("12", "thinking_delta", "thinking", r#""""#),
            delta(
                "3",
                "input_json_delta",
                "partial_json",
                r#""{\"path\": \"/tmp\"}""#,
            ),
            delta(
                "1",
                "text_delta",
                "text",
                r#""\u00e9\ud83d\ude00 \"q\" \\ \n""#,
            ),
            // As Anthropic sends them: padded before the last brace.
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello!"}       }"#.into(),
            format!("{}\r\n", delta("0", "text_delta", "text", r#""a""#)),
        ] {
            let (hot, generic) = both_readings(&frame).expect(&frame);
            assert_eq!(hot, generic, "{frame}");
        }
        for frame in [
            delta("01", "text_delta", "text", r#""a""#),
            delta("-1", "text_delta", "text", r#""a""#),
            delta("1.0", "text_delta", "text", r#""a""#),
            delta("99999999999999999999", "text_delta", "text", r#""a""#),
            delta("0", "text_delta", "text", "null"),
            delta("0", "text_delta", "text", "7"),
            delta("0", "text_delta", "text", "\"raw\u{1}control\""),
            delta("0", "text_delta", "thinking", r#""swapped""#),
            delta("0", "signature_delta", "signature", r#""sig""#),
            delta("0", "citations_delta", "citation", "{}"),
            format!("{}\u{a0}", delta("0", "text_delta", "text", r#""a""#)),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"} }x"#.into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a","x":1}}"#.into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"text":"a","type":"text_delta"}}"#.into(),
            r#"{"type":"content_block_delta", "index":0,"delta":{"type":"text_delta","text":"a"}}"#.into(),
            r#"{"index":0,"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}"#.into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}}"#.into(),
            START.into(),
        ] {
            assert_eq!(both_readings(&frame), None, "{frame}");
        }
    }

    proptest::proptest! {
        /// Any text Anthropic can send in a delta — serialized as serde_json does — is read
        /// by the template exactly as serde reads it.
        #[test]
        fn any_delta_text_reads_as_serde_reads_it(text in ".*", index in 0u64..1_000_000) {
            let value = serde_json::to_string(&text).unwrap();
            let frame = format!(
                r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":{value}}}}}"#
            );
            let (hot, generic) = both_readings(&frame).expect("read by the template");
            proptest::prop_assert_eq!(hot, generic);
        }
    }
}

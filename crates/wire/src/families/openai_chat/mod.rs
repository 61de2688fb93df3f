//! OpenAI Chat Completions streaming and its dialects (spec §6 "F2 CC dialects"):
//! OpenAI, OpenRouter, DeepSeek, Moonshot/Kimi, pioneer (bare JSONL, no `[DONE]`),
//! gpt-oss via ollama's OpenAI-compatible surface, and any aggregator speaking the shape.
//!
//! # When things are emitted
//! One rule reproduces every golden:
//! - Each chunk first absorbs its usage (top-level, `choices[i].usage`,
//!   `choices[i].delta.usage`), then its in-chunk `error`, pioneer metadata, and finally
//!   per choice the delta content and the `finish_reason`.
//! - Content, reasoning and tool-call deltas stream as they arrive. Reasoning segments
//!   stay open for the whole turn (F2 has no segment boundaries); all of them close at the
//!   `finish_reason` chunk, followed by the §3.5 dispatch there: `final_answer` (Finalize,
//!   Truncate) or tool `end` items (tool yield).
//! - End markers emitted before any usage frame get that frame's reasoning-token count
//!   as one tokens-only update each when it comes (§3.2; the goldens show the count
//!   folded onto the markers); usage in the finish chunk itself was absorbed before the
//!   markers existed, so they carry no tokens (deepseek-direct and Kimi goldens).
//! - The terminal lifecycle event waits for the end of the stream (`[DONE]` when the
//!   dialect sends it, else the stream close): usage and pioneer's `x_pioneer` metadata
//!   arrive in chunks after the finish chunk. In-chunk errors end the run at once.
//!
//! # Metadata with no event of its own
//! Kept visible as diagnostics, never dropped silently: OpenRouter's `delta.annotations`
//! (`annotations`, per chunk), the moderated-completions `moderation` results
//! (`moderation`), requested `logprobs` (one `unsupported_frame` per run) and audio
//! output (one `unsupported_frame` per run naming `audio`, with the transcript text and
//! never the audio bytes, when the turn resolves: audio is Phase-1 out of scope, §6).

mod reasoning;
mod wire;

use super::final_text::FinalText;
use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::finality::Path;
use crate::families::same_frame::SameFrame;
use crate::framing::Frame;
use reasoning::Segments;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Assistant, AssistantPhase, Diagnostic, Item, ItemPhase, Json, SegmentPhase, SegmentStatus,
    StopReason, Thinking, ThinkingVariant,
};
use wire::{Chunk, Content, Delta, Detail, TextChunk, TextMember};

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct F2Adapter {
    /// All `delta.content` text of the turn (the final answer on Finalize/Truncate),
    /// bounded.
    text: FinalText,
    /// All `delta.refusal` text (the reply when there is no content text), bounded.
    refusal: FinalText,
    /// Latest usage object, verbatim.
    usage: Option<Json>,
    /// Path chosen by the finish chunk; its lifecycle event waits for the stream's end.
    terminal: Option<Terminal>,
    /// The terminal lifecycle event was emitted: later frames are consumed silently.
    done: bool,
    /// The structured lane was seen: the flat mirror is ignored for the rest of the turn.
    structured: bool,
    /// The flat reasoning lane's single segment.
    flat: Lane,
    /// Structured reasoning segments.
    segments: Segments,
    /// Tool calls by wire index, in first-seen order.
    tools: Vec<Tool>,
    /// Segments (variant, id) whose end marker went out before any usage frame: each gets
    /// the next usage frame's reasoning-token count as a tokens-only update.
    waiting_tokens: Vec<(ThinkingVariant, Option<String>)>,
    /// `delta.audio` was seen: the spoken reply's transcript so far (bounded), reported
    /// once when the turn resolves ([`F2Adapter::report_audio`]).
    audio: Option<FinalText>,
    /// The once-per-run `unsupported_frame` for requested logprobs went out.
    logprobs_reported: bool,
    /// The last hot frame whose one text was a string: the next ones that differ from
    /// it only there are read without reading their other members again.
    same: SameFrame<TextMember>,
}

#[derive(Debug, Default)]
struct Lane {
    open: bool,
    closed: bool,
}

#[derive(Debug)]
struct Tool {
    index: u64,
    id: Option<String>,
    name: Option<String>,
    arguments: String,
    /// A custom-tool call: its input is free-form text, never parsed as JSON.
    custom: bool,
    ended: bool,
}

/// The §3.5 path the finish chunk chose, with its diagnostic.
#[derive(Debug)]
struct Terminal {
    path: Path,
    diagnostic: Option<Diagnostic>,
}

impl Adapter for F2Adapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.done {
            // Nothing may follow the terminal event (I7); the frame is a documented drop.
            out.consumed();
            return;
        }
        let data = frame.data.trim();
        if data == "[DONE]" {
            out.consumed();
            if self.terminal.is_some() {
                self.emit_terminal(out);
            }
            return;
        }
        if let Some((member, text)) = self.same.text(data) {
            out.consumed();
            self.text_chunk(TextChunk::with_text(member, text), out);
            return;
        }
        if let Some(chunk) = wire::hot_chunk(data) {
            match chunk.only_text() {
                Some((member, text)) => self.same.keep_text(data, text, member),
                None => self.same.forget(),
            }
            out.consumed();
            self.text_chunk(chunk, out);
            return;
        }
        let chunk: Chunk<'_> = match serde_json::from_str(data) {
            Ok(c) => c,
            Err(_) => {
                out.malformed_frame(data);
                return;
            }
        };
        // Every parsed chunk feeds adapter state, even when it yields no event.
        out.consumed();
        self.chunk(chunk, out);
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.done {
            return;
        }
        if self.terminal.is_some() {
            // The finish chunk arrived: the stream close is the authoritative end
            // (pioneer sends no `[DONE]`).
            self.emit_terminal(out);
            return;
        }
        // Stream death: close what is open, no final_answer.
        self.report_audio(out);
        self.close_thinking(out);
        self.end_tools(false, out);
        Path::Dead(StopReason::StreamClosed).emit(self.usage.clone(), None, out);
        self.done = true;
    }
}

impl F2Adapter {
    fn chunk(&mut self, chunk: Chunk<'_>, out: &mut Emitter) {
        self.absorb_usage(chunk.usage, out);
        if let Some(error) = chunk.error {
            // OpenRouter smuggles mid-stream errors into a normal chunk (§3.4): Dead.
            self.report_audio(out);
            self.close_thinking(out);
            self.end_tools(false, out);
            self.terminal = Some(Terminal {
                path: Path::Dead(StopReason::Error),
                diagnostic: Some(Diagnostic::new(
                    "provider_error",
                    Some(Json::from_raw(error)),
                )),
            });
            self.emit_terminal(out);
            return;
        }
        if let Some(meta) = chunk.x_pioneer {
            out.diagnostic("pioneer_metadata", Some(Json::from_raw(meta)));
        }
        if let Some(moderation) = chunk.moderation {
            // Moderated completions: the results (a flagged output included) come after
            // the whole output and are kept visible, verbatim; they do not change the path.
            out.diagnostic("moderation", Some(Json::from_raw(moderation)));
        }
        for choice in chunk.choices.unwrap_or_default() {
            self.absorb_usage(choice.usage, out);
            if let Some(delta) = &choice.delta {
                self.absorb_usage(delta.usage, out);
            }
            if choice.logprobs.is_some() {
                self.report_logprobs(out);
            }
            if self.terminal.is_some() {
                // Post-finish choices (OpenRouter's second stop chunk, pioneer's metadata
                // chunk) only carry usage, absorbed above.
                continue;
            }
            if let Some(delta) = choice.delta {
                self.delta(delta, out);
            }
            if let Some(reason) = choice.finish_reason.0 {
                self.finish(&reason, choice.native_finish_reason.0, out);
            }
        }
    }

    /// What [`F2Adapter::chunk`] does with a chunk of text and reasoning pieces only: it
    /// has no usage, logprobs, finish, tool calls or structured reasoning to absorb.
    fn text_chunk(&mut self, chunk: TextChunk<'_>, out: &mut Emitter) {
        for choice in chunk.choices.into_iter().flatten() {
            if self.terminal.is_some() {
                // As in `chunk`: a choice after the finish only carries usage.
                continue;
            }
            let Some(delta) = choice.delta else { continue };
            self.flat_reasoning(delta.reasoning_content.0.or(delta.reasoning.0), out);
            if let Some(text) = delta.content {
                self.content(text, out);
            }
        }
    }

    fn absorb_usage(&mut self, usage: Option<&RawValue>, out: &mut Emitter) {
        let Some(raw) = usage.filter(|u| u.get().starts_with('{')) else {
            return;
        };
        self.usage = Some(Json::from_raw(raw));
        out.saw_usage();
        // The first usage frame settles every waiting segment, with or without a count.
        let waiting = std::mem::take(&mut self.waiting_tokens);
        if let Some(tokens) = wire::reasoning_tokens(raw) {
            for (variant, id) in waiting {
                out.emit(Thinking::tokens_update(variant, id, tokens));
            }
        }
    }

    fn delta(&mut self, delta: Delta<'_>, out: &mut Emitter) {
        // Reasoning: structured lane first; the flat siblings are probed in evidence order
        // (reasoning_content, reasoning, reasoning_text) only when it is absent (§3.2).
        if let Some(details) = delta.reasoning_details {
            self.structured |= !details.is_empty();
            for entry in details {
                self.detail(entry, out);
            }
        } else {
            let flat = delta
                .reasoning_content
                .0
                .or(delta.reasoning.0)
                .or(delta.reasoning_text.0);
            self.flat_reasoning(flat, out);
        }

        match delta.content {
            Content::Absent => {}
            Content::Text(text) => self.content(text, out),
            Content::Parts(parts) => {
                for part in parts {
                    let kind = part.kind.0.clone();
                    match kind.as_deref() {
                        Some("text" | "output_text") => {
                            if let Some(text) = part.into_text().filter(|t| !t.is_empty()) {
                                self.content(text, out);
                            }
                        }
                        // Mistral's reasoning models: `{"type":"thinking","thinking":[…]}`.
                        Some("thinking" | "reasoning") => {
                            let text = part.into_thinking_text().filter(|t| !t.is_empty());
                            if let Some(text) = text {
                                self.flat_thinking(text, out);
                            }
                        }
                        // A part this adapter does not map is reported, never dropped
                        // silently.
                        other => {
                            let kind = other.unwrap_or("(none)");
                            out.diagnostic("unknown_content_part", Some(Json::string(kind)));
                        }
                    }
                }
            }
            Content::Other(kind) => {
                out.diagnostic("unsupported_content_shape", Some(Json::string(kind)));
            }
        }

        if let Some(refusal) = delta.refusal.0 {
            // The refusal lane is the reply itself (§3.1); it surfaces as the final answer.
            self.refusal.push_str(&refusal);
        }

        if let Some(annotations) = delta.annotations.filter(|a| a.get() != "[]") {
            // OpenRouter's web-search citations: metadata of the answer, kept visible.
            out.diagnostic("annotations", Some(Json::from_raw(annotations)));
        }
        if let Some(audio) = delta.audio {
            self.audio(audio);
        }

        for call in delta.tool_calls.unwrap_or_default() {
            let index = call.index.0.unwrap_or(0);
            let custom = call.custom.is_some() && call.function.is_none();
            let (name, input) = call.name_and_input();
            self.tool_call(index, call.id.0, name, input, custom, out);
        }
        if let Some(function) = delta.function_call {
            // Legacy single function call: one call, no id on the wire.
            let args = function.arguments_text();
            self.tool_call(0, None, function.name.0, args, false, out);
        }
    }

    /// Audio output is Phase-1 out of scope (spec §6): the transcript is collected so the
    /// `unsupported_frame` diagnostic can carry the spoken reply's text; the audio bytes
    /// are never read.
    fn audio(&mut self, audio: &RawValue) {
        let transcript = self.audio.get_or_insert_with(FinalText::default);
        if let Some(text) = wire::transcript(audio) {
            transcript.push_str(&text);
        }
    }

    /// The run's one `unsupported_frame` for audio output, with the transcript text (when
    /// there was one), once the turn resolves or dies.
    fn report_audio(&mut self, out: &mut Emitter) {
        let Some(transcript) = self.audio.take() else {
            return;
        };
        let mut detail = serde_json::Map::new();
        detail.insert("frame".into(), "audio".into());
        if !transcript.is_empty() {
            detail.insert("transcript".into(), transcript.text().into());
        }
        out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
    }

    /// Logprobs are debug metadata with no event (spec §6); that they were requested is
    /// reported once per run as `unsupported_frame`.
    fn report_logprobs(&mut self, out: &mut Emitter) {
        if !self.logprobs_reported {
            self.logprobs_reported = true;
            out.diagnostic("unsupported_frame", Some(Json::string("logprobs")));
        }
    }

    fn content(&mut self, text: Cow<'_, str>, out: &mut Emitter) {
        // Null and "" are absent (I9): no empty assistant events.
        if text.is_empty() {
            return;
        }
        self.text.push_str(&text);
        out.emit(Assistant {
            phase: Some(AssistantPhase::Commentary),
            delta: Some(text.into_owned()),
            status: Some(SegmentStatus::InProgress),
            ..Assistant::default()
        });
    }

    /// A piece of a flat reasoning lane, unless the structured lane is in use (the flat one
    /// mirrors it) or the piece is empty.
    fn flat_reasoning(&mut self, flat: Option<Cow<'_, str>>, out: &mut Emitter) {
        if self.structured {
            return;
        }
        if let Some(text) = flat.filter(|t| !t.is_empty()) {
            self.flat_thinking(text, out);
        }
    }

    fn flat_thinking(&mut self, text: Cow<'_, str>, out: &mut Emitter) {
        if !self.flat.open {
            self.flat.open = true;
            out.emit(Thinking::marker(
                ThinkingVariant::Raw,
                SegmentPhase::Start,
                None,
            ));
        }
        out.emit(Thinking::delta(
            ThinkingVariant::Raw,
            text.into_owned(),
            None,
        ));
    }

    fn detail(&mut self, entry: Detail<'_>, out: &mut Emitter) {
        let i = self.segments.locate(&entry);
        let Some(seg) = self.segments.get_mut(i) else {
            return;
        };
        // Opaque material goes to the transcript only (§2), attached to its segment.
        if let Some(sig) = entry.signature {
            seg.opaque = true;
            out.transcript(
                "openrouter_reasoning_signature",
                Some(&seg.label()),
                &material(sig),
            );
        }
        if let Some(data) = entry.data {
            seg.opaque = true;
            out.transcript(
                "openrouter_reasoning_encrypted",
                Some(&seg.label()),
                &material(data),
            );
        }
        let (variant, text) = match entry.kind.0.as_deref() {
            Some("reasoning.text") => (ThinkingVariant::Raw, entry.text.0),
            Some("reasoning.summary") => (ThinkingVariant::Summary, entry.summary.0),
            Some("reasoning.encrypted") => {
                seg.opaque = true;
                out.consumed();
                return;
            }
            other => {
                if !seg.opaque {
                    let detail = Json::from_value(&other.unwrap_or("absent"));
                    out.diagnostic("unknown_reasoning_detail", Some(detail));
                }
                return;
            }
        };
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            // A signature-only closing entry, or an empty fragment: state only.
            out.consumed();
            return;
        };
        seg.displayable = true;
        seg.variant = variant;
        let id = seg.id.clone();
        if !seg.open {
            seg.open = true;
            out.emit(Thinking::marker(variant, SegmentPhase::Start, id.clone()));
        }
        out.emit(Thinking::delta(variant, text.into_owned(), id));
    }

    /// One `tool_calls[]` delta (or the legacy `function_call`): `name` and `input` are the
    /// function's name and argument fragment, or a custom call's name and input fragment.
    fn tool_call(
        &mut self,
        index: u64,
        id: Option<Cow<'_, str>>,
        name: Option<Cow<'_, str>>,
        input: Option<Cow<'_, str>>,
        custom: bool,
        out: &mut Emitter,
    ) {
        let name = name.as_deref();
        let pos = match self.tools.iter().position(|t| t.index == index) {
            Some(pos) => {
                let tool = &mut self.tools[pos];
                if tool.id.is_none() {
                    tool.id = id.map(Cow::into_owned);
                }
                if tool.name.is_none() {
                    tool.name = name.map(str::to_owned);
                }
                tool.custom |= custom;
                pos
            }
            None => {
                // §3.3: start as soon as the call is known, before its arguments.
                self.tools.push(Tool {
                    index,
                    id: id.map(Cow::into_owned),
                    name: name.map(str::to_owned),
                    arguments: String::new(),
                    custom,
                    ended: false,
                });
                let pos = self.tools.len() - 1;
                out.emit(self.tools[pos].item(ItemPhase::Start, "in_progress"));
                pos
            }
        };
        if let Some(args) = input.filter(|a| !a.is_empty()) {
            let tool = &mut self.tools[pos];
            tool.arguments.push_str(&args);
            out.emit(Item {
                input_delta: Some(args.into_owned()),
                ..tool.item(ItemPhase::Update, "in_progress")
            });
        }
    }

    /// §3.5 dispatch on `finish_reason`; the lifecycle event waits for the stream's end.
    fn finish(&mut self, reason: &str, native: Option<Cow<'_, str>>, out: &mut Emitter) {
        self.report_audio(out);
        self.close_thinking(out);
        let native =
            native.map(|n| Diagnostic::new("native_finish_reason", Some(Json::string(&n))));
        let (path, diagnostic) = match reason {
            "stop" => (Path::Finalize(StopReason::Completed), native),
            "length" => (Path::Truncate, native),
            "tool_calls" | "function_call" => (Path::Yield, native),
            // Reject: the streamed text is retracted downstream, never finalized.
            "content_filter" => (Path::Reject(StopReason::ContentFilter), native),
            "error" => (
                Path::Dead(StopReason::Error),
                Some(native.unwrap_or_else(|| Diagnostic::new("finish_reason_error", None))),
            ),
            // Unknown reason: end incomplete, no final answer (conservative, as F3).
            other => (
                Path::Incomplete(Some(StopReason::Other("incomplete".to_owned()))),
                Some(Diagnostic::new(
                    "unknown_finish_reason",
                    Some(Json::string(other)),
                )),
            ),
        };
        let tools_completed = matches!(path, Path::Finalize(_) | Path::Truncate | Path::Yield);
        self.end_tools(tools_completed, out);
        if let Some(truncated) = path.final_answer() {
            self.final_answer(truncated, out);
        }
        self.terminal = Some(Terminal { path, diagnostic });
    }

    fn final_answer(&mut self, truncated: bool, out: &mut Emitter) {
        let text = if self.text.is_empty() {
            &self.refusal
        } else {
            &self.text
        };
        // Zero-text finalize: no final_answer at all.
        if text.is_empty() {
            return;
        }
        text.report_cut(out);
        out.emit(Assistant {
            phase: Some(AssistantPhase::FinalAnswer),
            text: Some(text.text()),
            status: Some(SegmentStatus::Completed),
            truncated: truncated.then_some(true),
            ..Assistant::default()
        });
    }

    /// Closes every open reasoning segment; structured segments that only ever carried
    /// opaque material become a redacted marker pair (§3.2 displayable-wins).
    fn close_thinking(&mut self, out: &mut Emitter) {
        if self.flat.open && !self.flat.closed {
            self.flat.closed = true;
            self.end_marker(
                Thinking::marker(ThinkingVariant::Raw, SegmentPhase::End, None),
                out,
            );
        }
        let mut markers = Vec::new();
        for seg in self.segments.iter_mut().filter(|s| !s.closed) {
            if seg.open {
                seg.closed = true;
                let end = Thinking::marker(seg.variant, SegmentPhase::End, seg.id.clone());
                markers.push((None, end));
            } else if !seg.displayable && seg.opaque {
                seg.closed = true;
                let id = seg.id.clone();
                let start =
                    Thinking::marker(ThinkingVariant::Redacted, SegmentPhase::Start, id.clone());
                let end = Thinking::marker(ThinkingVariant::Redacted, SegmentPhase::End, id);
                markers.push((Some(start), end));
            }
        }
        for (start, end) in markers {
            if let Some(start) = start {
                out.emit(start);
            }
            self.end_marker(end, out);
        }
    }

    /// Emits an end marker; when no usage came yet, the next usage frame's token count
    /// follows as an update.
    fn end_marker(&mut self, end: Thinking, out: &mut Emitter) {
        if self.usage.is_none() {
            self.waiting_tokens.push((end.variant, end.id.clone()));
        }
        out.emit(end);
    }

    fn end_tools(&mut self, completed: bool, out: &mut Emitter) {
        for tool in self.tools.iter_mut().filter(|t| !t.ended) {
            tool.ended = true;
            let item = if completed {
                let arguments = if tool.custom {
                    // A custom tool's input is text, whatever it looks like.
                    (!tool.arguments.is_empty()).then(|| Json::string(&tool.arguments))
                } else {
                    parse_arguments(&tool.arguments)
                };
                Item {
                    arguments,
                    ..tool.item(ItemPhase::End, "completed")
                }
            } else {
                tool.item(ItemPhase::End, "failed")
            };
            out.emit(item);
        }
    }

    fn emit_terminal(&mut self, out: &mut Emitter) {
        let Some(t) = self.terminal.take() else {
            return;
        };
        t.path.emit(self.usage.clone(), t.diagnostic, out);
        self.done = true;
    }
}

impl Tool {
    fn item(&self, phase: ItemPhase, status: &str) -> Item {
        Item {
            phase,
            id: self.id.clone(),
            index: Some(self.index),
            kind: "tool".to_owned(),
            name: self.name.clone(),
            status: Some(status.to_owned()),
            ..Item::default()
        }
    }
}

/// Assembled arguments: the JSON value when they parse, else the text as a string;
/// nothing when no argument text arrived.
fn parse_arguments(text: &str) -> Option<Json> {
    if text.trim().is_empty() {
        return None;
    }
    Some(Json::parse(text).unwrap_or_else(|| Json::string(text)))
}

/// Transcript material: a JSON string's value, or any other value's JSON text.
fn material(raw: &RawValue) -> String {
    serde_json::from_str::<String>(raw.get()).unwrap_or_else(|_| raw.get().to_owned())
}

#[cfg(test)]
mod tests;

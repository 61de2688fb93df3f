//! Gemini `streamGenerateContent?alt=sse` (F5; spec §6 F5 table, evidence
//! `gemini-genai-sse.md`).
//!
//! Every SSE frame is one whole `GenerateContentResponse`: `candidates[].content.parts[]`
//! carry text deltas (`thought:true` marks thought *summaries*), `functionCall` parts carry
//! complete calls (with the opaque `thoughtSignature` beside them) — or, on Vertex with
//! streamed arguments, one call over several parts ([`streamed_args`]) — `finishReason` on
//! the candidate ends the turn, and `usageMetadata` is a cumulative snapshot on every chunk.
//! There is no `[DONE]`: the terminal frame is the one with a `finishReason`.
//!
//! Layout: this file holds the adapter; `streamed_args.rs` assembles streamed arguments;
//! `inline_bytes.rs` keeps base64 media out of the diagnostics that report a part.

use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::finality::{stream_closed, Path};
use crate::families::same_frame::SameFrame;
use crate::families::segments::TurnSegments;
use crate::framing::Frame;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamed_args::{PartialArg, StreamedArgs};
use streamgate_grammar::{
    Diagnostic, Json, Lifecycle, LifecyclePhase, StopReason, Thinking, ThinkingVariant,
};
use text_chunk::{hot_chunk, KeptChunk, TextCandidate, TextChunk};

mod inline_bytes;
mod streamed_args;
mod text_chunk;

/// A streamed call's arguments go out as a snapshot on every part while they are at most
/// this big; beyond it only the finished arguments do (each snapshot repeats the whole).
const SNAPSHOT_LIMIT: usize = 16 * 1024;

/// Transcript kind for `thoughtSignature` (opaque continuation state, spec §2).
const SIGNATURE_KIND: &str = "gemini_thought_signature";

/// One SSE data frame.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk<'a> {
    #[serde(borrow)]
    candidates: Option<Vec<Candidate<'a>>>,
    #[serde(borrow)]
    usage_metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    model_version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    response_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    prompt_feedback: Option<&'a RawValue>,
    /// Google API error envelope (`{"error":{code,message,status}}`), sent in-band when a
    /// stream fails after the HTTP headers went out.
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    /// The model's lifecycle stage and retirement time (a deprecation warning).
    #[serde(borrow)]
    model_status: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback<'a> {
    #[serde(borrow)]
    block_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    #[serde(borrow)]
    content: Option<Content<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    finish_message: Option<Cow<'a, str>>,
    index: Option<u64>,
    #[serde(borrow)]
    safety_ratings: Option<&'a RawValue>,
    #[serde(borrow)]
    citation_metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    grounding_metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    url_context_metadata: Option<&'a RawValue>,
    /// Token log probabilities (`responseLogprobs`): debug metadata with no event.
    #[serde(borrow)]
    logprobs_result: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
struct Content<'a> {
    #[serde(borrow)]
    parts: Option<Vec<Part<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    thought: Option<bool>,
    #[serde(borrow)]
    function_call: Option<FunctionCall<'a>>,
    #[serde(borrow)]
    thought_signature: Option<Cow<'a, str>>,
    // Catalogued part types with no Phase-1 mapping (→ `unsupported_frame`).
    #[serde(borrow)]
    inline_data: Option<&'a RawValue>,
    #[serde(borrow)]
    file_data: Option<&'a RawValue>,
    #[serde(borrow)]
    executable_code: Option<&'a RawValue>,
    #[serde(borrow)]
    code_execution_result: Option<&'a RawValue>,
    #[serde(borrow)]
    function_response: Option<&'a RawValue>,
    /// A built-in tool call that Gemini runs server-side (the client does not).
    #[serde(borrow)]
    tool_call: Option<&'a RawValue>,
    /// The server-side built-in tool's result.
    #[serde(borrow)]
    tool_response: Option<&'a RawValue>,
}

impl<'a> Part<'a> {
    fn unsupported(&self) -> Option<(&'static str, &'a RawValue)> {
        [
            ("inlineData", self.inline_data),
            ("fileData", self.file_data),
            ("executableCode", self.executable_code),
            ("codeExecutionResult", self.code_execution_result),
            ("functionResponse", self.function_response),
            ("toolCall", self.tool_call),
            ("toolResponse", self.tool_response),
        ]
        .into_iter()
        .find_map(|(name, raw)| raw.map(|r| (name, r)))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FunctionCall<'a> {
    /// Newer API versions may carry a provider call id; used when present.
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    args: Option<&'a RawValue>,
    /// Streamed arguments (Vertex `streamFunctionCallArguments`).
    #[serde(borrow)]
    partial_args: Option<Vec<PartialArg<'a>>>,
    /// More parts of this call follow.
    will_continue: Option<bool>,
}

/// The one usage field the adapter reads (for the thinking `tokens` rule, spec §3.2).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThoughtCount {
    thoughts_token_count: Option<u64>,
}

/// What [`F5Adapter::chunk_head`] reads of a chunk.
struct ChunkHead<'a> {
    response_id: Option<&'a str>,
    usage: Option<&'a str>,
    model_version: Option<&'a str>,
    /// The chunk carries something this family knows.
    known: bool,
}

/// The candidate's index when it is the first candidate (the only one normalized: `n > 1`
/// candidates would interleave several replies into one turn), else `None` after
/// reporting it.
fn first_candidate(index: Option<u64>, out: &mut Emitter) -> Option<u64> {
    let index = index.unwrap_or(0);
    if index != 0 {
        let detail = serde_json::json!({ "candidate_index": index });
        out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
        return None;
    }
    Some(index)
}

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct F5Adapter {
    started: bool,
    /// The terminal lifecycle event went out; later frames are dropped.
    ended: bool,
    response_id: Option<String>,
    /// Latest cumulative `usageMetadata` text (buffer reused across frames).
    usage: String,
    has_usage: bool,
    /// Thought tokens already reported on earlier thinking segments' end markers.
    thought_tokens_reported: u64,
    /// The last thinking segment, when it closed before usage gave a thought count: its
    /// variant and the tokens reported before it. The count is back-filled onto it when
    /// it arrives (spec §3.2).
    unreported_thinking: Option<(ThinkingVariant, u64)>,
    /// The call whose arguments are still streaming (its `item/start` went out).
    streaming: Option<StreamedArgs>,
    segments: TurnSegments,
    calls: crate::families::whole_calls::WholeCalls,
    /// Function calls announced this turn (the `index` of the next one).
    call_count: u64,
    /// Latest `safetyRatings`, reported once at the end of the turn.
    safety_ratings: Option<Json>,
    /// `logprobsResult` was reported (it rides on every chunk; once a run says enough).
    logprobs_reported: bool,
    /// `modelStatus` was reported (repeated on every chunk; once a run says enough).
    model_status_reported: bool,
    /// The last text frames read member by member: the next ones that differ from one of
    /// them only in their text and usage are read without reading their other members.
    same: SameFrame<text_chunk::Shape>,
}

impl Adapter for F5Adapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.ended {
            // The turn is over (its terminal event must stay last): documented drop.
            out.consumed();
            return;
        }
        let data = frame.data.trim();
        if data == "[DONE]" {
            // Not sent by Gemini, but harmless transport noise if a proxy adds it.
            out.consumed();
            return;
        }
        if let Some(chunk) = text_chunk::same_chunk(&self.same, data) {
            self.kept_chunk(chunk, frame, out);
            return;
        }
        if let Some(chunk) = hot_chunk(data) {
            text_chunk::keep(&mut self.same, data, &chunk);
            self.text_chunk(chunk, frame, out);
            return;
        }
        let chunk: Chunk<'_> = match serde_json::from_str(data) {
            Ok(c) => c,
            Err(_) => {
                out.malformed_frame(frame.data);
                return;
            }
        };
        self.chunk(chunk, frame, out);
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.ended {
            return;
        }
        // No finishReason ever arrived: stream death (spec §3.4). Close what is open, and
        // never re-tag text as final.
        self.close_thinking(out);
        self.finish_streamed_call(None, out);
        self.end_calls(out, "failed");
        stream_closed(out);
        self.ended = true;
    }
}

impl F5Adapter {
    fn chunk(&mut self, chunk: Chunk<'_>, frame: Frame<'_>, out: &mut Emitter) {
        let known = chunk.candidates.is_some()
            || chunk.error.is_some()
            || chunk.prompt_feedback.is_some()
            || chunk.usage_metadata.is_some()
            || chunk.model_status.is_some();
        let head = ChunkHead {
            response_id: chunk.response_id.as_deref(),
            usage: chunk.usage_metadata.map(RawValue::get),
            model_version: chunk.model_version.as_deref(),
            known,
        };
        if !self.chunk_head(head, frame, out) {
            return;
        }
        self.model_status(chunk.model_status, out);

        if let Some(error) = chunk.error {
            let diag = Diagnostic::new("provider_error", Some(Json::from_raw(error)));
            self.terminate(out, Path::Dead(StopReason::Error), None, Some(diag));
            return;
        }
        for candidate in chunk.candidates.unwrap_or_default() {
            if self.ended {
                break;
            }
            self.candidate(candidate, out);
        }
        if self.ended {
            return;
        }
        // After the parts: a count that grew while thinking was open is that segment's.
        self.backfill_thought_tokens(out);
        if let Some(feedback) = chunk.prompt_feedback {
            let blocked = serde_json::from_str::<PromptFeedback<'_>>(feedback.get())
                .is_ok_and(|f| f.block_reason.is_some());
            if blocked {
                // The prompt itself was blocked: nothing will be generated (Reject path).
                let diag = Diagnostic::new("prompt_blocked", Some(Json::from_raw(feedback)));
                self.terminate(
                    out,
                    Path::Reject(StopReason::ContentFilter),
                    None,
                    Some(diag),
                );
            }
        }
    }

    /// What [`F5Adapter::chunk`] does with a frame of text and thought parts only: it has
    /// no error, prompt feedback, model status or candidate metadata to handle.
    fn text_chunk(&mut self, chunk: TextChunk<'_>, frame: Frame<'_>, out: &mut Emitter) {
        let head = ChunkHead {
            response_id: chunk.response_id.as_deref(),
            usage: chunk.usage_metadata,
            model_version: chunk.model_version.as_deref(),
            known: chunk.candidates.is_some() || chunk.usage_metadata.is_some(),
        };
        self.text_frame(head, frame, out, |this, out| {
            for candidate in chunk.candidates.into_iter().flatten() {
                if this.ended {
                    break;
                }
                this.text_candidate(candidate, out);
            }
        });
    }

    /// [`F5Adapter::text_chunk`] for a frame read as a kept one: its one candidate's
    /// parts handed straight to [`F5Adapter::text_part`].
    fn kept_chunk(&mut self, chunk: KeptChunk<'_>, frame: Frame<'_>, out: &mut Emitter) {
        let head = ChunkHead {
            response_id: chunk.response_id.as_deref(),
            usage: chunk.usage_metadata,
            model_version: chunk.model_version.as_deref(),
            known: true,
        };
        self.text_frame(head, frame, out, |this, out| {
            if first_candidate(chunk.index, out).is_some() {
                for (text, thought) in chunk.texts.into_iter().take(chunk.parts) {
                    this.text_part(Some(text), thought, None, None, out);
                }
            }
        });
    }

    /// A text frame: its head, then `parts` (unless the head ends it), then the thought
    /// count a closed segment may still be waiting for.
    fn text_frame(
        &mut self,
        head: ChunkHead<'_>,
        frame: Frame<'_>,
        out: &mut Emitter,
        parts: impl FnOnce(&mut Self, &mut Emitter),
    ) {
        if !self.chunk_head(head, frame, out) {
            return;
        }
        parts(self, out);
        if !self.ended {
            self.backfill_thought_tokens(out);
        }
    }

    /// What every chunk does first: the response id and usage it carries, the unknown
    /// frame it may be, the run's start. Answers whether the chunk goes on.
    fn chunk_head(&mut self, head: ChunkHead<'_>, frame: Frame<'_>, out: &mut Emitter) -> bool {
        if let Some(id) = head.response_id {
            if self.response_id.as_deref() != Some(id) {
                self.response_id = Some(id.to_owned());
            }
        }
        if let Some(usage) = head.usage {
            self.usage.clear();
            self.usage.push_str(usage);
            self.has_usage = true;
            out.saw_usage();
        }
        if !head.known {
            out.unknown_frame(frame.event.unwrap_or("frame"), frame.data);
            return false;
        }
        // A well-formed chunk is accounted for even when it only feeds state (usage, an
        // empty delta): its content surfaces on later events.
        out.consumed();
        self.start(head.model_version, out);
        true
    }

    fn start(&mut self, model: Option<&str>, out: &mut Emitter) {
        if self.started {
            return;
        }
        self.started = true;
        out.emit(Lifecycle {
            provider: Some("gemini".to_owned()),
            model: model.map(str::to_owned),
            id: self.response_id.clone(),
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    /// `modelStatus`, once a run: the operator's warning that the model is deprecated or
    /// will be retired, verbatim (stage, retirement time, message).
    fn model_status(&mut self, status: Option<&RawValue>, out: &mut Emitter) {
        let Some(status) = status else { return };
        if self.model_status_reported {
            return;
        }
        self.model_status_reported = true;
        out.diagnostic("model_status", Some(Json::from_raw(status)));
    }

    fn candidate(&mut self, mut candidate: Candidate<'_>, out: &mut Emitter) {
        let Some(cand_index) = first_candidate(candidate.index, out) else {
            return;
        };
        let parts = candidate.content.take().and_then(|c| c.parts);
        for part in parts.into_iter().flatten() {
            self.part(part, cand_index, out);
        }
        if let Some(ratings) = candidate.safety_ratings {
            self.safety_ratings = Some(Json::from_raw(ratings));
        }
        self.candidate_metadata(&candidate, out);
        if let Some(reason) = candidate.finish_reason.as_deref() {
            self.finish(reason, candidate.finish_message.as_deref(), out);
        }
    }

    /// Candidate metadata with no grammar home: citations, grounding (search queries,
    /// sources, supports) and URL-context retrievals go out verbatim at the chunk that
    /// carries them; log probabilities are only named, once a run (they repeat per chunk
    /// and are debug data, spec §6).
    fn candidate_metadata(&mut self, candidate: &Candidate<'_>, out: &mut Emitter) {
        let verbatim = [
            ("citation_metadata", candidate.citation_metadata),
            ("grounding_metadata", candidate.grounding_metadata),
            ("url_context_metadata", candidate.url_context_metadata),
        ];
        for (code, raw) in verbatim {
            if let Some(raw) = raw {
                out.diagnostic(code, Some(Json::from_raw(raw)));
            }
        }
        if candidate.logprobs_result.is_some() && !self.logprobs_reported {
            self.logprobs_reported = true;
            let detail = serde_json::json!({ "field": "logprobsResult" });
            out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
        }
    }

    /// What [`F5Adapter::candidate`] does with a candidate of text and thought parts only.
    fn text_candidate(&mut self, candidate: TextCandidate<'_>, out: &mut Emitter) {
        if first_candidate(candidate.index, out).is_none() {
            return;
        }
        for part in candidate.content.flatten().into_iter().flatten() {
            let signature = part.thought_signature.as_deref();
            self.text_part(part.text, part.thought, signature, None, out);
        }
        if let Some(reason) = candidate.finish_reason.as_deref() {
            self.finish(reason, None, out);
        }
    }

    fn part(&mut self, part: Part<'_>, cand_index: u64, out: &mut Emitter) {
        if let Some(call) = part.function_call {
            self.function_call(call, part.thought_signature.as_deref(), cand_index, out);
            return;
        }
        let unsupported = part.unsupported();
        let signature = part.thought_signature.as_deref();
        self.text_part(part.text, part.thought, signature, unsupported, out);
    }

    /// A part that is no function call: text or a thought, a signature, or a part type
    /// with no mapping (`unsupported`).
    fn text_part(
        &mut self,
        text: Option<Cow<'_, str>>,
        thought: Option<bool>,
        signature: Option<&str>,
        unsupported: Option<(&'static str, &RawValue)>,
        out: &mut Emitter,
    ) {
        // Anything else ends a call whose arguments were still streaming.
        self.finish_streamed_call(None, out);
        if let Some(sig) = signature {
            // Signatures may also ride on text parts (newer models): opaque either way.
            out.transcript(SIGNATURE_KIND, None, sig);
        }
        if let Some((name, raw)) = unsupported {
            self.interrupt_text(out);
            out.diagnostic("unsupported_frame", Some(unsupported_part(name, raw)));
            return;
        }
        let Some(text) = text else {
            if signature.is_none() {
                self.interrupt_text(out);
                out.diagnostic("unknown_part", None);
            }
            return;
        };
        if text.is_empty() {
            // Empty deltas carry nothing (I9); the frame is accounted by its usage/consume.
            return;
        }
        if thought == Some(true) {
            // Thought parts are summaries (`includeThoughts`), not raw CoT (spec §6 F5).
            self.segments
                .think(out, ThinkingVariant::Summary, text.into_owned());
            return;
        }
        self.close_thinking(out);
        self.segments.say(out, text.into_owned());
    }

    /// A non-text part (code, media, a tool's call or result, an unknown part) stands
    /// between the text before and after it, as a `functionCall` does: the open thinking
    /// segment closes and the next text starts a new segment, so only text after it can
    /// become the final answer (§3.5 "last text segment"), never both sides glued.
    fn interrupt_text(&mut self, out: &mut Emitter) {
        self.close_thinking(out);
        self.segments.break_text();
    }

    /// A `functionCall` part: a whole call, the first part of a streamed one, or the next
    /// part of the call whose arguments are streaming.
    fn function_call(
        &mut self,
        call: FunctionCall<'_>,
        signature: Option<&str>,
        cand_index: u64,
        out: &mut Emitter,
    ) {
        let more = call.will_continue == Some(true);
        if self.streaming.is_some() {
            let other = call
                .name
                .as_deref()
                .is_some_and(|n| self.calls.last_name().is_some_and(|last| last != n));
            if !other {
                self.continue_call(call, more, out);
                return;
            }
            // A call under another name: the streamed one lost its last part.
            self.finish_streamed_call(None, out);
        }
        self.interrupt_text(out);
        let index = self.call_count;
        self.call_count += 1;
        // Gemini gives no call id: `responseId:candidate:call-ordinal` (the golden's
        // shape), unless the provider supplies one.
        let id = match call.id {
            Some(ref id) => Some(id.clone().into_owned()),
            None => self
                .response_id
                .as_ref()
                .map(|r| format!("{r}:{cand_index}:{index}")),
        };
        if let Some(sig) = signature {
            out.transcript(SIGNATURE_KIND, id.as_deref(), sig);
        }
        let name = call.name.clone().map(Cow::into_owned);
        if !more && call.partial_args.is_none() {
            let args = call.args.map(Json::from_raw);
            self.calls.start(out, id, index, name, args);
            return;
        }
        // A streamed call: its row opens now, with the name; the arguments follow.
        self.calls.start(out, id, index, name, None);
        self.streaming = Some(StreamedArgs::default());
        self.continue_call(call, more, out);
    }

    /// Adds a streamed call's part: its partial arguments (or whole `args`), a late name;
    /// the part without `willContinue` finishes the call.
    fn continue_call(&mut self, call: FunctionCall<'_>, more: bool, out: &mut Emitter) {
        let Some(args) = self.streaming.as_mut() else {
            return;
        };
        if let Some(whole) = call.args {
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(whole.get()) {
                args.replace(map);
            }
        }
        let mut bad = Vec::new();
        for piece in call.partial_args.iter().flatten() {
            if let Err(path) = args.apply(piece) {
                bad.push(path);
            }
        }
        if !bad.is_empty() {
            let detail = serde_json::json!({ "json_paths": bad });
            out.diagnostic("malformed_partial_arg", Some(Json::from_value(&detail)));
        }
        // A name on a later part is news only when the first part had none.
        let name = call
            .name
            .map(Cow::into_owned)
            .filter(|n| self.calls.last_name() != Some(n.as_str()));
        if !more {
            self.finish_streamed_call(name, out);
            return;
        }
        let input = args.snapshot(SNAPSHOT_LIMIT);
        // (A part that changes nothing is accounted by its chunk.)
        if name.is_some() || input.is_some() {
            self.calls.update_last(out, name, input);
        }
    }

    /// Ends the streaming of the open call's arguments (if any): its finished arguments
    /// (and a `name` its last part brought) go out on an `item/update`; the item ends
    /// when the turn settles, as whole calls do.
    fn finish_streamed_call(&mut self, name: Option<String>, out: &mut Emitter) {
        let Some(args) = self.streaming.take() else {
            return;
        };
        let input = args.finished();
        if name.is_some() || input.is_some() {
            self.calls.update_last(out, name, input);
        }
    }

    /// Gives the last thinking segment, closed before usage had a thought count, its
    /// count once one arrives: a tokens-only update (spec §3.2 back-fill).
    fn backfill_thought_tokens(&mut self, out: &mut Emitter) {
        if self.segments.thinking_open() {
            return;
        }
        let Some((variant, before)) = self.unreported_thinking else {
            return;
        };
        let Some(total) = self.thought_total() else {
            return;
        };
        self.unreported_thinking = None;
        self.thought_tokens_reported = total.max(before);
        out.emit(Thinking::tokens_update(
            variant,
            None,
            total.saturating_sub(before),
        ));
    }

    /// Closes the open thinking segment; its `tokens` come from the cumulative
    /// `thoughtsTokenCount`, already current because usage rides on the same chunk.
    fn close_thinking(&mut self, out: &mut Emitter) {
        if !self.segments.thinking_open() {
            return;
        }
        let before = self.thought_tokens_reported;
        let tokens = self.thought_total().map(|total| {
            // Cumulative count: a later segment reports only what it added.
            let added = total.saturating_sub(before);
            self.thought_tokens_reported = total.max(before);
            added
        });
        self.unreported_thinking = match tokens {
            None => self.segments.thinking_variant().map(|v| (v, before)),
            Some(_) => None,
        };
        self.segments.end_thinking(out, tokens);
    }

    fn thought_total(&self) -> Option<u64> {
        if !self.has_usage {
            return None;
        }
        match text_chunk::thought_count(&self.usage) {
            Some(count) => count,
            None => serde_json::from_str::<ThoughtCount>(&self.usage)
                .ok()
                .and_then(|c| c.thoughts_token_count),
        }
    }

    fn end_calls(&mut self, out: &mut Emitter, status: &str) {
        self.calls.end_all(out, status);
    }

    /// `finishReason` dispatch (spec §6 F5 row, §3.5).
    fn finish(&mut self, reason: &str, message: Option<&str>, out: &mut Emitter) {
        let path = match reason {
            "STOP" if !self.calls.is_empty() => Path::Yield,
            "STOP" => Path::Finalize(StopReason::Completed),
            "MAX_TOKENS" => Path::Truncate,
            // SAFETY and RECITATION per the spec; the other content-blocking reasons of
            // the API reference take the same Reject path.
            "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "IMAGE_SAFETY"
            | "IMAGE_PROHIBITED_CONTENT"
            | "IMAGE_RECITATION" => Path::Reject(StopReason::ContentFilter),
            // The model's tool use failed (a bad call, a call to no declared tool, too
            // many calls): the turn ends without an answer and its calls fail.
            "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" | "TOO_MANY_TOOL_CALLS" => {
                Path::Incomplete(Some(StopReason::Other("tool_error".to_owned())))
            }
            // OTHER and anything unknown: conservative, no final answer.
            _ => Path::Incomplete(Some(StopReason::Other("unknown".to_owned()))),
        };
        // STOP and MAX_TOKENS are fully described by the normalized reason; the others
        // lose the provider's word, so it is kept as a diagnostic.
        let lossy = !matches!(reason, "STOP" | "MAX_TOKENS");
        let reason_diag = || Diagnostic::new("finish_reason", Some(Json::string(reason)));
        let (extra, diag) = match message {
            Some(m) => (
                lossy.then(reason_diag),
                Some(Diagnostic::new("finish_message", Some(Json::string(m)))),
            ),
            None => (None, lossy.then(reason_diag)),
        };
        self.terminate(out, path, extra, diag);
    }

    /// Emits the terminal sequence: thinking end, item ends, final answer (Finalize and
    /// Truncate only, and only with text), `extra` and safety-rating diagnostics, then the
    /// one terminal lifecycle event carrying `diag`.
    fn terminate(
        &mut self,
        out: &mut Emitter,
        path: Path,
        extra: Option<Diagnostic>,
        diag: Option<Diagnostic>,
    ) {
        self.backfill_thought_tokens(out);
        self.close_thinking(out);
        self.finish_streamed_call(None, out);
        self.calls.settle(&mut self.segments, &path, out);
        if let Some(extra) = extra {
            out.emit(Lifecycle {
                diagnostic: Some(extra),
                ..Lifecycle::new(LifecyclePhase::Update)
            });
        }
        if let Some(ratings) = self.safety_ratings.take() {
            out.diagnostic("safety_ratings", Some(ratings));
        }
        let usage = if self.has_usage {
            Json::parse(&self.usage)
        } else {
            None
        };
        path.emit(usage, diag, out);
        self.ended = true;
    }
}

/// The `unsupported_frame` detail of a part: its name and its body, with inline media
/// bytes replaced by their size ([`inline_bytes`]).
fn unsupported_part(name: &str, raw: &RawValue) -> Json {
    let mut data = serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null);
    inline_bytes::elide(&mut data);
    Json::from_value(&serde_json::json!({ "part": name, "data": data }))
}

#[cfg(test)]
mod tests;

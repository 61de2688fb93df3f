//! Gemini `streamGenerateContent?alt=sse` (F5; spec §6 F5 table, evidence
//! `gemini-genai-sse.md`).
//!
//! Every SSE frame is one whole `GenerateContentResponse`: `candidates[].content.parts[]`
//! carry text deltas (`thought:true` marks thought *summaries*), `functionCall` parts carry
//! complete calls (with the opaque `thoughtSignature` beside them), `finishReason` on the
//! candidate ends the turn, and `usageMetadata` is a cumulative snapshot on every chunk.
//! There is no `[DONE]`: the terminal frame is the one with a `finishReason`.

use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::finality::{stream_closed, Path};
use crate::families::segments::TurnSegments;
use crate::framing::Frame;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Diagnostic, Json, Lifecycle, LifecyclePhase, StopReason, ThinkingVariant,
};

/// Transcript kind for `thoughtSignature` (opaque continuation state, spec §2).
const SIGNATURE_KIND: &str = "gemini_thought_signature";

/// One SSE data frame.
#[derive(Deserialize)]
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
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback<'a> {
    #[serde(borrow)]
    block_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
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
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow)]
    parts: Option<Vec<Part<'a>>>,
}

#[derive(Deserialize)]
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
}

impl Part<'_> {
    fn unsupported(&self) -> Option<(&'static str, &RawValue)> {
        [
            ("inlineData", self.inline_data),
            ("fileData", self.file_data),
            ("executableCode", self.executable_code),
            ("codeExecutionResult", self.code_execution_result),
            ("functionResponse", self.function_response),
        ]
        .into_iter()
        .find_map(|(name, raw)| raw.map(|r| (name, r)))
    }
}

#[derive(Deserialize)]
struct FunctionCall<'a> {
    /// Newer API versions may carry a provider call id; used when present.
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    args: Option<&'a RawValue>,
}

/// The one usage field the adapter reads (for the thinking `tokens` rule, spec §3.2).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThoughtCount {
    thoughts_token_count: Option<u64>,
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
    segments: TurnSegments,
    calls: crate::families::whole_calls::WholeCalls,
    /// Function calls announced this turn (the `index` of the next one).
    call_count: u64,
    /// Latest `safetyRatings`, reported once at the end of the turn.
    safety_ratings: Option<Json>,
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
        self.end_calls(out, "failed");
        stream_closed(out);
        self.ended = true;
    }
}

impl F5Adapter {
    fn chunk(&mut self, chunk: Chunk<'_>, frame: Frame<'_>, out: &mut Emitter) {
        if let Some(id) = &chunk.response_id {
            if self.response_id.as_deref() != Some(id) {
                self.response_id = Some(id.clone().into_owned());
            }
        }
        if let Some(usage) = chunk.usage_metadata {
            self.usage.clear();
            self.usage.push_str(usage.get());
            self.has_usage = true;
            out.saw_usage();
        }
        let known = chunk.candidates.is_some()
            || chunk.error.is_some()
            || chunk.prompt_feedback.is_some()
            || chunk.usage_metadata.is_some();
        if !known {
            out.unknown_frame(frame.event.unwrap_or("frame"), frame.data);
            return;
        }
        // A well-formed chunk is accounted for even when it only feeds state (usage, an
        // empty delta): its content surfaces on later events.
        out.consumed();
        self.start(chunk.model_version.as_deref(), out);

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

    fn candidate(&mut self, candidate: Candidate<'_>, out: &mut Emitter) {
        let cand_index = candidate.index.unwrap_or(0);
        if cand_index != 0 {
            // `n > 1` candidates would interleave several replies into one turn; only the
            // first candidate is normalized.
            let detail = serde_json::json!({ "candidate_index": cand_index });
            out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
            return;
        }
        let parts = candidate.content.and_then(|c| c.parts).unwrap_or_default();
        for part in parts {
            self.part(part, cand_index, out);
        }
        if let Some(ratings) = candidate.safety_ratings {
            self.safety_ratings = Some(Json::from_raw(ratings));
        }
        if let Some(citations) = candidate.citation_metadata {
            out.diagnostic("citation_metadata", Some(Json::from_raw(citations)));
        }
        if let Some(reason) = candidate.finish_reason.as_deref() {
            self.finish(reason, candidate.finish_message.as_deref(), out);
        }
    }

    fn part(&mut self, part: Part<'_>, cand_index: u64, out: &mut Emitter) {
        if let Some(call) = part.function_call {
            self.close_thinking(out);
            self.segments.break_text();
            let index = self.call_count;
            self.call_count += 1;
            // Gemini gives no call id: `responseId:candidate:call-ordinal` (the golden's
            // shape), unless the provider supplies one.
            let id = match call.id {
                Some(id) => Some(id.into_owned()),
                None => self
                    .response_id
                    .as_ref()
                    .map(|r| format!("{r}:{cand_index}:{index}")),
            };
            if let Some(sig) = part.thought_signature.as_deref() {
                out.transcript(SIGNATURE_KIND, id.as_deref(), sig);
            }
            let args = call.args.map(Json::from_raw);
            let name = call.name.map(Cow::into_owned);
            self.calls.start(out, id, index, name, args);
            return;
        }
        if let Some(sig) = part.thought_signature.as_deref() {
            // Signatures may also ride on text parts (newer models): opaque either way.
            out.transcript(SIGNATURE_KIND, None, sig);
        }
        if let Some((name, raw)) = part.unsupported() {
            let detail = serde_json::json!({ "part": name, "data": raw });
            out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
            return;
        }
        let Some(text) = part.text else {
            if part.thought_signature.is_none() {
                out.diagnostic("unknown_part", None);
            }
            return;
        };
        if text.is_empty() {
            // Empty deltas carry nothing (I9); the frame is accounted by its usage/consume.
            return;
        }
        if part.thought == Some(true) {
            // Thought parts are summaries (`includeThoughts`), not raw CoT (spec §6 F5).
            self.segments
                .think(out, ThinkingVariant::Summary, text.into_owned());
            return;
        }
        self.close_thinking(out);
        self.segments.say(out, text.into_owned());
    }

    /// Closes the open thinking segment; its `tokens` come from the cumulative
    /// `thoughtsTokenCount`, already current because usage rides on the same chunk.
    fn close_thinking(&mut self, out: &mut Emitter) {
        if !self.segments.thinking_open() {
            return;
        }
        let tokens = self.thought_total().map(|total| {
            // Cumulative count: a later segment reports only what it added.
            let added = total.saturating_sub(self.thought_tokens_reported);
            self.thought_tokens_reported = total;
            added
        });
        self.segments.end_thinking(out, tokens);
    }

    fn thought_total(&self) -> Option<u64> {
        if !self.has_usage {
            return None;
        }
        serde_json::from_str::<ThoughtCount>(&self.usage)
            .ok()
            .and_then(|c| c.thoughts_token_count)
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
            "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII"
            | "IMAGE_SAFETY" => Path::Reject(StopReason::ContentFilter),
            "MALFORMED_FUNCTION_CALL" => {
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
        self.close_thinking(out);
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

#[cfg(test)]
mod tests {
    use crate::adapter::Family;
    use crate::normalizer::{normalize_bytes, Normalized};
    use proptest::prelude::*;
    use streamgate_grammar::{check, EventData, SegmentPhase};

    fn run(frames: &[&str]) -> Normalized {
        let mut bytes = String::new();
        for f in frames {
            bytes.push_str("data: ");
            bytes.push_str(f);
            bytes.push_str("\r\n\r\n");
        }
        normalize_bytes(Family::F5.into(), bytes.as_bytes(), 0)
    }

    fn lines(n: &Normalized) -> Vec<String> {
        n.events.iter().map(|e| e.to_json()).collect()
    }

    #[test]
    fn later_thinking_segments_report_only_their_own_tokens() {
        let n = run(&[
            r#"{"candidates":[{"content":{"parts":[{"text":"a","thought":true}]}}],"usageMetadata":{"thoughtsTokenCount":10}}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":"x"}]}}],"usageMetadata":{"thoughtsTokenCount":10}}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":"b","thought":true}]}}],"usageMetadata":{"thoughtsTokenCount":14}}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":"y"}]},"finishReason":"STOP"}],"usageMetadata":{"thoughtsTokenCount":14}}"#,
        ]);
        let tokens: Vec<Option<u64>> = n
            .events
            .iter()
            .filter_map(|e| match &e.data {
                EventData::Thinking(t) if t.phase == Some(SegmentPhase::End) => Some(t.tokens),
                _ => None,
            })
            .collect();
        assert_eq!(tokens, vec![Some(10), Some(4)]);
        // The final answer is the last text segment only (spec §3.5 re-tag).
        let all = lines(&n).join("\n");
        assert!(
            all.contains(r#""phase":"final_answer","text":"y""#),
            "{all}"
        );
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    #[test]
    fn calls_in_separate_chunks_get_distinct_ids_and_signatures_stay_off_the_bus() {
        let n = run(&[
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"a","args":{}},"thoughtSignature":"U0lHTkFUVVJFLUFBQUFBQUFB"}]}}],"responseId":"R"}"#,
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"b","args":{"k":1}}}]},"finishReason":"STOP"}],"responseId":"R"}"#,
        ]);
        let all = lines(&n).join("\n");
        assert!(all.contains(r#""id":"R:0:0","index":0"#), "{all}");
        assert!(all.contains(r#""id":"R:0:1","index":1"#), "{all}");
        assert!(!all.contains("U0lHTkFUVVJF"));
        assert_eq!(n.transcript.len(), 1);
        assert_eq!(n.transcript[0].segment.as_deref(), Some("R:0:0"));
        assert!(all.contains(r#""reason":"tool_use""#));
        assert!(!all.contains("final_answer"));
    }

    #[test]
    fn frames_after_the_terminal_one_are_dropped_but_accounted() {
        let n = run(&[
            r#"{"candidates":[{"content":{"parts":[{"text":"hi"}]},"finishReason":"STOP"}]}"#,
            r#"{"candidates":[{"content":{"parts":[{"text":"late"}]}}]}"#,
            "not json",
        ]);
        assert!(!lines(&n).join("\n").contains("late"));
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    #[test]
    fn chunking_does_not_change_the_events() {
        let capture = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"t\\u00e9\",\"thought\": true}]}}],\"usageMetadata\": {\"thoughtsTokenCount\": 3},\"responseId\": \"r\"}\r\n\r\ndata: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\u{1F600} ok\"}]},\"finishReason\": \"STOP\"}]}\r\n\r\n";
        let whole = normalize_bytes(Family::F5.into(), capture.as_bytes(), 0);
        for step in [1, 2, 3, 7] {
            let parts = normalize_bytes(Family::F5.into(), capture.as_bytes(), step);
            assert_eq!(lines(&parts), lines(&whole), "chunk size {step}");
        }
    }

    #[test]
    fn unknown_shapes_are_diagnosed_not_dropped() {
        let n = run(&[
            r#"{"hello":1}"#,
            r#"[1,2]"#,
            r#"{"candidates":[{"content":{"parts":[{}]}}]}"#,
        ]);
        let all = lines(&n).join("\n");
        assert!(all.contains("unknown_frame"));
        assert!(all.contains("malformed_frame"));
        assert!(all.contains("unknown_part"));
        assert!(all.contains("stream_closed"));
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_break_the_invariants(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let n = normalize_bytes(Family::F5.into(), &bytes, 0);
            prop_assert!(check(&n.events, &[], Some(n.account)).is_empty());
        }

        #[test]
        fn arbitrary_gemini_like_frames_keep_the_invariants(
            frames in proptest::collection::vec(
                prop_oneof![
                    Just(r#"{"candidates":[{"content":{"parts":[{"text":"a","thought":true}]}}],"usageMetadata":{"thoughtsTokenCount":2}}"#),
                    Just(r#"{"candidates":[{"content":{"parts":[{"text":"b"}]}}]}"#),
                    Just(r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}]}}],"responseId":"r"}"#),
                    Just(r#"{"candidates":[{"finishReason":"STOP"}]}"#),
                    Just(r#"{"candidates":[{"finishReason":"MAX_TOKENS"}]}"#),
                    Just(r#"{"candidates":[{"finishReason":"SAFETY","safetyRatings":[]}]}"#),
                    Just(r#"{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL"}]}"#),
                    Just(r#"{"candidates":[{"finishReason":"OTHER","finishMessage":"m"}]}"#),
                    Just(r#"{"error":{"code":500}}"#),
                    Just(r#"{"candidates":[{"content":{"parts":[{"te"#),
                ],
                0..8,
            )
        ) {
            let n = run(&frames);
            prop_assert!(check(&n.events, &[], Some(n.account)).is_empty(), "{:?}", lines(&n));
        }
    }
}

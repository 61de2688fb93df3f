//! ollama native `/api/chat` JSONL (evidence `openai-families.md` §C live ollama
//! re-exposure addendum; the Harmony `analysis` channel surfaces as `message.thinking`).
//!
//! One JSON object per line: `{model, created_at, message:{role, content, thinking?,
//! tool_calls?}, done}`; the last one has `done:true`, `done_reason` and the perf/usage
//! counters. Tool-call `arguments` arrive as a parsed JSON **object** (not a string like
//! Chat Completions) and are passed through verbatim. A failing request streams
//! `{"error":"…"}`. Reply `images` and top-level `logprobs` have no grammar home: they are
//! named in `unsupported_frame` diagnostics (never their bytes or values).

use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::finality::{stream_closed, Path};
use crate::families::segments::TurnSegments;
use crate::framing::Frame;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Diagnostic, Json, Lifecycle, LifecyclePhase, StopReason, ThinkingVariant,
};

/// One JSONL frame.
#[derive(Debug, Default, Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    message: Option<Message<'a>>,
    done: Option<bool>,
    #[serde(borrow)]
    done_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    total_duration: Option<&'a RawValue>,
    #[serde(borrow)]
    load_duration: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_eval_count: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_eval_duration: Option<&'a RawValue>,
    #[serde(borrow)]
    eval_count: Option<&'a RawValue>,
    #[serde(borrow)]
    eval_duration: Option<&'a RawValue>,
    /// Per-token log probabilities (request `logprobs`); only their presence is read.
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
}

impl<'a> Chunk<'a> {
    /// The final frame's counters, in wire order, as the usage object (with `done_reason`,
    /// as the goldens carry it).
    fn usage(&self) -> Option<Json> {
        let fields: [(&str, Option<&'a RawValue>); 7] = [
            ("done_reason", self.done_reason),
            ("total_duration", self.total_duration),
            ("load_duration", self.load_duration),
            ("prompt_eval_count", self.prompt_eval_count),
            ("prompt_eval_duration", self.prompt_eval_duration),
            ("eval_count", self.eval_count),
            ("eval_duration", self.eval_duration),
        ];
        let mut text = String::with_capacity(192);
        text.push('{');
        for (key, raw) in fields {
            let Some(raw) = raw else { continue };
            if text.len() > 1 {
                text.push(',');
            }
            text.push('"');
            text.push_str(key);
            text.push_str("\":");
            text.push_str(raw.get());
        }
        if text.len() == 1 {
            return None;
        }
        text.push('}');
        Json::parse(&text)
    }
}

#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
    /// Base64 images (image-generating models); only counted, the bytes are never read.
    #[serde(borrow)]
    images: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<Function<'a>>,
}

#[derive(Debug, Deserialize)]
struct Function<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// The line nearly every long run is made of — a content or thinking piece as ollama
/// writes it — read by its exact template ([`exact_frame`]) into the chunk the generic
/// reading makes of it; `None` for any other line, which is then read the generic way
/// (docs/performance.md has the measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
fn hot_chunk(data: &str) -> Option<Chunk<'_>> {
    let mut c = Cursor::new(data);
    c.literal(r#"{"model":"#)?;
    let model = c.string()?;
    c.literal(r#","created_at":"#)?;
    c.string()?;
    c.literal(r#","message":{"role":"assistant","content":"#)?;
    let content = c.string()?;
    let thinking = match c.literal(r#","thinking":"#) {
        Some(()) => Some(c.string()?),
        None => None,
    };
    c.literal(r#"},"done":false}"#)?;
    c.whitespace();
    c.end()?;
    Some(Chunk {
        model: Some(model),
        message: Some(Message {
            content: Some(content),
            thinking,
            tool_calls: None,
            images: None,
        }),
        done: Some(false),
        ..Chunk::default()
    })
}

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct OllamaNativeAdapter {
    started: bool,
    /// The terminal lifecycle event went out; later frames are dropped.
    ended: bool,
    segments: TurnSegments,
    calls: crate::families::whole_calls::WholeCalls,
    /// `logprobs` was reported (they ride on every line; once a run says enough).
    logprobs_reported: bool,
}

impl Adapter for OllamaNativeAdapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.ended {
            // The turn is over (its terminal event must stay last): documented drop.
            out.consumed();
            return;
        }
        let read =
            hot_chunk(frame.data).map_or_else(|| serde_json::from_str(frame.data.trim()), Ok);
        let chunk: Chunk<'_> = match read {
            Ok(c) => c,
            Err(_) => {
                out.malformed_frame(frame.data);
                return;
            }
        };
        if chunk.message.is_none() && chunk.done.is_none() && chunk.error.is_none() {
            out.unknown_frame(frame.event.unwrap_or("frame"), frame.data);
            return;
        }
        // A well-formed frame is accounted for even when it carries nothing new (empty
        // `content` while the model thinks, the bare `done` frame).
        out.consumed();
        self.start(chunk.model.as_deref(), out);
        if let Some(error) = chunk.error {
            self.close_thinking(out);
            self.end_calls(out, "failed");
            let diagnostic = Diagnostic::new("provider_error", Some(Json::from_raw(error)));
            Path::Dead(StopReason::Error).emit(None, Some(diagnostic), out);
            self.ended = true;
            return;
        }
        if let Some(message) = chunk.message.as_ref() {
            self.message(message, out);
        }
        self.logprobs(&chunk, out);
        if chunk.done == Some(true) {
            self.finish(&chunk, out);
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.ended {
            return;
        }
        // No `done:true` frame: stream death (spec §3.4); nothing becomes final.
        self.close_thinking(out);
        self.end_calls(out, "failed");
        stream_closed(out);
        self.ended = true;
    }
}

impl OllamaNativeAdapter {
    fn start(&mut self, model: Option<&str>, out: &mut Emitter) {
        if self.started {
            return;
        }
        self.started = true;
        out.emit(Lifecycle {
            provider: Some("ollama".to_owned()),
            model: model.map(str::to_owned),
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    fn message(&mut self, message: &Message<'_>, out: &mut Emitter) {
        if let Some(thinking) = message.thinking.as_deref().filter(|t| !t.is_empty()) {
            // Harmony `analysis`: raw chain-of-thought.
            self.segments
                .think(out, ThinkingVariant::Raw, thinking.to_owned());
        }
        if let Some(content) = message.content.as_deref().filter(|c| !c.is_empty()) {
            self.close_thinking(out);
            self.segments.say(out, content.to_owned());
        }
        if let Some(count) = message.images.map(entries).filter(|&n| n > 0) {
            // No grammar home for media (spec §6 Phase-1 scope): say how many arrived.
            let detail = serde_json::json!({ "field": "images", "count": count });
            out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
        }
        for call in message.tool_calls.iter().flatten() {
            self.close_thinking(out);
            self.segments.break_text();
            let function = call.function.as_ref();
            let index = function
                .and_then(|f| f.index)
                .unwrap_or(self.calls.len() as u64);
            // Object-form arguments stay an object (verbatim), never re-encoded as text.
            let args = function.and_then(|f| f.arguments).map(Json::from_raw);
            let id = call.id.as_deref().map(str::to_owned);
            let name = function.and_then(|f| f.name.as_deref()).map(str::to_owned);
            self.calls.start(out, id, index, name, args);
        }
    }

    /// Log probabilities are debug metadata with no event (spec §6): the first line that
    /// carries them is reported as `unsupported_frame` naming the field, once a run.
    fn logprobs(&mut self, chunk: &Chunk<'_>, out: &mut Emitter) {
        let present = chunk.logprobs.map(entries).is_some_and(|n| n > 0);
        if !present || self.logprobs_reported {
            return;
        }
        self.logprobs_reported = true;
        let detail = serde_json::json!({ "field": "logprobs" });
        out.diagnostic("unsupported_frame", Some(Json::from_value(&detail)));
    }

    fn close_thinking(&mut self, out: &mut Emitter) {
        // ollama reports no thinking-token count, so the marker carries no `tokens`.
        self.segments.end_thinking(out, None);
    }

    fn end_calls(&mut self, out: &mut Emitter, status: &str) {
        self.calls.end_all(out, status);
    }

    /// `done:true` dispatch on `done_reason` (spec §3.5, F2-style reasons).
    fn finish(&mut self, chunk: &Chunk<'_>, out: &mut Emitter) {
        let usage = chunk.usage();
        if usage.is_some() {
            out.saw_usage();
        }
        let reason: Option<Cow<'_, str>> = chunk
            .done_reason
            .and_then(|r| serde_json::from_str(r.get()).ok());
        self.close_thinking(out);
        let mut diagnostic = None;
        let path = match reason.as_deref() {
            // Older servers omit `done_reason`; `load`/`unload` answer model-management
            // requests and end cleanly with no text.
            None | Some("stop" | "load" | "unload") if !self.calls.is_empty() => Path::Yield,
            None | Some("stop" | "load" | "unload") => Path::Finalize(StopReason::Completed),
            Some("length") => Path::Truncate,
            Some(other) => {
                // Unknown reason: conservative end, no final answer, provider word kept.
                diagnostic = Some(Diagnostic::new("done_reason", Some(Json::string(other))));
                Path::Incomplete(Some(StopReason::Other("unknown".to_owned())))
            }
        };
        self.calls.settle(&mut self.segments, &path, out);
        path.emit(usage, diagnostic, out);
        self.ended = true;
    }
}

/// How many entries a documented array field holds, without reading them (an image's
/// bytes are never decoded). Another shape is still one thing that arrived: a server
/// that drifts from the array form must not turn a good line into a malformed one.
fn entries(raw: &RawValue) -> usize {
    serde_json::from_str::<Vec<IgnoredAny>>(raw.get()).map_or(1, |items| items.len())
}

#[cfg(test)]
mod tests {
    use crate::adapter::Family;
    use crate::normalizer::{normalize_bytes, Normalized};
    use proptest::prelude::*;
    use streamgate_grammar::check;

    fn run(frames: &[&str]) -> Normalized {
        let mut bytes = String::new();
        for f in frames {
            bytes.push_str(f);
            bytes.push('\n');
        }
        normalize_bytes(Family::OllamaNative.into(), bytes.as_bytes(), 0)
    }

    fn text(n: &Normalized) -> String {
        n.events
            .iter()
            .map(|e| e.to_json())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What the template reading and the generic reading make of `line`: `None` when the
    /// template leaves it to the generic reading, else both readings' `Debug` text.
    fn both_readings(line: &str) -> Option<(String, String)> {
        let hot = super::hot_chunk(line)?;
        let generic = serde_json::from_str::<super::Chunk<'_>>(line.trim()).expect(line);
        Some((format!("{hot:?}"), format!("{generic:?}")))
    }

    /// Content and thinking pieces read by their exact template become the chunk the
    /// generic reading makes of them; every other shape is left to it.
    #[test]
    fn pieces_read_by_template_are_read_as_serde_reads_them() {
        let piece = |message: &str| {
            format!(
                r#"{{"model":"gpt-oss:20b","created_at":"2026-06-12T03:55:04.898416Z","message":{{"role":"assistant",{message}}},"done":false}}"#
            )
        };
        for line in [
            piece(r#""content":"391""#),
            piece(r#""content":"","thinking":"The""#),
            piece(r#""content":"\"q\" \\ \n \ud83d\ude00","thinking":"""#),
            format!("{}\r", piece(r#""content":"a""#)),
        ] {
            let (hot, generic) = both_readings(&line).expect(&line);
            assert_eq!(hot, generic, "{line}");
        }
        for line in [
            piece(r#""content":null"#),
            piece(r#""content":"","thinking":null"#),
            piece(r#""content":"a","images":[]"#),
            piece(r#""content":"","tool_calls":[]"#),
            piece(r#""thinking":"a","content":"""#),
            r#"{"model":"m","created_at":"t","message":{"role":"user","content":"a"},"done":false}"#.into(),
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":true}"#.into(),
            r#"{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false,"logprobs":[]}"#.into(),
            r#" {"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false}"#.into(),
        ] {
            assert_eq!(both_readings(&line), None, "{line}");
        }
    }

    #[test]
    fn arguments_pass_through_verbatim_object_or_string() {
        let n = run(&[
            r#"{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"a","arguments":{"x":[1,{"y":null}]}}},{"function":{"name":"b","arguments":"{\"s\":1}"}}]},"done":false}"#,
            r#"{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}"#,
        ]);
        let all = text(&n);
        assert!(all.contains(r#""input":{"x":[1,{"y":null}]}"#), "{all}");
        assert!(all.contains(r#""arguments":{"x":[1,{"y":null}]}"#), "{all}");
        // A string stays a string: the adapter never re-encodes provider arguments.
        assert!(all.contains(r#""input":"{\"s\":1}""#), "{all}");
        // Without provider indexes the calls are numbered in arrival order.
        assert!(
            all.contains(r#""index":0,"kind":"tool","name":"a""#),
            "{all}"
        );
        assert!(
            all.contains(r#""index":1,"kind":"tool","name":"b""#),
            "{all}"
        );
        assert!(all.contains(r#""reason":"tool_use""#));
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    #[test]
    fn text_interrupted_by_thinking_finalizes_only_the_last_text() {
        let n = run(&[
            r#"{"message":{"content":"I'll look."},"done":false}"#,
            r#"{"message":{"content":"","thinking":"hmm"},"done":false}"#,
            r#"{"message":{"content":"Answer."},"done":true,"done_reason":"stop"}"#,
        ]);
        let all = text(&n);
        assert_eq!(
            all.matches(r#""variant":"raw","phase":"end""#).count(),
            1,
            "{all}"
        );
        assert!(
            all.contains(r#""phase":"final_answer","text":"Answer.""#),
            "{all}"
        );
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    #[test]
    fn frames_after_done_are_dropped_but_accounted() {
        let n = run(&[
            r#"{"message":{"content":"x"},"done":true,"done_reason":"stop"}"#,
            r#"{"message":{"content":"late"},"done":false}"#,
        ]);
        assert!(!text(&n).contains("late"));
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    #[test]
    fn images_are_counted_and_logprobs_named_once_never_carried() {
        let n = run(&[
            r#"{"message":{"content":"a"},"logprobs":[{"token":"a","logprob":-0.1}],"done":false}"#,
            r#"{"message":{"content":"","images":["QUJD","REVG"]},"logprobs":[{"token":"b","logprob":-0.2}],"done":false}"#,
            r#"{"message":{"content":"","images":[]},"done":true,"done_reason":"stop"}"#,
        ]);
        let all = text(&n);
        assert!(
            all.contains(r#""detail":{"field":"images","count":2}"#),
            "{all}"
        );
        assert_eq!(all.matches(r#""field":"images""#).count(), 1, "{all}");
        assert_eq!(all.matches(r#""field":"logprobs""#).count(), 1, "{all}");
        assert!(!all.contains("QUJD") && !all.contains("-0.1"), "{all}");
        assert!(check(&n.events, &[], Some(n.account)).is_empty());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_break_the_invariants(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let n = normalize_bytes(Family::OllamaNative.into(), &bytes, 0);
            prop_assert!(check(&n.events, &[], Some(n.account)).is_empty());
        }

        #[test]
        fn arbitrary_ollama_like_frames_keep_the_invariants(
            frames in proptest::collection::vec(
                prop_oneof![
                    Just(r#"{"message":{"content":"","thinking":"t"},"done":false}"#),
                    Just(r#"{"message":{"content":"c"},"done":false}"#),
                    Just(r#"{"message":{"tool_calls":[{"id":"i","function":{"name":"f","arguments":{}}}]},"done":false}"#),
                    Just(r#"{"message":{"content":""},"done":true,"done_reason":"stop","eval_count":3}"#),
                    Just(r#"{"message":{"content":""},"done":true,"done_reason":"length"}"#),
                    Just(r#"{"message":{"content":""},"done":true,"done_reason":"weird"}"#),
                    Just(r#"{"error":"boom"}"#),
                    Just(r#"{"message":{"content":"","images":["QUJD"]},"logprobs":[{"token":"x","logprob":-1}],"done":false}"#),
                    Just(r#"{"mess"#),
                ],
                0..8,
            )
        ) {
            let n = run(&frames);
            prop_assert!(check(&n.events, &[], Some(n.account)).is_empty(), "{}", text(&n));
        }
    }
}

//! Unit tests for the F2 state machine's tricky rules (the fixtures run in
//! `tests/golden.rs`).

use crate::adapter::{Close, Family};
use crate::normalizer::{normalize_bytes, Normalizer};
use streamgate_grammar::Event;

fn run(capture: &str) -> (Vec<String>, Vec<&'static str>) {
    let n = normalize_bytes(Family::F2.into(), capture.as_bytes(), 0);
    let events = n.events.iter().map(Event::to_json).collect();
    let kinds = n.transcript.iter().map(|t| t.kind).collect();
    (events, kinds)
}

fn sse(chunks: &[&str]) -> String {
    chunks.iter().map(|c| format!("data: {c}\n\n")).collect()
}

#[test]
fn usage_in_the_finish_chunk_does_not_backfill_tokens() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"reasoning_content":"r"}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}],"usage":{"completion_tokens_details":{"reasoning_tokens":5}}}"#,
        "[DONE]",
    ]));
    assert!(
        ev[3].contains(r#""phase":"end""#) && !ev[3].contains("tokens"),
        "{ev:?}"
    );
}

#[test]
fn later_usage_follows_the_marker_as_one_tokens_update() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"reasoning":"r"}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}"#,
        r#"{"choices":[],"usage":{"output_tokens_details":{"reasoning_tokens":5}}}"#,
    ]));
    // The marker and the final answer go out with the finish chunk, not with the usage.
    assert!(
        ev[3].contains(r#""phase":"end""#) && !ev[3].contains("tokens"),
        "{ev:?}"
    );
    assert!(ev[4].contains("final_answer"), "{ev:?}");
    assert_eq!(
        ev[5],
        r#"{"seq":6,"stream":"thinking","data":{"variant":"raw","tokens":5}}"#
    );
    assert!(ev[6].contains(r#""phase":"end""#), "{ev:?}");
}

#[test]
fn flat_lane_is_ignored_once_structured_lane_appears() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"reasoning":"x","reasoning_details":[{"type":"reasoning.text","text":"x","index":0}]}}]}"#,
        r#"{"choices":[{"delta":{"reasoning":"dup"}}]}"#,
        r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
    ]));
    assert!(!ev.iter().any(|e| e.contains("dup")), "{ev:?}");
    assert_eq!(
        ev.iter()
            .filter(|e| e.contains(r#""phase":"start""#))
            .count(),
        1
    );
}

#[test]
fn reasoning_probe_order_prefers_reasoning_content() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"reasoning_content":"A","reasoning":"B","reasoning_text":"C"}}]}"#,
        r#"{"choices":[{"delta":{"reasoning_text":"D"},"finish_reason":"stop"}]}"#,
    ]));
    assert!(ev[1].contains(r#""delta":"A""#), "{ev:?}");
    assert!(ev[2].contains(r#""delta":"D""#), "{ev:?}");
    assert!(!ev.iter().any(|e| e.contains(r#""delta":"B""#)));
}

#[test]
fn signature_only_segment_is_a_redacted_marker() {
    let (ev, kinds) = run(&sse(&[
        r#"{"choices":[{"delta":{"reasoning_details":[{"type":"reasoning.text","signature":"S1GNATURE-abcdefghijklmnop","format":"f","index":0}]}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}"#,
    ]));
    assert_eq!(kinds, ["openrouter_reasoning_signature"]);
    assert!(
        ev[1].contains(r#""variant":"redacted","phase":"start""#),
        "{ev:?}"
    );
    assert!(
        ev[2].contains(r#""variant":"redacted","phase":"end""#),
        "{ev:?}"
    );
    assert!(!ev.iter().any(|e| e.contains("S1GNATURE")));
}

#[test]
fn empty_and_null_content_never_emit() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":null}}]}"#,
        r#"{"choices":[{"delta":{"content":""}}]}"#,
        r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        "[DONE]",
    ]));
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].contains(r#""phase":"end""#));
}

#[test]
fn content_parts_are_split_into_text_and_thinking() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":[{"type":"thinking","text":"t"},{"type":"text","text":"a"},42]}}]}"#,
        r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
    ]));
    assert!(ev[1].contains(r#""variant":"raw","delta":"t""#), "{ev:?}");
    assert!(
        ev[2].contains(r#""phase":"commentary","delta":"a""#),
        "{ev:?}"
    );
}

#[test]
fn object_form_arguments_are_kept_as_json() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":{"k":1}}}]},"finish_reason":"tool_calls"}]}"#,
    ]));
    assert!(ev[2].contains(r#""arguments":{"k":1}"#), "{ev:?}");
}

#[test]
fn unknown_finish_reason_ends_incomplete_without_final_answer() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"weird"}]}"#,
    ]));
    assert!(!ev.iter().any(|e| e.contains("final_answer")));
    assert!(ev
        .last()
        .unwrap()
        .contains(r#""reason":"incomplete","status":"incomplete""#));
}

#[test]
fn done_without_finish_is_stream_closed() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":"a"}}]}"#,
        "[DONE]",
    ]));
    assert!(ev.last().unwrap().contains("stream_closed"), "{ev:?}");
    assert!(!ev.iter().any(|e| e.contains("final_answer")));
}

#[test]
fn frames_after_the_terminal_event_are_silent() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}"#,
        "[DONE]",
        r#"{"x_pioneer":{"a":1},"choices":[{"delta":{"content":"late"}}]}"#,
    ]));
    assert!(ev.last().unwrap().contains(r#""phase":"end""#), "{ev:?}");
    assert!(!ev
        .iter()
        .any(|e| e.contains("late") || e.contains("pioneer")));
}

#[test]
fn final_answer_is_live_at_done_before_close() {
    let mut n = Normalizer::new(Family::F2.into());
    n.feed(
        sse(&[
            r#"{"choices":[{"delta":{"reasoning":"r","content":"a"},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
        .as_bytes(),
    );
    let ev: Vec<String> = n.drain().map(|e| e.to_json()).collect();
    assert!(
        ev.last().is_some_and(|e| e.contains(r#""phase":"end""#)),
        "{ev:?}"
    );
    n.close(Close::Normal);
    assert_eq!(n.drain().count(), 0);
}

#[test]
fn garbage_never_panics_and_always_terminates() {
    for input in [
        "data: {\"choices\":5}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1,\"function\":{\"arguments\":7}}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"reasoning_details\":[{\"index\":{\"a\":1}}]}}]}\n\n",
        "data: [1,2]\n\ndata: null\n\n",
        "{\"error\":\"boom\"}\n",
        "data: {\"usage\":[],\"choices\":[{\"usage\":7,\"delta\":{\"usage\":\"x\"}}]}\n\n",
    ] {
        let n = normalize_bytes(Family::F2.into(), input.as_bytes(), 0);
        let last = n.events.last().map(Event::to_json).unwrap_or_default();
        assert!(last.contains(r#""phase":"e"#), "{input}: {last}");
    }
}

#[test]
fn custom_tool_input_stays_text_even_when_it_looks_like_json() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","type":"custom","custom":{"name":"calc","input":"4"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"custom":{"input":"2"}}]}}]}"#,
        r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
    ]));
    assert!(ev[0].contains(r#""name":"calc""#), "{ev:?}");
    assert!(ev[2].contains(r#""input_delta":"2""#), "{ev:?}");
    assert!(ev[3].contains(r#""arguments":"42""#), "{ev:?}");
}

#[test]
fn audio_is_reported_once_with_its_transcript_and_never_its_bytes() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"audio":{"id":"a","transcript":"Hel"}}}]}"#,
        r#"{"choices":[{"delta":{"audio":{"data":"QUJDREVGR0hJSktMTU5PUA=="}}}]}"#,
        r#"{"choices":[{"delta":{"audio":{"transcript":"lo"}}}]}"#,
    ]));
    // The stream dies: the audio is still reported, before the terminal event.
    let audio: Vec<&String> = ev.iter().filter(|e| e.contains("audio")).collect();
    assert_eq!(audio.len(), 1, "{ev:?}");
    assert!(audio[0].contains(r#""transcript":"Hello""#), "{ev:?}");
    assert!(!ev.iter().any(|e| e.contains("QUJD")));
    assert!(ev.last().unwrap().contains("stream_closed"), "{ev:?}");
}

#[test]
fn requested_logprobs_are_reported_once_per_run() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[]}}]}"#,
        r#"{"choices":[{"delta":{"content":"b"},"logprobs":{"content":[]}}]}"#,
        r#"{"choices":[{"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#,
    ]));
    assert_eq!(ev.iter().filter(|e| e.contains("logprobs")).count(), 1);
    assert!(ev[0].contains("unsupported_frame"), "{ev:?}");
}

#[test]
fn empty_annotations_are_no_event() {
    let (ev, _) = run(&sse(&[
        r#"{"choices":[{"delta":{"content":"a","annotations":[]}}]}"#,
        r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
    ]));
    assert!(!ev.iter().any(|e| e.contains("annotations")), "{ev:?}");
}

/// What the member-by-member reading and the generic reading make of `chunk`: `None` when
/// the former leaves it to the generic reading, else both readings' `Debug` text.
fn both_readings(chunk: &str) -> Option<(String, String)> {
    let hot = super::wire::hot_chunk(chunk)?.into_chunk();
    let generic = serde_json::from_str::<super::wire::Chunk<'_>>(chunk).expect(chunk);
    Some((format!("{hot:?}"), format!("{generic:?}")))
}

/// Text and reasoning chunks as providers and routers lay them out — DeepSeek, OpenAI-
/// compatible servers, the project's fixtures, spaced, escaped — read member by member
/// give the chunk serde gives; a finish, usage, tool calls, structured reasoning or any
/// member the reading does not know is left to serde.
#[test]
fn text_chunks_read_member_by_member_are_read_as_serde_reads_them() {
    for chunk in [
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"content":null,"reasoning_content":" them."},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"c","object":"chat.completion.chunk","created":1760000000,"model":"gpt-oss:20b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"\"4\" \\ \n","reasoning":"\ud83d\ude00"},"finish_reason":null}]}"#,
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"logprobs":null,"finish_reason":null}]}"#,
        r#"{ "choices" : [ { "delta" : { "content" : "a" } , "native_finish_reason" : null } ] , "usage" : null }"#,
        r#"{"choices":[],"usage":null}"#,
        r#"{"id":"x","choices":[{"delta":{}}]}"#,
    ] {
        let (hot, generic) = both_readings(chunk).expect(chunk);
        assert_eq!(hot, generic, "{chunk}");
    }
    for chunk in [
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"delta":{"content":""}}],"usage":{"prompt_tokens":9}}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
        r#"{"choices":[{"delta":{"content":"a","reasoning":"b","reasoning_details":[{"type":"reasoning.text","text":"b"}]}}]}"#,
        r#"{"choices":[{"delta":{"content":["a"]}}]}"#,
        r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"}}],"usage":null,"usage":null}"#,
        r#"{"choices":[{"delta":{"reasoning_content":7}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[]}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"}}],"error":{"message":"x"}}"#,
        r#"{"choices":[{"delta":{"content":"a"}}],"x_pioneer":{}}"#,
        r#"{"choices":[{"delta":{"content":"a"}}],"id":}"#,
        "[DONE]",
    ] {
        assert_eq!(both_readings(chunk), None, "{chunk}");
    }
}

/// The adapter does with a chunk read member by member what it does with the same chunk
/// read by serde: every fixture gives the same events and transcript when each of its
/// chunks carries one more member (which serde skips and the member-by-member reading
/// does not know, so every chunk goes the generic way).
#[test]
fn text_chunks_handled_directly_give_the_events_the_generic_reading_gives() {
    let fixtures = crate::families::exact_frame::sse_fixtures("f2");
    assert!(fixtures.len() > 20, "only {} fixtures", fixtures.len());
    for (path, capture) in fixtures {
        let generic = crate::families::exact_frame::with_generic_member(&capture);
        assert_ne!(generic, capture, "{}", path.display());
        assert_eq!(run(&capture), run(&generic), "{}", path.display());
    }
}

/// A chunk recognized as a kept chunk with only its text changed reads as the
/// member-by-member reading reads it: for each pair of chunks, the second is read through
/// the first kept ([`SameFrame`]) and in full, and both give the same chunk — or the
/// second is not recognized at all.
///
/// [`SameFrame`]: crate::families::same_frame::SameFrame
#[test]
fn a_chunk_like_the_last_one_reads_as_it_reads_in_full() {
    use super::wire::{hot_chunk, TextChunk};
    use crate::families::same_frame::SameFrame;
    let chunks = [
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Add"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"content":null,"reasoning_content":" them.\n\"x\" \u00e9"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"content":"4","reasoning_content":null},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"content":"","reasoning_content":null},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"d1","object":"chat.completion.chunk","model":"deepseek","choices":[{"index":0,"delta":{"content":"a","reasoning_content":"b"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{ "choices" : [ { "delta" : { "reasoning" : "a" } } ] }"#,
        r#"{ "choices" : [ { "delta" : { "reasoning" : "b\"} ] }" } } ] }"#,
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}"#,
    ];
    let mut recognized = 0;
    for kept in chunks {
        let mut same = SameFrame::default();
        match hot_chunk(kept).as_ref().and_then(TextChunk::only_text) {
            Some((member, text)) => same.keep_text(kept, text, member),
            None => continue,
        }
        for chunk in chunks {
            let Some((member, text)) = same.text(chunk) else {
                continue;
            };
            recognized += 1;
            let full = hot_chunk(chunk).expect(chunk).into_chunk();
            let via_kept = TextChunk::with_text(member, text).into_chunk();
            assert_eq!(
                format!("{via_kept:?}"),
                format!("{full:?}"),
                "{chunk} after {kept}"
            );
        }
    }
    // Each reasoning pair ("Add" and its escaped successor, the two spaced chunks) and
    // the content pair ("4" and ""): each chunk of a pair, kept, recognizes both. A chunk
    // of two texts or a finish keeps nothing.
    assert_eq!(recognized, 3 * 2 * 2, "recognized {recognized}");
}

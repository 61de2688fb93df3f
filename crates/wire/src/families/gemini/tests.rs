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

#[test]
fn a_non_text_part_splits_the_text_so_only_the_later_text_is_final() {
    let n = run(&[
        r#"{"candidates":[{"content":{"parts":[{"text":"Computing."},{"executableCode":{"language":"PYTHON","code":"print(1)"}},{"text":"It is 1."}]},"finishReason":"STOP"}]}"#,
    ]);
    let all = lines(&n).join("\n");
    assert!(
        all.contains(r#""phase":"final_answer","text":"It is 1.""#),
        "{all}"
    );
    assert!(!all.contains("Computing.It is 1."), "{all}");
    assert!(check(&n.events, &[], Some(n.account)).is_empty());
}

#[test]
fn a_non_text_part_closes_open_thinking() {
    let n = run(&[
        r#"{"candidates":[{"content":{"parts":[{"text":"plan","thought":true},{"toolCall":{"id":"t1","toolType":"GOOGLE_SEARCH_WEB","args":{}}},{"text":"later","thought":true}]}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"done"}]},"finishReason":"STOP"}]}"#,
    ]);
    let ends = n
        .events
        .iter()
        .filter(|e| matches!(&e.data, EventData::Thinking(t) if t.phase == Some(SegmentPhase::End)))
        .count();
    assert_eq!(ends, 2, "{:?}", lines(&n));
    assert!(lines(&n).join("\n").contains(r#""part":"toolCall""#));
    assert!(check(&n.events, &[], Some(n.account)).is_empty());
}

#[test]
fn inline_bytes_never_reach_a_diagnostic() {
    let n = run(&[
        r#"{"candidates":[{"content":{"parts":[{"inlineData":{"mimeType":"audio/wav","data":"UklGRiQAAABXQVZF"}}]},"finishReason":"STOP"}]}"#,
    ]);
    let all = lines(&n).join("\n");
    assert!(!all.contains("UklGRi"), "{all}");
    assert!(
        all.contains(r#"{"mimeType":"audio/wav","bytes":12}"#),
        "{all}"
    );
}

#[test]
fn logprobs_and_model_status_are_reported_once_a_run() {
    let n = run(&[
        r#"{"candidates":[{"content":{"parts":[{"text":"a"}]},"logprobsResult":{"chosenCandidates":[]}}],"modelStatus":{"modelStage":"DEPRECATED"}}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"b"}]},"logprobsResult":{"chosenCandidates":[]}}],"modelStatus":{"modelStage":"DEPRECATED"}}"#,
        r#"{"candidates":[{"finishReason":"STOP","logprobsResult":{"chosenCandidates":[]}}],"modelStatus":{"modelStage":"DEPRECATED"}}"#,
    ]);
    let all = lines(&n).join("\n");
    assert_eq!(
        all.matches(r#""field":"logprobsResult""#).count(),
        1,
        "{all}"
    );
    assert_eq!(all.matches(r#""code":"model_status""#).count(), 1, "{all}");
    assert!(check(&n.events, &[], Some(n.account)).is_empty());
}

#[test]
fn tool_misuse_reasons_end_as_tool_errors_and_image_blocks_reject() {
    for (reason, phase, normalized) in [
        ("UNEXPECTED_TOOL_CALL", "end", "tool_error"),
        ("TOO_MANY_TOOL_CALLS", "end", "tool_error"),
        ("IMAGE_PROHIBITED_CONTENT", "error", "content_filter"),
        ("IMAGE_RECITATION", "error", "content_filter"),
    ] {
        let frame = format!(
            r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"name":"f","args":{{}}}}}}]}},"finishReason":"{reason}"}}],"responseId":"r"}}"#
        );
        let n = run(&[&frame]);
        let all = lines(&n).join("\n");
        let terminal =
            format!(r#""phase":"{phase}","reason":"{normalized}","status":"incomplete""#);
        assert!(all.contains(&terminal), "{reason}: {all}");
        assert!(all.contains(r#""status":"failed""#), "{reason}: {all}");
        assert!(
            all.contains(&format!(r#""detail":"{reason}""#)),
            "{reason}: {all}"
        );
    }
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
                Just(r#"{"candidates":[{"content":{"parts":[{"executableCode":{"code":"x"}}]},"groundingMetadata":{},"logprobsResult":{}}],"modelStatus":{}}"#),
                Just(r#"{"candidates":[{"content":{"parts":[{"inlineData":{"mimeType":"image/png","data":"QUJD"}}]}}]}"#),
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

/// What the member-by-member reading and the generic reading make of `frame`: `None` when
/// the former leaves it to the generic reading, else both readings' `Debug` text.
fn both_readings(frame: &str) -> Option<(String, String)> {
    let hot = super::hot_chunk(frame)?.into_chunk();
    let generic = serde_json::from_str::<super::Chunk<'_>>(frame).expect(frame);
    Some((format!("{hot:?}"), format!("{generic:?}")))
}

/// Text and thought frames — as the API spaces and orders them, as the project's fixtures
/// do, with escapes and several parts — read member by member give the chunk the generic
/// reading gives; every other shape is left to it.
#[test]
fn text_frames_read_member_by_member_are_read_as_serde_reads_them() {
    for frame in [
        r#"{"candidates": [{"content": {"parts": [{"text": "**Plan**\n\nI'm \"working\" \ud83d\ude00","thought": true}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 18,"totalTokenCount": 86,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 18}],"thoughtsTokenCount": 68,"serviceTier": "standard"},"modelVersion": "gemini-2.5-flash","responseId": "FWYravX3EPqmjuMPisHpuAU"}"#,
        r#"{"candidates":[{"index":0,"content":{"parts":[{"text":" Check.","thought":true},{"text":"The sum"}],"role":"model"}}],"usageMetadata":{"promptTokenCount":9},"modelVersion":"gemini-2.5-flash","responseId":"r"}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":" is 42."}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"totalTokenCount":39}}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a","thoughtSignature":"c2ln"}]}}]}"#,
        r#"{"candidates":[{"content":{}}],"usageMetadata":{}}"#,
        r#"{"candidates":[]}"#,
        "{}",
    ] {
        let (hot, generic) = both_readings(frame).expect(frame);
        assert_eq!(hot, generic, "{frame}");
    }
    for frame in [
        r#"{"candidates":[{"content":{"parts":[{"text":"a"}]},"safetyRatings":[]}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}]}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a","text":"b"}]}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a","thought":null}]}}]}"#,
        r#"{"candidates":[{"content":null}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a"}],"role":null}}]}"#,
        r#"{"candidates":[{"index":0}],"usageMetadata":null}"#,
        r#"{"candidates":[{"index":0}],"modelVersion":null}"#,
        r#"{"candidates":[{"index":-1}]}"#,
        r#"{"candidates":[{"index":0}],"promptFeedback":{"blockReason":"SAFETY"}}"#,
        r#"{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}"#,
        r#"{"candidates":[{"index":0}],"usageMetadata":{"a":}}"#,
    ] {
        assert_eq!(both_readings(frame), None, "{frame}");
    }
}

/// The adapter does with a frame read member by member what it does with the same frame
/// read by serde: every fixture gives the same events and transcript when each of its
/// frames carries one more member (which sends it the generic way).
#[test]
fn text_frames_handled_directly_give_the_events_the_generic_reading_gives() {
    let read = |bytes: &str| {
        let n = normalize_bytes(Family::F5.into(), bytes.as_bytes(), 0);
        let kinds: Vec<&str> = n.transcript.iter().map(|t| t.kind).collect();
        (lines(&n), kinds)
    };
    let fixtures = crate::families::exact_frame::sse_fixtures("f5");
    assert!(fixtures.len() > 20, "only {} fixtures", fixtures.len());
    for (path, capture) in fixtures {
        let generic = crate::families::exact_frame::with_generic_member(&capture);
        assert_ne!(generic, capture, "{}", path.display());
        assert_eq!(read(&capture), read(&generic), "{}", path.display());
    }
}

/// The thought count read member by member is the one serde reads into `ThoughtCount`;
/// every usage it cannot read that way is left to serde.
#[test]
fn thought_counts_read_member_by_member_are_read_as_serde_reads_them() {
    let serde = |usage: &str| {
        serde_json::from_str::<super::ThoughtCount>(usage)
            .ok()
            .and_then(|c| c.thoughts_token_count)
    };
    for usage in [
        r#"{"promptTokenCount":9,"totalTokenCount":19,"thoughtsTokenCount":10}"#,
        r#"{ "thoughtsTokenCount" : 0 , "promptTokensDetails": [{"modality": "TEXT","tokenCount": 18}] }"#,
        r#"{"thoughtsTokenCount":null}"#,
        r#"{"promptTokenCount":9}"#,
        "{}",
    ] {
        let read = super::text_chunk::thought_count(usage);
        assert_eq!(read, Some(serde(usage)), "{usage}");
    }
    for usage in [
        r#"{"thoughtsTokenCount":1,"thoughtsTokenCount":2}"#,
        r#"{"thoughtsTokenCount":-1}"#,
        r#"{"thoughtsTokenCount":1.0}"#,
        r#"{"thoughtsTokenCount":"1"}"#,
        r#"{"thoughts\u0054okenCount":3}"#,
        r#"{"thoughtsTokenCount":18446744073709551616}"#,
    ] {
        assert_eq!(super::text_chunk::thought_count(usage), None, "{usage}");
    }
}

/// A frame recognized as a kept text frame with another text and usage reads as the
/// member-by-member reading reads it: for each pair of frames, the second is read through
/// the first kept ([`SameFrame`]) and in full, and both give the same chunk — or the
/// second is not recognized at all.
///
/// [`SameFrame`]: crate::families::same_frame::SameFrame
#[test]
fn a_frame_like_the_last_one_reads_as_it_reads_in_full() {
    use super::text_chunk::{hot_chunk, keep, same_chunk};
    use crate::families::same_frame::SameFrame;
    let frames = [
        r#"{"candidates":[{"index":0,"content":{"parts":[{"text":"Plan","thought":true}],"role":"model"}}],"usageMetadata":{"promptTokenCount":9,"totalTokenCount":19},"modelVersion":"gemini-2.5-flash","responseId":"r1"}"#,
        r#"{"candidates":[{"index":0,"content":{"parts":[{"text":" more \"x\"\n\u00e9","thought":true}],"role":"model"}}],"usageMetadata":{"promptTokenCount":9,"totalTokenCount":123,"thoughtsTokenCount":77},"modelVersion":"gemini-2.5-flash","responseId":"r1"}"#,
        r#"{"candidates":[{"index":0,"content":{"parts":[{"text":"x","thought":true}],"role":"model"}}],"usageMetadata":null,"modelVersion":"gemini-2.5-flash","responseId":"r1"}"#,
        r#"{"candidates":[{"index":0,"content":{"parts":[{"text":"x","thought":true}],"role":"model"}}],"usageMetadata":{"promptTokenCount":9},"modelVersion":"gemini-2.5-flash","responseId":"r2"}"#,
        r#"{"usageMetadata": {"promptTokenCount": 9}, "candidates": [{"content": {"parts": [{"text": "The"}], "role": "model"}}], "responseId": "r1"}"#,
        r#"{"usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 2}, "candidates": [{"content": {"parts": [{"text": " sum"}], "role": "model"}}], "responseId": "r1"}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a"}],"role":"model"}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"b\"}]}}]}"}],"role":"model"}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a","thought":true},{"text":"b"}],"role":"model"}}],"usageMetadata":{"totalTokenCount":3}}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":" \"c\"","thought":true},{"text":"d\n"}],"role":"model"}}],"usageMetadata":{"totalTokenCount":12}}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a"},{"text":"b"},{"text":"c"}],"role":"model"}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"a"}],"role":"model"},"finishReason":"STOP"}]}"#,
    ];
    let mut recognized = 0;
    for kept in frames {
        let mut same = SameFrame::default();
        let Some(chunk) = hot_chunk(kept) else {
            continue;
        };
        keep(&mut same, kept, &chunk);
        for frame in frames {
            let Some(via_kept) = same_chunk(&same, frame) else {
                continue;
            };
            recognized += 1;
            let full = hot_chunk(frame).expect(frame).into_chunk();
            assert_eq!(
                format!("{:?}", via_kept.into_chunk()),
                format!("{full:?}"),
                "{frame} after {kept}"
            );
        }
    }
    // The first frame and its escaped successor: each, kept, recognizes both (not the
    // `null` usage, not another response id); the third leaves its usage to serde (not
    // read member by member); the fourth: itself; the spaced pair and the usage-less pair
    // ("a" and its successor with a quote inside): each recognizes both; so do the two
    // frames of two parts. Three parts or a finish keep nothing.
    assert_eq!(
        recognized,
        2 * 2 + 1 + 2 * 2 + 2 * 2 + 2 * 2,
        "recognized {recognized}"
    );
}

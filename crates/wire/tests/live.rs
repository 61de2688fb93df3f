//! Live first, nothing held (issue 10): for thinking turns, every event goes out as soon as
//! its frame is read. Fed chunk by chunk up to (not including) the usage frame, a thinking
//! capture has already produced every answer delta and every thinking `end` marker; the
//! usage frame adds the tokens-only update(s); and the whole run, folded to the batch form
//! (`fold_token_updates`), equals its golden file.

use std::path::{Path, PathBuf};
use streamgate_grammar::{check, fold_token_updates, Event, EventData, SegmentPhase};
use streamgate_wire::{Close, FamilyChoice, Normalizer};

struct Case {
    family: &'static str,
    capture: PathBuf,
    expected: PathBuf,
    /// Text of the usage frame (its first occurrence in the capture).
    usage_frame: &'static str,
}

fn fixture(family: &'static str, name: &str, usage_frame: &'static str) -> Case {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let (capture, expected) = match name.rsplit_once('.') {
        Some((stem, _)) => (dir.join(name), dir.join(format!("{stem}.expected.jsonl"))),
        None => unreachable!("fixture names have an extension"),
    };
    Case {
        family,
        capture,
        expected,
        usage_frame,
    }
}

const F1_USAGE: &str = r#""type":"message_delta""#;
const F3_USAGE: &str = r#""type":"response.completed""#;

fn cases() -> Vec<Case> {
    let mut cases = vec![
        fixture("f1", "f1/redacted.sse", F1_USAGE),
        fixture("f1e", "f1e/thinking.jsonl", F1_USAGE),
        fixture("f3", "f3/reasoning.sse", F3_USAGE),
        fixture("f3", "f3/encrypted.sse", F3_USAGE),
    ];
    // The shared corpus's one thinking capture with a separate usage frame (its F3
    // captures hold no reasoning).
    if let Some(corpus) = std::env::var_os("STREAMGATE_CORPUS") {
        let corpus = PathBuf::from(corpus);
        cases.push(Case {
            family: "f1",
            capture: corpus.join("captures/anthropic/02-thinking-stream.sse"),
            expected: corpus.join("expected/f1__anthropic_02_thinking_stream_sse.jsonl"),
            usage_frame: F1_USAGE,
        });
    }
    cases
}

/// Byte offset where the frame holding `needle` starts (after the previous blank line for
/// SSE, after the previous line end for JSONL).
fn frame_start(bytes: &[u8], needle: &str, jsonl: bool) -> usize {
    let text = std::str::from_utf8(bytes).expect("UTF-8 capture");
    let at = text.find(needle).expect("usage frame in capture");
    let sep = if jsonl { "\n" } else { "\n\n" };
    text[..at].rfind(sep).map_or(0, |i| i + sep.len())
}

fn feed(n: &mut Normalizer, bytes: &[u8], chunk: usize, events: &mut Vec<Event>) {
    for piece in bytes.chunks(chunk) {
        n.feed(piece);
        events.extend(n.drain());
    }
}

fn is_answer_delta(e: &Event) -> bool {
    matches!(&e.data, EventData::Assistant(a) if a.delta.is_some())
}

fn is_tokens_update(e: &Event) -> bool {
    matches!(&e.data, EventData::Thinking(t) if t.is_tokens_update())
}

#[test]
fn answer_deltas_go_out_before_the_usage_frame() {
    let cases = cases();
    for case in &cases {
        let name = case.capture.display().to_string();
        let bytes = std::fs::read(&case.capture).unwrap_or_else(|e| panic!("{name}: {e}"));
        let cut = frame_start(&bytes, case.usage_frame, name.ends_with(".jsonl"));
        let family: FamilyChoice = case.family.parse().unwrap();
        for chunk in [1, 7, 64] {
            let mut n = Normalizer::new(family);
            let mut before = Vec::new();
            feed(&mut n, &bytes[..cut], chunk, &mut before);
            let mut all = before.clone();
            feed(&mut n, &bytes[cut..], chunk, &mut all);
            n.close(Close::Normal);
            all.extend(n.drain());

            // Everything the answer streamed is out before usage arrives …
            let deltas = all.iter().filter(|e| is_answer_delta(e)).count();
            assert!(deltas > 0, "{name}: no answer delta at all");
            assert_eq!(
                before.iter().filter(|e| is_answer_delta(e)).count(),
                deltas,
                "{name} (chunks of {chunk}): answer deltas waited for the usage frame"
            );
            // … and so is every thinking end marker (without tokens, usage is unknown).
            let ends = |evs: &[Event]| {
                evs.iter()
                    .filter(|e| {
                        matches!(&e.data, EventData::Thinking(t) if t.phase == Some(SegmentPhase::End))
                    })
                    .count()
            };
            assert!(ends(&before) > 0, "{name}: no thinking end marker");
            assert_eq!(ends(&before), ends(&all), "{name}: an end marker waited");
            assert!(!before.iter().any(is_tokens_update), "{name}");
            assert_eq!(before[..], all[..before.len()], "{name}: live prefix");
            // The usage frame brings the token count as tokens-only update(s).
            assert!(
                all[before.len()..].iter().any(is_tokens_update),
                "{name}: no tokens update after the usage frame"
            );
            assert_eq!(check(&all, &[], Some(n.account())), vec![], "{name}");

            // Folded to the batch form, the run is its golden.
            let golden: Vec<Event> = std::fs::read_to_string(&case.expected)
                .unwrap()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| Event::from_json(l).unwrap())
                .collect();
            let folded = fold_token_updates(&all);
            let lines = |evs: &[Event]| -> Vec<serde_json::Value> {
                evs.iter()
                    .map(|e| serde_json::from_str(&e.to_json()).unwrap())
                    .collect()
            };
            assert_eq!(lines(&folded), lines(&golden), "{name}: folded vs golden");
        }
    }
    eprintln!("{} thinking captures checked", cases.len());
}

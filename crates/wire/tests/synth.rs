//! `synth::inflate` grows one capture of every family into a single run of the requested
//! size that ends like the original: at most one `lifecycle/start` (as the original), one
//! terminal event with the
//! same phase and reason, the same final answer kind, and every invariant holding.

use std::path::Path;
use streamgate_grammar::{check, EventData, LifecyclePhase};
use streamgate_wire::{normalize_bytes, FamilyChoice};

/// One clean capture per family (path under `fixtures/`).
const CAPTURES: [(&str, &str); 11] = [
    ("f1", "f1/end-turn.sse"),
    ("f1e", "f1e/thinking.jsonl"),
    ("f2", "f2/deepseek-thinking.sse"),
    ("f3", "f3/reasoning.sse"),
    ("f5", "f5/thinking.sse"),
    ("ollama-native", "ollama-native/text.jsonl"),
    ("codex-exec", "codex-exec/answer.jsonl"),
    ("codex-appserver", "codex-appserver/reasoning.jsonl"),
    ("acp", "acp/answer.jsonl"),
    ("acp", "acp/v2-updates.jsonl"),
    ("openclaw-events", "openclaw-events/answer.jsonl"),
];

/// What a run's end looks like: terminal phase and reason, and whether a final answer
/// went out.
fn ending(file: &str, family: FamilyChoice, capture: &[u8]) -> (String, bool, usize) {
    let n = normalize_bytes(family, capture, 0);
    let problems = check(&n.events, &[], Some(n.account));
    assert!(problems.is_empty(), "{file}: {problems:?}");
    let starts = n
        .events
        .iter()
        .filter(|e| matches!(&e.data, EventData::Lifecycle(l) if l.phase == LifecyclePhase::Start))
        .count();
    assert!(starts <= 1, "{file}: {starts} runs");
    let last = n.events.last().expect("events");
    let EventData::Lifecycle(end) = &last.data else {
        panic!("{file}: last event is not lifecycle: {}", last.to_json());
    };
    let finals = n
        .events
        .iter()
        .filter(|e| e.to_json().contains(r#""phase":"final_answer""#))
        .count();
    let end = format!("{starts} start, {:?} {:?}", end.phase, end.reason);
    (end, finals == 1, n.events.len())
}

#[test]
fn every_family_grows_into_one_run_that_ends_like_the_original() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let target = 256 << 10;
    for (family, file) in CAPTURES {
        let choice: FamilyChoice = family.parse().unwrap();
        let capture = std::fs::read(fixtures.join(file)).unwrap();
        let big = streamgate_wire::synth::inflate(&capture, target);
        assert!(
            big.len() >= target,
            "{file}: grew to {} bytes, wanted {target}",
            big.len()
        );
        let (small_end, small_final, small_events) = ending(file, choice, &capture);
        let (big_end, big_final, big_events) = ending(file, choice, &big);
        assert_eq!(big_end, small_end, "{file}: ends differently");
        assert_eq!(big_final, small_final, "{file}: final answer differs");
        assert!(
            big_events > small_events * 10,
            "{file}: the deltas did not grow"
        );
    }
}

/// A capture with no streamed text or thinking (an error stream, tool arguments only) cannot
/// grow — `streamgate synth` refuses it with that reason — and is listed, not checked.
#[test]
fn every_shared_corpus_capture_grows_into_one_run_that_ends_like_the_original() {
    let Some(dir) = std::env::var_os("STREAMGATE_CORPUS") else {
        eprintln!("STREAMGATE_CORPUS not set: shared corpus not grown");
        return;
    };
    let dir = Path::new(&dir);
    let index = std::fs::read_to_string(dir.join("index.tsv")).unwrap();
    for row in index.lines().skip(1) {
        let cols: Vec<&str> = row.split('\t').collect();
        let (family, file) = (cols[1], cols[2]);
        let choice: FamilyChoice = family.parse().unwrap();
        let capture = std::fs::read(dir.join(file)).unwrap();
        let target = (256 << 10).max(capture.len() * 8);
        let big = streamgate_wire::synth::inflate(&capture, target);
        if big.len() < target {
            eprintln!("{file}: grew to {} bytes", big.len());
            continue;
        }
        let (small_end, small_final, small_events) = ending(file, choice, &capture);
        let (big_end, big_final, big_events) = ending(file, choice, &big);
        assert_eq!(big_end, small_end, "{file}: ends differently");
        assert_eq!(big_final, small_final, "{file}: final answer differs");
        assert!(
            big_events > small_events * 5,
            "{file}: the deltas did not grow"
        );
    }
}

//! Properties over every capture we have (the project's fixtures, plus the shared corpus
//! when `$STREAMGATE_CORPUS` is set):
//! - any chunking of a capture gives exactly the events and transcript of one big chunk;
//! - arbitrary bytes never panic any family, and any stream still ends in exactly one
//!   terminal lifecycle event with gap-free seqs;
//! - a real capture cut at any point dies cleanly (`stream_closed` or its own terminal).

use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use streamgate_grammar::{check, EventData};
use streamgate_wire::conformance::parse_index;
use streamgate_wire::{normalize_bytes, Close, Family, FamilyChoice, Normalized, Normalizer};

struct Capture {
    name: String,
    family: FamilyChoice,
    bytes: Vec<u8>,
}

fn load_index(dir: &Path, out: &mut Vec<Capture>) {
    let Ok(index) = std::fs::read_to_string(dir.join("index.tsv")) else {
        return;
    };
    for case in parse_index(&index).unwrap_or_default() {
        if let (Ok(family), Ok(bytes)) = (
            case.adapter.parse::<FamilyChoice>(),
            std::fs::read(dir.join(&case.capture)),
        ) {
            out.push(Capture {
                name: case.capture,
                family,
                bytes,
            });
        }
    }
}

fn captures() -> &'static [Capture] {
    static CAPTURES: OnceLock<Vec<Capture>> = OnceLock::new();
    CAPTURES.get_or_init(|| {
        let mut all = Vec::new();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&fixtures)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        dirs.sort();
        for dir in dirs {
            load_index(&dir, &mut all);
        }
        if let Some(corpus) = std::env::var_os("STREAMGATE_CORPUS") {
            load_index(Path::new(&corpus), &mut all);
        }
        all
    })
}

/// Normalizes with the given chunk boundaries (sizes cycle until the input is used up).
fn normalize_chunked(family: FamilyChoice, bytes: &[u8], sizes: &[usize]) -> Normalized {
    let mut n = Normalizer::new(family);
    let mut events = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < bytes.len() {
        let size = sizes[i % sizes.len()].max(1);
        let end = (pos + size).min(bytes.len());
        n.feed(&bytes[pos..end]);
        events.extend(n.drain());
        pos = end;
        i += 1;
    }
    n.close(Close::Normal);
    events.extend(n.drain());
    Normalized {
        events,
        transcript: n.take_transcript(),
        account: n.account(),
        family: n.family(),
    }
}

fn assert_same(a: &Normalized, b: &Normalized, what: &str) {
    assert_eq!(a.events, b.events, "{what}: events differ");
    assert_eq!(a.transcript, b.transcript, "{what}: transcript differs");
    assert_eq!(a.account, b.account, "{what}: frame accounting differs");
}

/// Structural invariants every stream must keep, whatever its bytes: gap-free seqs and
/// exactly one terminal event, last (I1, I7), no final answer on a dead path (I3).
fn assert_well_formed(out: &Normalized, what: &str) {
    let violations: Vec<_> = check(&out.events, &[], None)
        .into_iter()
        .filter(|v| matches!(v.invariant, "I1" | "I3" | "I7"))
        .collect();
    assert!(violations.is_empty(), "{what}: {violations:?}");
}

#[test]
fn byte_at_a_time_equals_whole() {
    for cap in captures() {
        let whole = normalize_bytes(cap.family, &cap.bytes, 0);
        let bytewise = normalize_bytes(cap.family, &cap.bytes, 1);
        assert_same(&whole, &bytewise, &cap.name);
    }
}

/// A stream cut anywhere — mid-frame, mid-line, mid-UTF-8 character — still satisfies
/// every invariant against its own transcript: one terminal event, last; no final answer
/// when the provider never said stop; no opaque material leaked by a half frame.
#[test]
fn every_capture_cut_anywhere_keeps_every_invariant() {
    for cap in captures() {
        // Every byte for small captures; ~4000 spread points for large ones.
        let len = cap.bytes.len();
        let step = (len / 4000).max(1);
        for cut in (0..=len).step_by(step) {
            let out = normalize_bytes(cap.family, &cap.bytes[..cut], 0);
            let opaque: Vec<&str> = out.transcript.iter().map(|t| t.material.as_str()).collect();
            let problems = check(&out.events, &opaque, Some(out.account));
            assert!(
                problems.is_empty(),
                "{} cut at {cut}: {problems:?}",
                cap.name
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), ..ProptestConfig::default() })]

    #[test]
    fn any_chunking_gives_identical_events(
        pick in any::<prop::sample::Index>(),
        sizes in prop::collection::vec(1usize..700, 1..24),
    ) {
        let caps = captures();
        prop_assume!(!caps.is_empty());
        let cap = &caps[pick.index(caps.len())];
        let whole = normalize_bytes(cap.family, &cap.bytes, 0);
        let chunked = normalize_chunked(cap.family, &cap.bytes, &sizes);
        assert_same(&whole, &chunked, &cap.name);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        family in 0usize..=Family::ALL.len(),
        bytes in prop::collection::vec(any::<u8>(), 0..4096),
        sizes in prop::collection::vec(1usize..300, 1..8),
    ) {
        let choice = Family::ALL.get(family).copied().map_or(FamilyChoice::Auto, FamilyChoice::Known);
        let out = normalize_chunked(choice, &bytes, &sizes);
        assert_well_formed(&out, "arbitrary bytes");
    }

    #[test]
    fn json_shaped_garbage_never_panics(
        family in 0usize..=Family::ALL.len(),
        lines in prop::collection::vec(json_ish_line(), 0..40),
        sse in any::<bool>(),
    ) {
        let choice = Family::ALL.get(family).copied().map_or(FamilyChoice::Auto, FamilyChoice::Known);
        let mut bytes = Vec::new();
        for l in &lines {
            if sse {
                bytes.extend_from_slice(b"data: ");
            }
            bytes.extend_from_slice(l.as_bytes());
            bytes.extend_from_slice(if sse { b"\n\n" } else { b"\n" });
        }
        let out = normalize_bytes(choice, &bytes, 0);
        assert_well_formed(&out, "json-shaped garbage");
    }

    #[test]
    fn mutated_captures_never_panic(
        pick in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
    ) {
        let caps = captures();
        prop_assume!(!caps.is_empty());
        let cap = &caps[pick.index(caps.len())];
        let mut bytes = cap.bytes.clone();
        prop_assume!(!bytes.is_empty());
        for (at, b) in &flips {
            let i = at.index(bytes.len());
            bytes[i] = *b;
        }
        let out = normalize_bytes(cap.family, &bytes, 0);
        assert_well_formed(&out, &cap.name);
        // Whatever survives must still be valid canonical JSON lines.
        for ev in &out.events {
            let line = ev.to_json();
            let back = streamgate_grammar::Event::from_json(&line);
            prop_assert!(back.is_ok(), "{line}");
            if let EventData::Assistant(a) = &ev.data {
                prop_assert!(a.delta.is_some() || a.text.is_some());
            }
        }
    }
}

/// Lines that look like provider JSON: real keys, wrong types, nesting, nulls.
fn json_ish_line() -> impl Strategy<Value = String> {
    let keys = prop::sample::select(vec![
        "type",
        "choices",
        "delta",
        "content",
        "reasoning",
        "reasoning_content",
        "reasoning_details",
        "tool_calls",
        "finish_reason",
        "usage",
        "index",
        "id",
        "message",
        "content_block",
        "text",
        "thinking",
        "candidates",
        "parts",
        "functionCall",
        "done",
        "method",
        "params",
        "item",
        "response",
        "error",
        "stop_reason",
        "result",
        "event",
        "output_index",
        "sequence_number",
        "thread_id",
        "aggregated_output",
        "exit_code",
        "status",
        "runId",
        "seq",
        "stream",
        "data",
        "toolCallId",
        "jsonrpc",
        "sessionId",
        "update",
        "sessionUpdate",
        "stopReason",
        "rawInput",
        "rawOutput",
    ]);
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z_.]{0,12}".prop_map(|s| format!("\"{s}\"")),
        prop::sample::select(vec![
            "\"message_start\"",
            "\"content_block_delta\"",
            "\"message_delta\"",
            "\"response.output_text.delta\"",
            "\"response.completed\"",
            "\"stop\"",
            "\"length\"",
            "\"tool_calls\"",
            "\"STOP\"",
            "\"text_delta\"",
            "\"thread.started\"",
            "\"item.started\"",
            "\"item.completed\"",
            "\"turn.completed\"",
            "\"turn.failed\"",
            "\"agent_message\"",
            "\"command_execution\"",
            "\"lifecycle\"",
            "\"assistant\"",
            "\"tool\"",
            "\"end\"",
            "\"2.0\"",
            "\"session/update\"",
            "\"session/prompt\"",
            "\"agent_message_chunk\"",
            "\"tool_call_update\"",
            "\"end_turn\"",
            "\"max_tokens\"",
        ])
        .prop_map(str::to_owned),
    ];
    let value = leaf.prop_recursive(3, 24, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((keys.clone(), inner), 0..5).prop_map(|kv| {
                let body: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", body.join(","))
            }),
        ]
    });
    value
}

/// `default` property cases, or `$PROPTEST_CASES` (the fast test tier asks for fewer).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

//! Redaction speed over 1 MB of tool-output-like text: the clean case (one `RegexSet`
//! pass) and a dirty one (a secret every ~2 KB).
//!
//! `cargo bench -p streamgate-projection --bench redact`

use criterion::{criterion_main, Criterion, Throughput};
use std::hint::black_box;
use streamgate_grammar::Event;
use streamgate_projection::redact::redact;
use streamgate_projection::{Reasoning, RunProjection, Settings, Tier};

fn text(secret_every: Option<usize>) -> String {
    let line = "total 48 drwxr-xr-x 5 user staff 160 Nov 25 06:00 src, the answer is 42; see https://example.com/docs?q=1 and token_count=7\n";
    let mut s = String::with_capacity(1 << 20);
    let mut n = 0;
    while s.len() < 1 << 20 {
        s.push_str(line);
        n += 1;
        if secret_every.is_some_and(|k| n % k == 0) {
            s.push_str("export OPENAI_API_KEY=sk-abcdefghijklmnopqrstuv password=hunter2\n");
        }
    }
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("redact_1MB");
    for (name, t) in [("clean", text(None)), ("secret_every_2KB", text(Some(16)))] {
        g.throughput(Throughput::Bytes(t.len() as u64));
        g.sample_size(20);
        g.bench_function(name, |b| b.iter(|| redact(black_box(&t))));
    }
    g.finish();

    // A whole run as a channel renders it: thinking deltas of ~50 and ~300 bytes under
    // `/reasoning stream` on T2 (no per-lane cut), every event re-rendering the draft.
    // The cost must grow linearly with the segment (1 MB vs 8 MB: 8×), not with its
    // square (a long reasoning turn once took the instance down).
    let settings = Settings {
        reasoning: Reasoning::Stream,
        ..Settings::default()
    };
    let mut g = c.benchmark_group("project_run");
    g.sample_size(10);
    for (name, bytes, delta) in [
        ("thinking_100KB_in_50B_deltas_T2", 100_000, 50),
        ("thinking_1MB_in_300B_deltas_T2", 1 << 20, 300),
        ("thinking_8MB_in_300B_deltas_T2", 8 << 20, 300),
    ] {
        let events = thinking_run(bytes, delta);
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut p = RunProjection::new("r");
                events
                    .iter()
                    .map(|e| p.apply(e, &settings, Tier::T2 { status_line: false }).len())
                    .sum::<usize>()
            })
        });
    }
    g.finish();
}

/// One open thinking segment of about `bytes` bytes in deltas of about `delta` bytes
/// (words, a newline every ~20 deltas).
fn thinking_run(bytes: usize, delta: usize) -> Vec<Event> {
    let mut events = vec![Event::from_json(
        r#"{"seq":1,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"t"}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"))];
    let sentence = "step: check the config and the logs now. ";
    let (mut total, mut i) = (0, 0u64);
    while total < bytes {
        let mut d = sentence.repeat(delta.div_ceil(sentence.len()));
        d.truncate(delta);
        if i % 20 == 19 {
            d.push_str("\\n");
        }
        total += d.len();
        let line = format!(
            r#"{{"seq":{},"stream":"thinking","data":{{"variant":"raw","delta":"{d}","id":"t"}}}}"#,
            i + 2
        );
        events.push(Event::from_json(&line).unwrap_or_else(|e| panic!("{e}")));
        i += 1;
    }
    events
}

// criterion_group! generates an undocumented public fn.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::bench);
}
use group::benches;
criterion_main!(benches);

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

    // A whole run as a channel renders it: 2,000 thinking deltas of 50 bytes (100 KB of
    // reasoning) under `/reasoning stream` on T2 (no per-lane cut), so every event
    // re-renders, and re-redacts, the accumulated segment.
    let mut events = vec![Event::from_json(
        r#"{"seq":1,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"t"}}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"))];
    for i in 0..2000u64 {
        let line = format!(
            r#"{{"seq":{},"stream":"thinking","data":{{"variant":"raw","delta":"step {i:05}: check the config and the logs now. ","id":"t"}}}}"#,
            i + 2
        );
        events.push(Event::from_json(&line).unwrap_or_else(|e| panic!("{e}")));
    }
    let settings = Settings {
        reasoning: Reasoning::Stream,
        ..Settings::default()
    };
    let mut g = c.benchmark_group("project_run");
    g.sample_size(10);
    g.bench_function("thinking_100KB_in_2000_deltas_T2", |b| {
        b.iter(|| {
            let mut p = RunProjection::new("r");
            events
                .iter()
                .map(|e| p.apply(e, &settings, Tier::T2 { status_line: false }).len())
                .sum::<usize>()
        })
    });
    g.finish();
}

// criterion_group! generates an undocumented public fn.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::bench);
}
use group::benches;
criterion_main!(benches);

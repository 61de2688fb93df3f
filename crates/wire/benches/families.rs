//! Adapter throughput per family: each family's own fixtures (and the shared corpus when
//! `$STREAMGATE_CORPUS` is set) grown to ~4 MiB single-run captures, normalized in 64 KiB
//! chunks. Reported as bytes/s.

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use std::path::Path;
use streamgate_wire::conformance::parse_index;
use streamgate_wire::synth::inflate;
use streamgate_wire::{normalize_bytes, FamilyChoice};

const SIZE: usize = 4 << 20;

/// The largest capture per family from an index folder that `synth` can grow (one with
/// streamed text or thinking: an error stream or a tool-arguments-only turn stays small
/// and would measure nothing but its own size).
fn largest_per_family(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(index) = std::fs::read_to_string(dir.join("index.tsv")) else {
        return;
    };
    for case in parse_index(&index).unwrap_or_default() {
        let Ok(bytes) = std::fs::read(dir.join(&case.capture)) else {
            continue;
        };
        if inflate(&bytes, SIZE).len() < SIZE {
            continue;
        }
        match out.iter_mut().find(|(f, _)| *f == case.adapter) {
            Some((_, best)) if best.len() >= bytes.len() => {}
            Some((_, best)) => *best = bytes,
            None => out.push((case.adapter.clone(), bytes)),
        }
    }
}

fn families(c: &mut Criterion) {
    let mut inputs = Vec::new();
    if let Some(corpus) = std::env::var_os("STREAMGATE_CORPUS") {
        largest_per_family(Path::new(&corpus), &mut inputs);
    }
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    if let Ok(rd) = std::fs::read_dir(&fixtures) {
        for dir in rd.flatten() {
            largest_per_family(&dir.path(), &mut inputs);
        }
    }
    inputs.sort();
    let mut group = c.benchmark_group("normalize");
    group.sample_size(10);
    for (family, capture) in inputs {
        let big = inflate(&capture, SIZE);
        let choice: FamilyChoice = family.parse().unwrap();
        group.throughput(Throughput::Bytes(big.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(&family), &big, |b, big| {
            b.iter(|| normalize_bytes(choice, big, 64 * 1024).events.len())
        });
    }
    group.finish();
}

// criterion_group! generates an undocumented public fn.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::families);
}
use group::benches;
criterion_main!(benches);

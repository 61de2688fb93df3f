//! Fuzzes every family adapter (and auto-detection) through the full normalizer.
//! Byte 0 picks the family, byte 1 the chunk size; the rest is the stream. Beyond "no
//! panic", the run must still end in exactly one terminal event with gap-free seqs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use streamgate_grammar::check;
use streamgate_wire::{normalize_bytes, Family, FamilyChoice};

fuzz_target!(|data: &[u8]| {
    let (Some(&f), Some(&c)) = (data.first(), data.get(1)) else {
        return;
    };
    let choice = Family::ALL
        .get(usize::from(f) % (Family::ALL.len() + 1))
        .copied()
        .map_or(FamilyChoice::Auto, FamilyChoice::Known);
    let out = normalize_bytes(choice, &data[2..], usize::from(c));
    let broken: Vec<_> = check(&out.events, &[], None)
        .into_iter()
        .filter(|v| matches!(v.invariant, "I1" | "I3" | "I7"))
        .collect();
    assert!(broken.is_empty(), "{broken:?}");
});

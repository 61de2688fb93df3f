//! Fuzzes the SSE/JSONL decoder alone: any bytes, any chunking, no panic, and the same
//! frames whatever the chunking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use streamgate_wire::{Decoded, FrameDecoder};

fn frames(data: &[u8], chunk: usize) -> Vec<String> {
    let mut d = FrameDecoder::default();
    let mut out = Vec::new();
    let mut sink = |x: Decoded<'_>| out.push(format!("{x:?}"));
    for part in data.chunks(chunk.max(1)) {
        d.feed(part, &mut sink);
    }
    d.finish(&mut sink);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some(&c) = data.first() else { return };
    let body = &data[1..];
    assert_eq!(frames(body, body.len()), frames(body, usize::from(c)));
});

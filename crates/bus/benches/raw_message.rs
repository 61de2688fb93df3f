//! Reading a raw message's subject and headers (`RawChunk::from_parts`): the normalizer
//! does it once per chunk, before any adapter sees the bytes. And writing them
//! (`RawChunk::headers`): every front door does it once per chunk it stores. Reported per
//! message.

use async_nats::HeaderMap;
use bytes::Bytes;
use criterion::{criterion_main, Criterion, Throughput};
use streamgate_bus::raw::{CloseKind, RawChunk};
use streamgate_bus::subject::RunAddr;

fn chunk(close: Option<CloseKind>) -> RawChunk {
    RawChunk {
        addr: RunAddr::parse("bench", "bench-7-3", 8).expect("valid ids"),
        session_key: None,
        family: "auto".into(),
        dialect: None,
        chunk: 41,
        ingest_ts_ms: 1_700_000_000_123,
        close,
        body: if close.is_some() {
            Bytes::new()
        } else {
            Bytes::from(vec![b'x'; 1024])
        },
    }
}

fn raw_message(c: &mut Criterion) {
    let mut group = c.benchmark_group("raw_message");
    group.throughput(Throughput::Elements(1));
    for (name, raw) in [
        ("chunk", chunk(None)),
        ("close", chunk(Some(CloseKind::Normal))),
    ] {
        let subject = raw.addr.raw_subject();
        let headers: HeaderMap = raw.headers();
        group.bench_function(name, |b| {
            b.iter(|| {
                RawChunk::from_parts(&subject, Some(&headers), raw.body.clone()).expect("readable")
            })
        });
        group.bench_function(format!("{name}_headers"), |b| b.iter(|| raw.headers()));
    }
    group.finish();
}

// criterion_group! generates an undocumented public fn.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::raw_message);
}
use group::benches;
criterion_main!(benches);

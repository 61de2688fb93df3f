//! `streamgate normalize`: reads a capture incrementally, prints canonical JSONL.
//!
//! Memory does not grow with the capture: bytes are read in fixed chunks and events are
//! written as soon as the adapter releases them.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use streamgate_wire::{Close, FamilyChoice, Normalizer, TranscriptEntry};

/// Read size (and output buffer): large enough to amortize syscalls, small enough to stay
/// in cache. Measured against 256 KiB: the same speed, 0.5–3 MiB less peak memory.
const READ_CHUNK: usize = 64 * 1024;

/// Runs the subcommand.
pub fn run(family: &str, transcript: Option<&Path>, capture: &Path) -> Result<ExitCode> {
    let choice: FamilyChoice = family.parse()?;
    let mut input: Box<dyn Read> = if capture == Path::new("-") {
        Box::new(io::stdin().lock())
    } else {
        Box::new(File::open(capture).with_context(|| format!("cannot read {}", capture.display()))?)
    };
    let mut transcript_out = match transcript {
        Some(p) => Some(BufWriter::new(
            File::create(p).with_context(|| format!("cannot write {}", p.display()))?,
        )),
        None => None,
    };

    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(READ_CHUNK, stdout.lock());
    let mut normalizer = Normalizer::new(choice);
    let mut buf = vec![0u8; READ_CHUNK];
    let written = (|| -> io::Result<()> {
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            normalizer.feed(&buf[..n]);
            write_events(&mut normalizer, &mut out)?;
            // Taken even when not written: left in the normalizer, a long run's
            // signatures and snapshots would pile up in memory.
            let transcript = normalizer.take_transcript();
            if let Some(t) = transcript_out.as_mut() {
                write_transcript(transcript, t)?;
            }
        }
        normalizer.close(Close::Normal);
        write_events(&mut normalizer, &mut out)?;
        if let Some(t) = transcript_out.as_mut() {
            write_transcript(normalizer.take_transcript(), t)?;
            t.flush()?;
        }
        out.flush()
    })();
    match written {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // `streamgate normalize … | head` is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).with_context(|| format!("while normalizing {}", capture.display())),
    }
}

fn write_events(n: &mut Normalizer, out: &mut impl Write) -> io::Result<()> {
    for event in n.drain() {
        event.write_json(out)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

fn write_transcript(entries: Vec<TranscriptEntry>, out: &mut impl Write) -> io::Result<()> {
    for e in entries {
        let line = serde_json::json!({
            "kind": e.kind,
            "segment": e.segment,
            "material": e.material,
        });
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

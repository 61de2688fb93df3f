//! `streamgate bench json CAPTURE`: the JSON-validation speed the adapters are measured
//! against. Every JSON document of the capture — a JSON Lines line, or an SSE line's
//! `data:` field — is parsed with serde_json into nothing (`IgnoredAny`), the file read
//! in 64 KiB pieces as `streamgate normalize` reads it, in one process.
//! `scripts/bench-adapters.sh` times it whole-process beside each family, so the adapters'
//! MB/s can be read as a share of what merely validating their input costs on the same
//! machine (the performance issue's goal: half of it). An SSE event whose JSON spans
//! several `data:` lines counts as other lines, not a document: no capture here has one.

use anyhow::Context as _;
use serde::de::IgnoredAny;
use std::path::PathBuf;

/// The same piece size as `streamgate normalize`.
const READ_CHUNK: usize = 64 * 1024;

/// Arguments of `streamgate bench json`.
#[derive(Debug, clap::Args)]
pub struct JsonArgs {
    /// The capture: JSON Lines or SSE.
    pub capture: PathBuf,
}

/// What one pass over a capture found.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    documents: u64,
    /// Lines that held something other than JSON (`event:` fields, `[DONE]`, junk).
    other: u64,
    bytes: u64,
}

/// Validates every JSON document of the capture and prints the tally.
pub fn json(args: JsonArgs) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.capture)
        .with_context(|| format!("cannot read {}", args.capture.display()))?;
    let tally = validate(file, READ_CHUNK).context("reading the capture")?;
    println!(
        "{} JSON documents, {} other lines, {} bytes",
        tally.documents, tally.other, tally.bytes
    );
    Ok(())
}

/// Reads `input` in pieces of `chunk` bytes and validates each whole line as it arrives.
fn validate(mut input: impl std::io::Read, chunk: usize) -> std::io::Result<Tally> {
    let mut tally = Tally::default();
    // One buffer: the unfinished line's start moves to its front and the next piece is
    // read in behind it, so what was read is not copied again (only that short tail).
    let mut buf = vec![0u8; chunk.max(1)];
    let mut held = 0;
    loop {
        if held == buf.len() {
            buf.resize(buf.len() * 2, 0); // a line longer than the buffer
        }
        let n = match input.read(&mut buf[held..]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        tally.bytes += n as u64;
        let filled = held + n;
        let whole = memchr::memrchr(b'\n', &buf[held..filled]).map_or(0, |i| held + i + 1);
        validate_lines(&buf[..whole], &mut tally);
        buf.copy_within(whole..filled, 0);
        held = filled - whole;
    }
    validate_lines(&buf[..held], &mut tally);
    Ok(tally)
}

/// Validates the JSON document of each line of `lines`.
fn validate_lines(lines: &[u8], tally: &mut Tally) {
    for line in memchr::memchr_iter(b'\n', lines)
        .scan(0, |start, end| {
            let line = &lines[*start..end];
            *start = end + 1;
            Some(line)
        })
        .chain(last_unterminated(lines))
    {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let doc = line
            .strip_prefix(b"data:")
            .map_or(line, |d| d.strip_prefix(b" ").unwrap_or(d));
        if doc.is_empty() {
            continue;
        }
        match serde_json::from_slice::<IgnoredAny>(doc) {
            Ok(_) => tally.documents += 1,
            Err(_) => tally.other += 1,
        }
    }
}

/// The text after the last newline, when there is any.
fn last_unterminated(lines: &[u8]) -> Option<&[u8]> {
    let start = memchr::memrchr(b'\n', lines).map_or(0, |i| i + 1);
    (start < lines.len()).then(|| &lines[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_data_fields_and_json_lines_are_documents_the_rest_is_counted_apart() {
        let mut tally = Tally::default();
        validate_lines(
            b"event: delta\ndata: {\"a\":1}\r\n\n{\"b\":[1,2]}\ndata: [DONE]\ndata:{}\n{\"tail\":true}",
            &mut tally,
        );
        assert_eq!((tally.documents, tally.other), (4, 2), "{tally:?}");
    }

    #[test]
    fn pieces_of_any_size_give_the_same_tally() {
        let long = format!("{{\"text\":\"{}\"}}", "x".repeat(100));
        let capture = format!(
            "data: {{\"a\":1}}\r\nevent: e\r\n{long}\n\ndata: {{\"b\":2}}\r\n{{\"end\":true}}"
        );
        let whole = validate(capture.as_bytes(), 1 << 16).unwrap();
        assert_eq!((whole.documents, whole.other), (4, 1), "{whole:?}");
        assert_eq!(whole.bytes, capture.len() as u64);
        // Pieces smaller than a line, a CRLF split between two, a line longer than the
        // buffer, and no newline at the end.
        for chunk in 1..=9 {
            assert_eq!(
                validate(capture.as_bytes(), chunk).unwrap(),
                whole,
                "{chunk}"
            );
        }
    }
}

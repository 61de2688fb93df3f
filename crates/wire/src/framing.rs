//! Incremental framing: bytes in chunks of any size → whole provider frames.
//!
//! Two framings exist on the wire: Server-Sent Events (`event:`/`data:` fields, blank-line
//! dispatch, `:` comments) and JSON Lines (one object per line). The decoder sniffs which
//! one a stream uses from its first significant byte (`{` means JSONL), because the same
//! family can arrive either way (pioneer's Chat Completions stream is bare JSONL).
//!
//! Chunks may split a line, a CRLF pair or a UTF-8 character anywhere: bytes are buffered
//! until a line is complete, and text is only decoded from complete lines. Lines end in
//! LF, CRLF or a lone CR. A leading UTF-8 BOM is skipped. A line longer than the frame
//! limit is discarded (reported, never buffered without bound).

use memchr::memchr2;

/// Default upper bound for one line, and so for one frame's data.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// One frame, as the adapter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// SSE `event:` name; `None` for JSONL and for SSE frames without one.
    pub event: Option<&'a str>,
    /// SSE `data:` (multi-line data joined with `\n`) or the JSONL line.
    pub data: &'a str,
}

/// What the decoder hands out besides frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A complete frame.
    Frame(Frame<'a>),
    /// An SSE comment line (`: keepalive`), text after the colon.
    Comment(&'a str),
    /// A line over the size limit was discarded; its length so far.
    Oversized(usize),
    /// A frame whose bytes were not valid UTF-8 (replaced with U+FFFD before the adapter
    /// sees it).
    InvalidUtf8,
}

/// Which framing a stream uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Server-Sent Events.
    Sse,
    /// JSON Lines.
    Jsonl,
}

/// Incremental decoder for one stream.
#[derive(Debug)]
pub struct FrameDecoder {
    framing: Option<Framing>,
    max_frame: usize,
    buf: Vec<u8>,
    /// A line ended in CR: a following LF belongs to it.
    pending_cr: bool,
    /// Discarding the rest of an oversized line.
    skipping: bool,
    bom_checked: bool,
    // SSE event under construction.
    event_name: String,
    data: Vec<u8>,
    has_data: bool,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(None, DEFAULT_MAX_FRAME_BYTES)
    }
}

impl FrameDecoder {
    /// A decoder; `framing: None` sniffs it from the first significant byte.
    pub fn new(framing: Option<Framing>, max_frame: usize) -> FrameDecoder {
        FrameDecoder {
            framing,
            max_frame,
            buf: Vec::new(),
            pending_cr: false,
            skipping: false,
            bom_checked: false,
            event_name: String::new(),
            data: Vec::new(),
            has_data: false,
        }
    }

    /// The framing in use, once known.
    pub fn framing(&self) -> Option<Framing> {
        self.framing
    }

    /// Bytes buffered while waiting for a line end.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.data.len()
    }

    /// Feeds a chunk; calls `sink` for everything it completes.
    pub fn feed(&mut self, mut chunk: &[u8], sink: &mut dyn FnMut(Decoded<'_>)) {
        if chunk.is_empty() {
            return;
        }
        if !self.bom_checked {
            // The BOM itself may be split across chunks: wait for three bytes.
            if self.buf.len() + chunk.len() < 3 {
                self.buf.extend_from_slice(chunk);
                if !b"\xEF\xBB\xBF".starts_with(&self.buf) {
                    self.bom_checked = true;
                    let pending = std::mem::take(&mut self.buf);
                    self.feed(&pending, sink);
                }
                return;
            }
            self.bom_checked = true;
            if !self.buf.is_empty() {
                let mut joined = std::mem::take(&mut self.buf);
                joined.extend_from_slice(chunk);
                let start = if joined.starts_with(b"\xEF\xBB\xBF") {
                    3
                } else {
                    0
                };
                self.feed(&joined[start..], sink);
                return;
            }
            if chunk.starts_with(b"\xEF\xBB\xBF") {
                chunk = &chunk[3..];
            }
        }
        if chunk.is_empty() {
            return;
        }
        if self.pending_cr {
            self.pending_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        if self.buf.is_empty() {
            let used = self.lines(chunk, sink);
            self.keep_tail(&chunk[used..], sink);
        } else {
            self.complete_line(chunk, sink);
        }
    }

    /// A partial line waits in `buf`: completes it with `chunk`'s bytes up to its first
    /// line end and reads the rest of `chunk` in place — rather than copying all of
    /// `chunk` behind the partial line, which cost ~5% of `normalize` (a chunk boundary
    /// nearly always splits a line).
    fn complete_line(&mut self, chunk: &[u8], sink: &mut dyn FnMut(Decoded<'_>)) {
        let Some(end) = memchr2(b'\n', b'\r', chunk) else {
            self.keep_tail(chunk, sink);
            return;
        };
        let mut line = std::mem::take(&mut self.buf);
        line.extend_from_slice(&chunk[..=end]);
        self.lines(&line, sink);
        line.clear();
        // Keep the allocation for the next partial line.
        self.buf = line;
        let mut rest = &chunk[end + 1..];
        // The line ended in CR at the end of `line`: a LF that follows belongs to it.
        if self.pending_cr && !rest.is_empty() {
            self.pending_cr = false;
            if rest[0] == b'\n' {
                rest = &rest[1..];
            }
        }
        let used = self.lines(rest, sink);
        self.keep_tail(&rest[used..], sink);
    }

    /// The stream ended: completes a trailing line without a terminator and dispatches a
    /// pending SSE event (captures often lack the final blank line).
    pub fn finish(&mut self, sink: &mut dyn FnMut(Decoded<'_>)) {
        if !self.bom_checked {
            self.bom_checked = true;
        }
        let tail = std::mem::take(&mut self.buf);
        if !tail.is_empty() && !self.skipping {
            self.line(&tail, Checked::NONE, sink);
        }
        self.skipping = false;
        self.pending_cr = false;
        if self.framing == Some(Framing::Sse) {
            self.dispatch(sink);
        }
    }

    fn keep_tail(&mut self, tail: &[u8], sink: &mut dyn FnMut(Decoded<'_>)) {
        if self.skipping {
            return;
        }
        if self.buf.len() + tail.len() > self.max_frame {
            sink(Decoded::Oversized(self.buf.len() + tail.len()));
            self.buf.clear();
            self.skipping = true;
            return;
        }
        self.buf.extend_from_slice(tail);
    }

    /// Processes every complete line in `bytes`; returns how many bytes were consumed.
    fn lines(&mut self, bytes: &[u8], sink: &mut dyn FnMut(Decoded<'_>)) -> usize {
        let checked = Checked::lines_of(bytes);
        let mut pos = 0;
        while let Some(off) = memchr2(b'\n', b'\r', &bytes[pos..]) {
            let end = pos + off;
            let line = &bytes[pos..end];
            if self.skipping {
                self.skipping = false;
            } else if line.len() > self.max_frame {
                sink(Decoded::Oversized(line.len()));
            } else if let Some(after) = self.one_line_event(line, bytes, end, checked, sink) {
                pos = after;
                continue;
            } else {
                self.line(line, checked, sink);
            }
            pos = end + 1;
            if bytes[end] == b'\r' {
                match bytes.get(pos) {
                    Some(b'\n') => pos += 1,
                    Some(_) => {}
                    None => self.pending_cr = true,
                }
            }
        }
        pos
    }

    /// An SSE event of one `data:` line whose blank line follows in `bytes` — nearly every
    /// frame of a provider stream — dispatched from `bytes` in place: what [`Self::line`]
    /// does with the two lines, without copying the data into the event buffer or
    /// searching for the blank line's end (a fifth of an Anthropic normalize was framing,
    /// callgrind). `line` ends at `end`; answers where the blank line ends, or `None` to
    /// read the lines one by one.
    fn one_line_event(
        &mut self,
        line: &[u8],
        bytes: &[u8],
        end: usize,
        checked: Checked<'_>,
        sink: &mut dyn FnMut(Decoded<'_>),
    ) -> Option<usize> {
        if self.framing != Some(Framing::Sse) || self.has_data {
            return None;
        }
        let (b"data", value) = sse_field(line) else {
            return None;
        };
        // The data line's end: LF, CRLF or a lone CR (a CR that ends `bytes` leaves the LF
        // that may follow it to the next chunk: read one by one).
        let mut next = end + 1;
        if bytes[end] == b'\r' && *bytes.get(next)? == b'\n' {
            next += 1;
        }
        // The blank line, ended the same ways, and wholly in `bytes`.
        let after = match (bytes.get(next)?, bytes.get(next + 1)) {
            (b'\n', _) => next + 1,
            (b'\r', Some(b'\n')) => next + 2,
            (b'\r', Some(_)) => next + 1,
            _ => return None,
        };
        emit_event(&mut self.event_name, value, checked, sink);
        Some(after)
    }

    /// One complete line; `checked` may hold it as text already.
    fn line(&mut self, line: &[u8], checked: Checked<'_>, sink: &mut dyn FnMut(Decoded<'_>)) {
        let framing = match self.framing {
            Some(f) => f,
            None => {
                let Some(first) = line.iter().find(|b| !b.is_ascii_whitespace()) else {
                    return;
                };
                let f = if *first == b'{' || *first == b'[' {
                    Framing::Jsonl
                } else {
                    Framing::Sse
                };
                self.framing = Some(f);
                f
            }
        };
        match framing {
            Framing::Jsonl => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    return;
                }
                emit_text(line, None, checked, sink);
            }
            Framing::Sse => self.sse_line(line, checked, sink),
        }
    }

    fn sse_line(&mut self, line: &[u8], checked: Checked<'_>, sink: &mut dyn FnMut(Decoded<'_>)) {
        if line.is_empty() {
            self.dispatch(sink);
            return;
        }
        if line[0] == b':' {
            let text = String::from_utf8_lossy(&line[1..]);
            sink(Decoded::Comment(text.trim_start()));
            return;
        }
        let (field, value) = sse_field(line);
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event_name.clear();
                // Text the chunk's check already holds, else checked here: the lossy
                // decoder's chunk iterator cost a few percent of the families that name
                // every event (`perf`).
                match checked
                    .text_of(value)
                    .map_or_else(|| std::str::from_utf8(value), Ok)
                {
                    Ok(name) => self.event_name.push_str(name),
                    Err(_) => self.event_name.push_str(&String::from_utf8_lossy(value)),
                }
            }
            // `id`, `retry` and unknown fields carry nothing an adapter needs.
            _ => {}
        }
    }

    fn dispatch(&mut self, sink: &mut dyn FnMut(Decoded<'_>)) {
        if self.has_data {
            emit_event(&mut self.event_name, &self.data, Checked::NONE, sink);
        }
        self.data.clear();
        self.has_data = false;
        self.event_name.clear();
    }
}

/// An SSE field line's name and value: the value after the first colon, less one leading
/// space; a line without a colon is a name with an empty value.
fn sse_field(line: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b':', line) {
        Some(i) => {
            let v = &line[i + 1..];
            (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
        }
        None => (line, &b""[..]),
    }
}

/// Hands on an SSE event's data under the event name so far, which it then clears.
fn emit_event(
    event_name: &mut String,
    data: &[u8],
    checked: Checked<'_>,
    sink: &mut dyn FnMut(Decoded<'_>),
) {
    let name = (!event_name.is_empty()).then_some(event_name.as_str());
    emit_text(data, name, checked, sink);
    event_name.clear();
}

/// The complete lines of the bytes being read, checked as UTF-8 in one pass — `None` when
/// any of them is not. Checking each ~100-byte line on its own cost ~85 instructions a
/// line in setup alone, 4.5% of a codex normalize (callgrind); one check of a chunk's
/// lines costs a fraction of that. A line of valid text is valid text by itself, since
/// every line ends at an ASCII byte (CR, LF), which never falls inside a UTF-8 sequence.
#[derive(Debug, Clone, Copy)]
struct Checked<'a>(Option<&'a str>);

impl<'a> Checked<'a> {
    /// Nothing checked: every frame is checked on its own.
    const NONE: Checked<'static> = Checked(None);

    /// Checks `bytes` up to the end of its last complete line.
    fn lines_of(bytes: &'a [u8]) -> Checked<'a> {
        let end = memchr::memrchr2(b'\n', b'\r', bytes).map_or(0, |at| at + 1);
        Checked(simdutf8::basic::from_utf8(&bytes[..end]).ok())
    }

    /// `part` as text, when it lies within the checked bytes (the same memory: a line or
    /// a field value sliced from them); `None` for bytes from anywhere else.
    fn text_of(self, part: &[u8]) -> Option<&'a str> {
        let text = self.0?;
        let start = part.as_ptr().addr().checked_sub(text.as_ptr().addr())?;
        text.get(start..start.checked_add(part.len())?)
    }
}

fn emit_text(
    bytes: &[u8],
    event: Option<&str>,
    checked: Checked<'_>,
    sink: &mut dyn FnMut(Decoded<'_>),
) {
    if let Some(data) = checked.text_of(bytes) {
        sink(Decoded::Frame(Frame { event, data }));
        return;
    }
    // The same verdict as `std::str::from_utf8` (the test below holds them together), in
    // SIMD: std's check was 6.5% of a whole `normalize` run (codex app-server, perf).
    match simdutf8::basic::from_utf8(bytes) {
        Ok(data) => sink(Decoded::Frame(Frame { event, data })),
        Err(_) => {
            sink(Decoded::InvalidUtf8);
            let lossy = String::from_utf8_lossy(bytes);
            sink(Decoded::Frame(Frame {
                event,
                data: &lossy,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]]) -> Vec<String> {
        let mut d = FrameDecoder::default();
        let mut out = Vec::new();
        let mut sink = |x: Decoded<'_>| match x {
            Decoded::Frame(f) => out.push(format!("{}|{}", f.event.unwrap_or("-"), f.data)),
            Decoded::Comment(c) => out.push(format!("#{c}")),
            other => out.push(format!("{other:?}")),
        };
        for c in chunks {
            d.feed(c, &mut sink);
        }
        d.finish(&mut sink);
        out
    }

    /// A frame is text exactly when the standard library's check says its bytes are
    /// UTF-8; any other frame is reported and handed on with replacement characters.
    #[test]
    fn frames_are_text_exactly_when_their_bytes_are_utf8() {
        // simdutf8 checks 64-byte blocks with vector code and the rest byte by byte: the
        // long lines put a multibyte character across byte 64 and bad bytes past it.
        let pad = "x".repeat(57);
        let long = |tail: &[u8]| [format!("{{\"a\":\"{pad}").as_bytes(), tail, b"\"}"].concat();
        let lines: Vec<Vec<u8>> = vec![
            b"{\"a\":\"plain\"}".to_vec(),
            "{\"a\":\"\u{e9}\u{1f600} short\"}".as_bytes().to_vec(),
            long("\u{e9}\u{1f600} across the block edge, then more text".as_bytes()),
            long("\u{1f600}".repeat(40).as_bytes()),
            long(b"past the block edge \xff"),
            long(b"a character cut at the end \xe2\x82"),
            long(b"an overlong one \xc0\xaf past the edge"),
            b"{\"a\":\"\xff\"}".to_vec(),
            b"{\"a\":\"cut \xe2\x82\"}".to_vec(),
            b"{\"a\":\"overlong \xc0\xaf\"}".to_vec(),
            b"{\"a\":\"surrogate \xed\xa0\x80 in a line longer than sixty-four bytes, too\"}"
                .to_vec(),
            b"{\"a\":\"past U+10FFFF \xf4\x90\x80\x80\"}".to_vec(),
            b"[\x80]".to_vec(),
        ];
        assert_eq!(
            &lines[2][63..65],
            "\u{e9}".as_bytes(),
            "\u{e9} spans bytes 63 and 64"
        );
        let text = lines.iter().filter(|l| std::str::from_utf8(l).is_ok());
        assert_eq!(text.count(), 4, "four lines are UTF-8, the rest are not");
        for line in &lines {
            let line = line.as_slice();
            let mut capture = line.to_vec();
            capture.push(b'\n');
            let out = decode(&[&capture]);
            match std::str::from_utf8(line) {
                Ok(text) => assert_eq!(out, vec![format!("-|{text}")]),
                Err(_) => assert_eq!(
                    out,
                    vec![
                        "InvalidUtf8".to_owned(),
                        format!("-|{}", String::from_utf8_lossy(line))
                    ]
                ),
            }
        }
    }

    /// The lines of a chunk are checked as UTF-8 together: a line that is not text is
    /// reported alone and its neighbours stay text, however the stream is cut into chunks
    /// (a cut inside a multibyte character included).
    #[test]
    fn one_bad_line_leaves_its_neighbours_text() {
        let jsonl: &[u8] =
            b"{\"a\":\"h\xc3\xa9\"}\n{\"a\":\"\xff\"}\r\n{\"a\":\"\xf0\x9f\x98\x80\"}\n";
        let sse: &[u8] =
            b"data: h\xc3\xa9\n\ndata: \xe2\x82\n\nevent: e\ndata: \xf0\x9f\x98\x80\n\n";
        let expected: [&[&str]; 2] = [
            &[
                "-|{\"a\":\"h\u{e9}\"}",
                "InvalidUtf8",
                "-|{\"a\":\"\u{fffd}\"}",
                "-|{\"a\":\"\u{1f600}\"}",
            ],
            &["-|h\u{e9}", "InvalidUtf8", "-|\u{fffd}", "e|\u{1f600}"],
        ];
        for (input, expected) in [jsonl, sse].into_iter().zip(expected) {
            assert_eq!(decode(&[input]), expected);
            for i in 0..input.len() {
                assert_eq!(
                    decode(&[&input[..i], &input[i..]]),
                    expected,
                    "split at {i}"
                );
            }
        }
    }

    #[test]
    fn sse_fields_comments_multiline_and_done() {
        let out = decode(&[b"\xEF\xBB\xBF: ping\r\nevent: a\r\ndata: {\"x\":1}\r\n\r\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n"]);
        assert_eq!(out, vec!["#ping", "a|{\"x\":1}", "-|l1\nl2", "-|[DONE]"]);
    }

    /// Events of one data line, dispatched in place, read as the lines one by one are: a
    /// field with and without its space or colon, each line end, the event name reset.
    #[test]
    fn one_line_events_read_as_their_lines_are() {
        let input = b"event: a\ndata: 1\n\ndata:2\r\n\r\ndata\n\nevent: b\rdata:  3\r\rdata: 4\n\rdataX: 5\n\n";
        let out = decode(&[input]);
        assert_eq!(out, vec!["a|1", "-|2", "-|", "b| 3", "-|4"]);
        for i in 0..input.len() {
            assert_eq!(decode(&[&input[..i], &input[i..]]), out, "split at {i}");
        }
    }

    #[test]
    fn jsonl_with_crlf_and_blank_lines() {
        let out = decode(&[b"{\"a\":1}\r\n\r\n{\"b\":2}"]);
        assert_eq!(out, vec!["-|{\"a\":1}", "-|{\"b\":2}"]);
    }

    #[test]
    fn every_split_point_gives_the_same_frames() {
        let input = "\u{FEFF}event: e\r\ndata: {\"t\":\"h\u{e9}\u{1F600}\"}\r\n\r\n: c\rdata: x\r\rdata: y\n\n".as_bytes();
        let whole = decode(&[input]);
        for i in 0..input.len() {
            for j in i..input.len() {
                let got = decode(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, whole, "split at {i},{j}");
            }
        }
    }

    /// What a JSONL decoder with an 8-byte frame limit makes of `chunks`.
    fn decode_limited(chunks: &[&[u8]]) -> Vec<String> {
        let mut d = FrameDecoder::new(Some(Framing::Jsonl), 8);
        let mut out = Vec::new();
        let mut sink = |x: Decoded<'_>| out.push(format!("{x:?}"));
        for c in chunks {
            d.feed(c, &mut sink);
        }
        d.finish(&mut sink);
        out
    }

    #[test]
    fn oversized_lines_are_reported_and_skipped() {
        let out = decode_limited(&[b"{\"a\":12345", b"6789}\n{}\n"]);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].starts_with("Oversized"), "{out:?}");
        assert!(out[1].contains("\"{}\""), "{out:?}");

        // A partial line that fits, completed past the limit by the next chunk.
        let out = decode_limited(&[b"{\"a\":1", b"2345}\n{}\n"]);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].starts_with("Oversized(11)"), "{out:?}");
        assert!(out[1].contains("\"{}\""), "{out:?}");
    }
}

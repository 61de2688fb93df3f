//! The canonical JSON line of an event, written straight into a byte buffer.
//!
//! Text and thinking deltas are nearly every event of a long run, and serde_json's
//! serializer cost a quarter of `streamgate normalize` (docs/performance.md, `perf`): it
//! escape-scans every key byte by byte and checks every byte of a value against its
//! escape table one at a time. Here the keys are literals and a value's bytes are scanned
//! eight at a time, so only a word that holds a byte to escape is looked at byte by byte.
//! This is hand-written for that measured cost; tool items and lifecycle events, which
//! are few in a run, still go through serde. The output is byte for byte serde_json's
//! (same field order, same escapes), which the tests hold over any text.

use crate::event::{
    Assistant, AssistantPhase, Event, EventData, SegmentPhase, SegmentStatus, Thinking,
};
use std::io::{self, Write};

/// Writes `event`'s canonical JSON line (no newline) to `out`: a `Vec<u8>`, or a buffered
/// writer, so that one event holding megabytes of text is never built whole in memory.
/// Fails only when `out` does.
pub fn write_event<W: Write>(out: &mut W, event: &Event) -> io::Result<()> {
    // Few and long pieces: every `write_all` into a buffered writer is a capacity check
    // and a copy, and a line of a dozen small ones cost more than its text (`perf`). The
    // stream names are the ones `Stream::as_str` gives (the tests hold the line to serde's).
    out.write_all(b"{\"seq\":")?;
    out.write_all(itoa::Buffer::new().format(event.seq).as_bytes())?;
    match &event.data {
        EventData::Assistant(a) => {
            out.write_all(b",\"stream\":\"assistant\",\"data\":{")?;
            write_assistant(out, a)?;
            out.write_all(b"}}")
        }
        EventData::Thinking(t) => {
            out.write_all(b",\"stream\":\"thinking\",\"data\":{")?;
            write_thinking(out, t)?;
            out.write_all(b"}}")
        }
        EventData::Item(item) => {
            out.write_all(b",\"stream\":\"item\",\"data\":")?;
            serde_json::to_writer(&mut *out, item)?;
            out.write_all(b"}")
        }
        EventData::Lifecycle(l) => {
            out.write_all(b",\"stream\":\"lifecycle\",\"data\":")?;
            serde_json::to_writer(&mut *out, l)?;
            out.write_all(b"}")
        }
    }
}

/// An upper bound of a text or thinking event's line length, found without writing it:
/// an escaped byte takes at most six (`\u00xx`), and the rest of the line — keys, names,
/// two numbers — is well under 256 bytes. `None` for tool items and lifecycle events
/// (their provider objects are measured by writing them).
pub fn text_event_len_bound(event: &Event) -> Option<usize> {
    let texts = match &event.data {
        EventData::Assistant(a) => [&a.id, &a.delta, &a.text],
        EventData::Thinking(t) => [&t.id, &t.delta, &t.text],
        EventData::Item(_) | EventData::Lifecycle(_) => return None,
    };
    let text_bytes: usize = texts
        .iter()
        .filter_map(|t| t.as_ref())
        .map(String::len)
        .sum();
    Some(text_bytes.saturating_mul(6).saturating_add(256))
}

/// The members of `{"id","phase","delta","text","status","truncated"}` as present, in the
/// struct's order (the braces are the caller's).
fn write_assistant<W: Write>(out: &mut W, a: &Assistant) -> io::Result<()> {
    // Destructured so that a field added to the struct fails to compile here.
    let Assistant {
        id,
        phase,
        delta,
        text,
        status,
        truncated,
    } = a;
    let mut object = Object::members(out);
    if let Some(id) = id {
        object.string("id", id)?;
    }
    if let Some(phase) = phase {
        object.name("phase", assistant_phase(*phase))?;
    }
    if let Some(delta) = delta {
        object.string("delta", delta)?;
    }
    if let Some(text) = text {
        object.string("text", text)?;
    }
    if let Some(status) = status {
        object.name("status", segment_status(*status))?;
    }
    if let Some(truncated) = truncated {
        object.raw("truncated", if *truncated { "true" } else { "false" })?;
    }
    Ok(())
}

/// The members of `{"id","variant","phase","delta","text","tokens"}` as present, in the
/// struct's order (the braces are the caller's).
fn write_thinking<W: Write>(out: &mut W, t: &Thinking) -> io::Result<()> {
    let Thinking {
        id,
        variant,
        phase,
        delta,
        text,
        tokens,
    } = t;
    let mut object = Object::members(out);
    if let Some(id) = id {
        object.string("id", id)?;
    }
    object.name("variant", variant.as_str())?;
    if let Some(phase) = phase {
        object.name("phase", segment_phase(*phase))?;
    }
    if let Some(delta) = delta {
        object.string("delta", delta)?;
    }
    if let Some(text) = text {
        object.string("text", text)?;
    }
    if let Some(tokens) = tokens {
        object.raw("tokens", itoa::Buffer::new().format(*tokens))?;
    }
    Ok(())
}

fn assistant_phase(phase: AssistantPhase) -> &'static str {
    match phase {
        AssistantPhase::Commentary => "commentary",
        AssistantPhase::FinalAnswer => "final_answer",
    }
}

fn segment_status(status: SegmentStatus) -> &'static str {
    match status {
        SegmentStatus::InProgress => "in_progress",
        SegmentStatus::Completed => "completed",
    }
}

fn segment_phase(phase: SegmentPhase) -> &'static str {
    match phase {
        SegmentPhase::Start => "start",
        SegmentPhase::End => "end",
    }
}

/// The members of a JSON object being written, separated by commas, with keys known not
/// to need escaping. Each member is three or four pieces: the separator and key's opening
/// quote, the key, its closing quote and colon (with the value's opening quote, for a
/// string), the value. Always inlined: the keys and names are literals at every call,
/// so their copies become a few moves of known length instead of a `memcpy` call each
/// (the writes were two fifths of an Anthropic or codex normalize, callgrind).
struct Object<'a, W> {
    out: &'a mut W,
    first: bool,
}

impl<'a, W: Write> Object<'a, W> {
    /// Members written right after the object's opening brace.
    #[inline(always)]
    fn members(out: &'a mut W) -> Object<'a, W> {
        Object { out, first: true }
    }

    /// The key, then `then` (`":` or `":"`).
    #[inline(always)]
    fn key(&mut self, key: &str, then: &[u8]) -> io::Result<()> {
        self.out
            .write_all(if self.first { b"\"" } else { b",\"" })?;
        self.first = false;
        self.out.write_all(key.as_bytes())?;
        self.out.write_all(then)
    }

    /// A member whose value is any text, escaped.
    #[inline(always)]
    fn string(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.key(key, b"\":\"")?;
        write_string_rest(self.out, value)
    }

    /// A member whose value is a name known not to need escaping.
    #[inline(always)]
    fn name(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.key(key, b"\":\"")?;
        self.out.write_all(value.as_bytes())?;
        self.out.write_all(b"\"")
    }

    /// A member whose value is JSON text already (a number, a boolean).
    #[inline(always)]
    fn raw(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.key(key, b"\":")?;
        self.out.write_all(value.as_bytes())
    }
}

/// Writes `s` as a JSON string, escaped exactly as serde_json escapes it: `"` and `\`,
/// the five short control escapes, every other control byte as `\u00xx` (lowercase hex);
/// everything else, DEL and non-ASCII included, as it is.
pub fn write_string<W: Write>(out: &mut W, s: &str) -> io::Result<()> {
    out.write_all(b"\"")?;
    write_string_rest(out, s)
}

/// [`write_string`] after its opening quote: the escaped text and the closing quote.
fn write_string_rest<W: Write>(out: &mut W, s: &str) -> io::Result<()> {
    let bytes = s.as_bytes();
    let mut start = 0; // first byte not yet written
    while let Some(at) = special_byte_to_end(&bytes[start..]) {
        let at = start + at;
        out.write_all(&bytes[start..at])?;
        escape_of(bytes[at]).write(out)?;
        start = at + 1;
    }
    out.write_all(&bytes[start..])?;
    out.write_all(b"\"")
}

/// The position of the first byte a JSON string cannot hold as it is — `"`, `\` or a
/// control byte (< 0x20) — scanning eight bytes at a time. A reader's plain string body
/// ends there. (Short strings are the common case, where this beats a vectorized search,
/// whose setup costs more than the scan.) Inlined: it is called for every key and string
/// of every hot frame, most of them a word or two long.
#[inline]
pub fn special_byte(bytes: &[u8]) -> Option<usize> {
    match special_in_words(bytes) {
        Ok(at) => Some(at),
        Err(rest) => bytes[rest..]
            .iter()
            .position(|&b| is_special(b))
            .map(|i| rest + i),
    }
}

/// [`special_byte`] for a writer, which scans every string to its end: the bytes after
/// the last whole word are read as one more word ([`special_in_tail`]) rather than one by
/// one — the byte loop was a third of writing an event's strings (callgrind). Readers keep
/// the byte loop: they nearly always stop at a quote inside a word, and the extra code
/// made them slower where they are inlined (callgrind, Gemini and codex app-server +2%).
fn special_byte_to_end(bytes: &[u8]) -> Option<usize> {
    match special_in_words(bytes) {
        Ok(at) => Some(at),
        Err(rest) if rest == bytes.len() => None,
        Err(_) => special_in_tail(bytes),
    }
}

/// The first special byte among `bytes`' whole eight-byte words, or where the bytes after
/// the last whole word start.
#[inline(always)]
fn special_in_words(bytes: &[u8]) -> Result<usize, usize> {
    let mut at = 0;
    for word in bytes.chunks_exact(8) {
        if let Some(i) = first_marked(special_bytes(word_of(word))) {
            return Ok(at + i);
        }
        at += 8;
    }
    Err(at)
}

/// The first special byte of the last `bytes.len() % 8` bytes (none of the bytes before
/// them is special), read as one word. The word reaches back over bytes already read:
/// none of them is special, so none is marked — a mark only ever follows a special byte —
/// and the lowest mark is still the first special byte.
fn special_in_tail(bytes: &[u8]) -> Option<usize> {
    let len = bytes.len();
    if len >= 8 {
        let last = len - 8;
        return first_marked(special_bytes(word_of(&bytes[last..]))).map(|i| last + i);
    }
    if len >= 4 {
        // Four to seven bytes: the first four and the last four (overlapping) as one word.
        let mut w = [0u8; 8];
        w[..4].copy_from_slice(&bytes[..4]);
        w[4..].copy_from_slice(&bytes[len - 4..]);
        // A mark in the upper half is byte `i - 4` of the last four.
        return first_marked(special_bytes(u64::from_le_bytes(w))).map(|i| {
            if i < 4 {
                i
            } else {
                len - 4 + (i - 4)
            }
        });
    }
    bytes.iter().position(|&b| is_special(b))
}

/// Eight bytes as a little-endian word.
#[inline(always)]
fn word_of(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(bytes);
    u64::from_le_bytes(w)
}

/// The byte index of the lowest mark of [`special_bytes`] (little-endian: the first in
/// the slice), if any.
#[inline(always)]
fn first_marked(found: u64) -> Option<usize> {
    (found != 0).then(|| (found.trailing_zeros() / 8) as usize)
}

fn is_special(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `word` that is a control byte (< 0x20), `"` or `\`, and
/// perhaps of bytes after the first such byte — never before it: the classic has-zero /
/// has-less bit tricks, where a borrow only runs from a byte that really matches into the
/// bytes above it (later ones, read little-endian). So the lowest mark is exact.
fn special_bytes(word: u64) -> u64 {
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let quote = quote.wrapping_sub(ONES) & !quote;
    let backslash = backslash.wrapping_sub(ONES) & !backslash;
    (control | quote | backslash) & HIGHS
}

/// How one byte is escaped.
enum Escape {
    /// `\` and a letter (or the quote or backslash itself).
    Short(u8),
    /// `\u00` and two lowercase hex digits.
    Unicode(u8),
}

impl Escape {
    fn write<W: Write>(self, out: &mut W) -> io::Result<()> {
        match self {
            Escape::Short(letter) => out.write_all(&[b'\\', letter]),
            Escape::Unicode(byte) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let (high, low) = (HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]);
                out.write_all(&[b'\\', b'u', b'0', b'0', high, low])
            }
        }
    }
}

/// How a special byte (see [`special_byte`]) is escaped.
fn escape_of(byte: u8) -> Escape {
    match byte {
        b'"' => Escape::Short(b'"'),
        b'\\' => Escape::Short(b'\\'),
        0x08 => Escape::Short(b'b'),
        0x0c => Escape::Short(b'f'),
        b'\n' => Escape::Short(b'n'),
        b'\r' => Escape::Short(b'r'),
        b'\t' => Escape::Short(b't'),
        _ => Escape::Unicode(byte),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Item, ItemPhase, Lifecycle, LifecyclePhase, ThinkingVariant};
    use crate::Json;
    use proptest::prelude::*;

    fn line(event: &Event) -> String {
        let mut out = Vec::new();
        write_event(&mut out, event).expect("a Vec takes every byte");
        String::from_utf8(out).expect("the line is UTF-8")
    }

    fn serde_line(event: &Event) -> String {
        serde_json::to_string(event).expect("serializes")
    }

    #[test]
    fn every_escape_is_serde_jsons() {
        let all: String = (0u8..0x80).map(char::from).collect();
        for s in [
            all.as_str(),
            "",
            "plain words, eight or more of them",
            "\"quoted\" \\ back\\slash",
            "tab\there\nnew line\r\u{8}\u{c}\u{1}\u{1f}\u{7f}",
            "non-ASCII: é ü 漢字 🙂 and \u{2028}\u{2029}",
            "1234567\"",
            "12345678\\",
        ] {
            let mut out = Vec::new();
            write_string(&mut out, s).expect("a Vec takes every byte");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(s).unwrap()
            );
        }
    }

    #[test]
    fn every_text_event_shape_is_serde_jsons() {
        let variants = [
            ThinkingVariant::Raw,
            ThinkingVariant::Summary,
            ThinkingVariant::Redacted,
        ];
        for variant in variants {
            for phase in [None, Some(SegmentPhase::Start), Some(SegmentPhase::End)] {
                let t = Thinking {
                    id: Some("0".into()),
                    variant,
                    phase,
                    delta: Some("d".into()),
                    text: Some("t".into()),
                    tokens: Some(12),
                };
                let ev = Event {
                    seq: 3,
                    data: EventData::Thinking(t),
                };
                assert_eq!(line(&ev), serde_line(&ev));
            }
        }
        for phase in [
            None,
            Some(AssistantPhase::Commentary),
            Some(AssistantPhase::FinalAnswer),
        ] {
            for status in [
                None,
                Some(SegmentStatus::InProgress),
                Some(SegmentStatus::Completed),
            ] {
                for truncated in [None, Some(true), Some(false)] {
                    let a = Assistant {
                        id: Some("1:0".into()),
                        phase,
                        delta: None,
                        text: Some("snapshot".into()),
                        status,
                        truncated,
                    };
                    let ev = Event {
                        seq: u64::MAX,
                        data: EventData::Assistant(a),
                    };
                    assert_eq!(line(&ev), serde_line(&ev));
                }
            }
        }
        let empty = Event {
            seq: 0,
            data: EventData::Assistant(Assistant::default()),
        };
        assert_eq!(line(&empty), serde_line(&empty));
    }

    #[test]
    fn items_and_lifecycle_events_are_serde_jsons() {
        let item = Item {
            phase: ItemPhase::End,
            id: Some("call_1".into()),
            name: Some("get_weather".into()),
            arguments: Json::parse(r#"{"city":"Paris"}"#),
            ..Item::default()
        };
        let start = Lifecycle {
            provider: Some("openai".into()),
            usage: Some(Json::null()),
            ..Lifecycle::new(LifecyclePhase::Start)
        };
        for data in [EventData::from(item), EventData::from(start)] {
            let ev = Event { seq: 9, data };
            assert_eq!(line(&ev), serde_line(&ev));
        }
    }

    proptest! {
        #[test]
        fn the_special_byte_is_the_first_a_string_cannot_hold(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let first = bytes.iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\');
            prop_assert_eq!(special_byte(&bytes), first);
            prop_assert_eq!(special_byte_to_end(&bytes), first);
        }

        /// Bytes next to the three the bit tricks look for, several special ones per word:
        /// the one reported must be the first, not one a borrow marked after it.
        #[test]
        fn the_first_of_several_special_bytes_in_a_word_is_reported(
            bytes in proptest::collection::vec(proptest::sample::select(vec![
                0x00u8, 0x01, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7f, 0x80, 0x9f,
                0xa0, 0xa2, 0xdc, 0xff, b'a',
            ]), 0..40),
        ) {
            let first = bytes.iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\');
            prop_assert_eq!(special_byte(&bytes), first);
            prop_assert_eq!(special_byte_to_end(&bytes), first);
        }

        #[test]
        fn any_text_is_written_as_serde_writes_it(
            delta in ".*",
            text in proptest::option::of(".*"),
            id in proptest::option::of("[ -~]{0,12}"),
            seq in any::<u64>(),
            tokens in proptest::option::of(any::<u64>()),
        ) {
            let thinking = Event {
                seq,
                data: EventData::Thinking(Thinking {
                    id: id.clone(),
                    variant: ThinkingVariant::Raw,
                    phase: None,
                    delta: Some(delta.clone()),
                    text: text.clone(),
                    tokens,
                }),
            };
            prop_assert_eq!(line(&thinking), serde_line(&thinking));
            let assistant = Event {
                seq,
                data: EventData::Assistant(Assistant {
                    id,
                    phase: Some(AssistantPhase::Commentary),
                    delta: Some(delta),
                    text,
                    status: Some(SegmentStatus::InProgress),
                    truncated: None,
                }),
            };
            prop_assert_eq!(line(&assistant), serde_line(&assistant));
        }
    }
}

//! Reading a frame of one known, exact shape without a JSON parser: the hot path of the
//! families whose long runs are nearly all one frame shape (an Anthropic text delta, a
//! codex `item.completed`).
//!
//! Two ways to read one: a literal template (keys in the provider's order, no whitespace:
//! [`Cursor::literal`] and the value readers), or — for providers whose key order or
//! spacing varies, like Gemini's — member by member ([`Cursor::object`],
//! [`Cursor::list`]), with a closure that reads the members the adapter knows and
//! refuses any other; [`once`] keeps a member from counting twice.
//!
//! Hand-written for measured performance: serde's derived reading of an Anthropic delta
//! frame costs ~280 ns on the reference box where validating the same bytes costs ~90 ns
//! (its visitors move the adapters' wide wire structs through their returns); reading
//! the hot frames this way made the families 1.2–3.7× faster end to end
//! (docs/performance.md). It stays exact by accepting only what it can read as serde
//! would — the template's literals, or the members the caller knows — and answering
//! `None` for anything else, which the caller then reads the generic (serde) way. It
//! never accepts what serde would refuse and never reads a value differently: a string
//! holding an escape is decoded by serde_json itself, a raw value is delimited and
//! validated by serde_json, a raw control character or a number that is not a plain
//! `u64` sends the frame the generic way.

use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::line::special_byte;

/// What [`Cursor::list`] reads: a hot frame's array, nearly always of one element (a
/// chunk's one choice, a candidate's one part), held without an allocation: a `Vec` for
/// it was a malloc and a free per frame (`perf`).
pub(crate) type List<T> = smallvec::SmallVec<[T; 1]>;

/// A position in a frame being matched against a template.
pub(crate) struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `frame`.
    pub(crate) fn new(frame: &'a str) -> Cursor<'a> {
        Cursor { rest: frame }
    }

    /// Steps over `literal`, or `None` when the frame does not go on with it.
    pub(crate) fn literal(&mut self, literal: &str) -> Option<()> {
        self.rest = self.rest.strip_prefix(literal)?;
        Some(())
    }

    /// Steps over one ASCII punctuation byte (`{`, `:`, `,` …): [`Cursor::literal`] for
    /// the one-byte tokens read around every member, without a string comparison.
    fn byte(&mut self, byte: u8) -> Option<()> {
        debug_assert!(byte.is_ascii());
        if self.rest.as_bytes().first() != Some(&byte) {
            return None;
        }
        // An ASCII byte is a whole character: the rest starts on a boundary.
        self.rest = self.rest.get(1..)?;
        Some(())
    }

    /// Steps over whichever of `choices` the frame goes on with and tells which.
    pub(crate) fn one_of<const N: usize>(&mut self, choices: [&str; N]) -> Option<usize> {
        let i = choices.iter().position(|c| self.rest.starts_with(c))?;
        self.rest = &self.rest[choices[i].len()..];
        Some(i)
    }

    /// A JSON unsigned integer as serde reads it into a `u64`: digits, no leading zero,
    /// no sign, fraction or exponent, no overflow.
    pub(crate) fn uint(&mut self) -> Option<u64> {
        // Digit by digit, with the overflow checks `str::parse` makes: the counters of a hot
        // frame are a few digits, and `parse` (sign, radix, a second pass) cost more.
        let bytes = self.rest.as_bytes();
        let mut value: u64 = 0;
        let mut digits = 0;
        while let Some(&b) = bytes.get(digits) {
            if !b.is_ascii_digit() {
                break;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            digits += 1;
        }
        if digits == 0 || (digits > 1 && bytes[0] == b'0') {
            return None;
        }
        if matches!(bytes.get(digits), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        // Digits are ASCII: the rest starts on a boundary.
        self.rest = self.rest.get(digits..)?;
        Some(value)
    }

    /// A JSON string: borrowed when it holds no escape; decoded here when its escapes are
    /// the two-character ones (`\n`, `\"` …: what model text is full of), else by
    /// serde_json (a `\u` escape, with its surrogate pairs and refusals).
    ///
    /// Inlined, with the escapes read apart ([`Cursor::escaped_string`]): a hot frame reads
    /// four or five short plain strings, and the whole reader as one function cost ~80
    /// instructions a string, a fifth of it saving and restoring registers (callgrind).
    #[inline]
    pub(crate) fn string(&mut self) -> Option<Cow<'a, str>> {
        let body = self.rest.strip_prefix('"')?;
        let at = special_byte(body.as_bytes())?;
        if body.as_bytes()[at] == b'"' {
            self.rest = &body[at + 1..];
            return Some(Cow::Borrowed(&body[..at]));
        }
        self.escaped_string(body, at)
    }

    /// [`Cursor::string`] from its first special byte on (at `at` in `body`, the string
    /// after its opening quote), when that is not the closing quote.
    #[inline(never)]
    fn escaped_string(&mut self, body: &'a str, at: usize) -> Option<Cow<'a, str>> {
        let bytes = body.as_bytes();
        if bytes[at] != b'\\' {
            // A raw control character: serde refuses the string.
            return None;
        }
        match short_escapes(body, at) {
            Unescaped::Done(decoded, end) => {
                self.rest = &body[end + 1..];
                Some(Cow::Owned(decoded))
            }
            Unescaped::Refused => None,
            Unescaped::Unicode => {
                let end = escaped_string_end(bytes, at)?;
                let decoded: String = serde_json::from_str(&self.rest[..end + 2]).ok()?;
                self.rest = &body[end + 1..];
                Some(Cow::Owned(decoded))
            }
        }
    }

    /// [`Cursor::string`], with the string's text as the frame has it (quotes and
    /// escapes included).
    pub(crate) fn string_token(&mut self) -> Option<(Cow<'a, str>, &'a str)> {
        let start = self.rest;
        let value = self.string()?;
        Some((value, &start[..start.len() - self.rest.len()]))
    }

    /// A member's key as [`Cursor::object`] matches it: a string without an escape
    /// (serde would match the unescaped name: a key holding one leaves the frame to it).
    fn plain_key(&mut self) -> Option<&'a str> {
        let body = self.rest.strip_prefix('"')?;
        let at = special_byte(body.as_bytes())?;
        if body.as_bytes()[at] != b'"' {
            return None;
        }
        self.rest = &body[at + 1..];
        Some(&body[..at])
    }

    /// Steps over a string as serde_json's raw-value reader does — checking its escapes
    /// without decoding them (a `\u` escape needs four hex digits, not a valid code
    /// point: serde_json's `ignore_escape` in the locked version, which the skipped-value
    /// test holds with a lone surrogate) — or `None` where that reader refuses it (a raw
    /// control character, another escape, no end). Only for members serde skips or keeps
    /// raw, never for a value read as text.
    fn skip_string(&mut self) -> Option<()> {
        let body = self.rest.strip_prefix('"')?;
        let bytes = body.as_bytes();
        let mut at = special_byte(bytes)?;
        loop {
            match bytes[at] {
                b'"' => break,
                b'\\' => {}
                _ => return None,
            }
            let after = match *bytes.get(at + 1)? {
                letter if short_escape(letter).is_some() => at + 2,
                b'u' if bytes.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => at + 6,
                _ => return None,
            };
            at = after + special_byte(&bytes[after..])?;
        }
        self.rest = &body[at + 1..];
        Some(())
    }

    /// Steps over JSON whitespace, which some providers pad their frames with (Anthropic
    /// writes spaces before a delta frame's last brace).
    pub(crate) fn whitespace(&mut self) {
        // Byte by byte: most frames have none, and a `char` pattern decodes each
        // character before comparing it.
        let spaces = self
            .rest
            .bytes()
            .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
        if spaces > 0 {
            self.rest = self.rest.get(spaces..).unwrap_or_default();
        }
    }

    /// A JSON `true` or `false`.
    pub(crate) fn boolean(&mut self) -> Option<bool> {
        self.one_of(["true", "false"]).map(|i| i == 0)
    }

    /// Any JSON value, validated and delimited by serde_json itself and borrowed as it
    /// stands (`null` included: a caller whose field reads `null` as absent says so).
    pub(crate) fn raw_value(&mut self) -> Option<&'a RawValue> {
        let mut values = serde_json::Deserializer::from_str(self.rest).into_iter::<&RawValue>();
        let value = values.next()?.ok()?;
        self.rest = &self.rest[values.byte_offset()..];
        Some(value)
    }

    /// Steps over any JSON value, as [`Cursor::raw_value`] would: a plain string or
    /// unsigned integer (the ids, names and counters around a hot frame's text) read here,
    /// anything else delimited and validated by serde_json. serde_json's stream reader is
    /// set up for each value it reads: for the short members of a Chat Completions chunk
    /// it was a seventh of the reading (`perf`).
    pub(crate) fn skip_value(&mut self) -> Option<()> {
        if let Some(len) = flat_counts(self.rest.as_bytes(), |_, _| Some(())) {
            self.rest = self.rest.get(len..)?;
            return Some(());
        }
        let start = self.rest;
        if self.skip_plain(0).is_some() {
            return Some(());
        }
        // Anything the plain reading does not read — a float, a literal, an escaped key, a
        // deep nesting, or a syntax error, which serde then reports — is serde's to read.
        self.rest = start;
        self.raw_value().map(drop)
    }

    /// The text of any JSON value, as [`Cursor::raw_value`] would delimit and validate it
    /// (`null` included), read by [`Cursor::skip_value`]: for a value kept as text, like
    /// Gemini's usage, without setting serde_json's stream reader up for it.
    pub(crate) fn value_text(&mut self) -> Option<&'a str> {
        let start = self.rest;
        self.skip_value()?;
        Some(&start[..start.len() - self.rest.len()])
    }

    /// [`Cursor::skip_value`]'s own reading: plain strings, plain unsigned integers, and
    /// objects and arrays of such values, nested at most [`PLAIN_DEPTH`] deep. `None`
    /// (the cursor anywhere) for anything else.
    fn skip_plain(&mut self, depth: usize) -> Option<()> {
        match self.rest.as_bytes().first()? {
            b'"' => self.skip_string(),
            b'0'..=b'9' => self.uint().map(drop),
            b'{' if depth < PLAIN_DEPTH => self.object(|_, c| c.skip_plain(depth + 1)),
            b'[' if depth < PLAIN_DEPTH => self.sequence(b'[', b']', |c| c.skip_plain(depth + 1)),
            _ => None,
        }
    }

    /// Reads an object member by member, in any order, with JSON whitespace between its
    /// tokens: `member` gets each key with the cursor at its value and reads the value, or
    /// answers `None` (for a member it does not know) to leave the frame to serde. A key
    /// holding an escape leaves it too: serde would match the unescaped name.
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&'a str, &mut Cursor<'a>) -> Option<()>,
    ) -> Option<()> {
        self.sequence(b'{', b'}', |c| {
            let key = c.plain_key()?;
            c.whitespace();
            c.byte(b':')?;
            c.whitespace();
            member(key, c)
        })
    }

    /// Reads an array element by element, as [`Cursor::object`] reads members, into a
    /// list of what `read` makes of each element.
    pub(crate) fn list<T>(
        &mut self,
        mut read: impl FnMut(&mut Cursor<'a>) -> Option<T>,
    ) -> Option<List<T>> {
        let mut list = List::new();
        self.sequence(b'[', b']', |c| {
            list.push(read(c)?);
            Some(())
        })?;
        Some(list)
    }

    /// `open`, then comma-separated items (none at all too), then `close`.
    fn sequence(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Cursor<'a>) -> Option<()>,
    ) -> Option<()> {
        self.byte(open)?;
        self.whitespace();
        if self.byte(close).is_some() {
            return Some(());
        }
        loop {
            item(self)?;
            self.whitespace();
            if self.byte(b',').is_none() {
                return self.byte(close);
            }
            self.whitespace();
        }
    }

    /// How many bytes of the frame are left to read.
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// `Some` when the whole frame has been matched.
    pub(crate) fn end(self) -> Option<()> {
        self.rest.is_empty().then_some(())
    }
}

/// Fills `slot` with `value`, once: a member met twice leaves the frame to serde, which
/// refuses a duplicate field; so does a value that could not be read.
pub(crate) fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

/// How deep [`Cursor::skip_value`] reads nested values itself (its reading recurses, on
/// the stack) before it hands the whole value to serde_json, whose skipping of a value
/// is iterative and has no depth limit.
const PLAIN_DEPTH: usize = 16;

/// The length of the object `bytes` starts with when it is a flat object of counts as
/// providers write their usage — `{"promptTokenCount":9,"totalTokenCount":19}`: plain keys,
/// unsigned integers of at most 19 digits (a `u64` always), no whitespace — with `member`
/// given each key and value; `None` for anything else (or when `member` answers `None`),
/// which [`Cursor::skip_value`]'s general reading then takes. What it accepts is exactly
/// what that reading accepts of such an object, in one pass over the bytes: Gemini's
/// usage, read twice for each frame of a thinking run, cost a fifth of the family's
/// instructions member by member (callgrind).
pub(crate) fn flat_counts(
    bytes: &[u8],
    mut member: impl FnMut(&[u8], u64) -> Option<()>,
) -> Option<usize> {
    if bytes.first() != Some(&b'{') {
        return None;
    }
    if bytes.get(1) == Some(&b'}') {
        return Some(2);
    }
    let mut at = 1;
    loop {
        // A key: `"`, bytes that need no escape, `"`.
        if *bytes.get(at)? != b'"' {
            return None;
        }
        let key_start = at + 1;
        // Eight bytes at a time (byte by byte cost six instructions a byte).
        let end = key_start + special_byte(bytes.get(key_start..)?)?;
        if bytes[end] != b'"' {
            return None;
        }
        if *bytes.get(end + 1)? != b':' {
            return None;
        }
        // The count: digits without a leading zero, then `,` or `}` (a fraction or an
        // exponent is no count).
        let digits_start = end + 2;
        let mut value: u64 = 0;
        let mut next = digits_start;
        while let Some(&b) = bytes.get(next).filter(|b| b.is_ascii_digit()) {
            if next - digits_start == 19 {
                return None;
            }
            value = value * 10 + u64::from(b - b'0');
            next += 1;
        }
        let digits = next - digits_start;
        if digits == 0 || (digits > 1 && bytes[digits_start] == b'0') {
            return None;
        }
        member(&bytes[key_start..end], value)?;
        match *bytes.get(next)? {
            b',' => at = next + 1,
            b'}' => return Some(next + 1),
            _ => return None,
        }
    }
}

/// What [`short_escapes`] made of a string body.
enum Unescaped {
    /// The decoded text and the index of the closing quote.
    Done(String, usize),
    /// A `\u` escape: serde_json decodes the string.
    Unicode,
    /// A string serde refuses: an unknown escape, a raw control character, no end.
    Refused,
}

/// Decodes a string body whose first escape is at `from`, as serde_json does, while every
/// escape is a two-character one. Plain runs between escapes are copied whole, found
/// eight bytes at a time ([`special_byte`]).
fn short_escapes(body: &str, mut from: usize) -> Unescaped {
    let bytes = body.as_bytes();
    let mut decoded = String::with_capacity(body.len().min(from + 64));
    let mut plain = 0;
    loop {
        // `from` is at a backslash.
        decoded.push_str(&body[plain..from]);
        let letter = bytes.get(from + 1).copied();
        if letter == Some(b'u') {
            return Unescaped::Unicode;
        }
        let Some(unescaped) = letter.and_then(short_escape) else {
            return Unescaped::Refused;
        };
        decoded.push(unescaped);
        plain = from + 2;
        let Some(at) = special_byte(&bytes[plain..]) else {
            return Unescaped::Refused;
        };
        from = plain + at;
        match bytes[from] {
            b'"' => {
                decoded.push_str(&body[plain..from]);
                return Unescaped::Done(decoded, from);
            }
            b'\\' => {}
            _ => return Unescaped::Refused,
        }
    }
}

/// The character a two-character escape (`\` and `letter`) stands for, as JSON defines
/// them; `None` for `u` and for any letter that is no escape.
fn short_escape(letter: u8) -> Option<char> {
    Some(match letter {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        _ => return None,
    })
}

/// The index of the closing quote of a string body whose first escape is at `from`.
fn escaped_string_end(body: &[u8], mut from: usize) -> Option<usize> {
    loop {
        match body.get(from)? {
            b'\\' => from += 2,
            b'"' => return Some(from),
            _ => from += 1,
        }
        from += memchr::memchr2(b'"', b'\\', body.get(from..)?)?;
    }
}

/// `capture` (SSE) with one more member in each of its whole JSON object frames: a
/// member no member-by-member reading knows and serde skips, so every such frame goes the
/// generic way. A frame cut short stays as it is (its diagnostic reports its size). For
/// the tests that hold an adapter's handling of directly read frames equal to its
/// handling of the generic reading.
#[cfg(test)]
pub(crate) fn with_generic_member(capture: &str) -> String {
    capture
        .split_inclusive('\n')
        .map(|line| match line.strip_prefix("data: ") {
            Some(json)
                if json.starts_with('{')
                    && !json[1..].trim_start().starts_with('}')
                    && serde_json::from_str::<serde_json::Value>(json).is_ok() =>
            {
                format!(r#"data: {{"sg_generic_reading":0,{}"#, &json[1..])
            }
            _ => line.to_owned(),
        })
        .collect()
}

/// The project's SSE fixtures of one family (`fixtures/<family>/*.sse`): path and text.
#[cfg(test)]
pub(crate) fn sse_fixtures(family: &str) -> Vec<(std::path::PathBuf, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(family);
    let mut fixtures: Vec<_> = std::fs::read_dir(&dir)
        .expect("the family's fixtures")
        .map(|entry| entry.expect("a fixture").path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("sse"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("fixture text");
            (path, text)
        })
        .collect();
    fixtures.sort();
    fixtures
}

#[cfg(test)]
mod tests {
    use super::Cursor;
    use proptest::prelude::*;
    use std::borrow::Cow;

    fn string(frame: &str) -> Option<(Cow<'_, str>, &str)> {
        let mut c = Cursor::new(frame);
        let s = c.string()?;
        Some((s, c.rest))
    }

    #[test]
    fn strings_read_as_serde_reads_them() {
        for json in [
            r#""plain""#,
            r#""""#,
            r#""a \"quoted\" word""#,
            r#""back\\slash""#,
            r#""\\""#,
            r#""\u00e9\ud83d\ude00 é 😀""#,
            r#""line\nbreak\ttab\/""#,
        ] {
            let (ours, rest) = string(json).expect(json);
            let serde: String = serde_json::from_str(json).expect(json);
            assert_eq!(ours, serde, "{json}");
            assert_eq!(rest, "");
        }
        assert!(matches!(
            string(r#""plain"}"#),
            Some((Cow::Borrowed("plain"), "}"))
        ));
    }

    proptest! {
        /// Any mix of plain text, short and `\\u` escapes, raw control characters and
        /// broken escapes reads as serde reads it, or is refused where serde refuses it.
        #[test]
        fn escaped_strings_read_as_serde_reads_them(pieces in proptest::collection::vec(
            proptest::sample::select(vec![
                "plain", " ", "é", "😀", "\\n", "\\\"", "\\\\", "\\/", "\\b", "\\f",
                "\\r", "\\t", "\\u00e9", "\\ud83d\\ude00", "\\ud800", "\\x", "\\", "\u{1}", "\"",
            ]),
            0..12,
        )) {
            let json = format!("\"{}\",1", pieces.concat());
            let ours = string(&json).map(|(s, rest)| (s.into_owned(), rest));
            let mut theirs = serde_json::Deserializer::from_str(&json).into_iter::<String>();
            let serde = theirs.next().and_then(Result::ok).map(|s| (s, &json[theirs.byte_offset()..]));
            prop_assert_eq!(ours, serde);
        }
    }

    #[test]
    fn strings_serde_refuses_are_not_read() {
        for json in [
            "\"raw\ncontrol\"",
            "\"tab\there\"",
            r#""unterminated"#,
            r#""bad \x escape""#,
            r#""lone \ud800 surrogate""#,
            r#""ends in \"#,
            "plain",
        ] {
            assert!(string(json).is_none(), "{json}");
        }
    }

    #[test]
    fn integers_are_plain_u64s_only() {
        let uint = |s: &str| Cursor::new(s).uint();
        assert_eq!(uint("0,"), Some(0));
        assert_eq!(uint("42}"), Some(42));
        assert_eq!(uint("18446744073709551615"), Some(u64::MAX));
        for refused in ["", "-1", "01", "1.0", "1e3", "18446744073709551616", "x"] {
            assert_eq!(uint(refused), None, "{refused}");
        }
    }

    /// `skip_value` steps over exactly what `raw_value` reads, and refuses what it refuses.
    #[test]
    fn a_skipped_value_is_the_raw_value_serde_reads() {
        for frame in [
            r#""plain","#,
            r#""with \"escape\"","#,
            r#""\n\t\/\b\f\r\\ \u00e9 \ud83d\ude00","#,
            r#""lone \ud800 surrogate","#,
            r#""short \u12","#,
            r#""not hex \u12g4","#,
            r#""ends in \"#,
            "\"raw\u{1}control\",",
            r#""bad \x escape","#,
            r#""unterminated"#,
            "0,",
            "42}",
            "18446744073709551616,",
            "-1,",
            "1.5e3,",
            "01,",
            r#"{"a":[1,null]},"#,
            r#"{"a":1,"b":[2,"x",{}],"c":{"d":[]}}}"#,
            r#"{ "a" : [ 1 , "x" ] } ,"#,
            r#"{"a\u0062":1},"#,
            r#"{"a":1,"a":2},"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"[1,2.5,-3,"y",true]]"#,
            r#"["unterminated]"#,
            &format!("{}0{},", "[".repeat(20), "]".repeat(20)),
            &format!("{}0{},", "[".repeat(200), "]".repeat(200)),
            "null,",
            "true}",
            "[1,,]",
            "",
            // Flat count objects (`flat_counts`) and what is nearly one.
            r#"{"promptTokenCount":9,"totalTokenCount":19},"#,
            r#"{}}"#,
            r#"{"a":0,"b":10000000000000000000}"#,
            r#"{"a":18446744073709551616}"#,
            r#"{"a":01}"#,
            r#"{"a":1.5}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-1}"#,
            r#"{"a":}"#,
            r#"{"a":1"#,
            r#"{"a":1,"#,
            r#"{"a"b":1}"#,
            "{\"a\u{1}b\":1}",
            r#"{"é😀":1}"#,
            r#"{"a":1 }"#,
            r#"{"a":1,"b":"x"}"#,
            r#"{"a":1,"b":{"c":2}}"#,
            r#"{"a":1}}"#,
        ] {
            let mut skipped = Cursor::new(frame);
            let skip = skipped.skip_value().map(|()| skipped.rest);
            let mut read = Cursor::new(frame);
            let raw = read.raw_value().map(|_| read.rest);
            assert_eq!(skip, raw, "{frame:?}");
        }
    }

    proptest! {
        /// Objects of counts as usage is written, some with a flaw: `flat_counts` takes
        /// exactly what the general reading takes, to the same end, with every member.
        #[test]
        fn flat_counts_read_as_the_general_reading(
            members in proptest::collection::vec(("[a-zA-Z\\\\\"é\u{1}]{0,6}", "(0|[1-9][0-9]{0,20}|01|1\\.5|-2)"), 0..5),
            spaced in any::<bool>(),
        ) {
            let sep = if spaced { ", " } else { "," };
            let body: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let frame = format!("{{{}}},", body.join(sep));
            let mut general = Cursor::new(&frame);
            let general = general.skip_plain(0).map(|()| general.rest).or_else(|| {
                let mut read = Cursor::new(&frame);
                read.raw_value().map(|_| read.rest)
            });
            let mut seen = Vec::new();
            let flat = super::flat_counts(frame.as_bytes(), |k, v| {
                seen.push((k.to_vec(), v));
                Some(())
            });
            if let Some(len) = flat {
                prop_assert_eq!(Some(&frame[len..]), general, "{}", frame);
                let expected: Vec<(Vec<u8>, u64)> = members
                    .iter()
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.parse().unwrap_or(u64::MAX)))
                    .collect();
                prop_assert_eq!(seen, expected, "{}", frame);
            }
        }
    }

    /// An object read member by member, in any order and spacing, with a duplicate, an
    /// unknown member or a broken value leaving the frame to serde.
    #[test]
    fn objects_and_arrays_read_member_by_member() {
        #[derive(Debug, Default, PartialEq)]
        struct Read<'a> {
            n: Option<u64>,
            list: Option<super::List<bool>>,
            raw: Option<&'a str>,
        }
        fn read(frame: &str) -> Option<Read<'_>> {
            let mut got = Read::default();
            let mut c = Cursor::new(frame);
            c.object(|key, c| match key {
                "n" => super::once(&mut got.n, c.uint()),
                "list" => super::once(&mut got.list, c.list(Cursor::boolean)),
                "raw" => super::once(&mut got.raw, c.raw_value().map(|r| r.get())),
                "ignored" => c.string().map(drop),
                _ => None,
            })?;
            c.whitespace();
            c.end()?;
            Some(got)
        }
        let whole = Read {
            n: Some(7),
            list: Some(smallvec::smallvec![true, false]),
            raw: Some(r#"{"a": [1, 2.5e3, null]}"#),
        };
        assert_eq!(
            read(r#"{"n":7,"list":[true,false],"raw":{"a": [1, 2.5e3, null]}}"#),
            Some(whole)
        );
        let spaced = read("{ \"raw\" : 1 ,\n\"ignored\": \"x\", \"list\": [ ] , \"n\" : 0 } ");
        assert_eq!(
            spaced,
            Some(Read {
                n: Some(0),
                list: Some(super::List::new()),
                raw: Some("1"),
            })
        );
        assert_eq!(read("{}"), Some(Read::default()));
        for refused in [
            r#"{"n":1,"n":2}"#,
            r#"{"n":1,"other":2}"#,
            r#"{"\u006e":1}"#,
            r#"{"raw":{"a":}}"#,
            r#"{"raw":1x}"#,
            r#"{"list":[true,]}"#,
            r#"{"n":1,}"#,
            r#"{"n":1} x"#,
            r#"{"n":1"#,
        ] {
            assert_eq!(read(refused), None, "{refused}");
        }
    }

    #[test]
    fn a_template_matches_the_whole_frame_or_nothing() {
        fn read(frame: &str) -> Option<(u64, usize, Cow<'_, str>)> {
            let mut c = Cursor::new(frame);
            c.literal(r#"{"n":"#)?;
            let n = c.uint()?;
            let kind = c.one_of([r#","a":"#, r#","b":"#])?;
            let s = c.string()?;
            c.literal("}")?;
            c.end()?;
            Some((n, kind, s))
        }
        assert_eq!(read(r#"{"n":3,"b":"x"}"#), Some((3, 1, Cow::Borrowed("x"))));
        assert_eq!(read(r#"{"n":3,"b":"x"} "#), None);
        assert_eq!(read(r#"{"n": 3,"b":"x"}"#), None);
        assert_eq!(read(r#"{"n":3,"c":"x"}"#), None);
        let mut padded = Cursor::new(" \t\r\n}\u{a0}");
        padded.whitespace();
        assert_eq!(
            padded.rest, "}\u{a0}",
            "only JSON's four whitespace characters"
        );
    }
}

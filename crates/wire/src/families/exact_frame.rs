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
        let digits = self.rest.bytes().take_while(u8::is_ascii_digit).count();
        let (number, rest) = self.rest.split_at(digits);
        if number.is_empty() || (number.len() > 1 && number.starts_with('0')) {
            return None;
        }
        if rest.starts_with(['.', 'e', 'E']) {
            return None;
        }
        let value = number.parse().ok()?;
        self.rest = rest;
        Some(value)
    }

    /// A JSON string: borrowed when it holds no escape, else decoded by serde_json.
    pub(crate) fn string(&mut self) -> Option<Cow<'a, str>> {
        let body = self.rest.strip_prefix('"')?;
        let bytes = body.as_bytes();
        let at = special_byte(bytes)?;
        match bytes[at] {
            b'"' => {
                self.rest = &body[at + 1..];
                return Some(Cow::Borrowed(&body[..at]));
            }
            b'\\' => {}
            // A raw control character: serde refuses the string.
            _ => return None,
        }
        let end = escaped_string_end(bytes, at)?;
        let decoded: String = serde_json::from_str(&self.rest[..end + 2]).ok()?;
        self.rest = &body[end + 1..];
        Some(Cow::Owned(decoded))
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
        match self.rest.as_bytes().first()? {
            // A string serde refuses (a raw control character, a bad escape) is refused
            // here too: `string` reads only what serde reads.
            b'"' => self.string().map(drop),
            // `uint` leaves the cursor where it was when the number is not a plain u64.
            b'0'..=b'9' if self.uint().is_some() => Some(()),
            _ => self.raw_value().map(drop),
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
            let Cow::Borrowed(key) = c.string()? else {
                return None;
            };
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
    ) -> Option<Vec<T>> {
        let mut list = Vec::new();
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

/// A raw member value as serde reads an `Option<&RawValue>` field: `null` is absent.
pub(crate) fn non_null(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get() != "null")
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
            "null,",
            "true}",
            "[1,,]",
            "",
        ] {
            let mut skipped = Cursor::new(frame);
            let skip = skipped.skip_value().map(|()| skipped.rest);
            let mut read = Cursor::new(frame);
            let raw = read.raw_value().map(|_| read.rest);
            assert_eq!(skip, raw, "{frame:?}");
        }
    }

    /// An object read member by member, in any order and spacing, with a duplicate, an
    /// unknown member or a broken value leaving the frame to serde.
    #[test]
    fn objects_and_arrays_read_member_by_member() {
        #[derive(Debug, Default, PartialEq)]
        struct Read<'a> {
            n: Option<u64>,
            list: Option<Vec<bool>>,
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
            list: Some(vec![true, false]),
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
                list: Some(vec![]),
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

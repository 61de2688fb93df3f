//! Reading a frame of one known, exact shape without a JSON parser: the hot path of the
//! families whose long runs are nearly all one frame shape (an Anthropic text delta, a
//! codex `item.completed`).
//!
//! Hand-written for measured performance: serde's derived reading of an Anthropic delta
//! frame costs ~280 ns on the reference box, validating the same bytes ~90 ns, and this
//! reader ~30 ns (docs/performance.md). It stays exact by accepting only a frame that is
//! byte for byte its template — keys in the provider's order, no whitespace, nothing
//! more — and answering `None` for anything else, which the caller then reads the generic
//! (serde) way. It never accepts what serde would refuse and never reads a value
//! differently: a string holding an escape is decoded by serde_json itself, a raw control
//! character or a number that is not a plain `u64` sends the frame the generic way.

use std::borrow::Cow;

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
        let close = memchr::memchr2(b'"', b'\\', bytes)?;
        if bytes[close] == b'"' {
            let text = &body[..close];
            if text.bytes().any(|b| b < 0x20) {
                return None;
            }
            self.rest = &body[close + 1..];
            return Some(Cow::Borrowed(text));
        }
        let end = escaped_string_end(bytes, close)?;
        let decoded: String = serde_json::from_str(&self.rest[..end + 2]).ok()?;
        self.rest = &body[end + 1..];
        Some(Cow::Owned(decoded))
    }

    /// Steps over JSON whitespace, which some providers pad their frames with (Anthropic
    /// writes spaces before a delta frame's last brace).
    pub(crate) fn whitespace(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t', '\n', '\r']);
    }

    /// `Some` when the whole frame has been matched.
    pub(crate) fn end(self) -> Option<()> {
        self.rest.is_empty().then_some(())
    }
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

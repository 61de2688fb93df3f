//! [`SafeText`]: the display-safe text of one growing thinking segment, kept as it
//! streams so that rendering a delta costs O(delta), not O(segment).
//!
//! A reasoning turn can stream megabytes into one open segment. Redacting and eliding
//! the whole accumulated text on every delta made a long turn quadratic (a 5 MB segment
//! took the instance down). Here each delta goes through a [`StreamRedactor`] (which
//! redacts on the accumulated text, holds back a half-streamed secret, and drops what it
//! no longer needs as context), and only what a draft can ever show is kept: the first
//! [`KEEP_CHARS`] chars and the last [`KEEP_CHARS`] to twice that, plus exact counts.
//! A draft shows at most a head and a tail of a long segment, so nothing visible is
//! lost; the archive keeps the whole text.

use crate::redact::{redact, StreamRedactor};

/// Chars kept at each end of a long segment's display-safe text.
pub(crate) const KEEP_CHARS: usize = 8192;

/// The display-safe text of one thinking segment (see the module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct SafeText {
    redactor: StreamRedactor,
    /// The first (up to) [`KEEP_CHARS`] chars.
    head: String,
    head_chars: usize,
    /// The text after `head`, of which only the last chars are kept.
    tail: String,
    tail_chars: usize,
    /// Every char appended, kept or not.
    chars: usize,
    closed: bool,
}

impl SafeText {
    /// Appends a delta (redacted on the accumulated text; a half-streamed secret is
    /// held back until it completes or the segment closes).
    pub fn push(&mut self, delta: &str) {
        let safe = self.redactor.push(delta);
        self.append(&safe);
    }

    /// The display-safe text of a whole folded text, open or closed.
    pub fn of(text: &str, closed: bool) -> SafeText {
        let mut t = SafeText::default();
        t.set(text, closed);
        t
    }

    /// Replaces the text with a snapshot.
    pub fn set(&mut self, text: &str, closed: bool) {
        *self = SafeText::default();
        if closed {
            self.append(&redact(text));
            self.closed = true;
        } else {
            self.push(text);
        }
    }

    /// The segment ended: what was held back goes out (it is complete now).
    pub fn close(&mut self) {
        if !self.closed {
            let rest = self.redactor.finish();
            self.append(&rest);
            self.closed = true;
        }
    }

    fn append(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        let mut rest = s;
        if self.tail.is_empty() && self.head_chars < KEEP_CHARS {
            let room = KEEP_CHARS - self.head_chars;
            let end = rest.char_indices().nth(room).map_or(rest.len(), |(i, _)| i);
            let taken = rest[..end].chars().count();
            self.head.push_str(&rest[..end]);
            self.head_chars += taken;
            self.chars += taken;
            rest = &rest[end..];
        }
        if rest.is_empty() {
            return;
        }
        let n = rest.chars().count();
        self.tail.push_str(rest);
        self.tail_chars += n;
        self.chars += n;
        if self.tail_chars > 2 * KEEP_CHARS {
            let drop = self.tail_chars - KEEP_CHARS;
            let cut = self
                .tail
                .char_indices()
                .nth(drop)
                .map_or(self.tail.len(), |(i, _)| i);
            self.tail.drain(..cut);
            self.tail_chars -= drop;
        }
    }

    /// True when nothing but whitespace was shown so far.
    pub fn is_blank(&self) -> bool {
        self.head.trim().is_empty() && self.tail.trim().is_empty()
    }

    /// The whole display-safe text, trimmed, when it is all kept.
    pub fn whole(&self) -> Option<String> {
        (self.chars == self.head_chars + self.tail_chars)
            .then(|| format!("{}{}", self.head, self.tail).trim().to_owned())
    }

    /// Chars of the trimmed text: exact (the count is kept as text arrives; only the
    /// whitespace at the ends is counted here).
    pub fn trimmed_chars(&self) -> usize {
        let lead = self.head.chars().take_while(|c| c.is_whitespace()).count();
        let end = if self.tail.is_empty() {
            &self.head
        } else {
            &self.tail
        };
        let trail = end.chars().rev().take_while(|c| c.is_whitespace()).count();
        self.chars.saturating_sub(lead + trail).min(self.chars)
    }

    /// The trimmed text's first `n` chars and last `m` chars, each within what is kept:
    /// O(`n` + `m`), for a head + tail elision.
    pub fn ends(&self, n: usize, m: usize) -> (String, String) {
        let head: String = self.head.trim_start().chars().take(n).collect();
        let end = if self.tail.is_empty() {
            &self.head
        } else {
            &self.tail
        };
        let end = end.trim_end();
        let from = match m {
            0 => end.len(),
            m => end.char_indices().rev().nth(m - 1).map_or(0, |(i, _)| i),
        };
        (head, end[from..].to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_text_is_whole_and_redacted() {
        let mut t = SafeText::default();
        for d in [
            "  think ",
            "password=hun",
            "ter2 and sk-ant-",
            "api03-AbCdEfGhIjKlMnOp",
        ] {
            t.push(d);
        }
        assert_eq!(t.whole().unwrap(), "think password=*** and");
        t.close();
        assert_eq!(t.whole().unwrap(), "think password=*** and sk-ant-***");
        assert!(!t.is_blank());
    }

    #[test]
    fn a_long_text_keeps_its_ends_and_exact_count() {
        let mut t = SafeText::default();
        let mut full = String::new();
        for i in 0..20_000 {
            let d = format!("w{i} ");
            full.push_str(&d);
            t.push(&d);
        }
        t.close();
        assert!(t.whole().is_none());
        assert!(t.tail.len() <= 2 * KEEP_CHARS + 8);
        assert_eq!(t.trimmed_chars(), full.trim().chars().count());
        let (h, tail) = t.ends(5, 7);
        assert_eq!(h, "w0 w1");
        assert_eq!(tail, " w19999");
    }
}

//! A hot frame that is the last one again with only its text changed.
//!
//! Most frames of a long Chat Completions run are byte for byte the same but for one
//! string: `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":…,"model":…,
//! "choices":[{"index":0,"delta":{"content":"<text>"},"logprobs":null,"finish_reason":null}]}`.
//! [`SameFrame`] keeps the last frames a member-by-member reading ([`exact_frame`]) read
//! whose only text was that one string, and recognizes a next frame that has the same
//! bytes as one of them before the string's opening quote and from its closing quote on: such a frame
//! reads exactly as the kept one did, with the new text — the bytes around it are the
//! ones already read, and the string between them is read the way [`exact_frame`] reads
//! one (escapes, refusals) and must end exactly where the kept bytes start again. So the
//! frame costs two comparisons and the text's own scan instead of a reading of every
//! member (docs/performance.md has the measurement). Anything else — another member, a
//! second text, a changed id or counter — is not the same frame and is read as before.
//!
//! [`exact_frame`]: crate::families::exact_frame

use crate::families::exact_frame::Cursor;
use std::borrow::Cow;
use std::ops::Range;

/// The last few frames ([`KEPT`]) whose one text was a string, each with what that text
/// was to the reader (`K`: which member held it). A run alternates between a few such
/// frames — reasoning pieces and reply pieces, say — so one kept frame would be replaced
/// at every turn between them.
#[derive(Debug, Default)]
pub(crate) struct SameFrame<K> {
    kept: [Kept<K>; KEPT],
    /// The slot the next kept frame replaces (the oldest).
    next: usize,
}

/// How many frames [`SameFrame`] keeps.
pub(crate) const KEPT: usize = 4;

/// The longest frame [`SameFrame`] keeps: a hot frame is a piece of text with its
/// envelope, a few hundred bytes; a longer one is not copied (it would be held for the
/// rest of the run, per kept slot).
pub(crate) const MAX_KEPT_BYTES: usize = 4096;

/// One kept frame; `frame` is empty in a slot that holds none.
#[derive(Debug, Default)]
struct Kept<K> {
    frame: String,
    /// Its text's body, between the string's quotes.
    body: Range<usize>,
    kind: K,
}

impl<K: Copy> SameFrame<K> {
    /// Keeps `frame`, whose one text is `text`: a string body borrowed from `frame` itself
    /// (a text decoded from escapes is not, and keeps nothing: a later frame without
    /// escapes is kept instead), in place of the oldest kept frame. The next frames are
    /// compared against it.
    pub(crate) fn keep(&mut self, frame: &str, text: &str, kind: K) {
        if frame.len() > MAX_KEPT_BYTES {
            return;
        }
        let Some(body) = body_within(frame, text) else {
            return;
        };
        let slot = &mut self.kept[self.next];
        slot.frame.clear();
        slot.frame.push_str(frame);
        slot.body = body;
        slot.kind = kind;
        self.next = (self.next + 1) % KEPT;
    }

    /// Forgets every kept frame: the next frames are read in full.
    pub(crate) fn forget(&mut self) {
        for slot in &mut self.kept {
            slot.frame.clear();
        }
    }

    /// `frame`'s text and its kind, when `frame` is a kept frame with only its text
    /// changed; `None` (read it in full) otherwise.
    pub(crate) fn text<'a>(&self, frame: &'a str) -> Option<(K, Cow<'a, str>)> {
        self.kept.iter().find_map(|kept| kept.text(frame))
    }
}

impl<K: Copy> Kept<K> {
    fn text<'a>(&self, frame: &'a str) -> Option<(K, Cow<'a, str>)> {
        if self.frame.is_empty() {
            return None;
        }
        let (before, after) = (&self.frame[..self.body.start], &self.frame[self.body.end..]);
        if frame.len() < before.len() + after.len()
            || !frame.starts_with(before)
            || !frame.ends_with(after)
        {
            return None;
        }
        // From the opening quote, the kept bytes' last one (ASCII: a boundary in `frame`
        // too); the string must close on the first of the kept bytes after it.
        let mut c = Cursor::new(&frame[before.len() - 1..]);
        let text = c.string()?;
        (c.remaining() + 1 == after.len()).then_some((self.kind, text))
    }
}

/// Where `text`, a slice of `frame`, lies in it, when it is a string's whole body there
/// (a quote on each side).
fn body_within(frame: &str, text: &str) -> Option<Range<usize>> {
    let start = (text.as_ptr() as usize).checked_sub(frame.as_ptr() as usize)?;
    let end = start.checked_add(text.len())?;
    let bytes = frame.as_bytes();
    let quoted = start > 0
        && end < bytes.len()
        && bytes[start - 1] == b'"'
        && bytes[end] == b'"'
        && frame.get(start..end) == Some(text);
    quoted.then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: &str = r#"{"id":"c1","choices":[{"delta":{"content":"Hello"}}]}"#;

    fn kept() -> SameFrame<u8> {
        let mut same = SameFrame::default();
        let text = &FRAME[FRAME.find("Hello").unwrap()..][..5];
        same.keep(FRAME, text, 7);
        same
    }

    #[test]
    fn a_frame_with_only_its_text_changed_is_the_same_frame() {
        let same = kept();
        let text = |frame: &str| same.text(frame).map(|(k, t)| (k, t.into_owned()));
        let frame = r#"{"id":"c1","choices":[{"delta":{"content":" world, and more"}}]}"#;
        assert_eq!(text(frame), Some((7, " world, and more".to_owned())));
        assert_eq!(text(FRAME), Some((7, "Hello".to_owned())));
        // An empty text, and one with escapes, decoded as the member reading decodes them.
        let frame = r#"{"id":"c1","choices":[{"delta":{"content":""}}]}"#;
        assert_eq!(text(frame), Some((7, String::new())));
        let frame = r#"{"id":"c1","choices":[{"delta":{"content":"a\n\"b\u00e9"}}]}"#;
        assert_eq!(text(frame), Some((7, "a\n\"bé".to_owned())));
    }

    #[test]
    fn anything_else_is_read_in_full() {
        let same = kept();
        for frame in [
            // Another id, another member, a second text, a text that is no string.
            r#"{"id":"c2","choices":[{"delta":{"content":"Hello"}}]}"#,
            r#"{"id":"c1","choices":[{"delta":{"content":"Hi"},"x":1}]}"#,
            r#"{"id":"c1","choices":[{"delta":{"content":"a","role":"b"}}]}"#,
            r#"{"id":"c1","choices":[{"delta":{"content":"a"},{"content":"b"}}]}"#,
            // A quote inside: the string ends before the kept bytes do.
            r#"{"id":"c1","choices":[{"delta":{"content":"a"}}]}"}}]}"#,
            // What the member reading refuses: a raw control character, a bad escape.
            "{\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"a\u{1}\"}}]}",
            r#"{"id":"c1","choices":[{"delta":{"content":"\q"}}]}"#,
            // Shorter than the kept bytes around the text.
            r#"{"id":"c1"}"#,
        ] {
            assert!(same.text(frame).is_none(), "{frame}");
        }
        let mut same = kept();
        same.forget();
        assert!(same.text(FRAME).is_none());
    }

    #[test]
    fn the_last_few_frames_are_kept() {
        let mut same = kept();
        let frames: Vec<String> = (0..KEPT)
            .map(|i| format!(r#"{{"id":"d{i}","choices":[{{"delta":{{"content":"t"}}}}]}}"#))
            .collect();
        for frame in &frames {
            let text = &frame[frame.len() - 6..frame.len() - 5];
            assert_eq!(text, "t");
            same.keep(frame, text, 1);
        }
        // KEPT more frames replaced the first one; each of them is recognized.
        assert!(same.text(FRAME).is_none());
        for frame in &frames {
            assert_eq!(
                same.text(frame).map(|(k, t)| (k, t.into_owned())),
                Some((1, "t".into()))
            );
        }
    }

    #[test]
    fn only_a_string_body_of_the_frame_itself_is_kept() {
        let mut same = SameFrame::default();
        // Decoded text (not borrowed from the frame) keeps nothing.
        same.keep(FRAME, &String::from("Hello"), 1u8);
        assert!(same.text(FRAME).is_none());
        // Nor does a frame over the size kept.
        let long = format!(
            r#"{{"choices":[{{"delta":{{"content":"{}"}}}}]}}"#,
            "a".repeat(MAX_KEPT_BYTES)
        );
        same.keep(&long, &long[long.find('a').unwrap()..][..MAX_KEPT_BYTES], 1);
        assert!(same.text(&long).is_none());
        // A slice that is not a whole string body keeps nothing.
        let mut same = SameFrame::default();
        same.keep(FRAME, &FRAME[FRAME.find("Hello").unwrap()..][..4], 1u8);
        assert!(same.text(FRAME).is_none());
    }
}

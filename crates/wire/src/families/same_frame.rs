//! A hot frame that is a recent one again with only its changing values changed.
//!
//! Most frames of a long run are byte for byte a recent frame but for a value or two: a
//! Chat Completions chunk but for its text (`{"id":"chatcmpl-1","object":…,"choices":
//! [{"index":0,"delta":{"content":"<text>"},…}]}`), a Gemini frame but for its texts and
//! its usage counts, a Responses delta but for its text, sequence number and padding.
//! [`SameFrame`] keeps the last frames a member-by-member reading ([`exact_frame`]) read,
//! with their *holes* — where those values stand — and recognizes a frame whose bytes
//! between the holes are one kept frame's and whose holes hold what
//! their readers read ([`Cursor::string`], [`Cursor::value_text`]: escapes, refusals and
//! all): such a frame reads exactly as the kept one did, with the new values — the bytes
//! around them are the ones already read. So the frame costs a few comparisons and its
//! values' own scans instead of a reading of every member (docs/performance.md has the
//! measurement). Anything else — another member, a second text, a changed id — is not
//! the same frame and is read as before.
//!
//! [`exact_frame`]: crate::families::exact_frame

use crate::families::exact_frame::Cursor;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::cell::Cell;
use std::ops::Range;

/// The last few frames ([`KEPT`]) a reader read, each with its holes — the values that
/// change from one frame to the next (the text, a usage object) — and what the frame was
/// to the reader (`K`: which member held the text, the members around it). A run
/// alternates between a few such frames — reasoning pieces and reply pieces, say — so one
/// kept frame would be replaced at every turn between them.
#[derive(Debug, Default)]
pub(crate) struct SameFrame<K> {
    kept: [Kept<K>; KEPT],
    /// The slot the next kept frame replaces (the oldest).
    next: usize,
    /// The slot the last recognized frame was, tried first: a run's frames come in
    /// stretches of one kind (a reasoning stretch, then the answer's), and each slot
    /// refused costs a comparison.
    last: Cell<usize>,
}

/// How many frames [`SameFrame`] keeps.
pub(crate) const KEPT: usize = 4;

/// The longest frame [`SameFrame`] keeps: a hot frame is a piece of text with its
/// envelope, a few hundred bytes (an OpenAI chunk ~230, a Gemini frame with its usage
/// ~400); a longer one is not copied. A kept frame is held for the rest of its run, so
/// this bounds what an open run holds here: [`KEPT`] × 1 KiB.
pub(crate) const MAX_KEPT_BYTES: usize = 1024;

/// The most holes a kept frame has: a Responses delta has four (its item id, its text,
/// its obfuscation padding and its sequence number). A frame with more is not kept, so a
/// recognized frame's values are held inline, never in a heap allocation.
pub(crate) const MAX_HOLES: usize = 4;

/// How a hole of a kept frame is read in the next frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hole {
    /// A string, read by [`Cursor::string`] (the slice given to [`SameFrame::keep`] is the
    /// string as the frame has it, quotes and escapes included: [`Cursor::string_token`]).
    Text,
    /// Any JSON value, read by [`Cursor::value_text`] (the slice is the value's text).
    Value,
}

/// What the holes of a recognized frame hold, in the frame's order ([`SameFrame::read`]).
pub(crate) type Values<'a> = [Option<Filled<'a>>; MAX_HOLES];

/// What a hole holds in a recognized frame.
#[derive(Debug)]
pub(crate) enum Filled<'a> {
    Text(Cow<'a, str>),
    Value(&'a str),
}

/// A frame recognized as a kept one with other values in its holes (which
/// [`SameFrame::read`] handed over as it read them).
#[derive(Debug)]
pub(crate) struct Same<'a, 'k, K> {
    /// What the kept frame was to the reader.
    pub kind: &'k K,
    frame: &'a str,
    kept: &'k Kept<K>,
    /// Where each run of kept bytes (before each hole, and after the last) starts in
    /// this frame.
    starts: [usize; MAX_HOLES + 1],
}

impl<'a, K> Same<'a, '_, K> {
    /// This frame's text at `kept`, a range of the kept frame's bytes between its holes
    /// ([`range_of`]: a member that does not change, like a response id): the same bytes,
    /// borrowed from this frame.
    pub(crate) fn fixed(&self, kept: &Range<usize>) -> Option<&'a str> {
        let holes = &self.kept.holes;
        let (mut run_start, mut at) = (0, 0);
        while let Some(&start) = self.starts.get(at) {
            let run_end = holes
                .get(at)
                .map_or(self.kept.frame.len(), |(h, _)| h.start);
            if run_start <= kept.start && kept.end <= run_end {
                let from = start + (kept.start - run_start);
                return self.frame.get(from..from + kept.len());
            }
            run_start = holes.get(at)?.0.end;
            at += 1;
        }
        None
    }
}

/// One kept frame; `frame` is empty in a slot that holds none.
#[derive(Debug, Default)]
struct Kept<K> {
    frame: String,
    /// Its holes, in order: the bytes each value took (a string with its quotes).
    holes: SmallVec<[(Range<usize>, Hole); MAX_HOLES]>,
    /// How many of its bytes are not in a hole: the least a frame like it has.
    fixed_len: usize,
    kind: K,
}

impl<K: Clone> SameFrame<K> {
    /// Keeps `frame`, whose changing values are `holes` (slices of `frame` itself, in
    /// its order; anything else keeps nothing), in place of the oldest kept frame. The
    /// next frames are compared against it.
    pub(crate) fn keep(&mut self, frame: &str, holes: &[(&str, Hole)], kind: K) {
        if frame.len() > MAX_KEPT_BYTES || holes.len() > MAX_HOLES {
            return;
        }
        let mut ranges = SmallVec::new();
        let (mut after, mut fixed_len) = (0, frame.len());
        for &(value, hole) in holes {
            let Some(range) = hole_within(frame, value, hole).filter(|r| r.start >= after) else {
                return;
            };
            after = range.end;
            fixed_len -= range.len();
            ranges.push((range, hole));
        }
        let slot = &mut self.kept[self.next];
        slot.frame.clear();
        slot.frame.push_str(frame);
        slot.holes = ranges;
        slot.fixed_len = fixed_len;
        slot.kind = kind;
        self.next = (self.next + 1) % KEPT;
    }

    /// [`SameFrame::keep`] for a frame whose one changing value is the string `token`
    /// (as the frame has it).
    pub(crate) fn keep_text(&mut self, frame: &str, token: &str, kind: K) {
        self.keep(frame, &[(token, Hole::Text)], kind);
    }

    /// Forgets every kept frame: the next frames are read in full.
    pub(crate) fn forget(&mut self) {
        for slot in &mut self.kept {
            slot.frame.clear();
        }
    }

    /// `frame` as a kept frame with other values in its holes, or `None` (read it in
    /// full) when it is none of them. Each hole's value is written to its place in
    /// `values` as it is read — the reader builds its own value from them, and nothing
    /// else is built or moved (moving the values through a list was measurable in the
    /// Responses and Gemini paths). `values` may also get values of a kept frame that is
    /// then refused: only the first as many as the answered frame has holes count.
    pub(crate) fn read<'a, 's>(
        &'s self,
        frame: &'a str,
        values: &mut Values<'a>,
    ) -> Option<Same<'a, 's, K>> {
        self.find(|kept| {
            let mut starts = [0; MAX_HOLES + 1];
            let (mut hole_at, mut run_at) = (0, 0);
            kept.walk(
                frame,
                |value| {
                    if let Some(slot) = values.get_mut(hole_at) {
                        *slot = Some(value);
                    }
                    hole_at += 1;
                },
                |start| {
                    if let Some(slot) = starts.get_mut(run_at) {
                        *slot = start;
                    }
                    run_at += 1;
                },
            )?;
            Some(Same {
                kind: &kept.kind,
                frame,
                kept,
                starts,
            })
        })
    }

    /// `frame`'s text and its kind, when `frame` is a kept frame of one text hole
    /// ([`SameFrame::keep_text`]) with only its text changed.
    pub(crate) fn text<'a>(&self, frame: &'a str) -> Option<(K, Cow<'a, str>)> {
        self.find(|kept| kept.text(frame))
    }

    /// What `read` makes of the first kept frame it recognizes, the last one recognized
    /// tried first.
    fn find<'s, T>(&'s self, mut read: impl FnMut(&'s Kept<K>) -> Option<T>) -> Option<T> {
        let last = self.last.get();
        if let Some(found) = self.kept.get(last).and_then(&mut read) {
            return Some(found);
        }
        let (at, found) = (0..KEPT).filter(|&at| at != last).find_map(|at| {
            self.kept
                .get(at)
                .and_then(&mut read)
                .map(|found| (at, found))
        })?;
        self.last.set(at);
        Some(found)
    }
}

impl<K: Clone> Kept<K> {
    /// Reads `frame` against this kept frame: each run of kept bytes must stand in it as
    /// it is (`run` gets where it starts in this one), each hole hold a value its reader
    /// reads (`hole` gets it), and the frame end with the last run.
    fn walk<'a>(
        &self,
        frame: &'a str,
        mut hole: impl FnMut(Filled<'a>),
        mut run: impl FnMut(usize),
    ) -> Option<()> {
        if !self.may_be(frame) {
            return None;
        }
        let (mut kept_at, mut at) = (0, 0);
        for (hole_at, kind) in &self.holes {
            let kept_run = &self.frame.as_bytes()[kept_at..hole_at.start];
            if !same_bytes(frame.as_bytes().get(at..at + kept_run.len())?, kept_run) {
                return None;
            }
            run(at);
            at += kept_run.len();
            // The run ends on an ASCII byte (a hole starts after `:`, `,`, `[` or
            // whitespace): `at` is a boundary.
            let mut c = Cursor::new(frame.get(at..)?);
            hole(match kind {
                Hole::Text => Filled::Text(c.string()?),
                Hole::Value => Filled::Value(c.value_text()?),
            });
            at = frame.len() - c.remaining();
            kept_at = hole_at.end;
        }
        if !same_bytes(
            frame.as_bytes().get(at..)?,
            &self.frame.as_bytes()[kept_at..],
        ) {
            return None;
        }
        run(at);
        Some(())
    }

    /// Whether `frame` can be this kept frame: it ends with its last run of kept bytes
    /// and is long enough for all of them (a cheap refusal before any hole is read).
    fn may_be(&self, frame: &str) -> bool {
        let Some((last, _)) = self.holes.last().filter(|_| !self.frame.is_empty()) else {
            return false;
        };
        let tail = &self.frame.as_bytes()[last.end..];
        frame.len() >= self.fixed_len
            && frame
                .as_bytes()
                .get(frame.len() - tail.len()..)
                .is_some_and(|end| same_bytes(end, tail))
    }

    /// [`Kept::read`] for a frame of one text hole: its text, without the rest of a
    /// [`Same`] (the Chat Completions path, where it was measurably cheaper).
    fn text<'a>(&self, frame: &'a str) -> Option<(K, Cow<'a, str>)> {
        let [(hole, Hole::Text)] = self.holes.as_slice() else {
            return None;
        };
        if !self.may_be(frame) || !frame.starts_with(&self.frame[..hole.start]) {
            return None;
        }
        let after = self.frame.len() - hole.end;
        let mut c = Cursor::new(frame.get(hole.start..)?);
        let text = c.string()?;
        (c.remaining() == after).then(|| (self.kind.clone(), text))
    }
}

/// Whether `a` and `b` hold the same bytes: compared here for a few bytes (a kept frame's
/// last run is often just `}`), where calling libc's `memcmp` cost more than comparing
/// (`perf`: a tenth of the Responses family's time went to that call).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    const SHORT: usize = 16;
    if a.len() != b.len() {
        return false;
    }
    if a.len() > SHORT {
        return a == b;
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// Where `value`, a slice of `frame`, lies in it.
pub(crate) fn range_of(frame: &str, value: &str) -> Option<Range<usize>> {
    let start = (value.as_ptr() as usize).checked_sub(frame.as_ptr() as usize)?;
    let end = start.checked_add(value.len())?;
    (frame.get(start..end) == Some(value)).then_some(start..end)
}

/// The bytes a hole's value takes in `frame`: `value`'s own, a [`Hole::Text`]'s with a
/// quote at each end.
fn hole_within(frame: &str, value: &str, hole: Hole) -> Option<Range<usize>> {
    let range = range_of(frame, value)?;
    let quoted = value.len() >= 2 && value.starts_with('"') && value.ends_with('"');
    (hole == Hole::Value || quoted).then_some(range)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: &str = r#"{"id":"c1","choices":[{"delta":{"content":"Hello"}}]}"#;

    fn kept() -> SameFrame<u8> {
        let mut same = SameFrame::default();
        let token = &FRAME[FRAME.find("\"Hello").unwrap()..][..7];
        assert_eq!(token, "\"Hello\"");
        same.keep_text(FRAME, token, 7);
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
    fn a_frame_of_several_holes_is_read_hole_by_hole() {
        let kept = r#"{"t":"ab","u":{"n":1},"id":"r1"}"#;
        let mut same = SameFrame::default();
        let (text, usage) = (&kept[5..9], &kept[14..21]);
        assert_eq!((text, usage), ("\"ab\"", r#"{"n":1}"#));
        // Holes out of order keep nothing.
        same.keep(kept, &[(usage, Hole::Value), (text, Hole::Text)], 0u8);
        assert!(same.read(kept, &mut Values::default()).is_none());
        same.keep(kept, &[(text, Hole::Text), (usage, Hole::Value)], 3u8);
        let id = range_of(kept, &kept[28..30]).unwrap();
        let frame = r#"{"t":"longer\n","u":{"n":12,"m":[3]},"id":"r1"}"#;
        let mut filled = Values::default();
        let read = same.read(frame, &mut filled).unwrap();
        assert_eq!(*read.kind, 3);
        assert!(
            matches!(&filled[..], [Some(Filled::Text(t)), Some(Filled::Value(v)), None, ..]
            if t == "longer\n" && *v == r#"{"n":12,"m":[3]}"#)
        );
        // The id stands after both holes: found where this frame has it.
        assert_eq!(read.fixed(&id), Some("r1"));
        assert_eq!(read.fixed(&(0..30)), None, "a range across a hole");
        for other in [
            r#"{"t":"x","u":{"n":1},"id":"r2"}"#,
            r#"{"t":"x","u":{"n":1,},"id":"r1"}"#,
            r#"{"t":"x","u":1.5e3,"id":"r1"}"#,
            r#"{"t":"x","v":{"n":1},"id":"r1"}"#,
        ] {
            let read = same.read(other, &mut Values::default());
            // A number serde reads is a value too; anything else is not the frame.
            assert_eq!(read.is_some(), other.contains("1.5e3"), "{other}");
        }
    }

    #[test]
    fn the_last_few_frames_are_kept() {
        let mut same = kept();
        let frames: Vec<String> = (0..KEPT)
            .map(|i| format!(r#"{{"id":"d{i}","choices":[{{"delta":{{"content":"t"}}}}]}}"#))
            .collect();
        for frame in &frames {
            let token = &frame[frame.len() - 7..frame.len() - 4];
            assert_eq!(token, "\"t\"");
            same.keep_text(frame, token, 1);
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
    fn only_a_quoted_string_of_the_frame_itself_is_kept() {
        let mut same = SameFrame::default();
        // A string not borrowed from the frame keeps nothing.
        same.keep_text(FRAME, &String::from("\"Hello\""), 1u8);
        assert!(same.text(FRAME).is_none());
        // Nor does a frame over the size kept.
        let long = format!(
            r#"{{"choices":[{{"delta":{{"content":"{}"}}}}]}}"#,
            "a".repeat(MAX_KEPT_BYTES)
        );
        let token = &long[long.find("\"a").unwrap()..][..MAX_KEPT_BYTES + 2];
        same.keep_text(&long, token, 1);
        assert!(same.text(&long).is_none());
        // Nor a slice without its quotes.
        same.keep_text(FRAME, &FRAME[FRAME.find("Hello").unwrap()..][..5], 1u8);
        assert!(same.text(FRAME).is_none());
    }
}

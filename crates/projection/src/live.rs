//! [`Live`]: the structured live view of a run for surfaces that stream natively (Slack
//! `chat.startStream` / `appendStream`), carried by T1 [`crate::Op::Draft`]s beside the
//! rendered text.
//!
//! A draft is a whole rendering, replaced each time. A native stream can only grow: the
//! answer is appended, tool rows are tasks updated by id, and "thinking" is a status. So
//! the sink needs the facts, not the rendering: the answer text of the segment streaming
//! now with its byte offset (what is new since the last append), the tool rows with
//! their outcome, and whether the model is thinking.
//!
//! The answer is redacted as it streams ([`StreamRedactor`]: what was appended can never
//! be taken back, so a half-streamed secret is held back until it is complete) and only a
//! window of its end is kept, so following a long answer costs O(delta) per event and
//! flat memory.

use crate::redact::StreamRedactor;
use serde::{Deserialize, Serialize};
use streamgate_grammar::fold::TextSegment;

/// Bytes of the streaming answer's end a [`LiveText`] carries. A sink that fell further
/// behind (a long `retry_after`) sees a gap and stops appending that segment; the final
/// answer then replaces the stream's text.
pub const LIVE_WINDOW_BYTES: usize = 8 * 1024;

/// Tool rows a [`Live`] carries (the latest ones).
pub const LIVE_TASKS: usize = 32;

/// The structured live view of a run (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    /// The model is reasoning now (an open thinking segment, nothing after it yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub thinking: bool,
    /// Tool rows, oldest first (at most [`LIVE_TASKS`], the latest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<LiveTask>,
    /// The answer text streaming now, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<LiveText>,
    /// The agent's latest plan, when the chat shows plans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<LivePlan>,
}

/// An agent's plan: a title (`📋 plan: 2/5 done · …`) and its steps as tasks (ids
/// `plan-<n>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivePlan {
    /// Display-safe status line of the plan.
    pub title: String,
    /// The steps, in order.
    pub steps: Vec<LiveTask>,
}

/// One tool row as a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveTask {
    /// Stable id within the run (the provider's call id, else `t<first seq>`).
    pub id: String,
    /// Display-safe name.
    pub title: String,
    /// How it stands.
    pub outcome: Outcome,
}

/// How a tool row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Not started (a plan step).
    Pending,
    /// Started, not ended.
    Running,
    /// Ended well.
    Done,
    /// Failed, cancelled, declined.
    Failed,
}

/// The end of one answer segment's display-safe text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveText {
    /// The segment (its first seq): a new value starts a new paragraph of the stream.
    pub segment: u64,
    /// Byte offset of `text` in the segment's display-safe text.
    pub offset: usize,
    /// The segment's display-safe text from `offset` to what is safe to show now.
    pub text: String,
    /// The segment stopped growing by appends (its text was rewritten, or the window
    /// lost bytes nobody had seen): a stream must not append more of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broken: bool,
}

/// Follows the last answer segment as it grows (see the module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct AnswerFollower {
    segment: Option<u64>,
    /// Bytes of the segment's raw text fed to the redactor (counting elided ones).
    consumed: usize,
    redactor: StreamRedactor,
    /// Bytes of display-safe text produced so far.
    safe_len: usize,
    /// The end of the display-safe text.
    window: String,
    broken: bool,
}

impl AnswerFollower {
    /// Takes what `seg` (the run's last answer segment, after an event) added.
    pub fn follow(&mut self, seg: &TextSegment) {
        if self.segment != Some(seg.first_seq) {
            *self = AnswerFollower {
                segment: Some(seg.first_seq),
                ..AnswerFollower::default()
            };
        }
        if self.broken {
            return;
        }
        let total = seg.elided + seg.text.len();
        if total == self.consumed {
            return;
        }
        let new = total
            .checked_sub(self.consumed)
            .and_then(|_| self.consumed.checked_sub(seg.elided))
            .and_then(|from| seg.text.get(from..));
        let Some(delta) = new else {
            // Shorter than what was taken (rewritten), or the fold's window dropped bytes
            // not taken yet: the stream cannot follow this segment by appends any more.
            self.broken = true;
            return;
        };
        self.consumed = total;
        let safe = self.redactor.push(delta);
        self.append(&safe);
    }

    fn append(&mut self, s: &str) {
        self.safe_len += s.len();
        self.window.push_str(s);
        if self.window.len() > 2 * LIVE_WINDOW_BYTES {
            let mut cut = self.window.len() - LIVE_WINDOW_BYTES;
            while !self.window.is_char_boundary(cut) {
                cut += 1;
            }
            self.window.drain(..cut);
        }
    }

    /// The followed segment's end, for a [`Live`].
    pub fn view(&self) -> Option<LiveText> {
        let segment = self.segment?;
        let text = if self.window.len() > LIVE_WINDOW_BYTES {
            let mut cut = self.window.len() - LIVE_WINDOW_BYTES;
            while !self.window.is_char_boundary(cut) {
                cut += 1;
            }
            &self.window[cut..]
        } else {
            &self.window[..]
        };
        Some(LiveText {
            segment,
            offset: self.safe_len - text.len(),
            text: text.to_owned(),
            broken: self.broken,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(first_seq: u64, text: &str, elided: usize) -> TextSegment {
        TextSegment {
            id: None,
            text: text.to_owned(),
            chars: text.chars().count(),
            line_start: 0,
            elided,
            first_seq,
            last_seq: first_seq,
        }
    }

    #[test]
    fn follows_appends_and_holds_back_a_half_streamed_secret() {
        let mut f = AnswerFollower::default();
        f.follow(&seg(3, "Hello ", 0));
        f.follow(&seg(3, "Hello wor", 0));
        let v = f.view().unwrap();
        assert_eq!((v.segment, v.offset), (3, 0));
        assert!(v.text.starts_with("Hello"), "{v:?}");
        f.follow(&seg(3, "Hello world key sk-ant-api03-AbCdEfGhIjKl", 0));
        let v = f.view().unwrap();
        assert!(!v.text.contains("AbCd"), "{v:?}");
        f.follow(&seg(9, "next", 0));
        let v = f.view().unwrap();
        assert_eq!(v.segment, 9);
    }

    #[test]
    fn a_rewrite_or_a_gap_breaks_the_segment() {
        let mut f = AnswerFollower::default();
        f.follow(&seg(1, "abcdef\n", 0));
        f.follow(&seg(1, "abc", 0));
        assert!(f.view().unwrap().broken);
        let mut g = AnswerFollower::default();
        g.follow(&seg(1, "ab\n", 0));
        g.follow(&seg(1, "zz\n", 10));
        assert!(g.view().unwrap().broken);
    }

    #[test]
    fn the_window_is_bounded_and_offsets_add_up() {
        let mut f = AnswerFollower::default();
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!("line {i} é\n"));
            f.follow(&seg(1, &text, 0));
        }
        let v = f.view().unwrap();
        assert!(v.text.len() <= LIVE_WINDOW_BYTES);
        assert_eq!(v.offset + v.text.len(), text.len());
        assert!(text.ends_with(&v.text));
    }
}

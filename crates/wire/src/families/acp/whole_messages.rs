//! ACP v2 whole-message upserts: `agent_message` and `agent_thought` name their message
//! by `messageId` and carry its whole `content` so far (present = replace, `null` or `[]`
//! = clear, absent = unchanged).
//!
//! The grammar streams deltas and never takes text back, so each lane remembers how much
//! of its current message was shown — its length and a hash, not the text, to stay flat
//! in memory — and turns a snapshot into:
//! - nothing, when it is what was shown;
//! - a delta, when it extends what was shown (the common case: the agent re-sends the
//!   message as it grows);
//! - a rewrite, when it changes what was shown: the adapter reports `message_rewritten`
//!   and shows the whole new text as a new segment (so a final answer is the latest
//!   text, never a splice of old and new).

use std::hash::{DefaultHasher, Hash, Hasher};

/// What one snapshot changes.
#[derive(Debug, PartialEq)]
pub(super) enum Change<'t> {
    Unchanged,
    Extend(&'t str),
    Rewrite(&'t str),
}

/// What was shown of the lane's current message.
#[derive(Debug, Default)]
struct Shown {
    message_id: String,
    len: usize,
    hash: u64,
    /// Content blocks seen so far (non-text blocks are reported once, when new).
    blocks: usize,
}

/// One lane (the agent's message, or its thought).
#[derive(Debug, Default)]
pub(super) struct Lane {
    shown: Option<Shown>,
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl Lane {
    /// Records the snapshot `text` of message `id` (with `blocks` content blocks) and
    /// says what it changes. A new `id` starts over: all of its text is new.
    pub(super) fn upsert<'t>(&mut self, id: &str, text: &'t str, blocks: usize) -> Change<'t> {
        let shown = match &mut self.shown {
            Some(s) if s.message_id == id => s,
            _ => self.shown.insert(Shown {
                message_id: id.to_owned(),
                len: 0,
                hash: hash(""),
                blocks: 0,
            }),
        };
        shown.blocks = shown.blocks.max(blocks);
        let extends = text.len() >= shown.len
            && text.is_char_boundary(shown.len)
            && hash(&text[..shown.len]) == shown.hash;
        let change = if !extends {
            Change::Rewrite(text)
        } else if text.len() == shown.len {
            Change::Unchanged
        } else {
            Change::Extend(&text[shown.len..])
        };
        shown.len = text.len();
        shown.hash = hash(text);
        change
    }

    /// Content blocks of message `id` seen before this snapshot (0 for a new message).
    pub(super) fn blocks_seen(&self, id: &str) -> usize {
        match &self.shown {
            Some(s) if s.message_id == id => s.blocks,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_snapshots_become_deltas_and_rewrites_are_told_apart() {
        let mut lane = Lane::default();
        assert_eq!(lane.upsert("m1", "Hel", 1), Change::Extend("Hel"));
        assert_eq!(lane.upsert("m1", "Hello", 1), Change::Extend("lo"));
        assert_eq!(lane.upsert("m1", "Hello", 1), Change::Unchanged);
        assert_eq!(lane.upsert("m1", "Help", 1), Change::Rewrite("Help"));
        assert_eq!(lane.upsert("m1", "", 0), Change::Rewrite(""));
        assert_eq!(lane.upsert("m2", "Bye", 1), Change::Extend("Bye"));
        // A snapshot that cuts a multi-byte character where the old text ended.
        assert_eq!(lane.upsert("m3", "é", 1), Change::Extend("é"));
        assert_eq!(lane.upsert("m3", "x", 1), Change::Rewrite("x"));
    }
}

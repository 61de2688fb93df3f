//! The final-answer candidate of an open run, bounded.
//!
//! Adapters keep the text a run may finish with (the last text segment, every content
//! delta of a Chat Completions turn, …) until the turn resolves (spec §3.5). A model that
//! never stops would make that text, and the instance's memory, grow without end. The
//! final answer is one event, and one event is one broker message: the normalizer already
//! cuts an event over the broker's `max_payload`, keeping its head. So the adapter keeps
//! at most [`FINAL_TEXT_CAP`] bytes of the candidate's head and counts the rest; a cut
//! final says so in its text and in a `final_answer_cut` diagnostic. The provider's bytes
//! stay whole in `SG_RAW`, and every delta still goes out as commentary.
//!
//! Two bounds, set once by the service ([`configure`]): each candidate keeps at most
//! the per-run cap, and all candidates of the process together at most the process
//! budget ([`held_bytes`] is the gauge); past either, a candidate stops growing — the
//! run is degraded visibly, never the instance.

use crate::emitter::Emitter;
use std::sync::atomic::{AtomicUsize, Ordering};
use streamgate_grammar::Json;

/// Default bytes of one final-answer candidate kept in memory: the largest broker
/// message the project's own nats-server configuration accepts (8 MiB); an event over a
/// smaller `max_payload` is cut further by the normalizer.
pub const FINAL_TEXT_CAP: usize = 8 << 20;

/// Default bytes of every candidate of the process together.
pub const FINAL_TEXT_BUDGET: usize = 128 << 20;

static RUN_CAP: AtomicUsize = AtomicUsize::new(FINAL_TEXT_CAP);
static PROCESS_BUDGET: AtomicUsize = AtomicUsize::new(FINAL_TEXT_BUDGET);
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Sets the per-run cap and the process budget (at startup, before any run).
pub fn configure(run_cap: usize, process_budget: usize) {
    RUN_CAP.store(run_cap.max(1), Ordering::Relaxed);
    PROCESS_BUDGET.store(process_budget.max(1), Ordering::Relaxed);
}

/// Bytes the candidates of every open run of this process hold now.
pub fn held_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// A final-answer candidate: its head up to the per-run cap (and the process budget),
/// and how many bytes arrived after it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FinalText {
    head: String,
    elided: usize,
}

impl Drop for FinalText {
    fn drop(&mut self) {
        HELD.fetch_sub(self.head.len(), Ordering::Relaxed);
    }
}

impl FinalText {
    /// Appends `s`, counting what no longer fits.
    pub fn push_str(&mut self, s: &str) {
        if self.elided > 0 {
            self.elided += s.len();
            return;
        }
        let budget_room = PROCESS_BUDGET
            .load(Ordering::Relaxed)
            .saturating_sub(HELD.load(Ordering::Relaxed));
        let room = RUN_CAP
            .load(Ordering::Relaxed)
            .saturating_sub(self.head.len())
            .min(budget_room);
        let mut keep = room.min(s.len());
        while !s.is_char_boundary(keep) {
            keep -= 1;
        }
        self.head.push_str(&s[..keep]);
        HELD.fetch_add(keep, Ordering::Relaxed);
        self.elided = s.len() - keep;
    }

    /// Empties it (the next text starts a new candidate).
    pub fn clear(&mut self) {
        HELD.fetch_sub(self.head.len(), Ordering::Relaxed);
        self.head.clear();
        self.elided = 0;
    }

    /// Replaces it with `text` (an authoritative snapshot).
    pub fn set(&mut self, text: &str) {
        self.clear();
        self.push_str(text);
    }

    /// True when nothing arrived.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.elided == 0
    }

    /// Bytes that arrived, kept or not.
    pub fn len(&self) -> usize {
        self.head.len() + self.elided
    }

    /// The kept head.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Whether `text` is (as far as the kept head tells) what arrived.
    pub fn matches(&self, text: &str) -> bool {
        text.len() == self.len() && text.starts_with(&self.head)
    }

    /// What a growing snapshot adds to what arrived, or `None` when `snapshot` does not
    /// extend it.
    pub fn extension<'a>(&self, snapshot: &'a str) -> Option<&'a str> {
        let at = self.len();
        (snapshot.len() >= at && snapshot.is_char_boundary(at) && snapshot.starts_with(&self.head))
            .then(|| &snapshot[at..])
    }

    /// The text for the final answer: the head, and a note of the cut when there was one.
    pub fn text(&self) -> String {
        with_cut_note(self.head.clone(), self.elided)
    }

    /// [`FinalText::text`], leaving it empty (the head is handed over, not copied).
    pub fn take(&mut self) -> String {
        let head = std::mem::take(&mut self.head);
        HELD.fetch_sub(head.len(), Ordering::Relaxed);
        with_cut_note(head, std::mem::take(&mut self.elided))
    }

    /// Reports a cut candidate (a `final_answer_cut` diagnostic) before it goes out as the
    /// final answer: the run is degraded visibly, never silently.
    pub fn report_cut(&self, out: &mut Emitter) {
        if self.elided > 0 {
            out.diagnostic(
                "final_answer_cut",
                Some(Json::from_value(&serde_json::json!({
                    "kept_bytes": self.head.len(),
                    "cut_bytes": self.elided,
                }))),
            );
        }
    }
}

/// `head`, followed by a note of the `elided` bytes when there were any.
fn with_cut_note(mut head: String, elided: usize) -> String {
    if elided > 0 {
        head.push_str(&format!(
            "… [streamgate: {elided} bytes cut: the answer was over what a run may keep in memory; SG_RAW keeps the provider's bytes]"
        ));
    }
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candidate_over_the_cap_keeps_its_head_and_says_what_was_cut() {
        let mut t = FinalText::default();
        let piece = "é".repeat(1000); // 2,000 bytes
        let pieces = FINAL_TEXT_CAP / 2000 + 10;
        for _ in 0..pieces {
            t.push_str(&piece);
        }
        assert!(t.head().len() <= FINAL_TEXT_CAP);
        assert_eq!(t.len(), pieces * 2000);
        let text = t.text();
        assert!(
            text.starts_with(&piece) && text.contains("bytes cut"),
            "{}",
            &text[text.len() - 200..]
        );
        // A growing snapshot past the cap extends it by exactly what it adds.
        let mut snapshot = piece.repeat(pieces);
        assert!(t.matches(&snapshot));
        snapshot.push_str("more");
        assert_eq!(t.extension(&snapshot), Some("more"));
        assert_eq!(t.take().len(), text.len());
        assert!(t.is_empty());
    }

    #[test]
    fn a_small_candidate_is_exact() {
        let mut t = FinalText::default();
        t.push_str("Hello, ");
        t.push_str("world");
        assert_eq!(t.text(), "Hello, world");
        assert_eq!(t.extension("Hello, world!"), Some("!"));
        assert_eq!(t.extension("Bye"), None);
        assert!(t.matches("Hello, world") && !t.matches("Hello, world!"));
        t.set("x");
        assert_eq!(t.take(), "x");
    }
}

//! The thinking and text segments of a turn whose frames carry finished deltas (Gemini
//! parts, ollama-native messages, OpenClaw agent events): thinking opens on its first delta and closes before
//! anything else; text deltas go out as commentary while the last text segment is kept,
//! to be re-tagged as the final answer when the turn finishes (spec §3.5).

use super::final_text::FinalText;
use crate::emitter::Emitter;
use streamgate_grammar::{
    Assistant, AssistantPhase, SegmentPhase, SegmentStatus, Thinking, ThinkingVariant,
};

/// Segment state of one turn.
#[derive(Debug, Default)]
pub struct TurnSegments {
    /// The variant of the open thinking segment.
    thinking: Option<ThinkingVariant>,
    /// The last text segment (the final-answer candidate), bounded.
    text: FinalText,
    /// A text segment is open: further text extends `text`.
    text_open: bool,
}

impl TurnSegments {
    /// A thinking delta of `variant` (raw CoT, provider summary, …), opening a segment
    /// first when none of that variant is open; it ends the current text segment.
    pub fn think(&mut self, out: &mut Emitter, variant: ThinkingVariant, delta: String) {
        self.text_open = false;
        if self.thinking != Some(variant) {
            self.end_thinking(out, None);
            self.thinking = Some(variant);
            out.emit(Thinking::marker(variant, SegmentPhase::Start, None));
        }
        out.emit(Thinking::delta(variant, delta, None));
    }

    /// True while a thinking segment is open.
    pub fn thinking_open(&self) -> bool {
        self.thinking.is_some()
    }

    /// The open thinking segment's variant.
    pub fn thinking_variant(&self) -> Option<ThinkingVariant> {
        self.thinking
    }

    /// Closes the open thinking segment (if any) with its token count.
    pub fn end_thinking(&mut self, out: &mut Emitter, tokens: Option<u64>) {
        let Some(variant) = self.thinking.take() else {
            return;
        };
        let mut marker = Thinking::marker(variant, SegmentPhase::End, None);
        marker.tokens = tokens;
        out.emit(marker);
    }

    /// A text delta, as in-progress commentary; it extends the open text segment or
    /// starts a new one. The caller ends thinking first (it knows the token count).
    pub fn say(&mut self, out: &mut Emitter, delta: String) {
        debug_assert!(self.thinking.is_none(), "end thinking before text");
        if !self.text_open {
            self.text_open = true;
            self.text.clear();
        }
        self.text.push_str(&delta);
        out.emit(Assistant {
            phase: Some(AssistantPhase::Commentary),
            delta: Some(delta),
            status: Some(SegmentStatus::InProgress),
            ..Assistant::default()
        });
    }

    /// The open text segment's text so far (`None` when no text segment is open): lets
    /// snapshot-only wires turn a growing snapshot into deltas
    /// ([`FinalText::extension`]).
    pub fn open_text(&self) -> Option<&FinalText> {
        self.text_open.then_some(&self.text)
    }

    /// Something other than text happened (a tool call): the next text starts a new
    /// segment.
    pub fn break_text(&mut self) {
        self.text_open = false;
    }

    /// Re-tags the last text segment as the final answer (when there is text), marked
    /// `truncated` when the turn hit its token limit.
    pub fn finalize(&mut self, out: &mut Emitter, truncated: bool) {
        if self.text.is_empty() {
            return;
        }
        self.text.report_cut(out);
        out.emit(Assistant {
            phase: Some(AssistantPhase::FinalAnswer),
            text: Some(self.text.take()),
            status: Some(SegmentStatus::Completed),
            truncated: truncated.then_some(true),
            ..Assistant::default()
        });
    }
}

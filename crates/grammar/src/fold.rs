//! The run-state fold: a deterministic summary of a run at any seq. The archiver serves it
//! as `ReplayState`/`ReplayTimeline`; the projector renders drafts from it.
//!
//! Folding the same events always gives the same state, so a consumer that crashed can
//! rebuild a run by re-reading its events.

use crate::event::{
    AssistantPhase, Diagnostic, Event, EventData, ItemPhase, LifecyclePhase, RunStatus,
    SegmentPhase, StopReason, ThinkingVariant,
};
use crate::json::Json;

/// Where a run stands.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RunProgress {
    /// No terminal event yet.
    #[default]
    Open,
    /// `lifecycle/end`.
    Ended {
        /// Normalized stop reason.
        reason: Option<StopReason>,
        /// Completed or incomplete.
        status: Option<RunStatus>,
    },
    /// `lifecycle/error`.
    Failed {
        /// Normalized stop reason (`error`, `stream_closed`, …).
        reason: Option<StopReason>,
        /// The error diagnostic, if any.
        diagnostic: Option<Diagnostic>,
    },
}

/// A commentary text segment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TextSegment {
    /// Provider segment id, when stable.
    pub id: Option<String>,
    /// Text so far.
    pub text: String,
    /// `text.chars().count()`, kept by the fold as text arrives: renderers of long
    /// texts need the length on every event without a pass over the whole text.
    pub chars: usize,
    /// Byte offset where `text`'s last line starts (after its last `\n`), kept by the
    /// fold likewise: a status line shows the last line without scanning the text.
    pub line_start: usize,
    /// Bytes dropped from the front of `text` by a windowed fold
    /// ([`RunState::windowed`]); 0 in a full fold.
    pub elided: usize,
    /// First and last seq that touched it.
    pub first_seq: u64,
    /// Last seq that touched it.
    pub last_seq: u64,
}

/// A reasoning segment.
#[derive(Debug, Clone, PartialEq)]
pub struct ThinkingSegment {
    /// Provider segment id, when stable.
    pub id: Option<String>,
    /// The lane.
    pub variant: ThinkingVariant,
    /// Reasoning text so far (empty for redacted markers); in a windowed fold, its
    /// last bytes only.
    pub text: String,
    /// Bytes dropped from the front of `text` by a windowed fold; 0 in a full fold.
    pub elided: usize,
    /// Thinking tokens, from the end marker or the tokens-only update after it.
    pub tokens: Option<u64>,
    /// First seq of the segment.
    pub first_seq: u64,
    /// Last seq of the segment.
    pub last_seq: u64,
    /// True once the `end` marker arrived.
    pub closed: bool,
}

/// A tool call or other activity item.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ItemState {
    /// Provider call id.
    pub id: Option<String>,
    /// Provider index.
    pub index: Option<u64>,
    /// Item kind (`tool`, `command`, …).
    pub kind: String,
    /// Tool name.
    pub name: Option<String>,
    /// Latest status.
    pub status: Option<String>,
    /// Input at start, when given.
    pub input: Option<Json>,
    /// Argument text assembled from `input_delta`s (in a windowed fold, its first bytes).
    pub input_text: String,
    /// Final arguments, from `end`.
    pub arguments: Option<Json>,
    /// Result, from `end`.
    pub result: Option<Json>,
    /// Output text assembled from `output_delta`s (in a windowed fold, its first bytes).
    pub output_text: String,
    /// Bytes of `input_delta`s and `output_delta`s a windowed fold left out (it keeps
    /// the first bytes of each: a tool row shows how its arguments and output start);
    /// 0 in a full fold.
    pub elided: usize,
    /// First seq of the item.
    pub first_seq: u64,
    /// Last seq of the item.
    pub last_seq: u64,
    /// True once `end` arrived.
    pub ended: bool,
}

/// The folded state of one run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunState {
    /// Highest seq folded.
    pub last_seq: u64,
    /// Provider, from `lifecycle/start`.
    pub provider: Option<String>,
    /// Model, from `lifecycle/start`.
    pub model: Option<String>,
    /// Provider message/response id.
    pub message_id: Option<String>,
    /// Open, ended or failed.
    pub progress: RunProgress,
    /// The final answer, once resolved.
    pub final_text: Option<String>,
    /// True when the final answer was truncated.
    pub final_truncated: bool,
    /// Seq of the final answer.
    pub final_seq: Option<u64>,
    /// Commentary segments in order.
    pub commentary: Vec<TextSegment>,
    /// Thinking segments in order.
    pub thinking: Vec<ThinkingSegment>,
    /// Items in order of first appearance.
    pub items: Vec<ItemState>,
    /// Latest cumulative usage.
    pub usage: Option<Json>,
    /// Diagnostics from `lifecycle/update` (and terminal events), in order.
    pub diagnostics: Vec<Diagnostic>,
    /// Seq of the last event that was not commentary (to split id-less text segments).
    last_non_commentary_seq: u64,
    /// Longest text a segment keeps, in bytes ([`RunState::windowed`]); `None` keeps all.
    window: Option<usize>,
}

/// Appends `delta` to `text` as far as `window` bytes allow (at a char boundary);
/// returns the bytes left out.
fn push_within(text: &mut String, delta: &str, window: Option<usize>) -> usize {
    let room = window.map_or(usize::MAX, |w| w.saturating_sub(text.len()));
    if delta.len() <= room {
        text.push_str(delta);
        return 0;
    }
    let mut end = room;
    while !delta.is_char_boundary(end) {
        end -= 1;
    }
    text.push_str(&delta[..end]);
    delta.len() - end
}

/// Drops the front of `text` once it is over twice `window` bytes, keeping its last
/// `window` bytes or so (cut at a char boundary): amortized O(1) per byte appended.
/// Returns the bytes dropped.
fn keep_tail(text: &mut String, window: Option<usize>) -> usize {
    let Some(window) = window else { return 0 };
    if text.len() <= window.saturating_mul(2) {
        return 0;
    }
    let mut cut = text.len() - window;
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    text.drain(..cut);
    cut
}

impl RunState {
    /// Folds a whole event sequence.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> RunState {
        let mut state = RunState::default();
        for ev in events {
            state.apply(ev);
        }
        state
    }

    /// A fold whose texts keep at most about `window` bytes each: a thinking or
    /// commentary segment its last `window` to `2 × window` bytes, a tool's arguments
    /// and output their first `window` bytes. The bounded state a live channel renders
    /// from, which can show only a long text's ends anyway. Counts (`TextSegment::chars`) stay exact;
    /// each segment says how many bytes it dropped (`elided`). The archive's replay
    /// folds in full ([`RunState::fold`]).
    pub fn windowed(window: usize) -> RunState {
        RunState {
            window: Some(window.max(1)),
            ..RunState::default()
        }
    }

    /// True once a terminal lifecycle event was folded.
    pub fn is_terminal(&self) -> bool {
        !matches!(self.progress, RunProgress::Open)
    }

    /// Folds one event.
    pub fn apply(&mut self, ev: &Event) {
        self.last_seq = self.last_seq.max(ev.seq);
        match &ev.data {
            EventData::Assistant(a) => {
                if a.phase == Some(AssistantPhase::FinalAnswer) {
                    self.final_text = a.text.clone().or_else(|| a.delta.clone());
                    self.final_truncated = a.truncated == Some(true);
                    self.final_seq = Some(ev.seq);
                    self.last_non_commentary_seq = ev.seq;
                    return;
                }
                let continues = match self.commentary.last() {
                    Some(seg) if a.id.is_some() => seg.id == a.id,
                    Some(seg) => seg.id.is_none() && seg.last_seq > self.last_non_commentary_seq,
                    None => false,
                };
                if !continues {
                    self.commentary.push(TextSegment {
                        id: a.id.clone(),
                        first_seq: ev.seq,
                        ..TextSegment::default()
                    });
                }
                if let Some(seg) = self.commentary.last_mut() {
                    if let Some(t) = &a.text {
                        seg.text.clone_from(t);
                        seg.elided = 0;
                        seg.chars = t.chars().count();
                        seg.line_start = t.rfind('\n').map_or(0, |i| i + 1);
                    } else if let Some(d) = &a.delta {
                        if let Some(i) = d.rfind('\n') {
                            seg.line_start = seg.text.len() + i + 1;
                        }
                        seg.text.push_str(d);
                        seg.chars += d.chars().count();
                    }
                    let dropped = keep_tail(&mut seg.text, self.window);
                    seg.elided += dropped;
                    seg.line_start = seg.line_start.saturating_sub(dropped);
                    seg.last_seq = ev.seq;
                }
            }
            EventData::Thinking(t) if t.is_tokens_update() => {
                // The token count of an ended segment (spec §3.2, `batch`): it lands on
                // that segment and is no activity of its own (no new segment, no span).
                if let Some(seg) = self.thinking.iter_mut().rev().find(|s| {
                    s.closed && s.tokens.is_none() && s.variant == t.variant && s.id == t.id
                }) {
                    seg.tokens = t.tokens;
                }
            }
            EventData::Thinking(t) => {
                self.last_non_commentary_seq = ev.seq;
                let open = self
                    .thinking
                    .iter()
                    .rposition(|s| !s.closed && s.variant == t.variant && s.id == t.id);
                let idx = match (open, t.phase) {
                    (Some(i), Some(SegmentPhase::Start)) => {
                        // A second start for the same key closes the previous segment.
                        self.thinking[i].closed = true;
                        None
                    }
                    (Some(i), _) => Some(i),
                    (None, _) => None,
                };
                let idx = idx.unwrap_or_else(|| {
                    self.thinking.push(ThinkingSegment {
                        id: t.id.clone(),
                        variant: t.variant,
                        text: String::new(),
                        elided: 0,
                        tokens: None,
                        first_seq: ev.seq,
                        last_seq: ev.seq,
                        closed: false,
                    });
                    self.thinking.len() - 1
                });
                let seg = &mut self.thinking[idx];
                if let Some(text) = &t.text {
                    seg.text.clone_from(text);
                    seg.elided = 0;
                } else if let Some(d) = &t.delta {
                    seg.text.push_str(d);
                }
                seg.elided += keep_tail(&mut seg.text, self.window);
                if t.tokens.is_some() {
                    seg.tokens = t.tokens;
                }
                if t.phase == Some(SegmentPhase::End) {
                    seg.closed = true;
                }
                seg.last_seq = ev.seq;
            }
            EventData::Item(it) => {
                self.last_non_commentary_seq = ev.seq;
                let existing = self.items.iter().rposition(|s| {
                    (it.id.is_some() && s.id == it.id)
                        || (it.id.is_none() && s.index == it.index && !s.ended)
                });
                let idx = match existing {
                    Some(i) if it.phase != ItemPhase::Start || !self.items[i].ended => i,
                    _ => {
                        self.items.push(ItemState {
                            id: it.id.clone(),
                            index: it.index,
                            kind: it.kind.clone(),
                            first_seq: ev.seq,
                            ..ItemState::default()
                        });
                        self.items.len() - 1
                    }
                };
                let item = &mut self.items[idx];
                if it.name.is_some() {
                    item.name.clone_from(&it.name);
                }
                if it.status.is_some() {
                    item.status.clone_from(&it.status);
                }
                if it.input.is_some() {
                    item.input.clone_from(&it.input);
                }
                // A tool row shows the start of its arguments and output: a windowed fold
                // keeps their heads.
                if let Some(d) = &it.input_delta {
                    item.elided += push_within(&mut item.input_text, d, self.window);
                }
                if let Some(d) = &it.output_delta {
                    item.elided += push_within(&mut item.output_text, d, self.window);
                }
                if it.arguments.is_some() {
                    item.arguments.clone_from(&it.arguments);
                }
                if it.result.is_some() {
                    item.result.clone_from(&it.result);
                }
                if it.phase == ItemPhase::End {
                    item.ended = true;
                }
                item.last_seq = ev.seq;
            }
            EventData::Lifecycle(l) => {
                self.last_non_commentary_seq = ev.seq;
                if l.provider.is_some() {
                    self.provider.clone_from(&l.provider);
                }
                if l.model.is_some() {
                    self.model.clone_from(&l.model);
                }
                if l.id.is_some() {
                    self.message_id.clone_from(&l.id);
                }
                if let Some(u) = &l.usage {
                    if !u.is_null() {
                        self.usage = Some(u.clone());
                    }
                }
                if let Some(d) = &l.diagnostic {
                    self.diagnostics.push(d.clone());
                }
                match l.phase {
                    LifecyclePhase::End => {
                        self.progress = RunProgress::Ended {
                            reason: l.reason.clone(),
                            status: l.status,
                        }
                    }
                    LifecyclePhase::Error => {
                        self.progress = RunProgress::Failed {
                            reason: l.reason.clone(),
                            diagnostic: l.diagnostic.clone(),
                        }
                    }
                    LifecyclePhase::Start | LifecyclePhase::Update => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(lines: &[&str]) -> RunState {
        let evs: Vec<Event> = lines.iter().map(|l| Event::from_json(l).unwrap()).collect();
        RunState::fold(&evs)
    }

    #[test]
    fn folds_thinking_text_tools_and_end() {
        let s = fold(&[
            r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"anthropic","model":"m"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"0","variant":"raw","delta":"a"}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end","tokens":3}}"#,
            r#"{"seq":5,"stream":"item","data":{"phase":"start","id":"t1","index":0,"kind":"tool","name":"w","status":"in_progress"}}"#,
            r#"{"seq":6,"stream":"item","data":{"phase":"update","id":"t1","index":0,"kind":"tool","input_delta":"{}"}}"#,
            r#"{"seq":7,"stream":"item","data":{"phase":"end","id":"t1","index":0,"kind":"tool","status":"completed","arguments":{}}}"#,
            r#"{"seq":8,"stream":"assistant","data":{"phase":"commentary","delta":"he"}}"#,
            r#"{"seq":9,"stream":"assistant","data":{"phase":"commentary","delta":"llo"}}"#,
            r#"{"seq":10,"stream":"assistant","data":{"phase":"final_answer","text":"hello"}}"#,
            r#"{"seq":11,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed","usage":{"x":1}}}"#,
        ]);
        assert_eq!(s.thinking.len(), 1);
        assert_eq!(s.thinking[0].text, "a");
        assert_eq!(s.thinking[0].tokens, Some(3));
        assert_eq!(s.items.len(), 1);
        assert_eq!(s.items[0].input_text, "{}");
        assert!(s.items[0].ended);
        assert_eq!(s.commentary.len(), 1);
        assert_eq!(s.commentary[0].text, "hello");
        assert_eq!(s.commentary[0].chars, 5);
        assert_eq!(s.commentary[0].line_start, 0);
        assert_eq!(s.final_text.as_deref(), Some("hello"));
        assert!(s.is_terminal());
        assert_eq!(s.usage.unwrap().get(), r#"{"x":1}"#);
    }

    #[test]
    fn a_tokens_update_lands_on_its_ended_segment() {
        let live = [
            r#"{"seq":1,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","delta":"a"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end"}}"#,
            r#"{"seq":4,"stream":"assistant","data":{"phase":"commentary","delta":"he","id":"1"}}"#,
            r#"{"seq":5,"stream":"thinking","data":{"id":"0","variant":"raw","tokens":3}}"#,
            r#"{"seq":6,"stream":"assistant","data":{"phase":"final_answer","text":"he","id":"1"}}"#,
            r#"{"seq":7,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ];
        let s = fold(&live);
        assert_eq!(s.thinking.len(), 1, "{:?}", s.thinking);
        assert_eq!(s.thinking[0].tokens, Some(3));
        assert_eq!(s.thinking[0].text, "a");
        assert_eq!(
            s.thinking[0].last_seq, 3,
            "the update is not part of the span"
        );
        // Same state as the batch form, apart from the seqs the update took.
        let evs: Vec<Event> = live.iter().map(|l| Event::from_json(l).unwrap()).collect();
        let batch = RunState::fold(&crate::batch::fold_token_updates(&evs));
        assert_eq!(batch.thinking[0].tokens, s.thinking[0].tokens);
        assert_eq!(batch.thinking[0].text, s.thinking[0].text);
        assert_eq!(batch.final_text, s.final_text);
        assert_eq!(batch.commentary.len(), s.commentary.len());
    }

    #[test]
    fn a_windowed_fold_keeps_a_bounded_tail_and_exact_counts() {
        let mut s = RunState::windowed(16);
        let mut full = RunState::default();
        for seq in 1..=1000u64 {
            let line = match seq % 3 {
                0 => format!(
                    r#"{{"seq":{seq},"stream":"thinking","data":{{"id":"0","variant":"raw","delta":"é{seq}"}}}}"#
                ),
                1 => format!(
                    r#"{{"seq":{seq},"stream":"item","data":{{"phase":"update","id":"t","kind":"tool","input_delta":"ü{seq}"}}}}"#
                ),
                _ => format!(
                    r#"{{"seq":{seq},"stream":"assistant","data":{{"phase":"commentary","id":"c","delta":"ä\n{seq}"}}}}"#
                ),
            };
            let ev = Event::from_json(&line).unwrap();
            s.apply(&ev);
            full.apply(&ev);
        }
        let (t, ft) = (&s.thinking[0], &full.thinking[0]);
        assert!(t.text.len() <= 32 && t.elided > 0);
        assert!(ft.text.ends_with(&t.text) && ft.text.len() == t.text.len() + t.elided);
        let (c, fc) = (&s.commentary[0], &full.commentary[0]);
        assert!(c.text.len() <= 32 && fc.text.ends_with(&c.text));
        assert_eq!(c.chars, fc.chars, "counts stay exact");
        assert_eq!(&c.text[c.line_start..], &fc.text[fc.line_start..]);
        let (i, fi) = (&s.items[0], &full.items[0]);
        assert!(i.input_text.len() <= 16 && fi.input_text.starts_with(&i.input_text));
        assert_eq!(i.input_text.len() + i.elided, fi.input_text.len());
        assert_eq!(full.thinking[0].elided + full.commentary[0].elided, 0);
    }
}

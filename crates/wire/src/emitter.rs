//! Where adapters put their output: events (with `seq` assigned in emission order), the
//! side-channel transcript for opaque material, and frame accounting for invariant I6.
//!
//! # Held events
//! Some values are only known after later frames: F1 reports thinking tokens in the final
//! usage frame, yet the golden stream places them on the segment's `end` marker. An
//! adapter [`hold`](Emitter::hold)s such an event; it keeps its seq, and everything emitted
//! after it waits behind it, so consumers still see seq order. The adapter fills it in and
//! [`release`](Emitter::release)s it when the value arrives; the run's close releases
//! everything still held. A hold that waits behind more than [`MAX_HELD_EVENTS`] events
//! is released as-is, so memory stays bounded — a deterministic rule (counted in events,
//! not time), so replays of the same bytes still give the same events.

use std::collections::VecDeque;
use streamgate_grammar::{Event, EventData, FrameAccount, Json, Lifecycle};

/// Upper bound on events queued behind a hold.
pub const MAX_HELD_EVENTS: usize = 4096;

/// Handle to a held event (its seq).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold(u64);

/// Opaque provider material kept off the bus (spec §2: the adapter's provider-native
/// transcript): signatures, encrypted reasoning, thought signatures, raw reasoning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptEntry {
    /// What kind of material (`anthropic_signature_delta`, `gemini_thought_signature`, …).
    pub kind: &'static str,
    /// The segment or item it belongs to, when known.
    pub segment: Option<String>,
    /// The material itself, verbatim.
    pub material: String,
}

/// What a diagnostic may say about a frame without quoting it.
struct FrameShape<'a> {
    bytes: usize,
    kind: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> FrameShape<'a> {
    /// Longest `type` tag echoed; longer values are not tags.
    const MAX_TAG: usize = 64;

    fn of(data: &'a str) -> FrameShape<'a> {
        #[derive(serde::Deserialize)]
        struct Tagged<'b> {
            #[serde(rename = "type", borrow, default)]
            kind: Option<std::borrow::Cow<'b, str>>,
        }
        let kind = serde_json::from_str::<Tagged<'a>>(data)
            .ok()
            .and_then(|t| t.kind)
            .filter(|k| {
                k.len() <= Self::MAX_TAG
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
            });
        FrameShape {
            bytes: data.len(),
            kind,
        }
    }

    fn detail(&self, what: Option<&str>) -> Json {
        let mut detail = serde_json::Map::new();
        if let Some(w) = what {
            detail.insert("frame".into(), w.into());
        }
        detail.insert("bytes".into(), self.bytes.into());
        if let Some(k) = &self.kind {
            detail.insert("type".into(), k.as_ref().into());
        }
        Json::from_value(&detail)
    }
}

#[derive(Debug)]
struct Queued {
    event: Event,
    held: bool,
}

/// Output collector for one run.
#[derive(Debug, Default)]
pub struct Emitter {
    next_seq: u64,
    ready: Vec<Event>,
    queue: VecDeque<Queued>,
    transcript: Vec<TranscriptEntry>,
    account: FrameAccount,
    /// Outputs recorded since the current frame began (events, transcript, drops).
    frame_outputs: u64,
    /// A terminal lifecycle event was emitted: nothing may follow it (invariant I7).
    terminated: bool,
    /// Events refused because they came after the terminal event.
    after_terminal: u64,
}

impl Emitter {
    /// A fresh emitter; the first event gets seq 1.
    pub fn new() -> Emitter {
        Emitter {
            next_seq: 1,
            ..Emitter::default()
        }
    }

    /// Emits an event; returns its seq, or `None` when the run already ended.
    ///
    /// Once a terminal lifecycle event is out, later events (a diagnostic for bytes that
    /// trail the provider's stop, say) are refused and counted instead: a run has exactly
    /// one terminal event and it is the last one, whatever the input.
    pub fn emit(&mut self, data: impl Into<EventData>) -> Option<u64> {
        let data = data.into();
        self.frame_outputs += 1;
        if !self.admit(&data) {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let event = Event { seq, data };
        if self.queue.is_empty() {
            self.ready.push(event);
        } else {
            self.queue.push_back(Queued { event, held: false });
            if self.queue.len() > MAX_HELD_EVENTS {
                self.release_oldest();
            }
        }
        Some(seq)
    }

    /// True when the run has not ended yet; records a terminal event as the end.
    fn admit(&mut self, data: &EventData) -> bool {
        if self.terminated {
            self.after_terminal += 1;
            return false;
        }
        if matches!(data, EventData::Lifecycle(l) if l.is_terminal()) {
            self.terminated = true;
        }
        true
    }

    /// True once a terminal lifecycle event was emitted.
    pub fn is_terminated(&self) -> bool {
        self.terminated
    }

    /// Events refused because they came after the terminal event.
    pub fn after_terminal(&self) -> u64 {
        self.after_terminal
    }

    /// Emits a `lifecycle/update` diagnostic.
    pub fn diagnostic(&mut self, code: &str, detail: Option<Json>) -> Option<u64> {
        self.emit(Lifecycle::diagnostic(code, detail))
    }

    /// Emits an `unknown_frame` diagnostic: which frame, its size and (when it has one) its
    /// short `type` tag — never its values. A frame nobody recognises may still carry
    /// opaque material (signatures, encrypted reasoning), and nothing opaque may reach the
    /// bus (spec §2); the bytes themselves stay in SG_RAW, the provider-native transcript.
    pub fn unknown_frame(&mut self, what: &str, data: &str) -> Option<u64> {
        let detail = FrameShape::of(data).detail(Some(what));
        self.diagnostic("unknown_frame", Some(detail))
    }

    /// Emits a `malformed_frame` diagnostic for a frame that is not the JSON its family
    /// promises (reported like [`unknown_frame`](Emitter::unknown_frame): shape only).
    pub fn malformed_frame(&mut self, data: &str) -> Option<u64> {
        let detail = FrameShape::of(data).detail(None);
        self.diagnostic("malformed_frame", Some(detail))
    }

    /// Emits an event that later frames will complete; see the module docs. After the
    /// terminal event the hold is refused like [`emit`](Emitter::emit) (its handle then
    /// points at nothing).
    pub fn hold(&mut self, data: impl Into<EventData>) -> Hold {
        let data = data.into();
        self.frame_outputs += 1;
        if !self.admit(&data) {
            return Hold(0);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back(Queued {
            event: Event { seq, data },
            held: true,
        });
        Hold(seq)
    }

    /// The held event, to fill in; `None` once it was released.
    pub fn held_mut(&mut self, hold: Hold) -> Option<&mut EventData> {
        self.queue
            .iter_mut()
            .find(|q| q.held && q.event.seq == hold.0)
            .map(|q| &mut q.event.data)
    }

    /// Releases a held event (and whatever waited only behind it).
    pub fn release(&mut self, hold: Hold) {
        if let Some(q) = self.queue.iter_mut().find(|q| q.event.seq == hold.0) {
            q.held = false;
        }
        self.flush_queue();
    }

    /// Releases every held event (the run is closing).
    pub fn release_all(&mut self) {
        for q in &mut self.queue {
            q.held = false;
        }
        self.flush_queue();
    }

    /// Records opaque material in the side-channel transcript.
    pub fn transcript(&mut self, kind: &'static str, segment: Option<&str>, material: &str) {
        self.frame_outputs += 1;
        self.transcript.push(TranscriptEntry {
            kind,
            segment: segment.map(str::to_owned),
            material: material.to_owned(),
        });
    }

    /// Accounts for a frame that is a documented drop (keepalive, `[DONE]`, structural
    /// framing) or whose content went into adapter state (consumed, emitted later).
    pub fn consumed(&mut self) {
        self.frame_outputs += 1;
    }

    /// Notes that the provider sent usage (invariant I10 checks it reaches the end event).
    pub fn saw_usage(&mut self) {
        self.account.usage_seen = true;
    }

    /// Seq the next emitted event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Events ready for consumers, in seq order.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Event> {
        self.ready.drain(..)
    }

    /// Number of events ready.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Transcript entries recorded so far, handed out once.
    pub fn take_transcript(&mut self) -> Vec<TranscriptEntry> {
        std::mem::take(&mut self.transcript)
    }

    /// Frame accounting so far.
    pub fn account(&self) -> FrameAccount {
        self.account
    }

    /// Marks the start of a frame (for I6).
    pub(crate) fn begin_frame(&mut self) {
        self.account.frames += 1;
        self.frame_outputs = 0;
    }

    /// Marks the end of a frame; a frame with no output at all is unaccounted.
    pub(crate) fn end_frame(&mut self) {
        if self.frame_outputs == 0 {
            self.account.unaccounted += 1;
        }
    }

    fn release_oldest(&mut self) {
        if let Some(q) = self.queue.iter_mut().find(|q| q.held) {
            q.held = false;
        }
        self.flush_queue();
    }

    fn flush_queue(&mut self) {
        while self.queue.front().is_some_and(|q| !q.held) {
            if let Some(q) = self.queue.pop_front() {
                self.ready.push(q.event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamgate_grammar::{SegmentPhase, Thinking, ThinkingVariant};

    #[test]
    fn held_events_keep_their_seq_and_block_later_ones() {
        let mut e = Emitter::new();
        e.emit(Lifecycle::diagnostic("a", None));
        let h = e.hold(Thinking::marker(
            ThinkingVariant::Raw,
            SegmentPhase::End,
            None,
        ));
        e.emit(Lifecycle::diagnostic("b", None));
        assert_eq!(e.drain().map(|ev| ev.seq).collect::<Vec<_>>(), vec![1]);
        if let Some(EventData::Thinking(t)) = e.held_mut(h) {
            t.tokens = Some(7);
        }
        e.release(h);
        let rest: Vec<_> = e.drain().collect();
        assert_eq!(rest.iter().map(|ev| ev.seq).collect::<Vec<_>>(), vec![2, 3]);
        assert!(matches!(&rest[0].data, EventData::Thinking(t) if t.tokens == Some(7)));
    }

    #[test]
    fn frame_diagnostics_never_quote_values() {
        let mut e = Emitter::new();
        e.unknown_frame(
            "x",
            r#"{"type":"response.audio.delta","signature":"SECRETSECRET"}"#,
        );
        e.malformed_frame(r#"{"encrypted_content":"SECRETSECRET"#);
        let out: Vec<String> = e.drain().map(|ev| ev.to_json()).collect();
        assert!(out
            .iter()
            .all(|l| !l.contains("SECRET") && !l.contains("signature")));
        assert!(out[0].contains("response.audio.delta"));
    }

    #[test]
    fn nothing_follows_the_terminal_event() {
        let mut e = Emitter::new();
        e.emit(Lifecycle::new(streamgate_grammar::LifecyclePhase::End));
        assert_eq!(e.diagnostic("late", None), None);
        assert!(e.is_terminated());
        assert_eq!(e.after_terminal(), 1);
        assert_eq!(e.drain().count(), 1);
    }

    #[test]
    fn holds_are_bounded() {
        let mut e = Emitter::new();
        let _h = e.hold(Thinking::marker(
            ThinkingVariant::Raw,
            SegmentPhase::End,
            None,
        ));
        for _ in 0..=MAX_HELD_EVENTS {
            e.emit(Lifecycle::diagnostic("x", None));
        }
        assert!(e.ready_len() > 0);
    }
}

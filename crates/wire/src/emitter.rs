//! Where adapters put their output: events (with `seq` assigned in emission order), the
//! side-channel transcript for opaque material, and frame accounting for invariant I6.
//!
//! Every event is ready the moment it is emitted: nothing waits for a later frame. A
//! value that only a later frame supplies (thinking tokens from usage, spec §3.2) goes
//! out as an event of its own when that frame arrives
//! ([`Thinking::tokens_update`](streamgate_grammar::Thinking::tokens_update)).

use streamgate_grammar::{Event, EventData, FrameAccount, Json, Lifecycle};

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

/// Output collector for one run.
#[derive(Debug, Default)]
pub struct Emitter {
    next_seq: u64,
    ready: Vec<Event>,
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
        self.ready.push(Event { seq, data });
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

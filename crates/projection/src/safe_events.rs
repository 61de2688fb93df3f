//! Display-safe events for channel token holders (`ProjectorService.Subscribe` and
//! `Watch`, hence `streamgate tail`): the same events, with every piece of progress text
//! passed through the one redactor ([`crate::redact`]). Raw events stay operator-only
//! (the archive's `ArchiveService`).
//!
//! Deltas are redacted on each lane's accumulated text ([`StreamRedactor`]), so a
//! secret split across deltas is still caught; a half-streamed secret-shaped token is
//! held back and goes out with a later delta of its lane or with the lane's closing event
//! (thinking `end`, item `end`, commentary `completed`). Snapshots, tool inputs, arguments,
//! outputs, results and error diagnostics are redacted whole (JSON stays JSON). Final
//! answers pass verbatim, as on every channel (see [`crate::redact`]).

use crate::redact::{redact, redact_json, StreamRedactor};
use std::collections::HashMap;
use streamgate_grammar::{
    AssistantPhase, Event, EventData, ItemPhase, Json, SegmentPhase, SegmentStatus,
};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Lane {
    Thinking(&'static str, Option<String>),
    Commentary(Option<String>),
    ItemInput(String),
    ItemOutput(String),
}

/// One run's events made display-safe, in seq order.
#[derive(Debug, Default, Clone)]
pub struct EventRedactor {
    lanes: HashMap<Lane, StreamRedactor>,
    last_seq: u64,
}

impl EventRedactor {
    /// A run with nothing seen.
    pub fn new() -> EventRedactor {
        EventRedactor::default()
    }

    /// Highest seq seen.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The display-safe form of `ev`, or `None` for a seq at or below
    /// [`EventRedactor::last_seq`] (already seen). Feed every event of the run in order,
    /// including ones the receiver already has (their output is dropped), so lanes carry
    /// their text across a resume.
    pub fn apply(&mut self, ev: &Event) -> Option<Event> {
        if ev.seq <= self.last_seq {
            return None;
        }
        self.last_seq = ev.seq;
        let mut out = ev.clone();
        match &mut out.data {
            EventData::Assistant(a) => {
                if a.phase == Some(AssistantPhase::FinalAnswer) {
                    return Some(out);
                }
                let lane = Lane::Commentary(a.id.clone());
                self.text_lane(
                    lane,
                    &mut a.delta,
                    &mut a.text,
                    a.status == Some(SegmentStatus::Completed),
                );
            }
            EventData::Thinking(t) => {
                let lane = Lane::Thinking(t.variant.as_str(), t.id.clone());
                let end = t.phase == Some(SegmentPhase::End);
                self.text_lane(lane, &mut t.delta, &mut t.text, end);
            }
            EventData::Item(it) => {
                let key = it
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("#{}", it.index.unwrap_or(0)));
                let end = it.phase == ItemPhase::End;
                let mut none = None;
                self.text_lane(
                    Lane::ItemInput(key.clone()),
                    &mut it.input_delta,
                    &mut none,
                    end,
                );
                self.text_lane(Lane::ItemOutput(key), &mut it.output_delta, &mut none, end);
                for j in [
                    &mut it.input,
                    &mut it.arguments,
                    &mut it.output,
                    &mut it.result,
                    &mut it.meta,
                ]
                .into_iter()
                .flatten()
                {
                    *j = redact_json_value(j);
                }
                for s in [&mut it.name, &mut it.title].into_iter().flatten() {
                    *s = redact(s);
                }
            }
            EventData::Lifecycle(l) => {
                if let Some(d) = &mut l.diagnostic {
                    if let Some(m) = &mut d.message {
                        *m = redact(m);
                    }
                    if let Some(j) = &mut d.detail {
                        *j = redact_json_value(j);
                    }
                }
                if l.is_terminal() {
                    self.lanes.clear();
                }
            }
        }
        Some(out)
    }

    /// A delta (redacted on the lane's accumulated text) or a snapshot (redacted whole,
    /// restarting the lane); `close` flushes what the lane held back onto this event.
    fn text_lane(
        &mut self,
        lane: Lane,
        delta: &mut Option<String>,
        snapshot: &mut Option<String>,
        close: bool,
    ) {
        if let Some(text) = snapshot {
            *text = redact(text);
            self.lanes.remove(&lane);
        }
        if delta.is_none() && !close {
            return;
        }
        let r = self.lanes.entry(lane.clone()).or_default();
        let mut safe = delta.as_deref().map(|d| r.push(d)).unwrap_or_default();
        if close {
            safe.push_str(&r.finish());
            self.lanes.remove(&lane);
        }
        if delta.is_some() || !safe.is_empty() {
            *delta = Some(safe);
        }
    }
}

/// `j` redacted; unchanged JSON keeps its exact text.
fn redact_json_value(j: &Json) -> Json {
    let orig = j.to_value();
    let mut v = orig.clone();
    redact_json(&mut v);
    if v == orig {
        j.clone()
    } else {
        Json::from_value(&v)
    }
}

//! The run timeline: segments and items with their seq span and time span, derived from
//! the fold and the events' ingest times.

use crate::envelope::RunEvent;
use crate::event::{EventData, LifecyclePhase};
use crate::fold::RunState;

/// What a timeline entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A reasoning segment.
    Thinking,
    /// A commentary text segment.
    Commentary,
    /// The final answer.
    FinalAnswer,
    /// A tool call or other item.
    Item,
    /// The run's terminal lifecycle event.
    Lifecycle,
}

impl EntryKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Thinking => "thinking",
            EntryKind::Commentary => "commentary",
            EntryKind::FinalAnswer => "final_answer",
            EntryKind::Item => "item",
            EntryKind::Lifecycle => "lifecycle",
        }
    }
}

/// One span of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry {
    /// What it is.
    pub kind: EntryKind,
    /// Provider id, when there is one.
    pub id: Option<String>,
    /// Variant (thinking), tool name (item), reason (lifecycle).
    pub label: String,
    /// First seq.
    pub start_seq: u64,
    /// Last seq.
    pub end_seq: u64,
    /// Ingest time of the first seq (ms).
    pub start_ts_ms: i64,
    /// Ingest time of the last seq (ms).
    pub end_ts_ms: i64,
}

impl TimelineEntry {
    /// Wall time the span took, by ingest time.
    pub fn duration_ms(&self) -> i64 {
        self.end_ts_ms - self.start_ts_ms
    }
}

/// Builds the timeline of a run's events (ordered by start seq).
pub fn timeline(events: &[RunEvent]) -> Vec<TimelineEntry> {
    let state = RunState::fold(events.iter().map(|e| &e.event));
    let ts = |seq: u64| -> i64 {
        events
            .binary_search_by_key(&seq, |e| e.event.seq)
            .map(|i| events[i].envelope.ts_ms)
            .unwrap_or(0)
    };
    let mut out = Vec::new();
    let mut push = |kind, id: Option<String>, label: String, start: u64, end: u64| {
        out.push(TimelineEntry {
            kind,
            id,
            label,
            start_seq: start,
            end_seq: end,
            start_ts_ms: ts(start),
            end_ts_ms: ts(end),
        });
    };
    for t in &state.thinking {
        push(
            EntryKind::Thinking,
            t.id.clone(),
            t.variant.as_str().to_owned(),
            t.first_seq,
            t.last_seq,
        );
    }
    for c in &state.commentary {
        push(
            EntryKind::Commentary,
            c.id.clone(),
            String::new(),
            c.first_seq,
            c.last_seq,
        );
    }
    if let Some(seq) = state.final_seq {
        push(EntryKind::FinalAnswer, None, String::new(), seq, seq);
    }
    for i in &state.items {
        push(
            EntryKind::Item,
            i.id.clone(),
            i.name.clone().unwrap_or_else(|| i.kind.clone()),
            i.first_seq,
            i.last_seq,
        );
    }
    if let Some(term) = events.iter().find_map(|e| match &e.event.data {
        EventData::Lifecycle(l)
            if matches!(l.phase, LifecyclePhase::End | LifecyclePhase::Error) =>
        {
            Some((e.event.seq, l))
        }
        _ => None,
    }) {
        let first = events.first().map_or(term.0, |e| e.event.seq);
        let label = term.1.reason.as_ref().map_or("", |r| r.as_str()).to_owned();
        push(EntryKind::Lifecycle, None, label, first, term.0);
    }
    out.sort_by_key(|e| (e.start_seq, e.end_seq));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;
    use crate::event::Event;

    #[test]
    fn spans_have_seq_and_time() {
        let lines = [
            r#"{"seq":1,"stream":"thinking","data":{"variant":"raw","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"variant":"raw","delta":"x"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"variant":"raw","phase":"end"}}"#,
            r#"{"seq":4,"stream":"assistant","data":{"phase":"commentary","delta":"a"}}"#,
            r#"{"seq":5,"stream":"assistant","data":{"phase":"final_answer","text":"a"}}"#,
            r#"{"seq":6,"stream":"lifecycle","data":{"phase":"end","reason":"completed"}}"#,
        ];
        let events: Vec<RunEvent> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| RunEvent {
                envelope: Envelope {
                    tenant: "t".into(),
                    session_key: None,
                    run_id: "r".into(),
                    ts_ms: 100 + i as i64 * 10,
                },
                event: Event::from_json(l).unwrap(),
            })
            .collect();
        let tl = timeline(&events);
        let kinds: Vec<_> = tl.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![
                EntryKind::Thinking,
                EntryKind::Lifecycle,
                EntryKind::Commentary,
                EntryKind::FinalAnswer
            ]
        );
        assert_eq!(tl[0].duration_ms(), 20);
        assert_eq!(tl[1].end_seq, 6);
    }
}

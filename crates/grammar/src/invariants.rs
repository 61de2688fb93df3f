//! The conformance invariants I1–I10 (spec §8, `CONFORMANCE.md`) as a checker over one
//! run's events, its adapter transcript, and the adapter's frame accounting.

use crate::event::{AssistantPhase, Event, EventData, LifecyclePhase, StopReason, ThinkingVariant};
use std::fmt;

/// How the adapter accounted for the input frames of a run (needed by I6 and I10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameAccount {
    /// Frames decoded from the byte stream.
    pub frames: u64,
    /// Frames that produced no event, no transcript entry, no documented drop and no
    /// diagnostic. I6 requires zero.
    pub unaccounted: u64,
    /// True when some frame carried provider usage.
    pub usage_seen: bool,
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `I1` … `I10`.
    pub invariant: &'static str,
    /// What was wrong, and where.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

/// Keys whose presence in an event means opaque material leaked onto the bus (I2).
const OPAQUE_KEYS: [&str; 4] = [
    "\"signature\"",
    "\"encrypted_content\"",
    "\"thoughtSignature\"",
    "\"thought_signature\"",
];

/// Opaque strings shorter than this are too generic to search for verbatim.
const MIN_OPAQUE_LEN: usize = 12;

/// Checks every invariant; returns the violations (empty when the run conforms).
///
/// `opaque` is the material the adapter diverted to its transcript; none of it may appear
/// in any event. `frames` is the adapter's accounting, when known.
pub fn check(events: &[Event], opaque: &[&str], frames: Option<FrameAccount>) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut push = |invariant: &'static str, detail: String| {
        v.push(Violation { invariant, detail });
    };

    // I1: seq strictly increasing, from 1 with no gaps (the bus relies on that).
    for (i, ev) in events.iter().enumerate() {
        let want = i as u64 + 1;
        if ev.seq != want {
            push(
                "I1",
                format!("event #{i} has seq {} (expected {want})", ev.seq),
            );
            break;
        }
    }

    // I2: no opaque material in any event payload.
    for ev in events {
        let json = ev.data.to_json();
        if let Some(key) = OPAQUE_KEYS.iter().find(|k| json.contains(*k)) {
            push("I2", format!("seq {} carries key {key}", ev.seq));
        }
        for material in opaque.iter().filter(|m| m.len() >= MIN_OPAQUE_LEN) {
            if json.contains(*material) {
                push("I2", format!("seq {} carries transcript material", ev.seq));
            }
        }
    }

    let terminals: Vec<&Event> = events.iter().filter(|e| e.is_terminal()).collect();
    let terminal = terminals.first().and_then(|e| match &e.data {
        EventData::Lifecycle(l) => Some(l),
        _ => None,
    });
    let finals: Vec<&Event> = events
        .iter()
        .filter(|e| {
            matches!(&e.data, EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer))
        })
        .collect();

    // I3: at most one final answer, none on Reject/Suspend/Dead/tool-yield paths.
    if finals.len() > 1 {
        push("I3", format!("{} final_answer events", finals.len()));
    }
    if let (Some(term), Some(fin)) = (terminal, finals.first()) {
        let forbidden = term.phase == LifecyclePhase::Error
            || matches!(
                term.reason,
                Some(
                    StopReason::Refusal
                        | StopReason::ContentFilter
                        | StopReason::Paused
                        | StopReason::ToolUse
                        | StopReason::Error
                        | StopReason::StreamClosed
                )
            );
        if forbidden {
            let reason = term
                .reason
                .as_ref()
                .map(StopReason::as_str)
                .unwrap_or("error");
            push(
                "I3",
                format!("final_answer at seq {} on a {reason} path", fin.seq),
            );
        }
    }

    // I4: the final answer is a replacement (snapshot text, keyed by id or seq), not history.
    for fin in &finals {
        if let EventData::Assistant(a) = &fin.data {
            if a.delta.is_some() || a.text.as_deref().is_none_or(str::is_empty) {
                push(
                    "I4",
                    format!(
                        "final_answer at seq {} is not a non-empty snapshot",
                        fin.seq
                    ),
                );
            }
        }
    }

    // I5: thinking variants valid (typed) and redacted markers content-free.
    for ev in events {
        if let EventData::Thinking(t) = &ev.data {
            if t.variant == ThinkingVariant::Redacted && (t.delta.is_some() || t.text.is_some()) {
                push(
                    "I5",
                    format!("redacted marker at seq {} carries text", ev.seq),
                );
            }
        }
    }

    // I5 (live form, spec §3.2): a tokens-only thinking update carries the count of a
    // segment that already ended without one; one update per segment.
    for (i, target) in crate::batch::token_update_targets(events) {
        if target.is_none() {
            push(
                "I5",
                format!(
                    "tokens update at seq {} follows no end marker of its segment still \
                     without tokens",
                    events[i].seq
                ),
            );
        }
    }

    // I6: every input frame accounted for.
    if let Some(acc) = frames {
        if acc.unaccounted > 0 {
            push(
                "I6",
                format!("{} of {} frames unaccounted", acc.unaccounted, acc.frames),
            );
        }
    }

    // I7: exactly one terminal lifecycle event, and it is the last event.
    match terminals.len() {
        1 => {
            if events.last().map(|e| e.seq) != terminals.first().map(|e| e.seq) {
                push("I7", "events follow the terminal lifecycle event".into());
            }
        }
        n => push("I7", format!("{n} terminal lifecycle events")),
    }

    // I8: truncated:true iff the dispatch path was Truncate.
    let truncate_path = terminal.is_some_and(|t| t.reason == Some(StopReason::Truncated));
    for ev in events {
        if let EventData::Assistant(a) = &ev.data {
            if a.truncated == Some(true) && !truncate_path {
                push(
                    "I8",
                    format!("truncated flag at seq {} off the Truncate path", ev.seq),
                );
            }
        }
    }
    if truncate_path {
        for fin in &finals {
            if let EventData::Assistant(a) = &fin.data {
                if a.truncated != Some(true) {
                    push(
                        "I8",
                        format!("final_answer at seq {} lacks truncated", fin.seq),
                    );
                }
            }
        }
    }

    // I9: no empty assistant text events.
    for ev in events {
        if let EventData::Assistant(a) = &ev.data {
            if a.delta.as_deref() == Some("") || a.text.as_deref() == Some("") {
                push("I9", format!("empty assistant text at seq {}", ev.seq));
            }
            if a.delta.is_none() && a.text.is_none() {
                push(
                    "I9",
                    format!("assistant event at seq {} has no text", ev.seq),
                );
            }
        }
    }

    // I10: usage the provider sent reaches the terminal event, wherever the dialect put it.
    if let (Some(acc), Some(term)) = (frames, terminal) {
        if acc.usage_seen && term.usage.is_none() && term.phase == LifecyclePhase::End {
            push(
                "I10",
                "provider usage seen but missing on lifecycle end".into(),
            );
        }
    }

    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(lines: &[&str]) -> Vec<Event> {
        lines.iter().map(|l| Event::from_json(l).unwrap()).collect()
    }

    #[test]
    fn clean_run_passes() {
        let evs = parse(&[
            r#"{"seq":1,"stream":"assistant","data":{"phase":"commentary","delta":"hi","status":"in_progress"}}"#,
            r#"{"seq":2,"stream":"assistant","data":{"phase":"final_answer","text":"hi","status":"completed"}}"#,
            r#"{"seq":3,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ]);
        assert_eq!(check(&evs, &[], None), vec![]);
    }

    #[test]
    fn final_on_refusal_and_leak_and_gap_are_caught() {
        let evs = parse(&[
            r#"{"seq":1,"stream":"assistant","data":{"phase":"final_answer","text":"sig-abcdefghijklmnop","status":"completed"}}"#,
            r#"{"seq":3,"stream":"lifecycle","data":{"phase":"end","reason":"refusal","status":"completed"}}"#,
        ]);
        let v = check(&evs, &["sig-abcdefghijklmnop"], None);
        let ids: Vec<_> = v.iter().map(|v| v.invariant).collect();
        assert!(ids.contains(&"I1"));
        assert!(ids.contains(&"I2"));
        assert!(ids.contains(&"I3"));
    }

    #[test]
    fn tokens_updates_need_an_ended_segment_without_tokens() {
        let ok = parse(&[
            r#"{"seq":1,"stream":"thinking","data":{"id":"0","variant":"redacted","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"redacted","phase":"end"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"0","variant":"redacted","tokens":5}}"#,
            r#"{"seq":4,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ]);
        assert_eq!(check(&ok, &[], None), vec![]);
        let twice = parse(&[
            r#"{"seq":1,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","tokens":5}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end"}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"id":"0","variant":"raw","tokens":5}}"#,
            r#"{"seq":5,"stream":"thinking","data":{"id":"0","variant":"raw","tokens":5}}"#,
            r#"{"seq":6,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ]);
        let v = check(&twice, &[], None);
        let at: Vec<_> = v.iter().map(|v| v.detail.clone()).collect();
        assert_eq!(v.len(), 2, "{at:?}");
        assert!(at[0].contains("seq 2") && at[1].contains("seq 5"), "{at:?}");
    }

    #[test]
    fn missing_terminal_is_caught() {
        let evs = parse(&[
            r#"{"seq":1,"stream":"assistant","data":{"phase":"commentary","delta":"hi"}}"#,
        ]);
        assert!(check(&evs, &[], None).iter().any(|v| v.invariant == "I7"));
    }
}

//! Events too large for the broker. A canonical event is one NATS message (alone in its
//! batch when large), and a message over the broker's `max_payload` is refused for good:
//! without this, one huge tool result would fail its batch on every redelivery and stall
//! its whole partition.
//!
//! Such an event keeps its seq and shape; its longest text fields are cut to fit, each
//! ending with a note of how many bytes were cut. The provider's bytes stay whole in
//! `SG_RAW` (and in any raw archive), so the cut is visible and the original
//! recoverable; every other event of the run is exact.

use streamgate_grammar::line::text_event_len_bound;
use streamgate_grammar::{Event, RunEvent};

/// Room kept under `max_payload` for the message's headers and encoding.
const HEADROOM: usize = 64 * 1024;

/// Cuts the events of `events` that would not fit a message of `max_payload` bytes;
/// returns how many it cut.
pub fn fit(events: &mut [RunEvent], max_payload: usize) -> usize {
    let limit = max_payload.saturating_sub(HEADROOM).max(HEADROOM);
    let mut cut = 0;
    for ev in events {
        if !longer_than(&ev.event, limit) {
            continue;
        }
        if let Some(fitted) = fitted(&ev.event, limit) {
            tracing::warn!(
                run = %ev.envelope.run_id,
                seq = ev.event.seq,
                max_payload,
                "event over the broker's max_payload: its longest texts were cut to fit (SG_RAW keeps the provider's bytes)"
            );
            ev.event = fitted;
            cut += 1;
        }
    }
    cut
}

/// Whether `event`'s JSON is longer than `limit` bytes, found without building it (this
/// runs on every event): the serializer writes into a counter that stops at the limit.
fn longer_than(event: &Event, limit: usize) -> bool {
    if text_event_len_bound(event).is_some_and(|bound| bound <= limit) {
        return false;
    }
    struct Counter {
        bytes: usize,
        limit: usize,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.bytes += buf.len();
            if self.bytes > self.limit {
                return Err(std::io::Error::other("over the limit"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter { bytes: 0, limit };
    event.write_json(&mut counter).is_err()
}

/// `event` with its longest strings cut until its JSON is at most `limit` bytes.
fn fitted(event: &Event, limit: usize) -> Option<Event> {
    let mut v: serde_json::Value = serde_json::from_str(&event.to_json()).ok()?;
    for _ in 0..16 {
        let size = v.to_string().len();
        if size <= limit {
            break;
        }
        let longest = longest_string(&mut v["data"])?;
        let len = longest.len();
        let over = size - limit;
        let mut keep = len.saturating_sub(over + 256);
        while keep > 0 && !longest.is_char_boundary(keep) {
            keep -= 1;
        }
        let note = format!(
            "… [streamgate: {} bytes cut: the event was over the broker's message size limit]",
            len - keep
        );
        longest.truncate(keep);
        longest.push_str(&note);
    }
    Event::from_json(&v.to_string()).ok()
}

/// The longest string anywhere in `v`.
fn longest_string(v: &mut serde_json::Value) -> Option<&mut String> {
    match v {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Array(a) => a
            .iter_mut()
            .filter_map(longest_string)
            .max_by_key(|s| s.len()),
        serde_json::Value::Object(o) => o
            .values_mut()
            .filter_map(longest_string)
            .max_by_key(|s| s.len()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamgate_grammar::Envelope;

    #[test]
    fn a_huge_tool_result_is_cut_to_fit_and_says_so() {
        let big = "x".repeat(3 << 20);
        let line = format!(
            r#"{{"seq":6,"stream":"item","data":{{"phase":"end","id":"c1","kind":"tool","name":"exec","status":"completed","result":{{"stdout":"{big}","code":0}}}}}}"#
        );
        let mut evs = vec![RunEvent {
            envelope: Envelope {
                tenant: "t".into(),
                session_key: None,
                run_id: "r".into(),
                ts_ms: 0,
            },
            event: Event::from_json(&line).unwrap_or_else(|e| panic!("{e}")),
        }];
        assert_eq!(fit(&mut evs, 1 << 20), 1);
        let json = evs[0].event.to_json();
        assert!(json.len() <= (1 << 20) - HEADROOM, "{}", json.len());
        assert!(json.contains("bytes cut"), "the cut says so");
        assert!(
            json.contains("\"code\":0") && json.contains("\"seq\":6"),
            "shape kept"
        );
        // Small events are left alone.
        assert_eq!(fit(&mut evs, 8 << 20), 0);
        assert!(!longer_than(&evs[0].event, json.len()));
        assert!(longer_than(&evs[0].event, json.len() - 1));
    }

    #[test]
    fn a_text_events_bound_is_never_below_its_length() {
        // The worst text: every byte escaped as `\u00xx`, the longest names and numbers.
        let worst = "\u{1}".repeat(1000);
        let thinking = Event {
            seq: u64::MAX,
            data: streamgate_grammar::Thinking {
                id: Some(worst.clone()),
                variant: streamgate_grammar::ThinkingVariant::Redacted,
                phase: Some(streamgate_grammar::SegmentPhase::Start),
                delta: Some(worst.clone()),
                text: Some(worst.clone()),
                tokens: Some(u64::MAX),
            }
            .into(),
        };
        let assistant = Event {
            seq: u64::MAX,
            data: streamgate_grammar::Assistant {
                id: Some(worst.clone()),
                phase: Some(streamgate_grammar::AssistantPhase::FinalAnswer),
                delta: Some(worst.clone()),
                text: Some(worst),
                status: Some(streamgate_grammar::SegmentStatus::InProgress),
                truncated: Some(false),
            }
            .into(),
        };
        for event in [thinking, assistant] {
            let len = event.to_json().len();
            let bound = text_event_len_bound(&event).expect("a text event has a bound");
            assert!(bound >= len, "{bound} < {len}");
            assert!(longer_than(&event, len - 1) && !longer_than(&event, len));
        }
    }
}

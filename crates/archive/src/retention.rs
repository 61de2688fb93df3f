//! Retention stubs (docs/architecture.md §5): what an event keeps once a retention policy drops its
//! thinking text and tool payloads. The event stays (same seq, stream, ids, phases,
//! names, statuses), so folds and timelines of an old run still work; each text becomes a
//! stub naming its size and SHA-256, so what was there can still be told apart and
//! matched against a copy, never read.

use sha2::Digest as _;
use streamgate_grammar::{Event, EventData, Json};

/// The prefix of a stubbed text.
const STUB_PREFIX: &str = "[retention: ";

/// `text` as a stub: `[retention: <bytes> bytes, sha256:<first 16 hex>]`.
pub fn stub_text(text: &str) -> String {
    format!(
        "{STUB_PREFIX}{} bytes, sha256:{}]",
        text.len(),
        &hex(text.as_bytes())[..16]
    )
}

/// A JSON payload as a stub: `{"retention":{"bytes":N,"sha256":"<hex>"}}`.
pub fn stub_json(json: &Json) -> Json {
    let raw = json.get();
    Json::from_value(&serde_json::json!({
        "retention": {"bytes": raw.len(), "sha256": hex(raw.as_bytes())}
    }))
}

fn hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn strip_text(text: &mut Option<String>) -> bool {
    match text {
        Some(t) if !t.is_empty() && !t.starts_with(STUB_PREFIX) => {
            *t = stub_text(t);
            true
        }
        _ => false,
    }
}

fn strip_json(json: &mut Option<Json>) -> bool {
    match json {
        Some(j) if !j.get().starts_with("{\"retention\":") => {
            *j = stub_json(j);
            true
        }
        _ => false,
    }
}

/// The event with its thinking text and tool payloads stubbed; `None` when it has none
/// (or they are stubs already).
pub fn strip(event: &Event) -> Option<Event> {
    let mut out = event.clone();
    let changed = match &mut out.data {
        EventData::Thinking(t) => strip_text(&mut t.delta) | strip_text(&mut t.text),
        EventData::Item(i) => {
            strip_text(&mut i.input_delta)
                | strip_text(&mut i.output_delta)
                | strip_json(&mut i.input)
                | strip_json(&mut i.arguments)
                | strip_json(&mut i.output)
                | strip_json(&mut i.result)
        }
        EventData::Assistant(_) | EventData::Lifecycle(_) => false,
    };
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_and_tool_payloads_become_stubs_and_stay_events() {
        let thinking =
            Event::from_json(r#"{"seq":3,"stream":"thinking","data":{"id":"t1","variant":"raw","delta":"secret plan"}}"#)
                .unwrap();
        let stripped = strip(&thinking).unwrap();
        let line = stripped.to_json();
        assert!(!line.contains("secret plan"), "{line}");
        assert!(line.contains("[retention: 11 bytes, sha256:"), "{line}");
        assert_eq!(Event::from_json(&line).unwrap(), stripped);
        assert_eq!(strip(&stripped), None, "a stub is not stubbed again");

        let tool = Event::from_json(
            r#"{"seq":4,"stream":"item","data":{"phase":"end","id":"c1","kind":"tool","name":"bash","arguments":{"cmd":"cat /etc/shadow"},"result":{"out":"root:x"}}}"#,
        )
        .unwrap();
        let line = strip(&tool).unwrap().to_json();
        assert!(
            !line.contains("shadow") && !line.contains("root:x"),
            "{line}"
        );
        assert!(line.contains("\"name\":\"bash\""), "{line}");
        let answer = Event::from_json(
            r#"{"seq":5,"stream":"assistant","data":{"phase":"final_answer","text":"kept"}}"#,
        )
        .unwrap();
        assert_eq!(strip(&answer), None, "answers are kept");
    }
}

//! The frames nearly every long Responses run is made of — an output text, reasoning text
//! or reasoning summary delta — read member by member ([`exact_frame`]: any key order and
//! spacing; the API sorts its keys, the fixtures do not) into the [`Ev`] serde makes of
//! them. Anything else — another event type, a member of [`Ev`] a delta does not carry, a
//! member this reading does not know, a duplicate, a `null` — answers `None` and is read
//! the generic way, so this reading never accepts what serde refuses or reads a value
//! differently (docs/performance.md has the measurement).
//!
//! [`exact_frame`]: crate::families::exact_frame

use super::Ev;
use crate::families::exact_frame::{once, Cursor};

/// The event types read here.
const DELTA_TYPES: [&str; 3] = [
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
];

/// `data` read as a delta frame, or `None` for the generic reading.
pub(super) fn delta_frame(data: &str) -> Option<Ev<'_>> {
    let (mut ty, mut item_id, mut delta) = (None, None, None);
    let (mut output_index, mut content_index, mut summary_index) = (None, None, None);
    let (mut logprobs, mut obfuscation, mut sequence_number) = (None, None, None);
    let mut c = Cursor::new(data);
    c.object(|key, c| match key {
        "type" => once(&mut ty, c.string()),
        "item_id" => once(&mut item_id, c.string()),
        "delta" => once(&mut delta, c.string()),
        "output_index" => once(&mut output_index, c.uint()),
        "content_index" => once(&mut content_index, c.uint()),
        "summary_index" => once(&mut summary_index, c.uint()),
        // Not fields of `Ev`: serde skips them, whatever they hold.
        "logprobs" => once(&mut logprobs, c.skip_value()),
        "obfuscation" => once(&mut obfuscation, c.skip_value()),
        "sequence_number" => once(&mut sequence_number, c.skip_value()),
        _ => None,
    })?;
    c.whitespace();
    c.end()?;
    if !DELTA_TYPES.contains(&ty.as_deref()?) {
        return None;
    }
    // Every field spelled out: a field added to `Ev` must be decided on here.
    Some(Ev {
        ty,
        item_id,
        output_index,
        content_index,
        summary_index,
        delta,
        text: None,
        refusal: None,
        arguments: None,
        item: None,
        part: None,
        response: None,
        error: None,
        annotation: None,
        code: None,
        message: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde reads, or `None` where the fast reading must not answer differently.
    fn serde_reading(data: &str) -> Option<String> {
        serde_json::from_str::<Ev<'_>>(data)
            .ok()
            .map(|ev| format!("{ev:?}"))
    }

    #[test]
    fn delta_frames_read_member_by_member_are_read_as_serde_reads_them() {
        let read = [
            // The API's layout (keys sorted, as in the shared corpus's capture).
            r#"{"type":"response.output_text.delta","content_index":0,"delta":"Hi","item_id":"msg_1","logprobs":[],"obfuscation":"OHL8ybUen3hGW","output_index":1,"sequence_number":6}"#,
            // The fixtures' layout.
            r#"{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"think","sequence_number":4}"#,
            r#"{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":2,"delta":"First","sequence_number":8}"#,
            // Spaced, escaped, without the indices.
            "{ \"type\" : \"response.output_text.delta\" ,\n\"delta\": \"a \\\"quote\\\" \\u00e9\", \"item_id\":\"m\" }",
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"","logprobs":[{"token":"x","logprob":-0.1}]}"#,
        ];
        for data in read {
            let fast = delta_frame(data).map(|ev| format!("{ev:?}"));
            assert!(fast.is_some(), "read fast: {data}");
            assert_eq!(fast, serde_reading(data), "{data}");
        }
        let left_to_serde = [
            // Another event type, or a delta frame carrying what a delta does not.
            r#"{"type":"response.output_text.done","item_id":"m","output_index":0,"content_index":0,"text":"Hi"}"#,
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"a","text":"a"}"#,
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"a","new_member":1}"#,
            r#"{"item_id":"m","delta":"a"}"#,
            // Values serde reads otherwise, or refuses.
            r#"{"type":"response.output_text.delta","item_id":null,"delta":"a"}"#,
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"a","output_index":-1}"#,
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"a","output_index":1.0}"#,
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"a","delta":"b"}"#,
            r#"{"type":"response.output_text.delta","item_id":"m","delta":"a","sequence_number":1,"sequence_number":2}"#,
            "{\"type\":\"response.output_text.delta\",\"delta\":\"raw \u{1} control\"}",
            r#"{"type":"response.output_text.delta","delta":"a"} trailing"#,
        ];
        for data in left_to_serde {
            assert!(delta_frame(data).is_none(), "left to serde: {data}");
        }
    }

    /// The members skipped here are no fields of `Ev`: serde reads a frame of nothing else
    /// as an empty event, whatever they hold.
    #[test]
    fn the_skipped_members_are_not_fields_of_the_event() {
        let data = r#"{"logprobs":{"a":1},"obfuscation":[true],"sequence_number":"x"}"#;
        let empty = r#"{}"#;
        assert_eq!(serde_reading(data), serde_reading(empty));
        assert!(serde_reading(empty).is_some());
    }
}

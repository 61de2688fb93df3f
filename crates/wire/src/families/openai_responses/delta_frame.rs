//! The frames nearly every long Responses run is made of — an output text, reasoning text
//! or reasoning summary delta — read member by member ([`exact_frame`]: any key order and
//! spacing; the API sorts its keys, the fixtures do not) into the [`Ev`] serde makes of
//! them. Anything else — another event type, a member of [`Ev`] a delta does not carry, a
//! member this reading does not know, a duplicate, a `null` — answers `None` and is read
//! the generic way, so this reading never accepts what serde refuses or reads a value
//! differently (docs/performance.md has the measurement).
//!
//! A delta frame is nearly always a recent one again with another text, sequence number
//! and obfuscation padding: [`keep`] keeps it in a [`SameFrame`] with those values (and
//! its item id, which some gateways change with every frame) as its holes, and
//! [`same_delta`] reads a frame recognized as a kept one without reading its members.
//!
//! [`exact_frame`]: crate::families::exact_frame

use super::Ev;
use crate::families::exact_frame::{once, Cursor};
use crate::families::same_frame::{Filled, Hole, SameFrame, Values, MAX_HOLES};
use smallvec::SmallVec;
use std::borrow::Cow;

/// The event types read here.
const DELTA_TYPES: [&str; 3] = [
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
];

/// Where the values that change from frame to frame stand in a delta frame: the item id's
/// and the text's string tokens and the skipped members' values, in the frame's order,
/// each with what it is.
type Holes<'a> = SmallVec<[(&'a str, Hole, Role); MAX_HOLES]>;

/// What a hole of a kept delta frame holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Role {
    ItemId,
    #[default]
    Delta,
    /// `obfuscation` or `sequence_number`: no field of [`Ev`], checked and dropped.
    Skipped,
}

/// What a kept delta frame ([`SameFrame`]) was, around its holes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Shape {
    ty: &'static str,
    output_index: Option<u64>,
    content_index: Option<u64>,
    summary_index: Option<u64>,
    /// What each hole holds, in the frame's order (the first `holes` of them).
    roles: [Role; MAX_HOLES],
    holes: usize,
}

/// Reads `data` into `ev`, an empty event, when it is a delta frame: as a kept frame it is
/// like ([`same_delta`]), else member by member ([`delta_frame`]), keeping it for the next
/// frames. `false` leaves the frame to serde, and `ev` empty. `ev` is filled in place:
/// it is some 350 bytes, and moving it through an `Option` was measurable (`perf`).
pub(super) fn read_delta<'a>(same: &mut SameFrame<Shape>, data: &'a str, ev: &mut Ev<'a>) -> bool {
    if same_delta(same, data, ev) {
        return true;
    }
    let Some(holes) = delta_frame(data, ev) else {
        return false;
    };
    keep(same, data, ev, &holes);
    true
}

/// Reads `data` into `ev` (empty) as a delta frame, member by member; `None` (and `ev`
/// left empty) for the generic reading, else where its holes are.
fn delta_frame<'a>(data: &'a str, ev: &mut Ev<'a>) -> Option<Holes<'a>> {
    let (mut ty, mut item_id, mut delta) = (None, None, None);
    let (mut output_index, mut content_index, mut summary_index) = (None, None, None);
    let (mut logprobs, mut obfuscation, mut sequence_number) = (None, None, None);
    let mut holes = SmallVec::new();
    let mut c = Cursor::new(data);
    c.object(|key, c| match key {
        "type" => once(&mut ty, c.string()),
        "item_id" => once(&mut item_id, string_hole(c, Role::ItemId, &mut holes)),
        "delta" => once(&mut delta, string_hole(c, Role::Delta, &mut holes)),
        "output_index" => once(&mut output_index, c.uint()),
        "content_index" => once(&mut content_index, c.uint()),
        "summary_index" => once(&mut summary_index, c.uint()),
        // Not fields of `Ev`: serde skips them, whatever they hold. Log probabilities are
        // no hole: without them asked for they are `[]` in every frame.
        "logprobs" => once(&mut logprobs, c.skip_value()),
        "obfuscation" => once(&mut obfuscation, value_hole(c, &mut holes)),
        "sequence_number" => once(&mut sequence_number, value_hole(c, &mut holes)),
        _ => None,
    })?;
    c.whitespace();
    c.end()?;
    if !DELTA_TYPES.contains(&ty.as_deref()?) {
        return None;
    }
    // The fields a delta carries; the others of `Ev` stay empty. A member skipped above
    // that becomes a field of `Ev` must be read here.
    (ev.ty, ev.item_id, ev.delta) = (ty, item_id, delta);
    (ev.output_index, ev.content_index, ev.summary_index) =
        (output_index, content_index, summary_index);
    Some(holes)
}

/// A string member read by [`Cursor::string`], noted as a hole.
fn string_hole<'a>(c: &mut Cursor<'a>, role: Role, holes: &mut Holes<'a>) -> Option<Cow<'a, str>> {
    let (value, token) = c.string_token()?;
    holes.push((token, Hole::Text, role));
    Some(value)
}

/// A skipped member read by [`Cursor::value_text`] ([`Cursor::skip_value`]'s reading),
/// noted as a hole.
fn value_hole<'a>(c: &mut Cursor<'a>, holes: &mut Holes<'a>) -> Option<()> {
    holes.push((c.value_text()?, Hole::Value, Role::Skipped));
    Some(())
}

/// Keeps the delta frame `data`, read into `ev`, with its item id, text, padding and
/// sequence number as its holes: a later frame that differs from it only there is read
/// by [`same_delta`].
fn keep(same: &mut SameFrame<Shape>, data: &str, ev: &Ev<'_>, frame_holes: &Holes<'_>) {
    let Some(ty) = DELTA_TYPES
        .into_iter()
        .find(|t| ev.ty.as_deref() == Some(t))
    else {
        return;
    };
    let mut shape = Shape {
        ty,
        output_index: ev.output_index,
        content_index: ev.content_index,
        summary_index: ev.summary_index,
        ..Shape::default()
    };
    let mut holes: SmallVec<[(&str, Hole); MAX_HOLES]> = SmallVec::new();
    for (role, &(value, hole, frame_role)) in shape.roles.iter_mut().zip(frame_holes) {
        *role = frame_role;
        holes.push((value, hole));
    }
    shape.holes = holes.len();
    same.keep(data, &holes, shape);
}

/// Reads `data` into `ev` (empty) as [`delta_frame`] would, when [`SameFrame`] recognizes
/// it as a kept delta frame with other values in its holes; `false` (and `ev` left
/// empty) when it does not.
fn same_delta<'a>(same: &SameFrame<Shape>, data: &'a str, ev: &mut Ev<'a>) -> bool {
    let mut values = Values::default();
    let Some(&shape) = same.read(data, &mut values).map(|same| same.kind) else {
        return false;
    };
    let (mut item_id, mut delta) = (None, None);
    for (value, role) in values.into_iter().zip(shape.roles).take(shape.holes) {
        match (role, value) {
            (Role::ItemId, Some(Filled::Text(text))) => item_id = Some(text),
            (Role::Delta, Some(Filled::Text(text))) => delta = Some(text),
            (Role::Skipped, Some(Filled::Value(_))) => {}
            _ => return false,
        }
    }
    (ev.ty, ev.item_id, ev.delta) = (Some(Cow::Borrowed(shape.ty)), item_id, delta);
    (ev.output_index, ev.content_index, ev.summary_index) =
        (shape.output_index, shape.content_index, shape.summary_index);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::same_frame::SameFrame;

    /// What [`delta_frame`] reads.
    fn member_by_member(data: &str) -> Option<Ev<'_>> {
        let mut ev = Ev::default();
        delta_frame(data, &mut ev).map(|_| ev)
    }

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
            let fast = member_by_member(data).map(|ev| format!("{ev:?}"));
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
            assert!(member_by_member(data).is_none(), "left to serde: {data}");
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

    /// A frame recognized as a kept delta frame reads as the member-by-member reading
    /// reads it: for each pair of frames, the second is read through the first kept and
    /// in full, and both give the same event — or the second is not recognized at all.
    #[test]
    fn a_frame_like_a_kept_one_reads_as_it_reads_in_full() {
        let frames = [
            r#"{"type":"response.output_text.delta","content_index":0,"delta":"Hi","item_id":"msg_1","logprobs":[],"obfuscation":"OHL8ybUen3hGW","output_index":1,"sequence_number":6}"#,
            r#"{"type":"response.output_text.delta","content_index":0,"delta":" \"there\"\n\u00e9","item_id":"msg_1","logprobs":[],"obfuscation":"x","output_index":1,"sequence_number":1234}"#,
            // Another item id (a gateway that sends one per frame), another index.
            r#"{"type":"response.output_text.delta","content_index":0,"delta":"a","item_id":"msg_2","logprobs":[],"obfuscation":"y","output_index":1,"sequence_number":7}"#,
            r#"{"type":"response.output_text.delta","content_index":1,"delta":"a","item_id":"msg_1","logprobs":[],"obfuscation":"y","output_index":1,"sequence_number":7}"#,
            // A text the full reading refuses; a sequence number it skips, whatever it is.
            r#"{"type":"response.output_text.delta","content_index":0,"delta":null,"item_id":"msg_1","logprobs":[],"obfuscation":"y","output_index":1,"sequence_number":7}"#,
            r#"{"type":"response.output_text.delta","content_index":0,"delta":"a","item_id":"msg_1","logprobs":[],"obfuscation":"y","output_index":1,"sequence_number":-7}"#,
            // The fixtures' layout, and a frame whose text closes the frame early.
            r#"{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"think","sequence_number":4}"#,
            r#"{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"a\"}","sequence_number":5}"#,
            r#"{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"a","sequence_number":5,"text":"a"}"#,
            r#"{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":2,"delta":"First","sequence_number":8}"#,
        ];
        let mut recognized = 0;
        for kept in frames {
            let mut same = SameFrame::default();
            let mut ev = Ev::default();
            let Some(holes) = delta_frame(kept, &mut ev) else {
                continue;
            };
            keep(&mut same, kept, &ev, &holes);
            for frame in frames {
                let mut via_kept = Ev::default();
                if !same_delta(&same, frame, &mut via_kept) {
                    assert_eq!(format!("{via_kept:?}"), format!("{:?}", Ev::default()));
                    continue;
                }
                recognized += 1;
                let full = member_by_member(frame).expect(frame);
                assert_eq!(
                    format!("{via_kept:?}"),
                    format!("{full:?}"),
                    "{frame} after {kept}"
                );
            }
        }
        // The output text frames but the fourth and the `null` text recognize each other
        // (4 × 4), the fourth only itself; the two reasoning deltas each other (2 × 2), not
        // the frame with a text; the summary itself.
        assert_eq!(recognized, 4 * 4 + 1 + 2 * 2 + 1, "recognized {recognized}");
    }
}

//! OpenRouter's structured reasoning lane (`reasoning_details[]`): segment identity and
//! the displayable-wins dedup of spec §3.2.
//!
//! Segment key: `format + index` when the entry has an index, else its `id`, else
//! `format` alone (one segment per format per turn). The type-group is deliberately NOT
//! part of the key: OpenRouter sends a segment's displayable text and its opaque closing
//! material (signature, encrypted blob) as separate entries under the same index, and
//! displayable-wins only works if they meet in one segment (spec §3.2: "GPT-5-mini emits
//! summary then encrypted under the same index — … one summary segment and no marker").
//! The index outranks the id for the same reason: GPT-5-mini's encrypted entry carries an
//! `id` its summary entries lack.

use super::wire::Detail;
use serde_json::value::RawValue;
use streamgate_grammar::ThinkingVariant;

/// One structured reasoning segment of the turn.
#[derive(Debug)]
pub(super) struct Segment {
    key: Key,
    /// Provider id from the segment's first entry (kept on every event of it).
    pub id: Option<String>,
    /// Variant of the displayable text seen (raw or summary).
    pub variant: ThinkingVariant,
    /// Some entry carried displayable text.
    pub displayable: bool,
    /// Some entry carried opaque material (signature, encrypted data).
    pub opaque: bool,
    /// `phase:start` was emitted.
    pub open: bool,
    /// The segment was closed (end marker or redacted marker pair emitted).
    pub closed: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Key {
    Index { format: String, index: String },
    Id(String),
    Format(String),
}

/// The key of an entry, borrowed (no allocation on the per-delta path).
#[derive(Clone, Copy)]
enum KeyRef<'e> {
    Index { format: &'e str, index: &'e str },
    Id(&'e str),
    Format(&'e str),
}

impl<'e> KeyRef<'e> {
    fn of(entry: &'e Detail<'_>) -> KeyRef<'e> {
        // An absent format is keyed as the literal "unknown" (what deepseek-via-OpenRouter
        // sends anyway), so both spellings of "no format" land in one segment.
        let format = entry.format.0.as_deref().unwrap_or("unknown");
        if let Some(index) = entry.index.map(RawValue::get).filter(|i| *i != "null") {
            return KeyRef::Index { format, index };
        }
        match entry.id.0.as_deref() {
            Some(id) => KeyRef::Id(id),
            None => KeyRef::Format(format),
        }
    }

    fn matches(self, key: &Key) -> bool {
        match (self, key) {
            (
                KeyRef::Index { format, index },
                Key::Index {
                    format: f,
                    index: i,
                },
            ) => format == f && index == i,
            (KeyRef::Id(a), Key::Id(b)) => a == b,
            (KeyRef::Format(a), Key::Format(b)) => a == b,
            _ => false,
        }
    }

    fn to_owned(self) -> Key {
        match self {
            KeyRef::Index { format, index } => Key::Index {
                format: format.to_owned(),
                index: index.to_owned(),
            },
            KeyRef::Id(id) => Key::Id(id.to_owned()),
            KeyRef::Format(f) => Key::Format(f.to_owned()),
        }
    }
}

impl Segment {
    /// A printable key, for transcript entries.
    pub fn label(&self) -> String {
        match &self.key {
            Key::Index { format, index } => format!("{format}+{index}"),
            Key::Id(id) => id.clone(),
            Key::Format(f) => format!("{f}+absent"),
        }
    }
}

/// The turn's structured segments, in first-seen order (the order their end markers take).
#[derive(Debug, Default)]
pub(super) struct Segments {
    list: Vec<Segment>,
}

impl Segments {
    /// The segment `entry` belongs to (created on first sight); returns its position.
    pub fn locate(&mut self, entry: &Detail<'_>) -> usize {
        let key = KeyRef::of(entry);
        if let Some(i) = self.list.iter().position(|s| key.matches(&s.key)) {
            return i;
        }
        self.list.push(Segment {
            key: key.to_owned(),
            id: entry.id.0.as_deref().map(str::to_owned),
            variant: ThinkingVariant::Redacted,
            displayable: false,
            opaque: false,
            open: false,
            closed: false,
        });
        self.list.len() - 1
    }

    /// The segment at `i`.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Segment> {
        self.list.get_mut(i)
    }

    /// All segments, in first-seen order.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Segment> {
        self.list.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(json: &str) -> Detail<'_> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn index_outranks_id_and_type_group() {
        let mut s = Segments::default();
        let a = s.locate(&detail(
            r#"{"type":"reasoning.summary","summary":"x","format":"openai-responses-v1","index":0}"#,
        ));
        let b = s.locate(&detail(
            r#"{"type":"reasoning.encrypted","data":"zz","id":"rs_1","format":"openai-responses-v1","index":0}"#,
        ));
        assert_eq!(a, b);
    }

    #[test]
    fn distinct_indexes_and_formats_are_distinct_segments() {
        let mut s = Segments::default();
        let a = s.locate(&detail(
            r#"{"type":"reasoning.text","format":"f","index":0}"#,
        ));
        let b = s.locate(&detail(
            r#"{"type":"reasoning.text","format":"f","index":1}"#,
        ));
        let c = s.locate(&detail(
            r#"{"type":"reasoning.text","format":"g","index":0}"#,
        ));
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn id_keys_when_index_is_absent_and_format_collapses_otherwise() {
        let mut s = Segments::default();
        let a = s.locate(&detail(r#"{"type":"reasoning.text","id":"r1"}"#));
        let b = s.locate(&detail(r#"{"type":"reasoning.text","id":"r2"}"#));
        let c = s.locate(&detail(r#"{"type":"reasoning.text"}"#));
        let d = s.locate(&detail(
            r#"{"type":"reasoning.encrypted","format":"unknown"}"#,
        ));
        assert_ne!(a, b);
        assert_eq!(c, d, "absent format keys as \"unknown\"");
    }
}

//! The frames nearly every long Gemini run is made of — text and thought parts of one
//! candidate with the usage so far — read member by member ([`exact_frame`]: any key
//! order and spacing, as Gemini's API and its proxies differ in both) into a
//! [`TextChunk`]: only what such a frame can hold, handed straight to the adapter's text
//! handling instead of being built into the wide [`Chunk`] (every optional member of every
//! part type) and moved through it — that memcpy was a seventh of the family's time
//! (`perf`). `None` for any frame with another member, which is then read the generic
//! way; a test holds [`TextChunk::into_chunk`] equal to what serde reads
//! (docs/performance.md has the measurement).
//!
//! [`exact_frame`]: crate::families::exact_frame

use crate::families::exact_frame::{flat_counts, once, Cursor, List};
use crate::families::same_frame::{range_of, Filled, Hole, SameFrame, Values, MAX_HOLES};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::ops::Range;

/// A frame [`hot_chunk`] read.
#[derive(Debug)]
pub(super) struct TextChunk<'a> {
    pub candidates: Option<List<TextCandidate<'a>>>,
    /// `usageMetadata`'s text, validated as serde would (kept as text, as the adapter keeps
    /// it).
    pub usage_metadata: Option<&'a str>,
    pub model_version: Option<Cow<'a, str>>,
    pub response_id: Option<Cow<'a, str>>,
}

/// A candidate of a [`TextChunk`]: text and thought parts, and a finish reason.
#[derive(Debug, Default)]
pub(super) struct TextCandidate<'a> {
    /// `content`, when present: its `parts`, when present.
    pub content: Option<Option<List<TextPart<'a>>>>,
    pub finish_reason: Option<Cow<'a, str>>,
    pub index: Option<u64>,
}

/// A text or thought part (a signature may ride on it).
#[derive(Debug, Default)]
pub(super) struct TextPart<'a> {
    pub text: Option<Cow<'a, str>>,
    /// `text` as the frame has it (quotes, escapes).
    pub text_token: Option<&'a str>,
    pub thought: Option<bool>,
    pub thought_signature: Option<Cow<'a, str>>,
}

/// `data` read as a text frame, or `None` for the generic reading.
pub(super) fn hot_chunk(data: &str) -> Option<TextChunk<'_>> {
    let (mut candidates, mut usage_metadata) = (None, None);
    let (mut model_version, mut response_id) = (None, None);
    let mut c = Cursor::new(data);
    c.object(|key, c| match key {
        "candidates" => once(&mut candidates, c.list(hot_candidate)),
        // serde reads a `null` object as absent: such a frame is left to it.
        "usageMetadata" => once(&mut usage_metadata, c.value_text().filter(|t| *t != "null")),
        "modelVersion" => once(&mut model_version, c.string()),
        "responseId" => once(&mut response_id, c.string()),
        _ => None,
    })?;
    c.whitespace();
    c.end()?;
    Some(TextChunk {
        candidates,
        usage_metadata,
        model_version,
        response_id,
    })
}

fn hot_candidate<'a>(c: &mut Cursor<'a>) -> Option<TextCandidate<'a>> {
    let mut candidate = TextCandidate::default();
    c.object(|key, c| match key {
        "content" => {
            let mut parts = None;
            c.object(|key, c| match key {
                "parts" => once(&mut parts, c.list(hot_part)),
                // Not a field the adapter reads: serde skips it, whatever it holds.
                "role" => c.string().map(drop),
                _ => None,
            })?;
            once(&mut candidate.content, Some(parts))
        }
        "index" => once(&mut candidate.index, c.uint()),
        "finishReason" => once(&mut candidate.finish_reason, c.string()),
        _ => None,
    })?;
    Some(candidate)
}

fn hot_part<'a>(c: &mut Cursor<'a>) -> Option<TextPart<'a>> {
    let mut part = TextPart::default();
    c.object(|key, c| match key {
        "text" => {
            let (text, token) = c.string_token()?;
            part.text_token = Some(token);
            once(&mut part.text, Some(text))
        }
        "thought" => once(&mut part.thought, c.boolean()),
        "thoughtSignature" => once(&mut part.thought_signature, c.string()),
        _ => None,
    })?;
    Some(part)
}

/// The most parts a kept text frame has: Gemini sends a thought and the answer's first
/// words in one frame where the thinking ends, and some models alternate the two.
const KEPT_PARTS: usize = 2;

/// What a kept text frame ([`SameFrame`]) was, around its holes — each part's text and,
/// when the frame has one, the usage object, whose counts grow from frame to frame.
#[derive(Debug, Default, Clone)]
pub(super) struct Shape {
    index: Option<u64>,
    /// Each part's `thought` (the first `parts` of them).
    thoughts: [Option<bool>; KEPT_PARTS],
    parts: usize,
    /// What each hole holds, in the frame's order (the first `holes` of them).
    roles: [Role; MAX_HOLES],
    holes: usize,
    /// Where the model version and the response id stand in the kept frame.
    model_version: Option<Range<usize>>,
    response_id: Option<Range<usize>>,
}

/// What a hole of a kept text frame holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The text of the part at this place.
    Text(usize),
    #[default]
    Usage,
}

/// Keeps `chunk`, read from `data`, when it is one candidate of one or two text parts
/// with no finish and no signature (what a long run's frames are) and the model version
/// and the response id are borrowed from `data` (not decoded from escapes).
pub(super) fn keep(same: &mut SameFrame<Shape>, data: &str, chunk: &TextChunk<'_>) {
    let Some([candidate]) = chunk.candidates.as_deref() else {
        return;
    };
    let Some(Some(parts)) = candidate.content.as_ref().map(|p| p.as_deref()) else {
        return;
    };
    if parts.is_empty() || parts.len() > KEPT_PARTS || candidate.finish_reason.is_some() {
        return;
    }
    let fixed = |value: &Option<Cow<'_, str>>| match value {
        None => Some(None),
        Some(Cow::Borrowed(value)) => range_of(data, value).map(Some),
        Some(Cow::Owned(_)) => None,
    };
    let (Some(model_version), Some(response_id)) =
        (fixed(&chunk.model_version), fixed(&chunk.response_id))
    else {
        return;
    };
    let mut shape = Shape {
        index: candidate.index,
        parts: parts.len(),
        model_version,
        response_id,
        ..Shape::default()
    };
    let mut holes: SmallVec<[(&str, Hole, Role); MAX_HOLES]> = SmallVec::new();
    for (at, part) in parts.iter().enumerate() {
        let (Some(text), None) = (part.text_token, &part.thought_signature) else {
            return;
        };
        shape.thoughts[at] = part.thought;
        holes.push((text, Hole::Text, Role::Text(at)));
    }
    if let Some(usage) = chunk.usage_metadata {
        holes.push((usage, Hole::Value, Role::Usage));
    }
    // In the frame's order: every value is a slice of it.
    holes.sort_by_key(|(value, ..)| value.as_ptr());
    for (role, &(.., hole_role)) in shape.roles.iter_mut().zip(&holes) {
        *role = hole_role;
    }
    shape.holes = holes.len();
    let holes: SmallVec<[(&str, Hole); MAX_HOLES]> = holes
        .iter()
        .map(|&(value, hole, _)| (value, hole))
        .collect();
    same.keep(data, &holes, shape);
}

/// A frame [`same_chunk`] recognized: one candidate's text and thought parts (no finish,
/// no signature) with the usage so far — what its [`TextChunk`] holds, without the lists
/// of candidates and parts, whose moves were ~9% of the family's instructions
/// (callgrind).
#[derive(Debug)]
pub(super) struct KeptChunk<'a> {
    pub index: Option<u64>,
    /// Each part's text and `thought` (the first `parts` of them).
    pub texts: [(Cow<'a, str>, Option<bool>); KEPT_PARTS],
    pub parts: usize,
    pub usage_metadata: Option<&'a str>,
    pub model_version: Option<Cow<'a, str>>,
    pub response_id: Option<Cow<'a, str>>,
}

/// The chunk [`hot_chunk`] reads from `data`, when [`SameFrame`] recognizes it as a kept
/// text frame with other texts and usage; `None` when it does not, or for what
/// `hot_chunk` leaves to serde (a `null` usage).
pub(super) fn same_chunk<'a>(same: &SameFrame<Shape>, data: &'a str) -> Option<KeptChunk<'a>> {
    let mut values = Values::default();
    let same = same.read(data, &mut values)?;
    let shape = same.kind;
    let fixed = |at: &Option<Range<usize>>| match at {
        None => Some(None),
        Some(at) => same.fixed(at).map(|v| Some(Cow::Borrowed(v))),
    };
    let (model_version, response_id) = (fixed(&shape.model_version)?, fixed(&shape.response_id)?);
    let mut texts: [(Cow<'a, str>, Option<bool>); KEPT_PARTS] = Default::default();
    let mut read = [false; KEPT_PARTS];
    let mut usage = None;
    for (value, role) in values.into_iter().zip(shape.roles).take(shape.holes) {
        match (role, value?) {
            (Role::Text(at), Filled::Text(text)) => {
                texts.get_mut(at)?.0 = text;
                *read.get_mut(at)? = true;
            }
            (Role::Usage, Filled::Value(value)) => usage = Some(value),
            _ => return None,
        }
    }
    if usage == Some("null") || read.iter().take(shape.parts).any(|r| !r) {
        return None;
    }
    for ((_, thought), &kept) in texts.iter_mut().zip(&shape.thoughts) {
        *thought = kept;
    }
    Some(KeptChunk {
        index: shape.index,
        texts,
        parts: shape.parts,
        usage_metadata: usage,
        model_version,
        response_id,
    })
}

/// `usageMetadata`'s `thoughtsTokenCount` as serde reads it into the adapter's
/// `ThoughtCount` (a number or `null`; other members skipped), read member by member:
/// the adapter reads it each time a thinking segment closes. `None` leaves the usage to
/// serde (a duplicate, an escaped key, a count that is no plain `u64` …).
pub(super) fn thought_count(usage: &str) -> Option<Option<u64>> {
    let mut count = None;
    let flat = flat_counts(usage.as_bytes(), |key, value| {
        if key == b"thoughtsTokenCount" {
            // A second one is left to the member-by-member reading below (and serde).
            once(&mut count, Some(Some(value)))?;
        }
        Some(())
    });
    if flat == Some(usage.len()) {
        return Some(count.flatten());
    }
    count = None;
    let mut c = Cursor::new(usage);
    c.object(|key, c| match key {
        "thoughtsTokenCount" => once(
            &mut count,
            match c.literal("null") {
                Some(()) => Some(None),
                None => c.uint().map(Some),
            },
        ),
        _ => c.skip_value(),
    })?;
    c.whitespace();
    c.end()?;
    Some(count.flatten())
}

#[cfg(test)]
impl<'a> KeptChunk<'a> {
    /// The [`Chunk`] serde reads from the same frame (as [`TextChunk::into_chunk`]).
    pub(super) fn into_chunk(self) -> super::Chunk<'a> {
        let mut parts = List::new();
        for (text, thought) in self.texts.into_iter().take(self.parts) {
            parts.push(TextPart {
                text: Some(text),
                text_token: None,
                thought,
                thought_signature: None,
            });
        }
        let candidate = TextCandidate {
            content: Some(Some(parts)),
            finish_reason: None,
            index: self.index,
        };
        TextChunk {
            candidates: Some(List::from_buf([candidate])),
            usage_metadata: self.usage_metadata,
            model_version: self.model_version,
            response_id: self.response_id,
        }
        .into_chunk()
    }
}

#[cfg(test)]
impl<'a> TextChunk<'a> {
    /// The [`Chunk`] serde reads from the same frame (for the tests that hold both
    /// readings equal).
    pub(super) fn into_chunk(self) -> super::Chunk<'a> {
        let part = |p: TextPart<'a>| super::Part {
            text: p.text,
            thought: p.thought,
            thought_signature: p.thought_signature,
            ..super::Part::default()
        };
        let candidate = |c: TextCandidate<'a>| super::Candidate {
            content: c.content.map(|parts| super::Content {
                parts: parts.map(|p| p.into_iter().map(part).collect()),
            }),
            finish_reason: c.finish_reason,
            index: c.index,
            ..super::Candidate::default()
        };
        super::Chunk {
            candidates: self
                .candidates
                .map(|c| c.into_iter().map(candidate).collect()),
            usage_metadata: self
                .usage_metadata
                .map(|text| serde_json::from_str(text).expect("validated usage text")),
            model_version: self.model_version,
            response_id: self.response_id,
            ..super::Chunk::default()
        }
    }
}

//! OpenAI Responses output items and the events built from them, shared by the
//! `openai_responses` (F3) adapter and the codex envelopes (`codex` app-server
//! `rawResponseItem`, `codex-exec` items) so the item shapes are parsed in one place.
//!
//! - [`RawItem`]: one output item (`message`, `reasoning`, `function_call`, …).
//! - [`Part`] / [`parse_parts`]: an item's content or summary parts.
//! - [`args_json`], [`unsupported`], [`final_answer`], [`commentary_delta`]: the event
//!   shapes both families emit for them.

use crate::emitter::Emitter;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{Assistant, AssistantPhase, Json, SegmentStatus};

/// An F3 response output item (also the codex `rawResponseItem` payload).
#[derive(Deserialize)]
pub(crate) struct RawItem<'a> {
    /// `message`, `reasoning`, `function_call`, …
    #[serde(borrow, rename = "type", default)]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub status: Option<Cow<'a, str>>,
    /// Opaque reasoning replay state: transcript only.
    #[serde(borrow, default)]
    pub encrypted_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub summary: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
}

impl<'a> RawItem<'a> {
    /// Parses an item object; `None` when it is not one.
    pub(crate) fn parse(raw: &'a RawValue) -> Option<RawItem<'a>> {
        serde_json::from_str(raw.get()).ok()
    }

    /// The item's type, `""` when absent.
    pub(crate) fn kind(&self) -> &str {
        self.ty.as_deref().unwrap_or("")
    }
}

/// One content/summary part (`output_text`, `refusal`, `reasoning_text`, `summary_text`).
#[derive(Deserialize)]
pub(crate) struct Part<'a> {
    #[serde(borrow, rename = "type", default)]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub refusal: Option<Cow<'a, str>>,
}

impl Part<'_> {
    pub(crate) fn body(&self) -> Option<&str> {
        self.text.as_deref().or(self.refusal.as_deref())
    }
}

pub(crate) fn parse_parts(raw: Option<&RawValue>) -> Vec<Part<'_>> {
    raw.and_then(|r| serde_json::from_str::<Vec<Part<'_>>>(r.get()).ok())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// events built from items
// ---------------------------------------------------------------------------------------

/// Tool arguments as JSON: the parsed object when the text is JSON, else the text as a
/// JSON string (never dropped, never a panic).
pub(crate) fn args_json(text: &str) -> Json {
    Json::parse(text).unwrap_or_else(|| Json::string(text))
}

/// Reports a catalogued frame that Phase 1 does not map (spec §6 "out of scope").
pub(crate) fn unsupported(out: &mut Emitter, what: &str) {
    out.diagnostic("unsupported_frame", Some(Json::string(what)));
}

/// The final-answer snapshot event (§3.5: a replacement keyed by the segment id).
pub(crate) fn final_answer(id: &str, text: &str, truncated: bool) -> Assistant {
    Assistant {
        id: Some(id.to_owned()),
        phase: Some(AssistantPhase::FinalAnswer),
        text: Some(text.to_owned()),
        status: Some(SegmentStatus::Completed),
        truncated: truncated.then_some(true),
        delta: None,
    }
}

/// A commentary delta on a segment.
pub(crate) fn commentary_delta(id: &str, delta: &str) -> Assistant {
    Assistant {
        id: Some(id.to_owned()),
        phase: Some(AssistantPhase::Commentary),
        delta: Some(delta.to_owned()),
        status: Some(SegmentStatus::InProgress),
        ..Assistant::default()
    }
}

//! The canonical event: `{"seq":N,"stream":"…","data":{…}}` (spec §3).
//!
//! Field order in the structs follows the golden files so the JSON we print reads like
//! them; consumers compare events as JSON values, so order is cosmetic. Absent fields are
//! omitted, never written as `null`.

use crate::json::{deserialize_present as present, Json};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// One normalized event of a run: its position and its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Per-run position, from 1, no gaps, in provider order.
    pub seq: u64,
    /// The payload; its variant is the event's `stream`.
    pub data: EventData,
}

impl Event {
    /// The stream this event belongs to.
    pub fn stream(&self) -> Stream {
        self.data.stream()
    }

    /// True for a terminal lifecycle event (`end` or `error`): the run's last.
    pub fn is_terminal(&self) -> bool {
        matches!(&self.data, EventData::Lifecycle(l) if l.is_terminal())
    }

    /// The code of the lifecycle diagnostic this event carries, if any.
    pub fn diagnostic_code(&self) -> Option<&str> {
        match &self.data {
            EventData::Lifecycle(l) => l.diagnostic.as_ref().map(|d| d.code.as_str()),
            _ => None,
        }
    }

    /// The event as one line of canonical JSON (the golden shape, no newline).
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(128);
        // Writing into a Vec cannot fail; the line is UTF-8 (text it is handed as `&str`,
        // ASCII around it).
        match crate::line::write_event(&mut out, self) {
            Ok(()) => String::from_utf8(out).unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Writes the event's canonical JSON line (no newline) to `out`; see [`crate::line`].
    pub fn write_json<W: std::io::Write>(&self, out: &mut W) -> std::io::Result<()> {
        crate::line::write_event(out, self)
    }

    /// Parses one canonical JSON line.
    pub fn from_json(line: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// The four event streams of the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Visible reply text: commentary and the final answer.
    Assistant,
    /// Reasoning, in any variant.
    Thinking,
    /// Tool calls and other activity items.
    Item,
    /// Run start, diagnostics, end and errors.
    Lifecycle,
}

impl Stream {
    /// The wire name (`assistant`, `thinking`, `item`, `lifecycle`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Assistant => "assistant",
            Stream::Thinking => "thinking",
            Stream::Item => "item",
            Stream::Lifecycle => "lifecycle",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Stream> {
        Some(match s {
            "assistant" => Stream::Assistant,
            "thinking" => Stream::Thinking,
            "item" => Stream::Item,
            "lifecycle" => Stream::Lifecycle,
            _ => return None,
        })
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event payload; the variant decides the `stream`.
///
/// Tool items and lifecycle events are boxed: they are few in a run but three times the
/// size of a text or thinking delta, and every event is moved through the emitter's
/// queue — unboxed they made each of a long run's deltas 280 bytes (measured:
/// docs/performance.md).
#[derive(Debug, Clone, PartialEq)]
pub enum EventData {
    /// `stream: "assistant"`.
    Assistant(Assistant),
    /// `stream: "thinking"`.
    Thinking(Thinking),
    /// `stream: "item"`.
    Item(Box<Item>),
    /// `stream: "lifecycle"`.
    Lifecycle(Box<Lifecycle>),
}

impl EventData {
    /// The stream of this payload.
    pub fn stream(&self) -> Stream {
        match self {
            EventData::Assistant(_) => Stream::Assistant,
            EventData::Thinking(_) => Stream::Thinking,
            EventData::Item(_) => Stream::Item,
            EventData::Lifecycle(_) => Stream::Lifecycle,
        }
    }

    /// The payload as JSON text (the `data` member of the canonical line).
    pub fn to_json(&self) -> String {
        let result = match self {
            EventData::Assistant(d) => serde_json::to_string(d),
            EventData::Thinking(d) => serde_json::to_string(d),
            EventData::Item(d) => serde_json::to_string(d),
            EventData::Lifecycle(d) => serde_json::to_string(d),
        };
        result.unwrap_or_default()
    }

    /// Parses a `data` object for the given stream.
    pub fn from_json(stream: Stream, data: &str) -> Result<EventData, serde_json::Error> {
        Ok(match stream {
            Stream::Assistant => EventData::Assistant(serde_json::from_str(data)?),
            Stream::Thinking => EventData::Thinking(serde_json::from_str(data)?),
            Stream::Item => EventData::Item(Box::new(serde_json::from_str(data)?)),
            Stream::Lifecycle => EventData::Lifecycle(Box::new(serde_json::from_str(data)?)),
        })
    }
}

impl From<Assistant> for EventData {
    fn from(d: Assistant) -> EventData {
        EventData::Assistant(d)
    }
}
impl From<Thinking> for EventData {
    fn from(d: Thinking) -> EventData {
        EventData::Thinking(d)
    }
}
impl From<Item> for EventData {
    fn from(d: Item) -> EventData {
        EventData::Item(Box::new(d))
    }
}
impl From<Lifecycle> for EventData {
    fn from(d: Lifecycle) -> EventData {
        EventData::Lifecycle(Box::new(d))
    }
}

// ---------------------------------------------------------------------------------------
// assistant
// ---------------------------------------------------------------------------------------

/// Whether assistant text is progress or the reply (spec §3.1, §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssistantPhase {
    /// Text streamed while the turn is open; may turn out to be the reply.
    Commentary,
    /// The reply, resolved by the finality rules.
    FinalAnswer,
}

/// Progress state of a text or item segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentStatus {
    /// Still streaming.
    InProgress,
    /// Closed.
    Completed,
}

/// `stream: "assistant"` payload (spec §3.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Assistant {
    /// Provider-stable segment id (F1 block index, F3 `item_id:content_index`), never synthesized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Commentary or final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AssistantPhase>,
    /// Incremental text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<String>,
    /// Snapshot text (the whole segment so far, or the final reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Segment progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SegmentStatus>,
    /// Set on a final answer cut short by a token limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// thinking
// ---------------------------------------------------------------------------------------

/// Which reasoning lane a thinking event belongs to (spec §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingVariant {
    /// Chain-of-thought text.
    Raw,
    /// A provider-written summary of the reasoning.
    Summary,
    /// Reasoning happened but its content is withheld: content-free markers only.
    Redacted,
}

impl ThinkingVariant {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingVariant::Raw => "raw",
            ThinkingVariant::Summary => "summary",
            ThinkingVariant::Redacted => "redacted",
        }
    }
}

/// Boundary marker of a thinking segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentPhase {
    /// The segment opens.
    Start,
    /// The segment closes.
    End,
}

/// `stream: "thinking"` payload (spec §3.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thinking {
    /// Provider-stable reasoning segment id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The reasoning lane.
    pub variant: ThinkingVariant,
    /// Segment boundary; text frames have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SegmentPhase>,
    /// Incremental reasoning text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<String>,
    /// Snapshot reasoning text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Thinking tokens from usage: on the `end` marker when usage came before the segment
    /// ended, else on the one tokens-only update that follows it (see
    /// [`Thinking::tokens_update`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

impl Thinking {
    /// A content-free boundary marker.
    pub fn marker(variant: ThinkingVariant, phase: SegmentPhase, id: Option<String>) -> Thinking {
        Thinking {
            id,
            variant,
            phase: Some(phase),
            delta: None,
            text: None,
            tokens: None,
        }
    }

    /// The tokens-only update of an ended segment:
    /// `{"id","variant","tokens"}`, no `phase`, no text. Events go out as soon as their
    /// frame is read, and thinking-token counts come from a usage frame that usually
    /// follows the segment, so the `end` marker goes out without `tokens` and this update
    /// carries them once usage arrives (spec §3.2: "the adapter MAY emit one summary
    /// marker update"). It belongs to the latest earlier `end` marker of the same
    /// `variant` and `id`; [`crate::batch::fold_token_updates`] folds it back onto that
    /// marker, which gives the batch (golden) form.
    pub fn tokens_update(variant: ThinkingVariant, id: Option<String>, tokens: u64) -> Thinking {
        Thinking {
            id,
            variant,
            phase: None,
            delta: None,
            text: None,
            tokens: Some(tokens),
        }
    }

    /// True for a tokens-only update (see [`Thinking::tokens_update`]).
    pub fn is_tokens_update(&self) -> bool {
        self.phase.is_none() && self.delta.is_none() && self.text.is_none() && self.tokens.is_some()
    }

    /// An incremental text frame.
    pub fn delta(variant: ThinkingVariant, delta: String, id: Option<String>) -> Thinking {
        Thinking {
            id,
            variant,
            phase: None,
            delta: Some(delta),
            text: None,
            tokens: None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// item
// ---------------------------------------------------------------------------------------

/// Lifecycle of an activity item (spec §3.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemPhase {
    /// Call id and name are known.
    #[default]
    Start,
    /// More input or output arrived.
    Update,
    /// The item is complete (or failed).
    End,
}

/// `stream: "item"` payload: a tool call or another activity item.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// `start`, `update` or `end`.
    pub phase: ItemPhase,
    /// Provider call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Provider position of the call within the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// `tool`, `command`, `search`, … (open set).
    #[serde(default)]
    pub kind: String,
    /// Tool or activity name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Human title, when the runtime gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `in_progress`, `completed`, `failed`, … (open set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Input known at start (a provider object).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub input: Option<Json>,
    /// Incremental argument text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_delta: Option<String>,
    /// Fully assembled arguments, on `end`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub arguments: Option<Json>,
    /// Incremental output text (command output and the like).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_delta: Option<String>,
    /// Aggregated output of a runtime-executed item (codex `commandExecution`
    /// `aggregatedOutput`), on `end`; the codex golden names it `output`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub output: Option<Json>,
    /// Result or output summary, on `end`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub result: Option<Json>,
    /// Provider metadata for the item (annotations, citations, …).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub meta: Option<Json>,
}

// ---------------------------------------------------------------------------------------
// lifecycle
// ---------------------------------------------------------------------------------------

/// Phase of a lifecycle event (spec §3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LifecyclePhase {
    /// The run started.
    Start,
    /// A diagnostic; not rendered by default.
    Update,
    /// The run ended (any non-error terminal path).
    End,
    /// The run died: in-band error, abort, or `stream_closed`.
    Error,
}

/// Run status carried on terminal lifecycle events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The provider finished the turn.
    Completed,
    /// The turn ended without a complete answer.
    Incomplete,
}

/// Normalized stop reason (spec §3.4). Unknown provider reasons are kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// Clean stop (Finalize).
    Completed,
    /// Token limit (Truncate).
    Truncated,
    /// A stop sequence matched (Finalize).
    StopSequence,
    /// The turn yields to tool execution.
    ToolUse,
    /// Suspended (`pause_turn`).
    Paused,
    /// Provider safety stop (Reject).
    Refusal,
    /// Content filter (Reject).
    ContentFilter,
    /// In-band error (Dead).
    Error,
    /// The transport closed with no terminal frame (Dead).
    StreamClosed,
    /// Any other reason, verbatim.
    Other(String),
}

impl StopReason {
    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            StopReason::Completed => "completed",
            StopReason::Truncated => "truncated",
            StopReason::StopSequence => "stop_sequence",
            StopReason::ToolUse => "tool_use",
            StopReason::Paused => "paused",
            StopReason::Refusal => "refusal",
            StopReason::ContentFilter => "content_filter",
            StopReason::Error => "error",
            StopReason::StreamClosed => "stream_closed",
            StopReason::Other(s) => s,
        }
    }

    /// Parses a wire name; unknown names become [`StopReason::Other`].
    pub fn parse(s: &str) -> StopReason {
        match s {
            "completed" => StopReason::Completed,
            "truncated" => StopReason::Truncated,
            "stop_sequence" => StopReason::StopSequence,
            "tool_use" => StopReason::ToolUse,
            "paused" => StopReason::Paused,
            "refusal" => StopReason::Refusal,
            "content_filter" => StopReason::ContentFilter,
            "error" => StopReason::Error,
            "stream_closed" => StopReason::StreamClosed,
            other => StopReason::Other(other.to_owned()),
        }
    }

    /// True for the Reject path (partial text must be retracted).
    pub fn is_reject(&self) -> bool {
        matches!(self, StopReason::Refusal | StopReason::ContentFilter)
    }
}

impl Serialize for StopReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StopReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StopReason, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        if s.is_empty() {
            return Err(D::Error::custom("empty stop reason"));
        }
        Ok(StopReason::parse(&s))
    }
}

/// A diagnostic attached to a lifecycle event: `unknown_frame`, `rate_limit_event`, …
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Machine-readable code.
    pub code: String,
    /// Human-readable message, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Provider detail, verbatim.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub detail: Option<Json>,
}

impl Diagnostic {
    /// A diagnostic with a code and provider detail.
    pub fn new(code: impl Into<String>, detail: Option<Json>) -> Diagnostic {
        Diagnostic {
            code: code.into(),
            message: None,
            detail,
        }
    }
}

/// `stream: "lifecycle"` payload (spec §3.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lifecycle {
    /// Start, update, end or error.
    pub phase: LifecyclePhase,
    /// Normalized stop reason, on terminal events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<StopReason>,
    /// Run status, on terminal events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// Provider name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Provider message/response id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Cumulative usage, verbatim from the provider.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub usage: Option<Json>,
    /// A diagnostic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<Diagnostic>,
}

impl Lifecycle {
    /// A lifecycle event with only its phase set.
    pub fn new(phase: LifecyclePhase) -> Lifecycle {
        Lifecycle {
            phase,
            reason: None,
            status: None,
            provider: None,
            model: None,
            id: None,
            usage: None,
            diagnostic: None,
        }
    }

    /// A `lifecycle/update` diagnostic.
    pub fn diagnostic(code: impl Into<String>, detail: Option<Json>) -> Lifecycle {
        Lifecycle {
            diagnostic: Some(Diagnostic::new(code, detail)),
            ..Lifecycle::new(LifecyclePhase::Update)
        }
    }

    /// True for `end` and `error`.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase, LifecyclePhase::End | LifecyclePhase::Error)
    }
}

// ---------------------------------------------------------------------------------------
// canonical line (de)serialization
// ---------------------------------------------------------------------------------------

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Event", 3)?;
        st.serialize_field("seq", &self.seq)?;
        st.serialize_field("stream", &self.stream())?;
        match &self.data {
            EventData::Assistant(d) => st.serialize_field("data", d)?,
            EventData::Thinking(d) => st.serialize_field("data", d)?,
            EventData::Item(d) => st.serialize_field("data", d)?,
            EventData::Lifecycle(d) => st.serialize_field("data", d)?,
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        #[derive(Deserialize)]
        struct Line {
            seq: u64,
            stream: Stream,
            data: Box<serde_json::value::RawValue>,
        }
        let line = Line::deserialize(d)?;
        let data = EventData::from_json(line.stream, line.data.get()).map_err(D::Error::custom)?;
        Ok(Event {
            seq: line.seq,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_lines_round_trip() {
        let lines = [
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":7,"stream":"assistant","data":{"id":"1","phase":"commentary","delta":"x","status":"in_progress"}}"#,
            r#"{"seq":8,"stream":"item","data":{"phase":"end","id":"t","index":0,"kind":"tool","name":"get_weather","status":"completed","arguments":{"location":"San Francisco, CA"}}}"#,
            r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"openai","model":"m","id":"r","usage":null}}"#,
            r#"{"seq":9,"stream":"lifecycle","data":{"phase":"error","reason":"stream_closed","status":"incomplete"}}"#,
        ];
        for line in lines {
            let ev = Event::from_json(line).unwrap();
            let back = ev.to_json();
            let a: serde_json::Value = serde_json::from_str(line).unwrap();
            let b: serde_json::Value = serde_json::from_str(&back).unwrap();
            assert_eq!(a, b, "{line}");
        }
    }

    #[test]
    fn unknown_reason_is_kept() {
        let ev = Event::from_json(
            r#"{"seq":1,"stream":"lifecycle","data":{"phase":"end","reason":"weird"}}"#,
        )
        .unwrap();
        assert!(ev.to_json().contains(r#""reason":"weird""#));
    }
}

//! `session/update` notifications: `params.update` is tagged by `sessionUpdate`.
//!
//! | `sessionUpdate` | event |
//! |---|---|
//! | `agent_message_chunk` (text block) | `assistant` commentary delta |
//! | `agent_thought_chunk` (text block) | `thinking` delta, variant `raw` |
//! | v2 `agent_message`, `agent_thought` (whole message by `messageId`) | the same, as deltas of what is new ([`super::whole_messages`]) |
//! | `tool_call`, `tool_call_update` | `item` ([`super::tool_calls`]) |
//! | v2 `tool_call_content_chunk` | `item/update` of its tool: text as `output_delta`, other content appended to `output` |
//! | `plan`, `available_commands_update`, `current_mode_update`, `config_option_update`, `session_info_update`, `user_message_chunk`, non-terminal `state_update`; v2 `user_message`, `plan_update`, `plan_removed`, `notice`, `compaction_update`, `compaction_summary_chunk`, `terminal_update`, `terminal_output_chunk`, `prompt_suggestions_update`, `cursor_update`, `subagent_update`, `session_message`, `session_message_chunk`, `replay_complete` | `lifecycle/update`, `diagnostic.code` = the kind |
//! | `usage_update` | the same, plus `lifecycle.usage` = `{used, size, cost}` |
//! | `state_update` `idle` with a `stopReason` (protocol v2) | the turn's end |
//! | anything else | `unknown_session_update` diagnostic (the kind only) |
//!
//! Contract (the projector relies on it): the `diagnostic.detail` of a kind-coded
//! update is the `update` object **verbatim, `sessionUpdate` key included**.
//! A message or thought chunk whose block is not text (image, audio, resource) is a
//! `non_text_content` diagnostic naming the kind and the block type, never its data.
//! The client's prompt is outlined the same way ([`prompt_outline`]).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::Json;

/// Session-update kinds that become a kind-coded `lifecycle/update` diagnostic.
pub(super) const STATUS_KINDS: [&str; 21] = [
    "plan",
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
    "session_info_update",
    "user_message_chunk",
    "state_update",
    // Protocol v2: the user's whole message, plans by id, notices, context compaction,
    // and agent-owned terminals (display-only: the tool rows show the activity).
    "user_message",
    "plan_update",
    "notice",
    "compaction_update",
    "terminal_update",
    "terminal_output_chunk",
    // Protocol v2 session state that is not the agent's reply: plan removal, the
    // compaction summary, prompt suggestions, the history cursor and replay, sub-agent
    // progress, session-level messages.
    "plan_removed",
    "compaction_summary_chunk",
    "prompt_suggestions_update",
    "cursor_update",
    "subagent_update",
    "session_message",
    "session_message_chunk",
    "replay_complete",
];

/// The union of the `update` fields the adapter reads.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Update<'a> {
    #[serde(borrow, default)]
    pub session_update: Option<Cow<'a, str>>,
    /// A content block (message/thought chunks) or a tool's content array.
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub message_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub title: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub raw_input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub raw_output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub locations: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub used: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub size: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub cost: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub state: Option<Cow<'a, str>>,
    /// Read raw: a v2 `stopReason` may be an object describing a failure ([`Stop`]).
    #[serde(borrow, default)]
    pub stop_reason: Option<&'a RawValue>,
    /// The failure beside a v2 `stopReason: "error"` (a JSON-RPC error object).
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
}

/// A `stopReason` as the agent sent it.
pub(super) enum Stop<'a> {
    /// A named reason (`end_turn`, `cancelled`, v2 `error`, …); a value that is neither a
    /// string nor an object is named by its JSON text, and dispatched as unknown.
    Named(Cow<'a, str>),
    /// An object in the reason's place: a failure described by its fields.
    Failure(&'a RawValue),
}

impl<'a> Stop<'a> {
    /// The stop reason of `raw`; `None` when absent or `null` (not reported).
    pub(super) fn of(raw: Option<&'a RawValue>) -> Option<Stop<'a>> {
        let raw = raw.filter(|r| r.get() != "null")?;
        if raw.get().starts_with('{') {
            return Some(Stop::Failure(raw));
        }
        let name =
            serde_json::from_str::<Cow<'a, str>>(raw.get()).unwrap_or(Cow::Borrowed(raw.get()));
        Some(Stop::Named(name))
    }
}

impl Update<'_> {
    /// The lifecycle `usage` of a `usage_update`: `{used, size, cost}` as sent (absent
    /// fields left out); `None` when it carries none of them.
    pub(super) fn context_usage(&self) -> Option<Json> {
        #[derive(Serialize)]
        struct ContextUsage<'b> {
            #[serde(skip_serializing_if = "Option::is_none")]
            used: Option<&'b RawValue>,
            #[serde(skip_serializing_if = "Option::is_none")]
            size: Option<&'b RawValue>,
            #[serde(skip_serializing_if = "Option::is_none")]
            cost: Option<&'b RawValue>,
        }
        fn keep_of(r: Option<&RawValue>) -> Option<&RawValue> {
            r.filter(|r| r.get() != "null")
        }
        let usage = ContextUsage {
            used: keep_of(self.used),
            size: keep_of(self.size),
            cost: keep_of(self.cost),
        };
        if usage.used.is_none() && usage.size.is_none() && usage.cost.is_none() {
            return None;
        }
        Some(Json::from_value(&usage))
    }
}

/// A content block: what a message or thought chunk carries, and a prompt is made of.
#[derive(Deserialize, Serialize, Default)]
pub(super) struct Block<'a> {
    #[serde(
        rename = "type",
        borrow,
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ty: Option<Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Cow<'a, str>>,
}

/// The `prompt` diagnostic's detail: the prompt's blocks, text blocks whole and every
/// other block (image, audio, embedded resource) as its `type` only, so a pasted image
/// or file never rides the bus twice (the raw stream keeps it). `None` when the prompt
/// is not an array of blocks.
pub(super) fn prompt_outline(prompt: Option<&RawValue>) -> Option<Json> {
    let blocks: Vec<Block<'_>> = serde_json::from_str(prompt?.get()).ok()?;
    let outline: Vec<Block<'_>> = blocks
        .into_iter()
        .map(|b| match b.ty.as_deref() {
            Some("text") | None => b,
            Some(_) => Block { text: None, ..b },
        })
        .collect();
    Some(Json::from_value(&outline))
}

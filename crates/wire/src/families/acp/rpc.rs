//! The JSON-RPC 2.0 envelope as an ACP client's capture holds it, and which side of the
//! connection each method belongs to.
//!
//! The shapes are hand-written, borrowed serde structs that read only the fields the
//! adapter uses (the same zero-copy style as every other family). The
//! `agent-client-protocol-schema` crate was considered and not used: it churns fast
//! (0.x → 1.x within months, with `v1`/`v2` modules and a dozen `unstable_*` feature
//! gates), pulls `derive_more`, `serde_with`, `schemars` and `indexmap`, and its owned,
//! strictly typed structs reject frames this adapter must still account for (an unknown
//! `sessionUpdate` kind, a tool update with a field of an unexpected type).

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// One JSON-RPC message: request (`id` + `method`), notification (`method` only) or
/// response (`id` + `result` | `error`).
#[derive(Deserialize)]
pub(super) struct Message<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

/// A request id as a comparable key: its JSON text (`2`, `"req-2"`).
pub(super) fn id_key(id: &RawValue) -> String {
    id.get().to_owned()
}

/// True for methods the agent calls on the client (`session/request_permission`, the
/// client's `fs/*` and `terminal/*` capabilities, elicitation). Everything else with an
/// id is a client request (`initialize`, `session/new`, `session/prompt`, …).
pub(super) fn agent_method(method: &str) -> bool {
    method == "session/request_permission"
        || method.starts_with("fs/")
        || method.starts_with("terminal/")
        || method.starts_with("elicitation/")
        || method == "session/elicitation"
}

/// Client requests of the handshake and session setup: no agent output, documented drops.
pub(super) const SETUP_METHODS: [&str; 11] = [
    "initialize",
    "authenticate",
    "session/new",
    "session/load",
    "session/resume",
    "session/list",
    "session/close",
    "session/fork",
    "session/set_mode",
    "session/set_model",
    "session/set_config_option",
];

/// `session/update` and `session/prompt` params.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct SessionParams<'a> {
    #[serde(borrow, default)]
    pub session_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub update: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub prompt: Option<&'a RawValue>,
}

/// A `session/update` notification read in one pass — envelope, params and update
/// together — for the adapter's fast path: the generic path reads the envelope with
/// `params` raw, then the params with `update` raw, then the update, three passes over
/// the same bytes (measured: ACP was the slowest family, half its time in parsing). Its
/// fields have the generic structs' types, so it parses exactly when they all would.
#[derive(Deserialize)]
pub(super) struct UpdateNotification<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub params: Option<InlineParams<'a>>,
}

/// [`SessionParams`] with the update read in place (`prompt` is not read: a chunk has none).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct InlineParams<'a> {
    #[serde(borrow, default)]
    pub session_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub update: Option<super::update::Update<'a>>,
}

/// The fields of a response `result` the adapter reads: the prompt response
/// (`stopReason`, optional `usage`) and `session/new`'s `sessionId`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResultFields<'a> {
    #[serde(borrow, default)]
    pub stop_reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub session_id: Option<Cow<'a, str>>,
}

/// Parses `raw` as `T`, or `T::default()` when it is absent or not that shape.
pub(super) fn fields<'a, T: Deserialize<'a> + Default>(raw: Option<&'a RawValue>) -> T {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default()
}

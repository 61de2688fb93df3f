//! Agent Client Protocol (`acp`): JSON-RPC 2.0 over newline-delimited JSON, as an ACP
//! *client* sees it. One run is one prompt turn.
//!
//! # Layout
//! - [`rpc`]: the JSON-RPC envelope, request/response matching helpers, and why the
//!   serde shapes are hand-written.
//! - [`update`]: `session/update` kinds and what each becomes.
//! - [`tool_calls`]: merging `tool_call` / `tool_call_update` into one item per id,
//!   and v2's `tool_call_content_chunk` appended to it.
//! - [`whole_messages`]: v2's whole-message upserts (`agent_message`, `agent_thought`)
//!   turned into deltas.
//!
//! # Both directions
//! A capture may interleave the client's side (`initialize`, `session/new`,
//! `session/prompt`, `session/cancel`, replies to the agent's permission and `fs/*`
//! requests) with the agent's. Client traffic is never agent output: setup requests,
//! their responses and the client's replies are documented drops; the prompt becomes a
//! `prompt` `lifecycle/update` diagnostic (detail = its content blocks, non-text blocks
//! reduced to their `type`).
//! The agent's `session/request_permission` is a `request_permission` diagnostic and its
//! `elicitation/create` (a question to the user) an `elicitation` diagnostic (detail =
//! the params); its `fs/*` and `terminal/*` requests are dropped (the tool call rows
//! already show the activity). Other methods are `unsupported_frame`.
//!
//! `lifecycle/start` (provider `acp`, id = the session id) goes out at the first frame
//! of the turn (the prompt, an update, an agent request, the turn's end), not during
//! the handshake. Updates for another `sessionId` than the run's are dropped with a
//! `foreign_session` diagnostic.
//!
//! # Finality (spec §3.5, via [`crate::families::finality`])
//! The turn ends with the `session/prompt` response (matched by request id when the
//! request is in the capture, else any response carrying `result.stopReason`) or, in
//! protocol v2, a `state_update` `idle` with a `stopReason`:
//!
//! | `stopReason` | path |
//! |---|---|
//! | `end_turn` | Finalize: last text segment → final answer, `end`/`completed` |
//! | `max_tokens` | Truncate: final answer `truncated`, `end`/`truncated`/`incomplete` |
//! | `max_turn_requests` | `end`, reason `max_turn_requests`, `incomplete`, no final answer |
//! | `refusal` | Reject: `error`/`refusal`, no final answer |
//! | `cancelled` | Dead: `error`/`error`, diagnostic `cancelled`, open tools `cancelled` |
//! | v2 `error` | Dead, diagnostic `stop_reason_error` (the `error` object beside it) |
//! | v2 an object in its place | Dead, diagnostic `stop_reason_error` carrying the object |
//! | anything else | `end` `incomplete`, reason `unknown`, diagnostic `stop_reason` |
//!
//! - `max_turn_requests` is a turn-budget stop, not a token cut: the last text is what
//!   the agent said before the request it was not allowed to make ("let me run the
//!   tests…"), not a reply cut mid-sentence. Re-tagging it as the answer would deliver
//!   progress as the reply, so it takes §3.5's conservative row (end incomplete, no
//!   final answer; channels show "⚠️ incomplete"), with the reason verbatim.
//! - `cancelled` is the client's `session/cancel` confirmed: an abort, which §3.5 puts
//!   on the Dead path (no final answer, the draft settles in error). It is told apart
//!   from a failure by its diagnostic code, as codex's `turn_interrupted` and
//!   OpenClaw's `aborted` are. Suspend (`paused`) would promise a resumable draft ACP
//!   does not have: the next prompt is a new turn.
//! - v2 reports a failure on the idle update: `stopReason: "error"` with the JSON-RPC
//!   error object in `error`, or (drafts) an object in `stopReason`'s place. Either is
//!   the Dead path, the failure carried by the `stop_reason_error` diagnostic: an object
//!   where a name was expected is still the turn's end, not a malformed frame that would
//!   leave the turn to die as `stream_closed`.
//! - A JSON-RPC `error` response to the prompt is Dead with a `jsonrpc_error`
//!   diagnostic (message and error object). A stream that ends before any of these is
//!   stream death (`stream_closed`).
//!
//! Usage: every `usage_update` sets `lifecycle.usage` on its update; the terminal event
//! carries the latest usage seen (the prompt response's or idle update's `usage` when
//! it has one, else the last `usage_update`'s `{used, size, cost}`). Open thinking
//! closes and open tool calls end before the terminal event (`completed` on clean
//! paths, `failed` on error paths, `cancelled` on cancel). Frames after the terminal
//! event are documented drops.
//!
//! Protocol v2 (unstable, already emitted by agents) is read beside v1: whole-message
//! upserts, tool content chunks, `state_update`, and the status kinds listed in
//! [`update`]. An update kind neither version documents is an `unknown_session_update`
//! diagnostic naming the kind; the update itself is kept whole in `SG_RAW` and the
//! archive's raw chunks, as the schema asks receivers to preserve what they do not know.

mod rpc;
mod tool_calls;
mod update;
mod whole_messages;

use super::error_objects::error_message;
use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::finality::{stream_closed, Path};
use crate::families::response_items::unsupported;
use crate::families::segments::TurnSegments;
use crate::families::tools::present;
use crate::framing::Frame;
use rpc::{
    agent_method, fields, id_key, InlineParams, Message, ResultFields, SessionParams,
    UpdateNotification,
};
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Diagnostic, Json, Lifecycle, LifecyclePhase, StopReason, ThinkingVariant,
};
use tool_calls::ToolCalls;
use update::{Block, Stop, Update, STATUS_KINDS};

/// Adapter state for one run (one prompt turn).
#[derive(Debug, Default)]
pub struct AcpAdapter {
    started: bool,
    terminated: bool,
    /// The run's session id (from `session/new`, the prompt or the first update).
    session: Option<String>,
    /// The `session/prompt` request id, when the request is in the capture.
    prompt_id: Option<String>,
    /// Client requests awaiting their response (ids).
    client_pending: Vec<String>,
    /// Agent requests awaiting the client's reply (ids).
    agent_pending: Vec<String>,
    segments: TurnSegments,
    /// The `messageId` of the last message or thought chunk (v2, newer v1).
    message_id: Option<String>,
    /// v2 whole-message upserts: what was shown of the agent's message and thought.
    message_lane: whole_messages::Lane,
    thought_lane: whole_messages::Lane,
    tools: ToolCalls,
    /// The latest usage seen.
    usage: Option<Json>,
}

impl Adapter for AcpAdapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.terminated {
            // Nothing may follow the terminal event (I7): a documented drop.
            out.consumed();
            return;
        }
        if !self.chunk_fast_path(frame.data, out) {
            self.any_frame(frame.data, out);
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.terminated {
            return;
        }
        // No prompt response, no idle update: stream death, nothing becomes final.
        self.terminated = true;
        self.segments.end_thinking(out, None);
        self.tools.end_open("failed", out);
        stream_closed(out);
    }
}

/// The frame nearly every long run is made of — a message or thought chunk of text as
/// ACP agents write it — read by its exact template ([`exact_frame`]) into its session,
/// kind and text; `None` for any other frame, which is then read with serde (one pass
/// for the other chunks, the generic way for the rest; docs/performance.md has the
/// measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
fn hot_chunk(data: &str) -> Option<(Cow<'_, str>, &'static str, Cow<'_, str>)> {
    const KINDS: [&str; 2] = ["agent_message_chunk", "agent_thought_chunk"];
    let mut c = Cursor::new(data);
    c.literal(r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#)?;
    let session = c.string()?;
    c.literal(r#","update":{"sessionUpdate":""#)?;
    let kind = c.one_of(KINDS)?;
    c.literal(r#"","content":{"type":"text","text":"#)?;
    let text = c.string()?;
    c.literal("}}}}")?;
    c.whitespace();
    c.end()?;
    Some((session, KINDS[kind], text))
}

impl AcpAdapter {
    fn start(&mut self, out: &mut Emitter) {
        if self.started {
            return;
        }
        self.started = true;
        out.emit(Lifecycle {
            provider: Some("acp".into()),
            id: self.session.clone(),
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    /// Adopts `session` as the run's session; `false` when the run already has another.
    fn same_session(&mut self, session: Option<&str>) -> bool {
        match (session, &self.session) {
            (Some(s), Some(mine)) => s == mine,
            (Some(s), None) => {
                self.session = Some(s.to_owned());
                true
            }
            (None, _) => true,
        }
    }

    fn on_request(
        &mut self,
        method: &str,
        id: &RawValue,
        params: Option<&RawValue>,
        out: &mut Emitter,
    ) {
        if agent_method(method) {
            self.agent_pending.push(id_key(id));
            self.start(out);
            match method {
                "session/request_permission" => {
                    out.diagnostic("request_permission", present(params));
                }
                // The agent asks the user a question: as visible as a permission request.
                "elicitation/create" => {
                    out.diagnostic("elicitation", present(params));
                }
                _ => out.consumed(),
            }
            return;
        }
        self.client_pending.push(id_key(id));
        match method {
            "session/prompt" => self.on_prompt(id, params, out),
            m if rpc::SETUP_METHODS.contains(&m) => out.consumed(),
            m => unsupported(out, m),
        }
    }

    fn on_prompt(&mut self, id: &RawValue, params: Option<&RawValue>, out: &mut Emitter) {
        let p: SessionParams<'_> = fields(params);
        if self.prompt_id.is_none() {
            self.prompt_id = Some(id_key(id));
        }
        self.same_session(p.session_id.as_deref());
        self.start(out);
        out.diagnostic("prompt", update::prompt_outline(p.prompt));
    }

    fn on_notification(
        &mut self,
        method: &str,
        params: Option<&RawValue>,
        data: &str,
        out: &mut Emitter,
    ) {
        match method {
            "session/update" => self.on_update(params, data, out),
            // The client asks to cancel; the agent confirms with `stopReason: cancelled`.
            "session/cancel" => out.consumed(),
            m => unsupported(out, m),
        }
    }

    /// A response carrying `result`.
    fn on_result(&mut self, id: &RawValue, result: Option<&RawValue>, out: &mut Emitter) {
        let key = id_key(id);
        let r: ResultFields<'_> = fields(result);
        let is_prompt = self.prompt_id.as_deref().is_none_or(|p| p == key);
        if let (Some(stop), true) = (r.stop_reason, is_prompt) {
            self.finish(Stop::Named(stop), None, present(r.usage), out);
            return;
        }
        if take(&mut self.agent_pending, &key) {
            // The client's reply to a permission or fs/terminal request.
            out.consumed();
            return;
        }
        if take(&mut self.client_pending, &key) && self.session.is_none() {
            // session/new, session/load: the run's session id.
            self.session = r.session_id.as_deref().map(str::to_owned);
        }
        // Setup responses, the v2 prompt acknowledgement (`{}`), strays: documented drops.
        out.consumed();
    }

    /// A response carrying `error`.
    fn on_error(&mut self, id: Option<&RawValue>, error: Option<&RawValue>, out: &mut Emitter) {
        let key = id.map(id_key);
        let diagnostic = Diagnostic {
            code: "jsonrpc_error".into(),
            message: error.and_then(error_message),
            detail: present(error),
        };
        let Some(key) = key else {
            // `id: null`: a parse error about some message, not the turn's end.
            out.emit(Lifecycle {
                diagnostic: Some(diagnostic),
                ..Lifecycle::new(LifecyclePhase::Update)
            });
            return;
        };
        if take(&mut self.agent_pending, &key) {
            // The client failed an agent request (an fs read, say): not the turn's end.
            out.consumed();
            return;
        }
        let is_prompt = match &self.prompt_id {
            Some(p) => *p == key,
            None => !self.client_pending.contains(&key),
        };
        take(&mut self.client_pending, &key);
        if is_prompt {
            self.die(diagnostic, "failed", out);
        } else {
            out.emit(Lifecycle {
                diagnostic: Some(diagnostic),
                ..Lifecycle::new(LifecyclePhase::Update)
            });
        }
    }

    fn on_update(&mut self, params: Option<&RawValue>, data: &str, out: &mut Emitter) {
        let p = params.and_then(|r| serde_json::from_str::<SessionParams<'_>>(r.get()).ok());
        let Some((p, raw)) = p.and_then(|p| p.update.map(|u| (p.session_id, u))) else {
            out.malformed_frame(data);
            return;
        };
        let Ok(u) = serde_json::from_str::<Update<'_>>(raw.get()) else {
            out.malformed_frame(data);
            return;
        };
        if !self.same_session(p.as_deref()) {
            out.diagnostic("foreign_session", p.as_deref().map(Json::string));
            return;
        }
        self.start(out);
        let Some(kind) = u.session_update.as_deref() else {
            out.malformed_frame(data);
            return;
        };
        match kind {
            "agent_message_chunk" => self.on_chunk(kind, &u, false, out),
            "agent_thought_chunk" => self.on_chunk(kind, &u, true, out),
            "agent_message" => self.on_whole_message(kind, &u, false, data, out),
            "agent_thought" => self.on_whole_message(kind, &u, true, data, out),
            "tool_call" | "tool_call_update" => self.on_tool(&u, data, out),
            "tool_call_content_chunk" => {
                self.segments.end_thinking(out, None);
                self.segments.break_text();
                if !self.tools.append_content(&u, out) {
                    out.malformed_frame(data);
                }
            }
            "usage_update" => self.on_usage(&u, raw, out),
            "state_update" if u.state.as_deref() == Some("idle") => {
                match Stop::of(u.stop_reason) {
                    Some(stop) => self.finish(stop, u.error, present(u.usage), out),
                    // Idle without a stop reason does not end foreground work.
                    None => {
                        out.diagnostic(kind, Some(Json::from_raw(raw)));
                    }
                }
            }
            k if STATUS_KINDS.contains(&k) => {
                out.diagnostic(k, Some(Json::from_raw(raw)));
            }
            k => {
                out.diagnostic("unknown_session_update", Some(Json::string(k)));
            }
        }
    }

    /// Any JSON-RPC message: the envelope read with `params` raw, then dispatched.
    fn any_frame(&mut self, data: &str, out: &mut Emitter) {
        let Ok(msg) = serde_json::from_str::<Message<'_>>(data) else {
            out.malformed_frame(data);
            return;
        };
        match (msg.method.as_deref(), msg.id) {
            (Some(method), Some(id)) => self.on_request(method, id, msg.params, out),
            (Some(method), None) => self.on_notification(method, msg.params, data, out),
            (None, id) if msg.error.is_some() => self.on_error(id, msg.error, out),
            // `result` may be `null` (`fs/write_text_file`'s reply).
            (None, Some(id)) => self.on_result(id, msg.result, out),
            _ => {
                out.unknown_frame("jsonrpc", data);
            }
        }
    }

    /// The frame nearly every long run is made of — a `session/update` notification
    /// carrying a message or thought chunk — read in one pass and handled as
    /// [`AcpAdapter::any_frame`] would. `false` for any other frame, which then goes
    /// that way (read again: those are few).
    fn chunk_fast_path(&mut self, data: &str, out: &mut Emitter) -> bool {
        if let Some((session_id, kind, text)) = hot_chunk(data) {
            let block = Block {
                ty: Some(Cow::Borrowed("text")),
                text: Some(text),
            };
            self.chunk(Some(&session_id), kind, None, block, out);
            return true;
        }
        let Ok(n) = serde_json::from_str::<UpdateNotification<'_>>(data) else {
            return false;
        };
        if n.id.is_some() || n.method.as_deref() != Some("session/update") {
            return false;
        }
        let Some(InlineParams {
            session_id,
            update: Some(u),
            ..
        }) = n.params
        else {
            return false;
        };
        let kind = match u.session_update.as_deref() {
            Some("agent_message_chunk") => "agent_message_chunk",
            Some("agent_thought_chunk") => "agent_thought_chunk",
            _ => return false,
        };
        let block = fields(u.content);
        self.chunk(
            session_id.as_deref(),
            kind,
            u.message_id.as_deref(),
            block,
            out,
        );
        true
    }

    /// A message or thought chunk of `session`, handled as the generic reading of its
    /// `session/update` would.
    fn chunk(
        &mut self,
        session: Option<&str>,
        kind: &'static str,
        message_id: Option<&str>,
        block: Block<'_>,
        out: &mut Emitter,
    ) {
        if !self.same_session(session) {
            out.diagnostic("foreign_session", session.map(Json::string));
            return;
        }
        self.start(out);
        self.note_message(message_id, out);
        self.chunk_block(kind, block, kind == "agent_thought_chunk", out);
    }

    /// Tracks the `messageId` of message and thought content: a new message's text is a
    /// new segment.
    fn note_message(&mut self, id: Option<&str>, out: &mut Emitter) {
        if let Some(id) = id {
            if self.message_id.as_deref().is_some_and(|m| m != id) {
                self.segments.break_text();
                self.segments.end_thinking(out, None);
            }
            self.message_id = Some(id.to_owned());
        }
    }

    /// A message (`thought == false`) or thought chunk.
    fn on_chunk(&mut self, kind: &str, u: &Update<'_>, thought: bool, out: &mut Emitter) {
        self.note_message(u.message_id.as_deref(), out);
        self.chunk_block(kind, fields(u.content), thought, out);
    }

    fn chunk_block(&mut self, kind: &str, block: Block<'_>, thought: bool, out: &mut Emitter) {
        match (block.ty.as_deref(), block.text) {
            (Some("text") | None, Some(text)) if !text.is_empty() => {
                if thought {
                    self.segments
                        .think(out, ThinkingVariant::Raw, text.into_owned());
                } else {
                    self.segments.end_thinking(out, None);
                    self.segments.say(out, text.into_owned());
                }
            }
            (Some("text") | None, _) => out.consumed(),
            (Some(ty), _) => {
                let detail = serde_json::json!({ "sessionUpdate": kind, "type": ty });
                out.diagnostic("non_text_content", Some(Json::from_value(&detail)));
            }
        }
    }

    /// A v2 whole-message upsert of the agent's message (`thought == false`) or thought:
    /// its text blocks joined, turned into what is new ([`whole_messages`]).
    fn on_whole_message(
        &mut self,
        kind: &str,
        u: &Update<'_>,
        thought: bool,
        data: &str,
        out: &mut Emitter,
    ) {
        let Some(id) = u.message_id.as_deref() else {
            out.malformed_frame(data);
            return;
        };
        self.note_message(Some(id), out);
        let Some(content) = u.content else {
            out.consumed(); // content absent: the message is unchanged
            return;
        };
        // `null` clears the message, as `[]` does.
        let blocks: Vec<Block<'_>> = serde_json::from_str(content.get()).unwrap_or_default();
        let lane = if thought {
            &mut self.thought_lane
        } else {
            &mut self.message_lane
        };
        let seen = lane.blocks_seen(id);
        let mut text = String::new();
        for (at, block) in blocks.iter().enumerate() {
            match (block.ty.as_deref(), &block.text) {
                (Some("text") | None, Some(t)) => text.push_str(t),
                (Some("text") | None, None) => {}
                (Some(ty), _) if at >= seen => {
                    let detail = serde_json::json!({ "sessionUpdate": kind, "type": ty });
                    out.diagnostic("non_text_content", Some(Json::from_value(&detail)));
                }
                _ => {}
            }
        }
        let before = out.next_seq();
        match lane.upsert(id, &text, blocks.len()) {
            whole_messages::Change::Unchanged => {}
            whole_messages::Change::Extend(delta) => self.show(thought, delta, out),
            whole_messages::Change::Rewrite(whole) => {
                let detail = serde_json::json!({ "sessionUpdate": kind, "messageId": id });
                out.diagnostic("message_rewritten", Some(Json::from_value(&detail)));
                self.segments.break_text();
                self.segments.end_thinking(out, None);
                self.show(thought, whole, out);
            }
        }
        if out.next_seq() == before {
            out.consumed();
        }
    }

    /// Shows new message or thought text.
    fn show(&mut self, thought: bool, text: &str, out: &mut Emitter) {
        if text.is_empty() {
            return;
        }
        if thought {
            self.segments
                .think(out, ThinkingVariant::Raw, text.to_owned());
        } else {
            self.segments.end_thinking(out, None);
            self.segments.say(out, text.to_owned());
        }
    }

    fn on_tool(&mut self, u: &Update<'_>, data: &str, out: &mut Emitter) {
        self.segments.end_thinking(out, None);
        self.segments.break_text();
        if !self.tools.apply(u, out) {
            out.malformed_frame(data);
        }
    }

    fn on_usage(&mut self, u: &Update<'_>, raw: &RawValue, out: &mut Emitter) {
        let usage = u.context_usage();
        if usage.is_some() {
            out.saw_usage();
            self.usage.clone_from(&usage);
        }
        out.emit(Lifecycle {
            usage,
            diagnostic: Some(Diagnostic::new("usage_update", Some(Json::from_raw(raw)))),
            ..Lifecycle::new(LifecyclePhase::Update)
        });
    }

    /// The turn's end: the §3.5 dispatch on ACP's `stopReason` (`error`: the v2 failure
    /// object beside it).
    fn finish(
        &mut self,
        stop: Stop<'_>,
        error: Option<&RawValue>,
        usage: Option<Json>,
        out: &mut Emitter,
    ) {
        if usage.is_some() {
            out.saw_usage();
            self.usage = usage;
        }
        let (path, diagnostic, tool_status) = match stop {
            Stop::Named(name) => dispatch(&name, error),
            Stop::Failure(failure) => (
                Path::Dead(StopReason::Error),
                Some(failure_diagnostic(failure)),
                "failed",
            ),
        };
        if let Path::Dead(_) = path {
            let diagnostic = diagnostic.unwrap_or_else(|| Diagnostic::new("error", None));
            self.die(diagnostic, tool_status, out);
            return;
        }
        self.start(out);
        self.terminated = true;
        self.segments.end_thinking(out, None);
        self.tools.end_open(tool_status, out);
        if let Some(truncated) = path.final_answer() {
            self.segments.finalize(out, truncated);
        }
        path.emit(self.usage.clone(), diagnostic, out);
    }

    /// Dead path: thinking closes, open tools end with `tool_status`, no final answer.
    fn die(&mut self, diagnostic: Diagnostic, tool_status: &str, out: &mut Emitter) {
        self.start(out);
        self.terminated = true;
        self.segments.end_thinking(out, None);
        self.tools.end_open(tool_status, out);
        Path::Dead(StopReason::Error).emit(self.usage.clone(), Some(diagnostic), out);
    }
}

/// ACP `stopReason` → (§3.5 path, diagnostic, status for still-open tool calls);
/// `error` is the failure object beside a v2 `error` reason.
fn dispatch(stop: &str, error: Option<&RawValue>) -> (Path, Option<Diagnostic>, &'static str) {
    match stop {
        "end_turn" => (Path::Finalize(StopReason::Completed), None, "completed"),
        "max_tokens" => (Path::Truncate, None, "completed"),
        "max_turn_requests" => (
            Path::Incomplete(Some(StopReason::Other("max_turn_requests".into()))),
            None,
            "completed",
        ),
        "refusal" => (Path::Reject(StopReason::Refusal), None, "failed"),
        "cancelled" => (
            Path::Dead(StopReason::Error),
            Some(Diagnostic {
                code: "cancelled".into(),
                message: Some("the client cancelled the turn".into()),
                detail: None,
            }),
            "cancelled",
        ),
        "error" => (
            Path::Dead(StopReason::Error),
            Some(Diagnostic {
                code: "stop_reason_error".into(),
                message: error.and_then(error_message),
                detail: present(error),
            }),
            "failed",
        ),
        other => (
            Path::Incomplete(Some(StopReason::Other("unknown".into()))),
            Some(Diagnostic::new("stop_reason", Some(Json::string(other)))),
            "completed",
        ),
    }
}

/// The `stop_reason_error` diagnostic of an object in `stopReason`'s place: the object
/// whole, and the failure's message (its own `message`, or that of an `error` in it).
fn failure_diagnostic(failure: &RawValue) -> Diagnostic {
    #[derive(serde::Deserialize)]
    struct Nested<'a> {
        #[serde(borrow, default)]
        error: Option<&'a RawValue>,
    }
    let message = error_message(failure).or_else(|| {
        serde_json::from_str::<Nested<'_>>(failure.get())
            .ok()
            .and_then(|n| n.error)
            .and_then(error_message)
    });
    Diagnostic {
        code: "stop_reason_error".into(),
        message,
        detail: Some(Json::from_raw(failure)),
    }
}

/// Removes `key` from `ids`; true when it was there.
fn take(ids: &mut Vec<String>, key: &str) -> bool {
    match ids.iter().position(|k| k == key) {
        Some(at) => {
            ids.remove(at);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests;

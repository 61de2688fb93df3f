//! codex app-server JSON-RPC notifications (evidence `codex-appserver-envelope.md`).
//!
//! An envelope over F3: codex re-projects Responses items into its own item model and
//! LABELS the answer lane — `agentMessage.phase` is `commentary` or `final_answer` — so
//! finality is by phase, not position (§6 of the evidence). Deltas stream as commentary
//! keyed by the bare `itemId` (globally unique, evidence §8); a commentary message settles
//! with a `completed` snapshot at `item/completed`; the final-answer snapshot is released
//! only at `turn/completed` with status `completed` (§3.5 Finalize), never on a dead turn.
//! Usage is the last `thread/tokenUsage/updated` (turn/completed carries none).
//! `rawResponseItem/completed` mirrors the F3 items: reasoning items (encrypted replay
//! state) go to the transcript as `codex_raw_reasoning`, the rest is a consumed mirror.
//!
//! Items that are not agent activity are not tool rows: `userMessage` and `hookPrompt`
//! (input a hook injected) are consumed; a `plan` (plan mode's `<proposed_plan>` block,
//! split out of the agent's message) is a kind-coded `plan` diagnostic at completion, and
//! the final answer of a completed turn that has no answer-labelled (or unlabelled) agent
//! message: codex exec's own last-message rule falls back to the plan the same way.
//! Documented notifications the adapter does not map are `unsupported_frame` naming the
//! method; `model/rerouted` is a `model_fallback` diagnostic (detail = its params).

use super::{commentary_snapshot, error_message, parse_item};
use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::finality::{stream_closed, Path};
use crate::families::response_items::{commentary_delta, final_answer, unsupported, RawItem};
use crate::families::tools::{end_open_tools, present};
use crate::framing::Frame;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Diagnostic, Item, ItemPhase, Json, Lifecycle, LifecyclePhase, StopReason, Thinking,
    ThinkingVariant,
};

/// Transcript kind for the raw F3 reasoning item mirrored by `rawResponseItem/completed`.
pub const RAW_REASONING_KIND: &str = "codex_raw_reasoning";

/// Notifications the public schema documents that carry no turn content this adapter
/// maps (thread and account metadata, realtime voice, approval reviews, hooks, progress
/// the item rows already show): `unsupported_frame` naming the method, params in SG_RAW.
/// `turn/plan/updated` is not listed yet: the `codex-appserver/misc` fixture pins it as
/// `unknown_frame`.
const UNMAPPED_NOTIFICATIONS: [&str; 36] = [
    "turn/diff/updated",
    "item/plan/delta",
    "item/mcpToolCall/progress",
    "item/commandExecution/terminalInteraction",
    "item/fileChange/patchUpdated",
    "item/autoApprovalReview/started",
    "item/autoApprovalReview/completed",
    "hook/started",
    "hook/completed",
    "thread/compacted",
    "serverRequest/resolved",
    "thread/name/updated",
    "thread/archived",
    "thread/unarchived",
    "thread/closed",
    "skills/changed",
    "account/updated",
    "account/login/completed",
    "app/list/updated",
    "mcpServer/oauthLogin/completed",
    "fs/changed",
    "configWarning",
    "deprecationNotice",
    "fuzzyFileSearch/sessionUpdated",
    "fuzzyFileSearch/sessionCompleted",
    "command/exec/outputDelta",
    "windows/worldWritableWarning",
    "windowsSandbox/setupCompleted",
    "thread/realtime/started",
    "thread/realtime/itemAdded",
    "thread/realtime/transcript/delta",
    "thread/realtime/transcript/done",
    "thread/realtime/outputAudio/delta",
    "thread/realtime/sdp",
    "thread/realtime/error",
    "thread/realtime/closed",
];

/// One JSON-RPC message: a notification, a response, or a server→client request.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// The union of the notification params the adapter reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params<'a> {
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    turn: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thread: Option<&'a RawValue>,
    #[serde(borrow, default)]
    token_usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    will_retry: Option<bool>,
}

/// The notifications nearly every long run is made of — an agent message or reasoning
/// delta as codex writes it — read by their exact template ([`exact_frame`]) into the
/// method and params the generic reading makes of them; `None` for any other frame,
/// which is then read the generic way (docs/performance.md has the measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
fn hot_delta(data: &str) -> Option<(&'static str, Params<'_>)> {
    const METHODS: [&str; 3] = [
        "item/agentMessage/delta",
        "item/reasoning/textDelta",
        "item/reasoning/summaryTextDelta",
    ];
    let mut c = Cursor::new(data);
    c.literal(r#"{"method":""#)?;
    let method = c.one_of(METHODS)?;
    c.literal(r#"","params":{"threadId":"#)?;
    c.string()?;
    c.literal(r#","turnId":"#)?;
    c.string()?;
    c.literal(r#","itemId":"#)?;
    let item_id = c.string()?;
    c.literal(r#","delta":"#)?;
    let delta = c.string()?;
    // Reasoning deltas say which part they belong to, a field the adapter ignores.
    if method > 0
        && c.one_of([r#","contentIndex":"#, r#","summaryIndex":"#])
            .is_some()
    {
        c.uint()?;
    }
    c.literal("}}")?;
    c.end()?;
    let params = Params {
        item_id: Some(item_id),
        delta: Some(delta),
        ..Params::default()
    };
    Some((METHODS[method], params))
}

/// A codex thread item (`agentMessage`, `reasoning`, `commandExecution`, …).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadItem<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    phase: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    command: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    invocation: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    query: Option<&'a RawValue>,
    #[serde(borrow, default)]
    aggregated_output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    exit_code: Option<i64>,
    /// Reasoning summary parts (strings in the v2 protocol).
    #[serde(borrow, default)]
    summary: Option<&'a RawValue>,
    /// Raw reasoning parts (strings in the v2 protocol).
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    /// MCP server of an `mcpToolCall`.
    #[serde(borrow, default)]
    server: Option<Cow<'a, str>>,
    /// Tool name (`mcpToolCall`, `dynamicToolCall`, `collabAgentToolCall`).
    #[serde(borrow, default)]
    tool: Option<Cow<'a, str>>,
    /// A failed `mcpToolCall`'s `{message}`.
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    /// A `fileChange`'s `{path, kind, diff}` list.
    #[serde(borrow, default)]
    changes: Option<&'a RawValue>,
    /// An `imageGeneration`'s rewritten prompt and where the image was saved.
    #[serde(borrow, default)]
    revised_prompt: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    saved_path: Option<Cow<'a, str>>,
}

impl ThreadItem<'_> {
    fn kind(&self) -> &str {
        self.ty.as_deref().unwrap_or("")
    }

    /// What the item was asked to do, for tool rows (a file change: what it touches).
    fn input(&self) -> Option<Json> {
        if let Some(c) = self.command.as_deref() {
            return Some(Json::string(c));
        }
        if self.kind() == "fileChange" {
            return change_outline(self.changes);
        }
        [self.invocation, self.arguments, self.query]
            .into_iter()
            .find_map(present)
    }

    /// What the item produced (a generated image: its size, never its bytes).
    fn output(&self) -> Option<Json> {
        if self.kind() == "imageGeneration" {
            return self.image_outline();
        }
        [self.aggregated_output, self.output, self.result]
            .into_iter()
            .find_map(present)
    }

    /// `server/tool` for MCP calls, the tool name for other named calls.
    fn title(&self) -> Option<String> {
        match (self.server.as_deref(), self.tool.as_deref()) {
            (Some(s), Some(t)) => Some(format!("{s}/{t}")),
            (None, Some(t)) => Some(t.to_owned()),
            _ => None,
        }
    }

    fn failed(&self) -> bool {
        matches!(
            self.status.as_deref(),
            Some("failed" | "declined" | "error")
        ) || self.exit_code.is_some_and(|c| c != 0)
            || present(self.error).is_some()
    }

    /// An `imageGeneration`'s output: the size of its base64 `result` (the image stays in
    /// SG_RAW: an image is not text a channel shows, and it would swell every consumer),
    /// the revised prompt and the saved path when given.
    fn image_outline(&self) -> Option<Json> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct ImageOutline<'b> {
            #[serde(skip_serializing_if = "Option::is_none")]
            result_bytes: Option<usize>,
            #[serde(skip_serializing_if = "Option::is_none")]
            revised_prompt: Option<&'b str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            saved_path: Option<&'b str>,
        }
        let result_bytes = self
            .result
            .and_then(|r| serde_json::from_str::<Cow<'_, str>>(r.get()).ok())
            .map(|r| r.len());
        let outline = ImageOutline {
            result_bytes,
            revised_prompt: self.revised_prompt.as_deref(),
            saved_path: self.saved_path.as_deref(),
        };
        if outline.result_bytes.is_none()
            && outline.revised_prompt.is_none()
            && outline.saved_path.is_none()
        {
            return None;
        }
        Some(Json::from_value(&outline))
    }
}

/// A `fileChange`'s `changes` as `{path, kind}` per file (`move_path` when the update
/// moves the file): what the change touches, without the diffs, which can be large and
/// are kept in SG_RAW. `None` when `changes` is not such a list.
fn change_outline(raw: Option<&RawValue>) -> Option<Json> {
    /// `kind` is `{type, move_path}` in the v2 schema, a bare string in older ones.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Kind<'a> {
        Name(#[serde(borrow)] Cow<'a, str>),
        Tagged {
            #[serde(borrow, rename = "type", default)]
            ty: Option<Cow<'a, str>>,
            #[serde(borrow, default, alias = "movePath")]
            move_path: Option<Cow<'a, str>>,
        },
    }
    #[derive(Deserialize)]
    struct Change<'a> {
        #[serde(borrow, default)]
        path: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<Kind<'a>>,
    }
    #[derive(Serialize)]
    struct Touched<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        move_path: Option<Cow<'a, str>>,
    }
    let changes: Vec<Change<'_>> = serde_json::from_str(raw?.get()).ok()?;
    let touched: Vec<Touched<'_>> = changes
        .into_iter()
        .map(|c| {
            let (kind, move_path) = match c.kind {
                Some(Kind::Name(n)) => (Some(n), None),
                Some(Kind::Tagged { ty, move_path }) => (ty, move_path),
                None => (None, None),
            };
            Touched {
                path: c.path,
                kind,
                move_path,
            }
        })
        .collect();
    Some(Json::from_value(&touched))
}

/// Joins reasoning parts: plain strings (v2) or `{text}` objects.
fn join_parts(raw: Option<&RawValue>) -> String {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum PartText<'a> {
        Plain(#[serde(borrow)] Cow<'a, str>),
        Object {
            #[serde(borrow, default)]
            text: Option<Cow<'a, str>>,
        },
    }
    let parts: Vec<PartText<'_>> = raw
        .and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default();
    let mut out = String::new();
    for p in parts {
        match p {
            PartText::Plain(s) => out.push_str(&s),
            PartText::Object { text: Some(s) } => out.push_str(&s),
            PartText::Object { text: None } => {}
        }
    }
    out
}

/// The `turn` object of `turn/completed`.
#[derive(Deserialize)]
struct Turn<'a> {
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// The `thread` object (thread/start response, `thread/started`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadHead<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model_provider: Option<Cow<'a, str>>,
}

/// The result of `thread/start` (and `thread/resume`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadStartResult<'a> {
    #[serde(borrow, default)]
    thread: Option<ThreadHead<'a>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model_provider: Option<Cow<'a, str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MsgPhase {
    Commentary,
    Final,
    /// Older servers omit `phase`: finality falls back to position.
    Unlabelled,
}

fn msg_phase(p: Option<&str>) -> MsgPhase {
    match p {
        Some("final_answer") => MsgPhase::Final,
        Some("commentary") => MsgPhase::Commentary,
        _ => MsgPhase::Unlabelled,
    }
}

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct CodexAppServerAdapter {
    started: bool,
    terminated: bool,
    usage: Option<Json>,
    /// `agentMessage` phases from `item/started`.
    phases: Vec<(String, MsgPhase)>,
    /// The settled final-answer message (id, text), released at `turn/completed`.
    final_msg: Option<(String, String)>,
    /// An unlabelled message waiting to learn whether it is the last one.
    pending: Option<(String, String)>,
    /// The turn's latest plan (id, text): the answer of a turn whose agent messages
    /// (if any) are all commentary.
    plan: Option<(String, String)>,
    /// Open tool-like items: id and type name.
    tools: Vec<(String, String)>,
    /// The reasoning item the next raw mirror belongs to.
    last_reasoning: Option<String>,
}

impl Adapter for CodexAppServerAdapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.terminated {
            // Post-settle noise (status changes, rate limits): the run is over.
            out.consumed();
            return;
        }
        if let Some((method, params)) = hot_delta(frame.data) {
            self.on_notification(method, Some(params), frame.data, out);
            return;
        }
        let mut msg: Message<'_> = match serde_json::from_str(frame.data) {
            Ok(m) => m,
            Err(_) => {
                out.malformed_frame(frame.data);
                return;
            }
        };
        match (msg.method.take(), msg.id.is_some()) {
            (None, true) => self.on_response(&msg, out),
            (Some(method), true) => {
                // Server→client request (approval, elicitation): out of the content
                // pipeline's scope (evidence §2).
                unsupported(out, &method);
            }
            (Some(method), false) => {
                self.on_notification(&method, msg.params, frame.data, out);
            }
            (None, false) => {
                out.unknown_frame("frame", frame.data);
            }
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.terminated {
            return;
        }
        self.terminated = true;
        self.end_tools("failed", out);
        stream_closed(out);
    }
}

impl CodexAppServerAdapter {
    fn on_response(&mut self, msg: &Message<'_>, out: &mut Emitter) {
        if let Some(err) = msg.error {
            out.diagnostic("rpc_error", Some(Json::from_raw(err)));
            return;
        }
        let started = msg
            .result
            .and_then(|r| serde_json::from_str::<ThreadStartResult<'_>>(r.get()).ok())
            .filter(|r| r.thread.is_some());
        match started {
            Some(r) if !self.started => {
                self.started = true;
                let thread = r.thread;
                let provider = r
                    .model_provider
                    .or_else(|| thread.as_ref().and_then(|t| t.model_provider.clone()))
                    .map(Cow::into_owned)
                    .unwrap_or_else(|| "openai".into());
                out.emit(Lifecycle {
                    provider: Some(provider),
                    model: r.model.map(Cow::into_owned),
                    id: thread.and_then(|t| t.id).map(Cow::into_owned),
                    ..Lifecycle::new(LifecyclePhase::Start)
                });
            }
            _ => out.consumed(),
        }
    }

    /// `lifecycle/start` from `thread/started` when the handshake response was not seen.
    fn start_from_thread(&mut self, thread: Option<&RawValue>, out: &mut Emitter) {
        if self.started {
            out.consumed();
            return;
        }
        self.started = true;
        let head = thread.and_then(|t| serde_json::from_str::<ThreadHead<'_>>(t.get()).ok());
        let (id, provider) = match head {
            Some(h) => (
                h.id.map(Cow::into_owned),
                h.model_provider.map(Cow::into_owned),
            ),
            None => (None, None),
        };
        out.emit(Lifecycle {
            provider: Some(provider.unwrap_or_else(|| "openai".into())),
            id,
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    fn on_notification(
        &mut self,
        method: &str,
        params: Option<Params<'_>>,
        data: &str,
        out: &mut Emitter,
    ) {
        let Some(p) = params else {
            match method {
                "thread/status/changed"
                | "mcpServer/startupStatus/updated"
                | "remoteControl/status/changed"
                | "account/rateLimits/updated" => out.consumed(),
                _ => unmapped(method, data, out),
            }
            return;
        };
        match method {
            "thread/started" => self.start_from_thread(p.thread, out),
            "turn/started" => {
                if self.started {
                    out.consumed();
                } else {
                    self.start_from_thread(None, out);
                }
            }
            // Operator metadata and lifecycle noise, not content (evidence §8).
            "thread/status/changed"
            | "mcpServer/startupStatus/updated"
            | "remoteControl/status/changed"
            | "account/rateLimits/updated"
            | "item/reasoning/summaryPartAdded" => out.consumed(),
            "thread/tokenUsage/updated" => {
                if let Some(u) = p.token_usage.filter(|u| u.get() != "null") {
                    out.saw_usage();
                    self.usage = Some(Json::from_raw(u));
                }
                out.consumed();
            }
            "item/started" => self.on_item_started(p.item, data, out),
            "item/completed" => self.on_item_completed(p.item, data, out),
            "item/agentMessage/delta" => match (p.item_id.as_deref(), p.delta.as_deref()) {
                (Some(id), Some(d)) if !d.is_empty() => {
                    out.emit(commentary_delta(id, d));
                }
                _ => out.consumed(),
            },
            "item/reasoning/textDelta" | "item/reasoning/summaryTextDelta" => {
                self.on_reasoning_delta(method, &p, out)
            }
            "item/commandExecution/outputDelta" | "item/fileChange/outputDelta" => {
                self.on_output_delta(method, &p, out)
            }
            "rawResponseItem/completed" => self.on_raw_item(&p, out),
            "turn/completed" => self.on_turn_completed(p.turn, out),
            "error" => self.on_error(&p, out),
            _ => unmapped(method, data, out),
        }
    }

    fn on_reasoning_delta(&mut self, method: &str, p: &Params<'_>, out: &mut Emitter) {
        let variant = if method.ends_with("summaryTextDelta") {
            ThinkingVariant::Summary
        } else {
            ThinkingVariant::Raw
        };
        match p.delta.as_deref().filter(|d| !d.is_empty()) {
            Some(d) => {
                let id = p.item_id.as_deref().map(str::to_owned);
                out.emit(Thinking::delta(variant, d.to_owned(), id));
            }
            None => out.consumed(),
        }
    }

    /// Command / file-change output streams as an `item` update of its tool.
    fn on_output_delta(&mut self, method: &str, p: &Params<'_>, out: &mut Emitter) {
        let (Some(id), Some(d)) = (p.item_id.as_deref(), p.delta.as_deref()) else {
            out.consumed();
            return;
        };
        if d.is_empty() {
            out.consumed();
            return;
        }
        let name = self
            .tools
            .iter()
            .find(|(tid, _)| tid == id)
            .map(|(_, n)| n.clone())
            .unwrap_or_else(|| {
                method
                    .strip_prefix("item/")
                    .and_then(|m| m.split('/').next())
                    .unwrap_or("tool")
                    .to_owned()
            });
        out.emit(Item {
            phase: ItemPhase::Update,
            id: Some(id.to_owned()),
            kind: "tool".into(),
            name: Some(name),
            status: Some("in_progress".into()),
            output_delta: Some(d.to_owned()),
            ..Item::default()
        });
    }

    fn on_raw_item(&mut self, p: &Params<'_>, out: &mut Emitter) {
        let item = p.item.and_then(RawItem::parse);
        match (item, p.item) {
            (Some(it), Some(raw)) if it.kind() == "reasoning" => {
                let segment = self.last_reasoning.clone();
                out.transcript(RAW_REASONING_KIND, segment.as_deref(), raw.get());
            }
            // The Responses-item mirror of items already projected: consumed.
            _ => out.consumed(),
        }
    }

    fn on_error(&mut self, p: &Params<'_>, out: &mut Emitter) {
        if p.will_retry == Some(true) {
            // Codex retries on its own: a diagnostic, not the end of the turn.
            out.diagnostic("codex_error_retry", p.error.map(Json::from_raw));
        } else {
            self.die(
                Diagnostic {
                    code: "codex_error".into(),
                    message: p.error.and_then(error_message),
                    detail: p.error.map(Json::from_raw),
                },
                out,
            );
        }
    }

    fn on_item_started(&mut self, raw: Option<&RawValue>, data: &str, out: &mut Emitter) {
        let Some(item) = parse_item::<ThreadItem<'_>>(raw, data, out) else {
            return;
        };
        let id = item.id.as_deref().unwrap_or("").to_owned();
        match item.kind() {
            "agentMessage" => {
                self.flush_pending(out);
                let phase = msg_phase(item.phase.as_deref());
                self.phases.push((id, phase));
                out.consumed();
            }
            "reasoning" => {
                self.last_reasoning = Some(id);
                out.consumed();
            }
            // Input echo and hook-injected input: not agent activity.
            "userMessage" | "hookPrompt" => out.consumed(),
            // Plan text arrives whole at completion (authoritative over its deltas).
            "plan" => out.consumed(),
            kind => {
                self.flush_pending(out);
                self.tools.push((id.clone(), kind.to_owned()));
                out.emit(Item {
                    phase: ItemPhase::Start,
                    id: Some(id),
                    kind: "tool".into(),
                    name: Some(kind.to_owned()),
                    title: item.title(),
                    status: Some("in_progress".into()),
                    input: item.input(),
                    ..Item::default()
                });
            }
        }
    }

    fn on_item_completed(&mut self, raw: Option<&RawValue>, data: &str, out: &mut Emitter) {
        let Some(item) = parse_item::<ThreadItem<'_>>(raw, data, out) else {
            return;
        };
        let id = item.id.as_deref().unwrap_or("").to_owned();
        match item.kind() {
            "agentMessage" => self.message_completed(&item, id, out),
            "reasoning" => {
                reasoning_snapshot(join_parts(item.summary), join_parts(item.content), id, out)
            }
            "userMessage" | "hookPrompt" => out.consumed(),
            "plan" => self.plan_completed(&item, id, raw, out),
            kind => {
                let status = if item.failed() { "failed" } else { "completed" };
                self.tools.retain(|(tid, _)| *tid != id);
                out.emit(Item {
                    phase: ItemPhase::End,
                    id: Some(id),
                    kind: "tool".into(),
                    name: Some(kind.to_owned()),
                    title: item.title(),
                    status: Some(status.into()),
                    input: item.input(),
                    output: item.output(),
                    result: present(item.error),
                    ..Item::default()
                });
            }
        }
    }

    /// A completed plan: a status update carrying the item; its text is kept as the
    /// answer of a turn that ends with no answer-labelled or unlabelled agent message.
    fn plan_completed(
        &mut self,
        item: &ThreadItem<'_>,
        id: String,
        raw: Option<&RawValue>,
        out: &mut Emitter,
    ) {
        out.diagnostic("plan", raw.map(Json::from_raw));
        let text = item.text.as_deref().unwrap_or("");
        if !text.is_empty() {
            self.plan = Some((id, text.to_owned()));
        }
    }

    /// A completed `agentMessage`: commentary settles now, the final answer waits for
    /// the turn, an unlabelled message waits to learn which it was.
    fn message_completed(&mut self, item: &ThreadItem<'_>, id: String, out: &mut Emitter) {
        let phase = match msg_phase(item.phase.as_deref()) {
            MsgPhase::Unlabelled => self
                .phases
                .iter()
                .rev()
                .find(|(pid, _)| *pid == id)
                .map(|(_, p)| *p)
                .unwrap_or(MsgPhase::Unlabelled),
            p => p,
        };
        let text = item.text.as_deref().unwrap_or("").to_owned();
        match phase {
            MsgPhase::Final => {
                if !text.is_empty() {
                    self.final_msg = Some((id, text));
                }
                out.consumed();
            }
            MsgPhase::Commentary => {
                if text.is_empty() {
                    out.consumed();
                } else {
                    out.emit(commentary_snapshot(id, text));
                }
            }
            MsgPhase::Unlabelled => {
                self.flush_pending(out);
                if !text.is_empty() {
                    self.pending = Some((id, text));
                }
                out.consumed();
            }
        }
    }

    /// An unlabelled message followed by more activity was commentary after all.
    fn flush_pending(&mut self, out: &mut Emitter) {
        if let Some((id, text)) = self.pending.take() {
            out.emit(commentary_snapshot(id, text));
        }
    }

    fn on_turn_completed(&mut self, turn: Option<&RawValue>, out: &mut Emitter) {
        let turn = turn.and_then(|t| serde_json::from_str::<Turn<'_>>(t.get()).ok());
        let (status, error) = match &turn {
            Some(t) => (
                t.status.as_deref().unwrap_or("completed"),
                t.error.filter(|e| e.get() != "null"),
            ),
            None => ("completed", None),
        };
        if error.is_some() || status == "failed" {
            self.die(
                Diagnostic {
                    code: "turn_failed".into(),
                    message: error.and_then(error_message),
                    detail: error.map(Json::from_raw),
                },
                out,
            );
            return;
        }
        if status == "interrupted" {
            // Abort (`turn/interrupt`): the Dead path (§3.5).
            self.die(Diagnostic::new("turn_interrupted", None), out);
            return;
        }
        self.terminated = true;
        self.end_tools("completed", out);
        let usage = self.usage.clone();
        if status == "completed" {
            // Finalize: the phase-labelled answer, else (unlabelled servers) the last
            // message by position, else the plan (plan mode split the whole reply into
            // it). Zero text → no final answer.
            let answer = self
                .final_msg
                .take()
                .or_else(|| self.pending.take())
                .or_else(|| self.plan.take());
            if let Some((id, text)) = answer {
                out.emit(final_answer(&id, &text, false));
            }
            Path::Finalize(StopReason::Completed).emit(usage, None, out);
        } else {
            self.flush_pending(out);
            Path::Incomplete(Some(StopReason::Other(status.to_owned()))).emit(usage, None, out);
        }
    }

    fn die(&mut self, diagnostic: Diagnostic, out: &mut Emitter) {
        self.terminated = true;
        self.end_tools("failed", out);
        Path::Dead(StopReason::Error).emit(self.usage.clone(), Some(diagnostic), out);
    }

    fn end_tools(&mut self, status: &str, out: &mut Emitter) {
        end_open_tools(&mut self.tools, status, out);
    }
}

/// A notification the adapter does not read: `model/rerouted` is the spec's
/// `model_fallback` diagnostic (detail = its params: from/to model and reason); other
/// documented methods are `unsupported_frame`; anything else is an `unknown_frame`.
fn unmapped(method: &str, data: &str, out: &mut Emitter) {
    if method == "model/rerouted" {
        #[derive(Deserialize)]
        struct RawParams<'a> {
            #[serde(borrow, default)]
            params: Option<&'a RawValue>,
        }
        let params = serde_json::from_str::<RawParams<'_>>(data)
            .ok()
            .and_then(|m| present(m.params));
        out.diagnostic("model_fallback", params);
    } else if UNMAPPED_NOTIFICATIONS.contains(&method) {
        unsupported(out, method);
    } else {
        out.unknown_frame(method, data);
    }
}

/// A completed reasoning item as thinking snapshots (summary, then raw); an item with
/// neither (encrypted-only) is a content-free `redacted` marker (§3.2).
pub(crate) fn reasoning_snapshot(summary: String, content: String, id: String, out: &mut Emitter) {
    let mut sid = Some(id);
    if summary.is_empty() && content.is_empty() {
        // Encrypted-only under OAuth: a content-free marker (§3.2).
        out.emit(Thinking {
            id: sid,
            variant: ThinkingVariant::Redacted,
            phase: None,
            delta: None,
            text: None,
            tokens: None,
        });
        return;
    }
    // The id is copied only when both texts go out: a copy each time was an allocation
    // and a free per reasoning item (callgrind).
    let both = !summary.is_empty() && !content.is_empty();
    for (variant, text) in [
        (ThinkingVariant::Summary, summary),
        (ThinkingVariant::Raw, content),
    ] {
        if !text.is_empty() {
            let id = if both && variant == ThinkingVariant::Summary {
                sid.clone()
            } else {
                sid.take()
            };
            out.emit(Thinking {
                id,
                variant,
                phase: None,
                delta: None,
                text: Some(text),
                tokens: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::adapter::Family;

    fn run(lines: &[&str]) -> Vec<serde_json::Value> {
        super::super::run_lines(Family::CodexAppServer, lines)
    }

    /// What the template reading and the generic reading make of `line`: `None` when the
    /// template leaves it to the generic reading, else both readings' method and params.
    fn both_readings(line: &str) -> Option<(String, String)> {
        let (method, params) = super::hot_delta(line)?;
        let generic = serde_json::from_str::<super::Message<'_>>(line).expect(line);
        assert!(generic.id.is_none(), "{line}");
        let generic = (generic.method.unwrap(), generic.params.unwrap());
        Some((
            format!("{method} {params:?}"),
            format!("{} {:?}", generic.0, generic.1),
        ))
    }

    /// Agent message and reasoning deltas read by their exact template become the method
    /// and params the generic reading makes of them; every other shape is left to it.
    #[test]
    fn deltas_read_by_template_are_read_as_serde_reads_them() {
        let note = |method: &str, rest: &str| {
            format!(
                r#"{{"method":"{method}","params":{{"threadId":"t","turnId":"u","itemId":"i","delta":{rest}}}}}"#
            )
        };
        for line in [
            note("item/agentMessage/delta", r#""391""#),
            note("item/agentMessage/delta", r#""\"q\" \\ \n \ud83d\ude00""#),
            note("item/reasoning/textDelta", r#""a","contentIndex":0"#),
            note("item/reasoning/summaryTextDelta", r#""","summaryIndex":12"#),
            note("item/reasoning/summaryTextDelta", r#""b""#),
        ] {
            let (hot, generic) = both_readings(&line).expect(&line);
            assert_eq!(hot, generic, "{line}");
        }
        for line in [
            note("item/agentMessage/delta", r#""a","contentIndex":0"#),
            note("item/reasoning/textDelta", r#""a","contentIndex":-1"#),
            note("item/reasoning/textDelta", r#""a","contentIndex":"0""#),
            note("item/commandExecution/outputDelta", r#""a""#),
            note("item/agentMessage/delta", "null"),
            note("item/agentMessage/delta", r#""a","x":1"#),
            r#"{"id":1,"method":"item/agentMessage/delta","params":{"threadId":"t","turnId":"u","itemId":"i","delta":"a"}}"#.into(),
            r#"{"method":"item/agentMessage/delta","params":{"threadId":null,"turnId":"u","itemId":"i","delta":"a"}}"#.into(),
            r#"{"method":"item/agentMessage/delta","params":{"threadId":"t","turnId":"u","itemId":"i","delta":"a"}} "#.into(),
            r#"{"method":"item/agentMessage/deltas","params":{"threadId":"t","turnId":"u","itemId":"i","delta":"a"}}"#.into(),
        ] {
            assert_eq!(both_readings(&line), None, "{line}");
        }
    }

    const FINAL_STARTED: &str = r#"{"method":"item/started","params":{"item":{"type":"agentMessage","id":"m","text":"","phase":"final_answer"}}}"#;
    const FINAL_DONE: &str = r#"{"method":"item/completed","params":{"item":{"type":"agentMessage","id":"m","text":"42","phase":"final_answer"}}}"#;

    #[test]
    fn final_answer_waits_for_a_completed_turn() {
        let ev = run(&[
            FINAL_STARTED,
            FINAL_DONE,
            r#"{"method":"turn/completed","params":{"turn":{"status":"completed","error":null}}}"#,
        ]);
        assert_eq!(ev[0]["data"]["phase"], "final_answer");
        assert_eq!(ev[0]["data"]["text"], "42");
    }

    #[test]
    fn a_failed_turn_never_releases_the_final_answer() {
        let ev = run(&[
            FINAL_STARTED,
            FINAL_DONE,
            r#"{"method":"turn/completed","params":{"turn":{"status":"failed","error":{"message":"x"}}}}"#,
        ]);
        assert!(ev.iter().all(|e| e["data"]["phase"] != "final_answer"));
        assert_eq!(ev.last().unwrap()["data"]["phase"], "error");
    }

    const TURN_DONE: &str =
        r#"{"method":"turn/completed","params":{"turn":{"status":"completed","error":null}}}"#;

    #[test]
    fn hook_prompts_are_input_and_plans_are_status_updates() {
        let ev = run(&[
            r#"{"method":"item/started","params":{"item":{"type":"hookPrompt","id":"h","fragments":[{"text":"again","hookRunId":"r"}]}}}"#,
            r#"{"method":"item/completed","params":{"item":{"type":"hookPrompt","id":"h","fragments":[{"text":"again","hookRunId":"r"}]}}}"#,
            r#"{"method":"item/started","params":{"item":{"type":"plan","id":"p","text":""}}}"#,
            r#"{"method":"item/completed","params":{"item":{"type":"plan","id":"p","text":"1. Do it"}}}"#,
            FINAL_STARTED,
            FINAL_DONE,
            TURN_DONE,
        ]);
        assert!(ev.iter().all(|e| e["stream"] != "item"));
        assert_eq!(ev[0]["data"]["diagnostic"]["code"], "plan");
        // An answer-labelled message is the answer; the plan is not.
        assert_eq!(ev[1]["data"]["phase"], "final_answer");
        assert_eq!(ev[1]["data"]["text"], "42");
    }

    #[test]
    fn a_failed_mcp_call_keeps_its_error_and_an_image_only_its_size() {
        let ev = run(&[
            r#"{"method":"item/completed","params":{"item":{"type":"mcpToolCall","id":"c","server":"s","tool":"t","status":"failed","arguments":{},"result":null,"error":{"message":"boom"}}}}"#,
            r#"{"method":"item/completed","params":{"item":{"type":"imageGeneration","id":"i","status":"completed","revisedPrompt":null,"result":"QUJDRA=="}}}"#,
            TURN_DONE,
        ]);
        assert_eq!(ev[0]["data"]["title"], "s/t");
        assert_eq!(ev[0]["data"]["status"], "failed");
        assert_eq!(ev[0]["data"]["result"]["message"], "boom");
        assert_eq!(
            ev[1]["data"]["output"],
            serde_json::json!({"resultBytes": 8})
        );
        assert!(!ev[1].to_string().contains("QUJDRA=="));
    }

    #[test]
    fn documented_notifications_are_unsupported_and_a_reroute_is_a_fallback() {
        let ev = run(&[
            r#"{"method":"thread/compacted","params":{"threadId":"t","turnId":"u"}}"#,
            r#"{"method":"model/rerouted","params":{"fromModel":"a","toModel":"b","reason":"capacity"}}"#,
            r#"{"method":"thread/teleported","params":{}}"#,
            TURN_DONE,
        ]);
        assert_eq!(ev[0]["data"]["diagnostic"]["code"], "unsupported_frame");
        assert_eq!(ev[0]["data"]["diagnostic"]["detail"], "thread/compacted");
        assert_eq!(ev[1]["data"]["diagnostic"]["code"], "model_fallback");
        assert_eq!(ev[1]["data"]["diagnostic"]["detail"]["toModel"], "b");
        assert_eq!(ev[2]["data"]["diagnostic"]["code"], "unknown_frame");
    }

    #[test]
    fn a_retrying_error_is_not_terminal() {
        let ev = run(&[
            r#"{"method":"error","params":{"error":{"message":"retry"},"willRetry":true}}"#,
            FINAL_STARTED,
            FINAL_DONE,
            r#"{"method":"turn/completed","params":{"turn":{"status":"completed"}}}"#,
        ]);
        assert_eq!(ev[0]["data"]["diagnostic"]["code"], "codex_error_retry");
        assert_eq!(ev.last().unwrap()["data"]["reason"], "completed");
    }
}

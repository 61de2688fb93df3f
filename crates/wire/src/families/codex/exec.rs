//! `codex exec --json` JSONL (`codex-exec`): one thread event per line.
//!
//! The headless sibling of the app-server envelope ([`super::app_server`]), flattened:
//! `thread.started {thread_id}`, `turn.started`, `item.started|item.updated|
//! item.completed {item}`, `turn.completed {usage}`, `turn.failed {error}`, and a
//! top-level `error {message}` (unrecoverable). Items are snake_case
//! (`agent_message`, `reasoning`, `command_execution`, `file_change`, `mcp_tool_call`,
//! `web_search`, `todo_list`, `error`) and carry no text deltas: an agent message arrives
//! whole at `item.completed`.
//!
//! Mapping (spec §6, as the app-server family):
//! - `thread.started` → `lifecycle/start` (provider `openai`, id = thread id).
//! - `agent_message` completed → a `commentary` snapshot at once (nothing waits for a
//!   later frame); the LAST agent message of the turn is re-tagged as the final answer
//!   (same id) at `turn.completed` — codex exec's own "last message" rule, and §3.5
//!   Finalize. A turn with no agent message ends with `lifecycle/end` alone.
//! - `reasoning` completed → a `summary` thinking snapshot (an empty one is a redacted
//!   marker, §3.2).
//! - tool-like items → `item` start / update / end, `kind:"tool"`, `name` = item type;
//!   `failed`/`declined` status, a non-zero exit code or an `error` make the end
//!   `failed`.
//! - `error` item: non-fatal, a `codex_error_item` diagnostic.
//! - `plan` item (plan mode's `<proposed_plan>` block, split out of the agent's message):
//!   at completion a kind-coded `plan` diagnostic, detail = the item verbatim (a status
//!   update, like ACP's `plan`). A turn that completes with no agent message releases the
//!   last plan's text as the final answer: codex exec's own last-message rule falls back
//!   to the plan when the turn has no agent message.
//! - Unknown item types → an `unknown_item_type` diagnostic (type tag only), never a
//!   panic or a silent drop; `item.plan.delta` / `request_user_input` →
//!   `unsupported_frame`.
//!
//! Finality (§3.5, via [`crate::families::finality`]): `turn.completed` → Finalize;
//! `turn.failed` and top-level `error` → Dead; a stream that ends before either →
//! `stream_closed` (Dead). Frames after the terminal one are documented drops.

use super::app_server::reasoning_snapshot;
use super::{commentary_snapshot, error_message, parse_item};
use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::finality::{stream_closed, Path};
use crate::families::response_items::{final_answer, unsupported};
use crate::families::tools::{end_open_tools, present};
use crate::framing::Frame;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Diagnostic, Item, ItemPhase, Json, Lifecycle, LifecyclePhase, StopReason,
};

/// One JSONL line: every top-level field the adapter reads.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thread_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

/// A thread item (`exec_events.rs` `ThreadItem`, flattened details).
#[derive(Debug, Default, Deserialize)]
struct ExecItem<'a> {
    #[serde(borrow, rename = "type", default)]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    command: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    aggregated_output: Option<&'a RawValue>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(borrow, default)]
    changes: Option<&'a RawValue>,
    #[serde(borrow, default)]
    server: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    query: Option<&'a RawValue>,
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
}

/// The line nearly every long run is made of — a completed reasoning or agent message
/// item as codex writes it — read by its exact template ([`exact_frame`]) into the item
/// the generic reading makes of it; `None` for any other line, which is then read the
/// generic way (docs/performance.md has the measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
fn hot_item(data: &str) -> Option<ExecItem<'_>> {
    let mut c = Cursor::new(data);
    c.literal(r#"{"type":"item.completed","item":{"id":"#)?;
    let id = c.string()?;
    let kind = c.one_of([
        r#","type":"reasoning","text":"#,
        r#","type":"agent_message","text":"#,
    ])?;
    let text = c.string()?;
    c.literal("}}")?;
    c.end()?;
    Some(ExecItem {
        ty: Some(Cow::Borrowed(["reasoning", "agent_message"][kind])),
        id: Some(id),
        text: Some(text),
        ..ExecItem::default()
    })
}

/// Keeps `(id, text)` as the latest candidate in `slot`, in the strings it already holds:
/// a long run is message after message, and a fresh pair for each was two allocations
/// and two frees a line (callgrind).
fn remember(slot: &mut Option<(String, String)>, id: &str, text: &str) {
    let (last_id, last_text) = slot.get_or_insert_with(Default::default);
    last_id.clear();
    last_id.push_str(id);
    last_text.clear();
    last_text.push_str(text);
}

/// Item types that become `item` rows.
const TOOL_TYPES: [&str; 5] = [
    "command_execution",
    "file_change",
    "mcp_tool_call",
    "web_search",
    "todo_list",
];

impl ExecItem<'_> {
    fn kind(&self) -> &str {
        self.ty.as_deref().unwrap_or("")
    }

    /// What the item was asked to do (a to-do list's items at its start).
    fn input(&self) -> Option<Json> {
        if let Some(c) = self.command.as_deref() {
            return Some(Json::string(c));
        }
        [self.changes, self.arguments, self.query, self.items]
            .into_iter()
            .find_map(present)
    }

    /// What it produced.
    fn output(&self) -> Option<Json> {
        [self.aggregated_output, self.result, self.items]
            .into_iter()
            .find_map(present)
    }

    /// `server/tool` for MCP calls.
    fn title(&self) -> Option<String> {
        match (self.server.as_deref(), self.tool.as_deref()) {
            (Some(s), Some(t)) => Some(format!("{s}/{t}")),
            (None, Some(t)) => Some(t.to_owned()),
            _ => None,
        }
    }

    fn failed(&self) -> bool {
        matches!(self.status.as_deref(), Some("failed" | "declined"))
            || self.exit_code.is_some_and(|c| c != 0)
            || present(self.error).is_some()
    }

    fn row(&self, phase: ItemPhase, status: &str) -> Item {
        Item {
            phase,
            id: self.id.as_deref().map(str::to_owned),
            kind: "tool".into(),
            name: Some(self.kind().to_owned()),
            title: self.title(),
            status: Some(status.into()),
            input: self.input(),
            ..Item::default()
        }
    }
}

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct CodexExecAdapter {
    started: bool,
    terminated: bool,
    /// The turn's latest agent message (id, text): the final-answer candidate.
    last_message: Option<(String, String)>,
    /// The turn's latest plan (id, text): the final answer when no agent message came.
    last_plan: Option<(String, String)>,
    /// Tool rows started and not yet ended (id, name).
    tools: Vec<(String, String)>,
    /// Agent messages without an id get a positional one.
    messages: u64,
}

impl Adapter for CodexExecAdapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.terminated {
            // Nothing may follow the terminal event (I7): a documented drop.
            out.consumed();
            return;
        }
        if let Some(item) = hot_item(frame.data) {
            // The item's raw text is read only for plan and error items, which the
            // template never matches.
            self.on_parsed_item("item.completed", &item, None, out);
            return;
        }
        let Ok(line) = serde_json::from_str::<Line<'_>>(frame.data) else {
            out.malformed_frame(frame.data);
            return;
        };
        let ty = line.ty.as_deref().unwrap_or("");
        match ty {
            "thread.started" => self.start(line.thread_id.as_deref(), out),
            "turn.started" => {
                if self.started {
                    out.consumed();
                } else {
                    self.start(None, out);
                }
            }
            "item.started" | "item.updated" | "item.completed" => {
                self.on_item(ty, line.item, frame.data, out)
            }
            "turn.completed" => self.on_turn_completed(line.usage, out),
            "turn.failed" => self.die("turn_failed", line.error, None, out),
            "error" => self.die("codex_error", None, line.message.as_deref(), out),
            "item.plan.delta" | "request_user_input" => unsupported(out, ty),
            _ => {
                out.unknown_frame(ty, frame.data);
            }
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.terminated {
            return;
        }
        // No turn.completed / turn.failed: stream death, nothing becomes final.
        self.terminated = true;
        self.end_tools("failed", out);
        stream_closed(out);
    }
}

impl CodexExecAdapter {
    fn start(&mut self, thread_id: Option<&str>, out: &mut Emitter) {
        if self.started {
            out.consumed();
            return;
        }
        self.started = true;
        out.emit(Lifecycle {
            provider: Some("openai".into()),
            id: thread_id.map(str::to_owned),
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    fn on_item(&mut self, ty: &str, raw: Option<&RawValue>, data: &str, out: &mut Emitter) {
        let Some(item) = parse_item::<ExecItem<'_>>(raw, data, out) else {
            return;
        };
        self.on_parsed_item(ty, &item, raw, out);
    }

    fn on_parsed_item(
        &mut self,
        ty: &str,
        item: &ExecItem<'_>,
        raw: Option<&RawValue>,
        out: &mut Emitter,
    ) {
        let completed = ty == "item.completed";
        match item.kind() {
            "agent_message" if completed => self.message_completed(item, out),
            "reasoning" if completed => {
                let text = item.text.as_deref().unwrap_or("").to_owned();
                let id = item.id.as_deref().unwrap_or("").to_owned();
                reasoning_snapshot(text, String::new(), id, out);
            }
            "plan" if completed => self.plan_completed(item, raw, out),
            // Whole text only arrives at completion; earlier states carry nothing new.
            "agent_message" | "reasoning" | "plan" => out.consumed(),
            "error" => {
                out.diagnostic("codex_error_item", raw.map(Json::from_raw));
            }
            kind if TOOL_TYPES.contains(&kind) => match ty {
                "item.started" => self.tool_started(item, out),
                "item.updated" => self.tool_updated(item, out),
                _ => self.tool_completed(item, out),
            },
            kind => {
                out.diagnostic("unknown_item_type", Some(Json::string(kind)));
            }
        }
    }

    fn message_completed(&mut self, item: &ExecItem<'_>, out: &mut Emitter) {
        self.messages += 1;
        let id = match item.id.as_deref() {
            Some(id) => id.to_owned(),
            None => format!("msg_{}", self.messages),
        };
        let text = item.text.as_deref().unwrap_or("");
        if text.is_empty() {
            out.consumed();
            return;
        }
        remember(&mut self.last_message, &id, text);
        out.emit(commentary_snapshot(id, text.to_owned()));
    }

    /// A completed plan: a status update carrying the item; its text is kept as the
    /// fallback answer of a turn without agent messages.
    fn plan_completed(&mut self, item: &ExecItem<'_>, raw: Option<&RawValue>, out: &mut Emitter) {
        out.diagnostic("plan", raw.map(Json::from_raw));
        let text = item.text.as_deref().unwrap_or("");
        if !text.is_empty() {
            remember(
                &mut self.last_plan,
                item.id.as_deref().unwrap_or("plan"),
                text,
            );
        }
    }

    fn tool_started(&mut self, item: &ExecItem<'_>, out: &mut Emitter) {
        let id = item.id.as_deref().unwrap_or("").to_owned();
        if !self.tools.iter().any(|(tid, _)| *tid == id) {
            self.tools.push((id, item.kind().to_owned()));
        }
        out.emit(item.row(ItemPhase::Start, "in_progress"));
    }

    fn tool_updated(&mut self, item: &ExecItem<'_>, out: &mut Emitter) {
        out.emit(Item {
            input: None,
            output: item.output(),
            ..item.row(ItemPhase::Update, "in_progress")
        });
    }

    fn tool_completed(&mut self, item: &ExecItem<'_>, out: &mut Emitter) {
        let id = item.id.as_deref().unwrap_or("");
        self.tools.retain(|(tid, _)| tid != id);
        let status = if item.failed() { "failed" } else { "completed" };
        out.emit(Item {
            output: item.output(),
            result: present(item.error),
            ..item.row(ItemPhase::End, status)
        });
    }

    fn on_turn_completed(&mut self, usage: Option<&RawValue>, out: &mut Emitter) {
        self.terminated = true;
        let usage = present(usage);
        if usage.is_some() {
            out.saw_usage();
        }
        self.end_tools("completed", out);
        let path = Path::Finalize(StopReason::Completed);
        if let Some(truncated) = path.final_answer() {
            // The last agent message, else the last plan; neither: no final answer.
            let answer = self.last_message.take().or_else(|| self.last_plan.take());
            if let Some((id, text)) = answer {
                out.emit(final_answer(&id, &text, truncated));
            }
        }
        path.emit(usage, None, out);
    }

    /// Dead path (`turn.failed`, top-level `error`): open tools fail, no final answer.
    fn die(
        &mut self,
        code: &str,
        error: Option<&RawValue>,
        message: Option<&str>,
        out: &mut Emitter,
    ) {
        self.terminated = true;
        self.end_tools("failed", out);
        let error = error.filter(|e| e.get() != "null");
        let message = message
            .map(str::to_owned)
            .or_else(|| error.and_then(error_message));
        let diagnostic = Diagnostic {
            code: code.into(),
            message,
            detail: error.map(Json::from_raw),
        };
        Path::Dead(StopReason::Error).emit(None, Some(diagnostic), out);
    }

    fn end_tools(&mut self, status: &str, out: &mut Emitter) {
        end_open_tools(&mut self.tools, status, out);
    }
}

#[cfg(test)]
mod tests {
    use crate::adapter::Family;
    use crate::normalizer::normalize_bytes;

    fn run(lines: &[&str]) -> Vec<serde_json::Value> {
        super::super::run_lines(Family::CodexExec, lines)
    }

    /// What the template reading and the generic reading make of `line`: `None` when the
    /// template leaves it to the generic reading, else both readings' `Debug` text.
    fn both_readings(line: &str) -> Option<(String, String)> {
        let hot = super::hot_item(line)?;
        let generic = serde_json::from_str::<super::Line<'_>>(line).expect(line);
        assert_eq!(generic.ty.as_deref(), Some("item.completed"));
        let item: super::ExecItem<'_> = serde_json::from_str(generic.item.unwrap().get()).unwrap();
        Some((format!("{hot:?}"), format!("{item:?}")))
    }

    /// Completed reasoning and agent messages read by their exact template become the item
    /// the generic reading makes of them; every other shape is left to the generic reading.
    #[test]
    fn completed_items_read_by_template_are_read_as_serde_reads_them() {
        let item = |id: &str, kind: &str, text: &str| {
            format!(
                r#"{{"type":"item.completed","item":{{"id":{id},"type":"{kind}","text":{text}}}}}"#
            )
        };
        for line in [
            item(r#""item_0""#, "reasoning", r#""**Reading**""#),
            item(r#""item_1""#, "agent_message", r#""""#),
            item(
                r#""i\u0031""#,
                "agent_message",
                r#""\"q\" \\ \n \ud83d\ude00""#,
            ),
        ] {
            let (hot, generic) = both_readings(&line).expect(&line);
            assert_eq!(hot, generic, "{line}");
        }
        for line in [
            item("null", "reasoning", r#""a""#),
            item(r#""i""#, "reasoning", "null"),
            item(r#""i""#, "plan", r#""a""#),
            item(r#""i""#, "command_execution", r#""a""#),
            item(r#""i""#, "reasoning", "\"raw\ttab\""),
            r#"{"type":"item.started","item":{"id":"i","type":"reasoning","text":"a"}}"#.into(),
            r#"{"type":"item.completed","item":{"id":"i","type":"reasoning","text":"a","status":"x"}}"#.into(),
            r#"{"type":"item.completed","item":{"type":"reasoning","id":"i","text":"a"}}"#.into(),
            r#"{"type":"item.completed","item":{"id":"i","type":"reasoning","text":"a"}} "#.into(),
            r#"{"type":"item.completed","item":{"id":"i","type":"reasoning","text":"a"},"x":1}"#.into(),
        ] {
            assert_eq!(both_readings(&line), None, "{line}");
        }
    }

    #[test]
    fn the_last_agent_message_is_the_answer() {
        let ev = run(&[
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            r#"{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"Looking."}}"#,
            r#"{"type":"item.completed","item":{"id":"i1","type":"agent_message","text":"Done."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":1,"cached_input_tokens":0,"output_tokens":2}}"#,
        ]);
        let finals: Vec<_> = ev
            .iter()
            .filter(|e| e["data"]["phase"] == "final_answer")
            .collect();
        assert_eq!(finals.len(), 1);
        assert_eq!(finals[0]["data"]["text"], "Done.");
        assert_eq!(finals[0]["data"]["id"], "i1");
    }

    #[test]
    fn a_plan_is_a_status_update_and_the_answer_only_without_agent_messages() {
        let plan =
            r#"{"type":"item.completed","item":{"id":"p1","type":"plan","text":"1. Do it"}}"#;
        let done = r#"{"type":"turn.completed","usage":null}"#;
        let msg = r#"{"type":"item.completed","item":{"id":"m1","type":"agent_message","text":"Plan ready."}}"#;
        let ev = run(&[plan, msg, done]);
        assert_eq!(ev[0]["data"]["diagnostic"]["code"], "plan");
        assert_eq!(ev[0]["data"]["diagnostic"]["detail"]["text"], "1. Do it");
        let finals: Vec<_> = ev
            .iter()
            .filter(|e| e["data"]["phase"] == "final_answer")
            .collect();
        assert_eq!(finals.len(), 1);
        assert_eq!(finals[0]["data"]["id"], "m1");
        let ev = run(&[plan, done]);
        assert_eq!(ev[1]["data"]["phase"], "final_answer");
        assert_eq!(ev[1]["data"]["text"], "1. Do it");
    }

    #[test]
    fn an_unknown_item_type_is_a_diagnostic() {
        let ev = run(&[
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            r#"{"type":"item.started","item":{"id":"x","type":"hologram"}}"#,
        ]);
        assert_eq!(ev[1]["data"]["diagnostic"]["code"], "unknown_item_type");
        assert_eq!(ev.last().unwrap()["data"]["reason"], "stream_closed");
    }

    #[test]
    fn auto_detects_codex_exec_from_its_first_line() {
        use crate::adapter::FamilyChoice;
        use crate::detect::sniff;
        use crate::framing::Frame;
        let line = r#"{"type":"thread.started","thread_id":"t1"}"#;
        let frame = Frame {
            event: None,
            data: line,
        };
        assert_eq!(sniff(&frame), Some(Family::CodexExec));
        let text = format!("{line}\n{}\n", r#"{"type":"turn.completed","usage":null}"#);
        let n = normalize_bytes(FamilyChoice::Auto, text.as_bytes(), 0);
        assert_eq!(n.events.len(), 2);
    }

    #[test]
    fn auto_detects_codex_exec_from_a_leading_error_line() {
        use crate::adapter::FamilyChoice;
        // codex exec fails before the thread starts (bad config, no auth): its first
        // and only line is the top-level error, which is not Anthropic's SSE error.
        let text = "{\"type\":\"error\",\"message\":\"unexpected status 401\"}\n";
        let n = normalize_bytes(FamilyChoice::Auto, text.as_bytes(), 0);
        assert_eq!(n.family, Some(Family::CodexExec));
        let last: serde_json::Value =
            serde_json::from_str(&n.events.last().unwrap().to_json()).unwrap();
        assert_eq!(last["data"]["diagnostic"]["code"], "codex_error");
        assert_eq!(
            last["data"]["diagnostic"]["message"],
            "unexpected status 401"
        );
    }
}

//! claude-cli stream-json: a JSONL envelope over F1 (spec §6 F1e column).
//!
//! Inner `stream_event` frames run through the shared F1 [`MessageMachine`]; the envelope
//! owns the run: `system/init` starts it, `result` ends it. Per the single-final-source
//! rule (spec §3.5), inner text is progress only and `result.result` is the final reply —
//! streamed text is the fallback only when `result.result` is missing or unusable.
//! claude-cli runs tools itself, so a tool call's item ends when its `tool_result`
//! arrives in a `user` frame.

use super::messages::{
    delta_template, dispatch, emit_error, error_diagnostic, settle, Block, MachineOptions,
    MessageMachine, Step, TemplateDelta, WireEvent, REDACTED_KIND,
};
use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::final_text::FinalText;
use crate::families::finality::{stream_closed, Path};
use crate::framing::Frame;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Assistant, AssistantPhase, Item, ItemPhase, Json, Lifecycle, LifecyclePhase, SegmentPhase,
    SegmentStatus, StopReason, Thinking, ThinkingVariant,
};

/// Transcript kind for thinking signatures found in `assistant` snapshot frames.
pub const SNAPSHOT_SIGNATURE_KIND: &str = "claude_cli_snapshot_signature";

/// One stream-json line, flat over every frame type (parsed once, borrowing).
#[derive(Debug, Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    ty: Cow<'a, str>,
    #[serde(default, borrow)]
    subtype: Option<Cow<'a, str>>,
    /// `stream_event`: the raw Anthropic event.
    #[serde(default, borrow)]
    event: Option<WireEvent<'a>>,
    /// `assistant` / `user` snapshot message, parsed only for those frames.
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
    #[serde(default, borrow)]
    session_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    cwd: Option<&'a RawValue>,
    #[serde(default, borrow)]
    claude_code_version: Option<&'a RawValue>,
    #[serde(default, rename = "permissionMode", borrow)]
    permission_mode: Option<&'a RawValue>,
    #[serde(default, borrow)]
    status: Option<&'a RawValue>,
    #[serde(default, borrow)]
    rate_limit_info: Option<&'a RawValue>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    api_error_status: Option<&'a RawValue>,
    #[serde(default, borrow)]
    terminal_reason: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// The line nearly every long run is made of — a `stream_event` holding a text,
/// thinking or tool-argument delta, as the CLI writes it — read by its exact template
/// ([`exact_frame`], the inner event by [`delta_template`]) into the block index and
/// delta the generic reading makes of it ([`TemplateDelta`]; its session id, read only
/// when a message starts, left out); `None` for any other line, which is then read the
/// generic way (docs/performance.md has the measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
fn hot_stream_delta(data: &str) -> Option<TemplateDelta<'_>> {
    let mut c = Cursor::new(data);
    c.literal(r#"{"type":"stream_event","event":"#)?;
    let delta = delta_template(&mut c)?;
    c.literal(r#","session_id":"#)?;
    c.string()?;
    c.literal(r#","parent_tool_use_id":null"#)?;
    if c.literal(r#","uuid":"#).is_some() {
        c.string()?;
    }
    c.literal("}")?;
    c.whitespace();
    c.end()?;
    Some(delta)
}

/// The `message` of an `assistant`/`user` frame (content kept raw: `user` content may be
/// a plain string).
#[derive(Debug, Deserialize)]
struct Snapshot<'a> {
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

/// `lifecycle/start` diagnostic detail: the init fields a run record needs.
#[derive(Serialize)]
struct InitDetail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claude_code_version: Option<&'a RawValue>,
    #[serde(rename = "permissionMode", skip_serializing_if = "Option::is_none")]
    permission_mode: Option<&'a RawValue>,
}

/// Detail of a failed `result`.
#[derive(Serialize)]
struct ResultErrorDetail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    subtype: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_error_status: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    terminal_reason: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<&'a str>,
}

/// Adapter state for one run.
#[derive(Debug)]
pub struct F1eAdapter {
    inner: MessageMachine,
    started: bool,
    done: bool,
    /// Some `stream_event` arrived: snapshots are then reconstruction-only (spec §6: no
    /// bus re-emission when deltas are present).
    saw_stream: bool,
    /// Snapshot-only runs: trailing text of the snapshots, the fallback final source.
    snapshot_text: FinalText,
}

impl Default for F1eAdapter {
    fn default() -> F1eAdapter {
        F1eAdapter {
            inner: MessageMachine::new(MachineOptions {
                defer_client_tools: true,
            }),
            started: false,
            done: false,
            saw_stream: false,
            snapshot_text: FinalText::default(),
        }
    }
}

impl Adapter for F1eAdapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.done {
            // Nothing may follow the terminal event (I7): a documented drop.
            out.consumed();
            return;
        }
        if let Some(hot) = hot_stream_delta(frame.data) {
            // What `stream_event` does with a content_block_delta, without the line.
            self.saw_stream = true;
            let index = hot.index;
            self.inner
                .content_delta(index, &hot.delta(), frame.data, out);
            return;
        }
        let line: Line<'_> = match serde_json::from_str(frame.data) {
            Ok(l) => l,
            Err(_) => {
                out.malformed_frame(frame.data);
                return;
            }
        };
        match line.ty.as_ref() {
            "system" => self.system(&line, frame.data, out),
            "rate_limit_event" => {
                out.diagnostic("rate_limit_event", line.rate_limit_info.map(Json::from_raw));
            }
            "stream_event" => self.stream_event(&line, frame.data, out),
            "assistant" => self.assistant(&line, out),
            "user" => self.user(&line, out),
            "result" => self.result(&line, out),
            "error" => {
                // A CLI-level failure outside any message: the Dead path.
                self.done = true;
                self.inner.close_all("failed", out);
                emit_error(line.error, self.inner.usage().cloned(), out);
            }
            "control_request" | "control_response" => {
                // Spec §6: native permission handshake, Phase-1 out of scope.
                out.diagnostic("unsupported_frame", Some(Json::string(&line.ty)));
            }
            other => {
                out.unknown_frame(other, frame.data);
            }
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.done {
            return;
        }
        self.done = true;
        // No `result`: stream death, no final answer from either source.
        self.inner.close_all("failed", out);
        stream_closed(out);
    }
}

impl F1eAdapter {
    fn system(&mut self, line: &Line<'_>, raw: &str, out: &mut Emitter) {
        match line.subtype.as_deref() {
            Some("init") => {
                let detail = InitDetail {
                    cwd: line.cwd,
                    claude_code_version: line.claude_code_version,
                    permission_mode: line.permission_mode,
                };
                let diagnostic = streamgate_grammar::Diagnostic::new(
                    "claude_cli_init",
                    Some(Json::from_value(&detail)),
                );
                if self.started {
                    out.emit(Lifecycle {
                        diagnostic: Some(diagnostic),
                        ..Lifecycle::new(LifecyclePhase::Update)
                    });
                    return;
                }
                self.started = true;
                out.emit(Lifecycle {
                    provider: Some("claude-cli".to_owned()),
                    model: line.model.as_deref().map(str::to_owned),
                    id: line.session_id.as_deref().map(str::to_owned),
                    diagnostic: Some(diagnostic),
                    ..Lifecycle::new(LifecyclePhase::Start)
                });
            }
            Some("status") => {
                let detail = line
                    .status
                    .map(|s| Json::from_value(&serde_json::json!({ "status": s })));
                out.diagnostic("claude_cli_status", detail);
            }
            _ => {
                out.unknown_frame("system", raw);
            }
        }
    }

    fn stream_event(&mut self, line: &Line<'_>, raw: &str, out: &mut Emitter) {
        let Some(ev) = &line.event else {
            out.unknown_frame("stream_event", raw);
            return;
        };
        self.saw_stream = true;
        match self.inner.handle(ev, raw, out) {
            Step::Done => {}
            Step::Start(head) => {
                if self.started {
                    out.consumed();
                    return;
                }
                // No `system/init` seen: start the run from the inner message.
                self.started = true;
                out.emit(Lifecycle {
                    provider: Some("claude-cli".to_owned()),
                    model: head.model.as_deref().map(str::to_owned),
                    id: line
                        .session_id
                        .as_deref()
                        .or(head.id.as_deref())
                        .map(str::to_owned),
                    ..Lifecycle::new(LifecyclePhase::Start)
                });
            }
            // One model message is over; the run ends with `result`.
            Step::Stop => out.consumed(),
            // The CLI may retry; `result.is_error` decides the run's fate (spec §6 F1e).
            Step::Error(body) => {
                out.emit(Lifecycle {
                    diagnostic: Some(error_diagnostic(body)),
                    ..Lifecycle::new(LifecyclePhase::Update)
                });
            }
        }
    }

    fn snapshot_blocks<'a>(line: &Line<'a>) -> Option<Vec<Block<'a>>> {
        Some(
            Self::snapshot_raw_blocks(line)?
                .into_iter()
                .map(|(block, _)| block)
                .collect(),
        )
    }

    /// The snapshot's blocks, each with its JSON (for the transcript).
    fn snapshot_raw_blocks<'a>(line: &Line<'a>) -> Option<Vec<(Block<'a>, &'a RawValue)>> {
        let message: Snapshot<'a> = serde_json::from_str(line.message?.get()).ok()?;
        let raw: Vec<&'a RawValue> = serde_json::from_str(message.content?.get()).ok()?;
        raw.into_iter()
            .map(|r| serde_json::from_str(r.get()).ok().map(|b| (b, r)))
            .collect()
    }

    fn assistant(&mut self, line: &Line<'_>, out: &mut Emitter) {
        let Some(blocks) = Self::snapshot_raw_blocks(line) else {
            out.consumed();
            return;
        };
        let mut traced = false;
        for (pos, (block, raw)) in blocks.iter().enumerate() {
            if let Some(sig) = block.signature.as_deref().filter(|s| !s.is_empty()) {
                out.transcript(SNAPSHOT_SIGNATURE_KIND, None, sig);
                traced = true;
            }
            if self.saw_stream {
                continue;
            }
            // Snapshot-only run (no `--include-partial-messages`): the snapshot is the
            // only source, so reconstruct its blocks as events.
            traced = true;
            self.snapshot_block(block, raw, pos, out);
        }
        if !traced {
            out.consumed();
        }
    }

    fn snapshot_block(&mut self, block: &Block<'_>, raw: &RawValue, pos: usize, out: &mut Emitter) {
        match block.ty.as_ref() {
            "text" => {
                let Some(text) = block.text.as_deref().filter(|t| !t.is_empty()) else {
                    return;
                };
                self.snapshot_text.push_str(text);
                out.emit(Assistant {
                    phase: Some(AssistantPhase::Commentary),
                    text: Some(text.to_owned()),
                    status: Some(SegmentStatus::Completed),
                    ..Assistant::default()
                });
                return;
            }
            "thinking" | "redacted_thinking" => {
                let text = block.thinking.as_deref().filter(|t| !t.is_empty());
                let variant = if text.is_some() {
                    ThinkingVariant::Raw
                } else {
                    ThinkingVariant::Redacted
                };
                if let Some(data) = block.data.as_deref().filter(|d| !d.is_empty()) {
                    out.transcript(REDACTED_KIND, None, data);
                }
                out.emit(Thinking::marker(variant, SegmentPhase::Start, None));
                if let Some(text) = text {
                    out.emit(Thinking {
                        phase: None,
                        text: Some(text.to_owned()),
                        ..Thinking::marker(variant, SegmentPhase::Start, None)
                    });
                }
                out.emit(Thinking::marker(variant, SegmentPhase::End, None));
            }
            "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                let id = block.id.as_deref().unwrap_or_default().to_owned();
                let name = block.name.as_deref().unwrap_or_default().to_owned();
                let index = u64::try_from(pos).ok();
                out.emit(Item {
                    phase: ItemPhase::Start,
                    id: Some(id.clone()),
                    index,
                    kind: "tool".to_owned(),
                    name: Some(name.clone()),
                    status: Some("in_progress".to_owned()),
                    input: block.input.map(Json::from_raw),
                    ..Item::default()
                });
                self.inner.defer_tool(id, name, index);
            }
            t if t.ends_with("_tool_result") => {
                // A server tool's result (web search, web fetch, code execution, MCP):
                // ends its call as in a stream.
                self.inner.server_tool_result(None, block, raw, out);
            }
            other => {
                out.diagnostic("unsupported_frame", Some(Json::string(other)));
            }
        }
        // Any non-text block makes earlier snapshot text commentary.
        self.snapshot_text.clear();
    }

    fn user(&mut self, line: &Line<'_>, out: &mut Emitter) {
        let mut traced = false;
        for block in Self::snapshot_blocks(line).unwrap_or_default() {
            if block.ty != "tool_result" {
                continue;
            }
            traced = true;
            self.inner.resolve_tool(
                block.tool_use_id.as_deref().unwrap_or_default(),
                block.is_error == Some(true),
                block.content.map(Json::from_raw),
                out,
            );
        }
        if !traced {
            // Prompt echo or other user content: not model output.
            out.consumed();
        }
    }

    fn result(&mut self, line: &Line<'_>, out: &mut Emitter) {
        self.done = true;
        let usage = line
            .usage
            .map(Json::from_raw)
            .or_else(|| self.inner.usage().cloned());
        if line.usage.is_some() {
            out.saw_usage();
        }
        let result_text = line
            .result
            .and_then(|r| serde_json::from_str::<Cow<'_, str>>(r.get()).ok());
        let subtype = line.subtype.as_deref();
        let failed = line.is_error == Some(true) || subtype.is_some_and(|s| s.starts_with("error"));
        if failed {
            self.inner.close_all("failed", out);
            let detail = ResultErrorDetail {
                subtype,
                api_error_status: line.api_error_status.filter(|r| r.get() != "null"),
                terminal_reason: line.terminal_reason,
                stop_reason: line.stop_reason.as_deref(),
            };
            let diagnostic = streamgate_grammar::Diagnostic {
                // `error_max_turns`, `error_during_execution`, …; a `success`
                // subtype with `is_error` (API error text in `result`) gets a generic code.
                code: subtype
                    .filter(|s| s.starts_with("error"))
                    .unwrap_or("result_error")
                    .to_owned(),
                message: result_text.filter(|t| !t.is_empty()).map(Cow::into_owned),
                detail: Some(Json::from_value(&detail)),
            };
            Path::Dead(StopReason::Error).emit(usage, Some(diagnostic), out);
            return;
        }
        self.inner.close_all("incomplete", out);
        let stop = line.stop_reason.as_deref().or(self.inner.stop_reason());
        let path = match stop {
            // A successful `result` with no stop reason anywhere is still a clean end.
            None => Path::Finalize(StopReason::Completed),
            s => dispatch(s),
        };
        // Single final source (spec §3.5): `result.result`, else the streamed text.
        let final_text = match result_text.filter(|t| !t.is_empty()) {
            Some(text) => Some((None, text.into_owned())),
            None if self.saw_stream => self.inner.take_final(out),
            None => {
                self.snapshot_text.report_cut(out);
                let empty = self.snapshot_text.is_empty();
                let text = self.snapshot_text.take();
                (!empty).then_some((None, text))
            }
        };
        settle(path, final_text, usage, out);
    }
}

#[cfg(test)]
mod tests {
    use super::{hot_stream_delta, Line};

    /// What the template reading and the generic reading make of `line`: `None` when the
    /// template leaves it to the generic reading, else both readings' `Debug` text.
    fn both_readings(line: &str) -> Option<(String, String)> {
        let hot = hot_stream_delta(line)?;
        let (index, delta) = (hot.index, hot.delta());
        let generic = serde_json::from_str::<Line<'_>>(line).expect(line);
        assert_eq!(generic.ty, "stream_event", "{line}");
        let event = generic.event.expect(line);
        assert_eq!(event.ty, "content_block_delta", "{line}");
        assert!(
            event.message.is_none() && event.content_block.is_none(),
            "{line}"
        );
        Some((
            format!("{index} {delta:?}"),
            format!("{} {:?}", event.index.unwrap(), event.delta.unwrap()),
        ))
    }

    /// Stream events holding a delta, read by their exact template, become the block
    /// index and delta the generic reading makes of them; every other shape is left to it.
    #[test]
    fn delta_lines_read_by_template_are_read_as_serde_reads_them() {
        let line = |delta: &str, tail: &str| {
            format!(
                r#"{{"type":"stream_event","event":{{"type":"content_block_delta","index":1,"delta":{delta}}},"session_id":"s-1","parent_tool_use_id":null{tail}}}"#
            )
        };
        let uuid = r#","uuid":"00000000-0000-0000-0000-000000000000""#;
        for text in [
            line(r#"{"type":"text_delta","text":"capture-ok"}"#, uuid),
            line(r#"{"type":"thinking_delta","thinking":"17*23 = 391."}"#, ""),
            line(
                r#"{"type":"input_json_delta","partial_json":"{\"a\": \"\\n\"}"}"#,
                uuid,
            ),
        ] {
            let (hot, generic) = both_readings(&text).expect(&text);
            assert_eq!(hot, generic, "{text}");
        }
        for text in [
            line(r#"{"type":"signature_delta","signature":"abc"}"#, uuid),
            line(r#"{"type":"text_delta","text":"a"}"#, r#","uuid":null"#),
            line(r#"{"type":"text_delta","text":"a"}"#, r#","extra":1"#),
            r#"{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"a"}},"session_id":"s","parent_tool_use_id":"toolu_1"}"#.into(),
            r#"{"type":"stream_event","event":{"type":"content_block_stop","index":1},"session_id":"s","parent_tool_use_id":null}"#.into(),
        ] {
            assert_eq!(both_readings(&text), None, "{text}");
        }
    }
}

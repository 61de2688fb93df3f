//! OpenClaw gateway agent events (`openclaw-events`): one `AgentEventPayload` per JSONL
//! line, `{runId, seq, stream, ts, data, sessionKey?}` (RFC 0015 agent-event I/O
//! contract; evidence `openclaw-internals.md`).
//!
//! OpenClaw has already normalized its provider into streams, so the mapping is close
//! to one-to-one:
//! - `lifecycle` `data.phase` `start` → `lifecycle/start` (provider `openclaw`, id =
//!   `runId`); `end` → the §3.5 dispatch on `data.stopReason` (absent = clean stop);
//!   `error` → Dead.
//! - `assistant` `{delta?, text?}` → commentary deltas ([`TurnSegments`]); a snapshot
//!   without `delta` contributes what it adds to the open segment. The last text segment
//!   is re-tagged as the final answer at a clean `lifecycle` end.
//! - `thinking` `{delta?, text?, variant?}` → a thinking segment (`raw` unless the
//!   event names its variant); never dropped (§3.2).
//! - `tool` `{phase: start|update|result|end, name, toolCallId, args, partialResult,
//!   result, isError}` → `item` start / update / end, `kind:"tool"`.
//! - `error` `{message|error}` → Dead.
//! - Other OpenClaw streams (`item`, `command_output`, `patch`, `plan`, `approval`,
//!   `compaction`) are display projections of the same activity: `unsupported_frame`.
//!
//! Events of another `runId` than the first, and events whose `seq` does not advance
//! (replays, duplicates), are documented drops with a diagnostic. A stream that ends
//! without a terminal lifecycle event is `stream_closed`.

use crate::adapter::{Adapter, Close};
use crate::emitter::Emitter;
use crate::families::exact_frame::Cursor;
use crate::families::finality::{stream_closed, Path};
use crate::families::response_items::unsupported;
use crate::families::segments::TurnSegments;
use crate::families::tools::{end_open_tools, present};
use crate::framing::Frame;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use streamgate_grammar::{
    Diagnostic, Item, ItemPhase, Json, Lifecycle, LifecyclePhase, StopReason, ThinkingVariant,
};

/// One agent event.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    #[serde(borrow, default)]
    run_id: Option<Cow<'a, str>>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(borrow, default)]
    stream: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

/// The union of the `data` fields the adapter reads.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Data<'a> {
    #[serde(borrow, default)]
    phase: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    variant: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    provider: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    aborted: Option<bool>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    args: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partial_result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

/// An agent event read the generic way: the envelope, then its `data` (a `data` of
/// another shape reads as empty).
fn read_event(line: &str) -> Option<(Envelope<'_>, Data<'_>)> {
    let env = serde_json::from_str::<Envelope<'_>>(line).ok()?;
    let data = env
        .data
        .and_then(|d| serde_json::from_str::<Data<'_>>(d.get()).ok())
        .unwrap_or_default();
    Some((env, data))
}

/// The event nearly every long run is made of — an assistant or thinking delta as the
/// gateway writes it — read by its exact template ([`exact_frame`]) into what
/// [`read_event`] makes of it (its raw `data`, read only for `error` events, left out);
/// `None` for any other line, which is then read the generic way (docs/performance.md
/// has the measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
fn hot_event(line: &str) -> Option<(Envelope<'_>, Data<'_>)> {
    const STREAMS: [&str; 2] = ["assistant", "thinking"];
    let mut c = Cursor::new(line);
    c.literal(r#"{"runId":"#)?;
    let run_id = c.string()?;
    c.literal(r#","seq":"#)?;
    let seq = c.uint()?;
    c.literal(r#","stream":""#)?;
    let stream = c.one_of(STREAMS)?;
    c.literal(r#"","ts":"#)?;
    c.uint()?;
    c.literal(r#","data":{"text":"#)?;
    let text = c.string()?;
    c.literal(r#","delta":"#)?;
    let delta = c.string()?;
    c.literal("}")?;
    if c.literal(r#","sessionKey":"#).is_some() {
        c.string()?;
    }
    c.literal("}")?;
    c.whitespace();
    c.end()?;
    let env = Envelope {
        run_id: Some(run_id),
        seq: Some(seq),
        stream: Some(Cow::Borrowed(STREAMS[stream])),
        data: None,
    };
    let data = Data {
        text: Some(text),
        delta: Some(delta),
        ..Data::default()
    };
    Some((env, data))
}

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct OpenClawAdapter {
    started: bool,
    terminated: bool,
    run_id: Option<String>,
    last_seq: Option<u64>,
    segments: TurnSegments,
    /// Open tool calls (id, name).
    tools: Vec<(String, String)>,
}

impl Adapter for OpenClawAdapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        if self.terminated {
            // Nothing may follow the terminal event (I7): a documented drop.
            out.consumed();
            return;
        }
        let Some((env, data)) = hot_event(frame.data).or_else(|| read_event(frame.data)) else {
            out.malformed_frame(frame.data);
            return;
        };
        if !self.admit(&env, out) {
            return;
        }
        match env.stream.as_deref().unwrap_or("") {
            "lifecycle" => self.on_lifecycle(&data, frame.data, out),
            "assistant" => self.on_assistant(&data, out),
            "thinking" => self.on_thinking(&data, out),
            "tool" => self.on_tool(&data, frame.data, out),
            "error" => self.die("openclaw_error", &data, env.data, out),
            s @ ("item" | "command_output" | "patch" | "plan" | "approval" | "compaction") => {
                unsupported(out, s)
            }
            other => {
                out.unknown_frame(other, frame.data);
            }
        }
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        if self.terminated {
            return;
        }
        // No terminal lifecycle event: stream death, nothing becomes final.
        self.terminated = true;
        self.segments.end_thinking(out, None);
        self.end_tools("failed", out);
        stream_closed(out);
    }
}

impl OpenClawAdapter {
    /// Run and seq guard: `false` (with a diagnostic) for a foreign run or a `seq` that
    /// does not advance.
    fn admit(&mut self, env: &Envelope<'_>, out: &mut Emitter) -> bool {
        if let Some(run) = env.run_id.as_deref() {
            match &self.run_id {
                None => self.run_id = Some(run.to_owned()),
                Some(mine) if mine != run => {
                    out.diagnostic("foreign_run", Some(Json::string(run)));
                    return false;
                }
                Some(_) => {}
            }
        }
        if let Some(seq) = env.seq {
            if self.last_seq.is_some_and(|last| seq <= last) {
                out.diagnostic("stale_seq", Some(Json::from_value(&seq)));
                return false;
            }
            self.last_seq = Some(seq);
        }
        true
    }

    fn start(&mut self, data: &Data<'_>, out: &mut Emitter) {
        self.started = true;
        out.emit(Lifecycle {
            provider: Some(data.provider.as_deref().unwrap_or("openclaw").to_owned()),
            model: data.model.as_deref().map(str::to_owned),
            id: self.run_id.clone(),
            ..Lifecycle::new(LifecyclePhase::Start)
        });
    }

    fn on_lifecycle(&mut self, data: &Data<'_>, raw: &str, out: &mut Emitter) {
        match data.phase.as_deref() {
            Some("start") if !self.started => self.start(data, out),
            Some("start") => out.consumed(),
            Some("end") if data.aborted == Some(true) => {
                self.die("aborted", data, None, out);
            }
            Some("end") => self.finish(data, out),
            Some("error") => self.die("lifecycle_error", data, None, out),
            _ => {
                out.unknown_frame("lifecycle", raw);
            }
        }
    }

    /// The §3.5 dispatch on `stopReason` (OpenClaw's normalized pi-ai stop reasons).
    fn finish(&mut self, data: &Data<'_>, out: &mut Emitter) {
        let (path, diagnostic) = match data.stop_reason.as_deref() {
            None | Some("stop" | "end_turn" | "completed") => {
                (Path::Finalize(StopReason::Completed), None)
            }
            Some("length" | "max_tokens") => (Path::Truncate, None),
            Some("toolUse" | "tool_use") => (Path::Yield, None),
            Some("refusal" | "content_filter") => (Path::Reject(StopReason::ContentFilter), None),
            Some("error" | "aborted") => {
                self.die("lifecycle_error", data, None, out);
                return;
            }
            Some(other) => (
                Path::Incomplete(Some(StopReason::Other("unknown".to_owned()))),
                Some(Diagnostic::new("stop_reason", Some(Json::string(other)))),
            ),
        };
        self.terminated = true;
        self.segments.end_thinking(out, None);
        let tool_status = if path.is_error() {
            "failed"
        } else {
            "completed"
        };
        self.end_tools(tool_status, out);
        if let Some(truncated) = path.final_answer() {
            self.segments.finalize(out, truncated);
        }
        let usage = present(data.usage);
        if usage.is_some() {
            out.saw_usage();
        }
        path.emit(usage, diagnostic, out);
    }

    fn on_assistant(&mut self, data: &Data<'_>, out: &mut Emitter) {
        let delta = match (data.delta.as_deref(), data.text.as_deref()) {
            (Some(d), _) if !d.is_empty() => d.to_owned(),
            (_, Some(t)) if !t.is_empty() => {
                match self.segments.open_text().map(|o| o.extension(t)) {
                    // A growing snapshot: only what it adds.
                    Some(Some(added)) => added.to_owned(),
                    Some(None) => {
                        self.segments.break_text();
                        t.to_owned()
                    }
                    None => t.to_owned(),
                }
            }
            _ => String::new(),
        };
        if delta.is_empty() {
            out.consumed();
            return;
        }
        self.segments.end_thinking(out, None);
        self.segments.say(out, delta);
    }

    fn on_thinking(&mut self, data: &Data<'_>, out: &mut Emitter) {
        let variant = match data.variant.as_deref() {
            Some("summary") => ThinkingVariant::Summary,
            _ => ThinkingVariant::Raw,
        };
        match data.delta.as_deref().or(data.text.as_deref()) {
            Some(d) if !d.is_empty() => self.segments.think(out, variant, d.to_owned()),
            _ => out.consumed(),
        }
    }

    fn on_tool(&mut self, data: &Data<'_>, raw: &str, out: &mut Emitter) {
        let id = data.tool_call_id.as_deref().unwrap_or("").to_owned();
        let name = data.name.as_deref().unwrap_or("tool").to_owned();
        let item = Item {
            id: Some(id.clone()),
            kind: "tool".into(),
            name: Some(name.clone()),
            ..Item::default()
        };
        match data.phase.as_deref() {
            Some("start") => {
                self.segments.end_thinking(out, None);
                self.segments.break_text();
                self.tools.push((id, name));
                out.emit(Item {
                    phase: ItemPhase::Start,
                    status: Some("in_progress".into()),
                    input: present(data.args),
                    ..item
                });
            }
            Some("update") => {
                out.emit(Item {
                    phase: ItemPhase::Update,
                    status: Some("in_progress".into()),
                    output: present(data.partial_result),
                    ..item
                });
            }
            Some("result" | "end") => {
                self.tools.retain(|(tid, _)| *tid != id);
                let failed = data.is_error == Some(true);
                out.emit(Item {
                    phase: ItemPhase::End,
                    status: Some(if failed { "failed" } else { "completed" }.into()),
                    output: present(data.result),
                    ..item
                });
            }
            _ => {
                out.unknown_frame("tool", raw);
            }
        }
    }

    /// Dead path: thinking closes, open tools fail, no final answer.
    fn die(&mut self, code: &str, data: &Data<'_>, raw: Option<&RawValue>, out: &mut Emitter) {
        self.terminated = true;
        self.segments.end_thinking(out, None);
        self.end_tools("failed", out);
        let message = data.message.as_deref().map(str::to_owned).or_else(|| {
            data.error
                .and_then(|e| serde_json::from_str::<String>(e.get()).ok())
        });
        let detail = present(data.error).or_else(|| present(raw));
        let diagnostic = Diagnostic {
            code: code.into(),
            message,
            detail,
        };
        // An abort is the Dead path too (§3.5), told apart by its diagnostic code.
        Path::Dead(StopReason::Error).emit(present(data.usage), Some(diagnostic), out);
    }

    fn end_tools(&mut self, status: &str, out: &mut Emitter) {
        end_open_tools(&mut self.tools, status, out);
    }
}

#[cfg(test)]
mod tests {
    use crate::adapter::{Family, FamilyChoice};
    use crate::normalizer::normalize_bytes;
    use streamgate_grammar::check;

    /// What the template reading and the generic reading make of `line`: `None` when the
    /// template leaves it to the generic reading, else both readings' `Debug` text (the
    /// raw `data`, which the template leaves out, set aside).
    fn both_readings(line: &str) -> Option<(String, String)> {
        let hot = super::hot_event(line)?;
        let (mut env, data) = super::read_event(line).expect(line);
        env.data = None;
        Some((format!("{hot:?}"), format!("{:?}", (env, data))))
    }

    /// Assistant and thinking deltas read by their exact template become what the generic
    /// reading makes of them; every other shape is left to it.
    #[test]
    fn deltas_read_by_template_are_read_as_serde_reads_them() {
        let event = |stream: &str, data: &str, tail: &str| {
            format!(
                r#"{{"runId":"run_a","seq":3,"stream":"{stream}","ts":1760000000150,"data":{data}{tail}}}"#
            )
        };
        let key = r#","sessionKey":"agent:main:telegram:dm:42""#;
        for line in [
            event("thinking", r#"{"text":"The user","delta":" user"}"#, key),
            event("assistant", r#"{"text":"Paris","delta":"Paris"}"#, ""),
            event(
                "assistant",
                r#"{"text":"\"q\" \\ \ud83d\ude00","delta":"\n"}"#,
                key,
            ),
        ] {
            let (hot, generic) = both_readings(&line).expect(&line);
            assert_eq!(hot, generic, "{line}");
        }
        for line in [
            event("tool", r#"{"text":"a","delta":"a"}"#, key),
            event("assistant", r#"{"text":"a"}"#, key),
            event("assistant", r#"{"delta":"a","text":"a"}"#, key),
            event("assistant", r#"{"text":"a","delta":"a","phase":"x"}"#, key),
            event("assistant", r#"{"text":"a","delta":null}"#, key),
            event("assistant", r#"{"text":"a","delta":"a"}"#, r#","sessionKey":null"#),
            r#"{"runId":"r","seq":-1,"stream":"assistant","ts":1,"data":{"text":"a","delta":"a"}}"#.into(),
            r#"{"runId":"r","seq":1,"stream":"assistant","ts":1.5,"data":{"text":"a","delta":"a"}}"#.into(),
            r#"{"runId":"r","seq":1,"stream":"assistant","ts":1,"data":{"text":"a","delta":"a"},"x":1}"#.into(),
        ] {
            assert_eq!(both_readings(&line), None, "{line}");
        }
    }

    #[test]
    fn auto_detects_openclaw_events_and_finalizes_the_last_text() {
        let text = concat!(
            r#"{"runId":"r","seq":1,"stream":"lifecycle","ts":1,"data":{"phase":"start"}}"#,
            "\n",
            r#"{"runId":"r","seq":2,"stream":"assistant","ts":2,"data":{"text":"Hi","delta":"Hi"}}"#,
            "\n",
            r#"{"runId":"r","seq":3,"stream":"assistant","ts":3,"data":{"text":"Hi there"}}"#,
            "\n",
            r#"{"runId":"r","seq":4,"stream":"lifecycle","ts":4,"data":{"phase":"end"}}"#,
            "\n",
        );
        let auto = normalize_bytes(FamilyChoice::Auto, text.as_bytes(), 0);
        let known = normalize_bytes(Family::OpenClawEvents.into(), text.as_bytes(), 0);
        assert_eq!(auto.events, known.events);
        assert_eq!(check(&known.events, &[], None), vec![]);
        let last_text: Vec<String> = known.events.iter().map(|e| e.to_json()).collect();
        assert!(
            last_text[2].contains(r#""delta":" there""#),
            "{last_text:?}"
        );
        assert!(
            last_text[3].contains(r#""text":"Hi there""#),
            "{last_text:?}"
        );
    }
}

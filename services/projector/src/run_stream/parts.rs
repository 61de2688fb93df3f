//! The canonical grammar as message parts: the one place that decides which canonical
//! events open, grow and close a reasoning, text or tool part, for every encoding that
//! thinks in parts (the Vercel AI SDK UI message stream, AG-UI). Each encoding only
//! spells [`PartOp`]s its own way (`docs/run-stream.md` has the table).
//!
//! Rules (spec §3):
//! - a thinking segment (variant + id) is one reasoning part; a redacted marker carries
//!   no text and makes none;
//! - a commentary segment (by id; id-less text continues the open id-less part) is one
//!   text part; `status: completed` closes it;
//! - the final answer closes the text part that streamed it (same id, else the text
//!   part opened since the last thinking or tool activity); a final nobody streamed
//!   becomes a text part of its own;
//! - an item (by id, else index) is one tool call: start → input start, `input_delta` →
//!   input delta, end → input available (arguments, else input, else the parsed
//!   deltas) and then its output (result, else output, else the output deltas) or its
//!   error (a failed status);
//! - the terminal lifecycle event closes every open part and ends the run.
//!
//! A snapshot (`text` instead of `delta`) that extends what was sent sends the
//! extension; one that rewrites it cannot be carried by an append-only part and is
//! dropped (the run's replay has it).

use std::collections::HashMap;
use streamgate_grammar::{
    AssistantPhase, EventData, ItemPhase, LifecyclePhase, RunEvent, SegmentPhase, SegmentStatus,
    StopReason, ThinkingVariant,
};

/// What a part-based encoding is asked to say.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PartOp {
    RunStart,
    ReasoningStart {
        id: String,
    },
    ReasoningDelta {
        id: String,
        delta: String,
    },
    ReasoningEnd {
        id: String,
    },
    TextStart {
        id: String,
    },
    TextDelta {
        id: String,
        delta: String,
    },
    TextEnd {
        id: String,
    },
    ToolStart {
        id: String,
        name: String,
    },
    ToolArgs {
        id: String,
        delta: String,
    },
    ToolEnd {
        id: String,
        name: String,
        input: serde_json::Value,
    },
    ToolOutput {
        id: String,
        output: serde_json::Value,
    },
    ToolError {
        id: String,
        error: String,
    },
    /// The run ended: `reason` normalized, `error` for a dead turn.
    RunEnd {
        reason: Option<StopReason>,
        error: Option<String>,
    },
}

#[derive(Debug, Default)]
struct Tool {
    id: String,
    name: String,
    args: String,
    ended: bool,
}

/// One run's part state.
#[derive(Debug, Default)]
pub(super) struct Parts {
    started: bool,
    ended: bool,
    next_id: u64,
    /// Open reasoning parts by (variant, segment id): part id, bytes sent.
    reasoning: HashMap<(&'static str, Option<String>), (String, usize)>,
    /// The open text part: segment id, part id, bytes sent.
    text: Option<(Option<String>, String, usize)>,
    /// Segment ids of text parts closed so far, and whether a text part was opened since
    /// the last thinking or tool activity.
    texts: Vec<Option<String>>,
    text_since_activity: bool,
    tools: HashMap<String, Tool>,
}

impl Parts {
    fn fresh(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("{kind}-{}", self.next_id)
    }

    /// The part ops of one (display-safe) event, in order.
    pub fn apply(&mut self, ev: &RunEvent) -> Vec<PartOp> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        if !self.started {
            self.started = true;
            out.push(PartOp::RunStart);
        }
        match &ev.event.data {
            EventData::Thinking(t) if t.variant != ThinkingVariant::Redacted => {
                if t.is_tokens_update() {
                    return out;
                }
                // An end marker only closes the segment: text streamed before it (a
                // provider that ends reasoning after the answer began) is still the
                // text the final answer claims.
                let end_marker =
                    t.phase == Some(SegmentPhase::End) && t.delta.is_none() && t.text.is_none();
                if !end_marker {
                    self.text_since_activity = false;
                }
                let key = (t.variant.as_str(), t.id.clone());
                if t.phase == Some(SegmentPhase::Start) {
                    if let Some((id, _)) = self.reasoning.remove(&key) {
                        out.push(PartOp::ReasoningEnd { id });
                    }
                }
                let piece = t.delta.as_deref().or(t.text.as_deref()).unwrap_or("");
                if !self.reasoning.contains_key(&key) && !piece.is_empty()
                    || t.phase == Some(SegmentPhase::Start)
                {
                    let id = self.fresh("reasoning");
                    out.push(PartOp::ReasoningStart { id: id.clone() });
                    self.reasoning.insert(key.clone(), (id, 0));
                }
                if let Some((id, sent)) = self.reasoning.get_mut(&key) {
                    if let Some(delta) = grow(sent, t.delta.as_deref(), t.text.as_deref()) {
                        out.push(PartOp::ReasoningDelta {
                            id: id.clone(),
                            delta,
                        });
                    }
                }
                if t.phase == Some(SegmentPhase::End) {
                    if let Some((id, _)) = self.reasoning.remove(&key) {
                        out.push(PartOp::ReasoningEnd { id });
                    }
                }
            }
            EventData::Thinking(_) => {}
            EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
                self.final_answer(
                    a.id.as_ref(),
                    a.text.as_deref().or(a.delta.as_deref()),
                    &mut out,
                );
            }
            EventData::Assistant(a) => {
                let same = self.text.as_ref().is_some_and(|(seg, _, _)| *seg == a.id);
                if !same {
                    self.close_text(&mut out);
                    let id = self.fresh("text");
                    out.push(PartOp::TextStart { id: id.clone() });
                    self.text = Some((a.id.clone(), id, 0));
                    self.texts.push(a.id.clone());
                    self.text_since_activity = true;
                }
                if let Some((_, id, sent)) = &mut self.text {
                    if let Some(delta) = grow(sent, a.delta.as_deref(), a.text.as_deref()) {
                        out.push(PartOp::TextDelta {
                            id: id.clone(),
                            delta,
                        });
                    }
                }
                if a.status == Some(SegmentStatus::Completed) {
                    self.close_text(&mut out);
                }
            }
            EventData::Item(it) => {
                self.text_since_activity = false;
                self.close_text(&mut out);
                let key = it
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("item-{}", it.index.unwrap_or(0)));
                let tool = self.tools.entry(key.clone()).or_default();
                if tool.id.is_empty() {
                    tool.id = key.clone();
                    tool.name = it
                        .name
                        .clone()
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| it.kind.clone());
                    out.push(PartOp::ToolStart {
                        id: key.clone(),
                        name: tool.name.clone(),
                    });
                }
                if let Some(d) = it.input_delta.as_deref().filter(|d| !d.is_empty()) {
                    tool.args.push_str(d);
                    out.push(PartOp::ToolArgs {
                        id: key.clone(),
                        delta: d.to_owned(),
                    });
                }
                if it.phase == ItemPhase::End && !tool.ended {
                    tool.ended = true;
                    let input = it
                        .arguments
                        .as_ref()
                        .or(it.input.as_ref())
                        .map(|j| j.to_value())
                        .or_else(|| serde_json::from_str(&tool.args).ok())
                        .unwrap_or_else(|| serde_json::json!({}));
                    tool.args.clear();
                    out.push(PartOp::ToolEnd {
                        id: key.clone(),
                        name: tool.name.clone(),
                        input,
                    });
                    let status = it.status.as_deref().unwrap_or("").to_ascii_lowercase();
                    let output = it
                        .result
                        .as_ref()
                        .or(it.output.as_ref())
                        .map(|j| j.to_value())
                        .unwrap_or(serde_json::Value::Null);
                    if ["fail", "error", "cancel", "declin", "reject", "denied"]
                        .iter()
                        .any(|w| status.contains(w))
                    {
                        let error = match &output {
                            serde_json::Value::String(s) => s.clone(),
                            serde_json::Value::Null => status.clone(),
                            v => v.to_string(),
                        };
                        out.push(PartOp::ToolError { id: key, error });
                    } else {
                        out.push(PartOp::ToolOutput { id: key, output });
                    }
                }
            }
            EventData::Lifecycle(l) if l.is_terminal() => {
                self.ended = true;
                self.close_text(&mut out);
                let mut open: Vec<String> = self.reasoning.drain().map(|(_, (id, _))| id).collect();
                open.sort();
                out.extend(open.into_iter().map(|id| PartOp::ReasoningEnd { id }));
                let error = (l.phase == LifecyclePhase::Error).then(|| {
                    l.diagnostic
                        .as_ref()
                        .map(|d| d.message.clone().unwrap_or_else(|| d.code.clone()))
                        .or_else(|| l.reason.as_ref().map(|r| r.as_str().to_owned()))
                        .unwrap_or_else(|| "error".to_owned())
                });
                out.push(PartOp::RunEnd {
                    reason: l.reason.clone(),
                    error,
                });
            }
            EventData::Lifecycle(_) => {}
        }
        out
    }

    fn close_text(&mut self, out: &mut Vec<PartOp>) {
        if let Some((_, id, _)) = self.text.take() {
            out.push(PartOp::TextEnd { id });
        }
    }

    fn final_answer(&mut self, seg: Option<&String>, text: Option<&str>, out: &mut Vec<PartOp>) {
        let streamed = match seg {
            Some(s) => self.texts.iter().any(|t| t.as_ref() == Some(s)),
            None => false,
        } || self.text_since_activity;
        self.close_text(out);
        let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
            return;
        };
        if !streamed {
            let id = self.fresh("text");
            out.push(PartOp::TextStart { id: id.clone() });
            out.push(PartOp::TextDelta {
                id: id.clone(),
                delta: text.to_owned(),
            });
            out.push(PartOp::TextEnd { id });
            self.texts.push(seg.cloned());
        }
    }
}

/// What a delta or snapshot adds to a part that has `sent` bytes: the delta, or the
/// snapshot's extension of what was sent (a rewrite cannot be carried).
fn grow(sent: &mut usize, delta: Option<&str>, snapshot: Option<&str>) -> Option<String> {
    let add = match (delta, snapshot) {
        (Some(d), _) => d,
        (None, Some(s)) => s.get(*sent..).unwrap_or(""),
        (None, None) => "",
    };
    if add.is_empty() {
        return None;
    }
    *sent += add.len();
    Some(add.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamgate_grammar::{Envelope, Event};

    fn ops(lines: &[&str]) -> Vec<PartOp> {
        let mut parts = Parts::default();
        lines
            .iter()
            .flat_map(|l| {
                let event = Event::from_json(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                let ev = RunEvent {
                    envelope: Envelope {
                        tenant: "t".into(),
                        session_key: None,
                        run_id: "r".into(),
                        ts_ms: 0,
                    },
                    event,
                };
                parts.apply(&ev)
            })
            .collect()
    }

    /// OpenAI-compatible streams end reasoning after the answer began: the final answer
    /// still claims the streamed text (one text part, not the answer twice).
    #[test]
    fn a_final_after_a_late_reasoning_end_claims_the_streamed_text() {
        let ops = ops(&[
            r#"{"seq":1,"stream":"thinking","data":{"variant":"raw","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"variant":"raw","delta":"Check."}}"#,
            r#"{"seq":3,"stream":"assistant","data":{"phase":"commentary","delta":"Hi","status":"in_progress"}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"variant":"raw","phase":"end"}}"#,
            r#"{"seq":5,"stream":"assistant","data":{"phase":"final_answer","text":"Hi","status":"completed"}}"#,
            r#"{"seq":6,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ]);
        let texts = ops
            .iter()
            .filter(|o| matches!(o, PartOp::TextStart { .. }))
            .count();
        assert_eq!(texts, 1, "{ops:?}");
    }
}

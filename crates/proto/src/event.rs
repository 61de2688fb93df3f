//! Lossless conversion between the grammar's [`RunEvent`] and the bus [`v1::Event`].

use crate::v1;
use streamgate_grammar as g;
use streamgate_grammar::{Envelope, Event, EventData, Json, RunEvent};

/// A protobuf event that does not map onto the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The `data` oneof was empty.
    #[error("event {0} has no payload")]
    NoPayload(String),
    /// A required enum was unspecified or out of range.
    #[error("event {id}: invalid {field}")]
    InvalidEnum {
        /// Event id.
        id: String,
        /// Which field.
        field: &'static str,
    },
    /// A `*_json` field did not hold JSON.
    #[error("event {id}: {field} is not JSON")]
    InvalidJson {
        /// Event id.
        id: String,
        /// Which field.
        field: &'static str,
    },
}

fn json_out(j: &Option<Json>) -> Option<String> {
    j.as_ref().map(|j| j.get().to_owned())
}

impl From<&RunEvent> for v1::Event {
    fn from(ev: &RunEvent) -> v1::Event {
        use v1::event::Data;
        let data = match &ev.event.data {
            EventData::Assistant(a) => Data::Assistant(v1::Assistant {
                id: a.id.clone(),
                phase: match a.phase {
                    None => v1::AssistantPhase::Unspecified,
                    Some(g::AssistantPhase::Commentary) => v1::AssistantPhase::Commentary,
                    Some(g::AssistantPhase::FinalAnswer) => v1::AssistantPhase::FinalAnswer,
                } as i32,
                delta: a.delta.clone(),
                text: a.text.clone(),
                status: segment_status_out(a.status) as i32,
                truncated: a.truncated,
            }),
            EventData::Thinking(t) => Data::Thinking(v1::Thinking {
                id: t.id.clone(),
                variant: match t.variant {
                    g::ThinkingVariant::Raw => v1::ThinkingVariant::Raw,
                    g::ThinkingVariant::Summary => v1::ThinkingVariant::Summary,
                    g::ThinkingVariant::Redacted => v1::ThinkingVariant::Redacted,
                } as i32,
                phase: match t.phase {
                    None => v1::SegmentPhase::Unspecified,
                    Some(g::SegmentPhase::Start) => v1::SegmentPhase::Start,
                    Some(g::SegmentPhase::End) => v1::SegmentPhase::End,
                } as i32,
                delta: t.delta.clone(),
                text: t.text.clone(),
                tokens: t.tokens,
            }),
            EventData::Item(i) => Data::Item(v1::Item {
                phase: match i.phase {
                    g::ItemPhase::Start => v1::ItemPhase::Start,
                    g::ItemPhase::Update => v1::ItemPhase::Update,
                    g::ItemPhase::End => v1::ItemPhase::End,
                } as i32,
                id: i.id.clone(),
                index: i.index,
                kind: i.kind.clone(),
                name: i.name.clone(),
                title: i.title.clone(),
                status: i.status.clone(),
                input_json: json_out(&i.input),
                input_delta: i.input_delta.clone(),
                arguments_json: json_out(&i.arguments),
                output_delta: i.output_delta.clone(),
                result_json: json_out(&i.result),
                meta_json: json_out(&i.meta),
                output_json: json_out(&i.output),
            }),
            EventData::Lifecycle(l) => Data::Lifecycle(v1::Lifecycle {
                phase: match l.phase {
                    g::LifecyclePhase::Start => v1::LifecyclePhase::Start,
                    g::LifecyclePhase::Update => v1::LifecyclePhase::Update,
                    g::LifecyclePhase::End => v1::LifecyclePhase::End,
                    g::LifecyclePhase::Error => v1::LifecyclePhase::Error,
                } as i32,
                reason: l.reason.as_ref().map(|r| r.as_str().to_owned()),
                status: match l.status {
                    None => v1::RunStatus::Unspecified,
                    Some(g::RunStatus::Completed) => v1::RunStatus::Completed,
                    Some(g::RunStatus::Incomplete) => v1::RunStatus::Incomplete,
                } as i32,
                provider: l.provider.clone(),
                model: l.model.clone(),
                id: l.id.clone(),
                usage_json: json_out(&l.usage),
                diagnostic: l.diagnostic.as_ref().map(|d| v1::Diagnostic {
                    code: d.code.clone(),
                    message: d.message.clone(),
                    detail_json: json_out(&d.detail),
                }),
            }),
        };
        v1::Event {
            tenant: ev.envelope.tenant.clone(),
            session_key: ev.envelope.session_key.clone(),
            run_id: ev.envelope.run_id.clone(),
            seq: ev.event.seq,
            ts_ms: ev.envelope.ts_ms,
            data: Some(data),
        }
    }
}

fn segment_status_out(s: Option<g::SegmentStatus>) -> v1::SegmentStatus {
    match s {
        None => v1::SegmentStatus::Unspecified,
        Some(g::SegmentStatus::InProgress) => v1::SegmentStatus::InProgress,
        Some(g::SegmentStatus::Completed) => v1::SegmentStatus::Completed,
    }
}

impl TryFrom<v1::Event> for RunEvent {
    type Error = DecodeError;

    fn try_from(ev: v1::Event) -> Result<RunEvent, DecodeError> {
        use v1::event::Data;
        // The id names the event in an error only: formatted then, not for every event.
        let (run_id, seq) = (&ev.run_id, ev.seq);
        let id = || format!("{run_id}/{seq}");
        let bad = |field: &'static str| DecodeError::InvalidEnum { id: id(), field };
        let json = |field: &'static str, s: Option<String>| -> Result<Option<Json>, DecodeError> {
            match s {
                None => Ok(None),
                Some(s) => Json::parse(&s)
                    .map(Some)
                    .ok_or_else(|| DecodeError::InvalidJson { id: id(), field }),
            }
        };
        let data = match ev.data.ok_or_else(|| DecodeError::NoPayload(id()))? {
            Data::Assistant(a) => EventData::Assistant(g::Assistant {
                id: a.id,
                phase: match v1::AssistantPhase::try_from(a.phase) {
                    Ok(v1::AssistantPhase::Unspecified) => None,
                    Ok(v1::AssistantPhase::Commentary) => Some(g::AssistantPhase::Commentary),
                    Ok(v1::AssistantPhase::FinalAnswer) => Some(g::AssistantPhase::FinalAnswer),
                    Err(_) => return Err(bad("assistant.phase")),
                },
                delta: a.delta,
                text: a.text,
                status: segment_status_in(a.status).ok_or_else(|| bad("assistant.status"))?,
                truncated: a.truncated,
            }),
            Data::Thinking(t) => EventData::Thinking(g::Thinking {
                id: t.id,
                variant: match v1::ThinkingVariant::try_from(t.variant) {
                    Ok(v1::ThinkingVariant::Raw) => g::ThinkingVariant::Raw,
                    Ok(v1::ThinkingVariant::Summary) => g::ThinkingVariant::Summary,
                    Ok(v1::ThinkingVariant::Redacted) => g::ThinkingVariant::Redacted,
                    _ => return Err(bad("thinking.variant")),
                },
                phase: match v1::SegmentPhase::try_from(t.phase) {
                    Ok(v1::SegmentPhase::Unspecified) => None,
                    Ok(v1::SegmentPhase::Start) => Some(g::SegmentPhase::Start),
                    Ok(v1::SegmentPhase::End) => Some(g::SegmentPhase::End),
                    Err(_) => return Err(bad("thinking.phase")),
                },
                delta: t.delta,
                text: t.text,
                tokens: t.tokens,
            }),
            Data::Item(i) => EventData::from(g::Item {
                phase: match v1::ItemPhase::try_from(i.phase) {
                    Ok(v1::ItemPhase::Start) => g::ItemPhase::Start,
                    Ok(v1::ItemPhase::Update) => g::ItemPhase::Update,
                    Ok(v1::ItemPhase::End) => g::ItemPhase::End,
                    _ => return Err(bad("item.phase")),
                },
                id: i.id,
                index: i.index,
                kind: i.kind,
                name: i.name,
                title: i.title,
                status: i.status,
                input: json("item.input_json", i.input_json)?,
                input_delta: i.input_delta,
                arguments: json("item.arguments_json", i.arguments_json)?,
                output_delta: i.output_delta,
                result: json("item.result_json", i.result_json)?,
                meta: json("item.meta_json", i.meta_json)?,
                output: json("item.output_json", i.output_json)?,
            }),
            Data::Lifecycle(l) => EventData::from(g::Lifecycle {
                phase: match v1::LifecyclePhase::try_from(l.phase) {
                    Ok(v1::LifecyclePhase::Start) => g::LifecyclePhase::Start,
                    Ok(v1::LifecyclePhase::Update) => g::LifecyclePhase::Update,
                    Ok(v1::LifecyclePhase::End) => g::LifecyclePhase::End,
                    Ok(v1::LifecyclePhase::Error) => g::LifecyclePhase::Error,
                    _ => return Err(bad("lifecycle.phase")),
                },
                reason: l.reason.as_deref().map(g::StopReason::parse),
                status: match v1::RunStatus::try_from(l.status) {
                    Ok(v1::RunStatus::Unspecified) => None,
                    Ok(v1::RunStatus::Completed) => Some(g::RunStatus::Completed),
                    Ok(v1::RunStatus::Incomplete) => Some(g::RunStatus::Incomplete),
                    Err(_) => return Err(bad("lifecycle.status")),
                },
                provider: l.provider,
                model: l.model,
                id: l.id,
                usage: json("lifecycle.usage_json", l.usage_json)?,
                diagnostic: match l.diagnostic {
                    None => None,
                    Some(d) => Some(g::Diagnostic {
                        code: d.code,
                        message: d.message,
                        detail: json("diagnostic.detail_json", d.detail_json)?,
                    }),
                },
            }),
        };
        Ok(RunEvent {
            envelope: Envelope {
                tenant: ev.tenant,
                session_key: ev.session_key,
                run_id: ev.run_id,
                ts_ms: ev.ts_ms,
            },
            event: Event { seq: ev.seq, data },
        })
    }
}

fn segment_status_in(s: i32) -> Option<Option<g::SegmentStatus>> {
    match v1::SegmentStatus::try_from(s) {
        Ok(v1::SegmentStatus::Unspecified) => Some(None),
        Ok(v1::SegmentStatus::InProgress) => Some(Some(g::SegmentStatus::InProgress)),
        Ok(v1::SegmentStatus::Completed) => Some(Some(g::SegmentStatus::Completed)),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    const LINES: &[&str] = &[
        r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"openai","model":"m","id":"r","usage":null}}"#,
        r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end","tokens":62}}"#,
        r#"{"seq":3,"stream":"assistant","data":{"id":"1","phase":"commentary","delta":"x","status":"in_progress"}}"#,
        r#"{"seq":4,"stream":"item","data":{"phase":"end","id":"t","index":0,"kind":"tool","name":"w","status":"completed","arguments":{"a":[1,2.5]}}}"#,
        r#"{"seq":5,"stream":"assistant","data":{"phase":"final_answer","text":"","status":"completed","truncated":true}}"#,
        r#"{"seq":6,"stream":"lifecycle","data":{"phase":"end","reason":"odd_reason","status":"completed","usage":{"n":1},"diagnostic":{"code":"c","detail":"end_turn"}}}"#,
    ];

    #[test]
    fn round_trips_through_protobuf_bytes() {
        for line in LINES {
            let ev = RunEvent {
                envelope: Envelope {
                    tenant: "acme".into(),
                    session_key: Some("chat-1".into()),
                    run_id: "r1".into(),
                    ts_ms: 1_700_000_000_000,
                },
                event: Event::from_json(line).unwrap(),
            };
            let bytes = v1::Event::from(&ev).encode_to_vec();
            let back = RunEvent::try_from(v1::Event::decode(bytes.as_slice()).unwrap()).unwrap();
            assert_eq!(back, ev, "{line}");
            let a: serde_json::Value = serde_json::from_str(line).unwrap();
            let b: serde_json::Value = serde_json::from_str(&back.event.to_json()).unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn empty_payload_is_an_error() {
        let ev = v1::Event::default();
        assert!(RunEvent::try_from(ev).is_err());
    }
}

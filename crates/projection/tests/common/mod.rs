//! Event builders and op helpers shared by the projection tests.
#![allow(dead_code)]

use streamgate_grammar::Event;
use streamgate_projection::{Op, RunProjection, Settings, Tier};

/// Parses a canonical event line with `seq` spliced in.
pub fn ev(seq: u64, stream: &str, data: &str) -> Event {
    Event::from_json(&format!(
        r#"{{"seq":{seq},"stream":"{stream}","data":{data}}}"#
    ))
    .unwrap_or_else(|e| panic!("bad test event {stream} {data}: {e}"))
}

pub fn start(seq: u64) -> Event {
    ev(
        seq,
        "lifecycle",
        r#"{"phase":"start","provider":"anthropic","model":"m"}"#,
    )
}

pub fn end(seq: u64, reason: &str) -> Event {
    ev(
        seq,
        "lifecycle",
        &format!(r#"{{"phase":"end","reason":"{reason}","status":"completed"}}"#),
    )
}

pub fn error(seq: u64, reason: &str, message: Option<&str>) -> Event {
    let diag = message
        .map(|m| format!(r#","diagnostic":{{"code":"provider_error","message":"{m}"}}"#))
        .unwrap_or_default();
    ev(
        seq,
        "lifecycle",
        &format!(r#"{{"phase":"error","reason":"{reason}","status":"incomplete"{diag}}}"#),
    )
}

pub fn think_start(seq: u64, variant: &str) -> Event {
    ev(
        seq,
        "thinking",
        &format!(r#"{{"id":"0","variant":"{variant}","phase":"start"}}"#),
    )
}

pub fn think_delta(seq: u64, variant: &str, text: &str) -> Event {
    let text = serde_json::to_string(text).unwrap();
    ev(
        seq,
        "thinking",
        &format!(r#"{{"id":"0","variant":"{variant}","delta":{text}}}"#),
    )
}

pub fn think_end(seq: u64, variant: &str, tokens: Option<u64>) -> Event {
    let tok = tokens
        .map(|t| format!(r#","tokens":{t}"#))
        .unwrap_or_default();
    ev(
        seq,
        "thinking",
        &format!(r#"{{"id":"0","variant":"{variant}","phase":"end"{tok}}}"#),
    )
}

pub fn tool_start(seq: u64, id: &str, name: &str, input: &str) -> Event {
    ev(
        seq,
        "item",
        &format!(
            r#"{{"phase":"start","id":"{id}","kind":"tool","name":"{name}","status":"in_progress","input":{input}}}"#
        ),
    )
}

pub fn tool_end(seq: u64, id: &str, status: &str, result: &str) -> Event {
    ev(
        seq,
        "item",
        &format!(
            r#"{{"phase":"end","id":"{id}","kind":"tool","status":"{status}","result":{result}}}"#
        ),
    )
}

pub fn say(seq: u64, id: &str, delta: &str) -> Event {
    let delta = serde_json::to_string(delta).unwrap();
    ev(
        seq,
        "assistant",
        &format!(r#"{{"id":"{id}","phase":"commentary","delta":{delta},"status":"in_progress"}}"#),
    )
}

pub fn final_answer(seq: u64, id: &str, text: &str, truncated: bool) -> Event {
    let text = serde_json::to_string(text).unwrap();
    let tr = if truncated {
        r#","truncated":true"#
    } else {
        ""
    };
    ev(
        seq,
        "assistant",
        &format!(r#"{{"id":"{id}","phase":"final_answer","text":{text}{tr}}}"#),
    )
}

/// Projects every event through a fresh projection; returns the ops per event, drafts
/// without their `live` facts (the truth tables are about the rendering; `live.rs`
/// tests the facts).
pub fn project(events: &[Event], settings: &Settings, tier: Tier) -> Vec<Vec<Op>> {
    let mut p = RunProjection::new("r1");
    events
        .iter()
        .map(|e| {
            p.apply(e, settings, tier)
                .into_iter()
                .map(without_live)
                .collect()
        })
        .collect()
}

/// `op` with a draft's `live` facts dropped.
pub fn without_live(op: Op) -> Op {
    match op {
        Op::Draft { key, text, seq, .. } => Op::Draft {
            key,
            text,
            seq,
            live: None,
        },
        op => op,
    }
}

/// All ops of a run, flattened.
pub fn flat(events: &[Event], settings: &Settings, tier: Tier) -> Vec<Op> {
    project(events, settings, tier)
        .into_iter()
        .flatten()
        .collect()
}

pub fn key() -> streamgate_projection::DraftKey {
    streamgate_projection::DraftKey {
        run_id: "r1".into(),
        tenant: String::new(),
    }
}

pub fn draft(text: &str, seq: u64) -> Op {
    Op::Draft {
        key: key(),
        text: text.into(),
        seq,
        live: None,
    }
}

pub fn settle(text: &str, seq: u64) -> Op {
    Op::Settle {
        key: key(),
        text: text.into(),
        seq,
    }
}

pub fn notice(text: &str, seq: u64) -> Op {
    Op::Notice {
        key: key(),
        text: text.into(),
        seq,
    }
}

pub fn dismiss() -> Op {
    Op::Dismiss { key: key() }
}

pub fn final_op(text: &str, seq: u64) -> Op {
    Op::Final {
        key: key(),
        text: text.into(),
        truncated: false,
        suffix: None,
        seq,
    }
}

/// The last draft text among `ops`.
pub fn last_draft(ops: &[Op]) -> Option<String> {
    ops.iter().rev().find_map(|o| match o {
        Op::Draft { text, .. } => Some(text.clone()),
        _ => None,
    })
}

pub fn settings(reasoning: &str, verbose: &str) -> Settings {
    Settings {
        reasoning: reasoning.parse().unwrap(),
        verbose: verbose.parse().unwrap(),
        ..Settings::default()
    }
}

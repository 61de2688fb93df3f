//! Property tests over random event sequences, settings, tiers and budgets: the draft
//! never exceeds its budget, at most one final goes out and it is the final-answer
//! event's text verbatim, nothing follows a settle or dismissal, and nothing panics.

mod common;

use common::ev;
use proptest::prelude::*;
use streamgate_grammar::{AssistantPhase, Event, EventData};
use streamgate_projection::{
    is_silent, Budgets, Delivery, Op, Reasoning, RunProjection, Settings, Tier, Verbose,
};

#[derive(Debug, Clone)]
enum Step {
    ThinkStart(usize),
    ThinkDelta(usize, String),
    ThinkEnd(usize, Option<u64>),
    ToolStart(usize, usize, String),
    ToolEnd(usize, bool, String),
    Say(usize, String),
    Final(String, bool),
    Update,
    End(usize),
    Error(usize),
    /// Re-deliver an earlier event (replay overlap).
    Replay(usize),
    /// Flip settings mid-turn.
    Flip,
}

const VARIANTS: [&str; 3] = ["raw", "summary", "redacted"];
const TOOLS: [&str; 6] = [
    "bash",
    "read_file",
    "web_search",
    "write_file",
    "web_fetch",
    "x",
];
const ENDS: [&str; 7] = [
    "completed",
    "truncated",
    "tool_use",
    "paused",
    "refusal",
    "content_filter",
    "weird",
];
const ERRORS: [&str; 3] = ["error", "stream_closed", "refusal"];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 \n/=:_.-]{0,40}",
        "[a-z ]{100,400}",
        Just("NO_REPLY".to_owned()),
        Just("HEARTBEAT_OK".to_owned()),
        Just(String::new()),
        Just("password=hunter2 Bearer abc sk-abcdefghijklmnopqrstu".to_owned()),
        "\\PC{0,30}",
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize).prop_map(Step::ThinkStart),
        (0..3usize, text()).prop_map(|(v, t)| Step::ThinkDelta(v, t)),
        (0..3usize, proptest::option::of(0..5000u64)).prop_map(|(v, t)| Step::ThinkEnd(v, t)),
        (0..4usize, 0..TOOLS.len(), text()).prop_map(|(i, n, a)| Step::ToolStart(i, n, a)),
        (0..4usize, any::<bool>(), text()).prop_map(|(i, f, r)| Step::ToolEnd(i, f, r)),
        (0..3usize, text()).prop_map(|(i, t)| Step::Say(i, t)),
        (text(), any::<bool>()).prop_map(|(t, tr)| Step::Final(t, tr)),
        Just(Step::Update),
        (0..ENDS.len()).prop_map(Step::End),
        (0..ERRORS.len()).prop_map(Step::Error),
        (0..40usize).prop_map(Step::Replay),
        Just(Step::Flip),
    ]
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        0..3usize,
        0..3usize,
        any::<bool>(),
        0..600usize,
        0..400usize,
        0..100usize,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(r, v, fo, max, th, det, rep, tags)| Settings {
            reasoning: [Reasoning::Off, Reasoning::On, Reasoning::Stream][r],
            verbose: [Verbose::Off, Verbose::On, Verbose::Full][v],
            delivery: if fo {
                Delivery::FinalOnly
            } else {
                Delivery::Live
            },
            budgets: Budgets {
                draft_max_chars: max,
                thinking_chars: th,
                item_detail_chars: det,
                ..Budgets::default()
            },
            suppress_repeats: rep,
            show_variant_tags: tags,
            ..Settings::default()
        })
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::T1),
        Just(Tier::T2 { status_line: false }),
        Just(Tier::T2 { status_line: true }),
        Just(Tier::T0),
    ]
}

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn build(seq: u64, step: &Step) -> Option<Event> {
    Some(match step {
        Step::ThinkStart(v) => ev(
            seq,
            "thinking",
            &format!(
                r#"{{"id":"0","variant":"{}","phase":"start"}}"#,
                VARIANTS[*v]
            ),
        ),
        Step::ThinkDelta(v, t) => ev(
            seq,
            "thinking",
            &format!(
                r#"{{"id":"0","variant":"{}","delta":{}}}"#,
                VARIANTS[*v],
                js(t)
            ),
        ),
        Step::ThinkEnd(v, tok) => {
            let tok = tok.map(|t| format!(r#","tokens":{t}"#)).unwrap_or_default();
            ev(
                seq,
                "thinking",
                &format!(
                    r#"{{"id":"0","variant":"{}","phase":"end"{tok}}}"#,
                    VARIANTS[*v]
                ),
            )
        }
        Step::ToolStart(i, n, a) => ev(
            seq,
            "item",
            &format!(
                r#"{{"phase":"start","id":"t{i}","kind":"tool","name":"{}","status":"in_progress","input":{{"command":{}}}}}"#,
                TOOLS[*n],
                js(a)
            ),
        ),
        Step::ToolEnd(i, failed, r) => ev(
            seq,
            "item",
            &format!(
                r#"{{"phase":"end","id":"t{i}","kind":"tool","status":"{}","result":{}}}"#,
                if *failed { "failed" } else { "completed" },
                js(r)
            ),
        ),
        Step::Say(i, t) => ev(
            seq,
            "assistant",
            &format!(r#"{{"id":"c{i}","phase":"commentary","delta":{}}}"#, js(t)),
        ),
        Step::Final(t, tr) => ev(
            seq,
            "assistant",
            &format!(
                r#"{{"phase":"final_answer","text":{},"truncated":{tr}}}"#,
                js(t)
            ),
        ),
        Step::Update => ev(
            seq,
            "lifecycle",
            r#"{"phase":"update","diagnostic":{"code":"rate_limit_event"}}"#,
        ),
        Step::End(r) => ev(
            seq,
            "lifecycle",
            &format!(
                r#"{{"phase":"end","reason":"{}","status":"completed"}}"#,
                ENDS[*r]
            ),
        ),
        Step::Error(r) => ev(
            seq,
            "lifecycle",
            &format!(r#"{{"phase":"error","reason":"{}"}}"#, ERRORS[*r]),
        ),
        Step::Replay(_) | Step::Flip => return None,
    })
}

/// The final the spec requires: the first final-answer event before the terminal one
/// with non-blank text, unless a silent token came first.
fn expected_final(events: &[Event]) -> Option<String> {
    for e in events {
        match &e.data {
            EventData::Lifecycle(l) if l.is_terminal() => return None,
            EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
                let Some(t) = a.text.as_ref().or(a.delta.as_ref()) else {
                    continue;
                };
                if t.trim().is_empty() {
                    continue;
                }
                if is_silent(t) {
                    return None;
                }
                return Some(t.clone());
            }
            _ => {}
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(400), ..ProptestConfig::default() })]

    #[test]
    fn projection_invariants(
        steps in proptest::collection::vec(step(), 0..40),
        s1 in settings(),
        s2 in settings(),
        t1 in tier(),
        t2 in tier(),
        interrupt in any::<bool>(),
    ) {
        let mut events = vec![ev(1, "lifecycle", r#"{"phase":"start"}"#)];
        let mut p = RunProjection::new("r1");
        let (mut s, mut t) = (s1.clone(), t1);
        let mut ops: Vec<(Op, usize)> = Vec::new(); // op + budget in effect
        let push = |new: Vec<Op>, s: &Settings, ops: &mut Vec<(Op, usize)>| {
            ops.extend(new.into_iter().map(|o| (o, s.budgets.draft_max_chars)));
        };
        let first = events[0].clone();
        push(p.apply(&first, &s, t), &s, &mut ops);
        for st in &steps {
            match st {
                Step::Replay(i) => {
                    let e = events[i % events.len()].clone();
                    let out = p.apply(&e, &s, t);
                    prop_assert!(out.is_empty(), "a replayed event produced {out:?}");
                }
                Step::Flip => {
                    (s, t) = if s == s1 && t == t1 { (s2.clone(), t2) } else { (s1.clone(), t1) };
                    let out = p.resettle(&s, t);
                    push(out, &s, &mut ops);
                }
                other => {
                    let seq = events.len() as u64 + 1;
                    if let Some(e) = build(seq, other) {
                        events.push(e.clone());
                        let out = p.apply(&e, &s, t);
                        push(out, &s, &mut ops);
                    }
                }
            }
        }
        if interrupt {
            let out = p.interrupted();
            push(out, &s, &mut ops);
        }

        let finals: Vec<&Op> = ops.iter().map(|(o, _)| o).filter(|o| matches!(o, Op::Final { .. })).collect();
        prop_assert!(finals.len() <= 1, "{finals:?}");
        let want = expected_final(&events);
        match (finals.first(), &want) {
            (Some(Op::Final { text, .. }), Some(w)) => prop_assert_eq!(text, w),
            (None, None) => {}
            // `delivery: final_only` holds the answer until the terminal event (issue #13).
            (None, Some(_)) if p.final_pending() => {}
            (got, want) => prop_assert!(false, "final {got:?}, expected {want:?}"),
        }
        let mut closed = false;
        for (op, budget) in &ops {
            prop_assert!(!closed, "op after settle/dismiss: {op:?}");
            match op {
                Op::Draft { text, .. } => {
                    prop_assert!(!text.is_empty());
                    prop_assert!(text.chars().count() <= *budget, "{} > {budget}", text.chars().count());
                }
                Op::Settle { text, .. } => {
                    prop_assert!(text.chars().count() <= *budget);
                    closed = true;
                }
                Op::Dismiss { .. } => closed = true,
                Op::Final { text, .. } => prop_assert!(!text.trim().is_empty()),
                _ => {}
            }
        }
    }
}

proptest! {
    /// Redaction never panics, and a key embedded anywhere in arbitrary text is masked
    /// (the text around it is separated by a space, as in a shell command or a log line).
    #[test]
    fn secrets_never_survive_display_safe(
        before in "\\PC{0,40}",
        after in "\\PC{0,40}",
        tail in "[A-Za-z0-9]{20,40}",
        kind in 0..5usize,
        cap in proptest::option::of(0..200usize),
    ) {
        let secret = match kind {
            0 => format!("sk-ant-{tail}"),
            1 => format!("ghp_{tail}"),
            2 => format!("xoxb-{tail}"),
            3 => format!("password={tail}"),
            _ => format!("Bearer {tail}"),
        };
        let text = format!("{before} {secret} {after}");
        let out = streamgate_projection::redact::display_safe(&text, cap);
        prop_assert!(!out.contains(&tail), "{out}");
        if let Some(c) = cap {
            prop_assert!(out.chars().count() <= c);
        }
    }
}

/// `default` property cases, or `$PROPTEST_CASES` (the fast test tier asks for fewer).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

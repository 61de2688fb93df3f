//! The live facts T1 drafts carry for natively streaming surfaces: thinking, tool rows
//! as tasks, the answer as an append-only text.

mod common;

use common::*;
use streamgate_projection::{Live, Op, Outcome, RunProjection, Settings, Tier};

fn lives(events: &[streamgate_grammar::Event], tier: Tier) -> Vec<Option<Live>> {
    let mut p = RunProjection::new("r1");
    let settings: Settings = settings("stream", "on");
    events
        .iter()
        .flat_map(|e| p.apply(e, &settings, tier))
        .filter_map(|op| match op {
            Op::Draft { live, .. } => Some(live.map(|l| *l)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_tool_loop_becomes_thinking_then_tasks_then_an_appended_answer() {
    let events = [
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", "planning the search"),
        think_end(4, "raw", None),
        tool_start(5, "call_1", "web_search", r#"{"q":"x"}"#),
        tool_end(6, "call_1", "completed", r#""ok""#),
        say(7, "m1", "The answer"),
        say(8, "m1", " is 42."),
    ];
    let lives = lives(&events, Tier::T1);
    let all: Vec<Live> = lives.into_iter().map(Option::unwrap_or_default).collect();
    assert!(all.iter().any(|l| l.thinking), "{all:#?}");
    let last = all.last().cloned().unwrap_or_default();
    assert!(!last.thinking);
    assert_eq!(last.tasks.len(), 1);
    assert_eq!(last.tasks[0].id, "call_1");
    assert_eq!(last.tasks[0].title, "web_search");
    assert_eq!(last.tasks[0].outcome, Outcome::Done);
    let answer = last.answer.unwrap();
    assert_eq!(
        (answer.offset, answer.text.as_str()),
        (0, "The answer is 42.")
    );
    assert_eq!(answer.segment, 7);
}

#[test]
fn a_secret_in_the_answer_is_never_in_the_live_text() {
    let events = [
        start(1),
        say(2, "m1", "use sk-ant-api03-"),
        say(3, "m1", "AbCdEfGhIjKlMnOpQrStUv and go\n"),
    ];
    for live in lives(&events, Tier::T1).into_iter().flatten() {
        let text = live.answer.map(|a| a.text).unwrap_or_default();
        assert!(!text.contains("AbCd"), "{text}");
    }
}

#[test]
fn only_t1_drafts_carry_live_facts() {
    let events = [start(1), say(2, "m1", "hello")];
    assert!(lives(&events, Tier::T1).iter().all(Option::is_some));
    let t2 = lives(&events, Tier::T2 { status_line: false });
    assert!(!t2.is_empty() && t2.iter().all(Option::is_none));
}

#[test]
fn a_shown_plan_is_a_title_and_steps() {
    let plan = ev(
        2,
        "lifecycle",
        r#"{"phase":"update","diagnostic":{"code":"plan","detail":{"sessionUpdate":"plan","entries":[{"content":"Read code","status":"completed"},{"content":"Fix bug","status":"in_progress"},{"content":"Run tests","status":"pending"}]}}}"#,
    );
    let events = [start(1), plan];
    let mut s: Settings = settings("on", "on");
    s.tag_visibility
        .0
        .insert(streamgate_projection::tags::PLAN.to_owned(), true);
    let mut p = RunProjection::new("r1");
    let live = events
        .iter()
        .flat_map(|e| p.apply(e, &s, Tier::T1))
        .find_map(|op| match op {
            Op::Draft { live, .. } => live,
            _ => None,
        })
        .and_then(|l| l.plan);
    let plan = live.expect("a plan");
    assert_eq!(plan.title, "📋 plan: 1/3 done · Fix bug");
    let steps: Vec<(&str, &str, Outcome)> = plan
        .steps
        .iter()
        .map(|t| (t.id.as_str(), t.title.as_str(), t.outcome))
        .collect();
    assert_eq!(
        steps,
        [
            ("plan-0", "Read code", Outcome::Done),
            ("plan-1", "Fix bug", Outcome::Running),
            ("plan-2", "Run tests", Outcome::Pending)
        ]
    );
    // Not shown: no plan.
    let mut q = RunProjection::new("r1");
    let hidden = events
        .iter()
        .flat_map(|e| q.apply(e, &settings("on", "on"), Tier::T1))
        .any(|op| matches!(op, Op::Draft { live: Some(l), .. } if l.plan.is_some()));
    assert!(!hidden);
}

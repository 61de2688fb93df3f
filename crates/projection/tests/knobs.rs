//! The ACP dedupe plan's knobs (issue #13), on every channel: tag visibility with the
//! minimal-noise defaults, status lines (latest per tag), repeat suppression, final-only
//! delivery and the budgets.

mod common;

use common::*;
use streamgate_grammar::Event;
use streamgate_projection::{
    tags, Budgets, Delivery, Op, RunProjection, Settings, TagVisibility, Tier,
};

/// A `lifecycle/update` with the ACP adapter's contract: `diagnostic.code` = the tag,
/// `diagnostic.detail` = the update object verbatim.
fn update(seq: u64, tag: &str, detail: &str) -> Event {
    ev(
        seq,
        "lifecycle",
        &format!(r#"{{"phase":"update","diagnostic":{{"code":"{tag}","detail":{detail}}}}}"#),
    )
}

fn plan(seq: u64, statuses: [&str; 3]) -> Event {
    let [a, b, c] = statuses;
    update(
        seq,
        tags::PLAN,
        &format!(
            r#"{{"sessionUpdate":"plan","entries":[{{"content":"Read code","status":"{a}","priority":"high"}},{{"content":"Fix bug","status":"{b}","priority":"high"}},{{"content":"Run tests","status":"{c}","priority":"low"}}]}}"#
        ),
    )
}

fn usage(seq: u64, used: u64) -> Event {
    ev(
        seq,
        "lifecycle",
        &format!(
            r#"{{"phase":"update","usage":{{"used":{used},"size":200000}},"diagnostic":{{"code":"usage_update","detail":{{"sessionUpdate":"usage_update","used":{used},"size":200000,"cost":{{"amount":0.01,"currency":"USD"}}}}}}}}"#
        ),
    )
}

fn tool_update(seq: u64, id: &str) -> Event {
    ev(
        seq,
        "item",
        &format!(r#"{{"phase":"update","id":"{id}","kind":"tool","status":"in_progress"}}"#),
    )
}

/// An ACP-like turn: every status tag, thinking, text, a tool, the final.
fn acp_run() -> Vec<Event> {
    vec![
        start(1),
        plan(2, ["completed", "in_progress", "pending"]),
        usage(3, 1200),
        update(
            4,
            tags::AVAILABLE_COMMANDS_UPDATE,
            r#"{"availableCommands":[{"name":"web","description":"search"},{"name":"test","description":"run tests"}]}"#,
        ),
        update(5, tags::CURRENT_MODE_UPDATE, r#"{"currentModeId":"code"}"#),
        update(
            6,
            tags::CONFIG_OPTION_UPDATE,
            r#"{"configOptions":[{"id":"model","name":"Model","type":"select","currentValue":"sonnet"}]}"#,
        ),
        update(7, tags::SESSION_INFO_UPDATE, r#"{"title":"Fix login bug"}"#),
        think_start(8, "raw"),
        think_delta(9, "raw", "the bug is in auth"),
        think_end(10, "raw", None),
        say(11, "m1", "Looking at the code."),
        tool_start(12, "t1", "read_file", r#"{"path":"src/auth.rs"}"#),
        tool_end(13, "t1", "completed", r#""ok""#),
        final_answer(14, "m2", "Fixed.", false),
        end(15, "completed"),
    ]
}

const STATUS_MARKS: [&str; 7] = ["📋", "📊", "⌘", "🔀", "⚙️", "🏷️", "ℹ️"];

fn shown(tag: &str) -> Settings {
    let mut s = Settings::default();
    s.tag_visibility.0.insert(tag.to_owned(), true);
    s
}

fn drafts(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .filter_map(|o| match o {
            Op::Draft { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn is_draft(o: &Op) -> bool {
    matches!(o, Op::Draft { .. })
}

#[test]
fn status_tags_and_thinking_are_hidden_by_default() {
    let events = acp_run();
    let per_event = project(&events, &Settings::default(), Tier::T1);
    // No update event makes an edit; nothing of them (nor thinking) reaches the draft.
    for (i, ops) in per_event.iter().enumerate().take(10).skip(1) {
        assert!(
            !ops.iter().any(is_draft),
            "event {} drafted: {ops:?}",
            i + 1
        );
    }
    let all: Vec<Op> = per_event.into_iter().flatten().collect();
    for d in drafts(&all) {
        for mark in STATUS_MARKS.iter().chain(&["🧠"]) {
            assert!(!d.contains(mark), "{mark} in {d}");
        }
    }
    assert_eq!(
        last_draft(&all).as_deref(),
        Some("Looking at the code.\n📄 read_file ✅")
    );
    assert!(all.contains(&final_op("Fixed.", 14)));
}

#[test]
fn each_enabled_tag_renders_its_status_line() {
    let cases = [
        (tags::PLAN, "📋 plan: 1/3 done · Fix bug"),
        (tags::USAGE_UPDATE, "📊 1200/200000 tokens · 0.01 USD"),
        (tags::AVAILABLE_COMMANDS_UPDATE, "⌘ 2 commands"),
        (tags::CURRENT_MODE_UPDATE, "🔀 mode: code"),
        (tags::CONFIG_OPTION_UPDATE, "⚙️ config: model=sonnet"),
        (tags::SESSION_INFO_UPDATE, "🏷️ Fix login bug"),
    ];
    let events = acp_run();
    for (tag, line) in cases {
        let ops = flat(&events[..13], &shown(tag), Tier::T1);
        let last = last_draft(&ops).unwrap_or_default();
        // The line, alone of its kind, at the foot of the draft.
        assert_eq!(
            last,
            format!("Looking at the code.\n📄 read_file ✅\n{line}"),
            "{tag}"
        );
        // It showed as soon as its update arrived.
        let first = drafts(&ops).into_iter().next().unwrap_or_default();
        assert_eq!(first, line, "{tag}");
    }
    // Any other code: `ℹ️ <code>`.
    let events = vec![
        start(1),
        update(2, "rate_limit_event", r#"{"status":"allowed"}"#),
    ];
    let ops = flat(&events, &shown("rate_limit_event"), Tier::T1);
    assert_eq!(last_draft(&ops).as_deref(), Some("ℹ️ rate_limit_event"));
    // Every tag on, on the full T2 surface too: one line each, fixed order.
    let mut all = Settings::default();
    for (tag, _) in cases {
        all.tag_visibility.0.insert(tag.to_owned(), true);
    }
    let ops = flat(&acp_run()[..8], &all, Tier::T2 { status_line: false });
    let want: Vec<&str> = [0, 3, 5, 4, 2, 1].iter().map(|&i| cases[i].1).collect();
    assert_eq!(last_draft(&ops), Some(want.join("\n")));
}

#[test]
fn thought_chunks_follow_reasoning_unless_set() {
    let events = acp_run();
    let thinking = "> 🧠 the bug is in auth";
    // Default: follows /reasoning (off: hidden, on: shown).
    let off = flat(&events[..11], &Settings::default(), Tier::T1);
    assert!(!last_draft(&off).unwrap_or_default().contains("🧠"));
    let on = flat(&events[..11], &settings("on", "on"), Tier::T1);
    assert!(last_draft(&on).unwrap_or_default().starts_with(thinking));
    // Explicit true shows it (as `on`) with /reasoning off.
    let ops = flat(&events[..11], &shown(tags::AGENT_THOUGHT_CHUNK), Tier::T1);
    assert!(last_draft(&ops).unwrap_or_default().starts_with(thinking));
    // Explicit false hides it even under /reasoning stream, and declares no clamp.
    for tier in [Tier::T1, Tier::T2 { status_line: true }] {
        let mut s = settings("stream", "on");
        s.tag_visibility
            .0
            .insert(tags::AGENT_THOUGHT_CHUNK.into(), false);
        let ops = flat(&events, &s, tier);
        assert!(drafts(&ops).iter().all(|d| !d.contains("🧠")), "{ops:?}");
        assert!(
            !ops.iter().any(|o| matches!(o, Op::Notice { .. })),
            "{ops:?}"
        );
    }
}

#[test]
fn a_tags_latest_update_replaces_its_line() {
    let events = vec![
        start(1),
        plan(2, ["in_progress", "pending", "pending"]),
        plan(3, ["completed", "completed", "in_progress"]),
        plan(4, ["completed", "completed", "completed"]),
    ];
    let ops = flat(&events, &shown(tags::PLAN), Tier::T1);
    assert_eq!(
        drafts(&ops),
        vec![
            "📋 plan: 0/3 done · Read code",
            "📋 plan: 2/3 done · Run tests",
            "📋 plan: 3/3 done",
        ]
    );
}

#[test]
fn repeats_are_suppressed_by_default() {
    let mut s = shown(tags::PLAN);
    s.tag_visibility.0.insert(tags::USAGE_UPDATE.into(), true);
    s.verbose = "full".parse().unwrap();
    let events = vec![
        start(1),
        plan(2, ["in_progress", "pending", "pending"]),
        plan(3, ["in_progress", "pending", "pending"]),
        usage(4, 10),
        usage(5, 10),
        tool_start(6, "t1", "bash", r#"{"command":"ls"}"#),
        tool_update(7, "t1"),
        tool_update(8, "t1"),
        usage(9, 20),
    ];
    let per_event = project(&events, &s, Tier::T1);
    let edits: Vec<bool> = per_event
        .iter()
        .map(|ops| ops.iter().any(is_draft))
        .collect();
    assert_eq!(
        edits,
        [false, true, false, true, false, true, false, false, true],
        "{per_event:?}"
    );
}

#[test]
fn repeats_are_allowed_with_suppression_off() {
    let mut s = shown(tags::PLAN);
    s.tag_visibility.0.insert(tags::USAGE_UPDATE.into(), true);
    s.suppress_repeats = false;
    let events = vec![
        start(1),
        plan(2, ["in_progress", "pending", "pending"]),
        plan(3, ["in_progress", "pending", "pending"]),
        usage(4, 10),
        usage(5, 10),
        tool_start(6, "t1", "bash", r#"{"command":"ls"}"#),
        tool_update(7, "t1"),
        tool_update(8, "t1"),
    ];
    let per_event = project(&events, &s, Tier::T1);
    let edits: Vec<bool> = per_event
        .iter()
        .map(|ops| ops.iter().any(is_draft))
        .collect();
    assert_eq!(edits, [false, true, true, true, true, true, true, true]);
    // Same text each time for a repeat: only the edit is repeated.
    let d = drafts(&per_event.concat());
    assert_eq!(d[0], d[1]);
    assert_eq!(d[2], d[3]);
    // A hidden tag stays silent even then.
    let events = vec![
        start(1),
        update(
            2,
            tags::AVAILABLE_COMMANDS_UPDATE,
            r#"{"availableCommands":[]}"#,
        ),
        update(
            3,
            tags::AVAILABLE_COMMANDS_UPDATE,
            r#"{"availableCommands":[]}"#,
        ),
    ];
    assert!(!flat(&events, &s, Tier::T1).iter().any(is_draft));
}

#[test]
fn available_commands_stay_hidden_while_other_tags_show() {
    let mut s = shown(tags::PLAN);
    s.tag_visibility
        .0
        .insert(tags::CURRENT_MODE_UPDATE.into(), true);
    let events = acp_run();
    let per_event = project(&events, &s, Tier::T1);
    // The commands update (seq 4) makes no edit; the draft never names them.
    assert!(!per_event[3].iter().any(is_draft), "{:?}", per_event[3]);
    let all = per_event.concat();
    assert!(drafts(&all).iter().all(|d| !d.contains("⌘")));
    assert!(drafts(&all).iter().any(|d| d.contains("🔀 mode: code")));
}

#[test]
fn final_only_defers_everything_to_the_terminal_event() {
    let mut s = settings("stream", "full");
    for tag in tags::KNOWN {
        s.tag_visibility.0.insert(tag.to_owned(), true);
    }
    s.delivery = Delivery::FinalOnly;
    for tier in [Tier::T1, Tier::T2 { status_line: false }, Tier::T0] {
        let per_event = project(&acp_run(), &s, tier);
        let Some((last, before)) = per_event.split_last() else {
            panic!("no ops")
        };
        assert!(before.iter().all(Vec::is_empty), "{tier:?}: {before:?}");
        assert_eq!(last, &vec![final_op("Fixed.", 14)], "{tier:?}");
    }
    // A run that never gets its terminal event delivers the answer at recovery.
    let events = acp_run();
    let mut p = RunProjection::new("r1");
    for e in &events[..14] {
        assert!(p.apply(e, &s, Tier::T1).is_empty());
    }
    assert!(p.final_pending());
    let ops = p.interrupted();
    assert_eq!(ops.first(), Some(&final_op("Fixed.", 14)));
    // Switching the chat to live delivers it at once.
    let mut p = RunProjection::new("r1");
    for e in &events[..14] {
        p.apply(e, &s, Tier::T1);
    }
    let live = Settings::default();
    let ops = p.resettle(&live, Tier::T1);
    assert_eq!(ops.first(), Some(&final_op("Fixed.", 14)));
    assert_eq!(p.final_seq(), Some(14));
    assert!(!p
        .apply(&events[14], &live, Tier::T1)
        .iter()
        .any(|o| matches!(o, Op::Final { .. })));
}

#[test]
fn text_streaming_and_truncation_are_unchanged_by_hidden_tags() {
    // The same turn with and without (hidden) status updates renders the same drafts,
    // the same truncated final and the same settle.
    let text: String = "word ".repeat(500);
    let plain = vec![
        start(1),
        say(2, "m1", &text[..1000]),
        say(3, "m1", &text[1000..]),
        final_answer(4, "m2", "The answer is", true),
        end(5, "truncated"),
    ];
    let noisy = vec![
        start(1),
        plan(2, ["pending", "pending", "pending"]),
        say(3, "m1", &text[..1000]),
        usage(4, 5),
        update(
            5,
            tags::AVAILABLE_COMMANDS_UPDATE,
            r#"{"availableCommands":[]}"#,
        ),
        say(6, "m1", &text[1000..]),
        update(7, tags::SESSION_INFO_UPDATE, r#"{"title":"t"}"#),
        final_answer(8, "m2", "The answer is", true),
        end(9, "truncated"),
    ];
    let budgets = Budgets {
        draft_max_chars: 300,
        ..Budgets::default()
    };
    let s = Settings {
        budgets,
        ..Settings::default()
    };
    let strip = |ops: Vec<Op>| -> Vec<(String, String)> {
        ops.into_iter()
            .filter(|o| !matches!(o, Op::Typing))
            .map(|o| match o {
                Op::Draft { text, .. } => ("draft".into(), text),
                Op::Final { text, suffix, .. } => ("final".into(), format!("{text}|{suffix:?}")),
                Op::Settle { text, .. } => ("settle".into(), text),
                other => (other.name().into(), String::new()),
            })
            .collect()
    };
    let a = strip(flat(&plain, &s, Tier::T1));
    let b = strip(flat(&noisy, &s, Tier::T1));
    assert_eq!(a, b);
    assert!(a
        .iter()
        .any(|(k, t)| k == "draft" && t.contains("chars omitted")));
    assert!(a
        .iter()
        .any(|(k, t)| k == "final" && t.contains("truncated (token limit)")));
}

#[test]
fn message_and_tool_tags_can_be_hidden() {
    let events = acp_run();
    // Message chunks hidden: no commentary in the draft, the final still delivered.
    let mut s = Settings::default();
    s.tag_visibility
        .0
        .insert(tags::AGENT_MESSAGE_CHUNK.into(), false);
    let ops = flat(&events, &s, Tier::T1);
    assert_eq!(last_draft(&ops).as_deref(), Some("📄 read_file ✅"));
    assert!(ops.contains(&final_op("Fixed.", 14)));
    // Tool calls hidden: no rows, not counted in the settle.
    let mut s = Settings::default();
    s.tag_visibility.0.insert(tags::TOOL_CALL.into(), false);
    let ops = flat(&events[..13], &s, Tier::T1);
    assert_eq!(last_draft(&ops).as_deref(), Some("Looking at the code."));
    // Tool updates hidden: the row stays as it started, its end makes no edit.
    let mut s = Settings::default();
    s.tag_visibility
        .0
        .insert(tags::TOOL_CALL_UPDATE.into(), false);
    let per_event = project(&events[..13], &s, Tier::T1);
    assert!(!per_event[12].iter().any(is_draft));
    assert_eq!(
        last_draft(&per_event.concat()).as_deref(),
        Some("Looking at the code.\n📄 read_file ⏳")
    );
}

#[test]
fn status_lines_are_capped_redacted_and_within_the_turn_budget() {
    let long = "x".repeat(500);
    let events = vec![
        start(1),
        update(
            2,
            tags::SESSION_INFO_UPDATE,
            &format!(r#"{{"title":"deploy with password=hunter2 {long}"}}"#),
        ),
    ];
    let mut s = shown(tags::SESSION_INFO_UPDATE);
    s.budgets.status_chars = 40;
    let d = last_draft(&flat(&events, &s, Tier::T1)).unwrap_or_default();
    assert_eq!(d.chars().count(), 40, "{d}");
    assert!(d.ends_with('…'));
    assert!(!d.contains("hunter2"), "{d}");
    // maxTurnChars bounds the whole draft, status lines included.
    s.budgets.status_chars = 500;
    s.budgets.draft_max_chars = 30;
    let d = last_draft(&flat(&events, &s, Tier::T1)).unwrap_or_default();
    assert!(d.chars().count() <= 30, "{d}");
    // A cleared title removes its line (and the draft, having nothing else, is
    // dismissed at the end: status lines are not content).
    let events = vec![
        start(1),
        update(2, tags::SESSION_INFO_UPDATE, r#"{"title":"T"}"#),
        update(3, tags::SESSION_INFO_UPDATE, r#"{"title":null}"#),
        end(4, "completed"),
    ];
    let ops = flat(&events, &shown(tags::SESSION_INFO_UPDATE), Tier::T1);
    assert_eq!(drafts(&ops), vec!["🏷️ T"]);
    assert_eq!(ops.last(), Some(&dismiss()));
}

#[test]
fn visibility_lists_parse_and_old_settings_still_read() {
    let v = TagVisibility::parse_list("plan=show, usage_update=on,agent_message_chunk=hide")
        .unwrap_or_default();
    assert_eq!(v.get("plan"), Some(true));
    assert_eq!(v.get("usage_update"), Some(true));
    assert!(!v.shown("agent_message_chunk"));
    assert!(v.shown("tool_call"));
    assert!(!v.shown("config_option_update"));
    assert_eq!(
        v.to_string(),
        "agent_message_chunk=hide,plan=show,usage_update=show"
    );
    assert!(TagVisibility::parse_list("plan").is_err());
    assert!(TagVisibility::parse_list("plan=maybe").is_err());
    // Settings serialized before the knobs existed read with their defaults.
    let old = r#"{"reasoning":"on","verbose":"full","delivery":"live","budgets":{"draft_max_chars":900,"thinking_chars":600,"item_detail_chars":120},"suppress_repeats":true,"show_variant_tags":false}"#;
    let s: Settings = serde_json::from_str(old).unwrap_or_default();
    assert_eq!(s.budgets.draft_max_chars, 900);
    assert_eq!(
        s.budgets.status_chars,
        streamgate_projection::DEFAULT_STATUS_CHARS
    );
    assert!(s.tag_visibility.0.is_empty());
    let json = serde_json::to_string(&shown(tags::PLAN)).unwrap_or_default();
    assert!(json.contains(r#""tag_visibility":{"plan":true}"#), "{json}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// Update objects of every shape a stream may send, well-formed or not.
    fn detail() -> impl Strategy<Value = String> {
        let text = "\\PC{0,30}".prop_map(|t| serde_json::to_string(&t).unwrap_or_default());
        prop_oneof![
            Just("null".to_owned()),
            Just("[]".to_owned()),
            Just("42".to_owned()),
            Just(r#"{"entries":"x"}"#.to_owned()),
            Just(r#"{"entries":[1,null,{"status":3,"content":{}}]}"#.to_owned()),
            Just(r#"{"used":-1.5,"size":"big","cost":{"amount":"?"}}"#.to_owned()),
            Just(r#"{"used":null,"cost":7}"#.to_owned()),
            Just(r#"{"availableCommands":{"a":1}}"#.to_owned()),
            Just(r#"{"configOptions":[{"id":"m","currentValue":[1]},{"name":5}]}"#.to_owned()),
            Just(r#"{"currentModeId":7,"title":false}"#.to_owned()),
            text.clone().prop_map(|t| format!(
                r#"{{"entries":[{{"content":{t},"status":"in_progress"}}]}}"#
            )),
            text.clone()
                .prop_map(|t| format!(r#"{{"title":{t},"currentModeId":{t}}}"#)),
            text.prop_map(|t| format!(
                r#"{{"used":1,"size":2,"cost":{{"amount":3,"currency":{t}}}}}"#
            )),
        ]
    }

    fn tag() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(tags::KNOWN.to_vec()).prop_map(str::to_owned),
            "[a-z_]{1,12}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(200), ..ProptestConfig::default() })]

        /// Whatever the updates hold and whichever tags are on: no panic, drafts within
        /// the turn budget and never empty, status lines within their cap, one final.
        #[test]
        fn any_update_renders_within_budgets(
            updates in proptest::collection::vec((tag(), detail()), 0..12),
            on in proptest::collection::vec(tag(), 0..6),
            max in 0..300usize,
            status_cap in 0..80usize,
            repeats in any::<bool>(),
        ) {
            let mut s = Settings::default();
            for t in on {
                s.tag_visibility.0.insert(t, true);
            }
            s.budgets.draft_max_chars = max;
            s.budgets.status_chars = status_cap;
            s.suppress_repeats = repeats;
            let mut events = vec![start(1)];
            for (tag, d) in &updates {
                let seq = events.len() as u64 + 1;
                let tag = serde_json::to_string(tag).unwrap_or_default();
                events.push(ev(
                    seq,
                    "lifecycle",
                    &format!(r#"{{"phase":"update","diagnostic":{{"code":{tag},"detail":{d}}}}}"#),
                ));
            }
            let n = events.len() as u64;
            events.push(final_answer(n + 1, "m", "done", false));
            events.push(end(n + 2, "completed"));
            for tier in [Tier::T1, Tier::T2 { status_line: false }, Tier::T2 { status_line: true }, Tier::T0] {
                let ops = flat(&events, &s, tier);
                prop_assert_eq!(ops.iter().filter(|o| matches!(o, Op::Final { .. })).count(), 1);
                for d in drafts(&ops) {
                    prop_assert!(!d.is_empty());
                    prop_assert!(d.chars().count() <= max);
                    // Only status lines here (and perhaps the overflow marker line, itself
                    // cut when the turn budget is tiny).
                    for line in d.lines().filter(|l| !l.starts_with("… [")) {
                        prop_assert!(line.chars().count() <= status_cap, "{line}");
                    }
                }
            }
        }
    }
}

/// A diagnostic named like an event lane (`tool_call`, `agent_message_chunk`, …) is not a
/// status line, although those tags are shown by default: lifecycle updates render only
/// through the status tags (spec §3.4).
#[test]
fn a_diagnostic_named_like_an_event_lane_is_no_status_line() {
    let mut events = vec![start(1)];
    for (i, tag) in tags::EVENT_LANES.iter().enumerate() {
        events.push(update(i as u64 + 2, tag, "null"));
    }
    let n = events.len() as u64;
    events.push(final_answer(n + 1, "m", "done", false));
    events.push(end(n + 2, "completed"));
    let ops = flat(&events, &Settings::default(), Tier::T1);
    assert!(drafts(&ops).is_empty(), "{:?}", drafts(&ops));
    assert!(ops.contains(&final_op("done", n + 1)));
}

/// `default` property cases, or `$PROPTEST_CASES` (the fast test tier asks for fewer).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

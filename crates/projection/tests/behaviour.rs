//! Terminal paths, finals, silent runs, overflow, settings flips, replay and recovery.

mod common;

use common::*;
use streamgate_grammar::{Envelope, Event, RunEvent};
use streamgate_projection::{
    Budgets, Op, RunProjection, Settings, Tier, REJECT_PLACEHOLDER, TRUNCATED_SUFFIX,
};

fn t1() -> Tier {
    Tier::T1
}

fn count(ops: &[Op], name: &str) -> usize {
    ops.iter().filter(|o| o.name() == name).count()
}

#[test]
fn reject_retracts_rendered_text_and_settles_to_error() {
    let events = vec![
        start(1),
        say(2, "0", "Here is how to do the unsafe th"),
        error(3, "refusal", None),
    ];
    let ops = flat(&events, &settings("off", "on"), t1());
    assert_eq!(
        ops,
        vec![
            Op::Typing,
            draft("Here is how to do the unsafe th", 2),
            Op::Retract {
                key: key(),
                placeholder: REJECT_PLACEHOLDER.into(),
                seq: 3
            },
            settle(
                &format!("{REJECT_PLACEHOLDER} · 🧠 0 segments · 0 tools"),
                3
            ),
        ]
    );
    // The rejected text is never in the settled state, and no final goes out.
    assert_eq!(count(&ops, "final"), 0);
    // content_filter on an `end` takes the same path; append-only channels get a notice.
    let events = vec![start(1), say(2, "0", "x"), end(3, "content_filter")];
    let ops = flat(&events, &settings("off", "off"), Tier::T0);
    assert_eq!(ops, vec![Op::Typing, notice(REJECT_PLACEHOLDER, 3)]);
}

#[test]
fn truncated_final_carries_the_suffix_line() {
    let events = vec![
        start(1),
        say(2, "0", "The answer is"),
        final_answer(3, "0", "The answer is", true),
        end(4, "truncated"),
    ];
    let ops = flat(&events, &settings("off", "on"), t1());
    assert!(ops.contains(&Op::Final {
        key: key(),
        text: "The answer is".into(),
        truncated: true,
        suffix: Some(TRUNCATED_SUFFIX.into()),
        seq: 3
    }));
    // The only commentary was the final's own segment: content-free, so dismissed.
    assert_eq!(ops.last(), Some(&dismiss()));
}

#[test]
fn zero_text_turn_has_no_final() {
    for text in ["", "   \n"] {
        let events = vec![
            start(1),
            final_answer(2, "0", text, false),
            end(3, "completed"),
        ];
        let ops = flat(&events, &settings("on", "on"), t1());
        assert_eq!(count(&ops, "final"), 0, "{text:?}");
        assert_eq!(ops, vec![Op::Typing, dismiss()]);
    }
    let events = vec![start(1), end(2, "completed")];
    assert_eq!(
        flat(&events, &settings("on", "on"), Tier::T0),
        vec![Op::Typing]
    );
}

#[test]
fn paused_turn_settles_to_paused() {
    let events = vec![
        start(1),
        tool_start(2, "t", "web_search", r#"{"query":"rust"}"#),
        end(3, "paused"),
    ];
    let ops = flat(&events, &settings("off", "on"), t1());
    assert_eq!(
        ops.last(),
        Some(&settle("⏸️ paused · 🧠 0 segments · 1 tool", 3))
    );
    assert_eq!(last_draft(&ops).as_deref(), Some("🔍 web_search ⏳"));
    // Content-free paused drafts still say they paused; T0 says it in a notice.
    let events = vec![start(1), end(2, "paused")];
    assert_eq!(
        flat(&events, &settings("off", "off"), t1()).last(),
        Some(&settle("⏸️ paused", 2))
    );
    assert_eq!(
        flat(&events, &settings("off", "off"), Tier::T0).last(),
        Some(&notice("⏸️ paused", 2))
    );
}

#[test]
fn tool_yield_end_settles_the_draft() {
    let events = vec![
        start(1),
        say(2, "0", "Let me look."),
        tool_start(3, "t", "read_file", r#"{"path":"/a/b/c/d.rs"}"#),
        end(4, "tool_use"),
    ];
    let ops = flat(&events, &settings("off", "full"), t1());
    assert_eq!(
        last_draft(&ops).as_deref(),
        Some("Let me look.\n📄 read_file ⏳ — …/c/d.rs")
    );
    assert_eq!(ops.last(), Some(&settle("🧠 0 segments · 1 tool", 4)));
}

#[test]
fn error_notices_and_settles_to_error_state() {
    let events = vec![
        start(1),
        say(2, "0", "Working on it"),
        error(
            3,
            "error",
            Some("overloaded (api_key=sk-abcdefghijklmnopqrst)"),
        ),
    ];
    let ops = flat(&events, &settings("off", "on"), t1());
    assert_eq!(
        &ops[2..],
        &[
            notice("❌ error: overloaded (api_key=***)", 3),
            settle("❌ error · 🧠 0 segments · 0 tools", 3),
        ]
    );
    // Content-free: the notice carries the error, the draft is dismissed.
    let ops = flat(
        &[start(1), error(2, "error", None)],
        &settings("off", "on"),
        t1(),
    );
    assert_eq!(
        ops,
        vec![Op::Typing, notice("❌ error: error", 2), dismiss()]
    );
}

#[test]
fn stream_closed_is_an_error() {
    let events = vec![
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", "hmm"),
        error(4, "stream_closed", None),
    ];
    let ops = flat(&events, &settings("stream", "on"), t1());
    assert_eq!(
        &ops[ops.len() - 2..],
        &[
            notice(
                "❌ stream closed: the provider connection ended before the turn finished",
                4
            ),
            settle("❌ error · 🧠 1 segment · 0 tools", 4),
        ]
    );
    let t0 = flat(&events, &settings("stream", "on"), Tier::T0);
    assert_eq!(count(&t0, "notice"), 2, "clamp declaration + the error");
}

#[test]
fn degenerate_tool_only_turn_with_flags_off_is_dismissed() {
    let events = vec![
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", "secret plan"),
        think_end(4, "raw", None),
        tool_start(5, "t", "bash", r#"{"command":"ls"}"#),
        tool_end(6, "t", "completed", r#""ok""#),
        end(7, "tool_use"),
    ];
    let ops = flat(&events, &settings("off", "off"), t1());
    assert_eq!(
        ops,
        vec![Op::Typing, dismiss()],
        "no draft is ever created for liveness alone"
    );
}

#[test]
fn silent_runs_produce_nothing() {
    for token in ["NO_REPLY", "HEARTBEAT_OK", "  NO_REPLY\n"] {
        let events = vec![
            start(1),
            say(2, "0", token),
            final_answer(3, "0", token, false),
            end(4, "completed"),
        ];
        for tier in [Tier::T1, Tier::T2 { status_line: false }, Tier::T0] {
            let ops = flat(&events, &settings("off", "on"), tier);
            assert_eq!(count(&ops, "final"), 0);
            assert_eq!(
                count(&ops, "draft"),
                0,
                "the token never flashes into a draft"
            );
            assert_eq!(count(&ops, "notice"), 0, "not even a clamp declaration");
        }
    }
    // A silent run that had drafted activity dismisses the draft.
    let events = vec![
        start(1),
        tool_start(2, "t", "bash", r#"{"command":"uptime"}"#),
        final_answer(3, "0", "HEARTBEAT_OK", false),
        end(4, "completed"),
    ];
    let ops = flat(&events, &settings("off", "on"), t1());
    assert_eq!(ops.last(), Some(&dismiss()));
    assert_eq!(count(&ops, "final"), 0);
}

#[test]
fn final_is_delivered_exactly_once_under_replay() {
    let events = [
        start(1),
        say(2, "0", "Hi"),
        final_answer(3, "0", "Hi there", false),
        end(4, "completed"),
    ];
    let mut p = RunProjection::new("r1");
    let s = settings("off", "on");
    let mut ops = Vec::new();
    for e in events.iter().chain(events.iter()).chain(&events[1..3]) {
        ops.extend(p.apply(e, &s, t1()));
    }
    assert_eq!(count(&ops, "final"), 1);
    // A second final_answer event with a new seq is ignored too.
    let mut p = RunProjection::new("r1");
    let mut ops = Vec::new();
    for e in [
        start(1),
        final_answer(2, "0", "one", false),
        final_answer(3, "0", "two", false),
    ] {
        ops.extend(p.apply(&e, &s, t1()));
    }
    assert_eq!(
        ops.iter()
            .filter(|o| o.name() == "final")
            .collect::<Vec<_>>(),
        vec![&final_op("one", 2)]
    );
}

#[test]
fn nothing_after_settle() {
    let mut p = RunProjection::new("r1");
    let s = settings("stream", "full");
    p.apply(&start(1), &s, t1());
    p.apply(&say(2, "0", "x"), &s, t1());
    assert!(!p.apply(&end(3, "completed"), &s, t1()).is_empty());
    assert!(p.is_settled());
    assert!(p.apply(&say(4, "1", "late"), &s, t1()).is_empty());
    assert!(p.resettle(&settings("off", "off"), t1()).is_empty());
    assert!(p.interrupted().is_empty());
}

fn busy_turn() -> Vec<Event> {
    vec![
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", "first idea"),
        say(4, "c1", "Checking."),
        think_delta(5, "raw", ", second idea"),
        tool_start(6, "t", "bash", r#"{"command":"ls /x/y/z"}"#),
        think_end(7, "raw", None),
        tool_end(8, "t", "failed", r#""permission denied""#),
        say(9, "c2", "Done"),
        final_answer(10, "c2", "Done", false),
        end(11, "completed"),
    ]
}

#[test]
fn settings_flip_mid_turn_changes_rendering_only() {
    let events = busy_turn();
    let before: Vec<String> = events.iter().map(Event::to_json).collect();
    let off = settings("off", "off");
    let full = settings("stream", "full");

    let mut p = RunProjection::new("r1");
    let mut ops = Vec::new();
    for e in &events[..5] {
        ops.extend(p.apply(e, &off, t1()));
    }
    assert_eq!(last_draft(&ops).as_deref(), Some("Checking."));
    // Flip: the open thinking segment and the commentary re-render at once.
    let flipped: Vec<Op> = p
        .resettle(&full, t1())
        .into_iter()
        .map(without_live)
        .collect();
    assert_eq!(
        flipped,
        vec![draft("> 🧠 first idea, second idea\nChecking.", 5)]
    );
    for e in &events[5..] {
        ops.extend(p.apply(e, &full, t1()));
    }
    // The input events are byte-identical after projection under both settings.
    let after: Vec<String> = events.iter().map(Event::to_json).collect();
    assert_eq!(before, after);
    // The folded state matches a fold that never saw any settings.
    let mut fold = streamgate_grammar::RunState::windowed(streamgate_projection::TEXT_WINDOW_BYTES);
    events.iter().for_each(|e| fold.apply(e));
    assert_eq!(p.state(), &fold);
    // Flipping back to the same settings changes nothing.
    let mut q = RunProjection::new("r1");
    for e in &events[..5] {
        q.apply(e, &full, t1());
    }
    assert!(q.resettle(&full, t1()).is_empty());
}

#[test]
fn status_line_and_reasoning_on_flip() {
    let events = busy_turn();
    let mut p = RunProjection::new("r1");
    let on = settings("on", "on");
    for e in &events[..6] {
        p.apply(e, &on, t1());
    }
    // `on` shows thinking only at segment end; switching to stream shows it live.
    let ops = p.resettle(&settings("stream", "on"), t1());
    assert_eq!(
        last_draft(&ops).as_deref(),
        Some("> 🧠 first idea, second idea\nChecking.\n💻 bash ⏳")
    );
}

#[test]
fn path_independence_primary_queued_and_replay_from_seq() {
    let events = busy_turn();
    let s = settings("stream", "full");
    for tier in [Tier::T1, Tier::T2 { status_line: true }, Tier::T0] {
        // With the drafts' live facts: a restored projection must produce them too.
        let with_live = |events: &[Event]| -> Vec<Vec<Op>> {
            let mut p = RunProjection::new("r1");
            events.iter().map(|e| p.apply(e, &s, tier)).collect()
        };
        let primary = with_live(&events);
        let queued = with_live(&events);
        assert_eq!(primary, queued);
        for k in 1..events.len() {
            // A projection that rendered up to seq k, then replays from k-1 (overlap).
            let mut p = RunProjection::restore("r1", &events[..k], &s, tier);
            assert_eq!(p.last_seq(), k as u64);
            let from = k.saturating_sub(2);
            let replayed: Vec<Op> = events[from..]
                .iter()
                .flat_map(|e| p.apply(e, &s, tier))
                .collect();
            let want: Vec<Op> = primary[k..].iter().flatten().cloned().collect();
            assert_eq!(replayed, want, "{tier:?} resumed after seq {k}");
        }
    }
}

#[test]
fn ops_since_gives_a_reconnecting_subscriber_no_gap_and_no_duplicate() {
    let events = busy_turn();
    let s = settings("stream", "on");
    let mut p = RunProjection::new("r1");
    let mut seen = Vec::new();
    for e in &events[..6] {
        seen.extend(p.apply(e, &s, t1()));
    }
    let last_rendered = p.last_seq();
    for e in &events[6..] {
        p.apply(e, &s, t1());
    }
    let missed = p.ops_since(last_rendered);
    // Latest-wins: one settle, no stale drafts (the settle supersedes), no final (it
    // travels on the reliable path), no typing.
    assert_eq!(missed, vec![settle("🧠 1 segment · 1 tool", 11)]);
    // Mid-turn: the latest draft only.
    let mut q = RunProjection::new("r1");
    for e in &events[..9] {
        q.apply(e, &s, t1());
    }
    let missed = q.ops_since(5);
    assert_eq!(missed.len(), 1);
    assert_eq!(missed[0].name(), "draft");
    assert!(q.ops_since(q.last_seq()).is_empty());
}

#[test]
fn interrupted_settles_orphaned_drafts_without_resending_the_final() {
    let events = busy_turn();
    let s = settings("off", "on");
    let mut p = RunProjection::restore("r1", &events[..10], &s, t1());
    assert_eq!(p.final_seq(), Some(10));
    assert_eq!(p.interrupted(), vec![settle("⚠️ agent interrupted", 10)]);
    assert!(p.interrupted().is_empty());
    // No draft on the channel: a notice instead.
    let mut p = RunProjection::restore("r1", &events[..1], &s, t1());
    assert_eq!(p.interrupted(), vec![notice("⚠️ agent interrupted", 1)]);
    // Never started: nothing to recover.
    assert!(RunProjection::new("r1").interrupted().is_empty());
}

#[test]
fn overflow_elides_thinking_then_items_then_commentary() {
    let long = "x".repeat(3000);
    let mut events = vec![
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", &long),
        think_end(4, "raw", None),
    ];
    let mut seq = 5;
    for i in 0..10 {
        events.push(tool_start(
            seq,
            &format!("t{i}"),
            "bash",
            r#"{"command":"cargo test --workspace --all-features"}"#,
        ));
        seq += 1;
    }
    events.push(say(seq, "c", "Still working on the failing tests."));
    let budgets = Budgets {
        draft_max_chars: 400,
        thinking_chars: 600,
        item_detail_chars: 120,
        ..Budgets::default()
    };
    let s = Settings {
        budgets,
        ..settings("stream", "full")
    };
    let ops = flat(&events, &s, t1());
    for op in &ops {
        if let Op::Draft { text, .. } = op {
            assert!(
                text.chars().count() <= 400,
                "{} chars",
                text.chars().count()
            );
        }
    }
    let text = last_draft(&ops).unwrap();
    assert!(text.starts_with("> 🧠 x"), "{text}");
    assert!(
        text.contains("chars omitted]"),
        "thinking elided head+tail: {text}"
    );
    assert!(
        text.ends_with("Still working on the failing tests."),
        "commentary survives: {text}"
    );
    assert_eq!(
        text.lines().count(),
        12,
        "never splits, never drops a row here: {text}"
    );
    // T1 lane budget alone (no overall pressure): head+tail at thinking_chars.
    let s = settings("stream", "off");
    let text = last_draft(&flat(&events[..4], &s, t1())).unwrap();
    assert_eq!(
        text,
        format!(
            "> 🧠 {} … [2400 chars omitted] {}",
            "x".repeat(300),
            "x".repeat(300)
        )
    );
    // T2 has no lane budget: the whole segment, until the draft budget bites.
    let s = Settings {
        budgets: Budgets {
            draft_max_chars: 10_000,
            ..Budgets::default()
        },
        ..settings("stream", "off")
    };
    let text = last_draft(&flat(&events[..4], &s, Tier::T2 { status_line: false })).unwrap();
    assert_eq!(text, format!("> 🧠 [raw] {long}"));
}

#[test]
fn commentary_is_elided_oldest_first() {
    let mut events = vec![start(1)];
    for i in 0..6u64 {
        events.push(say(
            2 + 2 * i,
            &format!("c{i}"),
            &format!("line {i} {}", "y".repeat(60)),
        ));
        events.push(tool_start(3 + 2 * i, &format!("t{i}"), "bash", "{}"));
    }
    let s = Settings {
        budgets: Budgets {
            draft_max_chars: 300,
            ..Budgets::default()
        },
        ..settings("off", "on")
    };
    let text = last_draft(&flat(&events, &s, t1())).unwrap();
    assert!(text.chars().count() <= 300, "{text}");
    assert!(
        text.contains("line 5 ") && text.contains("line 4 "),
        "newest commentary kept: {text}"
    );
    assert!(
        !text.contains("line 0 ") && !text.contains("line 3 "),
        "oldest commentary elided first: {text}"
    );
    assert_eq!(text.matches("chars omitted]").count(), 4, "{text}");
}

#[test]
fn repeat_suppression_and_variant_tags_and_redacted_markers() {
    let events = vec![
        start(1),
        say(2, "a", "Retrying…"),
        tool_start(3, "t", "bash", "{}"),
        say(4, "b", "Retrying…"),
        ev(
            5,
            "thinking",
            r#"{"id":"r","variant":"redacted","phase":"start"}"#,
        ),
        ev(
            6,
            "thinking",
            r#"{"id":"r","variant":"redacted","phase":"end","tokens":42}"#,
        ),
        ev(
            7,
            "thinking",
            r#"{"id":"s","variant":"summary","phase":"start"}"#,
        ),
        ev(
            8,
            "thinking",
            r#"{"id":"s","variant":"summary","delta":"weighed options"}"#,
        ),
        ev(
            9,
            "thinking",
            r#"{"id":"s","variant":"summary","phase":"end"}"#,
        ),
    ];
    let s = settings("on", "off");
    let text = last_draft(&flat(&events, &s, t1())).unwrap();
    assert_eq!(
        text,
        "Retrying…\n> 🧠 thought privately (42 tok)\n> 🧠 weighed options"
    );
    let s = Settings {
        suppress_repeats: false,
        show_variant_tags: true,
        ..settings("on", "off")
    };
    let text = last_draft(&flat(&events, &s, t1())).unwrap();
    assert_eq!(
        text,
        "Retrying…\nRetrying…\n> 🧠 thought privately (42 tok)\n> 🧠 [summary] weighed options"
    );
}

#[test]
fn full_verbose_details_are_display_safe() {
    let events = vec![
        start(1),
        tool_start(
            2,
            "t",
            "web_fetch",
            r#"{"url":"https://api.example.com/v1","headers":{"Authorization":"Bearer abc"}}"#,
        ),
        tool_start(
            3,
            "u",
            "bash",
            r#"{"command":"curl -H 'Authorization: Bearer sk-ant-abcdefghijklmnop' https://x.io"}"#,
        ),
        tool_end(3, "u", "completed", r#""ok""#),
    ];
    let text = last_draft(&flat(&events, &settings("off", "full"), t1())).unwrap();
    assert!(!text.contains("abcdefghijklmnop"), "{text}");
    assert!(
        text.contains("🌐 web_fetch ⏳ — https://api.example.com/v1"),
        "{text}"
    );
    assert!(
        text.contains("💻 bash ⏳ — curl -H 'Authorization: ***' https://x.io"),
        "{text}"
    );
    let s = Settings {
        budgets: Budgets {
            item_detail_chars: 10,
            ..Budgets::default()
        },
        ..settings("off", "full")
    };
    let text = last_draft(&flat(&events[..2], &s, t1())).unwrap();
    assert_eq!(text, "🌐 web_fetch ⏳ — https://a…");
}

#[test]
fn failed_tools_show_the_failure_mark() {
    let events = busy_turn();
    let ops = flat(&events[..8], &settings("off", "on"), t1());
    assert_eq!(last_draft(&ops).as_deref(), Some("Checking.\n💻 bash ❌"));
}

#[test]
fn settle_summary_counts_elapsed_seconds_from_envelopes() {
    let s = settings("on", "on");
    let mut p = RunProjection::new("r1");
    let mut ops = Vec::new();
    for (i, e) in busy_turn().into_iter().enumerate() {
        let re = RunEvent {
            envelope: Envelope {
                tenant: "t".into(),
                session_key: None,
                run_id: "r1".into(),
                ts_ms: 1_000 + 700 * i as i64,
            },
            event: e,
        };
        ops.extend(p.apply_run_event(&re, &s, t1()));
    }
    assert_eq!(ops.last(), Some(&settle("🧠 1 segment · 1 tool · 7 s", 11)));
    // Another run's event is not ours.
    let other = RunEvent {
        envelope: Envelope {
            tenant: "t".into(),
            session_key: None,
            run_id: "r2".into(),
            ts_ms: 0,
        },
        event: start(1),
    };
    assert!(RunProjection::new("r1")
        .apply_run_event(&other, &s, t1())
        .is_empty());
}

#[test]
fn incomplete_end_without_answer_is_not_an_error() {
    let e = ev(
        3,
        "lifecycle",
        r#"{"phase":"end","reason":"max_output_weird","status":"incomplete"}"#,
    );
    let events = vec![start(1), say(2, "0", "partial"), e];
    let ops = flat(
        &events,
        &settings("off", "on"),
        Tier::T2 { status_line: false },
    );
    assert_eq!(
        ops.last(),
        Some(&settle("⚠️ incomplete · 🧠 0 segments · 0 tools", 3))
    );
}

#[test]
fn clamp_is_declared_once_per_run() {
    let events = busy_turn();
    let tier = Tier::T2 { status_line: true };
    let ops = flat(&events, &settings("stream", "on"), tier);
    let clamps: Vec<_> = ops
        .iter()
        .filter(|o| matches!(o, Op::Notice { text, .. } if text.starts_with("ℹ️")))
        .collect();
    assert_eq!(
        clamps,
        vec![&notice(
            "ℹ️ this channel shows a single status line: /reasoning stream → on",
            4
        )]
    );
    // Nothing to clamp on T1.
    assert_eq!(
        count(
            &flat(&events, &settings("stream", "full"), Tier::T1),
            "notice"
        ),
        0
    );
}

/// Spec §3.2 live form: a thinking segment's token count arrives as a tokens-only update
/// after its end marker. A channel renders that exactly like the batch form (count on the
/// marker): the update shows no text, starts no segment, splits no commentary; at most the
/// token count appears.
#[test]
fn a_tokens_only_update_renders_like_tokens_on_the_end_marker() {
    let live = vec![
        start(1),
        ev(
            2,
            "thinking",
            r#"{"id":"0","variant":"redacted","phase":"start"}"#,
        ),
        ev(
            3,
            "thinking",
            r#"{"id":"0","variant":"redacted","phase":"end"}"#,
        ),
        ev(
            4,
            "thinking",
            r#"{"id":"1","variant":"raw","phase":"start"}"#,
        ),
        ev(
            5,
            "thinking",
            r#"{"id":"1","variant":"raw","delta":"weighing"}"#,
        ),
        ev(6, "thinking", r#"{"id":"1","variant":"raw","phase":"end"}"#),
        ev(7, "assistant", r#"{"phase":"commentary","delta":"The "}"#),
        ev(
            8,
            "thinking",
            r#"{"id":"0","variant":"redacted","tokens":42}"#,
        ),
        ev(9, "assistant", r#"{"phase":"commentary","delta":"answer"}"#),
        ev(10, "thinking", r#"{"id":"1","variant":"raw","tokens":7}"#),
        ev(
            11,
            "assistant",
            r#"{"phase":"final_answer","text":"The answer"}"#,
        ),
        end(12, "completed"),
    ];
    let batch = streamgate_grammar::fold_token_updates(&live);
    assert_eq!(batch.len(), live.len() - 2);
    // Ops without their seqs (the update takes seqs of its own).
    let unseq = |ops: Vec<Op>| -> Vec<String> {
        ops.iter()
            .filter(|o| o.name() != "typing")
            .map(|o| {
                let s = format!("{o:?}");
                match s.find(", seq:") {
                    Some(i) => s[..i].to_owned(),
                    None => s,
                }
            })
            .collect()
    };
    for reasoning in ["off", "on", "stream"] {
        for verbose in ["off", "on"] {
            for tier in [Tier::T1, Tier::T2 { status_line: false }, Tier::T0] {
                let s = settings(reasoning, verbose);
                let mut live_ops = unseq(flat(&live, &s, tier));
                let batch_ops = unseq(flat(&batch, &s, tier));
                // A draft refresh that only adds the count is the update's one effect.
                live_ops.dedup();
                let mut b = batch_ops.clone();
                b.dedup();
                let ctx = format!("reasoning {reasoning}, verbose {verbose}, {tier:?}");
                assert_eq!(
                    live_ops.last(),
                    b.last(),
                    "{ctx}: settled differently\nlive {live_ops:#?}\nbatch {b:#?}"
                );
                let finals = |ops: &[String]| -> Vec<String> {
                    ops.iter()
                        .filter(|o| o.starts_with("Final"))
                        .cloned()
                        .collect()
                };
                assert_eq!(finals(&live_ops), finals(&b), "{ctx}");
                assert_eq!(finals(&live_ops).len(), 1, "{ctx}");
                for op in &live_ops {
                    assert!(
                        !op.contains("tokens") && !op.contains("\"7\""),
                        "{ctx}: {op}"
                    );
                }
            }
        }
    }
    // The folded state has the counts on their segments, and one commentary segment.
    let mut p = RunProjection::new("r1");
    for e in &live {
        p.apply(e, &settings("on", "on"), Tier::T2 { status_line: false });
    }
    let st = p.state();
    assert_eq!(st.thinking.len(), 2, "{:?}", st.thinking);
    assert_eq!(st.thinking[0].tokens, Some(42));
    assert_eq!(st.thinking[1].tokens, Some(7));
    assert_eq!(st.thinking[1].text, "weighing");
    assert_eq!(st.commentary.len(), 1, "{:?}", st.commentary);
    assert_eq!(st.commentary[0].text, "The answer");
}

/// Events that arrived together (one bus message): drafts are rendered once, after the
/// batch, and every other op comes out as it would — the batch ends with the same draft,
/// final and settle as the events applied one by one.
#[test]
fn a_batch_renders_its_draft_once_and_changes_nothing_else() {
    let mut events = vec![start(1), think_start(2, "raw")];
    for i in 0..40 {
        events.push(think_delta(3 + i, "raw", &format!("step {i}. ")));
    }
    events.push(think_end(43, "raw", None));
    events.push(say(44, "c1", "Looking. "));
    events.push(final_answer(45, "f", "Done.", false));
    events.push(end(46, "stop"));
    let s = settings("stream", "full");
    let env = |e: &Event| RunEvent {
        envelope: Envelope {
            tenant: String::new(),
            session_key: None,
            run_id: "r1".into(),
            ts_ms: 0,
        },
        event: e.clone(),
    };
    let mut q = RunProjection::new("r1");
    let one_by_one: Vec<Op> = events
        .iter()
        .flat_map(|e| q.apply_run_event(&env(e), &s, t1()))
        .collect();
    // Batches of 10, the last event of each applied normally, then a flush.
    let mut p = RunProjection::new("r1");
    let mut batched = Vec::new();
    for chunk in events.chunks(10) {
        for (i, e) in chunk.iter().enumerate() {
            let ops = if i + 1 < chunk.len() {
                p.apply_run_event_batched(&env(e), &s, t1())
            } else {
                p.apply_run_event(&env(e), &s, t1())
            };
            batched.extend(ops);
        }
        batched.extend(p.flush_draft(&s, t1()));
    }
    assert!(count(&batched, "draft") < count(&one_by_one, "draft") / 4);
    for name in ["final", "settle", "notice", "typing"] {
        assert_eq!(count(&batched, name), count(&one_by_one, name), "{name}");
    }
    // Every draft that went out is the one the events one by one gave at that seq (the
    // drafts in between were never rendered; one due at the terminal event is
    // superseded by the settle, as in a chat lane).
    for d in batched.iter().filter(|o| o.name() == "draft") {
        assert!(one_by_one.contains(d), "{d:?}");
    }
    let tail = |ops: &[Op]| {
        ops.iter()
            .filter(|o| o.name() != "draft")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(tail(&batched), tail(&one_by_one));
    // A due draft never follows the settle.
    let settle_at = batched.iter().position(|o| o.name() == "settle");
    let draft_after = batched
        .iter()
        .skip(settle_at.unwrap_or(usize::MAX))
        .any(|o| o.name() == "draft");
    assert!(!draft_after);
}

//! Spec §4.3 truth tables × every tier (§7.1–7.2), table-driven: one scripted turn with
//! thinking + a tool + commentary + a final answer, projected under every
//! (`/reasoning`, `/verbose`, tier) cell, compared op-for-op with the expected script.

mod common;

use common::*;
use streamgate_grammar::Event;
use streamgate_projection::{Delivery, Op, Reasoning, Settings, Tier, Verbose};

const TIERS: [Tier; 4] = [
    Tier::T1,
    Tier::T2 { status_line: false },
    Tier::T2 { status_line: true },
    Tier::T0,
];

/// seq 1 start · 2–4 raw thinking · 5–6 bash tool · 7–8 commentary · 9 final · 10 end.
fn script() -> Vec<Event> {
    vec![
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", "plan the call"),
        think_end(4, "raw", Some(5)),
        tool_start(
            5,
            "t1",
            "bash",
            r#"{"command":"cat /home/u/src/app/main.rs"}"#,
        ),
        tool_end(6, "t1", "completed", r#""fn main() {}""#),
        say(7, "c1", "Reading the file."),
        say(8, "c2", "It has one function."),
        final_answer(9, "c2", "It has one function.", false),
        end(10, "completed"),
    ]
}

/// The expected draft text after event `seq` for one cell (None = nothing visible).
fn expected_draft(seq: u64, r: Reasoning, v: Verbose, tier: Tier) -> Option<String> {
    let status_line = tier == (Tier::T2 { status_line: true });
    // The tier's ceiling: stream → on and full → on on a status line.
    let r = match (status_line, r) {
        (true, Reasoning::Stream) => Reasoning::On,
        (_, r) => r,
    };
    let v = match (status_line, v) {
        (true, Verbose::Full) => Verbose::On,
        (_, v) => v,
    };
    let tag = if tier == (Tier::T2 { status_line: false }) {
        "[raw] "
    } else {
        ""
    };
    let mut lines: Vec<String> = Vec::new();
    let thinking_from = match r {
        Reasoning::Off => u64::MAX,
        Reasoning::On => 4,
        Reasoning::Stream => 3,
    };
    if seq >= thinking_from {
        lines.push(format!("> 🧠 {tag}plan the call"));
    }
    if status_line {
        let mut parts = Vec::new();
        if v != Verbose::Off && seq == 5 {
            parts.push("💻 bash".to_owned());
        }
        let last = match seq {
            7 | 9 | 10 => Some("Reading the file."),
            8 => Some("It has one function."),
            _ => None,
        };
        parts.extend(last.map(str::to_owned));
        if !parts.is_empty() {
            lines.push(format!("⏳ {}", parts.join(" · ")));
        }
    } else {
        if seq >= 5 {
            let status = if seq >= 6 { "✅" } else { "⏳" };
            match v {
                Verbose::Off => {}
                Verbose::On => lines.push(format!("💻 bash {status}")),
                Verbose::Full if seq == 5 => {
                    lines.push("💻 bash ⏳ — cat …/app/main.rs".to_owned())
                }
                Verbose::Full => {
                    lines.push("💻 bash ✅ — cat …/app/main.rs → fn main() {}".to_owned())
                }
            }
        }
        if seq >= 7 {
            lines.push("Reading the file.".to_owned());
        }
        // seq 9: the final answer replaces the draft's copy of its segment.
        if seq == 8 {
            lines.push("It has one function.".to_owned());
        }
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

fn clamp(r: Reasoning, v: Verbose, tier: Tier) -> Option<String> {
    let rn = |r: Reasoning| ["off", "on", "stream"][r as usize];
    let vn = |v: Verbose| ["off", "on", "full"][v as usize];
    let mut parts = Vec::new();
    match tier {
        Tier::T2 { status_line: true } => {
            if r == Reasoning::Stream {
                parts.push("/reasoning stream → on".to_owned());
            }
            if v == Verbose::Full {
                parts.push("/verbose full → on".to_owned());
            }
            (!parts.is_empty()).then(|| {
                format!(
                    "ℹ️ this channel shows a single status line: {}",
                    parts.join(", ")
                )
            })
        }
        Tier::T0 => {
            if r != Reasoning::Off {
                parts.push(format!("/reasoning {} → off", rn(r)));
            }
            if v != Verbose::Off {
                parts.push(format!("/verbose {} → off", vn(v)));
            }
            (!parts.is_empty()).then(|| {
                format!(
                    "ℹ️ this channel shows only final answers and errors: {}",
                    parts.join(", ")
                )
            })
        }
        _ => None,
    }
}

/// The whole expected op script of one cell.
fn expected_ops(r: Reasoning, v: Verbose, tier: Tier) -> Vec<Vec<Op>> {
    let mut per_event = Vec::new();
    let mut last: Option<String> = None;
    let mut clamp_pending = clamp(r, v, tier);
    let mut visible = |seq: u64, op: Op, out: &mut Vec<Op>| {
        if let Some(text) = clamp_pending.take() {
            out.push(notice(&text, seq));
        }
        out.push(op);
    };
    for seq in 1..=10u64 {
        let mut out = Vec::new();
        // Liveness: first event, then every 8 events (never on the terminal event);
        // an append-only channel gets the first one only.
        if seq == 1 || (seq == 9 && tier != Tier::T0) {
            out.push(Op::Typing);
        }
        if seq == 9 {
            visible(9, final_op("It has one function.", 9), &mut out);
        }
        if tier != Tier::T0 && seq < 10 {
            let text = expected_draft(seq, r, v, tier);
            if let Some(text) = text {
                if last.as_deref() != Some(text.as_str()) {
                    visible(seq, draft(&text, seq), &mut out);
                    last = Some(text);
                }
            }
        }
        if seq == 10 && tier != Tier::T0 {
            // Commentary "Reading the file." always survives, so the draft settles.
            let n = usize::from(r != Reasoning::Off);
            let m = usize::from(v != Verbose::Off);
            let seg = if n == 1 { "segment" } else { "segments" };
            let tools = if m == 1 { "tool" } else { "tools" };
            visible(
                10,
                settle(&format!("🧠 {n} {seg} · {m} {tools}"), 10),
                &mut out,
            );
        }
        per_event.push(out);
    }
    per_event
}

#[test]
fn every_truth_table_cell_on_every_tier() {
    let events = script();
    let mut cells = 0;
    for tier in TIERS {
        for r in [Reasoning::Off, Reasoning::On, Reasoning::Stream] {
            for v in [Verbose::Off, Verbose::On, Verbose::Full] {
                let settings = Settings {
                    reasoning: r,
                    verbose: v,
                    ..Settings::default()
                };
                let got = project(&events, &settings, tier);
                let want = expected_ops(r, v, tier);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g,
                        w,
                        "cell {tier:?} /reasoning {r:?} /verbose {v:?}, seq {}",
                        i + 1
                    );
                }
                cells += 1;
            }
        }
    }
    assert_eq!(cells, 36);
}

/// Anchors the table's oracle with literal text for the fullest T1 cell.
#[test]
fn t1_stream_full_literal_script() {
    let got = flat(&script(), &settings("stream", "full"), Tier::T1);
    assert_eq!(
        got,
        vec![
            Op::Typing,
            draft("> 🧠 plan the call", 3),
            draft("> 🧠 plan the call\n💻 bash ⏳ — cat …/app/main.rs", 5),
            draft("> 🧠 plan the call\n💻 bash ✅ — cat …/app/main.rs → fn main() {}", 6),
            draft(
                "> 🧠 plan the call\n💻 bash ✅ — cat …/app/main.rs → fn main() {}\nReading the file.",
                7
            ),
            draft(
                "> 🧠 plan the call\n💻 bash ✅ — cat …/app/main.rs → fn main() {}\nReading the file.\nIt has one function.",
                8
            ),
            Op::Typing,
            final_op("It has one function.", 9),
            draft(
                "> 🧠 plan the call\n💻 bash ✅ — cat …/app/main.rs → fn main() {}\nReading the file.",
                9
            ),
            settle("🧠 1 segment · 1 tool", 10),
        ]
    );
}

/// T0 never drafts: the first visible op declares the clamp, then the final.
#[test]
fn t0_literal_script() {
    let got = flat(&script(), &settings("stream", "full"), Tier::T0);
    assert_eq!(
        got,
        vec![
            Op::Typing,
            notice(
                "ℹ️ this channel shows only final answers and errors: /reasoning stream → off, /verbose full → off",
                9
            ),
            final_op("It has one function.", 9),
        ]
    );
}

/// `delivery: final_only` on every tier and cell: the final and nothing else.
#[test]
fn final_only_delivers_the_final_alone_everywhere() {
    for tier in TIERS {
        for (r, v) in [("off", "off"), ("stream", "full"), ("on", "on")] {
            let s = Settings {
                delivery: Delivery::FinalOnly,
                ..settings(r, v)
            };
            assert_eq!(
                flat(&script(), &s, tier),
                vec![final_op("It has one function.", 9)],
                "{tier:?} {r} {v}"
            );
        }
    }
}

//! Long open segments: a reasoning turn of megabytes renders every delta within the
//! draft budget from bounded state, shows the live tail with an elision marker, and
//! never shows a secret streamed across deltas (issue #17, "one long reasoning turn
//! takes the instance down").

use streamgate_grammar::Event;
use streamgate_projection::{Op, Reasoning, RunProjection, Settings, Tier};

fn thinking(seq: u64, delta: &str) -> Event {
    let json = format!(
        r#"{{"seq":{seq},"stream":"thinking","data":{{"variant":"raw","id":"t","delta":{}}}}}"#,
        serde_json::to_string(delta).unwrap_or_default()
    );
    Event::from_json(&json).unwrap_or_else(|e| panic!("{e}"))
}

fn stream() -> Settings {
    Settings {
        reasoning: Reasoning::Stream,
        ..Settings::default()
    }
}

fn drafts(ops: &[Op]) -> Vec<&str> {
    ops.iter()
        .filter_map(|o| match o {
            Op::Draft { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_megabyte_segment_shows_its_live_tail_within_the_budget() {
    let settings = stream();
    let max = settings.budgets.draft_max_chars;
    for tier in [Tier::T1, Tier::T2 { status_line: false }] {
        let mut p = RunProjection::new("r");
        let mut last = String::new();
        let mut seq = 1;
        let mut total = 0;
        while total < 1 << 20 {
            seq += 1;
            let d = format!("step {seq}: read the logs and check the config. ");
            total += d.len();
            let ops = p.apply(&thinking(seq, &d), &settings, tier);
            if let Some(t) = drafts(&ops).last() {
                assert!(t.chars().count() <= max, "{tier:?}: {} chars", t.len());
                last = (*t).to_owned();
            }
        }
        assert!(last.starts_with("> 🧠"), "{last}");
        assert!(last.contains("chars omitted]"), "{last}");
        assert!(
            last.contains(&format!("step {seq}: read the logs")),
            "{tier:?}: the newest delta is on screen: {last}"
        );
    }
}

#[test]
fn a_secret_split_across_deltas_of_a_long_segment_never_shows() {
    let settings = stream();
    let secrets = [
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv",
        "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
        "password=hunter2hunter2",
    ];
    let filler = "thinking about the deployment plan once more. ".repeat(100);
    for secret in secrets {
        let text = format!("{filler}then use {secret} to log in. {filler}");
        for step in [1, 7, 64] {
            let mut p = RunProjection::new("r");
            let mut seq = 1;
            let mut at = 0;
            while at < text.len() {
                let mut end = (at + step).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                seq += 1;
                let ops = p.apply(&thinking(seq, &text[at..end]), &settings, Tier::T1);
                for d in drafts(&ops) {
                    for part in ["AbCdEfGhIjKlMn", "hunter2"] {
                        assert!(!d.contains(part), "{secret} at step {step}: {d}");
                    }
                }
                at = end;
            }
        }
    }
}

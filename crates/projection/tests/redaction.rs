//! Issue 11: one redactor on every channel surface. Thinking, commentary, tool rows,
//! notices and settle lines never carry a secret, also when the secret arrives split
//! across deltas; the final answer stays verbatim.

mod common;

use common::*;
use proptest::prelude::*;
use streamgate_grammar::Event;
use streamgate_projection::redact::StreamRedactor;
use streamgate_projection::{Op, Settings, Tier};

/// (text containing a secret, the part that must never be shown).
const SECRETS: [(&str, &str); 27] = [
    ("sk-ant-api03-Zq9Xw7Vk3Lm1Np5Rt", "Zq9Xw7Vk3Lm1Np5Rt"),
    ("password=Hq7Zt2Wv9x", "Hq7Zt2Wv9x"),
    (
        "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG",
        "wJalrXUtnFEMIK7MDENG",
    ),
    ("postgres://app:S3cr3tPw@db:5432/x", "S3cr3tPw"),
    ("ghp_Qw3Er5Ty7Ui9Op1As3Df5Gh", "Qw3Er5Ty7Ui9Op1As3Df5Gh"),
    ("Authorization: Bearer Zt5Yx8Wq2Vb7", "Zt5Yx8Wq2Vb7"),
    ("glpat-Kd8Jf7Hg6Sa5Lq4Wz3", "Kd8Jf7Hg6Sa5Lq4Wz3"),
    (r#""db_pass": "Mn4Bv6Cx8Zl""#, "Mn4Bv6Cx8Zl"),
    ("sk_live_51HqZxWvUtSrQp", "51HqZxWvUtSrQp"),
    (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.Rq2Ws4Ed6Rf8Tg0Yh",
        "Rq2Ws4Ed6Rf8Tg0Yh",
    ),
    // Issue 17's catalogue: space-separated flags and CLI passwords,
    ("app --password Hq7Zt2Wv9y -v", "Hq7Zt2Wv9y"),
    (
        "aws configure set aws_secret_access_key wJalrXUtnFEMIK7MDENH",
        "wJalrXUtnFEMIK7MDENH",
    ),
    ("docker login -u bob -p Dk4Lp9Qz2Xc reg", "Dk4Lp9Qz2Xc"),
    ("redis-cli -h h -a Rc5Vb8Nm3Kq ping", "Rc5Vb8Nm3Kq"),
    // look-alikes (Cyrillic а) and a zero-width space inside a key,
    ("p\u{430}ssword=Cy7Rl1Lk9Qz", "Cy7Rl1Lk9Qz"),
    ("sk-ant-\u{200b}api03-Zw8Xq6Vm4Ln2Pj", "Zw8Xq6Vm4Ln2Pj"),
    // URL parameters, an Azure key, Hugging Face and npm tokens, a Slack webhook,
    ("https://x.io/v1?key=Ky3Mn7Bv1Cx&q=1", "Ky3Mn7Bv1Cx"),
    (
        "https://b.blob.core.windows.net/c?sv=1&sig=Sg5Hj8Kl2Pq",
        "Sg5Hj8Kl2Pq",
    ),
    ("https://s3.x/o?X-Amz-Signature=Am9Zs2Xd4Cf", "Am9Zs2Xd4Cf"),
    ("https://app.x/cb?code=Oc4Dx7Zr1Wq&state=s", "Oc4Dx7Zr1Wq"),
    ("AccountName=a;AccountKey=Az8Qw2Er4Ty+/==;", "Az8Qw2Er4Ty"),
    ("hf_Hf3Gj5Kl7Zx9Cv1Bn3Mq5Wr", "Hf3Gj5Kl7Zx9Cv1Bn3Mq5Wr"),
    (
        "npm_Np2Lk4Jh6Gf8Ds0Aq2Ws4Ed6Rf8Tg0Y",
        "Np2Lk4Jh6Gf8Ds0Aq2Ws4Ed6Rf8Tg0Y",
    ),
    (
        "https://hooks.slack.com/services/T01/B02/Sw7Xc9Vb2Nm",
        "Sw7Xc9Vb2Nm",
    ),
    // a password holding `@` in a URL, a JSON value with escaped quotes, nested JSON,
    ("postgres://app:P@ssw0rd9Zq@db/x", "P@ssw0rd9Zq"),
    (r#"{"password": "Es1\"Qt6Wy9Rb"}"#, "Qt6Wy9Rb"),
    (r#"{"in": "{\"db_pass\": \"Nj5Hb8Gv2\"}"}"#, "Nj5Hb8Gv2"),
];

/// Every text a channel gets from `ops`, final answers excluded.
fn progress_texts(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .filter_map(|o| match o {
            Op::Draft { text, .. } | Op::Settle { text, .. } | Op::Notice { text, .. } => {
                Some(text.clone())
            }
            Op::Retract { placeholder, .. } => Some(placeholder.clone()),
            _ => None,
        })
        .collect()
}

/// No progress text shows `hidden` or any 5+ char piece of it.
fn assert_hidden(ops: &[Op], hidden: &str, ctx: &str) {
    let chars: Vec<char> = hidden.chars().collect();
    for text in progress_texts(ops) {
        for w in chars.windows(5) {
            let piece: String = w.iter().collect();
            assert!(!text.contains(&piece), "{ctx}: {piece:?} shown in {text:?}");
        }
    }
}

fn tiers() -> [Tier; 3] {
    [
        Tier::T1,
        Tier::T2 { status_line: false },
        Tier::T2 { status_line: true },
    ]
}

/// Thinking streamed as `a` + `b`, commentary likewise, then an end.
fn split_run(a: &str, b: &str) -> Vec<Event> {
    vec![
        start(1),
        think_start(2, "raw"),
        think_delta(3, "raw", a),
        think_delta(4, "raw", b),
        think_end(5, "raw", None),
        say(6, "c1", a),
        say(7, "c1", b),
        end(8, "stop"),
    ]
}

#[test]
fn a_secret_split_at_every_position_is_never_shown() {
    let s = settings("stream", "full");
    for (secret, hidden) in SECRETS {
        let text = format!("checking {secret} now\n");
        for cut in (1..text.len()).filter(|i| text.is_char_boundary(*i)) {
            let (a, b) = text.split_at(cut);
            for tier in tiers() {
                let ops = flat(&split_run(a, b), &s, tier);
                assert_hidden(&ops, hidden, &format!("{secret} cut at {cut} on {tier:?}"));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(300), ..ProptestConfig::default() })]

    /// Any secret of the catalogue, split at any position across two deltas, inside any
    /// surrounding text: the rendered drafts (every one of them, not only the last) never
    /// show it.
    #[test]
    fn split_secrets_are_redacted_in_the_rendered_draft(
        which in 0..SECRETS.len(),
        cut in 0usize..200,
        pre in "[a-z ]{0,20}",
        post in "[a-z .\n]{0,20}",
    ) {
        let (secret, hidden) = SECRETS[which];
        let text = format!("{pre} {secret} {post}");
        let mut cut = cut % text.len();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let (a, b) = text.split_at(cut);
        for tier in tiers() {
            let ops = flat(&split_run(a, b), &settings("stream", "full"), tier);
            assert_hidden(&ops, hidden, &format!("{text:?} cut at {cut}"));
        }
    }

    /// The event-stream redactor (what `ProjectorService` sends): the concatenation of
    /// its outputs for any split never shows the secret, and equals the redaction of the
    /// whole text.
    #[test]
    fn stream_redactor_matches_whole_text_redaction(
        which in 0..SECRETS.len(),
        cuts in proptest::collection::vec(0usize..200, 0..4),
        pre in "[a-z ]{0,20}",
        post in "[a-z .\n]{0,20}",
    ) {
        let (secret, hidden) = SECRETS[which];
        let text = format!("{pre} {secret} {post}\nnext line {secret}");
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % text.len()).collect();
        cuts.sort_unstable();
        let mut r = StreamRedactor::new();
        let mut out = String::new();
        let mut at = 0;
        for c in cuts {
            let c = (at..=c).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(at);
            let piece = r.push(&text[at..c]);
            prop_assert!(!piece.contains(&hidden[..5]), "{piece:?}");
            out.push_str(&piece);
            at = c;
        }
        out.push_str(&r.push(&text[at..]));
        out.push_str(&r.finish());
        prop_assert!(!out.contains(&hidden[..5]), "{out:?}");
        prop_assert_eq!(out, streamgate_projection::redact::redact(&text));
    }
}

#[test]
fn every_surface_is_redacted_and_the_final_is_verbatim() {
    let answer = "Your key is sk-ant-api03-Zq9Xw7Vk3Lm1Np5Rt as requested.";
    let events = vec![
        start(1),
        think_start(2, "raw"),
        think_delta(
            3,
            "raw",
            "the env has AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG",
        ),
        think_end(4, "raw", None),
        tool_start(
            5,
            "t",
            "bash",
            r#"{"command":"psql postgres://app:S3cr3tPw@db/x -c 'select 1'"}"#,
        ),
        tool_end(6, "t", "completed", r#"{"db_pass":"Mn4Bv6Cx8Zl","rows":1}"#),
        say(7, "c1", "Found password=Hq7Zt2Wv9x in the config. "),
        final_answer(8, "f", answer, false),
        end(9, "stop"),
    ];
    for tier in tiers() {
        for s in [settings("stream", "full"), settings("on", "full")] {
            let ops = flat(&events, &s, tier);
            for (_, hidden) in SECRETS {
                assert_hidden(&ops, hidden, &format!("{tier:?}"));
            }
            let finals: Vec<&Op> = ops
                .iter()
                .filter(|o| matches!(o, Op::Final { .. }))
                .collect();
            assert_eq!(finals, vec![&final_op(answer, 8)], "{tier:?}");
        }
    }
    // Something was shown (the test is not vacuous).
    let ops = flat(&events, &settings("stream", "full"), Tier::T1);
    let texts = progress_texts(&ops).join("\n");
    assert!(texts.contains("AWS_SECRET_ACCESS_KEY=***"), "{texts}");
    assert!(texts.contains("postgres://app:***@db"), "{texts}");
    assert!(texts.contains("password=***"), "{texts}");
}

#[test]
fn error_notices_are_redacted() {
    let events = vec![
        start(1),
        say(2, "c1", "working "),
        error(
            3,
            "error",
            Some("401 invalid x-api-key sk-ant-api03-Zq9Xw7Vk3Lm1Np5Rt"),
        ),
    ];
    for tier in [Tier::T0, Tier::T1] {
        let ops = flat(&events, &Settings::default(), tier);
        assert_hidden(&ops, "Zq9Xw7Vk3Lm1Np5Rt", "error notice");
        assert!(progress_texts(&ops)
            .iter()
            .any(|t| t.contains("sk-ant-***")));
    }
}

/// The display-safe event stream (what `ProjectorService` sends): the secret never
/// appears in any event, final answers are untouched, and a projection of the safe
/// events renders the same drafts as one of the raw events (the redaction is the same).
#[test]
fn display_safe_events_hide_secrets_and_keep_finals() {
    use streamgate_projection::EventRedactor;
    let answer = "Your key is sk-ant-api03-Zq9Xw7Vk3Lm1Np5Rt as requested.";
    for (secret, hidden) in SECRETS {
        let text = format!("checking {secret} now");
        for cut in (1..text.len()).filter(|i| text.is_char_boundary(*i)) {
            let (a, b) = text.split_at(cut);
            let args_a = serde_json::to_string(a).unwrap();
            let args_b = serde_json::to_string(b).unwrap();
            let events = vec![
                start(1),
                think_start(2, "raw"),
                think_delta(3, "raw", a),
                think_delta(4, "raw", b),
                think_end(5, "raw", None),
                say(6, "c1", a),
                say(7, "c1", b),
                common::ev(
                    8,
                    "item",
                    r#"{"phase":"start","id":"t","kind":"tool","name":"bash"}"#,
                ),
                common::ev(
                    9,
                    "item",
                    &format!(
                        r#"{{"phase":"update","id":"t","kind":"tool","input_delta":{args_a}}}"#
                    ),
                ),
                common::ev(
                    10,
                    "item",
                    &format!(
                        r#"{{"phase":"update","id":"t","kind":"tool","input_delta":{args_b}}}"#
                    ),
                ),
                common::ev(
                    11,
                    "item",
                    &format!(
                        r#"{{"phase":"end","id":"t","kind":"tool","arguments":{{"command":{}}},"result":{{"password":"Hq7Zt2Wv9x","n":1}}}}"#,
                        serde_json::to_string(&text).unwrap()
                    ),
                ),
                final_answer(12, "f", answer, false),
                end(13, "stop"),
            ];
            let mut r = EventRedactor::new();
            let safe: Vec<Event> = events.iter().filter_map(|e| r.apply(e)).collect();
            assert_eq!(safe.len(), events.len());
            for (raw, ev) in events.iter().zip(&safe) {
                let line = ev.to_json();
                if raw.seq == 12 {
                    assert_eq!(raw, ev, "final answers pass verbatim");
                    continue;
                }
                for w in hidden.as_bytes().windows(5) {
                    let piece = std::str::from_utf8(w).unwrap();
                    assert!(!line.contains(piece), "{secret} cut {cut}: {line}");
                }
                assert!(!line.contains("Hq7Zt2Wv9x"), "{line}");
            }
            // Nothing is lost: the lanes' safe text is the redaction of the whole text.
            let mut p = streamgate_projection::RunProjection::new("r1");
            for e in &safe {
                p.apply(e, &settings("stream", "full"), Tier::T1);
            }
            let st = p.state();
            assert_eq!(
                st.thinking[0].text,
                streamgate_projection::redact::redact(&text)
            );
            assert_eq!(
                st.commentary[0].text,
                streamgate_projection::redact::redact(&text)
            );
            assert_eq!(
                st.items[0].input_text,
                streamgate_projection::redact::redact(&text)
            );
        }
    }
    // Replays are dropped; a resumed stream is primed by feeding what the receiver has.
    let mut r = EventRedactor::new();
    assert!(r.apply(&start(1)).is_some());
    assert!(r.apply(&start(1)).is_none());
}

/// Tool arguments stream as raw JSON text (`{"command": "echo hi\nexport K=…"}`): every
/// secret of the catalogue inside them, the argument text split at every position across
/// two `input_delta` chunks, never reaches a display-safe event — escapes (`\n`, `\"`)
/// and nested JSON included.
#[test]
fn secrets_in_streamed_tool_arguments_are_redacted_at_every_split() {
    use streamgate_projection::EventRedactor;
    for (secret, hidden) in SECRETS {
        let args = serde_json::json!({ "command": format!("echo hi\n{secret}\nls") }).to_string();
        for cut in (1..args.len()).filter(|i| args.is_char_boundary(*i)) {
            let (a, b) = args.split_at(cut);
            let events = vec![
                start(1),
                common::ev(
                    2,
                    "item",
                    r#"{"phase":"start","id":"t","kind":"tool","name":"bash"}"#,
                ),
                common::ev(
                    3,
                    "item",
                    &format!(
                        r#"{{"phase":"update","id":"t","kind":"tool","input_delta":{}}}"#,
                        serde_json::to_string(a).unwrap()
                    ),
                ),
                common::ev(
                    4,
                    "item",
                    &format!(
                        r#"{{"phase":"update","id":"t","kind":"tool","input_delta":{}}}"#,
                        serde_json::to_string(b).unwrap()
                    ),
                ),
                common::ev(
                    5,
                    "item",
                    &format!(r#"{{"phase":"end","id":"t","kind":"tool","arguments":{args}}}"#),
                ),
                end(6, "stop"),
            ];
            let mut r = EventRedactor::new();
            let mut shown = String::new();
            for e in &events {
                let Some(safe) = r.apply(e) else { continue };
                let line = safe.to_json();
                for w in hidden.as_bytes().windows(5) {
                    let piece = String::from_utf8_lossy(w);
                    assert!(!line.contains(&*piece), "{secret} cut {cut}: {line}");
                }
                if let streamgate_grammar::EventData::Item(it) = &safe.data {
                    shown.push_str(it.input_delta.as_deref().unwrap_or(""));
                }
            }
            // Nothing else is lost: the argument text shown is the redaction of the whole.
            assert_eq!(
                shown,
                streamgate_projection::redact::redact(&args),
                "{secret} cut {cut}"
            );
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

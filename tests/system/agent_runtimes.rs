//! Agent-runtime families reach a channel (issue #13): every own fixture of the families
//! agent gateways speak besides provider streams — `acp`, `codex-exec`,
//! `openclaw-events` — ingested at once through the real pipeline (nats-server,
//! normalizer, archiver on SQLite) with a webhook projector channel in front of a fake
//! receiver that dedupes on `Idempotency-Key`, as a real one would. Then, per run:
//! - the archive holds exactly what `streamgate normalize` prints (as `pipeline.rs` checks
//!   for every capture);
//! - a run whose events carry a final answer shows it on the channel exactly once,
//!   verbatim, with `truncated` as the event says; a run without one (errors, stream
//!   death, zero text, refusal) shows no final.
//!
//! `acp_status_updates_follow_tag_visibility`: the projection knobs over the ACP
//! adapter's real output — status updates hidden by default, each one's line when shown.
//!
//! Run: `cargo test --test agent_runtimes` (needs `STREAMGATE_NATS_SERVER` or a
//! nats-server on PATH, like the other end-to-end tests).

use crate::common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const CHANNEL: &str = "hook";
const SECRET: &str = "agent-runtimes-webhook-secret";
const FAMILIES: &[&str] = &["acp", "codex-exec", "openclaw-events"];

/// What the channel must show for a run: its final answer and whether it was cut short.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Final {
    text: String,
    truncated: bool,
}

/// The final answer a run's events carry (the last `final_answer` with text), if any.
/// A run that dies after one (spec §3.5 Dead: no re-tag) or whose answer is withdrawn
/// carries none: the adapter only tags a final on the Finalize and Truncate paths.
fn final_of(events: &[Value]) -> Option<Final> {
    let last = events.iter().rfind(|e| {
        e["stream"] == "assistant"
            && e["data"]["phase"] == "final_answer"
            && e["data"]["text"].as_str().is_some_and(|t| !t.is_empty())
    })?;
    let text = last["data"]["text"].as_str()?.to_owned();
    if streamgate_projection::is_silent(&text) {
        return None;
    }
    Some(Final {
        text,
        truncated: last["data"]["truncated"] == true,
    })
}

/// The finals the receiver applied, by run id (a list: exactly-once is checked).
fn finals(fake: &streamgate_sinks::fakes::FakeServer) -> BTreeMap<String, Vec<Final>> {
    let mut out: BTreeMap<String, Vec<Final>> = BTreeMap::new();
    for e in fake.events() {
        if e.get("op").and_then(Value::as_str) != Some("final") {
            continue;
        }
        let run = e["run_id"].as_str().unwrap_or("").to_owned();
        out.entry(run).or_default().push(Final {
            text: e["text"].as_str().unwrap_or("").to_owned(),
            truncated: e["truncated"] == true,
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_agent_runtime_fixture_reaches_a_channel() {
    let seed = seed("every_agent_runtime_fixture_reaches_a_channel");
    let mut rng = rng(seed);
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| c.name.starts_with("fixture:") && FAMILIES.contains(&c.family.as_str()))
        .collect();
    for family in ["codex-exec", "openclaw-events"] {
        assert!(
            cases.iter().any(|c| c.family == family),
            "no {family} fixtures found"
        );
    }

    let p = Pipeline::start(Backend::Sqlite).await;
    let channel = WebhookChannel::start(&p, CHANNEL, SECRET).await;
    let fake = &channel.fake;

    // Every run at once, each in random chunks and its own chat (`session-<run>`).
    let runs: Vec<(String, Case, Vec<bytes::Bytes>)> = cases
        .into_iter()
        .enumerate()
        .map(|(i, case)| {
            let chunks = split(&case.bytes, &mut rng, 64);
            (format!("agent-{i:02}"), case, chunks)
        })
        .collect();
    put_runs(&p.ingestor, &runs).await;

    let mut want: BTreeMap<String, Vec<Final>> = BTreeMap::new();
    for (run, case, chunks) in &runs {
        let events = expected(&case.family, &case.bytes);
        let got = wait_run(&*p.store, run, events.len(), PATIENCE).await;
        assert_archive_eq(
            run,
            &got,
            &events,
            &format!("{} ({} chunks, seed {seed})", case.name, chunks.len()),
        );
        if let Some(f) = final_of(&events) {
            want.insert(run.clone(), vec![f]);
        }
    }
    assert!(
        want.len() >= 4,
        "too few fixtures with a final answer: {want:?}"
    );

    // Every final once; then a moment more, so a duplicate or a final for a run that has
    // none would show.
    let deadline = Instant::now() + PATIENCE;
    while finals(fake) != want {
        assert!(
            Instant::now() < deadline,
            "webhook finals (seed {seed}):\n got {:#?}\nwant {want:#?}\nruns: {:#?}",
            finals(fake),
            runs.iter()
                .map(|(r, c, _)| format!("{r}: {}", c.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_quiet(&p.js).await;
    // Negative window, not a wait: a duplicate or stray final gets 500 ms to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(finals(fake), want, "after the channel went quiet");
    channel.stop.cancel();
}

/// The projection knobs against what the ACP adapter really emits (not a hand-made event):
/// `fixtures/acp/misc.jsonl` holds every status update kind. With default settings no
/// status line reaches a draft; with every tag shown, each kind renders its own line —
/// the latest usage, not the first — and the answer is unchanged either way.
#[test]
fn acp_status_updates_follow_tag_visibility() {
    use streamgate_projection::{settings::tags, Op, RunProjection, Settings, Tier};
    let events =
        streamgate_wire::normalize_bytes(choice("acp"), &fixture("acp/misc.jsonl"), 0).events;
    let project = |settings: &Settings| -> (Vec<String>, Vec<String>) {
        let mut p = RunProjection::new("acp-misc");
        let ops: Vec<Op> = events
            .iter()
            .flat_map(|e| p.apply(e, settings, Tier::T1))
            .collect();
        let drafts = ops
            .iter()
            .filter_map(|o| match o {
                Op::Draft { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect();
        let finals = ops
            .iter()
            .filter_map(|o| match o {
                Op::Final { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect();
        (drafts, finals)
    };
    let marks = ["📋", "📊", "⌘", "🔀", "⚙️", "🏷️", "ℹ️"];

    let (drafts, finals) = project(&Settings::default());
    for d in &drafts {
        assert!(
            !marks.iter().any(|m| d.contains(m)),
            "hidden by default: {d}"
        );
    }
    assert_eq!(finals, ["Done."]);

    let mut all = Settings::default();
    for tag in [
        tags::PLAN,
        tags::USAGE_UPDATE,
        tags::AVAILABLE_COMMANDS_UPDATE,
        tags::CURRENT_MODE_UPDATE,
        tags::CONFIG_OPTION_UPDATE,
        tags::SESSION_INFO_UPDATE,
    ] {
        all.tag_visibility.0.insert(tag.to_owned(), true);
    }
    let (drafts, finals) = project(&all);
    let last = drafts.last().expect("a draft with every status line");
    for want in [
        "📋 plan: 0/1 done · Read README",
        "📊 1500/200000 tokens",
        "⌘ 1 command",
        "🔀 mode: code",
        "⚙️ config: model=fast",
        "🏷️ Fix README",
    ] {
        assert!(
            last.contains(want),
            "{want:?} missing from the draft:\n{last}"
        );
    }
    assert!(
        !last.contains("1000/200000"),
        "an older usage line stayed:\n{last}"
    );
    assert_eq!(finals, ["Done."]);
}

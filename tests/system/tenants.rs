//! Tenant is part of every identity (issue #11, docs/architecture.md §3: a run id is unique only
//! within its tenant).
//!
//! `same_run_id_under_two_tenants`: the same run id `r1` under tenants `acme` and
//! `globex`, with *different* captures, ingested at the same time through the real
//! pipeline — nats-server, normalizer, archiver on SQLite, a webhook projector channel
//! (the fake receiver dedupes on `Idempotency-Key`, as a real one would). Then:
//! - `streamgate replay r1 --tenant acme --json` and `… --tenant globex --json` (the CLI
//!   binary against the archiver's gRPC) each print exactly their own capture's golden
//!   (`fixtures/f1/*.expected.jsonl`), with their own tenant on every line;
//! - `streamgate runs --tenant <t>` lists the run under each tenant, once;
//! - both runs reach the webhook channel, each with its own final answer, tenant and
//!   idempotency key;
//! - nothing was counted as an archive conflict.
//!
//! Run: `cargo test --test tenants` (needs `STREAMGATE_NATS_SERVER` or a nats-server on
//! PATH, like the other end-to-end tests).

use crate::common;

use bytes::Bytes;
use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

const RUN: &str = "r1";
const CHANNEL: &str = "hook";
const SECRET: &str = "tenants-webhook-secret";

/// Tenant, capture and its golden: two different captures under the same run id.
const RUNS: &[(&str, &str, &str)] = &[
    ("acme", "f1/end-turn.sse", "f1/end-turn.expected.jsonl"),
    (
        "globex",
        "f1/stop-sequence.sse",
        "f1/stop-sequence.expected.jsonl",
    ),
];

/// The golden's events as `{seq, stream, data}` values.
fn golden(path: &str) -> Vec<Value> {
    String::from_utf8(fixture(path))
        .expect("golden is UTF-8")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{path}: {e}: {l}")))
        .collect()
}

/// Runs a `streamgate` subcommand to completion; stdout, or a panic with stderr.
fn streamgate(args: Vec<String>) -> String {
    let mut child = Command::new(bin())
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn streamgate {args:?}: {e}"));
    let deadline = Instant::now() + PATIENCE;
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("streamgate {args:?} did not finish in {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "streamgate {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The `final` ops the webhook receiver applied, as (tenant, run id, text).
fn finals(fake: &streamgate_sinks::fakes::FakeServer) -> Vec<(String, String, String)> {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let mut out: Vec<_> = fake
        .events()
        .iter()
        .filter(|e| e.get("op").and_then(Value::as_str) == Some("final"))
        .map(|e| (s(e, "tenant"), s(e, "run_id"), s(e, "text")))
        .collect();
    out.sort();
    out
}

/// The final answer text of a golden.
fn final_text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["stream"] == "assistant" && e["data"]["phase"] == "final_answer")
        .filter_map(|e| e["data"]["text"].as_str())
        .next_back()
        .expect("the golden has a final answer")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_run_id_under_two_tenants() {
    let p = Pipeline::start(Backend::Sqlite).await;
    let channel = WebhookChannel::start(&p, CHANNEL, SECRET).await;
    let fake = &channel.fake;

    // Both runs at once, chunk by chunk interleaved: the normalizer's per-run state and
    // the ingest lock are per (tenant, run), so neither waits for nor disturbs the other.
    let specs: Vec<_> = RUNS
        .iter()
        .map(|(tenant, capture, _)| {
            let mut spec = spec(RUN, "f1");
            spec.tenant = tenant.parse().unwrap();
            spec.session_key = Some(format!("chat-{tenant}").parse().unwrap());
            let mut rng = rng(seed(&format!("tenants-{tenant}")));
            (spec, split(&fixture(capture), &mut rng, 48))
        })
        .collect();
    let _claims: Vec<_> = specs
        .iter()
        .map(|(s, _)| {
            p.ingestor
                .claim(&s.tenant, &s.run_id)
                .expect("both tenants' r1 can be claimed at once")
        })
        .collect();
    let most = specs.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
    for i in 0..most {
        for (spec, chunks) in &specs {
            if let Some(c) = chunks.get(i) {
                put(&p.ingestor, spec, i as u64, c.clone(), None).await;
            }
        }
    }
    for (spec, chunks) in &specs {
        put(
            &p.ingestor,
            spec,
            chunks.len() as u64,
            Bytes::new(),
            Some(streamgate_bus::raw::CloseKind::Normal),
        )
        .await;
    }

    let goldens: Vec<Vec<Value>> = RUNS.iter().map(|(_, _, g)| golden(g)).collect();
    assert_ne!(goldens[0], goldens[1], "the two captures must differ");
    for ((tenant, _, _), want) in RUNS.iter().zip(&goldens) {
        let got = wait_run_in(&*p.store, tenant, RUN, want.len(), PATIENCE).await;
        assert_eq!(&as_json(&got), want, "{tenant}/{RUN}: archived events");
    }
    assert_eq!(p.store.conflicts_total(), 0, "archive conflicts");

    // The operator CLI, per tenant: each replay is its own golden, nothing of the other.
    let addr = p.archive_grpc.to_string();
    let cli = |args: &[&str]| -> Vec<String> {
        args.iter()
            .copied()
            .chain(["--addr", addr.as_str(), "--token", TOKEN])
            .map(str::to_owned)
            .collect()
    };
    for ((tenant, _, _), want) in RUNS.iter().zip(&goldens) {
        let args = cli(&["replay", RUN, "--tenant", tenant, "--json"]);
        let out = tokio::task::spawn_blocking(move || streamgate(args))
            .await
            .expect("replay");
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        for l in &lines {
            assert_eq!(
                (&l["tenant"], &l["run_id"]),
                (&Value::from(*tenant), &Value::from(RUN)),
                "{tenant}: every replayed line names its run"
            );
        }
        let shape: Vec<Value> = lines
            .iter()
            .map(|v| serde_json::json!({"seq": v["seq"], "stream": v["stream"], "data": v["data"]}))
            .collect();
        assert_eq!(&shape, want, "replay {RUN} --tenant {tenant} vs its golden");

        let args = cli(&["runs", "--tenant", tenant, "--json"]);
        let out = tokio::task::spawn_blocking(move || streamgate(args))
            .await
            .expect("runs");
        let runs: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).expect("runs --json line"))
            .collect();
        assert_eq!(runs.len(), 1, "runs --tenant {tenant}: {out}");
        assert_eq!(
            (&runs[0]["tenant"], &runs[0]["run_id"]),
            (&Value::from(*tenant), &Value::from(RUN))
        );
        assert_eq!(runs[0]["event_count"], want.len());
    }
    // The default tenant has no run of that id.
    let args = cli(&["runs", "--json"]);
    let out = tokio::task::spawn_blocking(move || streamgate(args))
        .await
        .expect("runs");
    assert_eq!(out.trim(), "", "tenant `default` has no runs");

    // Both runs reach the webhook channel: each its own final, tenant and key.
    let mut want: Vec<(String, String, String)> = RUNS
        .iter()
        .zip(&goldens)
        .map(|((tenant, _, _), g)| ((*tenant).to_owned(), RUN.to_owned(), final_text(g)))
        .collect();
    want.sort();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = finals(fake);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "webhook finals: got {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys: Vec<String> = fake
        .events()
        .iter()
        .filter(|e| e.get("op").and_then(Value::as_str) == Some("final"))
        .filter_map(|e| e.get("key").and_then(Value::as_str).map(str::to_owned))
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_ne!(keys[0], keys[1], "each run has its own idempotency key");
    channel.stop.cancel();
}

//! `streamgate follow-gateway` and the normalizer's `--follow-gateway` against a local
//! WebSocket server that speaks the gateway side of the OpenClaw protocol: it answers the
//! `connect` request, replays three runs' agent events (the `openclaw-events` fixtures,
//! each under its own `runId`, interleaved) with noise around them (ticks, presence, a
//! non-JSON frame, agent events without or with a bad `runId`), drops the connection
//! mid-stream and, on the reconnect, re-sends the last events already sent before the
//! rest.
//!
//! - `follow_gateway_cli_runs_replay_like_normalize`: `streamgate up` and `streamgate
//!   follow-gateway ws://… --token …`; every `connect` carries the `tool-events`
//!   capability and the token, the token is in no log line, and each run's `streamgate
//!   replay --json` equals `streamgate normalize --family openclaw-events` of its lines.
//! - `normalizer_follower_lands_runs_through_its_ingestor`: the follower the normalizer
//!   starts for `--follow-gateway` (its own ingestor as the sink) on the in-process
//!   pipeline: each archived run equals the reference normalization of its lines.

use crate::common;

use common::*;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// The runs replayed: (run id, fixture). `gw-big`'s tool result is [`BIG_RESULT`] bytes.
const RUNS: [(&str, &str); 4] = [
    ("gw-answer", "openclaw-events/answer.jsonl"),
    ("gw-tools", "openclaw-events/tools.jsonl"),
    ("gw-error", "openclaw-events/error.jsonl"),
    ("gw-big", "openclaw-events/tools.jsonl"),
];
/// A large tool result (issue #17: one ~4 MB agent event was retried forever and then
/// stalled every other run).
const BIG_RESULT: usize = 5 << 20;
/// The gateway token the follower must present.
const GATEWAY_TOKEN: &str = "gw-secret-7f3a";
/// Events of the first connection (of 20); the second re-sends [`RESEND`] of them.
const CUT: usize = 10;
const RESEND: usize = 3;

/// One run's lines (its fixture with `runId` replaced), newline-terminated.
fn run_lines(run: &str, fixture_path: &str) -> Vec<String> {
    String::from_utf8(fixture(fixture_path))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v["runId"] = Value::from(run);
            if run == "gw-big" && v["data"]["phase"] == "result" && v["data"]["result"].is_object()
            {
                v["data"]["result"]["stdout"] = Value::from("x".repeat(BIG_RESULT));
            }
            format!("{v}\n")
        })
        .collect()
}

/// Every run's lines, interleaved round-robin.
fn interleaved() -> Vec<String> {
    let runs: Vec<Vec<String>> = RUNS.iter().map(|(r, f)| run_lines(r, f)).collect();
    let longest = runs.iter().map(Vec::len).max().unwrap();
    (0..longest)
        .flat_map(|i| runs.iter().filter_map(move |r| r.get(i).cloned()))
        .collect()
}

/// Frames a follower must survive: other events, a non-JSON frame, agent events that
/// cannot be routed.
const NOISE: [&str; 7] = [
    r#"{"type":"event","event":"tick","payload":{"ts":1}}"#,
    "this is not JSON",
    r#"{"type":"event","event":"agent","payload":{"seq":1,"stream":"lifecycle","data":{"phase":"start"}}}"#,
    r#"{"type":"event","event":"agent","payload":{"runId":"bad\u0001run","seq":1,"stream":"lifecycle","data":{"phase":"start"}}}"#,
    r#"{"type":"event","event":"agent","payload":{"runId":42,"seq":1}}"#,
    r#"{"type":"event","event":"agent","payload":"a string"}"#,
    r#"{"type":"event","event":"presence","payload":{"entries":[]}}"#,
];

fn agent_frame(line: &str, seq: usize) -> Message {
    Message::text(format!(
        r#"{{"type":"event","event":"agent","payload":{},"seq":{seq}}}"#,
        line.trim_end()
    ))
}

/// Serves the gateway side: connection 0 gets the noise and events `..CUT` and is then
/// dropped without a close handshake; connection 1 gets events `CUT - RESEND..`; later
/// ones only the handshake. Every `connect` request is sent to `connects`.
async fn gateway(
    listener: TcpListener,
    events: Vec<String>,
    connects: mpsc::UnboundedSender<Value>,
) {
    let mut n = 0;
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
            continue;
        };
        let challenge =
            r#"{"type":"event","event":"connect.challenge","payload":{"nonce":"n-1","ts":1}}"#;
        let _ = ws.send(Message::text(challenge)).await;
        let Some(Ok(Message::Text(req))) = ws.next().await else {
            continue;
        };
        let req: Value = serde_json::from_str(&req).unwrap_or(Value::Null);
        let hello = serde_json::json!({"type":"res","id":req["id"],"ok":true,
            "payload":{"type":"hello-ok","protocol":3,"policy":{"tickIntervalMs":15000}}});
        let _ = connects.send(req);
        let _ = ws.send(Message::text(hello.to_string())).await;
        let range = match n {
            0 => 0..CUT,
            1 => CUT - RESEND..events.len(),
            _ => 0..0,
        };
        if n == 0 {
            for noise in NOISE {
                let _ = ws.send(Message::text(noise)).await;
            }
        }
        for i in range {
            let _ = ws.send(agent_frame(&events[i], i + 1)).await;
        }
        if n == 0 {
            let _ = ws.flush().await;
            drop(ws); // no close handshake: the connection just breaks
        } else {
            tokio::spawn(async move { while let Some(Ok(_)) = ws.next().await {} });
        }
        n += 1;
    }
}

/// Checks the `connect` requests seen: at least `want`, each announcing `tool-events`
/// and carrying the token.
fn check_connects(rx: &mut mpsc::UnboundedReceiver<Value>, want: usize) {
    let mut seen = Vec::new();
    while let Ok(v) = rx.try_recv() {
        seen.push(v);
    }
    assert!(
        seen.len() >= want,
        "{} connect requests, want {want}: {seen:?}",
        seen.len()
    );
    for req in &seen {
        assert_eq!(req["type"], "req", "{req}");
        assert_eq!(req["method"], "connect", "{req}");
        let caps = req["params"]["caps"].as_array().expect("caps");
        assert!(caps.iter().any(|c| c == "tool-events"), "{req}");
        assert_eq!(req["params"]["auth"]["token"], GATEWAY_TOKEN, "{req}");
        assert_eq!(req["params"]["minProtocol"], 3, "{req}");
    }
}

/// The gateway on a thread of its own (for tests that drive processes).
fn gateway_thread() -> (SocketAddr, mpsc::UnboundedReceiver<Value>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            gateway(listener, interleaved(), tx).await;
        });
    });
    (addr_rx.recv().unwrap(), rx)
}

fn start_up(dir: &std::path::Path) -> Graceful {
    let mut up = Graceful(
        Command::new(bin())
            .args(["up", "--quiet", "--no-web"])
            .current_dir(dir)
            .stdout(std::fs::File::create(dir.join("up.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("up.err")).unwrap())
            .spawn()
            .expect("spawn streamgate up"),
    );
    let deadline = Instant::now() + PATIENCE;
    while !dir.join(".streamgate/up.json").exists() {
        if let Ok(Some(s)) = up.0.try_wait() {
            panic!("streamgate up exited with {s}");
        }
        assert!(Instant::now() < deadline, "no up.json after {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    up
}

/// Runs a CLI command to its end (at most [`PATIENCE`]); its stdout. The output goes to
/// files, not pipes: a command printing more than a pipe holds (a 5 MiB event) would
/// block on a pipe nobody reads until it ends.
fn cli(dir: &std::path::Path, args: &[&str]) -> String {
    let out_path = dir.join("cli.out");
    let err_path = dir.join("cli.err");
    let mut child = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("streamgate {args:?} did not finish in {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "streamgate {args:?}: {}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    std::fs::read_to_string(&out_path).unwrap()
}

/// `(seq, stream, data)` of each JSONL event: what replay and normalize share.
fn golden(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            serde_json::json!({"seq": v["seq"], "stream": v["stream"], "data": v["data"]})
        })
        .collect()
}

#[test]
fn follow_gateway_cli_runs_replay_like_normalize() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = start_up(dir.path());
    let (addr, mut connects) = gateway_thread();
    let log = dir.path().join("follow.log");
    let mut follower = Graceful(
        Command::new(bin())
            .args([
                "follow-gateway",
                &format!("ws://{addr}"),
                "--token",
                GATEWAY_TOKEN,
            ])
            .env("RUST_LOG", "info")
            .current_dir(dir.path())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("follow.err")).unwrap())
            .spawn()
            .expect("spawn streamgate follow-gateway"),
    );
    for (run, fixture_path) in RUNS {
        let replayed = cli(dir.path(), &["replay", run, "--json", "--follow"]);
        let capture = dir.path().join(format!("{run}.jsonl"));
        std::fs::write(&capture, run_lines(run, fixture_path).concat()).unwrap();
        let normalized = cli(
            dir.path(),
            &[
                "normalize",
                "--family",
                "openclaw-events",
                capture.to_str().unwrap(),
            ],
        );
        let want = golden(&normalized);
        assert!(!want.is_empty());
        assert_eq!(golden(&replayed), want, "run {run}: replay vs normalize");
    }
    assert!(
        follower.0.try_wait().unwrap().is_none(),
        "follow-gateway exited on bad input"
    );
    check_connects(&mut connects, 2);
    let status = follower.stop(Duration::from_secs(30));
    let logs = std::fs::read_to_string(&log).unwrap()
        + &std::fs::read_to_string(dir.path().join("follow.err")).unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "follow-gateway did not stop cleanly:\n{logs}"
    );
    assert!(
        !logs.contains(GATEWAY_TOKEN),
        "the gateway token was logged:\n{logs}"
    );
    assert!(
        logs.contains("reconnecting"),
        "no reconnect logged:\n{logs}"
    );
    assert!(
        logs.contains("not routable"),
        "bad agent events not logged:\n{logs}"
    );
    let _ = up.stop(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normalizer_follower_lands_runs_through_its_ingestor() {
    use streamgate_normalizer::gateway::{follow, FollowConfig};
    let p = Pipeline::start(Backend::Sqlite).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut connects) = mpsc::unbounded_channel();
    let server = tokio::spawn(gateway(listener, interleaved(), tx));
    let cancel = tokio_util::sync::CancellationToken::new();
    let cfg = FollowConfig {
        token: Some(GATEWAY_TOKEN.to_owned()),
        tenant: TENANT.to_owned(),
        reconnect_base: Duration::from_millis(100),
        ..FollowConfig::new(format!("ws://{addr}"))
    };
    let follower = tokio::spawn(follow(cfg, p.ingestor.clone(), cancel.clone()));
    for (run, fixture_path) in RUNS {
        let lines = run_lines(run, fixture_path).concat();
        let want = expected("openclaw-events", lines.as_bytes());
        let got = wait_run_in(&*p.store, TENANT, run, want.len(), PATIENCE).await;
        assert_eq!(as_json(&got), want, "run {run}: archive vs normalize");
    }
    check_connects(&mut connects, 2);
    cancel.cancel();
    follower.await.unwrap().unwrap();
    server.abort();
}

/// A gateway nobody listens at: `follow-gateway` says so and exits 1 at once instead of
/// retrying forever, and what it writes to a file carries no terminal colour codes.
#[test]
fn an_unreachable_gateway_is_an_error_not_an_endless_retry() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let err_path = dir.path().join("follow.err");
    let mut child = Command::new(bin())
        .args([
            "follow-gateway",
            &format!("ws://127.0.0.1:{port}"),
            "--addr",
            "127.0.0.1:9",
            "--ingest-token",
            "t",
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still retrying after 20 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("cannot follow the gateway"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a file: {err:?}");
}

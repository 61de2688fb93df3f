//! The run stream's encodings checked by their real consumers (issue #18): `up --demo`
//! (one capture per family) plus the agent-runtime families, each run fetched as the
//! Vercel AI SDK UI message stream and turned into a UI message by the `ai` package's
//! `readUIMessageStream` (every chunk validated against the package's own schema), and as
//! AG-UI events validated by `@ag-ui/core`'s schemas. The UI message's reasoning, text
//! and tool parts must equal the run's replayed state.
//!
//! Needs Node and `tests/js/node_modules` (`npm ci --prefix tests/js`, which
//! `scripts/test.sh` runs); fails without them unless `STREAMGATE_SKIP_NODE=1`.

use crate::common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn js_dir() -> std::path::PathBuf {
    root().join("tests/js")
}

fn node_ready() -> bool {
    let ready = js_dir().join("node_modules/ai").exists()
        && js_dir().join("node_modules/@ag-ui/core").exists();
    if !ready {
        assert_eq!(
            std::env::var("STREAMGATE_SKIP_NODE").as_deref(),
            Ok("1"),
            "tests/js/node_modules missing: run `npm ci --prefix tests/js` (or set STREAMGATE_SKIP_NODE=1)"
        );
    }
    ready
}

/// Runs a checker script on an SSE body; its JSON verdict.
fn check(script: &str, body: &Path) -> Value {
    let out = Command::new("node")
        .arg(js_dir().join(script))
        .arg(body)
        .output()
        .expect("run node");
    let text = String::from_utf8_lossy(&out.stdout);
    let verdict: Value =
        serde_json::from_str(text.lines().last().unwrap_or("{}")).unwrap_or_else(|e| {
            panic!(
                "{script}: {e}: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        out.status.success() && verdict["ok"] == true,
        "{script} refused {}: {verdict}",
        body.display()
    );
    verdict
}

fn cli(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Starts `streamgate up --quiet <extra>` in `dir`; waits for its page address (with its
/// `?token=`) and `up.json`.
fn start_up(dir: &Path, extra: &[&str]) -> (Graceful, String, Value) {
    let up = Graceful(
        Command::new(bin())
            .args(["up", "--quiet"])
            .args(extra)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("up.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let err = std::fs::read_to_string(dir.join("up.err")).unwrap_or_default();
        let page = err
            .split_whitespace()
            .find(|w| w.starts_with("http://") && w.contains("?token="))
            .map(str::to_owned);
        let inst = std::fs::read(dir.join(".streamgate/up.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if let (Some(p), Some(i)) = (page, inst) {
            return (up, p, i);
        }
        assert!(Instant::now() < deadline, "up did not come up:\n{err}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Parts of a UI message of one type, in order.
fn parts<'a>(msg: &'a Value, kind: &str) -> Vec<&'a Value> {
    msg["parts"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|x| x["type"].as_str().is_some_and(|t| t == kind))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn ai_sdk_and_ag_ui_encodings_satisfy_their_real_consumers() {
    if !node_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_up, page, _) = start_up(dir.path(), &["--demo", "--stay"]);
    let deadline = Instant::now() + PATIENCE;
    // The agent-runtime families the demo does not bundle.
    for (family, path, run) in [
        ("acp", "acp/answer.jsonl", "extra-acp"),
        ("codex-exec", "codex-exec/answer.jsonl", "extra-codex-exec"),
        (
            "openclaw-events",
            "openclaw-events/answer.jsonl",
            "extra-openclaw",
        ),
    ] {
        let out = cli(
            dir.path(),
            &[
                "ingest",
                root().join("fixtures").join(path).to_str().unwrap(),
                "--family",
                family,
                "--run",
                run,
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (base, token) = page.split_once("/?token=").unwrap();
    // Every run ended (the archive lists it with a terminal status).
    // (run, tenant): the demo's runs are tenant `demo`'s, the extras `default`'s.
    let runs: Vec<(String, String)> = loop {
        let out =
            String::from_utf8_lossy(&cli(dir.path(), &["runs", "--all-tenants", "--json"]).stdout)
                .into_owned();
        let rows: Vec<serde_json::Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if rows.len() >= 12 && rows.iter().all(|r| r["status"] != "open") {
            break rows
                .iter()
                .filter_map(|r| {
                    Some((
                        r["run_id"].as_str()?.to_owned(),
                        r["tenant"].as_str()?.to_owned(),
                    ))
                })
                .collect();
        }
        assert!(Instant::now() < deadline, "runs not all ended:\n{out}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let (mut with_reasoning, mut with_tools, mut with_final) = (0, 0, 0);
    for (run, tenant) in &runs {
        let fetch = |format: &str| {
            rt.block_on(async {
                let resp = client
                    .get(format!(
                        "{base}/v1/runs/{tenant}/{run}/events?format={format}"
                    ))
                    .bearer_auth(token)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                let header = resp
                    .headers()
                    .get("x-vercel-ai-ui-message-stream")
                    .map(|v| v.to_str().unwrap_or("").to_owned());
                (header, resp.text().await.unwrap())
            })
        };
        let (header, ai) = fetch("ai-sdk");
        assert_eq!(header.as_deref(), Some("v1"), "{run}");
        let ai_file = dir.path().join(format!("{run}.ai.sse"));
        std::fs::write(&ai_file, &ai).unwrap();
        let msg = check("ai_sdk_check.mjs", &ai_file)["message"].clone();
        let (_, ag) = fetch("ag-ui");
        let ag_file = dir.path().join(format!("{run}.agui.sse"));
        std::fs::write(&ag_file, &ag).unwrap();
        check("ag_ui_check.mjs", &ag_file);

        let state: Value = serde_json::from_slice(
            &cli(dir.path(), &["replay", run, "--tenant", tenant, "--state"]).stdout,
        )
        .unwrap();
        // Reasoning: the thinking text, in order (the demo has no secrets to mask).
        let want_reasoning: String = state["thinking"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["text"].as_str())
            .collect();
        let got_reasoning: String = parts(&msg, "reasoning")
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert_eq!(got_reasoning, want_reasoning, "{run}: reasoning");
        with_reasoning += usize::from(!want_reasoning.is_empty());
        // Text: the final answer is the last text part.
        if let Some(final_text) = state["final_text"].as_str() {
            let texts = parts(&msg, "text");
            let last = texts.last().and_then(|p| p["text"].as_str());
            assert_eq!(last, Some(final_text), "{run}: final answer");
            with_final += 1;
        }
        // Tools: one part per item, with its call id and arguments.
        let tools: Vec<&Value> = msg["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["toolCallId"].is_string())
            .collect();
        let items = state["items"].as_array().unwrap();
        assert_eq!(tools.len(), items.len(), "{run}: tool parts {msg}");
        with_tools += usize::from(!items.is_empty());
        for (part, item) in tools.iter().zip(items) {
            if let Some(id) = item["id"].as_str() {
                assert_eq!(part["toolCallId"], id, "{run}");
            }
            if let Some(args) = item.get("arguments").filter(|a| !a.is_null()) {
                assert_eq!(&part["input"], args, "{run}: tool input");
            }
        }
    }
    assert!(
        with_reasoning >= 4 && with_tools >= 2 && with_final >= 8,
        "the runs exercise every part: {with_reasoning} with reasoning, {with_tools} with tools, {with_final} with a final"
    );
}

/// Runs the resume check (`DefaultChatTransport.reconnectToStream`) for `run`.
fn resume(api: &str, run: &str, token: &str) -> std::process::Child {
    Command::new("node")
        .arg(js_dir().join("ai_sdk_resume.mjs"))
        .args([api, run, token])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node")
}

fn verdict(child: std::process::Child) -> Value {
    let out = child.wait_with_output().expect("node");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        out.status.success() && v["ok"] == true,
        "resume refused: {v}"
    );
    v
}

/// Issue #18: `useChat({ resume: true })` resumes a run in flight through the real `ai`
/// package's `DefaultChatTransport` (`{api}/{chatId}/stream`): the message it rebuilds
/// equals the run's final answer once the run ends; an ended or unknown run answers 204
/// (no active stream), as the SDK expects.
#[test]
fn the_ai_sdk_resumes_a_run_in_flight() {
    if !node_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join(".streamgate");
    let (_up, page, inst) = start_up(dir.path(), &[]);
    let (base, token) = page.split_once("/?token=").unwrap();
    let api = format!("{base}/v1/runs/default");
    let ingest = format!(
        "http://{}/v1/ingest/default/resumed?family=f1",
        inst["ingest_http"].as_str().unwrap()
    );
    let ingest_token = std::fs::read_to_string(data.join("ingest.token"))
        .unwrap()
        .trim()
        .to_owned();
    let capture = std::fs::read(root().join("fixtures/f1/end-turn.sse")).unwrap();
    let pause = String::from_utf8_lossy(&capture)
        .find("data: {\"type\":\"message_delta\"")
        .unwrap();

    // Not started: no active stream.
    assert_eq!(verdict(resume(&api, "resumed", token))["active"], false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let post = rt.spawn({
        let (ingest, ingest_token) = (ingest.clone(), ingest_token.clone());
        async move {
            reqwest::Client::new()
                .post(ingest)
                .bearer_auth(ingest_token)
                .body(reqwest::Body::wrap_stream(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                ))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    rt.block_on(tx.send(Ok(capture[..pause].to_vec()))).unwrap();
    // The run is in flight once its first events are on the run stream.
    let in_flight = Instant::now() + PATIENCE;
    let child = loop {
        let mut child = resume(&api, "resumed", token);
        // An active stream keeps the client reading until the run ends; a 204 ends it
        // at once.
        std::thread::sleep(Duration::from_millis(1500));
        if child.try_wait().unwrap().is_none() {
            break child;
        }
        let v = verdict(child);
        assert_eq!(v["active"], false, "{v}");
        assert!(Instant::now() < in_flight, "the run never became active");
    };
    // The rest of the turn: the resumed client reads it live and ends with the run.
    rt.block_on(tx.send(Ok(capture[pause..].to_vec()))).unwrap();
    drop(tx);
    assert_eq!(rt.block_on(post).unwrap().unwrap(), 200);
    let v = verdict(child);
    assert_eq!(v["active"], true, "{v}");
    let types = v["chunkTypes"].as_array().unwrap();
    assert_eq!(types.first().and_then(Value::as_str), Some("start"), "{v}");
    assert_eq!(types.last().and_then(Value::as_str), Some("finish"), "{v}");
    // The live run stream ends with the run; the archive writes the same events on its
    // own consumer, so it may hold the final answer a moment later.
    let archived = Instant::now() + PATIENCE;
    let state = loop {
        let out = Command::new(bin())
            .args(["replay", "resumed", "--state"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let state: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if state["final_text"].is_string() || Instant::now() > archived {
            break state;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let texts = parts(&v["message"], "text");
    assert_eq!(
        texts.last().and_then(|p| p["text"].as_str()),
        state["final_text"].as_str(),
        "{v}"
    );
    // Ended: no active stream.
    assert_eq!(verdict(resume(&api, "resumed", token))["active"], false);
}

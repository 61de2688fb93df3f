//! `streamgate up` as an operator meets it: one `up` per data dir, a broker that dies is
//! brought back, a stop that is prompt whatever is still queued, a CLI that exits quietly
//! on a closed pipe.
//!
//! - `a_second_up_is_refused_and_a_killed_broker_comes_back`: a second `up` on a live data
//!   dir exits non-zero naming the first; SIGKILL of `up`'s nats-server is recovered from
//!   (an ingest goes through again within 15 s); SIGTERM ends `up` within 10 s and takes
//!   its nats-server with it.
//! - `settings_from_the_command_line`: `up --verbose` sets the channels' default and
//!   `streamgate settings` changes and shows one chat's override on the running `up`.
//! - `ingest_on_up_needs_its_token`: `up` writes an all-tenant `ingest.token` (0600)
//!   that its front doors require (HTTP 401 without it) and `streamgate ingest` sends.
//! - `replay_into_a_closed_pipe_exits_quietly`: `streamgate replay … | head -n 0` prints no
//!   panic.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The data dir a test's `up` runs on.
fn data_dir(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join(".streamgate")
}

/// Starts `streamgate up --quiet <extra>` in `dir` and waits for its `up.json`.
fn start_up_with(dir: &std::path::Path, extra: &[&str]) -> Graceful {
    let mut up = Graceful(
        Command::new(bin())
            .args(["up", "--quiet"])
            .args(extra)
            .current_dir(dir)
            .stdout(std::fs::File::create(dir.join("up.out")).unwrap())
            .stderr(std::fs::File::create(dir.join("up.err")).unwrap())
            .spawn()
            .expect("spawn streamgate up"),
    );
    let deadline = Instant::now() + PATIENCE;
    while !data_dir(dir).join("up.json").exists() {
        if let Ok(Some(s)) = up.0.try_wait() {
            panic!("streamgate up exited with {s}:\n{}", up_err(dir));
        }
        assert!(Instant::now() < deadline, "no up.json after {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    up
}

/// Starts `streamgate up --quiet` in `dir` and waits for its `up.json`.
fn start_up(dir: &std::path::Path) -> Graceful {
    start_up_with(dir, &[])
}

fn up_err(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("up.err")).unwrap_or_default()
}

/// Pids of the nats-servers whose store is under `dir`.
fn broker_pids(dir: &std::path::Path) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("{}/nats/js", data_dir(dir).display())])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Ingests a tiny capture as run `run` through the CLI; true when it was acked.
fn ingest(dir: &std::path::Path, run: &str) -> bool {
    let capture = dir.join("capture.sse");
    std::fs::write(&capture, fixture("f1/end-turn.sse")).unwrap();
    Command::new(bin())
        .args(["ingest", "--family", "f1", "--run", run])
        .arg(&capture)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_second_up_is_refused_and_a_killed_broker_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = start_up(dir.path());

    let second = Command::new(bin())
        .args(["up", "--quiet"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let msg = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a second up started:\n{msg}");
    assert!(
        msg.contains("already serving") && msg.contains(&up.0.id().to_string()),
        "the refusal does not name the running up:\n{msg}"
    );
    assert!(ingest(dir.path(), "before"), "the first up stopped serving");

    let pids = broker_pids(dir.path());
    assert_eq!(pids.len(), 1, "one broker expected: {pids:?}");
    Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut recovered = false;
    while Instant::now() < deadline {
        if ingest(dir.path(), "after") {
            recovered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        recovered,
        "no ingest within 15 s of killing the broker:\n{}",
        up_err(dir.path())
    );
    assert!(
        up_err(dir.path()).contains("restarting"),
        "the restart was not reported:\n{}",
        up_err(dir.path())
    );

    let started = Instant::now();
    Command::new("kill")
        .args(["-TERM", &up.0.id().to_string()])
        .status()
        .unwrap();
    let deadline = started + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = up.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "up still running 10 s after SIGTERM:\n{}",
            up_err(dir.path())
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "up exited with {status}:\n{}",
        up_err(dir.path())
    );
    assert!(
        broker_pids(dir.path()).is_empty(),
        "nats-server left running after up stopped"
    );
}

#[test]
fn ingest_on_up_needs_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    let token_file = data_dir(dir.path()).join("ingest.token");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "ingest.token mode {mode:o}");
    }
    let token = std::fs::read_to_string(&token_file).unwrap();
    let up_err = up_err(dir.path());
    assert!(
        !up_err.contains(token.trim()),
        "up printed its ingest token"
    );
    // `streamgate ingest` finds the token by itself.
    assert!(ingest(dir.path(), "tok-1"));
    let inst: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir(dir.path()).join("up.json")).unwrap())
            .unwrap();
    let http = inst["ingest_http"].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let post = |auth: Option<String>, run: &str| {
        let url = format!("http://{http}/v1/ingest/acme/{run}?family=f1");
        rt.block_on(async {
            let mut req = reqwest::Client::new()
                .post(url)
                .body(fixture("f1/end-turn.sse"));
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            req.send().await.unwrap().status().as_u16()
        })
    };
    assert_eq!(post(None, "tok-2"), 401);
    assert_eq!(post(Some("Bearer wrong-token".into()), "tok-2"), 401);
    assert_eq!(post(Some(format!("bearer {}", token.trim())), "tok-2"), 200);
    // An explicit wrong token overrides the local one, and is refused.
    let capture = dir.path().join("capture.sse");
    let out = Command::new(bin())
        .args([
            "ingest", "--family", "f1", "--run", "tok-3", "--token", "wrong",
        ])
        .arg(&capture)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ingest token"), "{stderr}");
}

#[test]
fn replay_into_a_closed_pipe_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    assert!(ingest(dir.path(), "r1"));
    let script = format!("'{}' replay r1 --json | head -n 0", bin().display());
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "replay panicked:\n{stderr}");
    assert!(out.status.success(), "replay | head failed:\n{stderr}");
}

/// `up --verbose full` sets its channels' default; `streamgate settings` changes one
/// chat's override on the running instance and shows it back without flags.
#[test]
fn settings_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up_with(dir.path(), &["--verbose", "full"]);
    let settings = |args: &[&str]| {
        let out = Command::new(bin())
            .arg("settings")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        settings(&["web"]).contains("/verbose full"),
        "up --verbose full not applied"
    );
    let set = settings(&["web", "--chat", "c1", "--reasoning", "stream"]);
    assert!(set.contains("/reasoning stream"), "{set}");
    let shown = settings(&["web", "--chat", "c1"]);
    assert!(
        shown.contains("/reasoning stream") && shown.contains("/verbose full"),
        "{shown}"
    );
    assert!(
        settings(&["web", "--chat", "c2"]).contains("/reasoning on"),
        "another chat changed too"
    );
}

/// `up --metrics` serves Prometheus text where every streamgate series has `# HELP`,
/// with the build info and the consumers' lag.
#[test]
fn metrics_carry_help_text_build_info_and_consumer_lag() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _up = start_up_with(dir.path(), &["--metrics", &addr]);
    assert!(ingest(dir.path(), "m1"));
    // The lag reporter runs every 5 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{addr}/metrics")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("streamgate_consumer_pending_messages{") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(text.contains("streamgate_build_info{"), "{text}");
    assert!(
        text.contains("streamgate_consumer_pending_messages{"),
        "{text}"
    );
    assert!(
        text.contains("streamgate_archive_commit_latency_seconds_bucket"),
        "{text}"
    );
    for line in text.lines() {
        let Some(name) = line.split(['{', ' ']).next() else {
            continue;
        };
        if line.starts_with('#') || !name.starts_with("streamgate_") {
            continue;
        }
        let base = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        assert!(
            text.contains(&format!("# HELP {base} ")),
            "{base} has no # HELP"
        );
    }
}

/// The web page through the address `up` prints (token and all), in headless Chromium:
/// an ended run is in the run list, its final is rendered markdown (a heading element,
/// no literal `**`/`##`), its thinking is in a collapsed `<details>`. The screenshot is
/// kept as `target/artifacts/up-web.png`. (The XSS test of the page is
/// services/projector/tests/e2e.rs, on the same page.)
#[test]
fn the_web_page_up_prints_shows_rendered_answers() {
    let chromium =
        std::env::var("STREAMGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !std::path::Path::new(&chromium).exists() {
        assert_eq!(
            std::env::var("STREAMGATE_SKIP_BROWSER").as_deref(),
            Ok("1"),
            "no browser at {chromium} (set STREAMGATE_SKIP_BROWSER=1 to skip)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    let err = up_err(dir.path());
    let url = err
        .split_whitespace()
        .find(|w| w.starts_with("http://") && w.contains("?token="))
        .unwrap_or_else(|| panic!("up printed no page address:\n{err}"))
        .to_owned();
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"m\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let capture = [
        chunk(
            r#"{"role":"assistant","content":null,"reasoning_content":"Check the forecast."}"#,
            "null",
        ),
        chunk(
            &serde_json::json!({"content": "## Paris today\n\n**18 °C**, sunny.\n"}).to_string(),
            "null",
        ),
        chunk(r#"{"content":""}"#, r#""stop""#),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    std::fs::write(dir.path().join("md.sse"), capture).unwrap();
    let ok = Command::new(bin())
        .args(["ingest", "--family", "f2", "--run", "md-run"])
        .arg(dir.path().join("md.sse"))
        .current_dir(dir.path())
        .status()
        .unwrap()
        .success();
    assert!(ok, "ingest failed");
    let page = format!("{url}&run=md-run");
    let browse = |extra: &[&str]| {
        // `timeout`: a browser that hangs fails the look, not the test run. `--timeout`
        // (not a virtual-time budget, which waits for the page's open event stream).
        Command::new("timeout")
            .arg("30")
            .arg(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
                "--window-size=1280,800",
                "--timeout=4000",
            ])
            .arg(format!(
                "--user-data-dir={}",
                tempfile::tempdir().unwrap().keep().display()
            ))
            .args(extra)
            .arg(&page)
            .output()
            .unwrap()
    };
    // The run ends a moment after the ingest returns; look until the page shows it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let dom = loop {
        let dom = String::from_utf8_lossy(&browse(&["--dump-dom"]).stdout).into_owned();
        if dom.contains("Paris today") || Instant::now() > deadline {
            break dom;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let heading = in_heading(&dom, "Paris today");
    assert!(
        heading,
        "the answer heading is not a heading element:\n{dom}"
    );
    assert!(
        !dom.contains("**18") && !dom.contains("## Paris"),
        "raw markdown:\n{dom}"
    );
    assert!(
        dom.contains("<details"),
        "thinking not in <details>:\n{dom}"
    );
    assert!(dom.contains("md-run"), "the run is not in the list:\n{dom}");
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("up-web.png");
    browse(&[&format!("--screenshot={}", shot.display())]);
}

/// True when `text` stands in an `<h1>`…`<h6>` element of `dom`.
fn in_heading(dom: &str, text: &str) -> bool {
    (1..=6).any(|n| {
        dom.split(&format!("<h{n}")).skip(1).any(|rest| {
            rest.split(&format!("</h{n}>"))
                .next()
                .is_some_and(|h| h.contains(text))
        })
    })
}

//! `streamgate up` as an operator meets it: one `up` per data dir, a broker that dies is
//! brought back, a stop that is prompt whatever is still queued, a CLI that exits quietly
//! on a closed pipe.
//!
//! - `a_second_up_is_refused_and_a_killed_broker_comes_back`: a second `up` on a live data
//!   dir exits non-zero naming the first; SIGKILL of `up`'s nats-server is recovered from
//!   (an ingest goes through again within 15 s); SIGTERM ends `up` within 10 s and takes
//!   its nats-server with it.
//! - `settings_from_the_command_line`: `up --verbose` (and a dedupe knob,
//!   `--max-status-chars`) sets the channels' default and `streamgate settings` changes
//!   and shows one chat's overrides (`/reasoning`, tag visibility, delivery mode, budgets)
//!   on the running `up`.
//! - `secrets_reach_no_channel_surface`: with `--reasoning stream --verbose full`, every
//!   secret shape of issue 11 in thinking and tool arguments reaches neither the webhook,
//!   the web page's data nor `tail` (status lines or raw events).
//! - `ingest_on_up_needs_its_token`: `up` writes an all-tenant `ingest.token` (0600)
//!   that its front doors require (HTTP 401 without it) and `streamgate ingest` sends.
//! - `ingest_from_stdin_is_live`: `streamgate ingest -` archives what a writer sent
//!   before pausing while standard input is still open; the run equals `normalize`.
//! - `replay_into_a_closed_pipe_exits_quietly`: `streamgate replay … | head -n 0` prints no
//!   panic.
//! - `local_secrets_are_private_and_the_broker_requires_credentials`: the data dir is 0700
//!   and the archive (WAL/SHM too), `up.json`, `nats.env`, channel tokens and the broker's
//!   config 0600; the broker refuses clients without up's credentials (or with a wrong
//!   password), also after a restart, and the password is on no command line.
//! - `up_serves_tls_and_its_clients_follow`: `up --tls-cert/--tls-key` records
//!   `https://` addresses in `up.json` and prints an https page; `ingest --ca` and
//!   `replay --ca` work, an ingest without `--ca` is refused with a hint; with
//!   `--tls-client-ca` an ingest without a client certificate is refused and one with
//!   it works.
//! - `verify_and_backfill_after_an_adapter_change`: `up` records which adapter made each
//!   run (`runs`); a run whose archived events an older adapter made (simulated by
//!   rewriting its rows) is the one run `verify` reports (exit 1); `backfill` is a dry run
//!   until `--apply`, which writes generation 2; a second backfill writes nothing;
//!   `replay` shows the new events and `replay --generation 1` the old.
//! - `erase_leaves_no_trace_in_any_store`: two runs of a session, delivered to a webhook
//!   channel, are erased with `streamgate erase --session`; afterwards neither their
//!   answer text nor their run ids occur in any file of the data dir (the SQLite archive
//!   and its WAL, the broker's SG_RAW, SG_EVENTS and KV stores), a run of another session
//!   is untouched, the audit lists the erasure without the ids, and erasing again
//!   removes nothing.
//! - `retention_strips_thinking_on_request`: `streamgate retention` says when there is no
//!   policy; with `up --retention '*:strip=0d'` it shows the policy and the run due, and
//!   `--apply` leaves the run's answer and thinking segments but its thinking text as a
//!   stub (`replay`), its raw chunks gone (`verify` says so).
//! - `export_writes_jsonl_and_genai_traces`: `streamgate export` writes one JSONL line per
//!   run with all its events, and `export --otlp` sends a local OTLP receiver one trace per
//!   run: `invoke_agent` → `chat {model}` (usage, finish reason, time to first chunk) and
//!   `execute_tool {name}` per tool; message content only with `--content`.
//! - `continuous_export_sends_each_ended_run_once`: `up --export-otlp` sends every run
//!   that ends to a local OTLP receiver as its trace, once.
//! - `a_service_joins_up_with_its_nats_env_and_is_refused_without`: `streamgate projector
//!   --config <data dir>/nats.env` joins; without credentials it exits refused.

use crate::cdp;
use crate::common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The data dir a test's `up` runs on.
fn data_dir(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join(".streamgate")
}

/// Starts `streamgate up --quiet <extra>` in `dir` and waits for its `up.json`.
///
/// Started once more when it stops on "Address already in use": `up` checks that a
/// remembered port is free and binds it moments later, and another test's server can
/// take that port in between (picked at random from the same range). The second start
/// finds the port taken and picks a fresh one, as a user's rerun would.
fn start_up_with(dir: &std::path::Path, extra: &[&str]) -> Graceful {
    match try_start_up(dir, extra) {
        Ok(up) => up,
        Err(err) if err.contains("Address already in use") => try_start_up(dir, extra)
            .unwrap_or_else(|err| panic!("streamgate up failed twice:\n{err}")),
        Err(err) => panic!("{err}"),
    }
}

/// One start of `streamgate up --quiet <extra>`: running once `up.json` exists, or why
/// it exited before.
fn try_start_up(dir: &std::path::Path, extra: &[&str]) -> Result<Graceful, String> {
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
            return Err(format!("streamgate up exited with {s}:\n{}", up_err(dir)));
        }
        assert!(Instant::now() < deadline, "no up.json after {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    Ok(up)
}

/// Starts `streamgate up --quiet` in `dir` and waits for its `up.json`.
fn start_up(dir: &std::path::Path) -> Graceful {
    start_up_with(dir, &[])
}

/// The page address `up` printed (`http://…/?token=…`); its lines follow `up.json`, so
/// this waits for them.
fn page_url(dir: &std::path::Path) -> String {
    let err = up_err_with(dir, "?token=");
    err.split_whitespace()
        .find(|w| w.starts_with("http://") && w.contains("?token="))
        .unwrap_or_else(|| panic!("up printed no page address:\n{err}"))
        .to_owned()
}

fn up_err(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("up.err")).unwrap_or_default()
}

/// `up`'s stderr once a whole line of it contains `needle` (its address lines follow
/// `up.json`, so a test that has just seen `up.json` waits for them; stderr is unbuffered,
/// so a line can be read half written).
fn up_err_with(dir: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let err = up_err(dir);
        if err
            .split_inclusive('\n')
            .any(|line| line.ends_with('\n') && line.contains(needle))
        {
            return err;
        }
        assert!(
            Instant::now() < deadline,
            "up never printed {needle:?}:\n{err}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// A fake webhook receiver (secret `hook-secret`) on a runtime of its own.
fn fake_webhook() -> (tokio::runtime::Runtime, streamgate_sinks::fakes::FakeServer) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hook = rt
        .block_on(streamgate_sinks::fakes::FakeServer::webhook(
            "hook-secret",
            Default::default(),
        ))
        .unwrap();
    (rt, hook)
}

/// `streamgate ingest --family f1 --run <run> <extra…> <capture>` in `dir`.
fn ingest_f1(
    dir: &std::path::Path,
    run: &str,
    capture: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec!["ingest", "--family", "f1", "--run", run];
    args.extend_from_slice(extra);
    args.push(capture.to_str().unwrap());
    cli(dir, &args)
}

/// [`ingest_f1`], which must succeed.
fn ingested_f1(dir: &std::path::Path, run: &str, capture: &std::path::Path, extra: &[&str]) {
    let out = ingest_f1(dir, run, capture, extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let _up = start_up_with(
        dir.path(),
        &["--verbose", "full", "--max-status-chars", "77"],
    );
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
    // The dedupe knobs (issue #13): up's channel default, then one chat's overrides.
    let set = settings(&[
        "web",
        "--chat",
        "c1",
        "--tag",
        "plan=show,usage_update=show",
        "--delivery-mode",
        "final_only",
        "--max-turn-chars",
        "900",
    ]);
    assert!(
        set.contains("delivery final_only")
            && set.contains("max chars turn 900, tool 120, status 77")
            && set.contains(
                "shown: agent_message_chunk,plan,tool_call,tool_call_update,usage_update ·"
            ),
        "{set}"
    );
    let shown = settings(&["web", "--chat", "c1", "--tag", "plan=default"]);
    assert!(
        shown.contains("/reasoning stream")
            && shown.contains("delivery final_only")
            && shown
                .contains("shown: agent_message_chunk,tool_call,tool_call_update,usage_update ·"),
        "{shown}"
    );
    let other = settings(&["web", "--chat", "c2"]);
    assert!(
        other.contains("delivery live")
            && other.contains("max chars turn 2000, tool 120, status 77"),
        "another chat changed too: {other}"
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
    // The lag reporter runs every 5 s; the archive's first commit follows the ingest's
    // normalization, which on a loaded machine can come after the first lag report.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{addr}/metrics")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let ready = text.contains("streamgate_consumer_pending_messages{")
            && text.contains("streamgate_archive_commit_latency_seconds_bucket");
        if ready || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(text.contains("streamgate_build_info{"), "{text}");
    assert!(
        text.contains("streamgate_consumer_pending_messages{"),
        "{text}"
    );
    // The process_* family every Prometheus client exports.
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.contains(&format!("\n{process} ")), "{process}: {text}");
    }
    // Counters exist at zero before their first event: a dashboard shows 0, not "No data".
    for counter in [
        "streamgate_lease_lost_total",
        "streamgate_delivery_dropped_total",
    ] {
        assert!(
            text.contains(&format!("\n{counter} 0")),
            "{counter}: {text}"
        );
    }
    assert!(
        text.contains("streamgate_archive_commit_latency_seconds_bucket"),
        "{text}"
    );
    // The ingested capture's bytes, and the ingest call among the servers' responses.
    let ingested: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("streamgate_ingest_bytes_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(ingested > 0, "{text}");
    assert!(
        text.contains("streamgate_server_responses_total{server=\"grpc\",status=\"200\"}"),
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
    let url = page_url(dir.path());
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
    // The page as a person's browser shows it (the DevTools helper of the projector's
    // page tests): look until the run's answer is there.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dom = rt.block_on(async {
        let mut browser = cdp::Browser::launch(&page, 1280, 800)
            .await
            .unwrap()
            .expect("a browser (checked above)");
        let (dom, _) = browser
            .wait_for(
                "document.documentElement?.outerHTML ?? ''",
                Duration::from_secs(30),
                |v| in_heading(v.as_str().unwrap_or_default(), "Paris today"),
            )
            .await
            .unwrap();
        let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
        browser
            .screenshot(&artifacts.join("up-web.png"))
            .await
            .unwrap();
        browser.close().await;
        dom.as_str().unwrap_or_default().to_owned()
    });
    assert!(
        in_heading(&dom, "Paris today"),
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
    assert_eq!(
        dom.matches("Paris today</h2>").count(),
        1,
        "the answer shown twice:\n{dom}"
    );
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

/// Every secret shape of issue 11, as `(prefix, secret, suffix)`: the secret part must
/// never reach a channel surface; prefix and suffix are context that may.
const SECRET_SHAPES: &[(&str, &str, &str)] = &[
    ("key sk-ant-api03-", "Zq9Xw7Vk3Lm1Np5Rt8Yu", " in .env"),
    ("password=", "Hq7Zt2Wv9xQ", " there"),
    (
        "AWS_SECRET_ACCESS_KEY=",
        "wJalrXUtnFEMI7K7MDENGbPxRfiCYEXAMPLE",
        " set",
    ),
    ("psql postgres://app:", "S3cr3tPw42", "@db.internal/x"),
    (
        "git clone https://deploy:",
        "Gh7Kl9Mn3Pq",
        "@git.example.com/r.git",
    ),
    ("curl -u admin:", "Vb8Nm2Qw4Er", " https://api.example.com"),
    ("mysql -h db -p", "Rt5Yu7Io9Pa", " app"),
    ("stripe sk_live_", "51HxTestKey4242abcdEFGH", " ok"),
    ("gitlab glpat-", "Xy8Zw6Vu4Ts2Rq0Po9Nm", " ok"),
    ("github ghp_", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0UvWxYz", " ok"),
    ("maps AIza", "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", " ok"),
    (
        "jwt eyJ",
        "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r",
        " ok",
    ),
    (r#"{"db_pass": ""#, "Mn4Bv6Cx8ZlQ", r#""}"#),
    ("Authorization: Bearer ", "Tk9Lm8Nb7Vc6Xz5As4Df", " sent"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\n",
        "MIIEpAIBAAKCAQEA7xQz3Kp9Lm2Nb8Vc",
        "\n-----END RSA PRIVATE KEY-----",
    ),
    (
        "bot 123456789:",
        "AAHd7Kx9Lm2Np4Qr6St8Uv0Wx1Yz3Ab5Cd7",
        " ok",
    ),
];

/// An Anthropic Messages capture (family f1): every secret shape in the thinking, split
/// across deltas of 7 bytes, then a clean answer.
fn thinking_capture(text: &str) -> String {
    let data = |v: serde_json::Value| format!("data: {v}\n\n");
    let mut out = String::from("event: message_start\n");
    out += &data(
        serde_json::json!({"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}),
    );
    out += &data(
        serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}),
    );
    for piece in pieces(text, 7) {
        out += &data(
            serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":piece}}),
        );
    }
    out += &data(serde_json::json!({"type":"content_block_stop","index":0}));
    out += &data(
        serde_json::json!({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}),
    );
    out += &data(
        serde_json::json!({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"All credentials are rotated."}}),
    );
    out += &data(serde_json::json!({"type":"content_block_stop","index":1}));
    out += &data(
        serde_json::json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":20}}),
    );
    out += &data(serde_json::json!({"type":"message_stop"}));
    out
}

/// The same family: a tool call whose streamed arguments hold every secret shape.
fn tool_capture(args: &serde_json::Value) -> String {
    let data = |v: serde_json::Value| format!("data: {v}\n\n");
    let mut out = String::from("event: message_start\n");
    out += &data(
        serde_json::json!({"type":"message_start","message":{"id":"msg_t","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}),
    );
    out += &data(
        serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_s","name":"bash","input":{}}}),
    );
    for piece in pieces(&args.to_string(), 7) {
        out += &data(
            serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":piece}}),
        );
    }
    out += &data(serde_json::json!({"type":"content_block_stop","index":0}));
    out += &data(
        serde_json::json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}),
    );
    out += &data(serde_json::json!({"type":"message_stop"}));
    out
}

/// `text` cut into pieces of at most `n` bytes, on char boundaries.
fn pieces(text: &str, n: usize) -> Vec<String> {
    let mut out = vec![String::new()];
    for c in text.chars() {
        if out.last().is_some_and(|p| p.len() + c.len_utf8() > n) {
            out.push(String::new());
        }
        out.last_mut().unwrap().push(c);
    }
    out
}

/// The secrets (or any 8-byte piece of one) found in `surface`.
fn leaks(surface: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (_, secret, _) in SECRET_SHAPES {
        let bytes = secret.as_bytes();
        if let Some(w) = bytes
            .windows(8.min(bytes.len()))
            .filter_map(|w| std::str::from_utf8(w).ok())
            .find(|w| surface.contains(w))
        {
            found.push(format!("{secret} (as {w:?})"));
        }
    }
    found
}

/// Issue 11: with `/reasoning stream` and `/verbose full` on every channel, a run whose
/// thinking holds every secret shape and a run whose tool arguments hold them show none
/// of them on the webhook, the web page or `tail` (status lines and raw events).
#[test]
fn secrets_reach_no_channel_surface() {
    let (rt, hook) = fake_webhook();
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up_with(
        dir.path(),
        &[
            "--reasoning",
            "stream",
            "--verbose",
            "full",
            "--channel",
            "web=127.0.0.1:0",
            "--channel",
            &format!("webhook={}", hook.base_url),
            "--channel-secret",
            "hook-secret",
        ],
    );
    let url = page_url(dir.path());
    let (base, token) = url.split_once("/?token=").unwrap();

    let text: String = SECRET_SHAPES
        .iter()
        .map(|(p, s, x)| format!("{p}{s}{x}\n"))
        .collect();
    let args = serde_json::json!({
        "command": SECRET_SHAPES.iter().take(12).map(|(p, s, x)| format!("{p}{s}{x}")).collect::<Vec<_>>().join(" && "),
        "env": {"AWS_SECRET_ACCESS_KEY": SECRET_SHAPES[2].1, "db_pass": SECRET_SHAPES[12].1},
        "headers": format!("Authorization: Bearer {}", SECRET_SHAPES[13].1),
        "key": format!("{}{}{}", SECRET_SHAPES[14].0, SECRET_SHAPES[14].1, SECRET_SHAPES[14].2),
        "bot": format!("123456789:{}", SECRET_SHAPES[15].1),
    });
    let runs = [
        ("secret-thinking", thinking_capture(&text)),
        ("secret-tool", tool_capture(&args)),
    ];
    // Both tails (status lines and raw events) follow a run from its start to its end.
    let mut tails = Vec::new();
    for (run, _) in &runs {
        for raw in [false, true] {
            let mut cmd = Command::new(bin());
            cmd.args(["tail", "--run", run, "--reasoning", "on", "--verbose", "on"]);
            if raw {
                cmd.arg("--raw-events");
            }
            // Stderr in a file, to see below when the tail waits for its run.
            let err = dir.path().join(format!("tail-{run}-raw-{raw}.err"));
            let child = cmd
                .current_dir(dir.path())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&err).unwrap())
                .spawn()
                .unwrap();
            tails.push((format!("tail {run} raw={raw}"), child, err));
        }
    }
    // Every tail is connected and waiting for its run (it says so just before it
    // watches) before the runs start.
    wait_until(
        "every `tail --run` saying it waits for its run to start",
        PATIENCE,
        || {
            tails.iter().all(|(_, _, err)| {
                std::fs::read_to_string(err)
                    .unwrap_or_default()
                    .contains("waiting for it to start")
            })
        },
    );
    for (run, capture) in &runs {
        let path = dir.path().join(format!("{run}.sse"));
        std::fs::write(&path, capture).unwrap();
        // Paced like a live provider, in small chunks: a run's chunks that reach the
        // normalizer together go out as one message, and a channel shows only where
        // such a backlog ends (the final), not the drafts this test reads.
        let ok = Command::new(bin())
            .args(["ingest", "--family", "f1", "--run", run])
            .args(["--pace", "recorded", "--chunk-bytes", "512"])
            .arg(&path)
            .current_dir(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "ingest of {run} failed");
    }

    let mut surfaces: Vec<(String, String)> = Vec::new();
    for (name, mut child, err) in tails {
        // A tail that never sees its run end is killed (and then fails below).
        let deadline = Instant::now() + PATIENCE;
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout).into_owned()
            + &std::fs::read_to_string(&err).unwrap_or_default();
        surfaces.push((name, shown));
    }
    // The webhook's ops: drafts (thinking, tool rows), notices, the settle.
    let deadline = Instant::now() + PATIENCE;
    while !runs.iter().all(|(run, _)| {
        hook.calls().iter().any(|c| {
            c.body.to_string().contains(run)
                && ["final", "settle", "dismiss"].contains(&c.api.as_str())
        })
    }) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls: Vec<String> = hook.calls().iter().map(|c| c.body.to_string()).collect();
    assert!(
        calls.iter().any(|c| c.contains("sk-ant-***")),
        "the webhook never showed the masked thinking: {calls:#?}\n{}",
        up_err(dir.path())
    );
    assert!(
        calls.iter().any(|c| c.contains("postgres://app:***@")),
        "the webhook never showed the masked tool arguments: {calls:#?}"
    );
    surfaces.push(("webhook".into(), calls.join("\n")));
    // The web page's data, as the page reads it: the run stream.
    let client = reqwest::Client::new();
    for (run, _) in &runs {
        let body = rt.block_on(async {
            client
                .get(format!("{base}/v1/runs/default/{run}/events?wait=10"))
                .bearer_auth(token)
                .send()
                .await?
                .text()
                .await
        });
        surfaces.push((format!("web {run}"), body.unwrap()));
    }
    for (name, shown) in &surfaces {
        let found = leaks(shown);
        assert!(found.is_empty(), "{name} shows {found:#?}:\n{shown}");
    }
    let thinking_tail = &surfaces[1].1;
    assert!(
        thinking_tail.contains("secret-thinking"),
        "the raw tail saw nothing: {thinking_tail}"
    );
}

/// Permission bits of `p`.
#[cfg(unix)]
fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Connects to `url` with these credentials (none when `user` is `None`).
async fn nats_connect(
    url: &str,
    user: Option<(&str, &str)>,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    let mut options = async_nats::ConnectOptions::new();
    if let Some((u, p)) = user {
        options = options.user_and_password(u.to_owned(), p.to_owned());
    }
    options.connect(url).await
}

/// Issue #11: what `up` keeps in its data dir is its owner's only — the dir 0700, the
/// archive and its WAL/SHM, `up.json`, channel tokens and the broker's credentials 0600
/// — and its nats-server refuses clients without the credentials `up` generated (none
/// of them on the broker's command line), also after the broker was killed and brought
/// back.
#[cfg(unix)]
#[test]
fn local_secrets_are_private_and_the_broker_requires_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    assert!(ingest(dir.path(), "r1"), "{}", up_err(dir.path()));
    let data = data_dir(dir.path());
    assert_eq!(mode(&data), 0o700, "data dir");
    for file in [
        "up.json",
        "channel-web.token",
        "nats.env",
        "nats/nats-server.conf",
        "archive.db",
        "archive.db-wal",
        "archive.db-shm",
    ] {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }

    let inst: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("up.json")).unwrap()).unwrap();
    let url = inst["nats_url"].as_str().unwrap().to_owned();
    let user = inst["nats_user"].as_str().expect("nats_user").to_owned();
    let password = inst["nats_password"]
        .as_str()
        .expect("nats_password")
        .to_owned();
    assert!(password.len() >= 32, "a weak password");
    let env = std::fs::read_to_string(data.join("nats.env")).unwrap();
    assert!(env.contains(&format!("STREAMGATE_NATS_PASSWORD={password}")));
    for pid in broker_pids(dir.path()) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains(&password),
            "the password is on the broker's command line"
        );
    }
    assert!(
        !up_err(dir.path()).contains(&password),
        "up printed the password"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let check = |when: &str| {
        rt.block_on(async {
            assert!(
                nats_connect(&url, None).await.is_err(),
                "{when}: a client without credentials was let in"
            );
            assert!(
                nats_connect(&url, Some((&user, "wrong"))).await.is_err(),
                "{when}: a wrong password was let in"
            );
            let client = nats_connect(&url, Some((&user, &password)))
                .await
                .unwrap_or_else(|e| panic!("{when}: the credentials were refused: {e}"));
            let js = async_nats::jetstream::new(client);
            js.get_stream(streamgate_bus::RAW_STREAM)
                .await
                .unwrap_or_else(|e| panic!("{when}: no JetStream with the credentials: {e}"));
        });
    };
    check("at start");

    // The supervisor brings a killed broker back with the same credentials.
    let pids = broker_pids(dir.path());
    assert_eq!(pids.len(), 1, "one broker expected: {pids:?}");
    Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ingest(dir.path(), "r2") {
        assert!(
            Instant::now() < deadline,
            "no ingest within 15 s of killing the broker:\n{}",
            up_err(dir.path())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    check("after a broker restart");
}

/// A service joins a running `up` with nothing but `--config <data dir>/nats.env` (the
/// shared bus flags read the broker's address and credentials from it, exported before
/// the runtime starts); the same service without the credentials is refused by the broker.
#[test]
fn a_service_joins_up_with_its_nats_env_and_is_refused_without() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    let data = data_dir(dir.path());
    let inst: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("up.json")).unwrap()).unwrap();
    let url = inst["nats_url"].as_str().unwrap().to_owned();
    let projector = |extra: &[&str], log: &str| {
        let mut cmd = Command::new(bin());
        cmd.args(["projector", "--name", "joined", "--sink", "plain=stdout"])
            .args(["--grpc", "127.0.0.1:0"])
            .args(extra)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(log)).unwrap());
        for var in [
            "STREAMGATE_NATS_URL",
            "STREAMGATE_NATS_USER",
            "STREAMGATE_NATS_PASSWORD",
            "STREAMGATE_NATS_TOKEN",
            "STREAMGATE_NATS_CREDS",
            "STREAMGATE_CONFIG",
        ] {
            cmd.env_remove(var);
        }
        Graceful(cmd.spawn().expect("spawn streamgate projector"))
    };

    // Without credentials: refused, and the error says so without leaking anything.
    let mut refused = projector(&["--nats", &url], "refused.err");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = refused.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "a projector without NATS credentials kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let err = std::fs::read_to_string(dir.path().join("refused.err")).unwrap();
    assert!(
        err.to_lowercase().contains("authorization"),
        "no authorization error:\n{err}"
    );

    // With the instance's nats.env: it joins (its durable consumers appear).
    let env = data.join("nats.env");
    let _joined = projector(&["--config", env.to_str().unwrap()], "joined.err");
    let user = inst["nats_user"].as_str().unwrap().to_owned();
    let password = inst["nats_password"].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let joined = rt.block_on(async {
        let client = nats_connect(&url, Some((&user, &password))).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let stream = js.get_stream(streamgate_bus::EVENTS_STREAM).await.unwrap();
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            let names: Vec<String> = {
                use tokio_stream::StreamExt as _;
                stream
                    .consumer_names()
                    .filter_map(Result::ok)
                    .collect::<Vec<_>>()
                    .await
            };
            if names.iter().any(|n| n.starts_with("sg-projector-joined")) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    });
    assert!(
        joined,
        "the projector never joined with --config nats.env:\n{}",
        std::fs::read_to_string(dir.path().join("joined.err")).unwrap_or_default()
    );
}

/// Runs the CLI in `dir` with `args`; its output.
fn cli(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env_remove("STREAMGATE_CA")
        .env_remove("STREAMGATE_CLIENT_CERT")
        .env_remove("STREAMGATE_CLIENT_KEY")
        .output()
        .unwrap()
}

#[test]
fn up_serves_tls_and_its_clients_follow() {
    let dir = tempfile::tempdir().unwrap();
    let pki = streamgate_testkit::pki::TestPki::new();
    let (cert, key, ca) = (
        pki.server.cert.to_str().unwrap(),
        pki.server.key.to_str().unwrap(),
        pki.ca.to_str().unwrap(),
    );
    let capture = dir.path().join("capture.sse");
    std::fs::write(&capture, fixture("f1/end-turn.sse")).unwrap();
    let capture = capture.to_str().unwrap();
    let ingest = |run: &str, tls: &[&str]| {
        let mut args = vec![
            "ingest",
            "--family",
            "f1",
            "--run",
            run,
            "--retry-secs",
            "0",
        ];
        args.extend_from_slice(tls);
        args.push(capture);
        cli(dir.path(), &args)
    };

    let mut up = start_up_with(dir.path(), &["--tls-cert", cert, "--tls-key", key]);
    let inst: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir(dir.path()).join("up.json")).unwrap())
            .unwrap();
    assert_eq!(inst["tls"], true, "{inst}");
    for a in [
        &inst["ingest_grpc"],
        &inst["archive_grpc"],
        &inst["channels"][0]["grpc"],
    ] {
        assert!(a.as_str().unwrap().starts_with("https://"), "{inst}");
    }
    up_err_with(dir.path(), "web: https://");

    let out = ingest("tls-1", &["--ca", ca]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = cli(dir.path(), &["replay", "tls-1", "--json", "--ca", ca]);
        if out.status.success() && !out.stdout.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replay over TLS: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = ingest("tls-2", &[]);
    assert!(!out.status.success(), "ingest without --ca went through");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--ca"), "{stderr}");
    assert!(up.stop(Duration::from_secs(10)).is_some());

    // mTLS: the client CA makes a client certificate mandatory.
    let _up = start_up_with(
        dir.path(),
        &["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca],
    );
    let out = ingest("tls-3", &["--ca", ca]);
    assert!(
        !out.status.success(),
        "ingest without a client certificate went through"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--client-cert"), "{stderr}");
    let (ccert, ckey) = (
        pki.client.cert.to_str().unwrap(),
        pki.client.key.to_str().unwrap(),
    );
    let out = ingest(
        "tls-3",
        &["--ca", ca, "--client-cert", ccert, "--client-key", ckey],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The events of `replay --json` / `normalize` output, without envelopes.
fn event_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            serde_json::json!({"seq": v["seq"], "stream": v["stream"], "data": v["data"]})
        })
        .collect()
}

/// `streamgate ingest -` streams standard input live: the answer deltas a writer sent
/// before pausing (ahead of its `message_delta` frame) are archived while standard input
/// is still open, and the finished run equals `normalize` of the same bytes (issue #18).
#[test]
fn ingest_from_stdin_is_live() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    let capture = fixture("f1/end-turn.sse");
    let text = String::from_utf8(capture.clone()).unwrap();
    let pause = text.find("data: {\"type\":\"message_delta\"").unwrap();
    let mut child = Graceful(
        Command::new(bin())
            .args(["ingest", "-", "--family", "f1", "--run", "stdin-run"])
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    stdin.write_all(&capture[..pause]).unwrap();
    stdin.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = cli(dir.path(), &["replay", "stdin-run", "--json"]);
        if String::from_utf8_lossy(&out.stdout).contains(", world.") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the answer deltas sent before the pause were not archived"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(child.0.try_wait().unwrap().is_none(), "ingest ended early");
    stdin.write_all(&capture[pause..]).unwrap();
    drop(stdin);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
    let replayed = cli(dir.path(), &["replay", "stdin-run", "--json", "--follow"]);
    let file = dir.path().join("capture.sse");
    std::fs::write(&file, &capture).unwrap();
    let normalized = cli(
        dir.path(),
        &["normalize", "--family", "f1", file.to_str().unwrap()],
    );
    let want = event_lines(&normalized);
    assert!(!want.is_empty());
    assert_eq!(event_lines(&replayed), want);
}

/// The web page address `up` printed: (`http://host:port`, channel token).
fn page_address(dir: &std::path::Path) -> (String, String) {
    let url = page_url(dir);
    let (base, token) = url
        .split_once("/?token=")
        .unwrap_or_else(|| panic!("{url}"));
    (base.trim_end_matches('/').to_owned(), token.to_owned())
}

/// GET `url` with the channel's bearer `token`, as JSON.
async fn get_json(client: &reqwest::Client, url: &str, token: &str) -> serde_json::Value {
    client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Reads a run stream's SSE messages (`(id, data)`, comments skipped) until the stream
/// ends or `max` messages were read (then the connection is dropped).
async fn read_sse(req: reqwest::RequestBuilder, max: usize) -> Vec<(String, String)> {
    use futures::StreamExt as _;
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.headers());
    let mut body = resp.bytes_stream();
    let (mut buf, mut out) = (String::new(), Vec::new());
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut data) = (String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                } else if let Some(v) = line.strip_prefix("event:") {
                    id = format!("event:{}", v.trim());
                }
            }
            if !data.is_empty() {
                out.push((id, data));
                if out.len() >= max {
                    return out;
                }
            }
        }
    }
    out
}

/// The rest of a run stream after seq 3 (a client reconnecting with `Last-Event-ID`).
async fn rest_after_3(url: &str, token: &str, within: Duration) -> Vec<(String, String)> {
    let client = reqwest::Client::new();
    tokio::time::timeout(
        within,
        read_sse(
            client
                .get(url)
                .bearer_auth(token)
                .header("Last-Event-ID", "3"),
            usize::MAX,
        ),
    )
    .await
    .expect("the rest of the run, ending with its terminal event")
}

/// The run stream of `up`'s web channel: asked for before the run starts, it waits; a
/// client that drops after 3 events and reconnects with `Last-Event-ID` gets exactly
/// the rest, ending with the terminal event; `?after=` resumes an ended run; together
/// they equal the run's replay. Without the channel token: 401 (issue #18).
#[test]
fn the_run_stream_follows_and_resumes_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    let (base, token) = page_address(dir.path());
    let inst: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir(dir.path()).join("up.json")).unwrap())
            .unwrap();
    let http = inst["ingest_http"].as_str().unwrap().to_owned();
    let ingest_token = std::fs::read_to_string(data_dir(dir.path()).join("ingest.token")).unwrap();
    let capture = fixture("f1/tool-use.sse");
    let url = format!("{base}/v1/runs/default/rs-1/events");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (first, rest) = rt.block_on(async {
        let client = reqwest::Client::new();
        // Asked for before the run exists.
        let first = tokio::spawn(read_sse(client.get(&url).bearer_auth(&token), 3));
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The run streams in through live HTTP ingest, half, a pause, the rest.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
        let post = client
            .post(format!("http://{http}/v1/ingest/default/rs-1?family=f1"))
            .bearer_auth(ingest_token.trim())
            .body(reqwest::Body::wrap_stream(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            ))
            .send();
        let post = tokio::spawn(post);
        // Everything but the usage and stop frames: the first 3 events are in it.
        let half = String::from_utf8_lossy(&capture)
            .find("data: {\"type\":\"message_delta\"")
            .unwrap();
        tx.send(Ok(capture[..half].to_vec())).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("the first 3 events while the run is open")
            .unwrap();
        tx.send(Ok(capture[half..].to_vec())).await.unwrap();
        drop(tx);
        assert!(post.await.unwrap().unwrap().status().is_success());
        let rest = rest_after_3(&url, &token, Duration::from_secs(10)).await;
        (first, rest)
    });
    let ids: Vec<String> = first
        .iter()
        .chain(&rest)
        .map(|(id, _)| id.clone())
        .collect();
    let want: Vec<String> = (1..=ids.len()).map(|i| i.to_string()).collect();
    assert_eq!(ids, want, "no gap, no duplicate");
    let streamed: Vec<serde_json::Value> = first
        .iter()
        .chain(&rest)
        .map(|(_, d)| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            serde_json::json!({"seq": v["seq"], "stream": v["stream"], "data": v["data"]})
        })
        .collect();
    let replayed = event_lines(&cli(dir.path(), &["replay", "rs-1", "--json", "--follow"]));
    assert_eq!(
        streamed, replayed,
        "the stream is the run (no secrets in it)"
    );
    // An ended run resumes from any seq and ends.
    rt.block_on(async {
        let client = reqwest::Client::new();
        let after = read_sse(
            client.get(format!("{url}?after=5")).bearer_auth(&token),
            usize::MAX,
        )
        .await;
        assert_eq!(after.first().map(|(id, _)| id.as_str()), Some("6"));
        assert_eq!(after.len(), replayed.len() - 5);
        let denied = client.get(&url).send().await.unwrap();
        assert_eq!(denied.status(), 401);
        let csp = denied.headers()["content-security-policy"]
            .to_str()
            .unwrap();
        assert!(csp.contains("img-src 'self' data:"), "{csp}");
        // The token exchange never redirects off-site.
        let no_redirects = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let exchange = no_redirects
            .get(format!("{base}//evil.example/x?token={token}"))
            .send()
            .await
            .unwrap();
        let to = exchange.headers()["location"].to_str().unwrap().to_owned();
        assert!(to.starts_with('/') && !to.starts_with("//"), "{to}");
        // The channel's run list names the run (ended), cursor paged.
        let list = get_json(
            &client,
            &format!("{base}/v1/runs?tenant=default&limit=1"),
            &token,
        )
        .await;
        assert_eq!(list["runs"][0]["run_id"], "rs-1", "{list}");
        assert_eq!(list["runs"][0]["status"], "ended", "{list}");
        let bad = client
            .get(&url)
            .bearer_auth(&token)
            .header("Last-Event-ID", "x")
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status(), 400);
        let not_started = read_sse(
            client
                .get(format!("{base}/v1/runs/default/never/events?wait=1"))
                .bearer_auth(&token),
            usize::MAX,
        )
        .await;
        assert_eq!(not_started.len(), 1);
        assert!(not_started[0].0 == "event:error" && not_started[0].1.contains("did not start"));
    });
}

/// A data dir keeps its addresses and tokens across restarts of `up` (every surface
/// keeps one address); `--rotate-tokens` changes the tokens (issue #18).
#[test]
fn ports_and_tokens_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let read = |dir: &std::path::Path| {
        let inst: serde_json::Value =
            serde_json::from_slice(&std::fs::read(data_dir(dir).join("up.json")).unwrap()).unwrap();
        let tokens = (
            std::fs::read_to_string(data_dir(dir).join("ingest.token")).unwrap(),
            std::fs::read_to_string(data_dir(dir).join("channel-web.token")).unwrap(),
        );
        (
            inst["ingest_http"].clone(),
            inst["ingest_grpc"].clone(),
            inst["channels"][0]["web"].clone(),
            tokens,
        )
    };
    let mut up = start_up(dir.path());
    let (http, grpc, web, tokens) = read(dir.path());
    let (page, token) = page_address(dir.path());
    assert!(ingest(dir.path(), "before-restart"));
    up.stop(Duration::from_secs(15));
    let mut up = start_up(dir.path());
    let again = read(dir.path());
    // The page lists the earlier run (from SG_EVENTS) and can open it (issue #19).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (rows, stream) = rt.block_on(async {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let rows = loop {
            let rows = get_json(&client, &format!("{page}/api/runs"), &token).await;
            if rows.to_string().contains("before-restart") || Instant::now() > deadline {
                break rows;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let stream = client
            .get(format!(
                "{page}/v1/runs/default/before-restart/events?wait=5"
            ))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        (rows, stream)
    });
    let row = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["run_id"] == "before-restart"))
        .unwrap_or_else(|| panic!("the earlier run is not listed after the restart: {rows}"));
    assert_eq!(row["status"], "completed", "{rows}");
    assert!(
        stream.contains("\"phase\":\"final_answer\""),
        "the earlier run does not open: {stream}"
    );
    assert_eq!((&again.0, &again.1, &again.2), (&http, &grpc, &web));
    assert_eq!(again.3, tokens, "tokens kept");
    assert_eq!(
        page_address(dir.path()).0,
        page,
        "the page keeps its address"
    );
    assert!(ingest(dir.path(), "after-restart"));
    up.stop(Duration::from_secs(15));
    let _up = start_up_with(dir.path(), &["--rotate-tokens"]);
    let rotated = read(dir.path());
    assert_eq!(rotated.0, http);
    assert_ne!(rotated.3 .0, tokens.0, "--rotate-tokens");
    assert_ne!(rotated.3 .1, tokens.1, "--rotate-tokens");
}

/// Across an `up` restart mid-run: a run-stream client that read 3 events, and an
/// ingest cut by the restart, both carry on — the sender resends the whole body (only
/// the bytes the run lacks are stored), the client reconnects to the same address with
/// `Last-Event-ID` and gets exactly the rest; the run equals `normalize` (issue #18).
#[test]
fn the_run_stream_and_ingest_resume_across_an_up_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = start_up(dir.path());
    let (base, token) = page_address(dir.path());
    let inst: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir(dir.path()).join("up.json")).unwrap())
            .unwrap();
    let http = inst["ingest_http"].as_str().unwrap().to_owned();
    let ingest_token = std::fs::read_to_string(data_dir(dir.path()).join("ingest.token"))
        .unwrap()
        .trim()
        .to_owned();
    let capture = fixture("f1/tool-use.sse");
    let pause = String::from_utf8_lossy(&capture)
        .find("data: {\"type\":\"message_delta\"")
        .unwrap();
    let url = format!("{base}/v1/runs/default/restarted/events");
    let ingest_url = format!("http://{http}/v1/ingest/default/restarted?family=f1");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let first = rt.block_on(async {
        let client = reqwest::Client::new();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
        let post = client
            .post(&ingest_url)
            .bearer_auth(&ingest_token)
            .body(reqwest::Body::wrap_stream(
                tokio_stream::wrappers::ReceiverStream::new(rx),
            ))
            .send();
        let post = tokio::spawn(post);
        tx.send(Ok(capture[..pause].to_vec())).await.unwrap();
        let first = tokio::time::timeout(
            Duration::from_secs(10),
            read_sse(client.get(&url).bearer_auth(&token), 3),
        )
        .await
        .expect("3 events of the open run");
        // Keep the body open while `up` goes down: the restart cuts it.
        std::mem::forget(tx);
        drop(post);
        first
    });
    up.stop(Duration::from_secs(15));
    let _up = start_up(dir.path());
    assert_eq!(
        page_address(dir.path()).0,
        base,
        "same address after the restart"
    );
    let rest = rt.block_on(async {
        let client = reqwest::Client::new();
        // The sender resends the whole body; the run had only the first part stored.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let resp = client
                .post(&ingest_url)
                .bearer_auth(&ingest_token)
                .body(capture.clone())
                .send()
                .await
                .unwrap();
            let code = resp.status().as_u16();
            let body = resp.text().await.unwrap();
            if code == 200 {
                assert!(
                    body.contains(&format!("\"skipped_bytes\":{pause}")),
                    "{body}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "{code} {body}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        rest_after_3(&url, &token, Duration::from_secs(20)).await
    });
    let ids: Vec<String> = first
        .iter()
        .chain(&rest)
        .map(|(id, _)| id.clone())
        .collect();
    let want: Vec<String> = (1..=ids.len()).map(|i| i.to_string()).collect();
    assert_eq!(ids, want, "no gap, no duplicate across the restart");
    let file = dir.path().join("capture.sse");
    std::fs::write(&file, &capture).unwrap();
    let normalized = cli(
        dir.path(),
        &["normalize", "--family", "f1", file.to_str().unwrap()],
    );
    let replayed = cli(dir.path(), &["replay", "restarted", "--json", "--follow"]);
    assert_eq!(event_lines(&replayed), event_lines(&normalized));
    assert_eq!(ids.len(), event_lines(&normalized).len());
}

/// The JSON lines of a CLI's stdout.
fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn verify_and_backfill_after_an_adapter_change() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up_with(dir.path(), &["--prices", "claude-*:input=3,output=15"]);
    for run in ["hist-1", "hist-2", "hist-3"] {
        assert!(ingest(dir.path(), run), "ingest {run}");
    }
    // Every run archived, ended, and stamped with the adapter that made it.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let runs = json_lines(&cli(dir.path(), &["runs", "--json"]));
        let done = runs
            .iter()
            .filter(|r| r["status"] == "ended" && r["adapter"] == "f1")
            .count();
        if done == 3 {
            for r in &runs {
                assert_eq!(r["adapter_version"], 1, "{r}");
                assert_eq!(r["grammar_version"], 1, "{r}");
                assert_eq!(r["generation"], 1, "{r}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "runs not archived: {runs:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let ok = cli(dir.path(), &["verify"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let before = json_lines(&cli(dir.path(), &["replay", "hist-2", "--json"]));

    // An older adapter made hist-2: its answer text read differently. Rewritten in the
    // archive file as that adapter would have written it.
    {
        let db = rusqlite::Connection::open(data_dir(dir.path()).join("archive.db")).unwrap();
        db.busy_timeout(Duration::from_secs(10)).unwrap();
        let n = db
            .execute(
                "UPDATE events SET payload = replace(payload, 'world', 'World') \
                 WHERE run_id = 'hist-2' AND phase = 'final_answer'",
                [],
            )
            .unwrap();
        assert_eq!(n, 1, "the capture's answer says `world`");
        db.execute(
            "UPDATE runs SET adapter_version = 0 WHERE run_id = 'hist-2'",
            [],
        )
        .unwrap();
    }

    let verify = cli(dir.path(), &["verify"]);
    let out = String::from_utf8_lossy(&verify.stdout).into_owned();
    assert_eq!(
        verify.status.code(),
        Some(1),
        "verify fails on a difference:\n{out}"
    );
    let differs: Vec<&str> = out.lines().filter(|l| l.starts_with("DIFFERS")).collect();
    assert_eq!(
        differs.len(),
        1,
        "{out}{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(differs[0].contains("default/hist-2"), "{out}");
    assert!(differs[0].contains("made by f1@0, today f1@1"), "{out}");
    assert!(differs[0].contains("final answer"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("identical")).count(),
        2,
        "{out}"
    );
    let summary = String::from_utf8_lossy(&verify.stderr);
    assert!(summary.contains("verified 3 runs"), "{summary}");
    assert!(summary.contains("runs/s"), "{summary}");

    // Scoped: only that run; another family matches nothing.
    let one = json_lines(&cli(dir.path(), &["verify", "--run", "hist-2", "--json"]));
    assert_eq!(one.len(), 1);
    assert_eq!(one[0]["verdict"], "differs");
    let none = cli(dir.path(), &["verify", "--family", "f3"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no run matches"));
    let bad = cli(dir.path(), &["verify", "--family", "f9"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown family"));

    // A dry run writes nothing; --apply writes generation 2; again, nothing.
    let dry = cli(dir.path(), &["backfill"]);
    assert_eq!(dry.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&dry.stderr).contains("--apply"));
    let apply = cli(dir.path(), &["backfill", "--apply"]);
    let applied = String::from_utf8_lossy(&apply.stdout).into_owned();
    assert!(apply.status.success(), "{applied}");
    assert!(
        applied.contains("default/hist-2") && applied.contains("wrote g2"),
        "{applied}"
    );
    let again = cli(dir.path(), &["backfill", "--apply"]);
    assert!(again.status.success());
    assert!(!String::from_utf8_lossy(&again.stdout).contains("wrote"));
    assert!(cli(dir.path(), &["verify"]).status.success());

    // Replay reads generation 2 (today's events); generation 1 keeps the older ones.
    let latest = json_lines(&cli(dir.path(), &["replay", "hist-2", "--json"]));
    assert_eq!(latest, before);
    let old = cli(
        dir.path(),
        &["replay", "hist-2", "--json", "--generation", "1"],
    );
    let old = String::from_utf8_lossy(&old.stdout).into_owned();
    assert!(
        old.contains("Hello, World.") && old.lines().count() == before.len(),
        "{old}"
    );
    let missing = cli(dir.path(), &["replay", "hist-2", "--generation", "3"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no generation 3"));
    // Full-text search over the answers: each run once, the backfilled one included.
    let found = json_lines(&cli(
        dir.path(),
        &["runs", "--search", "hello WORLD", "--json"],
    ));
    let mut ids: Vec<&str> = found
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["hist-1", "hist-2", "hist-3"], "{found:?}");
    assert!(
        found[0]["snippet"]
            .as_str()
            .unwrap()
            .contains("[Hello, world]"),
        "{found:?}"
    );
    let text = String::from_utf8_lossy(&cli(dir.path(), &["runs", "--search", "Hello"]).stdout)
        .into_owned();
    assert!(text.contains("[Hello]"), "{text}");
    let runs = json_lines(&cli(dir.path(), &["runs", "--json"]));
    let r2 = runs.iter().find(|r| r["run_id"] == "hist-2").unwrap();
    assert_eq!(
        (r2["generation"].as_u64(), r2["adapter_version"].as_u64()),
        (Some(2), Some(1))
    );
}

/// An Anthropic Messages capture (family f1) whose answer is `answer` in one delta.
fn answer_capture(answer: &str) -> String {
    let data = |v: serde_json::Value| format!("data: {v}\n\n");
    let mut out = String::new();
    out += &data(
        serde_json::json!({"type":"message_start","message":{"id":"msg_e","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}),
    );
    out += &data(
        serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
    );
    out += &data(
        serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":answer}}),
    );
    out += &data(serde_json::json!({"type":"content_block_stop","index":0}));
    out += &data(
        serde_json::json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":20}}),
    );
    out += &data(serde_json::json!({"type":"message_stop"}));
    out
}

/// The files under `dir` whose bytes contain `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(path.display().to_string());
                }
            }
        }
    }
    found
}

/// Thinking is searchable only when asked for (`--search-thinking`): an ended run's
/// reasoning is indexed, `runs --search … --thinking` finds it by a phrase of it, and the
/// answer search does not look there.
#[test]
fn thinking_search_finds_a_run_by_its_reasoning_when_turned_on() {
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up_with(dir.path(), &["--search-thinking"]);
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/f1/zero-text.sse");
    ingested_f1(dir.path(), "think-1", &fixture, &[]);
    let deadline = Instant::now() + PATIENCE;
    let found = loop {
        let found = json_lines(&cli(
            dir.path(),
            &["runs", "--search", "nothing to SAY", "--thinking", "--json"],
        ));
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["run_id"], "think-1");
    assert!(
        found[0]["snippet"]
            .as_str()
            .unwrap()
            .contains("[Nothing to say]"),
        "{found:?}"
    );
    let answers = json_lines(&cli(
        dir.path(),
        &["runs", "--search", "nothing to say", "--json"],
    ));
    assert!(answers.is_empty(), "{answers:?}");

    // The run is closed: ingesting it again is refused at once, not retried.
    let started = Instant::now();
    let again = ingest_f1(dir.path(), "think-1", &fixture, &[]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success());
    assert!(err.contains("already ingested and closed"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "retried: {err}"
    );
}

#[test]
fn erase_leaves_no_trace_in_any_store() {
    let (rt, hook) = fake_webhook();
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up_with(
        dir.path(),
        &[
            "--channel",
            &format!("webhook={}", hook.base_url),
            "--channel",
            "web=127.0.0.1:0",
            "--channel-secret",
            "hook-secret",
        ],
    );
    let runs = [
        ("erasable-run-one", "s-erase", "Zebra quartz answer 4411"),
        ("erasable-run-two", "s-erase", "Heron basalt answer 7302"),
        ("kept-run-three", "s-keep", "Walrus opal answer 2290"),
    ];
    for (run, session, answer) in runs {
        let path = dir.path().join(format!("{run}.sse"));
        std::fs::write(&path, answer_capture(answer)).unwrap();
        ingested_f1(dir.path(), run, &path, &["--session", session]);
        std::fs::remove_file(&path).unwrap();
    }
    // Archived, and delivered (the channel's delivery state is in the broker's KV).
    let deadline = Instant::now() + PATIENCE;
    loop {
        let ended = json_lines(&cli(dir.path(), &["runs", "--json"]))
            .iter()
            .filter(|r| r["status"] == "ended")
            .count();
        let finals = hook.events().iter().filter(|e| e["op"] == "final").count();
        if ended == 3 && finals == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ended} runs ended, {finals} finals"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let data = data_dir(dir.path());
    // What the search must find before: every answer in the archive and the broker.
    for (run, _, answer) in runs {
        let holding = files_holding(&data, answer);
        assert!(
            holding.iter().any(|f| f.contains("archive.db")),
            "{answer}: {holding:?}"
        );
        assert!(
            holding.iter().any(|f| f.contains("/nats/")),
            "{answer}: {holding:?}"
        );
        assert!(!files_holding(&data, run).is_empty(), "{run}");
    }

    // The web page lists the runs (in the projector's memory) until the erasure.
    let (page, token) = page_address(dir.path());
    let listed_on_page = |rt: &tokio::runtime::Runtime, want: bool| {
        rt.block_on(async {
            let client = reqwest::Client::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let rows = get_json(&client, &format!("{page}/api/runs"), &token).await;
                let text = rows.to_string();
                let now = text.contains("erasable-run-one") && text.contains("erasable-run-two");
                let gone = !text.contains("erasable-run") && text.contains("kept-run-three");
                if (want && now) || (!want && gone) || Instant::now() > deadline {
                    break text;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let before = listed_on_page(&rt, true);
    assert!(before.contains("erasable-run-one"), "{before}");
    let out = cli(
        dir.path(),
        &["erase", "--session", "s-erase", "--actor", "dpo"],
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.starts_with("erased 2 runs of tenant `default`"),
        "{said}"
    );

    // The KV buckets through their API: no key of an erased run is left.
    let inst: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("up.json")).unwrap()).unwrap();
    let keys: Vec<String> = rt.block_on(async {
        let client = nats_connect(
            inst["nats_url"].as_str().unwrap(),
            Some((
                inst["nats_user"].as_str().unwrap(),
                inst["nats_password"].as_str().unwrap(),
            )),
        )
        .await
        .unwrap();
        let js = async_nats::jetstream::new(client);
        let mut keys = Vec::new();
        for bucket in ["SG_DELIVERY", "SG_OPEN_RUNS"] {
            let kv = js.get_key_value(bucket).await.unwrap();
            let mut found = kv.keys().await.unwrap();
            while let Some(k) = futures::StreamExt::next(&mut found).await {
                keys.push(k.unwrap());
            }
        }
        keys
    });
    for (run, _, answer) in &runs[..2] {
        assert_eq!(
            files_holding(&data, answer),
            Vec::<String>::new(),
            "{answer} is gone"
        );
        assert!(!keys.iter().any(|k| k.contains(run)), "{run} in {keys:?}");
        // Byte for byte: the archive, the streams and the KV buckets erase in place (a
        // KV write erases the versions it replaces, the erasure every version left).
        assert_eq!(
            files_holding(&data, run),
            Vec::<String>::new(),
            "{run} is gone"
        );
        let replay = cli(dir.path(), &["replay", run]);
        assert!(!replay.status.success());
    }
    let (kept, _, answer) = runs[2];
    assert!(
        !files_holding(&data, answer).is_empty(),
        "the other session's run stays"
    );
    let after = listed_on_page(&rt, false);
    assert!(
        !after.contains("erasable-run") && !after.contains("Zebra quartz"),
        "the page forgot the erased runs: {after}"
    );
    assert!(after.contains(kept), "{after}");
    let listed = json_lines(&cli(dir.path(), &["runs", "--json"]));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["run_id"], kept);

    // The audit: who, what kind, how many — ids only as hashes.
    let audit = cli(dir.path(), &["erase", "--audit"]);
    let audit = String::from_utf8_lossy(&audit.stdout).into_owned();
    assert_eq!(audit.lines().count(), 1, "{audit}");
    assert!(
        audit.contains("session") && audit.contains("2 runs") && audit.contains("by dpo"),
        "{audit}"
    );
    assert!(
        !audit.contains("erasable") && !audit.contains("s-erase"),
        "{audit}"
    );

    // Again: nothing left to remove, and the request is recorded.
    let again = cli(dir.path(), &["erase", "--session", "s-erase"]);
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("erased 0 runs"));
    let all = cli(dir.path(), &["erase", "--all"]);
    assert!(!all.status.success());
    assert!(String::from_utf8_lossy(&all.stderr).contains("--yes"));
}

#[test]
fn retention_strips_thinking_on_request() {
    let dir = tempfile::tempdir().unwrap();
    {
        let _up = start_up(dir.path());
        let none = cli(dir.path(), &["retention"]);
        assert!(String::from_utf8_lossy(&none.stdout).contains("no retention policy"));
    }
    let _ = std::fs::remove_file(data_dir(dir.path()).join("up.json"));
    let _up = start_up_with(dir.path(), &["--retention", "*:strip=0d"]);
    let thinking = "Thinking about the orbit of Phobos in detail before answering.";
    let path = dir.path().join("think.sse");
    std::fs::write(&path, thinking_capture(thinking)).unwrap();
    ingested_f1(dir.path(), "ret-1", &path, &[]);
    let deadline = Instant::now() + PATIENCE;
    while !json_lines(&cli(dir.path(), &["runs", "--json"]))
        .iter()
        .any(|r| r["run_id"] == "ret-1" && r["status"] == "ended")
    {
        assert!(Instant::now() < deadline, "ret-1 not archived");
        std::thread::sleep(Duration::from_millis(100));
    }
    let before =
        String::from_utf8_lossy(&cli(dir.path(), &["replay", "ret-1", "--state", "--json"]).stdout)
            .into_owned();
    assert!(before.contains("orbit of Phobos"), "{before}");

    let due = String::from_utf8_lossy(&cli(dir.path(), &["retention"]).stdout).into_owned();
    assert!(
        due.contains("policy *:strip=0d") && due.contains("1 runs to strip"),
        "{due}"
    );
    let applied =
        String::from_utf8_lossy(&cli(dir.path(), &["retention", "--apply"]).stdout).into_owned();
    assert!(applied.contains("stripped 1 runs"), "{applied}");

    let state: serde_json::Value =
        serde_json::from_slice(&cli(dir.path(), &["replay", "ret-1", "--state", "--json"]).stdout)
            .unwrap();
    assert_eq!(state["final_text"], "All credentials are rotated.");
    let segments = state["thinking"].as_array().unwrap();
    assert_eq!(segments.len(), 1);
    let text = segments[0]["text"].as_str().unwrap();
    assert!(
        !text.contains("Phobos") && text.contains("[retention: "),
        "{text}"
    );
    let verify = json_lines(&cli(dir.path(), &["verify", "--run", "ret-1", "--json"]));
    assert_eq!(verify[0]["verdict"], "no_raw_chunks");
    let again = String::from_utf8_lossy(&cli(dir.path(), &["retention"]).stdout).into_owned();
    assert!(again.contains("0 runs to strip"), "{again}");
}

/// A local OTLP/gRPC receiver keeping every span it gets.
#[derive(Clone, Default)]
struct OtlpReceiver {
    spans: std::sync::Arc<std::sync::Mutex<Vec<opentelemetry_proto::tonic::trace::v1::Span>>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for OtlpReceiver
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.spans.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(Default::default()))
    }
}

/// A span attribute as text (ints and doubles formatted).
fn attr(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| {
            Some(match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                other => format!("{other:?}"),
            })
        })
}

impl OtlpReceiver {
    /// Serves OTLP/gRPC on a free local port of `rt`; returns the endpoint.
    fn serve(&self, rt: &tokio::runtime::Runtime) -> String {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let service = opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer::new(self.clone());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        endpoint
    }

    /// The root spans received for `run`.
    fn roots_of(&self, run: &str) -> usize {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| {
                s.parent_span_id.is_empty() && attr(s, "streamgate.run_id").as_deref() == Some(run)
            })
            .count()
    }
}

#[test]
fn continuous_export_sends_each_ended_run_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let receiver = OtlpReceiver::default();
    let endpoint = receiver.serve(&rt);
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up_with(
        dir.path(),
        &[
            "--export-otlp",
            &endpoint,
            "--export-otlp-interval-ms",
            "200",
        ],
    );
    for run in ["cont-1", "cont-2"] {
        assert!(ingest(dir.path(), run), "ingest {run}");
        let deadline = Instant::now() + PATIENCE;
        while receiver.roots_of(run) == 0 {
            assert!(Instant::now() < deadline, "no trace for {run}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // cont-2's trace came in a later pass than cont-1's: cont-1 was not sent again.
    assert_eq!(receiver.roots_of("cont-1"), 1);
    assert_eq!(receiver.roots_of("cont-2"), 1);
}

#[test]
fn export_writes_jsonl_and_genai_traces() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let receiver = OtlpReceiver::default();
    let endpoint = receiver.serve(&rt);
    let dir = tempfile::tempdir().unwrap();
    let _up = start_up(dir.path());
    for (run, capture) in [
        ("exp-answer", "f1/end-turn.sse"),
        ("exp-tool", "f1/tool-use.sse"),
    ] {
        let path = dir.path().join("capture.sse");
        std::fs::write(&path, fixture(capture)).unwrap();
        ingested_f1(dir.path(), run, &path, &["--session", "chat-9"]);
    }
    let deadline = Instant::now() + PATIENCE;
    while json_lines(&cli(dir.path(), &["runs", "--json"]))
        .iter()
        .filter(|r| r["status"] == "ended")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "runs not archived");
        std::thread::sleep(Duration::from_millis(100));
    }

    // JSONL: one line per run, every event.
    let file = dir.path().join("export.jsonl");
    let out = cli(
        dir.path(),
        &["export", "--since", "1d", "-o", file.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        let events = l["events"].as_array().unwrap();
        assert_eq!(
            events.len() as u64,
            l["run"]["event_count"].as_u64().unwrap()
        );
        assert_eq!(events[0]["seq"], 1);
        assert_eq!(events[0]["run_id"], l["run"]["run_id"]);
    }

    // Traces, without content.
    let out = cli(dir.path(), &["export", "--otlp", &endpoint]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans.lock().unwrap().clone();
    let traces: std::collections::BTreeSet<Vec<u8>> =
        spans.iter().map(|s| s.trace_id.clone()).collect();
    assert_eq!(traces.len(), 2, "one trace per run");
    for trace in &traces {
        let of: Vec<_> = spans.iter().filter(|s| &s.trace_id == trace).collect();
        let root = of
            .iter()
            .find(|s| s.parent_span_id.is_empty())
            .expect("a root");
        assert_eq!(root.name, "invoke_agent");
        assert_eq!(
            attr(root, "gen_ai.operation.name").as_deref(),
            Some("invoke_agent")
        );
        assert_eq!(
            attr(root, "gen_ai.provider.name").as_deref(),
            Some("anthropic")
        );
        assert_eq!(
            attr(root, "gen_ai.conversation.id").as_deref(),
            Some("chat-9")
        );
        let chat = of
            .iter()
            .find(|s| s.name == "chat claude-test")
            .expect("a chat span");
        assert_eq!(chat.parent_span_id, root.span_id);
        assert_eq!(
            attr(chat, "gen_ai.usage.input_tokens").as_deref(),
            Some("10")
        );
        assert!(attr(chat, "gen_ai.response.finish_reasons").is_some());
        assert!(attr(chat, "gen_ai.response.time_to_first_chunk").is_some());
        assert!(
            attr(chat, "gen_ai.output.messages").is_none(),
            "no content by default"
        );
        assert!(
            root.start_time_unix_nano > 0 && root.end_time_unix_nano >= root.start_time_unix_nano
        );
    }
    let tools: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("execute_tool"))
        .collect();
    assert_eq!(
        tools.len(),
        1,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert_eq!(tools[0].name, "execute_tool get_weather");
    assert_eq!(
        attr(tools[0], "gen_ai.tool.call.id").as_deref(),
        Some("toolu_1")
    );
    assert!(attr(tools[0], "gen_ai.tool.call.arguments").is_none());

    // With content.
    receiver.spans.lock().unwrap().clear();
    let out = cli(dir.path(), &["export", "--otlp", &endpoint, "--content"]);
    assert!(out.status.success());
    let spans = receiver.spans.lock().unwrap().clone();
    let messages: Vec<String> = spans
        .iter()
        .filter_map(|s| attr(s, "gen_ai.output.messages"))
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("Hello, world.")),
        "{messages:?}"
    );
    let tool = spans
        .iter()
        .find(|s| s.name == "execute_tool get_weather")
        .unwrap();
    assert!(attr(tool, "gen_ai.tool.call.arguments").is_some_and(|a| a.contains("city")));
}

//! `streamgate tail` as a user runs it against `streamgate up` in a temp data dir, found
//! through `up.json` and the channel's token file, across a restart of `up` in the middle
//! of a run:
//!
//! - `tail --run r1` (status-line rendering) prints the run's final answer exactly once
//!   and exits when the run ends;
//! - `tail --raw-events` (every run) prints every event of the run exactly once, seq 1 to
//!   the terminal event, in order: the reconnect resumed from the last rendered seq with
//!   no duplicate and no gap.

use crate::common;

use bytes::Bytes;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A capture with a tool, commentary and a final answer, one event-bearing line each.
const FAMILY: &str = "codex-appserver";
const CAPTURE: &str = "codex-appserver/tooluse.jsonl";
const FINAL: &str = "One file.";

fn spawn_logged(args: &[&str], dir: &Path, tag: &str) -> Graceful {
    let out = std::fs::File::create(dir.join(format!("{tag}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{tag}.err"))).unwrap();
    Graceful(
        Command::new(bin())
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {tag}: {e}")),
    )
}

fn log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Waits for `<data>/up.json` of a process other than `not_pid`.
fn wait_up(dir: &Path, up: &mut Graceful, tag: &str, not_pid: Option<u64>) -> Value {
    let path = dir.join(".streamgate/up.json");
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(Some(s)) = up.0.try_wait() {
            panic!(
                "{tag} exited with {s}:\n{}",
                log(dir, &format!("{tag}.err"))
            );
        }
        if let Some(v) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        {
            if v["pid"].as_u64() != not_pid {
                return v;
            }
        }
        assert!(Instant::now() < deadline, "{tag}: no up.json");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool, dir: &Path) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what}\n--- tail-all ---\n{}{}\n--- tail-run ---\n{}{}",
            log(dir, "tail-all.out"),
            log(dir, "tail-all.err"),
            log(dir, "tail-run.out"),
            log(dir, "tail-run.err")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Seqs of `run` in `--raw-events` output (`<run padded> #<seq> <what>`).
fn seqs(out: &str, run: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix(run))
        .filter_map(|rest| rest.trim_start().strip_prefix('#'))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Publishes to the broker of the `up` that wrote `inst` (its `up.json`), with the
/// credentials it requires.
async fn publish_to(inst: &serde_json::Value, raws: &[streamgate_bus::raw::RawChunk]) {
    let field = |k: &str| inst[k].as_str().unwrap_or_default().to_owned();
    let client = async_nats::ConnectOptions::new()
        .user_and_password(field("nats_user"), field("nats_password"))
        .connect(field("nats_url"))
        .await
        .expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    publish_all(&js, raws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_a_run_across_an_up_restart_without_duplicates_or_gaps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut up = spawn_logged(&["up", "--quiet"], dir, "up1");
    let inst = wait_up(dir, &mut up, "up1", None);
    let mut tail_all = spawn_logged(&["tail", "--raw-events"], dir, "tail-all");
    let mut tail_run = spawn_logged(&["tail", "--run", "r1"], dir, "tail-run");

    // The run, one JSONL line per chunk, all with one ingest time.
    let bytes = fixture(CAPTURE);
    let chunks: Vec<Bytes> = bytes
        .split_inclusive(|b| *b == b'\n')
        .map(Bytes::copy_from_slice)
        .collect();
    let want = expected(FAMILY, &bytes).len() as u64;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let raws = raw_chunks(&spec("r1", FAMILY), &chunks, ts);
    let half = chunks.len() / 2;
    publish_to(&inst, &raws[..half]).await;

    // Both tails are following the live run and have rendered its first part.
    wait_for(
        "tails never followed r1",
        || {
            log(dir, "tail-run.err").contains("following run r1")
                && seqs(&log(dir, "tail-all.out"), "r1").len() >= 3
        },
        dir,
    );
    let before = seqs(&log(dir, "tail-all.out"), "r1");
    assert!(
        (before.len() as u64) < want,
        "the run was already over: {before:?}"
    );

    // `up` goes away mid-run and comes back on other ports with new tokens.
    let status = up.stop(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "up did not stop cleanly with tails subscribed: {status:?}\n{}",
        log(dir, "up1.err")
    );
    let old_pid = inst["pid"].as_u64();
    let mut up2 = spawn_logged(&["up", "--quiet"], dir, "up2");
    let inst2 = wait_up(dir, &mut up2, "up2", old_pid);
    // Both tails subscribed again to the new instance (from their last rendered seq)
    // before the run goes on: a run that ends while a subscriber is away gets no
    // progress replay (spec §7.3).
    let resumed = "run r1 resumed after seq ";
    wait_for(
        "tails never resumed r1 on the new instance",
        || log(dir, "tail-run.err").contains(resumed) && log(dir, "tail-all.err").contains(resumed),
        dir,
    );
    publish_to(&inst2, &raws[half..]).await;

    // `tail --run` exits by itself once the run ended.
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = tail_run.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "tail --run r1 did not exit:\n{}{}",
            log(dir, "tail-run.out"),
            log(dir, "tail-run.err")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", log(dir, "tail-run.err"));
    let rendered = log(dir, "tail-run.out");
    assert_eq!(
        rendered.matches("✅ final answer:").count(),
        1,
        "final answer not printed exactly once:\n{rendered}\n{}",
        log(dir, "tail-run.err")
    );
    assert!(rendered.contains(FINAL), "{rendered}");
    assert_eq!(
        rendered.matches("🧠 0 segments · 1 tool").count(),
        1,
        "settle summary not printed exactly once:\n{rendered}"
    );

    wait_for(
        "tail --raw-events never printed the terminal event",
        || seqs(&log(dir, "tail-all.out"), "r1").len() as u64 >= want,
        dir,
    );
    // Negative window, not a wait: anything duplicated gets 300 ms to show up before the
    // last look.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        tail_all.stop(Duration::from_secs(10)).map(|s| s.success()),
        Some(true)
    );
    let all = log(dir, "tail-all.out");
    assert_eq!(
        seqs(&all, "r1"),
        (1..=want).collect::<Vec<_>>(),
        "duplicate or gap across the restart:\n{all}"
    );
    assert!(all.contains("■ end"), "{all}");
    let status = up2.stop(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "{}",
        log(dir, "up2.err")
    );
}

/// `tail` started before five back-to-back small runs shows all five finals (runs start
/// and end between what used to be two polls); `tail --run` on one that has ended prints
/// its final answer and exits within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_shows_back_to_back_runs_and_the_final_of_an_ended_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut up = spawn_logged(&["up", "--quiet"], dir, "up1");
    let inst = wait_up(dir, &mut up, "up1", None);
    let mut tail_all = spawn_logged(&["tail"], dir, "tail-all");
    wait_for(
        "tail never connected",
        || log(dir, "tail-all.err").is_empty() || !log(dir, "tail-all.err").contains("retrying"),
        dir,
    );

    let bytes = fixture(CAPTURE);
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    // tail's watch is open before the burst (a run that has ended is not replayed to a
    // later watch): it follows a warm-up run, half of it published and left open.
    let lines: Vec<Bytes> = bytes
        .split_inclusive(|b| *b == b'\n')
        .map(Bytes::copy_from_slice)
        .collect();
    let warmup = raw_chunks(&spec("warmup", FAMILY), &lines, ts);
    publish_to(&inst, &warmup[..lines.len() / 2]).await;
    wait_for(
        "tail never followed the warm-up run (its watch never opened)",
        || log(dir, "tail-all.err").contains("following run warmup"),
        dir,
    );
    let mut raws = Vec::new();
    for i in 0..5 {
        raws.extend(raw_chunks(
            &spec(&format!("burst{i}"), FAMILY),
            &[Bytes::copy_from_slice(&bytes)],
            ts,
        ));
    }
    publish_to(&inst, &raws).await;
    wait_for(
        "tail did not show all five finals",
        || log(dir, "tail-all.out").matches("✅ final answer:").count() >= 5,
        dir,
    );
    for i in 0..5 {
        assert!(
            log(dir, "tail-all.out").contains(&format!("burst{i}")),
            "burst{i} missing:\n{}",
            log(dir, "tail-all.out")
        );
    }

    let started = Instant::now();
    let out = Command::new(bin())
        .args(["tail", "--run", "burst3"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "tail --run on an ended run took {elapsed:?}"
    );
    assert!(stdout.contains(FINAL), "no final answer:\n{stdout}");
    let _ = tail_all.stop(Duration::from_secs(10));
}

/// A codex-exec turn in two pieces: thinking (the run is live), then a markdown answer.
fn markdown_turn(i: usize) -> [Bytes; 2] {
    let first = "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n{\"type\":\"turn.started\"}\n\
                 {\"type\":\"item.completed\",\"item\":{\"id\":\"item_0\",\"type\":\"reasoning\",\"text\":\"Thinking it over\"}}\n";
    let answer = format!(
        "## Result {i}\\n\\n- **one**\\n- two\\n\\n```sh\\necho {i}\\n```\\n\\nDone with `run {i}`."
    );
    let second = format!(
        "{{\"type\":\"item.completed\",\"item\":{{\"id\":\"item_1\",\"type\":\"agent_message\",\"text\":\"{answer}\"}}}}\n\
         {{\"type\":\"turn.completed\",\"usage\":{{\"input_tokens\":1,\"output_tokens\":1}}}}\n"
    );
    [Bytes::from(first), Bytes::from(second)]
}

/// Runs `tmux` on this test's own server socket.
fn tmux(socket: &str, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tmux (install it: scripts/test.sh does): {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue "tail on the run stream": `tail` in a real terminal (tmux) with three runs live
/// at once shows three live lines (a redrawn block, not one shared line), then each run's
/// final rendered for a terminal (heading without `##`, bullets, indented code, bold in
/// colour) and no notice noise. The pane captures are kept in
/// `target/artifacts/tail-live.txt` and `tail-finals.txt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_on_a_terminal_shows_a_line_per_live_run_and_rendered_finals() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut up = spawn_logged(&["up", "--quiet"], dir, "up1");
    let inst = wait_up(dir, &mut up, "up1", None);
    let socket = format!("sg-tail-{}", std::process::id());
    let cmd = format!(
        "cd '{}' && env -u NO_COLOR '{}' tail; sleep 600",
        dir.display(),
        bin().display()
    );
    tmux(
        &socket,
        &[
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "120",
            "-y",
            "50",
            &cmd,
        ],
    );
    let capture = |escapes: bool| {
        let mut args = vec!["capture-pane", "-p", "-t", "t"];
        if escapes {
            args.push("-e");
        }
        tmux(&socket, &args)
    };
    // No wait for tail's watch here: these runs stay open until all three live lines
    // show (polled below), and a watch opened late replays the open runs.
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let runs: Vec<Vec<streamgate_bus::raw::RawChunk>> = (0..3)
        .map(|i| {
            raw_chunks(
                &spec(&format!("loop{i}"), "codex-exec"),
                &markdown_turn(i),
                ts,
            )
        })
        .collect();
    let firsts: Vec<_> = runs.iter().map(|r| r[0].clone()).collect();
    publish_to(&inst, &firsts).await;
    let artifacts = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let deadline = Instant::now() + PATIENCE;
    let live = loop {
        let pane = capture(false);
        let lines = (0..3)
            .filter(|i| pane.lines().any(|l| l.starts_with(&format!("● loop{i} "))))
            .count();
        if lines == 3 {
            break pane;
        }
        assert!(
            Instant::now() < deadline,
            "three live lines never showed:\n{pane}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    std::fs::write(artifacts.join("tail-live.txt"), &live).unwrap();
    assert!(live.contains("thinking"), "{live}");
    let rests: Vec<_> = runs.iter().flat_map(|r| r[1..].to_vec()).collect();
    publish_to(&inst, &rests).await;
    let finals = loop {
        let pane = capture(false);
        if pane.matches("✅ final answer:").count() == 3 && !pane.contains("● loop") {
            break pane;
        }
        assert!(
            Instant::now() < deadline,
            "three finals never showed:\n{pane}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let coloured = capture(true);
    std::fs::write(artifacts.join("tail-finals.txt"), &finals).unwrap();
    tmux(&socket, &["kill-server"]);
    let _ = up.stop(Duration::from_secs(10));
    for i in 0..3 {
        assert!(finals.contains(&format!("Result {i}")), "{finals}");
        assert!(
            finals.contains(&format!("          echo {i}")),
            "code indented: {finals}"
        );
    }
    assert!(
        !finals.contains("##") && !finals.contains("```"),
        "{finals}"
    );
    assert!(finals.contains("• one"), "{finals}");
    assert!(!finals.contains("ℹ️"), "notice noise: {finals}");
    assert!(
        coloured.contains("\u{1b}[1m"),
        "no colour on a TTY: {coloured}"
    );
}

/// With no instance running, `tail` says so in one line (no raw OS error) and keeps
/// retrying (issue #19: it printed "No such file or directory (os error 2); retrying…").
#[test]
fn tail_without_an_instance_says_so_in_one_line_and_retries() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tail = spawn_logged(&["tail"], tmp.path(), "tail");
    // Negative window, not a wait: tail must keep retrying (not exit, not print more)
    // for 2 s.
    std::thread::sleep(Duration::from_secs(2));
    assert!(tail.0.try_wait().unwrap().is_none(), "tail gave up");
    let err = log(tmp.path(), "tail.err");
    let _ = tail.stop(Duration::from_secs(10));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no streamgate instance is running")
            && err.contains("streamgate up")
            && err.contains("retrying"),
        "{err}"
    );
    assert!(!err.contains("os error"), "{err}");
}

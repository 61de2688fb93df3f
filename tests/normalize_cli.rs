//! The `streamgate normalize` and `conform` commands as a user runs them: for every
//! corpus row (when `$STREAMGATE_CORPUS` is set) and every own fixture, the printed JSONL
//! (the live order: thinking tokens as a separate update) folded to the batch form equals
//! the expected file line for line as JSON values; bad input exits non-zero with a
//! one-line error and nothing on stdout.

use std::path::{Path, PathBuf};
use std::process::Command;
use streamgate_grammar::{fold_token_updates, Event};

fn streamgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_streamgate"))
}

/// (dir, family, capture, expected) for every row of every index we have.
fn rows() -> Vec<(PathBuf, String, String, String)> {
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
    if let Some(c) = std::env::var_os("STREAMGATE_CORPUS") {
        dirs.push(PathBuf::from(c));
    }
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(index) = std::fs::read_to_string(dir.join("index.tsv")) else {
            continue;
        };
        for line in index.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('\t').collect();
            out.push((dir.clone(), cols[1].into(), cols[2].into(), cols[3].into()));
        }
    }
    out
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// What `normalize` printed, folded to the batch (golden) form (spec §3.2).
fn batch_lines(text: &str) -> Vec<serde_json::Value> {
    let events: Vec<Event> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Event::from_json(l).unwrap_or_else(|e| panic!("not an event ({e}): {l}")))
        .collect();
    let folded: Vec<String> = fold_token_updates(&events)
        .iter()
        .map(Event::to_json)
        .collect();
    json_lines(&folded.join("\n"))
}

#[test]
fn normalize_prints_exactly_the_expected_events() {
    let rows = rows();
    assert!(!rows.is_empty());
    for (dir, family, capture, expected) in rows {
        let out = streamgate()
            .args(["normalize", "--family", &family])
            .arg(dir.join(&capture))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{capture}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = std::fs::read_to_string(dir.join(&expected)).unwrap();
        assert_eq!(
            batch_lines(&String::from_utf8(out.stdout).unwrap()),
            json_lines(&want),
            "{}",
            dir.join(&capture).display()
        );
    }
}

#[test]
fn auto_detects_every_family() {
    for (dir, family, capture, expected) in rows() {
        let out = streamgate()
            .args(["normalize", "--family", "auto"])
            .arg(dir.join(&capture))
            .output()
            .unwrap();
        let want = std::fs::read_to_string(dir.join(&expected)).unwrap();
        // A capture declared with the wrong family on purpose (docs/families.md) is
        // detected as what it is, not as what it was declared.
        if want.contains("\"family_mismatch\"") {
            continue;
        }
        // Captures that are only a fragment (cut before any recognisable frame) cannot be
        // detected; every capture with a recognisable opening must match.
        let got = batch_lines(&String::from_utf8(out.stdout).unwrap());
        if got
            .iter()
            .any(|v| v["data"]["diagnostic"]["code"] == "unknown_family")
        {
            continue;
        }
        assert_eq!(
            got,
            json_lines(&want),
            "{family} {}",
            dir.join(&capture).display()
        );
    }
}

#[test]
fn transcript_file_gets_the_opaque_material() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.jsonl");
    let out = streamgate()
        .args(["normalize", "--family", "f1", "--transcript"])
        .arg(&t)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/f1/redacted.sse"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let transcript = std::fs::read_to_string(&t).unwrap();
    assert!(!transcript.is_empty());
    for entry in json_lines(&transcript) {
        let material = entry["material"].as_str().unwrap();
        assert!(!String::from_utf8_lossy(&out.stdout).contains(material));
    }
}

#[test]
fn bad_input_fails_with_one_line() {
    for args in [
        vec!["normalize", "--family", "f9", "Cargo.toml"],
        vec!["normalize", "--family", "f1", "/nonexistent/capture.sse"],
        vec!["conform", "--corpus", "/nonexistent"],
    ] {
        let out = streamgate().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn conform_over_own_fixtures_passes() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    for dir in std::fs::read_dir(fixtures).unwrap().flatten() {
        let out = streamgate()
            .arg("conform")
            .arg("--corpus")
            .arg(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.trim_end().ends_with(" 0 failed"), "{stdout}");
    }
}

#[test]
fn normalize_prints_the_live_order() {
    let out = streamgate()
        .args(["normalize", "--family", "f1"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/f1/redacted.sse"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let got = json_lines(&String::from_utf8(out.stdout).unwrap());
    let pos = |want: serde_json::Value| {
        got.iter()
            .position(|v| v["data"] == want)
            .unwrap_or_else(|| panic!("{want} not printed: {got:#?}"))
    };
    // The segment's end marker as the segment ends, the answer delta right after it, the
    // token count with the usage frame (`message_delta`), then the final answer.
    let end = pos(serde_json::json!({"id":"1","variant":"redacted","phase":"end"}));
    let delta = pos(
        serde_json::json!({"id":"2","phase":"commentary","delta":"Done.","status":"in_progress"}),
    );
    let tokens = pos(serde_json::json!({"id":"1","variant":"redacted","tokens":33}));
    let fin = got
        .iter()
        .position(|v| v["data"]["phase"] == "final_answer")
        .unwrap();
    assert!(end < delta && delta < tokens && tokens < fin, "{got:#?}");
    let seqs: Vec<u64> = got.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=got.len() as u64).collect::<Vec<_>>());
}

/// `streamgate ingest` applies the id rule before it connects: nothing reaches the
/// ingest address.
#[test]
fn ingest_refuses_bad_ids_before_sending() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let capture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/f1/end-turn.sse");
    let long = "r".repeat(257);
    for (flag, value, want) in [
        ("--run", "run\n1", "run id: no control characters"),
        (
            "--run",
            long.as_str(),
            "run id: at most 256 bytes (got 257)",
        ),
        ("--tenant", "", "tenant: must not be empty"),
        ("--session", "s\r\n", "session: no control characters"),
    ] {
        let mut cmd = streamgate();
        cmd.arg("ingest")
            .arg(&capture)
            .args(["--family", "f1", "--addr", &addr])
            .args([flag, value]);
        if flag != "--run" {
            cmd.args(["--run", "ok-run"]);
        }
        let out = cmd.output().expect("run streamgate ingest");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value:?} accepted");
        assert!(stderr.contains(want), "{flag}: {stderr}");
    }
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the CLI connected despite a bad id"
    );
}

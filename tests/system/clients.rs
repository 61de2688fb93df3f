//! The Python and TypeScript clients' own test suites (`clients/python`,
//! `clients/typescript`), run against a real `up` of this build: follow, list, resume,
//! a cut connection, idle timeout, cancellation and a 401 (issue #18).
//!
//! Each suite starts its own `up` from `STREAMGATE_BIN` (set here to this build's
//! binary). Needs `npm ci --prefix clients/typescript` and a Python with the client and
//! its test extras (`STREAMGATE_PYTHON`, default `python3`); `scripts/test.sh` prepares
//! both. Without them a suite fails unless `STREAMGATE_SKIP_NODE=1` /
//! `STREAMGATE_SKIP_PYTHON=1`.

use crate::common;

use common::*;
use std::process::Command;

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .env("STREAMGATE_BIN", bin())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    eprintln!(
        "{what}: {}",
        text.lines().rev().take(12).collect::<Vec<_>>().join(" | ")
    );
}

fn skipped(var: &str, ready: bool, hint: &str) -> bool {
    if ready {
        return false;
    }
    assert_eq!(
        std::env::var(var).as_deref(),
        Ok("1"),
        "{hint} (or set {var}=1 to skip)"
    );
    true
}

#[test]
fn typescript_client_suite_against_up() {
    let dir = root().join("clients/typescript");
    if skipped(
        "STREAMGATE_SKIP_NODE",
        dir.join("node_modules/typescript").exists(),
        "clients/typescript/node_modules missing: run `npm ci --prefix clients/typescript`",
    ) {
        return;
    }
    run(
        Command::new("npm").arg("test").current_dir(&dir),
        "clients/typescript npm test",
    );
}

#[test]
fn python_client_suite_against_up() {
    let python = std::env::var("STREAMGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ready = Command::new(&python)
        .args([
            "-c",
            "import httpx, pytest, pytest_asyncio, streamgate_client",
        ])
        .current_dir(root().join("clients/python"))
        .status()
        .is_ok_and(|s| s.success());
    if skipped(
        "STREAMGATE_SKIP_PYTHON",
        ready,
        "no Python with the client and its test extras: pip install -e 'clients/python[test]'",
    ) {
        return;
    }
    run(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "tests"])
            .current_dir(root().join("clients/python")),
        "clients/python pytest",
    );
}

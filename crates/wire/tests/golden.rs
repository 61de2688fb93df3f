//! Golden conformance: every row of the shared corpus (`$STREAMGATE_CORPUS`) and of the
//! project's own fixtures (`fixtures/`) must normalize to its expected file, with the
//! expected transcript kinds and every invariant holding.
//!
//! `STREAMGATE_FAMILY=f2` restricts a run to one family while working on it.

use std::path::{Path, PathBuf};
use streamgate_wire::conformance::{case_problems, parse_index};
use streamgate_wire::{normalize_bytes, FamilyChoice};

fn run_index(dir: &Path) -> (usize, Vec<String>) {
    let index = std::fs::read_to_string(dir.join("index.tsv"))
        .unwrap_or_else(|e| panic!("cannot read {}/index.tsv: {e}", dir.display()));
    let only = std::env::var("STREAMGATE_FAMILY").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in parse_index(&index).unwrap() {
        if only.as_deref().is_some_and(|f| f != case.adapter) {
            continue;
        }
        ran += 1;
        let family: FamilyChoice = case.adapter.parse().unwrap();
        let capture = std::fs::read(dir.join(&case.capture)).unwrap();
        let expected = std::fs::read_to_string(dir.join(&case.expected)).unwrap();
        let produced = normalize_bytes(family, &capture, 0);
        let kinds: Vec<&str> = case.transcript_kinds.iter().map(String::as_str).collect();
        let problems = case_problems(&expected, &kinds, &produced);
        if !problems.is_empty() {
            failures.push(format!(
                "{} ({}):\n  {}",
                case.name,
                case.capture,
                problems.join("\n  ")
            ));
        }
    }
    (ran, failures)
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

#[test]
fn shared_corpus_matches_goldens() {
    let Some(dir) = std::env::var_os("STREAMGATE_CORPUS") else {
        // CI sets STREAMGATE_CORPUS; there a missing corpus is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "STREAMGATE_CORPUS is not set in CI"
        );
        eprintln!("STREAMGATE_CORPUS not set: shared corpus not checked");
        return;
    };
    let (ran, failures) = run_index(Path::new(&dir));
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `fixtures/` holds one folder per family, each with its own `index.tsv`.
fn run_fixture_dirs() -> (usize, Vec<String>) {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.join("index.tsv").is_file());
    dirs.sort();
    let mut ran = 0;
    let mut failures = Vec::new();
    for dir in dirs {
        let (n, f) = run_index(&dir);
        ran += n;
        failures.extend(f);
    }
    (ran, failures)
}

#[test]
fn own_fixtures_match_goldens() {
    let (ran, failures) = run_fixture_dirs();
    assert!(
        ran > 0 || std::env::var("STREAMGATE_FAMILY").is_ok(),
        "no fixtures ran"
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

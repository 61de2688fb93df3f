//! Comparing a run against a golden expected file (pure: the caller reads the files).
//!
//! Goldens are in batch form: a thinking segment's `tokens` sit on its `end` marker. The
//! adapters emit the live form, where that count follows as one tokens-only update once
//! usage arrives; the two are equivalent under spec §3.2 ("MAY emit one summary marker
//! update"), and produced events are compared after
//! [`fold_token_updates`](streamgate_grammar::fold_token_updates) turned them into the
//! batch form. Invariants are checked on the live form, as emitted.

use crate::emitter::TranscriptEntry;
use crate::normalizer::Normalized;
use serde_json::Value;
use std::collections::BTreeSet;
use streamgate_grammar::{check, fold_token_updates};

/// Differences between produced events (folded to the batch form, see the module docs)
/// and the golden JSONL, compared as JSON values (key order and formatting do not
/// matter). Empty when they match.
pub fn diff_events(expected_jsonl: &str, produced: &Normalized) -> Vec<String> {
    let produced = fold_token_updates(&produced.events);
    let mut problems = Vec::new();
    let expected: Vec<&str> = expected_jsonl
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    for (i, want) in expected.iter().enumerate() {
        let want_v: Value = match serde_json::from_str(want) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("expected line {} is not JSON: {e}", i + 1));
                continue;
            }
        };
        match produced.get(i) {
            None => {
                problems.push(format!("missing line {}: {want}", i + 1));
                break;
            }
            Some(ev) => {
                let got = ev.to_json();
                let got_v: Value = serde_json::from_str(&got).unwrap_or(Value::Null);
                if got_v != want_v {
                    problems.push(format!(
                        "line {} differs\n  expected: {want}\n  produced: {got}",
                        i + 1
                    ));
                    if problems.len() >= 3 {
                        break;
                    }
                }
            }
        }
    }
    if produced.len() > expected.len() {
        problems.push(format!(
            "{} extra events, first: {}",
            produced.len() - expected.len(),
            produced[expected.len()].to_json()
        ));
    }
    problems
}

/// Differences between the transcript kinds produced and those `index.tsv` lists.
pub fn diff_transcript_kinds(expected: &[&str], transcript: &[TranscriptEntry]) -> Vec<String> {
    let want: BTreeSet<&str> = expected.iter().copied().filter(|k| !k.is_empty()).collect();
    let got: BTreeSet<&str> = transcript.iter().map(|t| t.kind).collect();
    let mut problems = Vec::new();
    for k in want.difference(&got) {
        problems.push(format!("transcript lacks kind {k}"));
    }
    for k in got.difference(&want) {
        problems.push(format!("transcript has unexpected kind {k}"));
    }
    problems
}

/// Invariant violations of a produced run, as text.
pub fn invariant_problems(produced: &Normalized) -> Vec<String> {
    let opaque: Vec<&str> = produced
        .transcript
        .iter()
        .map(|t| t.material.as_str())
        .collect();
    check(&produced.events, &opaque, Some(produced.account))
        .into_iter()
        .map(|v| v.to_string())
        .collect()
}

/// Everything that is wrong with one case.
pub fn case_problems(expected_jsonl: &str, kinds: &[&str], produced: &Normalized) -> Vec<String> {
    let mut p = diff_events(expected_jsonl, produced);
    p.extend(diff_transcript_kinds(kinds, &produced.transcript));
    p.extend(invariant_problems(produced));
    p
}

/// One row of a conformance `index.tsv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// Human name.
    pub name: String,
    /// Family id (`f1`, `f2`, …).
    pub adapter: String,
    /// Capture path, relative to the index.
    pub capture: String,
    /// Expected JSONL path, relative to the index.
    pub expected: String,
    /// Transcript kinds the adapter must divert for this capture.
    pub transcript_kinds: Vec<String>,
}

/// Parses an `index.tsv` (header row first; tab-separated
/// `name adapter capture expected transcript_kinds`).
pub fn parse_index(text: &str) -> Result<Vec<Case>, String> {
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() < 4 {
            return Err(format!("index line {}: expected at least 4 columns", n + 1));
        }
        cases.push(Case {
            name: cols[0].to_owned(),
            adapter: cols[1].to_owned(),
            capture: cols[2].to_owned(),
            expected: cols[3].to_owned(),
            transcript_kinds: cols
                .get(4)
                .map(|k| {
                    k.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    Ok(cases)
}

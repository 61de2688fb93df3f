//! `streamgate conform`: runs every row of a corpus `index.tsv` and reports per case.

use anyhow::{Context, Result};
use std::path::Path;
use std::process::ExitCode;
use streamgate_wire::conformance::{case_problems, parse_index};
use streamgate_wire::{normalize_bytes, FamilyChoice};

/// Runs the subcommand; fails (exit 1) when any case fails.
pub fn run(corpus: &Path) -> Result<ExitCode> {
    let index_path = corpus.join("index.tsv");
    let index = std::fs::read_to_string(&index_path)
        .with_context(|| format!("cannot read {}", index_path.display()))?;
    let cases = parse_index(&index).map_err(anyhow::Error::msg)?;
    let (mut passed, mut failed) = (0usize, 0usize);
    for case in cases {
        let problems = match run_case(corpus, &case) {
            Ok(p) => p,
            Err(e) => vec![format!("{e:#}")],
        };
        if problems.is_empty() {
            passed += 1;
            println!("ok    {}", case.name);
        } else {
            failed += 1;
            println!("FAIL  {}", case.name);
            for p in problems {
                println!("      {}", p.replace('\n', "\n      "));
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run_case(corpus: &Path, case: &streamgate_wire::conformance::Case) -> Result<Vec<String>> {
    let family: FamilyChoice = case.adapter.parse()?;
    let capture_path = corpus.join(&case.capture);
    let capture = std::fs::read(&capture_path)
        .with_context(|| format!("cannot read {}", capture_path.display()))?;
    let expected_path = corpus.join(&case.expected);
    let expected = std::fs::read_to_string(&expected_path)
        .with_context(|| format!("cannot read {}", expected_path.display()))?;
    let produced = normalize_bytes(family, &capture, 0);
    let kinds: Vec<&str> = case.transcript_kinds.iter().map(String::as_str).collect();
    Ok(case_problems(&expected, &kinds, &produced))
}

//! Every metric the code records is in the runtime's catalogue, so it is exported with
//! `# HELP` text and the one `streamgate_` prefix: every `"streamgate_…"` string literal
//! in the sources (metric names are the only ones of that shape) must be listed.

use std::path::Path;
use streamgate_runtime::metrics::CATALOGUE;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("build.rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_recorded_metric_is_described_in_the_catalogue() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "crates", "services"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for (i, _) in text.match_indices("\"streamgate_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !CATALOGUE.iter().any(|(n, _, _)| *n == name) {
                missing.push(format!("{}: {name}", f.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics without a catalogue entry:\n{}",
        missing.join("\n")
    );
    for (name, _, help) in CATALOGUE {
        assert!(
            name.starts_with("streamgate_") && !help.is_empty(),
            "{name}"
        );
    }
}

#[test]
fn the_grafana_dashboard_only_queries_metrics_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("deploy/grafana/streamgate.json"))
        .expect("deploy/grafana/streamgate.json");
    for (i, _) in text.match_indices("streamgate_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let base = name.trim_end_matches("_bucket");
        assert!(
            CATALOGUE.iter().any(|(n, _, _)| *n == base),
            "the dashboard queries {name}, which nothing records"
        );
    }
}

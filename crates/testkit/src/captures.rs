//! Every capture's expected events: the project's fixtures (`fixtures/*/index.tsv`) and,
//! when `$STREAMGATE_CORPUS` names it, the shared corpus (its `index.tsv`) — for the
//! tests that deliver every known stream to a channel.

use std::path::{Path, PathBuf};
use streamgate_grammar::Event;

/// One capture's expected (normalized) events.
pub struct Capture {
    /// `<directory>-<capture file>`, for failure messages.
    pub name: String,
    /// The events, in order.
    pub events: Vec<Event>,
}

/// The captures a directory's `index.tsv` lists (expected events in its fourth column).
pub fn indexed(dir: &Path) -> Vec<Capture> {
    let Ok(index) = std::fs::read_to_string(dir.join("index.tsv")) else {
        return Vec::new();
    };
    let dname = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = Vec::new();
    for line in index.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let Some(expected) = cols.get(3) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(dir.join(expected)) else {
            continue;
        };
        out.push(Capture {
            name: format!("{dname}-{}", cols.get(2).unwrap_or(&"")),
            events: text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .filter_map(|l| Event::from_json(l).ok())
                .collect(),
        });
    }
    out
}

/// The project's fixtures, then the shared corpus's captures when `$STREAMGATE_CORPUS`
/// is set.
pub fn captures() -> Vec<Capture> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.extend(std::env::var_os("STREAMGATE_CORPUS").map(PathBuf::from));
    dirs.iter().flat_map(|d| indexed(d)).collect()
}

/// A distinctive piece of an answer that every chat platform shows as it is: its
/// longest run of letters, digits and spaces (markdown rendering leaves those alone),
/// at most 40 chars; `None` when it has no such run of 12 chars. Counting it in what a
/// platform stores tells how many times the answer is shown.
pub fn probe(answer: &str) -> Option<String> {
    let best = answer
        .split(|c: char| !(c.is_alphanumeric() || c == ' '))
        .map(str::trim)
        .max_by_key(|s| s.chars().count())?;
    let p: String = best.chars().take(40).collect();
    (p.trim().chars().count() >= 12).then(|| p.trim().to_owned())
}

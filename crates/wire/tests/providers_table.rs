//! The coverage table `docs/providers.md` against the fixtures.
//!
//! Every wire type a fixture of a family contains (an SSE event type, a content block,
//! a delta, an item, a part, a session update, …, named with the table's keys) must have
//! a row in that family's table — so an adapter meeting a type the table does not list
//! fails here — and every row's fixture must exist and contain the type it covers.
//! With `STREAMGATE_CORPUS` set, the shared corpus's captures are checked the same way.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use streamgate_wire::{Decoded, FrameDecoder};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One table row.
struct Row {
    key: String,
    fixture: String,
}

/// The table's rows per adapter code, from the sections headed `## Name — \`code\``.
fn table() -> BTreeMap<String, Vec<Row>> {
    let text = std::fs::read_to_string(root().join("docs/providers.md")).unwrap();
    let mut rows: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    let mut family: Option<String> = None;
    for line in text.lines() {
        if let Some(head) = line.strip_prefix("## ") {
            family = head
                .rsplit_once('`')
                .and_then(|(before, _)| before.rsplit_once('`'))
                .map(|(_, code)| code.to_owned());
            continue;
        }
        let (Some(fam), Some(cells)) = (&family, line.strip_prefix('|')) else {
            continue;
        };
        let cells: Vec<&str> = cells.split('|').map(str::trim).collect();
        let Some(key) = cells
            .first()
            .and_then(|c| c.strip_prefix('`'))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue; // header, separator
        };
        let fixture = cells.get(2).copied().unwrap_or_default();
        let fixture = fixture.trim_matches('`').to_owned();
        rows.entry(fam.clone()).or_default().push(Row {
            key: key.to_owned(),
            fixture,
        });
    }
    rows
}

/// The JSON records of a capture: SSE `data:` payloads or JSON lines.
fn records(bytes: &[u8]) -> Vec<Value> {
    // The adapters' own framing (SSE or JSON lines, sniffed), so the table is checked
    // against exactly the frames they meet.
    let mut out = Vec::new();
    let mut take = |d: Decoded<'_>| {
        if let Decoded::Frame(f) = d {
            if let Ok(v) = serde_json::from_str::<Value>(f.data) {
                out.push(v);
            }
        }
    };
    let mut decoder = FrameDecoder::default();
    decoder.feed(bytes, &mut take);
    decoder.finish(&mut take);
    out
}

fn s(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn items(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Anthropic Messages event keys (also claude-cli's `stream_event` payloads).
fn anthropic(ev: &Value, keys: &mut BTreeSet<String>) {
    let Some(ty) = s(ev, "type") else { return };
    keys.insert(format!("event:{ty}"));
    if let Some(b) = ev.get("content_block").and_then(|b| s(b, "type")) {
        keys.insert(format!("block:{b}"));
    }
    if let Some(d) = ev.get("delta") {
        if let Some(t) = s(d, "type") {
            keys.insert(format!("delta:{t}"));
        }
        if let Some(r) = s(d, "stop_reason") {
            keys.insert(format!("stop:{r}"));
        }
    }
    if ty == "error" {
        if let Some(e) = ev.get("error").and_then(|e| s(e, "type")) {
            keys.insert(format!("error:{e}"));
        }
    }
}

fn claude_cli(line: &Value, keys: &mut BTreeSet<String>) {
    let Some(ty) = s(line, "type") else { return };
    match s(line, "subtype") {
        Some(sub) => keys.insert(format!("line:{ty}/{sub}")),
        None => keys.insert(format!("line:{ty}")),
    };
    if let Some(ev) = line.get("event") {
        anthropic(ev, keys);
    }
    let content = line.get("message").and_then(|m| m.get("content"));
    for part in items(content) {
        if let Some(t) = s(part, "type") {
            keys.insert(format!("content:{t}"));
        }
    }
}

fn openai_chat(chunk: &Value, keys: &mut BTreeSet<String>) {
    if chunk.get("error").is_some() {
        keys.insert("chunk:error".into());
    }
    if chunk.get("moderation").is_some_and(|m| !m.is_null()) {
        keys.insert("chunk:moderation".into());
    }
    let choices = items(chunk.get("choices"));
    if choices.is_empty() && chunk.get("usage").is_some_and(|u| !u.is_null()) {
        keys.insert("chunk:usage".into());
    }
    for choice in choices {
        if let Some(r) = s(choice, "finish_reason") {
            keys.insert(format!("finish:{r}"));
        }
        if choice.get("logprobs").is_some_and(|l| !l.is_null()) {
            keys.insert("field:logprobs".into());
        }
        let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
            continue;
        };
        for (field, value) in delta {
            if value.is_null() {
                continue;
            }
            keys.insert(format!("field:{field}"));
            for part in items(Some(value)) {
                match (field.as_str(), s(part, "type")) {
                    ("content", Some(t)) => {
                        keys.insert(format!("part:{t}"));
                    }
                    ("tool_calls", Some(t)) if t == "custom" => {
                        keys.insert("field:tool_calls.custom".into());
                    }
                    _ => {}
                }
            }
        }
    }
}

fn openai_responses(ev: &Value, keys: &mut BTreeSet<String>) {
    let Some(ty) = s(ev, "type") else { return };
    keys.insert(format!("event:{ty}"));
    if let Some(t) = ev.get("item").and_then(|i| s(i, "type")) {
        keys.insert(format!("item:{t}"));
    }
    if let Some(t) = ev.get("part").and_then(|p| s(p, "type")) {
        keys.insert(format!("part:{t}"));
    }
    let incomplete = ev
        .get("response")
        .and_then(|r| r.get("incomplete_details"))
        .and_then(|d| s(d, "reason"));
    if let Some(r) = incomplete {
        keys.insert(format!("incomplete:{r}"));
    }
}

fn gemini(chunk: &Value, keys: &mut BTreeSet<String>) {
    let Some(top) = chunk.as_object() else { return };
    for (k, v) in top {
        match k.as_str() {
            "candidates" => {}
            "promptFeedback" => {
                keys.insert(format!("field:{k}"));
                if let Some(b) = s(v, "blockReason") {
                    keys.insert(format!("block:{b}"));
                }
            }
            _ => {
                keys.insert(format!("field:{k}"));
            }
        }
    }
    for cand in items(chunk.get("candidates")) {
        let Some(cand) = cand.as_object() else {
            continue;
        };
        for (k, v) in cand {
            match k.as_str() {
                "content" => {
                    for part in items(v.get("parts")) {
                        gemini_part(part, keys);
                    }
                }
                "finishReason" => {
                    if let Some(r) = v.as_str() {
                        keys.insert(format!("finish:{r}"));
                    }
                }
                _ => {
                    keys.insert(format!("field:{k}"));
                }
            }
        }
    }
}

fn gemini_part(part: &Value, keys: &mut BTreeSet<String>) {
    let Some(part) = part.as_object() else { return };
    for (k, v) in part {
        keys.insert(format!("part:{k}"));
        if k == "functionCall" {
            for field in ["partialArgs", "willContinue"] {
                if v.get(field).is_some() {
                    keys.insert(format!("call:{field}"));
                }
            }
        }
    }
}

fn ollama(line: &Value, keys: &mut BTreeSet<String>) {
    if line.get("error").is_some() {
        keys.insert("line:error".into());
    }
    if line.get("logprobs").is_some_and(|l| !l.is_null()) {
        keys.insert("field:logprobs".into());
    }
    if let Some(r) = s(line, "done_reason") {
        keys.insert(format!("done:{r}"));
    }
    if let Some(m) = line.get("message").and_then(Value::as_object) {
        for (k, v) in m {
            if !v.is_null() {
                keys.insert(format!("field:{k}"));
            }
        }
    }
}

fn codex_exec(line: &Value, keys: &mut BTreeSet<String>) {
    if let Some(t) = s(line, "type") {
        keys.insert(format!("event:{t}"));
    }
    if let Some(t) = line.get("item").and_then(|i| s(i, "type")) {
        keys.insert(format!("item:{t}"));
    }
}

fn codex_app_server(msg: &Value, keys: &mut BTreeSet<String>) {
    if let Some(m) = s(msg, "method") {
        keys.insert(format!("method:{m}"));
    }
    // Thread items of `item/*` notifications; `rawResponseItem/completed` mirrors the
    // Responses items and is one row of its own.
    let thread_item = s(msg, "method").is_some_and(|m| m.starts_with("item/"));
    let item = msg
        .get("params")
        .and_then(|p| p.get("item"))
        .filter(|_| thread_item);
    if let Some(t) = item.and_then(|i| s(i, "type")) {
        keys.insert(format!("item:{t}"));
    }
}

fn acp(msg: &Value, keys: &mut BTreeSet<String>) {
    if let Some(m) = s(msg, "method") {
        keys.insert(format!("method:{m}"));
    }
    let params = msg.get("params");
    if let Some(u) = params.and_then(|p| p.get("update")) {
        if let Some(kind) = s(u, "sessionUpdate") {
            keys.insert(format!("update:{kind}"));
        }
        if let Some(r) = s(u, "stopReason") {
            keys.insert(format!("stop:{r}"));
        }
        // Content: one block or entry (the `*_chunk` kinds) or an array of them (v2 whole
        // messages, a tool's content entries).
        let blocks: Vec<&Value> = match u.get("content") {
            Some(Value::Array(a)) => a.iter().collect(),
            Some(c @ Value::Object(_)) => vec![c],
            _ => Vec::new(),
        };
        for b in blocks {
            if let Some(t) = s(b, "type") {
                keys.insert(format!("content:{t}"));
            }
        }
    }
    for b in items(params.and_then(|p| p.get("prompt"))) {
        if let Some(t) = s(b, "type") {
            keys.insert(format!("content:{t}"));
        }
    }
    if let Some(r) = msg.get("result").and_then(|r| s(r, "stopReason")) {
        keys.insert(format!("stop:{r}"));
    }
}

fn openclaw(ev: &Value, keys: &mut BTreeSet<String>) {
    let Some(stream) = s(ev, "stream") else {
        return;
    };
    keys.insert(format!("stream:{stream}"));
    if let Some(p) = ev.get("data").and_then(|d| s(d, "phase")) {
        keys.insert(format!("phase:{stream}/{p}"));
    }
}

/// The table keys of every type in `capture`, read as `family`.
fn keys_of(family: &str, capture: &[u8]) -> BTreeSet<String> {
    let extract: fn(&Value, &mut BTreeSet<String>) = match family {
        "f1" => anthropic,
        "f1e" => claude_cli,
        "f2" => openai_chat,
        "f3" => openai_responses,
        "f5" => gemini,
        "ollama-native" => ollama,
        "codex-exec" => codex_exec,
        "codex-appserver" => codex_app_server,
        "acp" => acp,
        "openclaw-events" => openclaw,
        other => panic!("no key extractor for family {other}"),
    };
    let mut keys = BTreeSet::new();
    for record in records(capture) {
        extract(&record, &mut keys);
    }
    keys
}

/// (family, capture path) of every case in an index.
fn cases(dir: &Path) -> Vec<(String, PathBuf)> {
    let index = std::fs::read_to_string(dir.join("index.tsv")).unwrap();
    index
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols.len() >= 3).then(|| (cols[1].to_owned(), dir.join(cols[2])))
        })
        .collect()
}

fn fixture_cases() -> Vec<(String, PathBuf)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(root().join("fixtures")).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("index.tsv").exists() {
            all.extend(cases(&dir));
        }
    }
    all.sort();
    all
}

/// Types met in `cases` that the table does not list, as messages.
fn unlisted(cases: &[(String, PathBuf)], table: &BTreeMap<String, Vec<Row>>) -> Vec<String> {
    let mut missing = Vec::new();
    for (family, path) in cases {
        let Some(rows) = table.get(family) else {
            missing.push(format!("{family}: no section in docs/providers.md"));
            continue;
        };
        let listed: BTreeSet<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        let capture = std::fs::read(path).unwrap();
        for key in keys_of(family, &capture) {
            if !listed.contains(key.as_str()) {
                missing.push(format!("{family}: `{key}` (in {})", path.display()));
            }
        }
    }
    missing.dedup();
    missing
}

#[test]
fn every_type_the_fixtures_contain_is_in_the_table() {
    let missing = unlisted(&fixture_cases(), &table());
    assert!(
        missing.is_empty(),
        "types with no row in docs/providers.md:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_row_cites_a_fixture_that_contains_its_type() {
    let mut problems = Vec::new();
    for (family, rows) in table() {
        for row in rows {
            if row.fixture == "—" || row.fixture.is_empty() {
                continue; // explained in the row
            }
            let path = root().join("fixtures").join(&row.fixture);
            let Ok(capture) = std::fs::read(&path) else {
                problems.push(format!(
                    "{family} `{}`: no fixture {}",
                    row.key, row.fixture
                ));
                continue;
            };
            if !keys_of(&family, &capture).contains(&row.key) {
                problems.push(format!(
                    "{family} `{}`: {} does not contain it",
                    row.key, row.fixture
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_type_the_shared_corpus_contains_is_in_the_table() {
    let Some(dir) = std::env::var_os("STREAMGATE_CORPUS") else {
        eprintln!("STREAMGATE_CORPUS not set: shared corpus not checked");
        return;
    };
    let missing = unlisted(&cases(Path::new(&dir)), &table());
    assert!(
        missing.is_empty(),
        "corpus types with no row in docs/providers.md:\n{}",
        missing.join("\n")
    );
}

//! `up --demo`: one bundled capture per family, ingested in small random chunks like a
//! live provider, then a wait until every run is archived and its final answer shown.

use anyhow::Result;
use bytes::Bytes;
use std::time::Duration;
use streamgate_bus::raw::CloseKind;
use streamgate_normalizer::ingest::{Ingestor, RunSpec};
use tokio::sync::mpsc::UnboundedReceiver;

/// The captures `--demo` ingests: one per family, from the project's own fixtures.
const DEMO: &[(&str, &str, &[u8])] = &[
    (
        "demo-anthropic-thinking",
        "f1",
        include_bytes!("../../../fixtures/f1/redacted.sse"),
    ),
    (
        "demo-anthropic-tool",
        "f1",
        include_bytes!("../../../fixtures/f1/tool-use.sse"),
    ),
    (
        "demo-claude-cli",
        "f1e",
        include_bytes!("../../../fixtures/f1e/thinking.jsonl"),
    ),
    (
        "demo-deepseek",
        "f2",
        include_bytes!("../../../fixtures/f2/deepseek-thinking.sse"),
    ),
    (
        "demo-openrouter",
        "f2",
        include_bytes!("../../../fixtures/f2/openrouter-dual-lane.sse"),
    ),
    (
        "demo-openai-responses",
        "f3",
        include_bytes!("../../../fixtures/f3/reasoning.sse"),
    ),
    (
        "demo-gemini",
        "f5",
        include_bytes!("../../../fixtures/f5/thinking.sse"),
    ),
    (
        "demo-ollama",
        "ollama-native",
        include_bytes!("../../../fixtures/ollama-native/text.jsonl"),
    ),
    (
        "demo-codex",
        "codex-appserver",
        include_bytes!("../../../fixtures/codex-appserver/reasoning.jsonl"),
    ),
];

/// The tenant of the demo runs.
const DEMO_TENANT: &str = "demo";

/// Ingests one capture in small random chunks, like a live provider.
async fn demo_ingest(ingestor: &Ingestor, run: &str, family: &str, bytes: &[u8]) -> Result<()> {
    let spec = RunSpec::new(DEMO_TENANT, run, Some("demo-session"), family, None)?;
    let mut pos = 0;
    let mut chunk = 0;
    while pos < bytes.len() {
        let n = (rand::random::<u32>() % 200 + 20) as usize;
        let end = (pos + n).min(bytes.len());
        ingestor
            .put(
                &spec,
                chunk,
                Bytes::copy_from_slice(&bytes[pos..end]),
                None,
                None,
            )
            .await?;
        pos = end;
        chunk += 1;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    ingestor
        .put(&spec, chunk, Bytes::new(), Some(CloseKind::Normal), None)
        .await?;
    Ok(())
}

/// Waits until every run has its terminal event in the archive.
async fn wait_archived(store: &dyn streamgate_archive::Store, runs: &[String]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for run in runs {
        loop {
            let done = store
                .get_run(DEMO_TENANT, run)
                .await?
                .is_some_and(|r| r.status != streamgate_archive::RunStatusKind::Open);
            if done {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "demo run {run} was not archived in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Ingests every demo capture, then waits until each run is archived and (when
/// `shown` is given: the terminal channel reports runs it has settled) shown.
pub async fn run(
    ingestor: Ingestor,
    store: &dyn streamgate_archive::Store,
    shown: Option<UnboundedReceiver<String>>,
) -> Result<()> {
    // Give the terminal channel a moment to subscribe so the demo is visible.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let suffix = format!("{:x}", rand::random::<u32>());
    let mut runs = Vec::new();
    for (name, family, bytes) in DEMO {
        let run = format!("{name}-{suffix}");
        demo_ingest(&ingestor, &run, family, bytes).await?;
        runs.push(run);
    }
    wait_archived(store, &runs).await?;
    if let Some(shown) = shown {
        wait_shown(shown, &runs).await?;
    }
    eprintln!("demo: {} runs normalized, archived and shown", runs.len());
    Ok(())
}

/// Waits until the terminal channel has settled every run (its final answer printed).
async fn wait_shown(mut shown: UnboundedReceiver<String>, runs: &[String]) -> Result<()> {
    let mut left: std::collections::HashSet<&str> = runs.iter().map(String::as_str).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !left.is_empty() {
        match tokio::time::timeout_at(deadline, shown.recv()).await {
            Ok(Some(run)) => {
                left.remove(run.as_str());
            }
            Ok(None) => anyhow::bail!("the terminal channel stopped before the demo was shown"),
            Err(_) => anyhow::bail!(
                "the terminal channel did not show {} demo run(s) in time",
                left.len()
            ),
        }
    }
    Ok(())
}

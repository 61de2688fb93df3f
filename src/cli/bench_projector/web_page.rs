//! `bench projector --sink web`: what a person watching the web page sees. One client
//! per run follows the run stream the page reads, `/v1/runs/{tenant}/{run}/events`
//! (opened before the run starts, as an open page would be); each event's arrival is
//! recorded with whether it is the final answer: latency here is from the publish of a
//! run's first event to its first event on the stream, and from the publish of its
//! final-answer event to that event on the stream.

use anyhow::Result;
use futures::StreamExt;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per run: arrival of its first event on the run stream and of its final answer.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageTimes {
    pub first: Option<Instant>,
    pub final_shown: Option<Instant>,
}

/// What every page client saw, by run.
pub type Pages = Arc<Mutex<HashMap<String, PageTimes>>>;

/// Opens one SSE client per run against the web channel at `web`.
pub async fn open_pages(web: SocketAddr, tenant: &str, runs: &[String]) -> Result<Pages> {
    let pages: Pages = Arc::new(Mutex::new(HashMap::new()));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    for run in runs {
        let resp = client
            .get(format!("http://{web}/v1/runs/{tenant}/{run}/events"))
            .send()
            .await?
            .error_for_status()?;
        let (pages, run) = (pages.clone(), run.clone());
        tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                let at = Instant::now();
                buf.extend_from_slice(&chunk);
                // One SSE event ends with a blank line; only `data:` lines matter.
                while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = buf.drain(..end + 2).collect();
                    let shows_final =
                        String::from_utf8_lossy(&event).contains("\"phase\":\"final_answer\"");
                    if let Ok(mut p) = pages.lock() {
                        let t = p.entry(run.clone()).or_default();
                        t.first.get_or_insert(at);
                        if shows_final {
                            t.final_shown.get_or_insert(at);
                        }
                    }
                }
            }
        });
    }
    Ok(pages)
}

/// Waits until every run's page shows its final (or `patience` passes).
pub async fn wait_finals(pages: &Pages, runs: usize, patience: Duration) -> Result<()> {
    let deadline = Instant::now() + patience;
    loop {
        let shown = pages
            .lock()
            .map(|p| p.values().filter(|t| t.final_shown.is_some()).count())
            .unwrap_or(0);
        if shown >= runs {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {shown} of {runs} pages showed their final"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

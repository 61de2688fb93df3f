//! The run list after a restart: one read of `SG_EVENTS` for the last message of every
//! run subject (JetStream's last-per-subject delivery), so the page lists the runs the
//! stream still holds — not only those this process rendered. The channel's tenant and
//! session filters apply; the archive is never read.

use super::runs::Runs;
use crate::channel::Channel;
use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt as _;
use std::time::Duration;
use streamgate_bus::{events, EVENTS_STREAM};
use streamgate_grammar::{AssistantPhase, EventData, RunEvent};

/// Most subjects read at start (the list keeps [`super::runs::MAX_RUNS`] of them).
const MAX_SCAN: usize = 20_000;
/// Longest pause between two messages of the scan before it gives up on the rest.
const IDLE: Duration = Duration::from_secs(5);

/// Lists the runs `SG_EVENTS` holds for `channel` in `runs`. Errors are logged: the page
/// still lists every run the channel renders from now on.
pub async fn from_events(channel: &Channel, runs: &Runs) {
    match scan(channel).await {
        Ok(found) => {
            tracing::debug!(runs = found.len(), "run list seeded from the event stream");
            runs.seed(found);
        }
        Err(e) => tracing::warn!(error = %e, "run list not seeded from the event stream"),
    }
}

async fn scan(channel: &Channel) -> Result<Vec<(RunEvent, Option<String>)>, String> {
    let stream = channel
        .jetstream()
        .get_stream(EVENTS_STREAM)
        .await
        .map_err(|e| e.to_string())?;
    let info = stream.cached_info().clone();
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    // Last-per-subject delivery needs a filter: every subject of the stream.
    let filter = info.config.subjects.first().cloned().unwrap_or_default();
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let cfg = channel.config();
    let mut found = Vec::new();
    for _ in 0..MAX_SCAN {
        let msg = match tokio::time::timeout(IDLE, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(None) | Err(_) => break,
        };
        let pending = msg.info().map(|i| i.pending).unwrap_or(0);
        if let Ok(evs) = events::decode_msg(&msg) {
            let answer = evs.iter().rev().find_map(|e| match &e.event.data {
                EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
                    a.text.clone().or_else(|| a.delta.clone())
                }
                _ => None,
            });
            if let Some(last) = evs.into_iter().last() {
                let env = &last.envelope;
                if cfg.accepts(&env.tenant, env.session_key.as_deref()) {
                    found.push((last, answer));
                }
            }
        }
        if pending == 0 {
            break;
        }
    }
    Ok(found)
}

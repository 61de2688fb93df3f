//! The opt-in search over thinking (`--search-thinking`): reasoning is what a privacy
//! review flags first, so it is indexed only when an operator asks for it.
//!
//! A pass every [`EVERY`] lists ended runs the thinking search has not indexed
//! (`runs.thinking_indexed_at_ms`), joins each reasoning segment's text — deltas and
//! snapshots, between its boundary markers — and hands the segments to
//! [`Store::index_thinking`], which replaces the run's rows and marks it. Segments are
//! indexed whole, so a phrase split over two deltas is found. Retention stripping a run,
//! a backfill writing a new generation and an erasure take its rows out again (a new
//! generation is indexed anew by the next pass).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use streamgate_archive::{ArchiveError, RunFilter, RunStatusKind, Store};
use streamgate_grammar::{EventData, RunEvent, SegmentPhase};
use tokio_util::sync::CancellationToken;

/// Time between passes.
pub const EVERY: Duration = Duration::from_secs(2);
/// Runs per pass at most.
const PASS_RUNS: u32 = 200;

/// A run's reasoning segments as `(seq of the segment's last event, its text)`: the text
/// of each segment (per variant and id) from its deltas, or its last snapshot, closed by
/// its `end` marker; a segment the run left open ends with the run.
pub fn segments(events: &[RunEvent]) -> Vec<(i64, String)> {
    let mut open: HashMap<(String, Option<String>), (i64, String)> = HashMap::new();
    let mut out = Vec::new();
    for ev in events {
        let EventData::Thinking(t) = &ev.event.data else {
            continue;
        };
        let seq = i64::try_from(ev.event.seq).unwrap_or(i64::MAX);
        let key = (t.variant.as_str().to_owned(), t.id.clone());
        let slot = open
            .entry(key.clone())
            .or_insert_with(|| (seq, String::new()));
        slot.0 = seq;
        if let Some(text) = &t.text {
            text.clone_into(&mut slot.1);
        }
        if let Some(delta) = &t.delta {
            slot.1.push_str(delta);
        }
        if t.phase == Some(SegmentPhase::End) {
            if let Some((seq, text)) = open.remove(&key) {
                out.push((seq, text));
            }
        }
    }
    out.extend(open.into_values());
    out.retain(|(_, text)| !text.trim().is_empty());
    out.sort_by_key(|(seq, _)| *seq);
    out
}

/// Indexes ended runs' thinking until `shutdown`.
pub async fn run(store: Arc<dyn Store>, shutdown: CancellationToken) -> anyhow::Result<()> {
    tracing::info!("thinking search on: ended runs' reasoning is indexed");
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        if let Err(e) = pass(&*store).await {
            tracing::warn!(error = %e, "thinking index pass failed; the next pass retries");
        }
    }
}

/// One pass over up to [`PASS_RUNS`] ended runs not indexed yet: how many it indexed.
pub async fn pass(store: &dyn Store) -> Result<usize, ArchiveError> {
    let mut indexed = 0;
    for status in [RunStatusKind::Ended, RunStatusKind::Failed] {
        let page = store
            .list_runs(&RunFilter {
                status: Some(status),
                thinking_unindexed: true,
                limit: PASS_RUNS,
                ..RunFilter::default()
            })
            .await?;
        for run in &page.runs {
            let events = crate::genai::follow::events_of(store, &run.tenant, &run.run_id).await?;
            let now = streamgate_runtime::clock::now_ms();
            store
                .index_thinking(&run.tenant, &run.run_id, &segments(&events), now)
                .await?;
            indexed += 1;
        }
    }
    if indexed > 0 {
        metrics::counter!("streamgate_archiver_thinking_indexed_runs_total")
            .increment(indexed as u64);
    }
    Ok(indexed)
}

#[cfg(test)]
mod tests {
    use super::segments;
    use streamgate_grammar::{Envelope, Event, RunEvent};

    fn run(lines: &[&str]) -> Vec<RunEvent> {
        lines
            .iter()
            .filter_map(|l| Event::from_json(l).ok())
            .map(|event| RunEvent {
                envelope: Envelope {
                    tenant: "t".into(),
                    session_key: None,
                    run_id: "r".into(),
                    ts_ms: 0,
                },
                event,
            })
            .collect()
    }

    #[test]
    fn each_segment_is_joined_from_its_deltas_and_one_left_open_ends_with_the_run() {
        let events = run(&[
            r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"0","variant":"raw","delta":"The tail po"}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"id":"0","variant":"raw","delta":"ints away."}}"#,
            r#"{"seq":5,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end"}}"#,
            r#"{"seq":6,"stream":"assistant","data":{"phase":"final_answer","text":"In 2061."}}"#,
            r#"{"seq":7,"stream":"thinking","data":{"id":"1","variant":"summary","text":"Checked the period."}}"#,
            r#"{"seq":8,"stream":"thinking","data":{"id":"2","variant":"raw","phase":"start"}}"#,
            r#"{"seq":9,"stream":"thinking","data":{"id":"2","variant":"raw","phase":"end"}}"#,
        ]);
        assert_eq!(events.len(), 9);
        assert_eq!(
            segments(&events),
            [
                (5, "The tail points away.".to_owned()),
                (7, "Checked the period.".to_owned())
            ]
        );
    }
}

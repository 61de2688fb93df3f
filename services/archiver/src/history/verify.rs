//! Comparing a run's re-normalization with its archived events, both read page by page.

use super::renormalize::Renormalizer;
use super::{Difference, RunReport, Verdict};
use std::collections::VecDeque;
use streamgate_archive::{ArchiveError, RunRecord, Store};
use streamgate_grammar::{AssistantPhase, EventData, RunEvent};

/// Archived events read per page.
const EVENT_PAGE: u32 = 1000;

/// The parts of a run, in the order a [`Difference`] lists them.
const PARTS: [&str; 5] = [
    "final answer",
    "commentary",
    "thinking",
    "tools",
    "lifecycle",
];

/// Verifies one run against its current generation. With `keep`, also returns today's
/// events when they differ (what a backfill writes); otherwise memory stays bounded by a
/// page of raw chunks and a page of events.
pub async fn verify_run(
    store: &dyn Store,
    run: &RunRecord,
    max_payload: usize,
    keep: bool,
) -> Result<(RunReport, Option<Vec<RunEvent>>), ArchiveError> {
    let mut today = Renormalizer::new(
        store,
        &run.tenant,
        &run.run_id,
        run.session_key.clone(),
        max_payload,
    );
    let mut archived = Archived::new(store, run);
    let mut diff = Diff::default();
    let mut kept = keep.then(Vec::new);
    let mut events = 0u64;
    while let Some(page) = today.next_page().await? {
        for ev in page {
            events += 1;
            let old = archived.next().await?;
            diff.compare(old.as_ref(), Some(&ev));
            if let Some(k) = kept.as_mut() {
                k.push(ev);
            }
        }
    }
    // Archived events beyond what today's adapter yields.
    while let Some(old) = archived.next().await? {
        diff.compare(Some(&old), None);
    }
    let verdict = if !today.saw_raw() {
        Verdict::NoRawChunks
    } else {
        match diff.finish() {
            None => Verdict::Identical,
            Some(d) => Verdict::Differs(d),
        }
    };
    let differs = matches!(verdict, Verdict::Differs(_));
    let report = RunReport {
        tenant: run.tenant.clone(),
        run_id: run.run_id.clone(),
        generation: run.generation,
        made_by: run.provenance.clone(),
        made_today: today.made_today(),
        verdict,
        raw_bytes: today.raw_bytes,
        events,
        open: !today.closed(),
    };
    Ok((report, kept.filter(|_| differs)))
}

/// The archived events of a run's current generation, one page at a time.
struct Archived<'s> {
    store: &'s dyn Store,
    tenant: String,
    run_id: String,
    generation: u32,
    page: VecDeque<RunEvent>,
    after: u64,
    done: bool,
}

impl<'s> Archived<'s> {
    fn new(store: &'s dyn Store, run: &RunRecord) -> Archived<'s> {
        Archived {
            store,
            tenant: run.tenant.clone(),
            run_id: run.run_id.clone(),
            generation: run.generation,
            page: VecDeque::new(),
            after: 0,
            done: false,
        }
    }

    async fn next(&mut self) -> Result<Option<RunEvent>, ArchiveError> {
        if self.page.is_empty() && !self.done {
            let page = self
                .store
                .generation_events_after(
                    &self.tenant,
                    &self.run_id,
                    self.generation,
                    self.after,
                    EVENT_PAGE,
                )
                .await?;
            self.done = page.len() < EVENT_PAGE as usize;
            if let Some(last) = page.last() {
                self.after = last.event.event.seq;
            }
            self.page = page.into_iter().map(|e| e.event).collect();
        }
        Ok(self.page.pop_front())
    }
}

/// The running comparison: the first difference and the parts that differ.
#[derive(Default)]
struct Diff {
    first: Option<(u64, Option<String>, Option<String>)>,
    parts: [bool; PARTS.len()],
    events: u64,
}

impl Diff {
    /// Compares the archived and today's event at the same position (either may be
    /// missing). Events are equal when their canonical lines and envelopes are.
    fn compare(&mut self, old: Option<&RunEvent>, new: Option<&RunEvent>) {
        let (old_line, new_line) = (old.map(RunEvent::to_json), new.map(RunEvent::to_json));
        if old_line == new_line {
            return;
        }
        self.events += 1;
        for ev in [old, new].into_iter().flatten() {
            self.parts[part_of(ev)] = true;
        }
        if self.first.is_none() {
            let seq = new.or(old).map_or(0, |e| e.event.seq);
            self.first = Some((seq, old_line, new_line));
        }
    }

    fn finish(self) -> Option<Difference> {
        let (first_seq, archived, renormalized) = self.first?;
        Some(Difference {
            first_seq,
            archived,
            renormalized,
            parts: PARTS
                .iter()
                .zip(self.parts)
                .filter(|(_, differs)| *differs)
                .map(|(name, _)| *name)
                .collect(),
            events: self.events,
        })
    }
}

/// Index into [`PARTS`] of the part of the run an event belongs to.
fn part_of(ev: &RunEvent) -> usize {
    match &ev.event.data {
        EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => 0,
        EventData::Assistant(_) => 1,
        EventData::Thinking(_) => 2,
        EventData::Item(_) => 3,
        EventData::Lifecycle(_) => 4,
    }
}

//! Writing a run's re-normalization as its new generation.

use super::verify::verify_run;
use super::{RunReport, Verdict};
use streamgate_archive::{ArchiveError, GenerationOutcome, NewGeneration, RunRecord, Store};

/// What [`backfill_run`] did with a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Nothing to write: identical, no raw chunks, or (without `apply`) a dry run.
    Nothing,
    /// The run differs but is still open: a backfill waits until it ends.
    SkippedOpen,
    /// Written as this generation.
    Written(u32),
    /// Another backfill wrote the run meanwhile (now at this generation): left alone.
    Raced(u32),
}

/// Verifies a run and, with `apply`, writes today's events as its new generation when
/// they differ and the run has ended. Idempotent: once written, the run verifies
/// identical and a second backfill writes nothing; a backfill interrupted by a crash
/// resumes by running again (each run is one transaction).
pub async fn backfill_run(
    store: &dyn Store,
    run: &RunRecord,
    max_payload: usize,
    apply: bool,
    now_ms: i64,
) -> Result<(RunReport, Applied), ArchiveError> {
    let (report, events) = verify_run(store, run, max_payload, apply).await?;
    if !matches!(report.verdict, Verdict::Differs(_)) || !apply {
        return Ok((report, Applied::Nothing));
    }
    if report.open {
        return Ok((report, Applied::SkippedOpen));
    }
    let (Some(events), Some(made_today)) = (events, report.made_today.clone()) else {
        return Ok((report, Applied::Nothing));
    };
    if events.is_empty() {
        // Today's adapter yields nothing at all for these bytes: keeping the archived
        // events is better than a run with none; reported as differing.
        return Ok((report, Applied::Nothing));
    }
    let outcome = store
        .write_generation(&NewGeneration {
            tenant: &run.tenant,
            run_id: &run.run_id,
            replaces: run.generation,
            events: &events,
            provenance: made_today,
            at_ms: now_ms,
        })
        .await?;
    let applied = match outcome {
        GenerationOutcome::Written(g) => Applied::Written(g),
        GenerationOutcome::Stale { current } => Applied::Raced(current),
        GenerationOutcome::NoRun => Applied::Nothing,
    };
    Ok((report, applied))
}

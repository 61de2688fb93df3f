//! Governable history (docs/architecture.md §5): `verify` re-normalizes a run's archived raw chunks
//! with this build's adapters and compares the result with the archived events; `backfill`
//! writes the differing runs' re-normalization as a new generation (the old one is kept).
//!
//! Both work one run at a time, paging its raw chunks and its archived events, so memory
//! stays bounded by a page whatever the archive's size (a backfill holds one run's new
//! events until its transaction). A run is re-normalized exactly as the normalizer does
//! it live ([`renormalize`]): the same adapter per family header, the same envelope (ingest
//! time per chunk), the same cut of events too large for the broker — so an unchanged
//! adapter reproduces the archive byte for byte, and a difference means the adapter (or
//! the archive) changed.
//!
//! # Layout
//! - this file: [`Scope`] (which runs), [`RunReport`] and [`Verdict`] (what was found),
//!   and [`runs_in_scope`].
//! - [`renormalize`]: one run's raw chunks through today's adapter, page by page.
//! - [`verify`]: the comparison with the archived events.
//! - [`backfill`]: writing a new generation.
//! - [`rpc`]: the ArchiveService's `Verify` and `Backfill` calls over the above.

pub mod backfill;
pub mod renormalize;
pub mod rpc;
pub mod verify;

use streamgate_archive::{ArchiveError, Provenance, RunFilter, RunRecord, Store};

/// Which runs `verify` and `backfill` look at.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Only this tenant's runs (every tenant's when `None`).
    pub tenant: Option<String>,
    /// Only this run (needs `tenant`, default `default`).
    pub run_id: Option<String>,
    /// Only runs that started at or after this time (ms since the Unix epoch).
    pub since_ts_ms: Option<i64>,
    /// Only runs of this wire family (`f1`, `ollama-native`, …): the family their raw
    /// chunks were ingested as, or the adapter recorded as having made their events.
    pub family: Option<String>,
}

/// What [`verify::verify_run`] found for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Today's adapter yields exactly the archived events.
    Identical,
    /// The first difference, and in which parts of the run they differ.
    Differs(Difference),
    /// The archive keeps no raw chunks for the run (the raw archive was off): nothing to
    /// re-normalize.
    NoRawChunks,
}

/// How a re-normalization differs from the archived events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The first seq at which they differ.
    pub first_seq: u64,
    /// The archived event at that seq (canonical JSON line), `None` when the archive
    /// ends before it.
    pub archived: Option<String>,
    /// Today's event at that seq, `None` when today's adapter yields fewer events.
    pub renormalized: Option<String>,
    /// The parts of the run with a differing event, in a fixed order: `final answer`,
    /// `commentary`, `thinking`, `tools`, `lifecycle`.
    pub parts: Vec<&'static str>,
    /// How many seqs differ.
    pub events: u64,
}

/// One run's verdict with what `verify` read to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// Tenant that owns the run.
    pub tenant: String,
    /// The run id.
    pub run_id: String,
    /// The generation compared against (the run's current one).
    pub generation: u32,
    /// What made the compared generation, when recorded.
    pub made_by: Option<Provenance>,
    /// What makes the run's events today (the family its raw chunks select, as detected),
    /// when its raw chunks are archived.
    pub made_today: Option<Provenance>,
    /// The verdict.
    pub verdict: Verdict,
    /// Raw bytes re-normalized.
    pub raw_bytes: u64,
    /// Events today's adapter yielded.
    pub events: u64,
    /// Whether the run's input is still open — its raw chunks end without a close marker
    /// (a backfill leaves such runs alone: the normalizer may still be adding to them).
    pub open: bool,
}

/// The runs in `scope`, page by page (`f` is called once per page), newest first. The
/// family filter is applied per run by [`verify::verify_run`]'s caller, since the family is
/// known only from the raw chunks.
pub async fn runs_in_scope<F, Fut>(
    store: &dyn Store,
    scope: &Scope,
    mut f: F,
) -> Result<(), ArchiveError>
where
    F: FnMut(Vec<RunRecord>) -> Fut,
    Fut: std::future::Future<Output = Result<bool, ArchiveError>>,
{
    if let Some(run_id) = &scope.run_id {
        let tenant = scope
            .tenant
            .as_deref()
            .unwrap_or(streamgate_grammar::ids::DEFAULT_TENANT);
        if let Some(run) = store.get_run(tenant, run_id).await? {
            f(vec![run]).await?;
        }
        return Ok(());
    }
    let mut filter = RunFilter {
        tenant: scope.tenant.clone(),
        since_ts_ms: scope.since_ts_ms,
        limit: 500,
        ..RunFilter::default()
    };
    loop {
        let page = store.list_runs(&filter).await?;
        if !f(page.runs).await? {
            return Ok(());
        }
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => return Ok(()),
        }
    }
}

/// Whether a run belongs to the family filter, given its raw chunks' family header and
/// the adapter recorded as having made its events.
pub fn in_family(
    family: Option<&str>,
    raw_family: Option<&str>,
    made_by: Option<&Provenance>,
) -> bool {
    let Some(want) = family else { return true };
    raw_family == Some(want) || made_by.is_some_and(|p| p.adapter.split('/').next() == Some(want))
}

//! Erasure (docs/architecture.md §5): a tenant's run, session or every run removed from every store
//! that holds it, with an audit record and no content kept.
//!
//! Order matters for a request that fails half way: the broker's copies go first
//! (`streamgate_bus::erase`), the archive last, in one transaction with its audit record.
//! The archive is what names a session's runs, so a retry after a failure finds them
//! again; and once the bus holds nothing of a run, no late redelivery can put it back
//! into the archive after its rows are gone.

use std::sync::Arc;
use streamgate_archive::{ArchiveError, EraseScope, Erased, Erasure, RunFilter, Store};
use streamgate_bus::erase::{erase_messages, run_filters};
use streamgate_bus::BusError;
use streamgate_grammar::ids::{RunId, TenantId};

/// What an erasure removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EraseReport {
    /// What the archive removed (and its audit id).
    pub archive: Erased,
    /// Messages erased from the streams and KV buckets.
    pub bus_messages: u64,
}

/// Why an erasure failed (what was erased before the failure stays erased; running it
/// again finishes it).
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The archive failed.
    #[error("archive: {0}")]
    Archive(#[from] ArchiveError),
    /// The broker failed.
    #[error("broker: {0}")]
    Bus(#[from] BusError),
    /// A tenant or run id breaks the id rule (no run of it can exist).
    #[error(transparent)]
    InvalidId(#[from] streamgate_grammar::ids::IdError),
}

/// Erases `scope` of `tenant` from the broker, then the archive.
pub async fn erase(
    store: &Arc<dyn Store>,
    js: &async_nats::jetstream::Context,
    partitions: u32,
    tenant: &str,
    scope: &EraseScope,
    actor: &str,
    at_ms: i64,
) -> Result<EraseReport, EraseError> {
    let mut filters = Vec::new();
    let tenant_id = TenantId::new(tenant)?;
    match scope {
        EraseScope::Run(run) => {
            filters.extend(run_filters(
                &tenant_id,
                Some(&RunId::new(run.as_str())?),
                partitions,
            ));
        }
        EraseScope::Session(session) => {
            for run in session_runs(store, tenant, session).await? {
                filters.extend(run_filters(&tenant_id, Some(&RunId::new(run)?), partitions));
            }
        }
        EraseScope::All => filters.extend(run_filters(&tenant_id, None, partitions)),
    }
    let mut bus_messages = 0;
    for (stream, filter, removal) in &filters {
        bus_messages += erase_messages(js, stream, filter, *removal).await?;
    }
    let archive = store
        .erase(&Erasure {
            tenant,
            scope,
            actor,
            at_ms,
        })
        .await?;
    // What services hold of the runs in memory goes too (a projector's run list).
    let notice = streamgate_bus::erase::Erased {
        tenant: tenant.to_owned(),
        runs: match scope {
            EraseScope::All => None,
            EraseScope::Run(run) => Some(vec![run.clone()]),
            EraseScope::Session(_) => Some(archive.runs.clone()),
        },
    };
    if let Err(e) = streamgate_bus::erase::announce(&js.client(), &notice).await {
        tracing::warn!(error = %e, "erasure not announced; projectors keep their in-memory copy until it ages out");
    }
    tracing::info!(
        tenant,
        scope = scope.kind(),
        actor,
        runs = archive.runs.len(),
        events = archive.events,
        raw_chunks = archive.raw_chunks,
        bus_messages,
        audit_id = archive.audit_id,
        "erased"
    );
    Ok(EraseReport {
        archive,
        bus_messages,
    })
}

/// The runs of a session, as the archive lists them.
async fn session_runs(
    store: &Arc<dyn Store>,
    tenant: &str,
    session: &str,
) -> Result<Vec<String>, ArchiveError> {
    let mut filter = RunFilter {
        tenant: Some(tenant.to_owned()),
        session_key: Some(session.to_owned()),
        limit: 1000,
        ..RunFilter::default()
    };
    let mut runs = Vec::new();
    loop {
        let page = store.list_runs(&filter).await?;
        runs.extend(page.runs.into_iter().map(|r| r.run_id));
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => return Ok(runs),
        }
    }
}

//! The `Verify` and `Backfill` calls of the ArchiveService: the engine run on a task,
//! its reports streamed as each run is done.

use super::backfill::{backfill_run, Applied};
use super::{in_family, runs_in_scope, RunReport, Scope, Verdict};
use std::sync::Arc;
use streamgate_archive::{Provenance, Store};
use streamgate_grammar::ids;
use streamgate_proto::v1;
use tokio::sync::mpsc;
use tonic::Status;

/// Reports buffered ahead of a slow client.
const REPORTS: usize = 64;

/// The scope a request names; the run id and tenant obey the id rule.
pub fn scope(r: Option<v1::VerifyRequest>) -> Result<Scope, Status> {
    let r = r.unwrap_or_default();
    let tenant = r.tenant.map(|t| ids::tenant_or_default(&t).to_owned());
    if let Some(run_id) = &r.run_id {
        let t = tenant.as_deref().unwrap_or(ids::DEFAULT_TENANT);
        ids::RunRef::new(t, run_id).map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    if let Some(f) = &r.family {
        f.parse::<streamgate_wire::Family>()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    Ok(Scope {
        tenant,
        run_id: r.run_id,
        since_ts_ms: r.since_ts_ms,
        family: r.family,
    })
}

/// Runs verify (`apply: None`) or backfill over `scope`, sending one report per run.
pub fn spawn(
    store: Arc<dyn Store>,
    scope: Scope,
    max_payload: usize,
    apply: Option<bool>,
) -> mpsc::Receiver<Result<v1::VerifyReport, Status>> {
    let (tx, rx) = mpsc::channel(REPORTS);
    tokio::spawn(async move {
        let result = runs_in_scope(&*store, &scope, |page| {
            let (store, tx, scope) = (store.clone(), tx.clone(), scope.clone());
            async move {
                for run in page {
                    let (report, applied) = match apply {
                        None => (
                            super::verify::verify_run(&*store, &run, max_payload, false)
                                .await?
                                .0,
                            Applied::Nothing,
                        ),
                        Some(apply) => {
                            backfill_run(
                                &*store,
                                &run,
                                max_payload,
                                apply,
                                streamgate_runtime::clock::now_ms(),
                            )
                            .await?
                        }
                    };
                    if !in_family(
                        scope.family.as_deref(),
                        report.made_today.as_ref().map(|p| p.adapter.as_str()),
                        report.made_by.as_ref(),
                    ) {
                        continue;
                    }
                    if tx.send(Ok(to_proto(&report, &applied))).await.is_err() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        })
        .await;
        if let Err(e) = result {
            let _ = tx.send(Err(Status::internal(e.to_string()))).await;
        }
    });
    rx
}

fn label(p: &Provenance) -> String {
    format!("{}@{}", p.adapter, p.adapter_version)
}

fn to_proto(r: &RunReport, applied: &Applied) -> v1::VerifyReport {
    let mut out = v1::VerifyReport {
        tenant: r.tenant.clone(),
        run_id: r.run_id.clone(),
        generation: r.generation,
        made_by: r.made_by.as_ref().map(label),
        made_today: r.made_today.as_ref().map(label),
        raw_bytes: r.raw_bytes,
        events: r.events,
        open: r.open,
        ..v1::VerifyReport::default()
    };
    match &r.verdict {
        Verdict::Identical => out.verdict = "identical".into(),
        Verdict::NoRawChunks => out.verdict = "no_raw_chunks".into(),
        Verdict::Differs(d) => {
            out.verdict = "differs".into();
            out.first_seq = Some(d.first_seq);
            out.archived_json.clone_from(&d.archived);
            out.renormalized_json.clone_from(&d.renormalized);
            out.differs_in = d.parts.iter().map(|p| (*p).to_owned()).collect();
            out.differing_events = d.events;
        }
    }
    match applied {
        Applied::Nothing => {}
        Applied::Written(g) => out.written_generation = Some(*g),
        Applied::SkippedOpen => out.skipped = Some("open".into()),
        Applied::Raced(_) => out.skipped = Some("raced".into()),
    }
    out
}

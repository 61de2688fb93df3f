//! Batches in flight: a consumer batch whose events are sent to SG_EVENTS and wait for
//! the broker's acks before the batch's raw chunks are acknowledged.
//!
//! A partition worker sends a batch's events and, while the broker stores them, applies
//! and sends the next batch — up to `NormalizerConfig::batches_in_flight` batches at
//! once — instead of idling a broker round trip per batch (docs/performance.md, tenth
//! stop: a fifth of both cores sat idle on that wait). The rules that keep this exact:
//!
//! - **Sent in order.** A batch's messages are all written to the connection before the
//!   next batch's ([`send`] returns only then), so a run's events reach the broker in seq
//!   order, as with one batch at a time.
//! - **Landed in order.** Only the oldest flight is waited on ([`land_front`]); a batch's
//!   raw chunks are acknowledged (one in-order ack) after its own events and every
//!   earlier batch's are stored, and its open-runs records are written after the earlier
//!   batch's.
//! - **A failure takes everything behind it.** When a flight fails, the worker forgets
//!   the runs of it and of every flight behind it (their state is past events that may
//!   not be stored) and makes a new incarnation from the first chunk not landed: those
//!   chunks come again and rebuild their runs from SG_RAW. Events of a later batch that
//!   were stored meanwhile are duplicates by seq, which the archive and projectors
//!   ignore (the same as a rebuild's re-published events).

use crate::open_runs::OpenRuns;
use crate::runs::RunKey;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;
use streamgate_bus::events::{publish_batches_under, send_batches_under, Batch, MadeBy};
use streamgate_bus::subject::RunAddr;
use streamgate_bus::trace::TraceContext;
use streamgate_grammar::RunEvent;
use tracing::warn;

/// The events consecutive raw chunks of a run yielded (`worker::coalesce`), published
/// together with the first chunk's trace.
pub(crate) struct Produced {
    pub events: Vec<RunEvent>,
    pub trace: Option<TraceContext>,
    pub made_by: Option<MadeBy>,
}

/// A run's address and what its chunks in a consumer batch yielded.
pub(crate) type RunBatches = (RunAddr, Vec<Produced>);

/// What applying a consumer batch to the run table produced, ready to send.
pub(crate) struct Ready {
    /// Per run whose state the batch moved, in seq order, the events of its chunks.
    pub out: BTreeMap<RunKey, RunBatches>,
    /// Runs that started, were rebuilt or closed in the batch: whether each is open now.
    pub registry: BTreeMap<RunKey, (RunAddr, bool)>,
    /// Chunks the batch applied (duplicates and unreadable ones not counted).
    pub chunks: u64,
    /// One span per chunk, open until the batch lands: the normalizer's step of the
    /// trace each chunk carries.
    pub spans: Vec<tracing::Span>,
    /// The broker's message limit, read once per batch.
    pub max_payload: usize,
}

/// Publish attempts per run and batch before the batch is given up (and redelivered).
const PUBLISH_ATTEMPTS: usize = 3;

/// A batch whose events are sent: it lands once the broker has stored them.
pub(crate) struct Flight {
    landing: BoxFuture<'static, anyhow::Result<()>>,
    /// The raw message whose in-order ack covers the batch (and every earlier one).
    pub last: async_nats::jetstream::Message,
    /// Where a new incarnation starts once this batch has landed.
    pub resume_at: u64,
    /// The runs whose state the batch moved: forgotten if it, or one before it, fails.
    pub runs: Vec<RunKey>,
    /// When its first event was sent.
    pub sent: Instant,
    /// Events it published and chunks it applied, for the counters once it lands.
    pub events: usize,
    pub chunks: u64,
    _spans: Vec<tracing::Span>,
}

/// Sends the events of `ready` (every message written to the connection before this
/// returns) and starts recording its runs; the returned flight lands when both are done.
/// A run whose send failed is sent again when the flight lands, like one whose acks
/// failed, up to [`PUBLISH_ATTEMPTS`] in all.
pub(crate) async fn send(
    js: &async_nats::jetstream::Context,
    open_runs: &OpenRuns,
    ready: Ready,
    last: async_nats::jetstream::Message,
    resume_at: u64,
) -> Flight {
    let Ready {
        mut out,
        registry,
        chunks,
        spans,
        max_payload,
    } = ready;
    let sent_at = Instant::now();
    let mut sent = Vec::with_capacity(out.len());
    for (key, (addr, produced)) in out.iter().filter(|(_, (_, p))| !p.is_empty()) {
        let acks = send_batches_under(js, addr, batches(produced), max_payload).await;
        sent.push((key.clone(), acks));
    }
    let events = out
        .values()
        .flat_map(|(_, produced)| produced.iter().map(|p| p.events.len()))
        .sum();
    let runs = out.keys().cloned().collect();
    let (js, open_runs) = (js.clone(), open_runs.clone());
    let landing = Box::pin(async move {
        // The events and the open-runs registry concurrently (each is a broker round
        // trip, and neither depends on the other).
        let record = futures::future::join_all(
            registry
                .values()
                .map(|(addr, open)| open_runs.record(addr, *open)),
        );
        let stored = async {
            let mut failed = BTreeSet::new();
            for (key, acks) in sent {
                let stored = match acks {
                    Ok(acks) => acks.await,
                    Err(e) => Err(e),
                };
                if let Err(e) = stored {
                    warn!(error = %e, attempt = 1, "publishing events failed; retrying");
                    failed.insert(key);
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            out.retain(|key, _| failed.contains(key));
            publish_runs(&js, &out, max_payload, 2..=PUBLISH_ATTEMPTS).await
        };
        let (stored, recorded) = futures::future::join(stored, record).await;
        stored?;
        recorded.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        Ok(())
    });
    Flight {
        landing,
        last,
        resume_at,
        runs,
        sent: sent_at,
        events,
        chunks,
        _spans: spans,
    }
}

/// Waits for the oldest flight to land, then takes it off the queue; `None` when there
/// is none. Cancel-safe: dropped before it lands, the flight stays first in the queue.
pub(crate) async fn land_front(
    flights: &mut VecDeque<Flight>,
) -> Option<(Flight, anyhow::Result<()>)> {
    let front = flights.front_mut()?;
    let landed = (&mut front.landing).await;
    flights.pop_front().map(|flight| (flight, landed))
}

fn batches(produced: &[Produced]) -> impl Iterator<Item = Batch<'_>> {
    produced.iter().map(|p| Batch {
        events: &p.events,
        trace: p.trace.as_ref(),
        made_by: p.made_by.as_ref(),
    })
}

/// Publishes the events of every run in `out`, runs concurrently, once per attempt in
/// `attempts` until all are stored. Re-publishing is harmless (message ids), so a run
/// whose publish failed (e.g. acks lost across a broker reconnect) is retried before the
/// batch fails.
async fn publish_runs(
    js: &async_nats::jetstream::Context,
    out: &BTreeMap<RunKey, RunBatches>,
    max_payload: usize,
    attempts: std::ops::RangeInclusive<usize>,
) -> anyhow::Result<()> {
    let mut pending: Vec<&RunBatches> = out
        .values()
        .filter(|(_, produced)| !produced.is_empty())
        .collect();
    let last_attempt = *attempts.end();
    for attempt in attempts {
        let results = futures::future::join_all(pending.iter().map(|(addr, produced)| {
            publish_batches_under(js, addr, batches(produced), max_payload)
        }))
        .await;
        let mut failed = Vec::new();
        let mut last_error = None;
        for (run, result) in pending.into_iter().zip(results) {
            if let Err(e) = result {
                failed.push(run);
                last_error = Some(e);
            }
        }
        pending = failed;
        match last_error {
            None => break,
            Some(e) if attempt >= last_attempt => return Err(e.into()),
            Some(e) => warn!(error = %e, attempt, "publishing events failed; retrying"),
        }
    }
    Ok(())
}

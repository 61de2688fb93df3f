//! Batches in flight: a consumer batch whose events are sent to SG_EVENTS and wait for
//! the broker's acks before the batch's raw chunks are acknowledged.
//!
//! A partition worker sends a batch's events and, while the broker stores them, applies
//! and sends the next batch — up to `NormalizerConfig::batches_in_flight` batches at
//! once — instead of idling a broker round trip per batch. The rules that keep this
//! exact:
//!
//! - **Sent in order.** A batch's messages are all queued on the connection before the
//!   next batch's ([`send`] returns only then), so when nothing fails a run's events
//!   reach the broker in seq order. A run whose publish failed is sent again later, after
//!   newer events of it may be stored; consumers take events in any order (§3).
//! - **Awaited at once.** Each run's acks are awaited by a task of its own as soon as
//!   they are sent, all of them together: async-nats holds a permit of the connection's
//!   publish window (5,000) per unawaited ack, so acks left waiting while the worker
//!   sends the next batch could starve every sender; and a reconnect that loses acks
//!   costs one timeout, not one per run.
//! - **Landed in order.** Only the oldest flight is waited on ([`land_front`]); a batch's
//!   raw chunks are acknowledged (one in-order ack) after its own events and every
//!   earlier batch's are stored. Its open-runs records are written after the earlier
//!   batch's (a run opened in one batch may close in the next).
//! - **A failure takes everything behind it.** When a flight fails, the worker forgets
//!   the runs of it and of every flight behind it (their state is past events that may
//!   not be stored) and makes a new incarnation from the first chunk not landed: those
//!   chunks come again and rebuild their runs from SG_RAW. Events of a later batch that
//!   were stored meanwhile are duplicates by seq, which the archive and projectors
//!   ignore (the same as a rebuild's re-published events).

use crate::open_runs::OpenRuns;
use crate::runs::RunKey;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::IntoFuture as _;
use std::time::Instant;
use streamgate_bus::events::{publish_batches_under, send_batches_under, Batch, MadeBy};
use streamgate_bus::subject::RunAddr;
use streamgate_bus::trace::TraceContext;
use streamgate_bus::BusError;
use streamgate_grammar::RunEvent;
use tokio::sync::oneshot;
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

/// A batch whose events are sent: it lands once the broker has stored them and its runs
/// are recorded.
pub(crate) struct Flight {
    /// The task awaiting the acks and writing the records (aborted with the flight).
    landing: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Fires once this batch's open-runs records are written: the next batch's wait
    /// for it ([`send`] takes it from the flight before).
    recorded: Option<oneshot::Receiver<()>>,
    /// The raw message whose in-order ack covers the batch (and every earlier one).
    pub last: async_nats::jetstream::Message,
    /// Where a new incarnation starts once this batch has landed.
    pub resume_at: u64,
    /// The runs whose state the batch moved: forgotten if it, or one before it, fails.
    pub runs: Vec<RunKey>,
    /// When its first event was sent.
    pub sent_at: Instant,
    /// Events it published and chunks it applied, for the counters once it lands.
    pub events: usize,
    pub chunks: u64,
    _spans: Vec<tracing::Span>,
}

impl Drop for Flight {
    fn drop(&mut self) {
        // A flight dropped unlanded (one before it failed, the partition was lost) stops
        // retrying; its acks' permits go back to the connection. No-op once landed.
        self.landing.abort();
    }
}

/// Sends the events of `ready` (every message queued on the connection before this
/// returns) and starts the task that lands it: awaiting their acks, and writing the
/// runs' open-runs records once `before`'s are written. A run whose send or acks failed
/// is sent again by that task, up to [`PUBLISH_ATTEMPTS`] in all.
pub(crate) async fn send(
    js: &async_nats::jetstream::Context,
    open_runs: &OpenRuns,
    ready: Ready,
    last: async_nats::jetstream::Message,
    resume_at: u64,
    before: Option<&mut Flight>,
) -> Flight {
    let Ready {
        out,
        registry,
        chunks,
        spans,
        max_payload,
    } = ready;
    let sent_at = Instant::now();
    let mut sent = Vec::with_capacity(out.len());
    for (key, (addr, produced)) in out.iter().filter(|(_, (_, p))| !p.is_empty()) {
        // Each run's acks awaited at once, by a task of its own: a long send never
        // holds the permits of acks that already came back.
        let acks = send_batches_under(js, addr, batches(produced), max_payload)
            .await
            .map(|acks| tokio::spawn(acks.into_future()));
        sent.push((key.clone(), acks));
    }
    let events = out
        .values()
        .flat_map(|(_, produced)| produced.iter().map(|p| p.events.len()))
        .sum();
    let runs = out.keys().cloned().collect();
    let records_after = before.and_then(|flight| flight.recorded.take());
    let (recorded_tx, recorded) = oneshot::channel();
    let (js, open_runs) = (js.clone(), open_runs.clone());
    let landing = tokio::spawn(async move {
        let stored = stored(&js, out, sent, max_payload);
        let recorded = record_in_order(&open_runs, registry, records_after, recorded_tx);
        let (stored, recorded) = futures::future::join(stored, recorded).await;
        stored.and(recorded)
    });
    Flight {
        landing,
        recorded: Some(recorded),
        last,
        resume_at,
        runs,
        sent_at,
        events,
        chunks,
        _spans: spans,
    }
}

/// A run's sent events: the task awaiting their acks, or why they could not be sent.
type Sent = (
    RunKey,
    Result<tokio::task::JoinHandle<Result<(), BusError>>, BusError>,
);

/// Waits until every run's events in `out` are stored: the acks of what [`send`] sent,
/// then the runs that failed sent again.
async fn stored(
    js: &async_nats::jetstream::Context,
    mut out: BTreeMap<RunKey, RunBatches>,
    sent: Vec<Sent>,
    max_payload: usize,
) -> anyhow::Result<()> {
    let results = futures::future::join_all(sent.into_iter().map(|(key, acks)| async {
        let failed = match acks {
            Ok(acks) => match acks.await {
                Ok(Ok(())) => return None,
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        Some((key, failed))
    }))
    .await;
    let mut failed = BTreeSet::new();
    for (key, e) in results.into_iter().flatten() {
        warn!(error = %e, attempt = 1, "publishing events failed; retrying");
        failed.insert(key);
    }
    if failed.is_empty() {
        return Ok(());
    }
    out.retain(|key, _| failed.contains(key));
    publish_runs(js, &out, max_payload, 2..=PUBLISH_ATTEMPTS).await
}

/// Writes the open-runs records of a batch once the batch before it has written its
/// own (`after`; dropped unsent when that flight was dropped — it failed, or the
/// partition went — and then this one is dropped too), and says so on `done`.
async fn record_in_order(
    open_runs: &OpenRuns,
    registry: BTreeMap<RunKey, (RunAddr, bool)>,
    after: Option<oneshot::Receiver<()>>,
    done: oneshot::Sender<()>,
) -> anyhow::Result<()> {
    if let Some(after) = after {
        let _ = after.await;
    }
    let recorded = futures::future::join_all(
        registry
            .values()
            .map(|(addr, open)| open_runs.record(addr, *open)),
    )
    .await;
    let _ = done.send(());
    recorded.into_iter().collect()
}

/// Waits for the oldest flight to land, then takes it off the queue; `None` when there
/// is none. Cancel-safe: dropped before it lands, the flight stays first in the queue.
pub(crate) async fn land_front(
    flights: &mut VecDeque<Flight>,
) -> Option<(Flight, anyhow::Result<()>)> {
    let front = flights.front_mut()?;
    let landed = match (&mut front.landing).await {
        Ok(landed) => landed,
        Err(e) => Err(anyhow::anyhow!("the batch's landing task ended: {e}")),
    };
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

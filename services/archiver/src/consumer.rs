//! SG_EVENTS → archive. Replicas share one durable consumer (the archive needs no per-run
//! order: `(tenant, run_id, seq)` is the key). Each batch is committed in one transaction and
//! acknowledged only after the commit, so a crash at any point loses nothing and the
//! redelivered tail is absorbed by the store's idempotent insert.

use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use streamgate_archive::{
    ArchiveError, ArchivedEvent, Provenance, RawChunkRecord, RunProvenance, Store,
};
use streamgate_bus::consume::durable_pull;
use streamgate_bus::events::{decode_msg, MadeBy};
use streamgate_bus::raw::RawChunk;
use streamgate_bus::trace;
use streamgate_bus::{EVENTS_STREAM, RAW_STREAM};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Batches handed to the store and not yet acknowledged, at most, when the store commits
/// them in the order they were handed over ([`Store::commits_in_submission_order`]): one
/// committing and one waiting behind it keep the store's writer busy, and more would only
/// hold messages longer without a shorter wait. (On SQLite a batch's reply also waits for
/// its WAL sync, while the next one commits: the writer idles only where a sync, 0.3–5 ms
/// on this project's machines, outlasts a commit, that is at light loads, where it has
/// time to spare.) Other stores get one at a time.
const COMMITS_IN_FLIGHT: usize = 2;

/// Called with every batch right after it is committed (before the ack): the hook
/// benchmarks and tests use to observe commit latency.
#[derive(Clone)]
pub struct CommitHook(pub Arc<CommitFn>);

/// The function a [`CommitHook`] calls.
pub type CommitFn = dyn Fn(&[ArchivedEvent]) + Send + Sync;

impl std::fmt::Debug for CommitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitHook")
    }
}

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Durable consumer name shared by replicas.
    pub durable: String,
    /// Messages per transaction at most.
    pub batch: usize,
    /// The shortest time between two batches taken from the broker, by the events
    /// consumer and (with `archive_raw`) by the raw one. A batch is handed to the store as
    /// it is taken, and batches that queue behind a commit share the next transaction, so
    /// this also spaces the commits. Every commit rewrites the
    /// archive pages of each run it touches (and, on SQLite, fsyncs), so at a modest load
    /// committing as soon as anything arrives writes each page many times over: at 20k
    /// events/s on the bench's 32 runs, 330 commits/s wrote ~90 MB/s of WAL for 5 MB/s of
    /// input, and the disk stalled the whole box. A few milliseconds here add at most that
    /// much to ingest→commit (live views read SG_EVENTS, not the archive) and divide the
    /// writes. A full batch is followed at once (it is a backlog, and waiting would cap a
    /// replica at `batch` messages per interval); zero commits whatever has arrived as
    /// soon as the last commit is done.
    pub commit_interval: Duration,
    /// Broker redelivery timeout.
    pub ack_wait: Duration,
    /// Unacknowledged messages the broker lets this consumer hold.
    pub max_ack_pending: i64,
    /// Also archive raw chunks from SG_RAW.
    pub archive_raw: bool,
    /// Observer of committed batches.
    pub on_commit: Option<CommitHook>,
    /// Retention policies (none: keep everything).
    pub retention: crate::retention::Policies,
    /// How often retention is enforced.
    pub retention_interval: Duration,
    /// Continuous export of ended runs as GenAI traces (off: `None`).
    pub export_otlp: Option<crate::genai::follow::FollowConfig>,
    /// Index ended runs' thinking for `runs --search --thinking` ([`crate::thinking`]).
    pub search_thinking: bool,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            durable: "sg-archiver".to_owned(),
            batch: 1024,
            commit_interval: Duration::from_millis(10),
            ack_wait: Duration::from_secs(10),
            max_ack_pending: 50_000,
            archive_raw: false,
            on_commit: None,
            retention: crate::retention::Policies::default(),
            retention_interval: Duration::from_secs(3600),
            export_otlp: None,
            search_thinking: false,
        }
    }
}

/// A durable consumer's messages in batches, pulling.
pub type Batches = futures::stream::ReadyChunks<async_nats::jetstream::consumer::pull::Stream>;

/// The archiver's consumers, pulling: what [`open_consumers`] hands to the loops.
pub struct Consumers {
    /// SG_EVENTS, for [`run_events`].
    pub events: Batches,
    /// SG_RAW with `archive_raw`, for [`run_raw`].
    pub raw: Option<Batches>,
}

/// Makes (or finds) the archiver's consumers — SG_EVENTS, and SG_RAW with `archive_raw` —
/// and starts pulling from them. The archiver opens them before it spawns their loops
/// ([`crate::start`]), so a JetStream timeout here fails the start, which the service
/// retries (`streamgate_runtime::startup`), instead of a running task. Both consumers
/// are made before either pulls, so a start that fails on the second leaves nothing
/// delivered to a pull it drops.
pub async fn open_consumers(
    js: &async_nats::jetstream::Context,
    cfg: &ConsumerConfig,
) -> anyhow::Result<Consumers> {
    let made = |stream: &'static str, durable: String, filter: &str| {
        let filters = vec![filter.to_owned()];
        async move {
            durable_pull(
                js,
                stream,
                &durable,
                filters,
                cfg.ack_wait,
                cfg.max_ack_pending,
            )
            .await
        }
    };
    let events = made(EVENTS_STREAM, cfg.durable.clone(), "sg.evt.>").await?;
    let raw = match cfg.archive_raw {
        true => Some(made(RAW_STREAM, format!("{}-raw", cfg.durable), "sg.raw.>").await?),
        false => None,
    };
    let pull = |consumer| streamgate_bus::consume::batches(consumer, cfg.batch);
    let consumers = Consumers {
        events: pull(&events).await?,
        raw: match &raw {
            Some(raw) => Some(pull(raw).await?),
            None => None,
        },
    };
    info!(durable = %cfg.durable, raw = cfg.archive_raw, "archiver consuming SG_EVENTS");
    Ok(consumers)
}

/// Archives what the SG_EVENTS consumer ([`open_consumers`]) delivers until `shutdown`.
/// The batch in flight is committed and acknowledged before it returns, unless the store
/// is down at that moment: then the batch is left unacknowledged and the broker
/// redelivers it after `ack_wait`. Returns an error when the store cannot take writes
/// again ([`ArchiveError::is_permanent`]): the archiver then exits, for a restart,
/// instead of retrying for ever.
pub async fn run_events(
    mut batches: Batches,
    store: Arc<dyn Store>,
    cfg: ConsumerConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Commits in flight: the next batch is pulled and decoded while the store commits the
    // last one, and batches that queue behind a commit share the next transaction (the
    // store's group commit). One at a time, the writer idled through every pull, decode
    // and ack, and the archiver's pace was commit + everything else (docs/performance.md,
    // fourteenth stop).
    let max_in_flight = if store.commits_in_submission_order() {
        COMMITS_IN_FLIGHT
    } else {
        1
    };
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut next_commit = tokio::time::Instant::now();
    loop {
        // At most one batch per `commit_interval` (what arrives meanwhile joins the next
        // one) unless batches come full; the first message after a quiet spell is taken
        // at once. With `max_in_flight` batches unfinished, nothing more is pulled: the
        // broker holds the rest.
        let may_pull = in_flight.len() < max_in_flight;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(done) = in_flight.next(), if !in_flight.is_empty() => { done?; continue }
            () = tokio::time::sleep_until(next_commit), if may_pull => {}
        }
        let batch = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(done) = in_flight.next(), if !in_flight.is_empty() => { done?; continue }
            b = batches.next() => match b { Some(b) => b, None => break },
        };
        next_commit = next_commit_after(&batch, &cfg);
        in_flight.push(archive(&*store, &cfg, &shutdown, Taken::decode(batch)));
    }
    // What was taken is committed and acknowledged (or, with the store down at shutdown,
    // left for redelivery) before the consumer returns.
    while let Some(done) = in_flight.next().await {
        done?;
    }
    pull_ended_by(&shutdown, "SG_EVENTS")?;
    info!("archiver consumer stopped");
    Ok(())
}

/// When the batch after `batch` may be taken: at once after a backlog (a full batch, or
/// the broker reporting more pending after its last message), else `commit_interval`
/// from now, so that what arrives meanwhile joins one commit.
fn next_commit_after<E>(
    batch: &[Result<async_nats::jetstream::Message, E>],
    cfg: &ConsumerConfig,
) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    if batch.len() >= cfg.batch.max(1) || streamgate_bus::consume::more_pending(batch) {
        now
    } else {
        now.checked_add(cfg.commit_interval).unwrap_or(now)
    }
}

/// One consumer batch, decoded.
struct Taken {
    msgs: Vec<async_nats::jetstream::Message>,
    events: Vec<ArchivedEvent>,
    provenances: Vec<RunProvenance>,
    /// One span per message, open until its events are committed and acked: the
    /// archive's step of the trace the message carries.
    spans: Vec<tracing::Span>,
}

impl Taken {
    fn decode<E>(batch: Vec<Result<async_nats::jetstream::Message, E>>) -> Taken {
        let (taken_ms, decoding) = (
            streamgate_runtime::clock::now_ms(),
            std::time::Instant::now(),
        );
        let msgs: Vec<_> = batch.into_iter().filter_map(Result::ok).collect();
        let mut events = Vec::with_capacity(msgs.len());
        let mut made_by = Provenances::default();
        let mut spans = Vec::with_capacity(msgs.len());
        for m in &msgs {
            let span = streamgate_runtime::hop_span!("archive", subject = %m.subject);
            trace::follow(&span, trace::extract_context(m.headers.as_ref()));
            spans.push(span);
            // A batch message's events share its journal position (ties go by run, seq).
            let journal_seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
            match decode_msg(m) {
                Ok(evs) => {
                    if let (Some(first), Some(by)) = (evs.first(), MadeBy::read(m.headers.as_ref()))
                    {
                        made_by.add(&first.envelope.tenant, &first.envelope.run_id, by);
                    }
                    events.extend(
                        evs.into_iter()
                            .map(|event| ArchivedEvent { event, journal_seq }),
                    );
                }
                Err(e) => {
                    metrics::counter!("streamgate_archiver_undecodable_total").increment(1);
                    warn!(error = %e, subject = %m.subject, "undecodable event skipped");
                }
            }
        }
        record_since_ingest("streamgate_archiver_pull_wait_seconds", &events, taken_ms);
        record_step("decode", decoding.elapsed());
        Taken {
            msgs,
            events,
            provenances: made_by.into_vec(),
            spans,
        }
    }
}

/// Commits one batch, retrying while the store is down, then acknowledges it; gives up
/// unacknowledged on shutdown, or with the error when the store cannot take writes again.
async fn archive(
    store: &dyn Store,
    cfg: &ConsumerConfig,
    shutdown: &CancellationToken,
    taken: Taken,
) -> Result<(), ArchiveError> {
    let Taken {
        msgs,
        events,
        provenances,
        spans,
    } = taken;
    let mut committing = std::time::Instant::now();
    loop {
        // The events and their provenance in one transaction, before the ack; both
        // idempotent, so a retry or a redelivery repeats them harmlessly.
        match store
            .insert_batch_with_provenance(&events, &provenances)
            .await
        {
            Ok(outcome) => {
                record_step("commit", committing.elapsed());
                metrics::counter!("streamgate_archiver_events_inserted_total")
                    .increment(outcome.inserted);
                record_commit_latency(&events);
                metrics::counter!("streamgate_archiver_duplicates_total")
                    .increment(outcome.duplicates);
                metrics::counter!("streamgate_archiver_conflicts_total")
                    .increment(outcome.conflicts);
                if let Some(hook) = &cfg.on_commit {
                    (hook.0)(&events);
                }
                break;
            }
            Err(e) if e.is_permanent() => {
                error!(error = %e, "the archive cannot take writes again; the archiver stops (the batch stays unacknowledged)");
                return Err(e);
            }
            Err(e) => {
                // The store is down: hold the batch (the broker holds the rest) and
                // retry; nothing is acknowledged before it is committed.
                warn!(error = %e, "archive commit failed; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
                committing = std::time::Instant::now();
            }
        }
    }
    let acking = std::time::Instant::now();
    for m in &msgs {
        if let Err(e) = m.ack().await {
            warn!(error = %e, "ack failed; the batch tail will be redelivered (idempotent)");
        }
    }
    record_step("ack", acking.elapsed());
    drop(spans);
    Ok(())
}

/// What made the runs of one consumer batch, one entry per run (the lowest versions when
/// its messages disagree, as the store keeps them). Ordered by run, as the batch's rows
/// are, so two replicas' transactions take `runs` row locks in key order at each step
/// (a deadlock PostgreSQL still finds is rolled back, and the batch retried).
#[derive(Default)]
struct Provenances(std::collections::BTreeMap<(String, String), MadeBy>);

impl Provenances {
    /// The store's rule, per field: the adapter (name and version) of the lowest adapter
    /// version seen, and the lowest grammar version seen — each on its own, since one
    /// message can carry the lower adapter version and another the lower grammar version.
    fn add(&mut self, tenant: &str, run_id: &str, by: MadeBy) {
        let key = (tenant.to_owned(), run_id.to_owned());
        match self.0.get_mut(&key) {
            Some(seen) => {
                if by.adapter_version < seen.adapter_version {
                    seen.adapter = by.adapter;
                    seen.adapter_version = by.adapter_version;
                }
                seen.grammar_version = seen.grammar_version.min(by.grammar_version);
            }
            None => {
                self.0.insert(key, by);
            }
        }
    }

    fn into_vec(self) -> Vec<RunProvenance> {
        self.0
            .into_iter()
            .map(|((tenant, run_id), by)| RunProvenance {
                tenant,
                run_id,
                provenance: Provenance {
                    adapter: by.adapter,
                    adapter_version: by.adapter_version,
                    grammar_version: by.grammar_version,
                },
            })
            .collect()
    }
}

/// Archives what the optional SG_RAW consumer ([`open_consumers`]) delivers until
/// `shutdown`.
pub async fn run_raw(
    mut batches: Batches,
    store: Arc<dyn Store>,
    cfg: ConsumerConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Paced like the events: one commit per `commit_interval` unless a backlog waits. A
    // commit per batch as it came made a commit (and an fsync) of nearly every chunk at a
    // live pace, and the archive wrote a third more (docs/performance.md, twenty-fifth
    // stop).
    let mut next_commit = tokio::time::Instant::now();
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep_until(next_commit) => {}
        }
        let batch = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            b = batches.next() => match b { Some(b) => b, None => break },
        };
        next_commit = next_commit_after(&batch, &cfg);
        let msgs: Vec<_> = batch.into_iter().filter_map(Result::ok).collect();
        let records: Vec<RawChunkRecord> = msgs
            .iter()
            .filter_map(|m| RawChunk::from_message(m).ok())
            .map(crate::convert::raw_record)
            .collect();
        while let Err(e) = store.insert_raw(&records).await {
            if e.is_permanent() {
                error!(error = %e, "the archive cannot take raw chunks again; the raw consumer stops");
                return Err(e.into());
            }
            warn!(error = %e, "raw archive commit failed; retrying");
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        for m in &msgs {
            let _ = m.ack().await;
        }
    }
    pull_ended_by(&shutdown, "SG_RAW")
}

/// After a consumer's loop: fine on shutdown, else an error, since the pull ended by
/// itself (the broker deleted the consumer) and the archive would silently fall behind;
/// the archiver exits and its next start makes the consumer again.
fn pull_ended_by(shutdown: &CancellationToken, stream: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        shutdown.is_cancelled(),
        "the archiver's pull on {stream} ended by itself (its consumer was deleted?)"
    );
    Ok(())
}

/// Records the time a consumer batch spent in one of the archiver's steps
/// (`streamgate_archiver_batch_seconds`; a failed commit's retries are not counted in).
fn record_step(step: &'static str, took: Duration) {
    metrics::histogram!("streamgate_archiver_batch_seconds", "step" => step)
        .record(took.as_secs_f64());
}

/// Ingest → commit, per event of a committed batch (the envelope carries the chunk's
/// ingest time).
fn record_commit_latency(events: &[ArchivedEvent]) {
    let now_ms = streamgate_runtime::clock::now_ms();
    record_since_ingest("streamgate_archive_commit_latency_seconds", events, now_ms);
}

/// Records, in histogram `name`, the time from each event's ingest (its envelope's
/// timestamp) to `now_ms`.
fn record_since_ingest(name: &'static str, events: &[ArchivedEvent], now_ms: i64) {
    let histogram = metrics::histogram!(name);
    for e in events {
        let ms = now_ms.saturating_sub(e.event.envelope.ts_ms).max(0);
        histogram.record(ms as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(adapter: &str, adapter_version: u32, grammar_version: u32) -> MadeBy {
        MadeBy {
            adapter: adapter.to_owned(),
            adapter_version,
            grammar_version,
        }
    }

    #[test]
    fn a_batch_keeps_the_lowest_adapter_and_the_lowest_grammar_each_on_its_own() {
        let mut seen = Provenances::default();
        seen.add("t", "r", by("f1", 3, 2));
        // Lower grammar, higher adapter: only the grammar version moves.
        seen.add("t", "r", by("f1e", 4, 1));
        // Lower adapter, higher grammar: the adapter (name and version) moves.
        seen.add("t", "r", by("f1/old", 2, 5));
        seen.add("t", "other", by("f2", 9, 9));
        let mut stamps = seen.into_vec();
        stamps.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        let got: Vec<_> = stamps
            .iter()
            .map(|s| {
                let p = &s.provenance;
                (
                    s.run_id.as_str(),
                    p.adapter.as_str(),
                    p.adapter_version,
                    p.grammar_version,
                )
            })
            .collect();
        assert_eq!(got, [("other", "f2", 9, 9), ("r", "f1/old", 2, 1)]);
    }
}

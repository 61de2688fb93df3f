//! The normalization worker: SG_RAW → per-run adapters → SG_EVENTS.
//!
//! Replicas split the partitions with leases (`streamgate_bus::lease`, group
//! `normalizer`): each held partition has a worker of its own, with its own run table
//! and a consumer of its own (filter `sg.raw.*.<p>.*`) — an incarnation of
//! `<durable>-pNN` (`streamgate_bus::incarnation`) made when the worker starts, right
//! after the lowest ack floor the partition's earlier consumers left, so a run's chunks
//! reach one replica only and a new owner resumes where the last one stopped.
//! A released partition's worker drains: the batch in hand and what is already
//! buffered are processed and acknowledged before the lease goes. A lost partition's
//! worker is aborted; what it had not acknowledged is delivered again to the next owner,
//! which rebuilds the run from SG_RAW (docs/architecture.md §4).
//!
//! Messages are taken in batches. Each batch is applied to the run table in stream order
//! (which is per-run chunk order), the events the batch's chunks of one run yield are
//! published together (one SG_EVENTS message unless size splits it,
//! `streamgate_bus::events`) and acknowledged by the broker, and only then is the batch
//! acknowledged — with one ack, in order (`AckPolicy::All`): the broker's work per chunk
//! is a third less than with an ack per message (docs/performance.md). That ack covers
//! every earlier message of the partition, so the worker checks that deliveries arrive
//! without a gap (consumer sequences 1, 2, 3, …) and acknowledges only the whole prefix;
//! after a gap, a batch that failed or its consumer deleted, it makes a new incarnation
//! from the first chunk not processed. A crash anywhere before the ack means the chunks
//! are delivered again and their events re-published — duplicates (by seq) the archive
//! and projectors ignore.

use crate::config::NormalizerConfig;
use crate::open_runs::OpenRuns;
use crate::runs::{Applied, RunBudget, RunKey, RunTable};
use async_nats::jetstream::consumer::pull::{MessagesError, MessagesErrorKind};
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::{FutureExt as _, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use streamgate_bus::consume::{read_subject, start_after_legacy};
use streamgate_bus::events::{publish_batches_under, Batch, MadeBy};
use streamgate_bus::incarnation::{self, Start};
use streamgate_bus::lease::{group_key, LeaseConfig, PartitionLeases, PartitionWork};
use streamgate_bus::raw::{publish_raw, RawChunk};
use streamgate_bus::subject::{partition_durable, raw_partition_filter, RunAddr};
use streamgate_bus::trace::{self, TraceContext};
use streamgate_bus::{ensure_streams, RAW_STREAM};
use streamgate_grammar::RunEvent;
use streamgate_wire::Family;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use streamgate_runtime::clock::now_ms;

/// The lease group of the normalizer's partitions.
pub fn lease_group() -> String {
    group_key(&["normalizer"])
}

/// A normalizer worker that has joined its lease group, not yet working.
pub struct Worker {
    js: async_nats::jetstream::Context,
    cfg: NormalizerConfig,
    partitions: u32,
    leases: PartitionLeases,
    open_runs: OpenRuns,
}

impl Worker {
    /// Provisions the streams and opens the lease bucket.
    pub async fn open(
        js: async_nats::jetstream::Context,
        cfg: NormalizerConfig,
        partitions: u32,
    ) -> anyhow::Result<Worker> {
        let partitions = partitions.max(1);
        let streams = streamgate_bus::StreamSettings {
            partitions,
            ..cfg.streams.clone()
        };
        ensure_streams(&js, &streams).await?;
        let lease_js = cfg
            .lease_nats
            .clone()
            .map_or_else(|| js.clone(), async_nats::jetstream::new);
        let leases = PartitionLeases::open(
            &lease_js,
            LeaseConfig {
                group: lease_group(),
                partitions,
                ttl: cfg.lease_ttl,
                replicas: cfg.streams.replicas,
                member: None,
            },
        )
        .await?;
        let open_runs = OpenRuns::open(&js, partitions, &cfg.streams).await?;
        Ok(Worker {
            js,
            cfg,
            partitions,
            leases,
            open_runs,
        })
    }

    /// The partitions this replica holds (changes as leases come and go).
    pub fn partitions(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.leases.held()
    }

    /// This replica's member id in the lease group.
    pub fn member(&self) -> &str {
        self.leases.member()
    }

    /// Works on this replica's share of the partitions until `shutdown` fires; then every
    /// partition drains and its lease is released.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Worker {
            js,
            cfg,
            partitions,
            leases,
            open_runs,
        } = self;
        let budget = RunBudget::new(cfg.max_open_runs);
        info!(member = %leases.member(), partitions, "normalizer joining the lease group");
        leases
            .run(shutdown, move |work: PartitionWork| {
                partition_worker(
                    js.clone(),
                    cfg.clone(),
                    partitions,
                    budget.clone(),
                    open_runs.clone(),
                    work,
                )
            })
            .await?;
        info!("normalizer stopped");
        Ok(())
    }
}

/// Runs the worker until `shutdown` fires; in-flight batches finish (drain) first.
pub async fn run(
    js: async_nats::jetstream::Context,
    cfg: NormalizerConfig,
    partitions: u32,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    Worker::open(js, cfg, partitions).await?.run(shutdown).await
}

/// One partition: its consumer (an [`incarnation`] of `<durable>-pNN`), its run table,
/// its idle reaper.
async fn partition_worker(
    js: async_nats::jetstream::Context,
    cfg: NormalizerConfig,
    partitions: u32,
    budget: RunBudget,
    open_runs: OpenRuns,
    work: PartitionWork,
) -> anyhow::Result<()> {
    let p = work.partition;
    let mut part = Partition::start(js, cfg, partitions, budget, open_runs, p).await?;
    let mut idle_tick = tokio::time::interval(part.cfg.idle_check);
    idle_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep_tick =
        tokio::time::interval_at(tokio::time::Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
    sweep_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    debug!(partition = p, consumer = %part.pulling.name, "consuming partition");
    loop {
        // The ticks before the batches: under a backlog a batch is always ready.
        tokio::select! {
            biased;
            () = work.release.cancelled() => break,
            _ = sweep_tick.tick() => part.sweep().await,
            _ = idle_tick.tick() => part.reap_idle().await,
            batch = part.pulling.messages.next() => {
                let Some(batch) = batch else {
                    warn!(partition = p, consumer = %part.pulling.name, "the partition's pull ended; starting over");
                    break;
                };
                if part.take(batch, &work.release).await? == Taken::Released {
                    // Released while waiting for a new incarnation: what the old one
                    // still holds must not be acknowledged (the ack would cover the
                    // chunks it is made again for); the next owner starts before them.
                    return Ok(());
                }
            }
        }
    }
    part.drain().await;
    debug!(partition = p, "partition drained");
    Ok(())
}

/// What a partition worker holds.
struct Partition {
    js: async_nats::jetstream::Context,
    cfg: NormalizerConfig,
    spec: incarnation::Spec,
    open_runs: OpenRuns,
    budget: RunBudget,
    table: RunTable,
    pulling: Pulling,
    /// New incarnations since the last batch that moved the partition on.
    reopens: u32,
}

/// Whether [`Partition::take`] may go on.
#[derive(Debug, PartialEq, Eq)]
enum Taken {
    Go,
    /// The partition was released while a new incarnation was waited for.
    Released,
}

impl Partition {
    /// Makes the partition's first incarnation and adopts the runs left open in it.
    async fn start(
        js: async_nats::jetstream::Context,
        cfg: NormalizerConfig,
        partitions: u32,
        budget: RunBudget,
        open_runs: OpenRuns,
        p: u32,
    ) -> anyhow::Result<Partition> {
        // The process-wide backpressure bound, split over the partitions; never below
        // two pull batches, which keeps one pull in flight while the previous is
        // processed.
        let max_ack_pending = (cfg.max_ack_pending / i64::from(partitions))
            .max(2 * i64::try_from(cfg.batch).unwrap_or(i64::MAX));
        let spec = incarnation::Spec {
            stream: RAW_STREAM.to_owned(),
            base: partition_durable(&cfg.durable, partitions, p),
            filter: raw_partition_filter(p),
            ack_wait: cfg.ack_wait,
            max_ack_pending,
        };
        // A deployment upgraded from the single shared consumer `<durable>` resumes
        // where that one was acknowledged, not at the start of SG_RAW.
        let legacy = match start_after_legacy(&js, RAW_STREAM, &cfg.durable).await? {
            DeliverPolicy::ByStartSequence { start_sequence } => Some(start_sequence),
            _ => None,
        };
        let pulling = Pulling::open(&js, &spec, Start::Resume(legacy), cfg.batch).await?;
        let mut table = RunTable::with_budget(budget.clone());
        adopt_open_runs(&js, &open_runs, p, &mut table).await;
        Ok(Partition {
            js,
            cfg,
            spec,
            open_runs,
            budget,
            table,
            pulling,
            reopens: 0,
        })
    }

    /// Applies a batch; then, when it says so, makes a new incarnation from
    /// [`Pulling::resume_at`] — at once the first time, later each time a cause persists
    /// (SG_EVENTS full, a gap that keeps coming), up to the ack wait.
    async fn take(
        &mut self,
        batch: Vec<Result<async_nats::jetstream::Message, MessagesError>>,
        release: &CancellationToken,
    ) -> anyhow::Result<Taken> {
        let resume_before = self.pulling.resume_at;
        let next = self.apply(batch).await;
        if self.pulling.resume_at > resume_before {
            self.reopens = 0;
        }
        let Some(least) = self.needs_new_incarnation(next).await else {
            return Ok(Taken::Go);
        };
        let wait = least.max(reopen_backoff(self.reopens, self.cfg.ack_wait));
        tokio::select! {
            () = release.cancelled() => return Ok(Taken::Released),
            () = tokio::time::sleep(wait) => {}
        }
        self.reopens += 1;
        let start = Start::At(self.pulling.resume_at);
        self.pulling = Pulling::open(&self.js, &self.spec, start, self.cfg.batch).await?;
        debug!(consumer = %self.pulling.name, "consuming partition again");
        Ok(Taken::Go)
    }

    /// Applies, publishes and acknowledges a batch ([`handle_batch`]).
    async fn apply(
        &mut self,
        batch: Vec<Result<async_nats::jetstream::Message, MessagesError>>,
    ) -> Next {
        handle_batch(
            &self.js,
            &self.open_runs,
            &mut self.table,
            &self.budget,
            &mut self.pulling,
            batch,
        )
        .await
    }

    /// Whether, after a batch that said `next`, the partition needs a new incarnation,
    /// and the least wait before it. Nothing processed is lost by one, and the run
    /// table takes nothing twice.
    async fn needs_new_incarnation(&mut self, next: Next) -> Option<Duration> {
        let deleted = match next {
            Next::Pull => return None,
            Next::Reopen => return Some(Duration::ZERO),
            Next::Deleted => true,
            Next::Check => consumer_gone(&self.js, &self.pulling.name).await,
        };
        if deleted {
            warn!(consumer = %self.pulling.name, "the partition's consumer was deleted; making a new one");
            return Some(REMAKE_DELETED_AFTER);
        }
        // Still there: pull again at once rather than wait out the lost pull's expiry.
        // Deliveries of the old pull that no longer arrive show up as a gap.
        self.pulling.pull_again(self.cfg.batch).await;
        None
    }

    /// Deletes incarnations an overlapping owner left behind (it made one, then was
    /// stopped before deleting the others): they would pull the next owner's start back
    /// and mislead the lag gauge. (`&mut`: the run table is not `Sync`.)
    async fn sweep(&mut self) {
        if let Err(e) = incarnation::delete_others(&self.js, &self.spec, &self.pulling.name).await {
            debug!(error = %e, "cannot sweep old consumer incarnations");
        }
    }

    /// Writes the timeout close marker of this partition's idle runs (another replica's
    /// are its business).
    async fn reap_idle(&mut self) {
        for marker in self.table.idle_closes(self.cfg.idle_timeout, now_ms()) {
            info!(run = %marker.addr.run_id, "run idle: writing timeout close marker");
            if let Err(e) = publish_raw(&self.js, &marker).await {
                warn!(error = %e, run = %marker.addr.run_id, "cannot write timeout close marker");
            }
        }
    }

    /// Released: what the consumer already handed us is processed and acknowledged too,
    /// rather than left to the next owner.
    async fn drain(mut self) {
        while let Some(Some(batch)) = self.pulling.messages.next().now_or_never() {
            let next = self.apply(batch).await;
            if next != Next::Pull {
                break;
            }
        }
        // The last ack on its way before the lease goes: the next owner starts after it.
        if let Err(e) = self.js.client().flush().await {
            debug!(error = %e, "cannot flush the last ack");
        }
    }
}

/// A partition's current consumer incarnation, and how far what it delivered is known to
/// be whole.
struct Pulling {
    name: String,
    consumer: async_nats::jetstream::consumer::PullConsumer,
    messages: futures::stream::ReadyChunks<PullStream>,
    /// The consumer sequence the next delivery must carry. Any other means a delivery
    /// never arrived (lost on a reconnect, dropped as a slow consumer), and an in-order
    /// ack past it would cover a chunk nobody processed.
    next_delivery: u64,
    /// The stream sequence a new incarnation starts at: everything of the partition
    /// before it was processed (and its ack sent; a lost ack is covered by the next).
    resume_at: u64,
}

type PullStream = async_nats::jetstream::consumer::pull::Stream;

impl Pulling {
    async fn open(
        js: &async_nats::jetstream::Context,
        spec: &incarnation::Spec,
        start: Start,
        batch: usize,
    ) -> anyhow::Result<Pulling> {
        let made = incarnation::open(js, spec, start).await?;
        let messages = streamgate_bus::consume::batches(&made.consumer, batch).await?;
        Ok(Pulling {
            name: made.name,
            consumer: made.consumer,
            messages,
            next_delivery: 1,
            resume_at: made.start,
        })
    }

    /// A new pull on the same incarnation (the old one's requests are dropped).
    async fn pull_again(&mut self, batch: usize) {
        match streamgate_bus::consume::batches(&self.consumer, batch).await {
            Ok(messages) => self.messages = messages,
            Err(e) => debug!(consumer = %self.name, error = %e, "cannot pull again yet"),
        }
    }
}

/// What a partition worker does after a batch.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Go on pulling.
    Pull,
    /// Make a new incarnation from [`Pulling::resume_at`]: a delivery never arrived, or
    /// the batch failed. Its chunks come again from the new one.
    Reopen,
    /// The consumer was deleted under a waiting pull.
    Deleted,
    /// The broker did not answer a pull (no responders, missed heartbeats): the consumer
    /// may be gone — deleted while no pull of ours was waiting — or the broker away.
    Check,
}

/// How often a partition worker deletes consumer incarnations other than its own.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How long to wait before the new incarnation after `reopens` earlier ones that moved
/// nothing on: none the first time, then 200 ms doubling up to `cap`.
fn reopen_backoff(reopens: u32, cap: Duration) -> Duration {
    match reopens {
        0 => Duration::ZERO,
        n => Duration::from_millis(200)
            .saturating_mul(1 << (n - 1).min(16))
            .min(cap),
    }
}

/// How long a worker whose consumer was deleted waits before it makes a new one. When
/// the deleter is a new owner of the partition (this replica's lease was lost and it has
/// not noticed yet), each would otherwise delete the other's consumer back to back until
/// the lease runner stops this worker.
const REMAKE_DELETED_AFTER: Duration = Duration::from_secs(1);

/// Whether the broker says the consumer `name` does not exist (not when it cannot say).
async fn consumer_gone(js: &async_nats::jetstream::Context, name: &str) -> bool {
    use async_nats::jetstream::context::ConsumerInfoErrorKind;
    match js.get_stream(RAW_STREAM).await {
        Ok(stream) => matches!(
            stream.consumer_info(name).await,
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound
        ),
        Err(_) => false,
    }
}

/// Hands the runs left open in partition `p` (by a previous owner, or this replica before
/// a restart) to the idle reaper, timed from their last chunk: a run whose producer is
/// gone still gets its one timeout close marker. Best effort: a failure is logged, and
/// the runs are then known only once a chunk of theirs arrives.
async fn adopt_open_runs(
    js: &async_nats::jetstream::Context,
    open_runs: &OpenRuns,
    p: u32,
    table: &mut RunTable,
) {
    let adopted = async {
        let raw = js.get_stream(RAW_STREAM).await?;
        let mut adopted = 0usize;
        for addr in open_runs.in_partition(p).await? {
            let last = match raw
                .get_last_raw_message_by_subject(&addr.raw_subject())
                .await
            {
                Ok(m) => RawChunk::from_stream_message(&m).ok(),
                Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => None,
                Err(e) => return Err(e.into()),
            };
            match last {
                Some(last) if last.close.is_none() => {
                    table.watch_idle(&last, now_ms());
                    adopted += 1;
                }
                // Closed (its close marker may still be on its way through the consumer,
                // which deletes the entry too), or gone from SG_RAW: nothing to reap.
                _ => open_runs.record(&addr, false).await?,
            }
        }
        anyhow::Ok(adopted)
    };
    match adopted.await {
        Ok(0) => {}
        Ok(n) => info!(
            partition = p,
            runs = n,
            "watching runs left open for idleness"
        ),
        Err(e) => warn!(partition = p, error = %e, "cannot read the partition's open runs"),
    }
}

async fn handle_batch(
    js: &async_nats::jetstream::Context,
    open_runs: &OpenRuns,
    table: &mut RunTable,
    budget: &RunBudget,
    pulling: &mut Pulling,
    batch: Vec<Result<async_nats::jetstream::Message, MessagesError>>,
) -> Next {
    let (msgs, highest, mut next) = whole_prefix(&mut pulling.next_delivery, &pulling.name, batch);
    if let Some((last, highest)) = highest {
        let (last, resume_at) = (&msgs[last], highest + 1);
        match process_batch(js, open_runs, table, &msgs).await {
            Ok(()) => {
                // In order: this ack covers every message of the batch (and of the
                // partition) before it.
                let acking = Instant::now();
                if let Err(e) = last.ack().await {
                    warn!(error = %e, "raw ack failed; the next one covers it");
                }
                record_step("ack", acking.elapsed());
                pulling.resume_at = pulling.resume_at.max(resume_at);
            }
            Err(e) => {
                // Nothing of the failed batch was acknowledged: a new incarnation
                // delivers it again.
                warn!(error = %e, "batch failed; it will be delivered again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                // Whatever else the batch said (a missed heartbeat after its messages, a
                // gap): the next ack would cover these chunks, so never go on with this
                // incarnation — unless it is gone anyway.
                if next != Next::Deleted {
                    next = Next::Reopen;
                }
            }
        }
    }
    table.trim();
    metrics::gauge!("streamgate_normalizer_open_runs").set(budget.used() as f64);
    next
}

/// The messages of `batch` up to the first one that does not follow the last delivery
/// of `consumer` (`next_delivery`, [`Pulling::next_delivery`]); which of them has the
/// highest stream sequence, and that sequence (the one whose ack covers them all; a
/// redelivery can come after a later chunk); and what to do after them. Each reply
/// subject is read once.
fn whole_prefix(
    next_delivery: &mut u64,
    consumer: &str,
    batch: Vec<Result<async_nats::jetstream::Message, MessagesError>>,
) -> (
    Vec<async_nats::jetstream::Message>,
    Option<(usize, u64)>,
    Next,
) {
    let mut msgs = Vec::with_capacity(batch.len());
    let mut highest: Option<(usize, u64)> = None;
    let mut next = Next::Pull;
    for m in batch {
        match m {
            Ok(m) => match m.info().map(|i| (i.consumer_sequence, i.stream_sequence)) {
                Ok((seq, stream_seq)) if seq == *next_delivery => {
                    *next_delivery += 1;
                    if highest.is_none_or(|(_, h)| stream_seq > h) {
                        highest = Some((msgs.len(), stream_seq));
                    }
                    msgs.push(m);
                }
                got => {
                    warn!(
                        consumer,
                        expected = *next_delivery,
                        got = ?got.ok(),
                        "a raw delivery never arrived; taking the partition again from the first chunk not processed"
                    );
                    metrics::counter!("streamgate_normalizer_delivery_gaps_total").increment(1);
                    return (msgs, highest, Next::Reopen);
                }
            },
            Err(e) if e.kind() == MessagesErrorKind::ConsumerDeleted => {
                return (msgs, highest, Next::Deleted);
            }
            Err(e) => {
                warn!(error = %e, "SG_RAW consumer error");
                // Checked after the batch: deliveries after the error are still whole.
                if matches!(
                    e.kind(),
                    MessagesErrorKind::NoResponders | MessagesErrorKind::MissingHeartbeat
                ) {
                    next = Next::Check;
                }
            }
        }
    }
    (msgs, highest, next)
}

async fn process_batch(
    js: &async_nats::jetstream::Context,
    open_runs: &OpenRuns,
    table: &mut RunTable,
    msgs: &[async_nats::jetstream::Message],
) -> anyhow::Result<()> {
    let mut out = BTreeMap::new();
    if let Err(e) = apply_and_publish(js, open_runs, table, msgs, &mut out).await {
        // The table already holds these runs' state past this batch, but (some of) the
        // batch's events never reached SG_EVENTS. Forget the runs: their redelivered
        // chunks, or their next ones, rebuild them from SG_RAW and publish every event
        // again. Keeping the state would make the redelivered chunks look like
        // duplicates and lose those events for good (a gap in the run).
        for key in out.keys() {
            table.forget(key);
        }
        return Err(e);
    }
    Ok(())
}

/// Records the time a consumer batch spent in one of the worker's steps
/// (`streamgate_normalizer_batch_seconds`): with the pull wait, where a chunk's time
/// between ingest and its events goes (`bench pipeline` prints them).
fn record_step(step: &'static str, took: Duration) {
    metrics::histogram!("streamgate_normalizer_batch_seconds", "step" => step)
        .record(took.as_secs_f64());
}

/// Seconds from `since_ms` to `now_ms` (wall clock, ms), never negative: another host's
/// clock may run ahead.
fn seconds_since(since_ms: i64, now_ms: i64) -> f64 {
    now_ms.saturating_sub(since_ms).max(0) as f64 / 1000.0
}

/// The events consecutive raw chunks of a run yielded ([`coalesce`]), published together
/// with the first chunk's trace.
struct Produced {
    events: Vec<RunEvent>,
    trace: Option<TraceContext>,
    made_by: Option<MadeBy>,
}

/// Adds what a chunk of a run yielded to what the run's earlier chunks in this consumer
/// batch yielded: appended to the last one when it continues it (its first seq follows
/// the last one's last) and the same adapter made both, so a backlog of a run's chunks
/// goes out as one SG_EVENTS message (split only by size,
/// `streamgate_bus::events::messages_for`) instead of one per chunk — a third of the
/// broker's work per chunk at saturation, when a pull brings several chunks of a run.
/// Nothing waits for this: only chunks that arrived together are joined. The message
/// carries the first chunk's trace. What does not continue — a rebuild's events, which
/// start again at seq 1 — goes out on its own (a message must hold consecutive seqs).
fn coalesce(produced: &mut Vec<Produced>, next: Produced) {
    let continues = |last: &Produced| {
        let (Some(end), Some(start)) = (last.events.last(), next.events.first()) else {
            return false;
        };
        start.event.seq == end.event.seq + 1 && last.made_by == next.made_by
    };
    match produced.last_mut() {
        Some(last) if continues(last) => last.events.extend(next.events),
        _ => produced.push(next),
    }
}

/// What made the events of a chunk of a run of `family` (dialect as the chunk named it).
fn made_by(family: Option<Family>, dialect: Option<&str>) -> Option<MadeBy> {
    let family = family?;
    Some(MadeBy {
        adapter: match dialect {
            Some(d) => format!("{}/{d}", family.as_str()),
            None => family.as_str().to_owned(),
        },
        adapter_version: family.adapter_version(),
        grammar_version: streamgate_grammar::GRAMMAR_VERSION,
    })
}

/// A run's address and what its chunks in a consumer batch yielded ([`coalesce`]d).
type RunBatches = (RunAddr, Vec<Produced>);

/// Publish attempts per run and batch before the batch is given up (and redelivered).
const PUBLISH_ATTEMPTS: usize = 3;

async fn apply_and_publish(
    js: &async_nats::jetstream::Context,
    open_runs: &OpenRuns,
    table: &mut RunTable,
    msgs: &[async_nats::jetstream::Message],
    out: &mut BTreeMap<RunKey, RunBatches>,
) -> anyhow::Result<()> {
    // `out`: per run whose state this batch moved, in seq order, the events of its
    // chunks ([`coalesce`]d); runs are published concurrently.
    // Runs that started, were rebuilt or closed in this batch: whether each is open now.
    let mut registry: BTreeMap<RunKey, (RunAddr, bool)> = BTreeMap::new();
    let mut chunks_applied = 0u64;
    // One span per chunk, open until its events are published: the normalizer's step of
    // the trace the chunk carries.
    let mut spans = Vec::with_capacity(msgs.len());
    // The broker's message limit, once per batch (events over it are cut to fit).
    let max_payload = js.client().server_info().max_payload;
    let (taken_ms, applying) = (now_ms(), Instant::now());
    // Metric handles once per batch: each macro call is a registry lookup.
    let pull_wait = metrics::histogram!("streamgate_normalizer_pull_wait_seconds");
    let events_cut = metrics::counter!("streamgate_normalizer_events_cut_total");
    let answers_cut = metrics::counter!("streamgate_normalizer_final_answers_cut_total");
    for msg in msgs {
        let chunk = match RawChunk::from_message(msg) {
            Ok(c) => c,
            Err(e) => {
                // A message nobody can read (a malformed header, an id breaking the id
                // rule, …) is counted and passed over (the batch's in-order ack covers
                // it, so it never loops); the raw bytes stay in SG_RAW for inspection.
                warn!(error = %e, subject = %msg.subject, "unreadable raw message");
                metrics::counter!("streamgate_normalizer_bad_raw_total").increment(1);
                continue;
            }
        };
        pull_wait.record(seconds_since(chunk.ingest_ts_ms, taken_ms));
        let span = streamgate_runtime::hop_span!("normalize", run = %chunk.addr.run_id, chunk = chunk.chunk);
        let trace = trace::follow(&span, trace::extract_context(msg.headers.as_ref()));
        spans.push(span);
        let key = chunk.addr.run();
        let mut rebuilt = false;
        let groups = match table.apply(&chunk) {
            Applied::Events(evs) => vec![evs],
            Applied::Duplicate => {
                debug!(run = %chunk.addr.run_id, chunk = chunk.chunk, "duplicate chunk");
                continue;
            }
            Applied::NeedsRebuild => {
                let history = read_subject(js, RAW_STREAM, &chunk.addr.raw_subject()).await?;
                let history: Vec<RawChunk> = history
                    .iter()
                    .filter_map(|m| RawChunk::from_message(m).ok())
                    .collect();
                info!(run = %chunk.addr.run_id, chunks = history.len(), "rebuilding run from SG_RAW");
                metrics::counter!("streamgate_normalizer_rebuilds_total").increment(1);
                rebuilt = true;
                let mut groups = table.rebuild(&chunk, history);
                match table.apply(&chunk) {
                    Applied::Events(more) => groups.push(more),
                    Applied::Duplicate | Applied::NeedsRebuild => {}
                }
                groups
            }
        };
        chunks_applied += 1;
        let mut groups = groups;
        for group in &mut groups {
            let cut = streamgate_wire::oversize::fit(group, max_payload);
            events_cut.increment(cut as u64);
            let cut_answers = group
                .iter()
                .filter(|e| e.event.diagnostic_code() == Some("final_answer_cut"))
                .count();
            answers_cut.increment(cut_answers as u64);
        }
        if chunk.chunk == 0 || rebuilt || chunk.close.is_some() {
            let open = !table.is_closed(&key);
            registry.insert(key.clone(), (chunk.addr.clone(), open));
        }
        let made_by = made_by(table.last_family(), chunk.dialect.as_deref());
        let entry = out
            .entry(key)
            .or_insert_with(|| (chunk.addr.clone(), Vec::new()));
        // A rebuild's earlier chunks are re-published within this chunk's trace (or,
        // joined to an earlier chunk of the batch, within that one's).
        for events in groups.into_iter().filter(|events| !events.is_empty()) {
            coalesce(
                &mut entry.1,
                Produced {
                    events,
                    trace: trace.clone(),
                    made_by: made_by.clone(),
                },
            );
        }
    }
    metrics::gauge!("streamgate_normalizer_final_text_bytes")
        .set(streamgate_wire::families::final_text::held_bytes() as f64);
    let publishing = Instant::now();
    record_step("apply", publishing - applying);
    // The events and the open-runs registry are written concurrently (each is a broker
    // round trip, and neither depends on the other); both before the chunks are
    // acknowledged: a failure of either fails the batch, whose redelivery rebuilds the
    // runs, publishes their events again (same seqs) and records them again.
    let record = futures::future::join_all(
        registry
            .values()
            .map(|(addr, open)| open_runs.record(addr, *open)),
    );
    let (published, recorded) =
        futures::future::join(publish_runs(js, &*out, max_payload), record).await;
    published?;
    recorded.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    record_step("publish", publishing.elapsed());
    let published: usize = out
        .values()
        .flat_map(|(_, produced)| produced.iter().map(|p| p.events.len()))
        .sum();
    metrics::counter!("streamgate_normalizer_events_published_total").increment(published as u64);
    metrics::counter!("streamgate_normalizer_chunks_total").increment(chunks_applied);
    drop(spans);
    Ok(())
}

/// Publishes the events of every run in `out`, runs concurrently. Re-publishing is
/// harmless (message ids), so a run whose publish failed (e.g. acks lost across a broker
/// reconnect) is retried a few times before the batch fails.
async fn publish_runs(
    js: &async_nats::jetstream::Context,
    out: &BTreeMap<RunKey, RunBatches>,
    max_payload: usize,
) -> anyhow::Result<()> {
    let mut pending: Vec<&RunBatches> = out
        .values()
        .filter(|(_, groups)| !groups.is_empty())
        .collect();
    for attempt in 1..=PUBLISH_ATTEMPTS {
        let results = futures::future::join_all(pending.iter().map(|(addr, produced)| {
            let batches = produced.iter().map(|p| Batch {
                events: &p.events,
                trace: p.trace.as_ref(),
                made_by: p.made_by.as_ref(),
            });
            publish_batches_under(js, addr, batches, max_payload)
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
            Some(e) if attempt == PUBLISH_ATTEMPTS => return Err(e.into()),
            Some(e) => warn!(error = %e, attempt, "publishing events failed; retrying"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopens_back_off_up_to_the_ack_wait() {
        let cap = Duration::from_secs(10);
        let waits: Vec<u128> = (0..9).map(|n| reopen_backoff(n, cap).as_millis()).collect();
        assert_eq!(waits, [0, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        assert_eq!(reopen_backoff(u32::MAX, cap), cap);
    }

    /// Deliveries of a real consumer: a batch is taken up to a delivery that never
    /// arrived, the worker is told to take the partition again, and a consumer deletion
    /// is told apart.
    #[tokio::test]
    async fn a_batch_is_taken_up_to_a_delivery_that_never_arrived() {
        use streamgate_bus::subject::RunAddr;
        let server = streamgate_testkit::NatsServer::start();
        let js = async_nats::jetstream::new(server.client().await);
        ensure_streams(&js, &streamgate_bus::StreamSettings::default())
            .await
            .unwrap();
        let addr = RunAddr::parse("t", "r", streamgate_bus::DEFAULT_PARTITIONS).unwrap();
        for chunk in 0..4 {
            let raw = RawChunk {
                addr: addr.clone(),
                session_key: None,
                family: "f1".into(),
                dialect: None,
                chunk,
                ingest_ts_ms: 1,
                close: None,
                body: bytes::Bytes::from_static(b"x"),
            };
            publish_raw(&js, &raw).await.unwrap();
        }
        let spec = incarnation::Spec {
            stream: RAW_STREAM.into(),
            base: "sg-normalizer-p07".into(),
            filter: raw_partition_filter(addr.partition),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 100,
        };
        let made = incarnation::open(&js, &spec, Start::At(1)).await.unwrap();
        let mut fetched = made
            .consumer
            .fetch()
            .max_messages(4)
            .messages()
            .await
            .unwrap();
        let mut delivered = Vec::new();
        while let Some(m) = fetched.next().await {
            delivered.push(m);
        }
        assert_eq!(delivered.len(), 4);
        // The whole batch.
        let mut next = 1;
        let whole: Vec<_> = delivered
            .iter()
            .map(|m| Ok(m.as_ref().unwrap().clone()))
            .collect();
        let (msgs, _, then) = whole_prefix(&mut next, "c", whole);
        assert_eq!((msgs.len(), then, next), (4, Next::Pull, 5));
        // The second delivery lost: only the first is taken.
        let mut next = 1;
        let lost: Vec<_> = [0, 2, 3]
            .iter()
            .map(|&i| Ok(delivered[i].as_ref().unwrap().clone()))
            .collect();
        let (msgs, _, then) = whole_prefix(&mut next, "c", lost);
        assert_eq!((msgs.len(), then, next), (1, Next::Reopen, 2));
        assert_eq!(msgs[0].info().unwrap().stream_sequence, 1);
        // The consumer deleted under the pull.
        let stream = js.get_stream(RAW_STREAM).await.unwrap();
        stream.delete_consumer(&made.name).await.unwrap();
        let mut pull = streamgate_bus::consume::batches(&made.consumer, 8)
            .await
            .unwrap();
        let then = loop {
            let batch = pull
                .next()
                .await
                .expect("the pull stream ends with an error");
            let (_, _, then) = whole_prefix(&mut 1, "c", batch);
            if then != Next::Pull {
                break then;
            }
        };
        // No pull of ours was waiting when it went: the next one is not answered.
        assert_eq!(then, Next::Check);
        assert!(consumer_gone(&js, &made.name).await);
        let other = incarnation::open(&js, &spec, Start::At(1)).await.unwrap();
        assert!(!consumer_gone(&js, &other.name).await);
    }
    use streamgate_grammar::{Assistant, Envelope, Event, EventData};

    fn produced(seqs: std::ops::RangeInclusive<u64>, adapter: &str, span: char) -> Produced {
        let traceparent = format!("00-{}-{}-01", "1".repeat(32), span.to_string().repeat(16));
        Produced {
            events: seqs
                .map(|seq| RunEvent {
                    envelope: Envelope {
                        tenant: "acme".into(),
                        session_key: None,
                        run_id: "r1".into(),
                        ts_ms: 0,
                    },
                    event: Event {
                        seq,
                        data: EventData::Assistant(Assistant {
                            delta: Some(format!("{seq} ")),
                            ..Default::default()
                        }),
                    },
                })
                .collect(),
            trace: TraceContext::parse(Some(&traceparent), None),
            made_by: Some(MadeBy {
                adapter: adapter.to_owned(),
                adapter_version: 1,
                grammar_version: 1,
            }),
        }
    }

    /// The seqs of each message [`coalesce`] made.
    fn seqs(out: &[Produced]) -> Vec<Vec<u64>> {
        out.iter()
            .map(|p| p.events.iter().map(|e| e.event.seq).collect())
            .collect()
    }

    #[test]
    fn a_runs_chunks_in_one_batch_go_out_together_while_one_adapter_made_them() {
        let mut out = Vec::new();
        for p in [
            produced(1..=2, "f2", 'a'),
            produced(3..=3, "f2", 'b'),
            produced(4..=6, "f2/deepseek", 'c'),
            produced(7..=7, "f2/deepseek", 'd'),
        ] {
            coalesce(&mut out, p);
        }
        assert_eq!(seqs(&out), [vec![1, 2, 3], vec![4, 5, 6, 7]]);
        // Each message continues the trace of its first chunk.
        let spans: Vec<&str> = out
            .iter()
            .map(|p| &p.trace.as_ref().unwrap().traceparent()[36..52])
            .collect();
        assert_eq!(spans, ["a".repeat(16), "c".repeat(16)]);
    }

    #[test]
    fn events_that_do_not_continue_the_last_ones_go_out_on_their_own() {
        // A run's first chunk, then a rebuild (seq 1 again) and the chunk after it.
        let mut out = Vec::new();
        for p in [
            produced(1..=3, "f2", 'a'),
            produced(1..=3, "f2", 'b'),
            produced(4..=4, "f2", 'c'),
        ] {
            coalesce(&mut out, p);
        }
        assert_eq!(seqs(&out), [vec![1, 2, 3], vec![1, 2, 3, 4]]);
        // Each is a valid message: consecutive seqs.
        for p in &out {
            streamgate_bus::events::messages_for(&p.events).expect("consecutive seqs");
        }
    }
}

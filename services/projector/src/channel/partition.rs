//! A held partition's worker: recovery, then its durable consumer, each message
//! processed and acked; on release, a bounded handover; its runs leave memory however
//! the worker ends, and the engine's queued ops of them with them.

use super::lanes::Lanes;
use super::recovery::Recovery;
use super::resume::{self, Progress};
use super::{lock, run_key, Channel, RunKey};
use crate::error::{nats, ProjectorError};
use async_nats::jetstream;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::FutureExt as _;
use futures::StreamExt as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use streamgate_bus::lease::PartitionWork;
use streamgate_bus::memory_pull;
use streamgate_bus::subject::{partition_of, RunAddr};
use streamgate_bus::{consume, events, trace, EVENTS_STREAM};
use streamgate_projection::DraftKey;
use streamgate_sinks::ChatTarget;
use tracing::Instrument as _;

/// How long a released partition waits for the engine to execute what it queued, so
/// the next owner's re-submitted ops do not race ours; bounded because a chat in a long
/// `retry_after` must not hold the handover forever. On shutdown the engine closes
/// after its own short grace, which ends this wait sooner; then only the requests
/// already sent are waited for ([`streamgate_sinks::Delivery::attempts_done`]).
const HANDOVER_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// A partition's messages processed at once, at most ([`Lanes`]: one run's, and one
/// chat's, still one after the other). Enough that a few hundred new runs' KV round
/// trips overlap; few enough that a partition's burst does not flood the broker.
const MESSAGES_AT_ONCE: usize = 32;

impl Channel {
    /// The partition of every run in memory (a run not in memory is on the partition its
    /// id hashes to).
    fn run_partitions(&self) -> HashMap<RunKey, u32> {
        lock(&self.runs)
            .iter()
            .map(|(k, e)| (k.clone(), e.partition))
            .collect()
    }

    /// Whether the run of `key` in `chat` is one of this channel's on `partition`
    /// (`runs`: [`Channel::run_partitions`]).
    fn is_on(
        &self,
        partition: u32,
        runs: &HashMap<RunKey, u32>,
        chat: &ChatTarget,
        key: &DraftKey,
    ) -> bool {
        chat.channel == self.cfg.name
            && runs.get(&run_key(&key.tenant, &key.run_id)).map_or_else(
                || partition_of(&key.run_id, self.cfg.partitions) == partition,
                |p| *p == partition,
            )
    }

    /// Forgets the runs of a partition this replica no longer holds, and gives up what
    /// the engine still has queued for them: after a graceful release
    /// ([`Delivery::hand_over`](streamgate_sinks::Delivery::hand_over)) nothing is left;
    /// after a lost lease (the worker aborted) the next owner is already sending them,
    /// and two owners must not act on one chat.
    fn drop_partition(&self, partition: u32) {
        let runs = self.run_partitions();
        // The engine logs what it dropped.
        self.delivery
            .give_up(|chat, key| self.is_on(partition, &runs, chat, key));
        lock(&self.runs).retain(|_, e| e.partition != partition);
    }

    /// Works on one partition this replica holds the lease of, until it is released
    /// (or, on a lost lease, the task is aborted): recovery of the partition's marked
    /// runs, then its durable consumer ([`Channel::open_consumer`]) from where its
    /// previous owner left it. Each message is acked after [`Channel::process`] took
    /// all its events (a redelivered batch re-applies nothing: the projection skips seqs
    /// it has seen); a message that cannot be decoded is terminated (it would never
    /// decode on redelivery). Messages of different runs in different chats are
    /// processed at once ([`Lanes`]), so a new run's KV round trips or a rebuild hold up
    /// only its own run and chat.
    ///
    /// On release, messages already received are processed too and the engine gets a
    /// bounded time to execute what was queued, so the next owner starts after it.
    /// However the worker ends, the partition's runs leave memory.
    pub async fn run_partition(self: Arc<Self>, work: PartitionWork) -> Result<(), ProjectorError> {
        let partition = work.partition;
        let acquired = Instant::now();
        let _forget = ForgetPartition {
            channel: self.clone(),
            partition,
        };
        let interrupted = self
            .recover(Recovery::Partition {
                partition,
                acquired,
            })
            .await?;
        if interrupted > 0 {
            tracing::info!(
                partition,
                interrupted,
                "orphaned runs settled on acquiring the partition"
            );
        }
        // The channel's backpressure bound, split over the partitions.
        let max_ack_pending = (10_000 / i64::from(self.cfg.partitions.max(1))).max(256);
        let durable = self.cfg.partition_durable(partition);
        let (consumer, mut progress) = self
            .open_consumer(partition, &durable, max_ack_pending)
            .await?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(nats("consumer messages"))?;
        let this: &Channel = &self;
        let mut lanes = Lanes::new(MESSAGES_AT_ONCE);
        let mut running: FuturesUnordered<BoxFuture<'_, Handled>> = FuturesUnordered::new();
        let mut save = tokio::time::interval(resume::SAVE_EVERY);
        save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconnects = memory_pull::Reconnects::new(&self.js.client());
        let released = loop {
            // Taken messages are bounded too: beyond these the broker holds the rest.
            let room = lanes.len() < 2 * MESSAGES_AT_ONCE;
            tokio::select! {
                biased;
                () = work.release.cancelled() => break true,
                Some(handled) = running.next() => handled.done(&mut lanes, &mut progress),
                _ = save.tick() => {
                    progress.save(&self.state_kv, &durable);
                    if reconnects.happened()
                        && memory_pull::missing(&self.js, EVENTS_STREAM, &durable).await
                    {
                        tracing::info!(partition, "partition consumer gone after a reconnect; opening it again");
                        break false;
                    }
                }
                next = messages.next(), if room => match next {
                    Some(Ok(msg)) => {
                        if let Err(missed) = this.take(&mut lanes, &mut progress, msg) {
                            tracing::info!(partition, expected = missed.expected, got = missed.got, "a delivery was missed; opening the consumer again");
                            break false;
                        }
                    }
                    Some(Err(e)) => {
                        if memory_pull::gone(&self.js, EVENTS_STREAM, &durable, &e).await {
                            tracing::info!(partition, error = %e, "partition consumer gone (a broker restart?); opening it again");
                            break false;
                        }
                        tracing::warn!(error = %e, "consumer error");
                    }
                    // The consumer ended: the lease supervisor starts us again.
                    None => break false,
                },
            }
            start_ready(this, &mut lanes, &mut running);
        };
        if released {
            // Up to a missed delivery: what follows it is the next owner's.
            while let Some(Some(msg)) = messages.next().now_or_never() {
                match msg {
                    Ok(msg) => {
                        if this.take(&mut lanes, &mut progress, msg).is_err() {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "consumer error"),
                }
            }
        }
        // What was taken is processed (and acked) before the partition goes.
        while !lanes.is_empty() {
            start_ready(this, &mut lanes, &mut running);
            match running.next().await {
                Some(handled) => handled.done(&mut lanes, &mut progress),
                None => break,
            }
        }
        progress.save_now(&self.state_kv, &durable).await;
        if !released {
            return Ok(());
        }
        drop(messages);
        if tokio::time::timeout(HANDOVER_FLUSH_LIMIT, self.delivery.flush())
            .await
            .is_err()
        {
            tracing::info!(
                partition,
                "ops still queued at handover; the next owner re-submits them"
            );
        }
        // Whatever of this partition is still queued (a chat paced to a few messages a
        // minute, a long retry_after) goes to the next owner, and an attempt of it in
        // flight ends before the lease does: two owners never act on one chat at once.
        let runs = self.run_partitions();
        self.delivery
            .hand_over(|chat, key| self.is_on(partition, &runs, chat, key))
            .await;
        if self.delivery.is_closed() {
            // Shutdown: the engine takes no more ops, but a request it already sent
            // finishes and its outcome is saved before the partition goes to its next
            // owner — which then resumes after it instead of sending it again.
            self.delivery.attempts_done().await;
        }
        Ok(())
    }

    /// The partition's durable consumer `sg-projector-<channel>-pNN`, held in the
    /// broker's memory ([`memory_pull`]), and the progress it starts from: where this
    /// partition was processed to before, from its previous owner or before a broker
    /// restart ([`resume`]). A channel without a point, upgraded from its single shared
    /// consumer, resumes where that one was acknowledged; a new one at the start of
    /// `SG_EVENTS`.
    async fn open_consumer(
        &self,
        partition: u32,
        durable: &str,
        max_ack_pending: i64,
    ) -> Result<(jetstream::consumer::PullConsumer, Progress), ProjectorError> {
        let recorded = resume::load(&self.state_kv, durable).await?;
        let fallback =
            consume::start_after_legacy(&self.js, EVENTS_STREAM, &self.cfg.durable_name()).await?;
        let spec = memory_pull::Spec {
            stream: EVENTS_STREAM,
            durable,
            filters: vec![self.cfg.partition_filter(partition)],
            ack_wait: self.cfg.ack_wait,
            max_ack_pending,
        };
        let (consumer, from) = memory_pull::open(&self.js, spec, recorded, fallback).await?;
        Ok((consumer, Progress::new(from, recorded)))
    }

    /// One `SG_EVENTS` message taken from the consumer: decoded and queued in its run's
    /// and chat's lanes. A delivery out of consumer order (or without the broker's
    /// sequences) is left alone: the partition no longer knows every delivery, and a
    /// new consumer must start after the later of its point and the broker's ack floor.
    fn take(
        &self,
        lanes: &mut Lanes<LaneKey, Taken>,
        progress: &mut Progress,
        msg: jetstream::Message,
    ) -> Result<(), resume::Missed> {
        let (seq, delivery) = msg
            .info()
            .map_or((0, 0), |i| (i.stream_sequence, i.consumer_sequence));
        progress.taken(seq, delivery)?;
        match events::decode_msg(&msg) {
            Ok(evs) => {
                let mut keys = vec![LaneKey::Run(msg.subject.to_string())];
                // A message's events are one run's, so they share one chat.
                if let Some(env) = evs.first().map(|e| &e.envelope) {
                    keys.push(LaneKey::Chat(super::settings::chat_key(
                        &env.tenant,
                        &self.cfg.chat_for(env.session_key.as_deref()),
                    )));
                }
                lanes.push(keys, Taken::Events { msg, seq, evs });
            }
            Err(e) => lanes.push(Vec::new(), Taken::Undecodable { msg, seq, error: e }),
        }
        Ok(())
    }

    /// Processes one taken message: every event, then the ack (or leave it for
    /// redelivery); an undecodable one is terminated (it would never decode on
    /// redelivery). Whether the message is settled for good (not left for redelivery).
    async fn handle(&self, taken: Taken) -> bool {
        let (msg, evs) = match taken {
            Taken::Events { msg, evs, .. } => (msg, evs),
            Taken::Undecodable { msg, error, .. } => {
                tracing::warn!(subject = %msg.subject, error = %error, "undecodable message terminated");
                let _ = msg.ack_with(jetstream::AckKind::Term).await;
                return true;
            }
        };
        if let Err(e) = RunAddr::parse_subject(&msg.subject) {
            tracing::warn!(subject = %msg.subject, error = %e, "event on a foreign subject");
        }
        let subject = msg.subject.to_string();
        let span =
            streamgate_runtime::hop_span!("project", channel = %self.cfg.name, subject = %subject);
        trace::follow(&span, trace::extract_context(msg.headers.as_ref()));
        let processed = self.process_all(evs, &subject).instrument(span).await;
        match processed {
            Ok(()) => {
                if let Err(e) = msg.ack().await {
                    tracing::warn!(error = %e, "ack failed; the event will be redelivered");
                }
                true
            }
            Err(e) => {
                // Not acked: JetStream redelivers after ack_wait; the rebuild and
                // the KV delivery state make the retry idempotent.
                tracing::warn!(error = %e, "event not processed; leaving it for redelivery");
                let _ = msg
                    .ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                false
            }
        }
    }
}

/// What orders a partition's messages ([`Lanes`]): a run's in order, and a chat's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum LaneKey {
    /// The run's `SG_EVENTS` subject.
    Run(String),
    /// The chat the run renders into: (tenant, chat).
    Chat(super::settings::ChatKey),
}

/// A message taken from the consumer, waiting for its lanes.
enum Taken {
    Events {
        msg: jetstream::Message,
        /// The stream sequence.
        seq: u64,
        evs: Vec<streamgate_grammar::RunEvent>,
    },
    Undecodable {
        msg: jetstream::Message,
        seq: u64,
        error: streamgate_bus::BusError,
    },
}

impl Taken {
    /// The message's stream sequence.
    fn seq(&self) -> u64 {
        let (Taken::Events { seq, .. } | Taken::Undecodable { seq, .. }) = self;
        *seq
    }
}

/// A taken message after [`Channel::handle`]: its lanes, and its stream sequence when
/// it is settled for good.
struct Handled {
    keys: Vec<LaneKey>,
    settled: Option<u64>,
}

impl Handled {
    /// Frees the message's lanes and records it settled.
    fn done(self, lanes: &mut Lanes<LaneKey, Taken>, progress: &mut Progress) {
        lanes.done(&self.keys);
        if let Some(seq) = self.settled {
            progress.settled(seq);
        }
    }
}

/// Starts every taken message whose lanes are free.
fn start_ready<'a>(
    channel: &'a Channel,
    lanes: &mut Lanes<LaneKey, Taken>,
    running: &mut FuturesUnordered<BoxFuture<'a, Handled>>,
) {
    for (keys, taken) in lanes.ready() {
        running.push(
            async move {
                let seq = taken.seq();
                let settled = channel.handle(taken).await;
                Handled {
                    keys,
                    settled: settled.then_some(seq),
                }
            }
            .boxed(),
        );
    }
}

/// Drops a partition's runs from memory when its worker ends, however it ends (a
/// release, an error, or the abort of a lost lease).
struct ForgetPartition {
    channel: Arc<Channel>,
    partition: u32,
}

impl Drop for ForgetPartition {
    fn drop(&mut self) {
        self.channel.drop_partition(self.partition);
    }
}

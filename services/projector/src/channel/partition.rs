//! A held partition: recovery, then its durable consumer, whose messages a
//! [`Worker`] processes; on release, a bounded handover; its runs leave memory however
//! the partition's task ends, and the engine's queued ops of them with them.

use super::recovery::Recovery;
use super::resume::{self, Progress};
use super::worker::Worker;
use super::{lock, run_key, Channel, RunKey};
use crate::error::{nats, ProjectorError};
use async_nats::jetstream;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use streamgate_bus::lease::PartitionWork;
use streamgate_bus::memory_pull;
use streamgate_bus::subject::partition_of;
use streamgate_bus::{consume, EVENTS_STREAM};
use streamgate_projection::DraftKey;
use streamgate_sinks::ChatTarget;

/// How long a released partition waits for the engine to execute what it queued, so
/// the next owner's re-submitted ops do not race ours; bounded because a chat in a long
/// `retry_after` must not hold the handover forever. On shutdown the engine closes
/// after its own short grace, which ends this wait sooner; then only the requests
/// already sent are waited for ([`streamgate_sinks::Delivery::attempts_done`]).
const HANDOVER_FLUSH_LIMIT: Duration = Duration::from_secs(5);

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
    /// after a lost lease (the partition's task aborted) the next owner is already sending them,
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
    /// previous owner left it, its messages processed by a [`Worker`].
    ///
    /// On release, messages already received are processed too and the engine gets a
    /// bounded time to execute what was queued, so the next owner starts after it.
    /// However this task ends, the partition's runs leave memory.
    pub async fn run_partition(self: Arc<Self>, work: PartitionWork) -> Result<(), ProjectorError> {
        let partition = work.partition;
        let _forget = ForgetPartition {
            channel: self.clone(),
            partition,
        };
        self.settle_orphans(partition).await?;
        let durable = self.cfg.partition_durable(partition);
        let (consumer, progress) = self.open_consumer(partition, &durable).await?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(nats("consumer messages"))?;
        let mut worker = Worker::new(&self, partition, &durable, progress);
        let released = worker.consume(&mut messages, &work).await;
        if released {
            worker.take_received(&mut messages);
        }
        worker.finish().await;
        if released {
            drop(messages);
            self.hand_over(partition).await;
        }
        Ok(())
    }

    /// Settles the runs a previous owner of `partition` left open ([`Recovery`]).
    async fn settle_orphans(&self, partition: u32) -> Result<(), ProjectorError> {
        let interrupted = self
            .recover(Recovery::Partition {
                partition,
                acquired: Instant::now(),
            })
            .await?;
        if interrupted > 0 {
            tracing::info!(
                partition,
                interrupted,
                "orphaned runs settled on acquiring the partition"
            );
        }
        Ok(())
    }

    /// After a release: the engine gets [`HANDOVER_FLUSH_LIMIT`] to execute what this
    /// partition queued; the rest goes to the next owner.
    async fn hand_over(&self, partition: u32) {
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
    }

    /// The partition's durable consumer `sg-projector-<channel>-pNN`, held in the
    /// broker's memory ([`memory_pull`]), and the progress it starts from: where this
    /// partition was processed to before, from its previous owner or before a broker
    /// restart ([`resume`]). Only a partition with neither a consumer nor a point looks
    /// for the single shared consumer of a channel upgraded from before partitions, and
    /// resumes where that one was acknowledged; a new channel starts at the start of
    /// `SG_EVENTS`.
    async fn open_consumer(
        &self,
        partition: u32,
        durable: &str,
    ) -> Result<(jetstream::consumer::PullConsumer, Progress), ProjectorError> {
        let recorded = resume::load(&self.state_kv, durable).await?;
        let legacy = self.cfg.durable_name();
        let fallback = consume::start_after_legacy(&self.js, EVENTS_STREAM, &legacy);
        let spec = memory_pull::Spec {
            stream: EVENTS_STREAM,
            durable,
            filters: vec![self.cfg.partition_filter(partition)],
            ack_wait: self.cfg.ack_wait,
            // The channel's backpressure bound, split over the partitions.
            max_ack_pending: (10_000 / i64::from(self.cfg.partitions.max(1))).max(256),
        };
        let (consumer, from) = memory_pull::open(&self.js, spec, recorded, fallback).await?;
        Ok((consumer, Progress::new(from, recorded)))
    }
}

/// Drops a partition's runs from memory when its task ends, however it ends (a
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

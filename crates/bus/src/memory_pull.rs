//! Durable pull consumers whose delivery state the broker keeps in memory, resumed from
//! a point the consumer's owner keeps itself.
//!
//! The broker writes a file-backed consumer's state (delivered and acknowledged
//! sequences) to a file of its own, atomically (a new file, then a rename), within
//! milliseconds of every delivery or ack. With many consumers that each see a few
//! messages, as a projector serving many channels has, those writes are most of what the
//! broker does: 200 webhook channels at 10,000 events/s spent 46% of nats-server's CPU in
//! them (docs/performance.md, twenty-second stop). A consumer with `mem_storage` writes
//! nothing; what it forgets when the broker restarts, its owner brings back: it records
//! how far it has processed ([`ResumePoint`]) and [`open`] starts its consumer anew
//! after the later of that point and what the broker still knows.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{pull, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::ConsumerInfoErrorKind;

use crate::consume::durable_config;
use crate::{nats, BusError};

/// The stream sequence up to which the owner has processed every message of its
/// consumer: what a consumer the broker forgot starts after.
pub type ResumePoint = u64;

/// What [`open`] asks for.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    /// The stream.
    pub stream: &'a str,
    /// The durable name.
    pub durable: &'a str,
    /// Filter subjects.
    pub filters: Vec<String>,
    /// How long a delivered message waits for its ack before it is delivered again.
    pub ack_wait: Duration,
    /// Delivered messages not yet acknowledged, at most.
    pub max_ack_pending: i64,
}

/// A new durable pull consumer for `spec`, its state in the broker's memory, and the
/// point after which it delivers every message (its consumer sequences start at 1). A
/// consumer of that name that exists is replaced, so that nobody else is served by it
/// any more (an earlier owner's pull left on a half-open connection would take messages
/// its new owner never sees). The new one starts after the latest point known to be
/// done with:
/// - the old consumer's last delivery when every delivery is acknowledged, else its ack
///   floor (which of the unacknowledged ones come again, only the broker knows);
/// - `resume`, the owner's own record, which is all there is when the broker forgot the
///   consumer (a restart) or recreated it without its state (a whole cluster restarted:
///   the definition survives in the meta layer, the memory does not) — unless it lies
///   beyond the stream's last message (a stream deleted and made again), where it is
///   ignored;
/// - with neither, what `fallback` resolves to. It is awaited only then, so a lookup
///   behind it (an earlier version's consumer) costs nothing while there is a point.
///
/// Messages between the owner's last recorded point and what it had processed are
/// delivered again, as after an ack timeout: the owner must be idempotent to them.
pub async fn open(
    js: &jetstream::Context,
    spec: Spec<'_>,
    resume: Option<ResumePoint>,
    fallback: impl Future<Output = Result<DeliverPolicy, BusError>>,
) -> Result<(PullConsumer, ResumePoint), BusError> {
    let stream = js
        .get_stream(spec.stream)
        .await
        .map_err(nats("get stream"))?;
    let last = stream.cached_info().state.last_sequence;
    let resume = resume.filter(|&point| {
        let known = point <= last;
        if !known {
            tracing::warn!(
                consumer = spec.durable,
                point,
                last,
                "resume point beyond the stream's last message (the stream was made again?): ignored"
            );
        }
        known
    });
    let done = match stream.consumer_info(spec.durable).await {
        Ok(info) => {
            stream
                .delete_consumer(spec.durable)
                .await
                .map_err(nats("delete consumer"))?;
            Some(if info.num_ack_pending == 0 {
                info.delivered.stream_sequence
            } else {
                info.ack_floor.stream_sequence
            })
        }
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => None,
        Err(e) => return Err(nats("consumer info")(e)),
    };
    let (policy, from) = match done.max(resume) {
        Some(after) => (after_sequence(after), after),
        None => {
            let fallback = fallback.await?;
            (fallback, before(fallback))
        }
    };
    let mut config = durable_config(
        spec.durable,
        spec.filters,
        spec.ack_wait,
        spec.max_ack_pending,
        policy,
    );
    config.memory_storage = true;
    let consumer = stream
        .create_consumer(config)
        .await
        .map_err(nats("create durable consumer"))?;
    Ok((consumer, from))
}

/// The deliver policy of the message right after `seq`.
fn after_sequence(seq: u64) -> DeliverPolicy {
    DeliverPolicy::ByStartSequence {
        start_sequence: seq + 1,
    }
}

/// The point a consumer created at `policy` delivers everything after (0: from the
/// stream's start, or not known).
fn before(policy: DeliverPolicy) -> ResumePoint {
    match policy {
        DeliverPolicy::ByStartSequence { start_sequence } => start_sequence.saturating_sub(1),
        _ => 0,
    }
}

/// Whether a pull stream's error means its consumer is gone (deleted, or forgotten by a
/// broker that restarted): the stream delivers nothing more, and the consumer must be
/// opened again. The client reports a forgotten consumer as a failed pull after its own
/// retries, so any other error is checked with the broker.
pub async fn gone(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
    error: &pull::MessagesError,
) -> bool {
    matches!(
        error.kind(),
        pull::MessagesErrorKind::ConsumerDeleted | pull::MessagesErrorKind::NoResponders
    ) || missing(js, stream, durable).await
}

/// Whether the broker says the consumer does not exist (any other answer: it may).
pub async fn missing(js: &jetstream::Context, stream: &str, durable: &str) -> bool {
    let Ok(stream) = js.get_stream_no_info(stream).await else {
        return false;
    };
    matches!(
        stream.consumer_info(durable).await,
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound
    )
}

/// Notices that the client connected again (a broker restart, a network cut). The
/// client itself finds a forgotten consumer only after its retries, about 15 s after
/// it reconnected; an owner that asks this on a timer checks its consumer
/// ([`missing`]) at once instead.
#[derive(Debug)]
pub struct Reconnects {
    stats: Arc<async_nats::Statistics>,
    seen: u64,
}

impl Reconnects {
    /// Counting from now.
    pub fn new(client: &async_nats::Client) -> Reconnects {
        let stats = client.statistics();
        let seen = stats.connects.load(Ordering::Relaxed);
        Reconnects { stats, seen }
    }

    /// Whether the client connected again since the last call.
    pub fn happened(&mut self) -> bool {
        let now = self.stats.connects.load(Ordering::Relaxed);
        std::mem::replace(&mut self.seen, now) != now
    }
}

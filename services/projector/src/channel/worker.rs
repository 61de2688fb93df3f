//! A held partition's messages ([`Worker`]): taken from its consumer in order, processed
//! in lanes ([`Lanes`]: a run's, and a chat's, one after the other; the others at once),
//! each acked after all its events are processed, and how far the partition is done
//! ([`Progress`]) saved as it moves.
//!
//! A message that cannot be decoded is terminated (it would never decode on
//! redelivery); one whose events could not be processed is left for redelivery (the
//! projection skips seqs it has seen, so a redelivered batch re-applies nothing).

use super::lanes::Lanes;
use super::resume::{self, Progress};
use super::Channel;
use async_nats::jetstream;
use async_nats::jetstream::consumer::pull;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::FutureExt as _;
use futures::StreamExt as _;
use std::time::Duration;
use streamgate_bus::lease::PartitionWork;
use streamgate_bus::memory_pull;
use streamgate_bus::subject::RunAddr;
use streamgate_bus::{events, trace, EVENTS_STREAM};
use tracing::Instrument as _;

/// A partition's messages processed at once, at most ([`Lanes`]: one run's, and one
/// chat's, still one after the other). Enough that a few hundred new runs' KV round
/// trips overlap; few enough that a partition's burst does not flood the broker.
const MESSAGES_AT_ONCE: usize = 32;

/// The partition consumer's deliveries.
pub(super) type Messages = pull::Stream;

/// One held partition's messages, from its consumer to their acks.
pub(super) struct Worker<'a> {
    channel: &'a Channel,
    partition: u32,
    /// The consumer's name, and the key of its resume point.
    durable: &'a str,
    lanes: Lanes<LaneKey, Taken>,
    running: FuturesUnordered<BoxFuture<'a, Handled>>,
    progress: Progress,
}

impl<'a> Worker<'a> {
    pub(super) fn new(
        channel: &'a Channel,
        partition: u32,
        durable: &'a str,
        progress: Progress,
    ) -> Worker<'a> {
        Worker {
            channel,
            partition,
            durable,
            lanes: Lanes::new(MESSAGES_AT_ONCE),
            running: FuturesUnordered::new(),
            progress,
        }
    }

    /// Takes and processes the consumer's messages until the partition is released
    /// (`true`), or until the consumer must be opened again (`false`): it ended, the
    /// broker lost it, or a delivery was missed. Every [`resume::SAVE_EVERY`] the point
    /// is saved, and after a reconnect the consumer is checked: the client's own
    /// retries would notice a forgotten one only much later.
    pub(super) async fn consume(&mut self, messages: &mut Messages, work: &PartitionWork) -> bool {
        let mut save = tokio::time::interval(resume::SAVE_EVERY);
        save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reconnects = memory_pull::Reconnects::new(&self.channel.js.client());
        loop {
            // Taken messages are bounded too: beyond these the broker holds the rest.
            let room = self.lanes.len() < 2 * MESSAGES_AT_ONCE;
            tokio::select! {
                biased;
                () = work.release.cancelled() => return true,
                Some(handled) = self.running.next() => {
                    handled.done(&mut self.lanes, &mut self.progress);
                }
                _ = save.tick() => {
                    self.progress.save(&self.channel.state_kv, self.durable);
                    if reconnects.happened()
                        && consumer_missing(self.channel, self.partition, self.durable).await
                    {
                        return false;
                    }
                }
                next = messages.next(), if room => {
                    if !self.delivered(next).await {
                        return false;
                    }
                }
            }
            self.start_ready();
        }
    }

    /// One item of the consumer's stream taken; whether the consumer goes on.
    async fn delivered(
        &mut self,
        next: Option<Result<jetstream::Message, pull::MessagesError>>,
    ) -> bool {
        let partition = self.partition;
        match next {
            Some(Ok(msg)) => match self.take(msg) {
                Ok(()) => true,
                Err(missed) => {
                    tracing::info!(
                        partition,
                        expected = missed.expected,
                        got = missed.got,
                        "a delivery was missed; opening the consumer again"
                    );
                    false
                }
            },
            Some(Err(e)) => {
                let js = &self.channel.js;
                if memory_pull::gone(js, EVENTS_STREAM, self.durable, &e).await {
                    tracing::info!(partition, error = %e, "partition consumer gone (a broker restart?); opening it again");
                    return false;
                }
                tracing::warn!(error = %e, "consumer error");
                true
            }
            // The consumer ended: the lease supervisor starts the partition again.
            None => false,
        }
    }

    /// After a release: the messages already received are taken too, up to a missed
    /// delivery (what follows it is the next owner's).
    pub(super) fn take_received(&mut self, messages: &mut Messages) {
        while let Some(Some(msg)) = messages.next().now_or_never() {
            match msg {
                Ok(msg) => {
                    if self.take(msg).is_err() {
                        break;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "consumer error"),
            }
        }
    }

    /// Processes (and acks) what was taken, then saves how far the partition is done:
    /// the partition goes only after that.
    pub(super) async fn finish(mut self) {
        while !self.lanes.is_empty() {
            self.start_ready();
            match self.running.next().await {
                Some(handled) => handled.done(&mut self.lanes, &mut self.progress),
                None => break,
            }
        }
        self.progress
            .save_now(&self.channel.state_kv, self.durable)
            .await;
    }

    /// One `SG_EVENTS` message taken from the consumer: decoded and queued in its run's
    /// and chat's lanes. A delivery out of consumer order (or without the broker's
    /// sequences) is left alone: the partition no longer knows every delivery, and a
    /// new consumer must start after the later of its point and the broker's ack floor.
    fn take(&mut self, msg: jetstream::Message) -> Result<(), resume::Missed> {
        let (seq, delivery) = msg
            .info()
            .map_or((0, 0), |i| (i.stream_sequence, i.consumer_sequence));
        self.progress.taken(seq, delivery)?;
        match events::decode_msg(&msg) {
            Ok(evs) => {
                let mut keys = vec![LaneKey::Run(msg.subject.to_string())];
                // A message's events are one run's, so they share one chat.
                if let Some(env) = evs.first().map(|e| &e.envelope) {
                    keys.push(LaneKey::Chat(super::settings::chat_key(
                        &env.tenant,
                        &self.channel.cfg.chat_for(env.session_key.as_deref()),
                    )));
                }
                self.lanes.push(keys, Taken::Events { msg, seq, evs });
            }
            Err(e) => self
                .lanes
                .push(Vec::new(), Taken::Undecodable { msg, seq, error: e }),
        }
        Ok(())
    }

    /// Starts every taken message whose lanes are free.
    fn start_ready(&mut self) {
        let channel = self.channel;
        for (keys, taken) in self.lanes.ready() {
            self.running.push(
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
}

/// Whether the broker forgot the partition's consumer (checked after a reconnect).
async fn consumer_missing(channel: &Channel, partition: u32, durable: &str) -> bool {
    let missing = memory_pull::missing(&channel.js, EVENTS_STREAM, durable).await;
    if missing {
        tracing::info!(
            partition,
            "partition consumer gone after a reconnect; opening it again"
        );
    }
    missing
}

impl Channel {
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

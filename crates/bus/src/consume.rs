//! Consumers: durable pull consumers for the services, and a bounded read of one subject
//! for rebuilding an in-flight run after a crash or lease move (docs/architecture.md §4).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::StreamExt as _;

use crate::{nats, BusError};

/// How long [`read_subject`] waits for the next message before giving up. A healthy
/// server delivers the next stored message in well under a millisecond; this only trips
/// when messages vanish under the read (limits, purge) or the server is unreachable.
pub const READ_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Gets or creates a durable pull consumer (explicit ack) on `stream` with the given
/// filter subjects, ack_wait and max_ack_pending. Idempotent.
///
/// It is a create-or-update: when the consumer exists with other filters, ack wait or
/// max ack pending (a config change between deploys), it is updated to these. Settings
/// the server cannot change in place (e.g. deliver policy) come back as an error.
pub async fn durable_pull(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
    filters: Vec<String>,
    ack_wait: Duration,
    max_ack_pending: i64,
) -> Result<jetstream::consumer::PullConsumer, BusError> {
    durable_pull_from(
        js,
        stream,
        durable,
        filters,
        ack_wait,
        max_ack_pending,
        DeliverPolicy::All,
    )
    .await
}

/// [`durable_pull`] whose consumer, when it does not exist yet, starts at `start`; an
/// existing consumer keeps its own deliver policy (the server cannot change it) and
/// continues from its ack floor.
pub async fn durable_pull_from(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
    filters: Vec<String>,
    ack_wait: Duration,
    max_ack_pending: i64,
    start: DeliverPolicy,
) -> Result<jetstream::consumer::PullConsumer, BusError> {
    let stream = js.get_stream(stream).await.map_err(nats("get stream"))?;
    let deliver_policy = match stream.consumer_info(durable).await {
        Ok(info) => info.config.deliver_policy,
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => start,
        Err(e) => return Err(nats("consumer info")(e)),
    };
    stream
        .create_consumer(durable_config(
            durable,
            filters,
            ack_wait,
            max_ack_pending,
            deliver_policy,
        ))
        .await
        .map_err(nats("create durable consumer"))
}

/// The configuration of a durable pull consumer with explicit acks.
pub(crate) fn durable_config(
    durable: &str,
    filters: Vec<String>,
    ack_wait: Duration,
    max_ack_pending: i64,
    deliver_policy: DeliverPolicy,
) -> pull::Config {
    let mut config = pull::Config {
        durable_name: Some(durable.to_owned()),
        ack_policy: AckPolicy::Explicit,
        deliver_policy,
        ack_wait,
        max_ack_pending,
        ..Default::default()
    };
    // One filter goes in `filter_subject`, which every server version understands and
    // which lets the client use the filtered create API; several need `filter_subjects`.
    match <[String; 1]>::try_from(filters) {
        Ok([one]) => config.filter_subject = one,
        Err(many) => config.filter_subjects = many,
    }
    config
}

/// The messages of a durable pull consumer in batches of up to `batch` — what is ready
/// now, never waiting to fill one. Pulls carry a 5 s idle heartbeat (a broker that went
/// away is noticed, not waited on) and expire after 30 s.
pub async fn batches(
    consumer: &jetstream::consumer::PullConsumer,
    batch: usize,
) -> Result<futures::stream::ReadyChunks<pull::Stream>, BusError> {
    Ok(consumer
        .stream()
        .max_messages_per_batch(batch.max(1))
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(nats("pull messages"))?
        .ready_chunks(batch.max(1)))
}

/// Whether the broker had more messages pending for the consumer when it sent a batch's
/// last message: a backlog, which a consumer that paces its batches takes at once.
pub fn more_pending<E>(batch: &[Result<jetstream::Message, E>]) -> bool {
    batch
        .iter()
        .rev()
        .find_map(|m| m.as_ref().ok())
        .and_then(|m| m.info().ok())
        .is_some_and(|info| info.pending > 0)
}

/// Where new per-partition consumers start when the single durable consumer `legacy`
/// that served every partition before partition leases still exists: right after its
/// ack floor, so upgrading a deployment resumes where it was instead of replaying the
/// whole stream (what lies between the floor and the old consumer's last delivery is
/// processed again, which consumers are idempotent to). Without it: the whole stream.
pub async fn start_after_legacy(
    js: &jetstream::Context,
    stream: &str,
    legacy: &str,
) -> Result<DeliverPolicy, BusError> {
    let stream = js.get_stream(stream).await.map_err(nats("get stream"))?;
    match stream.consumer_info(legacy).await {
        Ok(info) => Ok(DeliverPolicy::ByStartSequence {
            start_sequence: info.ack_floor.stream_sequence + 1,
        }),
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => Ok(DeliverPolicy::All),
        Err(e) => Err(nats("consumer info")(e)),
    }
}

/// All messages of one subject currently in `stream`, in order (an ordered, ephemeral
/// consumer that stops at the stream's last sequence for that subject). Used to rebuild
/// an in-flight run after a crash.
///
/// "Currently" is the last message at the time of the call; messages published after it
/// are not included. Errors with [`BusError::Nats`] when no message arrives for
/// [`READ_IDLE_TIMEOUT`].
pub async fn read_subject(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Vec<jetstream::Message>, BusError> {
    let stream = js.get_stream(stream).await.map_err(nats("get stream"))?;
    let last_seq = match stream.get_last_raw_message_by_subject(subject).await {
        Ok(m) => m.sequence,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(Vec::new()),
        Err(e) => return Err(nats("last message for subject")(e)),
    };
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.to_owned(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(nats("create ordered consumer"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(nats("ordered consumer messages"))?;
    let mut out = Vec::new();
    loop {
        let next = tokio::time::timeout(READ_IDLE_TIMEOUT, messages.next())
            .await
            .map_err(nats("read subject"))?;
        let msg = match next {
            Some(m) => m.map_err(nats("ordered consumer"))?,
            None => break,
        };
        let (seq, pending) = msg
            .info()
            .map(|i| (i.stream_sequence, i.pending))
            .map_err(|e| BusError::Nats {
                op: "message info",
                source: e,
            })?;
        out.push(msg);
        // `pending == 0` also ends the read when the last message was removed (limits)
        // after we looked it up; otherwise we would wait for it until the timeout.
        if seq >= last_seq || pending == 0 {
            break;
        }
    }
    Ok(out)
}

/// How often [`report_lag`] asks the broker.
pub const LAG_REPORT_EVERY: Duration = Duration::from_secs(5);

/// The consumers [`report_lag`] reports, which decides how it asks the broker for them.
#[derive(Debug, Clone)]
pub enum LagOf {
    /// Durable consumers by their exact names (the projector's partitions, the
    /// archiver): one info request per name and round. Their stream holds many other
    /// consumers — every channel of every projector makes one per partition on
    /// `SG_EVENTS` — and a listing of all of them per channel and round grows with the
    /// square of the channels: at 200 channels the broker and the process spent over a
    /// core serializing and parsing ~60 MB/s of consumer infos nobody read.
    Durables(Vec<String>),
    /// Stable bases whose owners make consumers of their own ([`crate::incarnation`]:
    /// the normalizer's partitions), each reported as the incarnation in use
    /// ([`crate::incarnation::in_use`]): one listing of the stream per round. `SG_RAW`
    /// holds the normalizer group's consumers and a few others (the archiver's raw copy,
    /// short-lived readers), none per channel.
    Incarnations(Vec<String>),
}

/// Publishes the lag of durable consumers on `stream` as gauges
/// (`streamgate_consumer_pending_messages`, `streamgate_consumer_ack_pending_messages`,
/// labelled by stream and consumer) every [`LAG_REPORT_EVERY`] until `stop`. Each
/// replica reports every consumer it names (the same values from every replica: the
/// broker's view), so a scrape of any replica shows the group's lag. An incarnation's
/// base is the label, so it stays `sg-normalizer-pNN` while its owners make consumers of
/// their own. A consumer that does not exist yet is skipped; a round the broker does not
/// answer leaves the gauges as they were.
pub async fn report_lag(
    js: jetstream::Context,
    stream: &'static str,
    of: LagOf,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        for (name, info) in lag(&js, stream, &of).await {
            let labels = [("stream", stream.to_owned()), ("consumer", name.to_owned())];
            metrics::gauge!("streamgate_consumer_pending_messages", &labels)
                .set(info.num_pending as f64);
            metrics::gauge!("streamgate_consumer_ack_pending_messages", &labels)
                .set(info.num_ack_pending as f64);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LAG_REPORT_EVERY) => {}
        }
    }
}

/// One round of [`report_lag`]: each consumer `of` names that the broker knows, with its
/// info (its pending and ack-pending counts), under the name `of` gives it.
pub async fn lag<'a>(
    js: &jetstream::Context,
    stream: &str,
    of: &'a LagOf,
) -> Vec<(&'a str, jetstream::consumer::Info)> {
    use futures::TryStreamExt as _;
    let mut out = Vec::new();
    match of {
        LagOf::Durables(names) => {
            let Ok(s) = js.get_stream_no_info(stream).await else {
                return out;
            };
            for name in names {
                if let Ok(info) = s.consumer_info(name).await {
                    out.push((name.as_str(), info));
                }
            }
        }
        LagOf::Incarnations(bases) => {
            let listed = match js.get_stream_no_info(stream).await {
                Ok(s) => s.consumers().try_collect::<Vec<_>>().await.ok(),
                Err(_) => None,
            };
            let Some(all) = listed else {
                return out;
            };
            for base in bases {
                let mine = all
                    .iter()
                    .filter(|c| crate::incarnation::belongs(&c.name, base));
                if let Some(info) = crate::incarnation::in_use(mine) {
                    out.push((base.as_str(), info.clone()));
                }
            }
        }
    }
    out
}

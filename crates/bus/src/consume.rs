//! Consumers: durable pull consumers for the services, and a bounded read of one subject
//! for rebuilding an in-flight run after a crash or lease move (DESIGN §4).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
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
    let stream = js.get_stream(stream).await.map_err(nats("get stream"))?;
    let mut config = pull::Config {
        durable_name: Some(durable.to_owned()),
        ack_policy: AckPolicy::Explicit,
        deliver_policy: DeliverPolicy::All,
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
    stream
        .create_consumer(config)
        .await
        .map_err(nats("create durable consumer"))
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

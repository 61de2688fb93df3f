//! The broker-only yardsticks `bench pipeline` sets its figures against, on its private
//! nats-server, with chunk-sized messages on a stream of their own:
//! - [`publish`]: JetStream publishes (file store, acks pipelined) — the baseline;
//! - [`relay`]: the same publishes taken by a durable pull consumer on a second
//!   connection and acknowledged — the least broker work any design pays per chunk that
//!   is stored and then consumed from JetStream, with one ack per message (the
//!   normalizer's explicit acks) or one per pull batch (`AckPolicy::All`). The pipeline
//!   adds its own work to that on the same cores, so this floor bounds its ratio.

use anyhow::Result;
use async_nats::jetstream::consumer::pull::{MessagesError, MessagesErrorKind};
use bytes::Bytes;
use futures::StreamExt as _;
use std::time::{Duration, Instant};

/// Publishes acknowledged at once at most (the baseline keeps acks pipelined).
const PUBLISH_WINDOW: usize = 1024;

/// Messages per pull of [`relay`]: the normalizer's batch.
const RELAY_BATCH: usize = 256;

/// JetStream publishes of `n` messages of `size` bytes, per second.
pub async fn publish(js: &async_nats::jetstream::Context, n: usize, size: usize) -> Result<f64> {
    let stream = BenchStream::create(js, "SG_BENCH", "sg.bench").await?;
    let started = Instant::now();
    publish_all(js, &stream, n, size).await?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    stream.delete(js).await?;
    Ok(rate)
}

/// How [`relay`] acknowledges.
#[derive(Debug, Clone, Copy)]
pub enum Acks {
    /// One ack per message (`AckPolicy::Explicit`).
    EachMessage,
    /// One ack per pull batch, of its last message (`AckPolicy::All`).
    EachBatch,
}

impl Acks {
    /// How the figure is labelled.
    pub fn label(self) -> &'static str {
        match self {
            Acks::EachMessage => "an ack per message",
            Acks::EachBatch => "an ack per pull",
        }
    }
}

/// `n` messages of `size` bytes published on `js` and, concurrently, taken from a durable
/// pull consumer on `consumer_nats` (another connection, as the normalizer has) and
/// acknowledged: messages per second, from the first publish to the last ack.
pub async fn relay(
    js: &async_nats::jetstream::Context,
    consumer_nats: async_nats::Client,
    n: usize,
    size: usize,
    acks: Acks,
) -> Result<f64> {
    let stream = BenchStream::create(js, "SG_BENCH_RELAY", "sg.relay").await?;
    let consumer = async_nats::jetstream::new(consumer_nats)
        .get_stream(&stream.name)
        .await?
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("relay".into()),
            ack_policy: match acks {
                Acks::EachMessage => async_nats::jetstream::consumer::AckPolicy::Explicit,
                Acks::EachBatch => async_nats::jetstream::consumer::AckPolicy::All,
            },
            max_ack_pending: 20_000,
            ..Default::default()
        })
        .await?;
    let mut batches = streamgate_bus::consume::batches(&consumer, RELAY_BATCH).await?;
    let started = Instant::now();
    let take = async {
        let mut taken = 0usize;
        while taken < n {
            let Some(batch) = batches.next().await else {
                anyhow::bail!("the relay consumer ended after {taken} of {n} messages");
            };
            let msgs = delivered(batch)?;
            taken += msgs.len();
            match acks {
                Acks::EachMessage => {
                    for m in &msgs {
                        m.ack().await.map_err(anyhow::Error::msg)?;
                    }
                }
                Acks::EachBatch => {
                    if let Some(last) = msgs.last() {
                        last.ack().await.map_err(anyhow::Error::msg)?;
                    }
                }
            }
        }
        // The last acks reach the broker before the clock stops.
        all_acked(&consumer).await
    };
    let (published, taken) = futures::future::join(publish_all(js, &stream, n, size), take).await;
    published?;
    taken?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop(batches);
    stream.delete(js).await?;
    Ok(rate)
}

/// The messages of a pulled batch. A missed idle heartbeat is passed over: on a saturated
/// box the broker's heartbeat can come late, and the pull stream pulls again and goes on
/// (the services do the same); it once stopped the whole benchmark in its floor phase.
/// Any other error ends the relay.
fn delivered(
    batch: Vec<Result<async_nats::jetstream::Message, MessagesError>>,
) -> Result<Vec<async_nats::jetstream::Message>> {
    let mut msgs = Vec::with_capacity(batch.len());
    for item in batch {
        match item {
            Ok(m) => msgs.push(m),
            Err(e) if e.kind() == MessagesErrorKind::MissingHeartbeat => {
                tracing::debug!(error = %e, "relay: a heartbeat came late; pulling on");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(msgs)
}

/// Waits until the consumer has nothing delivered and unacknowledged.
async fn all_acked(consumer: &async_nats::jetstream::consumer::PullConsumer) -> Result<()> {
    let mut consumer = consumer.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.info().await?.num_ack_pending > 0 {
        anyhow::ensure!(Instant::now() < deadline, "relay acks never all arrived");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// A stream of the bench's own, deleted after use.
struct BenchStream {
    name: String,
    subject_prefix: String,
}

impl BenchStream {
    async fn create(
        js: &async_nats::jetstream::Context,
        name: &str,
        subject_prefix: &str,
    ) -> Result<BenchStream> {
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: vec![format!("{subject_prefix}.>")],
            ..Default::default()
        })
        .await?;
        Ok(BenchStream {
            name: name.into(),
            subject_prefix: subject_prefix.into(),
        })
    }

    async fn delete(self, js: &async_nats::jetstream::Context) -> Result<()> {
        js.delete_stream(&self.name).await?;
        Ok(())
    }
}

/// Publishes `n` messages over 32 subjects, [`PUBLISH_WINDOW`] acks in flight.
async fn publish_all(
    js: &async_nats::jetstream::Context,
    stream: &BenchStream,
    n: usize,
    size: usize,
) -> Result<()> {
    let payload = Bytes::from(vec![b'x'; size]);
    let mut pending = Vec::with_capacity(PUBLISH_WINDOW);
    for i in 0..n {
        pending.push(
            js.publish(
                format!("{}.{}", stream.subject_prefix, i % 32),
                payload.clone(),
            )
            .await?,
        );
        if pending.len() == PUBLISH_WINDOW {
            for ack in pending.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in pending {
        ack.await?;
    }
    Ok(())
}

//! Consumers made afresh by each owner of a partition: *incarnations*.
//!
//! A consumer that acknowledges in order (`AckPolicy::All`: one ack of a batch's highest
//! stream sequence covers the batch) is only safe while nothing but its owner's current
//! pull can take its messages, and while no ack from an earlier life of it can land on
//! it. Under a fixed name neither holds: a pull stream of an overlapping owner (a frozen
//! process resuming past its lease) keeps pulling from the consumer a new owner made
//! again under that name, and queued acks flushed on a reconnect hit it too
//! (docs/performance.md, fifth stop). So each owner — and each restart of one, after a
//! delivery that never arrived or a batch that failed — makes a consumer of its own,
//! `<base>-i<16 hex>`, from a known stream sequence, and then deletes every other
//! consumer of `base`. What an old incarnation's pull still takes, or an old ack still
//! covers, belongs to a consumer nobody reads any more.
//!
//! A new owner starts right after the lowest ack floor among the consumers it finds (all
//! of them acknowledged only what was processed), so it may process again what lies
//! between a floor and its owner's last ack — duplicates consumers are idempotent to —
//! and never skips anything. `base` itself (the fixed-name consumer of earlier releases)
//! counts as an incarnation, which upgrades a deployment in place.
//!
//! Metrics and operators name the stable `base` ([`crate::consume::report_lag`] reports
//! the incarnation in use under it, [`in_use`]).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::stream::ConsumerErrorKind;
use futures::TryStreamExt as _;

use crate::{nats, BusError};

/// What separates `base` from an incarnation's random part.
const SEPARATOR: &str = "-i";

/// A fresh incarnation name of `base`: `<base>-i<16 lowercase hex>`.
pub fn new_name(base: &str) -> String {
    format!("{base}{SEPARATOR}{:016x}", crate::lease::random_u64())
}

/// Whether the consumer `name` is an incarnation of `base`: `base` itself or
/// `<base>-i<16 hex>`. `sg-normalizer-p01` does not own `sg-normalizer-p010-i…`.
pub fn belongs(name: &str, base: &str) -> bool {
    match name.strip_prefix(base) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix(SEPARATOR)
            .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
        None => false,
    }
}

/// Every consumer of `stream` that is an incarnation of `base` ([`belongs`]).
pub async fn list(
    stream: &jetstream::stream::Stream,
    base: &str,
) -> Result<Vec<jetstream::consumer::Info>, BusError> {
    let all: Vec<_> = stream
        .consumers()
        .try_collect()
        .await
        .map_err(nats("list consumers"))?;
    Ok(all.into_iter().filter(|c| belongs(&c.name, base)).collect())
}

/// The consumer of `infos` its owner works on: the one that delivered furthest into
/// the stream (one left behind by an overlapping owner stops delivering), the newest of
/// those.
pub fn in_use<'a>(
    infos: impl IntoIterator<Item = &'a jetstream::consumer::Info>,
) -> Option<&'a jetstream::consumer::Info> {
    infos
        .into_iter()
        .max_by_key(|c| (c.delivered.stream_sequence, c.created))
}

/// The consumer of `stream` that serves `base` now: `base` itself or the
/// incarnation in use ([`in_use`]); `None` while there is none.
pub async fn current(
    js: &jetstream::Context,
    stream: &str,
    base: &str,
) -> Result<Option<jetstream::consumer::Info>, BusError> {
    let stream = js.get_stream(stream).await.map_err(nats("get stream"))?;
    let mine = list(&stream, base).await?;
    Ok(in_use(&mine).cloned())
}

/// Where a partition's new incarnation starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At this stream sequence: its owner processed everything of the partition before.
    At(u64),
    /// After the lowest ack floor of the incarnations there are; with none, at this
    /// stream sequence (after an older kind of consumer) or, without one, at the start.
    Resume(Option<u64>),
}

/// How a partition's incarnations are made.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The stream.
    pub stream: String,
    /// The stable name the incarnations extend (`sg-normalizer-pNN`).
    pub base: String,
    /// The partition's filter subject.
    pub filter: String,
    /// Ack wait.
    pub ack_wait: Duration,
    /// Max ack pending.
    pub max_ack_pending: i64,
}

/// A new incarnation, pulled from.
pub struct Incarnation {
    /// Its consumer name.
    pub name: String,
    /// The stream sequence it started at: everything of the partition before it had
    /// been processed.
    pub start: u64,
    /// Its consumer.
    pub consumer: jetstream::consumer::PullConsumer,
}

/// Makes a new incarnation of `spec.base` (in-order acks) starting at `start`, then
/// deletes every other one. Deleting comes second, so a crash between the two leaves a
/// consumer whose floor the next owner starts from, never none.
pub async fn open(
    js: &jetstream::Context,
    spec: &Spec,
    start: Start,
) -> Result<Incarnation, BusError> {
    let stream = js
        .get_stream(&spec.stream)
        .await
        .map_err(nats("get stream"))?;
    let others = list(&stream, &spec.base).await?;
    let start = match start {
        Start::At(seq) => seq,
        Start::Resume(fallback) => match others.iter().map(|c| c.ack_floor.stream_sequence).min() {
            Some(floor) => floor + 1,
            None => fallback.unwrap_or(1),
        },
    }
    .max(1);
    let name = new_name(&spec.base);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        ack_policy: AckPolicy::All,
        deliver_policy: DeliverPolicy::ByStartSequence {
            start_sequence: start,
        },
        ack_wait: spec.ack_wait,
        max_ack_pending: spec.max_ack_pending,
        filter_subject: spec.filter.clone(),
        ..Default::default()
    };
    let consumer = stream
        .create_consumer(config)
        .await
        .map_err(nats("create consumer incarnation"))?;
    delete(&stream, others.iter().map(|c| c.name.as_str())).await;
    Ok(Incarnation {
        name,
        start,
        consumer,
    })
}

/// Deletes every incarnation of `spec.base` but `keep` (what an overlapping owner left
/// behind) — only while `keep` itself exists.
pub async fn delete_others(
    js: &jetstream::Context,
    spec: &Spec,
    keep: &str,
) -> Result<(), BusError> {
    let stream = js
        .get_stream(&spec.stream)
        .await
        .map_err(nats("get stream"))?;
    let all = list(&stream, &spec.base).await?;
    // A caller whose own incarnation is gone was replaced by a new owner: its sweep
    // would delete the new owner's, and with it the partition's only floor.
    if all.iter().any(|c| c.name == keep) {
        let others = all.iter().map(|c| c.name.as_str()).filter(|&n| n != keep);
        delete(&stream, others).await;
    }
    Ok(())
}

/// Deletes the consumers `names`; one already gone is fine, and one that cannot be
/// deleted is logged (left behind, it only costs the broker a consumer; the next owner
/// or sweep deletes it).
async fn delete(stream: &jetstream::stream::Stream, names: impl Iterator<Item = &str>) {
    for name in names {
        match stream.delete_consumer(name).await {
            Ok(_) => {}
            Err(e)
                if matches!(e.kind(), ConsumerErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND) => {}
            Err(e) => {
                tracing::warn!(consumer = %name, error = %e, "cannot delete an old consumer incarnation")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incarnations_extend_their_base_and_nothing_else() {
        let name = new_name("sg-normalizer-p01");
        assert!(belongs(&name, "sg-normalizer-p01"), "{name}");
        assert!(belongs("sg-normalizer-p01", "sg-normalizer-p01"));
        assert!(!belongs(&name, "sg-normalizer-p0"));
        assert!(!belongs(
            "sg-normalizer-p010-i00ff00ff00ff00ff",
            "sg-normalizer-p01"
        ));
        assert!(!belongs("sg-normalizer-p01-iface", "sg-normalizer-p01"));
        assert!(!belongs("sg-normalizer-p01-i", "sg-normalizer-p01"));
        assert!(!belongs("sg-normalizer-p01-x12", "sg-normalizer-p01"));
        assert!(!belongs("sg-normalizer-p01-izz", "sg-normalizer-p01"));
        assert_ne!(new_name("b"), new_name("b"));
    }
}

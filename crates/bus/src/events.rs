//! Canonical events in `SG_EVENTS`.
//!
//! A message holds either
//! - one event: body protobuf `streamgate.v1.Event`, `Nats-Msg-Id` `<tenant>/<run>/<seq>`; or
//! - a batch: consecutive events of one run, body protobuf `streamgate.v1.EventBatch`,
//!   header `Sg-Batch` = the event count, `Nats-Msg-Id` `<tenant>/<run>/<first>-<last>`.
//!
//! A run id is unique only within its tenant (docs/architecture.md §3), so every id names both; the
//! tenant and run id are token-encoded ([`encode_token`]), so neither can hold a `/`.
//!
//! The normalizer publishes what a run's chunks in one consumer batch produced together
//! ([`publish_batches`]; one chunk's events when chunks arrive one at a time, several
//! chunks' in a backlog), which divides the broker's work per event (store, deliver, ack)
//! by the events per message. A retried publish of the same events carries the same ids
//! (the split into messages depends on the events only: [`MAX_BATCH_EVENTS`],
//! [`MAX_BATCH_BYTES`]) and JetStream drops it; a redelivery may group the chunks
//! differently, so consumers never depend on ids: they are idempotent on
//! `(tenant, run_id, seq)`.
//!
//! Every message has `Sg-Stream`: the stream kinds it holds (`assistant`, `thinking`,
//! `item`, `lifecycle`), comma-separated in order of first appearance, so consumers can
//! route without decoding. [`decode_message`] reads both shapes.

use async_nats::jetstream;
use async_nats::HeaderMap;
use prost::Message as _;
use streamgate_grammar::{RunEvent, Stream};
use streamgate_proto::v1;

use crate::raw::HDR_MSG_ID;
use crate::subject::{encode_token, RunAddr};
use crate::trace::{inject_context, TraceContext};
use crate::{hdr, nats, BusError};

/// The stream kinds a message holds: `assistant|thinking|item|lifecycle`, comma-separated.
pub const HDR_STREAM: &str = "Sg-Stream";
/// Present on batch messages: how many events the `EventBatch` body holds.
pub const HDR_BATCH: &str = "Sg-Batch";
/// What made a message's events: `<family>[/<dialect>]@<adapter version>`.
pub const HDR_ADAPTER: &str = "Sg-Adapter";
/// The grammar version of a message's events.
pub const HDR_GRAMMAR: &str = "Sg-Grammar";
/// Most events one message carries; a raw chunk that yields more is split.
pub const MAX_BATCH_EVENTS: usize = 1024;
/// Most encoded bytes one batch message carries (NATS' default max payload is 1 MiB); a
/// single event larger than this travels alone.
pub const MAX_BATCH_BYTES: usize = 256 * 1024;
/// What a batch message needs beside its events' bytes under the broker's `max_payload`:
/// headers (ids, kinds, provenance, trace context) and the batch's framing.
const BATCH_HEADROOM: usize = 4096;

/// `"<tenant>/<run>/<seq>"`, the event id (docs/architecture.md §3). Tenant and run id are
/// token-encoded, which leaves ordinary ids (`[A-Za-z0-9_-]`) unchanged, keeps any id a
/// valid header value and makes the id unambiguous (neither part can hold a `/`).
pub fn event_msg_id(tenant: &str, run_id: &str, seq: u64) -> String {
    format!("{}/{}/{seq}", encode_token(tenant), encode_token(run_id))
}

/// The message id of the events `first..=last` of a run: [`event_msg_id`] for one event,
/// `"<tenant>/<run>/<first>-<last>"` for a batch.
pub fn batch_msg_id(tenant: &str, run_id: &str, first: u64, last: u64) -> String {
    if first == last {
        event_msg_id(tenant, run_id, first)
    } else {
        format!(
            "{}/{}/{first}-{last}",
            encode_token(tenant),
            encode_token(run_id)
        )
    }
}

/// The headers a single event is published with.
pub fn event_headers(ev: &RunEvent) -> HeaderMap {
    let mut h = HeaderMap::new();
    hdr::put(
        &mut h,
        HDR_MSG_ID,
        event_msg_id(&ev.envelope.tenant, &ev.envelope.run_id, ev.event.seq),
    );
    hdr::put(&mut h, HDR_STREAM, ev.event.stream().as_str());
    h
}

/// The stream kinds a message holds, from its headers without decoding the body, in
/// order of first appearance; empty when the header is absent. Unknown kinds are
/// skipped.
pub fn streams_of(headers: Option<&HeaderMap>) -> Vec<Stream> {
    headers
        .and_then(|h| hdr::get(h, HDR_STREAM))
        .map(|v| {
            v.split(',')
                .filter_map(|k| Stream::parse(k.trim()))
                .collect()
        })
        .unwrap_or_default()
}

/// One `SG_EVENTS` message, ready to publish.
#[derive(Debug, Clone)]
pub struct EventMessage {
    /// `Nats-Msg-Id`, `Sg-Stream` and, for batches, `Sg-Batch`.
    pub headers: HeaderMap,
    /// Protobuf `Event` or `EventBatch`.
    pub payload: bytes::Bytes,
}

/// The messages that carry `events` — consecutive events of one run — split by
/// [`MAX_BATCH_EVENTS`] and [`MAX_BATCH_BYTES`]. The split depends on the events only,
/// so the same events always get the same message ids.
///
/// Errors with [`BusError::BatchGap`] when the seqs are not consecutive (the id
/// `<first>-<last>` would then claim events the message does not hold).
pub fn messages_for(events: &[RunEvent]) -> Result<Vec<EventMessage>, BusError> {
    messages_within(events, MAX_BATCH_BYTES)
}

/// [`messages_for`] with batches of at most `max_bytes` encoded bytes (at most
/// [`MAX_BATCH_BYTES`] still): what [`publish_batches`] uses under a broker whose
/// `max_payload` is smaller than that.
pub fn messages_within(
    events: &[RunEvent],
    max_bytes: usize,
) -> Result<Vec<EventMessage>, BusError> {
    let max_bytes = max_bytes.min(MAX_BATCH_BYTES);
    for pair in events.windows(2) {
        if !same_run(&pair[0].envelope, &pair[1].envelope) {
            return Err(BusError::RunMismatch {
                addr_run: run_label(&pair[0].envelope.tenant, &pair[0].envelope.run_id),
                event_run: run_label(&pair[1].envelope.tenant, &pair[1].envelope.run_id),
            });
        }
        if pair[1].event.seq != pair[0].event.seq + 1 {
            return Err(BusError::BatchGap {
                run: pair[0].envelope.run_id.clone(),
                after: pair[0].event.seq,
                next: pair[1].event.seq,
            });
        }
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut batch: Vec<v1::Event> = Vec::new();
    let mut bytes = 0;
    for (i, ev) in events.iter().enumerate() {
        let pb = v1::Event::from(ev);
        let len = prost::encoding::message::encoded_len(1, &pb);
        if !batch.is_empty() && (batch.len() == MAX_BATCH_EVENTS || bytes + len > max_bytes) {
            out.push(batch_message(&events[start..i], std::mem::take(&mut batch)));
            start = i;
            bytes = 0;
        }
        bytes += len;
        batch.push(pb);
    }
    if !batch.is_empty() {
        out.push(batch_message(&events[start..], batch));
    }
    Ok(out)
}

/// Whether two envelopes name the same run: a run is (tenant, run id).
fn same_run(a: &streamgate_grammar::Envelope, b: &streamgate_grammar::Envelope) -> bool {
    a.run_id == b.run_id && a.tenant == b.tenant
}

/// `<tenant>/<run>` for errors.
fn run_label(tenant: &str, run_id: &str) -> String {
    format!("{tenant}/{run_id}")
}

/// The message for `events` (non-empty), whose protobuf forms are `pb`.
fn batch_message(events: &[RunEvent], mut pb: Vec<v1::Event>) -> EventMessage {
    let (first, last) = (&events[0], &events[events.len() - 1]);
    if let ([ev], [one]) = (events, pb.as_mut_slice()) {
        return EventMessage {
            headers: event_headers(ev),
            payload: std::mem::take(one).encode_to_vec().into(),
        };
    }
    let mut kinds: Vec<&str> = Vec::with_capacity(4);
    for ev in events {
        let k = ev.event.stream().as_str();
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let mut h = HeaderMap::new();
    hdr::put(
        &mut h,
        HDR_MSG_ID,
        batch_msg_id(
            &first.envelope.tenant,
            &first.envelope.run_id,
            first.event.seq,
            last.event.seq,
        ),
    );
    hdr::put(&mut h, HDR_STREAM, kinds.join(","));
    hdr::put(&mut h, HDR_BATCH, events.len().to_string());
    EventMessage {
        headers: h,
        payload: v1::EventBatch { events: pb }.encode_to_vec().into(),
    }
}

/// What made a message's events (the `Sg-Adapter` and `Sg-Grammar` headers), so the
/// archive can record it per run and `verify` can find runs made by older adapters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeBy {
    /// `<family>` or `<family>/<dialect>`.
    pub adapter: String,
    /// The adapter's version.
    pub adapter_version: u32,
    /// The grammar's version.
    pub grammar_version: u32,
}

impl MadeBy {
    /// Puts the two headers on `h`.
    pub fn stamp(&self, h: &mut HeaderMap) {
        hdr::put(
            h,
            HDR_ADAPTER,
            format!("{}@{}", self.adapter, self.adapter_version),
        );
        hdr::put(h, HDR_GRAMMAR, self.grammar_version.to_string());
    }

    /// Reads the two headers; `None` when either is absent or malformed (a message from
    /// a normalizer that predates them, or from another producer).
    pub fn read(headers: Option<&HeaderMap>) -> Option<MadeBy> {
        let h = headers?;
        let adapter = h.get(HDR_ADAPTER)?.as_str();
        let (adapter, version) = adapter.rsplit_once('@')?;
        let grammar = h.get(HDR_GRAMMAR)?.as_str().parse().ok()?;
        let adapter_version = version.parse().ok()?;
        (!adapter.is_empty()).then(|| MadeBy {
            adapter: adapter.to_owned(),
            adapter_version,
            grammar_version: grammar,
        })
    }
}

/// Consecutive events of one run to publish together — what one or more raw chunks
/// produced — with the trace context of the work that produced them.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The events, ascending seq without gaps.
    pub events: &'a [RunEvent],
    /// Put on every message of the batch, so consumers continue the trace.
    pub trace: Option<&'a TraceContext>,
    /// Stamped on every message of the batch.
    pub made_by: Option<&'a MadeBy>,
}

impl<'a> From<&'a [RunEvent]> for Batch<'a> {
    fn from(events: &'a [RunEvent]) -> Batch<'a> {
        Batch {
            events,
            trace: None,
            made_by: None,
        }
    }
}

/// Publishes batches of one run's events as [`messages_for`] splits them, to
/// `addr.events_subject()`, pipelining: send all, then await every ack. Returns when
/// every message is durably in `SG_EVENTS`.
///
/// Every event's envelope must name `addr`'s tenant and run id ([`BusError::RunMismatch`] otherwise,
/// checked before anything is sent: [`messages_for`] holds a batch to one run, so its
/// first event stands for all). Re-publishing the same batches is harmless: the
/// message ids make JetStream drop duplicates inside its window, and consumers are
/// idempotent on `(tenant, run_id, seq)` beyond it.
pub async fn publish_batches<'a, B: Into<Batch<'a>>>(
    js: &jetstream::Context,
    addr: &RunAddr,
    batches: impl IntoIterator<Item = B>,
) -> Result<(), BusError> {
    let max_payload = js.client().server_info().max_payload;
    publish_batches_under(js, addr, batches, max_payload).await
}

/// [`publish_batches`] under a broker `max_payload` the caller already read (the
/// normalizer reads it once per consumer batch, not once per run: `server_info` copies
/// the whole server info under a lock).
pub async fn publish_batches_under<'a, B: Into<Batch<'a>>>(
    js: &jetstream::Context,
    addr: &RunAddr,
    batches: impl IntoIterator<Item = B>,
    max_payload: usize,
) -> Result<(), BusError> {
    // Room for the headers and the batch's framing under the broker's message limit.
    let max_bytes = max_payload.saturating_sub(BATCH_HEADROOM);
    let mut messages = Vec::new();
    for batch in batches {
        let batch: Batch<'a> = batch.into();
        let first = messages.len();
        messages.extend(messages_within(batch.events, max_bytes)?);
        if let Some(ev) = batch
            .events
            .first()
            .filter(|e| e.envelope.run_id != addr.run_id || e.envelope.tenant != addr.tenant)
        {
            return Err(BusError::RunMismatch {
                addr_run: run_label(&addr.tenant, &addr.run_id),
                event_run: run_label(&ev.envelope.tenant, &ev.envelope.run_id),
            });
        }
        for m in &mut messages[first..] {
            if let Some(cx) = batch.trace {
                inject_context(&mut m.headers, cx);
            }
            if let Some(made_by) = batch.made_by {
                made_by.stamp(&mut m.headers);
            }
        }
    }
    let subject = addr.events_subject();
    let mut acks = Vec::with_capacity(messages.len());
    for m in messages {
        // `publish_with_headers` returns once the message is written to the connection;
        // the ack arrives later, so all sends share one round trip.
        let ack = js
            .publish_with_headers(subject.clone(), m.headers, m.payload)
            .await
            .map_err(nats("publish event"))?;
        acks.push(ack);
    }
    // All at once: each ack's timeout starts when it is first polled, so acks lost
    // across a reconnect cost one timeout, not one per message.
    futures::future::try_join_all(acks.into_iter().map(std::future::IntoFuture::into_future))
        .await
        .map_err(nats("publish event ack"))?;
    Ok(())
}

/// Publishes each event as its own message (see [`publish_batches`]): for producers
/// that emit events one at a time.
pub async fn publish_events(
    js: &jetstream::Context,
    addr: &RunAddr,
    events: &[RunEvent],
) -> Result<(), BusError> {
    publish_batches(js, addr, events.chunks(1)).await
}

/// Decodes a single-event payload (protobuf `streamgate.v1.Event`).
pub fn decode_event(payload: &[u8]) -> Result<RunEvent, BusError> {
    let pb = v1::Event::decode(payload)?;
    Ok(RunEvent::try_from(pb)?)
}

/// Decodes an `SG_EVENTS` message of either shape into its events, in seq order.
pub fn decode_message(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Vec<RunEvent>, BusError> {
    let Some(count) = headers
        .map(|h| hdr::number::<usize>(h, HDR_BATCH))
        .transpose()?
        .flatten()
    else {
        return Ok(vec![decode_event(payload)?]);
    };
    let batch = v1::EventBatch::decode(payload)?;
    if batch.events.len() != count {
        return Err(BusError::InvalidHeader {
            name: HDR_BATCH,
            value: format!("{count} (the body holds {})", batch.events.len()),
        });
    }
    batch
        .events
        .into_iter()
        .map(|pb| RunEvent::try_from(pb).map_err(BusError::from))
        .collect()
}

/// [`decode_message`] for a received message.
pub fn decode_msg(msg: &async_nats::Message) -> Result<Vec<RunEvent>, BusError> {
    decode_message(msg.headers.as_ref(), &msg.payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_the_tenant() {
        assert_eq!(event_msg_id("acme", "r1", 7), "acme/r1/7");
        assert_eq!(batch_msg_id("acme", "r1", 7, 7), "acme/r1/7");
        assert_eq!(batch_msg_id("acme", "r1", 1, 9), "acme/r1/1-9");
        assert_ne!(
            event_msg_id("acme", "r1", 7),
            event_msg_id("globex", "r1", 7)
        );
        // Encoded, so a `/` inside an id cannot make two runs share an id.
        assert_eq!(event_msg_id("a/b", "c", 1), "a%2Fb/c/1");
        assert_ne!(event_msg_id("a/b", "c", 1), event_msg_id("a", "b/c", 1));
    }
}

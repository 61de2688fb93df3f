//! Canonical events in `SG_EVENTS`: protobuf `streamgate.v1.Event`, one message per
//! event, `Nats-Msg-Id` `<run>/<seq>`, stream kind in `Sg-Stream`.

use async_nats::jetstream;
use async_nats::HeaderMap;
use prost::Message as _;
use streamgate_grammar::{RunEvent, Stream};
use streamgate_proto::v1;

use crate::raw::HDR_MSG_ID;
use crate::subject::{encode_token, RunAddr};
use crate::{hdr, nats, BusError};

/// The event's stream kind: `assistant|thinking|item|lifecycle`.
pub const HDR_STREAM: &str = "Sg-Stream";

/// `"<run>/<seq>"`, the event id (DESIGN §2). The run id is token-encoded, which leaves
/// ordinary ids (`[A-Za-z0-9_-]`) unchanged and keeps any run id a valid header value.
pub fn event_msg_id(run_id: &str, seq: u64) -> String {
    format!("{}/{seq}", encode_token(run_id))
}

/// The headers an event is published with.
pub fn event_headers(ev: &RunEvent) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        HDR_MSG_ID,
        event_msg_id(&ev.envelope.run_id, ev.event.seq).as_str(),
    );
    h.insert(HDR_STREAM, ev.event.stream().as_str());
    h
}

/// The stream kind from a message's headers, without decoding the body; `None` when the
/// header is absent or unknown.
pub fn stream_of(headers: Option<&HeaderMap>) -> Option<Stream> {
    headers
        .and_then(|h| hdr::get(h, HDR_STREAM))
        .and_then(Stream::parse)
}

/// Encodes as protobuf `streamgate.v1.Event`.
pub fn encode_event(ev: &RunEvent) -> bytes::Bytes {
    v1::Event::from(ev).encode_to_vec().into()
}

/// Encodes as protobuf `streamgate.v1.Event` (streamgate-proto), publishes with
/// `Nats-Msg-Id` and `Sg-Stream` headers to `addr.events_subject()`, pipelining: send all,
/// then await every ack. Returns when every event is durably in `SG_EVENTS`.
///
/// Every event's envelope must name `addr.run_id` ([`BusError::RunMismatch`] otherwise,
/// checked before anything is sent). Re-publishing the same events is harmless: the
/// message ids make JetStream drop duplicates inside its window, and consumers are
/// idempotent on `(run_id, seq)` beyond it.
pub async fn publish_events(
    js: &jetstream::Context,
    addr: &RunAddr,
    events: &[RunEvent],
) -> Result<(), BusError> {
    if let Some(ev) = events.iter().find(|e| e.envelope.run_id != addr.run_id) {
        return Err(BusError::RunMismatch {
            addr_run: addr.run_id.clone(),
            event_run: ev.envelope.run_id.clone(),
        });
    }
    let subject = addr.events_subject();
    let mut acks = Vec::with_capacity(events.len());
    for ev in events {
        // `publish_with_headers` returns once the message is written to the connection;
        // the ack arrives later, so all sends share one round trip.
        let ack = js
            .publish_with_headers(subject.clone(), event_headers(ev), encode_event(ev))
            .await
            .map_err(nats("publish event"))?;
        acks.push(ack);
    }
    for ack in acks {
        ack.await.map_err(nats("publish event ack"))?;
    }
    Ok(())
}

/// Decodes a `SG_EVENTS` payload into the grammar event with its envelope.
pub fn decode_event(payload: &[u8]) -> Result<RunEvent, BusError> {
    let pb = v1::Event::decode(payload)?;
    Ok(RunEvent::try_from(pb)?)
}

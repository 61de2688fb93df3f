//! Raw messages in `SG_RAW`: one chunk of provider bytes, or a run's close marker.
//! The wire format is described in the crate docs ("Raw-message format").

use async_nats::jetstream;
use async_nats::HeaderMap;
use bytes::Bytes;

use streamgate_grammar::ids;

use crate::subject::{encode_token, is_literal_token, RunAddr, SubjectKind};
use crate::{hdr, nats, BusError, SubjectError};

/// `Nats-Msg-Id`: the JetStream dedupe key.
pub const HDR_MSG_ID: &str = "Nats-Msg-Id";
/// Tenant (token-encoded); optional on input, must match the subject.
pub const HDR_TENANT: &str = "Sg-Tenant";
/// Run id (token-encoded); optional on input, must match the subject.
pub const HDR_RUN: &str = "Sg-Run";
/// Chat session key (token-encoded); optional.
pub const HDR_SESSION: &str = "Sg-Session";
/// Wire family: `f1`, `f2`, … or `auto` (default when absent).
pub const HDR_FAMILY: &str = "Sg-Family";
/// Dialect hint within the family; optional.
pub const HDR_DIALECT: &str = "Sg-Dialect";
/// 0-based chunk index within the run, decimal; required.
pub const HDR_CHUNK: &str = "Sg-Chunk";
/// Ingest time, milliseconds since the Unix epoch, decimal.
pub const HDR_INGEST_TS: &str = "Sg-Ingest-Ts";
/// Close marker: `normal`, `abnormal` or `timeout`.
pub const HDR_CLOSE: &str = "Sg-Close";
/// Byte offset of the chunk's first byte within the run's bytes, decimal (on a close
/// marker: the run's total bytes); optional. Front doors that cut a body as it arrives
/// (not identically on a resend) set it, so a resend resumes by byte, not by chunk.
pub const HDR_OFFSET: &str = "Sg-Offset";
/// JetStream's optimistic-concurrency header: the publish is refused unless the last
/// message on the subject has this stream sequence (0: the subject has none).
pub const HDR_EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";

/// Where a chunk sits in its run, for [`send_raw_placed`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placement {
    /// [`HDR_OFFSET`]: the run byte offset of the chunk's first byte.
    pub offset: Option<u64>,
    /// [`HDR_EXPECTED_LAST_SUBJECT_SEQ`]: store the chunk only if the run's last stored
    /// message is this one (a fence against a cut request's publishes still in flight).
    pub expect_last_seq: Option<u64>,
}

/// Family used when a message names none: the normalizer sniffs the bytes.
pub const FAMILY_AUTO: &str = "auto";

/// How a close marker says the stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseKind {
    /// The producer saw the provider end the stream.
    Normal,
    /// The connection broke or the producer gave up.
    Abnormal,
    /// Nothing arrived for too long; a reaper closed the run.
    Timeout,
}

impl CloseKind {
    /// The header value: `normal`, `abnormal` or `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseKind::Normal => "normal",
            CloseKind::Abnormal => "abnormal",
            CloseKind::Timeout => "timeout",
        }
    }

    /// Parses a header value (exact, lowercase).
    pub fn parse(s: &str) -> Option<CloseKind> {
        match s {
            "normal" => Some(CloseKind::Normal),
            "abnormal" => Some(CloseKind::Abnormal),
            "timeout" => Some(CloseKind::Timeout),
            _ => None,
        }
    }
}

impl std::fmt::Display for CloseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One raw message: a chunk of provider bytes, or a close marker (empty body).
#[derive(Debug, Clone, PartialEq)]
pub struct RawChunk {
    /// The run the bytes belong to.
    pub addr: RunAddr,
    /// Chat session the run belongs to, if any.
    pub session_key: Option<String>,
    /// Wire family: `"f1"`, `"f2"`, …, or `"auto"`.
    pub family: String,
    /// Optional dialect hint.
    pub dialect: Option<String>,
    /// 0-based chunk index within the run. On a close marker: the number of data chunks
    /// published before it.
    pub chunk: u64,
    /// Ingest time, ms since the Unix epoch; becomes the `ts` of events it produces.
    pub ingest_ts_ms: i64,
    /// `Some` on the close marker.
    pub close: Option<CloseKind>,
    /// Provider bytes; empty on a close marker.
    pub body: Bytes,
}

impl RawChunk {
    /// `"<tenant>/<run>/raw/<chunk>"` (docs/architecture.md §3); close markers use
    /// `"<tenant>/<run>/raw/close"` so that only one close marker per run is ever
    /// accepted by the dedupe window. A run id is unique only within its tenant, so the
    /// tenant is part of the id: the same run id under two tenants never dedupes.
    /// `<tenant>` and `<run>` are token-encoded (identical for ids made of
    /// `[A-Za-z0-9_-]`; `/` becomes `%2F`), which keeps the id a valid header value and
    /// unambiguous for any pair of ids.
    pub fn msg_id(&self) -> String {
        let tenant = encode_token(&self.addr.tenant);
        let run = encode_token(&self.addr.run_id);
        match self.close {
            Some(_) => format!("{tenant}/{run}/raw/close"),
            None => format!("{tenant}/{run}/raw/{}", self.chunk),
        }
    }

    /// Every header of the raw-message format, including `Nats-Msg-Id`.
    pub fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        hdr::put(&mut h, HDR_MSG_ID, self.msg_id());
        hdr::put_text(&mut h, HDR_TENANT, &self.addr.tenant);
        hdr::put_text(&mut h, HDR_RUN, &self.addr.run_id);
        if let Some(s) = &self.session_key {
            hdr::put_text(&mut h, HDR_SESSION, s);
        }
        hdr::put_text(&mut h, HDR_FAMILY, &self.family);
        if let Some(d) = &self.dialect {
            hdr::put_text(&mut h, HDR_DIALECT, d);
        }
        hdr::put(&mut h, HDR_CHUNK, self.chunk.to_string());
        hdr::put(&mut h, HDR_INGEST_TS, self.ingest_ts_ms.to_string());
        if let Some(c) = self.close {
            hdr::put(&mut h, HDR_CLOSE, c.as_str());
        }
        h
    }

    /// Parses a message from `SG_RAW` (subject + headers + payload). `Sg-Ingest-Ts` is
    /// required here; [`RawChunk::from_message`] can fall back to JetStream's timestamp.
    ///
    /// The partition is taken from the subject; check it against the deployment's count
    /// with [`RunAddr::check_partition`] (or use [`RawChunk::from_parts_checked`]).
    pub fn from_parts(
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: Bytes,
    ) -> Result<RawChunk, BusError> {
        Self::parse(subject, headers, payload, None)
    }

    /// [`RawChunk::from_parts`], then verifies the subject's partition is
    /// `partition_of(run, partitions)`.
    pub fn from_parts_checked(
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: Bytes,
        partitions: u32,
    ) -> Result<RawChunk, BusError> {
        let chunk = Self::from_parts(subject, headers, payload)?;
        chunk.addr.check_partition(partitions)?;
        Ok(chunk)
    }

    /// Parses a JetStream message from `SG_RAW`. When `Sg-Ingest-Ts` is absent, the time
    /// JetStream stored the message is used: it is part of the stored message, so every
    /// replay sees the same value.
    pub fn from_message(msg: &jetstream::Message) -> Result<RawChunk, BusError> {
        let fallback = msg.info().ok().map(|i| {
            // ns → ms; i64 ms covers ±292 million years, so the narrowing cannot fail for
            // any real timestamp.
            (i.published.unix_timestamp_nanos() / 1_000_000) as i64
        });
        Self::parse(
            msg.subject.as_str(),
            msg.headers.as_ref(),
            msg.payload.clone(),
            fallback,
        )
    }

    /// Parses a message read directly from `SG_RAW` (e.g. the last one of a run), with
    /// the same ingest-time fallback as [`RawChunk::from_message`].
    pub fn from_stream_message(
        msg: &async_nats::jetstream::message::StreamMessage,
    ) -> Result<RawChunk, BusError> {
        let fallback = (msg.time.unix_timestamp_nanos() / 1_000_000) as i64;
        Self::parse(
            msg.subject.as_str(),
            Some(&msg.headers),
            msg.payload.clone(),
            Some(fallback),
        )
    }

    fn parse(
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: Bytes,
        fallback_ts_ms: Option<i64>,
    ) -> Result<RawChunk, BusError> {
        let (addr, kind) = RunAddr::parse_subject_kind(subject).map_err(|e| match e {
            SubjectError::InvalidId(e) => BusError::InvalidId(e),
            e => e.into(),
        })?;
        if kind != SubjectKind::Raw {
            return Err(SubjectError::Malformed(subject.to_owned()).into());
        }
        let empty = HeaderMap::new();
        let [tenant, run, chunk, ingest_ts, close, session, family, dialect] = hdr::find(
            headers.unwrap_or(&empty),
            [
                HDR_TENANT,
                HDR_RUN,
                HDR_CHUNK,
                HDR_INGEST_TS,
                HDR_CLOSE,
                HDR_SESSION,
                HDR_FAMILY,
                HDR_DIALECT,
            ],
        );
        for (name, header, from_subject) in [
            (HDR_TENANT, tenant, &*addr.tenant),
            (HDR_RUN, run, &*addr.run_id),
        ] {
            if let Some(v) = header {
                matches_subject(name, v, from_subject)?;
            }
        }
        let chunk = chunk
            .map(|v| hdr::parse_number::<u64>(HDR_CHUNK, v))
            .transpose()?
            .ok_or(BusError::MissingHeader(HDR_CHUNK))?;
        let ingest_ts_ms = match ingest_ts
            .map(|v| hdr::parse_number::<i64>(HDR_INGEST_TS, v))
            .transpose()?
        {
            Some(ts) => ts,
            None => fallback_ts_ms.ok_or(BusError::MissingHeader(HDR_INGEST_TS))?,
        };
        let close = close
            .map(|v| {
                CloseKind::parse(v.trim()).ok_or_else(|| BusError::InvalidHeader {
                    name: HDR_CLOSE,
                    value: v.to_owned(),
                })
            })
            .transpose()?;
        if close.is_some() && !payload.is_empty() {
            return Err(BusError::CloseWithBody(addr.run_id.into()));
        }
        let text = |name, v: Option<&str>| v.map(|v| hdr::decode_text(name, v)).transpose();
        let session_key = text(HDR_SESSION, session)?;
        // The id rule, as at the other front doors: a message that breaks it is refused
        // here, so it never reaches a run table, a KV key or an outbound header (the
        // tenant and run id were checked as the subject was parsed).
        if let Some(session) = &session_key {
            ids::check(ids::IdKind::Session, session)?;
        }
        let family = text(HDR_FAMILY, family)?
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| FAMILY_AUTO.to_owned());
        let dialect = text(HDR_DIALECT, dialect)?.filter(|d| !d.is_empty());
        Ok(RawChunk {
            session_key,
            dialect,
            family,
            chunk,
            ingest_ts_ms,
            close,
            body: payload,
            addr,
        })
    }
}

/// Checks that the token-encoded header `name` (value `v`) names what the subject does.
/// A value made of literal token bytes only is its own decoding, so the common case
/// compares without decoding (allocating) it.
fn matches_subject(name: &'static str, v: &str, from_subject: &str) -> Result<(), BusError> {
    let trimmed = v.trim();
    let header = if is_literal_token(trimmed) {
        std::borrow::Cow::Borrowed(trimmed)
    } else {
        std::borrow::Cow::Owned(hdr::decode_text(name, v)?)
    };
    if header == from_subject {
        return Ok(());
    }
    Err(BusError::HeaderMismatch {
        name,
        header: header.into_owned(),
        subject: from_subject.to_owned(),
    })
}

/// What JetStream said about one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPublish {
    /// Stream sequence of the stored message (of the original one for a duplicate).
    pub sequence: u64,
    /// True when the dedupe window already held this message id.
    pub duplicate: bool,
}

/// Publishes and waits for the JetStream ack (durable). Returns the stream sequence.
pub async fn publish_raw(js: &jetstream::Context, chunk: &RawChunk) -> Result<u64, BusError> {
    publish_raw_with(js, chunk, None).await.map(|p| p.sequence)
}

/// [`publish_raw`] with an optional trace context, reporting whether the message was
/// a duplicate.
pub async fn publish_raw_with(
    js: &jetstream::Context,
    chunk: &RawChunk,
    trace: Option<&crate::trace::TraceContext>,
) -> Result<RawPublish, BusError> {
    send_raw(js, chunk, trace).await?.await
}

/// Sends one raw message without waiting for its ack: the returned future waits for it
/// (and is bounded by the context's timeout once awaited). Lets a producer keep a few
/// publishes in flight (a window) instead of one round trip per chunk. Messages sent on
/// one connection are stored in the order they were sent.
pub async fn send_raw(
    js: &jetstream::Context,
    chunk: &RawChunk,
    trace: Option<&crate::trace::TraceContext>,
) -> Result<
    impl std::future::Future<Output = Result<RawPublish, BusError>> + Send + 'static,
    BusError,
> {
    send_raw_placed(js, chunk, trace, Placement::default()).await
}

/// [`send_raw`] with the chunk's [`Placement`] in its headers.
pub async fn send_raw_placed(
    js: &jetstream::Context,
    chunk: &RawChunk,
    trace: Option<&crate::trace::TraceContext>,
    at: Placement,
) -> Result<
    impl std::future::Future<Output = Result<RawPublish, BusError>> + Send + 'static,
    BusError,
> {
    if chunk.close.is_some() && !chunk.body.is_empty() {
        // Refuse instead of publishing bytes that the dedupe id would make unrecoverable.
        return Err(BusError::CloseWithBody(chunk.addr.run_id.to_string()));
    }
    // Refused before it reaches the connection: an over-long id would make a subject
    // past the broker's control-line limit, which drops the whole client connection
    // (the address's ids are checked by their type; the session is a plain string).
    if let Some(session) = &chunk.session_key {
        ids::check(ids::IdKind::Session, session)?;
    }
    let mut headers = chunk.headers();
    if let Some(cx) = trace {
        crate::trace::inject_context(&mut headers, cx);
    }
    if let Some(offset) = at.offset {
        headers.insert(HDR_OFFSET, offset.to_string().as_str());
    }
    if let Some(seq) = at.expect_last_seq {
        headers.insert(HDR_EXPECTED_LAST_SUBJECT_SEQ, seq.to_string().as_str());
    }
    let ack = js
        .publish_with_headers(chunk.addr.raw_subject(), headers, chunk.body.clone())
        .await
        .map_err(nats("publish raw"))?;
    Ok(async move {
        let ack = ack.await.map_err(nats("publish raw ack"))?;
        Ok(RawPublish {
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(close: Option<CloseKind>) -> RawChunk {
        RawChunk {
            addr: RunAddr::parse("acme", "run 1", 32).unwrap(),
            session_key: Some("tg:42 é".into()),
            family: "f2".into(),
            dialect: Some("openrouter".into()),
            chunk: 3,
            ingest_ts_ms: 1_700_000_000_123,
            close,
            body: if close.is_some() {
                Bytes::new()
            } else {
                Bytes::from_static(b"data: {}\n\n")
            },
        }
    }

    #[test]
    fn headers_round_trip() {
        for c in [None, Some(CloseKind::Timeout)] {
            let raw = chunk(c);
            let h = raw.headers();
            let back = RawChunk::from_parts(&raw.addr.raw_subject(), Some(&h), raw.body.clone());
            assert_eq!(back.unwrap(), raw);
        }
        assert_eq!(chunk(None).msg_id(), "acme/run%201/raw/3");
        assert_eq!(
            chunk(Some(CloseKind::Normal)).msg_id(),
            "acme/run%201/raw/close"
        );
        // The same run id under another tenant is another message.
        let mut other = chunk(None);
        other.addr = RunAddr::parse("globex", "run 1", 32).unwrap();
        assert_eq!(other.msg_id(), "globex/run%201/raw/3");
        // A `/` inside an id cannot make two pairs collide.
        let mut a = chunk(None);
        a.addr = RunAddr::parse("a/b", "c", 32).unwrap();
        let mut b = chunk(None);
        b.addr = RunAddr::parse("a", "b/c", 32).unwrap();
        assert_ne!(a.msg_id(), b.msg_id());
    }

    #[test]
    fn minimal_foreign_message_parses() {
        let mut h = HeaderMap::new();
        h.insert("sg-chunk", "0");
        h.insert("Sg-Ingest-Ts", "5");
        let c = RawChunk::from_parts("sg.raw.t.0.r", Some(&h), Bytes::from_static(b"x")).unwrap();
        assert_eq!((c.family.as_str(), c.chunk, c.ingest_ts_ms), ("auto", 0, 5));
        assert!(RawChunk::from_parts_checked("sg.raw.t.0.r", Some(&h), Bytes::new(), 32).is_err());
    }

    #[test]
    fn a_header_is_read_by_its_exact_name_first_then_in_any_case() {
        let raw = chunk(None);
        let subject = raw.addr.raw_subject();
        let mut h = raw.headers();
        h.insert("SG-CHUNK", "9");
        h.insert("sg-family", "f5");
        let c = RawChunk::from_parts(&subject, Some(&h), Bytes::new()).unwrap();
        assert_eq!(
            (c.chunk, c.family.as_str()),
            (raw.chunk, raw.family.as_str())
        );
        let mut h = HeaderMap::new();
        h.insert("SG-CHUNK", "9");
        h.insert("sg-ingest-ts", "5");
        h.insert("sg-run", " run%201 ");
        let c = RawChunk::from_parts(&subject, Some(&h), Bytes::new()).unwrap();
        assert_eq!((c.chunk, c.ingest_ts_ms), (9, 5));
    }

    #[test]
    fn bad_messages_are_rejected() {
        let raw = chunk(None);
        let subject = raw.addr.raw_subject();
        let mut h = raw.headers();
        h.insert(HDR_RUN, "other");
        assert!(matches!(
            RawChunk::from_parts(&subject, Some(&h), Bytes::new()),
            Err(BusError::HeaderMismatch { header, .. }) if header == "other"
        ));
        // A value breaking the token rule is refused as such, not compared.
        for bad in ["run 1", "run%2"] {
            let mut h = raw.headers();
            h.insert(HDR_RUN, bad);
            assert!(matches!(
                RawChunk::from_parts(&subject, Some(&h), Bytes::new()),
                Err(BusError::InvalidHeader { name: HDR_RUN, .. })
            ));
        }
        let mut h = raw.headers();
        h.insert(HDR_CLOSE, "normal");
        assert!(matches!(
            RawChunk::from_parts(&subject, Some(&h), Bytes::from_static(b"x")),
            Err(BusError::CloseWithBody(_))
        ));
        assert!(matches!(
            RawChunk::from_parts(&subject, None, Bytes::new()),
            Err(BusError::MissingHeader(HDR_CHUNK))
        ));
        // The id rule: control characters, over-long and empty ids are refused.
        // A subject's ids are checked as it is parsed; a session when its header is read.
        for (tenant, run, session) in [
            ("acme", "run\n1", None),
            ("acme", &*"r".repeat(257), None),
            ("acme", &*"r".repeat(4100), None),
            ("", "run", None),
            ("acme", "run", Some("s\r\n")),
        ] {
            assert_eq!(
                RunAddr::parse(tenant, run, 32).is_err(),
                session.is_none(),
                "{run:?}"
            );
            let subject = format!(
                "sg.raw.{}.{}.{}",
                crate::subject::encode_token(tenant),
                crate::subject::partition_of(run, 32),
                crate::subject::encode_token(run)
            );
            // A run whose ids pass (the session case) sends its own headers.
            let mut c = chunk(None);
            if let Ok(addr) = RunAddr::parse(tenant, run, 32) {
                c.addr = addr;
            }
            let mut h = c.headers();
            if let Some(s) = session {
                hdr::put_text(&mut h, HDR_SESSION, s);
            }
            assert!(
                matches!(
                    RawChunk::from_parts(&subject, Some(&h), raw.body.clone()),
                    Err(BusError::InvalidId(_))
                ),
                "{run:?}"
            );
        }
        let mut ok = chunk(None);
        ok.addr = RunAddr::parse(&"t".repeat(256), &"é".repeat(128), 32).unwrap();
        assert!(
            RawChunk::from_parts(&ok.addr.raw_subject(), Some(&ok.headers()), ok.body.clone())
                .is_ok()
        );
        assert!(RawChunk::from_parts(
            &raw.addr.events_subject(),
            Some(&raw.headers()),
            Bytes::new()
        )
        .is_err());
    }
}

//! Ingest front doors. Every door lands chunks in SG_RAW through one [`Ingestor`] and
//! acknowledges a chunk to its producer only after the broker acknowledged it.
//!
//! - NATS: publish directly (format in the bus crate docs, `docs/raw-messages.md`).
//! - gRPC: [`grpc::IngestServer`] (`streamgate.v1.IngestService`), resumable.
//! - HTTP: [`http::router`] — `POST /v1/ingest/{tenant}/{run}?family=f1` with a chunked
//!   body, so `curl --data-binary @capture.sse` works.
//!
//! Who may write which tenant: [`auth`] (bearer tokens scoped to tenants).
//!
//! Flow control ([`flow`]): one request keeps at most a small window of publishes in
//! flight, so a huge body neither fills the connection's buffers nor holds more than the
//! window in memory, and other requests' publishes interleave with it.
//!
//! A broker that cannot take a chunk *right now* (a stream leader being elected, no
//! responders, an ack timeout) is [`IngestError::Unavailable`]: HTTP answers 503 with
//! `Retry-After`, gRPC UNAVAILABLE with `retry-after` metadata ([`RETRY_AFTER`]), and the
//! producer sends again (chunks are deduplicated by message id).

pub mod auth;
pub mod flow;
pub mod grpc;
pub mod http;

use crate::worker::now_ms;
use async_nats::jetstream::context::PublishErrorKind;
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use streamgate_bus::raw::{
    send_raw_placed, CloseKind, Placement, RawChunk, HDR_CHUNK, HDR_CLOSE, HDR_OFFSET,
};
use streamgate_bus::subject::RunAddr;
use streamgate_bus::trace::TraceContext;
use streamgate_bus::{BusError, RAW_STREAM};
use streamgate_grammar::ids::{RunId, RunRef, SessionId, TenantId};

/// Something went wrong landing a chunk.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The request was wrong (unknown family, bad close kind, chunk out of order, …).
    #[error("{0}")]
    Invalid(String),
    /// A tenant, run or session id breaks the id rule ([`streamgate_grammar::ids`]).
    #[error(transparent)]
    Id(#[from] streamgate_grammar::ids::IdError),
    /// The run was already closed: nothing more is accepted for it.
    #[error("run {0} is already closed")]
    Closed(String),
    /// Another request of this process is ingesting the run right now.
    #[error("run {0} is being ingested by another request")]
    Busy(String),
    /// The broker cannot take the chunk right now (leader election, no responders, ack
    /// timeout, reconnecting): try again after [`RETRY_AFTER`].
    #[error("broker temporarily unavailable: {0}")]
    Unavailable(String),
    /// The broker refused the chunk for good (e.g. over its `max_payload`).
    #[error("broker: {0}")]
    Broker(String),
}

/// How long a producer is told to wait before sending again when the broker is
/// temporarily unavailable (HTTP `Retry-After`, gRPC `retry-after` metadata, seconds).
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl IngestError {
    /// True when the same request may succeed later ([`IngestError::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, IngestError::Unavailable(_))
    }
}

/// A bus error as an ingest error: transient broker trouble is
/// [`IngestError::Unavailable`], anything else says what was wrong.
fn from_bus(e: BusError) -> IngestError {
    match e {
        BusError::InvalidId(e) => IngestError::Id(e),
        e if e.is_transient() => IngestError::Unavailable(e.to_string()),
        e @ BusError::Nats { .. } => IngestError::Broker(e.to_string()),
        e => IngestError::Invalid(e.to_string()),
    }
}

/// A publish sent and not yet acknowledged ([`Ingestor::send`]): resolves to the stream
/// sequence once the broker stored the chunk.
pub type PendingPut = futures::future::BoxFuture<'static, Result<u64, IngestError>>;

/// Where a run's ingest stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResumePoint {
    /// The next chunk index to send.
    pub next_chunk: u64,
    /// True when a close marker is stored.
    pub closed: bool,
    /// Bytes of the run stored: a resend of the same body skips this many.
    pub stored_bytes: u64,
    /// Stream sequence of the run's last stored message (0: none): the fence a resend's
    /// first chunk carries ([`Placement::expect_last_seq`]).
    pub last_seq: u64,
}

/// The run identity and family a producer declares.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Tenant.
    pub tenant: TenantId,
    /// Run id.
    pub run_id: RunId,
    /// Optional chat session.
    pub session_key: Option<SessionId>,
    /// Wire family id, or `auto`.
    pub family: String,
    /// Optional dialect hint.
    pub dialect: Option<String>,
}

impl RunSpec {
    /// A producer's declaration, checked once at the front door: the id rule
    /// ([`streamgate_grammar::ids`]) for tenant, run and session, and a known family.
    pub fn new(
        tenant: &str,
        run_id: &str,
        session_key: Option<&str>,
        family: &str,
        dialect: Option<String>,
    ) -> Result<RunSpec, IngestError> {
        let spec = RunSpec {
            tenant: TenantId::new(tenant)?,
            run_id: RunId::new(run_id)?,
            session_key: session_key.map(SessionId::new).transpose()?,
            family: family.to_owned(),
            dialect,
        };
        spec.family
            .parse::<streamgate_wire::FamilyChoice>()
            .map_err(|e| IngestError::Invalid(e.to_string()))?;
        Ok(spec)
    }

    /// The run this spec declares.
    pub fn run(&self) -> RunRef {
        RunRef {
            tenant: self.tenant.clone(),
            run: self.run_id.clone(),
        }
    }
}

/// Runs with an open ingest request in this process, by (tenant, run id).
type Ingesting = Arc<Mutex<HashSet<(String, String)>>>;

/// Lands raw chunks in SG_RAW.
#[derive(Clone)]
pub struct Ingestor {
    js: async_nats::jetstream::Context,
    partitions: u32,
    ingesting: Ingesting,
    window: usize,
}

/// A run claimed by one ingest request ([`Ingestor::claim`]); the claim ends when this
/// is dropped, however the request ends.
#[derive(Debug)]
pub struct Claim {
    ingesting: Ingesting,
    key: (String, String),
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.ingesting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
    }
}

impl Ingestor {
    /// An ingestor on a JetStream context with the deployment's partition count.
    pub fn new(js: async_nats::jetstream::Context, partitions: u32) -> Ingestor {
        Ingestor {
            js,
            partitions,
            ingesting: Arc::default(),
            window: flow::DEFAULT_WINDOW,
        }
    }

    /// The same ingestor with at most `window` (at least 1) chunk publishes in flight
    /// per request ([`flow::Window`]; 1 waits for every ack before sending more).
    pub fn with_window(mut self, window: usize) -> Ingestor {
        self.window = window.max(1);
        self
    }

    /// Chunk publishes one request keeps in flight.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Claims `tenant`/`run_id` for one ingest request: two requests writing one run's
    /// chunks at once would interleave them, so a second one is refused
    /// ([`IngestError::Busy`]) until the first ends. The registry is in-process: requests
    /// to one replica are serialized per run — per `(tenant, run id)`, so the same run id
    /// under another tenant is not held up.
    pub fn claim(&self, tenant: &str, run_id: &str) -> Result<Claim, IngestError> {
        let key = (tenant.to_owned(), run_id.to_owned());
        let mut ingesting = self
            .ingesting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !ingesting.insert(key.clone()) {
            return Err(IngestError::Busy(run_id.to_owned()));
        }
        Ok(Claim {
            ingesting: self.ingesting.clone(),
            key,
        })
    }

    /// Stores one chunk (or close marker) and waits for the broker's ack. Returns the
    /// stream sequence. `trace` rides along in the raw message, so the normalizer and
    /// everything after it continue the producer's trace.
    pub async fn put(
        &self,
        spec: &RunSpec,
        chunk: u64,
        body: Bytes,
        close: Option<CloseKind>,
        trace: Option<&TraceContext>,
    ) -> Result<u64, IngestError> {
        self.send(spec, chunk, body, close, trace).await?.await
    }

    /// Sends one chunk (or close marker) without waiting for the broker's ack; the
    /// returned [`PendingPut`] waits for it. Chunks sent by one ingestor are stored in
    /// the order they were sent ([`flow::Window`] keeps a bounded number in flight).
    pub async fn send(
        &self,
        spec: &RunSpec,
        chunk: u64,
        body: Bytes,
        close: Option<CloseKind>,
        trace: Option<&TraceContext>,
    ) -> Result<PendingPut, IngestError> {
        self.send_at(spec, chunk, body, close, trace, Placement::default())
            .await
    }

    /// [`Ingestor::send`] with the chunk's byte offset and an optional fence
    /// ([`Placement`]). A fenced publish that finds the run moved on (a cut request's
    /// chunks landed after the resume point was read) fails as
    /// [`IngestError::Unavailable`]: the producer sends again from the new resume point.
    pub async fn send_at(
        &self,
        spec: &RunSpec,
        chunk: u64,
        body: Bytes,
        close: Option<CloseKind>,
        trace: Option<&TraceContext>,
        at: Placement,
    ) -> Result<PendingPut, IngestError> {
        let raw = self.raw_chunk(spec, chunk, body, close, now_ms());
        self.publish(raw, trace, at).await
    }

    /// [`Ingestor::send_at`] for a chunk of bytes that reached the front door at
    /// `received_ms` (ms since the Unix epoch), earlier than now: a door that joins what
    /// arrived while its previous publish was in flight stamps the chunk, and so its
    /// events, with when the bytes came, not when they went out.
    pub async fn send_received(
        &self,
        spec: &RunSpec,
        chunk: u64,
        body: Bytes,
        trace: Option<&TraceContext>,
        at: Placement,
        received_ms: i64,
    ) -> Result<PendingPut, IngestError> {
        let raw = self.raw_chunk(spec, chunk, body, None, received_ms);
        self.publish(raw, trace, at).await
    }

    fn raw_chunk(
        &self,
        spec: &RunSpec,
        chunk: u64,
        body: Bytes,
        close: Option<CloseKind>,
        ingest_ts_ms: i64,
    ) -> RawChunk {
        RawChunk {
            addr: RunAddr::new(&spec.run(), self.partitions),
            session_key: spec.session_key.clone().map(String::from),
            family: spec.family.clone(),
            dialect: spec.dialect.clone(),
            chunk,
            ingest_ts_ms,
            close,
            body,
        }
    }

    /// Publishes `raw`; the [`PendingPut`] waits for the broker's ack.
    async fn publish(
        &self,
        raw: RawChunk,
        trace: Option<&TraceContext>,
        at: Placement,
    ) -> Result<PendingPut, IngestError> {
        let ack = send_raw_placed(&self.js, &raw, trace, at)
            .await
            .map_err(from_bus)?;
        let fenced = at.expect_last_seq.is_some();
        let bytes = u64::try_from(raw.body.len()).unwrap_or(u64::MAX);
        Ok(Box::pin(async move {
            let seq = ack
                .await
                .map_err(|e| match e {
                    // JetStream's "wrong last sequence" (10071): the fence held.
                    e if fenced
                        && e.publish_error() == Some(PublishErrorKind::WrongLastSequence) =>
                    {
                        IngestError::Unavailable(
                            "the run's stored bytes changed while this request started \
                             (a cut request's chunks landed): send it again"
                                .to_owned(),
                        )
                    }
                    e => from_bus(e),
                })?
                .sequence;
            metrics::counter!("streamgate_ingest_chunks_total").increment(1);
            metrics::counter!("streamgate_ingest_bytes_total").increment(bytes);
            Ok(seq)
        }))
    }

    /// Where a run's ingest stands, from the last raw message stored for it.
    pub async fn resume_point(
        &self,
        tenant: &str,
        run_id: &str,
    ) -> Result<ResumePoint, IngestError> {
        let addr = RunAddr::parse(tenant, run_id, self.partitions)?;
        // Every failure here is the broker's (the stream exists once the service
        // started): a stream without a leader yet, a timeout, a reconnect.
        let stream = self
            .js
            .get_stream(RAW_STREAM)
            .await
            .map_err(|e| IngestError::Unavailable(e.to_string()))?;
        match stream
            .get_last_raw_message_by_subject(&addr.raw_subject())
            .await
        {
            Ok(msg) => {
                let header = |name: &str| msg.headers.get(name).map(|v| v.as_str().to_owned());
                let chunk: u64 = header(HDR_CHUNK).and_then(|c| c.parse().ok()).unwrap_or(0);
                let closed = header(HDR_CLOSE).is_some();
                let stored_bytes = match header(HDR_OFFSET).and_then(|o| o.parse::<u64>().ok()) {
                    Some(offset) => offset + msg.payload.len() as u64,
                    // Chunks stored without offsets (gRPC, the gateway follower, raw
                    // NATS producers): count them once.
                    None => self.count_stored_bytes(&addr).await?,
                };
                Ok(ResumePoint {
                    next_chunk: if closed { chunk } else { chunk + 1 },
                    closed,
                    stored_bytes,
                    last_seq: msg.sequence,
                })
            }
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
            {
                Ok(ResumePoint {
                    next_chunk: 0,
                    closed: false,
                    stored_bytes: 0,
                    last_seq: 0,
                })
            }
            Err(e) => Err(IngestError::Unavailable(e.to_string())),
        }
    }

    /// The bytes of a run's stored chunks, summed over its raw messages.
    async fn count_stored_bytes(&self, addr: &RunAddr) -> Result<u64, IngestError> {
        let msgs = streamgate_bus::consume::read_subject(&self.js, RAW_STREAM, &addr.raw_subject())
            .await
            .map_err(|e| IngestError::Unavailable(e.to_string()))?;
        Ok(msgs.iter().map(|m| m.payload.len() as u64).sum())
    }
}

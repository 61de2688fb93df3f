//! `streamgate.v1.IngestService`: a producer streams a run's chunks and gets one ack per
//! chunk once it is durable. Chunks carry their index, so a producer that lost its
//! connection asks `ResumePoint` and continues; chunks it re-sends are acknowledged as
//! duplicates and never stored twice. Like HTTP ingest, a stream keeps a window of
//! publishes in flight ([`Window`]) rather than one chunk per broker round trip.

use super::auth::{grant_of, Grant};
use super::flow::Window;
use super::{IngestError, Ingestor, RunSpec};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::pin::Pin;
use streamgate_bus::raw::CloseKind;
use streamgate_bus::trace::{self, TraceContext};
use streamgate_proto::v1::ingest_service_server::IngestService;
use streamgate_proto::v1::{IngestAck, IngestChunk, ResumePointReply, ResumePointRequest};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

/// The gRPC ingest service.
pub struct IngestServer {
    ingestor: Ingestor,
}

impl IngestServer {
    /// Serves ingest through `ingestor`.
    pub fn new(ingestor: Ingestor) -> IngestServer {
        IngestServer { ingestor }
    }
}

/// The metadata key of the seconds to wait before sending again, on UNAVAILABLE.
pub const RETRY_AFTER_KEY: &str = "retry-after";

/// The status of an ingest error; a broker that is only temporarily unavailable is
/// UNAVAILABLE with `retry-after` metadata (seconds), anything the broker refused for
/// good is INTERNAL.
fn status(e: IngestError) -> Status {
    match e {
        IngestError::Invalid(m) => Status::invalid_argument(m),
        IngestError::Id(e) => Status::invalid_argument(e.to_string()),
        e @ IngestError::Closed(_) => Status::failed_precondition(e.to_string()),
        e @ IngestError::Busy(_) => Status::aborted(e.to_string()),
        e @ IngestError::Unavailable(_) => {
            metrics::counter!("streamgate_ingest_unavailable_total", "transport" => "grpc")
                .increment(1);
            let mut meta = tonic::metadata::MetadataMap::new();
            meta.insert(
                RETRY_AFTER_KEY,
                tonic::metadata::MetadataValue::from(super::RETRY_AFTER.as_secs().max(1)),
            );
            Status::with_metadata(tonic::Code::Unavailable, e.to_string(), meta)
        }
        IngestError::Broker(m) => Status::internal(m),
    }
}

/// The status a producer gets when its request stream fails: a message over the size
/// limit (tonic says OUT_OF_RANGE) becomes RESOURCE_EXHAUSTED naming the limit; anything
/// else (a broken connection, …) is passed on. Never a silent end of the ack stream.
fn inbound_status(s: Status) -> Status {
    if s.code() == tonic::Code::OutOfRange && s.message().contains("too large") {
        Status::resource_exhausted(format!(
            "ingest message too large: {}; send the body in smaller chunks",
            s.message()
        ))
    } else {
        s
    }
}

/// The run a stream is bound to (its first message's), with its claim.
struct Bound {
    tenant: String,
    run_id: String,
    _claim: super::Claim,
}

/// Binds the stream to the run of its first message (claiming it, once the caller's
/// grant covers its tenant), or checks that a later message names the same run.
fn bind(
    ingestor: &Ingestor,
    grant: &Grant,
    bound: &mut Option<Bound>,
    chunk: &IngestChunk,
) -> Result<(), Status> {
    match bound {
        Some(b) if b.tenant == chunk.tenant && b.run_id == chunk.run_id => Ok(()),
        Some(b) => Err(status(IngestError::Invalid(format!(
            "an ingest stream carries one run: it is bound to tenant {:?} run {:?}, this chunk names tenant {:?} run {:?}",
            b.tenant, b.run_id, chunk.tenant, chunk.run_id
        )))),
        None => {
            spec_of(chunk).map_err(status)?;
            grant.check(&chunk.tenant).map_err(|e| e.status())?;
            let claim = ingestor
                .claim(&chunk.tenant, &chunk.run_id)
                .map_err(status)?;
            *bound = Some(Bound {
                tenant: chunk.tenant.clone(),
                run_id: chunk.run_id.clone(),
                _claim: claim,
            });
            Ok(())
        }
    }
}

fn spec_of(c: &IngestChunk) -> Result<RunSpec, IngestError> {
    RunSpec::new(
        &c.tenant,
        &c.run_id,
        c.session_key.as_deref(),
        &c.family,
        c.dialect.clone(),
    )
}

type AckStream = Pin<Box<dyn futures::Stream<Item = Result<IngestAck, Status>> + Send>>;

#[tonic::async_trait]
impl IngestService for IngestServer {
    type IngestStream = AckStream;

    async fn ingest(
        &self,
        request: Request<Streaming<IngestChunk>>,
    ) -> Result<Response<Self::IngestStream>, Status> {
        let grant = grant_of(&request)?;
        let meta = |name: &str| request.metadata().get(name).and_then(|v| v.to_str().ok());
        let incoming =
            TraceContext::parse(meta(trace::HDR_TRACEPARENT), meta(trace::HDR_TRACESTATE));
        // One span per stream; the run is known from the first chunk.
        let span = streamgate_runtime::hop_span!(
            "ingest",
            transport = "grpc",
            tenant = tracing::field::Empty,
            run = tracing::field::Empty
        );
        let trace = trace::follow(&span, incoming);
        let mut inbound = request.into_inner();
        let ingestor = self.ingestor.clone();
        // Small buffer: acks flow back as fast as the broker confirms; a slow reader
        // slows the producer (backpressure), nothing queues without bound.
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(
            async move {
                let window = Window::new(ingestor.window());
                serve_stream(&ingestor, &grant, &mut inbound, window, &tx, trace.as_ref()).await;
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn resume_point(
        &self,
        request: Request<ResumePointRequest>,
    ) -> Result<Response<ResumePointReply>, Status> {
        let grant = grant_of(&request)?;
        let r = request.into_inner();
        grant.check(&r.tenant).map_err(|e| e.status())?;
        let p = self
            .ingestor
            .resume_point(&r.tenant, &r.run_id)
            .await
            .map_err(status)?;
        Ok(Response::new(ResumePointReply {
            next_chunk: p.next_chunk,
            closed: p.closed,
        }))
    }
}

/// One step of an ingest stream: a chunk arrived, or the oldest publish was acked.
enum Step {
    Chunk(Option<Result<IngestChunk, Status>>),
    Ack(Result<IngestAck, IngestError>),
}

/// Reads the stream's chunks and publishes each as it arrives, with up to a window of
/// publishes in flight ([`Window`]): a large run goes out at the broker's pace instead
/// of one round trip per chunk. Acks go back in chunk order. The first error ends the
/// stream, after the acks of the chunks before it.
async fn serve_stream(
    ingestor: &Ingestor,
    grant: &Grant,
    inbound: &mut Streaming<IngestChunk>,
    mut window: Window<IngestAck>,
    tx: &tokio::sync::mpsc::Sender<Result<IngestAck, Status>>,
    trace: Option<&TraceContext>,
) {
    let mut resume: Option<super::ResumePoint> = None;
    // Held until the stream ends: the run is claimed for this stream.
    let mut bound: Option<Bound> = None;
    loop {
        let step = tokio::select! {
            biased;
            Some(ack) = window.next_ack(), if !window.is_empty() => Step::Ack(ack),
            item = inbound.next(), if !window.is_full() => Step::Chunk(item),
        };
        let failure = match step {
            Step::Ack(Ok(ack)) => {
                if tx.send(Ok(ack)).await.is_err() {
                    return;
                }
                continue;
            }
            Step::Ack(Err(e)) => status(e),
            Step::Chunk(None) => break,
            Step::Chunk(Some(Err(s))) => {
                let s = inbound_status(s);
                tracing::debug!(status = %s, "ingest stream failed");
                s
            }
            Step::Chunk(Some(Ok(chunk))) => {
                if bound.is_none() {
                    let span = tracing::Span::current();
                    span.record("tenant", chunk.tenant.as_str());
                    span.record("run", chunk.run_id.as_str());
                }
                let sent = match bind(ingestor, grant, &mut bound, &chunk) {
                    Ok(()) => send(ingestor, &chunk, &mut resume, trace)
                        .await
                        .map_err(status),
                    Err(s) => Err(s),
                };
                match sent {
                    Ok(ack) => {
                        window.push(ack);
                        continue;
                    }
                    Err(s) => s,
                }
            }
        };
        // The chunks before the failure are answered first: the producer learns
        // exactly which ones are durable.
        if acks_in_flight(&mut window, tx).await {
            let _ = tx.send(Err(failure)).await;
        }
        return;
    }
    acks_in_flight(&mut window, tx).await;
}

/// Sends the acks of the publishes in flight, in order, until the first failure (sent
/// as the stream's error). False when the stream ended (failed, or the producer left).
async fn acks_in_flight(
    window: &mut Window<IngestAck>,
    tx: &tokio::sync::mpsc::Sender<Result<IngestAck, Status>>,
) -> bool {
    while let Some(ack) = window.next_ack().await {
        let failed = ack.is_err();
        if tx.send(ack.map_err(status)).await.is_err() || failed {
            return false;
        }
    }
    true
}

/// Checks one chunk against where the run stands and publishes it; the returned future
/// resolves to its ack once the broker stored it (at once for a duplicate).
async fn send(
    ingestor: &Ingestor,
    chunk: &IngestChunk,
    resume: &mut Option<super::ResumePoint>,
    trace: Option<&TraceContext>,
) -> Result<BoxFuture<'static, Result<IngestAck, IngestError>>, IngestError> {
    let spec = spec_of(chunk)?;
    let close = match chunk.close.as_deref() {
        None => None,
        Some("normal") => Some(CloseKind::Normal),
        Some("abnormal") => Some(CloseKind::Abnormal),
        Some(other) => {
            return Err(IngestError::Invalid(format!(
                "close must be `normal` or `abnormal`, not `{other}`"
            )))
        }
    };
    // Learn once per stream where the run stands, to answer re-sent chunks as duplicates
    // and to refuse chunks after a close; from then on it advances with every chunk sent.
    let point = match resume {
        Some(p) => *p,
        None => {
            let p = ingestor.resume_point(&spec.tenant, &spec.run_id).await?;
            *resume = Some(p);
            p
        }
    };
    let index = chunk.chunk;
    if index < point.next_chunk || (point.closed && close.is_some()) {
        let ack = IngestAck {
            chunk: index,
            stream_seq: 0,
            duplicate: true,
            close: close.is_some(),
        };
        return Ok(Box::pin(async move { Ok(ack) }));
    }
    if point.closed {
        return Err(IngestError::Closed(spec.run_id.into()));
    }
    if index > point.next_chunk {
        return Err(IngestError::Invalid(format!(
            "chunk {} out of order: next expected is {}",
            index, point.next_chunk
        )));
    }
    let body = if close.is_some() {
        bytes::Bytes::new()
    } else {
        bytes::Bytes::copy_from_slice(&chunk.body)
    };
    let len = body.len() as u64;
    // With its byte offset, so a later resume point is read from this message alone.
    let at = streamgate_bus::raw::Placement {
        offset: Some(point.stored_bytes),
        expect_last_seq: None,
    };
    let pending = ingestor
        .send_at(&spec, index, body, close, trace, at)
        .await?;
    *resume = Some(super::ResumePoint {
        next_chunk: if close.is_some() { index } else { index + 1 },
        closed: close.is_some(),
        stored_bytes: point.stored_bytes + len,
        // Not known before the ack, and not needed: this stream fences nothing.
        last_seq: point.last_seq,
    });
    let close = close.is_some();
    Ok(Box::pin(async move {
        let seq = pending.await?;
        Ok(IngestAck {
            chunk: index,
            stream_seq: seq,
            duplicate: false,
            close,
        })
    }))
}

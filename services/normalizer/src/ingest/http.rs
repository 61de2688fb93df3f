//! HTTP ingest: `POST /v1/ingest/{tenant}/{run}?family=f1[&session=…][&chunk_bytes=N]`
//! with the provider stream as the (chunked) request body:
//!
//! ```sh
//! curl --data-binary @capture.sse 'http://127.0.0.1:7311/v1/ingest/acme/run-1?family=f1'
//! ```
//!
//! The body goes out live, as it arrives. While nothing of it is in flight, every line
//! the sender completed is published at once (in chunks of at most `chunk_bytes`,
//! default 16 KiB, at least [`MIN_CHUNK_BYTES`]), and the bytes of a frame still
//! incomplete follow after [`IDLE_FLUSH`] (25 ms) if nothing completes them sooner. So a
//! sender that pauses mid-turn (curl `-T -` reading a pipe) shows on every channel what
//! it sent so far. Lines that arrive while publishes of the body are in flight wait for
//! their acks and then go out together: a sender whose frames are further apart than a
//! publish's round trip (a model streaming live) never waits, and under load a chunk
//! carries the backlog instead of one message per frame (the broker's work is per
//! message). A chunk is stamped with when its first line was complete, so its events'
//! times count that wait (the events of its later lines carry that earlier time too).
//! Whole chunks go out with at most a window in flight per request
//! ([`flow::DEFAULT_WINDOW`] unless configured): more of the body is read only while
//! less than a chunk waits, so a slow broker slows the sender and a request holds at
//! most about `(window + 1) × chunk_bytes` of its body in memory, however large the
//! body ([`super::flow`]). Once every chunk is acknowledged, the end of the body writes a
//! `normal` close marker, and the reply says how many chunks were stored. A body that
//! breaks off (a cut connection) writes no close marker: the run stays open for the
//! resend (or the normalizer's idle timeout closes it).
//!
//! Ids that break the id rule get 400; a run another request is ingesting right now
//! (or an already closed run) gets 409. When the broker cannot take chunks right now (a
//! stream leader being elected, no responders, ack timeouts) the answer is 503 with
//! `Retry-After` (seconds): send the same request again then. A broker refusal that
//! repeating cannot fix is 502. `Authorization: Bearer <token>` is matched with the
//! scheme in any case; a missing or unknown token gets 401, a token for other tenants
//! 403 ([`super::auth`]).
//!
//! Resending is safe: a POST to a run that already has bytes stored (a request that
//! failed part-way) is taken as the same body sent again — its first bytes, as many as
//! the run holds (each chunk carries its byte offset, `Sg-Offset`), are skipped, so the
//! run gets every byte once however either request was cut. The resend's first chunk is
//! fenced on the run's last stored message: if chunks of the cut request were still in
//! flight and landed meanwhile, the answer is 503 and sending again resumes from there.
//! The reply's `chunks` counts the chunks this request stored, `skipped_bytes` what it
//! found stored.

use super::auth::IngestAuth;
use super::flow::Window;
use super::{IngestError, Ingestor, RunSpec, RETRY_AFTER};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use std::collections::VecDeque;
use streamgate_bus::raw::{CloseKind, Placement};
use streamgate_bus::trace::{self, TraceContext};
use tracing::Instrument as _;

/// Default upper bound of one chunk of an HTTP body.
pub const DEFAULT_CHUNK_BYTES: usize = 16 * 1024;
/// Smallest `chunk_bytes` honoured: a smaller one would only multiply messages (complete
/// lines go out without waiting for a chunk to fill, whatever the bound).
pub const MIN_CHUNK_BYTES: usize = 1024;
/// How long the bytes of a frame still incomplete (after the body's last line end) wait
/// for the rest, from when they started waiting or the body's last publish, before they
/// go out on their own (once nothing of the body is in flight).
pub const IDLE_FLUSH: std::time::Duration = std::time::Duration::from_millis(25);

#[derive(Clone)]
struct AppState {
    ingestor: Ingestor,
    auth: IngestAuth,
}

/// Query parameters of an ingest request.
#[derive(Debug, Deserialize)]
struct IngestQuery {
    family: Option<String>,
    session: Option<String>,
    dialect: Option<String>,
    chunk_bytes: Option<usize>,
}

/// The ingest routes; every request's bearer token must grant its tenant (`auth`).
pub fn router(ingestor: Ingestor, auth: IngestAuth) -> Router {
    Router::new()
        .route("/v1/ingest/{tenant}/{run}", post(ingest))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .with_state(AppState { ingestor, auth })
}

/// The status of a failed `put`: the broker's fault unless the request was wrong; a
/// broker that is only temporarily unavailable gets 503 with `Retry-After`.
fn put_error(e: IngestError) -> Response {
    let code = match e {
        IngestError::Invalid(_) | IngestError::Id(_) => StatusCode::BAD_REQUEST,
        IngestError::Closed(_) | IngestError::Busy(_) => StatusCode::CONFLICT,
        IngestError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        IngestError::Broker(_) => StatusCode::BAD_GATEWAY,
    };
    let transient = e.is_transient();
    let mut resp = error(code, e.to_string());
    if transient {
        metrics::counter!("streamgate_ingest_unavailable_total", "transport" => "http")
            .increment(1);
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(RETRY_AFTER.as_secs().max(1)),
        );
    }
    resp
}

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

async fn ingest(
    State(st): State<AppState>,
    Path((tenant, run_id)): Path<(String, String)>,
    Query(q): Query<IngestQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let span = streamgate_runtime::hop_span!("ingest", transport = "http", tenant = %tenant, run = %run_id);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let incoming = TraceContext::parse(
        header(trace::HDR_TRACEPARENT),
        header(trace::HDR_TRACESTATE),
    );
    let trace = trace::follow(&span, incoming);
    ingest_body(st, tenant, run_id, q, headers, body, trace)
        .instrument(span)
        .await
}

async fn ingest_body(
    st: AppState,
    tenant: String,
    run_id: String,
    q: IngestQuery,
    headers: HeaderMap,
    body: Body,
    trace: Option<TraceContext>,
) -> Response {
    let trace = trace.as_ref();
    if let Err(e) = st.auth.check_http(&headers, &tenant) {
        return e.into_response();
    }
    let spec = match RunSpec::new(
        &tenant,
        &run_id,
        q.session.as_deref(),
        q.family.as_deref().unwrap_or("auto"),
        q.dialect,
    ) {
        Ok(spec) => spec,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // One request per run at a time; the claim is released when this handler returns
    // (or is dropped with a broken connection).
    let _claim = match st.ingestor.claim(&spec.tenant, &spec.run_id) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::CONFLICT, e.to_string()),
    };
    let chunk_bytes = q
        .chunk_bytes
        .unwrap_or(DEFAULT_CHUNK_BYTES)
        .clamp(MIN_CHUNK_BYTES, 4 << 20);
    let point = match st.ingestor.resume_point(&spec.tenant, &spec.run_id).await {
        Ok(p) => p,
        Err(e) => return put_error(e),
    };
    if point.closed {
        return error(
            StatusCode::CONFLICT,
            IngestError::Closed(spec.run_id.to_string()).to_string(),
        );
    }
    let mut window = Window::new(st.ingestor.window());
    let cut = Cutter {
        chunk_bytes,
        skip: point.stored_bytes,
        next: point.next_chunk,
        offset: point.stored_bytes,
        fence: Some(point.last_seq),
        arrivals: VecDeque::new(),
    };
    let sent = send_body(&st.ingestor, &spec, &mut window, cut, body, trace).await;
    // Every chunk acknowledged (or failed) before the answer or the close marker.
    let drained = window.drain().await;
    let Sent {
        mut cut,
        bytes_in,
        close,
    } = match sent.and_then(|b| drained.map(|()| b)) {
        Ok(b) => b,
        Err(e) => return put_error(e),
    };
    if close == CloseKind::Abnormal {
        // The body broke off (the connection was cut): the run stays open for the
        // sender's resend, which skips what is stored; without one the normalizer's idle
        // timeout closes it.
        return error(
            StatusCode::BAD_REQUEST,
            "the request body broke off: the run stays open, send the body again".to_owned(),
        );
    }
    let at = cut.placement();
    let stored = async {
        st.ingestor
            .send_at(&spec, cut.next, Bytes::new(), Some(close), trace, at)
            .await?
            .await
    };
    if let Err(e) = stored.await {
        return put_error(e);
    }
    Json(serde_json::json!({
        "tenant": spec.tenant,
        "run_id": spec.run_id,
        "chunks": cut.next.saturating_sub(point.next_chunk),
        "bytes": bytes_in,
        "skipped_bytes": point.stored_bytes.min(bytes_in),
        "close": close.as_str(),
    }))
    .into_response()
}

/// What was read of a body and sent.
struct Sent {
    /// Where the cut ended (the close marker's chunk index and offset).
    cut: Cutter,
    /// Bytes read.
    bytes_in: u64,
    /// How the body ended.
    close: CloseKind,
}

/// Most arrival notes a request keeps ([`Cutter::take`]).
const MAX_ARRIVALS: usize = 1024;

/// How a body becomes chunks: live, and exactly once by byte offset.
#[derive(Debug)]
struct Cutter {
    /// Upper bound of one chunk.
    chunk_bytes: usize,
    /// Bytes at the start of the body the run already has (a resend): dropped.
    skip: u64,
    /// The next chunk index.
    next: u64,
    /// Run byte offset of the next chunk's first byte.
    offset: u64,
    /// The fence the first publish carries (the run's last stored message), then `None`.
    fence: Option<u64>,
    /// When the bytes not sent yet arrived: `(run offset their frame ends at, ms since
    /// the Unix epoch)`, oldest first ([`Cutter::send`] stamps a chunk from it).
    arrivals: VecDeque<(u64, i64)>,
}

impl Cutter {
    /// The next publish's placement (taking the fence).
    fn placement(&mut self) -> Placement {
        Placement {
            offset: Some(self.offset),
            expect_last_seq: self.fence.take(),
        }
    }

    /// The part of `data` (the body's bytes from `pos`) the run does not have yet.
    fn unstored(&self, pos: u64, data: Bytes) -> Bytes {
        let have = self.skip.saturating_sub(pos);
        if have >= data.len() as u64 {
            Bytes::new()
        } else {
            data.slice(have as usize..)
        }
    }

    /// Takes `data` (bytes the run does not have) into `pending`, noting when it came.
    /// Frames of the same millisecond share one note, and past [`MAX_ARRIVALS`] notes the
    /// last one grows (its bytes keep its earlier time): tiny frames cannot make the notes
    /// outgrow the bytes they describe.
    fn take(&mut self, pending: &mut BytesMut, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        pending.extend_from_slice(data);
        let end = self.offset + pending.len() as u64;
        let now = crate::worker::now_ms();
        let full = self.arrivals.len() >= MAX_ARRIVALS;
        match self.arrivals.back_mut() {
            Some(last) if last.1 == now || full => last.0 = end,
            _ => self.arrivals.push_back((end, now)),
        }
    }

    /// Sends what of `pending` may go out now:
    /// - whole `chunk_bytes` pieces, while the window has room;
    /// - then, with nothing of this body in flight, every complete line.
    ///
    /// So lines that arrive while publishes are in flight join one chunk, sent once they
    /// are acknowledged, instead of each becoming a message of its own (the broker's work
    /// is per message): under load a chunk grows with the backlog, and a sender whose
    /// frames are further apart than a publish's round trip (a model streaming live)
    /// has every line out the moment it arrives.
    async fn flush(
        &mut self,
        ingestor: &Ingestor,
        spec: &RunSpec,
        window: &mut Window,
        pending: &mut BytesMut,
        trace: Option<&TraceContext>,
    ) -> Result<(), IngestError> {
        while pending.len() >= self.chunk_bytes && !window.is_full() {
            let part = pending.split_to(self.chunk_bytes).freeze();
            self.send(ingestor, spec, window, part, trace).await?;
        }
        if window.is_empty() {
            if let Some(nl) = memchr::memrchr(b'\n', pending) {
                let part = pending.split_to(nl + 1).freeze();
                self.send(ingestor, spec, window, part, trace).await?;
            }
        }
        Ok(())
    }

    /// When the next chunk, `part` (not empty), had its first line complete: the arrival
    /// of its first line end, of its last byte when it has none. `None` when the
    /// arrivals do not cover it.
    fn complete_at(&self, part: &[u8]) -> Option<i64> {
        let at = memchr::memchr(b'\n', part).unwrap_or(part.len().saturating_sub(1));
        let at = self.offset + at as u64;
        self.arrivals
            .iter()
            .find(|(end, _)| *end > at)
            .map(|(_, ms)| *ms)
    }

    /// Sends one chunk through `window`, stamped with when its first line was complete:
    /// the arrival of its first line end (of its last byte when it has none). No event
    /// of the chunk could exist before that, and a chunk that waited for a publish in
    /// flight counts the wait. The fenced first publish is awaited before any other goes
    /// out: if the fence fails nothing after it may land.
    async fn send(
        &mut self,
        ingestor: &Ingestor,
        spec: &RunSpec,
        window: &mut Window,
        part: Bytes,
        trace: Option<&TraceContext>,
    ) -> Result<(), IngestError> {
        if part.is_empty() {
            return Ok(());
        }
        let received_ms = self
            .complete_at(&part)
            .unwrap_or_else(crate::worker::now_ms);
        let at = self.placement();
        let len = part.len() as u64;
        window.make_room().await?;
        window.push(
            ingestor
                .send_received(spec, self.next, part, trace, at, received_ms)
                .await?,
        );
        if at.expect_last_seq.is_some() {
            window.drain().await?;
        }
        self.next += 1;
        self.offset += len;
        while self
            .arrivals
            .front()
            .is_some_and(|(end, _)| *end <= self.offset)
        {
            self.arrivals.pop_front();
        }
        Ok(())
    }
}

/// One step of [`send_body`]'s loop.
enum Step {
    Ack(Result<u64, IngestError>),
    Idle,
    Frame(Option<Result<Bytes, axum::Error>>),
}

/// Reads the body and sends it as it arrives through `window`, cut by
/// [`Cutter::flush`]: whole pieces at once, complete lines as soon as nothing of the
/// body is in flight, and the bytes after the last line end (a frame still incomplete)
/// when more completes them or after [`IDLE_FLUSH`], whichever is first. The body is
/// read while less than a chunk waits (acks that come back meanwhile are taken first,
/// and a frame already there before the idle flush, which it may complete), so a slow
/// broker slows the sender. Returns when the whole body was sent; acks may still be in
/// flight.
async fn send_body(
    ingestor: &Ingestor,
    spec: &RunSpec,
    window: &mut Window,
    mut cut: Cutter,
    body: Body,
    trace: Option<&TraceContext>,
) -> Result<Sent, IngestError> {
    let mut pending = BytesMut::new();
    let mut stream = body.into_data_stream();
    let mut close = CloseKind::Normal;
    let mut bytes_in = 0u64;
    let idle = tokio::time::sleep(IDLE_FLUSH);
    tokio::pin!(idle);
    loop {
        let step = tokio::select! {
            biased;
            Some(ack) = window.next_ack(), if !window.is_empty() => Step::Ack(ack),
            frame = stream.next(), if pending.len() < cut.chunk_bytes => Step::Frame(frame),
            () = &mut idle, if !pending.is_empty() && window.is_empty() => Step::Idle,
        };
        let (waiting, sent) = (!pending.is_empty(), cut.next);
        match step {
            Step::Ack(ack) => {
                ack?;
            }
            Step::Idle => {
                let part = pending.split().freeze();
                cut.send(ingestor, spec, window, part, trace).await?;
            }
            Step::Frame(Some(Ok(data))) => {
                let pos = bytes_in;
                bytes_in += data.len() as u64;
                let data = cut.unstored(pos, data);
                cut.take(&mut pending, &data);
            }
            Step::Frame(Some(Err(_))) => {
                close = CloseKind::Abnormal;
                break;
            }
            Step::Frame(None) => break,
        }
        cut.flush(ingestor, spec, window, &mut pending, trace)
            .await?;
        // The idle clock starts when a partial frame starts waiting, and is not pushed
        // back by bytes that do not complete it.
        if !pending.is_empty() && (!waiting || cut.next != sent) {
            idle.as_mut()
                .reset(tokio::time::Instant::now() + IDLE_FLUSH);
        }
    }
    // The end of the body (or the break): everything read goes out.
    while !pending.is_empty() {
        let part = pending
            .split_to(pending.len().min(cut.chunk_bytes))
            .freeze();
        cut.send(ingestor, spec, window, part, trace).await?;
    }
    Ok(Sent {
        cut,
        bytes_in,
        close,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cutter at run offset 5 that read frames ending at offsets 10, 20 and 30 at
    /// 100, 200 and 300 ms.
    fn cutter() -> Cutter {
        Cutter {
            chunk_bytes: MIN_CHUNK_BYTES,
            skip: 0,
            next: 0,
            offset: 5,
            fence: None,
            arrivals: VecDeque::from([(10, 100), (20, 200), (30, 300)]),
        }
    }

    #[test]
    fn a_chunk_is_stamped_when_its_first_line_was_complete() {
        let c = cutter();
        // A line end in the first frame: that frame's arrival.
        assert_eq!(c.complete_at(b"ab\ncdefghijklmn"), Some(100));
        // A tail carried from the first frame, its line end in the second.
        assert_eq!(c.complete_at(b"abcdefgh\nijklmn"), Some(200));
        // No line end (an idle flush): its last byte's arrival.
        assert_eq!(c.complete_at(b"abcdefghijklmnopqrstu"), Some(300));
        // Past what was read: not covered.
        assert_eq!(c.complete_at(&[b'x'; 40]), None);
    }

    #[test]
    fn tiny_frames_keep_a_bounded_number_of_arrival_notes_covering_every_byte() {
        let mut c = cutter();
        c.arrivals.clear();
        let mut pending = BytesMut::new();
        for _ in 0..20_000 {
            c.take(&mut pending, b"x");
        }
        assert!(c.arrivals.len() <= MAX_ARRIVALS, "{}", c.arrivals.len());
        assert_eq!(c.arrivals.back().map(|a| a.0), Some(5 + 20_000));
        assert!(c.complete_at(&pending).is_some());
        // A full set of notes, each of another millisecond: the next frame grows the
        // last one instead of adding a note.
        let mut pending = BytesMut::from(&[b'x'; MAX_ARRIVALS][..]);
        c.arrivals = (0..MAX_ARRIVALS as u64)
            .map(|i| (5 + i + 1, i as i64))
            .collect();
        c.take(&mut pending, b"yz");
        assert_eq!(c.arrivals.len(), MAX_ARRIVALS);
        assert_eq!(
            c.arrivals.back(),
            Some(&(5 + MAX_ARRIVALS as u64 + 2, MAX_ARRIVALS as i64 - 1))
        );
    }
}

//! One followed run's feeder: takes the run's lines from its bounded queue, batches what
//! is queued into one chunk (up to `chunk_bytes`), appends it at the run's next chunk
//! index and, after the run's terminal event, stores the close marker.
//!
//! A chunk the sink cannot take right now is retried with backoff (the queue fills
//! meanwhile, which pushes back on the router and so on the WebSocket read); before a
//! retry the run's resume point is asked again, so a chunk that did land before the
//! failure is not sent twice. A run found closed, or a permanent refusal, ends the feed:
//! the run's remaining lines are dropped with a warning.
//!
//! A feeder with nothing to do for `idle` ends (its run stays open); the router starts a
//! new one, from the run's resume point, when the run's next event comes.

use super::backoff::Backoff;
use super::sink::{RunSink, SinkError};
use crate::ingest::RunSpec;
use bytes::{BufMut, Bytes, BytesMut};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One line of a run: an agent event payload, newline-terminated.
#[derive(Debug)]
pub struct Line {
    /// The payload as one line, with its `\n`.
    pub text: String,
    /// True for the run's terminal event (lifecycle end or error, an error stream).
    pub terminal: bool,
}

/// How feeders batch, wait and retry.
#[derive(Debug, Clone)]
pub struct FeedConfig {
    /// Largest chunk (a longer line is cut into chunks of this size).
    pub chunk_bytes: usize,
    /// A feeder with nothing to do this long ends.
    pub idle: Duration,
    /// First wait before a retry.
    pub retry_base: Duration,
    /// Longest wait between retries.
    pub retry_cap: Duration,
}

impl Default for FeedConfig {
    fn default() -> FeedConfig {
        FeedConfig {
            chunk_bytes: 64 * 1024,
            idle: Duration::from_secs(300),
            retry_base: Duration::from_millis(200),
            retry_cap: Duration::from_secs(10),
        }
    }
}

/// What to store.
#[derive(Debug, Clone, Copy)]
enum Op<'a> {
    Append(&'a Bytes),
    Close,
}

/// Feeds `run` from `rx` until its terminal event is stored, its queue is closed and
/// drained, or it idles.
pub async fn feed<S: RunSink>(
    sink: S,
    run: RunSpec,
    mut rx: mpsc::Receiver<Line>,
    cfg: FeedConfig,
    cancel: CancellationToken,
) {
    let Some(mut next) = start(&sink, &run, &cfg, &cancel).await else {
        return discard(rx, &cfg).await;
    };
    while let Some(first) = next_line(&mut rx, &cfg).await {
        let (body, terminal) = batch(first, &mut rx, cfg.chunk_bytes);
        // A line longer than a chunk (a large tool result) goes out in chunk-sized pieces:
        // the normalizer reads the run as one byte stream, and no piece is over the
        // ingest's or the broker's message limit.
        for piece in pieces(&body, cfg.chunk_bytes) {
            if let Err(e) = deliver(&sink, &run, next, Op::Append(&piece), &cfg, &cancel).await {
                tracing::warn!(run = %run.run_id, error = %e, "gateway run: its later events are dropped");
                return discard(rx, &cfg).await;
            }
            next += 1;
        }
        if terminal {
            match deliver(&sink, &run, next, Op::Close, &cfg, &cancel).await {
                Ok(()) => tracing::info!(run = %run.run_id, chunks = next, "gateway run closed"),
                Err(e) => {
                    tracing::warn!(run = %run.run_id, error = %e, "gateway run: cannot close")
                }
            }
            return discard(rx, &cfg).await;
        }
    }
}

/// The run's next chunk index, or `None` when it is closed or refused.
async fn start<S: RunSink>(
    sink: &S,
    run: &RunSpec,
    cfg: &FeedConfig,
    cancel: &CancellationToken,
) -> Option<u64> {
    let mut backoff = Backoff::new(cfg.retry_base, cfg.retry_cap);
    loop {
        match sink.resume(run).await {
            Ok(p) if p.closed => {
                tracing::warn!(run = %run.run_id, "gateway run already closed: its events are dropped");
                return None;
            }
            Ok(p) => return Some(p.next_chunk),
            Err(SinkError::Retry(e)) => {
                if !wait(&mut backoff, run, &e, cancel).await {
                    return None;
                }
            }
            Err(e) => {
                tracing::warn!(run = %run.run_id, error = %e, "gateway run refused: its events are dropped");
                return None;
            }
        }
    }
}

/// Sleeps before a retry; false when cancelled.
async fn wait(backoff: &mut Backoff, run: &RunSpec, e: &str, cancel: &CancellationToken) -> bool {
    let delay = backoff.next_delay();
    if backoff.attempts() == 1 {
        tracing::warn!(run = %run.run_id, error = %e, "ingest not accepted right now; retrying");
    } else {
        tracing::debug!(run = %run.run_id, error = %e, ?delay, "retrying ingest");
    }
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = cancel.cancelled() => false,
    }
}

/// Stores `op` at `index`, retrying what is worth retrying; a retry first asks whether
/// the earlier attempt landed after all.
async fn deliver<S: RunSink>(
    sink: &S,
    run: &RunSpec,
    index: u64,
    op: Op<'_>,
    cfg: &FeedConfig,
    cancel: &CancellationToken,
) -> Result<(), SinkError> {
    let mut backoff = Backoff::new(cfg.retry_base, cfg.retry_cap);
    loop {
        let r = match op {
            Op::Append(body) => sink.append(run, index, body.clone()).await,
            Op::Close => sink.close(run, index).await,
        };
        let e = match r {
            Ok(()) => return Ok(()),
            Err(SinkError::Retry(e)) => e,
            Err(e) => return Err(e),
        };
        if !wait(&mut backoff, run, &e, cancel).await {
            return Err(SinkError::Retry(format!("shutting down: {e}")));
        }
        match (sink.resume(run).await, op) {
            (Ok(p), Op::Append(_)) if p.next_chunk > index => return Ok(()),
            (Ok(p), Op::Close) if p.closed => return Ok(()),
            _ => {}
        }
    }
}

/// The next line: `None` when the queue is closed and drained, or after `idle` with
/// nothing queued (the queue is closed first, so no line sent meanwhile is lost).
async fn next_line(rx: &mut mpsc::Receiver<Line>, cfg: &FeedConfig) -> Option<Line> {
    match tokio::time::timeout(cfg.idle, rx.recv()).await {
        Ok(line) => line,
        Err(_) => {
            rx.close();
            rx.try_recv().ok()
        }
    }
}

/// The first line and whatever is queued behind it, up to `chunk_bytes` or a terminal
/// line; true when the batch ends with the terminal line.
fn batch(first: Line, rx: &mut mpsc::Receiver<Line>, chunk_bytes: usize) -> (Bytes, bool) {
    let mut body = BytesMut::with_capacity(first.text.len());
    body.put_slice(first.text.as_bytes());
    let mut terminal = first.terminal;
    while !terminal && body.len() < chunk_bytes {
        // Peeking is not possible: a line that would overflow the chunk still joins it
        // (a chunk is at most one line over `chunk_bytes`).
        let Ok(line) = rx.try_recv() else { break };
        body.put_slice(line.text.as_bytes());
        terminal = line.terminal;
    }
    (body.freeze(), terminal)
}

/// `body` cut into pieces of at most `max` bytes (at least one piece).
fn pieces(body: &Bytes, max: usize) -> Vec<Bytes> {
    let max = max.max(1);
    if body.len() <= max {
        return vec![body.clone()];
    }
    (0..body.len())
        .step_by(max)
        .map(|at| body.slice(at..(at + max).min(body.len())))
        .collect()
}

/// Drops the rest of a run that cannot be fed, so that its sender never blocks.
async fn discard(mut rx: mpsc::Receiver<Line>, cfg: &FeedConfig) {
    while next_line(&mut rx, cfg).await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_a_chunk_goes_out_in_chunk_sized_pieces() {
        let body = Bytes::from(vec![b'x'; 10]);
        let p = pieces(&body, 4);
        assert_eq!(p.iter().map(Bytes::len).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(p.concat(), body.to_vec());
        assert_eq!(pieces(&body, 64).len(), 1);
    }
}

//! Per-request flow control: a [`Window`] of at most `limit` chunk publishes in flight.
//!
//! A request sends a chunk ([`super::Ingestor::send`]) and only waits for acks when its
//! window is full, so a large body goes out at the broker's pace without one round trip
//! per chunk — and without ever having more than `limit` chunks (`limit × chunk_bytes`
//! bytes) of its own outstanding. However large the body, it cannot fill the
//! connection's buffers or hold the other requests' publishes behind megabytes of its
//! own: each request's share of the connection is its window.
//!
//! Acks come back in send order (one connection, one stream). The first failed ack fails
//! the request; the acks still in flight are awaited before the answer ([`Window::drain`])
//! so the producer is not told "failed" while chunks of its request are still landing.

use super::IngestError;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt as _;

/// Chunk publishes one request keeps in flight by default.
pub const DEFAULT_WINDOW: usize = 8;

/// A bounded window of publishes awaiting their acks, in send order. Each ack resolves
/// to a `T`: the stream sequence for [`super::PendingPut`], or whatever the transport
/// answers the producer with (gRPC's per-chunk ack).
pub struct Window<T = u64> {
    inflight: FuturesOrdered<BoxFuture<'static, Result<T, IngestError>>>,
    limit: usize,
}

impl<T> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("inflight", &self.inflight.len())
            .field("limit", &self.limit)
            .finish()
    }
}

impl<T> Window<T> {
    /// A window of at most `limit` (at least 1) publishes in flight.
    pub fn new(limit: usize) -> Window<T> {
        Window {
            inflight: FuturesOrdered::new(),
            limit: limit.max(1),
        }
    }

    /// Publishes in flight.
    pub fn len(&self) -> usize {
        self.inflight.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }

    /// True when no more may be sent before an ack comes back.
    pub fn is_full(&self) -> bool {
        self.inflight.len() >= self.limit
    }

    /// Adds a sent publish. Check [`Window::is_full`] (or call [`Window::make_room`])
    /// first: the window does not refuse, it only counts.
    pub fn push(&mut self, put: BoxFuture<'static, Result<T, IngestError>>) {
        self.inflight.push_back(put);
    }

    /// The oldest publish's ack; `None` when nothing is in flight.
    pub async fn next_ack(&mut self) -> Option<Result<T, IngestError>> {
        self.inflight.next().await
    }

    /// Waits for acks until another publish may be sent.
    pub async fn make_room(&mut self) -> Result<(), IngestError> {
        while self.is_full() {
            if let Some(Err(e)) = self.next_ack().await {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Waits for every publish in flight; the first error, if any, after all of them
    /// answered (or timed out).
    pub async fn drain(&mut self) -> Result<(), IngestError> {
        let mut first = None;
        while let Some(r) = self.next_ack().await {
            if let Err(e) = r {
                first = first.or(Some(e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn ok_after(ms: u64, seq: u64, done: Arc<AtomicUsize>) -> crate::ingest::PendingPut {
        Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            done.fetch_add(1, Ordering::SeqCst);
            Ok(seq)
        })
    }

    #[tokio::test(start_paused = true)]
    async fn acks_come_back_in_send_order_and_the_window_bounds_what_is_in_flight() {
        let done = Arc::new(AtomicUsize::new(0));
        let mut w = Window::new(2);
        w.push(ok_after(30, 1, done.clone()));
        assert!(!w.is_full());
        w.push(ok_after(10, 2, done.clone()));
        assert!(w.is_full());
        w.make_room().await.unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w.next_ack().await.unwrap().unwrap(), 2);
        assert!(w.is_empty());
        assert!(w.next_ack().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_every_ack_and_reports_the_first_error() {
        let done = Arc::new(AtomicUsize::new(0));
        let mut w = Window::new(4);
        w.push(Box::pin(async {
            Err(IngestError::Unavailable("no responders".into()))
        }));
        w.push(ok_after(50, 2, done.clone()));
        w.push(Box::pin(async {
            Err(IngestError::Broker("second".into()))
        }));
        let e = w.drain().await.unwrap_err();
        assert!(matches!(e, IngestError::Unavailable(_)), "{e:?}");
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn a_zero_limit_still_lets_one_through() {
        let mut w: Window = Window::new(0);
        assert!(!w.is_full());
        w.push(Box::pin(async { Ok(1) }));
        assert!(w.is_full());
    }
}

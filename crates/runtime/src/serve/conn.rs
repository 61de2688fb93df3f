//! An accepted connection under the server's [`Limits`](super::Limits): it holds one of
//! the server's connection slots until dropped, and fails its pending read or write
//! once no byte moved either way for the idle timeout (the server then closes it). Until
//! its first byte arrives the limit is the header-read timeout, counted from accept: a
//! peer that connects and sends nothing holds a slot for seconds, not for the idle
//! timeout (hyper's own header timer starts only at the first byte).
//!
//! And when every slot is taken, a new connection does not wait behind peers that
//! connected and said nothing: the connection silent the longest is closed to make room
//! ([`Slots`]). A flood of idle connections (no token needed to open one) then costs the
//! flood its own slots, not the service's; a peer that speaks at once is never the one
//! evicted while older silent ones exist.
//!
//! One peer address holds at most `max_connections_per_ip` of the slots: at its share,
//! its own longest-silent connection makes room, else its new connection is closed at
//! once — one host cannot take every slot with connections that trickle bytes.

use futures::task::AtomicWaker;
use futures::Stream;
use std::collections::{HashMap, VecDeque};
use std::future::Future as _;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A server's connection slots, and its connections that have not sent a byte yet
/// (oldest first), so that a full server can close the longest-silent one.
pub(crate) struct Slots {
    permits: Arc<Semaphore>,
    silent: Mutex<VecDeque<Arc<Silence>>>,
    /// Open connections per peer address.
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    max_per_ip: usize,
}

/// One connection's silence: whether it spoke (or is gone: nothing to evict), whether the
/// server closed it for a slot.
struct Silence {
    ip: IpAddr,
    spoke: AtomicBool,
    evicted: AtomicBool,
    waker: AtomicWaker,
}

/// A connection's place in its peer address's share; given back on drop.
pub(crate) struct IpShare {
    slots: Arc<Slots>,
    ip: IpAddr,
}

impl Drop for IpShare {
    fn drop(&mut self) {
        let mut per_ip = self.slots.per_ip();
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

impl Slots {
    pub(crate) fn new(limits: super::Limits) -> Arc<Slots> {
        Arc::new(Slots {
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            silent: Mutex::new(VecDeque::new()),
            per_ip: Mutex::new(HashMap::new()),
            max_per_ip: limits.max_connections_per_ip.max(1),
        })
    }

    fn silent(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Silence>>> {
        self.silent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn per_ip(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.per_ip.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the connection silent the longest (of peer `ip` only, when given); false
    /// when every such connection spoke.
    fn evict_oldest_silent(&self, ip: Option<IpAddr>) -> bool {
        let mut queue = self.silent();
        queue.retain(|s| !s.spoke.load(Ordering::Acquire));
        let Some(at) = queue.iter().position(|s| ip.is_none_or(|ip| s.ip == ip)) else {
            return false;
        };
        let Some(s) = queue.remove(at) else {
            return false;
        };
        s.evicted.store(true, Ordering::Release);
        s.waker.wake();
        true
    }

    /// A place in `ip`'s share of the slots: at once below the share, else after
    /// closing that peer's longest-silent connection; `None` when every connection of
    /// the peer spoke (the new one is refused).
    fn share(self: &Arc<Self>, ip: IpAddr) -> Option<IpShare> {
        let over = self.per_ip().get(&ip).copied().unwrap_or(0) >= self.max_per_ip;
        if over {
            if !self.evict_oldest_silent(Some(ip)) {
                metrics::counter!("streamgate_connections_refused_total", "reason" => "per_ip")
                    .increment(1);
                tracing::debug!(%ip, "a peer address is at its share of the connections: refused");
                return None;
            }
            metrics::counter!("streamgate_connections_evicted_total").increment(1);
        }
        *self.per_ip().entry(ip).or_insert(0) += 1;
        Some(IpShare {
            slots: self.clone(),
            ip,
        })
    }

    /// A slot: at once when one is free, else after closing the longest-silent
    /// connection, else when a connection ends.
    async fn take(&self) -> OwnedSemaphorePermit {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return p;
        }
        if self.evict_oldest_silent(None) {
            metrics::counter!("streamgate_connections_evicted_total").increment(1);
            tracing::debug!("connection limit reached: closed the longest-silent connection");
        } else {
            tracing::debug!("connection limit reached; waiting for a connection to close");
        }
        match self.permits.clone().acquire_owned().await {
            Ok(p) => p,
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    fn watch(&self, ip: IpAddr) -> Arc<Silence> {
        let s = Arc::new(Silence {
            ip,
            spoke: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        let mut queue = self.silent();
        // Forget the ones that spoke since (bounded by the open connections).
        queue.retain(|s| !s.spoke.load(Ordering::Acquire));
        queue.push_back(s.clone());
        s
    }
}

/// A connection with its slot and idle timer.
pub struct Conn<T> {
    io: T,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    /// Until its first byte: how the server may close it for a slot.
    silence: Option<Arc<Silence>>,
    _permit: OwnedSemaphorePermit,
    _share: IpShare,
}

impl<T> Conn<T> {
    /// `first_byte`: the deadline for the peer's first byte, from now.
    fn new(
        io: T,
        idle: Duration,
        first_byte: Duration,
        permit: OwnedSemaphorePermit,
        share: IpShare,
        silence: Arc<Silence>,
    ) -> Conn<T> {
        Conn {
            io,
            idle,
            deadline: Box::pin(tokio::time::sleep(first_byte.min(idle))),
            silence: Some(silence),
            _permit: permit,
            _share: share,
        }
    }

    /// Closed for a slot (while silent); else notes the first byte.
    fn evicted(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(s) = &self.silence else {
            return false;
        };
        s.waker.register(cx.waker());
        s.evicted.load(Ordering::Acquire)
    }

    fn spoke(&mut self) {
        if let Some(s) = self.silence.take() {
            s.spoke.store(true, Ordering::Release);
        }
    }

    fn touched(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// On a pending operation: the idle error once the deadline passed.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

impl<T> Drop for Conn<T> {
    /// A silent connection that closed (timed out, or its peer left) is no candidate for
    /// eviction: closing it again would free no slot.
    fn drop(&mut self) {
        self.spoke();
    }
}

fn idle_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle timeout")
}

impl<T: AsyncRead + Unpin> AsyncRead for Conn<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.evicted(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "closed for a new connection: it sent nothing while every slot was taken",
            )));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.spoke();
                }
                this.touched();
                Poll::Ready(r)
            }
            Poll::Pending if this.idle_expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Conn<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(r) => {
                this.touched();
                Poll::Ready(r)
            }
            Poll::Pending if this.idle_expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                this.touched();
                Poll::Ready(r)
            }
            Poll::Pending if this.idle_expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn<TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Accepts one connection and gives it a slot ([`Slots::take`]). Accept errors (out of
/// file descriptors, a peer gone before accept) are logged and retried after a pause;
/// the listener stays.
pub(crate) async fn accept(
    listener: &TcpListener,
    slots: &Arc<Slots>,
    limits: super::Limits,
) -> Conn<TcpStream> {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let ip = peer.ip().to_canonical();
                let Some(share) = slots.share(ip) else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let permit = slots.take().await;
                return Conn::new(
                    stream,
                    limits.idle_timeout,
                    limits.header_read_timeout,
                    permit,
                    share,
                    slots.watch(ip),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The connections of `listener` as a stream (for tonic's `serve_with_incoming`).
pub(crate) fn incoming(
    listener: TcpListener,
    limits: super::Limits,
) -> impl Stream<Item = io::Result<Conn<TcpStream>>> + Send + 'static {
    let slots = Slots::new(limits);
    futures::stream::unfold((listener, slots), move |(l, s)| async move {
        let c = accept(&l, &s, limits).await;
        Some((Ok(c), (l, s)))
    })
}

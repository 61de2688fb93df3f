//! An accepted connection under the server's [`Limits`](super::Limits): it holds one of
//! the server's connection permits until dropped, and fails its pending read or write
//! once no byte moved either way for the idle timeout (the server then closes it). Until
//! its first byte arrives the limit is the header-read timeout, counted from accept: a
//! peer that connects and sends nothing holds a slot for seconds, not for the idle
//! timeout (hyper's own header timer starts only at the first byte).

use futures::Stream;
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A connection with its permit and idle timer.
pub struct Conn<T> {
    io: T,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl<T> Conn<T> {
    /// `first_byte`: the deadline for the peer's first byte, from now.
    pub(crate) fn new(
        io: T,
        idle: Duration,
        first_byte: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Conn<T> {
        Conn {
            io,
            idle,
            deadline: Box::pin(tokio::time::sleep(first_byte.min(idle))),
            _permit: permit,
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
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
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

/// Accepts one connection once a permit is free. Accept errors (out of file
/// descriptors, a peer gone before accept) are logged and retried after a pause; the
/// listener stays.
pub(crate) async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    limits: super::Limits,
) -> Conn<TcpStream> {
    let permit = match permits.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            tracing::debug!("connection limit reached; waiting for a connection to close");
            match permits.clone().acquire_owned().await {
                Ok(p) => p,
                // The semaphore is never closed.
                Err(_) => return std::future::pending().await,
            }
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                return Conn::new(
                    stream,
                    limits.idle_timeout,
                    limits.header_read_timeout,
                    permit,
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
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    futures::stream::unfold((listener, permits), move |(l, p)| async move {
        let c = accept(&l, &p, limits).await;
        Some((Ok(c), (l, p)))
    })
}

//! HTTP servers: an axum router served over HTTP/1.1 and HTTP/2 (hyper), optional
//! TLS/mTLS (rustls), and the [`Limits`](super::Limits): connection cap, TLS handshake
//! and HTTP/1 header-read timeout, idle timeout. On shutdown the server stops
//! accepting, and each connection finishes its requests and closes.

use super::conn::{accept, Slots};
use super::{bind, ServeError, ServeOptions, Serving};
use futures::FutureExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Binds `addr` and returns the server of `app`; it serves until `shutdown` fires.
pub async fn start(
    addr: SocketAddr,
    app: axum::Router,
    opts: &ServeOptions,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    start_on(bind(addr).await?, app, opts, shutdown)
}

/// [`start`] on a bound listener (when the app needs the bound address).
pub fn start_on(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    opts: &ServeOptions,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    let bound = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let tls = match &opts.tls {
        Some(files) => Some(tokio_rustls::TlsAcceptor::from(files.server_config()?)),
        None => None,
    };
    let app = super::counted::http(app);
    let limits = opts.limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.idle_timeout / 3);
    let task = async move {
        let slots = Slots::new(limits);
        let mut conns = JoinSet::new();
        loop {
            let conn = tokio::select! {
                () = shutdown.cancelled() => break,
                c = accept(&listener, &slots, limits) => c,
            };
            while conns.try_join_next().is_some() {}
            let (app, builder, tls, stop) =
                (app.clone(), builder.clone(), tls.clone(), shutdown.clone());
            conns.spawn(async move {
                match tls {
                    None => serve_conn(conn, app, &builder, stop).await,
                    Some(acceptor) => {
                        let hs = acceptor.accept(conn);
                        match tokio::time::timeout(limits.header_read_timeout, hs).await {
                            Ok(Ok(tls)) => serve_conn(tls, app, &builder, stop).await,
                            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                            Err(_) => tracing::debug!("TLS handshake timed out"),
                        }
                    }
                }
            });
        }
        // Stop accepting now; the connections finish their requests and close.
        drop(listener);
        while conns.join_next().await.is_some() {}
        Ok(())
    }
    .boxed();
    Ok(Serving { addr: bound, task })
}

/// Serves one connection until it ends, or gracefully once `stop` fires.
async fn serve_conn<T>(
    io: T,
    app: axum::Router,
    builder: &auto::Builder<TokioExecutor>,
    stop: CancellationToken,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = stop.cancelled() => None,
    };
    let r = match ended {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

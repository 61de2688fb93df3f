//! gRPC servers: one function for every service's server — the service behind its
//! auth interceptor, gRPC health (the service reported serving) and reflection (v1 and
//! v1alpha), optional TLS/mTLS, and the [`Limits`](super::Limits).

use super::{bind, conn, ServeError, ServeOptions, Serving};
use crate::rpc::{reflection, reflection_v1alpha};
use futures::FutureExt as _;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http::Request;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::service::Routes;

/// How long a keep-alive ping may go unanswered before the connection is dropped.
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Binds `addr` and returns the server of `service` behind `auth`, with health and
/// reflection; it serves until `shutdown` fires.
pub async fn start<S, I>(
    addr: SocketAddr,
    service: S,
    auth: I,
    opts: &ServeOptions,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError>
where
    S: NamedService + Send + 'static,
    I: Interceptor + Send + 'static,
    InterceptedService<S, I>:
        Service<Request<Body>, Error = Infallible> + NamedService + Clone + Send + Sync + 'static,
    <InterceptedService<S, I> as Service<Request<Body>>>::Response: axum::response::IntoResponse,
    <InterceptedService<S, I> as Service<Request<Body>>>::Future: Send + 'static,
{
    start_with_http(addr, service, auth, None, opts, shutdown).await
}

/// As [`start`], also serving `http` (plain HTTP/1.1 and HTTP/2 routes, behind their own
/// auth) on the same port: a service whose only port is its gRPC one can still offer an
/// HTTP API (the projector's run stream).
pub async fn start_with_http<S, I>(
    addr: SocketAddr,
    service: S,
    auth: I,
    http: Option<axum::Router>,
    opts: &ServeOptions,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError>
where
    S: NamedService + Send + 'static,
    I: Interceptor + Send + 'static,
    InterceptedService<S, I>:
        Service<Request<Body>, Error = Infallible> + NamedService + Clone + Send + Sync + 'static,
    <InterceptedService<S, I> as Service<Request<Body>>>::Response: axum::response::IntoResponse,
    <InterceptedService<S, I> as Service<Request<Body>>>::Future: Send + 'static,
{
    let listener = bind(addr).await?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<S>().await;
    let limits = opts.limits;
    let mut builder = tonic::transport::Server::builder()
        // Pings keep a live peer's quiet stream (a follow, a watch) above the idle
        // timeout, and find dead peers.
        .http2_keepalive_interval(Some(limits.idle_timeout / 3))
        .http2_keepalive_timeout(Some(PING_TIMEOUT));
    if let Some(tls) = &opts.tls {
        builder = builder.tls_config(tls.tonic_config(limits.header_read_timeout)?)?;
    }
    let mut routes = Routes::new(InterceptedService::new(service, auth))
        .add_service(health)
        .add_service(reflection(S::NAME)?)
        .add_service(reflection_v1alpha(S::NAME)?);
    let counted = super::counted::grpc(routes.into_axum_router());
    routes = match http {
        Some(http) => {
            builder = builder.accept_http1(true);
            Routes::from(counted.merge(super::counted::http(http)))
        }
        None => Routes::from(counted),
    };
    let router = builder.add_routes(routes);
    let incoming = conn::incoming(listener, limits);
    let task = async move {
        router
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
            .await?;
        Ok(())
    }
    .boxed();
    Ok(Serving { addr: bound, task })
}

//! Starts the worker and the ingest front doors together (used by the service binary and
//! by `streamgate up`).

use crate::config::NormalizerConfig;
use crate::ingest::{grpc::IngestServer, http, Ingestor};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use streamgate_proto::v1::ingest_service_server::IngestServiceServer;
use streamgate_runtime::rpc::{reflection, reflection_v1alpha, RequireBearer};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Where to listen (port 0 picks a free port).
#[derive(Debug, Clone)]
pub struct Listeners {
    /// gRPC `IngestService` (+ health, reflection); `None` disables it.
    pub grpc: Option<SocketAddr>,
    /// HTTP ingest; `None` disables it.
    pub http: Option<SocketAddr>,
    /// Bearer token required by both front doors, when set.
    pub ingest_token: Option<String>,
    /// Partition count of the deployment.
    pub partitions: u32,
}

/// A started normalizer.
pub struct Running {
    /// Bound gRPC address.
    pub grpc: Option<SocketAddr>,
    /// Bound HTTP address.
    pub http: Option<SocketAddr>,
    /// The partitions this replica holds leases on (and normalizes), as they change.
    pub partitions: watch::Receiver<BTreeSet<u32>>,
    /// This replica's member id in the `normalizer` lease group.
    pub member: String,
    /// The tasks; they end after shutdown once drained. Aborting them is a crash: the
    /// partitions' leases stay until their TTL runs out.
    pub tasks: JoinSet<anyhow::Result<()>>,
}

/// Starts the worker and the front doors; they stop when `shutdown` fires.
pub async fn start(
    nats: async_nats::Client,
    cfg: NormalizerConfig,
    listen: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let js = async_nats::jetstream::new(nats);
    let durables = (0..listen.partitions)
        .map(|p| streamgate_bus::subject::partition_durable(&cfg.durable, listen.partitions, p))
        .collect();
    let window = cfg.ingest_window;
    let worker = crate::worker::Worker::open(js.clone(), cfg, listen.partitions).await?;
    let ingestor = Ingestor::new(js.clone(), listen.partitions).with_window(window);
    let mut tasks = JoinSet::new();
    {
        let (js, stop) = (js.clone(), shutdown.clone());
        tasks.spawn(async move {
            streamgate_bus::consume::report_lag(js, streamgate_bus::RAW_STREAM, durables, stop)
                .await;
            Ok(())
        });
    }

    let grpc = match listen.grpc {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            let (reporter, health) = tonic_health::server::health_reporter();
            reporter
                .set_serving::<IngestServiceServer<IngestServer>>()
                .await;
            let auth = RequireBearer::optional(listen.ingest_token.as_deref());
            let service = tonic::service::interceptor::InterceptedService::new(
                IngestServiceServer::new(IngestServer::new(ingestor.clone())),
                auth,
            );
            let reflect = reflection()?;
            let reflect_alpha = reflection_v1alpha()?;
            let stop = shutdown.clone();
            tasks.spawn(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                tonic::transport::Server::builder()
                    .add_service(service)
                    .add_service(health)
                    .add_service(reflect)
                    .add_service(reflect_alpha)
                    .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                    .await?;
                Ok(())
            });
            Some(bound)
        }
    };

    let http_addr = match listen.http {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            let app = http::router(ingestor, listen.ingest_token.clone());
            let stop = shutdown.clone();
            tasks.spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await?;
                Ok(())
            });
            Some(bound)
        }
    };

    let (partitions, member) = (worker.partitions(), worker.member().to_owned());
    let stop = shutdown.clone();
    tasks.spawn(async move { worker.run(stop).await });
    Ok(Running {
        grpc,
        http: http_addr,
        partitions,
        member,
        tasks,
    })
}

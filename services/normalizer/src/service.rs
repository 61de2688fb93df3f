//! Starts the worker and the ingest front doors together (used by the service binary and
//! by `streamgate up`). Both doors start through `streamgate_runtime::serve` (health,
//! reflection, TLS, connection limits) and authenticate with [`crate::ingest::auth`].

use crate::config::NormalizerConfig;
use crate::ingest::auth::{IngestAuth, IngestInterceptor};
use crate::ingest::{grpc::IngestServer, http, Ingestor};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use streamgate_proto::v1::ingest_service_server::IngestServiceServer;
use streamgate_runtime::serve::{self, ServeOptions};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Where to listen (port 0 picks a free port), and who may ingest.
#[derive(Debug, Clone, Default)]
pub struct Listeners {
    /// gRPC `IngestService` (+ health, reflection); `None` disables it.
    pub grpc: Option<SocketAddr>,
    /// HTTP ingest; `None` disables it.
    pub http: Option<SocketAddr>,
    /// A bearer token that may write every tenant (`--ingest-token`).
    pub ingest_token: Option<String>,
    /// A token file of tokens scoped to tenants (`--ingest-tokens`, format in
    /// [`crate::ingest::auth`]). With neither this nor `ingest_token` the front doors
    /// are open.
    pub ingest_tokens: Option<std::path::PathBuf>,
    /// Partition count of the deployment.
    pub partitions: u32,
    /// TLS and connection limits of both front doors.
    pub serve: ServeOptions,
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
    /// The ingestor behind the front doors (for in-process producers such as
    /// [`crate::gateway`] followers).
    pub ingestor: Ingestor,
}

/// Starts the worker and the front doors; they stop when `shutdown` fires.
pub async fn start(
    nats: async_nats::Client,
    cfg: NormalizerConfig,
    listen: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    streamgate_wire::families::final_text::configure(cfg.max_final_bytes, cfg.final_bytes_budget);
    let auth = IngestAuth::load(
        listen.ingest_token.as_deref(),
        listen.ingest_tokens.as_deref(),
    )?;
    if auth.is_open() {
        tracing::warn!("ingest front doors are open: no --ingest-token or --ingest-tokens given");
    }
    let js = async_nats::jetstream::new(nats);
    // The partitions' consumer names, each the base of its incarnations.
    let bases = (0..listen.partitions)
        .map(|p| streamgate_bus::subject::partition_durable(&cfg.durable, listen.partitions, p))
        .collect();
    let window = cfg.ingest_window;
    let worker = crate::worker::Worker::open(js.clone(), cfg, listen.partitions).await?;
    let ingestor = Ingestor::new(js.clone(), listen.partitions).with_window(window);
    let mut tasks = JoinSet::new();
    {
        let (js, stop) = (js.clone(), shutdown.clone());
        tasks.spawn(async move {
            let of = streamgate_bus::consume::LagOf::Incarnations(bases);
            streamgate_bus::consume::report_lag(js, streamgate_bus::RAW_STREAM, of, stop).await;
            Ok(())
        });
    }

    let grpc = match listen.grpc {
        None => None,
        Some(addr) => {
            let server = serve::grpc::start(
                addr,
                IngestServiceServer::new(IngestServer::new(ingestor.clone())),
                IngestInterceptor::new(auth.clone()),
                &listen.serve,
                shutdown.clone(),
            )
            .await?;
            let bound = server.addr;
            tasks.spawn(async move { Ok(server.task.await?) });
            Some(bound)
        }
    };

    let http_addr = match listen.http {
        None => None,
        Some(addr) => {
            let app = http::router(ingestor.clone(), auth);
            let server = serve::http::start(addr, app, &listen.serve, shutdown.clone()).await?;
            let bound = server.addr;
            tasks.spawn(async move { Ok(server.task.await?) });
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
        ingestor,
    })
}

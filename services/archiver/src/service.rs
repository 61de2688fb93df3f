//! Starts the archive consumer(s) and the ArchiveService gRPC server together (used by
//! the service binary and by `streamgate up`). The server starts through
//! `streamgate_runtime::serve::grpc` (operator bearer token, health, reflection, TLS/mTLS,
//! connection limits).

use crate::consumer::{open_consumers, run_events, run_raw, ConsumerConfig, Consumers};
use crate::replay::Replay;
use std::net::SocketAddr;
use std::sync::Arc;
use streamgate_archive::Store;
use streamgate_proto::v1::archive_service_server::ArchiveServiceServer;
use streamgate_runtime::rpc::RequireBearer;
use streamgate_runtime::serve::{self, ServeOptions};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Where and how the ArchiveService listens.
#[derive(Debug, Clone, Default)]
pub struct ArchiverListen {
    /// gRPC address (port 0 picks a free port); `None` runs the consumer only.
    pub grpc: Option<SocketAddr>,
    /// The operator bearer token every ArchiveService call must carry. Required: the
    /// archive holds raw reasoning and is operator-only.
    pub operator_token: String,
    /// Partition count of the deployment (to find a run's subject when following).
    pub partitions: u32,
    /// TLS and connection limits of the gRPC server.
    pub serve: ServeOptions,
    /// Prices of models, for the cost of runs.
    pub prices: crate::accounting::Prices,
    /// The prices' currency.
    pub currency: String,
}

/// A started archiver.
pub struct Running {
    /// Bound gRPC address.
    pub grpc: Option<SocketAddr>,
    /// The tasks; they end after shutdown once drained.
    pub tasks: JoinSet<anyhow::Result<()>>,
}

/// Starts the consumer(s) and the gRPC server; they stop when `shutdown` fires.
pub async fn start(
    nats: async_nats::Client,
    store: Arc<dyn Store>,
    cfg: ConsumerConfig,
    listen: ArchiverListen,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    anyhow::ensure!(
        !listen.operator_token.is_empty(),
        "the archive is operator-only: an operator token is required"
    );
    let js = async_nats::jetstream::new(nats);
    // The streams' settings belong to the deployment (the normalizer provisions them from
    // its config); the archiver has none of its own. It creates a missing stream with the
    // defaults so it can start first, but never rewrites an existing one, and refuses to
    // start against streams made for another partition count (its live replay would
    // listen on the wrong subjects).
    let streams = streamgate_bus::StreamSettings {
        partitions: listen.partitions,
        ..Default::default()
    };
    streamgate_bus::ensure_streams_exist(&js, &streams).await?;
    // The consumers are made here, not in their tasks: a JetStream timeout fails the
    // start, which the service retries, rather than a task that has already started.
    let Consumers { events, raw } = open_consumers(&js, &cfg).await?;
    let mut tasks = JoinSet::new();
    {
        let (js, stop) = (js.clone(), shutdown.clone());
        let durables = vec![cfg.durable.clone()];
        tasks.spawn(async move {
            let of = streamgate_bus::consume::LagOf::Durables(durables);
            streamgate_bus::consume::report_lag(js, streamgate_bus::EVENTS_STREAM, of, stop).await;
            Ok(())
        });
    }
    {
        let (store, cfg, stop) = (store.clone(), cfg.clone(), shutdown.clone());
        tasks.spawn(async move { run_events(events, store, cfg, stop).await });
    }
    {
        let (store, policies, stop) = (store.clone(), cfg.retention.clone(), shutdown.clone());
        let every = cfg.retention_interval;
        tasks.spawn(async move { crate::retention::run(store, policies, every, stop).await });
    }
    if cfg.search_thinking {
        let (store, stop) = (store.clone(), shutdown.clone());
        tasks.spawn(async move { crate::thinking::run(store, stop).await });
    }
    if let Some(follow) = cfg.export_otlp.clone() {
        let (store, stop) = (store.clone(), shutdown.clone());
        tasks.spawn(async move { crate::genai::follow::run(store, follow, stop).await });
    }
    if let Some(raw) = raw {
        let (store, cfg, stop) = (store.clone(), cfg.clone(), shutdown.clone());
        tasks.spawn(async move { run_raw(raw, store, cfg, stop).await });
    }
    let grpc = match listen.grpc {
        None => None,
        Some(addr) => {
            let server = serve::grpc::start(
                addr,
                ArchiveServiceServer::new(
                    Replay::new(store, js, listen.partitions)
                        .with_retention(cfg.retention.clone())
                        .with_prices(listen.prices.clone(), listen.currency.clone()),
                ),
                RequireBearer::new(&listen.operator_token),
                &listen.serve,
                shutdown.clone(),
            )
            .await?;
            let bound = server.addr;
            tasks.spawn(async move { Ok(server.task.await?) });
            Some(bound)
        }
    };
    Ok(Running { grpc, tasks })
}

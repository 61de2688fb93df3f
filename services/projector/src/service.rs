//! Starts a channel: KV buckets, sink and delivery engine, the settings watch, the
//! partition leases (whose workers recover and consume each held partition), the
//! `ProjectorService` gRPC server and (for `web` channels) the web page — both through
//! `streamgate_runtime::serve` (TLS/mTLS and connection limits from
//! [`ChannelConfig::serve`](crate::config::ChannelConfig::serve)).

use crate::channel::{Channel, Recovery};
use crate::config::{with_name, ChannelConfig, ChannelSink};
use crate::grpc::Projector;
use crate::kv;
use crate::web::{self, WebSink};
use futures::StreamExt as _;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use streamgate_bus::lease::{LeaseConfig, PartitionLeases, PartitionWork};
use streamgate_proto::v1::projector_service_server::ProjectorServiceServer;
use streamgate_runtime::rpc::RequireBearer;
use streamgate_runtime::serve;
use streamgate_sinks::{Delivery, Sink};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The web sink and where its page listens.
type WebPage = (Arc<WebSink>, SocketAddr);

/// A started channel.
pub struct Running {
    /// The channel (for in-process callers and tests).
    pub channel: Arc<Channel>,
    /// Bound `ProjectorService` address, when one was requested.
    pub grpc: Option<SocketAddr>,
    /// Bound web page address (`web` channels).
    pub web: Option<SocketAddr>,
    /// The partitions this replica holds leases on (and renders), as they change.
    /// Crash recovery of a partition runs when it is acquired; orphans it settles are
    /// counted by [`Channel::interrupted`].
    pub partitions: watch::Receiver<BTreeSet<u32>>,
    /// This replica's member id in the channel's lease group.
    pub member: String,
    /// The tasks; they end after shutdown (every partition drained and released).
    pub tasks: JoinSet<anyhow::Result<()>>,
}

/// Starts `cfg` on `nats`; gRPC on `grpc` when given (port 0 picks one). Everything stops
/// when `shutdown` fires; aborting the tasks (or dropping [`Running`]) simulates a crash.
pub async fn start(
    nats: async_nats::Client,
    cfg: ChannelConfig,
    grpc: Option<SocketAddr>,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let js = async_nats::jetstream::new(nats);
    // The normalizer owns the streams' settings; a channel only makes sure they exist.
    let streams = streamgate_bus::StreamSettings {
        replicas: cfg.replicas.max(1),
        partitions: cfg.partitions,
        ..Default::default()
    };
    streamgate_bus::ensure_streams_exist(&js, &streams).await?;
    let state_kv = kv::bucket(&js, kv::DELIVERY_BUCKET, cfg.replicas).await?;
    let settings_kv = kv::bucket(&js, kv::SETTINGS_BUCKET, cfg.replicas).await?;
    let store = Arc::new(kv::KvStateStore::new(state_kv.clone()));
    let (sink, web_sink): (Arc<dyn Sink>, Option<WebPage>) = match &cfg.sink {
        ChannelSink::Sink(s) => (with_name(s, &cfg.name).build()?, None),
        ChannelSink::Web { listen } => {
            let w = WebSink::new(&cfg.name);
            (w.clone(), Some((w, *listen)))
        }
    };
    let tier = cfg.tier.unwrap_or_else(|| sink.tier());
    let draft_limit = sink.text_limit();
    let delivery = Delivery::new(cfg.delivery.clone(), store, [sink]);
    let channel = Arc::new(Channel::new(
        cfg.clone(),
        tier,
        draft_limit,
        js,
        delivery.clone(),
        state_kv,
        settings_kv,
    ));
    // The settings watch opens before recovery fills the settings cache, so a change
    // made by another replica meanwhile is not missed.
    let settings_watch = channel.settings_watch().await?;
    let lease_js = cfg
        .lease_nats
        .clone()
        .map_or_else(|| channel.jetstream().clone(), async_nats::jetstream::new);
    let leases = PartitionLeases::open(
        &lease_js,
        LeaseConfig {
            group: cfg.lease_group(),
            partitions: cfg.partitions,
            ttl: cfg.lease_ttl,
            replicas: cfg.replicas.max(1),
            member: None,
        },
    )
    .await?;
    let (partitions, member) = (leases.held(), leases.member().to_owned());
    let mut tasks = JoinSet::new();
    {
        let js = channel.jetstream().clone();
        let durables = (0..cfg.partitions)
            .map(|p| cfg.partition_durable(p))
            .collect();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let of = streamgate_bus::consume::LagOf::Durables(durables);
            streamgate_bus::consume::report_lag(js, streamgate_bus::EVENTS_STREAM, of, stop).await;
            Ok(())
        });
    }
    {
        // Shutdown: queued ops get the engine's short grace, then it closes, so a chat
        // stuck in retries (or in a 30 s retry_after) cannot hold the process. What is
        // left stays tracked by the active-run markers for the next start. (A task of
        // the set: aborting the set, a crash, drops the engine with it.)
        let stop = shutdown.clone();
        tasks.spawn(async move {
            stop.cancelled().await;
            delivery.shutdown().await;
            Ok(())
        });
    }
    {
        let (c, stop) = (channel.clone(), shutdown.clone());
        tasks.spawn(async move { Ok(c.follow_settings(settings_watch, stop).await?) });
    }
    {
        // One worker per held partition: recovery of its marked runs, then its
        // consumer. A graceful stop drains and releases every partition.
        let (c, stop) = (channel.clone(), shutdown.clone());
        tasks.spawn(async move {
            leases
                .run(stop, move |work: PartitionWork| {
                    c.clone().run_partition(work)
                })
                .await?;
            Ok(())
        });
    }
    {
        // Periodic sweep: a run whose agent died while this projector kept running is
        // orphaned too.
        let (c, stop) = (channel.clone(), shutdown.clone());
        let every = cfg.orphan_after.max(std::time::Duration::from_secs(1));
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(every) => {}
                }
                if let Err(e) = c.recover(Recovery::Sweep).await {
                    tracing::warn!(error = %e, "orphan sweep failed");
                }
            }
        });
    }
    if cfg.sink.kind() == "telegram" {
        // Native drafts (private chats) vanish ~30 s after their last update: every
        // 10 s the open runs' drafts go to the engine again, and the sink sends the ones
        // about to expire (the others cost no request).
        let (c, stop) = (channel.clone(), shutdown.clone());
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
                }
                c.refresh_drafts().await;
            }
        });
    }
    let grpc = match grpc {
        None => None,
        Some(addr) => {
            // A channel without a web page serves the run stream beside ProjectorService
            // (a web channel serves it with its page, behind the page's guard).
            let run_stream = web_sink.is_none().then(|| {
                let router = crate::run_stream::router(channel.clone(), shutdown.clone()).layer(
                    axum::middleware::from_fn_with_state(
                        cfg.token.clone().map(std::sync::Arc::<str>::from),
                        crate::run_stream::require_bearer,
                    ),
                );
                // Outermost: a preflight is answered before the bearer check.
                match crate::run_stream::cors(&cfg.cors_origins) {
                    Some(cors) => router.layer(cors),
                    None => router,
                }
            });
            let server = serve::grpc::start_with_http(
                addr,
                ProjectorServiceServer::new(Projector::new(channel.clone(), shutdown.clone())),
                RequireBearer::optional(cfg.token.as_deref()),
                run_stream,
                &cfg.serve,
                shutdown.clone(),
            )
            .await?;
            let bound = server.addr;
            tasks.spawn(async move { Ok(server.task.await?) });
            Some(bound)
        }
    };
    {
        // An erasure takes what this replica holds of the erased runs in memory with it.
        let erasures = streamgate_bus::erase::erasures(&channel.jetstream().client()).await?;
        let (c, page, stop) = (
            channel.clone(),
            web_sink.as_ref().map(|(sink, _)| sink.clone()),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            let mut erasures = std::pin::pin!(erasures);
            loop {
                let erased = tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    e = erasures.next() => e,
                };
                let Some(erased) = erased else {
                    return Ok(());
                };
                c.forget_erased(&erased);
                if let Some(page) = &page {
                    page.runs().forget(&erased);
                }
                tracing::info!(tenant = %erased.tenant.escape_debug(), runs = erased.runs.as_ref().map_or(0, Vec::len), "erased runs forgotten");
            }
        });
    }
    let web = match web_sink {
        None => None,
        Some((sink, listen)) => {
            // Bound first: the page's access rule needs the bound address.
            let listener = streamgate_runtime::serve::listen(listen)?;
            let bound = listener.local_addr()?;
            let access = web::access::PageAccess {
                token: cfg.token.as_deref().map(Into::into),
                listen: bound,
            };
            let app = web::router(sink.clone(), shutdown.clone(), access, channel.clone());
            let c = channel.clone();
            tasks.spawn(async move {
                web::seed::from_events(&c, sink.runs()).await;
                Ok(())
            });
            let server = serve::http::start_on(listener, app, &cfg.serve, shutdown.clone())?;
            tasks.spawn(async move { Ok(server.task.await?) });
            Some(bound)
        }
    };
    Ok(Running {
        channel,
        grpc,
        web,
        partitions,
        member,
        tasks,
    })
}

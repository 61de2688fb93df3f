//! `streamgate follow-gateway <ws-url>`: follows a live OpenClaw gateway
//! ([`streamgate_normalizer::gateway`]) and sends each of its runs, as the
//! `openclaw-events` family, to the IngestService — the local `streamgate up`
//! (`up.json`, `ingest.token`) unless `--addr` says otherwise, like `streamgate ingest`.
//!
//! Each chunk goes as its own short gRPC ingest stream carrying the chunk's index: the
//! service stores it once (a chunk sent again is acknowledged as a duplicate), and a run
//! fed over minutes or hours holds no stream (nor the service's per-run claim) open
//! between its chunks. "Not now" answers (UNAVAILABLE while a stream leader is elected,
//! a broken connection) are retried with backoff, the run's queue filling meanwhile and
//! then pushing back on the WebSocket read; answers that repeating cannot change (a
//! refused token, a closed run) end that run's feed ([`super::ingest`]'s `retry`
//! classification).

use super::discover::{read_ingest_token, Instance};
use super::ingest::retry::{classify, Verdict};
use anyhow::{Context, Result};
use bytes::Bytes;
use std::path::PathBuf;
use streamgate_normalizer::gateway::sink::{RunSink, SinkError};
use streamgate_normalizer::gateway::{follow, FollowConfig};
use streamgate_normalizer::ingest::{ResumePoint, RunSpec};
use streamgate_proto::v1::ingest_service_client::IngestServiceClient;
use streamgate_proto::v1::{IngestChunk, ResumePointRequest};
use streamgate_runtime::rpc::SendBearer;
use streamgate_runtime::serve::ClientTlsArgs;
use streamgate_runtime::{init_telemetry, TelemetryArgs};

/// Flags of `streamgate follow-gateway`.
#[derive(Debug, Clone, clap::Args)]
pub struct FollowGatewayArgs {
    /// The gateway's WebSocket URL (`ws://host:18789`, `wss://…`).
    pub url: String,
    /// The gateway's token (sent in the `connect` request, never logged).
    #[arg(long, env = "STREAMGATE_GATEWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Tenant the runs are ingested under.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// IngestService address (default: the local `streamgate up`).
    #[arg(long, env = "STREAMGATE_INGEST_ADDR")]
    pub addr: Option<String>,
    /// Ingest bearer token (default with no `--addr`: the local `up`'s
    /// `<data dir>/ingest.token`).
    #[arg(long, env = "STREAMGATE_INGEST_TOKEN", hide_env_values = true)]
    pub ingest_token: Option<String>,
    /// Events queued per run at most before the WebSocket read waits.
    #[arg(long, default_value_t = 1024)]
    pub queue: usize,
    /// Data dir of the local instance to find.
    #[arg(long, default_value = super::discover::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// TLS to the IngestService.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
    /// Logs and metrics.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// The IngestService as a [`RunSink`].
#[derive(Clone)]
struct GrpcSink {
    client: super::ingest::Client,
}

fn sink_error(s: tonic::Status) -> SinkError {
    if s.code() == tonic::Code::FailedPrecondition {
        return SinkError::Closed;
    }
    let msg = s.to_string();
    match classify(&anyhow::Error::new(s)) {
        Verdict::Retry(_) => SinkError::Retry(msg),
        Verdict::Permanent => SinkError::Permanent(msg),
    }
}

impl GrpcSink {
    /// Sends one chunk (or the close marker) on a stream of its own; waits for its ack.
    async fn one(&self, chunk: IngestChunk) -> Result<(), SinkError> {
        let mut acks = self
            .client
            .clone()
            .ingest(futures::stream::iter([chunk]))
            .await
            .map_err(sink_error)?
            .into_inner();
        match acks.message().await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(SinkError::Retry(
                "the ingest stream ended without an ack".into(),
            )),
            Err(s) => Err(sink_error(s)),
        }
    }

    fn chunk(run: &RunSpec, index: u64, body: Vec<u8>, close: Option<&str>) -> IngestChunk {
        IngestChunk {
            tenant: run.tenant.to_string(),
            run_id: run.run_id.to_string(),
            session_key: run.session_key.clone().map(String::from),
            family: run.family.clone(),
            dialect: run.dialect.clone(),
            chunk: index,
            body,
            close: close.map(str::to_owned),
        }
    }
}

impl RunSink for GrpcSink {
    async fn resume(&self, run: &RunSpec) -> Result<ResumePoint, SinkError> {
        let p = self
            .client
            .clone()
            .resume_point(ResumePointRequest {
                tenant: run.tenant.to_string(),
                run_id: run.run_id.to_string(),
            })
            .await
            .map_err(sink_error)?
            .into_inner();
        Ok(ResumePoint {
            next_chunk: p.next_chunk,
            closed: p.closed,
            ..ResumePoint::default()
        })
    }

    async fn append(&self, run: &RunSpec, index: u64, body: Bytes) -> Result<(), SinkError> {
        self.one(Self::chunk(run, index, body.to_vec(), None)).await
    }

    async fn close(&self, run: &RunSpec, index: u64) -> Result<(), SinkError> {
        self.one(Self::chunk(run, index, Vec::new(), Some("normal")))
            .await
    }
}

/// Runs the subcommand until SIGINT/SIGTERM.
pub async fn run(args: FollowGatewayArgs) -> Result<()> {
    init_telemetry(&args.telemetry.config("streamgate-follow-gateway"))?;
    let (addr, token) = match &args.addr {
        Some(a) => (a.clone(), args.ingest_token.clone()),
        None => {
            let inst = Instance::read(&args.data_dir)?;
            let token = match &args.ingest_token {
                Some(t) => t.clone(),
                None => read_ingest_token(&args.data_dir)?,
            };
            (inst.ingest_grpc, Some(token))
        }
    };
    // Lazy: the follower starts while the service is still coming up, and every
    // failure to reach it is one more "not now" to retry.
    let channel = args
        .tls
        .endpoint(&addr)
        .with_context(|| format!("bad ingest address {addr}"))?
        .connect_lazy();
    let sink = GrpcSink {
        client: IngestServiceClient::with_interceptor(channel, SendBearer::new(token.as_deref())),
    };
    let cfg = FollowConfig {
        token: args.token.clone(),
        tenant: args.tenant.clone(),
        queue: args.queue,
        fail_first_connect: true,
        ..FollowConfig::new(args.url.clone())
    };
    let shutdown = streamgate_runtime::shutdown::on_signal();
    follow(cfg, sink, shutdown).await?;
    streamgate_runtime::telemetry::flush().await;
    Ok(())
}

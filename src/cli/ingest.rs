//! `streamgate ingest`: sends a capture to the gRPC IngestService chunk by chunk, waits
//! for each durable ack, and resumes from the last acknowledged chunk if the connection
//! breaks or the service answers "not now" (UNAVAILABLE while a stream leader is
//! elected): such answers are retried with bounded backoff honouring the service's
//! `retry-after`, for up to `--retry-secs` ([`retry`]). Errors that repeating cannot fix
//! (a bad id, a closed run, a refused token) are not retried. Without `--addr` it talks
//! to the local `streamgate up` (`up.json`) with its ingest token (`ingest.token`);
//! `--token` / `STREAMGATE_INGEST_TOKEN` overrides it.

pub(super) mod retry;
mod stdin;

use super::discover::{read_ingest_token, Instance};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;
use streamgate_proto::v1::ingest_service_client::IngestServiceClient;
use streamgate_proto::v1::{IngestChunk, ResumePointRequest};
use streamgate_runtime::rpc::SendBearer;
use streamgate_runtime::serve::ClientTlsArgs;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// How fast chunks are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pace {
    /// As fast as the acks come back.
    Fast,
    /// Like a live provider: one chunk every 25 ms.
    Recorded,
}

/// Flags of `streamgate ingest`.
#[derive(Debug, Clone, clap::Args)]
pub struct IngestArgs {
    /// The capture file, or `-` for standard input, streamed live as it is read (pipe a
    /// provider response in: `curl -N … | streamgate ingest - --run r1`).
    pub capture: PathBuf,
    /// Wire family: f1, f1e, f2, f3, f5, ollama-native, codex-appserver, codex-exec,
    /// openclaw-events, acp, or auto.
    #[arg(long, default_value = "auto")]
    pub family: String,
    /// Run id.
    #[arg(long)]
    pub run: String,
    /// Tenant.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Chat session the run belongs to.
    #[arg(long)]
    pub session: Option<String>,
    /// Bytes per chunk.
    #[arg(long, default_value_t = 4096)]
    pub chunk_bytes: usize,
    /// Sending pace.
    #[arg(long, value_enum, default_value_t = Pace::Fast)]
    pub pace: Pace,
    /// IngestService address (default: the local `streamgate up`).
    #[arg(long, env = "STREAMGATE_INGEST_ADDR")]
    pub addr: Option<String>,
    /// Ingest bearer token (default with no `--addr`: the local `up`'s
    /// `<data dir>/ingest.token`).
    #[arg(long, env = "STREAMGATE_INGEST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long to keep retrying while the service is unavailable (e.g. during a
    /// JetStream leader election), in seconds; 0 disables retries.
    #[arg(long, default_value_t = 60)]
    pub retry_secs: u64,
    /// Data dir of the local instance to find.
    #[arg(long, default_value = super::discover::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// TLS to the IngestService.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
}

pub(super) type Client = IngestServiceClient<InterceptedService<Channel, SendBearer>>;

async fn connect(addr: &str, token: Option<&str>, tls: &ClientTlsArgs) -> Result<Client> {
    let channel = tls
        .endpoint(addr)?
        .connect()
        .await
        .with_context(|| format!("cannot reach the ingest service at {addr}"))?;
    Ok(IngestServiceClient::with_interceptor(
        channel,
        SendBearer::new(token),
    ))
}

/// Runs the subcommand.
pub async fn run(args: IngestArgs) -> Result<()> {
    // The front door would refuse them too; refusing here sends nothing at all.
    streamgate_grammar::ids::RunRef::new(&args.tenant, &args.run)?;
    if let Some(session) = &args.session {
        streamgate_grammar::ids::SessionId::new(session.as_str())?;
    }
    let from_stdin = args.capture.as_os_str() == "-";
    let bytes = if from_stdin {
        Vec::new()
    } else {
        std::fs::read(&args.capture)
            .with_context(|| format!("cannot read {}", args.capture.display()))?
    };
    args.family
        .parse::<streamgate_wire::FamilyChoice>()
        .map_err(anyhow::Error::msg)?;
    let (addr, token, hint) = match &args.addr {
        Some(a) => (a.clone(), args.token.clone(), None),
        None => {
            let inst = Instance::read(&args.data_dir)?;
            let token = match &args.token {
                Some(t) => t.clone(),
                None => read_ingest_token(&args.data_dir)?,
            };
            let hint = inst.tls_hint(&args.tls);
            (inst.ingest_grpc, Some(token), hint)
        }
    };
    if from_stdin {
        return stdin::run(&args, &addr, token.as_deref())
            .await
            .map_err(|e| match hint {
                Some(h) => e.context(h),
                None => e,
            });
    }
    let chunks: Vec<&[u8]> = bytes.chunks(args.chunk_bytes.max(1)).collect();
    let mut backoff = retry::Backoff::new(Duration::from_secs(args.retry_secs));
    loop {
        let e = match send(&addr, token.as_deref(), &args, &chunks).await {
            Ok(sent) => {
                eprintln!(
                    "ingested {} ({} bytes, {} chunks) as run {}{}",
                    display(&args.capture),
                    bytes.len(),
                    sent,
                    args.run,
                    match backoff.attempts() {
                        0 => String::new(),
                        n => format!(" after {n} retries"),
                    }
                );
                return Ok(());
            }
            Err(e) => e,
        };
        // With TLS 1.3 a refused client certificate surfaces on the first request,
        // not at connect: the hint goes on whatever error ends the ingest.
        let hinted = |e: anyhow::Error| match hint {
            Some(h) => e.context(h),
            None => e,
        };
        let retry::Verdict::Retry(after) = retry::classify(&e) else {
            return Err(hinted(e));
        };
        let Some(delay) = backoff.next_delay(after) else {
            return Err(hinted(
                e.context(format!("gave up after {} retries", backoff.attempts())),
            ));
        };
        if backoff.attempts() == 1 {
            // Said once; the retries that follow are quiet.
            eprintln!(
                "ingest not accepted right now ({e:#}); retrying for up to {} s (resuming from the last acknowledged chunk)",
                args.retry_secs
            );
        }
        tokio::time::sleep(delay).await;
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// Sends every chunk not yet durable, then the close marker; returns chunks sent.
async fn send(addr: &str, token: Option<&str>, args: &IngestArgs, chunks: &[&[u8]]) -> Result<u64> {
    let mut client = connect(addr, token, &args.tls).await?;
    let point = client
        .resume_point(ResumePointRequest {
            tenant: args.tenant.clone(),
            run_id: args.run.clone(),
        })
        .await?
        .into_inner();
    if point.closed {
        return Err(retry::Permanent::closed(&args.run).into());
    }
    let start = point.next_chunk as usize;
    let total = chunks.len() as u64;
    let template = chunk_template(args);
    let mut messages: Vec<IngestChunk> = chunks
        .iter()
        .enumerate()
        .skip(start)
        .map(|(i, c)| IngestChunk {
            chunk: i as u64,
            body: c.to_vec(),
            ..template.clone()
        })
        .collect();
    messages.push(IngestChunk {
        chunk: total,
        close: Some("normal".into()),
        ..template
    });
    let expected = messages.len();
    let pace = args.pace;
    let outbound = async_stream(messages, pace);
    let mut acks = client.ingest(outbound).await?.into_inner();
    let mut acked = 0;
    while let Some(ack) = acks.message().await? {
        acked += 1;
        if ack.close {
            break;
        }
    }
    if acked < expected {
        bail!("the ingest service acknowledged {acked} of {expected} messages");
    }
    Ok(total - start as u64)
}

/// An empty chunk of the run `args` names (index, body and close filled in per chunk).
fn chunk_template(args: &IngestArgs) -> IngestChunk {
    IngestChunk {
        tenant: args.tenant.clone(),
        run_id: args.run.clone(),
        session_key: args.session.clone(),
        family: args.family.clone(),
        dialect: None,
        chunk: 0,
        body: Vec::new(),
        close: None,
    }
}

fn async_stream(
    messages: Vec<IngestChunk>,
    pace: Pace,
) -> impl futures::Stream<Item = IngestChunk> + Send + 'static {
    futures::stream::unfold(messages.into_iter(), move |mut it| async move {
        let next = it.next()?;
        if pace == Pace::Recorded {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Some((next, it))
    })
}

//! `streamgate ingest -`: standard input streamed live. Each read of the pipe (what the
//! writer wrote, up to `--chunk-bytes`) goes out as one chunk at once, so a provider
//! response piped in (`curl -N … | streamgate ingest - …`) shows on every channel as it
//! arrives. Standard input cannot be read twice, so the chunks sent and not yet
//! acknowledged are kept; after a broken connection the service's resume point says
//! which of them it stored, and the rest are sent again with the same indices (exactly
//! once, as for a file).

use super::{connect, retry, Client, IngestArgs};
use anyhow::{bail, Result};
use std::collections::VecDeque;
use std::time::Duration;
use streamgate_proto::v1::{IngestChunk, ResumePointRequest};
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;

/// Chunks read ahead of the service at most (pushback on the writer beyond that).
const READ_AHEAD: usize = 64;

/// Reads standard input into chunks on its own task: `None` marks the end.
fn read_stdin(chunk_bytes: usize) -> mpsc::Receiver<std::io::Result<Option<Vec<u8>>>> {
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        loop {
            let mut buf = vec![0u8; chunk_bytes];
            let item = match stdin.read(&mut buf).await {
                Ok(0) => Ok(None),
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Some(buf))
                }
                Err(e) => Err(e),
            };
            let last = !matches!(item, Ok(Some(_)));
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

/// What has been read and not yet acknowledged, in chunk order.
struct Unacked {
    template: IngestChunk,
    chunks: VecDeque<IngestChunk>,
    /// The next index to give a chunk read.
    next: u64,
    /// Standard input ended: the close marker is the last of `chunks` (or was acked).
    ended: bool,
    bytes: u64,
}

impl Unacked {
    fn push(&mut self, body: Option<Vec<u8>>) -> IngestChunk {
        let chunk = match body {
            Some(body) => {
                self.bytes += body.len() as u64;
                IngestChunk {
                    chunk: self.next,
                    body,
                    ..self.template.clone()
                }
            }
            None => {
                self.ended = true;
                IngestChunk {
                    chunk: self.next,
                    close: Some("normal".into()),
                    ..self.template.clone()
                }
            }
        };
        if chunk.close.is_none() {
            self.next += 1;
        }
        self.chunks.push_back(chunk.clone());
        chunk
    }

    /// Drops what the service holds: chunks below `next_chunk` (and the close marker
    /// when `closed`).
    fn stored(&mut self, next_chunk: u64, closed: bool) {
        while self
            .chunks
            .front()
            .is_some_and(|c| c.chunk < next_chunk || (closed && c.close.is_some()))
        {
            self.chunks.pop_front();
        }
    }
}

/// Streams standard input as run `args.run`; retries like a file ingest.
pub(super) async fn run(args: &IngestArgs, addr: &str, token: Option<&str>) -> Result<()> {
    let mut input = read_stdin(args.chunk_bytes.clamp(1, 4 << 20));
    let mut unacked = Unacked {
        template: super::chunk_template(args),
        chunks: VecDeque::new(),
        next: 0,
        ended: false,
        bytes: 0,
    };
    let mut backoff = retry::Backoff::new(Duration::from_secs(args.retry_secs));
    loop {
        let e = match stream(args, addr, token, &mut input, &mut unacked).await {
            Ok(()) => {
                eprintln!(
                    "ingested standard input ({} bytes, {} chunks) as run {}",
                    unacked.bytes, unacked.next, args.run
                );
                return Ok(());
            }
            Err(e) => e,
        };
        let retry::Verdict::Retry(after) = retry::classify(&e) else {
            return Err(e);
        };
        let Some(delay) = backoff.next_delay(after) else {
            return Err(e.context(format!("gave up after {} retries", backoff.attempts())));
        };
        tokio::time::sleep(delay).await;
    }
}

/// One connection: resends what the service lacks, then forwards standard input as it
/// is read, until the close marker is acknowledged.
async fn stream(
    args: &IngestArgs,
    addr: &str,
    token: Option<&str>,
    input: &mut mpsc::Receiver<std::io::Result<Option<Vec<u8>>>>,
    unacked: &mut Unacked,
) -> Result<()> {
    let mut client: Client = connect(addr, token, &args.tls).await?;
    let point = client
        .resume_point(ResumePointRequest {
            tenant: args.tenant.clone(),
            run_id: args.run.clone(),
        })
        .await?
        .into_inner();
    unacked.stored(point.next_chunk, point.closed);
    if point.closed {
        if unacked.ended && unacked.chunks.is_empty() {
            return Ok(());
        }
        return Err(retry::Permanent::closed(&args.run).into());
    }
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    for c in &unacked.chunks {
        tx.send(c.clone()).await?;
    }
    let mut acks = client
        .ingest(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut tx = Some(tx);
    loop {
        tokio::select! {
            read = input.recv(), if !unacked.ended => {
                let body = match read {
                    Some(Ok(body)) => body,
                    Some(Err(e)) => bail!("cannot read standard input: {e}"),
                    None => None,
                };
                let chunk = unacked.push(body);
                if let Some(t) = &tx {
                    t.send(chunk).await?;
                }
                if unacked.ended {
                    tx = None; // the request stream ends after the close marker
                }
            }
            ack = acks.message() => match ack? {
                Some(ack) => {
                    unacked.stored(ack.chunk + u64::from(!ack.close), ack.close);
                    if ack.close {
                        return Ok(());
                    }
                }
                None => bail!("the ingest service ended the stream before the close marker"),
            },
        }
    }
}

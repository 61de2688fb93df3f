//! Erasing runs from the broker (docs/architecture.md §5, erasure): every stream that holds a run's
//! bytes or ids — its raw chunks (`SG_RAW`), its events (`SG_EVENTS`), the projectors'
//! delivery states and active-run markers (`SG_DELIVERY`) and the normalizer's open-run
//! registry (`SG_OPEN_RUNS`) — named in one place, [`run_filters`].
//!
//! Messages are removed one by one with JetStream's message delete, which by default
//! *erases*: the stored message is overwritten before it is dropped (a purge would only
//! unlink it), so the text does not linger in the stream's files.
//!
//! What services hold of a run in memory (a projector's run list, the answers of runs
//! that just ended) goes when the erasure is announced on [`ERASED_SUBJECT`]
//! ([`announce`], [`Erased`]): ids only, never content.

use crate::kv::{DELIVERY_BUCKET, OPEN_RUNS_BUCKET};
use crate::subject::{encode_token, RunAddr};
use crate::{nats, BusError, EVENTS_STREAM, RAW_STREAM};
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use futures::StreamExt;
use std::time::Duration;
use streamgate_grammar::ids::{RunId, RunRef, TenantId};

/// The core NATS subject erasures are announced on.
pub const ERASED_SUBJECT: &str = "sg.ctl.erased";

/// An erasure as announced on [`ERASED_SUBJECT`]: which runs of which tenant are gone.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Erased {
    /// The tenant.
    pub tenant: String,
    /// The runs erased; `None`: every run of the tenant.
    #[serde(default)]
    pub runs: Option<Vec<String>>,
}

impl Erased {
    /// Whether `run_id` of `tenant` is among the erased runs (the default tenant
    /// however it is spelled).
    pub fn covers(&self, tenant: &str, run_id: &str) -> bool {
        use streamgate_grammar::ids::tenant_or_default;
        tenant_or_default(tenant) == tenant_or_default(&self.tenant)
            && self
                .runs
                .as_ref()
                .is_none_or(|runs| runs.iter().any(|r| r == run_id))
    }
}

/// Tells every service listening on [`ERASED_SUBJECT`] to drop what it holds in memory
/// of the erased runs. Core NATS, so at most once: a service that was disconnected keeps
/// its copy until it ages out (a projector's run list: hours) or it restarts.
pub async fn announce(client: &async_nats::Client, erased: &Erased) -> Result<(), BusError> {
    let body = serde_json::to_vec(erased).map_err(nats("encode erasure notice"))?;
    client
        .publish(ERASED_SUBJECT, body.into())
        .await
        .map_err(nats("announce erasure"))?;
    client.flush().await.map_err(nats("announce erasure"))
}

/// The erasures announced from now on; a notice that does not decode is skipped.
pub async fn erasures(
    client: &async_nats::Client,
) -> Result<impl futures::Stream<Item = Erased> + Send + 'static, BusError> {
    let sub = client
        .subscribe(ERASED_SUBJECT)
        .await
        .map_err(nats("subscribe to erasures"))?;
    Ok(sub.filter_map(|m| async move {
        match serde_json::from_slice(&m.payload) {
            Ok(erased) => Some(erased),
            Err(e) => {
                tracing::warn!(error = %e, "undecodable erasure notice skipped");
                None
            }
        }
    }))
}

/// How a stream's messages are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// One by one, each overwritten before it is dropped (the streams' default).
    Erase,
    /// A KV bucket's entries: erased like any stream's when the bucket allows deletes
    /// (streamgate creates its buckets so, [`crate::kv::open_erasable`]); purged when an
    /// older bucket denies them (JetStream cannot lift that), which unlinks the entries
    /// but leaves their bytes until the broker compacts the block.
    Bucket,
}

/// How long the erasure waits for the next message of a subject it is listing.
const LIST_PATIENCE: Duration = Duration::from_secs(10);

/// `(stream, filter subject)` of everything the broker holds about one run of `tenant`
/// (`run_id: None`: about every run of the tenant).
pub fn run_filters(
    tenant: &TenantId,
    run_id: Option<&RunId>,
    partitions: u32,
) -> Vec<(String, String, Removal)> {
    let kv_tenant = crate::kv::token(tenant);
    let kv_run = run_id.map_or_else(|| "*".to_owned(), |r| crate::kv::token(r));
    let (raw, events) = match run_id {
        Some(run) => {
            let run = RunRef {
                tenant: tenant.clone(),
                run: run.clone(),
            };
            let addr = RunAddr::new(&run, partitions);
            (addr.raw_subject(), addr.events_subject())
        }
        None => {
            let t = encode_token(tenant);
            (format!("sg.raw.{t}.*.*"), format!("sg.evt.{t}.*.*"))
        }
    };
    vec![
        (RAW_STREAM.to_owned(), raw, Removal::Erase),
        (EVENTS_STREAM.to_owned(), events, Removal::Erase),
        // `<channel>.<chat>.<tenant>.<run>` and `active.<channel>.<chat>.<tenant>.<run>`.
        (
            format!("KV_{DELIVERY_BUCKET}"),
            format!("$KV.{DELIVERY_BUCKET}.*.*.{kv_tenant}.{kv_run}"),
            Removal::Bucket,
        ),
        (
            format!("KV_{DELIVERY_BUCKET}"),
            format!("$KV.{DELIVERY_BUCKET}.active.*.*.{kv_tenant}.{kv_run}"),
            Removal::Bucket,
        ),
        // `<partition>.<tenant>.<run>`.
        (
            format!("KV_{OPEN_RUNS_BUCKET}"),
            format!("$KV.{OPEN_RUNS_BUCKET}.*.{kv_tenant}.{kv_run}"),
            Removal::Bucket,
        ),
    ]
}

/// Erases every message of `stream` on `filter`; returns how many. A stream that does
/// not exist (a deployment without projectors has no `SG_DELIVERY`) holds nothing.
pub async fn erase_messages(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
    removal: Removal,
) -> Result<u64, BusError> {
    let stream = match js.get_stream(stream).await {
        Ok(s) => s,
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return Ok(0)
        }
        Err(e) => return Err(nats("get stream")(e)),
    };
    if removal == Removal::Bucket {
        let info = stream.cached_info();
        if info.config.deny_delete {
            // A bucket made before buckets were erasable: JetStream can only purge it,
            // which unlinks the entries but leaves their bytes until the broker compacts
            // the block.
            tracing::warn!(
                stream = %info.config.name,
                "bucket denies message deletes (created by an older streamgate): its entries are purged, not erased"
            );
            let purged = stream
                .purge()
                .filter(filter)
                .await
                .map_err(nats("purge bucket entries"))?;
            return Ok(purged.purged);
        }
    }
    let mut consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter.to_owned(),
            deliver_policy: DeliverPolicy::All,
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(nats("list messages to erase"))?;
    let pending = consumer
        .info()
        .await
        .map_err(nats("list messages to erase"))?
        .num_pending;
    let mut seqs = Vec::new();
    if pending > 0 {
        let mut msgs = consumer
            .messages()
            .await
            .map_err(nats("list messages to erase"))?;
        loop {
            let next = tokio::time::timeout(LIST_PATIENCE, msgs.next()).await;
            let Ok(Some(msg)) = next else { break };
            let msg = msg.map_err(nats("list messages to erase"))?;
            let info = msg.info().map_err(|e| BusError::Nats {
                op: "list messages to erase",
                source: e,
            })?;
            seqs.push(info.stream_sequence);
            if info.pending == 0 {
                break;
            }
        }
    }
    let mut erased = 0;
    for seq in seqs {
        if erase_message(&stream, seq)
            .await
            .map_err(nats("erase message"))?
        {
            erased += 1;
        }
    }
    Ok(erased)
}

/// Erases message `seq` of `stream` (JetStream's delete, which overwrites the stored
/// bytes); true when this call erased it. A message already gone — the age limit, a
/// concurrent erasure — leaves nothing to erase: false, not an error. The server says
/// so with 10037 ("no message found") or, when the sequence went between a lookup and
/// the delete, 10043 ("sequence not found").
pub(crate) async fn erase_message(
    stream: &jetstream::stream::Stream,
    seq: u64,
) -> Result<bool, jetstream::stream::DeleteMessageError> {
    match stream.delete_message(seq).await {
        Ok(erased) => Ok(erased),
        Err(e)
            if matches!(e.kind(), jetstream::stream::DeleteMessageErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::NO_MESSAGE_FOUND
                    || j.error_code() == jetstream::ErrorCode::SEQUENCE_NOT_FOUND) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

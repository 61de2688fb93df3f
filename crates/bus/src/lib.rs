//! streamgate on NATS JetStream: subjects, stream provisioning, raw and event messages,
//! consumers, partition leases and trace propagation (docs/architecture.md §1, §3, §4).
//!
//! Two streams carry the pipeline:
//! - [`RAW_STREAM`] (`SG_RAW`, subjects `sg.raw.>`): provider wire bytes as producers saw
//!   them, one message per chunk, plus one close marker per run. Written by any NATS
//!   client (see the raw-message format below), read by the normalizer.
//! - [`EVENTS_STREAM`] (`SG_EVENTS`, subjects `sg.evt.>`): canonical events as protobuf
//!   `streamgate.v1.Event`, written by the normalizer, read by archiver and projectors.
//!
//! # Raw-message format (`SG_RAW`)
//!
//! Any NATS client can ingest by publishing to JetStream with these rules.
//!
//! **Subject** `sg.raw.<tenant>.<part>.<run>`:
//! - Tenant, run id and session key follow the id rule ([`streamgate_grammar::ids`]):
//!   UTF-8, 1–256 bytes, no control characters; a message breaking it is unreadable.
//! - `<tenant>` and `<run>` are token-encoded ([`subject::encode_token`]): every byte of
//!   the UTF-8 string outside `[A-Za-z0-9_-]` (including `%`) becomes `%XX` with uppercase
//!   hex; the empty string is `%`. Ids made of `[A-Za-z0-9_-]` appear unchanged.
//! - `<part>` is FNV-1a 64 of the run id's UTF-8 bytes, modulo the deployment's partition
//!   count (default [`DEFAULT_PARTITIONS`] = 8), in decimal ([`subject::partition_of`]).
//!
//! **Headers** (names exact; text values token-encoded like subject tokens, which leaves
//! ordinary ids unchanged and keeps CR/LF out of header lines):
//!
//! | header          | required | value |
//! |-----------------|----------|-------|
//! | `Nats-Msg-Id`   | yes¹     | `<tenant>/<run>/raw/<chunk>`, or `<tenant>/<run>/raw/close` for the close marker (tenant and run id token-encoded as in the subject) |
//! | `Sg-Chunk`      | yes      | 0-based chunk index within the run, decimal; on the close marker the number of data chunks before it |
//! | `Sg-Family`     | no       | wire family `f1`, `f2`, … or `auto` (the default) |
//! | `Sg-Dialect`    | no       | dialect hint within the family |
//! | `Sg-Tenant`     | no       | tenant; must match the subject when present |
//! | `Sg-Run`        | no       | run id; must match the subject when present |
//! | `Sg-Session`    | no       | chat session key |
//! | `Sg-Ingest-Ts`  | no²      | ingest time, ms since the Unix epoch, decimal |
//! | `Sg-Close`      | no       | `normal`, `abnormal` or `timeout`: this message is the close marker |
//! | `Sg-Offset`     | no       | byte offset of the chunk in the run's bytes, decimal (close: the total); set by front doors that cut as bytes arrive, so a resend resumes by byte |
//! | `traceparent`   | no       | W3C trace context ([`trace`]) |
//!
//! ¹ Without it JetStream cannot drop duplicate publishes; it is what makes a retried
//! publish harmless. ² When absent, readers use the time JetStream stored the message
//! ([`raw::RawChunk::from_message`]), which is just as stable across replays.
//!
//! **Body**: the provider's bytes, any size up to the server's max payload, split at any
//! byte; chunks of a run are concatenated in `Sg-Chunk` order. A close marker has an
//! empty body. At most one close marker per run is stored, because its message id is
//! fixed.
//!
//! The same contract, with a `nats pub` walk-through, is in `docs/raw-messages.md`.
//!
//! # Events (`SG_EVENTS`)
//! Subject `sg.evt.<tenant>.<part>.<run>`. A message holds one event (body protobuf
//! `streamgate.v1.Event`, `Nats-Msg-Id` `<tenant>/<run>/<seq>`) or consecutive events of
//! one run (what one raw chunk produced, or several that arrived together; body
//! `streamgate.v1.EventBatch`, header `Sg-Batch` = count,
//! `Nats-Msg-Id` `<tenant>/<run>/<first>-<last>`); a run id is unique only within its
//! tenant, so every id names both; header `Sg-Stream` names the stream kinds inside
//! so consumers can route without decoding ([`events`]), and `traceparent`/`tracestate`
//! continue the trace of the raw chunk that produced them ([`trace`]).
//!
//! # Layout
//! - [`subject`]: token encoding, partitions, [`subject::RunAddr`], partition filters.
//! - [`ensure_streams`] and [`StreamSettings`] (this file): stream provisioning.
//! - [`raw`]: [`raw::RawChunk`] ⇄ message, [`raw::publish_raw`].
//! - [`events`]: [`events::publish_batches`] (pipelined) and [`events::decode_message`].
//! - [`consume`]: durable pull consumers and [`consume::read_subject`] for run rebuilds.
//! - [`memory_pull`]: durable pull consumers held in the broker's memory, resumed from
//!   their owner's own record of how far it processed.
//! - [`incarnation`]: a consumer of its own for each owner of a partition, acknowledged
//!   in order (the normalizer's).
//! - [`lease`]: partition leases in KV ([`lease::PartitionLeases`]) and the per-partition
//!   workers they run — how the normalizer and projector replicas split the partitions.
//! - [`trace`]: W3C `traceparent` through NATS headers.
//! - [`kv`]: keys of the KV buckets (reversible id tokens) and the names of the buckets
//!   that hold run state.
//! - [`erase`]: every stream subject that holds a run, and erasing its messages.
//! - [`BusError`] (this file): every failure of this crate.
#![forbid(unsafe_code)]

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};

pub mod consume;
pub mod erase;
pub mod events;
mod hdr;
pub mod incarnation;
pub mod kv;
pub mod lease;
pub mod local;
pub mod memory_pull;
pub mod raw;
pub mod subject;
pub mod trace;

pub use subject::SubjectError;

/// Name of the raw stream; subjects `sg.raw.>`.
pub const RAW_STREAM: &str = "SG_RAW";
/// Name of the events stream; subjects `sg.evt.>`.
pub const EVENTS_STREAM: &str = "SG_EVENTS";
/// Subject filter covering all of [`RAW_STREAM`].
pub const RAW_SUBJECTS: &str = "sg.raw.>";
/// Subject filter covering all of [`EVENTS_STREAM`].
pub const EVENTS_SUBJECTS: &str = "sg.evt.>";
/// Partition count used when the deployment does not set one.
///
/// Partitions bound how many replicas of the normalizer (and of each projector channel)
/// can share the work: one partition is one lease and one filtered durable consumer per
/// group. The broker pays for each: every consumer scans the stream for its partition
/// and writes its ack state on its own, so on a 2-core box 32 partitions cost
/// nats-server about 40% more CPU than 1 at 50k events/s (and the pipeline's p99 doubled
/// at that load), while 8 stay close to 1. Deployments that want more than 8 replicas per
/// group raise `STREAMGATE_PARTITIONS` before their first start.
pub const DEFAULT_PARTITIONS: u32 = 8;

/// Everything that can go wrong on the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// A subject did not follow the scheme.
    #[error(transparent)]
    Subject(#[from] SubjectError),
    /// A required header is absent.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A header has a value this crate cannot use.
    #[error("invalid header {name}: {value:?}")]
    InvalidHeader {
        /// Header name.
        name: &'static str,
        /// The value found.
        value: String,
    },
    /// A header disagrees with the subject (e.g. `Sg-Run` names another run).
    #[error("header {name} is {header:?} but the subject says {subject:?}")]
    HeaderMismatch {
        /// Header name.
        name: &'static str,
        /// Value in the header.
        header: String,
        /// Value from the subject.
        subject: String,
    },
    /// A close marker carried a body (it would be lost, since close markers are deduped
    /// on a fixed id).
    #[error("close marker for run {0:?} has a non-empty body")]
    CloseWithBody(String),
    /// A tenant, run or session id breaks the id rule ([`streamgate_grammar::ids`]).
    #[error(transparent)]
    InvalidId(#[from] streamgate_grammar::ids::IdError),
    /// An event's envelope names a different run (tenant and run id) than the address it
    /// is published to, or than the other events of its batch.
    #[error("event for run {event_run:?} published to run {addr_run:?}")]
    RunMismatch {
        /// Run of the address, `<tenant>/<run>`.
        addr_run: String,
        /// Run in the event envelope, `<tenant>/<run>`.
        event_run: String,
    },
    /// Events given as one batch are not consecutive seqs of one run.
    #[error("run {run:?}: a batch cannot hold seq {next} right after seq {after}")]
    BatchGap {
        /// The run.
        run: String,
        /// The seq before the gap.
        after: u64,
        /// The seq after it.
        next: u64,
    },
    /// The payload is not a protobuf `streamgate.v1.Event`.
    #[error("event payload is not protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// The protobuf event does not map onto the grammar.
    #[error(transparent)]
    Event(#[from] streamgate_proto::DecodeError),
    /// A stream exists with a setting that cannot be changed in place.
    #[error(
        "stream {stream}: {setting} is {found} but must be {wanted}; it cannot be changed in place"
    )]
    ImmutableSetting {
        /// Stream name.
        stream: String,
        /// Which setting.
        setting: &'static str,
        /// Current value.
        found: String,
        /// Wanted value.
        wanted: String,
    },
    /// The streams were created for another partition count than this service's: its
    /// partition consumers would miss runs (or wait on partitions nobody writes).
    #[error(
        "stream {stream} was created for {found} partitions but this service is configured for {wanted}; \
         set STREAMGATE_PARTITIONS (--partitions) to {found} on every service"
    )]
    PartitionMismatch {
        /// Stream name.
        stream: String,
        /// The partition count recorded on the stream.
        found: String,
        /// This service's partition count.
        wanted: u32,
    },
    /// A NATS or JetStream operation failed (connection, timeout, server error).
    #[error("{op}: {source}")]
    Nats {
        /// What was being done.
        op: &'static str,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BusError {
    /// True when the broker could not take the request *right now* (no responders while
    /// a stream leader is elected, an ack or request timeout, a broken or reconnecting
    /// connection, JetStream temporarily unavailable): the same request may succeed if
    /// made again later. False for what repeating cannot fix (bad ids or headers, a
    /// message over the broker's `max_payload`, a conflicting stream setting).
    pub fn is_transient(&self) -> bool {
        use async_nats::jetstream::context::PublishErrorKind;
        match self {
            BusError::Nats { .. } => !matches!(
                self.publish_error(),
                Some(
                    PublishErrorKind::MaxPayloadExceeded
                        | PublishErrorKind::WrongLastMessageId
                        | PublishErrorKind::WrongLastSequence
                )
            ),
            _ => false,
        }
    }

    /// What kind of JetStream publish failure this is, when it is one (a fenced
    /// publish's `WrongLastSequence`, a payload over the broker's limit, …).
    pub fn publish_error(&self) -> Option<async_nats::jetstream::context::PublishErrorKind> {
        match self {
            BusError::Nats { source, .. } => source
                .downcast_ref::<async_nats::jetstream::context::PublishError>()
                .map(|e| e.kind()),
            _ => None,
        }
    }
}

/// Wraps an async-nats error with the operation it interrupted, for `map_err`.
pub(crate) fn nats<E>(op: &'static str) -> impl FnOnce(E) -> BusError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| BusError::Nats {
        op,
        source: Box::new(e),
    }
}

/// Stream settings (all configurable by the services' config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSettings {
    /// Replicas of each stream (1 on a single server; 3 in a cluster).
    pub replicas: usize,
    /// Byte limit of `SG_RAW`; -1 = unlimited.
    pub raw_max_bytes: i64,
    /// Age limit of `SG_RAW`.
    pub raw_max_age: Duration,
    /// Byte limit of `SG_EVENTS`; -1 = unlimited.
    pub events_max_bytes: i64,
    /// Age limit of `SG_EVENTS`.
    pub events_max_age: Duration,
    /// JetStream's publish dedupe window (`Nats-Msg-Id`).
    pub duplicate_window: Duration,
    /// Consumers each stream admits. Partition leases give every partition its own
    /// durable consumer — P for the normalizer on `SG_RAW`, P per projector channel on
    /// `SG_EVENTS` — plus the short-lived readers of run rebuilds, so the server's own
    /// default (1000 per stream since nats-server 2.15) is too low for a few dozen
    /// channels.
    pub max_consumers: i32,
    /// The deployment's partition count, recorded on both streams (metadata
    /// [`PARTITIONS_METADATA`]) so that a service configured with another count fails
    /// at start instead of silently missing runs.
    pub partitions: u32,
}

/// Stream metadata key holding the partition count the streams were created for.
pub const PARTITIONS_METADATA: &str = "streamgate.partitions";

impl Default for StreamSettings {
    fn default() -> Self {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        StreamSettings {
            replicas: 1,
            raw_max_bytes: -1,
            raw_max_age: 7 * DAY,
            events_max_bytes: -1,
            events_max_age: 7 * DAY,
            duplicate_window: Duration::from_secs(120),
            max_consumers: 10_000,
            partitions: DEFAULT_PARTITIONS,
        }
    }
}

impl StreamSettings {
    /// The wanted config of `SG_RAW`.
    pub fn raw_config(&self) -> Config {
        self.config(
            RAW_STREAM,
            RAW_SUBJECTS,
            self.raw_max_bytes,
            self.raw_max_age,
        )
    }

    /// The wanted config of `SG_EVENTS`.
    pub fn events_config(&self) -> Config {
        self.config(
            EVENTS_STREAM,
            EVENTS_SUBJECTS,
            self.events_max_bytes,
            self.events_max_age,
        )
    }

    fn config(&self, name: &str, subjects: &str, max_bytes: i64, max_age: Duration) -> Config {
        Config {
            name: name.to_owned(),
            subjects: vec![subjects.to_owned()],
            storage: StorageType::File,
            retention: RetentionPolicy::Limits,
            // Old: under a limit the oldest data goes; producers never see publish errors
            // because the archive, not the stream, is the system of record.
            discard: DiscardPolicy::Old,
            max_bytes,
            max_age,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            max_consumers: self.max_consumers,
            // Direct gets let any replica answer last-message lookups cheaply.
            allow_direct: true,
            metadata: [(PARTITIONS_METADATA.to_owned(), self.partitions.to_string())].into(),
            ..Default::default()
        }
    }
}

/// Creates `SG_RAW` and `SG_EVENTS` (file storage, limits retention) or updates their
/// config when it differs; safe to call from every replica at every start.
///
/// Only the settings this crate owns are compared and changed (subjects, limits, replicas,
/// dedupe window, consumer limit, discard, direct get); anything an operator set by hand
/// is kept. Storage
/// and retention cannot change in place: a mismatch is [`BusError::ImmutableSetting`].
pub async fn ensure_streams(js: &jetstream::Context, s: &StreamSettings) -> Result<(), BusError> {
    ensure_stream(js, s.raw_config(), true).await?;
    ensure_stream(js, s.events_config(), true).await
}

/// Creates `SG_RAW` and `SG_EVENTS` with `s` when they do not exist yet, and leaves
/// existing streams exactly as they are.
///
/// For services that only read the streams (projector channels): their settings must not
/// override the ones the normalizer was configured with (replicas, limits), or every
/// channel restart would scale the streams back to its own defaults.
pub async fn ensure_streams_exist(
    js: &jetstream::Context,
    s: &StreamSettings,
) -> Result<(), BusError> {
    ensure_stream(js, s.raw_config(), false).await?;
    ensure_stream(js, s.events_config(), false).await
}

async fn ensure_stream(
    js: &jetstream::Context,
    wanted: Config,
    update: bool,
) -> Result<(), BusError> {
    // Two attempts: when several replicas start at once, another may create the stream
    // between our lookup and our create; the second lookup then finds it.
    for _ in 0..2 {
        let current = match js.get_stream(&wanted.name).await {
            // get_stream already fetched the info; no second round trip.
            Ok(stream) => Some(stream.cached_info().config.clone()),
            Err(e) if is_stream_not_found(&e) => None,
            Err(e) => return Err(nats("get stream")(e)),
        };
        match current {
            None => match js.create_stream(wanted.clone()).await {
                Ok(_) => return Ok(()),
                Err(e) if is_name_in_use(&e) => continue,
                Err(e) => return Err(nats("create stream")(e)),
            },
            Some(current) if !update => return check_partitions(&current, &wanted),
            Some(current) => {
                let Some(updated) = merge(&current, &wanted)? else {
                    return Ok(());
                };
                tracing::info!(stream = %wanted.name, "updating stream config");
                match js.update_stream(updated.clone()).await {
                    Ok(_) => return Ok(()),
                    // Older servers cannot change the consumer limit in place (and
                    // their "unlimited" needs no raise): apply the rest without it.
                    Err(e) if updated.max_consumers != current.max_consumers => {
                        tracing::warn!(stream = %wanted.name, error = %e, "consumer limit not changed in place");
                        let mut rest = updated;
                        rest.max_consumers = current.max_consumers;
                        if rest != current {
                            js.update_stream(rest)
                                .await
                                .map_err(nats("update stream"))?;
                        }
                        return Ok(());
                    }
                    Err(e) => return Err(nats("update stream")(e)),
                }
            }
        }
    }
    Err(BusError::Nats {
        op: "create stream",
        source: format!("stream {} kept appearing and disappearing", wanted.name).into(),
    })
}

/// Fails when `current` records another partition count than `wanted` does. Streams from
/// before the count was recorded pass (the owner records it on its next start).
fn check_partitions(current: &Config, wanted: &Config) -> Result<(), BusError> {
    let (Some(found), Some(want)) = (
        current.metadata.get(PARTITIONS_METADATA),
        wanted.metadata.get(PARTITIONS_METADATA),
    ) else {
        return Ok(());
    };
    if found == want {
        return Ok(());
    }
    Err(BusError::PartitionMismatch {
        stream: wanted.name.clone(),
        found: found.clone(),
        wanted: want.parse().unwrap_or_default(),
    })
}

/// The config to apply, or `None` when `current` already has every owned setting.
fn merge(current: &Config, wanted: &Config) -> Result<Option<Config>, BusError> {
    check_partitions(current, wanted)?;
    let immutable = |setting, found: String, want: String| BusError::ImmutableSetting {
        stream: wanted.name.clone(),
        setting,
        found,
        wanted: want,
    };
    if current.storage != wanted.storage {
        return Err(immutable(
            "storage",
            format!("{:?}", current.storage),
            format!("{:?}", wanted.storage),
        ));
    }
    if current.retention != wanted.retention {
        return Err(immutable(
            "retention",
            format!("{:?}", current.retention),
            format!("{:?}", wanted.retention),
        ));
    }
    let mut next = current.clone();
    next.subjects.clone_from(&wanted.subjects);
    next.discard = wanted.discard;
    next.max_bytes = wanted.max_bytes;
    next.max_age = wanted.max_age;
    next.num_replicas = wanted.num_replicas;
    next.duplicate_window = wanted.duplicate_window;
    next.max_consumers = wanted.max_consumers;
    next.allow_direct = wanted.allow_direct;
    // Keep what the server (or an operator) put in the metadata; add the partition count.
    next.metadata.extend(wanted.metadata.clone());
    Ok((next != *current).then_some(next))
}

fn is_stream_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(j)
            if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

fn is_name_in_use(e: &jetstream::context::CreateStreamError) -> bool {
    matches!(
        e.kind(),
        jetstream::context::CreateStreamErrorKind::JetStream(j)
            if j.error_code() == jetstream::ErrorCode::STREAM_NAME_EXIST
    )
}

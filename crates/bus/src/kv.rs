//! Keys of streamgate's JetStream KV buckets (`SG_LEASES`, `SG_OPEN_RUNS`, the
//! projector's `SG_DELIVERY` and `SG_SETTINGS`).
//!
//! KV keys allow `[-/_=.A-Za-z0-9]`, with `.` separating levels; ids (tenants, runs,
//! chats, channels) may hold anything. [`token`] makes one id one key level, reversibly
//! ([`untoken`]); [`key`] joins levels. [`current`] reads every key under a prefix.

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::jetstream::kv::Store;
use futures::StreamExt as _;

use crate::{nats, BusError};

/// The projectors' bucket of delivery states and active-run markers (keys name the
/// channel, chat, tenant and run).
pub const DELIVERY_BUCKET: &str = "SG_DELIVERY";
/// The normalizers' registry of open runs (keys name the partition, tenant and run).
pub const OPEN_RUNS_BUCKET: &str = "SG_OPEN_RUNS";

/// One key level for `s`: bytes outside `[-_A-Za-z0-9]` become `=XX` (uppercase hex),
/// the empty string `=`. Never contains `.`, so distinct ids never share a key.
pub fn token(s: &str) -> String {
    crate::subject::escape(s, '=').into_owned()
}

/// The inverse of [`token`]; `None` when `s` is not one of its outputs.
pub fn untoken(s: &str) -> Option<String> {
    if s == "=" {
        return Some(String::new());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else if b[i].is_ascii_alphanumeric() || b[i] == b'-' || b[i] == b'_' {
            out.push(b[i]);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// A key of `parts`, each a [`token`], joined with `.`.
pub fn key(parts: &[&str]) -> String {
    parts.iter().map(|p| token(p)).collect::<Vec<_>>().join(".")
}

/// One key's latest entry, as [`current`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The key (within the bucket).
    pub key: String,
    /// Its value (empty for a deletion).
    pub value: bytes::Bytes,
    /// The revision (stream sequence) of this entry.
    pub revision: u64,
    /// The latest entry is a delete or purge.
    pub deleted: bool,
}

/// The latest entry of every key under `prefix` (e.g. `"normalizer."`; `""` for the
/// whole bucket), in revision order, deletions included. One read of the keys asked
/// for, not of the whole bucket: an ordered last-per-subject reader that is deleted
/// afterwards, so frequent reads do not pile up consumers.
pub async fn current(store: &Store, prefix: &str) -> Result<Vec<Current>, BusError> {
    let full_prefix = format!("{}{prefix}", store.prefix);
    let consumer = store
        .stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: format!("{full_prefix}>"),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(nats("create kv reader"))?;
    let name = consumer.cached_info().name.clone();
    let read = read_current(consumer, &store.prefix).await;
    if let Err(e) = store.stream.delete_consumer(&name).await {
        tracing::debug!(error = %e, "kv reader not deleted; it expires");
    }
    read
}

async fn read_current(
    consumer: async_nats::jetstream::consumer::Consumer<pull::OrderedConfig>,
    bucket_prefix: &str,
) -> Result<Vec<Current>, BusError> {
    let mut out = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(nats("read kv"))?;
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(nats("read kv"))?;
        let info = msg.info().map_err(|e| BusError::Nats {
            op: "kv message info",
            source: e,
        })?;
        let (revision, pending) = (info.stream_sequence, info.pending);
        let deleted = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|v| matches!(v.as_str(), "DEL" | "PURGE"));
        if let Some(key) = msg.subject.strip_prefix(bucket_prefix) {
            out.push(Current {
                key: key.to_owned(),
                value: msg.payload.clone(),
                revision,
                deleted,
            });
        }
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}

/// How many versions of a key the erasable buckets keep (their `history`). Each write
/// through [`put_erasing`] or [`delete_erasing`] erases the versions before it, so a key
/// normally holds one; the room for a few more is there so that a write whose erasure
/// failed (a crash, a timeout) is not then dropped by the history limit, which only
/// unlinks a message, leaving its bytes in the block file until the broker compacts it.
pub const ERASABLE_HISTORY: i64 = 4;

/// Erasures of replaced versions running at once, per process. They run beside the
/// writes, never in their way: an erasure is a replicated delete on an R3 bucket, and
/// waiting for it made every state save (and a projector's handover) several times
/// slower. Beyond this many, a write leaves its erasure to the key's next write (which
/// erases every version below its own) or to the run's erasure.
const CONCURRENT_ERASURES: usize = 64;

static ERASURES: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| {
        std::sync::Arc::new(tokio::sync::Semaphore::new(CONCURRENT_ERASURES))
    });

/// Writes `value` under `key`, then has the key's earlier versions erased in the
/// background: an overwritten value (delivery bookkeeping, run ids) does not linger in
/// the bucket's files, as it would if the history limit dropped it. Returns the new
/// revision once the write is stored. The erasure is best effort: a failure is logged,
/// and the next write or an erasure of the run takes those versions.
pub async fn put_erasing(store: &Store, key: &str, value: bytes::Bytes) -> Result<u64, BusError> {
    let revision = store.put(key, value).await.map_err(nats("kv put"))?;
    erase_in_background(store, key, Some(revision));
    Ok(revision)
}

/// Deletes `key` (a tombstone, as `Store::delete`), then has every version before the
/// tombstone erased in the background.
pub async fn delete_erasing(store: &Store, key: &str) -> Result<(), BusError> {
    store.delete(key).await.map_err(nats("kv delete"))?;
    erase_in_background(store, key, None);
    Ok(())
}

/// Erases the versions of `key` before `revision` (`None`: before its latest, the
/// tombstone a delete just wrote) on a task of its own, when fewer than
/// [`CONCURRENT_ERASURES`] run.
fn erase_in_background(store: &Store, key: &str, revision: Option<u64>) {
    let Ok(permit) = ERASURES.clone().try_acquire_owned() else {
        tracing::debug!(
            key,
            "erasures busy; the key's next write erases its versions"
        );
        return;
    };
    let (store, key) = (store.clone(), key.to_owned());
    tokio::spawn(async move {
        let revision = match revision {
            Some(r) => r,
            None => {
                let subject = format!("{}{key}", store.prefix);
                match store.stream.direct_get_last_for_subject(&subject).await {
                    Ok(latest) => latest.sequence,
                    Err(e) => {
                        tracing::debug!(key, error = %e, "earlier versions of a deleted key not erased");
                        return;
                    }
                }
            }
        };
        erase_before(&store, &key, revision).await;
        drop(permit);
    });
}

/// Waits until the erasures started so far have finished (tests that then read the
/// broker's files).
pub async fn erasures_done() {
    if let Ok(all) = ERASURES
        .acquire_many(u32::try_from(CONCURRENT_ERASURES).unwrap_or(u32::MAX))
        .await
    {
        drop(all);
    }
}

/// Erases the versions of `key` older than `revision`, oldest first; at most
/// [`ERASABLE_HISTORY`] of them, which is all a bucket holds.
async fn erase_before(store: &Store, key: &str, revision: u64) {
    if store.stream.cached_info().config.deny_delete {
        // A bucket made before buckets were erasable: JetStream cannot lift that, and
        // the history limit (1 there) drops what the write replaced.
        return;
    }
    let subject = format!("{}{key}", store.prefix);
    for _ in 0..ERASABLE_HISTORY {
        let oldest = match store.stream.direct_get_first_for_subject(&subject).await {
            Ok(m) => m.sequence,
            Err(e) => {
                tracing::debug!(key, error = %e, "no earlier version to erase");
                return;
            }
        };
        if oldest >= revision {
            return;
        }
        // Erased meanwhile by another writer of the key or by the age limit: fine too.
        match crate::erase::erase_message(&store.stream, oldest).await {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(key, revision = oldest, error = %e, "overwritten kv version not erased");
                return;
            }
        }
    }
}

/// Gets or creates a KV bucket that allows its entries to be *erased*
/// ([`crate::erase`]): the same stream a `create_or_update_key_value` makes, except
/// that single-message deletes are allowed. JetStream never lets a stream go back from
/// denying deletes, so a bucket created by an older version (denying them) keeps doing
/// so; its other settings are updated as usual. Returns the bucket.
pub async fn open_erasable(
    js: &async_nats::jetstream::Context,
    config: async_nats::jetstream::kv::Config,
) -> Result<async_nats::jetstream::kv::Store, crate::BusError> {
    use async_nats::jetstream::stream;
    let mut wanted = stream::Config {
        name: format!("KV_{}", config.bucket),
        description: Some(config.description.clone()),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        max_messages_per_subject: config.history.max(1),
        max_bytes: config.max_bytes,
        max_age: config.max_age,
        max_message_size: config.max_value_size,
        storage: config.storage,
        allow_rollup: true,
        deny_delete: false,
        deny_purge: false,
        allow_direct: true,
        num_replicas: config.num_replicas.max(1),
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    };
    for _ in 0..3 {
        match js.get_stream(&wanted.name).await {
            Ok(existing) => {
                wanted.deny_delete = existing.cached_info().config.deny_delete;
                js.update_stream(&wanted)
                    .await
                    .map_err(crate::nats("update kv bucket"))?;
                break;
            }
            Err(e)
                if matches!(e.kind(), async_nats::jetstream::context::GetStreamErrorKind::JetStream(j)
                    if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                match js.create_stream(&wanted).await {
                    Ok(_) => break,
                    // Another replica created it meanwhile (10058, "stream name already
                    // in use"): update it instead.
                    Err(e)
                        if matches!(e.kind(), async_nats::jetstream::context::CreateStreamErrorKind::JetStream(j)
                            if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NAME_EXIST) =>
                    {
                        continue
                    }
                    Err(e) => return Err(crate::nats("create kv bucket")(e)),
                }
            }
            Err(e) => return Err(crate::nats("get kv bucket")(e)),
        }
    }
    js.get_key_value(&config.bucket)
        .await
        .map_err(crate::nats("open kv bucket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_safe_distinct_and_reversible() {
        assert_eq!(key(&["tg", "-100123", "run.1"]), "tg.-100123.run=2E1");
        assert_ne!(
            key(&["tg", "-100123", "run.1"]),
            key(&["tg", "-100123.run", "1"])
        );
        assert_eq!(key(&["d", "", "r"]), "d.=.r");
        for s in ["", "a", "run.7", "é 中 🦀", "=3D", "a.b>c*"] {
            let t = token(s);
            assert!(t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)));
            assert_eq!(untoken(&t).as_deref(), Some(s));
        }
        assert_eq!(untoken("a.b"), None);
        assert_eq!(untoken("=4"), None);
    }
}

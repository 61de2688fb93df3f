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

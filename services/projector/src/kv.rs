//! The projector's JetStream KV buckets (docs/architecture.md §3):
//! - [`DELIVERY_BUCKET`] `SG_DELIVERY`: one [`DeliveryState`] per channel+chat+run under
//!   [`state_kv_key`] ([`KvStateStore`]), plus an active-run marker per run under
//!   `active.<state key>` ([`ActiveRun`]) that crash recovery walks. A run is tenant +
//!   run id (a run id is unique only within its tenant), so the state key is
//!   `<channel>.<chat>.<tenant>.<run>`, each level a [`streamgate_bus::kv::token`]: any
//!   id is a valid key level, and with every id at its 256-byte maximum (768 bytes
//!   escaped) the key stays far below the broker's limits ([`MAX_STATE_KEY_BYTES`]).
//! - [`SETTINGS_BUCKET`] `SG_SETTINGS`: per-chat overrides under
//!   `<channel>.<tenant>.<chat>` ([`SettingsOverride`]); a tenant's chat is its own.

use crate::error::{nats, ProjectorError};
use async_nats::jetstream::{self, kv};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use streamgate_projection::{Delivery, Reasoning, Settings, TagVisibility, Verbose};
use streamgate_sinks::{DeliveryState, StateKey, StateStore, StoreError};

/// Delivery states and active-run markers.
pub const DELIVERY_BUCKET: &str = streamgate_bus::kv::DELIVERY_BUCKET;
/// Per-chat settings overrides.
pub const SETTINGS_BUCKET: &str = "SG_SETTINGS";

/// How long a delivery state outlives its last write. Without a bound the bucket (and
/// the marker scan over its keys) grows with every run ever delivered; a week is far
/// longer than any turn, and a redelivery older than that is outside JetStream's
/// retention anyway.
pub const DELIVERY_TTL: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// How long [`bucket`] keeps asking while JetStream times out. On a freshly started
/// R3 cluster the meta leader and the bucket's stream leader take seconds to settle, and
/// a bucket request in that window times out; a projector that exited on it came up on
/// its next restart (seen as 1–2 restarts per pod in the manifests test). Waiting here
/// makes that a pause instead of a crash; other errors fail at once.
const BUCKET_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Gets or creates a KV bucket (file storage, `replicas` copies). Only a key's current
/// value matters: settings keep one version; the delivery bucket, whose keys name runs,
/// keeps [`streamgate_bus::kv::ERASABLE_HISTORY`] and allows the erasure of single
/// messages (a run's erasure overwrites every version of its keys; everyday writes are
/// plain puts of values that hold no content), and expires entries after
/// [`DELIVERY_TTL`]; settings never expire. JetStream timeouts are retried for
/// [`BUCKET_PATIENCE`] (the services' one startup retry, `streamgate_runtime::startup`).
pub async fn bucket(
    js: &jetstream::Context,
    name: &str,
    replicas: usize,
) -> Result<kv::Store, ProjectorError> {
    let config = kv::Config {
        bucket: name.to_owned(),
        history: if name == DELIVERY_BUCKET {
            streamgate_bus::kv::ERASABLE_HISTORY
        } else {
            1
        },
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas.max(1),
        max_age: if name == DELIVERY_BUCKET {
            DELIVERY_TTL
        } else {
            std::time::Duration::ZERO
        },
        ..Default::default()
    };
    streamgate_runtime::startup::retry_timeouts_within(name, BUCKET_PATIENCE, || async {
        Ok(streamgate_bus::kv::open_erasable(js, config.clone()).await?)
    })
    .await
    .map_err(|e| match e.downcast::<streamgate_bus::BusError>() {
        Ok(bus) => ProjectorError::Bus(bus),
        Err(e) => ProjectorError::Config(format!("create kv bucket {name}: {e:#}")),
    })
}

/// Key of a delivery state in [`DELIVERY_BUCKET`]: `<channel>.<chat>.<tenant>.<run>`.
pub fn state_kv_key(key: &StateKey) -> String {
    streamgate_bus::kv::key(&[&key.channel, &key.chat_id, &key.tenant, &key.run_id])
}

/// The longest key [`state_kv_key`] makes for ids within the id rule (tenant, run and a
/// session-derived chat of 256 bytes, a 256-byte channel name), with the `active.`
/// prefix: four levels of at most 3×256 bytes plus separators. The broker refuses a
/// publish whose control line exceeds 4096 bytes; this leaves room for the
/// `$KV.<bucket>.` prefix and the rest of the line.
pub const MAX_STATE_KEY_BYTES: usize = "active.".len() + 4 * 3 * 256 + 3;

/// [`StateStore`] over the `SG_DELIVERY` bucket. A `put` returns after JetStream stored
/// the value, which is what the engine's exactly-once finals rely on.
#[derive(Clone)]
pub struct KvStateStore {
    store: kv::Store,
}

impl KvStateStore {
    /// A store over an opened bucket.
    pub fn new(store: kv::Store) -> KvStateStore {
        KvStateStore { store }
    }
}

impl StateStore for KvStateStore {
    fn load<'a>(
        &'a self,
        key: &'a StateKey,
    ) -> BoxFuture<'a, Result<Option<DeliveryState>, StoreError>> {
        Box::pin(async move {
            let Some(bytes) = self
                .store
                .get(state_kv_key(key))
                .await
                .map_err(|e| StoreError(e.to_string()))?
            else {
                return Ok(None);
            };
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError(format!("corrupt delivery state: {e}")))
        })
    }

    fn save<'a>(
        &'a self,
        key: &'a StateKey,
        state: &'a DeliveryState,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let bytes = serde_json::to_vec(state).map_err(|e| StoreError(e.to_string()))?;
            // A plain put: a delivery state holds ids, flags, seqs and digests, never
            // the text it showed (`streamgate_sinks::TextDigest`), so the versions it
            // replaces reveal nothing its key and its current version do not. Erasing
            // each one rewrote a block file of the bucket per op, and every chat's state
            // read and write queued behind those rewrites (delivery p99 39–48 ms with
            // them, 6 ms without, at 200 runs). A run's erasure still overwrites every
            // version.
            self.store
                .put(state_kv_key(key), bytes.into())
                .await
                .map(|_| ())
                .map_err(|e| StoreError(e.to_string()))
        })
    }
}

/// Marker of a run in flight on a channel: enough to find its events again after a
/// crash without reading the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveRun {
    /// Channel name.
    pub channel: String,
    /// Chat the run renders into.
    pub chat_id: String,
    /// The run.
    pub run_id: String,
    /// Tenant of the run.
    pub tenant: String,
    /// Session key, if any.
    pub session_key: Option<String>,
    /// The run's `SG_EVENTS` subject.
    pub subject: String,
}

impl ActiveRun {
    /// Whether the run goes to `tenant`'s chat `chat` (no tenant: the default one).
    pub fn is_in(&self, tenant: &str, chat: &str) -> bool {
        self.chat_id == chat && streamgate_grammar::ids::tenant_or_default(&self.tenant) == tenant
    }

    /// Its key in [`DELIVERY_BUCKET`].
    pub fn kv_key(&self) -> String {
        format!("active.{}", state_kv_key(&self.state_key()))
    }

    /// The delivery state key of the run.
    pub fn state_key(&self) -> StateKey {
        StateKey {
            channel: self.channel.clone(),
            chat_id: self.chat_id.clone(),
            run_id: self.run_id.clone(),
            tenant: self.tenant.clone(),
        }
    }

    /// The draft key the run's ops carry (tenant and run id).
    pub fn draft_key(&self) -> streamgate_projection::DraftKey {
        streamgate_projection::DraftKey {
            run_id: self.run_id.clone(),
            tenant: self.tenant.clone(),
        }
    }
}

/// Writes an active-run marker: a plain put. A marker names its run, chat, session and
/// subject — identifiers, no content — so the tombstone [`delete_active`] leaves and the
/// version before it reveal nothing a run's erasure does not overwrite (it takes every
/// version of the key); they age out with [`DELIVERY_TTL`]. Erasing the version on each
/// run's end rewrote a block of the bucket per run, and at 2,000 runs ending together
/// every chat's delivery-state read waited for those rewrites (p99 107 ms, 5 ms without).
pub async fn put_active(store: &kv::Store, run: &ActiveRun) -> Result<(), ProjectorError> {
    let bytes = serde_json::to_vec(run).map_err(|e| ProjectorError::Config(e.to_string()))?;
    store
        .put(run.kv_key(), bytes.into())
        .await
        .map_err(nats("put active-run marker"))?;
    Ok(())
}

/// Removes an active-run marker (a tombstone; see [`put_active`]).
pub async fn delete_active(store: &kv::Store, run: &ActiveRun) -> Result<(), ProjectorError> {
    store
        .delete(run.kv_key())
        .await
        .map_err(nats("delete active-run marker"))?;
    Ok(())
}

/// Every active-run marker of `channel`. Unreadable markers are logged and skipped (a
/// corrupt marker must not stop the channel from starting). A marker still under its
/// key from before the tenant joined the key (`active.<channel>.<chat>.<run>`) is moved
/// to its current key, so deleting it later removes it for good.
pub async fn list_active(
    store: &kv::Store,
    channel: &str,
) -> Result<Vec<ActiveRun>, ProjectorError> {
    // Only this channel's markers, in one read (not every key of the bucket, each then
    // fetched on its own).
    let prefix = format!("active.{}.", streamgate_bus::kv::token(channel));
    let mut out = Vec::new();
    for entry in streamgate_bus::kv::current(store, &prefix).await? {
        if entry.deleted {
            continue;
        }
        match serde_json::from_slice::<ActiveRun>(&entry.value) {
            Ok(r) => {
                if entry.key != r.kv_key() {
                    put_active(store, &r).await?;
                    streamgate_bus::kv::delete_erasing(store, &entry.key).await?;
                }
                out.push(r)
            }
            Err(e) => {
                tracing::warn!(key = %entry.key, error = %e, "skipping unreadable active-run marker")
            }
        }
    }
    Ok(out)
}

/// Per-chat overrides of the channel's default settings: `/reasoning`, `/verbose` and
/// the ACP dedupe plan's knobs (issue #13). Stored as JSON with every field optional
/// (absent = the channel's default), so values written before a field existed read
/// unchanged, and an older reader ignores the fields it does not know.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsOverride {
    /// `/reasoning`, when set for the chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    /// `/verbose`, when set for the chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbose: Option<Verbose>,
    /// `deliveryMode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// `repeatSuppression`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppress_repeats: Option<bool>,
    /// `tagVisibility`: per-tag overrides laid over the channel's.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub tag_visibility: TagVisibility,
    /// `maxTurnChars` (the draft budget; clamped to the sink's limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turn_chars: Option<usize>,
    /// `maxToolSummaryChars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_summary_chars: Option<usize>,
    /// `maxStatusChars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_status_chars: Option<usize>,
}

fn is_empty(v: &TagVisibility) -> bool {
    v.0.is_empty()
}

impl SettingsOverride {
    /// `defaults` with these overrides applied.
    pub fn apply(&self, defaults: &Settings) -> Settings {
        let mut s = defaults.clone();
        if let Some(r) = self.reasoning {
            s.reasoning = r;
        }
        if let Some(v) = self.verbose {
            s.verbose = v;
        }
        if let Some(d) = self.delivery {
            s.delivery = d;
        }
        if let Some(r) = self.suppress_repeats {
            s.suppress_repeats = r;
        }
        s.tag_visibility = s.tag_visibility.merged(&self.tag_visibility);
        if let Some(n) = self.max_turn_chars {
            s.budgets.draft_max_chars = n;
        }
        if let Some(n) = self.max_tool_summary_chars {
            s.budgets.item_detail_chars = n;
        }
        if let Some(n) = self.max_status_chars {
            s.budgets.status_chars = n;
        }
        s
    }

    /// Lays `change` over these overrides: its set fields win, its tag overrides merge
    /// per tag, and the tags in `reset_tags` go back to the channel's default.
    pub fn update(&mut self, change: &SettingsOverride, reset_tags: &[String]) {
        macro_rules! take {
            ($($f:ident),*) => {$(
                if change.$f.is_some() {
                    self.$f = change.$f;
                }
            )*};
        }
        take!(
            reasoning,
            verbose,
            delivery,
            suppress_repeats,
            max_turn_chars,
            max_tool_summary_chars,
            max_status_chars
        );
        self.tag_visibility = self.tag_visibility.merged(&change.tag_visibility);
        for tag in reset_tags {
            self.tag_visibility.0.remove(tag);
        }
    }
}

/// Key of a tenant's chat's overrides in [`SETTINGS_BUCKET`]: `<channel>.<tenant>.<chat>`.
pub fn settings_key(channel: &str, tenant: &str, chat: &str) -> String {
    streamgate_bus::kv::key(&[channel, tenant, chat])
}

/// The tenant and chat of a key of `channel` in [`SETTINGS_BUCKET`] (the inverse of
/// [`settings_key`]); `None` for another channel's key or a key this scheme never writes.
/// A key of the scheme before tenants (`<channel>.<chat>`) is the default tenant's, so
/// overrides stored before an upgrade still apply to the runs they were set for.
pub fn chat_of_settings_key(channel: &str, key: &str) -> Option<(String, String)> {
    let rest = key
        .strip_prefix(&streamgate_bus::kv::token(channel))?
        .strip_prefix('.')?;
    match rest.split_once('.') {
        Some((tenant, chat)) if !chat.contains('.') => Some((
            streamgate_bus::kv::untoken(tenant)?,
            streamgate_bus::kv::untoken(chat)?,
        )),
        Some(_) => None,
        None => Some((
            streamgate_grammar::ids::DEFAULT_TENANT.to_owned(),
            streamgate_bus::kv::untoken(rest)?,
        )),
    }
}

/// A stored override value (unreadable: no overrides — rendering falls back to the
/// channel defaults rather than failing the run).
pub fn parse_override(bytes: &[u8]) -> SettingsOverride {
    serde_json::from_slice(bytes).unwrap_or_default()
}

/// A chat's overrides as stored, with the `SG_SETTINGS` revision they were read at (0:
/// never stored). Revisions order every change to the key, so a replica can tell a newer
/// value from an older one whichever way (lazy load or watch) it arrives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredOverride {
    /// The overrides (none after a delete).
    pub overrides: SettingsOverride,
    /// Revision of the key's last write or delete; 0 when it has none.
    pub revision: u64,
}

/// The chat's overrides and their revision.
pub async fn load_override(
    store: &kv::Store,
    channel: &str,
    tenant: &str,
    chat: &str,
) -> Result<StoredOverride, ProjectorError> {
    let entry = store
        .entry(settings_key(channel, tenant, chat))
        .await
        .map_err(nats("get settings"))?;
    Ok(
        entry.map_or_else(StoredOverride::default, |e| StoredOverride {
            overrides: match e.operation {
                kv::Operation::Put => parse_override(&e.value),
                kv::Operation::Delete | kv::Operation::Purge => SettingsOverride::default(),
            },
            revision: e.revision,
        }),
    )
}

/// Stores the chat's overrides if the key is still at `revision` (what
/// [`load_override`] returned); returns the new revision, or `None` when another
/// replica wrote in between (reload and retry: a blind write would lose its change).
pub async fn save_override(
    store: &kv::Store,
    channel: &str,
    tenant: &str,
    chat: &str,
    o: &SettingsOverride,
    revision: u64,
) -> Result<Option<u64>, ProjectorError> {
    let bytes = serde_json::to_vec(o).map_err(|e| ProjectorError::Config(e.to_string()))?;
    match store
        .update(settings_key(channel, tenant, chat), bytes.into(), revision)
        .await
    {
        Ok(rev) => Ok(Some(rev)),
        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
        Err(e) => Err(nats("put settings")(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_keys_name_the_tenant_and_read_back() {
        let k = settings_key("tg.main", "acme", "-100.5");
        assert_eq!(
            chat_of_settings_key("tg.main", &k),
            Some(("acme".to_owned(), "-100.5".to_owned()))
        );
        assert_ne!(k, settings_key("tg.main", "globex", "-100.5"));
        // Before tenants: the default tenant's.
        let legacy = streamgate_bus::kv::key(&["tg.main", "-100"]);
        assert_eq!(
            chat_of_settings_key("tg.main", &legacy),
            Some(("default".to_owned(), "-100".to_owned()))
        );
        assert_eq!(chat_of_settings_key("other", &k), None);
    }

    #[test]
    fn tokens_match_state_keys() {
        let k = StateKey {
            channel: "tg.main".into(),
            chat_id: "-100".into(),
            run_id: "".into(),
            tenant: "acme".into(),
        };
        assert_eq!(
            state_kv_key(&k),
            format!(
                "{}.{}.{}.{}",
                streamgate_bus::kv::token("tg.main"),
                streamgate_bus::kv::token("-100"),
                streamgate_bus::kv::token("acme"),
                streamgate_bus::kv::token("")
            )
        );
        assert_eq!(settings_key("c", "t", "a b"), "c.t.a=20b");
    }

    /// The same run id under two tenants: two delivery states, two markers; ids at
    /// their maximum stay valid KV keys within [`MAX_STATE_KEY_BYTES`].
    #[test]
    fn tenants_get_their_own_keys_within_limits() {
        let run = |tenant: &str, run_id: &str, chat: &str| ActiveRun {
            channel: "web".into(),
            chat_id: chat.into(),
            run_id: run_id.into(),
            tenant: tenant.into(),
            session_key: None,
            subject: String::new(),
        };
        let (a, g) = (run("acme", "r1", "c"), run("globex", "r1", "c"));
        assert_ne!(a.kv_key(), g.kv_key());
        assert_ne!(state_kv_key(&a.state_key()), state_kv_key(&g.state_key()));
        // Ids with `.` cannot shift levels: ("a.b", "c") and ("a", "b.c") differ.
        assert_ne!(run("a.b", "c", "x").kv_key(), run("a", "b.c", "x").kv_key());
        let max = "é".repeat(128);
        let big = ActiveRun {
            channel: max.clone(),
            ..run(&max, &max, &max)
        };
        let key = big.kv_key();
        assert!(key.len() <= MAX_STATE_KEY_BYTES, "{}", key.len());
        assert!(key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=.".contains(&b)));
        assert!(MAX_STATE_KEY_BYTES + "$KV.SG_DELIVERY.".len() < 4096 - 512);
    }

    #[test]
    fn settings_keys_give_their_chat_back() {
        for chat in ["", "-100123", "a b", "ü.x=y", "chat_1-2"] {
            let key = settings_key("tg.main", "a.b", chat);
            assert_eq!(
                chat_of_settings_key("tg.main", &key),
                Some(("a.b".to_owned(), chat.to_owned())),
                "{key}"
            );
        }
        assert_eq!(
            chat_of_settings_key("tg", &settings_key("tg.main", "t", "x")),
            None
        );
        assert_eq!(chat_of_settings_key("tg", "tg.a=4"), None);
        assert_eq!(chat_of_settings_key("tg", "tg.a.b.c"), None);
    }

    #[test]
    fn overrides_apply_over_defaults() {
        let d = Settings::default();
        let o = SettingsOverride {
            reasoning: Some(Reasoning::Stream),
            ..SettingsOverride::default()
        };
        let s = o.apply(&d);
        assert_eq!(s.reasoning, Reasoning::Stream);
        assert_eq!(s.verbose, d.verbose);
    }

    /// Values stored before the knobs existed read unchanged; new values keep the
    /// storage format (absent fields stay absent).
    #[test]
    fn stored_overrides_stay_readable() {
        let old = parse_override(br#"{"reasoning":"on"}"#);
        assert_eq!(old.reasoning, Some(Reasoning::On));
        assert_eq!(
            old.apply(&Settings::default()).tag_visibility,
            TagVisibility::default()
        );
        let mut o = old.clone();
        let change = SettingsOverride {
            delivery: Some(Delivery::FinalOnly),
            tag_visibility: TagVisibility::parse_list("plan=show,usage_update=show")
                .unwrap_or_default(),
            max_status_chars: Some(60),
            ..SettingsOverride::default()
        };
        o.update(&change, &["usage_update".to_owned()]);
        let json = serde_json::to_string(&o).unwrap_or_default();
        assert_eq!(
            json,
            r#"{"reasoning":"on","delivery":"final_only","tag_visibility":{"plan":true},"max_status_chars":60}"#
        );
        assert_eq!(parse_override(json.as_bytes()), o);
        let s = o.apply(&Settings::default());
        assert!(s.tag_visibility.shown("plan") && !s.tag_visibility.shown("usage_update"));
        assert_eq!(s.budgets.status_chars, 60);
    }
}

//! Per-chat settings: channel defaults overridden by `SG_SETTINGS`, cached with the
//! key's revision, changed through any replica and followed by all of them.

use super::runs::track_draft;
use super::{lock, Channel};
use crate::error::ProjectorError;
use crate::kv::{self, SettingsOverride, StoredOverride};
use async_nats::jetstream::kv as kv_watch;
use futures::StreamExt as _;
use std::sync::Arc;
use streamgate_grammar::ids::tenant_or_default;
use streamgate_projection::Settings;
use tokio_util::sync::CancellationToken;

/// A chat's identity in the settings cache: (tenant, chat). Two tenants' chats of the
/// same name are two chats.
pub(super) type ChatKey = (String, String);

/// The cache key of a tenant's chat (no tenant: the default one, as everywhere).
pub(super) fn chat_key(tenant: &str, chat: &str) -> ChatKey {
    (tenant_or_default(tenant).to_owned(), chat.to_owned())
}

/// A chat's effective settings and the `SG_SETTINGS` revision they were derived from.
pub(super) struct CachedSettings {
    pub(super) settings: Settings,
    pub(super) revision: u64,
}

impl Channel {
    /// The channel's defaults with a chat's overrides applied, the draft budget
    /// (`maxTurnChars`) clamped to the sink's message limit.
    pub fn resolve(&self, o: &SettingsOverride) -> Settings {
        let mut s = o.apply(&self.cfg.settings);
        if let Some(limit) = self.draft_limit {
            s.budgets.draft_max_chars = s.budgets.draft_max_chars.min(limit);
        }
        s
    }

    /// The tenant's chat's settings: channel defaults overridden by `SG_SETTINGS`.
    pub async fn settings_for(&self, tenant: &str, chat: &str) -> Result<Settings, ProjectorError> {
        let tenant = tenant_or_default(tenant);
        let id = chat_key(tenant, chat);
        if let Some(c) = lock(&self.chat_settings).get(&id) {
            return Ok(c.settings.clone());
        }
        let stored = kv::load_override(&self.settings_kv, &self.cfg.name, tenant, chat).await?;
        let mut cache = lock(&self.chat_settings);
        // The watch may have cached a newer value while this one was loading.
        let c = cache.entry(id).or_insert_with(|| CachedSettings {
            settings: self.resolve(&stored.overrides),
            revision: stored.revision,
        });
        if c.revision < stored.revision {
            c.settings = self.resolve(&stored.overrides);
            c.revision = stored.revision;
        }
        Ok(c.settings.clone())
    }

    /// [`Channel::change_settings`] without tag resets.
    pub async fn set_settings(
        &self,
        tenant: &str,
        chat: &str,
        o: SettingsOverride,
    ) -> Result<(Settings, u32), ProjectorError> {
        self.change_settings(tenant, chat, o, &[]).await
    }

    /// Stores the chat's overrides — `o`'s set fields (`None` = unchanged), its tag
    /// overrides merged per tag, the `reset_tags` back to the channel default — and
    /// re-renders its runs in flight (`resettle`: rendering only, events untouched); the
    /// other replicas follow through their settings watch. Returns the new settings and
    /// how many runs of the chat are in flight here (each re-rendered, by this call or
    /// by the watch that saw the same write first).
    pub async fn change_settings(
        &self,
        tenant: &str,
        chat: &str,
        o: SettingsOverride,
        reset_tags: &[String],
    ) -> Result<(Settings, u32), ProjectorError> {
        let tenant = tenant_or_default(tenant);
        // Compare-and-set: two replicas changing different flags at once both win.
        let (stored, revision) = loop {
            let current =
                kv::load_override(&self.settings_kv, &self.cfg.name, tenant, chat).await?;
            let mut stored = current.overrides;
            stored.update(&o, reset_tags);
            if let Some(rev) = kv::save_override(
                &self.settings_kv,
                &self.cfg.name,
                tenant,
                chat,
                &stored,
                current.revision,
            )
            .await?
            {
                break (stored, rev);
            }
        };
        let settings = self.resolve(&stored);
        self.apply_settings(
            tenant,
            chat,
            StoredOverride {
                overrides: stored,
                revision,
            },
        )
        .await?;
        let n = lock(&self.runs)
            .values()
            .filter(|e| e.marker.is_in(tenant, chat))
            .count();
        Ok((settings, u32::try_from(n).unwrap_or(u32::MAX)))
    }

    /// Caches `stored` as the chat's settings unless a newer revision is cached already,
    /// and re-renders the chat's runs in flight when the settings changed. Returns how
    /// many runs were re-rendered.
    async fn apply_settings(
        &self,
        tenant: &str,
        chat: &str,
        stored: StoredOverride,
    ) -> Result<usize, ProjectorError> {
        let tenant = tenant_or_default(tenant);
        let settings = self.resolve(&stored.overrides);
        let mut batches = Vec::new();
        {
            // Under the runs lock, so no event is folded between the cache update and
            // the re-render with settings older than either.
            let mut runs = lock(&self.runs);
            {
                let mut cache = lock(&self.chat_settings);
                let id = chat_key(tenant, chat);
                match cache.get_mut(&id) {
                    Some(c) if c.revision >= stored.revision => return Ok(0),
                    Some(c) if c.settings == settings => {
                        c.revision = stored.revision;
                        return Ok(0);
                    }
                    Some(c) => {
                        c.settings = settings.clone();
                        c.revision = stored.revision;
                    }
                    None => {
                        cache.insert(
                            id,
                            CachedSettings {
                                settings: settings.clone(),
                                revision: stored.revision,
                            },
                        );
                    }
                }
            }
            for e in runs.values_mut().filter(|e| e.marker.is_in(tenant, chat)) {
                let ops = e.proj.resettle(&settings, self.tier);
                track_draft(&mut e.draft, &mut e.final_text, &ops);
                batches.push(ops);
            }
        }
        let n = batches.len();
        let target = self.target(tenant, chat);
        for op in batches.into_iter().flatten() {
            self.delivery.submit(target.clone(), op).await?;
        }
        Ok(n)
    }

    /// Opens the watch of this channel's keys in `SG_SETTINGS`, with history: the
    /// current value of every key first, then each change. Open it before anything can
    /// fill the cache so no change falls between the two (and after a reconnect the
    /// history repairs whatever was missed; revisions make the repeats no-ops).
    pub async fn settings_watch(&self) -> Result<kv_watch::Watch, ProjectorError> {
        self.settings_kv
            .watch_with_history(format!("{}.>", streamgate_bus::kv::token(&self.cfg.name)))
            .await
            .map_err(crate::error::nats("watch settings"))
    }

    /// Follows `SG_SETTINGS` until `stop` fires: a chat's settings changed by any
    /// replica (or by hand in the bucket) update this replica's cache and re-render its
    /// runs of that chat — rendering only, like [`Channel::set_settings`]. A broken watch
    /// is reopened.
    pub async fn follow_settings(
        self: Arc<Self>,
        mut watch: kv_watch::Watch,
        stop: CancellationToken,
    ) -> Result<(), ProjectorError> {
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                n = watch.next() => n,
            };
            match next {
                Some(Ok(entry)) => {
                    let Some((tenant, chat)) = kv::chat_of_settings_key(&self.cfg.name, &entry.key)
                    else {
                        continue;
                    };
                    let overrides = match entry.operation {
                        kv_watch::Operation::Put => kv::parse_override(&entry.value),
                        kv_watch::Operation::Delete | kv_watch::Operation::Purge => {
                            SettingsOverride::default()
                        }
                    };
                    let stored = StoredOverride {
                        overrides,
                        revision: entry.revision,
                    };
                    match self.apply_settings(&tenant, &chat, stored).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!(chat = %chat, runs = n, "settings changed elsewhere; runs re-rendered")
                        }
                        Err(e) => {
                            tracing::warn!(chat = %chat, error = %e, "settings change not re-rendered")
                        }
                    }
                }
                other => {
                    if let Some(Err(e)) = other {
                        tracing::warn!(error = %e, "settings watch failed; reopening");
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                    match self.settings_watch().await {
                        Ok(w) => watch = w,
                        Err(e) => tracing::warn!(error = %e, "settings watch not reopened"),
                    }
                }
            }
        }
    }
}

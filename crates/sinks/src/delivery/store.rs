//! Where [`DeliveryState`] lives between attempts. The projector service persists it in
//! a JetStream KV bucket (the projector's `KvStateStore`); tests and single-process
//! setups use [`MemoryStore`].

use crate::sink::{ChatTarget, DeliveryState};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;

/// Identity of one [`DeliveryState`]: channel + chat + run, the run being tenant + run id
/// (a run id is unique only within its tenant). (The chat is part of the key so one run
/// mirrored into two chats of a channel keeps two states.)
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StateKey {
    /// Channel name.
    pub channel: String,
    /// Chat within the channel.
    pub chat_id: String,
    /// The run.
    pub run_id: String,
    /// The run's tenant (empty when the op's draft key names none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
}

impl StateKey {
    /// Key of `run_id` of the chat's tenant in `chat`.
    pub fn new(chat: &ChatTarget, run_id: &str) -> StateKey {
        StateKey {
            channel: chat.channel.clone(),
            chat_id: chat.chat_id.clone(),
            run_id: run_id.to_owned(),
            tenant: chat.tenant.clone(),
        }
    }

    /// Key of the run of `draft` (tenant and run id) in `chat`.
    pub fn for_draft(chat: &ChatTarget, draft: &streamgate_projection::DraftKey) -> StateKey {
        StateKey {
            tenant: draft.tenant.clone(),
            ..StateKey::new(chat, &draft.run_id)
        }
    }
}

/// A state store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("delivery state store: {0}")]
pub struct StoreError(pub String);

/// Persistence of delivery states. Implementations must make `save` durable before
/// returning: the engine relies on it for exactly-once finals.
pub trait StateStore: Send + Sync {
    /// The state for `key`, or `None` when nothing was recorded yet.
    fn load<'a>(
        &'a self,
        key: &'a StateKey,
    ) -> BoxFuture<'a, Result<Option<DeliveryState>, StoreError>>;
    /// Record `state` for `key`.
    fn save<'a>(
        &'a self,
        key: &'a StateKey,
        state: &'a DeliveryState,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// In-memory [`StateStore`] (tests, single process without persistence).
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<StateKey, DeliveryState>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Snapshot of one state (for tests and introspection).
    pub fn get(&self, key: &StateKey) -> Option<DeliveryState> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }
}

impl StateStore for MemoryStore {
    fn load<'a>(
        &'a self,
        key: &'a StateKey,
    ) -> BoxFuture<'a, Result<Option<DeliveryState>, StoreError>> {
        let v = self.get(key);
        Box::pin(async move { Ok(v) })
    }

    fn save<'a>(
        &'a self,
        key: &'a StateKey,
        state: &'a DeliveryState,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), state.clone());
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_through_json() {
        let mut s = DeliveryState {
            draft_message_id: Some("42".into()),
            final_delivered: true,
            ..DeliveryState::default()
        };
        s.notices_sent.insert(7);
        let back: Result<DeliveryState, _> =
            serde_json::from_str(&serde_json::to_string(&s).unwrap_or_default());
        assert_eq!(back.ok(), Some(s));
    }
}

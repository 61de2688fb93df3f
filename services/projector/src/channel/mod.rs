//! [`Channel`]: one chat channel's projector — a durable consumer loop over `SG_EVENTS`
//! per partition this replica holds ([`Channel::run_partition`]), one [`RunProjection`]
//! per run, ops handed to the delivery engine, crash recovery and settings changes.
//!
//! Partitions: the channel's replicas split the partitions with leases
//! (`streamgate_bus::lease`, group `projector.<channel>`), so every run is rendered by
//! one replica. Acquiring a partition runs crash recovery over that partition's
//! active-run markers before its consumer starts; giving it up (released or lost)
//! drops its runs from memory — the next owner rebuilds them from `SG_EVENTS`, and the
//! KV delivery state keeps finals exactly-once across the move. What this replica
//! answers about runs (`active_runs`, `draft`, live events) covers its own partitions
//! only.
//!
//! Settings: every replica of a channel caches each chat's settings, and follows
//! `SG_SETTINGS` ([`Channel::follow_settings`]) so a change made through any replica
//! reaches all of them without a restart and re-renders their runs of that chat. Cached
//! values carry the key's KV revision; an older value (a lazy load racing the watch)
//! never replaces a newer one.
//!
//! Identity: a run is `(tenant, run id)` ([`RunKey`]): a run id is unique only within its
//! tenant, so the run table, the ended-run memory, the active-run markers and delivery
//! states (KV), the draft keys of the ops and the web page's records all name both, and
//! the same run id under two tenants is rendered as two runs.
//!
//! Layout, one file per job: `mod.rs` (the [`Channel`] and what it answers), `runs`
//! (the run table: folding events into ops, rebuilds, marker cleanup), `recovery`
//! (crash recovery and orphans), `settings` (per-chat settings, the `SG_SETTINGS`
//! watch), `partition` (a held partition: recovery, its consumer, handover), `worker`
//! (a held partition's messages, from its consumer to their acks), `resume` (how far a
//! partition is processed, for a consumer the broker forgot), `lanes` (which of a
//! partition's messages may be processed at once: a run's and a chat's in order, the
//! others concurrently) and `ended` (runs that just ended, kept a while for a client
//! that asks after one).

mod ended;
mod lanes;
mod partition;
mod recovery;
mod resume;
mod runs;
mod settings;
mod worker;

pub use ended::EndedRun;
pub use recovery::Recovery;

use crate::config::ChannelConfig;
use crate::kv::{self, ActiveRun};
use async_nats::jetstream::{self, kv::Store};
use settings::CachedSettings;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use streamgate_bus::subject::{partition_of, RunAddr};
use streamgate_grammar::RunEvent;
use streamgate_projection::{RunProjection, Tier};
use streamgate_sinks::{Delivery, StateStore};
use tokio::sync::broadcast;

/// A run: `(tenant, run id)`.
pub type RunKey = (String, String);

/// The [`RunKey`] of a tenant and run id.
pub fn run_key(tenant: &str, run_id: &str) -> RunKey {
    (tenant.to_owned(), run_id.to_owned())
}

/// Why a run named by id alone could not be told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    /// The run, found.
    Found(T),
    /// No such run here.
    Missing,
    /// No tenant given and several tenants have a run of that id: name the tenant.
    Ambiguous,
}

impl<T> Lookup<T> {
    /// The run, when found.
    pub fn found(self) -> Option<T> {
        match self {
            Lookup::Found(t) => Some(t),
            Lookup::Missing | Lookup::Ambiguous => None,
        }
    }
}

/// Looks up `run_id` of `tenant` (empty: the only tenant with a run of that id) among
/// `keys`.
pub(crate) fn resolve<'a>(
    keys: impl IntoIterator<Item = &'a RunKey>,
    tenant: &str,
    run_id: &str,
) -> Lookup<RunKey> {
    let mut found = None;
    for k in keys {
        if k.1 == run_id && (tenant.is_empty() || k.0 == tenant) {
            if found.is_some() {
                return Lookup::Ambiguous;
            }
            found = Some(k.clone());
        }
    }
    found.map_or(Lookup::Missing, Lookup::Found)
}

/// What the channel knows about one run in flight.
struct RunEntry {
    proj: RunProjection,
    marker: ActiveRun,
    /// Draft text as last rendered ("" before the first draft or after a dismiss).
    draft: String,
    /// The final answer as sent, once the projection has sent it.
    final_text: Option<String>,
    /// The run's partition: its entry goes when this replica gives the partition up.
    partition: u32,
}

/// A run in flight, as reported by [`Channel::active_runs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveRunInfo {
    /// The run.
    pub run_id: String,
    /// Its tenant.
    pub tenant: String,
    /// Chat it renders into.
    pub chat_id: String,
    /// Its session key.
    pub session_key: Option<String>,
    /// Highest event seq rendered.
    pub last_seq: u64,
    /// The run's `SG_EVENTS` subject.
    pub subject: String,
}

/// The current draft of a run ([`Channel::draft`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftInfo {
    /// The run's tenant.
    pub tenant: String,
    /// Chat it renders into.
    pub chat_id: String,
    /// Rendered draft text.
    pub text: String,
    /// Highest event seq rendered.
    pub last_seq: u64,
    /// The run settled.
    pub settled: bool,
}

/// One channel's projector. Cheap to share (`Arc`); the gRPC and web servers read it.
pub struct Channel {
    cfg: ChannelConfig,
    tier: Tier,
    /// The sink's message size limit: no chat's draft budget goes above it.
    draft_limit: Option<usize>,
    js: jetstream::Context,
    delivery: Delivery,
    state_kv: Store,
    settings_kv: Store,
    store: Arc<dyn StateStore>,
    runs: Mutex<HashMap<RunKey, RunEntry>>,
    /// Runs that ended here recently, with their final answers.
    ended: Mutex<ended::EndedRuns>,
    /// Lock order: `runs` before `chat_settings` wherever both are held.
    chat_settings: Mutex<HashMap<settings::ChatKey, CachedSettings>>,
    events_tx: broadcast::Sender<Arc<RunEvent>>,
    /// Runs recovery settled as "agent interrupted" on this replica.
    interrupted: AtomicUsize,
    /// The last scan of the active-run markers and when it started.
    marker_scan: tokio::sync::Mutex<Option<(Instant, Arc<Vec<ActiveRun>>)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not take the channel down with a poisoned lock.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channel {
    /// A channel over an engine that already has the channel's sink registered, with
    /// the KV buckets opened.
    /// `draft_limit` is the sink's message size limit
    /// ([`streamgate_sinks::Sink::text_limit`]): no chat's `maxTurnChars` exceeds it.
    pub fn new(
        cfg: ChannelConfig,
        tier: Tier,
        draft_limit: Option<usize>,
        js: jetstream::Context,
        delivery: Delivery,
        state_kv: Store,
        settings_kv: Store,
    ) -> Channel {
        Channel {
            store: Arc::new(kv::KvStateStore::new(state_kv.clone())),
            cfg,
            tier,
            draft_limit,
            js,
            delivery,
            state_kv,
            settings_kv,
            runs: Mutex::new(HashMap::new()),
            ended: Mutex::new(ended::EndedRuns::default()),
            chat_settings: Mutex::new(HashMap::new()),
            events_tx: broadcast::channel(1024).0,
            interrupted: AtomicUsize::new(0),
            marker_scan: tokio::sync::Mutex::new(None),
        }
    }

    /// Forgets what this replica holds in memory of the runs an erasure removed: the
    /// projections of open runs and the answers of runs that just ended (their events,
    /// delivery states and markers went with the erasure).
    pub fn forget_erased(&self, erased: &streamgate_bus::erase::Erased) {
        lock(&self.runs).retain(|(tenant, run), _| !erased.covers(tenant, run));
        lock(&self.ended).forget(erased);
    }

    /// Runs this replica's crash recovery settled as "agent interrupted" so far.
    pub fn interrupted(&self) -> usize {
        self.interrupted.load(Ordering::Relaxed)
    }

    /// The partition of a run from its subject (or, should the subject not parse, from
    /// its id).
    fn partition_of(&self, subject: &str, run_id: &str) -> u32 {
        RunAddr::parse_subject(subject).map_or_else(
            |_| partition_of(run_id, self.cfg.partitions),
            |a| a.partition,
        )
    }

    /// The channel's configuration.
    pub fn config(&self) -> &ChannelConfig {
        &self.cfg
    }

    /// The tier the projection renders for.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The JetStream context (for replays from `SG_EVENTS`).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// A run that ended on this replica within the last hour (1024 runs at most):
    /// `run_id` of `tenant`, or with an empty `tenant` the only tenant's run of that id.
    pub fn ended_run(&self, tenant: &str, run_id: &str) -> Lookup<(RunKey, EndedRun)> {
        lock(&self.ended).get(tenant, run_id)
    }

    /// The runs that ended here recently ([`ended::EndedRuns`]'s bounds).
    pub fn ended_runs(&self) -> Vec<(RunKey, EndedRun)> {
        lock(&self.ended).all()
    }

    /// Live events after the channel processed them (for `Subscribe`).
    pub fn subscribe_events(&self) -> broadcast::Receiver<Arc<RunEvent>> {
        self.events_tx.subscribe()
    }
}

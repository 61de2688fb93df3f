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

use crate::config::ChannelConfig;
use crate::error::{nats, ProjectorError};
use crate::kv::{self, ActiveRun, SettingsOverride, StoredOverride};
use async_nats::jetstream::kv as kv_watch;
use async_nats::jetstream::{self, kv::Store};
use futures::FutureExt as _;
use futures::StreamExt as _;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use streamgate_bus::lease::PartitionWork;
use streamgate_bus::subject::{partition_of, RunAddr};
use streamgate_bus::{consume, events, trace, EVENTS_STREAM};
use streamgate_grammar::RunEvent;
use streamgate_projection::{Op, RunProjection, Settings, Tier};
use streamgate_sinks::{ChatTarget, Delivery, StateStore};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// What the channel knows about one run in flight.
struct RunEntry {
    proj: RunProjection,
    marker: ActiveRun,
    /// Draft text as last rendered ("" before the first draft or after a dismiss).
    draft: String,
    /// The run's partition: its entry goes when this replica gives the partition up.
    partition: u32,
}

/// How long a released partition waits for the engine to execute what it queued, so
/// the next owner's re-submitted ops do not race ours; bounded because a chat in a long
/// `retry_after` must not hold the handover forever. On shutdown the engine closes
/// after its own short grace, which ends this wait sooner.
const HANDOVER_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// Which runs a recovery pass ([`Channel::recover`]) looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The periodic orphan sweep: only runs in flight on this replica.
    Sweep,
    /// A partition this replica just acquired: every active-run marker of it.
    Partition {
        /// The partition.
        partition: u32,
        /// When the lease was acquired: a marker scan started after it is complete
        /// for the partition (its previous owner had stopped), so one scan serves the
        /// partitions acquired together.
        acquired: Instant,
    },
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
    /// Chat it renders into.
    pub chat_id: String,
    /// Rendered draft text.
    pub text: String,
    /// Highest event seq rendered.
    pub last_seq: u64,
    /// The run settled.
    pub settled: bool,
}

/// A chat's effective settings and the `SG_SETTINGS` revision they were derived from.
struct CachedSettings {
    settings: Settings,
    revision: u64,
}

/// One channel's projector. Cheap to share (`Arc`); the gRPC and web servers read it.
pub struct Channel {
    cfg: ChannelConfig,
    tier: Tier,
    js: jetstream::Context,
    delivery: Delivery,
    state_kv: Store,
    settings_kv: Store,
    store: Arc<dyn StateStore>,
    runs: Mutex<HashMap<String, RunEntry>>,
    /// Lock order: `runs` before `chat_settings` wherever both are held.
    chat_settings: Mutex<HashMap<String, CachedSettings>>,
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

/// A run rebuilt from its events in `SG_EVENTS`: the projection, its draft text, and
/// the ops to hand to the engine again — every durable op (final, settle, notice, …) in
/// order plus the newest draft. Re-submitting is safe because the sinks skip what the KV
/// delivery state says is done (`final_delivered`, `settled`, `notices_sent`, same draft
/// text), and it is what delivers an op that was queued but not executed before a crash.
struct Rebuilt {
    proj: RunProjection,
    draft: String,
    resubmit: Vec<Op>,
}

fn rebuild<'a>(
    run_id: &str,
    events: impl IntoIterator<Item = &'a RunEvent>,
    settings: &Settings,
    tier: Tier,
) -> Rebuilt {
    let mut proj = RunProjection::new(run_id);
    let mut draft = String::new();
    let mut resubmit: Vec<Op> = Vec::new();
    for ev in events {
        let ops = proj.apply_run_event(ev, settings, tier);
        track_draft(&mut draft, &ops);
        for op in ops {
            match op {
                Op::Typing => {}
                Op::Draft { .. } => {
                    resubmit.retain(|o| !matches!(o, Op::Draft { .. }));
                    resubmit.push(op);
                }
                _ => resubmit.push(op),
            }
        }
    }
    Rebuilt {
        proj,
        draft,
        resubmit,
    }
}

fn track_draft(draft: &mut String, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Draft { text, .. } | Op::Settle { text, .. } => text.clone_into(draft),
            Op::Dismiss { .. } => draft.clear(),
            Op::Retract { placeholder, .. } => placeholder.clone_into(draft),
            _ => {}
        }
    }
}

impl Channel {
    /// A channel over an engine that already has the channel's sink registered, with
    /// the KV buckets opened.
    pub fn new(
        cfg: ChannelConfig,
        tier: Tier,
        js: jetstream::Context,
        delivery: Delivery,
        state_kv: Store,
        settings_kv: Store,
    ) -> Channel {
        Channel {
            store: Arc::new(kv::KvStateStore::new(state_kv.clone())),
            cfg,
            tier,
            js,
            delivery,
            state_kv,
            settings_kv,
            runs: Mutex::new(HashMap::new()),
            chat_settings: Mutex::new(HashMap::new()),
            events_tx: broadcast::channel(1024).0,
            interrupted: AtomicUsize::new(0),
            marker_scan: tokio::sync::Mutex::new(None),
        }
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

    /// Forgets the runs of a partition this replica no longer holds.
    fn drop_partition(&self, partition: u32) {
        lock(&self.runs).retain(|_, e| e.partition != partition);
    }

    /// Every active-run marker of the channel, from a scan that started after
    /// `since` (reusing the last scan when it did).
    async fn markers_since(&self, since: Instant) -> Result<Arc<Vec<ActiveRun>>, ProjectorError> {
        let mut cache = self.marker_scan.lock().await;
        if let Some((at, markers)) = cache.as_ref() {
            if *at >= since {
                return Ok(markers.clone());
            }
        }
        let at = Instant::now();
        let markers = Arc::new(kv::list_active(&self.state_kv, &self.cfg.name).await?);
        *cache = Some((at, markers.clone()));
        Ok(markers)
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

    /// Live events after the channel processed them (for `Subscribe`).
    pub fn subscribe_events(&self) -> broadcast::Receiver<Arc<RunEvent>> {
        self.events_tx.subscribe()
    }

    /// Runs in flight on this channel's partitions held by this replica.
    pub fn active_runs(&self) -> Vec<ActiveRunInfo> {
        let mut v: Vec<_> = lock(&self.runs)
            .values()
            .map(|e| ActiveRunInfo {
                run_id: e.marker.run_id.clone(),
                tenant: e.marker.tenant.clone(),
                chat_id: e.marker.chat_id.clone(),
                session_key: e.marker.session_key.clone(),
                last_seq: e.proj.last_seq(),
                subject: e.marker.subject.clone(),
            })
            .collect();
        v.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        v
    }

    /// The run's current draft, if the run is in flight here (on a partition this
    /// replica holds).
    pub fn draft(&self, run_id: &str) -> Option<DraftInfo> {
        lock(&self.runs).get(run_id).map(|e| DraftInfo {
            chat_id: e.marker.chat_id.clone(),
            text: e.draft.clone(),
            last_seq: e.proj.last_seq(),
            settled: e.proj.is_settled(),
        })
    }

    /// The chat's settings: channel defaults overridden by `SG_SETTINGS`.
    pub async fn settings_for(&self, chat: &str) -> Result<Settings, ProjectorError> {
        if let Some(c) = lock(&self.chat_settings).get(chat) {
            return Ok(c.settings.clone());
        }
        let stored = kv::load_override(&self.settings_kv, &self.cfg.name, chat).await?;
        let mut cache = lock(&self.chat_settings);
        // The watch may have cached a newer value while this one was loading.
        let c = cache
            .entry(chat.to_owned())
            .or_insert_with(|| CachedSettings {
                settings: stored.overrides.apply(&self.cfg.settings),
                revision: stored.revision,
            });
        if c.revision < stored.revision {
            c.settings = stored.overrides.apply(&self.cfg.settings);
            c.revision = stored.revision;
        }
        Ok(c.settings.clone())
    }

    /// Stores the chat's `/reasoning` / `/verbose` (`None` = unchanged) and re-renders
    /// its runs in flight (`resettle`: rendering only, events untouched); the other
    /// replicas follow through their settings watch. Returns the new settings and how
    /// many runs of the chat are in flight here (each re-rendered, by this call or by
    /// the watch that saw the same write first).
    pub async fn set_settings(
        &self,
        chat: &str,
        o: SettingsOverride,
    ) -> Result<(Settings, u32), ProjectorError> {
        // Compare-and-set: two replicas changing different flags at once both win.
        let (stored, revision) = loop {
            let current = kv::load_override(&self.settings_kv, &self.cfg.name, chat).await?;
            let mut stored = current.overrides;
            if o.reasoning.is_some() {
                stored.reasoning = o.reasoning;
            }
            if o.verbose.is_some() {
                stored.verbose = o.verbose;
            }
            if let Some(rev) = kv::save_override(
                &self.settings_kv,
                &self.cfg.name,
                chat,
                &stored,
                current.revision,
            )
            .await?
            {
                break (stored, rev);
            }
        };
        let settings = stored.apply(&self.cfg.settings);
        self.apply_settings(
            chat,
            StoredOverride {
                overrides: stored,
                revision,
            },
        )
        .await?;
        let n = lock(&self.runs)
            .values()
            .filter(|e| e.marker.chat_id == chat)
            .count();
        Ok((settings, u32::try_from(n).unwrap_or(u32::MAX)))
    }

    /// Caches `stored` as the chat's settings unless a newer revision is cached already,
    /// and re-renders the chat's runs in flight when the settings changed. Returns how
    /// many runs were re-rendered.
    async fn apply_settings(
        &self,
        chat: &str,
        stored: StoredOverride,
    ) -> Result<usize, ProjectorError> {
        let settings = stored.overrides.apply(&self.cfg.settings);
        let mut batches = Vec::new();
        {
            // Under the runs lock, so no event is folded between the cache update and
            // the re-render with settings older than either.
            let mut runs = lock(&self.runs);
            {
                let mut cache = lock(&self.chat_settings);
                match cache.get_mut(chat) {
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
                            chat.to_owned(),
                            CachedSettings {
                                settings: settings.clone(),
                                revision: stored.revision,
                            },
                        );
                    }
                }
            }
            for e in runs.values_mut().filter(|e| e.marker.chat_id == chat) {
                let ops = e.proj.resettle(&settings, self.tier);
                track_draft(&mut e.draft, &ops);
                batches.push(ops);
            }
        }
        let n = batches.len();
        let target = ChatTarget::new(&self.cfg.name, chat);
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
            .watch_with_history(format!("{}.*", streamgate_bus::kv::token(&self.cfg.name)))
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
                    let Some(chat) = kv::chat_of_settings_key(&self.cfg.name, &entry.key) else {
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
                    match self.apply_settings(&chat, stored).await {
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

    /// The run's events currently in `SG_EVENTS` (ordered read of its subject).
    pub async fn read_run(&self, subject: &str) -> Result<Vec<RunEvent>, ProjectorError> {
        let msgs = consume::read_subject(&self.js, EVENTS_STREAM, subject).await?;
        let mut out = Vec::with_capacity(msgs.len());
        for m in msgs {
            match events::decode_msg(&m) {
                Ok(evs) => out.extend(evs),
                // A malformed message cannot be rendered; skipping it keeps the rest.
                Err(e) => tracing::warn!(subject, error = %e, "undecodable event skipped"),
            }
        }
        Ok(out)
    }

    /// Crash recovery (spec §7.3) over this channel's active-run markers, of the runs
    /// `scope` names:
    /// - a run without a terminal event whose last event is older than `orphan_after` is
    ///   orphaned: its open draft settles to "agent interrupted" (the final is never
    ///   re-sent) and its marker goes;
    /// - for a partition just acquired, every other marked run is rebuilt from
    ///   `SG_EVENTS` and its durable ops are handed to the engine again — a final or
    ///   settle that was acked but not executed before the crash (or before the
    ///   partition moved) is delivered now, once (the KV state skips the rest); ended
    ///   runs then lose their marker, live ones continue in memory.
    ///
    /// Returns how many runs were settled as interrupted.
    pub async fn recover(&self, scope: Recovery) -> Result<usize, ProjectorError> {
        let (markers, startup) = match scope {
            Recovery::Sweep => (
                kv::list_active(&self.state_kv, &self.cfg.name).await?,
                false,
            ),
            Recovery::Partition {
                partition,
                acquired,
            } => {
                let all = self.markers_since(acquired).await?;
                let mine = all
                    .iter()
                    .filter(|m| self.partition_of(&m.subject, &m.run_id) == partition)
                    .cloned()
                    .collect();
                (mine, true)
            }
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let orphan_ms = i64::try_from(self.cfg.orphan_after.as_millis()).unwrap_or(i64::MAX);
        let mut interrupted = 0;
        for m in markers {
            if !startup && !lock(&self.runs).contains_key(&m.run_id) {
                // Ended here and waiting for its flush, on another replica's partition,
                // or owned by a previous life: only the pass of an acquired partition
                // touches those.
                continue;
            }
            let events = self.read_run(&m.subject).await?;
            let ended = events.last().is_some_and(|e| e.event.is_terminal());
            let stale = events
                .last()
                .is_none_or(|l| now_ms.saturating_sub(l.envelope.ts_ms) >= orphan_ms);
            let target = ChatTarget::new(&self.cfg.name, &m.chat_id);
            if !ended && stale {
                let state =
                    self.store
                        .load(&m.state_key())
                        .await
                        .map_err(|e| ProjectorError::Nats {
                            op: "load delivery state",
                            detail: e.0,
                        })?;
                let settings = self.settings_for(&m.chat_id).await?;
                let in_memory = lock(&self.runs).remove(&m.run_id).map(|e| e.proj);
                let mut proj = in_memory
                    .unwrap_or_else(|| rebuild(&m.run_id, &events, &settings, self.tier).proj);
                if state.is_some_and(|s| !s.settled && !s.dismissed) {
                    for op in proj.interrupted() {
                        self.delivery.submit(target.clone(), op).await?;
                    }
                    if !self.delivery.flush_run(&target, &m.run_id).await {
                        // Shutting down: the marker stays, the next owner settles it.
                        continue;
                    }
                    interrupted += 1;
                    tracing::info!(run = %m.run_id, chat = %m.chat_id, "orphaned draft settled: agent interrupted");
                }
                kv::delete_active(&self.state_kv, &m).await?;
                continue;
            }
            if !startup {
                continue;
            }
            let settings = self.settings_for(&m.chat_id).await?;
            let rebuilt = rebuild(&m.run_id, &events, &settings, self.tier);
            for op in rebuilt.resubmit {
                self.delivery.submit(target.clone(), op).await?;
            }
            if ended {
                // As in `process`: the marker goes once the engine executed the run's
                // ops, in a task so a slow chat (429s) does not hold up the start.
                forget_when_delivered(self.delivery.clone(), self.state_kv.clone(), target, m);
            } else {
                let partition = self.partition_of(&m.subject, &m.run_id);
                lock(&self.runs).insert(
                    m.run_id.clone(),
                    RunEntry {
                        proj: rebuilt.proj,
                        marker: m,
                        draft: rebuilt.draft,
                        partition,
                    },
                );
            }
        }
        self.interrupted.fetch_add(interrupted, Ordering::Relaxed);
        Ok(interrupted)
    }

    /// Processes one event: rebuild the run if it is new here, fold, submit the ops,
    /// and return: the event may then be acked (the active-run marker written before
    /// the first op makes anything queued but unexecuted recoverable).
    pub async fn process(&self, ev: RunEvent, subject: &str) -> Result<(), ProjectorError> {
        let env = &ev.envelope;
        if !self.cfg.accepts(&env.tenant, env.session_key.as_deref()) {
            return Ok(());
        }
        let run_id = env.run_id.clone();
        let known = lock(&self.runs).contains_key(&run_id);
        let chat = self.cfg.chat_for(env.session_key.as_deref());
        let settings = self.settings_for(&chat).await?;
        if !known {
            let marker = ActiveRun {
                channel: self.cfg.name.clone(),
                chat_id: chat.clone(),
                run_id: run_id.clone(),
                tenant: env.tenant.clone(),
                session_key: env.session_key.clone(),
                subject: subject.to_owned(),
            };
            let rebuilt = if ev.event.seq > 1 {
                // Restart or redelivery: rebuild from the run's earlier messages —
                // DESIGN §4 — and hand their durable ops over again (idempotent).
                let earlier: Vec<RunEvent> = self
                    .read_run(subject)
                    .await?
                    .into_iter()
                    .filter(|e| e.event.seq < ev.event.seq)
                    .collect();
                rebuild(&run_id, &earlier, &settings, self.tier)
            } else {
                rebuild(&run_id, [], &settings, self.tier)
            };
            // The marker goes first: from here on a crash leaves a trace recovery finds.
            kv::put_active(&self.state_kv, &marker).await?;
            let target = ChatTarget::new(&self.cfg.name, &chat);
            for op in rebuilt.resubmit {
                self.delivery.submit(target.clone(), op).await?;
            }
            lock(&self.runs).insert(
                run_id.clone(),
                RunEntry {
                    proj: rebuilt.proj,
                    marker,
                    draft: rebuilt.draft,
                    partition: self.partition_of(subject, &run_id),
                },
            );
        }
        let (ops, done, marker) = {
            let mut runs = lock(&self.runs);
            let Some(e) = runs.get_mut(&run_id) else {
                return Ok(());
            };
            // The cache as of now: a settings change that landed since `settings` was
            // read has already re-rendered this run, and must not be undone.
            let settings = lock(&self.chat_settings)
                .get(&chat)
                .map_or(settings, |c| c.settings.clone());
            let ops = e.proj.apply_run_event(&ev, &settings, self.tier);
            track_draft(&mut e.draft, &ops);
            (
                ops,
                e.proj.is_settled() || ev.event.is_terminal(),
                e.marker.clone(),
            )
        };
        let target = ChatTarget::new(&self.cfg.name, &chat);
        for op in ops {
            self.delivery.submit(target.clone(), op).await?;
        }
        // No receivers is fine: nobody is subscribed.
        let _ = self.events_tx.send(Arc::new(ev));
        if done {
            lock(&self.runs).remove(&run_id);
            // The marker is what lets a restarted projector finish the run's final and
            // settle, so it goes only once the engine has executed them (this run's ops
            // only: another chat's backlog does not keep it).
            forget_when_delivered(self.delivery.clone(), self.state_kv.clone(), target, marker);
        }
        Ok(())
    }

    /// [`Channel::process`] for each event of one message, stopping at the first error.
    async fn process_all(&self, evs: Vec<RunEvent>, subject: &str) -> Result<(), ProjectorError> {
        for ev in evs {
            self.process(ev, subject).await?;
        }
        Ok(())
    }

    /// Works on one partition this replica holds the lease of, until it is released
    /// (or, on a lost lease, the task is aborted): recovery of the partition's marked
    /// runs, then its durable consumer `sg-projector-<channel>-pNN` from the ack floor
    /// its previous owner left. Each message is acked after [`Channel::process`] took
    /// all its events (a redelivered batch re-applies nothing: the projection skips seqs
    /// it has seen); a message that cannot be decoded is terminated (it would never
    /// decode on redelivery).
    ///
    /// On release, messages already received are processed too and the engine gets a
    /// bounded time to execute what was queued, so the next owner starts after it.
    /// However the worker ends, the partition's runs leave memory.
    pub async fn run_partition(self: Arc<Self>, work: PartitionWork) -> Result<(), ProjectorError> {
        let partition = work.partition;
        let acquired = Instant::now();
        let _forget = ForgetPartition {
            channel: self.clone(),
            partition,
        };
        let interrupted = self
            .recover(Recovery::Partition {
                partition,
                acquired,
            })
            .await?;
        if interrupted > 0 {
            tracing::info!(
                partition,
                interrupted,
                "orphaned runs settled on acquiring the partition"
            );
        }
        // The channel's backpressure bound, split over the partitions.
        let max_ack_pending = (10_000 / i64::from(self.cfg.partitions.max(1))).max(256);
        // A channel upgraded from its single shared consumer resumes where that one was
        // acknowledged, not at the start of SG_EVENTS.
        let start =
            consume::start_after_legacy(&self.js, EVENTS_STREAM, &self.cfg.durable_name()).await?;
        let consumer = consume::durable_pull_from(
            &self.js,
            EVENTS_STREAM,
            &self.cfg.partition_durable(partition),
            vec![self.cfg.partition_filter(partition)],
            self.cfg.ack_wait,
            max_ack_pending,
            start,
        )
        .await?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(nats("consumer messages"))?;
        loop {
            let next = tokio::select! {
                biased;
                () = work.release.cancelled() => break,
                n = messages.next() => n,
            };
            let Some(msg) = next else {
                // The consumer ended (deleted?): the lease supervisor starts us again.
                return Ok(());
            };
            self.handle_message(msg).await;
        }
        while let Some(Some(msg)) = messages.next().now_or_never() {
            self.handle_message(msg).await;
        }
        drop(messages);
        if tokio::time::timeout(HANDOVER_FLUSH_LIMIT, self.delivery.flush())
            .await
            .is_err()
        {
            tracing::warn!(
                partition,
                "ops still queued at handover; the next owner re-submits them"
            );
        }
        Ok(())
    }

    /// One `SG_EVENTS` message: decode, process every event, ack (or leave it for
    /// redelivery).
    async fn handle_message(
        &self,
        msg: Result<jetstream::Message, jetstream::consumer::pull::MessagesError>,
    ) {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "consumer error");
                return;
            }
        };
        let evs = match events::decode_msg(&msg) {
            Ok(evs) => evs,
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "undecodable message terminated");
                let _ = msg.ack_with(jetstream::AckKind::Term).await;
                return;
            }
        };
        if let Err(e) = RunAddr::parse_subject(&msg.subject) {
            tracing::warn!(subject = %msg.subject, error = %e, "event on a foreign subject");
        }
        let subject = msg.subject.to_string();
        let span =
            streamgate_runtime::hop_span!("project", channel = %self.cfg.name, subject = %subject);
        trace::follow(&span, trace::extract_context(msg.headers.as_ref()));
        let processed = self.process_all(evs, &subject).instrument(span).await;
        match processed {
            Ok(()) => {
                if let Err(e) = msg.ack().await {
                    tracing::warn!(error = %e, "ack failed; the event will be redelivered");
                }
            }
            Err(e) => {
                // Not acked: JetStream redelivers after ack_wait; the rebuild and
                // the KV delivery state make the retry idempotent.
                tracing::warn!(error = %e, "event not processed; leaving it for redelivery");
                let _ = msg
                    .ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
            }
        }
    }
}

/// Removes a run's active-run marker once the engine has executed (or, for good, given
/// up on) every op of the run, in a task. When the engine closes first (shutdown) the
/// marker stays: the next owner of the partition rebuilds the run and delivers what is
/// left, the KV delivery state skipping what is done.
fn forget_when_delivered(delivery: Delivery, kv: Store, target: ChatTarget, marker: ActiveRun) {
    tokio::spawn(async move {
        if !delivery.flush_run(&target, &marker.run_id).await {
            tracing::debug!(run = %marker.run_id.escape_debug(), "engine closed first; active marker kept for recovery");
            return;
        }
        if let Err(e) = kv::delete_active(&kv, &marker).await {
            tracing::warn!(error = %e, "active marker not removed; recovery will clear it");
        }
    });
}

/// Drops a partition's runs from memory when its worker ends, however it ends (a
/// release, an error, or the abort of a lost lease).
struct ForgetPartition {
    channel: Arc<Channel>,
    partition: u32,
}

impl Drop for ForgetPartition {
    fn drop(&mut self) {
        self.channel.drop_partition(self.partition);
    }
}

//! The run table: each event folded into its run's projection and the ops handed to the
//! engine; rebuilding a run from `SG_EVENTS`; the active-run marker removed once the
//! run's ops were executed.

use super::{
    lock, resolve, run_key, ActiveRunInfo, Channel, DraftInfo, EndedRun, Lookup, RunEntry,
};
use crate::error::ProjectorError;
use crate::kv::{self, ActiveRun};
use async_nats::jetstream::kv::Store;
use std::sync::Arc;
use streamgate_grammar::{ids::tenant_or_default, RunEvent};
use streamgate_projection::{Op, RunProjection, Settings, Tier};
use streamgate_sinks::{ChatTarget, Delivery};

/// A run rebuilt from its events in `SG_EVENTS`: the projection, its draft text, and
/// the ops to hand to the engine again — every durable op (final, settle, notice, …) in
/// order plus the newest draft. Re-submitting is safe because the sinks skip what the KV
/// delivery state says is done (`final_delivered`, `settled`, `notices_sent`, same draft
/// text), and it is what delivers an op that was queued but not executed before a crash.
pub(super) struct Rebuilt {
    pub(super) proj: RunProjection,
    pub(super) draft: String,
    pub(super) final_text: Option<String>,
    pub(super) resubmit: Vec<Op>,
}

pub(super) fn rebuild<'a>(
    tenant: &str,
    run_id: &str,
    events: impl IntoIterator<Item = &'a RunEvent>,
    settings: &Settings,
    tier: Tier,
) -> Rebuilt {
    let mut proj = RunProjection::for_run(tenant, run_id);
    let mut draft = String::new();
    let mut final_text = None;
    let mut resubmit: Vec<Op> = Vec::new();
    for ev in events {
        let ops = proj.apply_run_event(ev, settings, tier);
        track_draft(&mut draft, &mut final_text, &ops);
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
        final_text,
        resubmit,
    }
}

/// Applies `ev` and then the run's `later` events (already in `SG_EVENTS`) to `proj`,
/// the draft rendered once after the last of them — or left due for the rest of the
/// message when `batched`.
fn catch_up(
    proj: &mut RunProjection,
    ev: &RunEvent,
    later: &[RunEvent],
    settings: &Settings,
    tier: Tier,
    batched: bool,
) -> Vec<Op> {
    let mut ops = proj.apply_run_event_batched(ev, settings, tier);
    for l in later {
        ops.extend(proj.apply_run_event_batched(l, settings, tier));
    }
    if !batched {
        ops.extend(proj.flush_draft(settings, tier));
    }
    ops
}

pub(super) fn track_draft(draft: &mut String, final_text: &mut Option<String>, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Final { text, .. } => *final_text = Some(text.clone()),
            Op::Draft { text, .. } | Op::Settle { text, .. } => text.clone_into(draft),
            Op::Dismiss { .. } => draft.clear(),
            Op::Retract { placeholder, .. } => placeholder.clone_into(draft),
            _ => {}
        }
    }
}

impl Channel {
    /// Where `tenant`'s chat `chat` of this channel is delivered (no tenant: the default
    /// one, as everywhere).
    pub(super) fn target(&self, tenant: &str, chat: &str) -> ChatTarget {
        ChatTarget::new(tenant_or_default(tenant), &self.cfg.name, chat)
    }

    /// Hands every open run's current draft to the engine again. Telegram drops a native
    /// draft ~30 s after its last update; the sink sends one that is about to expire and
    /// skips the others without a request, so a long tool call does not leave a private
    /// chat empty.
    pub async fn refresh_drafts(&self) {
        let due: Vec<(ChatTarget, Op)> = lock(&self.runs)
            .values()
            .filter(|e| !e.draft.is_empty() && e.final_text.is_none() && !e.proj.is_settled())
            .map(|e| {
                let op = Op::Draft {
                    key: e.proj.key().clone(),
                    text: e.draft.clone(),
                    seq: e.proj.last_seq(),
                    // A refresh shows nothing new: a native stream has nothing to append.
                    live: None,
                };
                (self.target(&e.marker.tenant, &e.marker.chat_id), op)
            })
            .collect();
        for (chat, op) in due {
            if self.delivery.submit(chat, op).await.is_err() {
                return; // the engine closed: shutting down
            }
        }
    }

    /// This channel's finals parked on this replica (their retries ran out), oldest
    /// first.
    pub fn parked(&self) -> Vec<streamgate_sinks::Parked> {
        let mut all = self.delivery.parked();
        all.retain(|p| p.chat.channel == self.cfg.name);
        all
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
        v.sort_by(|a, b| (&a.run_id, &a.tenant).cmp(&(&b.run_id, &b.tenant)));
        v
    }

    /// The current draft of `run_id` of `tenant` (empty: the only tenant's run of that
    /// id), if the run is in flight here (on a partition this replica holds).
    pub fn draft(&self, tenant: &str, run_id: &str) -> Lookup<DraftInfo> {
        let runs = lock(&self.runs);
        let key = match resolve(runs.keys(), tenant, run_id) {
            Lookup::Found(k) => k,
            Lookup::Missing => return Lookup::Missing,
            Lookup::Ambiguous => return Lookup::Ambiguous,
        };
        match runs.get(&key) {
            Some(e) => Lookup::Found(DraftInfo {
                tenant: key.0,
                chat_id: e.marker.chat_id.clone(),
                text: e.draft.clone(),
                last_seq: e.proj.last_seq(),
                settled: e.proj.is_settled(),
            }),
            None => Lookup::Missing,
        }
    }

    /// Processes one event: rebuild the run if it is new here, fold, submit the ops,
    /// and return: the event may then be acked (the active-run marker written before
    /// the first op makes anything queued but unexecuted recoverable).
    pub async fn process(&self, ev: RunEvent, subject: &str) -> Result<(), ProjectorError> {
        self.process_event(ev, subject, false).await
    }

    /// [`Channel::process`]; `batched`: more events of the run follow in the same
    /// message, so a changed draft is left due ([`RunProjection::apply_run_event_batched`]).
    async fn process_event(
        &self,
        ev: RunEvent,
        subject: &str,
        batched: bool,
    ) -> Result<(), ProjectorError> {
        let env = &ev.envelope;
        if !self.cfg.accepts(&env.tenant, env.session_key.as_deref()) {
            return Ok(());
        }
        let run_id = env.run_id.clone();
        let key = run_key(&env.tenant, &run_id);
        let known = lock(&self.runs).contains_key(&key);
        let mut later = Vec::new();
        let chat = self.cfg.chat_for(env.session_key.as_deref());
        let settings = self.settings_for(&env.tenant, &chat).await?;
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
                // docs/architecture.md §4 — and hand their durable ops over again (idempotent).
                let (earlier, after): (Vec<RunEvent>, Vec<RunEvent>) = self
                    .read_run(subject)
                    .await?
                    .into_iter()
                    .filter(|e| e.event.seq != ev.event.seq)
                    .partition(|e| e.event.seq < ev.event.seq);
                // What the run has after this event is applied with it: a message
                // redelivered after its successors were acked (a lost ack, a retry of a
                // failed attempt) would otherwise leave the run waiting for events that
                // never come again — in memory and marked active for good.
                later = after;
                rebuild(&env.tenant, &run_id, &earlier, &settings, self.tier)
            } else {
                rebuild(&env.tenant, &run_id, [], &settings, self.tier)
            };
            // The marker goes first: from here on a crash leaves a trace recovery finds.
            kv::put_active(&self.state_kv, &marker).await?;
            let target = self.target(&env.tenant, &chat);
            for op in rebuilt.resubmit {
                self.delivery.submit(target.clone(), op).await?;
            }
            lock(&self.runs).insert(
                key.clone(),
                RunEntry {
                    proj: rebuilt.proj,
                    marker,
                    draft: rebuilt.draft,
                    final_text: rebuilt.final_text,
                    partition: self.partition_of(subject, &run_id),
                },
            );
        }
        let (ops, done, marker) = {
            let mut runs = lock(&self.runs);
            let Some(e) = runs.get_mut(&key) else {
                return Ok(());
            };
            // The cache as of now: a settings change that landed since `settings` was
            // read has already re-rendered this run, and must not be undone.
            let settings = lock(&self.chat_settings)
                .get(&super::settings::chat_key(&env.tenant, &chat))
                .map_or(settings, |c| c.settings.clone());
            let ops = if later.is_empty() {
                if batched {
                    e.proj.apply_run_event_batched(&ev, &settings, self.tier)
                } else {
                    e.proj.apply_run_event(&ev, &settings, self.tier)
                }
            } else {
                catch_up(&mut e.proj, &ev, &later, &settings, self.tier, batched)
            };
            track_draft(&mut e.draft, &mut e.final_text, &ops);
            let done = e.proj.is_settled()
                || ev.event.is_terminal()
                || later.iter().any(|l| l.event.is_terminal());
            if done {
                lock(&self.ended).insert(
                    key.clone(),
                    EndedRun {
                        chat_id: e.marker.chat_id.clone(),
                        final_text: e.final_text.clone(),
                        ended_at: std::time::SystemTime::now(),
                    },
                );
            }
            (ops, done, e.marker.clone())
        };
        let target = self.target(&env.tenant, &chat);
        if !ops.is_empty() {
            let now_ms = streamgate_runtime::clock::now_ms();
            let ms = now_ms.saturating_sub(ev.envelope.ts_ms).max(0);
            metrics::histogram!("streamgate_projector_event_to_submit_seconds")
                .record(ms as f64 / 1000.0);
        }
        for op in ops {
            self.delivery.submit(target.clone(), op).await?;
        }
        // No receivers is fine: nobody is subscribed.
        let _ = self.events_tx.send(Arc::new(ev));
        if done {
            lock(&self.runs).remove(&key);
            // The marker is what lets a restarted projector finish the run's final and
            // settle, so it goes only once the engine has executed them (this run's ops
            // only: another chat's backlog does not keep it).
            forget_when_delivered(self.delivery.clone(), self.state_kv.clone(), target, marker);
        }
        Ok(())
    }

    /// [`Channel::process`] for each event of one message, stopping at the first error.
    /// The events of one message arrived together: a draft is rendered once for them,
    /// after the last (drafts are latest-wins; nothing waits for a later message).
    pub(super) async fn process_all(
        &self,
        evs: Vec<RunEvent>,
        subject: &str,
    ) -> Result<(), ProjectorError> {
        let last = evs.len().saturating_sub(1);
        // Only a batch can leave a draft due: a single event renders its own.
        let batch = evs.last().filter(|_| last > 0).map(|e| e.envelope.clone());
        for (i, ev) in evs.into_iter().enumerate() {
            self.process_event(ev, subject, i < last).await?;
        }
        if let Some(env) = batch {
            self.flush_draft(&env).await?;
        }
        Ok(())
    }

    /// Renders and submits the draft a batch left due for the run of `env` (nothing when
    /// the last event rendered it, or the run is gone).
    async fn flush_draft(&self, env: &streamgate_grammar::Envelope) -> Result<(), ProjectorError> {
        let key = run_key(&env.tenant, &env.run_id);
        let chat = self.cfg.chat_for(env.session_key.as_deref());
        let settings = self.settings_for(&env.tenant, &chat).await?;
        let ops = {
            let mut runs = lock(&self.runs);
            let Some(e) = runs.get_mut(&key) else {
                return Ok(());
            };
            let ops = e.proj.flush_draft(&settings, self.tier);
            track_draft(&mut e.draft, &mut e.final_text, &ops);
            ops
        };
        let target = self.target(&env.tenant, &chat);
        for op in ops {
            self.delivery.submit(target.clone(), op).await?;
        }
        Ok(())
    }
}

/// Removes a run's active-run marker once the engine has executed (or, for good, given
/// up on) every op of the run, in a task. When the engine closes first (shutdown) the
/// marker stays: the next owner of the partition rebuilds the run and delivers what is
/// left, the KV delivery state skipping what is done.
pub(super) fn forget_when_delivered(
    delivery: Delivery,
    kv: Store,
    target: ChatTarget,
    marker: ActiveRun,
) {
    tokio::spawn(async move {
        let run = marker.draft_key();
        if !delivery.flush_run(&target, &run).await {
            tracing::debug!(run = %marker.run_id.escape_debug(), "engine closed first; active marker kept for recovery");
            return;
        }
        if delivery.is_parked(&target, &run) {
            // The final's retries ran out: the marker stays, so the next start (or the
            // partition's next owner) sends it again.
            return;
        }
        if let Err(e) = kv::delete_active(&kv, &marker).await {
            tracing::warn!(error = %e, "active marker not removed; recovery will clear it");
        }
    });
}

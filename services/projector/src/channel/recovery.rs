//! Crash recovery (spec §7.3): a partition just acquired gets its marked runs rebuilt
//! and their durable ops handed over again; runs whose agent died settle as "agent
//! interrupted".

use super::runs::{forget_when_delivered, rebuild};
use super::{lock, run_key, Channel, RunEntry};
use crate::error::ProjectorError;
use crate::kv::{self, ActiveRun};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use streamgate_bus::{consume, events, EVENTS_STREAM};
use streamgate_grammar::RunEvent;

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

impl Channel {
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

    /// Sends this channel's parked finals again (an operator's `ResendParked`): each run
    /// is rebuilt from `SG_EVENTS` and its durable ops are handed to the engine once more
    /// (the KV delivery state skips what the chat already has). Its marker goes once the
    /// final is delivered, and stays if it parks again. Returns how many runs were resent.
    pub async fn resend_parked(&self) -> Result<usize, ProjectorError> {
        let parked = self.parked();
        if parked.is_empty() {
            return Ok(0);
        }
        let markers = kv::list_active(&self.state_kv, &self.cfg.name).await?;
        let mut resent = 0;
        for p in parked {
            let Some(m) = markers.iter().find(|m| {
                m.run_id == p.run.run_id && m.tenant == p.run.tenant && m.chat_id == p.chat.chat_id
            }) else {
                continue;
            };
            let events = self.read_run(&m.subject).await?;
            let settings = self.settings_for(&m.tenant, &m.chat_id).await?;
            let rebuilt = rebuild(&m.tenant, &m.run_id, &events, &settings, self.tier);
            for op in rebuilt.resubmit {
                self.delivery.submit(p.chat.clone(), op).await?;
            }
            tracing::info!(run = %m.run_id.escape_debug(), chat = %p.chat, "parked final sent again");
            forget_when_delivered(
                self.delivery.clone(),
                self.state_kv.clone(),
                p.chat.clone(),
                m.clone(),
            );
            resent += 1;
        }
        Ok(resent)
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
        let now_ms = streamgate_runtime::clock::now_ms();
        let orphan_ms = i64::try_from(self.cfg.orphan_after.as_millis()).unwrap_or(i64::MAX);
        let mut interrupted = 0;
        for m in markers {
            let key = run_key(&m.tenant, &m.run_id);
            if !startup && !lock(&self.runs).contains_key(&key) {
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
            let target = self.target(&m.tenant, &m.chat_id);
            if !ended && stale {
                let state =
                    self.store
                        .load(&m.state_key())
                        .await
                        .map_err(|e| ProjectorError::Nats {
                            op: "load delivery state",
                            detail: e.0,
                        })?;
                let settings = self.settings_for(&m.tenant, &m.chat_id).await?;
                let in_memory = lock(&self.runs).remove(&key).map(|e| e.proj);
                let mut proj = in_memory.unwrap_or_else(|| {
                    rebuild(&m.tenant, &m.run_id, &events, &settings, self.tier).proj
                });
                if state.is_some_and(|s| !s.settled && !s.dismissed) {
                    for op in proj.interrupted() {
                        self.delivery.submit(target.clone(), op).await?;
                    }
                    if !self.delivery.flush_run(&target, &m.draft_key()).await {
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
            let settings = self.settings_for(&m.tenant, &m.chat_id).await?;
            let rebuilt = rebuild(&m.tenant, &m.run_id, &events, &settings, self.tier);
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
                    key,
                    RunEntry {
                        proj: rebuilt.proj,
                        marker: m,
                        draft: rebuilt.draft,
                        final_text: rebuilt.final_text,
                        partition,
                    },
                );
            }
        }
        self.interrupted.fetch_add(interrupted, Ordering::Relaxed);
        Ok(interrupted)
    }
}

//! `Watch`: every run this replica projects, as one stream — so a watcher (`streamgate
//! tail`) sees a run from its first event even when it starts and ends within a
//! millisecond, with no polling gap.
//!
//! Same boundary rule as `Subscribe`: the live broadcast is joined *before* the active
//! runs are read back, and each run's events pass only at exactly its next seq; a gap (a
//! run first met mid-way) or a lagging broadcast re-reads the run from `SG_EVENTS`.

use crate::channel::{Channel, RunKey};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use streamgate_bus::subject::RunAddr;
use streamgate_grammar::RunEvent;
use streamgate_projection::EventRedactor;
use streamgate_proto::v1;
use tokio::sync::{broadcast, mpsc};
use tonic::Status;

/// What a watcher already has: per run, the last seq it rendered.
#[derive(Debug, Default)]
pub(super) struct AfterSeq {
    /// Deprecated: per run id, for that run id under every tenant.
    pub(super) by_run_id: HashMap<String, u64>,
    /// Per run (tenant, run id); wins over `by_run_id`.
    pub(super) by_run: HashMap<RunKey, u64>,
}

impl AfterSeq {
    fn get(&self, run: &RunKey) -> u64 {
        self.by_run
            .get(run)
            .or_else(|| self.by_run_id.get(&run.1))
            .copied()
            .unwrap_or(0)
    }
}

/// The run of an event.
fn key_of(ev: &RunEvent) -> RunKey {
    (ev.envelope.tenant.clone(), ev.envelope.run_id.clone())
}

/// How many ended runs are remembered, so a late duplicate of theirs is not taken for a
/// new run.
const ENDED_MEMORY: usize = 4096;

/// One watcher's view: each open run's next seq and subject.
struct Watcher {
    channel: Arc<Channel>,
    /// What the watcher already has, per run (a run recovered after the watch began
    /// resumes after it).
    after_seq: AfterSeq,
    tx: mpsc::Sender<Result<v1::Event, Status>>,
    open: HashMap<RunKey, (u64, String)>,
    /// Per open run: its display-safe event redactor.
    redactors: HashMap<RunKey, EventRedactor>,
    ended: HashSet<RunKey>,
    ended_order: VecDeque<RunKey>,
}

/// Why sending stopped.
struct Gone;

impl Watcher {
    /// The run's subject on SG_EVENTS. `None` for ids that break the id rule, which no
    /// event has: its ids came off a subject that was checked as it was parsed.
    fn subject_of(&self, ev: &RunEvent) -> Option<String> {
        RunAddr::parse(
            &ev.envelope.tenant,
            &ev.envelope.run_id,
            self.channel.config().partitions,
        )
        .ok()
        .map(|addr| addr.events_subject())
    }

    /// Sends `ev`, display-safe, if it is its run's next event (an earlier one only
    /// primes the run's redactor: the watcher resumed after it).
    async fn pass(&mut self, ev: &RunEvent) -> Result<(), Gone> {
        let run = &key_of(ev);
        let Some((next, _)) = self.open.get_mut(run) else {
            return Ok(());
        };
        let redactor = self.redactors.entry(run.clone()).or_default();
        if ev.event.seq < *next {
            let _ = redactor.apply(&ev.event);
            return Ok(());
        }
        if ev.event.seq != *next {
            return Ok(());
        }
        *next += 1;
        let end = ev.event.is_terminal();
        let Some(safe) = super::display_safe(redactor, ev) else {
            return Ok(());
        };
        self.tx.send(Ok(safe)).await.map_err(|_| Gone)?;
        if end {
            self.end(key_of(ev));
        }
        Ok(())
    }

    fn end(&mut self, run: RunKey) {
        self.open.remove(&run);
        self.redactors.remove(&run);
        if self.ended.insert(run.clone()) {
            self.ended_order.push_back(run);
            if self.ended_order.len() > ENDED_MEMORY {
                if let Some(old) = self.ended_order.pop_front() {
                    self.ended.remove(&old);
                }
            }
        }
    }

    /// Sends what `SG_EVENTS` holds of `run` from its next seq on.
    async fn reread(&mut self, run: &RunKey) -> Result<(), Gone> {
        let Some((_, subject)) = self.open.get(run) else {
            return Ok(());
        };
        let events = match self.channel.read_run(subject).await {
            Ok(evs) => evs,
            Err(e) => {
                tracing::warn!(tenant = %run.0, run = %run.1, error = %e, "watch: run not re-read");
                return Ok(());
            }
        };
        for ev in &events {
            self.pass(ev).await?;
        }
        Ok(())
    }

    /// One live event: a new run is opened at seq 1; a gap is filled from the stream.
    async fn live(&mut self, ev: &RunEvent) -> Result<(), Gone> {
        let run = key_of(ev);
        if self.ended.contains(&run) {
            return Ok(());
        }
        if !self.open.contains_key(&run) {
            let Some(subject) = self.subject_of(ev) else {
                return Ok(());
            };
            let next = self.after_seq.get(&run) + 1;
            self.open.insert(run.clone(), (next, subject));
        }
        let next = self.open.get(&run).map_or(1, |(n, _)| *n);
        if ev.event.seq > next {
            return self.reread(&run).await;
        }
        self.pass(ev).await
    }
}

/// Streams every run's events into `tx` until the watcher goes away or the broadcast
/// closes. `after_seq` gives, per run, the last seq the watcher already has.
pub(super) async fn watch(
    channel: Arc<Channel>,
    after_seq: AfterSeq,
    mut live: broadcast::Receiver<Arc<RunEvent>>,
    tx: mpsc::Sender<Result<v1::Event, Status>>,
) {
    let mut w = Watcher {
        open: channel
            .active_runs()
            .into_iter()
            .map(|r| {
                let key = (r.tenant, r.run_id);
                let next = after_seq.get(&key) + 1;
                (key, (next, r.subject))
            })
            .collect(),
        channel,
        after_seq,
        tx,
        redactors: HashMap::new(),
        ended: HashSet::new(),
        ended_order: VecDeque::new(),
    };
    let active: Vec<RunKey> = w.open.keys().cloned().collect();
    for run in active {
        if w.reread(&run).await.is_err() {
            return;
        }
    }
    loop {
        let step = match live.recv().await {
            Ok(ev) => w.live(&ev).await,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::debug!(skipped = n, "watch lagged: re-reading open runs");
                let open: Vec<RunKey> = w.open.keys().cloned().collect();
                let mut r = Ok(());
                for run in open {
                    r = w.reread(&run).await;
                    if r.is_err() {
                        break;
                    }
                }
                r
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if step.is_err() {
            return;
        }
    }
}

//! The table of runs in flight: one [`Normalizer`] per run, fed raw chunks in order.
//!
//! A run's adapter state is a pure function of its raw chunks, so state is disposable:
//! a run that is not in memory (after a restart, after eviction under memory pressure,
//! or when a chunk arrives out of order) is rebuilt by re-reading its earlier chunks
//! from SG_RAW. Every event the rebuild yields is published again; that is safe because
//! events are keyed `<run>/<seq>` and every consumer is idempotent on that key, and it is
//! necessary because a rebuilt prefix may contain chunks whose events never made it out.

use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};
use streamgate_bus::raw::{CloseKind, RawChunk};
use streamgate_bus::subject::RunAddr;
use streamgate_grammar::{Envelope, RunEvent};
use streamgate_wire::{Close, FamilyChoice, Normalizer};

/// Key of a run: tenant and run id.
pub type RunKey = (String, String);

/// What applying a chunk did.
#[derive(Debug)]
pub enum Applied {
    /// The chunk was consumed; these events are new (may be empty).
    Events(Vec<RunEvent>),
    /// The chunk was already applied (or the run is closed): acknowledge and move on.
    Duplicate,
    /// The run must be rebuilt from SG_RAW before this chunk can be applied.
    NeedsRebuild,
}

struct OpenRun {
    addr: RunAddr,
    session_key: Option<String>,
    normalizer: Normalizer,
    next_chunk: u64,
    last_seen: Instant,
    timeout_requested: bool,
}

/// A run not in memory that still needs an idle timeout (evicted, or known only from
/// its last chunk).
struct Dormant {
    addr: RunAddr,
    session_key: Option<String>,
    family: String,
    next_chunk: u64,
    last_seen: Instant,
    timeout_requested: bool,
}

/// Runs in flight, bounded in number.
pub struct RunTable {
    open: HashMap<RunKey, OpenRun>,
    dormant: HashMap<RunKey, Dormant>,
    /// Recently closed runs, to ignore late duplicates without rebuilding.
    closed: HashSet<RunKey>,
    closed_order: VecDeque<RunKey>,
    max_open: usize,
    max_closed: usize,
}

fn family_of(chunk: &RawChunk) -> FamilyChoice {
    // An unknown family header still gets normalized: detection decides.
    chunk.family.parse().unwrap_or(FamilyChoice::Auto)
}

fn close_of(kind: CloseKind) -> Close {
    match kind {
        CloseKind::Normal => Close::Normal,
        CloseKind::Abnormal => Close::Abnormal,
        CloseKind::Timeout => Close::Timeout,
    }
}

impl RunTable {
    /// A table holding at most `max_open` runs' adapter state in memory.
    pub fn new(max_open: usize) -> RunTable {
        RunTable {
            open: HashMap::new(),
            dormant: HashMap::new(),
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            max_open: max_open.max(1),
            max_closed: 100_000,
        }
    }

    /// Runs with adapter state in memory.
    pub fn open_runs(&self) -> usize {
        self.open.len()
    }

    /// Applies one chunk that arrived from the consumer.
    pub fn apply(&mut self, chunk: &RawChunk) -> Applied {
        let key = (chunk.addr.tenant.clone(), chunk.addr.run_id.clone());
        if self.closed.contains(&key) {
            return Applied::Duplicate;
        }
        let Some(run) = self.open.get_mut(&key) else {
            if chunk.chunk == 0 {
                self.start(key.clone(), chunk);
                return self.apply(chunk);
            }
            return Applied::NeedsRebuild;
        };
        if chunk.chunk < run.next_chunk {
            return Applied::Duplicate;
        }
        if chunk.chunk > run.next_chunk {
            return Applied::NeedsRebuild;
        }
        run.last_seen = Instant::now();
        let events = Self::feed(run, chunk);
        if chunk.close.is_some() {
            self.open.remove(&key);
            self.dormant.remove(&key);
            self.remember_closed(key);
        }
        Applied::Events(events)
    }

    /// Rebuilds a run from its chunks in SG_RAW (any order, duplicates allowed) up to but
    /// excluding `upto` — or through its close marker when one is stored, which closes the
    /// run — and returns every event they yield (to be re-published), grouped per chunk
    /// as they were first published, so the re-publish carries the same message ids.
    pub fn rebuild(&mut self, upto: &RawChunk, history: Vec<RawChunk>) -> Vec<Vec<RunEvent>> {
        let key = (upto.addr.tenant.clone(), upto.addr.run_id.clone());
        self.open.remove(&key);
        self.dormant.remove(&key);
        // A close marker already in SG_RAW means the run is over, even when it sits after
        // `upto` (a late copy of a middle chunk, e.g. re-published after the dedupe
        // window). Rebuild through the marker so `upto` is then seen as a duplicate;
        // stopping before it would leave the run open and let the idle reaper write a
        // second close marker and a second, conflicting terminal event.
        let limit = history
            .iter()
            .filter(|c| c.close.is_some())
            .map(|c| c.chunk)
            .min()
            .map_or(upto.chunk, |closed_at| upto.chunk.max(closed_at + 1));
        let mut earlier: Vec<RawChunk> = history.into_iter().filter(|c| c.chunk < limit).collect();
        earlier.sort_by_key(|c| c.chunk);
        earlier.dedup_by_key(|c| c.chunk);
        let first = earlier.first().unwrap_or(upto).clone();
        self.start(key.clone(), &first);
        let mut events = Vec::new();
        for c in &earlier {
            let Some(run) = self.open.get_mut(&key) else {
                break;
            };
            if c.chunk != run.next_chunk {
                // A hole in the stream (retention removed it?): the rest cannot be
                // applied faithfully; the current chunk will be applied after it.
                break;
            }
            events.push(Self::feed(run, c));
            if c.close.is_some() {
                self.open.remove(&key);
                self.remember_closed(key.clone());
                break;
            }
        }
        if let Some(run) = self.open.get_mut(&key) {
            // Whatever is missing before `upto` is gone for good; continue from it (but
            // never step back over chunks the rebuild already fed).
            run.next_chunk = run.next_chunk.max(upto.chunk);
        }
        events
    }

    /// Drops everything known about a run (its state got ahead of what was published):
    /// its next chunk, redelivered or new, rebuilds it from SG_RAW.
    pub fn forget(&mut self, key: &RunKey) {
        self.open.remove(key);
        self.dormant.remove(key);
        if self.closed.remove(key) {
            self.closed_order.retain(|k| k != key);
        }
    }

    /// Runs idle for longer than `idle`, whose timeout close marker has not been asked
    /// for yet: returns the close markers to publish (and remembers they were asked).
    pub fn idle_closes(&mut self, idle: Duration, now_ms: i64) -> Vec<RawChunk> {
        let now = Instant::now();
        let mut out = Vec::new();
        for run in self.open.values_mut() {
            if !run.timeout_requested && now.duration_since(run.last_seen) >= idle {
                run.timeout_requested = true;
                out.push(close_marker(
                    &run.addr,
                    run.session_key.clone(),
                    "auto",
                    run.next_chunk,
                    now_ms,
                ));
            }
        }
        for run in self.dormant.values_mut() {
            if !run.timeout_requested && now.duration_since(run.last_seen) >= idle {
                run.timeout_requested = true;
                out.push(close_marker(
                    &run.addr,
                    run.session_key.clone(),
                    &run.family,
                    run.next_chunk,
                    now_ms,
                ));
            }
        }
        out
    }

    fn start(&mut self, key: RunKey, first: &RawChunk) {
        if self.open.len() >= self.max_open {
            self.evict_one();
        }
        self.open.insert(
            key,
            OpenRun {
                addr: first.addr.clone(),
                session_key: first.session_key.clone(),
                normalizer: Normalizer::new(family_of(first)),
                next_chunk: 0,
                last_seen: Instant::now(),
                timeout_requested: false,
            },
        );
    }

    /// Unloads the least recently active run; it stays known for its idle timeout and
    /// is rebuilt from SG_RAW if more chunks arrive.
    fn evict_one(&mut self) {
        let Some(key) = self
            .open
            .iter()
            .min_by_key(|(_, r)| r.last_seen)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        if let Some(run) = self.open.remove(&key) {
            metrics::counter!("sg_normalizer_runs_evicted_total").increment(1);
            self.dormant.insert(
                key,
                Dormant {
                    addr: run.addr,
                    session_key: run.session_key,
                    family: run
                        .normalizer
                        .family()
                        .map_or_else(|| "auto".to_owned(), |f| f.as_str().to_owned()),
                    next_chunk: run.next_chunk,
                    last_seen: run.last_seen,
                    timeout_requested: run.timeout_requested,
                },
            );
        }
    }

    fn remember_closed(&mut self, key: RunKey) {
        if self.closed.insert(key.clone()) {
            self.closed_order.push_back(key);
            while self.closed_order.len() > self.max_closed {
                if let Some(old) = self.closed_order.pop_front() {
                    self.closed.remove(&old);
                }
            }
        }
    }

    fn feed(run: &mut OpenRun, chunk: &RawChunk) -> Vec<RunEvent> {
        run.normalizer.feed(&chunk.body);
        if let Some(kind) = chunk.close {
            run.normalizer.close(close_of(kind));
        }
        run.next_chunk = chunk.chunk + 1;
        let envelope = Envelope {
            tenant: run.addr.tenant.clone(),
            session_key: run.session_key.clone(),
            run_id: run.addr.run_id.clone(),
            ts_ms: chunk.ingest_ts_ms,
        };
        run.normalizer
            .drain()
            .map(|event| RunEvent {
                envelope: envelope.clone(),
                event,
            })
            .collect()
    }
}

/// A close marker for a run (empty body).
pub fn close_marker(
    addr: &RunAddr,
    session_key: Option<String>,
    family: &str,
    chunk: u64,
    now_ms: i64,
) -> RawChunk {
    RawChunk {
        addr: addr.clone(),
        session_key,
        family: family.to_owned(),
        dialect: None,
        chunk,
        ingest_ts_ms: now_ms,
        close: Some(CloseKind::Timeout),
        body: Bytes::new(),
    }
}

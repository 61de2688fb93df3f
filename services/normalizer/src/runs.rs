//! The table of runs in flight: one [`Normalizer`] per run, fed raw chunks in order.
//!
//! A run's adapter state is a pure function of its raw chunks, so state is disposable:
//! a run that is not in memory (after a restart, after eviction under memory pressure,
//! or when a chunk arrives out of order) is rebuilt by re-reading its earlier chunks
//! from SG_RAW. Every event the rebuild yields is published again; that is safe because
//! events are keyed `<tenant>/<run>/<seq>` and every consumer is idempotent on that key, and it is
//! necessary because a rebuilt prefix may contain chunks whose events never made it out.
//!
//! Each held partition has its own table (its worker's); the tables of one process share
//! one [`RunBudget`], so `max_open_runs` bounds the process, however many partitions it
//! holds.

use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use streamgate_bus::raw::{CloseKind, RawChunk};
use streamgate_bus::subject::RunAddr;
use streamgate_grammar::{Envelope, RunEvent};
use streamgate_wire::{Close, Family, FamilyChoice, Normalizer};

/// Key of a run: tenant and run id.
pub type RunKey = streamgate_grammar::ids::RunRef;

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

/// How many runs the tables of one process may keep in memory, shared by all of them.
///
/// A table over budget unloads its own least recently active runs ([`RunTable::trim`]),
/// down to none: the bound holds across partitions even when each holds a single run.
/// Within one batch a table may go over by the runs that batch starts.
#[derive(Debug, Clone)]
pub struct RunBudget {
    max: usize,
    used: Arc<AtomicUsize>,
}

impl RunBudget {
    /// A budget of `max` runs (at least 1).
    pub fn new(max: usize) -> RunBudget {
        RunBudget {
            max: max.max(1),
            used: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Runs in memory across every table sharing this budget.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.max
    }

    fn full(&self) -> bool {
        self.used() >= self.max
    }

    fn take(&self) {
        self.used.fetch_add(1, Ordering::Relaxed);
    }

    fn give(&self, n: usize) {
        // Never below zero, whatever the bookkeeping did.
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            });
    }
}

/// Runs in flight, bounded in number by a [`RunBudget`].
pub struct RunTable {
    open: HashMap<RunKey, OpenRun>,
    dormant: HashMap<RunKey, Dormant>,
    /// Recently closed runs, to ignore late duplicates without rebuilding.
    closed: HashSet<RunKey>,
    closed_order: VecDeque<RunKey>,
    budget: RunBudget,
    max_closed: usize,
    last_family: Option<Family>,
}

impl Drop for RunTable {
    fn drop(&mut self) {
        // A released or lost partition's runs leave memory with its table.
        self.budget.give(self.open.len());
    }
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
    /// A table whose runs count against a budget shared with other tables.
    pub fn with_budget(budget: RunBudget) -> RunTable {
        RunTable {
            open: HashMap::new(),
            dormant: HashMap::new(),
            closed: HashSet::new(),
            closed_order: VecDeque::new(),
            budget,
            max_closed: 100_000,
            last_family: None,
        }
    }

    /// The family of the run the last [`RunTable::apply`] or [`RunTable::rebuild`] fed
    /// (detected, for `auto` runs, once the adapter knows it): what made the events they
    /// returned, stamped on their messages.
    pub fn last_family(&self) -> Option<Family> {
        self.last_family
    }

    /// Runs of this table with adapter state in memory.
    pub fn open_runs(&self) -> usize {
        self.open.len()
    }

    /// Unloads this table's least recently active runs while the shared budget is over
    /// its limit (they are rebuilt from SG_RAW if they continue).
    pub fn trim(&mut self) {
        while self.budget.over() && !self.open.is_empty() {
            self.evict_one();
        }
    }

    /// Takes a run's adapter state out of memory, returning its budget.
    fn unload(&mut self, key: &RunKey) -> Option<OpenRun> {
        let run = self.open.remove(key);
        if run.is_some() {
            self.budget.give(1);
        }
        run
    }

    /// Applies one chunk that arrived from the consumer.
    pub fn apply(&mut self, chunk: &RawChunk) -> Applied {
        let key = chunk.addr.run();
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
        let family = run.normalizer.family();
        self.last_family = family;
        if chunk.close.is_some() {
            self.unload(&key);
            self.dormant.remove(&key);
            self.remember_closed(key);
        }
        Applied::Events(events)
    }

    /// Rebuilds a run from its chunks in SG_RAW (any order, duplicates allowed) up to but
    /// excluding `upto` — or through its close marker when one is stored, which closes the
    /// run — and returns every event they yield (to be re-published), grouped per chunk.
    /// Consumers take a re-published event as the duplicate it is by its seq.
    pub fn rebuild(&mut self, upto: &RawChunk, history: Vec<RawChunk>) -> Vec<Vec<RunEvent>> {
        let key = upto.addr.run();
        self.unload(&key);
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
            let family = run.normalizer.family();
            self.last_family = family;
            if c.close.is_some() {
                self.unload(&key);
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
        self.unload(key);
        self.dormant.remove(key);
        if self.closed.remove(key) {
            self.closed_order.retain(|k| k != key);
        }
    }

    /// Makes the idle reaper watch a run this table has not seen, known only from its
    /// last raw chunk in SG_RAW (a run left open by a previous owner of the partition):
    /// it counts as idle since that chunk's ingest time. A run the table knows already
    /// (open, dormant or closed) is left alone, as is one whose last chunk closes it.
    pub fn watch_idle(&mut self, last: &RawChunk, now_ms: i64) {
        let key = last.addr.run();
        if last.close.is_some()
            || self.open.contains_key(&key)
            || self.dormant.contains_key(&key)
            || self.closed.contains(&key)
        {
            return;
        }
        let since = Duration::from_millis(u64::try_from(now_ms - last.ingest_ts_ms).unwrap_or(0));
        let now = Instant::now();
        self.dormant.insert(
            key,
            Dormant {
                addr: last.addr.clone(),
                session_key: last.session_key.clone(),
                family: last.family.clone(),
                next_chunk: last.chunk + 1,
                // Instants cannot go back past the machine's boot; such a run just waits
                // a full idle timeout from now.
                last_seen: now.checked_sub(since).unwrap_or(now),
                timeout_requested: false,
            },
        );
    }

    /// True when `key` is closed (as far as this table remembers).
    pub fn is_closed(&self, key: &RunKey) -> bool {
        self.closed.contains(key)
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
        if self.budget.full() && !self.open.is_empty() {
            self.evict_one();
        }
        self.budget.take();
        let replaced = self.open.insert(
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
        if replaced.is_some() {
            self.budget.give(1);
        }
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
        if let Some(run) = self.unload(&key) {
            metrics::counter!("streamgate_normalizer_runs_evicted_total").increment(1);
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
        // The adapter's transcript of opaque material (signatures, encrypted reasoning)
        // serves the offline `normalize` and conformance; the service publishes events
        // only, so it is dropped here rather than kept for the life of an open run.
        drop(run.normalizer.take_transcript());
        run.next_chunk = chunk.chunk + 1;
        let envelope = Envelope {
            tenant: run.addr.tenant.to_string(),
            session_key: run.session_key.clone(),
            run_id: run.addr.run_id.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use streamgate_grammar::ids::RunRef;

    fn chunk(run: &str, index: u64) -> RawChunk {
        RawChunk {
            addr: RunAddr::parse("t", run, 32).unwrap(),
            session_key: None,
            family: "f2".to_owned(),
            dialect: None,
            chunk: index,
            ingest_ts_ms: 0,
            close: None,
            body: Bytes::from_static(b"data: {\"choices\":[]}\n\n"),
        }
    }

    #[test]
    fn partition_tables_share_one_budget() {
        let budget = RunBudget::new(2);
        let mut a = RunTable::with_budget(budget.clone());
        let mut b = RunTable::with_budget(budget.clone());
        assert!(matches!(a.apply(&chunk("a1", 0)), Applied::Events(_)));
        assert!(matches!(b.apply(&chunk("b1", 0)), Applied::Events(_)));
        // Full: b starts its second run by unloading its first.
        assert!(matches!(b.apply(&chunk("b2", 0)), Applied::Events(_)));
        assert_eq!((budget.used(), b.open_runs()), (2, 1));
        assert!(matches!(b.apply(&chunk("b1", 1)), Applied::NeedsRebuild));
        // Over budget across tables: each trims itself, down to no run at all.
        let mut c = RunTable::with_budget(budget.clone());
        assert!(matches!(c.apply(&chunk("c1", 0)), Applied::Events(_)));
        assert_eq!(budget.used(), 3);
        c.trim();
        assert_eq!((budget.used(), c.open_runs()), (2, 0));
        assert!(matches!(c.apply(&chunk("c1", 1)), Applied::NeedsRebuild));
        // A dropped table (a released partition) gives its runs back.
        drop(a);
        assert_eq!(budget.used(), 1);
        b.forget(&RunRef::new("t", "b2").unwrap());
        assert_eq!(budget.used(), 0);
    }
}

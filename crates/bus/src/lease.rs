//! Partition leases (docs/architecture.md §4): which replica of a service group works on which
//! partitions, so that every partition — and with it every run — is consumed by exactly
//! one replica at a time.
//!
//! # In JetStream KV
//! One bucket, [`LEASE_BUCKET`] (`SG_LEASES`, file storage, history 1, `max_age` = the
//! lease TTL), holds, per group (e.g. `normalizer`, `projector.<channel>`, see
//! [`group_key`]):
//! - a **partition lease** under `<group>.<NN>` (the partition, zero-padded decimal) whose
//!   value is the owner's member id. It is acquired with a compare-and-set against what
//!   the key held when it was seen free (absent, deleted or expired), renewed with an
//!   update on the revision the owner holds, and released with a delete on that revision.
//!   A lease nobody renews is removed by the bucket's `max_age`: an owner that dies loses
//!   its leases one TTL after its last renewal.
//! - a **membership key** under `<group>.members.<member>` (same TTL), re-put every
//!   renewal round, so every replica knows how many live members share the group.
//!
//! # Fair share and rebalancing
//! Every renewal round (every TTL/3, and at once when a partition is released or a new
//! member appears) a replica renews what it holds, reads the group, and aims at
//! `ceil(P / members)` partitions: it acquires free partitions up to that share and
//! releases what it holds beyond it — so a replica that joins gets partitions without
//! anyone dying. Which partitions a member prefers is a rendezvous hash of member and
//! partition, so members try different free partitions first and assignments stay put.
//!
//! # Loss versus release
//! - **Release** (rebalance, graceful shutdown): the partition's worker is asked to
//!   finish the work in hand ([`PartitionWork::release`]); the lease keeps being renewed
//!   meanwhile, and only once the worker returned is the key deleted — the next owner,
//!   woken by the delete, takes over at once.
//! - **Loss** (a renewal finds the key taken or gone, or no renewal succeeded for
//!   `TTL - margin`): the worker task is aborted at once, without finishing anything.
//!   The margin ([`LeaseTiming`]) makes a replica cut off from the broker stop its
//!   workers before the server can expire its lease and hand the partition to another
//!   replica. Whatever the stopped worker had not acknowledged is redelivered to the
//!   next owner, which is safe because effects are idempotent (docs/architecture.md §3).
//!
//! The TTL belongs to the bucket: the first replica creates `SG_LEASES` with its
//! configured TTL and every replica times its renewals by the bucket's `max_age`, whatever
//! it was configured with. Timing by anything else could let a lease expire on the server
//! while its owner still thinks it holds it. To change the TTL, change the bucket's
//! `max_age` (or delete the bucket while the services are down).
//!
//! The partition workers run inside [`PartitionLeases::run`]: dropping or aborting that
//! future (a crash) aborts every worker with it and releases nothing, exactly like a
//! process that died.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::hash::{BuildHasher as _, Hasher as _};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::{self, context::KeyValueErrorKind};
use futures::StreamExt as _;
use tokio::sync::watch;
use tokio::task::{AbortHandle, Id, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{nats, BusError};

/// The KV bucket of partition leases and group memberships.
pub const LEASE_BUCKET: &str = "SG_LEASES";
/// Lease TTL used when the deployment does not set one.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// The shortest TTL accepted: below it the renewal rounds and the stop margin leave no
/// room for a round trip to the broker.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);
/// The key token under a group that holds membership keys (partitions are digits, so
/// the two never collide).
const MEMBERS: &str = "members";
/// How long a worker that returned on its own waits before it is started again.
const WORKER_RESTART_DELAY: Duration = Duration::from_secs(1);
/// Rounds triggered by watch events closer together than this are merged.
const TRIGGER_DEBOUNCE: Duration = Duration::from_millis(20);

/// A lease group from its parts, each a [`crate::kv::token`], joined with `.`:
/// `group_key(&["normalizer"])` is `normalizer`, `group_key(&["projector", "tg.main"])`
/// is `projector.tg=2Emain`. Groups of one service kind must have the same number of
/// parts, so that no group's keys fall under another's.
pub fn group_key(parts: &[&str]) -> String {
    crate::kv::key(parts)
}

/// The key of a partition's lease: `<group>.<NN>`, zero-padded to the width of the
/// largest partition (at least two digits) so listings sort.
pub fn partition_key(group: &str, partitions: u32, partition: u32) -> String {
    format!(
        "{group}.{}",
        crate::subject::partition_label(partitions, partition)
    )
}

/// The key of a member's membership: `<group>.members.<member>` (`member` as given; use
/// a [`crate::kv::token`]).
pub fn member_key(group: &str, member: &str) -> String {
    format!("{group}.{MEMBERS}.{member}")
}

/// A member id for this process: `<host>-<pid>-<random>`, unique among live processes
/// (so that two replicas never mistake each other's leases for their own), readable in
/// `nats kv ls SG_LEASES`.
pub fn default_member_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    crate::kv::token(&format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        random_u64() & 0xff_ffff
    ))
}

/// 64 bits that differ between processes and calls: enough for names that must not
/// collide among live ones (member ids, consumer incarnations). RandomState is seeded
/// from the OS per process and varied per instance.
pub(crate) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// What a group of replicas shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The group ([`group_key`]): replicas with the same group share its partitions.
    pub group: String,
    /// Partition count P of the deployment.
    pub partitions: u32,
    /// Lease TTL wanted when this replica creates [`LEASE_BUCKET`]; an existing bucket's
    /// own TTL wins (see the module docs).
    pub ttl: Duration,
    /// Replicas of the bucket (1 on a single server; 3 in a cluster).
    pub replicas: usize,
    /// This replica's member id (a KV token); `None`: [`default_member_id`].
    pub member: Option<String>,
}

impl LeaseConfig {
    /// A group's config with the default TTL, one bucket replica and a fresh member id.
    pub fn new(group: impl Into<String>, partitions: u32) -> LeaseConfig {
        LeaseConfig {
            group: group.into(),
            partitions,
            ttl: DEFAULT_LEASE_TTL,
            replicas: 1,
            member: None,
        }
    }
}

/// When a holder renews and when it gives up, derived from the TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// The lease TTL (the bucket's `max_age`).
    pub ttl: Duration,
    /// Time between renewal rounds: TTL/3, so two rounds can fail before it matters.
    pub renew_every: Duration,
    /// How long after sending its last successful renewal a holder still works:
    /// TTL minus a margin of TTL/5 (at least 200 ms) that covers stopping the workers.
    /// The server stamps the renewal after it was sent, so its expiry is later still.
    pub hold_for: Duration,
}

impl LeaseTiming {
    /// The timing for `ttl` (raised to [`MIN_LEASE_TTL`]).
    pub fn new(ttl: Duration) -> LeaseTiming {
        let ttl = ttl.max(MIN_LEASE_TTL);
        let margin = (ttl / 5).max(Duration::from_millis(200));
        LeaseTiming {
            ttl,
            renew_every: ttl / 3,
            hold_for: ttl - margin,
        }
    }
}

/// Handed to a partition worker when its partition's lease is acquired.
#[derive(Debug, Clone)]
pub struct PartitionWork {
    /// The partition.
    pub partition: u32,
    /// Cancelled when the partition is given up gracefully (rebalance, shutdown): finish
    /// and acknowledge the work in hand, then return. The lease is released once the
    /// worker returned. (On a lease *loss* the worker is aborted instead.)
    pub release: CancellationToken,
}

/// This replica's partition leases in one group: open with [`PartitionLeases::open`],
/// then drive with [`PartitionLeases::run`], which starts a worker per acquired
/// partition and stops it when the partition is released or lost.
pub struct PartitionLeases {
    kv: kv::Store,
    group: String,
    partitions: u32,
    member: String,
    timing: LeaseTiming,
    held_tx: watch::Sender<BTreeSet<u32>>,
}

impl std::fmt::Debug for PartitionLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLeases")
            .field("group", &self.group)
            .field("partitions", &self.partitions)
            .field("member", &self.member)
            .field("timing", &self.timing)
            .finish()
    }
}

impl PartitionLeases {
    /// Opens (creating it if absent) [`LEASE_BUCKET`] for `cfg`'s group. Nothing is
    /// acquired until [`PartitionLeases::run`].
    pub async fn open(
        js: &jetstream::Context,
        cfg: LeaseConfig,
    ) -> Result<PartitionLeases, BusError> {
        let kv = lease_bucket(js, cfg.ttl, cfg.replicas).await?;
        let ttl = kv.stream.cached_info().config.max_age;
        if ttl != cfg.ttl {
            tracing::warn!(
                configured = ?cfg.ttl,
                bucket = ?ttl,
                "{LEASE_BUCKET} exists with another TTL; timing leases by the bucket's"
            );
        }
        if ttl < MIN_LEASE_TTL {
            return Err(BusError::Nats {
                op: "open lease bucket",
                source: format!(
                    "{LEASE_BUCKET} has max_age {ttl:?}; leases need at least {MIN_LEASE_TTL:?}"
                )
                .into(),
            });
        }
        let member = cfg.member.unwrap_or_else(default_member_id);
        Ok(PartitionLeases {
            kv,
            group: cfg.group,
            partitions: cfg.partitions.max(1),
            member,
            timing: LeaseTiming::new(ttl),
            held_tx: watch::channel(BTreeSet::new()).0,
        })
    }

    /// This replica's member id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The partitions this replica holds, updated as leases are acquired, released and
    /// lost (a partition being released stays in the set until its lease is deleted).
    pub fn held(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.held_tx.subscribe()
    }

    /// Holds this replica's fair share of the group's partitions until `stop` fires,
    /// running `worker` for each held partition. Then releases everything (workers
    /// drain first) and leaves the group; returns once no lease is held.
    ///
    /// A worker that returns while its partition is still held (an error, a consumer
    /// that ended) is logged and started again after a second. Errors of the broker are
    /// logged and retried: this only returns early on a bug.
    pub async fn run<W, F, E>(self, stop: CancellationToken, worker: W) -> Result<(), BusError>
    where
        W: Fn(PartitionWork) -> F + Send + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let mut sup = Supervisor {
            spawn: Box::new(move |work| {
                let fut = worker(work);
                Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
            }),
            leases: self,
            held: BTreeMap::new(),
            workers: JoinSet::new(),
            members: BTreeSet::new(),
            pending_deletes: BTreeMap::new(),
            trigger: None,
            stopping: false,
        };
        sup.run(stop).await
    }
}

/// Gets or creates the lease bucket. An existing bucket is used as it is (its TTL is the
/// one everybody times by).
async fn lease_bucket(
    js: &jetstream::Context,
    ttl: Duration,
    replicas: usize,
) -> Result<kv::Store, BusError> {
    for _ in 0..2 {
        match js.get_key_value(LEASE_BUCKET).await {
            Ok(kv) => return Ok(kv),
            Err(e) if e.kind() == KeyValueErrorKind::GetBucket => {}
            Err(e) => return Err(nats("get lease bucket")(e)),
        }
        let created = js
            .create_key_value(kv::Config {
                bucket: LEASE_BUCKET.to_owned(),
                description: "streamgate partition leases and group memberships".to_owned(),
                history: 1,
                max_age: ttl.max(MIN_LEASE_TTL),
                // File storage: a broker restart must not forget who holds what while
                // the holders keep working.
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas.max(1),
                ..Default::default()
            })
            .await;
        match created {
            Ok(kv) => return Ok(kv),
            // Another replica created it first (or with other settings): use theirs.
            Err(e) => tracing::debug!(error = %e, "lease bucket not created; looking again"),
        }
    }
    js.get_key_value(LEASE_BUCKET)
        .await
        .map_err(nats("get lease bucket"))
}

type WorkerFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A lease this replica holds.
struct Held {
    /// The key's revision as of our last write.
    revision: u64,
    /// Work on the partition must stop by then unless a renewal succeeds.
    valid_until: Instant,
    /// Cancelled to ask the worker to drain.
    release: CancellationToken,
    /// The release was asked for.
    releasing: bool,
    /// The worker task, while one runs.
    worker: Option<AbortHandle>,
    /// When a worker that returned on its own is started again.
    restart_at: Option<Instant>,
}

/// What a read of the group found.
#[derive(Default)]
struct GroupView {
    /// Live member ids.
    members: BTreeSet<String>,
    /// Partition → (owner, revision) of live leases.
    owned: BTreeMap<u32, (String, u64)>,
    /// Partition → revision of the delete marker of released leases.
    released: BTreeMap<u32, u64>,
}

struct Supervisor {
    leases: PartitionLeases,
    spawn: Box<dyn Fn(PartitionWork) -> WorkerFuture + Send>,
    held: BTreeMap<u32, Held>,
    workers: JoinSet<Result<(), String>>,
    /// Members seen in the last read, to notice new ones in the watch.
    members: BTreeSet<String>,
    /// Released partitions whose key is still to be deleted → revision to delete on
    /// (the held revision wins while the partition is held).
    pending_deletes: BTreeMap<u32, u64>,
    /// Watch of the group's keys: wakes a round when a partition comes free or a
    /// member joins.
    trigger: Option<kv::Watch>,
    stopping: bool,
}

/// Per partition, what a compare-and-set answered (the new revision on success).
type Renewals = Vec<(u32, Result<u64, kv::UpdateError>)>;

impl Supervisor {
    fn key(&self, p: u32) -> String {
        partition_key(&self.leases.group, self.leases.partitions, p)
    }

    fn publish_held(&self) {
        let set: BTreeSet<u32> = self.held.keys().copied().collect();
        metrics::gauge!("streamgate_lease_partitions_held", "group" => self.leases.group.clone())
            .set(set.len() as f64);
        self.leases.held_tx.send_if_modified(|cur| {
            if *cur == set {
                false
            } else {
                *cur = set;
                true
            }
        });
    }

    async fn run(&mut self, stop: CancellationToken) -> Result<(), BusError> {
        let timing = self.leases.timing;
        let mut next_round = Instant::now();
        tracing::info!(group = %self.leases.group, member = %self.leases.member, ttl = ?timing.ttl, "joining lease group");
        loop {
            self.restart_due_workers();
            self.delete_released().await;
            if self.stopping && self.held.is_empty() && self.workers.is_empty() {
                break;
            }
            let wake = [Some(next_round), self.next_deadline(), self.next_restart()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(next_round);
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {
                    self.expire_overdue();
                    if Instant::now() >= next_round {
                        self.round().await;
                        next_round = Instant::now() + timing.renew_every;
                    }
                }
                Some(done) = self.workers.join_next_with_id(), if !self.workers.is_empty() => {
                    self.worker_exited(done);
                }
                ev = next_event(&mut self.trigger) => match ev {
                    Some(entry) => {
                        if self.is_relevant(&entry) {
                            next_round = next_round.min(Instant::now() + TRIGGER_DEBOUNCE);
                        }
                    }
                    // Broken watch: the next round reopens it; rounds go on meanwhile.
                    None => self.trigger = None,
                },
                () = stop.cancelled(), if !self.stopping => {
                    self.leave().await;
                    next_round = Instant::now();
                }
            }
        }
        self.publish_held();
        tracing::info!(group = %self.leases.group, member = %self.leases.member, "left lease group");
        Ok(())
    }

    /// Shutdown: leave the group, then let the next round release every partition.
    async fn leave(&mut self) {
        self.stopping = true;
        self.trigger = None;
        tracing::info!(group = %self.leases.group, held = self.held.len(), "leaving lease group: releasing partitions");
        // Leave first, so the others count the right share while our partitions come
        // free one by one.
        let kv = self.leases.kv.clone();
        let key = member_key(&self.leases.group, &self.leases.member);
        let limit = self.leases.timing.renew_every;
        match self
            .guarded(async move { tokio::time::timeout(limit, kv.delete(key)).await })
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "membership not deleted; it expires"),
            Err(_) => tracing::debug!("membership delete timed out; it expires"),
        }
    }

    /// A watch event that calls for a round now: a lease or membership deleted (a
    /// partition came free, a member left), or a member we do not know yet.
    fn is_relevant(&self, entry: &kv::Entry) -> bool {
        let Some(rest) = entry
            .key
            .strip_prefix(&self.leases.group)
            .and_then(|r| r.strip_prefix('.'))
        else {
            return false;
        };
        match entry.operation {
            Operation::Delete | Operation::Purge => true,
            Operation::Put => rest
                .strip_prefix(MEMBERS)
                .and_then(|m| m.strip_prefix('.'))
                .is_some_and(|m| !self.members.contains(m)),
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.held.values().map(|h| h.valid_until).min()
    }

    fn next_restart(&self) -> Option<Instant> {
        self.held.values().filter_map(|h| h.restart_at).min()
    }

    /// Awaits `fut` (which must not borrow the supervisor) while still stopping workers
    /// whose lease runs out and noting workers that return.
    async fn guarded<T>(&mut self, fut: impl Future<Output = T>) -> T {
        tokio::pin!(fut);
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                out = &mut fut => return out,
                () = sleep_until_opt(deadline) => self.expire_overdue(),
                Some(done) = self.workers.join_next_with_id(), if !self.workers.is_empty() => {
                    self.worker_exited(done);
                }
            }
        }
    }

    /// Stops (aborts) the worker of every lease not renewed in time and forgets the
    /// lease: it is about to expire on the server and another replica may take it.
    fn expire_overdue(&mut self) {
        let now = Instant::now();
        let overdue: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.valid_until <= now)
            .map(|(p, _)| *p)
            .collect();
        for p in overdue {
            self.lose(p, "not renewed in time");
        }
    }

    /// Aborts the partition's worker without letting it finish anything.
    fn lose(&mut self, p: u32, why: &str) {
        if let Some(h) = self.held.remove(&p) {
            h.release.cancel();
            if let Some(w) = h.worker {
                w.abort();
            }
            metrics::counter!("streamgate_lease_lost_total", "group" => self.leases.group.clone())
                .increment(1);
            tracing::warn!(group = %self.leases.group, partition = p, why, "partition lease lost: worker stopped");
            self.publish_held();
        }
    }

    fn worker_exited(&mut self, done: Result<(Id, Result<(), String>), tokio::task::JoinError>) {
        let (id, result) = match done {
            Ok((id, r)) => (id, r),
            Err(e) => (e.id(), Err(e.to_string())),
        };
        // Match by task id: a partition lost and acquired again has a new worker, and
        // the old one's (aborted) exit must not count for it.
        let Some((&p, h)) = self
            .held
            .iter_mut()
            .find(|(_, h)| h.worker.as_ref().is_some_and(|w| w.id() == id))
        else {
            return;
        };
        h.worker = None;
        if h.releasing {
            if let Err(e) = &result {
                tracing::warn!(partition = p, error = %e, "partition worker failed while draining");
            }
            self.pending_deletes.insert(p, h.revision);
            return;
        }
        match &result {
            Ok(()) => tracing::warn!(partition = p, "partition worker returned; restarting it"),
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "partition worker failed; restarting it")
            }
        }
        h.restart_at = Some(Instant::now() + WORKER_RESTART_DELAY);
    }

    fn start_worker(&mut self, p: u32) {
        let Some(h) = self.held.get_mut(&p) else {
            return;
        };
        let fut = (self.spawn)(PartitionWork {
            partition: p,
            release: h.release.clone(),
        });
        h.restart_at = None;
        h.worker = Some(self.workers.spawn(fut));
    }

    fn restart_due_workers(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| !h.releasing && h.restart_at.is_some_and(|t| t <= now))
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.start_worker(p);
        }
    }

    /// Asks the partition's worker to drain; its lease is deleted once it returned.
    fn release(&mut self, p: u32) {
        let Some(h) = self.held.get_mut(&p) else {
            return;
        };
        if h.releasing {
            return;
        }
        h.releasing = true;
        h.release.cancel();
        tracing::info!(group = %self.leases.group, partition = p, "releasing partition");
        if h.worker.is_none() {
            h.restart_at = None;
            self.pending_deletes.insert(p, h.revision);
        }
    }

    /// Deletes the leases of drained partitions (on the revision we hold, so a lease
    /// that meanwhile went to another replica is left alone).
    async fn delete_released(&mut self) {
        // Workers that finish draining while a delete is under way queue more.
        while !self.pending_deletes.is_empty() {
            self.delete_pending().await;
        }
    }

    async fn delete_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending_deletes);
        let deletes: Vec<_> = pending
            .into_iter()
            .filter_map(|(p, rev)| match self.held.get(&p) {
                // Held: only once released and drained, on the revision renewals have
                // moved it to since. (A stray taken back meanwhile is ours again.)
                Some(h) if h.releasing && h.worker.is_none() => Some((p, self.key(p), h.revision)),
                Some(_) => None,
                None => Some((p, self.key(p), rev)),
            })
            .collect();
        let kv = self.leases.kv.clone();
        let timeout = self.leases.timing.renew_every;
        let results = self
            .guarded(async move {
                futures::future::join_all(deletes.into_iter().map(|(p, key, rev)| {
                    let kv = kv.clone();
                    async move {
                        let r = tokio::time::timeout(
                            timeout,
                            kv.delete_expect_revision(key, Some(rev)),
                        )
                        .await;
                        (p, r)
                    }
                }))
                .await
            })
            .await;
        for (p, r) in results {
            match r {
                Ok(Ok(())) => {
                    metrics::counter!("streamgate_lease_released_total", "group" => self.leases.group.clone())
                        .increment(1);
                    tracing::info!(group = %self.leases.group, partition = p, "partition released");
                }
                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    tracing::warn!(partition = p, "released lease had already moved on");
                }
                other => {
                    // Could not tell the broker: the lease expires by itself after the
                    // TTL, and the worker has stopped, so nothing runs twice.
                    let error = match other {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_owned(),
                    };
                    tracing::warn!(partition = p, %error, "released lease not deleted; it expires");
                }
            }
            if self.held.get(&p).is_some_and(|h| h.releasing) {
                self.held.remove(&p);
            }
        }
        self.publish_held();
    }

    /// One renewal round: membership, renewals, a read of the group, then releases and
    /// acquisitions towards the fair share.
    async fn round(&mut self) {
        let limit = self.leases.timing.renew_every;
        let kv = self.leases.kv.clone();
        let group = self.leases.group.clone();
        let member = self.leases.member.clone();
        if self.stopping {
            self.renew().await;
            let all: Vec<u32> = self.held.keys().copied().collect();
            for p in all {
                self.release(p);
            }
            self.publish_held();
            return;
        }
        if self.trigger.is_none() {
            let (kv, filter) = (kv.clone(), format!("{group}.>"));
            self.trigger = match self
                .guarded(async move { tokio::time::timeout(limit, kv.watch(filter)).await })
                .await
            {
                Ok(Ok(w)) => Some(w),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "lease watch not opened");
                    None
                }
                Err(_) => None,
            };
        }
        let (kv2, key, value) = (
            kv.clone(),
            member_key(&group, &member),
            bytes::Bytes::from(member.clone()),
        );
        match self
            .guarded(async move { tokio::time::timeout(limit, kv2.put(key, value)).await })
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "membership not renewed"),
            Err(_) => tracing::warn!("membership renewal timed out"),
        }
        self.renew().await;
        let partitions = self.leases.partitions;
        let view = match self
            .guarded(async move {
                tokio::time::timeout(limit, read_group(&kv, &group, partitions)).await
            })
            .await
        {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "lease group not read; no rebalancing this round");
                return;
            }
            Err(_) => {
                tracing::warn!("reading the lease group timed out; no rebalancing this round");
                return;
            }
        };
        self.members.clone_from(&view.members);
        self.members.insert(member.clone());
        let share = fair_share(partitions, self.members.len());
        let mut active: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| !h.releasing)
            .map(|(p, _)| *p)
            .collect();
        if active.len() > share {
            // Give up the partitions we like least.
            active.sort_by_key(|&p| preference(&member, p));
            for &p in &active[..active.len() - share] {
                self.release(p);
            }
            active.drain(..active.len() - share);
        }
        let mut want = share - active.len();
        // Leases with our name that we do not hold: a renewal that landed after we gave
        // the partition up. Take them back while we have room (nobody else can hold
        // them), else free them. Then free partitions, most preferred first.
        let mut strays: Vec<(u32, u64)> = view
            .owned
            .iter()
            .filter(|(p, (owner, _))| *owner == member && !self.held.contains_key(p))
            .map(|(p, (_, rev))| (*p, *rev))
            .collect();
        strays.sort_by_key(|&(p, _)| std::cmp::Reverse(preference(&member, p)));
        let mut attempts = Vec::new();
        for (p, rev) in strays {
            if want > 0 {
                attempts.push((p, rev));
                want -= 1;
            } else {
                self.pending_deletes.insert(p, rev);
            }
        }
        let mut free: Vec<(u32, u64)> = (0..partitions)
            .filter(|p| !self.held.contains_key(p) && !view.owned.contains_key(p))
            .map(|p| (p, view.released.get(&p).copied().unwrap_or(0)))
            .collect();
        free.sort_by_key(|&(p, _)| std::cmp::Reverse(preference(&member, p)));
        attempts.extend(free.into_iter().take(want));
        if !attempts.is_empty() {
            self.acquire(attempts).await;
        }
        self.publish_held();
    }

    /// Compare-and-set of our member id on each `(partition, expected revision)`,
    /// concurrently, each bounded by the renewal interval; returns when all are answered
    /// (enforcing lease deadlines meanwhile) with the time the writes were sent.
    async fn cas_all(&mut self, targets: Vec<(u32, u64)>) -> (Instant, Renewals) {
        let kv = self.leases.kv.clone();
        let value = bytes::Bytes::from(self.leases.member.clone());
        let limit = self.leases.timing.renew_every;
        let targets: Vec<(u32, String, u64)> = targets
            .into_iter()
            .map(|(p, rev)| (p, self.key(p), rev))
            .collect();
        let sent = Instant::now();
        let results = self
            .guarded(futures::future::join_all(targets.into_iter().map(
                move |(p, key, rev)| {
                    let (kv, value) = (kv.clone(), value.clone());
                    async move {
                        let r = tokio::time::timeout(limit, kv.update(key, value, rev))
                            .await
                            .unwrap_or_else(|_| {
                                Err(kv::UpdateError::new(kv::UpdateErrorKind::TimedOut))
                            });
                        (p, r)
                    }
                },
            )))
            .await;
        (sent, results)
    }

    /// Renews every held lease on the revision we hold.
    async fn renew(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let targets = self.held.iter().map(|(p, h)| (*p, h.revision)).collect();
        let (sent, results) = self.cas_all(targets).await;
        let mut moved = Vec::new();
        for (p, r) in results {
            match r {
                Ok(rev) => match self.held.get_mut(&p) {
                    Some(h) => {
                        h.revision = rev;
                        h.valid_until = sent + self.leases.timing.hold_for;
                    }
                    // Lost while the renewal was under way, which then landed: free it.
                    None => {
                        self.pending_deletes.insert(p, rev);
                    }
                },
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => moved.push(p),
                Err(e) => {
                    // Maybe only slow: keep working until the lease runs out.
                    tracing::warn!(partition = p, error = %e, "lease not renewed");
                }
            }
        }
        if moved.is_empty() {
            return;
        }
        // The revision moved on. If the key still carries our name, the write that moved
        // it was our own whose acknowledgement got lost (a reconnect): nobody else writes
        // our name, so the lease is still ours — continue on that revision, keeping the
        // deadline of the last renewal we know landed. Anything else: lost.
        let kv = self.leases.kv.clone();
        let limit = self.leases.timing.renew_every;
        let keys: Vec<(u32, String)> = moved.iter().map(|&p| (p, self.key(p))).collect();
        let entries = self
            .guarded(futures::future::join_all(keys.into_iter().map(
                |(p, key)| {
                    let kv = kv.clone();
                    async move { (p, tokio::time::timeout(limit, kv.entry(key)).await) }
                },
            )))
            .await;
        for (p, entry) in entries {
            match entry {
                Ok(Ok(Some(e)))
                    if e.operation == Operation::Put
                        && e.value.as_ref() == self.leases.member.as_bytes() =>
                {
                    if let Some(h) = self.held.get_mut(&p) {
                        h.revision = e.revision;
                    }
                }
                _ => self.lose(p, "taken over or expired"),
            }
        }
    }

    /// Tries to take `(partition, expected revision)` leases; starts a worker for each
    /// one won.
    async fn acquire(&mut self, attempts: Vec<(u32, u64)>) {
        let (sent, results) = self.cas_all(attempts).await;
        for (p, r) in results {
            match r {
                Ok(rev) => {
                    self.pending_deletes.remove(&p);
                    self.held.insert(
                        p,
                        Held {
                            revision: rev,
                            valid_until: sent + self.leases.timing.hold_for,
                            release: CancellationToken::new(),
                            releasing: false,
                            worker: None,
                            restart_at: None,
                        },
                    );
                    metrics::counter!("streamgate_lease_acquired_total", "group" => self.leases.group.clone())
                        .increment(1);
                    tracing::info!(group = %self.leases.group, partition = p, "partition acquired");
                    self.start_worker(p);
                }
                // Someone else was quicker: fine.
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {}
                // Unknown outcome: if it was applied, the next read shows it as ours.
                Err(e) => tracing::debug!(partition = p, error = %e, "lease not acquired"),
            }
        }
    }
}

async fn next_event(w: &mut Option<kv::Watch>) -> Option<kv::Entry> {
    match w {
        Some(w) => match w.next().await {
            Some(Ok(e)) => Some(e),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "lease watch failed");
                None
            }
            None => None,
        },
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// `ceil(partitions / members)`.
pub fn fair_share(partitions: u32, members: usize) -> usize {
    (partitions as usize).div_ceil(members.max(1))
}

/// Rendezvous weight of a partition for a member (higher: preferred).
fn preference(member: &str, partition: u32) -> u64 {
    // FNV-1a: stable and spreads similar member ids apart.
    let mut h = crate::subject::fnv1a(member.bytes().chain(partition.to_be_bytes()));
    // A final mix, so that neighbouring partitions do not rank alike.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The group's live keys: an ordered consumer over the bucket, last message per key.
async fn read_group(kv: &kv::Store, group: &str, partitions: u32) -> Result<GroupView, BusError> {
    let prefix = format!("{group}.");
    let mut view = GroupView::default();
    for entry in crate::kv::current(kv, &prefix).await? {
        let Some(rest) = entry.key.strip_prefix(&prefix) else {
            continue;
        };
        if let Some(m) = rest.strip_prefix(MEMBERS).and_then(|m| m.strip_prefix('.')) {
            if !entry.deleted {
                view.members.insert(m.to_owned());
            }
        } else if let Some(p) = rest
            .parse::<u32>()
            .ok()
            .filter(|p| *p < partitions && rest.bytes().all(|b| b.is_ascii_digit()))
        {
            if entry.deleted {
                view.released.insert(p, entry.revision);
            } else {
                let owner = String::from_utf8_lossy(&entry.value).into_owned();
                view.owned.insert(p, (owner, entry.revision));
            }
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_and_distinct() {
        assert_eq!(group_key(&["normalizer"]), "normalizer");
        assert_eq!(group_key(&["projector", "tg.main"]), "projector.tg=2Emain");
        assert_eq!(group_key(&["projector", ""]), "projector.=");
        assert_eq!(partition_key("normalizer", 32, 7), "normalizer.07");
        assert_eq!(partition_key("normalizer", 1000, 7), "normalizer.007");
        assert_eq!(partition_key("g", 1, 0), "g.00");
        assert_eq!(
            member_key("normalizer", "h-1-ab"),
            "normalizer.members.h-1-ab"
        );
        let id = default_member_id();
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)));
        assert_ne!(id, default_member_id());
    }

    #[test]
    fn shares_and_timing() {
        assert_eq!(fair_share(32, 0), 32);
        assert_eq!(fair_share(32, 1), 32);
        assert_eq!(fair_share(32, 2), 16);
        assert_eq!(fair_share(32, 3), 11);
        assert_eq!(fair_share(32, 40), 1);
        let t = LeaseTiming::new(Duration::from_secs(10));
        assert_eq!(t.renew_every, Duration::from_nanos(3_333_333_333));
        assert_eq!(t.hold_for, Duration::from_secs(8));
        let t = LeaseTiming::new(Duration::from_millis(10));
        assert_eq!(t.ttl, MIN_LEASE_TTL);
        assert!(t.hold_for < t.ttl && t.renew_every < t.hold_for);
    }

    #[test]
    fn preferences_spread_partitions() {
        // Two members should not rank the same partitions first.
        let top = |m: &str| {
            let mut v: Vec<u32> = (0..32).collect();
            v.sort_by_key(|&p| std::cmp::Reverse(preference(m, p)));
            v.truncate(16);
            v.sort_unstable();
            v
        };
        assert_ne!(top("a-1-000001"), top("b-2-000002"));
    }
}

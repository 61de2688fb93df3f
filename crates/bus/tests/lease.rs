//! Partition leases against a real nats-server: exclusive ownership, fair split,
//! takeover after a member dies (after the TTL), after a member is cut off from the
//! broker (it stops before its leases expire), and after a graceful release (at once).
//!
//! Every test's workers record themselves in one [`Ledger`]: a worker that starts on a
//! partition another worker is still running on is a violation, whichever replica it
//! belongs to. A worker leaves the ledger when its task ends — returned or aborted.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use streamgate_bus::lease::{
    group_key, partition_key, LeaseConfig, PartitionLeases, PartitionWork, LEASE_BUCKET,
};
use streamgate_testkit::NatsServer;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const P: u32 = 32;
const PATIENCE: Duration = Duration::from_secs(60);

/// Who runs which partition right now, and what went wrong.
#[derive(Default)]
struct Ledger {
    running: HashMap<u32, String>,
    violations: Vec<String>,
    /// Workers that returned after being asked to release (drained) per member.
    drained: HashMap<String, usize>,
    starts: usize,
}

type SharedLedger = Arc<Mutex<Ledger>>;

/// Removes the worker from the ledger when its future is dropped (return or abort).
struct Running {
    ledger: SharedLedger,
    partition: u32,
    member: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test that failed while holding the lock must still report its own failure.
        let mut l = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if l.running.get(&self.partition) == Some(&self.member) {
            l.running.remove(&self.partition);
        }
    }
}

fn worker(
    ledger: SharedLedger,
    member: String,
) -> impl Fn(PartitionWork) -> futures::future::BoxFuture<'static, Result<(), String>> {
    move |work: PartitionWork| {
        let (ledger, member) = (ledger.clone(), member.clone());
        Box::pin(async move {
            {
                let mut l = ledger.lock().unwrap();
                l.starts += 1;
                if let Some(other) = l.running.get(&work.partition) {
                    let v = format!(
                        "{member} started partition {} while {other} runs it",
                        work.partition
                    );
                    l.violations.push(v);
                }
                l.running.insert(work.partition, member.clone());
            }
            let _guard = Running {
                ledger: ledger.clone(),
                partition: work.partition,
                member: member.clone(),
            };
            work.release.cancelled().await;
            // "Drain": a little work in hand before returning.
            tokio::time::sleep(Duration::from_millis(20)).await;
            *ledger.lock().unwrap().drained.entry(member).or_default() += 1;
            Ok(())
        })
    }
}

struct Member {
    name: String,
    held: watch::Receiver<BTreeSet<u32>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Member {
    fn held(&self) -> BTreeSet<u32> {
        self.held.borrow().clone()
    }
}

async fn member(
    client: async_nats::Client,
    ledger: &SharedLedger,
    name: &str,
    ttl: Duration,
) -> Member {
    let js = async_nats::jetstream::new(client);
    let mut cfg = LeaseConfig::new(group_key(&["test", "group.one"]), P);
    cfg.ttl = ttl;
    cfg.member = Some(name.to_owned());
    let leases = PartitionLeases::open(&js, cfg).await.expect("open leases");
    assert_eq!(leases.member(), name);
    let held = leases.held();
    let stop = CancellationToken::new();
    let w = worker(ledger.clone(), name.to_owned());
    let s = stop.clone();
    let task = tokio::spawn(async move {
        leases.run(s, w).await.expect("lease supervisor");
    });
    Member {
        name: name.to_owned(),
        held,
        stop,
        task,
    }
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn split_evenly(a: &Member, b: &Member) -> bool {
    let (x, y) = (a.held(), b.held());
    x.len() == 16 && y.len() == 16 && x.is_disjoint(&y)
}

fn no_violations(ledger: &SharedLedger) {
    let violations = ledger.lock().unwrap().violations.clone();
    assert!(violations.is_empty(), "{violations:#?}");
}

/// The owners the bucket names, by partition.
async fn owners(js: &async_nats::jetstream::Context) -> HashMap<u32, String> {
    let kv = js.get_key_value(LEASE_BUCKET).await.unwrap();
    let group = group_key(&["test", "group.one"]);
    let mut out = HashMap::new();
    for p in 0..P {
        if let Some(v) = kv.get(partition_key(&group, P, p)).await.unwrap() {
            out.insert(p, String::from_utf8(v.to_vec()).unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_takes_all_then_two_split_evenly_and_exclusively() {
    let nats = NatsServer::start();
    let ledger = SharedLedger::default();
    let ttl = Duration::from_secs(3);
    let a = member(nats.client().await, &ledger, "a", ttl).await;
    eventually("a holds every partition", || a.held().len() == 32).await;
    // A second member: a gives up half (gracefully), b takes it — nobody died.
    let b = member(nats.client().await, &ledger, "b", ttl).await;
    eventually("a and b split 16/16", || split_evenly(&a, &b)).await;
    eventually("the ledger matches the leases", || {
        ledger.lock().unwrap().running.len() == 32
    })
    .await;
    assert_eq!(
        ledger.lock().unwrap().drained.get("a").copied(),
        Some(16),
        "a's workers for the partitions it gave up drained"
    );
    // Stable: several renewal rounds later nothing moved.
    let (ha, hb) = (a.held(), b.held());
    tokio::time::sleep(ttl * 2).await;
    assert_eq!((a.held(), b.held()), (ha.clone(), hb.clone()));
    let kv_owners = owners(&async_nats::jetstream::new(nats.client().await)).await;
    for p in 0..P {
        let want = if ha.contains(&p) { "a" } else { "b" };
        assert_eq!(
            kv_owners.get(&p).map(String::as_str),
            Some(want),
            "partition {p}"
        );
        assert_eq!(
            ledger.lock().unwrap().running.get(&p).map(String::as_str),
            Some(want)
        );
    }
    // A third: 11 + 11 + 10.
    let c = member(nats.client().await, &ledger, "c", ttl).await;
    eventually("three members share 32 partitions", || {
        let sets = [a.held(), b.held(), c.held()];
        let mut sizes: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        sizes.sort_unstable();
        let union: BTreeSet<u32> = sets.iter().flatten().copied().collect();
        sizes == [10, 11, 11] && union.len() == 32
    })
    .await;
    no_violations(&ledger);
    for m in [&a, &b, &c] {
        m.stop.cancel();
    }
    for m in [a, b, c] {
        tokio::time::timeout(PATIENCE, m.task)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(ledger.lock().unwrap().running.is_empty());
    no_violations(&ledger);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_members_partitions_move_after_the_ttl() {
    let nats = NatsServer::start();
    let ledger = SharedLedger::default();
    let ttl = Duration::from_secs(3);
    let a = member(nats.client().await, &ledger, "a", ttl).await;
    let b = member(nats.client().await, &ledger, "b", ttl).await;
    eventually("split", || split_evenly(&a, &b)).await;
    let b_parts = b.held();
    // Crash: the supervisor and its workers die, nothing is released.
    b.task.abort();
    let _ = b.task.await;
    let died = Instant::now();
    eventually("b's workers are gone", || {
        ledger.lock().unwrap().running.values().all(|m| m == "a")
    })
    .await;
    assert_eq!(
        ledger.lock().unwrap().drained.get("b"),
        None,
        "a crash drains nothing"
    );
    eventually("a took every partition", || a.held().len() == 32).await;
    let took = died.elapsed();
    // The leases were b's until they expired: a could not have had them sooner.
    assert!(
        took >= ttl / 2,
        "a took b's partitions {took:?} after the crash, before b's leases could expire"
    );
    eventually("a runs b's partitions", || {
        let l = ledger.lock().unwrap();
        b_parts
            .iter()
            .all(|p| l.running.get(p).map(String::as_str) == Some("a"))
    })
    .await;
    no_violations(&ledger);
    let _ = b.stop;
    a.stop.cancel();
    tokio::time::timeout(PATIENCE, a.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_release_hands_partitions_over_at_once() {
    let nats = NatsServer::start();
    let ledger = SharedLedger::default();
    // A TTL far longer than the takeover may take: only a release explains it.
    let ttl = Duration::from_secs(60);
    let a = member(nats.client().await, &ledger, "a", ttl).await;
    let b = member(nats.client().await, &ledger, "b", ttl).await;
    let t0 = Instant::now();
    eventually("split", || split_evenly(&a, &b)).await;
    eprintln!("split after {:?}", t0.elapsed());
    let stopped = Instant::now();
    b.stop.cancel();
    tokio::time::timeout(PATIENCE, b.task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ledger.lock().unwrap().drained.get("b").copied(),
        Some(16),
        "every one of b's workers drained before its lease went"
    );
    let t = Instant::now();
    while a.held().len() < 32 {
        assert!(
            t.elapsed() < ttl / 3,
            "a did not take b's released partitions before the leases would expire"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("takeover {:?} after the stop", stopped.elapsed());
    eventually("a runs all 32", || {
        let l = ledger.lock().unwrap();
        l.running.len() == 32 && l.running.values().all(|m| m == "a")
    })
    .await;
    no_violations(&ledger);
    a.stop.cancel();
    tokio::time::timeout(PATIENCE, a.task)
        .await
        .unwrap()
        .unwrap();
}

/// A TCP proxy in front of the broker that can be frozen: connections stay open but no
/// byte passes, as when a network path dies without a reset.
struct Proxy {
    addr: std::net::SocketAddr,
    frozen: Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = frozen.clone();
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pipe(dr, uw, f.clone()));
                tokio::spawn(pipe(ur, dw, f.clone()));
            }
        });
        Proxy { addr, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok(n) = r.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        // Frozen: swallow everything, send nothing, keep the connection open.
        if frozen.load(std::sync::atomic::Ordering::SeqCst) {
            continue;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_the_broker_stops_before_its_leases_expire() {
    let nats = NatsServer::start();
    let ledger = SharedLedger::default();
    let ttl = Duration::from_secs(3);
    let proxy = Proxy::start(nats.port()).await;
    let a = member(nats.client().await, &ledger, "a", ttl).await;
    let cut_client = async_nats::ConnectOptions::new()
        .connect(format!("nats://{}", proxy.addr))
        .await
        .unwrap();
    let b = member(cut_client, &ledger, "b", ttl).await;
    eventually("split", || split_evenly(&a, &b)).await;
    let b_parts = b.held();
    proxy.freeze();
    // b can no longer renew; it must stop its workers before the server expires its
    // leases, and a must not start one of them before b's worker is gone (the ledger
    // records any overlap).
    eventually("b stopped every worker", || {
        ledger.lock().unwrap().running.values().all(|m| m == "a")
    })
    .await;
    eventually("b gave up its leases", || b.held().is_empty()).await;
    eventually("a took every partition", || a.held().len() == 32).await;
    eventually("a runs b's partitions", || {
        let l = ledger.lock().unwrap();
        b_parts
            .iter()
            .all(|p| l.running.get(p).map(String::as_str) == Some("a"))
    })
    .await;
    no_violations(&ledger);
    assert_eq!(
        ledger.lock().unwrap().drained.get("b"),
        None,
        "a lost lease is not drained: its worker is stopped at once"
    );
    b.task.abort();
    a.stop.cancel();
    tokio::time::timeout(PATIENCE, a.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_keeps_the_owners() {
    let mut nats = NatsServer::start();
    let ledger = SharedLedger::default();
    // A TTL long enough that a restart of the broker (JetStream recovery, the client's
    // reconnect backoff) on a loaded CI box fits well inside the hold time: this test is
    // about leases surviving a restart, not about how fast one is.
    let ttl = Duration::from_secs(30);
    let a = member(nats.client().await, &ledger, "a", ttl).await;
    let b = member(nats.client().await, &ledger, "b", ttl).await;
    eventually("split", || split_evenly(&a, &b)).await;
    let (ha, hb) = (a.held(), b.held());
    // Every held partition's worker has started (a lease shows as held a moment before
    // its worker runs): only starts after this point are restarts.
    eventually("every held partition runs its holder's worker", || {
        let l = ledger.lock().unwrap();
        l.running.len() == P as usize
            && ha
                .iter()
                .all(|p| l.running.get(p).map(String::as_str) == Some("a"))
            && hb
                .iter()
                .all(|p| l.running.get(p).map(String::as_str) == Some("b"))
    })
    .await;
    let starts = ledger.lock().unwrap().starts;
    let before = revisions(&async_nats::jetstream::new(nats.client().await)).await;
    assert_eq!(before.len(), P as usize, "every partition has a lease");
    // The leases are on disk and renewed on reconnect.
    nats.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.restart();
    let js = async_nats::jetstream::new(nats.client().await);
    let t = Instant::now();
    loop {
        let now = revisions(&js).await;
        let renewed = before
            .iter()
            .all(|(p, rev)| now.get(p).is_some_and(|r| r > rev));
        if renewed {
            break;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "the leases were not all renewed after the restart: {before:?} -> {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((a.held(), b.held()), (ha, hb), "an owner changed");
    no_violations(&ledger);
    let restarted = ledger.lock().unwrap().starts - starts;
    assert_eq!(restarted, 0, "{restarted} workers were restarted");
    a.stop.cancel();
    b.stop.cancel();
    for m in [a, b] {
        let name = m.name.clone();
        tokio::time::timeout(PATIENCE, m.task)
            .await
            .unwrap_or_else(|_| panic!("{name} did not stop"))
            .unwrap();
    }
}

/// The revision of every partition's lease, by partition.
async fn revisions(js: &async_nats::jetstream::Context) -> HashMap<u32, u64> {
    let Ok(kv) = js.get_key_value(LEASE_BUCKET).await else {
        return HashMap::new();
    };
    let group = group_key(&["test", "group.one"]);
    let mut out = HashMap::new();
    for p in 0..P {
        if let Ok(Some(e)) = kv.entry(partition_key(&group, P, p)).await {
            out.insert(p, e.revision);
        }
    }
    out
}

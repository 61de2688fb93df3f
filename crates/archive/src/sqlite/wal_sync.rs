//! Power-loss durability without the writer waiting for the disk.
//!
//! With [`SqliteDurability::Full`] the writer commits with `synchronous=NORMAL` — SQLite
//! writes the transaction's frames into the WAL file but does not fsync it — and hands
//! the replies of each job to a thread of its own, which syncs the WAL file once for
//! every reply that queued meanwhile and only then sends them. So a caller (the archiver,
//! which acknowledges the broker on that reply) still hears of a commit only once it is
//! on disk, as with `synchronous=FULL`, but the writer builds the next transaction while
//! the disk syncs the last one instead of idling through every fsync. At 80% of `bench
//! pipeline`'s maximum the fsync inside the writer doubled the ingest→commit p99
//! (docs/performance.md, twenty-sixth stop).
//!
//! Why this is as durable as `FULL` for what callers are told: in WAL mode a transaction
//! survives power loss once its frames, commit frame included, are on disk, and
//! `fdatasync` on any descriptor of the file covers every write made to it before the
//! call, whichever descriptor made it. The replies a sync answers were taken off the
//! queue before it began. `NORMAL` still syncs the WAL before a checkpoint copies it and
//! the database file after, and a new WAL header (and, the first time, the directory
//! entry) when the file starts over, so a transaction a checkpoint took out of the WAL
//! before this thread synced it is on disk in the database file. The WAL file is never
//! replaced while the writer's connection is open: a WAL-mode connection holds a shared
//! lock on the database for as long as it is open, and SQLite deletes the WAL only when
//! the last connection closes (a truncating checkpoint keeps the file). Its name is the
//! one SQLite uses, from the connection (SQLite resolves symbolic links in the path).
//!
//! One thing differs from `FULL`: readers (the query API, exports) may see a commit
//! during its sync, before it is durable. A power loss in that window can take back what
//! was read, never what a caller was told is committed.
//!
//! A failed sync is final: Linux may drop the pages it could not write and report
//! success to the next fsync, so nothing written after the failure can be called
//! durable. The replies waiting get the error, and the writer stops (every later call
//! fails); a restart recovers from what the file holds, and the broker redelivers what
//! was never acknowledged. Where the WAL file cannot be opened the writer keeps
//! `synchronous=FULL`.

use super::{SqliteDurability, WriterPriority};
use crate::ArchiveError;
use rusqlite::Connection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// A job's reply, called with whether its transaction reached the disk.
pub(super) type PendingReply = Box<dyn FnOnce(Result<(), ArchiveError>) + Send>;

/// Turns a job's result and its reply channel into a [`PendingReply`]: the caller gets the
/// job's own error if it failed, else the sync's error if that failed, else the result.
pub(super) fn answer<R: Send + 'static>(
    to: oneshot::Sender<Result<R, ArchiveError>>,
    result: Result<R, ArchiveError>,
) -> PendingReply {
    Box::new(move |synced| {
        let _ = to.send(result.and_then(|r| synced.map(|()| r)));
    })
}

/// How the writer's replies reach their callers.
pub(super) enum Durable {
    /// At once: SQLite synced the commit itself (`synchronous=FULL`), or the archive
    /// asked for `synchronous=NORMAL`.
    Inline,
    /// After the syncer thread synced the WAL file.
    Synced {
        /// The replies of each job (a group commit's several), in commit order.
        syncer: mpsc::SyncSender<Vec<PendingReply>>,
        /// Set by the syncer when a sync failed.
        failed: Arc<AtomicBool>,
    },
}

/// Jobs' replies queued for the syncer before the writer blocks: each entry is one
/// finished job (or group commit) whose callers wait, so the callers' own limits bound
/// the queue long before this does.
const SYNC_QUEUE: usize = 64;

impl Durable {
    /// Chooses how `conn` (the writer's connection, opened with `durability`'s pragma)
    /// makes its commits durable; with [`SqliteDurability::Full`] and the WAL file at
    /// hand, starts the syncer (scheduled with `priority`, as the writer is) and turns
    /// SQLite's own sync off.
    pub(super) fn start(
        conn: &Connection,
        durability: SqliteDurability,
        priority: WriterPriority,
    ) -> Durable {
        if durability != SqliteDurability::Full {
            return Durable::Inline;
        }
        // The file SQLite writes: its own name for the database (links resolved) + "-wal".
        let Some(db) = conn.path().filter(|p| !p.is_empty()) else {
            return Durable::Inline;
        };
        let wal = format!("{db}-wal");
        let file = match std::fs::OpenOptions::new().write(true).open(&wal) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(error = %e, wal = ?wal, "no WAL file to sync; sqlite syncs each commit itself");
                return Durable::Inline;
            }
        };
        let (syncer, rx) = mpsc::sync_channel(SYNC_QUEUE);
        let failed = Arc::new(AtomicBool::new(false));
        let failed_at = failed.clone();
        let started = std::thread::Builder::new()
            .name("sg-archive-sync".into())
            .spawn(move || {
                super::priority::apply_to_this_thread(priority, "WAL syncer");
                sync_loop(&rx, || file.sync_data(), &failed_at)
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "no WAL sync thread; sqlite syncs each commit itself");
            return Durable::Inline;
        }
        if let Err(e) = conn.pragma_update(None, "synchronous", "NORMAL") {
            // Still FULL: every commit is synced twice, but none is acknowledged early.
            tracing::warn!(error = %e, "sqlite kept synchronous=FULL beside the WAL sync thread");
        }
        Durable::Synced { syncer, failed }
    }

    /// Whether a sync failed: the writer then stops, since nothing it writes can be
    /// called durable any more.
    pub(super) fn failed(&self) -> bool {
        match self {
            Durable::Inline => false,
            Durable::Synced { failed, .. } => failed.load(Ordering::Relaxed),
        }
    }

    /// Sends `replies` once what the writer committed so far is durable.
    pub(super) fn deliver(&self, replies: Vec<PendingReply>) {
        match self {
            Durable::Inline => replies.into_iter().for_each(|r| r(Ok(()))),
            Durable::Synced { syncer, .. } => {
                if let Err(mpsc::SendError(replies)) = syncer.send(replies) {
                    for r in replies {
                        r(Err(ArchiveError::WriterStopped(
                            "WAL sync thread stopped".into(),
                        )));
                    }
                }
            }
        }
    }
}

/// The syncer: takes every reply that is waiting, syncs once, answers them; until the
/// writer (the only sender) is gone.
fn sync_loop(
    rx: &mpsc::Receiver<Vec<PendingReply>>,
    mut sync: impl FnMut() -> std::io::Result<()>,
    failed_flag: &AtomicBool,
) {
    let mut failed: Option<String> = None;
    while let Ok(mut replies) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            replies.extend(more);
        }
        if failed.is_none() {
            if let Err(e) = sync() {
                tracing::error!(error = %e, "the archive's WAL could not be synced: nothing written from now on is acknowledged; restart to recover");
                failed = Some(e.to_string());
                failed_flag.store(true, Ordering::Relaxed);
            }
        }
        for r in replies {
            r(match &failed {
                None => Ok(()),
                Some(e) => Err(ArchiveError::WalSync(e.clone())),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A reply that records what it was told.
    fn recorder(log: &Arc<Mutex<Vec<bool>>>) -> PendingReply {
        let log = log.clone();
        Box::new(move |synced| log.lock().unwrap().push(synced.is_ok()))
    }

    #[test]
    fn replies_waiting_together_share_one_sync() {
        let (tx, rx) = mpsc::sync_channel(SYNC_QUEUE);
        let log = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..3 {
            tx.send(vec![recorder(&log), recorder(&log)]).unwrap();
        }
        drop(tx);
        let (mut syncs, failed) = (0, AtomicBool::new(false));
        sync_loop(
            &rx,
            || {
                syncs += 1;
                Ok(())
            },
            &failed,
        );
        assert_eq!(syncs, 1);
        assert!(!failed.load(Ordering::Relaxed));
        assert_eq!(*log.lock().unwrap(), vec![true; 6]);
    }

    #[test]
    fn a_failed_sync_fails_its_replies_and_every_later_one_without_syncing_again() {
        let (tx, rx) = mpsc::sync_channel(SYNC_QUEUE);
        let log = Arc::new(Mutex::new(Vec::new()));
        let (step_tx, step_rx) = mpsc::channel::<()>();
        let writer_log = log.clone();
        let writer = std::thread::spawn(move || {
            // One batch at a time, each after the syncer began syncing the one before
            // (the syncer takes what waits before it syncs).
            for i in 0..3 {
                tx.send(vec![recorder(&writer_log)]).unwrap();
                if i < 2 {
                    step_rx.recv().unwrap();
                }
            }
        });
        let (mut syncs, failed) = (0, AtomicBool::new(false));
        sync_loop(
            &rx,
            || {
                syncs += 1;
                let _ = step_tx.send(());
                if syncs == 2 {
                    Err(std::io::Error::other("disk gone"))
                } else {
                    Ok(())
                }
            },
            &failed,
        );
        writer.join().unwrap();
        assert!(failed.load(Ordering::Relaxed), "the writer is told to stop");
        // The third batch is answered without a sync: the failure is final.
        assert_eq!(syncs, 2);
        assert_eq!(*log.lock().unwrap(), vec![true, false, false]);
    }
}

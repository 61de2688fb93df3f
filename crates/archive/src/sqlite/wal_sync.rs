//! Power-loss durability without the writer waiting for the disk.
//!
//! With [`SqliteDurability::Full`] the writer commits with `synchronous=NORMAL` — SQLite
//! writes the transaction's frames into the WAL file but does not fsync it — and hands
//! the reply of each job to a thread of its own, which syncs the WAL file once for every
//! reply that queued meanwhile and only then sends them. So a caller (the archiver,
//! which acknowledges the broker on that reply) still hears of a commit only once it is
//! on disk, as with `synchronous=FULL`, but the writer builds the next transaction while
//! the disk syncs the last one instead of idling through every fsync. At 80% of `bench
//! pipeline`'s maximum the fsync inside the writer doubled the ingest→commit p99
//! (docs/performance.md, twenty-sixth stop).
//!
//! Why this is as durable as `FULL`: in WAL mode a transaction survives power loss once
//! its frames, commit frame included, are on disk, and `fdatasync` on any descriptor of
//! the file covers every write made to it before the call, whichever descriptor made it.
//! `NORMAL` still syncs the WAL before a checkpoint copies it into the database file, the
//! database file after, and the WAL header when the file starts over, so a transaction a
//! checkpoint took out of the WAL before this thread synced it is on disk in the
//! database file. The WAL file is never replaced while the writer's connection is open
//! (SQLite deletes it only when its last connection closes; a truncating checkpoint
//! keeps the file), so the descriptor opened at the start stays the right one.
//!
//! A failed sync is final: Linux may drop the pages it could not write and report
//! success to the next fsync, so nothing written after the failure can be called
//! durable. Every later reply carries the error; the archiver then acknowledges nothing
//! more, and a restart recovers from what the file holds (the broker redelivers the
//! rest). Where the WAL file cannot be opened the writer keeps `synchronous=FULL`.

use super::SqliteDurability;
use crate::ArchiveError;
use rusqlite::Connection;
use std::path::Path;
use std::sync::mpsc;
use tokio::sync::oneshot;

/// A job's reply, called with whether its transaction reached the disk.
pub(super) type Reply = Box<dyn FnOnce(Result<(), ArchiveError>) + Send>;

/// Turns a job's result and its reply channel into a [`Reply`]: the caller gets the
/// result once the sync succeeded, the sync's error otherwise.
pub(super) fn answer<R: Send + 'static>(
    to: oneshot::Sender<Result<R, ArchiveError>>,
    result: Result<R, ArchiveError>,
) -> Reply {
    Box::new(move |synced| {
        let _ = to.send(synced.and(result));
    })
}

/// How the writer's replies reach their callers.
pub(super) enum Durable {
    /// At once: SQLite synced the commit itself (`synchronous=FULL`), or the archive
    /// asked for `synchronous=NORMAL`.
    Inline,
    /// After the syncer thread synced the WAL file.
    Synced(mpsc::SyncSender<Vec<Reply>>),
}

/// Replies queued for the syncer before the writer blocks: each is one finished job
/// whose caller waits, so callers bound it long before this does.
const SYNC_QUEUE: usize = 64;

impl Durable {
    /// Chooses how `conn` (the writer's connection of the archive at `path`, opened with
    /// `durability`'s pragma) makes its commits durable; with [`SqliteDurability::Full`]
    /// and the WAL file at hand, starts the syncer and turns SQLite's own sync off.
    pub(super) fn start(conn: &Connection, path: &Path, durability: SqliteDurability) -> Durable {
        if durability != SqliteDurability::Full {
            return Durable::Inline;
        }
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let file = match std::fs::OpenOptions::new().write(true).open(&wal) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(error = %e, wal = ?wal, "no WAL file to sync; sqlite syncs each commit itself");
                return Durable::Inline;
            }
        };
        let (tx, rx) = mpsc::sync_channel(SYNC_QUEUE);
        let started = std::thread::Builder::new()
            .name("sg-archive-sync".into())
            .spawn(move || sync_loop(&rx, || file.sync_data()));
        if let Err(e) = started {
            tracing::warn!(error = %e, "no WAL sync thread; sqlite syncs each commit itself");
            return Durable::Inline;
        }
        if let Err(e) = conn.pragma_update(None, "synchronous", "NORMAL") {
            // Still FULL: every commit is synced twice, but none is acknowledged early.
            tracing::warn!(error = %e, "sqlite kept synchronous=FULL beside the WAL sync thread");
        }
        Durable::Synced(tx)
    }

    /// Sends `replies` once what the writer committed so far is durable.
    pub(super) fn deliver(&self, replies: Vec<Reply>) {
        match self {
            Durable::Inline => replies.into_iter().for_each(|r| r(Ok(()))),
            Durable::Synced(syncer) => {
                if let Err(mpsc::SendError(replies)) = syncer.send(replies) {
                    for r in replies {
                        r(Err(ArchiveError::WorkerGone(
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
fn sync_loop(rx: &mpsc::Receiver<Vec<Reply>>, mut sync: impl FnMut() -> std::io::Result<()>) {
    let mut failed: Option<String> = None;
    while let Ok(mut replies) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            replies.extend(more);
        }
        if failed.is_none() {
            if let Err(e) = sync() {
                tracing::error!(error = %e, "the archive's WAL could not be synced: nothing written from now on is acknowledged; restart to recover");
                failed = Some(e.to_string());
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
    use std::sync::{Arc, Mutex};

    /// A reply that records what it was told.
    fn recorder(log: &Arc<Mutex<Vec<bool>>>) -> Reply {
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
        let mut syncs = 0;
        sync_loop(&rx, || {
            syncs += 1;
            Ok(())
        });
        assert_eq!(syncs, 1);
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
        let mut syncs = 0;
        sync_loop(&rx, || {
            syncs += 1;
            let _ = step_tx.send(());
            if syncs == 2 {
                Err(std::io::Error::other("disk gone"))
            } else {
                Ok(())
            }
        });
        writer.join().unwrap();
        // The third batch is answered without a sync: the failure is final.
        assert_eq!(syncs, 2);
        assert_eq!(*log.lock().unwrap(), vec![true, false, false]);
    }
}

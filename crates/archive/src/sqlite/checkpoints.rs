//! WAL checkpoints: copying committed pages from the WAL into the database file.
//!
//! A checkpointer thread with its own connection does the copying (`PASSIVE`), paced by
//! how much WAL each checkpoint finds ([`next_checkpoint_pause`]), so the writer does not
//! copy pages and fsync the database file inside its commits; once writes pause it
//! truncates the WAL. Under a steady load SQLite seldom starts the WAL over (a commit
//! lands while the checkpointer copies), so the writer's backstop (`wal_autocheckpoint`)
//! does, inside a commit, every few seconds.

use super::{pages_of, BUSY_TIMEOUT};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// Minimum pause between background checkpoints; each one fsyncs the database file, so
/// one per interval absorbs the commits in between.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);
/// The longest pause between checkpoints ([`next_checkpoint_pause`]).
const CHECKPOINT_INTERVAL_MAX: Duration = Duration::from_secs(1);
/// A checkpoint that found less WAL than this lets the next one wait twice as long; one
/// that found more than [`CHECKPOINT_LARGE_BYTES`] half as long.
const CHECKPOINT_SMALL_BYTES: i64 = 16 << 20;
/// See [`CHECKPOINT_SMALL_BYTES`].
const CHECKPOINT_LARGE_BYTES: i64 = 64 << 20;
/// WAL size past which the checkpointer stops being polite and waits for the writer
/// (`RESTART`), so a write burst cannot grow the WAL without bound.
const WAL_HARD_LIMIT_BYTES: i64 = 400 << 20;
/// How long without commits before the checkpointer truncates the WAL file to zero: the
/// WAL keeps its high-water size while writes flow, and gives the disk back when they stop.
const IDLE_TRUNCATE_AFTER: Duration = Duration::from_secs(2);

/// The writer's side of the checkpointer.
pub(super) struct Checkpoints {
    /// Wakes the checkpointer after a write (a full channel: a wake-up is pending).
    wake: mpsc::SyncSender<()>,
}

impl Checkpoints {
    /// Starts the checkpointer thread of the archive at `path`; without it (the thread
    /// could not start) the writer's `wal_autocheckpoint` backstop does the work.
    pub(super) fn start(path: &Path) -> Checkpoints {
        let (wake, signals) = mpsc::sync_channel(1);
        let path = path.to_path_buf();
        let started = std::thread::Builder::new()
            .name("sg-archive-ckpt".into())
            .spawn(move || checkpointer(path, signals));
        if let Err(e) = started {
            tracing::warn!(error = %e, "no sqlite checkpointer thread; writer auto-checkpoints");
        }
        Checkpoints { wake }
    }

    /// Called by the writer after each job: wakes the checkpointer.
    pub(super) fn after_write(&self) {
        let _ = self.wake.try_send(());
    }
}

/// Background WAL checkpoints on their own connection, so the writer never stalls on
/// copying pages into the database file and fsyncing it, nor on shrinking the WAL. Woken
/// by the writer after commits; once commits pause, truncates the WAL; exits when the
/// writer does.
fn checkpointer(path: PathBuf, signals: mpsc::Receiver<()>) {
    let conn = match Connection::open(&path).and_then(|c| c.busy_timeout(BUSY_TIMEOUT).map(|()| c))
    {
        Ok(conn) => conn,
        Err(e) => {
            tracing::warn!(error = %e, "sqlite checkpointer unavailable; writer auto-checkpoints");
            return;
        }
    };
    let run = |mode: &str| {
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        })
    };
    let limits = || -> rusqlite::Result<[i64; 3]> {
        Ok([
            pages_of(&conn, WAL_HARD_LIMIT_BYTES)?,
            pages_of(&conn, CHECKPOINT_SMALL_BYTES)?,
            pages_of(&conn, CHECKPOINT_LARGE_BYTES)?,
        ])
    };
    let [hard_limit, small, large] = match limits() {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "sqlite checkpointer unavailable; writer auto-checkpoints");
            return;
        }
    };
    let mut pause = CHECKPOINT_INTERVAL;
    let mut wal_in_use = false;
    loop {
        match signals.recv_timeout(IDLE_TRUNCATE_AFTER) {
            Ok(()) => wal_in_use = true,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if wal_in_use {
                    // Idle: copy what is left and cut the file back to zero bytes. It
                    // briefly holds the write lock; a writer arriving now waits (busy
                    // timeout) rather than failing.
                    if let Err(e) = run("TRUNCATE") {
                        tracing::warn!(error = %e, "sqlite WAL truncate checkpoint failed");
                    }
                    wal_in_use = false;
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        std::thread::sleep(pause);
        while signals.try_recv().is_ok() {}
        match run("PASSIVE") {
            Ok((log, done)) => {
                if log > hard_limit && done < log {
                    if let Err(e) = run("RESTART") {
                        tracing::warn!(error = %e, "sqlite WAL restart checkpoint failed");
                    }
                }
                pause = next_checkpoint_pause(pause, log, [small, large]);
            }
            Err(e) => tracing::warn!(error = %e, "sqlite WAL checkpoint failed"),
        }
    }
}

/// The pause before the next checkpoint, from the last one's and the WAL frames that
/// checkpoint found (`log`; the WAL starts again after a checkpoint, so about what the
/// pause let accumulate): twice as long while that is under `small` frames, half as
/// long over `large`, within [`CHECKPOINT_INTERVAL`]..=[`CHECKPOINT_INTERVAL_MAX`].
///
/// At a modest load every commit rewrites the same pages of the live runs, and a
/// checkpoint copies each page once however many commits changed it: once a second
/// instead of ten times copies a fraction of it. A fast-growing WAL keeps the short
/// pause, so the WAL (and what a crash leaves to replay) stays small.
fn next_checkpoint_pause(pause: Duration, log: i64, [small, large]: [i64; 2]) -> Duration {
    if log < small {
        (pause * 2).min(CHECKPOINT_INTERVAL_MAX)
    } else if log > large {
        (pause / 2).max(CHECKPOINT_INTERVAL)
    } else {
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_wait_longer_while_each_finds_little_wal_and_less_when_it_grows_fast() {
        let limits = [1_000, 4_000];
        let ms = Duration::from_millis;
        // A modest load: the pause doubles up to a second.
        let mut pause = CHECKPOINT_INTERVAL;
        let mut seen = vec![];
        for _ in 0..6 {
            pause = next_checkpoint_pause(pause, 100, limits);
            seen.push(pause.as_millis());
        }
        assert_eq!(seen, [200, 400, 800, 1000, 1000, 1000]);
        // Between the limits it holds; past the larger one it halves back to 100 ms.
        assert_eq!(next_checkpoint_pause(ms(400), 2_000, limits), ms(400));
        assert_eq!(next_checkpoint_pause(ms(400), 5_000, limits), ms(200));
        assert_eq!(
            next_checkpoint_pause(CHECKPOINT_INTERVAL, 5_000, limits),
            CHECKPOINT_INTERVAL
        );
    }
}

//! The SQLite store's threads and their priority (`sqlite/priority.rs`), in a binary of
//! their own: the only store in the process, so every archive thread read from `/proc`
//! is this store's.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};
use streamgate_archive::{SqliteStore, RAISED_BY};

/// The nice value of the calling thread.
fn nice_of_this_thread() -> i32 {
    nice_in(&std::fs::read_to_string("/proc/thread-self/stat").unwrap())
}

/// Field 19 of a `/proc/…/stat` line (the 17th after the command's closing parenthesis).
fn nice_in(stat: &str) -> i32 {
    let (_, fields) = stat.rsplit_once(") ").unwrap();
    fields.split(' ').nth(16).unwrap().parse().unwrap()
}

/// The nice value of each of this process's threads named `name`.
fn nice_of_threads(name: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let comm = stat
            .split_once(" (")
            .and_then(|(_, rest)| rest.rsplit_once(") "));
        if comm.is_some_and(|(comm, _)| comm == name) {
            out.push(nice_in(&stat));
        }
    }
    out
}

/// Whether this process may put a thread `steps` nice values ahead of `from`.
fn may_raise(from: i32, steps: i32) -> bool {
    std::thread::spawn(move || {
        let path = "/proc/thread-self/stat";
        let tid: i32 = std::fs::read_to_string(path)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        std::process::Command::new("renice")
            .args([
                "-n",
                &(from - steps).max(-20).to_string(),
                "-p",
                &tid.to_string(),
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    })
    .join()
    .unwrap()
}

#[tokio::test]
async fn the_writer_and_the_syncer_run_ahead_once_and_the_checkpointer_does_not() {
    let before = nice_of_this_thread();
    let dir = tempfile::tempdir().unwrap();
    let _store = SqliteStore::open(&dir.path().join("p.db")).await.unwrap();
    let (full, some) = (may_raise(before, RAISED_BY), may_raise(before, 1));
    // The writer raises itself once it has started its helpers, after `open` returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    while some && nice_of_threads("sg-archive-sqli") == [before] && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let writer = nice_of_threads("sg-archive-sqli");
    let [writer] = writer[..] else {
        panic!("one writer thread, not {writer:?}")
    };
    if full {
        assert_eq!(writer, (before - RAISED_BY).max(-20), "the writer, raised");
    } else if some {
        // A nice limit short of ten steps: as far as it lets.
        assert!(
            writer < before && writer > before - RAISED_BY,
            "the writer at {writer}"
        );
    } else {
        assert_eq!(
            writer, before,
            "no privilege: the writer keeps its priority"
        );
    }
    assert_eq!(
        nice_of_threads("sg-archive-sync"),
        [writer],
        "the WAL syncer"
    );
    assert_eq!(
        nice_of_threads("sg-archive-ckpt"),
        [before],
        "the checkpointer"
    );
}

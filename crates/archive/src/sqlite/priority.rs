//! The commit path's threads ask for a core ahead of the rest of the process.
//!
//! The writer thread is the pipeline's one serial stage, and the WAL syncer answers its
//! commits: every event behind a commit waits as long as they do. On a busy box
//! (`streamgate up`, or an archiver beside other work) both waited for a core about as
//! long as they ran — `bench pipeline` at 80% of the maximum: the writer ran 48% of a
//! core and waited 41% — while the tokio workers beside them have many tasks and no
//! single one that everything queues behind. Ten nice steps ahead of its process the
//! writer waited 10–12%, and ingest→commit p99 fell by about half (docs/performance.md,
//! twenty-seventh stop). The checkpointer keeps the process's priority: nothing waits
//! for it.
//!
//! Lowering a nice value needs `CAP_SYS_NICE` or a nice limit (`RLIMIT_NICE`, systemd's
//! `LimitNICE=`); without either the threads keep the process's priority and the log
//! says so once. Linux only: elsewhere the nice value belongs to the whole process.

use std::sync::Once;

/// How the writer and the WAL syncer are scheduled (the `writer_priority` URL parameter
/// of [`crate::open_store`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriterPriority {
    /// [`RAISED_BY`] nice steps ahead of the thread that opened the store (at most -20),
    /// where the process may raise a thread's priority. The default.
    #[default]
    Raised,
    /// The process's own priority.
    Normal,
}

/// How many nice steps [`WriterPriority::Raised`] puts the commit path ahead: enough
/// that the writer all but never waits for a core behind the process's other threads
/// (five steps left it waiting 23–25% of a core, ten 10–12%).
pub const RAISED_BY: i32 = 10;

impl WriterPriority {
    /// Parses `raised` / `normal`.
    pub fn parse(s: &str) -> Option<WriterPriority> {
        match s.to_ascii_lowercase().as_str() {
            "raised" => Some(WriterPriority::Raised),
            "normal" => Some(WriterPriority::Normal),
            _ => None,
        }
    }
}

/// Applies `priority` to the calling thread, `thread` naming it in the log.
pub(super) fn apply_to_this_thread(priority: WriterPriority, thread: &str) {
    if priority == WriterPriority::Normal {
        return;
    }
    match raise_this_thread(RAISED_BY) {
        Ok(nice) => tracing::debug!(thread, nice, "archive thread's priority raised"),
        Err(e) => {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    error = %e,
                    "the archive's writer keeps the process's priority: raising it needs CAP_SYS_NICE or a nice limit (RLIMIT_NICE); writer_priority=normal in the archive URL says not to try"
                );
            });
        }
    }
}

/// Lowers the calling thread's nice value by `steps` (to -20 at most); returns the new one.
#[cfg(target_os = "linux")]
fn raise_this_thread(steps: i32) -> std::io::Result<i32> {
    use rustix::process::{getpriority_process, setpriority_process};
    let tid = Some(rustix::thread::gettid());
    let nice = (getpriority_process(tid)? - steps).max(-20);
    setpriority_process(tid, nice)?;
    Ok(nice)
}

#[cfg(not(target_os = "linux"))]
fn raise_this_thread(_steps: i32) -> std::io::Result<i32> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "a thread's own priority is Linux-only",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
    }

    #[test]
    fn raised_puts_only_the_calling_thread_ahead_where_the_process_may() {
        let before = nice_of_this_thread();
        let (raised, allowed) = std::thread::spawn(move || {
            // Whether this process may lower a nice value at all (root, CAP_SYS_NICE);
            // putting it back up is always allowed.
            let tid = Some(rustix::thread::gettid());
            let allowed = rustix::process::setpriority_process(tid, (before - 1).max(-20)).is_ok();
            rustix::process::setpriority_process(tid, before).unwrap();
            apply_to_this_thread(WriterPriority::Raised, "test");
            (nice_of_this_thread(), allowed)
        })
        .join()
        .unwrap();
        if allowed {
            assert_eq!(raised, (before - RAISED_BY).max(-20));
        } else {
            assert_eq!(
                raised, before,
                "no privilege: the thread keeps its priority"
            );
        }
        assert_eq!(nice_of_this_thread(), before, "the caller is untouched");
    }

    /// The nice value of each of this process's threads named `name`.
    fn nice_of_threads(name: &str) -> Vec<i32> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ...`: the fields after the comm's closing parenthesis.
            let Some((head, fields)) = stat.rsplit_once(") ") else {
                continue;
            };
            if head.split_once(" (").map(|(_, comm)| comm) == Some(name) {
                // Field 19 of the whole line is the 17th after the comm.
                out.push(fields.split(' ').nth(16).unwrap().parse().unwrap());
            }
        }
        out
    }

    #[tokio::test]
    async fn a_store_raises_its_writer_and_syncer_once_and_leaves_the_checkpointer() {
        let before = nice_of_this_thread();
        let dir = tempfile::tempdir().unwrap();
        let _store = crate::SqliteStore::open(&dir.path().join("p.db"))
            .await
            .unwrap();
        let raised = (before - RAISED_BY).max(-20);
        // Other tests' stores run beside this one, raised or not: each thread is at the
        // process's priority or ten steps ahead, never further, and no checkpointer is.
        for name in ["sg-archive-sqli", "sg-archive-sync"] {
            let nice = nice_of_threads(name);
            assert!(!nice.is_empty(), "no {name} thread");
            assert!(
                nice.iter().all(|n| *n == before || *n == raised),
                "{name}: {nice:?}, process at {before}"
            );
        }
        let checkpointers = nice_of_threads("sg-archive-ckpt");
        assert!(
            checkpointers.iter().all(|n| *n == before),
            "checkpointers at {checkpointers:?}, process at {before}"
        );
    }

    #[test]
    fn normal_leaves_the_thread_alone() {
        let nice = std::thread::spawn(|| {
            let before = nice_of_this_thread();
            apply_to_this_thread(WriterPriority::Normal, "test");
            (before, nice_of_this_thread())
        })
        .join()
        .unwrap();
        assert_eq!(nice.0, nice.1);
    }

    #[test]
    fn parses_the_url_values() {
        assert_eq!(
            WriterPriority::parse("Raised"),
            Some(WriterPriority::Raised)
        );
        assert_eq!(
            WriterPriority::parse("normal"),
            Some(WriterPriority::Normal)
        );
        assert_eq!(WriterPriority::parse("high"), None);
    }
}

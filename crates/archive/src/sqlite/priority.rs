//! The commit path's threads ask for a core ahead of the rest of the process.
//!
//! The writer thread is the pipeline's one serial stage, and the WAL syncer answers its
//! commits: every event behind a commit waits as long as they do. On a busy box
//! (`streamgate up`, or an archiver beside other work) both waited for a core about as
//! long as they ran — `bench pipeline` at 80% of the maximum: the writer ran 48% of a
//! core and waited 41% — while the tokio workers beside them have many tasks and no
//! single one that everything queues behind. Ten nice steps ahead of its process the
//! writer waited 10–14%, ingest→commit p50 fell by a fifth to two fifths and p99 by up
//! to two thirds (docs/performance.md, twenty-seventh stop). The checkpointer keeps the
//! process's priority: nothing waits for it.
//!
//! Lowering a nice value needs `CAP_SYS_NICE` or a nice limit (`RLIMIT_NICE`, systemd's
//! `LimitNICE=`; a limit short of ten steps gets as far as it allows); without either
//! the threads keep the process's priority and the log says so once. Linux only:
//! elsewhere the nice value belongs to the whole process.

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
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            tracing::debug!(thread, error = %e, "archive thread keeps the process's priority");
        }
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

/// Lowers the calling thread's nice value by `steps` (to -20 at most), or as far as the
/// process's nice limit allows where it may not go that far (the kernel refuses a value
/// past the limit rather than stopping at it); returns the new value.
#[cfg(target_os = "linux")]
fn raise_this_thread(steps: i32) -> std::io::Result<i32> {
    use rustix::process::{getpriority_process, getrlimit, setpriority_process, Resource};
    let tid = Some(rustix::thread::gettid());
    let now = getpriority_process(tid)?;
    let wanted = (now - steps).max(-20);
    match setpriority_process(tid, wanted) {
        Ok(()) => Ok(wanted),
        Err(denied) => {
            // RLIMIT_NICE = n lets an unprivileged thread go down to 20 - n.
            let limit = getrlimit(Resource::Nice).current.unwrap_or(u64::MAX);
            let floor = 20 - i32::try_from(limit).unwrap_or(40).min(40);
            let reachable = wanted.max(floor);
            if reachable >= now {
                return Err(denied.into());
            }
            setpriority_process(tid, reachable)?;
            Ok(reachable)
        }
    }
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
    fn raised_puts_only_the_calling_thread_ahead_as_far_as_the_process_may() {
        let before = nice_of_this_thread();
        let (raised, full, some) = std::thread::spawn(move || {
            // How far this process may lower a nice value (root or CAP_SYS_NICE: all the
            // way; a nice limit: part of it); putting it back up is always allowed.
            let tid = Some(rustix::thread::gettid());
            let may = |to: i32| {
                let ok = rustix::process::setpriority_process(tid, to).is_ok();
                rustix::process::setpriority_process(tid, before).unwrap();
                ok
            };
            let full = may((before - RAISED_BY).max(-20));
            let some = may((before - 1).max(-20));
            apply_to_this_thread(WriterPriority::Raised, "test");
            (nice_of_this_thread(), full, some)
        })
        .join()
        .unwrap();
        if full {
            assert_eq!(raised, (before - RAISED_BY).max(-20));
        } else if some {
            assert!(raised < before && raised > before - RAISED_BY, "{raised}");
        } else {
            assert_eq!(
                raised, before,
                "no privilege: the thread keeps its priority"
            );
        }
        assert_eq!(nice_of_this_thread(), before, "the caller is untouched");
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

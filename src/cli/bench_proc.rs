//! What `/proc` tells about a process while a benchmark runs: its CPU time, the bytes it
//! sent to storage, its threads' time on a core and waiting for one, and its context
//! switches — of this process or of the nats-server it spawned. Read with procfs
//! (already in the tree through metrics-process, which reads only its own process).
//! Outside Linux each reads as `None` (or empty): the CPU figures print as NaN and the
//! other lines they feed are left out.

/// CPU time (user + system) a process has used so far, in seconds: this process, or
/// the one with `pid`; `None` where it cannot be read (the process is gone).
#[cfg(target_os = "linux")]
pub(crate) fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let stat = process(pid)?.stat().ok()?;
    Some((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
}

/// This process, or the one with `pid`; `None` where it cannot be opened (it is gone).
#[cfg(target_os = "linux")]
fn process(pid: Option<u32>) -> Option<procfs::process::Process> {
    match pid {
        Some(pid) => procfs::process::Process::new(i32::try_from(pid).ok()?).ok(),
        None => procfs::process::Process::myself().ok(),
    }
}

/// Not read outside Linux: the figure prints as NaN.
#[cfg(not(target_os = "linux"))]
pub(crate) fn cpu_seconds(_pid: Option<u32>) -> Option<f64> {
    None
}

/// Bytes a process has sent to the storage layer so far (`write_bytes` of
/// `/proc/<pid>/io`: pages it dirtied in files, not its socket writes): this process, or
/// the one with `pid`; `None` where it cannot be read.
#[cfg(target_os = "linux")]
pub(crate) fn storage_bytes(pid: Option<u32>) -> Option<u64> {
    Some(process(pid)?.io().ok()?.write_bytes)
}

/// Not read outside Linux: the `disk` line is left out.
#[cfg(not(target_os = "linux"))]
pub(crate) fn storage_bytes(_pid: Option<u32>) -> Option<u64> {
    None
}

/// Context switches so far, `[voluntary, involuntary]`, summed over the threads alive
/// now: of this process, or of the one with `pid`; `None` where it cannot be read. A
/// voluntary switch is a thread going to sleep until its next message or reply: handing
/// a message to a thread that sleeps costs one. An involuntary one is the scheduler
/// taking a thread's core away (the box is saturated). A thread that ended takes its
/// counts with it, so a delta over a run is a floor.
#[cfg(target_os = "linux")]
pub(crate) fn context_switches(pid: Option<u32>) -> Option<[u64; 2]> {
    let tasks = process(pid)?.tasks().ok()?;
    Some(
        tasks
            .flatten()
            .filter_map(|t| switches_of(&t))
            .fold([0, 0], |sum, t| [sum[0] + t[0], sum[1] + t[1]]),
    )
}

/// One thread's context switches so far, `[voluntary, involuntary]`.
#[cfg(target_os = "linux")]
fn switches_of(task: &procfs::process::Task) -> Option<[u64; 2]> {
    let status = task.status().ok()?;
    Some([
        status.voluntary_ctxt_switches.unwrap_or(0),
        status.nonvoluntary_ctxt_switches.unwrap_or(0),
    ])
}

/// Not read outside Linux: the `switches` line is left out.
#[cfg(not(target_os = "linux"))]
pub(crate) fn context_switches(_pid: Option<u32>) -> Option<[u64; 2]> {
    None
}

/// Per thread name: its threads' times and priority ([`ThreadTime`]).
pub(crate) type ThreadTimes = std::collections::BTreeMap<String, ThreadTime>;

/// What the threads of one name did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ThreadTime {
    /// Seconds on a core.
    pub ran: f64,
    /// Seconds runnable but waiting for a core.
    pub waited: f64,
    /// The lowest nice value among them (the most favoured), less the process's (its
    /// main thread's): 0 unless raised or lowered apart from the process.
    pub nice: i64,
}

/// On a core and runnable but waiting for one (the scheduler's run queue), in seconds so
/// far, per thread name, summed over that name's threads, with their nice value against
/// the process's: of this process, or of the one with `pid`. Empty where it cannot be
/// read.
#[cfg(target_os = "linux")]
pub(crate) fn thread_times(pid: Option<u32>) -> ThreadTimes {
    let mut times = ThreadTimes::new();
    let Some(process) = process(pid) else {
        return times;
    };
    let (Ok(tasks), Ok(main)) = (process.tasks(), process.stat()) else {
        return times;
    };
    for task in tasks.flatten() {
        let (Ok(stat), Ok(sched)) = (task.stat(), task.schedstat()) else {
            continue;
        };
        let nice = stat.nice - main.nice;
        let t = times.entry(stat.comm).or_insert(ThreadTime {
            nice,
            ..ThreadTime::default()
        });
        t.ran += sched.sum_exec_runtime as f64 / 1e9;
        t.waited += sched.run_delay as f64 / 1e9;
        t.nice = t.nice.min(nice);
    }
    times
}

/// Not read outside Linux: the `threads` line is left out.
#[cfg(not(target_os = "linux"))]
pub(crate) fn thread_times(_pid: Option<u32>) -> ThreadTimes {
    ThreadTimes::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_time_is_read_from_proc_and_grows_with_work() {
        let before = cpu_seconds(None).expect("this process's CPU time");
        let own = cpu_seconds(Some(std::process::id())).expect("the same, by pid");
        assert!(own >= before, "{own} < {before}");
        // Spin until the clock-tick counters move (USER_HZ: 10 ms a tick).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        while cpu_seconds(None).unwrap_or(0.0) < before + 0.05 {
            assert!(
                Instant::now() < deadline,
                "no CPU time counted after 10 s of work"
            );
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        assert_eq!(cpu_seconds(Some(u32::MAX)), None, "no such process");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn storage_bytes_count_what_a_file_write_sends_to_disk() {
        // Beside the sources, not in $TMPDIR: a tmpfs sends nothing to storage.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let before = storage_bytes(None).expect("this process's storage writes");
        std::fs::write(dir.path().join("f"), vec![7u8; 1 << 20]).unwrap();
        let after = storage_bytes(None).unwrap();
        assert!(after >= before + (1 << 20), "{before} → {after}");
        assert_eq!(storage_bytes(Some(u32::MAX)), None, "no such process");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn thread_times_are_read_per_thread_name_and_grow_with_work() {
        let spin = std::thread::Builder::new()
            .name("sg-bench-spin".to_owned())
            .spawn(|| {
                // Until the thread itself has run 30 ms (on a loaded box 30 ms of wall
                // time can be much less of a core), or 10 s have passed.
                let (started, mut x) = (Instant::now(), 0u64);
                loop {
                    for _ in 0..100_000 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                    }
                    let times = thread_times(None);
                    let ran = times.get("sg-bench-spin").map_or(0.0, |t| t.ran);
                    if ran >= 0.03 || started.elapsed() > Duration::from_secs(10) {
                        break times;
                    }
                }
            })
            .expect("a thread");
        let times = spin.join().expect("the spinning thread");
        let ThreadTime { ran, waited, nice } = times["sg-bench-spin"];
        assert!(ran >= 0.02, "ran {ran} s");
        assert!(waited >= 0.0);
        assert_eq!(nice, 0, "a thread at the process's priority");
        assert!(thread_times(Some(u32::MAX)).is_empty(), "no such process");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_that_sleeps_counts_voluntary_switches() {
        // This thread's own counts: other tests' threads end while it sleeps, and take
        // theirs out of the process's sum.
        fn this_thread() -> [u64; 2] {
            let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
            let tid = link
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
                .expect("a thread id");
            let task = process(None)
                .and_then(|p| p.task_from_tid(tid).ok())
                .expect("this thread's task");
            switches_of(&task).expect("its switches")
        }
        let sleeper = std::thread::spawn(|| {
            let before = this_thread();
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let after = this_thread();
            // Read while this thread is alive: the sum over the process includes it.
            (
                before,
                after,
                context_switches(None).expect("this process's switches"),
            )
        });
        let (before, after, process) = sleeper.join().expect("the sleeping thread");
        assert!(after[0] >= before[0] + 20, "{before:?} → {after:?}");
        assert!(after[1] >= before[1]);
        assert!(
            process[0] >= after[0] && process[1] >= after[1],
            "{process:?} < {after:?}"
        );
        assert_eq!(context_switches(Some(u32::MAX)), None, "no such process");
    }
}

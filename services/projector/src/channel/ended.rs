//! Recently ended runs, kept in memory for a bounded window so a client asking after a
//! run that just ended (`streamgate tail --run X`) gets its final answer at once. The
//! channel never reads the archive (operator-only); what it forgot, `streamgate replay`
//! has.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

/// At most this many ended runs are remembered…
const MAX_RUNS: usize = 1024;
/// …for at most this long.
const MAX_AGE: Duration = Duration::from_secs(3600);

/// One ended run as the channel rendered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedRun {
    /// Chat it rendered into.
    pub chat_id: String,
    /// Its final answer as sent to the channel (`None`: the run ended without one).
    pub final_text: Option<String>,
    /// When it ended.
    pub ended_at: SystemTime,
}

/// The bounded memory.
#[derive(Debug, Default)]
pub(super) struct EndedRuns {
    by_run: HashMap<String, (Instant, EndedRun)>,
    order: VecDeque<(Instant, String)>,
}

impl EndedRuns {
    pub(super) fn insert(&mut self, run_id: String, run: EndedRun) {
        let now = Instant::now();
        self.expire(now);
        if self.by_run.insert(run_id.clone(), (now, run)).is_none() {
            self.order.push_back((now, run_id));
        }
        while self.by_run.len() > MAX_RUNS {
            let Some((_, old)) = self.order.pop_front() else {
                break;
            };
            self.by_run.remove(&old);
        }
    }

    pub(super) fn get(&mut self, run_id: &str) -> Option<EndedRun> {
        self.expire(Instant::now());
        self.by_run.get(run_id).map(|(_, r)| r.clone())
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < MAX_AGE {
                break;
            }
            if let Some((_, run)) = self.order.pop_front() {
                self.by_run.remove(&run);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> EndedRun {
        EndedRun {
            chat_id: "c".into(),
            final_text: Some(text.into()),
            ended_at: SystemTime::now(),
        }
    }

    #[test]
    fn keeps_the_newest_runs_up_to_the_bound() {
        let mut e = EndedRuns::default();
        for i in 0..MAX_RUNS + 10 {
            e.insert(format!("r{i}"), run(&i.to_string()));
        }
        assert_eq!(e.get("r0"), None);
        assert_eq!(e.get("r9"), None);
        let last = format!("r{}", MAX_RUNS + 9);
        assert_eq!(
            e.get(&last).and_then(|r| r.final_text),
            Some((MAX_RUNS + 9).to_string())
        );
        assert_eq!(e.by_run.len(), MAX_RUNS);
    }
}

//! Recently ended runs, kept in memory for a bounded window so a client asking after a
//! run that just ended (`streamgate tail --run X`) gets its final answer at once. The
//! channel never reads the archive (operator-only); what it forgot, `streamgate replay`
//! has.

use super::{resolve, Lookup, RunKey};
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
    by_run: HashMap<RunKey, (Instant, EndedRun)>,
    order: VecDeque<(Instant, RunKey)>,
}

impl EndedRuns {
    pub(super) fn insert(&mut self, run_id: RunKey, run: EndedRun) {
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

    /// Forgets the runs an erasure removed.
    pub(super) fn forget(&mut self, erased: &streamgate_bus::erase::Erased) {
        self.by_run
            .retain(|(tenant, run), _| !erased.covers(tenant, run));
        let by_run = &self.by_run;
        self.order.retain(|(_, key)| by_run.contains_key(key));
    }

    /// Every run remembered, in no particular order.
    pub(super) fn all(&mut self) -> Vec<(RunKey, EndedRun)> {
        self.expire(Instant::now());
        self.by_run
            .iter()
            .map(|(k, (_, r))| (k.clone(), r.clone()))
            .collect()
    }

    /// `run_id` of `tenant` (empty: of the only tenant with an ended run of that id).
    pub(super) fn get(&mut self, tenant: &str, run_id: &str) -> Lookup<(RunKey, EndedRun)> {
        self.expire(Instant::now());
        match resolve(self.by_run.keys(), tenant, run_id) {
            Lookup::Found(k) => match self.by_run.get(&k) {
                Some((_, r)) => Lookup::Found((k, r.clone())),
                None => Lookup::Missing,
            },
            Lookup::Missing => Lookup::Missing,
            Lookup::Ambiguous => Lookup::Ambiguous,
        }
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
            e.insert(("t".into(), format!("r{i}")), run(&i.to_string()));
        }
        assert_eq!(e.get("t", "r0"), Lookup::Missing);
        assert_eq!(e.get("", "r9"), Lookup::Missing);
        let last = format!("r{}", MAX_RUNS + 9);
        let Lookup::Found((_, r)) = e.get("t", &last) else {
            panic!("the newest run is kept");
        };
        assert_eq!(r.final_text, Some((MAX_RUNS + 9).to_string()));
        assert_eq!(e.by_run.len(), MAX_RUNS);
    }

    /// The same run id under two tenants: two ended runs; naming no tenant finds the
    /// run only while one tenant has it.
    #[test]
    fn tenants_are_kept_apart() {
        let mut e = EndedRuns::default();
        e.insert(("acme".into(), "r1".into()), run("acme's"));
        let Lookup::Found((k, r)) = e.get("", "r1") else {
            panic!("one tenant: found without naming it");
        };
        assert_eq!(
            (k.0.as_str(), r.final_text.as_deref()),
            ("acme", Some("acme's"))
        );
        e.insert(("globex".into(), "r1".into()), run("globex's"));
        assert_eq!(e.get("", "r1"), Lookup::Ambiguous);
        for t in ["acme", "globex"] {
            let Lookup::Found((k, r)) = e.get(t, "r1") else {
                panic!("{t}: found");
            };
            assert_eq!(k, (t.to_owned(), "r1".to_owned()));
            assert_eq!(r.final_text, Some(format!("{t}'s")));
        }
        assert_eq!(e.get("initech", "r1"), Lookup::Missing);
    }
}

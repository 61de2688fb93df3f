//! The web channel's run list: which runs the page lists (live and ended), bounded by
//! count and age. What the page shows *of* a run comes from the run stream
//! ([`crate::run_stream`]), never from here.
//!
//! A row is created and updated by the channel's ops (a draft: live; a final, settle,
//! retraction or error notice: ended, with its status and a line of preview), and seeded
//! at start from `SG_EVENTS` ([`Runs::seed`], one last event per run): after a restart
//! the page lists the runs the stream still holds. The channel never reads the archive.
//!
//! Every change bumps a version that the list stream (`GET /api/runs/events`) watches.

use serde::Serialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use streamgate_grammar::{EventData, LifecyclePhase, RunEvent, StopReason};
use streamgate_projection::{
    DraftKey, Op, ERRORED, INCOMPLETE, INTERRUPTED, PAUSED, REJECT_PLACEHOLDER,
};
use streamgate_runtime::clock::now_ms;
use tokio::sync::watch;

/// Most runs listed; the oldest ended runs go first.
pub const MAX_RUNS: usize = 200;
/// Ended runs are forgotten this long after they ended; live runs this long after their
/// last op (an abandoned run must not stay forever).
pub const MAX_AGE: Duration = Duration::from_secs(6 * 3600);
/// The list is pushed to a page at most this often.
pub const MIN_PUSH_INTERVAL: Duration = Duration::from_millis(250);
/// Characters of preview per row.
const PREVIEW_CHARS: usize = 90;

type RunKey = (String, String);

/// How a run stands, for the status dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// In flight.
    Live,
    /// Answered.
    Completed,
    /// Suspended.
    Paused,
    /// Ended without an answer.
    Incomplete,
    /// Errored or aborted.
    Error,
    /// The agent died mid-turn.
    Interrupted,
    /// The provider withdrew the answer.
    Withdrawn,
}

/// A row of the run list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunRow {
    /// The run.
    pub run_id: String,
    /// Its tenant (a run id is unique only within its tenant).
    pub tenant: String,
    /// Its chat (empty for a run seeded from the event stream).
    pub chat_id: String,
    /// Status.
    pub status: RunStatus,
    /// First seen (ms since the epoch).
    pub started_ms: i64,
    /// Last change.
    pub updated_ms: i64,
    /// When it ended.
    pub ended_ms: Option<i64>,
    /// A line of preview: the start of the answer.
    pub preview: String,
}

/// The status a run's terminal event gives it.
pub fn status_of_end(ev: &RunEvent) -> Option<RunStatus> {
    let EventData::Lifecycle(l) = &ev.event.data else {
        return None;
    };
    if !l.is_terminal() {
        return None;
    }
    Some(match (&l.phase, &l.reason) {
        (LifecyclePhase::Error, _) => RunStatus::Error,
        (_, Some(StopReason::Paused)) => RunStatus::Paused,
        (_, Some(StopReason::Completed | StopReason::ToolUse | StopReason::StopSequence)) => {
            RunStatus::Completed
        }
        (_, Some(StopReason::Truncated)) => RunStatus::Completed,
        (_, None) => RunStatus::Completed,
        _ => RunStatus::Incomplete,
    })
}

/// A line of preview from an answer: its first non-empty line without markdown marks.
fn preview(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    line.trim()
        .trim_start_matches(['#', '>', '-', '*', ' '])
        .replace(['*', '`', '_'], "")
        .chars()
        .take(PREVIEW_CHARS)
        .collect()
}

/// The runs the page lists and a version that moves on every change.
pub struct Runs {
    inner: Mutex<HashMap<RunKey, RunRow>>,
    changed: watch::Sender<u64>,
    max_runs: usize,
    max_age_ms: i64,
}

impl Default for Runs {
    fn default() -> Self {
        Runs::new(MAX_RUNS, MAX_AGE)
    }
}

impl Runs {
    /// A window of at most `max_runs` runs, none older than `max_age`.
    pub fn new(max_runs: usize, max_age: Duration) -> Runs {
        Runs {
            inner: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
            max_runs: max_runs.max(1),
            max_age_ms: i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunKey, RunRow>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that sees every change.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Applies one op of the run `run` (rendering into `chat_id`).
    pub fn apply(&self, run: &DraftKey, chat_id: &str, op: &Op) {
        let now = now_ms();
        {
            let mut runs = self.lock();
            let r = self.row(&mut runs, &run.tenant, &run.run_id, now);
            if r.chat_id.is_empty() {
                chat_id.clone_into(&mut r.chat_id);
            }
            r.updated_ms = now;
            match op {
                Op::Typing | Op::Draft { .. } => {}
                Op::Settle { text, .. } => {
                    r.ended_ms.get_or_insert(now);
                    let t = text.trim();
                    r.status = match t {
                        _ if t == PAUSED => RunStatus::Paused,
                        _ if t == INCOMPLETE => RunStatus::Incomplete,
                        _ if t == ERRORED => RunStatus::Error,
                        _ if t == INTERRUPTED => RunStatus::Interrupted,
                        _ if t == REJECT_PLACEHOLDER => RunStatus::Withdrawn,
                        _ if r.status == RunStatus::Live => RunStatus::Completed,
                        _ => r.status,
                    };
                }
                Op::Dismiss { .. } => {
                    r.ended_ms.get_or_insert(now);
                    if r.status == RunStatus::Live {
                        r.status = RunStatus::Completed;
                    }
                }
                Op::Final { text, .. } => {
                    r.preview = preview(text);
                    r.ended_ms.get_or_insert(now);
                    if r.status == RunStatus::Live {
                        r.status = RunStatus::Completed;
                    }
                }
                Op::Retract { .. } => {
                    r.status = RunStatus::Withdrawn;
                    r.ended_ms.get_or_insert(now);
                }
                Op::Notice { text, .. } => {
                    if text.starts_with('❌') {
                        r.status = RunStatus::Error;
                    }
                }
            }
        }
        self.bump();
    }

    /// The row of a run, created (after making room) when new.
    fn row<'a>(
        &self,
        runs: &'a mut HashMap<RunKey, RunRow>,
        tenant: &str,
        run_id: &str,
        now: i64,
    ) -> &'a mut RunRow {
        let key = (tenant.to_owned(), run_id.to_owned());
        if !runs.contains_key(&key) {
            Self::evict(runs, now, self.max_runs - 1, self.max_age_ms);
        }
        runs.entry(key).or_insert_with(|| RunRow {
            run_id: run_id.to_owned(),
            tenant: tenant.to_owned(),
            chat_id: String::new(),
            status: RunStatus::Live,
            started_ms: now,
            updated_ms: now,
            ended_ms: None,
            preview: String::new(),
        })
    }

    /// Adds runs found in the event stream at start: the last event of each (`first_ms`
    /// when known), skipped when the run is listed already (its ops know better).
    pub fn seed(&self, last: impl IntoIterator<Item = (RunEvent, Option<String>)>) {
        let now = now_ms();
        let mut found: Vec<RunRow> = last
            .into_iter()
            .map(|(ev, answer)| {
                let end = status_of_end(&ev);
                RunRow {
                    run_id: ev.envelope.run_id.clone(),
                    tenant: ev.envelope.tenant.clone(),
                    chat_id: String::new(),
                    status: end.unwrap_or(RunStatus::Live),
                    started_ms: ev.envelope.ts_ms,
                    updated_ms: ev.envelope.ts_ms,
                    ended_ms: end.map(|_| ev.envelope.ts_ms),
                    preview: answer.as_deref().map(preview).unwrap_or_default(),
                }
            })
            .filter(|r| now.saturating_sub(r.updated_ms) < self.max_age_ms)
            .collect();
        // Newest first: when the stream holds more than the window, the newest stay.
        found.sort_by_key(|r| std::cmp::Reverse(r.updated_ms));
        found.truncate(self.max_runs);
        {
            let mut runs = self.lock();
            for r in found {
                let key = (r.tenant.clone(), r.run_id.clone());
                if runs.contains_key(&key) {
                    continue;
                }
                Self::evict(&mut runs, now, self.max_runs - 1, self.max_age_ms);
                runs.insert(key, r);
            }
        }
        self.bump();
    }

    /// Forgets the runs an erasure removed (their row and preview).
    pub fn forget(&self, erased: &streamgate_bus::erase::Erased) {
        let before = {
            let mut runs = self.lock();
            let before = runs.len();
            runs.retain(|(tenant, run), _| !erased.covers(tenant, run));
            before - runs.len()
        };
        if before > 0 {
            self.bump();
        }
    }

    /// Drops runs past the age window, then the oldest (ended first) down to `keep`.
    fn evict(runs: &mut HashMap<RunKey, RunRow>, now: i64, keep: usize, max_age_ms: i64) {
        runs.retain(|_, r| now.saturating_sub(r.ended_ms.unwrap_or(r.updated_ms)) < max_age_ms);
        if runs.len() <= keep {
            return;
        }
        let mut order: Vec<(bool, i64, RunKey)> = runs
            .iter()
            .map(|(k, r)| (r.ended_ms.is_none(), r.updated_ms, k.clone()))
            .collect();
        // Ended before live, then oldest first.
        order.sort();
        for (_, _, k) in order.into_iter().take(runs.len() - keep) {
            runs.remove(&k);
        }
    }

    /// The run list, newest first.
    pub fn list(&self) -> Vec<RunRow> {
        let now = now_ms();
        let mut runs = self.lock();
        Self::evict(&mut runs, now, self.max_runs, self.max_age_ms);
        let mut v: Vec<RunRow> = runs.values().cloned().collect();
        v.sort_by(|a, b| {
            b.started_ms
                .cmp(&a.started_ms)
                .then_with(|| b.run_id.cmp(&a.run_id))
                .then_with(|| b.tenant.cmp(&a.tenant))
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(run: &str) -> DraftKey {
        DraftKey {
            run_id: run.to_owned(),
            tenant: String::new(),
        }
    }

    fn draft(run: &str) -> Op {
        Op::Draft {
            key: key(run),
            text: "working".to_owned(),
            seq: 1,
            live: None,
        }
    }

    fn final_op(run: &str, text: &str) -> Op {
        Op::Final {
            key: key(run),
            text: text.to_owned(),
            suffix: None,
            truncated: false,
            seq: 2,
        }
    }

    #[test]
    fn a_draft_lists_a_live_run_and_a_final_ends_it_with_a_preview() {
        let runs = Runs::default();
        runs.apply(&key("r1"), "c1", &draft("r1"));
        let l = runs.list();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].status, RunStatus::Live);
        assert_eq!(l[0].chat_id, "c1");
        runs.apply(
            &key("r1"),
            "c1",
            &final_op("r1", "\n## **Paris** today\nmore"),
        );
        let l = runs.list();
        assert_eq!(l[0].status, RunStatus::Completed);
        assert_eq!(l[0].preview, "Paris today");
        assert!(l[0].ended_ms.is_some());
    }

    #[test]
    fn the_window_keeps_the_newest_runs_and_live_ones_first() {
        let runs = Runs::new(2, MAX_AGE);
        runs.apply(&key("a"), "c", &draft("a"));
        runs.apply(&key("b"), "c", &final_op("b", "x"));
        runs.apply(&key("c"), "c", &draft("c"));
        let ids: Vec<String> = runs.list().into_iter().map(|r| r.run_id).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&"a".to_owned()) && ids.contains(&"c".to_owned()));
    }

    #[test]
    fn seeded_runs_do_not_overwrite_what_ops_said() {
        let runs = Runs::default();
        runs.apply(&key("r1"), "c1", &draft("r1"));
        let ev = |run: &str, line: &str| RunEvent {
            envelope: streamgate_grammar::Envelope {
                tenant: String::new(),
                session_key: None,
                run_id: run.to_owned(),
                ts_ms: now_ms() - 1000,
            },
            event: streamgate_grammar::Event::from_json(line).unwrap_or_else(|e| panic!("{e}")),
        };
        let end = r#"{"seq":3,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#;
        runs.seed([
            (ev("r1", end), Some("old".to_owned())),
            (ev("r0", end), Some("Earlier answer".to_owned())),
        ]);
        let l = runs.list();
        assert_eq!(l.len(), 2);
        let r1 = l
            .iter()
            .find(|r| r.run_id == "r1")
            .unwrap_or_else(|| panic!("r1"));
        assert_eq!(r1.status, RunStatus::Live);
        let r0 = l
            .iter()
            .find(|r| r.run_id == "r0")
            .unwrap_or_else(|| panic!("r0"));
        assert_eq!(r0.status, RunStatus::Completed);
        assert_eq!(r0.preview, "Earlier answer");
    }
}

//! The web channel's memory of recent runs: what the page shows of each (live and
//! ended), bounded by count and age. The channel never reads the archive for it: a run
//! appears here once the channel rendered something of it, and goes when the window
//! moves past it.
//!
//! Every op updates the run's record in place (drafts latest-wins) and bumps a version
//! the page streams watch; a stream sends the run's current [`RunView`] when its version
//! moved, at most [`MIN_PUSH_INTERVAL`] apart, so a fast run costs the channel one
//! record update per op and the page at most ~10 snapshots a second.

use super::markdown;
use crate::channel::{resolve, Lookup, RunKey};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use streamgate_projection::{
    draft_line_kind, DraftKey, DraftLine, Op, ERRORED, INCOMPLETE, INTERRUPTED, PAUSED,
    REJECT_PLACEHOLDER,
};
use tokio::sync::watch;

/// Most runs remembered; the oldest ended runs go first.
pub const MAX_RUNS: usize = 200;
/// Ended runs are forgotten this long after they ended; live runs this long after their
/// last op (an abandoned run must not stay forever).
pub const MAX_AGE: Duration = Duration::from_secs(6 * 3600);
/// Snapshots of one run to one page at most this often (~10/s).
pub const MIN_PUSH_INTERVAL: Duration = Duration::from_millis(100);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// How a run stands, for the status badge.
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

/// Timing of one thinking segment, from the events' timestamps.
#[derive(Debug, Clone, Default)]
struct ThinkTiming {
    id: Option<String>,
    first_ms: i64,
    last_ms: i64,
}

#[derive(Debug, Default)]
struct Record {
    chat_id: String,
    started_ms: i64,
    updated_ms: i64,
    ended_ms: Option<i64>,
    status: Option<RunStatus>,
    /// Lines of the newest draft that had any (a settle keeps them: the activity stays).
    lines: Vec<String>,
    /// The final answer as far as the page renders it ([`markdown::MAX_RENDER_BYTES`]),
    /// and its full length in bytes: memory per run stays bounded.
    final_text: Option<Arc<str>>,
    final_len: usize,
    final_html: Option<Arc<str>>,
    suffix: Option<String>,
    notices: Vec<String>,
    withdrawn: Option<String>,
    thinking: Vec<ThinkTiming>,
    version: u64,
}

impl Record {
    fn status(&self) -> RunStatus {
        self.status.unwrap_or(if self.ended_ms.is_some() {
            RunStatus::Completed
        } else {
            RunStatus::Live
        })
    }
}

/// One step of a run's activity, in draft order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// A thinking block.
    Thinking {
        /// Its text (no quote marks, no lane labels).
        text: String,
        /// How long the model thought, when known.
        secs: Option<u64>,
        /// Still streaming.
        active: bool,
    },
    /// A tool row: `emoji name status — detail` (display-safe).
    Tool {
        /// Emoji of the tool's kind.
        icon: String,
        /// Tool name.
        name: String,
        /// `running`, `done` or `failed`.
        state: &'static str,
        /// Display-safe detail (arguments, result).
        detail: String,
    },
    /// Commentary (markdown, sanitized HTML).
    Text {
        /// Rendered HTML.
        html: String,
    },
}

/// What the page shows of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    /// The run.
    pub run_id: String,
    /// Its tenant (a run id is unique only within its tenant).
    pub tenant: String,
    /// Its chat.
    pub chat_id: String,
    /// Status badge.
    pub status: RunStatus,
    /// First op (ms since the epoch).
    pub started_ms: i64,
    /// Last op.
    pub updated_ms: i64,
    /// When it ended.
    pub ended_ms: Option<i64>,
    /// Activity: thinking, tool rows, commentary.
    pub steps: Vec<Step>,
    /// The final answer, rendered.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "shared_str")]
    pub final_html: Option<Arc<str>>,
    /// The final's suffix line (truncation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Notices (errors, clamps, withdrawal).
    pub notices: Vec<String>,
    /// Version of the record this view was taken at.
    pub version: u64,
}

fn shared_str<S: serde::Serializer>(v: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(t) => s.serialize_str(t),
        None => s.serialize_none(),
    }
}

/// A row of the run list.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// The run.
    pub run_id: String,
    /// Its tenant (a run id is unique only within its tenant).
    pub tenant: String,
    /// Its chat.
    pub chat_id: String,
    /// Status badge.
    pub status: RunStatus,
    /// First op.
    pub started_ms: i64,
    /// Last op.
    pub updated_ms: i64,
    /// When it ended.
    pub ended_ms: Option<i64>,
    /// A line of preview (start of the answer, else of the activity).
    pub preview: String,
}

/// The tool row emoji (as the projection renders them).
const TOOL_ICONS: [&str; 6] = ["✏️", "💻", "🌐", "🔍", "📄", "🔧"];

fn tool_step(line: &str) -> Step {
    let (icon, rest) = TOOL_ICONS
        .iter()
        .find_map(|e| line.strip_prefix(e).map(|r| (*e, r.trim_start())))
        .unwrap_or(("🔧", line));
    let (head, detail) = rest.split_once(" — ").unwrap_or((rest, ""));
    let (name, state) = match head.rsplit_once(' ') {
        Some((n, "⏳")) => (n, "running"),
        Some((n, "✅")) => (n, "done"),
        Some((n, "❌")) => (n, "failed"),
        _ => (head, "running"),
    };
    Step::Tool {
        icon: icon.to_owned(),
        name: name.to_owned(),
        state,
        detail: detail.to_owned(),
    }
}

/// A thinking line without its quote mark, brain and lane label.
fn thinking_text(line: &str, first: bool) -> &str {
    let t = line.strip_prefix('>').unwrap_or(line);
    let t = t.strip_prefix(' ').unwrap_or(t);
    if !first {
        return t;
    }
    let t = t.strip_prefix("🧠").map_or(t, str::trim_start);
    for tag in ["[raw] ", "[summary] ", "[redacted] ", "[raw]", "[summary]"] {
        if let Some(r) = t.strip_prefix(tag) {
            return r;
        }
    }
    t
}

fn steps_of(lines: &[String]) -> Vec<(DraftLine, String)> {
    let mut out: Vec<(DraftLine, String)> = Vec::new();
    for l in lines {
        let kind = draft_line_kind(l);
        match (kind, out.last_mut()) {
            (DraftLine::Thinking, Some((DraftLine::Thinking, t))) => {
                // A new block starts with the brain again.
                let body = l.strip_prefix('>').unwrap_or(l).trim_start();
                if body.starts_with("🧠") {
                    out.push((kind, thinking_text(l, true).to_owned()));
                } else {
                    t.push('\n');
                    t.push_str(thinking_text(l, false));
                }
            }
            (DraftLine::Thinking, _) => out.push((kind, thinking_text(l, true).to_owned())),
            (DraftLine::Text, Some((DraftLine::Text, t))) => {
                t.push('\n');
                t.push_str(l);
            }
            (k, _) => out.push((k, l.clone())),
        }
    }
    out
}

fn view_of((tenant, run_id): &RunKey, r: &Record) -> RunView {
    let ended = r.ended_ms.is_some();
    let mut raw = steps_of(&r.lines);
    if r.final_text.is_some() || r.withdrawn.is_some() {
        // The answer was streamed as commentary: it is the final now, shown once.
        if matches!(raw.last(), Some((DraftLine::Text, _))) {
            raw.pop();
        }
    }
    let n = raw.len();
    let mut think_i = 0;
    let steps = raw
        .into_iter()
        .enumerate()
        .filter(|(_, (_, t))| !t.trim().is_empty())
        .map(|(i, (kind, text))| match kind {
            DraftLine::Thinking => {
                let timing = r.thinking.get(think_i);
                think_i += 1;
                let active = !ended && i + 1 == n;
                Step::Thinking {
                    secs: timing.map(|t| {
                        u64::try_from((t.last_ms - t.first_ms).max(0) / 1000).unwrap_or(0)
                    }),
                    text: text.trim().to_owned(),
                    active,
                }
            }
            DraftLine::Tool => tool_step(&text),
            DraftLine::Text => Step::Text {
                html: markdown::render(text.trim()),
            },
        })
        .collect();
    let mut notices = r.notices.clone();
    if let Some(w) = &r.withdrawn {
        notices.push(w.clone());
    }
    RunView {
        run_id: run_id.clone(),
        tenant: tenant.clone(),
        chat_id: r.chat_id.clone(),
        status: r.status(),
        started_ms: r.started_ms,
        updated_ms: r.updated_ms,
        ended_ms: r.ended_ms,
        steps,
        final_html: r.final_html.clone(),
        suffix: r.suffix.clone(),
        notices,
        version: r.version,
    }
}

fn preview(r: &Record) -> String {
    let src = r.final_text.as_deref().map_or_else(
        || {
            r.lines
                .iter()
                .rev()
                .find(|l| draft_line_kind(l) == DraftLine::Text && !l.trim().is_empty())
                .cloned()
                .unwrap_or_default()
        },
        |f| {
            f.lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_owned()
        },
    );
    let plain: String = src
        .trim()
        .trim_start_matches(['#', '>', '-', '*', ' '])
        .replace(['*', '`', '_'], "");
    plain.chars().take(90).collect()
}

/// The recent runs and a version that moves on every change.
pub struct Runs {
    inner: Mutex<HashMap<RunKey, Record>>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunKey, Record>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that sees every change.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Applies one op of the run `run` (its tenant and run id; rendering into `chat_id`).
    pub fn apply(&self, run: &DraftKey, chat_id: &str, op: &Op) {
        let now = now_ms();
        let key = (run.tenant.clone(), run.run_id.clone());
        {
            let mut runs = self.lock();
            if !runs.contains_key(&key) {
                Self::evict(&mut runs, now, self.max_runs - 1, self.max_age_ms);
            }
            let r = runs.entry(key).or_insert_with(|| Record {
                chat_id: chat_id.to_owned(),
                started_ms: now,
                ..Record::default()
            });
            if r.chat_id.is_empty() {
                // Created by a thinking timestamp before its first op.
                chat_id.clone_into(&mut r.chat_id);
            }
            r.updated_ms = now;
            r.version += 1;
            match op {
                Op::Typing => {}
                Op::Draft { text, .. } => {
                    r.lines = text.lines().map(str::to_owned).collect();
                }
                Op::Settle { text, .. } => {
                    r.ended_ms.get_or_insert(now);
                    let t = text.trim();
                    r.status = Some(match t {
                        _ if t == PAUSED => RunStatus::Paused,
                        _ if t == INCOMPLETE => RunStatus::Incomplete,
                        _ if t == ERRORED => RunStatus::Error,
                        _ if t == INTERRUPTED => RunStatus::Interrupted,
                        _ if t == REJECT_PLACEHOLDER => RunStatus::Withdrawn,
                        _ if r.final_text.is_some() => RunStatus::Completed,
                        _ => r.status.unwrap_or(RunStatus::Completed),
                    });
                }
                Op::Dismiss { .. } => {
                    r.ended_ms.get_or_insert(now);
                }
                Op::Final {
                    text,
                    suffix,
                    truncated: _,
                    ..
                } => {
                    r.final_text = Some(Arc::from(markdown::prefix(
                        text,
                        markdown::MAX_RENDER_BYTES,
                    )));
                    r.final_len = text.len();
                    r.final_html = None;
                    r.suffix.clone_from(suffix);
                    r.ended_ms.get_or_insert(now);
                }
                Op::Retract { placeholder, .. } => {
                    r.withdrawn = Some(placeholder.clone());
                    r.status = Some(RunStatus::Withdrawn);
                    r.ended_ms.get_or_insert(now);
                }
                Op::Notice { text, .. } => {
                    r.notices.push(text.clone());
                    if text.starts_with('❌') {
                        r.status = Some(RunStatus::Error);
                    }
                }
            }
        }
        self.bump();
    }

    /// Records the timestamp of a thinking event of `run_id` of `tenant` (segment `id`,
    /// `start` opening a new one): the page says how long the model thought.
    pub fn thinking_at(
        &self,
        (tenant, run_id): (&str, &str),
        id: Option<&str>,
        start: bool,
        ts_ms: i64,
    ) {
        let mut runs = self.lock();
        let key = (tenant.to_owned(), run_id.to_owned());
        let Some(r) = runs.get_mut(&key) else {
            // Not seen yet: the first draft creates the record; keep the timing anyway.
            let mut rec = Record {
                started_ms: now_ms(),
                ..Record::default()
            };
            rec.thinking.push(ThinkTiming {
                id: id.map(str::to_owned),
                first_ms: ts_ms,
                last_ms: ts_ms,
            });
            Self::evict(
                &mut runs,
                rec.started_ms,
                self.max_runs - 1,
                self.max_age_ms,
            );
            runs.insert(key, rec);
            return;
        };
        let same = r
            .thinking
            .last()
            .is_some_and(|t| !start && (id.is_none() || t.id.as_deref() == id));
        let known = id.and_then(|id| r.thinking.iter_mut().find(|t| t.id.as_deref() == Some(id)));
        match (known, same) {
            (Some(t), _) => t.last_ms = t.last_ms.max(ts_ms),
            (None, true) => {
                if let Some(t) = r.thinking.last_mut() {
                    t.last_ms = t.last_ms.max(ts_ms);
                }
            }
            (None, false) => r.thinking.push(ThinkTiming {
                id: id.map(str::to_owned),
                first_ms: ts_ms,
                last_ms: ts_ms,
            }),
        }
    }

    /// Drops runs past the age window, then the oldest (ended first) down to `keep`.
    fn evict(runs: &mut HashMap<RunKey, Record>, now: i64, keep: usize, max_age_ms: i64) {
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
        let mut v: Vec<RunRow> = runs
            .iter()
            .filter(|(_, r)| r.version > 0)
            .map(|((tenant, run_id), r)| RunRow {
                run_id: run_id.clone(),
                tenant: tenant.clone(),
                chat_id: r.chat_id.clone(),
                status: r.status(),
                started_ms: r.started_ms,
                updated_ms: r.updated_ms,
                ended_ms: r.ended_ms,
                preview: preview(r),
            })
            .collect();
        v.sort_by(|a, b| {
            b.started_ms
                .cmp(&a.started_ms)
                .then_with(|| b.run_id.cmp(&a.run_id))
                .then_with(|| b.tenant.cmp(&a.tenant))
        });
        v
    }

    /// The key of `run_id` of `tenant`; with an empty `tenant`, of the only tenant with a
    /// run of that id in the window (`None` when there are several: name the tenant).
    fn find(runs: &HashMap<RunKey, Record>, tenant: &str, run_id: &str) -> Option<RunKey> {
        match resolve(runs.keys(), tenant, run_id) {
            Lookup::Found(k) => Some(k),
            Lookup::Missing | Lookup::Ambiguous => None,
        }
    }

    /// The run's version (0: unknown). `tenant` as in [`Runs::view`].
    pub fn version(&self, tenant: &str, run_id: &str) -> u64 {
        let runs = self.lock();
        Self::find(&runs, tenant, run_id)
            .and_then(|k| runs.get(&k).map(|r| r.version))
            .unwrap_or(0)
    }

    /// What the page shows of `run_id` of `tenant` now (`None`: not in the window; an
    /// empty `tenant` names the only tenant with a run of that id, and finds nothing when
    /// there are several). The final's HTML is rendered once, outside the lock, and kept.
    pub fn view(&self, tenant: &str, run_id: &str) -> Option<RunView> {
        let (key, pending) = {
            let runs = self.lock();
            let key = Self::find(&runs, tenant, run_id)?;
            let r = runs.get(&key).filter(|r| r.version > 0)?;
            let pending = match (&r.final_text, &r.final_html) {
                (Some(t), None) => Some((t.clone(), r.final_len)),
                _ => None,
            };
            (key, pending)
        };
        if let Some((text, len)) = pending {
            let html: Arc<str> = Arc::from(markdown::render_cut(&text, len));
            if let Some(r) = self.lock().get_mut(&key) {
                if r.final_text.as_ref().is_some_and(|t| Arc::ptr_eq(t, &text)) {
                    r.final_html = Some(html);
                }
            }
        }
        let runs = self.lock();
        runs.get(&key).map(|r| view_of(&key, r))
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

    fn draft(run: &str, text: &str) -> Op {
        Op::Draft {
            key: key(run),
            text: text.to_owned(),
            seq: 1,
        }
    }

    #[test]
    fn thinking_tools_and_answer_shown_once_without_labels() {
        let runs = Runs::default();
        runs.apply(
            &key("r"),
            "c",
            &draft(
                "r",
                "> 🧠 [raw] Let me think.\n> Still thinking.\n🔍 web_search ✅ — q: Paris → sunny\nThe **answer** so far",
            ),
        );
        let v = runs.view("", "r").unwrap();
        assert_eq!(v.status, RunStatus::Live);
        assert_eq!(v.steps.len(), 3, "{v:?}");
        assert!(
            matches!(&v.steps[0], Step::Thinking { text, .. } if text == "Let me think.\nStill thinking.")
        );
        assert!(
            matches!(&v.steps[1], Step::Tool { name, state: "done", detail, .. } if name == "web_search" && detail == "q: Paris → sunny")
        );
        assert!(
            matches!(&v.steps[2], Step::Text { html } if html.contains("<strong>answer</strong>"))
        );
        runs.apply(
            &key("r"),
            "c",
            &Op::Final {
                key: key("r"),
                text: "## The answer\n\nsunny".to_owned(),
                truncated: false,
                suffix: None,
                seq: 2,
            },
        );
        runs.apply(
            &key("r"),
            "c",
            &Op::Settle {
                key: key("r"),
                text: "🧠 1 segment · 1 tool · 3 s".to_owned(),
                seq: 3,
            },
        );
        let v = runs.view("", "r").unwrap();
        assert_eq!(v.status, RunStatus::Completed);
        assert!(v.ended_ms.is_some());
        // Thinking and the tool stay; the streamed answer is now the final, once.
        assert_eq!(v.steps.len(), 2, "{v:?}");
        assert!(v
            .final_html
            .as_deref()
            .unwrap()
            .contains("<h2>The answer</h2>"));
        let list = runs.list();
        assert_eq!(list[0].preview, "The answer");
    }

    #[test]
    fn a_huge_final_is_kept_and_rendered_up_to_the_page_cut() {
        let runs = Runs::default();
        let text = "word ".repeat(markdown::MAX_RENDER_BYTES);
        runs.apply(
            &key("r"),
            "c",
            &Op::Final {
                key: key("r"),
                text: text.clone(),
                truncated: false,
                suffix: None,
                seq: 1,
            },
        );
        let kept = runs.lock()[&(String::new(), "r".to_owned())]
            .final_text
            .as_ref()
            .unwrap()
            .len();
        assert_eq!(kept, markdown::MAX_RENDER_BYTES);
        let html = runs.view("", "r").unwrap().final_html.unwrap();
        let more = text.len() - markdown::MAX_RENDER_BYTES;
        assert!(
            html.contains(&format!("… {more} more bytes not shown")),
            "cut note"
        );
    }

    #[test]
    fn the_window_is_bounded_newest_first() {
        let runs = Runs::new(3, Duration::from_secs(3600));
        for i in 0..5 {
            runs.apply(&key(&format!("r{i}")), "c", &draft("x", "hi"));
            std::thread::sleep(Duration::from_millis(2));
        }
        let list: Vec<_> = runs.list().into_iter().map(|r| r.run_id).collect();
        assert_eq!(list, ["r4", "r3", "r2"]);
    }
}

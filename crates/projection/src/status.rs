//! Status lines: the `lifecycle` `phase:"update"` tags a chat enabled through
//! [`TagVisibility`](crate::settings::TagVisibility) (plan, usage, mode, session info,
//! commands, config options, any other diagnostic code), each shown as one compact,
//! display-safe line at the foot of the draft.
//!
//! Only the latest update of each tag is kept: a plan update replaces the previous plan
//! line, a usage update the previous usage — a user wants the current state of the
//! session, not its history (the record has that). The lines sit in a fixed order
//! ([`ORDER`], then other tags by name) so that an update edits its line in place and
//! nothing jumps around. The detail is the update object verbatim (the ACP wire
//! adapter's contract: `diagnostic.detail` = the ACP `sessionUpdate` object); fields a
//! line needs and does not find are left out, never invented.

use crate::live::{Outcome, LIVE_TASKS};
use crate::redact::display_safe;
use crate::settings::{tags, Settings};
use serde_json::Value;
use std::collections::BTreeMap;
use streamgate_grammar::{Lifecycle, LifecyclePhase};

/// Display order of the known status tags; other tags follow by name.
pub const ORDER: [&str; 6] = [
    tags::PLAN,
    tags::CURRENT_MODE_UPDATE,
    tags::SESSION_INFO_UPDATE,
    tags::CONFIG_OPTION_UPDATE,
    tags::AVAILABLE_COMMANDS_UPDATE,
    tags::USAGE_UPDATE,
];

/// Most distinct tags a run keeps: a stream inventing codes cannot grow the state.
const MAX_TAGS: usize = 32;

/// The latest update of one tag.
#[derive(Debug, Clone, PartialEq)]
struct Latest {
    detail: Option<Value>,
    usage: Option<Value>,
    message: Option<String>,
}

/// The latest update per tag of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StatusBoard {
    latest: BTreeMap<String, Latest>,
}

/// The tag of a lifecycle event, when it is a status update: the diagnostic's code, or
/// [`tags::USAGE_UPDATE`] for a usage-only update.
pub(crate) fn tag_of(l: &Lifecycle) -> Option<&str> {
    if l.phase != LifecyclePhase::Update {
        return None;
    }
    match (&l.diagnostic, &l.usage) {
        // The tags of the text, thinking and tool lanes govern those events; a
        // diagnostic that happens to carry one of their names is not a status line
        // (spec §3.4: lifecycle updates are not rendered by default).
        (Some(d), _) if tags::EVENT_LANES.contains(&d.code.as_str()) => None,
        (Some(d), _) if !d.code.is_empty() => Some(d.code.as_str()),
        (None, Some(u)) if !u.is_null() => Some(tags::USAGE_UPDATE),
        _ => None,
    }
}

impl StatusBoard {
    /// Records `l` if it is a status update; returns its tag.
    pub fn apply(&mut self, l: &Lifecycle) -> Option<String> {
        let tag = tag_of(l)?.to_owned();
        if !self.latest.contains_key(&tag) && self.latest.len() >= MAX_TAGS {
            return None;
        }
        let d = l.diagnostic.as_ref();
        let latest = Latest {
            detail: d.and_then(|d| d.detail.as_ref()).map(|j| j.to_value()),
            usage: l.usage.as_ref().map(|j| j.to_value()),
            message: d.and_then(|d| d.message.clone()),
        };
        self.latest.insert(tag.clone(), latest);
        Some(tag)
    }

    /// The lines `settings` enable, in display order, each display-safe and capped at
    /// `maxStatusChars`.
    pub fn lines(&self, settings: &Settings) -> Vec<String> {
        let cap = settings.budgets.status_chars;
        let known = ORDER.iter().filter_map(|t| self.latest.get_key_value(*t));
        let others = self
            .latest
            .iter()
            .filter(|(t, _)| !ORDER.contains(&t.as_str()));
        known
            .chain(others)
            .filter(|(tag, _)| settings.shows(tag))
            .filter_map(|(tag, l)| line(tag, l))
            .map(|text| display_safe(&text, Some(cap)))
            .filter(|text| !text.is_empty())
            .collect()
    }

    /// The latest plan when `settings` show plans: its status line as the title, and
    /// each entry (display-safe, at most [`LIVE_TASKS`]) with its state.
    pub fn plan(&self, settings: &Settings) -> Option<(String, Vec<(String, Outcome)>)> {
        if !settings.shows(tags::PLAN) {
            return None;
        }
        let d = self.latest.get(tags::PLAN)?.detail.as_ref();
        let entries = d
            .and_then(|d| d.get("entries"))
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let steps = entries
            .iter()
            .take(LIVE_TASKS)
            .filter_map(|e| {
                let content = display_safe(str_at(Some(e), "content")?, Some(200));
                let outcome = match str_at(Some(e), "status") {
                    Some("completed") => Outcome::Done,
                    Some("in_progress") => Outcome::Running,
                    Some("failed" | "cancelled") => Outcome::Failed,
                    _ => Outcome::Pending,
                };
                Some((content, outcome))
            })
            .collect();
        let title = display_safe(&plan_line(d), Some(settings.budgets.status_chars));
        Some((title, steps))
    }
}

fn str_at<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a str> {
    v?.get(key)?.as_str().filter(|s| !s.trim().is_empty())
}

fn number(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// The line of one tag's latest update (`None`: nothing to show, e.g. a title cleared).
fn line(tag: &str, l: &Latest) -> Option<String> {
    let d = l.detail.as_ref();
    Some(match tag {
        tags::PLAN => plan_line(d),
        tags::USAGE_UPDATE => usage_line(d, l.usage.as_ref())?,
        tags::CURRENT_MODE_UPDATE => format!("🔀 mode: {}", str_at(d, "currentModeId")?),
        tags::SESSION_INFO_UPDATE => format!("🏷️ {}", str_at(d, "title")?),
        tags::AVAILABLE_COMMANDS_UPDATE => {
            let n = d
                .and_then(|d| d.get("availableCommands"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            format!("⌘ {n} command{}", if n == 1 { "" } else { "s" })
        }
        tags::CONFIG_OPTION_UPDATE => config_line(d),
        other => match &l.message {
            Some(m) if !m.trim().is_empty() => format!("ℹ️ {other}: {m}"),
            _ => format!("ℹ️ {other}"),
        },
    })
}

/// `📋 plan: 2/5 done · <current entry>`: the entry in progress, else the next pending.
fn plan_line(d: Option<&Value>) -> String {
    let entries = d
        .and_then(|d| d.get("entries"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    fn status(e: &Value) -> &str {
        e.get("status").and_then(Value::as_str).unwrap_or("")
    }
    let done = entries.iter().filter(|e| status(e) == "completed").count();
    let current = ["in_progress", "pending"].iter().find_map(|s| {
        entries
            .iter()
            .find(|e| status(e) == *s)
            .and_then(|e| str_at(Some(e), "content"))
    });
    let mut s = format!("📋 plan: {done}/{} done", entries.len());
    if let Some(c) = current {
        s.push_str(&format!(" · {c}"));
    }
    s
}

/// `📊 <used>/<size> tokens` (+ ` · <amount> <currency>`), else the usage object's
/// numeric fields.
fn usage_line(d: Option<&Value>, usage: Option<&Value>) -> Option<String> {
    let used = d.and_then(|d| d.get("used")).and_then(number);
    let size = d.and_then(|d| d.get("size")).and_then(number);
    let mut s = match (used, size) {
        (Some(u), Some(z)) => format!("📊 {u}/{z} tokens"),
        (Some(u), None) => format!("📊 {u} tokens"),
        _ => {
            let obj = usage.or(d)?.as_object()?;
            let parts: Vec<String> = obj
                .iter()
                .filter_map(|(k, v)| v.as_number().map(|n| format!("{k} {n}")))
                .collect();
            if parts.is_empty() {
                return None;
            }
            format!("📊 {}", parts.join(" · "))
        }
    };
    if let Some(cost) = d.and_then(|d| d.get("cost")) {
        if let Some(amount) = cost.get("amount").and_then(number) {
            let cur = str_at(Some(cost), "currency").unwrap_or("");
            s.push_str(format!(" · {amount} {cur}").trim_end());
        }
    }
    Some(s)
}

/// `⚙️ config: id=value, …` from ACP `configOptions`.
fn config_line(d: Option<&Value>) -> String {
    let opts = d
        .and_then(|d| d.get("configOptions"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let parts: Vec<String> = opts
        .iter()
        .filter_map(|o| {
            let name = str_at(Some(o), "id").or_else(|| str_at(Some(o), "name"))?;
            Some(match o.get("currentValue").and_then(number_or_str) {
                Some(v) => format!("{name}={v}"),
                None => name.to_owned(),
            })
        })
        .collect();
    if parts.is_empty() {
        format!("⚙️ config: {} options", opts.len())
    } else {
        format!("⚙️ config: {}", parts.join(", "))
    }
}

fn number_or_str(v: &Value) -> Option<String> {
    match v {
        Value::Bool(b) => Some(b.to_string()),
        other => number(other),
    }
}

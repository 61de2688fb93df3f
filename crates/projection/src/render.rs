//! Draft rendering: the folded run state, seen through the effective settings, as one
//! message of at most `budgets.draft_max_chars` chars (spec §4.3, §7.2).
//!
//! Rendering is a pure function of the fold, so flipping `/reasoning` or `/verbose`
//! mid-turn re-renders from the same state (docs/architecture.md §6) and a replayed run renders the
//! same text as the live one.
//!
//! Status lines of enabled update tags ([`crate::status`]) come in already display-safe
//! and capped; they sit at the foot of a T1/T2 draft and count as no content (a draft
//! that showed only them is dismissed at the end, like a content-free one).
//!
//! Every lane is display-safe ([`crate::redact`]): thinking and commentary are redacted on
//! the segment's accumulated text before elision, tool rows through [`display_safe`].

use crate::live::Outcome;
use crate::redact::{display_safe, display_safe_open, redact, redact_open, truncate_chars};
use crate::safe_text::{SafeText, KEEP_CHARS};
use crate::settings::{tags, Budgets, Reasoning, Settings, Tier, Verbose};
use serde_json::Value;
use streamgate_grammar::fold::{ItemState, TextSegment, ThinkingSegment};
use streamgate_grammar::{RunState, ThinkingVariant};

/// Final-answer texts that mean "say nothing": OpenClaw's silent-reply token and its
/// heartbeat acknowledgement. The spec corpus names the silent/heartbeat machinery
/// (`silentExpected`, heartbeat runner) but not the tokens; these are OpenClaw's.
pub const SILENT_TOKENS: [&str; 2] = ["NO_REPLY", "HEARTBEAT_OK"];

/// True when a final answer is a silent-run token (trimmed, exact).
pub fn is_silent(text: &str) -> bool {
    SILENT_TOKENS.contains(&text.trim())
}

/// True while commentary could still be a silent token being streamed (`NO_`,
/// `HEARTBEAT`): rendering it would flash the token into the chat.
fn looks_silent(text: &str) -> bool {
    let t = text.trim();
    t.len() >= 3 && SILENT_TOKENS.iter().any(|tok| tok.starts_with(t))
}

/// The settings as the tier can show them (the tier's ceiling applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    pub reasoning: Reasoning,
    pub verbose: Verbose,
    /// `[raw]`/`[summary]` labels on thinking blocks.
    pub tags: bool,
    /// Per-lane budgets (thinking head+tail, item detail) apply.
    pub lane_budgets: bool,
    /// Tier C: thinking blocks plus one status line instead of rows.
    pub status_line: bool,
    pub budgets: Budgets,
    pub suppress_repeats: bool,
    /// `agent_message_chunk` shown: commentary renders.
    pub messages: bool,
    /// `tool_call` shown: tool rows render.
    pub tool_calls: bool,
    /// `tool_call_update` shown: tool rows follow their updates (else they stay as they
    /// started).
    pub tool_updates: bool,
}

impl View {
    /// The view of `settings` on `tier`. T0 has no draft; its view renders nothing.
    pub fn of(settings: &Settings, tier: Tier) -> View {
        let base = View {
            reasoning: settings.effective_reasoning(),
            verbose: settings.verbose,
            tags: settings.show_variant_tags,
            lane_budgets: true,
            status_line: false,
            budgets: settings.budgets,
            suppress_repeats: settings.suppress_repeats,
            messages: settings.shows(tags::AGENT_MESSAGE_CHUNK),
            tool_calls: settings.shows(tags::TOOL_CALL),
            tool_updates: settings.shows(tags::TOOL_CALL_UPDATE),
        };
        match tier {
            Tier::T1 => base,
            // A rich surface collapses and scrolls by itself: no per-lane cut, and raw vs
            // summary must stay distinguishable (spec §7.2 "variant labels").
            Tier::T2 { status_line: false } => View {
                tags: true,
                lane_budgets: false,
                ..base
            },
            Tier::T2 { status_line: true } => View {
                reasoning: match base.reasoning {
                    Reasoning::Stream => Reasoning::On,
                    r => r,
                },
                verbose: match settings.verbose {
                    Verbose::Full => Verbose::On,
                    v => v,
                },
                status_line: true,
                ..base
            },
            Tier::T0 => View {
                reasoning: Reasoning::Off,
                verbose: Verbose::Off,
                ..base
            },
        }
    }
}

/// The notice that declares a clamp, when `settings` exceed what `tier` can show
/// (spec §7.1: "declaredly, not silently").
pub(crate) fn clamp_notice(settings: &Settings, tier: Tier) -> Option<String> {
    let view = View::of(settings, tier);
    // Thinking as the chat's tag visibility leaves it: hiding thought chunks is a
    // choice, not a clamp.
    let reasoning = settings.effective_reasoning();
    let mut parts = Vec::new();
    if view.reasoning != reasoning {
        parts.push(format!(
            "/reasoning {} → {}",
            reasoning_name(reasoning),
            reasoning_name(view.reasoning)
        ));
    }
    if view.verbose != settings.verbose {
        parts.push(format!(
            "/verbose {} → {}",
            verbose_name(settings.verbose),
            verbose_name(view.verbose)
        ));
    }
    if parts.is_empty() {
        return None;
    }
    let why = match tier {
        Tier::T0 => "this channel shows only final answers and errors",
        _ => "this channel shows a single status line",
    };
    Some(format!("ℹ️ {why}: {}", parts.join(", ")))
}

fn reasoning_name(r: Reasoning) -> &'static str {
    match r {
        Reasoning::Off => "off",
        Reasoning::On => "on",
        Reasoning::Stream => "stream",
    }
}

fn verbose_name(v: Verbose) -> &'static str {
    match v {
        Verbose::Off => "off",
        Verbose::On => "on",
        Verbose::Full => "full",
    }
}

/// Commentary segments that must not render: the one the final answer replaced.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Hidden {
    pub final_segment: Option<usize>,
}

/// A rendered draft and what it counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rendered {
    /// The draft text, within `draft_max_chars`.
    pub text: String,
    /// Thinking segments shown.
    pub thinking: usize,
    /// Tool rows shown.
    pub tools: usize,
    /// Commentary shown.
    pub commentary: usize,
}

impl Rendered {
    /// Degenerate-draft rule (spec §4.3): nothing worth keeping.
    pub fn is_content_free(&self) -> bool {
        self.thinking == 0 && self.tools == 0 && self.commentary == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Thinking,
    Item,
    Commentary,
    Status,
}

/// One row (or block) of the draft, with its renderings from fullest to smallest.
#[derive(Debug)]
struct Piece {
    lane: Lane,
    levels: Vec<String>,
}

enum Entry<'a> {
    Thinking(usize, &'a ThinkingSegment),
    Item(&'a ItemState),
    Commentary(usize, &'a TextSegment),
}

impl Entry<'_> {
    fn seq(&self) -> u64 {
        match self {
            Entry::Thinking(_, t) => t.first_seq,
            Entry::Item(i) => i.first_seq,
            Entry::Commentary(_, c) => c.first_seq,
        }
    }
}

/// Renders the draft for `state` under `view`; `status` are the enabled status lines
/// ([`crate::status`]), shown at the foot of a T1/T2 draft (a tier-C draft keeps its
/// single line). `thinking` holds the display-safe text of each of `state.thinking`'s
/// segments, kept as they streamed ([`SafeText`]); a segment without one is redacted
/// from its folded text here.
pub(crate) fn render(
    state: &RunState,
    thinking: &[SafeText],
    hidden: Hidden,
    view: &View,
    status: &[String],
) -> Rendered {
    let mut entries: Vec<Entry<'_>> = Vec::new();
    entries.extend(
        state
            .thinking
            .iter()
            .enumerate()
            .map(|(i, t)| Entry::Thinking(i, t)),
    );
    entries.extend(state.items.iter().map(Entry::Item));
    entries.extend(
        state
            .commentary
            .iter()
            .enumerate()
            .map(|(i, c)| Entry::Commentary(i, c)),
    );
    // Interleave by seq (spec §4.3 always-on rows); the sort is stable, so equal seqs
    // keep lane order.
    entries.sort_by_key(Entry::seq);

    let mut out = Rendered::default();
    let mut pieces = Vec::new();
    let mut last_commentary: Option<&str> = None;
    let mut last_segment: Option<&TextSegment> = None;
    for entry in &entries {
        match entry {
            Entry::Thinking(i, seg) => {
                let folded;
                let safe = match thinking.get(*i) {
                    Some(safe) => safe,
                    None => {
                        folded = SafeText::of(&seg.text, seg.closed);
                        &folded
                    }
                };
                if let Some(p) = thinking_piece(seg, safe, view) {
                    out.thinking += 1;
                    pieces.push(p);
                }
            }
            Entry::Item(item) => {
                if view.verbose == Verbose::Off || !view.tool_calls {
                    continue;
                }
                out.tools += 1;
                if !view.status_line {
                    let piece = if view.tool_updates {
                        item_piece(item, view)
                    } else {
                        item_piece(&as_started(item), view)
                    };
                    pieces.push(piece);
                }
            }
            Entry::Commentary(i, seg) => {
                if hidden.final_segment == Some(*i) || !view.messages {
                    continue;
                }
                let text = seg.text.trim_end().trim_start_matches(['\n', '\r']);
                if text.trim().is_empty() || looks_silent(text) {
                    continue;
                }
                if view.suppress_repeats && last_commentary == Some(text.trim()) {
                    continue;
                }
                last_commentary = Some(text.trim());
                last_segment = Some(seg);
                out.commentary += 1;
                if !view.status_line {
                    pieces.push(commentary_piece(seg, text, view.budgets.draft_max_chars));
                }
            }
        }
    }
    if view.status_line {
        if let Some(line) = status_line(state, last_segment, view) {
            pieces.push(Piece {
                lane: Lane::Status,
                levels: vec![line],
            });
        }
    } else {
        pieces.extend(status.iter().map(|line| Piece {
            lane: Lane::Status,
            levels: vec![line.clone()],
        }));
    }
    out.text = fit(pieces, view.budgets.draft_max_chars);
    out
}

/// The one-line summary a content-bearing draft settles to (spec §7.2:
/// "🧠 n segments · m tools · k s"); `k` only when the run's timing is known.
pub(crate) fn summary(r: &Rendered, elapsed_secs: Option<u64>) -> String {
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut s = format!(
        "🧠 {} · {}",
        plural(r.thinking, "segment", "segments"),
        plural(r.tools, "tool", "tools")
    );
    if let Some(k) = elapsed_secs {
        s.push_str(&format!(" · {k} s"));
    }
    s
}

/// A commentary row: the text, else "… [N chars omitted]". `text` is `seg.text` trimmed.
///
/// Costs O(`max`), not O(text), per call — it runs on every event of a run, and an
/// answer streamed in 100k deltas would otherwise be copied and counted 100k times. A
/// text longer than the whole draft (`max` chars) can never be shown in full: [`fit`]
/// always takes its last level, and only compares its full level's length with `max`.
/// So that level is a stand-in of `max + 1` chars (the comparisons come out the same)
/// and `N` comes from the count the fold keeps.
fn commentary_piece(seg: &TextSegment, text: &str, max: usize) -> Piece {
    let start = seg.text.len() - seg.text.trim_start_matches(['\n', '\r']).len();
    let trimmed_end = seg.text.len() - seg.text.trim_end().len();
    let n = if seg.chars >= start + trimmed_end && seg.chars > max {
        // The trimmed bytes are ASCII ('\n', '\r') at the start; at the end they may
        // be any whitespace, so count those chars.
        seg.chars - start - seg.text[seg.text.len() - trimmed_end..].chars().count()
    } else {
        text.chars().count()
    };
    // Redacted on the accumulated text. The stand-in (longer than the whole draft, so
    // never shown) is redacted too, keeping the cost O(`max`).
    let full = if n > max {
        let end = text
            .char_indices()
            .nth(max.saturating_add(1))
            .map_or(text.len(), |(i, _)| i);
        redact(&text[..end])
    } else {
        // A segment may still grow (the fold does not mark commentary closed).
        redact_open(text)
    };
    Piece {
        lane: Lane::Commentary,
        levels: vec![full, format!("… [{n} chars omitted]")],
    }
}

/// The last non-blank line of a commentary segment, from the line start the fold keeps
/// (a text streamed without newlines is not scanned on every event).
fn last_line(seg: &TextSegment) -> Option<&str> {
    let text = seg.text.as_str();
    if let Some(line) = text.get(seg.line_start.min(text.len())..) {
        if !line.trim().is_empty() {
            return Some(line);
        }
    }
    text.lines().rev().find(|l| !l.trim().is_empty())
}

fn thinking_piece(seg: &ThinkingSegment, safe: &SafeText, view: &View) -> Option<Piece> {
    let shown = match (view.reasoning, seg.variant) {
        (Reasoning::Off, _) => false,
        // A marker has nothing to stream: both `on` and `stream` show it once closed.
        (_, ThinkingVariant::Redacted) => seg.closed,
        (Reasoning::On, _) => seg.closed && !safe.is_blank(),
        (Reasoning::Stream, _) => !safe.is_blank(),
    };
    if !shown {
        return None;
    }
    if seg.variant == ThinkingVariant::Redacted {
        let tok = seg
            .tokens
            .map(|n| format!(" ({n} tok)"))
            .unwrap_or_default();
        return Some(Piece {
            lane: Lane::Thinking,
            levels: vec![format!("> 🧠 thought privately{tok}")],
        });
    }
    let tag = if view.tags {
        format!("[{}] ", seg.variant.as_str())
    } else {
        String::new()
    };
    // The text was redacted as it streamed, on the accumulated text, before any elision
    // could cut a secret in two; an open segment holds back a half-streamed secret.
    let n = safe.trimmed_chars();
    let max = view.budgets.draft_max_chars;
    // A text the whole draft can hold is rendered from its whole (exact head + tail
    // cuts); a longer one from the ends [`SafeText`] keeps. A level longer than the
    // whole draft can never be shown ([`fit`] compares only its length): a stand-in of
    // `max + 1` chars keeps every rendering O(`max`), however long the segment.
    let whole = if n <= max { safe.whole() } else { None };
    let first = if view.lane_budgets {
        view.budgets.thinking_chars
    } else {
        n
    };
    // Progressively tighter head+tail caps under draft pressure, ending at "all omitted".
    let mut caps = vec![first];
    for cap in [240, 120, 60, 24, 0] {
        if cap < *caps.last().unwrap_or(&0) {
            caps.push(cap);
        }
    }
    let mut levels: Vec<String> = Vec::new();
    for cap in caps {
        let block = if cap.min(n) > max {
            "…".repeat(max.saturating_add(1))
        } else {
            let body = match &whole {
                Some(text) => elide_middle(text, cap),
                None => elide_ends(safe, n, cap),
            };
            quote(&format!("🧠 {tag}{body}"))
        };
        if levels.last() != Some(&block) {
            levels.push(block);
        }
    }
    Some(Piece {
        lane: Lane::Thinking,
        levels,
    })
}

/// [`elide_middle`] for a text known by its kept ends and its length `n`.
fn elide_ends(safe: &SafeText, n: usize, cap: usize) -> String {
    if cap == 0 {
        return format!("… [{n} chars omitted]");
    }
    let cap = cap.min(n.saturating_sub(1)).min(2 * KEEP_CHARS);
    let head = cap.div_ceil(2);
    let (h, t) = safe.ends(head, cap - head);
    let kept = h.chars().count() + t.chars().count();
    format!(
        "{} … [{} chars omitted] {}",
        h.trim_end(),
        n.saturating_sub(kept),
        t.trim_start()
    )
}

/// Head + tail of `text` with the middle replaced by "… [N chars omitted]".
pub(crate) fn elide_middle(text: &str, cap: usize) -> String {
    let n = text.chars().count();
    if n <= cap {
        return text.to_owned();
    }
    if cap == 0 {
        return format!("… [{n} chars omitted]");
    }
    let head = cap.div_ceil(2);
    let tail = cap - head;
    let h: String = text.chars().take(head).collect();
    let t: String = text.chars().skip(n - tail).collect();
    format!(
        "{} … [{} chars omitted] {}",
        h.trim_end(),
        n - cap,
        t.trim_start()
    )
}

/// A Markdown blockquote: every line prefixed with `> `.
fn quote(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.is_empty() {
                ">".to_owned()
            } else {
                format!("> {l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The emoji a tool row starts with ([`item_emoji`]'s answers).
const TOOL_EMOJIS: [&str; 6] = ["✏️", "💻", "🌐", "🔍", "📄", "🔧"];
/// The status marks of a tool row ([`item_status`]'s answers).
const STATUS_MARKS: [&str; 3] = ["⏳", "✅", "❌"];

/// Emoji for a tool, from its kind and name (first match wins; edits before reads so
/// `write_file` is an edit).
pub(crate) fn item_emoji(item: &ItemState) -> &'static str {
    let hay = format!(
        "{} {}",
        item.kind.to_ascii_lowercase(),
        item.name.as_deref().unwrap_or("").to_ascii_lowercase()
    );
    let has = |words: &[&str]| words.iter().any(|w| hay.contains(w));
    let [edit, shell, fetch, search, read, other] = TOOL_EMOJIS;
    if has(&["edit", "write", "patch", "replace", "create"]) {
        edit
    } else if has(&["bash", "shell", "command", "exec", "terminal"]) {
        shell
    } else if has(&["fetch", "http", "curl", "download"]) {
        fetch
    } else if has(&["search", "web", "grep", "find", "glob"]) {
        search
    } else if has(&["read", "file", "open", "view", "cat"]) {
        read
    } else {
        other
    }
}

pub(crate) fn item_name(item: &ItemState) -> String {
    let name = item.name.as_deref().filter(|s| !s.trim().is_empty());
    let label = name.unwrap_or(if item.kind.is_empty() {
        "tool"
    } else {
        &item.kind
    });
    display_safe(label, Some(60))
}

/// How an item stands: failed (by its status word), else done once ended, else running.
pub(crate) fn item_outcome(item: &ItemState) -> Outcome {
    let status = item.status.as_deref().unwrap_or("").to_ascii_lowercase();
    let failed = [
        "fail",
        "error",
        "cancel",
        "declin",
        "reject",
        "denied",
        "incomplete",
    ]
    .iter()
    .any(|w| status.contains(w));
    if failed {
        Outcome::Failed
    } else if item.ended {
        Outcome::Done
    } else {
        Outcome::Running
    }
}

/// ⏳ running, ✅ done, ❌ failed.
pub(crate) fn item_status(item: &ItemState) -> &'static str {
    let [running, done, failed] = STATUS_MARKS;
    match item_outcome(item) {
        Outcome::Pending | Outcome::Running => running,
        Outcome::Done => done,
        Outcome::Failed => failed,
    }
}

/// An item as its start showed it (`tool_call_update` hidden): name and input, running.
fn as_started(item: &ItemState) -> ItemState {
    ItemState {
        id: item.id.clone(),
        index: item.index,
        kind: item.kind.clone(),
        name: item.name.clone(),
        input: item.input.clone(),
        first_seq: item.first_seq,
        last_seq: item.first_seq,
        ..ItemState::default()
    }
}

fn item_piece(item: &ItemState, view: &View) -> Piece {
    let short = format!(
        "{} {} {}",
        item_emoji(item),
        item_name(item),
        item_status(item)
    );
    let mut levels = Vec::new();
    if view.verbose == Verbose::Full {
        let cap = view.lane_budgets.then_some(view.budgets.item_detail_chars);
        let detail = if item.ended {
            display_safe(&item_detail(item), cap)
        } else {
            display_safe_open(&item_detail(item), cap)
        };
        if !detail.is_empty() {
            levels.push(format!("{short} — {detail}"));
        }
    }
    levels.push(short);
    Piece {
        lane: Lane::Item,
        levels,
    }
}

/// Argument summary, then (once ended) the first line of the result: `ls -la → 3 files`.
/// Raw text: [`display_safe`] redacts and shortens it afterwards.
fn item_detail(item: &ItemState) -> String {
    let args = item
        .arguments
        .as_ref()
        .or(item.input.as_ref())
        .map(|j| summarize_json(&j.to_value()))
        .unwrap_or_else(|| item.input_text.clone());
    let result = item
        .result
        .as_ref()
        .map(|j| summarize_json(&j.to_value()))
        .unwrap_or_else(|| item.output_text.clone());
    let result = result
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_owned();
    match (args.trim().is_empty(), result.is_empty()) {
        (false, false) => format!("{} → {result}", args.trim()),
        (false, true) => args.trim().to_owned(),
        (true, false) => format!("→ {result}"),
        (true, true) => String::new(),
    }
}

/// The salient field of a tool's arguments (`command`, `path`, `query`, …), else compact
/// JSON; strings as themselves.
fn summarize_json(v: &Value) -> String {
    const SALIENT: [&str; 12] = [
        "command",
        "cmd",
        "path",
        "file_path",
        "filePath",
        "file",
        "query",
        "q",
        "pattern",
        "url",
        "uri",
        "output",
    ];
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Object(map) => SALIENT
            .iter()
            .find_map(|k| match map.get(*k) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(a)) if a.iter().all(Value::is_string) => Some(
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                _ => None,
            })
            .unwrap_or_else(|| v.to_string()),
        other => other.to_string(),
    }
}

/// Tier C: spinner + current item title + last commentary line.
fn status_line(
    state: &RunState,
    last_commentary: Option<&TextSegment>,
    view: &View,
) -> Option<String> {
    let mut parts = Vec::new();
    if view.verbose != Verbose::Off && view.tool_calls {
        let current = if view.tool_updates {
            state.items.iter().rev().find(|i| !i.ended)
        } else {
            state.items.last()
        };
        if let Some(item) = current {
            parts.push(format!("{} {}", item_emoji(item), item_name(item)));
        }
    }
    if let Some(line) = last_commentary.and_then(last_line) {
        // The line is cut to the draft anyway: past `max + 1` chars only its being too
        // long matters (see `commentary_piece`), so a long line costs O(budget).
        let max = view.budgets.draft_max_chars;
        let line = line.trim();
        let cut = match line.char_indices().nth(max.saturating_add(1)) {
            // A token cut in two could be a secret too short to recognise: drop it.
            Some((i, _)) => line[..i]
                .rsplit_once(char::is_whitespace)
                .map_or("", |(head, _)| head),
            None => line,
        };
        parts.push(redact_open(cut));
    }
    (!parts.is_empty()).then(|| format!("⏳ {}", parts.join(" · ")))
}

/// Joins the pieces within `max` chars (spec §7.2 overflow): thinking shrinks first
/// (head and tail, tighter and tighter), then item rows drop to name + status, then commentary is
/// elided oldest first; if that is still too long the oldest rows go, and a last hard cut
/// guarantees the bound. The draft never splits.
fn fit(pieces: Vec<Piece>, max: usize) -> String {
    let mut level = vec![0usize; pieces.len()];
    // Every piece has at least one level; `get` keeps a malformed one from panicking.
    let cur = |i: usize, level: &[usize]| -> &str {
        let p = &pieces[i];
        let l = level[i].min(p.levels.len().saturating_sub(1));
        p.levels.get(l).map_or("", String::as_str)
    };
    let total = |level: &[usize], from: usize| -> usize {
        let n = pieces.len().saturating_sub(from);
        (from..pieces.len())
            .map(|i| cur(i, level).chars().count())
            .sum::<usize>()
            + n.saturating_sub(1)
    };
    let last = |p: &Piece| p.levels.len().saturating_sub(1);
    // 1. thinking: tighten the currently longest block, one level at a time, down to the
    //    floor (the last head+tail level; "all omitted" comes later).
    let shrink_thinking = |level: &mut Vec<usize>, floor_gap: usize| {
        while total(level, 0) > max {
            let candidate = (0..pieces.len())
                .filter(|&i| {
                    pieces[i].lane == Lane::Thinking && level[i] + floor_gap < last(&pieces[i])
                })
                .max_by_key(|&i| cur(i, level).chars().count());
            match candidate {
                Some(i) => level[i] += 1,
                None => break,
            }
        }
    };
    shrink_thinking(&mut level, 1);
    // 2. item rows drop to name + status; thinking gets the room back and shrinks again.
    if total(&level, 0) > max {
        for (i, p) in pieces.iter().enumerate() {
            level[i] = if p.lane == Lane::Item { last(p) } else { 0 };
        }
        shrink_thinking(&mut level, 1);
    }
    // Then thinking may go down to "… [N chars omitted]".
    shrink_thinking(&mut level, 0);
    // 3. commentary, oldest first.
    for (i, p) in pieces.iter().enumerate() {
        if total(&level, 0) <= max {
            break;
        }
        if p.lane == Lane::Commentary {
            level[i] = last(p);
        }
    }
    // 4. drop the oldest rows behind one marker line.
    let mut from = 0;
    let marker = |dropped: usize| format!("… [{dropped} earlier rows omitted]");
    while from < pieces.len() && total(&level, from) > max {
        from += 1;
        if from < pieces.len() && total(&level, from) + marker(from).chars().count() < max {
            break;
        }
    }
    let mut lines: Vec<String> = Vec::new();
    if from > 0 && from < pieces.len() {
        lines.push(marker(from));
    }
    lines.extend((from..pieces.len()).map(|i| cur(i, &level).to_owned()));
    // 5. the hard bound, whatever the budget.
    truncate_chars(&lines.join("\n"), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(lane: Lane, levels: &[&str]) -> Piece {
        Piece {
            lane,
            levels: levels.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn long_commentary_renders_as_if_counted_in_full() {
        // The fold's count (fast path) and a segment without one (counted here) render
        // the same draft, with thinking and rows around it.
        let mut state = RunState::default();
        let mut seq = 0;
        let mut ev = |json: String| {
            seq += 1;
            let line = json.replace("SEQ", &seq.to_string());
            state.apply(&streamgate_grammar::Event::from_json(&line).unwrap());
        };
        ev(
            r#"{"seq":SEQ,"stream":"thinking","data":{"variant":"raw","delta":"plan é","id":"t"}}"#
                .to_owned(),
        );
        ev(
            r#"{"seq":SEQ,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"t"}}"#
                .to_owned(),
        );
        ev(
            r#"{"seq":SEQ,"stream":"assistant","data":{"phase":"commentary","delta":"\n\nhé"}}"#
                .to_owned(),
        );
        for _ in 0..700 {
            ev(
                r#"{"seq":SEQ,"stream":"assistant","data":{"phase":"commentary","delta":"llo "}}"#
                    .to_owned(),
            );
        }
        ev(
            r#"{"seq":SEQ,"stream":"assistant","data":{"phase":"commentary","delta":" \u00a0\n"}}"#
                .to_owned(),
        );
        let settings = Settings {
            reasoning: Reasoning::Stream,
            ..Settings::default()
        };
        for tier in [
            Tier::T1,
            Tier::T2 { status_line: false },
            Tier::T2 { status_line: true },
        ] {
            let view = View::of(&settings, tier);
            let fast = render(&state, &[], Hidden::default(), &view, &[]);
            let mut slow_state = state.clone();
            slow_state.commentary[0].chars = 0;
            let slow = render(&slow_state, &[], Hidden::default(), &view, &[]);
            assert_eq!(fast, slow);
            if tier == (Tier::T2 { status_line: true }) {
                // Same status rendering as a full scan (the line is the draft's whole
                // budget here, so the draft drops it: unchanged behaviour).
                continue;
            }
            assert!(
                fast.text.contains("… [2801 chars omitted]"),
                "{}",
                fast.text
            );
        }
    }

    #[test]
    fn elision_keeps_head_and_tail() {
        assert_eq!(elide_middle("abcdefghij", 4), "ab … [6 chars omitted] ij");
        assert_eq!(elide_middle("abc", 4), "abc");
        assert_eq!(elide_middle("abcdef", 0), "… [6 chars omitted]");
    }

    #[test]
    fn fit_shrinks_thinking_before_items_before_commentary() {
        let pieces = vec![
            piece(Lane::Commentary, &["cccccccccc", "… [10 chars omitted]"]),
            piece(Lane::Thinking, &["tttttttttttttttttttt", "t…t"]),
            piece(Lane::Item, &["🔧 x ✅ — detail detail", "🔧 x ✅"]),
        ];
        let out = fit(pieces, 30);
        assert!(out.chars().count() <= 30, "{out}");
        assert!(out.contains("cccccccccc"), "{out}");
        assert!(out.contains("t…t"), "{out}");
        assert!(out.ends_with("🔧 x ✅"), "{out}");
    }

    #[test]
    fn fit_never_exceeds_tiny_budgets() {
        for max in 0..30 {
            let pieces = vec![
                piece(Lane::Commentary, &["hello world", "… [11 chars omitted]"]),
                piece(Lane::Item, &["🔧 x ✅"]),
            ];
            assert!(fit(pieces, max).chars().count() <= max);
        }
    }

    #[test]
    fn emoji_per_tool_kind() {
        let it = |kind: &str, name: &str| ItemState {
            kind: kind.into(),
            name: Some(name.into()),
            ..ItemState::default()
        };
        assert_eq!(item_emoji(&it("tool", "bash")), "💻");
        assert_eq!(item_emoji(&it("command", "x")), "💻");
        assert_eq!(item_emoji(&it("tool", "web_search")), "🔍");
        assert_eq!(item_emoji(&it("tool", "read_file")), "📄");
        assert_eq!(item_emoji(&it("tool", "write_file")), "✏️");
        assert_eq!(item_emoji(&it("tool", "web_fetch")), "🌐");
        assert_eq!(item_emoji(&it("tool", "get_weather")), "🔧");
    }
}

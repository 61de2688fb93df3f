//! [`RunProjection`]: one run on one channel, as a state machine from events to ops.
//!
//! The projection keeps the run's fold ([`RunState`]) plus the few facts rendering cannot
//! recompute (what was already delivered): the last event seq, the final answer's seq,
//! whether a draft exists, whether the run has settled. Everything visible is re-rendered
//! from the fold, so settings may change between any two calls.

use crate::live::{AnswerFollower, Live, LivePlan, LiveTask, LIVE_TASKS};
use crate::ops::{DraftKey, Op};
use crate::redact::{display_safe, redact, truncate_chars};
use crate::render::{self, clamp_notice, is_silent, summary, Hidden, Rendered, View};
use crate::safe_text::SafeText;
use crate::settings::{tags, Delivery, Settings, Tier, Verbose};
use crate::status::StatusBoard;
use streamgate_grammar::fold::RunProgress;
use streamgate_grammar::{
    Assistant, AssistantPhase, Event, EventData, ItemPhase, Lifecycle, LifecyclePhase, RunEvent,
    RunState, RunStatus, StopReason,
};

/// Reject placeholder, DECIDED in spec §3.5.
pub const REJECT_PLACEHOLDER: &str = "⛔ response withdrawn (provider safety stop)";
/// Truncation suffix line, DECIDED in spec §4.3.
pub const TRUNCATED_SUFFIX: &str = "⚠️ truncated (token limit)";
/// What an orphaned draft settles to after a crash (spec §7.3).
pub const INTERRUPTED: &str = "⚠️ agent interrupted";
/// Settled state of a paused (suspended) turn.
pub const PAUSED: &str = "⏸️ paused";
/// Settled state of a turn that ended incomplete without an answer (spec §7.2 T2:
/// "incomplete", not error).
pub const INCOMPLETE: &str = "⚠️ incomplete";
/// Settled state of a dead turn (error, abort, `stream_closed`).
pub const ERRORED: &str = "❌ error";

/// Liveness rule: `Typing` goes out on the first event of the turn, then again once this
/// many further events have arrived since the last one. Counting events (not time) keeps
/// the core deterministic and replayable; the delivery engine throttles to the channel's
/// real refresh interval (Discord typing lasts ~10 s, Telegram chat actions ~5 s).
pub const TYPING_EVERY_EVENTS: u64 = 8;

/// The most text of one segment a projection keeps ([`RunState::windowed`]): a long
/// commentary segment keeps its last 32–64 KiB, a tool's arguments and output their first
/// 32 KiB; thinking is kept as display-safe ends ([`SafeText`]). A draft shows no more
/// than its budget (a few thousand chars), so for budgets up to 8k chars nothing visible
/// changes; the archive keeps every byte.
pub const TEXT_WINDOW_BYTES: usize = 32 * 1024;

/// Longest error detail carried in an error notice.
const ERROR_DETAIL_CHARS: usize = 300;

/// The projection of one run onto one channel.
#[derive(Debug, Clone)]
pub struct RunProjection {
    key: DraftKey,
    /// The run's fold, windowed ([`TEXT_WINDOW_BYTES`]): an open run's memory is
    /// bounded however long it streams.
    state: RunState,
    /// The display-safe text of each of `state.thinking`'s segments, kept as it streams
    /// (so a delta costs O(delta), not O(segment)).
    thinking: Vec<SafeText>,
    /// The last answer segment's display-safe text, as it streams (for [`Live`]).
    answer: AnswerFollower,
    /// Highest seq applied; lower or equal seqs are replays and are ignored.
    last_seq: u64,
    /// Events applied (replays excluded).
    events: u64,
    /// Value of `events` when the last `Typing` went out.
    typing_at: Option<u64>,
    /// Text of the last `Draft` op (`Some` = the draft exists on the channel).
    draft_text: Option<String>,
    /// Seq of the delivered final answer.
    final_seq: Option<u64>,
    /// The commentary segment the final answer replaced.
    final_segment: Option<usize>,
    /// The final answer was a silent token: the run shows nothing.
    silent: bool,
    /// Seq of the last thinking or item event (a trailing commentary segment starts after).
    last_activity_seq: u64,
    clamp_declared: bool,
    /// Settled, dismissed or interrupted: no more ops.
    done: bool,
    /// Whether the last call ran with a draft (for [`RunProjection::interrupted`]).
    drafts: bool,
    /// Draft budget of the last call (for [`RunProjection::interrupted`]).
    draft_max_chars: usize,
    first_ts_ms: Option<i64>,
    last_ts_ms: Option<i64>,
    /// Ops for [`RunProjection::ops_since`]: every op but `Typing`, with only the latest
    /// `Draft` kept (drafts are latest-wins), each with the seq that caused it.
    log: Vec<(u64, Op)>,
    /// The latest `lifecycle/update` of each tag (status lines).
    status: StatusBoard,
    /// `delivery: final_only`: the final answer, held back until the terminal event.
    pending_final: Option<Op>,
    /// A draft is due (with whether it must go out even if unchanged): rendered by the
    /// next event applied normally, or by [`RunProjection::flush_draft`].
    draft_due: Option<bool>,
}

impl RunProjection {
    /// A projection for run `run_id` that has seen nothing yet, tenant unnamed: for
    /// callers that only ever see one run's events. A channel projecting many tenants'
    /// runs uses [`RunProjection::for_run`].
    pub fn new(run_id: impl Into<String>) -> RunProjection {
        RunProjection::for_run("", run_id)
    }

    /// A projection for the run `(tenant, run_id)` that has seen nothing yet: its ops'
    /// [`DraftKey`] names the tenant, and [`RunProjection::apply_run_event`] takes only
    /// that tenant's events.
    pub fn for_run(tenant: impl Into<String>, run_id: impl Into<String>) -> RunProjection {
        RunProjection {
            key: DraftKey {
                run_id: run_id.into(),
                tenant: tenant.into(),
            },
            state: RunState::windowed(TEXT_WINDOW_BYTES),
            thinking: Vec::new(),
            answer: AnswerFollower::default(),
            last_seq: 0,
            events: 0,
            typing_at: None,
            draft_text: None,
            final_seq: None,
            final_segment: None,
            silent: false,
            last_activity_seq: 0,
            clamp_declared: false,
            done: false,
            drafts: false,
            draft_max_chars: usize::MAX,
            first_ts_ms: None,
            last_ts_ms: None,
            log: Vec::new(),
            status: StatusBoard::default(),
            pending_final: None,
            draft_due: None,
        }
    }

    /// Rebuilds a projection whose ops for `events` were already delivered (a restarted
    /// projector, or a subscriber resuming from its persisted state): the events are
    /// folded and the ops discarded, so applying later events continues seamlessly.
    pub fn restore<'a>(
        run_id: impl Into<String>,
        events: impl IntoIterator<Item = &'a Event>,
        settings: &Settings,
        tier: Tier,
    ) -> RunProjection {
        RunProjection::restore_run("", run_id, events, settings, tier)
    }

    /// [`RunProjection::restore`] for the run `(tenant, run_id)`.
    pub fn restore_run<'a>(
        tenant: impl Into<String>,
        run_id: impl Into<String>,
        events: impl IntoIterator<Item = &'a Event>,
        settings: &Settings,
        tier: Tier,
    ) -> RunProjection {
        let mut p = RunProjection::for_run(tenant, run_id);
        for ev in events {
            let _ = p.apply(ev, settings, tier);
        }
        p
    }

    /// The draft key of this run.
    pub fn key(&self) -> &DraftKey {
        &self.key
    }

    /// The folded run state (what the draft is rendered from).
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// Highest event seq applied: the channel's `lastRenderedSeq` (spec §7.3). A
    /// subscriber that reconnects asks for replay from `last_seq() + 1`.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// True once the run settled (or was dismissed or interrupted): later calls emit
    /// nothing.
    pub fn is_settled(&self) -> bool {
        self.done
    }

    /// Seq of the delivered final answer, if any.
    pub fn final_seq(&self) -> Option<u64> {
        self.final_seq
    }

    /// True while `delivery: final_only` holds a final answer back for the terminal
    /// event (or [`RunProjection::interrupted`], or a switch to `live`).
    pub fn final_pending(&self) -> bool {
        self.pending_final.is_some()
    }

    /// Applies an enveloped event; the envelopes' ingest times give the settle summary
    /// its elapsed seconds (`Event` carries no time). Events of another run yield nothing:
    /// another run id, or (when the projection names its tenant) another tenant.
    pub fn apply_run_event(&mut self, ev: &RunEvent, settings: &Settings, tier: Tier) -> Vec<Op> {
        self.apply_run_event_with(ev, settings, tier, false)
    }

    fn apply_run_event_with(
        &mut self,
        ev: &RunEvent,
        settings: &Settings,
        tier: Tier,
        defer_draft: bool,
    ) -> Vec<Op> {
        if ev.envelope.run_id != self.key.run_id
            || (!self.key.tenant.is_empty() && ev.envelope.tenant != self.key.tenant)
        {
            return Vec::new();
        }
        if ev.event.seq > self.last_seq && !self.done {
            let ts = ev.envelope.ts_ms;
            self.first_ts_ms = Some(self.first_ts_ms.map_or(ts, |f| f.min(ts)));
            self.last_ts_ms = Some(self.last_ts_ms.map_or(ts, |l| l.max(ts)));
        }
        self.apply_with(&ev.event, settings, tier, defer_draft)
    }

    /// [`RunProjection::apply_run_event`] for an event with more of its run right behind
    /// it (the rest of one bus message): the draft it changes is not rendered now but by
    /// the next event applied normally, or by [`RunProjection::flush_draft`]. Drafts are
    /// latest-wins, so this is the coalescing a chat lane does anyway — without
    /// rendering (and redacting) a draft no chat would ever see. Every other op comes out
    /// as it would.
    pub fn apply_run_event_batched(
        &mut self,
        ev: &RunEvent,
        settings: &Settings,
        tier: Tier,
    ) -> Vec<Op> {
        self.apply_run_event_with(ev, settings, tier, true)
    }

    /// The draft left due by [`RunProjection::apply_run_event_batched`], rendered now
    /// (nothing when none is due or the run is over).
    pub fn flush_draft(&mut self, settings: &Settings, tier: Tier) -> Vec<Op> {
        let mut out = Vec::new();
        if let Some(force) = self.draft_due.take() {
            if !self.done && self.drafts {
                self.refresh_draft(settings, tier, force, &mut out);
            }
        }
        out
    }

    /// The pure core: one event in, the ops it causes out. Replayed events (seq at or
    /// below [`RunProjection::last_seq`]) and events after the settle yield nothing.
    pub fn apply(&mut self, ev: &Event, settings: &Settings, tier: Tier) -> Vec<Op> {
        self.apply_with(ev, settings, tier, false)
    }

    /// [`RunProjection::apply`]; `defer_draft`: a changed draft is left due instead of
    /// rendered ([`RunProjection::apply_run_event_batched`]).
    fn apply_with(
        &mut self,
        ev: &Event,
        settings: &Settings,
        tier: Tier,
        defer_draft: bool,
    ) -> Vec<Op> {
        if self.done || ev.seq <= self.last_seq {
            return Vec::new();
        }
        let mode = Mode::of(settings, tier);
        self.drafts = mode.drafts;
        self.draft_max_chars = settings.budgets.draft_max_chars;
        self.last_seq = ev.seq;
        self.events += 1;
        let mut out = Vec::new();

        let terminal = ev.is_terminal();
        if mode.typing && !terminal && self.typing_due(tier) {
            self.typing_at = Some(self.events);
            out.push(Op::Typing);
        }

        // A tokens-only thinking update (spec §3.2) only adds a count to an ended segment:
        // it is no activity, so it does not end the trailing commentary segment.
        let activity = match &ev.data {
            EventData::Thinking(t) => !t.is_tokens_update(),
            EventData::Item(_) => true,
            _ => false,
        };
        if activity {
            self.last_activity_seq = ev.seq;
        }
        self.fold(ev);
        // `repeatSuppression` off: a shown status or tool update re-sends the draft even
        // when it changes nothing the draft shows.
        let shown_update = self.record_update(ev, settings);
        let force = shown_update && !settings.suppress_repeats;
        if settings.delivery == Delivery::Live {
            self.flush_final(settings, tier, &mut out);
        }

        match &ev.data {
            EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
                self.on_final(ev.seq, a, settings, tier, &mut out);
            }
            EventData::Lifecycle(l) if l.is_terminal() => {
                // The settle supersedes any draft still due.
                self.draft_due = None;
                self.on_terminal(ev.seq, l, settings, tier, mode, &mut out);
                return out;
            }
            _ => {}
        }
        if mode.drafts {
            let force = force || self.draft_due.take().unwrap_or(false);
            if defer_draft {
                self.draft_due = Some(force);
            } else {
                self.refresh_draft(settings, tier, force, &mut out);
            }
        }
        out
    }

    /// Folds `ev` into the run state and a thinking event also into its segment's
    /// display-safe text.
    fn fold(&mut self, ev: &Event) {
        if let EventData::Assistant(_) = &ev.data {
            self.state.apply(ev);
            if let Some(seg) = self.state.commentary.last() {
                self.answer.follow(seg);
            }
            return;
        }
        let EventData::Thinking(t) = &ev.data else {
            self.state.apply(ev);
            return;
        };
        if t.is_tokens_update() {
            self.state.apply(ev);
            return;
        }
        // A second start for the same key closes the open segment (see the fold).
        let open = self
            .state
            .thinking
            .iter()
            .rposition(|s| !s.closed && s.variant == t.variant && s.id == t.id);
        self.state.apply(ev);
        let segs = &self.state.thinking;
        self.thinking.resize_with(segs.len(), SafeText::default);
        if let Some(i) = open.filter(|&i| segs[i].closed) {
            self.thinking[i].close();
        }
        let Some(i) = segs.iter().rposition(|s| s.last_seq == ev.seq) else {
            return;
        };
        let safe = &mut self.thinking[i];
        if let Some(text) = &t.text {
            safe.set(text, segs[i].closed);
        } else if let Some(d) = &t.delta {
            safe.push(d);
        }
        if segs[i].closed {
            safe.close();
        }
    }

    /// Records a status update, and tells whether `ev` is an update the draft shows
    /// under `settings` (a status line or a tool row): the repeats
    /// `repeatSuppression` is about.
    fn record_update(&mut self, ev: &Event, settings: &Settings) -> bool {
        match &ev.data {
            EventData::Lifecycle(l) => self.status.apply(l).is_some_and(|t| settings.shows(&t)),
            EventData::Item(it) => {
                let tag = match it.phase {
                    ItemPhase::Start => tags::TOOL_CALL,
                    ItemPhase::Update | ItemPhase::End => tags::TOOL_CALL_UPDATE,
                };
                settings.verbose != Verbose::Off
                    && settings.shows(tags::TOOL_CALL)
                    && settings.shows(tag)
            }
            _ => false,
        }
    }

    /// Delivers a final answer `delivery: final_only` held back (at the terminal event,
    /// or as soon as the chat switched to `live`).
    fn flush_final(&mut self, settings: &Settings, tier: Tier, out: &mut Vec<Op>) {
        if let Some(op) = self.pending_final.take() {
            if let Op::Final { seq, .. } = &op {
                let seq = *seq;
                self.final_seq = Some(seq);
                self.emit(op, seq, settings, tier, out);
            }
        }
    }

    /// Re-renders the draft after `/reasoning`, `/verbose` or another setting changed
    /// mid-turn. Only rendering changes: the fold (and so every event) is untouched.
    pub fn resettle(&mut self, settings: &Settings, tier: Tier) -> Vec<Op> {
        if self.done || self.events == 0 {
            return Vec::new();
        }
        let mode = Mode::of(settings, tier);
        self.drafts = mode.drafts;
        self.draft_max_chars = settings.budgets.draft_max_chars;
        let mut out = Vec::new();
        if settings.delivery == Delivery::Live {
            self.flush_final(settings, tier, &mut out);
        }
        if mode.drafts {
            self.refresh_draft(settings, tier, false, &mut out);
        }
        out
    }

    /// Crash recovery (spec §7.3): the run has a start but will never see its terminal
    /// event. An existing draft settles to "agent interrupted" (otherwise a notice says
    /// so); a final answer is never re-sent.
    pub fn interrupted(&mut self) -> Vec<Op> {
        if self.done || self.events == 0 {
            return Vec::new();
        }
        self.done = true;
        let seq = self.last_seq;
        let mut out = Vec::new();
        if let Some(f) = self.pending_final.take() {
            // The answer exists; only its terminal event is lost.
            self.final_seq = Some(seq);
            self.log.push((seq, f.clone()));
            out.push(f);
        }
        let op = if self.drafts && self.draft_text.is_some() {
            Op::Settle {
                key: self.key.clone(),
                text: truncate_chars(INTERRUPTED, self.draft_max_chars),
                seq,
            }
        } else {
            Op::Notice {
                key: self.key.clone(),
                text: INTERRUPTED.to_owned(),
                seq,
            }
        };
        self.log.push((seq, op.clone()));
        out.push(op);
        out
    }

    /// Reconnect support (spec §7.3): the ops a subscriber whose `lastRenderedSeq` is
    /// `last_rendered_seq` has not seen, in order — the latest draft (drafts are
    /// latest-wins, so older upserts are not replayed), notices, retractions and the
    /// settle. `Typing` is transient and the final answer travels on the reliable path
    /// keyed by its seq, so neither is replayed here ("final_answer is never replayed via
    /// the progress path"). Together with [`RunProjection::apply`] ignoring seqs already
    /// applied, a subscriber replaying from `lastRenderedSeq + 1` sees no duplicate and
    /// no gap.
    pub fn ops_since(&self, last_rendered_seq: u64) -> Vec<Op> {
        self.log
            .iter()
            .filter(|(seq, op)| *seq > last_rendered_seq && !matches!(op, Op::Final { .. }))
            .map(|(_, op)| op.clone())
            .collect()
    }

    fn typing_due(&self, tier: Tier) -> bool {
        match self.typing_at {
            None => true,
            // An append-only channel cannot refresh an indicator: one "working…" only.
            Some(_) if tier == Tier::T0 => false,
            Some(at) => self.events - at >= TYPING_EVERY_EVENTS,
        }
    }

    /// Pushes a visible op, declaring a settings clamp first (once per run). Declaring
    /// with the first visible op, not the first event, keeps silent runs silent.
    fn emit(&mut self, op: Op, seq: u64, settings: &Settings, tier: Tier, out: &mut Vec<Op>) {
        let op = display_safe_op(op, settings.budgets.draft_max_chars);
        if !self.clamp_declared {
            self.clamp_declared = true;
            let clamp = match settings.delivery {
                // The user chose final-only: nothing is being clamped.
                Delivery::FinalOnly => None,
                Delivery::Live => clamp_notice(settings, tier),
            };
            if let Some(text) = clamp {
                let notice = Op::Notice {
                    key: self.key.clone(),
                    text,
                    seq,
                };
                self.log.push((seq, notice.clone()));
                out.push(notice);
            }
        }
        // Drafts are latest-wins, and a settle or dismissal supersedes the draft
        // entirely: a reconnecting subscriber needs only the newest of them.
        if matches!(
            op,
            Op::Draft { .. } | Op::Settle { .. } | Op::Dismiss { .. }
        ) {
            self.log.retain(|(_, o)| !matches!(o, Op::Draft { .. }));
        }
        self.log.push((seq, op.clone()));
        out.push(op);
    }

    fn hidden(&self) -> Hidden {
        Hidden {
            final_segment: self.final_segment,
        }
    }

    fn render(&self, settings: &Settings, tier: Tier) -> Rendered {
        let status = self.status.lines(settings);
        render::render(
            &self.state,
            &self.thinking,
            self.hidden(),
            &View::of(settings, tier),
            &status,
        )
    }

    /// Upserts the draft when its rendering changed (or, `force`, even when it did not:
    /// `repeatSuppression` off). Lazy: an empty rendering never creates a draft
    /// (liveness is `Typing`'s job, spec §11).
    fn refresh_draft(&mut self, settings: &Settings, tier: Tier, force: bool, out: &mut Vec<Op>) {
        if self.silent {
            return;
        }
        let r = self.render(settings, tier);
        let same = self.draft_text.as_deref() == Some(r.text.as_str());
        if r.text.is_empty() || (same && !force) {
            return;
        }
        self.draft_text = Some(r.text.clone());
        let live = (tier == Tier::T1).then(|| Box::new(self.live(settings, tier)));
        let op = Op::Draft {
            key: self.key.clone(),
            text: r.text,
            seq: self.last_seq,
            live,
        };
        self.emit(op, self.last_seq, settings, tier, out);
    }

    /// The run now as [`Live`] facts, under what `settings` show.
    fn live(&self, settings: &Settings, tier: Tier) -> Live {
        let view = View::of(settings, tier);
        let last_answer = self.state.commentary.last().map_or(0, |c| c.first_seq);
        let thinking = self
            .state
            .thinking
            .last()
            .is_some_and(|t| !t.closed && t.first_seq > last_answer);
        let tasks = if view.verbose == Verbose::Off || !view.tool_calls {
            Vec::new()
        } else {
            let skip = self.state.items.len().saturating_sub(LIVE_TASKS);
            self.state
                .items
                .iter()
                .skip(skip)
                .map(|item| LiveTask {
                    id: item
                        .id
                        .clone()
                        .unwrap_or_else(|| format!("t{}", item.first_seq)),
                    title: render::item_name(item),
                    outcome: render::item_outcome(item),
                })
                .collect()
        };
        let plan = self.status.plan(settings).map(|(title, steps)| LivePlan {
            title,
            steps: steps
                .into_iter()
                .enumerate()
                .map(|(i, (title, outcome))| LiveTask {
                    id: format!("plan-{i}"),
                    title,
                    outcome,
                })
                .collect(),
        });
        Live {
            thinking,
            tasks,
            answer: view.messages.then(|| self.answer.view()).flatten(),
            plan,
        }
    }

    fn on_final(
        &mut self,
        seq: u64,
        a: &Assistant,
        settings: &Settings,
        tier: Tier,
        out: &mut Vec<Op>,
    ) {
        if self.final_seq.is_some() || self.pending_final.is_some() || self.silent {
            return; // exactly once per run
        }
        let Some(text) = a.text.as_ref().or(a.delta.as_ref()) else {
            return;
        };
        if text.trim().is_empty() {
            return; // zero-text finalize: never an empty message (spec §3.5)
        }
        self.final_segment = self.final_copy_segment(a, text);
        if is_silent(text) {
            self.silent = true;
            return;
        }
        let truncated = a.truncated == Some(true);
        let op = Op::Final {
            key: self.key.clone(),
            text: text.clone(),
            truncated,
            suffix: truncated.then(|| TRUNCATED_SUFFIX.to_owned()),
            seq,
        };
        if settings.delivery == Delivery::FinalOnly {
            // Deferred to the terminal event: final_only delivers everything at once.
            self.pending_final = Some(op);
            return;
        }
        self.final_seq = Some(seq);
        self.emit(op, seq, settings, tier, out);
    }

    /// The commentary segment that streamed the final answer, which the durable final
    /// replaces (spec §3.5): same provider id, else the trailing segment (Finalize
    /// re-tags the last text segment), else one with the same text.
    fn final_copy_segment(&self, a: &Assistant, text: &str) -> Option<usize> {
        let segs = &self.state.commentary;
        if let Some(id) = &a.id {
            if let Some(i) = segs.iter().rposition(|s| s.id.as_ref() == Some(id)) {
                return Some(i);
            }
        }
        if let Some(last) = segs.len().checked_sub(1) {
            if segs[last].last_seq > self.last_activity_seq {
                return Some(last);
            }
        }
        segs.iter()
            .rposition(|s| s.elided == 0 && s.text.trim() == text.trim())
    }

    fn elapsed_secs(&self) -> Option<u64> {
        let (first, last) = (self.first_ts_ms?, self.last_ts_ms?);
        let ms = u64::try_from(last.saturating_sub(first)).unwrap_or(0);
        Some(ms.saturating_add(500) / 1000)
    }

    fn on_terminal(
        &mut self,
        seq: u64,
        l: &Lifecycle,
        settings: &Settings,
        tier: Tier,
        mode: Mode,
        out: &mut Vec<Op>,
    ) {
        self.done = true;
        // The held-back answer goes out first, as it would have live (a Reject after it
        // retracts the draft, not the delivered answer).
        self.flush_final(settings, tier, out);
        let r = self.render(settings, tier);
        let content = (!r.is_content_free()).then(|| summary(&r, self.elapsed_secs()));
        let max = settings.budgets.draft_max_chars;
        let with = |head: &str| match &content {
            Some(s) => truncate_chars(&format!("{head} · {s}"), max),
            None => truncate_chars(head, max),
        };
        let key = self.key.clone();
        let notice = |text: String| Op::Notice {
            key: key.clone(),
            text,
            seq,
        };
        let settle = |text: String| Op::Settle {
            key: key.clone(),
            text,
            seq,
        };
        let dismiss = Op::Dismiss { key: key.clone() };
        let reason = l.reason.as_ref();
        let mut ops: Vec<Op> = Vec::new();

        if reason.is_some_and(StopReason::is_reject) {
            // Destructive settle: the rejected text is replaced, never left on screen.
            if mode.drafts {
                ops.push(Op::Retract {
                    key: key.clone(),
                    placeholder: REJECT_PLACEHOLDER.to_owned(),
                    seq,
                });
                ops.push(settle(with(REJECT_PLACEHOLDER)));
            } else {
                ops.push(notice(REJECT_PLACEHOLDER.to_owned()));
            }
        } else if l.phase == LifecyclePhase::Error {
            ops.push(notice(self.error_text(l)));
            if mode.drafts {
                ops.push(match content {
                    Some(_) => settle(with(ERRORED)),
                    None => dismiss,
                });
            }
        } else if self.silent {
            if mode.drafts {
                ops.push(dismiss);
            }
        } else if reason == Some(&StopReason::Paused) {
            ops.push(if mode.drafts {
                settle(with(PAUSED))
            } else {
                notice(PAUSED.to_owned())
            });
        } else if self.ended_incomplete(l) {
            ops.push(if mode.drafts {
                settle(with(INCOMPLETE))
            } else {
                notice(format!("{INCOMPLETE}: the turn ended without an answer"))
            });
        } else if mode.drafts {
            // Finalize, Truncate, tool-use yield: collapse to the summary, or dismiss a
            // content-free draft (degenerate-draft rule, spec §4.3).
            ops.push(match content {
                Some(s) => settle(truncate_chars(&s, max)),
                None => dismiss,
            });
        }
        for op in ops {
            self.emit(op, seq, settings, tier, out);
        }
    }

    /// `lifecycle/end status:"incomplete"` with no answer and no reason that explains it
    /// (spec §3.4: unknown `incomplete_details.reason`).
    fn ended_incomplete(&self, l: &Lifecycle) -> bool {
        l.status == Some(RunStatus::Incomplete)
            && self.final_seq.is_none()
            && !matches!(
                l.reason,
                Some(StopReason::Truncated | StopReason::ToolUse | StopReason::Paused)
            )
    }

    fn error_text(&self, l: &Lifecycle) -> String {
        if l.reason == Some(StopReason::StreamClosed) {
            return "❌ stream closed: the provider connection ended before the turn finished"
                .to_owned();
        }
        let diag = l.diagnostic.as_ref().or(match &self.state.progress {
            RunProgress::Failed { diagnostic, .. } => diagnostic.as_ref(),
            _ => None,
        });
        let detail = diag
            .map(|d| d.message.clone().unwrap_or_else(|| d.code.clone()))
            .or_else(|| l.reason.as_ref().map(|r| r.as_str().to_owned()))
            .unwrap_or_else(|| "error".to_owned());
        format!(
            "❌ error: {}",
            display_safe(&detail, Some(ERROR_DETAIL_CHARS))
        )
    }
}

/// The one choke point every op passes on its way out: draft, settle, notice and retract
/// text is redacted ([`crate::redact`]; the lanes were already redacted on their
/// accumulated text, this also covers notices and settle lines and anything a future
/// rendering adds). Masking can lengthen a text (`password=x` → `password=***`), so drafts
/// and settles are re-cut to the budget. Final answers pass verbatim (see the module doc
/// of [`crate::redact`]).
fn display_safe_op(op: Op, draft_max_chars: usize) -> Op {
    match op {
        // `live` is display-safe as built (the answer redacted as it streamed, names by
        // `display_safe`).
        Op::Draft {
            key,
            text,
            seq,
            live,
        } => Op::Draft {
            key,
            text: truncate_chars(&redact(&text), draft_max_chars),
            seq,
            live,
        },
        Op::Settle { key, text, seq } => Op::Settle {
            key,
            text: truncate_chars(&redact(&text), draft_max_chars),
            seq,
        },
        Op::Notice { key, text, seq } => Op::Notice {
            key,
            text: redact(&text),
            seq,
        },
        Op::Retract {
            key,
            placeholder,
            seq,
        } => Op::Retract {
            key,
            placeholder: redact(&placeholder),
            seq,
        },
        op @ (Op::Typing | Op::Dismiss { .. } | Op::Final { .. }) => op,
    }
}

/// What a (settings, tier) pair allows at all.
#[derive(Debug, Clone, Copy)]
struct Mode {
    /// Draft ops (`Draft`, `Settle`, `Dismiss`, `Retract`).
    drafts: bool,
    /// `Typing` ops.
    typing: bool,
}

impl Mode {
    fn of(settings: &Settings, tier: Tier) -> Mode {
        let live = settings.delivery == Delivery::Live;
        Mode {
            drafts: live && tier != Tier::T0,
            typing: live,
        }
    }
}

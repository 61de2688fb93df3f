//! The delivery engine: runs ops through sinks with the manners chat APIs demand, and
//! keeps every chat independent of every other.
//!
//! **Fairness.** One **lane** (a task and a queue) per chat keeps that chat's ops in
//! order; chats never wait on each other's queues. [`Delivery::submit`] never waits on a
//! chat's queue: drafts coalesce, and beyond `lane_capacity` queued ops a chat's new
//! drafts and typing are dropped (a later draft, settle or final carries the text);
//! durable ops (final, settle, notice, dismiss, retract) are always taken and only the
//! engine-wide `max_queued` bound makes `submit` wait (backpressure on the consumer).
//!
//! **Pacing** is what each sink declares ([`Sink::pacing`]): a per-chat token bucket
//! (Telegram, Slack), a sink-wide bucket (Telegram's per-bot limit, a Discord webhook's
//! bucket), and a bound on requests in flight; a webhook or the web page is not paced at
//! all, only bounded. `DeliveryConfig::chat_rate` overrides the per-chat bucket. A lane
//! - pauses until a `retry_after` the API returned has passed (no request to that chat
//!   before it expires);
//! - coalesces drafts latest-wins: a new `Draft` for a run whose newest queued op is a
//!   `Draft` replaces it, and a draft being retried is dropped once a newer one is queued;
//! - throttles typing (one per chat per `typing_interval`; typing is never retried);
//! - retries transient failures with exponential backoff and full jitter — ops other
//!   than `Final` up to `max_attempts`, `Final` up to `final_attempts`; then a final is
//!   **parked** ([`Delivery::is_parked`], `streamgate_delivery_parked_total`): the chat
//!   goes on with its next op, and the owner keeps its own record of the run (the
//!   projector's active-run marker) so the final is sent again on the next start;
//! - gives a permanent refusal (a 4xx other than 429, a request that cannot be built)
//!   `permanent_attempts` tries, then drops the op with a warning and
//!   `streamgate_delivery_dropped_total`, and the chat goes on;
//! - asks the sink's circuit breaker before every request.
//!
//! **Shutdown.** [`Delivery::shutdown`] gives queued ops a grace period, then closes the
//! engine: lanes stop taking ops and give up their waits (pacing, backoff, a
//! `retry_after`), but an attempt already sent to a chat API finishes — bounded by
//! `attempt_timeout` — and its outcome is saved before `shutdown` returns
//! ([`Delivery::attempts_done`]), so the next owner of the run resumes after what the
//! platform confirmed instead of sending it again. [`Delivery::flush`]
//! and [`Delivery::flush_run`] return `false`, and `submit` answers
//! [`DeliveryError::Closed`]. Whoever needs an op delivered across a restart keeps its
//! own record until `flush_run` says `true` (the projector's active-run markers).
//!
//! **Handover.** When a partition moves to another replica, [`Delivery::hand_over`]
//! drops its runs' queued ops, makes an op of theirs waiting to retry give up, and waits
//! for their attempt in flight: the next owner rebuilds what is left from the events and
//! the saved state, and two owners never act on one chat at once.
//!
//! **Finals exactly once.** Before each attempt the lane loads the run's
//! [`DeliveryState`] from the [`StateStore`]; after each attempt — success, error or
//! timeout — it saves the state the sink left. Sinks record each confirmed effect in the
//! state as they go (each part of a split final), so a retry, a second submission of the
//! same `Final`, or a restart resumes after what is confirmed and never repeats it.
//!
//! The residual window, honestly: when a chat API applies a request but its response is
//! lost (timeout after the server acted, connection reset, crash before `save`), the
//! state cannot know, and the retry sends that message again — at-least-once for that
//! one request on Telegram, Discord and Slack, whose send APIs take no idempotency key.
//! The webhook sink closes the window: every op carries a stable `Idempotency-Key` the
//! receiver dedupes on.

mod breaker;
mod store;
#[cfg(test)]
mod tests;

pub use breaker::BreakerState;
pub use store::{MemoryStore, StateKey, StateStore, StoreError};

use crate::sink::{ChatTarget, DeliveryState, Pacing, Rate, Sink, SinkError};
use breaker::Breaker;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use streamgate_projection::{DraftKey, Op};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};

/// Tunables of the delivery engine. Pacing is not here: each sink declares its own
/// ([`Sink::pacing`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryConfig {
    /// Replaces the per-chat token bucket every sink of the engine declares (`None`:
    /// each sink's own). For operators with raised limits, and tests.
    pub chat_rate: Option<Rate>,
    /// At most one typing request per chat per this interval.
    pub typing_interval: Duration,
    /// First retry delay; doubles per attempt.
    pub retry_base: Duration,
    /// Cap of the retry delay.
    pub retry_max: Duration,
    /// Attempts after transient failures for ops other than `Final`.
    pub max_attempts: u32,
    /// Attempts of a `Final` after transient failures (5xx, timeouts) before it is
    /// parked and the chat goes on (at the default backoff, about 15 s of retries).
    pub final_attempts: u32,
    /// Attempts of any op — `Final` included — the sink refuses permanently (4xx other
    /// than 429, a request that cannot be built) before it is dropped.
    pub permanent_attempts: u32,
    /// Consecutive transient failures that open a sink's breaker.
    pub breaker_threshold: u32,
    /// How long an open breaker stays open before a probe.
    pub breaker_cooldown: Duration,
    /// Upper bound on one `Sink::execute` call.
    pub attempt_timeout: Duration,
    /// Queued ops of one chat beyond which its new drafts and typing are dropped
    /// (durable ops are always taken).
    pub lane_capacity: usize,
    /// Queued ops over every chat beyond which `submit` of a durable op waits
    /// (backpressure, not loss).
    pub max_queued: usize,
    /// How long [`Delivery::shutdown`] lets queued ops drain before closing.
    pub shutdown_grace: Duration,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            chat_rate: None,
            // Telegram's chat action lasts ~5 s.
            typing_interval: Duration::from_secs(4),
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            max_attempts: 5,
            final_attempts: 6,
            permanent_attempts: 2,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(30),
            lane_capacity: 256,
            max_queued: 65_536,
            shutdown_grace: Duration::from_secs(2),
        }
    }
}

/// A final whose retries ran out: the chat went on without it ([`Delivery::parked`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    /// Where it was going.
    pub chat: ChatTarget,
    /// Its run.
    pub run: DraftKey,
    /// The last failure.
    pub error: String,
    /// When it was parked.
    pub at: std::time::SystemTime,
}

/// A submission the engine cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// No sink is registered under the target's channel name.
    #[error("no sink registered for channel `{0}`")]
    UnknownChannel(String),
    /// The engine was shut down.
    #[error("delivery engine closed")]
    Closed,
}

const DROPPED: &str = "streamgate_delivery_dropped_total";
/// Seconds from an op's submission to the sink's answer (the delivery part of
/// event→sink; the projector records the part before it).
const LATENCY: &str = "streamgate_delivery_latency_seconds";

/// Records the time one attempt spent in a step of its delivery since `since`
/// (`streamgate_delivery_step_seconds`): `load` (the run's delivery state), `slot` (a
/// request slot among the sink's in flight), `request` (the sink's call), `save` (the
/// changed state).
fn record_step(step: &'static str, since: Instant) {
    metrics::histogram!("streamgate_delivery_step_seconds", "step" => step)
        .record(since.elapsed().as_secs_f64());
}

#[derive(Debug)]
struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: Rate) -> Bucket {
        Bucket {
            rate,
            tokens: f64::from(rate.burst.max(1)),
            at: Instant::now(),
        }
    }

    /// Takes a token (`None`) or says how long until one is there.
    fn take(&mut self, now: Instant) -> Option<Duration> {
        let rate = self.rate.per_sec.max(0.001);
        let burst = f64::from(self.rate.burst.max(1));
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate).min(burst);
        self.at = now;
        // The epsilon and the 1 ms floor matter: float refill can leave 0.999… tokens,
        // and a wait rounded to 0 ns would spin without the clock moving (forever under
        // paused time).
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            return None;
        }
        Some(Duration::from_secs_f64((1.0 - self.tokens) / rate).max(Duration::from_millis(1)))
    }
}

/// An op waiting on its chat's lane, with when it was submitted (a coalesced draft
/// keeps its slot's time: the chat has waited since then).
struct Queued {
    op: Op,
    since: Instant,
}

struct LaneQueue {
    ops: VecDeque<Queued>,
    /// Ops of each run queued or being executed (for [`Delivery::flush_run`]).
    runs: HashMap<DraftKey, usize>,
    last_typing: Option<Instant>,
    paused_until: Option<Instant>,
    bucket: Option<Bucket>,
    /// The lane's task ended after it idled (`LANE_IDLE`); a submit looks again.
    retired: bool,
    /// Runs handed to another owner ([`Delivery::hand_over`]) and not submitted here
    /// since: an op of theirs still running gives up at its next wait instead of trying
    /// again, and [`Delivery::flush_run`] says they were not delivered here.
    handed_over: HashSet<DraftKey>,
}

struct Lane {
    chat: ChatTarget,
    queue: Mutex<LaneQueue>,
    wake: Notify,
    /// Wakes the lane's waits when one of its runs is handed over.
    handover: Notify,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn has_queued_draft(&self, run: &DraftKey) -> bool {
        self.lock()
            .ops
            .iter()
            .any(|o| matches!(&o.op, Op::Draft { key, .. } if key == run))
    }

    fn pending(&self, run: &DraftKey) -> usize {
        self.lock().runs.get(run).copied().unwrap_or(0)
    }

    fn is_handed_over(&self, run: Option<&DraftKey>) -> bool {
        run.is_some_and(|r| self.lock().handed_over.contains(r))
    }

    /// Takes the queued ops of the runs `theirs` picks out of the queue and marks those
    /// runs handed over: the runs and how many ops were taken.
    fn hand_over(
        &self,
        theirs: &impl Fn(&ChatTarget, &DraftKey) -> bool,
    ) -> (Vec<DraftKey>, usize) {
        let mut q = self.lock();
        let runs: Vec<DraftKey> = q
            .runs
            .keys()
            .filter(|r| theirs(&self.chat, r))
            .cloned()
            .collect();
        if runs.is_empty() {
            return (runs, 0);
        }
        let mut taken = 0;
        let LaneQueue {
            ops,
            runs: counts,
            handed_over,
            ..
        } = &mut *q;
        ops.retain(|o| {
            let Some(run) = op_run(&o.op).filter(|r| runs.contains(r)) else {
                return true;
            };
            taken += 1;
            if let Some(n) = counts.get_mut(run) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(run);
                }
            }
            false
        });
        handed_over.extend(runs.iter().cloned());
        drop(q);
        self.handover.notify_waiters();
        (runs, taken)
    }
}

struct SinkEntry {
    sink: Arc<dyn Sink>,
    /// One breaker per tenant: a receiver failing one tenant's requests (a bad payload,
    /// a tenant-specific endpoint) never holds up another tenant's chats.
    breakers: Mutex<HashMap<String, Arc<Breaker>>>,
    breaker_threshold: u32,
    breaker_cooldown: Duration,
    pacing: Pacing,
    bucket: Option<Mutex<Bucket>>,
    permits: Semaphore,
}

/// Engine-wide counters, watched by `flush` and `submit`.
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    queued: usize,
    closed: bool,
    /// Attempts sent to a chat API whose outcome is not saved yet.
    attempts: usize,
}

/// Counts a submitted op in `queued` until [`Counted::keep`] (it is on its lane, which
/// uncounts it when done), or uncounts it when dropped first (it was coalesced, throttled
/// or dropped instead). Never used under a lane's lock: `flush_run` locks lanes inside
/// the watch.
struct Counted<'a>(Option<&'a watch::Sender<Flow>>);

impl<'a> Counted<'a> {
    fn new(flow: &'a watch::Sender<Flow>) -> Counted<'a> {
        flow.send_modify(|f| f.queued += 1);
        Counted(Some(flow))
    }

    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if let Some(flow) = self.0 {
            flow.send_modify(|f| f.queued = f.queued.saturating_sub(1));
        }
    }
}

/// Counts an attempt in flight until dropped (its outcome saved, or its task gone).
struct InFlight<'a>(&'a watch::Sender<Flow>);

impl<'a> InFlight<'a> {
    /// Counts an attempt about to be sent — unless the engine closed (`None`). Checked
    /// and counted in one step, so once [`Delivery::attempts_done`] saw none in flight
    /// after the close, none starts.
    fn start(flow: &'a watch::Sender<Flow>) -> Option<InFlight<'a>> {
        let mut started = false;
        flow.send_if_modified(|f| {
            if f.closed {
                return false;
            }
            f.attempts += 1;
            started = true;
            true
        });
        started.then_some(InFlight(flow))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .send_modify(|f| f.attempts = f.attempts.saturating_sub(1));
    }
}

struct Inner {
    config: DeliveryConfig,
    store: Arc<dyn StateStore>,
    sinks: HashMap<String, SinkEntry>,
    lanes: Mutex<HashMap<ChatTarget, Arc<Lane>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    flow: watch::Sender<Flow>,
    /// Finals whose retries ran out ([`Delivery::is_parked`]).
    parked: Mutex<HashMap<(ChatTarget, DraftKey), Parked>>,
    /// Tests: how long `submit` stalls its thread once an op is on its lane, in ms.
    #[cfg(test)]
    pause_after_queueing_ms: std::sync::atomic::AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Lanes hold only a weak reference while idle; stop them with the engine.
        for t in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// The delivery engine. Cheap to clone; all clones share lanes, breakers and state.
#[derive(Clone)]
pub struct Delivery {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("config", &self.inner.config)
            .field("channels", &self.inner.sinks.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn op_run(op: &Op) -> Option<&DraftKey> {
    match op {
        Op::Typing => None,
        Op::Draft { key, .. }
        | Op::Settle { key, .. }
        | Op::Dismiss { key }
        | Op::Final { key, .. }
        | Op::Retract { key, .. }
        | Op::Notice { key, .. } => Some(key),
    }
}

/// Ops a later op makes redundant; everything else must reach the chat.
fn is_droppable(op: &Op) -> bool {
    matches!(op, Op::Typing | Op::Draft { .. })
}

impl SinkEntry {
    /// The sink's breaker for `tenant`'s chats, made on first use.
    fn breaker(&self, tenant: &str) -> Arc<Breaker> {
        let mut breakers = self.breakers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = breakers.get(tenant) {
            return b.clone();
        }
        let b = Arc::new(Breaker::new(self.breaker_threshold, self.breaker_cooldown));
        breakers.insert(tenant.to_owned(), b.clone());
        b
    }
}

impl Delivery {
    /// An engine over `sinks` (keyed by [`Sink::channel`]; a later sink with the same
    /// name replaces an earlier one) keeping state in `store`. Must be called inside a
    /// tokio runtime (lanes are tasks).
    pub fn new(
        config: DeliveryConfig,
        store: Arc<dyn StateStore>,
        sinks: impl IntoIterator<Item = Arc<dyn Sink>>,
    ) -> Delivery {
        let sinks = sinks
            .into_iter()
            .map(|sink| {
                let mut pacing = sink.pacing();
                if let Some(rate) = config.chat_rate {
                    pacing.per_chat = Some(rate);
                }
                let entry = SinkEntry {
                    breakers: Mutex::new(HashMap::new()),
                    breaker_threshold: config.breaker_threshold,
                    breaker_cooldown: config.breaker_cooldown,
                    bucket: pacing.per_sink.map(|r| Mutex::new(Bucket::new(r))),
                    permits: Semaphore::new(pacing.concurrency.max(1)),
                    pacing,
                    sink,
                };
                (entry.sink.channel().to_owned(), entry)
            })
            .collect();
        Delivery {
            inner: Arc::new(Inner {
                config,
                store,
                sinks,
                lanes: Mutex::new(HashMap::new()),
                tasks: Mutex::new(Vec::new()),
                flow: watch::channel(Flow::default()).0,
                parked: Mutex::default(),
                #[cfg(test)]
                pause_after_queueing_ms: Default::default(),
            }),
        }
    }

    /// Queue `op` for `chat`. Returns once queued (or coalesced, or dropped as a
    /// throttled typing or a draft beyond the chat's bound). Never waits on the chat's
    /// own queue; a durable op waits only while the whole engine holds `max_queued`
    /// ops. Delivery happens on the chat's lane; [`Delivery::flush`] waits for it.
    pub async fn submit(&self, chat: ChatTarget, op: Op) -> Result<(), DeliveryError> {
        let Some(entry) = self.inner.sinks.get(&chat.channel) else {
            return Err(DeliveryError::UnknownChannel(chat.channel));
        };
        if !is_droppable(&op) {
            let max = self.inner.config.max_queued.max(1);
            let mut rx = self.inner.flow.subscribe();
            let _ = rx.wait_for(|f| f.closed || f.queued < max).await;
        }
        if self.inner.flow.borrow().closed {
            return Err(DeliveryError::Closed);
        }
        let label = op.name();
        // Counted before the op can reach its lane: a lane may take, run and uncount it
        // before this returns, and counting it after that left `queued` at one for good
        // (a `flush` that never returned).
        let counted = Counted::new(&self.inner.flow);
        let lane = loop {
            let lane = self.lane(&chat, entry);
            let mut q = lane.lock();
            if q.retired {
                // Retired idle between the lookup and the lock: take the new one.
                continue;
            }
            if let Some(run) = op_run(&op) {
                // The run is ours (again).
                q.handed_over.remove(run);
            }
            let now = Instant::now();
            match &op {
                Op::Typing => {
                    let recent = q
                        .last_typing
                        .is_some_and(|t| now < t + self.inner.config.typing_interval);
                    if recent || q.ops.iter().any(|o| matches!(o.op, Op::Typing)) {
                        metrics::counter!("streamgate_delivery_typing_throttled_total")
                            .increment(1);
                        return Ok(());
                    }
                }
                Op::Draft { key, .. } => {
                    // Latest wins: replace the run's newest queued op if it is a draft
                    // (never jump over a queued settle/final of the run).
                    let newest = q.ops.iter().rposition(|o| op_run(&o.op) == Some(key));
                    if let Some(pos) = newest {
                        if let Some(slot @ Op::Draft { .. }) = q.ops.get_mut(pos).map(|o| &mut o.op)
                        {
                            *slot = op;
                            metrics::counter!("streamgate_delivery_drafts_coalesced_total")
                                .increment(1);
                            return Ok(());
                        }
                    }
                }
                _ => {}
            }
            if is_droppable(&op) && q.ops.len() >= self.inner.config.lane_capacity.max(1) {
                // A full chat is busy enough: a later draft, the settle or the final
                // carries this text.
                metrics::counter!(DROPPED, "channel" => chat.channel.clone(), "op" => label, "reason" => "lane_full")
                    .increment(1);
                return Ok(());
            }
            if matches!(op, Op::Typing) {
                q.last_typing = Some(now);
            }
            if let Some(run) = op_run(&op) {
                *q.runs.entry(run.clone()).or_default() += 1;
            }
            q.ops.push_back(Queued { op, since: now });
            drop(q);
            break lane;
        };
        #[cfg(test)]
        self.inner.stall_after_queueing();
        counted.keep();
        lane.wake.notify_one();
        metrics::counter!("streamgate_delivery_submitted_total", "op" => label).increment(1);
        Ok(())
    }

    /// Wait until every queued op has been delivered, dropped or given up on: `true`;
    /// `false` when the engine closed first (ops may be left undelivered).
    pub async fn flush(&self) -> bool {
        let mut rx = self.inner.flow.subscribe();
        rx.wait_for(|f| f.closed || f.queued == 0)
            .await
            .is_ok_and(|f| !f.closed)
    }

    /// Wait until no op of the run `run` (tenant and run id, as its ops' draft key names
    /// it) is queued for `chat` or being executed: `true` (each was delivered, dropped or
    /// given up on); `false` when the engine closed or the run was handed over
    /// ([`Delivery::hand_over`]) first. Other chats and other runs —
    /// the same run id under another tenant included — do not hold it up.
    pub async fn flush_run(&self, chat: &ChatTarget, run: &DraftKey) -> bool {
        let lane = self
            .inner
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(chat)
            .cloned();
        let mut rx = self.inner.flow.subscribe();
        let Some(lane) = lane else {
            return !rx.borrow().closed;
        };
        let mut done = false;
        let _ = rx
            .wait_for(|f| {
                if f.closed || lane.is_handed_over(Some(run)) {
                    return true;
                }
                done = lane.pending(run) == 0;
                done
            })
            .await;
        done
    }

    /// The finals parked now, oldest first.
    pub fn parked(&self) -> Vec<Parked> {
        let mut all: Vec<Parked> = self
            .inner
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by_key(|p| p.at);
        all
    }

    /// True when the final of `run` for `chat` was parked (its retries ran out): the
    /// caller keeps whatever lets it send the final again on the next start.
    pub fn is_parked(&self, chat: &ChatTarget, run: &DraftKey) -> bool {
        self.inner
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&(chat.clone(), run.clone()))
    }

    /// Let queued ops drain for up to `config.shutdown_grace`, then [`Delivery::close`],
    /// and wait for the attempts in flight to finish and save their outcome (bounded by
    /// `attempt_timeout` and the store's retries).
    pub async fn shutdown(&self) {
        let _ = timeout(self.inner.config.shutdown_grace, self.flush()).await;
        self.close();
        self.attempts_done().await;
    }

    /// Waits until no attempt is in flight, bounded by `attempt_timeout` plus a margin
    /// for saving its state. After [`Delivery::close`] no new attempt starts, so this is
    /// when every effect the engine caused is recorded; a partition released after it
    /// hands its runs over without a request whose outcome nobody knows.
    pub async fn attempts_done(&self) {
        let bound = self.inner.config.attempt_timeout + Duration::from_secs(5);
        let mut rx = self.inner.flow.subscribe();
        if timeout(bound, rx.wait_for(|f| f.attempts == 0))
            .await
            .is_err()
        {
            tracing::warn!("delivery attempts still in flight after their bound");
        }
    }

    /// Gives up the runs `theirs` picks out (by chat and run) to another owner — a
    /// partition moving to another replica: their queued ops are dropped (the next
    /// owner rebuilds them from the events and the saved [`DeliveryState`]), an op of
    /// theirs waiting to be tried again gives up, and this returns once no attempt of
    /// theirs is in flight any more and its outcome is saved (bounded like
    /// [`Delivery::attempts_done`]). After it, this engine sends nothing more for those
    /// runs unless they are submitted again, so two owners never act on a chat at once.
    pub async fn hand_over(&self, theirs: impl Fn(&ChatTarget, &DraftKey) -> bool) {
        let marked = self.take_runs(theirs);
        if marked.is_empty() {
            return;
        }
        let bound = self.inner.config.attempt_timeout + Duration::from_secs(5);
        let mut rx = self.inner.flow.subscribe();
        // A closed engine's lanes stop without counting their ops off: there, no attempt
        // in flight is what matters.
        let idle = rx.wait_for(|f| {
            (f.closed && f.attempts == 0) || marked.iter().all(|(lane, run)| lane.pending(run) == 0)
        });
        if timeout(bound, idle).await.is_err() {
            tracing::warn!("an attempt of a handed-over run still in flight after its bound");
        }
    }

    /// The first half of [`Delivery::hand_over`], without the wait: the queued ops of
    /// the runs `theirs` picks out are dropped and an op of theirs waiting to be tried
    /// again gives up. A partition whose lease was *lost* (its worker aborted, no time
    /// to wait) calls this so that the engine does not go on sending for runs another
    /// replica now owns. Returns how many runs were given up.
    pub fn give_up(&self, theirs: impl Fn(&ChatTarget, &DraftKey) -> bool) -> usize {
        self.take_runs(theirs).len()
    }

    /// Takes the runs `theirs` picks out from every lane ([`Lane::hand_over`]): the runs
    /// with their lanes.
    fn take_runs(
        &self,
        theirs: impl Fn(&ChatTarget, &DraftKey) -> bool,
    ) -> Vec<(Arc<Lane>, DraftKey)> {
        let lanes: Vec<Arc<Lane>> = self
            .inner
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut marked = Vec::new();
        let mut dropped = 0;
        for lane in lanes {
            let (runs, taken) = lane.hand_over(&theirs);
            dropped += taken;
            marked.extend(runs.into_iter().map(|r| (Arc::clone(&lane), r)));
        }
        if marked.is_empty() {
            return marked;
        }
        self.inner
            .flow
            .send_modify(|f| f.queued = f.queued.saturating_sub(dropped));
        if dropped > 0 {
            tracing::info!(
                runs = marked.len(),
                ops = dropped,
                "queued ops handed over to the next owner"
            );
        }
        marked
    }

    /// Close the engine now: lanes stop taking ops and give up their waits (an attempt
    /// already sent finishes: [`Delivery::attempts_done`]), queued ops are left
    /// undelivered, waiting `flush`es return `false`, `submit` is refused.
    pub fn close(&self) {
        let queued = self.inner.flow.borrow().queued;
        self.inner.flow.send_modify(|f| f.closed = true);
        if queued > 0 {
            tracing::info!(queued, "delivery engine closed with ops queued");
        }
    }

    /// Whether [`Delivery::close`] (or `shutdown`) ran.
    pub fn is_closed(&self) -> bool {
        self.inner.flow.borrow().closed
    }

    /// Breaker state of the sink serving `channel` for `tenant`'s chats, if registered.
    pub fn breaker_state(&self, channel: &str, tenant: &str) -> Option<BreakerState> {
        self.inner
            .sinks
            .get(channel)
            .map(|e| e.breaker(tenant).state(Instant::now()))
    }

    /// The chat's lane, spawning it on first use.
    fn lane(&self, chat: &ChatTarget, entry: &SinkEntry) -> Arc<Lane> {
        let mut lanes = self.inner.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = lanes.get(chat) {
            return Arc::clone(l);
        }
        let lane = Arc::new(Lane {
            chat: chat.clone(),
            queue: Mutex::new(LaneQueue {
                ops: VecDeque::new(),
                runs: HashMap::new(),
                last_typing: None,
                paused_until: None,
                bucket: entry.pacing.per_chat.map(Bucket::new),
                retired: false,
                handed_over: HashSet::new(),
            }),
            wake: Notify::new(),
            handover: Notify::new(),
        });
        lanes.insert(chat.clone(), Arc::clone(&lane));
        let task = tokio::spawn(run_lane(
            Arc::downgrade(&self.inner),
            Arc::clone(&lane),
            self.inner.flow.subscribe(),
        ));
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
        lane
    }

    /// Tests: makes `submit` stall its thread for `pause` once an op is on its lane —
    /// time for the lane to run it before `submit` returns.
    #[cfg(test)]
    fn pause_after_queueing(&self, pause: Duration) {
        let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        self.inner
            .pause_after_queueing_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(test)]
    fn lane_count(&self) -> usize {
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// A chat's lane (its task and its state) goes after this long without work, so chats
/// seen once do not hold memory forever; it is only retired when nothing of it is
/// pending (no op, no running `retry_after`, no typing window).
const LANE_IDLE: Duration = Duration::from_secs(60);

async fn run_lane(inner: Weak<Inner>, lane: Arc<Lane>, mut flow: watch::Receiver<Flow>) {
    loop {
        let Queued { op, since } = loop {
            let woken = lane.wake.notified();
            let next = lane.lock().ops.pop_front();
            if let Some(queued) = next {
                break queued;
            }
            tokio::select! {
                () = woken => {}
                _ = flow.wait_for(|f| f.closed) => return,
                () = sleep(LANE_IDLE) => {
                    match inner.upgrade() {
                        Some(inner) if !inner.retire(&lane) => {}
                        _ => return,
                    }
                }
            }
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if flow.borrow().closed {
            return;
        }
        // Not raced against close: `deliver` gives up its waits itself when the engine
        // closes, but lets an attempt already sent finish and save its outcome.
        inner.process(&lane, &op).await;
        metrics::histogram!(LATENCY, "op" => op.name()).record(since.elapsed().as_secs_f64());
        if let Some(run) = op_run(&op) {
            let mut q = lane.lock();
            if let Some(n) = q.runs.get_mut(run) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    q.runs.remove(run);
                }
            }
        }
        inner
            .flow
            .send_modify(|f| f.queued = f.queued.saturating_sub(1));
    }
}

enum Outcome {
    Delivered,
    Skipped,
    Superseded,
    GaveUp,
    Parked,
    Failed,
    /// The engine closed before the op was attempted (again): left for the next owner.
    Shutdown,
    /// Its run went to another owner before the op was attempted (again).
    HandedOver,
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Skipped => "skipped",
            Outcome::Superseded => "superseded",
            Outcome::GaveUp => "gave_up",
            Outcome::Parked => "parked",
            Outcome::Failed => "failed",
            Outcome::Shutdown => "shutdown",
            Outcome::HandedOver => "handed_over",
        }
    }
}

impl Inner {
    #[cfg(test)]
    fn stall_after_queueing(&self) {
        let ms = self
            .pause_after_queueing_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    /// Retires `lane` if it is idle: removed from the table and marked, so a submit
    /// that already holds it looks up (and spawns) a fresh one. Lock order: the table,
    /// then the lane.
    fn retire(&self, lane: &Arc<Lane>) -> bool {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let mut q = lane.lock();
        let now = Instant::now();
        let idle = q.ops.is_empty()
            && q.runs.is_empty()
            && q.paused_until.is_none_or(|t| t <= now)
            && q.last_typing
                .is_none_or(|t| t + self.config.typing_interval <= now);
        if !idle {
            return false;
        }
        q.retired = true;
        if lanes.get(&lane.chat).is_some_and(|l| Arc::ptr_eq(l, lane)) {
            lanes.remove(&lane.chat);
        }
        true
    }

    /// Runs `fut` unless the engine closes or `run` is handed over first (`None`): the
    /// waits between attempts give way to a shutdown or a handover; an attempt itself
    /// does not.
    async fn unless_stopped<T>(
        &self,
        lane: &Lane,
        run: Option<&DraftKey>,
        fut: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let mut flow = self.flow.subscribe();
        let fut = std::pin::pin!(fut);
        let mut fut = fut;
        loop {
            let handover = std::pin::pin!(lane.handover.notified());
            let mut handover = handover;
            handover.as_mut().enable();
            if lane.is_handed_over(run) {
                return None;
            }
            tokio::select! {
                biased;
                _ = flow.wait_for(|f| f.closed) => return None,
                () = &mut handover => {}
                v = &mut fut => return Some(v),
            }
        }
    }

    /// Why a lane stopped working on an op before it was done.
    fn stopped(&self) -> Outcome {
        if self.flow.borrow().closed {
            Outcome::Shutdown
        } else {
            Outcome::HandedOver
        }
    }

    /// The wait before retry `attempt` (from 1): `retry_base` doubling up to `retry_max`,
    /// drawn from the upper half, which spreads retries of many lanes apart while keeping
    /// the delay growing. backon's exponential backoff, whose jitter adds up to the wait
    /// again: so it starts from half.
    fn backoff(&self, attempt: u32) -> Duration {
        use backon::BackoffBuilder as _;
        let step = usize::try_from(attempt.saturating_sub(1).min(32)).unwrap_or(32);
        backon::ExponentialBuilder::new()
            .with_min_delay(self.config.retry_base / 2)
            .with_max_delay(self.config.retry_max / 2)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(step)
            .unwrap_or(self.config.retry_max)
    }

    /// Wait for the chat's token, then the sink's; returns when both are taken.
    async fn take_tokens(&self, lane: &Lane, entry: &SinkEntry) {
        loop {
            let wait = lane
                .lock()
                .bucket
                .as_mut()
                .and_then(|b| b.take(Instant::now()));
            match wait {
                Some(d) => sleep(d).await,
                None => break,
            }
        }
        let Some(bucket) = &entry.bucket else {
            return;
        };
        loop {
            let wait = bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(Instant::now());
            match wait {
                Some(d) => sleep(d).await,
                None => return,
            }
        }
    }

    async fn load(&self, key: &StateKey) -> Result<DeliveryState, StoreError> {
        Ok(self.store.load(key).await?.unwrap_or_default())
    }

    async fn save(&self, key: &StateKey, state: &DeliveryState) {
        // The state after an effect must not be lost (it is what makes a final
        // exactly-once): retry the store a few times before giving up loudly.
        for attempt in 1..=5u32 {
            match self.store.save(key, state).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "saving delivery state failed");
                    sleep(self.backoff(attempt)).await;
                }
            }
        }
        tracing::error!(run = %key.run_id, "delivery state not saved; a retry may repeat");
    }

    async fn process(&self, lane: &Lane, op: &Op) {
        let outcome = self.deliver(lane, op).await;
        metrics::counter!(
            "streamgate_delivery_ops_total",
            "channel" => lane.chat.channel.clone(),
            "op" => op.name(),
            "outcome" => outcome.label()
        )
        .increment(1);
    }

    fn park(&self, chat: &ChatTarget, run: Option<&DraftKey>, error: &SinkError) {
        let Some(run) = run else { return };
        tracing::warn!(chat = %chat, run = %run.run_id.escape_debug(), error = %error, "final parked after its retries: the chat goes on; it is sent again on the next start");
        metrics::counter!("streamgate_delivery_parked_total", "channel" => chat.channel.clone())
            .increment(1);
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.insert(
            (chat.clone(), run.clone()),
            Parked {
                chat: chat.clone(),
                run: run.clone(),
                error: error.to_string(),
                at: std::time::SystemTime::now(),
            },
        );
        metrics::gauge!("streamgate_delivery_parked").set(parked.len() as f64);
    }

    fn unpark(&self, chat: &ChatTarget, run: Option<&DraftKey>) {
        let Some(run) = run else { return };
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        if parked.remove(&(chat.clone(), run.clone())).is_some() {
            metrics::gauge!("streamgate_delivery_parked").set(parked.len() as f64);
        }
    }

    fn dropped(&self, chat: &ChatTarget, op: &Op, reason: &'static str, error: &SinkError) {
        let run = op_run(op).map_or("-", |r| r.run_id.as_str());
        tracing::warn!(chat = %chat, run = %run.escape_debug(), op = op.name(), reason, error = %error, "op dropped undelivered");
        metrics::counter!(DROPPED, "channel" => chat.channel.clone(), "op" => op.name(), "reason" => reason)
            .increment(1);
    }

    async fn deliver(&self, lane: &Lane, op: &Op) -> Outcome {
        let chat = &lane.chat;
        let Some(entry) = self.sinks.get(&chat.channel) else {
            return Outcome::Failed;
        };
        let is_typing = matches!(op, Op::Typing);
        let is_final = matches!(op, Op::Final { .. });
        let run = op_run(op);
        let key = run.map(|r| StateKey::for_draft(chat, r));
        let breaker = entry.breaker(&chat.tenant);
        let mut attempt = 0u32;
        let mut refused = 0u32;
        loop {
            if self.flow.borrow().closed || lane.is_handed_over(run) {
                return self.stopped();
            }
            // 1. The chat API's own pause (retry_after) comes first.
            let paused = lane.lock().paused_until;
            if let Some(until) = paused.filter(|t| *t > Instant::now()) {
                if is_typing {
                    return Outcome::Skipped;
                }
                if self
                    .unless_stopped(lane, run, sleep_until(until))
                    .await
                    .is_none()
                {
                    return self.stopped();
                }
            }
            // 2. The sink's breaker.
            let probe = match breaker.acquire(Instant::now()) {
                Ok(probe) => probe,
                Err(_) if is_typing => return Outcome::Skipped,
                Err(until) => {
                    if self
                        .unless_stopped(lane, run, sleep_until(until))
                        .await
                        .is_none()
                    {
                        return self.stopped();
                    }
                    continue;
                }
            };
            // 3. The sink's pacing: the chat's and the sink's token buckets.
            if self
                .unless_stopped(lane, run, self.take_tokens(lane, entry))
                .await
                .is_none()
            {
                breaker.neutral(probe);
                return self.stopped();
            }
            // 4. What is already done for this run. Read before a request slot is
            //    taken: the slots bound requests to the platform, and a state read held
            //    in one made every chat's op wait for other chats' reads (finals of 200
            //    chats at once waited 120 ms for 16 slots, 0.3 ms of it the request).
            let loading = Instant::now();
            let mut state = match &key {
                Some(k) => match self.load(k).await {
                    Ok(s) => {
                        record_step("load", loading);
                        s
                    }
                    Err(e) => {
                        breaker.neutral(probe);
                        attempt += 1;
                        tracing::warn!(error = %e, "loading delivery state failed");
                        if self
                            .unless_stopped(lane, run, sleep(self.backoff(attempt)))
                            .await
                            .is_none()
                        {
                            return self.stopped();
                        }
                        continue;
                    }
                },
                None => DeliveryState::default(),
            };
            if is_final && state.final_delivered {
                breaker.neutral(probe);
                return Outcome::Skipped;
            }
            // 5. A slot among the requests in flight, then the attempt, bounded. A
            //    timed-out attempt leaves in `state` whatever the sink recorded before
            //    the cut; it is saved like any other. It counts as in flight until then:
            //    a shutdown waits for it.
            let waiting = Instant::now();
            let permit = self
                .unless_stopped(lane, run, entry.permits.acquire())
                .await;
            record_step("slot", waiting);
            let Some(permit) = permit else {
                breaker.neutral(probe);
                return self.stopped();
            };
            let Ok(permit) = permit else {
                return Outcome::Failed;
            };
            let Some(in_flight) = InFlight::start(&self.flow) else {
                drop(permit);
                breaker.neutral(probe);
                return self.stopped();
            };
            // Saved only when the attempt changed it: an attempt that found its work
            // done (a stale draft, a final already sent) must not write back the state
            // it read over one another owner saved meanwhile (a lost lease's overlap).
            let loaded = key.is_some().then(|| state.clone());
            let requesting = Instant::now();
            let result = match timeout(
                self.config.attempt_timeout,
                entry.sink.execute(chat, op, &mut state),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(SinkError::Transient("attempt timed out".into())),
            };
            drop(permit);
            record_step("request", requesting);
            if let Some(k) = key.as_ref().filter(|_| loaded.as_ref() != Some(&state)) {
                let saving = Instant::now();
                self.save(k, &state).await;
                record_step("save", saving);
            }
            drop(in_flight);
            let superseded = || match run {
                Some(r) if matches!(op, Op::Draft { .. }) => lane.has_queued_draft(r),
                _ => false,
            };
            match result {
                Ok(()) => {
                    breaker.success();
                    if is_final {
                        self.unpark(chat, run);
                    }
                    return Outcome::Delivered;
                }
                Err(SinkError::RateLimited { retry_after }) => {
                    breaker.neutral(probe);
                    let until = Instant::now() + retry_after;
                    {
                        let mut q = lane.lock();
                        q.paused_until = Some(q.paused_until.map_or(until, |p| p.max(until)));
                    }
                    metrics::counter!("streamgate_delivery_rate_limited_total").increment(1);
                    tracing::debug!(chat = %chat, ?retry_after, "rate limited; lane paused");
                    // Honouring 429s always terminates, so they do not use up attempts.
                    if is_typing {
                        return Outcome::Skipped;
                    }
                    if superseded() {
                        return Outcome::Superseded;
                    }
                }
                Err(e @ SinkError::Transient(_)) => {
                    breaker.failure(Instant::now());
                    attempt += 1;
                    tracing::warn!(chat = %chat, op = op.name(), attempt, error = %e, "transient delivery failure");
                    if is_typing {
                        return Outcome::Skipped;
                    }
                    if !is_final && attempt >= self.config.max_attempts {
                        self.dropped(chat, op, "retries_exhausted", &e);
                        return Outcome::GaveUp;
                    }
                    if is_final && attempt >= self.config.final_attempts.max(1) {
                        self.park(chat, run, &e);
                        // What failed this long may be this final, not the receiver:
                        // the chat's next op is the probe, not a cooldown later.
                        breaker.release();
                        return Outcome::Parked;
                    }
                    if superseded() {
                        return Outcome::Superseded;
                    }
                    if self
                        .unless_stopped(lane, run, sleep(self.backoff(attempt)))
                        .await
                        .is_none()
                    {
                        return self.stopped();
                    }
                }
                Err(e @ SinkError::TooLarge(_)) => {
                    breaker.neutral(probe);
                    self.dropped(chat, op, "too_large", &e);
                    return Outcome::Failed;
                }
                Err(e @ SinkError::Permanent(_)) => {
                    // Bounded: a refusal that holds would otherwise block the chat.
                    breaker.neutral(probe);
                    refused += 1;
                    if is_typing || refused >= self.config.permanent_attempts.max(1) {
                        self.dropped(chat, op, "permanent", &e);
                        return Outcome::Failed;
                    }
                    tracing::debug!(chat = %chat, op = op.name(), refused, error = %e, "op refused; one more try");
                    if superseded() {
                        return Outcome::Superseded;
                    }
                    if self
                        .unless_stopped(lane, run, sleep(self.backoff(refused)))
                        .await
                        .is_none()
                    {
                        return self.stopped();
                    }
                }
            }
        }
    }
}

//! The delivery engine: runs ops through sinks with the manners chat APIs demand.
//!
//! One **lane** (a task and a bounded queue) per chat keeps that chat's ops in order.
//! A lane:
//! - takes a token from the chat's token bucket before every request;
//! - pauses the whole lane until a `retry_after` the API returned has passed (no request
//!   to that chat before it expires);
//! - coalesces drafts latest-wins: a new `Draft` for a run whose newest queued op is a
//!   `Draft` replaces it, and a draft being retried is dropped once a newer one is queued;
//! - throttles typing (one per chat per `typing_interval`; typing is never retried);
//! - retries transient failures with exponential backoff and full jitter — ops other
//!   than `Final` up to `max_attempts`, `Final` until it succeeds or fails permanently;
//! - asks the sink's circuit breaker before every request.
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

use crate::sink::{ChatTarget, DeliveryState, Sink, SinkError};
use breaker::Breaker;
use rand::Rng;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use streamgate_projection::{DraftKey, Op};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};

/// Tunables of the delivery engine.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryConfig {
    /// Sustained requests per second per chat (token refill rate).
    pub rate_per_sec: f64,
    /// Token bucket size per chat (requests allowed back to back).
    pub burst: u32,
    /// At most one typing request per chat per this interval.
    pub typing_interval: Duration,
    /// First retry delay; doubles per attempt.
    pub retry_base: Duration,
    /// Cap of the retry delay.
    pub retry_max: Duration,
    /// Attempts for ops other than `Final` (which retries until success or a permanent
    /// error).
    pub max_attempts: u32,
    /// Consecutive transient failures that open a sink's breaker.
    pub breaker_threshold: u32,
    /// How long an open breaker stays open before a probe.
    pub breaker_cooldown: Duration,
    /// Upper bound on one `Sink::execute` call.
    pub attempt_timeout: Duration,
    /// Queued ops per chat before `submit` waits (backpressure, not loss).
    pub lane_capacity: usize,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            // Telegram allows ~1 message/s per chat; Discord webhooks 5 per 2 s; Slack
            // ~1/s per channel: 1/s with a small burst suits all three.
            rate_per_sec: 1.0,
            burst: 3,
            // Telegram's chat action lasts ~5 s.
            typing_interval: Duration::from_secs(4),
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            max_attempts: 5,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(30),
            lane_capacity: 256,
        }
    }
}

/// A submission the engine cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// No sink is registered under the target's channel name.
    #[error("no sink registered for channel `{0}`")]
    UnknownChannel(String),
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

struct LaneQueue {
    ops: VecDeque<Op>,
    last_typing: Option<Instant>,
    paused_until: Option<Instant>,
    bucket: Bucket,
}

struct Lane {
    chat: ChatTarget,
    queue: Mutex<LaneQueue>,
    wake: Notify,
    space: Notify,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn has_queued_draft(&self, run: &DraftKey) -> bool {
        self.lock()
            .ops
            .iter()
            .any(|o| matches!(o, Op::Draft { key, .. } if key == run))
    }
}

struct SinkEntry {
    sink: Arc<dyn Sink>,
    breaker: Breaker,
}

struct Inner {
    config: DeliveryConfig,
    store: Arc<dyn StateStore>,
    sinks: HashMap<String, SinkEntry>,
    lanes: Mutex<HashMap<ChatTarget, Arc<Lane>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    inflight: watch::Sender<usize>,
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
                let entry = SinkEntry {
                    breaker: Breaker::new(config.breaker_threshold, config.breaker_cooldown),
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
                inflight: watch::channel(0).0,
            }),
        }
    }

    /// Queue `op` for `chat`. Returns once queued (or coalesced, or dropped as a
    /// throttled typing); waits while the chat's queue is full. Delivery happens on the
    /// chat's lane; [`Delivery::flush`] waits for it.
    pub async fn submit(&self, chat: ChatTarget, op: Op) -> Result<(), DeliveryError> {
        if !self.inner.sinks.contains_key(&chat.channel) {
            return Err(DeliveryError::UnknownChannel(chat.channel));
        }
        let lane = self.lane(&chat);
        let label = op.name();
        let mut op = Some(op);
        loop {
            let space = lane.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            {
                let mut q = lane.lock();
                let now = Instant::now();
                let Some(cur) = op.take() else {
                    return Ok(());
                };
                match &cur {
                    Op::Typing => {
                        let recent = q
                            .last_typing
                            .is_some_and(|t| now < t + self.inner.config.typing_interval);
                        if recent || q.ops.iter().any(|o| matches!(o, Op::Typing)) {
                            metrics::counter!("streamgate_delivery_typing_throttled_total")
                                .increment(1);
                            return Ok(());
                        }
                        q.last_typing = Some(now);
                    }
                    Op::Draft { key, .. } => {
                        // Latest wins: replace the run's newest queued op if it is a
                        // draft (never jump over a queued settle/final of the run).
                        let newest = q.ops.iter().rposition(|o| op_run(o) == Some(key));
                        if let Some(pos) = newest {
                            if let Some(slot @ Op::Draft { .. }) = q.ops.get_mut(pos) {
                                *slot = cur;
                                metrics::counter!("streamgate_delivery_drafts_coalesced_total")
                                    .increment(1);
                                return Ok(());
                            }
                        }
                    }
                    _ => {}
                }
                if q.ops.len() < self.inner.config.lane_capacity.max(1) {
                    q.ops.push_back(cur);
                    self.inner.inflight.send_modify(|n| *n += 1);
                    drop(q);
                    lane.wake.notify_one();
                    metrics::counter!("streamgate_delivery_submitted_total", "op" => label)
                        .increment(1);
                    return Ok(());
                }
                if matches!(cur, Op::Typing) {
                    // A full lane is busy enough; typing would only add load.
                    q.last_typing = None;
                    return Ok(());
                }
                op = Some(cur);
            }
            space.await;
        }
    }

    /// Wait until every queued op has been delivered, dropped or given up on.
    pub async fn flush(&self) {
        let mut rx = self.inner.inflight.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Breaker state of the sink serving `channel`, if registered.
    pub fn breaker_state(&self, channel: &str) -> Option<BreakerState> {
        self.inner
            .sinks
            .get(channel)
            .map(|e| e.breaker.state(Instant::now()))
    }

    /// The chat's lane, spawning it on first use.
    fn lane(&self, chat: &ChatTarget) -> Arc<Lane> {
        let mut lanes = self.inner.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = lanes.get(chat) {
            return Arc::clone(l);
        }
        let burst = f64::from(self.inner.config.burst.max(1));
        let lane = Arc::new(Lane {
            chat: chat.clone(),
            queue: Mutex::new(LaneQueue {
                ops: VecDeque::new(),
                last_typing: None,
                paused_until: None,
                bucket: Bucket {
                    tokens: burst,
                    at: Instant::now(),
                },
            }),
            wake: Notify::new(),
            space: Notify::new(),
        });
        lanes.insert(chat.clone(), Arc::clone(&lane));
        let task = tokio::spawn(run_lane(Arc::downgrade(&self.inner), Arc::clone(&lane)));
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
        lane
    }
}

async fn run_lane(inner: Weak<Inner>, lane: Arc<Lane>) {
    loop {
        let op = loop {
            let woken = lane.wake.notified();
            let next = lane.lock().ops.pop_front();
            if let Some(op) = next {
                break op;
            }
            woken.await;
        };
        lane.space.notify_waiters();
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.process(&lane, op).await;
        inner.inflight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

enum Outcome {
    Delivered,
    Skipped,
    Superseded,
    GaveUp,
    Failed,
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Skipped => "skipped",
            Outcome::Superseded => "superseded",
            Outcome::GaveUp => "gave_up",
            Outcome::Failed => "failed",
        }
    }
}

impl Inner {
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .config
            .retry_base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(self.config.retry_max);
        // Full jitter over the upper half: spreads retries of many lanes apart while
        // keeping the delay growing.
        let ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX).max(1);
        Duration::from_millis(rand::rng().random_range(ms / 2..=ms))
    }

    /// Wait for the chat's token; returns when one is taken.
    async fn take_token(&self, lane: &Lane) {
        let rate = self.config.rate_per_sec.max(0.001);
        let burst = f64::from(self.config.burst.max(1));
        loop {
            let wait = {
                let mut q = lane.lock();
                let now = Instant::now();
                let b = &mut q.bucket;
                b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
                b.at = now;
                // The epsilon and the 1 ms floor matter: float refill can leave
                // 0.999… tokens, and a wait rounded to 0 ns would spin without the clock
                // moving (forever under paused time).
                if b.tokens >= 1.0 - 1e-9 {
                    b.tokens = (b.tokens - 1.0).max(0.0);
                    return;
                }
                Duration::from_secs_f64((1.0 - b.tokens) / rate).max(Duration::from_millis(1))
            };
            sleep(wait).await;
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

    async fn process(&self, lane: &Lane, op: Op) {
        let outcome = self.deliver(lane, &op).await;
        metrics::counter!(
            "streamgate_delivery_ops_total",
            "channel" => lane.chat.channel.clone(),
            "op" => op.name(),
            "outcome" => outcome.label()
        )
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
        let key = run.map(|r| StateKey::new(chat, &r.run_id));
        let mut attempt = 0u32;
        loop {
            // 1. The chat API's own pause (retry_after) comes first.
            let paused = lane.lock().paused_until;
            if let Some(until) = paused.filter(|t| *t > Instant::now()) {
                if is_typing {
                    return Outcome::Skipped;
                }
                sleep_until(until).await;
            }
            // 2. The sink's breaker.
            let probe = match entry.breaker.acquire(Instant::now()) {
                Ok(probe) => probe,
                Err(_) if is_typing => return Outcome::Skipped,
                Err(until) => {
                    sleep_until(until).await;
                    continue;
                }
            };
            // 3. The chat's token bucket.
            self.take_token(lane).await;
            // 4. What is already done for this run.
            let mut state = match &key {
                Some(k) => match self.load(k).await {
                    Ok(s) => s,
                    Err(e) => {
                        entry.breaker.neutral(probe);
                        attempt += 1;
                        tracing::warn!(error = %e, "loading delivery state failed");
                        sleep(self.backoff(attempt)).await;
                        continue;
                    }
                },
                None => DeliveryState::default(),
            };
            if is_final && state.final_delivered {
                entry.breaker.neutral(probe);
                return Outcome::Skipped;
            }
            // 5. The attempt, bounded. A timed-out attempt leaves in `state` whatever
            //    the sink recorded before the cut; it is saved like any other.
            let result = match timeout(
                self.config.attempt_timeout,
                entry.sink.execute(chat, op, &mut state),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(SinkError::Transient("attempt timed out".into())),
            };
            if let Some(k) = &key {
                self.save(k, &state).await;
            }
            let superseded = || match run {
                Some(r) if matches!(op, Op::Draft { .. }) => lane.has_queued_draft(r),
                _ => false,
            };
            match result {
                Ok(()) => {
                    entry.breaker.success();
                    return Outcome::Delivered;
                }
                Err(SinkError::RateLimited { retry_after }) => {
                    entry.breaker.neutral(probe);
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
                Err(SinkError::Transient(e)) => {
                    entry.breaker.failure(Instant::now());
                    attempt += 1;
                    tracing::warn!(chat = %chat, op = op.name(), attempt, error = %e, "transient delivery failure");
                    if is_typing {
                        return Outcome::Skipped;
                    }
                    if !is_final && attempt >= self.config.max_attempts {
                        return Outcome::GaveUp;
                    }
                    if superseded() {
                        return Outcome::Superseded;
                    }
                    sleep(self.backoff(attempt)).await;
                }
                Err(e @ (SinkError::TooLarge(_) | SinkError::Permanent(_))) => {
                    entry.breaker.neutral(probe);
                    if is_final {
                        tracing::error!(chat = %chat, error = %e, "final answer refused permanently");
                    } else {
                        tracing::warn!(chat = %chat, op = op.name(), error = %e, "op refused");
                    }
                    return Outcome::Failed;
                }
            }
        }
    }
}

//! Local fake chat-API servers (axum on `127.0.0.1:0`) that behave like the real APIs
//! where the sinks depend on it: size limits answered with the real 400-style errors,
//! deterministic 429s with `retry_after`, "not modified"/"not found" edge cases, and a
//! transcript (messages by id with current text and a deleted flag) so tests can
//! assert what a person in the chat would see.
//!
//! Each server records every call. Shut down when dropped.
//!
//! This module holds what every fake shares (the server, the recorder, rate limiting,
//! [`Behavior`]); each platform's routes live beside its sink, in `telegram/fake.rs`,
//! `discord/fake.rs`, `slack/fake.rs` and `webhook/fake.rs`.

use axum::Router;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How a fake misbehaves, deterministically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Behavior {
    /// Answer every n-th call (1-based: calls n, 2n, …) with a 429.
    pub rate_limit_every: Option<u64>,
    /// A 429 burst: calls `from..from + n` (1-based) are all answered with a 429.
    pub rate_limit_burst: Option<(u64, u64)>,
    /// The `retry_after` of those 429s, in seconds (Telegram rounds up to whole seconds
    /// like the real API).
    pub retry_after_secs: f64,
    /// Apply the first `delay_first` message-creating calls, then hold the response for
    /// `delay` (to make a client time out after the server acted).
    pub delay_first: usize,
    /// See `delay_first`.
    pub delay: Duration,
    /// Webhook: answer every request for the chats in `refuse_chats` (every chat when
    /// empty) with this status, forever (a 400 the receiver will never accept, a 500 of
    /// a receiver that is down).
    pub refuse_status: Option<u16>,
    /// See `refuse_status`.
    pub refuse_chats: Vec<String>,
    /// Discord: a rate-limit bucket of this many requests per window for the webhook,
    /// stated in `X-RateLimit-*` headers on every answer; a request beyond it gets a
    /// 429 (scope `user`, counted as invalid).
    pub discord_bucket: Option<(u64, Duration)>,
    /// Telegram: how long a native draft stays visible without an update (default
    /// [`DRAFT_TTL`], ~30 s like the real API).
    pub telegram_draft_ttl: Option<Duration>,
    /// Slack: a stream not appended to for this long ends by itself (later calls on it
    /// get `message_not_in_streaming_state`).
    pub slack_stream_ttl: Option<Duration>,
    /// Slack: each method's rate-limit tier applies per window this long (a stand-in for
    /// Slack's minute): Tier 2 `startStream`/`stopStream` 20 calls, Tier 3 `update`,
    /// `delete`, `setStatus` 50, Tier 4 `appendStream` 100; beyond, a 429 with the
    /// seconds left in `Retry-After`.
    pub slack_tier_window: Option<Duration>,
    /// Slack: `chat.startStream` is refused with this error (`missing_scope`, …).
    pub slack_refuse_streams: Option<String>,
}

/// A Slack stream (`chat.startStream`): a message in a thread that grows by appends
/// until it is stopped or expires.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    /// The message's `ts` (also in [`FakeServer::messages`], with the text so far).
    pub id: String,
    /// Channel.
    pub chat: String,
    /// The thread it answers.
    pub thread_ts: String,
    /// Still streaming (not stopped, not expired).
    pub streaming: bool,
    /// Task cards by id: (title, status).
    pub tasks: std::collections::BTreeMap<String, (String, String)>,
    /// Plan title, when one was set.
    pub plan: Option<String>,
    /// Last start or append.
    pub at: Instant,
}

/// One recorded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// API method (`sendMessage`, `execute`, `chat.update`, `final`, …).
    pub api: String,
    /// Parsed JSON body (`Null` when none).
    pub body: Value,
    /// HTTP status answered.
    pub status: u16,
    /// When it arrived.
    pub at: Instant,
}

/// A message in the fake chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Id as the API returned it.
    pub id: String,
    /// Chat (Telegram chat id, Discord thread id or "", Slack channel).
    pub chat: String,
    /// What a person sees: tags stripped, entities decoded.
    pub text: String,
    /// The text as sent on the wire (HTML / mrkdwn).
    pub raw: String,
    /// Deleted since.
    pub deleted: bool,
    /// Number of applied edits.
    pub edits: u32,
}

/// A Telegram native draft (`sendMessageDraft`): an ephemeral preview in a private chat,
/// animated while the same `draft_id` is updated, gone ~30 s after its last update or
/// when the bot sends a real message to the chat.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Chat (a private chat's id).
    pub chat: String,
    /// The draft's id (the same id = an animated update).
    pub draft_id: i64,
    /// What a person sees now (tags stripped); empty = the "Thinking…" placeholder.
    pub text: String,
    /// Updates applied after the first.
    pub updates: u32,
    /// Updates that arrived after the draft had already expired (it had vanished).
    pub revived: u32,
    /// When it was last updated.
    pub at: Instant,
    /// How long it stays visible without an update ([`DRAFT_TTL`] unless
    /// [`Behavior::telegram_draft_ttl`]).
    pub ttl: Duration,
    /// A real message replaced it.
    pub replaced: bool,
}

/// How long a Telegram draft stays visible without an update.
pub const DRAFT_TTL: Duration = Duration::from_secs(30);

impl Draft {
    /// Whether a person still sees it.
    pub fn visible(&self) -> bool {
        !self.replaced && self.at.elapsed() < self.ttl
    }
}

#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub(crate) calls: Vec<Call>,
    pub(crate) messages: Vec<Message>,
    pub(crate) drafts: Vec<Draft>,
    pub(crate) events: Vec<Value>,
    pub(crate) seen_keys: std::collections::HashSet<String>,
    pub(crate) duplicates: u32,
    pub(crate) counter: u64,
    /// Per rate-limit scope (`""` for the whole API): until when a 429 holds.
    pub(crate) blocked_until: HashMap<String, Instant>,
    pub(crate) early_calls: u32,
    pub(crate) delayed: usize,
    pub(crate) next_id: u64,
    /// [`FakeServer::recover`] was called: `refuse_status` no longer applies.
    pub(crate) recovered: bool,
    /// Discord bucket: when the current window started and the requests it took.
    pub(crate) bucket_window: Option<(Instant, u64)>,
    /// Slack streams, by `ts`.
    pub(crate) streams: Vec<Stream>,
    /// Slack assistant statuses set: (channel, thread_ts, status).
    pub(crate) statuses: Vec<(String, String, String)>,
}

/// Shared state of one fake server.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) behavior: Behavior,
    pub(crate) rec: Arc<Mutex<Recorder>>,
}

/// What the gate decided for one call.
pub(crate) enum Gate {
    Proceed,
    RateLimited(f64),
}

impl Shared {
    fn new(behavior: Behavior) -> Shared {
        Shared {
            behavior,
            rec: Arc::new(Mutex::new(Recorder::default())),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rate limiting over the whole API: a call inside a previous 429's window is
    /// counted as early (and refused, like the real APIs); every n-th call is refused.
    pub(crate) fn gate(&self, retry_after_secs: f64) -> Gate {
        self.gate_scoped("", retry_after_secs)
    }

    /// [`Shared::gate`] for an API whose limits hold per scope (Slack: per method, and
    /// per channel for `chat.postMessage`): a 429 refuses only calls of its own scope
    /// until it expires. The n-th call count stays API-wide.
    pub(crate) fn gate_scoped(&self, scope: &str, retry_after_secs: f64) -> Gate {
        let now = Instant::now();
        let mut r = self.lock();
        r.counter += 1;
        if let Some(until) = r.blocked_until.get(scope).copied() {
            if now < until {
                r.early_calls += 1;
                return Gate::RateLimited((until - now).as_secs_f64());
            }
        }
        let block = now + Duration::from_secs_f64(retry_after_secs);
        let in_burst = self
            .behavior
            .rate_limit_burst
            .is_some_and(|(from, n)| (from..from + n).contains(&r.counter));
        match self.behavior.rate_limit_every {
            _ if in_burst => {
                r.blocked_until.insert(scope.to_owned(), block);
                Gate::RateLimited(retry_after_secs)
            }
            Some(n) if n > 0 && r.counter.is_multiple_of(n) => {
                r.blocked_until.insert(scope.to_owned(), block);
                Gate::RateLimited(retry_after_secs)
            }
            _ => Gate::Proceed,
        }
    }

    pub(crate) fn record(&self, api: &str, body: &Value, status: u16) {
        self.lock().calls.push(Call {
            api: api.to_owned(),
            body: body.clone(),
            status,
            at: Instant::now(),
        });
    }

    pub(crate) fn next_id(&self) -> u64 {
        let mut r = self.lock();
        r.next_id += 1;
        r.next_id
    }

    pub(crate) fn push_message(&self, m: Message) {
        let mut r = self.lock();
        // A real message in the chat (or thread) replaces the bot's draft there.
        for d in r.drafts.iter_mut().filter(|d| d.chat == m.chat) {
            d.replaced = true;
        }
        r.messages.push(m);
    }

    /// Creates or updates the draft `draft_id` of `chat`.
    pub(crate) fn upsert_draft(&self, chat: &str, draft_id: i64, text: &str) {
        let mut r = self.lock();
        let now = Instant::now();
        match r
            .drafts
            .iter_mut()
            .find(|d| d.chat == chat && d.draft_id == draft_id && !d.replaced)
        {
            Some(d) => {
                if now.duration_since(d.at) >= d.ttl {
                    d.revived += 1;
                }
                d.text = text.to_owned();
                d.updates += 1;
                d.at = now;
            }
            None => r.drafts.push(Draft {
                chat: chat.to_owned(),
                draft_id,
                text: text.to_owned(),
                updates: 0,
                revived: 0,
                at: now,
                ttl: self.behavior.telegram_draft_ttl.unwrap_or(DRAFT_TTL),
                replaced: false,
            }),
        }
    }

    /// Find a live message; `f` edits it in place.
    pub(crate) fn with_message<T>(
        &self,
        chat: &str,
        id: &str,
        f: impl FnOnce(&mut Message) -> T,
    ) -> Option<T> {
        let mut r = self.lock();
        // A message posted in a thread (`<chat>/<thread>`) is edited by its chat.
        let in_chat = |m: &Message| {
            m.chat == chat
                || m.chat
                    .strip_prefix(chat)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        r.messages
            .iter_mut()
            .find(|m| m.id == id && in_chat(m) && !m.deleted)
            .map(f)
    }

    /// Whether this created message's response should be held back.
    pub(crate) fn take_delay(&self) -> Option<Duration> {
        let mut r = self.lock();
        if r.delayed < self.behavior.delay_first {
            r.delayed += 1;
            Some(self.behavior.delay)
        } else {
            None
        }
    }
}

/// A running fake server.
#[derive(Debug)]
pub struct FakeServer {
    /// Base URL to configure the sink with (`base_url`, or the webhook `url`).
    pub base_url: String,
    shared: Shared,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl FakeServer {
    async fn start(router: Router, shared: Shared, path: &str) -> std::io::Result<FakeServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(FakeServer {
            base_url: format!("http://{addr}{path}"),
            shared,
            shutdown: Some(tx),
        })
    }

    /// A fake Telegram Bot API for `token`; `base_url` is the API root.
    pub async fn telegram(token: &str, behavior: Behavior) -> std::io::Result<FakeServer> {
        let shared = Shared::new(behavior);
        let router = crate::telegram::fake::router(shared.clone(), token.to_owned());
        FakeServer::start(router, shared, "").await
    }

    /// A fake Discord API serving webhook `id`/`token`; `base_url` is the API root.
    pub async fn discord(id: &str, token: &str, behavior: Behavior) -> std::io::Result<FakeServer> {
        let shared = Shared::new(behavior);
        let router = crate::discord::fake::router(shared.clone(), id.to_owned(), token.to_owned());
        FakeServer::start(router, shared, "").await
    }

    /// A fake Slack Web API for bot `token`; `base_url` ends in `/api`.
    pub async fn slack(token: &str, behavior: Behavior) -> std::io::Result<FakeServer> {
        let shared = Shared::new(behavior);
        let router = crate::slack::fake::router(shared.clone(), token.to_owned());
        FakeServer::start(router, shared, "/api").await
    }

    /// A webhook receiver checking signatures with `secret` and deduping on
    /// `Idempotency-Key`; `base_url` is the URL to POST to.
    pub async fn webhook(secret: &str, behavior: Behavior) -> std::io::Result<FakeServer> {
        let shared = Shared::new(behavior);
        let router = crate::webhook::fake::router(shared.clone(), secret.to_owned());
        FakeServer::start(router, shared, "/hook").await
    }

    /// The receiver is back: `refuse_status` no longer applies (a 5xx outage ends).
    pub fn recover(&self) {
        self.shared.lock().recovered = true;
    }

    /// Slack streams so far.
    pub fn streams(&self) -> Vec<Stream> {
        let ttl = self.shared.behavior.slack_stream_ttl;
        let mut all = self.shared.lock().streams.clone();
        for s in &mut all {
            s.streaming &= ttl.is_none_or(|t| s.at.elapsed() < t);
        }
        all
    }

    /// Slack assistant statuses set so far: (channel, thread_ts, status).
    pub fn statuses(&self) -> Vec<(String, String, String)> {
        self.shared.lock().statuses.clone()
    }

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Every message ever created, in creation order (deleted ones flagged).
    pub fn messages(&self) -> Vec<Message> {
        self.shared.lock().messages.clone()
    }

    /// Messages not deleted, in creation order.
    pub fn live_messages(&self) -> Vec<Message> {
        self.messages().into_iter().filter(|m| !m.deleted).collect()
    }

    /// Telegram: every native draft ever shown, in creation order.
    pub fn drafts(&self) -> Vec<Draft> {
        self.shared.lock().drafts.clone()
    }

    /// Calls that arrived while a 429's `retry_after` was still running.
    pub fn early_calls(&self) -> u32 {
        self.shared.lock().early_calls
    }

    /// Webhook: applied (deduplicated) op objects, in order.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.clone()
    }

    /// Webhook: requests refused as repeats of an already applied `Idempotency-Key`.
    pub fn duplicates(&self) -> u32 {
        self.shared.lock().duplicates
    }
}

/// Hold a response when the behaviour says so (after the effect was applied).
pub(crate) async fn maybe_delay(shared: &Shared) {
    if let Some(d) = shared.take_delay() {
        tokio::time::sleep(d).await;
    }
}

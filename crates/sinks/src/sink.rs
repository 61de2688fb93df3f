//! The sink contract: one [`Op`] for one chat, with the per channel+chat+run facts the
//! delivery engine persists between attempts.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;
use streamgate_projection::{Op, Tier};

/// Where an op goes: which tenant's chat, in which configured channel (sink instance).
///
/// `chat_id` is the channel's own address: a Telegram chat id, a Slack channel id, a
/// Discord thread id (empty = the webhook's channel), a webhook's logical chat name.
/// The tenant is part of the identity: two tenants' chats of the same name are two
/// chats, each with its own delivery lane, settings and state — one tenant's failing
/// final never holds up another's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChatTarget {
    /// The tenant whose runs go to this chat.
    pub tenant: String,
    /// Name of the configured channel; selects the sink.
    pub channel: String,
    /// The chat inside that channel.
    pub chat_id: String,
}

impl ChatTarget {
    /// A target from its three parts.
    pub fn new(
        tenant: impl Into<String>,
        channel: impl Into<String>,
        chat_id: impl Into<String>,
    ) -> ChatTarget {
        ChatTarget {
            tenant: tenant.into(),
            channel: channel.into(),
            chat_id: chat_id.into(),
        }
    }
}

impl fmt::Display for ChatTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.channel, self.tenant, self.chat_id)
    }
}

/// What a sink has already done for one run in one chat. The delivery engine loads it
/// before every attempt and saves it after every attempt — successful or not — so a
/// retry resumes instead of repeating (e.g. the parts of a split final already sent).
///
/// Serializable so the projector can keep it in a JetStream KV bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryState {
    /// Id of the run's draft message once created (Telegram message id, Discord
    /// snowflake, Slack `ts`).
    pub draft_message_id: Option<String>,
    /// Digest of the text last applied to the draft; an identical upsert is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_digest: Option<TextDigest>,
    /// A native draft (Telegram `sendMessageDraft`) is shown: when it was last sent, in
    /// ms since the epoch (it vanishes ~30 s after its last update, so an unchanged draft
    /// is sent again before then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_draft_at_ms: Option<u64>,
    /// The chat refused native drafts: this run's drafts are sent and edited instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub native_draft_refused: bool,
    /// Highest event seq rendered into the draft (the reconnect protocol's
    /// `lastRenderedSeq`, spec §7.3).
    pub last_rendered_seq: Option<u64>,
    /// The draft was settled; later drafts of the run are stale.
    pub settled: bool,
    /// The draft was dismissed (deleted).
    pub dismissed: bool,
    /// Message ids of the final answer's parts sent so far, in order.
    pub final_message_ids: Vec<String>,
    /// The whole final answer was delivered: a repeated `Final` is a no-op.
    pub final_delivered: bool,
    /// The rendered text was withdrawn (Reject path).
    pub retracted: bool,
    /// Seqs of notices already sent (a notice is sent once per seq).
    pub notices_sent: BTreeSet<u64>,
    /// A native stream of the run (Slack `chat.startStream`), once one was tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<NativeStream>,
}

/// What a native stream (Slack `chat.startStream` … `chat.stopStream`) of one run has
/// shown so far. A stream only grows, so the sink remembers what it appended: the text of
/// the segment streaming now by length and hash (enough to tell whether the final answer
/// continues it), and each task's last outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeStream {
    /// The streaming message (Slack `ts`), once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The answer segment appended last (its first seq; `u64::MAX` = the final answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<u64>,
    /// Bytes of that segment's text appended.
    #[serde(default)]
    pub segment_bytes: usize,
    /// FNV-1a of those bytes.
    #[serde(default)]
    pub segment_hash: u64,
    /// Bytes of whitespace those bytes end with.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment_trailing_ws: usize,
    /// FNV-1a of those bytes without the trailing whitespace (an answer that differs
    /// from what streamed only by its trailing whitespace continues the stream).
    #[serde(default)]
    pub segment_hash_trimmed: u64,
    /// That segment can no longer be followed by appends (rewritten, or a gap).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub segment_broken: bool,
    /// Chars of markdown appended over the whole stream.
    #[serde(default)]
    pub chars: usize,
    /// Each task's last outcome sent (`pending`, `running`, `done`, `failed`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tasks: std::collections::BTreeMap<String, String>,
    /// Digest of the plan title last sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_digest: Option<TextDigest>,
    /// The stream was stopped by us.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// The platform ended the stream (Slack `message_not_in_streaming_state`): its message
    /// stays as it was; the final answer replaces its text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
    /// The platform refused to start a stream here: the run is sent and edited instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl DeliveryState {
    /// Whether `text` is what the draft shows now.
    pub fn draft_is(&self, text: &str) -> bool {
        TextDigest::of(text).is_in(&self.draft_digest)
    }
}

/// What a delivery state keeps of a text it showed, to tell whether the same text is
/// shown again: a digest (SHA-256, its first 16 bytes in hex), never the text. So the
/// state — and every version of it the KV bucket still holds — carries no model
/// output, and overwriting it needs no erasure of the versions before
/// (docs/architecture.md, KV buckets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TextDigest(String);

impl TextDigest {
    /// The digest of `text`.
    pub fn of(text: &str) -> TextDigest {
        use sha2::Digest as _;
        TextDigest(hex::encode(&sha2::Sha256::digest(text.as_bytes())[..16]))
    }

    /// Whether `slot` holds this digest: the text it was made of is what `slot` last
    /// recorded as shown. A sink hashes a text once, compares, and on success stores that
    /// same digest.
    pub fn is_in(&self, slot: &Option<TextDigest>) -> bool {
        slot.as_ref() == Some(self)
    }
}

impl NativeStream {
    /// The FNV-1a offset basis: the hash of no bytes.
    pub const EMPTY_HASH: u64 = 0xcbf2_9ce4_8422_2325;

    /// Continues `hash` (FNV-1a) over `bytes`. Hand-written because the value is kept
    /// in persisted state and must never change between releases.
    pub fn hash(mut hash: u64, bytes: &[u8]) -> u64 {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }
}

/// Why an op failed. The delivery engine's reaction is chosen by variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The chat API asked us to wait; the engine pauses the chat's lane that long.
    #[error("rate limited; retry after {retry_after:?}")]
    RateLimited {
        /// How long the API asked us to wait.
        retry_after: Duration,
    },
    /// The API refused the message as too long. Not retried.
    #[error("message too large: {0}")]
    TooLarge(String),
    /// Network trouble, a timeout, a 5xx: retried with backoff; counts toward the
    /// circuit breaker.
    #[error("transient failure: {0}")]
    Transient(String),
    /// The API refused the request for good (bad token, unknown chat): not retried.
    #[error("permanent failure: {0}")]
    Permanent(String),
}

impl SinkError {
    /// Whether the engine should try the op again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SinkError::RateLimited { .. } | SinkError::Transient(_)
        )
    }
}

/// A token-bucket rate: `per_sec` sustained, `burst` back to back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained requests per second.
    pub per_sec: f64,
    /// Requests allowed back to back.
    pub burst: u32,
}

impl Rate {
    /// `per_sec` sustained with a bucket of `burst`.
    pub const fn new(per_sec: f64, burst: u32) -> Rate {
        Rate { per_sec, burst }
    }
}

/// How the delivery engine paces one sink, declared by the sink from the API's real
/// limits (there is no engine-wide rule). Every chat has its own queue and worker
/// whatever the pacing, so a backlog in one chat never delays another.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Token bucket per chat (`None`: no per-chat pace).
    pub per_chat: Option<Rate>,
    /// Token bucket shared by every chat of the sink (a bot's or a webhook's global
    /// limit; `None`: none).
    pub per_sink: Option<Rate>,
    /// Requests in flight to the sink at once, over all chats (at least 1).
    pub concurrency: usize,
}

impl Pacing {
    /// No pace at all, only bounded concurrency (webhook, web page, plain text).
    pub const fn unpaced(concurrency: usize) -> Pacing {
        Pacing {
            per_chat: None,
            per_sink: None,
            concurrency,
        }
    }
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing::unpaced(16)
    }
}

/// A chat channel's executor.
///
/// Contract:
/// - `execute` performs one op for one chat and records what it did in `state` **as it
///   goes** (e.g. after each part of a split final), so that if the future is cancelled
///   or fails midway, the state the engine saves reflects every effect that the API
///   confirmed.
/// - `execute` must be idempotent given `state`: called again with the state it left,
///   it does only the work not yet confirmed (a `Final` with `final_delivered` set is a
///   no-op, a draft with the same text is a no-op, a dismiss of a deleted draft is a
///   no-op).
/// - `Typing` ops get a scratch state: they have no run.
///
/// The trait is object safe (boxed futures) so the engine can hold `Arc<dyn Sink>`.
pub trait Sink: Send + Sync {
    /// Name of the configured channel this sink serves (matches [`ChatTarget::channel`]).
    fn channel(&self) -> &str;

    /// Registered kind (`telegram`, `discord`, `slack`, `webhook`, `plain`).
    fn kind(&self) -> &'static str;

    /// The channel's capability tier (what the projection should produce for it).
    fn tier(&self) -> Tier;

    /// How the engine paces requests to this sink: the API's own limits. The default
    /// is no pace, only bounded concurrency (a receiver we do not know limits of);
    /// chat APIs override it. A `retry_after` the API returns is honoured either way.
    fn pacing(&self) -> Pacing {
        Pacing::default()
    }

    /// The hard size limit of one message, in chars of projection text, when the chat
    /// API has one (Telegram 4096, Discord 2000, Slack 40000); `None` for sinks without
    /// (webhook, plain, web). A channel never sets a draft budget (`maxTurnChars`) above
    /// it.
    fn text_limit(&self) -> Option<usize> {
        None
    }

    /// Execute one op for one chat.
    fn execute<'a>(
        &'a self,
        chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>>;
}

/// Text of a final answer as shown in a chat: the answer verbatim, then the suffix line.
pub(crate) fn final_display_text(text: &str, suffix: Option<&str>) -> String {
    match suffix {
        Some(s) if !s.is_empty() => {
            if text.is_empty() {
                s.to_owned()
            } else if text.ends_with('\n') {
                format!("{text}{s}")
            } else {
                format!("{text}\n{s}")
            }
        }
        _ => text.to_owned(),
    }
}

//! Chats whose messages can be edited (Telegram, Discord, Slack: tier T1).
//!
//! The tier-T1 (editable draft + durable messages) op semantics, written once over four
//! message primitives. Telegram, Discord and Slack differ only in those primitives —
//! and in whether a chat shows drafts natively ([`MessageApi::native_drafts`]: an
//! ephemeral preview, refreshed before it expires, that the final message replaces;
//! settle, notices and finals are real messages either way).

use crate::format::Target;
use crate::sink::{
    final_display_text, ChatTarget, DeliveryState, NativeStream, Pacing, Sink, SinkError,
    TextDigest,
};
use crate::text::{truncate, Unit};
use futures::future::BoxFuture;
use streamgate_grammar::clock::now_ms_u64 as now_ms;
use streamgate_projection::{DraftKey, Op, Tier};

/// Result of an edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Edited {
    /// The message now shows the text (including "not modified": it already did).
    Applied,
    /// The message is gone (deleted by a user or an admin).
    NotFound,
}

/// Whether [`MessageApi::stream`] performed an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streamed {
    /// Done on the stream.
    Yes,
    /// Not streamed: the send + edit semantics apply.
    No,
}

/// The primitives of an editable-message chat API. Texts given to `send` and `edit` are
/// already in the wire format: drafts and finals are model markdown rendered by
/// [`MessageApi::target`] (see [`crate::format`]), other texts (settle summaries,
/// notices, placeholders) are projection text escaped by [`MessageApi::plain`].
pub(crate) trait MessageApi: Send + Sync {
    /// Name of the configured channel ([`Sink::channel`]).
    fn channel(&self) -> &str;
    /// Registered kind ([`Sink::kind`]).
    fn kind(&self) -> &'static str;
    /// The API's rate limits ([`Sink::pacing`]).
    fn pacing(&self) -> Pacing;
    /// Message size limit, in `unit()`s of the projection text.
    fn limit(&self) -> usize;
    /// How a char of projection text counts toward `limit`.
    fn unit(&self) -> Unit;
    /// The wire format markdown is rendered to.
    fn target(&self) -> Target;
    /// Projection text (plain, `> ` blockquotes) in the wire format.
    fn plain(&self, text: &str) -> String;
    /// Post a new message; returns its id.
    fn send<'a>(
        &'a self,
        chat: &'a ChatTarget,
        text: &'a str,
    ) -> BoxFuture<'a, Result<String, SinkError>>;
    /// Replace a message's text.
    fn edit<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<Edited, SinkError>>;
    /// Delete a message; an already deleted one is success.
    fn delete<'a>(
        &'a self,
        chat: &'a ChatTarget,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), SinkError>>;
    /// Show the native typing indicator (no-op where the API has none).
    fn typing<'a>(&'a self, chat: &'a ChatTarget) -> BoxFuture<'a, Result<(), SinkError>>;
    /// Whether `chat` shows a run's draft natively — an ephemeral, animated preview the
    /// platform replaces with the final message (Telegram `sendMessageDraft` in private
    /// chats) — instead of a message that is sent, edited and deleted.
    fn native_drafts(&self, _chat: &ChatTarget) -> bool {
        false
    }
    /// Performs `op` on a native stream when the chat streams natively (Slack
    /// `chat.startStream`); [`Streamed::No`] leaves it to the send + edit semantics.
    /// Called before them for every op but `Typing`.
    fn stream<'a>(
        &'a self,
        _chat: &'a ChatTarget,
        _op: &'a Op,
        _state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<Streamed, SinkError>> {
        Box::pin(async { Ok(Streamed::No) })
    }
    /// Shows `text` as the native draft `draft_id` of `chat` (see [`Self::native_drafts`]).
    fn native_draft<'a>(
        &'a self,
        _chat: &'a ChatTarget,
        _draft_id: i64,
        _text: &'a str,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async { Err(SinkError::Permanent("no native drafts".into())) })
    }
}

/// Every editable-message API is a T1 sink with the same op semantics ([`execute`]).
impl<A: MessageApi> Sink for A {
    fn channel(&self) -> &str {
        MessageApi::channel(self)
    }

    fn kind(&self) -> &'static str {
        MessageApi::kind(self)
    }

    fn tier(&self) -> Tier {
        Tier::T1
    }

    fn pacing(&self) -> Pacing {
        MessageApi::pacing(self)
    }

    fn text_limit(&self) -> Option<usize> {
        Some(MessageApi::limit(self))
    }

    fn execute<'a>(
        &'a self,
        chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(execute(self, chat, op, state))
    }
}

/// An unchanged native draft is sent again after this long: the platform drops it ~30 s
/// after its last update, and a long tool call must not leave the chat empty.
pub(crate) const NATIVE_DRAFT_REFRESH_MS: u64 = 20_000;

/// The run's native draft id: stable for the run (the same id animates one preview),
/// non-zero, within 31 bits: FNV-1a of tenant, NUL, run ([`NativeStream::hash`], which
/// never changes between releases).
pub(crate) fn native_draft_id(key: &DraftKey) -> i64 {
    let h = NativeStream::hash(NativeStream::EMPTY_HASH, key.tenant.as_bytes());
    let h = NativeStream::hash(NativeStream::hash(h, &[0]), key.run_id.as_bytes());
    i64::try_from(h & 0x7fff_ffff).unwrap_or(1).max(1)
}

/// Shows the run's draft natively; an unchanged one is only sent again when it is about
/// to expire. A chat that refuses native drafts (a group after all, an old Bot API)
/// gets this run's drafts as an edited message from then on.
async fn native_upsert<A: MessageApi>(
    api: &A,
    chat: &ChatTarget,
    key: &DraftKey,
    text: &str,
    state: &mut DeliveryState,
) -> Result<(), SinkError> {
    let now = now_ms();
    let fresh = state
        .native_draft_at_ms
        .is_some_and(|at| now.saturating_sub(at) < NATIVE_DRAFT_REFRESH_MS);
    let digest = TextDigest::of(text);
    if fresh && digest.is_in(&state.draft_digest) {
        return Ok(());
    }
    match api.native_draft(chat, native_draft_id(key), text).await {
        Ok(()) => {
            state.draft_digest = Some(digest);
            state.native_draft_at_ms = Some(now);
            Ok(())
        }
        Err(SinkError::Permanent(e)) => {
            tracing::info!(chat = %chat, error = %e, "native draft refused; sending and editing a message instead");
            state.native_draft_refused = true;
            state.native_draft_at_ms = None;
            state.draft_digest = None;
            upsert_draft(api, chat, text, state).await
        }
        Err(e) => Err(e),
    }
}

/// Create the draft or replace its text; records id and text as soon as confirmed.
async fn upsert_draft<A: MessageApi>(
    api: &A,
    chat: &ChatTarget,
    text: &str,
    state: &mut DeliveryState,
) -> Result<(), SinkError> {
    let digest = TextDigest::of(text);
    if digest.is_in(&state.draft_digest) && state.draft_message_id.is_some() {
        return Ok(());
    }
    if let Some(id) = state.draft_message_id.clone() {
        match api.edit(chat, &id, text).await? {
            Edited::Applied => {
                state.draft_digest = Some(digest);
                return Ok(());
            }
            // Someone deleted the draft: recreate it rather than lose the rendering.
            Edited::NotFound => {
                state.draft_message_id = None;
                state.draft_digest = None;
            }
        }
    }
    let id = api.send(chat, text).await?;
    state.draft_message_id = Some(id);
    state.draft_digest = Some(digest);
    Ok(())
}

/// Execute `op` with T1 semantics. Idempotent given `state` (see [`crate::Sink`]).
pub(crate) async fn execute<A: MessageApi>(
    api: &A,
    chat: &ChatTarget,
    op: &Op,
    state: &mut DeliveryState,
) -> Result<(), SinkError> {
    let (limit, unit) = (api.limit(), api.unit());
    if !matches!(op, Op::Typing) && api.stream(chat, op, state).await? == Streamed::Yes {
        return Ok(());
    }
    match op {
        Op::Typing => api.typing(chat).await,
        Op::Draft { key, text, seq, .. } => {
            // A draft after the run's draft ended, or older than what is shown, is stale
            // (reconnect replay, a coalesced duplicate): nothing to do.
            if state.settled || state.dismissed || state.final_delivered || state.retracted {
                return Ok(());
            }
            if state.last_rendered_seq.is_some_and(|s| *seq < s) {
                return Ok(());
            }
            if text.trim().is_empty() {
                return Ok(());
            }
            // Drafts are budgeted by the projection and never split; the cut is only a
            // guard so that nothing over the limit is ever sent.
            let wire = api.target().draft(text, limit);
            if api.native_drafts(chat) && !state.native_draft_refused {
                native_upsert(api, chat, key, &wire, state).await?;
            } else {
                upsert_draft(api, chat, &wire, state).await?;
            }
            state.last_rendered_seq = Some(*seq);
            Ok(())
        }
        Op::Settle { text, seq, .. } => {
            if state.settled || state.dismissed {
                return Ok(());
            }
            let text = truncate(text, limit, unit);
            if text.trim().is_empty() {
                if let Some(id) = state.draft_message_id.clone() {
                    api.delete(chat, &id).await?;
                }
                state.draft_message_id = None;
                state.dismissed = true;
            } else {
                upsert_draft(api, chat, &api.plain(&text), state).await?;
            }
            state.settled = true;
            state.last_rendered_seq = Some(state.last_rendered_seq.unwrap_or(0).max(*seq));
            Ok(())
        }
        Op::Dismiss { .. } => {
            if let Some(id) = state.draft_message_id.clone() {
                api.delete(chat, &id).await?;
            }
            state.draft_message_id = None;
            state.draft_digest = None;
            state.dismissed = true;
            Ok(())
        }
        Op::Final { text, suffix, .. } => {
            if state.final_delivered {
                return Ok(());
            }
            let full = final_display_text(text, suffix.as_deref());
            if full.trim().is_empty() {
                return Err(SinkError::Permanent("empty final answer".into()));
            }
            // Render and split deterministically so a retry resumes at the first unsent
            // part; a split never breaks a code block or a tag (see `crate::format`).
            let parts: Vec<String> = api
                .target()
                .parts(text, suffix.as_deref(), limit)
                .into_iter()
                .filter(|p| !p.trim().is_empty())
                .collect();
            for part in parts.iter().skip(state.final_message_ids.len()) {
                let id = api.send(chat, part).await?;
                state.final_message_ids.push(id);
            }
            state.final_delivered = true;
            Ok(())
        }
        Op::Retract { placeholder, .. } => {
            if state.retracted {
                return Ok(());
            }
            let placeholder = api.plain(&truncate(placeholder, limit, unit));
            if let Some(first) = state.final_message_ids.first().cloned() {
                // The withdrawn text is the delivered answer: first part becomes the
                // placeholder, the other parts go.
                while state.final_message_ids.len() > 1 {
                    let Some(id) = state.final_message_ids.last().cloned() else {
                        break;
                    };
                    api.delete(chat, &id).await?;
                    state.final_message_ids.pop();
                }
                if api.edit(chat, &first, &placeholder).await? == Edited::NotFound {
                    let id = api.send(chat, &placeholder).await?;
                    state.final_message_ids = vec![id];
                }
            } else if state.draft_message_id.is_some() {
                state.draft_digest = None;
                upsert_draft(api, chat, &placeholder, state).await?;
            } else {
                let id = api.send(chat, &placeholder).await?;
                state.draft_message_id = Some(id);
                state.draft_digest = Some(TextDigest::of(&placeholder));
            }
            state.retracted = true;
            Ok(())
        }
        Op::Notice { text, seq, .. } => {
            if state.notices_sent.contains(seq) {
                return Ok(());
            }
            let text = truncate(text, limit, unit);
            if !text.trim().is_empty() {
                api.send(chat, &api.plain(&text)).await?;
            }
            state.notices_sent.insert(*seq);
            Ok(())
        }
    }
}

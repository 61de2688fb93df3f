//! Runs streamed natively in Slack threads: `chat.startStream` on the first visible
//! content, `chat.appendStream` with what is new, `chat.stopStream` with the rest of the
//! final answer — one message that grows into the answer, with the tools as task cards.
//!
//! A stream only grows, so it is fed from the draft's [`Live`] facts, not its rendering:
//! the answer segment streaming now (appended by what its display-safe text added),
//! tool rows and plan steps as `task_update` chunks (sent again only when their outcome
//! changes), the plan's status line as a `plan_update`, and
//! `assistant.threads.setStatus` ("is thinking…") until the stream starts.
//!
//! One final, whatever happens: the final answer continues the stream when the stream
//! already holds its beginning (checked by length and hash), else it follows as a new
//! paragraph; when the stream expired (`message_not_in_streaming_state`) or cannot hold
//! the answer, the stream's message is updated to the answer's first part and the other
//! parts follow as replies. Progress is recorded after every call, so a retry or a new
//! owner resumes where the last confirmed call left off.
//!
//! Streaming needs a thread, and outside a DM the user and team it answers (the chat id
//! `C…/<thread_ts>/U…` and `team_id`); a stream Slack refuses to start (no scope, not an
//! assistant thread) falls back to post + update for that run.

use super::chat::SlackChat;
use super::config::Streaming;
use super::runtime::{plain, Fail, SlackSink};
use crate::editable_chat::{Edited, MessageApi, Streamed};
use crate::sink::{
    final_display_text, ChatTarget, DeliveryState, NativeStream, SinkError, TextDigest,
};
use crate::text::slack_unit;
use serde_json::{json, Value};
use streamgate_projection::{Live, LiveText, Op, Outcome};

/// The assistant status shown until the stream starts.
pub(super) const THINKING: &str = "is thinking…";
/// Slack's limit on one `markdown_text`, in chars.
const MARKDOWN_LIMIT: usize = 12_000;
/// Chars a stream grows to at most (Slack messages hold 40 000); an answer that would
/// go past it is sent as messages instead.
const STREAM_LIMIT: usize = 36_000;
/// [`NativeStream::segment`] of the final answer appended as its own paragraph.
const FINAL_SEGMENT: u64 = u64::MAX;

impl SlackSink {
    /// Whether runs in `slack` stream natively.
    fn streams(&self, slack: &SlackChat<'_>) -> bool {
        self.streaming == Streaming::Auto
            && slack.thread_ts.is_some()
            && (slack.is_dm() || (slack.user.is_some() && self.team_id.is_some()))
    }

    fn set_open(&self, chat: &ChatTarget, open: bool) {
        if let Ok(mut set) = self.open_streams.lock() {
            if open {
                set.insert(chat.chat_id.clone());
            } else {
                set.remove(&chat.chat_id);
            }
        }
    }

    fn is_open(&self, chat: &ChatTarget) -> bool {
        self.open_streams
            .lock()
            .is_ok_and(|set| set.contains(&chat.chat_id))
    }

    /// Sets the thread's assistant status (nothing outside threads, or while a stream
    /// shows the run). A refusal (not an assistant thread, no scope) is not an error:
    /// the status is cosmetic; a rate limit is.
    pub(super) async fn set_status(
        &self,
        chat: &ChatTarget,
        status: &str,
    ) -> Result<(), SinkError> {
        let slack = SlackChat::parse(&chat.chat_id);
        let Some(thread_ts) = slack.thread_ts else {
            return Ok(());
        };
        if self.is_open(chat) {
            return Ok(());
        }
        let body = json!({"channel_id": slack.channel, "thread_ts": thread_ts, "status": status});
        match self.call("assistant.threads.setStatus", body).await {
            Ok(_) => Ok(()),
            Err(Fail::Sink(e)) if e.is_retryable() => Err(e),
            Err(f) => {
                tracing::debug!(chat = %chat, error = %plain(f), "slack assistant status refused");
                Ok(())
            }
        }
    }

    async fn stop(
        &self,
        chat: &ChatTarget,
        slack: &SlackChat<'_>,
        ts: &str,
        markdown: Option<&str>,
    ) -> Result<(), Fail> {
        let mut body = json!({"channel": slack.channel, "ts": ts});
        if let Some(text) = markdown.filter(|t| !t.is_empty()) {
            body["markdown_text"] = json!(text);
        }
        let r = self.call("chat.stopStream", body).await.map(|_| ());
        if !matches!(r, Err(Fail::Sink(_))) {
            self.set_open(chat, false);
        }
        r
    }
}

/// Performs `op` on the run's stream when `chat` streams ([`MessageApi::stream`]).
pub(super) async fn execute(
    sink: &SlackSink,
    chat: &ChatTarget,
    op: &Op,
    state: &mut DeliveryState,
) -> Result<Streamed, SinkError> {
    let slack = SlackChat::parse(&chat.chat_id);
    if !sink.streams(&slack) || state.stream.as_ref().is_some_and(|s| s.refused) {
        return Ok(Streamed::No);
    }
    match op {
        Op::Draft {
            live: Some(live),
            seq,
            ..
        } => draft(sink, chat, &slack, live, *seq, state).await,
        // A refreshed draft (no facts): nothing to append to a stream.
        Op::Draft { live: None, .. } => Ok(match &state.stream {
            Some(st) if st.expired || st.stopped => Streamed::No,
            _ => Streamed::Yes,
        }),
        Op::Final { text, suffix, .. } => {
            final_answer(sink, chat, &slack, text, suffix.as_deref(), state).await
        }
        Op::Settle { text, seq, .. } => settle(sink, chat, &slack, text, *seq, state).await,
        Op::Dismiss { .. } | Op::Retract { .. } => {
            if let Some(ts) = open_stream(state) {
                match sink.stop(chat, &slack, &ts, None).await {
                    Ok(()) | Err(Fail::NotStreaming | Fail::NotFound) => {}
                    Err(Fail::Sink(e)) => return Err(e),
                }
                if let Some(st) = state.stream.as_mut() {
                    st.stopped = true;
                }
            }
            // A withdrawn answer that was streamed: the placeholder replaces the stream.
            let streamed = state.stream.as_ref().and_then(|s| s.id.clone());
            if matches!(op, Op::Retract { .. })
                && !state.final_delivered
                && state.draft_message_id.is_none()
            {
                state.draft_message_id = streamed;
            }
            Ok(Streamed::No)
        }
        _ => Ok(Streamed::No),
    }
}

/// The stream's message id while it is open.
fn open_stream(state: &DeliveryState) -> Option<String> {
    let st = state.stream.as_ref()?;
    if st.stopped || st.expired {
        return None;
    }
    st.id.clone()
}

async fn draft(
    sink: &SlackSink,
    chat: &ChatTarget,
    slack: &SlackChat<'_>,
    live: &Live,
    seq: u64,
    state: &mut DeliveryState,
) -> Result<Streamed, SinkError> {
    if state.settled || state.dismissed || state.final_delivered || state.retracted {
        return Ok(Streamed::Yes);
    }
    if state.last_rendered_seq.is_some_and(|s| seq < s) {
        return Ok(Streamed::Yes);
    }
    let st = state.stream.get_or_insert_with(NativeStream::default);
    if st.stopped || st.expired {
        // The platform ended the stream: the rest of the run's progress is a message
        // sent and edited; the final answer will replace the stream's text.
        return Ok(Streamed::No);
    }
    let mut next = st.clone();
    let chunks = chunks(&mut next, live);
    if chunks.is_empty() {
        if live.thinking && st.id.is_none() {
            sink.set_status(chat, THINKING).await?;
        }
        state.last_rendered_seq = Some(seq);
        return Ok(Streamed::Yes);
    }
    let result = match &st.id {
        None => {
            let mut body = json!({
                "channel": slack.channel,
                "thread_ts": slack.thread_ts,
                "chunks": chunks,
            });
            if !slack.is_dm() {
                body["recipient_user_id"] = json!(slack.user);
                body["recipient_team_id"] = json!(sink.team_id);
            }
            sink.call("chat.startStream", body).await.and_then(|v| {
                v.get("ts")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or(Fail::Sink(SinkError::Permanent(
                        "chat.startStream: no ts".into(),
                    )))
            })
        }
        Some(ts) => {
            let body = json!({"channel": slack.channel, "ts": ts, "chunks": chunks});
            sink.call("chat.appendStream", body)
                .await
                .map(|_| ts.clone())
        }
    };
    match result {
        Ok(ts) => {
            next.id = Some(ts);
            *st = next;
            sink.set_open(chat, true);
            state.last_rendered_seq = Some(seq);
            Ok(Streamed::Yes)
        }
        Err(Fail::NotStreaming | Fail::NotFound) if st.id.is_some() => {
            tracing::info!(chat = %chat, "slack stream ended by the platform; updating a message instead");
            st.expired = true;
            sink.set_open(chat, false);
            Ok(Streamed::No)
        }
        Err(Fail::Sink(SinkError::Permanent(e))) if st.id.is_none() => {
            tracing::info!(chat = %chat, error = %e, "slack refused a stream; posting and updating instead");
            st.refused = true;
            Ok(Streamed::No)
        }
        Err(f) => Err(plain(f)),
    }
}

/// The chunks that bring the stream from `st` to `live`; `st` is advanced as if they
/// were applied.
fn chunks(st: &mut NativeStream, live: &Live) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(plan) = &live.plan {
        let digest = TextDigest::of(&plan.title);
        if !digest.is_in(&st.plan_digest) {
            out.push(json!({"type": "plan_update", "title": plan.title}));
            st.plan_digest = Some(digest);
        }
    }
    let steps = live.plan.iter().flat_map(|p| &p.steps);
    for task in steps.chain(&live.tasks) {
        let outcome = outcome_name(task.outcome);
        if st.tasks.get(&task.id).map(String::as_str) != Some(outcome) {
            out.push(json!({
                "type": "task_update",
                "id": task.id,
                "title": task.title,
                "status": task_status(task.outcome),
            }));
            st.tasks.insert(task.id.clone(), outcome.to_owned());
        }
    }
    if let Some(piece) = live.answer.as_ref().and_then(|a| answer_piece(st, a)) {
        out.push(json!({"type": "markdown_text", "text": piece}));
    }
    out
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Pending => "pending",
        Outcome::Running => "running",
        Outcome::Done => "done",
        Outcome::Failed => "failed",
    }
}

fn task_status(o: Outcome) -> &'static str {
    match o {
        Outcome::Pending => "pending",
        Outcome::Running => "in_progress",
        Outcome::Done => "complete",
        Outcome::Failed => "error",
    }
}

/// What `answer` adds to the stream (escaped), advancing `st`; `None` when nothing.
fn answer_piece(st: &mut NativeStream, answer: &LiveText) -> Option<String> {
    if st.segment != Some(answer.segment) {
        st.segment = Some(answer.segment);
        st.segment_bytes = 0;
        st.segment_hash = NativeStream::EMPTY_HASH;
        st.segment_trailing_ws = 0;
        st.segment_hash_trimmed = NativeStream::EMPTY_HASH;
        // The segment's start is no longer in the window: it cannot be shown whole.
        st.segment_broken = answer.offset > 0;
    }
    if answer.broken || answer.offset > st.segment_bytes {
        st.segment_broken = true;
    }
    if st.segment_broken {
        return None;
    }
    let new = answer.text.get(st.segment_bytes - answer.offset..)?;
    let sep = separator(st);
    let room = STREAM_LIMIT.saturating_sub(st.chars + sep.chars().count());
    let (fits, used) = prefix_within(new, room);
    if fits.len() < new.len() {
        st.segment_broken = true;
    }
    if fits.is_empty() {
        return None;
    }
    advance(st, fits, sep, used);
    Some(format!("{sep}{}", escape(fits)))
}

/// A new paragraph when the segment starts after earlier text.
fn separator(st: &NativeStream) -> &'static str {
    if st.segment_bytes == 0 && st.chars > 0 {
        "\n\n"
    } else {
        ""
    }
}

fn advance(st: &mut NativeStream, raw: &str, sep: &str, escaped_chars: usize) {
    let kept = raw.trim_end().len();
    if kept == 0 {
        st.segment_trailing_ws += raw.len();
    } else {
        st.segment_hash_trimmed = NativeStream::hash(st.segment_hash, &raw.as_bytes()[..kept]);
        st.segment_trailing_ws = raw.len() - kept;
    }
    st.segment_bytes += raw.len();
    st.segment_hash = NativeStream::hash(st.segment_hash, raw.as_bytes());
    st.chars += sep.chars().count() + escaped_chars;
}

/// Whether the stream's last segment already shows the beginning of `full` (or all of
/// it, up to trailing whitespace): then the answer continues it.
fn continues(st: &NativeStream, full: &str) -> bool {
    if st.segment_broken || st.segment.is_none() {
        return false;
    }
    let empty = NativeStream::EMPTY_HASH;
    let prefix = full
        .get(..st.segment_bytes)
        .is_some_and(|p| NativeStream::hash(empty, p.as_bytes()) == st.segment_hash);
    let trimmed = full.trim_end();
    let whole = st.segment_bytes > 0
        && trimmed.len() == st.segment_bytes - st.segment_trailing_ws
        && NativeStream::hash(empty, trimmed.as_bytes()) == st.segment_hash_trimmed;
    prefix || whole
}

/// The longest prefix of `s` whose escaped length is at most `max` chars, and that
/// length.
fn prefix_within(s: &str, max: usize) -> (&str, usize) {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        let u = slack_unit(c);
        if used + u > max {
            return (&s[..i], used);
        }
        used += u;
    }
    (s, used)
}

/// Slack's three control characters escaped, so model text never becomes a mention
/// (`<!channel>`) or a link.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

async fn final_answer(
    sink: &SlackSink,
    chat: &ChatTarget,
    slack: &SlackChat<'_>,
    text: &str,
    suffix: Option<&str>,
    state: &mut DeliveryState,
) -> Result<Streamed, SinkError> {
    if state.final_delivered {
        return Ok(Streamed::Yes);
    }
    let Some(ts) = state.stream.as_ref().and_then(|s| s.id.clone()) else {
        // Nothing streamed: the answer is one normal message (or its parts).
        return Ok(Streamed::No);
    };
    let full = final_display_text(text, suffix);
    if open_stream(state).is_some() {
        match finish_stream(sink, chat, slack, &ts, &full, state).await {
            Ok(true) => {
                state.final_message_ids = vec![ts];
                state.final_delivered = true;
                return Ok(Streamed::Yes);
            }
            Ok(false) => {}
            Err(e) => return Err(e),
        }
    }
    // The stream's message shows part of the run: it becomes the answer's first part.
    let parts: Vec<String> = sink
        .target()
        .parts(text, suffix, sink.limit())
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .collect();
    if state.final_message_ids.is_empty() {
        if let Some(first) = parts.first() {
            let id = match sink.edit(chat, &ts, first).await? {
                Edited::Applied => ts.clone(),
                Edited::NotFound => sink.send(chat, first).await?,
            };
            state.final_message_ids.push(id);
        }
    }
    for part in parts.iter().skip(state.final_message_ids.len()) {
        let id = sink.send(chat, part).await?;
        state.final_message_ids.push(id);
    }
    state.final_delivered = true;
    Ok(Streamed::Yes)
}

/// Appends what the answer adds to the open stream and stops it. `Ok(false)`: the
/// stream ended under us or cannot hold the answer (it is stopped then); the caller
/// replaces its text.
async fn finish_stream(
    sink: &SlackSink,
    chat: &ChatTarget,
    slack: &SlackChat<'_>,
    ts: &str,
    full: &str,
    state: &mut DeliveryState,
) -> Result<bool, SinkError> {
    let Some(st) = state.stream.as_mut() else {
        return Ok(false);
    };
    let continues = continues(st, full);
    if !continues {
        st.segment = Some(FINAL_SEGMENT);
        st.segment_bytes = 0;
        st.segment_hash = NativeStream::EMPTY_HASH;
        st.segment_trailing_ws = 0;
        st.segment_hash_trimmed = NativeStream::EMPTY_HASH;
        st.segment_broken = false;
    }
    let sep = separator(st);
    let rest = full.get(st.segment_bytes..).unwrap_or("");
    let rest_chars: usize = rest.chars().map(slack_unit).sum();
    if st.chars + sep.chars().count() + rest_chars > STREAM_LIMIT {
        match sink.stop(chat, slack, ts, None).await {
            Ok(()) | Err(Fail::NotStreaming | Fail::NotFound) => {}
            Err(f) => return Err(plain(f)),
        }
        st.stopped = true;
        return Ok(false);
    }
    // All but the last piece by `appendStream`, the last with `stopStream`; each
    // confirmed piece is recorded, so a retry continues after it.
    let mut sep = sep;
    let mut rest = rest;
    loop {
        let room = MARKDOWN_LIMIT - sep.chars().count();
        let (piece, used) = prefix_within(rest, room);
        let last = piece.len() == rest.len();
        let markdown = format!("{sep}{}", escape(piece));
        let r = if last {
            sink.stop(chat, slack, ts, Some(&markdown)).await
        } else {
            let body = json!({"channel": slack.channel, "ts": ts, "markdown_text": markdown});
            sink.call("chat.appendStream", body).await.map(|_| ())
        };
        match r {
            Ok(()) => {}
            Err(Fail::NotStreaming | Fail::NotFound) => {
                st.expired = true;
                sink.set_open(chat, false);
                return Ok(false);
            }
            Err(f) => return Err(plain(f)),
        }
        advance(st, piece, sep, used);
        if last {
            st.stopped = true;
            return Ok(true);
        }
        sep = "";
        rest = &rest[piece.len()..];
    }
}

async fn settle(
    sink: &SlackSink,
    chat: &ChatTarget,
    slack: &SlackChat<'_>,
    text: &str,
    seq: u64,
    state: &mut DeliveryState,
) -> Result<Streamed, SinkError> {
    if state.settled || state.dismissed {
        return Ok(Streamed::Yes);
    }
    let Some(st) = state.stream.as_ref() else {
        return Ok(Streamed::No);
    };
    if st.id.is_some() && st.stopped && state.final_delivered {
        // The stream became the answer and shows the run's tools: no summary after it.
        state.settled = true;
        return Ok(Streamed::Yes);
    }
    let Some(ts) = open_stream(state) else {
        return Ok(Streamed::No);
    };
    // The run ended without an answer (error, paused): its state closes the stream.
    let sep = if st.chars > 0 { "\n\n" } else { "" };
    let (line, _) = prefix_within(text, MARKDOWN_LIMIT - sep.len());
    let markdown = format!("{sep}{}", escape(line));
    match sink.stop(chat, slack, &ts, Some(&markdown)).await {
        Ok(()) => {
            if let Some(st) = state.stream.as_mut() {
                st.stopped = true;
            }
            state.settled = true;
            state.last_rendered_seq = Some(state.last_rendered_seq.unwrap_or(0).max(seq));
            Ok(Streamed::Yes)
        }
        Err(Fail::NotStreaming | Fail::NotFound) => {
            if let Some(st) = state.stream.as_mut() {
                st.expired = true;
            }
            Ok(Streamed::No)
        }
        Err(f) => Err(plain(f)),
    }
}

#[cfg(test)]
mod tests {
    use super::{escape, prefix_within, MARKDOWN_LIMIT};
    use crate::text::slack_unit;
    use proptest::prelude::*;

    proptest! {
        /// A stream's text goes out in pieces Slack takes: each within its limit after
        /// escaping, together the whole text, in order.
        #[test]
        fn markdown_pieces_are_within_the_limit_and_lossless(
            text in "[a-z <>&é🧠\n]{0,400}",
            max in 5usize..64,
        ) {
            let mut rest = text.as_str();
            let mut joined = String::new();
            while !rest.is_empty() {
                let (piece, used) = prefix_within(rest, max);
                prop_assert!(!piece.is_empty(), "no progress at {rest:?}");
                prop_assert_eq!(used, piece.chars().map(slack_unit).sum::<usize>());
                prop_assert!(escape(piece).chars().count() <= max);
                joined.push_str(piece);
                rest = &rest[piece.len()..];
            }
            prop_assert_eq!(joined, text);
            prop_assert!(MARKDOWN_LIMIT >= 5);
        }
    }
}

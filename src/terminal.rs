//! The terminal channel (spec tier C), two ways:
//! - status line (default): the projection core at [`STATUS_TIER`] — one live line per
//!   run (thinking, current tool, last commentary) rewritten in place on a TTY, then the
//!   settle summary, notices and the final answer as lines ([`print_ops`]);
//! - raw events (`--raw-events`): every event of every run as one short line, final
//!   answers in full, for watching the pipeline itself ([`line`], [`print_event`]).
//!
//! `streamgate up` feeds it straight from `SG_EVENTS` ([`follow_status`], [`follow`]);
//! `streamgate tail` (`cli::tail`) feeds the same rendering from a channel's
//! `ProjectorService`.

use futures::StreamExt;
use std::collections::HashMap;
use std::io::{IsTerminal as _, Write as _};
use streamgate_bus::events::decode_msg;
use streamgate_bus::EVENTS_STREAM;
use streamgate_grammar::{AssistantPhase, EventData, LifecyclePhase, RunEvent};
use streamgate_projection::{Op, RunProjection, Settings, Tier};
use tokio_util::sync::CancellationToken;

const MAX_SNIPPET: usize = 72;

fn snippet(s: &str) -> String {
    let one_line: String = s.chars().map(|c| if c == '\n' { '⏎' } else { c }).collect();
    if one_line.chars().count() <= MAX_SNIPPET {
        one_line
    } else {
        let cut: String = one_line.chars().take(MAX_SNIPPET).collect();
        format!("{cut}…")
    }
}

/// One human line for an event.
pub fn line(ev: &RunEvent) -> String {
    let what = match &ev.event.data {
        EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
            let text = a.text.as_deref().unwrap_or_default();
            let trunc = if a.truncated == Some(true) {
                "\n      ⚠️ truncated (token limit)"
            } else {
                ""
            };
            format!(
                "✅ final answer:\n      {}{trunc}",
                text.replace('\n', "\n      ")
            )
        }
        EventData::Assistant(a) => format!(
            "💬 {}",
            snippet(a.delta.as_deref().or(a.text.as_deref()).unwrap_or_default())
        ),
        EventData::Thinking(t) => match (t.phase, t.delta.as_deref().or(t.text.as_deref())) {
            (Some(p), _) => format!(
                "🧠 {} {}{}",
                t.variant.as_str(),
                if p == streamgate_grammar::SegmentPhase::Start {
                    "start"
                } else {
                    "end"
                },
                t.tokens.map(|n| format!(" ({n} tok)")).unwrap_or_default()
            ),
            (None, Some(d)) => format!("🧠 {}", snippet(d)),
            (None, None) => format!("🧠 {}", t.variant.as_str()),
        },
        EventData::Item(i) => format!(
            "🔧 {} {:?} {}",
            i.name.as_deref().unwrap_or(&i.kind),
            i.phase,
            i.status.as_deref().unwrap_or_default()
        ),
        EventData::Lifecycle(l) => match l.phase {
            LifecyclePhase::Start => format!(
                "▶ start {} {}",
                l.provider.as_deref().unwrap_or_default(),
                l.model.as_deref().unwrap_or_default()
            ),
            LifecyclePhase::Update => format!(
                "· {}",
                l.diagnostic
                    .as_ref()
                    .map(|d| d.code.as_str())
                    .unwrap_or("update")
            ),
            LifecyclePhase::End => format!(
                "■ end {}",
                l.reason.as_ref().map(|r| r.as_str()).unwrap_or_default()
            ),
            LifecyclePhase::Error => format!(
                "✖ error {}",
                l.reason.as_ref().map(|r| r.as_str()).unwrap_or_default()
            ),
        },
    };
    format!(
        "{:<20} #{:<4} {what}",
        snippet(&ev.envelope.run_id),
        ev.event.seq
    )
}

/// Prints every new event on SG_EVENTS until `shutdown`.
pub async fn follow(
    js: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stream = js.get_stream(EVENTS_STREAM).await?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => break,
            m = messages.next() => m,
        };
        let Some(Ok(msg)) = msg else { break };
        for ev in decode_msg(&msg).unwrap_or_default() {
            println!("{}", line(&ev));
        }
    }
    Ok(())
}

/// Last line of `text`, cut to `max` characters (the status line never wraps).
fn status_of(text: &str, max: usize) -> String {
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if last.chars().count() <= max {
        last.to_owned()
    } else {
        let cut: String = last.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// What one op prints: `(text, is_status)`; a status text replaces the current line on a
/// TTY and is skipped elsewhere (a log file wants only the lasting lines).
pub fn render_op(run: &str, op: &Op) -> Option<(String, bool)> {
    let run = snippet(run);
    match op {
        Op::Typing => None,
        Op::Draft { text, .. } => Some((format!("{run:<20} {}", status_of(text, 90)), true)),
        Op::Settle { text, .. } => Some((format!("{run:<20} {text}"), false)),
        Op::Dismiss { .. } => Some((String::new(), true)),
        Op::Final { text, suffix, .. } => {
            let body = text.replace('\n', "\n      ");
            let tail = suffix
                .as_deref()
                .map(|s| format!("\n      {s}"))
                .unwrap_or_default();
            Some((
                format!("{run:<20} ✅ final answer:\n      {body}{tail}"),
                false,
            ))
        }
        Op::Retract { placeholder, .. } => Some((format!("{run:<20} {placeholder}"), false)),
        Op::Notice { text, .. } => Some((format!("{run:<20} {text}"), false)),
    }
}

/// The tier terminal views render at: the spec's tier C, a status line
/// (docs/architecture.md §6: T2 with `status_line`).
pub const STATUS_TIER: Tier = Tier::T2 { status_line: true };

/// Prints ops of `run` as [`render_op`] renders them: on a TTY a status text replaces
/// the current line and lasting lines go above it; elsewhere (a pipe, a log file) only
/// the lasting lines. One lock of stdout per call keeps concurrent runs' lines whole.
pub fn print_ops(run: &str, ops: &[Op], tty: bool) {
    let mut out = std::io::stdout().lock();
    for op in ops {
        let Some((text, status)) = render_op(run, op) else {
            continue;
        };
        // Errors writing to a closed terminal are not worth stopping for.
        if status {
            if tty {
                let _ = write!(out, "\r\x1b[2K{text}");
            }
        } else if tty {
            let _ = writeln!(out, "\r\x1b[2K{text}");
        } else {
            let _ = writeln!(out, "{text}");
        }
    }
    let _ = out.flush();
}

/// Prints one event as [`line`] does, keeping a TTY's status line out of the way.
pub fn print_event(ev: &RunEvent, tty: bool) {
    let mut out = std::io::stdout().lock();
    let _ = if tty {
        writeln!(out, "\r\x1b[2K{}", line(ev))
    } else {
        writeln!(out, "{}", line(ev))
    };
    let _ = out.flush();
}

/// Follows every new run on SG_EVENTS through the projection core ([`STATUS_TIER`],
/// `settings`) until `shutdown`. An ephemeral ordered consumer: the terminal is a
/// local view, so it keeps no durable state. Each run it has settled (final answer
/// printed) is reported on `settled`, when given.
pub async fn follow_status(
    js: async_nats::jetstream::Context,
    shutdown: CancellationToken,
    settings: Settings,
    settled: Option<tokio::sync::mpsc::UnboundedSender<String>>,
) -> anyhow::Result<()> {
    let stream = js.get_stream(EVENTS_STREAM).await?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let tty = std::io::stdout().is_terminal();
    let mut runs: HashMap<String, RunProjection> = HashMap::new();
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => break,
            m = messages.next() => m,
        };
        let Some(Ok(msg)) = msg else { break };
        for ev in decode_msg(&msg).unwrap_or_default() {
            let run = ev.envelope.run_id.clone();
            let proj = runs
                .entry(run.clone())
                .or_insert_with(|| RunProjection::new(&run));
            let ops = proj.apply_run_event(&ev, &settings, STATUS_TIER);
            let done = proj.is_settled();
            print_ops(&run, &ops, tty);
            if done {
                runs.remove(&run);
                if let Some(tx) = &settled {
                    let _ = tx.send(run);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamgate_projection::DraftKey;

    #[test]
    fn status_ops_render_one_line_and_finals_in_full() {
        let key = DraftKey {
            run_id: "r1".into(),
            tenant: String::new(),
        };
        let draft = Op::Draft {
            key: key.clone(),
            text: "> 🧠 plan\n⏳ search · looking".into(),
            seq: 3,
            live: None,
        };
        assert_eq!(
            render_op("r1", &draft),
            Some((format!("{:<20} ⏳ search · looking", "r1"), true))
        );
        let fin = Op::Final {
            key,
            text: "a\nb".into(),
            truncated: true,
            suffix: Some("⚠️ truncated (token limit)".into()),
            seq: 9,
        };
        let (text, status) = render_op("r1", &fin).unwrap_or_default();
        assert!(!status);
        assert!(
            text.ends_with("a\n      b\n      ⚠️ truncated (token limit)"),
            "{text}"
        );
        assert_eq!(render_op("r1", &Op::Typing), None);
    }
}

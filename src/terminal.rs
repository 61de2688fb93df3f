//! The plain terminal channel of `streamgate up`: every event of every run as one short
//! line, final answers in full. (A status-line renderer driven by the projection core
//! replaces it for interactive use; this one is for watching the pipeline work.)

use futures::StreamExt;
use streamgate_bus::events::decode_event;
use streamgate_bus::EVENTS_STREAM;
use streamgate_grammar::{AssistantPhase, EventData, LifecyclePhase, RunEvent};
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
        if let Ok(ev) = decode_event(&msg.payload) {
            println!("{}", line(&ev));
        }
    }
    Ok(())
}

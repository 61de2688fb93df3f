//! Plain sink runtime.

use crate::sink::{final_display_text, ChatTarget, DeliveryState, Sink, SinkError};
use futures::future::BoxFuture;
use streamgate_projection::{Op, Tier};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

/// Append-only text sink over any writer.
pub struct PlainSink {
    name: String,
    out: Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
}

impl std::fmt::Debug for PlainSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainSink")
            .field("name", &self.name)
            .finish()
    }
}

impl PlainSink {
    /// A sink named `name` writing to `out`.
    pub fn new(name: impl Into<String>, out: impl AsyncWrite + Send + Unpin + 'static) -> Self {
        PlainSink {
            name: name.into(),
            out: Mutex::new(Box::new(out)),
        }
    }

    async fn write_block(&self, text: &str) -> Result<(), SinkError> {
        let mut out = self.out.lock().await;
        let mut block = text.to_owned();
        if !block.ends_with('\n') {
            block.push('\n');
        }
        // A failed write may be retried by the engine; a partially written line on a
        // plain stream is the residual at-least-once window of this sink.
        out.write_all(block.as_bytes())
            .await
            .map_err(|e| SinkError::Transient(format!("plain write: {e}")))?;
        out.flush()
            .await
            .map_err(|e| SinkError::Transient(format!("plain flush: {e}")))
    }
}

impl Sink for PlainSink {
    fn channel(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        super::KIND
    }

    fn tier(&self) -> Tier {
        Tier::T0
    }

    fn execute<'a>(
        &'a self,
        _chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            match op {
                Op::Final { text, suffix, .. } => {
                    if state.final_delivered {
                        return Ok(());
                    }
                    self.write_block(&final_display_text(text, suffix.as_deref()))
                        .await?;
                    state.final_delivered = true;
                }
                Op::Notice { text, seq, .. } => {
                    if state.notices_sent.contains(seq) {
                        return Ok(());
                    }
                    self.write_block(text).await?;
                    state.notices_sent.insert(*seq);
                }
                Op::Retract { placeholder, .. } => {
                    if state.retracted {
                        return Ok(());
                    }
                    self.write_block(placeholder).await?;
                    state.retracted = true;
                }
                Op::Typing | Op::Draft { .. } | Op::Settle { .. } | Op::Dismiss { .. } => {}
            }
            Ok(())
        })
    }
}

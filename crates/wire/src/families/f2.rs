//! OpenAI Chat Completions SSE and its dialects. (Placeholder: every frame is reported as `unknown_frame`.)

use crate::adapter::{stream_closed, Adapter, Close};
use crate::emitter::Emitter;
use crate::framing::Frame;

/// Adapter state for one run.
#[derive(Debug, Default)]
pub struct F2Adapter;

impl Adapter for F2Adapter {
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter) {
        out.unknown_frame(frame.event.unwrap_or("frame"), frame.data);
    }

    fn close(&mut self, _close: Close, out: &mut Emitter) {
        stream_closed(out);
    }
}

//! One run's normalizer: framing + family adapter + emitter, fed bytes in any chunking.

use crate::adapter::{Adapter, Close, Family, FamilyChoice};
use crate::detect::{sniff, MAX_SNIFF_FRAMES};
use crate::emitter::{Emitter, TranscriptEntry};
use crate::families::finality::stream_closed;
use crate::framing::{Decoded, Frame, FrameDecoder, DEFAULT_MAX_FRAME_BYTES};
use serde_json::json;
use streamgate_grammar::{Event, FrameAccount, Json};

/// Frames seen before the family was known (auto-detection only).
#[derive(Debug, Default)]
struct Sniffing {
    frames: Vec<(Option<String>, String)>,
}

enum Stage {
    Detecting(Sniffing),
    Running(Box<dyn Adapter>),
    /// Detection failed: every frame becomes an `unknown_frame` diagnostic.
    Unrecognised,
}

/// Normalizes one run's byte stream into canonical events.
///
/// ```
/// use streamgate_wire::{Close, Family, Normalizer};
/// let mut n = Normalizer::new(Family::F2.into());
/// n.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n");
/// n.close(Close::Normal);
/// let events: Vec<_> = n.drain().collect();
/// assert!(events.len() >= 2);
/// ```
pub struct Normalizer {
    decoder: FrameDecoder,
    stage: Stage,
    out: Emitter,
    family: Option<Family>,
    /// A declared family not yet checked against the first frame ([`declared_mismatch`]).
    unchecked: Option<Family>,
    closed: bool,
}

impl From<Family> for FamilyChoice {
    fn from(f: Family) -> FamilyChoice {
        FamilyChoice::Known(f)
    }
}

impl Normalizer {
    /// A normalizer for a family (or `Auto`).
    pub fn new(choice: FamilyChoice) -> Normalizer {
        Normalizer::with_max_frame(choice, DEFAULT_MAX_FRAME_BYTES)
    }

    /// A normalizer with a custom per-frame size limit.
    pub fn with_max_frame(choice: FamilyChoice, max_frame: usize) -> Normalizer {
        let (stage, family) = match choice {
            FamilyChoice::Known(f) => (Stage::Running(f.adapter()), Some(f)),
            FamilyChoice::Auto => (Stage::Detecting(Sniffing::default()), None),
        };
        Normalizer {
            decoder: FrameDecoder::new(None, max_frame),
            stage,
            out: Emitter::new(),
            unchecked: family,
            family,
            closed: false,
        }
    }

    /// The family in use, once known.
    pub fn family(&self) -> Option<Family> {
        self.family
    }

    /// Feeds the next chunk of raw bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.closed {
            return;
        }
        let Normalizer {
            decoder,
            stage,
            out,
            family,
            unchecked,
            ..
        } = self;
        decoder.feed(chunk, &mut |d| {
            declared_mismatch(&d, unchecked, out);
            on_decoded(d, stage, out, family)
        });
    }

    /// The stream ended; flushes everything and lets the adapter resolve finality (or
    /// synthesize `stream_closed`). Idempotent.
    pub fn close(&mut self, close: Close) {
        if self.closed {
            return;
        }
        let Normalizer {
            decoder,
            stage,
            out,
            family,
            unchecked,
            ..
        } = self;
        decoder.finish(&mut |d| {
            declared_mismatch(&d, unchecked, out);
            on_decoded(d, stage, out, family)
        });
        if let Stage::Detecting(_) = stage {
            give_up_detection(stage, out);
        }
        match stage {
            Stage::Running(adapter) => adapter.close(close, out),
            Stage::Unrecognised => {
                stream_closed(out);
            }
            Stage::Detecting(_) => {}
        }
        self.closed = true;
    }

    /// True once [`close`](Normalizer::close) ran.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Events completed so far, in seq order.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Event> {
        self.out.drain()
    }

    /// Transcript entries recorded since the last call.
    pub fn take_transcript(&mut self) -> Vec<TranscriptEntry> {
        self.out.take_transcript()
    }

    /// Frame accounting (for invariant I6/I10).
    pub fn account(&self) -> FrameAccount {
        self.out.account()
    }

    /// Bytes buffered waiting for a line end.
    pub fn buffered(&self) -> usize {
        self.decoder.buffered()
    }
}

/// A declared family (`--family f2`) is the operator's choice and stays in use; but when
/// the first frame plainly belongs to another family (detection recognises it), a
/// `family_mismatch` diagnostic says so before anything else — a capture ingested with
/// the wrong family otherwise ends as "stream closed" with no hint why (docs/families.md).
fn declared_mismatch(d: &Decoded<'_>, unchecked: &mut Option<Family>, out: &mut Emitter) {
    let (Some(declared), Decoded::Frame(frame)) = (*unchecked, d) else {
        return;
    };
    *unchecked = None;
    if let Some(detected) = sniff(frame).filter(|f| *f != declared) {
        let detail = json!({ "declared": declared.as_str(), "detected": detected.as_str() });
        out.diagnostic("family_mismatch", Some(Json::from_value(&detail)));
    }
}

fn on_decoded(d: Decoded<'_>, stage: &mut Stage, out: &mut Emitter, family: &mut Option<Family>) {
    match d {
        Decoded::Frame(frame) => on_frame(frame, stage, out, family),
        Decoded::Comment(_) => {
            // SSE comments are keepalives (`: OPENROUTER PROCESSING`): a documented drop.
        }
        Decoded::Oversized(len) => {
            let detail = json!({ "bytes": len });
            out.diagnostic("frame_too_large", Some(Json::from_value(&detail)));
        }
        Decoded::InvalidUtf8 => {
            out.diagnostic("invalid_utf8", None);
        }
    }
}

fn on_frame(frame: Frame<'_>, stage: &mut Stage, out: &mut Emitter, family: &mut Option<Family>) {
    match stage {
        Stage::Running(adapter) => {
            out.begin_frame();
            adapter.frame(frame, out);
            out.end_frame();
        }
        Stage::Unrecognised => {
            out.begin_frame();
            out.unknown_frame(frame.event.unwrap_or("frame"), frame.data);
            out.end_frame();
        }
        Stage::Detecting(sniffing) => {
            sniffing
                .frames
                .push((frame.event.map(str::to_owned), frame.data.to_owned()));
            if let Some(found) = sniff(&frame) {
                *family = Some(found);
                let buffered = std::mem::take(&mut sniffing.frames);
                let mut adapter = found.adapter();
                for (event, data) in &buffered {
                    out.begin_frame();
                    adapter.frame(
                        Frame {
                            event: event.as_deref(),
                            data,
                        },
                        out,
                    );
                    out.end_frame();
                }
                *stage = Stage::Running(adapter);
            } else if sniffing.frames.len() >= MAX_SNIFF_FRAMES {
                give_up_detection(stage, out);
            }
        }
    }
}

fn give_up_detection(stage: &mut Stage, out: &mut Emitter) {
    let Stage::Detecting(sniffing) = std::mem::replace(stage, Stage::Unrecognised) else {
        return;
    };
    out.diagnostic("unknown_family", None);
    for (event, data) in &sniffing.frames {
        out.begin_frame();
        out.unknown_frame(event.as_deref().unwrap_or("frame"), data);
        out.end_frame();
    }
}

/// Everything a whole capture normalizes to.
#[derive(Debug, Default)]
pub struct Normalized {
    /// The events, in seq order.
    pub events: Vec<Event>,
    /// The adapter transcript (opaque material).
    pub transcript: Vec<TranscriptEntry>,
    /// Frame accounting.
    pub account: FrameAccount,
    /// The family used (detected, for `Auto`).
    pub family: Option<Family>,
}

/// Normalizes a whole capture held in memory, feeding it in chunks of `chunk` bytes
/// (`0` = one chunk).
pub fn normalize_bytes(choice: FamilyChoice, bytes: &[u8], chunk: usize) -> Normalized {
    let mut n = Normalizer::new(choice);
    let mut events = Vec::new();
    let step = if chunk == 0 {
        bytes.len().max(1)
    } else {
        chunk
    };
    for part in bytes.chunks(step) {
        n.feed(part);
        events.extend(n.drain());
    }
    n.close(Close::Normal);
    events.extend(n.drain());
    Normalized {
        events,
        transcript: n.take_transcript(),
        account: n.account(),
        family: n.family(),
    }
}

//! Provider wire formats → the canonical streamgate grammar. Pure: bytes in, events out,
//! no I/O, no clocks, no panics on any input.
//!
//! # Layout
//! - [`framing`]: incremental SSE / JSONL decoding of byte chunks into frames.
//! - [`adapter`]: the [`Adapter`] contract, [`Family`] registry and [`Close`] kinds.
//! - [`families`]: one module per provider (`anthropic`, `openai_chat`, `openai_responses`,
//!   `gemini`, `ollama`, `codex`, `openclaw`, `acp`) and the shared §3.5 [`families::finality`] dispatch.
//! - [`emitter`]: seq assignment, the opaque-material transcript and frame accounting.
//! - [`detect`]: family detection for `--family auto`.
//! - [`normalizer`]: one run's pipeline (decoder → adapter → emitter).
//! - [`oversize`]: cutting events too large for the broker (the normalizer publishes them
//!   cut; `verify` re-normalizes the same way).
//! - [`conformance`]: comparing a run against golden files and the invariants.
//! - [`synth`]: large single-run captures grown from real ones, for benchmarks.
#![forbid(unsafe_code)]

pub mod adapter;
pub mod conformance;
pub mod detect;
pub mod emitter;
pub mod families;
pub mod framing;
pub mod normalizer;
pub mod oversize;
pub mod synth;

pub use adapter::{Adapter, Close, Family, FamilyChoice, UnknownFamily};
pub use emitter::{Emitter, TranscriptEntry};
pub use families::finality::stream_closed;
pub use framing::{Decoded, Frame, FrameDecoder, Framing};
pub use normalizer::{normalize_bytes, Normalized, Normalizer};

//! The adapter contract and the family registry.
//!
//! An adapter is a pure, deterministic state machine over one run's frames: the same
//! frames always yield the same events with the same seqs. That property is what makes
//! crash recovery, re-normalization and dedupe work downstream.
//!
//! This module depends on no family: the families implement [`Adapter`], and
//! [`Family::adapter`] (the registry's constructor) lives in [`crate::families`].

use crate::emitter::Emitter;
use crate::framing::Frame;
use std::fmt;
use std::str::FromStr;

/// How a run's byte stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Close {
    /// The producer closed the stream (end of file, end of request body, close marker
    /// `normal`).
    Normal,
    /// The transport broke (close marker `abnormal`).
    Abnormal,
    /// Nothing arrived for too long (close marker `timeout`).
    Timeout,
}

impl Close {
    /// The close marker name used on the bus.
    pub fn as_str(self) -> &'static str {
        match self {
            Close::Normal => "normal",
            Close::Abnormal => "abnormal",
            Close::Timeout => "timeout",
        }
    }

    /// Parses a close marker name.
    pub fn parse(s: &str) -> Option<Close> {
        Some(match s {
            "normal" => Close::Normal,
            "abnormal" => Close::Abnormal,
            "timeout" => Close::Timeout,
            _ => return None,
        })
    }
}

/// One wire family's normalizer.
pub trait Adapter: Send {
    /// Handles one frame. Every frame must leave a trace: an event, a transcript entry, a
    /// diagnostic, or [`Emitter::consumed`] (invariant I6).
    fn frame(&mut self, frame: Frame<'_>, out: &mut Emitter);

    /// The byte stream ended. An adapter that has not seen its terminal frame emits the
    /// synthetic `stream_closed` error (spec §3.4) — see
    /// [`crate::families::finality::stream_closed`].
    fn close(&mut self, close: Close, out: &mut Emitter);
}

/// The wire families streamgate understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Anthropic Messages SSE.
    F1,
    /// claude-cli stream-json (an envelope over F1).
    F1e,
    /// OpenAI Chat Completions SSE and its dialects (OpenRouter, DeepSeek, Moonshot,
    /// pioneer, ollama-compat, gpt-oss, …).
    F2,
    /// OpenAI Responses API SSE.
    F3,
    /// Gemini streamGenerateContent SSE.
    F5,
    /// ollama's native `/api/chat` JSONL.
    OllamaNative,
    /// codex app-server JSON-RPC notifications.
    CodexAppServer,
    /// `codex exec --json` JSONL thread events.
    CodexExec,
    /// OpenClaw gateway agent events (`{runId, seq, stream, ts, data}` JSONL).
    OpenClawEvents,
    /// Agent Client Protocol JSON-RPC as an ACP client sees it (`session/update`
    /// notifications, the `session/prompt` response).
    Acp,
}

impl Family {
    /// Every family, in registry order.
    pub const ALL: [Family; 10] = [
        Family::F1,
        Family::F1e,
        Family::F2,
        Family::F3,
        Family::F5,
        Family::OllamaNative,
        Family::CodexAppServer,
        Family::CodexExec,
        Family::OpenClawEvents,
        Family::Acp,
    ];

    /// The version of this family's adapter, recorded with every archived run so that
    /// `streamgate verify` and `backfill` can tell runs normalized by older code
    /// (docs/architecture.md §5). Bump a family's number in the change that makes its adapter emit
    /// different events for the same provider bytes (the goldens of that family change with it).
    pub fn adapter_version(self) -> u32 {
        match self {
            Family::F1
            | Family::F1e
            | Family::F2
            | Family::F3
            | Family::F5
            | Family::OllamaNative
            | Family::CodexAppServer
            | Family::CodexExec
            | Family::OpenClawEvents
            | Family::Acp => 1,
        }
    }

    /// The family id used on the command line, in `index.tsv` and in raw-message headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::F1 => "f1",
            Family::F1e => "f1e",
            Family::F2 => "f2",
            Family::F3 => "f3",
            Family::F5 => "f5",
            Family::OllamaNative => "ollama-native",
            Family::CodexAppServer => "codex-appserver",
            Family::CodexExec => "codex-exec",
            Family::OpenClawEvents => "openclaw-events",
            Family::Acp => "acp",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown family name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown family `{0}` (expected one of f1, f1e, f2, f3, f5, ollama-native, codex-appserver, codex-exec, openclaw-events, acp, auto)")]
pub struct UnknownFamily(pub String);

impl FromStr for Family {
    type Err = UnknownFamily;
    fn from_str(s: &str) -> Result<Family, UnknownFamily> {
        Family::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownFamily(s.to_owned()))
    }
}

/// A family, or "detect it from the stream".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FamilyChoice {
    /// A known family.
    Known(Family),
    /// Sniff the family from the first frames.
    Auto,
}

impl FromStr for FamilyChoice {
    type Err = UnknownFamily;
    fn from_str(s: &str) -> Result<FamilyChoice, UnknownFamily> {
        if s == "auto" {
            Ok(FamilyChoice::Auto)
        } else {
            s.parse().map(FamilyChoice::Known)
        }
    }
}

impl fmt::Display for FamilyChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FamilyChoice::Known(k) => k.fmt(f),
            FamilyChoice::Auto => f.write_str("auto"),
        }
    }
}

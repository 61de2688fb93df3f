//! One module per provider, each implementing the spec's mapping table (§6) for its wire
//! families, plus the pieces they share.
//!
//! # Layout
//! - [`anthropic`]: Messages SSE (`f1`) and the claude-cli stream-json envelope (`f1e`).
//! - [`openai_chat`]: Chat Completions SSE and its dialects (`f2`).
//! - [`openai_responses`]: Responses API SSE (`f3`).
//! - [`gemini`]: streamGenerateContent SSE (`f5`).
//! - [`ollama`]: native `/api/chat` JSONL (`ollama-native`).
//! - [`codex`]: the codex app-server JSON-RPC envelope (`codex-appserver`) and
//!   `codex exec --json` JSONL (`codex-exec`).
//! - [`openclaw`]: OpenClaw gateway agent events (`openclaw-events`).
//! - [`acp`]: Agent Client Protocol JSON-RPC, as an ACP client sees it (`acp`).
//!
//! Shared:
//! - `error_objects`: the `{message}` error objects of the JSON families.
//! - `exact_frame`: reads a hot frame by its exact template, without a JSON parser.
//! - [`final_text`]: the final-answer candidate an open run keeps, bounded.
//! - [`finality`]: the §3.5 terminal dispatch every family maps its stop signal into.
//! - [`response_items`]: OpenAI Responses output items, shared by `openai_responses` and
//!   `codex`.
//! - `same_frame`: recognizes a hot frame that is a recent one with only its changing values
//!   (text, usage, sequence number) changed.
//! - [`segments`], [`whole_calls`]: text/thinking segments and whole tool calls for
//!   families whose wire carries no segment ids.
//!
//! The wire ids users type (`--family f1`, …) live with [`Family`]; this module maps each
//! to its adapter ([`Family::adapter`]).

use crate::adapter::{Adapter, Family};

pub mod acp;
pub mod anthropic;
pub mod codex;
mod error_objects;
pub(crate) mod exact_frame;
pub mod final_text;
pub mod finality;
pub mod gemini;
pub mod ollama;
pub mod openai_chat;
pub mod openai_responses;
pub mod openclaw;
pub mod response_items;
pub(crate) mod same_frame;
pub mod segments;
pub(crate) mod tools;
pub mod whole_calls;

/// A fresh adapter for one run of `family`.
pub fn new_adapter(family: Family) -> Box<dyn Adapter> {
    match family {
        Family::F1 => Box::<anthropic::F1Adapter>::default(),
        Family::F1e => Box::<anthropic::F1eAdapter>::default(),
        Family::F2 => Box::<openai_chat::F2Adapter>::default(),
        Family::F3 => Box::<openai_responses::F3Adapter>::default(),
        Family::F5 => Box::<gemini::F5Adapter>::default(),
        Family::OllamaNative => Box::<ollama::OllamaNativeAdapter>::default(),
        Family::CodexAppServer => Box::<codex::CodexAppServerAdapter>::default(),
        Family::CodexExec => Box::<codex::CodexExecAdapter>::default(),
        Family::OpenClawEvents => Box::<openclaw::OpenClawAdapter>::default(),
        Family::Acp => Box::<acp::AcpAdapter>::default(),
    }
}

impl Family {
    /// A fresh adapter for one run of this family.
    pub fn adapter(self) -> Box<dyn Adapter> {
        new_adapter(self)
    }
}

//! OpenAI codex agent runtime wire families.
//!
//! - [`app_server`]: `codex app-server` JSON-RPC notifications (`codex-appserver`).
//! - [`exec`]: `codex exec --json` JSONL thread events (`codex-exec`).
//!
//! Both share the Responses item shapes in [`super::response_items`].

pub mod app_server;
pub mod exec;

pub use app_server::CodexAppServerAdapter;
pub use exec::CodexExecAdapter;

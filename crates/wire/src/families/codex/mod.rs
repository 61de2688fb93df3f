//! OpenAI codex agent runtime wire families.
//!
//! - [`app_server`]: `codex app-server` JSON-RPC notifications (`codex-appserver`).
//!
//! Both share the Responses item shapes in [`super::response_items`].

pub mod app_server;

pub use app_server::CodexAppServerAdapter;

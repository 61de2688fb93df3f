//! Anthropic wire families.
//!
//! - [`messages`]: Messages API SSE (`f1`), including the per-message machine
//!   ([`messages::MessageMachine`]) the claude-cli envelope reuses.
//! - [`cli`]: claude-cli `--output-format stream-json` (`f1e`), an envelope over F1.

pub mod cli;
pub mod messages;

pub use cli::F1eAdapter;
pub use messages::F1Adapter;

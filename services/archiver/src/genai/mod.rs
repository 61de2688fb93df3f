//! Runs as OpenTelemetry GenAI traces (semantic conventions for GenAI agent, inference
//! and tool spans), sent over OTLP/gRPC — as a batch by `streamgate export --otlp`, and
//! continuously by the archiver (`--export-otlp`): each run once it has ended.
//!
//! One trace per run, its ids derived from the tenant and run id (a re-export sends the
//! same trace, which a backend deduplicates):
//! - `invoke_agent` (root, the whole run): `gen_ai.operation.name`, `gen_ai.provider.name`,
//!   `gen_ai.conversation.id` (the session), token usage, an error status when it failed;
//! - `chat {model}` (the model's turn): request/response model, finish reason, usage with
//!   cache and reasoning tokens, `gen_ai.response.time_to_first_chunk` (seconds, the
//!   time from the run's start to its first streamed chunk, as the archive saw them);
//!   with content enabled, `gen_ai.output.messages`;
//! - `execute_tool {name}` per tool the run used, over the span its events took:
//!   `gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.type`; with content,
//!   `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result`.
//!
//! # Layout
//! - [`spans`]: a run's spans and the [`Exporter`] that batches and sends them.
//! - [`follow`]: the archiver's continuous export of ended runs.

pub mod follow;
pub mod spans;

pub use spans::{run_spans, Exporter};

//! The projection core: what a channel shows for a run, as a pure function of the run's
//! events, the chat's settings and the channel's tier. Sinks execute the resulting ops;
//! nothing here does I/O.
//!
//! # Layout
//! - [`settings`]: `/reasoning`, `/verbose`, delivery mode, budgets, tiers.
//! - [`ops`]: what a sink is asked to do (typing, draft upsert, settle, final, …).
#![forbid(unsafe_code)]

pub mod ops;
pub mod settings;

pub use ops::{DraftKey, Op};
pub use settings::{Budgets, Delivery, Reasoning, Settings, Tier, Verbose};

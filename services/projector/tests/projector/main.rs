//! The projector end to end: a real nats-server, the projector's channels and the sinks'
//! fake chat APIs, in one test binary (one link instead of five). The web page's browser
//! tests are a binary of their own (`tests/web_page.rs`), so a browser's load stays out
//! of the delivery tests' timing; it shares [`common`] and [`cdp`] from this folder.
//!
//! # Layout
//! - [`common`]: the test tenant, canonical events with envelopes, publishing them to
//!   `SG_EVENTS` as the normalizer would, a channel config with quick delivery, polling.
//! - [`e2e`]: every fixture's events through each chat sink; subscribe and watch.
//! - [`fair`]: fair delivery against the fake webhook receiver.
//! - [`knobs`]: a chat's settings changed through `SetSettings` mid-run.
//! - [`run_stream`]: the run stream across a replica handover.
//! - [`web_access`]: who the web page answers.
#![allow(missing_docs)]

mod common;

mod e2e;
mod fair;
mod knobs;
mod run_stream;
mod web_access;

//! streamgate's protobuf schemas and the conversions between them and the grammar.
//!
//! # Layout
//! - [`v1`]: prost types generated from `proto/streamgate/v1/*.proto`.
//! - [`v1`] also holds the tonic clients and servers (`ingest_service_*`,
//!   `projector_service_*`,
//!   `archive_service_*`).
//! - [`event`]: [`RunEvent`] ⇄ [`v1::Event`], lossless in both directions.
#![forbid(unsafe_code)]

/// Generated protobuf types (`streamgate.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/streamgate.v1.rs"));
}

/// The encoded descriptor set of every streamgate proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/streamgate_descriptor.bin"));

pub mod event;

pub use event::DecodeError;
pub use streamgate_grammar::RunEvent;

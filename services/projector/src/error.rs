//! Every failure of the projector.

/// What can go wrong in the projector.
#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    /// Bad channel configuration.
    #[error("channel config: {0}")]
    Config(String),
    /// A NATS / JetStream operation failed.
    #[error("nats {op}: {detail}")]
    Nats {
        /// What was attempted.
        op: &'static str,
        /// The client's error text.
        detail: String,
    },
    /// A streamgate-bus operation failed.
    #[error(transparent)]
    Bus(#[from] streamgate_bus::BusError),
    /// The sink could not be built.
    #[error(transparent)]
    Sink(#[from] streamgate_sinks::SinkError),
    /// The delivery engine refused an op.
    #[error(transparent)]
    Delivery(#[from] streamgate_sinks::DeliveryError),
    /// Local I/O (listeners).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Maps any displayable NATS error into [`ProjectorError::Nats`].
pub(crate) fn nats<E: std::fmt::Display>(op: &'static str) -> impl Fn(E) -> ProjectorError {
    move |e| ProjectorError::Nats {
        op,
        detail: e.to_string(),
    }
}

//! Where a followed run's lines land: [`RunSink`], chunk by chunk with explicit chunk
//! indexes so that a chunk sent again after a failure is never stored twice. The
//! normalizer lands them through its own [`Ingestor`]; `streamgate follow-gateway`
//! sends them to an IngestService over gRPC (its own sink).

use crate::ingest::{IngestError, Ingestor, ResumePoint, RunSpec};
use bytes::Bytes;
use std::future::Future;
use streamgate_bus::raw::CloseKind;

/// A failed sink operation.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Worth another attempt (the broker or service is unavailable right now, the
    /// connection broke, the run is busy).
    #[error("{0}")]
    Retry(String),
    /// The run was closed already: nothing more is accepted for it.
    #[error("the run is already closed")]
    Closed,
    /// The same request would fail the same way (a refused token, a bad id).
    #[error("{0}")]
    Permanent(String),
}

/// Appends a run's chunks (successive indexes from its resume point) and closes it.
pub trait RunSink: Clone + Send + Sync + 'static {
    /// Where the run's ingest stands (the next chunk index; closed or not).
    fn resume(&self, run: &RunSpec) -> impl Future<Output = Result<ResumePoint, SinkError>> + Send;
    /// Stores chunk `index` of the run and waits until it is durable.
    fn append(
        &self,
        run: &RunSpec,
        index: u64,
        body: Bytes,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;
    /// Stores the run's `normal` close marker at `index`.
    fn close(
        &self,
        run: &RunSpec,
        index: u64,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;
}

fn sink_error(e: IngestError) -> SinkError {
    match e {
        IngestError::Closed(_) => SinkError::Closed,
        e @ (IngestError::Unavailable(_) | IngestError::Busy(_)) => SinkError::Retry(e.to_string()),
        e => SinkError::Permanent(e.to_string()),
    }
}

/// The normalizer's own ingestor as a sink: each chunk is claimed like an ingest
/// request (so it never interleaves with a front-door request for the same run).
impl RunSink for Ingestor {
    async fn resume(&self, run: &RunSpec) -> Result<ResumePoint, SinkError> {
        self.resume_point(&run.tenant, &run.run_id)
            .await
            .map_err(sink_error)
    }

    async fn append(&self, run: &RunSpec, index: u64, body: Bytes) -> Result<(), SinkError> {
        let _claim = self.claim(&run.tenant, &run.run_id).map_err(sink_error)?;
        self.put(run, index, body, None, None)
            .await
            .map(drop)
            .map_err(sink_error)
    }

    async fn close(&self, run: &RunSpec, index: u64) -> Result<(), SinkError> {
        let _claim = self.claim(&run.tenant, &run.run_id).map_err(sink_error)?;
        self.put(run, index, Bytes::new(), Some(CloseKind::Normal), None)
            .await
            .map(drop)
            .map_err(sink_error)
    }
}

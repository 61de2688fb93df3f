//! Starting a service while its JetStream cluster is still settling.
//!
//! On a freshly started R3 cluster (a new install, every pod starting at once) the meta
//! leader and the new streams' and buckets' leaders take seconds to be elected, and a
//! JetStream request in that window times out. A service that exits on it comes up on
//! its next restart — Kubernetes shows restarts, a local test a dead replica. So the
//! service binaries start through [`retry_timeouts`]: a start that fails on a JetStream
//! timeout is tried again (with backoff, for a bounded time); any other error fails at
//! once, as before.

use backon::{ExponentialBuilder, Retryable as _};
use std::future::Future;
use std::time::Duration;

/// How long a start is retried while JetStream times out.
pub const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `start` until it succeeds, fails with an error that is not a JetStream timeout,
/// or [`STARTUP_PATIENCE`] has passed. `start` must be safe to run again after a failed
/// attempt (the services' `start` functions are: what a failed start spawned is dropped
/// with it, and every stream, bucket and consumer is created idempotently).
pub async fn retry_timeouts<T, F, Fut>(what: &str, start: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    retry_timeouts_within(what, STARTUP_PATIENCE, start).await
}

/// [`retry_timeouts`] with a patience of its own: waits from 0.5 s doubling to 8 s
/// (jittered up to twice each, backon's jitter), until `patience` of waiting is spent.
pub async fn retry_timeouts_within<T, F, Fut>(
    what: &str,
    patience: Duration,
    start: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let waits = ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(4))
        .with_jitter()
        .without_max_times()
        .with_total_delay(Some(patience));
    start
        .retry(waits)
        .sleep(tokio::time::sleep)
        .when(is_timeout)
        .notify(|e, retry_in| {
            tracing::warn!(service = what, error = %format!("{e:#}"), ?retry_in, "JetStream not ready; starting again");
        })
        .await
}

/// A JetStream request that timed out. async-nats reports it only in its error text
/// (the error kinds are per operation and generic), hence the text match.
fn is_timeout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.to_string().contains("timed out"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn timeouts_are_retried_and_other_errors_are_not() {
        let calls = AtomicU32::new(0);
        let v = retry_timeouts("t", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(anyhow::anyhow!(
                    "JetStream error: jetstream request timed out"
                )),
                _ => Ok(7),
            }
        })
        .await
        .unwrap();
        assert_eq!((v, calls.load(Ordering::SeqCst)), (7, 3));

        let calls = AtomicU32::new(0);
        let e = retry_timeouts::<(), _, _>("t", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(anyhow::anyhow!("stream settings conflict"))
        })
        .await
        .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{e}");

        let e = retry_timeouts::<(), _, _>("t", || async {
            Err(anyhow::anyhow!("jetstream request timed out"))
        })
        .await
        .unwrap_err();
        assert!(e.to_string().contains("timed out"));
    }
}

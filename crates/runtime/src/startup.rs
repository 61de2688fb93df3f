//! Starting a service while its JetStream cluster is still settling.
//!
//! On a freshly started R3 cluster (a new install, every pod starting at once) the meta
//! leader and the new streams' and buckets' leaders take seconds to be elected, and a
//! JetStream request in that window times out. A service that exits on it comes up on
//! its next restart — Kubernetes shows restarts, a local test a dead replica. So the
//! service binaries start through [`retry_timeouts`]: a start that fails on a JetStream
//! timeout is tried again (with backoff, for a bounded time); any other error fails at
//! once, as before.

use std::future::Future;
use std::time::Duration;

/// How long a start is retried while JetStream times out.
pub const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `start` until it succeeds, fails with an error that is not a JetStream timeout,
/// or [`STARTUP_PATIENCE`] has passed. `start` must be safe to run again after a failed
/// attempt (the services' `start` functions are: what a failed start spawned is dropped
/// with it, and every stream, bucket and consumer is created idempotently).
pub async fn retry_timeouts<T, F, Fut>(what: &str, mut start: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + STARTUP_PATIENCE;
    let mut delay = Duration::from_millis(500);
    loop {
        match start().await {
            Ok(v) => return Ok(v),
            Err(e) if is_timeout(&e) && tokio::time::Instant::now() + delay < deadline => {
                tracing::warn!(service = what, error = %format!("{e:#}"), retry_in = ?delay, "JetStream not ready; starting again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
            }
            Err(e) => return Err(e),
        }
    }
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

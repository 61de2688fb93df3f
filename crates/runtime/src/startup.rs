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

/// A JetStream request that timed out: some link of the error's chain is an async-nats
/// error whose kind is `TimedOut`. async-nats has one error type per operation (each a
/// `Error<Kind>` with its own kind enum), so the check lists the operations a start makes
/// — streams, consumers, buckets, plain requests — and asks each for its kind; the
/// bus's `BusError::Nats` keeps the client's error as its source, so the chain reaches it.
fn is_timeout(e: &anyhow::Error) -> bool {
    e.chain().any(timed_out)
}

/// True when `e` itself is one of async-nats's timeout errors.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::{consumer, context, kv, stream};
    macro_rules! kind_is {
        ($($error:ty => $kind:expr),* $(,)?) => {
            $(if let Some(e) = e.downcast_ref::<$error>() {
                return e.kind() == $kind;
            })*
        };
    }
    kind_is! {
        async_nats::RequestError => async_nats::RequestErrorKind::TimedOut,
        context::RequestError => context::RequestErrorKind::TimedOut,
        context::PublishError => context::PublishErrorKind::TimedOut,
        context::CreateStreamError => context::CreateStreamErrorKind::TimedOut,
        context::ConsumerInfoError => context::ConsumerInfoErrorKind::TimedOut,
        context::CreateKeyValueError => context::CreateKeyValueErrorKind::TimedOut,
        context::UpdateKeyValueError => context::UpdateKeyValueErrorKind::TimedOut,
        context::AccountError => context::AccountErrorKind::TimedOut,
        stream::ConsumerError => stream::ConsumerErrorKind::TimedOut,
        stream::ConsumerCreateStrictError => stream::ConsumerCreateStrictErrorKind::TimedOut,
        stream::ConsumerUpdateError => stream::ConsumerUpdateErrorKind::TimedOut,
        stream::DirectGetError => stream::DirectGetErrorKind::TimedOut,
        stream::PurgeError => stream::PurgeErrorKind::TimedOut,
        consumer::StreamError => consumer::StreamErrorKind::TimedOut,
        kv::StatusError => kv::StatusErrorKind::TimedOut,
        kv::EntryError => kv::EntryErrorKind::TimedOut,
        kv::WatchError => kv::WatchErrorKind::TimedOut,
        kv::UpdateError => kv::UpdateErrorKind::TimedOut,
    }
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn timeouts_are_retried_and_other_errors_are_not() {
        use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};
        let timeout =
            || anyhow::Error::new(CreateStreamError::new(CreateStreamErrorKind::TimedOut));
        let calls = AtomicU32::new(0);
        let v = retry_timeouts("t", || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(timeout().context("creating SG_RAW")),
                _ => Ok(7),
            }
        })
        .await
        .unwrap();
        assert_eq!((v, calls.load(Ordering::SeqCst)), (7, 3));

        // Another kind of the same error, and an error that only *says* "timed out",
        // are not retried.
        for other in [
            anyhow::Error::new(CreateStreamError::new(
                CreateStreamErrorKind::JetStreamUnavailable,
            )),
            anyhow::anyhow!("stream settings conflict"),
            anyhow::anyhow!("a model's text: the request timed out"),
        ] {
            let calls = AtomicU32::new(0);
            let mut other = Some(other);
            let e = retry_timeouts::<(), _, _>("t", || {
                calls.fetch_add(1, Ordering::SeqCst);
                let e = other.take().unwrap_or_else(|| anyhow::anyhow!("again"));
                async move { Err(e) }
            })
            .await
            .unwrap_err();
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{e}");
        }

        // A bus error keeps the client's error as its source: still a timeout.
        let bus = anyhow::Error::new(streamgate_bus::BusError::Nats {
            op: "creating a consumer",
            source: Box::new(async_nats::jetstream::stream::ConsumerError::new(
                async_nats::jetstream::stream::ConsumerErrorKind::TimedOut,
            )),
        });
        assert!(is_timeout(&bus));

        let e = retry_timeouts::<(), _, _>("t", || async { Err(timeout()) })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("timed out"));
    }
}

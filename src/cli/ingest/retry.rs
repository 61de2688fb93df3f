//! When `streamgate ingest` sends again: an answer that says "not now" (UNAVAILABLE
//! while a stream leader is elected, a broken connection, a stream cut short) is retried
//! with bounded exponential backoff, waiting at least what the service's `retry-after`
//! asks; an answer that repeating cannot change (a bad id, a closed run, a refused
//! token: the 4xx kind) is not. Resending is safe: the client resumes from the service's
//! resume point and re-sent chunks are deduplicated by message id.

use std::time::Duration;
use tokio::time::Instant;

/// The metadata key of the seconds to wait before sending again (set on UNAVAILABLE).
pub const RETRY_AFTER_KEY: &str = "retry-after";
/// The longest single wait (a `retry-after` above it is capped too).
const MAX_DELAY: Duration = Duration::from_secs(10);
/// The first backoff delay; it doubles per attempt.
const BASE_DELAY: Duration = Duration::from_millis(200);

/// A failure the client found itself that repeating cannot change (the run was already
/// ingested and closed): never retried.
#[derive(Debug)]
pub struct Permanent(pub String);

impl std::fmt::Display for Permanent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Permanent {}

impl Permanent {
    /// The run was ingested and closed already: a run is ingested once.
    pub fn closed(run: &str) -> Permanent {
        Permanent(format!(
            "run {run} was already ingested and closed (a run is ingested once; use a new run id)"
        ))
    }
}

/// What to do about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Give up: the same request would fail the same way.
    Permanent,
    /// Send again, after at least this long when the service said so.
    Retry(Option<Duration>),
}

/// Classifies a failed attempt. gRPC statuses decide by code; anything without a status
/// (the connection failed, the ack stream ended early) is worth another attempt.
pub fn classify(e: &anyhow::Error) -> Verdict {
    if e.chain().any(|c| c.is::<Permanent>()) {
        return Verdict::Permanent;
    }
    // A TLS handshake that failed over a certificate (no client certificate for an mTLS
    // service, a server certificate the CA does not vouch for) fails the same way every
    // time, whatever status or transport error carries it.
    if e.chain()
        .any(|c| c.to_string().to_ascii_lowercase().contains("certificate"))
    {
        return Verdict::Permanent;
    }
    let Some(status) = e.chain().find_map(|c| c.downcast_ref::<tonic::Status>()) else {
        return Verdict::Retry(None);
    };
    use tonic::Code;
    // A message over the service's size limit is refused the same way every time.
    if status.code() == Code::ResourceExhausted && status.message().contains("too large") {
        return Verdict::Permanent;
    }
    match status.code() {
        // ABORTED: another request of the service is ingesting the run right now
        // (e.g. our own previous attempt, not yet noticed as gone).
        Code::Unavailable
        | Code::Aborted
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Unknown
        | Code::Cancelled => Verdict::Retry(retry_after(status)),
        _ => Verdict::Permanent,
    }
}

/// The `retry-after` metadata of a status, in whole seconds.
fn retry_after(status: &tonic::Status) -> Option<Duration> {
    let v = status.metadata().get(RETRY_AFTER_KEY)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Bounded exponential backoff until a deadline (backon's exponential backoff for the
/// waits, without jitter: one client retrying alone).
#[derive(Debug)]
pub struct Backoff {
    waits: backon::ExponentialBackoff,
    attempt: u32,
    deadline: Instant,
}

impl Backoff {
    /// Retries allowed for `budget` from now.
    pub fn new(budget: Duration) -> Backoff {
        use backon::BackoffBuilder as _;
        Backoff {
            waits: backon::ExponentialBuilder::new()
                .with_min_delay(BASE_DELAY)
                .with_max_delay(MAX_DELAY)
                .without_max_times()
                .build(),
            attempt: 0,
            deadline: Instant::now() + budget,
        }
    }

    /// Retries made so far.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The wait before the next attempt — the backoff, or the service's `retry_after`
    /// when longer, capped at [`MAX_DELAY`] — or `None` when the budget is spent.
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        let backoff = self.waits.next().unwrap_or(MAX_DELAY);
        let delay = retry_after
            .map_or(backoff, |r| r.max(backoff))
            .min(MAX_DELAY);
        if Instant::now() + delay > self.deadline {
            return None;
        }
        self.attempt += 1;
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(after: Option<&str>) -> anyhow::Error {
        let mut s = tonic::Status::unavailable("leader election");
        if let Some(a) = after {
            s.metadata_mut().insert(RETRY_AFTER_KEY, a.parse().unwrap());
        }
        anyhow::Error::new(s).context("ingest")
    }

    #[test]
    fn a_closed_run_is_never_retried() {
        let e = anyhow::Error::new(Permanent("run r1 was already ingested and closed".into()))
            .context("ingest");
        assert_eq!(classify(&e), Verdict::Permanent);
    }

    #[test]
    fn unavailable_is_retried_after_what_the_service_asks() {
        assert_eq!(
            classify(&unavailable(Some("2"))),
            Verdict::Retry(Some(Duration::from_secs(2)))
        );
        assert_eq!(classify(&unavailable(None)), Verdict::Retry(None));
        assert_eq!(
            classify(&unavailable(Some("soon"))),
            Verdict::Retry(None),
            "an unreadable retry-after falls back to the backoff"
        );
    }

    #[test]
    fn client_errors_are_permanent_and_broken_connections_are_not() {
        for s in [
            tonic::Status::invalid_argument("bad id"),
            tonic::Status::failed_precondition("closed"),
            tonic::Status::unauthenticated("token"),
            tonic::Status::permission_denied("token"),
            tonic::Status::internal("max payload"),
        ] {
            assert_eq!(classify(&anyhow::Error::new(s)), Verdict::Permanent);
        }
        assert_eq!(
            classify(&anyhow::anyhow!("cannot reach the ingest service")),
            Verdict::Retry(None)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_honours_retry_after_and_stops_at_the_budget() {
        let mut b = Backoff::new(Duration::from_secs(3));
        // Whole milliseconds: backon doubles in f32.
        let mut next = |after| b.next_delay(after).map(|d| d.as_millis());
        assert_eq!(next(None), Some(200));
        assert_eq!(next(None), Some(400));
        assert_eq!(next(Some(Duration::from_secs(1))), Some(1000));
        assert_eq!(b.attempts(), 3);
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert_eq!(b.next_delay(None), None, "past the budget");
        let mut b = Backoff::new(Duration::from_secs(60));
        assert_eq!(
            b.next_delay(Some(Duration::from_secs(3600))),
            Some(MAX_DELAY)
        );
    }

    #[test]
    fn certificate_failures_are_permanent() {
        let e = anyhow::Error::new(tonic::Status::unavailable(
            "transport error: received fatal alert: CertificateRequired",
        ));
        assert_eq!(classify(&e), Verdict::Permanent);
        let e = anyhow::anyhow!("invalid peer certificate: UnknownIssuer");
        assert_eq!(classify(&e), Verdict::Permanent);
    }
}

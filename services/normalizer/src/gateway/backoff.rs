//! Exponential backoff with jitter, capped: the waits between reconnects to a gateway
//! and between retries of a chunk the ingest side could not take right now.

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;

/// Doubling waits from `base` up to `cap`, each drawn in `[d/2, d)` so that followers
/// restarted together do not reconnect in lockstep (backon's exponential backoff: its
/// jitter adds up to the wait again, so it starts from half).
#[derive(Debug)]
pub struct Backoff {
    policy: ExponentialBuilder,
    waits: ExponentialBackoff,
    attempt: u32,
}

impl Backoff {
    /// Waits from `base`, doubling per attempt, never above `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        let policy = ExponentialBuilder::new()
            .with_min_delay(base / 2)
            .with_max_delay(cap.max(base) / 2)
            .with_jitter()
            .without_max_times();
        Backoff {
            policy,
            waits: policy.build(),
            attempt: 0,
        }
    }

    /// Attempts since the last [`Backoff::reset`].
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Starts over from `base` (after a success).
    pub fn reset(&mut self) {
        self.waits = self.policy.build();
        self.attempt = 0;
    }

    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        // Without a limit on times or total, the iterator never ends.
        self.waits.next().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let d = b.next_delay();
        assert!(
            d >= Duration::from_millis(50) && d <= Duration::from_millis(100),
            "{d:?}"
        );
        let d = b.next_delay();
        assert!(
            d >= Duration::from_millis(100) && d <= Duration::from_millis(200),
            "{d:?}"
        );
        for _ in 0..40 {
            assert!(b.next_delay() <= Duration::from_secs(1));
        }
        assert_eq!(b.attempts(), 42);
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}

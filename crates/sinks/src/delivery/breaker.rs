//! Per sink and tenant circuit breaker: after `threshold` consecutive transient failures the sink
//! is left alone for `cooldown`; then one probe decides between closing and reopening.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Observable breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Requests wait until the cooldown ends.
    Open,
    /// One probe request is allowed; its outcome decides.
    HalfOpen,
}

#[derive(Debug)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// The breaker of one sink for one tenant.
#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { until } if now < until => BreakerState::Open,
            Inner::Open { .. } | Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// `Ok(is_probe)` to go ahead, `Err(when)` to wait until `when` and ask again.
    pub(crate) fn acquire(&self, now: Instant) -> Result<bool, Instant> {
        let mut g = self.lock();
        match *g {
            Inner::Closed { .. } => Ok(false),
            Inner::Open { until } if now < until => Err(until),
            Inner::Open { .. } | Inner::HalfOpen { probing: false } => {
                *g = Inner::HalfOpen { probing: true };
                Ok(true)
            }
            // Someone else is probing: look again shortly.
            Inner::HalfOpen { probing: true } => {
                Err(now + (self.cooldown / 10).max(Duration::from_millis(50)))
            }
        }
    }

    /// Ends an open breaker's cooldown early: the next request is the probe.
    pub(crate) fn release(&self) {
        let mut g = self.lock();
        if let Inner::Open { .. } = *g {
            *g = Inner::HalfOpen { probing: false };
        }
    }

    pub(crate) fn success(&self) {
        *self.lock() = Inner::Closed { failures: 0 };
    }

    pub(crate) fn failure(&self, now: Instant) {
        let mut g = self.lock();
        let open = Inner::Open {
            until: now + self.cooldown,
        };
        match *g {
            Inner::Closed { failures } if failures + 1 < self.threshold => {
                *g = Inner::Closed {
                    failures: failures + 1,
                }
            }
            Inner::Closed { .. } | Inner::HalfOpen { .. } => {
                metrics::counter!("streamgate_sink_breaker_open_total").increment(1);
                *g = open;
            }
            Inner::Open { .. } => {}
        }
    }

    /// An outcome that says nothing about the sink's health (429, a refused message):
    /// frees the probe slot without deciding.
    pub(crate) fn neutral(&self, probe: bool) {
        let mut g = self.lock();
        if probe && matches!(*g, Inner::HalfOpen { probing: true }) {
            *g = Inner::HalfOpen { probing: false };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_probes_once() {
        let b = Breaker::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(b.acquire(t0), Ok(false));
        b.failure(t0);
        assert_eq!(b.state(t0), BreakerState::Closed);
        b.failure(t0);
        assert_eq!(b.state(t0), BreakerState::Open);
        assert_eq!(b.acquire(t0), Err(t0 + Duration::from_secs(10)));
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(b.acquire(t1), Ok(true));
        assert!(b.acquire(t1).is_err(), "only one probe at a time");
        b.failure(t1);
        assert_eq!(b.state(t1), BreakerState::Open);
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(b.acquire(t2), Ok(true));
        b.success();
        assert_eq!(b.state(t2), BreakerState::Closed);
    }
}

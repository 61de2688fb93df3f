//! Discord's rate limits as the API states them on every response, never hard coded
//! (Discord: "rate limits should not be hard coded"; they differ per route and change).
//!
//! - Each route belongs to a bucket (`X-RateLimit-Bucket`) with `X-RateLimit-Remaining`
//!   requests left until `X-RateLimit-Reset-After` seconds. A request to a bucket known to
//!   be exhausted is not sent: the sink answers `RateLimited` with the time to the reset,
//!   so the engine pauses the chat's lane exactly as it does for a 429.
//! - A 429 marked global (`X-RateLimit-Global`, or `"global": true` in the body) holds
//!   every route until its `retry_after`.
//! - Invalid requests (401, 403, and 429s other than `X-RateLimit-Scope: shared`) are
//!   counted over a sliding 10 minutes: Discord bans the IP at 10,000. At the budget
//!   (well below that) the sink stops sending until the window frees up, reported as a
//!   transient failure, so the sink's breaker opens and probes instead of the chats
//!   hammering on.
//!
//! Hand-written: the state is three maps over what each response says; no kept crate
//! models Discord's bucket headers for webhook clients.

use reqwest::header::HeaderMap;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far back invalid requests count (Discord's window).
const INVALID_WINDOW: Duration = Duration::from_secs(600);

/// Added to a bucket's reset: `Reset-After` is rounded to milliseconds and measured
/// before the answer travelled, so a request sent exactly at the reset can be early.
const RESET_MARGIN: Duration = Duration::from_millis(50);

/// Why a request must not be sent now.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Hold {
    /// The route's bucket, or the global limit, frees up after this long.
    Wait(Duration),
    /// The invalid-request budget is spent: `count` in the last 10 minutes.
    Budget { count: usize },
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    remaining: u64,
    reset_at: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// Route → bucket id, as the API named it.
    routes: HashMap<String, String>,
    buckets: HashMap<String, Bucket>,
    global_until: Option<Instant>,
    /// When each recent invalid request was answered, oldest first.
    invalid: VecDeque<Instant>,
}

/// One webhook's view of Discord's limits.
#[derive(Debug)]
pub(super) struct Limits {
    state: Mutex<State>,
    budget: usize,
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

impl Limits {
    /// Limits with an invalid-request budget of `budget` per 10 minutes.
    pub(super) fn new(budget: usize) -> Limits {
        Limits {
            state: Mutex::new(State::default()),
            budget: budget.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a request on `route` may go now; when it may, it is counted against its
    /// bucket (concurrent requests do not all spend the last one).
    pub(super) fn admit(&self, route: &str, now: Instant) -> Result<(), Hold> {
        let mut s = self.lock();
        while s
            .invalid
            .front()
            .is_some_and(|t| now.duration_since(*t) >= INVALID_WINDOW)
        {
            s.invalid.pop_front();
        }
        if s.invalid.len() >= self.budget {
            return Err(Hold::Budget {
                count: s.invalid.len(),
            });
        }
        if let Some(until) = s.global_until.filter(|u| *u > now) {
            return Err(Hold::Wait(until - now));
        }
        let Some(id) = s.routes.get(route).cloned() else {
            return Ok(()); // not seen yet: the first response tells
        };
        let Some(bucket) = s.buckets.get_mut(&id) else {
            return Ok(());
        };
        if bucket.reset_at <= now {
            return Ok(()); // reset: the next response gives the new count
        }
        if bucket.remaining == 0 {
            return Err(Hold::Wait(bucket.reset_at - now));
        }
        bucket.remaining -= 1;
        Ok(())
    }

    /// Learns from a response on `route`: its bucket headers, a global 429, an invalid
    /// request. `retry_after` is the 429's.
    pub(super) fn observe(
        &self,
        route: &str,
        status: u16,
        headers: &HeaderMap,
        global_in_body: bool,
        retry_after: Option<Duration>,
        now: Instant,
    ) {
        let mut s = self.lock();
        let remaining = header(headers, "x-ratelimit-remaining").and_then(|v| v.parse().ok());
        let reset_after = header(headers, "x-ratelimit-reset-after")
            .and_then(|v| v.parse::<f64>().ok())
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok());
        if let (Some(id), Some(remaining), Some(reset_after)) = (
            header(headers, "x-ratelimit-bucket"),
            remaining,
            reset_after,
        ) {
            s.routes.insert(route.to_owned(), id.to_owned());
            s.buckets.insert(
                id.to_owned(),
                Bucket {
                    remaining,
                    reset_at: now + reset_after + RESET_MARGIN,
                },
            );
        }
        if status == 429 {
            let global = global_in_body || header(headers, "x-ratelimit-global") == Some("true");
            if global {
                let until = now + retry_after.unwrap_or(Duration::from_secs(1));
                s.global_until = Some(s.global_until.map_or(until, |u| u.max(until)));
            }
        }
        let shared = header(headers, "x-ratelimit-scope") == Some("shared");
        if matches!(status, 401 | 403) || (status == 429 && !shared) {
            s.invalid.push_back(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn an_exhausted_bucket_holds_its_routes_until_the_reset() {
        let l = Limits::new(100);
        let t0 = Instant::now();
        assert_eq!(l.admit("POST exec", t0), Ok(()));
        let h = headers(&[
            ("x-ratelimit-bucket", "abc"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset-after", "2.000"),
        ]);
        l.observe("POST exec", 200, &h, false, None, t0);
        // One left: taken by the next request, then the bucket is empty.
        assert_eq!(l.admit("POST exec", t0), Ok(()));
        assert_eq!(
            l.admit("POST exec", t0),
            Err(Hold::Wait(Duration::from_secs(2) + RESET_MARGIN))
        );
        // Another route of the same bucket learns it from its own response.
        assert_eq!(l.admit("PATCH msg", t0), Ok(()));
        // After the reset the route may go again.
        let later = t0 + Duration::from_secs(2) + RESET_MARGIN;
        assert_eq!(l.admit("POST exec", later), Ok(()));
    }

    #[test]
    fn a_global_429_holds_every_route() {
        let l = Limits::new(100);
        let t0 = Instant::now();
        let h = headers(&[("x-ratelimit-global", "true")]);
        l.observe(
            "POST exec",
            429,
            &h,
            false,
            Some(Duration::from_secs(3)),
            t0,
        );
        assert_eq!(
            l.admit("PATCH msg", t0),
            Err(Hold::Wait(Duration::from_secs(3)))
        );
    }

    #[test]
    fn invalid_requests_spend_a_budget_that_frees_up_after_ten_minutes() {
        let l = Limits::new(3);
        let t0 = Instant::now();
        let none = HeaderMap::new();
        l.observe("POST exec", 401, &none, false, None, t0);
        l.observe("POST exec", 403, &none, false, None, t0);
        // A shared-scope 429 is not the client's fault.
        let shared = headers(&[("x-ratelimit-scope", "shared")]);
        l.observe("POST exec", 429, &shared, false, None, t0);
        assert_eq!(l.admit("POST exec", t0), Ok(()));
        l.observe("POST exec", 429, &none, false, None, t0);
        assert_eq!(l.admit("POST exec", t0), Err(Hold::Budget { count: 3 }));
        assert_eq!(l.admit("POST exec", t0 + INVALID_WINDOW), Ok(()));
    }
}

//! Waiting on conditions instead of sleeping: a test polls what it expects until it
//! holds or its patience runs out. One pair for every test binary (it was copied into
//! each binary's helpers).

use std::time::{Duration, Instant};

/// Blocks (polling every 25 ms) until `ready` holds; panics naming `what` (the condition
/// that never came true) after `patience`. For plain `#[test]`s and child processes.
pub fn wait_until(what: &str, patience: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "never happened within {patience:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Polls `ready` every 50 ms on the async runtime until it holds (true) or `patience`
/// has passed (false, after one last look), for tests that assert with their own
/// message.
pub async fn poll_until(patience: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < deadline {
        if ready() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ready()
}

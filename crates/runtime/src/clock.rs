//! The wall clock as the services stamp it: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch (0 before it, saturating far after it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

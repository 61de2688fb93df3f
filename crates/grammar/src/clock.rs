//! The wall clock as streamgate stamps it: milliseconds since the Unix epoch (the unit of
//! every timestamp in the grammar, the archive and the bus), and those milliseconds as UTC
//! dates for people. The one clock of the workspace: the services reach it as
//! `streamgate_runtime::clock`; lower crates (sinks, archive) directly (hand-written: the calendar arithmetic is a dozen
//! lines, and none of the date crates in the tree is built with its formatting feature).

/// Milliseconds since the Unix epoch (0 before it, saturating far after it).
pub fn now_ms() -> i64 {
    ms_of(std::time::SystemTime::now())
}

/// `t` in milliseconds since the Unix epoch (0 before it, saturating far after it).
pub fn ms_of(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// [`now_ms`] unsigned, for the counters and keys that are (0 before the epoch).
pub fn now_ms_u64() -> u64 {
    u64::try_from(now_ms()).unwrap_or(0)
}

/// `days` since the Unix epoch as `YYYY-MM-DD` (proleptic Gregorian, UTC).
pub fn utc_date(days: i64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn utc_datetime(ms: i64) -> String {
    const DAY_MS: i64 = 86_400_000;
    let secs = ms.rem_euclid(DAY_MS) / 1000;
    format!(
        "{} {:02}:{:02}:{:02}",
        utc_date(ms.div_euclid(DAY_MS)),
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::{utc_date, utc_datetime};

    #[test]
    fn days_and_instants_as_utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(20_454), "2026-01-01");
        assert_eq!(utc_date(19_782), "2024-02-29");
        assert_eq!(utc_datetime(0), "1970-01-01 00:00:00");
        assert_eq!(utc_datetime(1_795_815_310_000), "2026-11-27 21:35:10");
        assert_eq!(utc_datetime(-1000), "1969-12-31 23:59:59");
    }
}

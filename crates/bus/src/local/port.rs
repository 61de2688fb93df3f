//! Free loopback ports for local servers and tests, picked outside the kernel's
//! ephemeral range.
//!
//! Binding port 0 asks the kernel for a port from that range, which is also where every
//! outgoing connection gets its local port. A port handed out that way and bound a
//! moment later (a child process's listener, or a server restarted on the same address)
//! can meanwhile have become one end of some unrelated connection, and the bind fails
//! with "Address already in use". A port outside the range is only ever taken by another
//! listener, and a random pick among thousands makes that unlikely too.
//!
//! The low range stops below Kubernetes' NodePort range (30000–32767): on a cluster node
//! kube-proxy forwards those ports with packet rules and no listening socket, so a bind
//! check cannot see that they are taken. Off Linux the ephemeral range is not known
//! here, and the kernel's own pick (port 0) is used.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};

/// Ports below this are left alone: the well-known and registered ports local services
/// listen on (PostgreSQL's 5432, NATS's 4222, 8080 and the like).
const LOWEST: u16 = 10_000;

/// Kubernetes' default NodePort range, inclusive: never picked.
const NODE_PORTS: (u16, u16) = (30_000, 32_767);

/// Where Linux starts and ends its ephemeral range when `/proc` cannot tell.
const LINUX_DEFAULT_RANGE: (u16, u16) = (32_768, 60_999);

/// Picks tried outside the ephemeral range before falling back to port 0.
const TRIES: usize = 64;

/// A loopback port that was free a moment ago (the caller retries if it is taken by the
/// time the server binds it).
pub fn free_port() -> std::io::Result<u16> {
    if let Some(port) = outside_ephemeral(IpAddr::V4(Ipv4Addr::LOCALHOST)) {
        return Ok(port);
    }
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

/// A port on `ip` that was free a moment ago, picked at random outside the kernel's
/// ephemeral range and the NodePort range (above); `None` when none was found or the
/// range is not known here. For a listener that asks for it again later, as `up` does
/// for the ports it remembers.
pub fn outside_ephemeral(ip: IpAddr) -> Option<u16> {
    let outside = ephemeral_range().map(outside_ranges).unwrap_or_default();
    let total: u32 = outside.iter().map(|(lo, hi)| u32::from(hi - lo) + 1).sum();
    if total == 0 {
        return None;
    }
    (0..TRIES)
        .map(|_| nth_port(&outside, (random() % u64::from(total)) as u32))
        .find(|&port| TcpListener::bind((ip, port)).is_ok())
}

/// The kernel's ephemeral port range (`ip_local_port_range`), inclusive; `None` off
/// Linux, where this module does not know it.
fn ephemeral_range() -> Option<(u16, u16)> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let read = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .filter(|(lo, hi)| lo <= hi);
    Some(read.unwrap_or(LINUX_DEFAULT_RANGE))
}

/// The inclusive ranges at or above [`LOWEST`] that neither `ephemeral` nor the
/// NodePort range covers, in order.
fn outside_ranges(ephemeral: (u16, u16)) -> Vec<(u16, u16)> {
    let mut out = vec![(LOWEST, u16::MAX)];
    for (lo, hi) in [ephemeral, NODE_PORTS] {
        out = out
            .into_iter()
            .flat_map(|(a, b)| {
                let below = (a < lo).then(|| (a, b.min(lo - 1)));
                let above = (b > hi).then(|| (a.max(hi + 1), b));
                below.into_iter().chain(above)
            })
            .collect();
    }
    out
}

/// The `n`th port counting through `ranges` in order.
fn nth_port(ranges: &[(u16, u16)], mut n: u32) -> u16 {
    for &(lo, hi) in ranges {
        let len = u32::from(hi - lo) + 1;
        if n < len {
            return lo + n as u16;
        }
        n -= len;
    }
    ranges.last().map_or(LOWEST, |r| r.1)
}

/// A random number, different per call and per process (std's hasher keys are random).
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_leave_out_the_ephemeral_ones_and_the_low_ports() {
        assert_eq!(
            outside_ranges((32_768, 60_999)),
            vec![(10_000, 29_999), (61_000, 65_535)]
        );
        assert_eq!(outside_ranges((1024, 65_535)), vec![]);
        assert_eq!(outside_ranges((20_000, 65_535)), vec![(10_000, 19_999)]);
        assert_eq!(
            outside_ranges((49_152, 65_535)),
            vec![(10_000, 29_999), (32_768, 49_151)]
        );
        assert_eq!(
            outside_ranges((1024, 5000)),
            vec![(10_000, 29_999), (32_768, 65_535)]
        );
    }

    #[test]
    fn the_nth_port_walks_the_ranges_in_order() {
        let r = [(10_000, 10_001), (20_000, 20_000)];
        assert_eq!(
            (0..3).map(|n| nth_port(&r, n)).collect::<Vec<_>>(),
            vec![10_000, 10_001, 20_000]
        );
    }

    #[test]
    fn a_free_port_is_outside_the_ephemeral_range_and_bindable() {
        let port = free_port().expect("a free port");
        if let Some((lo, hi)) = ephemeral_range().filter(|r| !outside_ranges(*r).is_empty()) {
            assert!(!(lo..=hi).contains(&port), "{port} is in {lo}..={hi}");
            assert!(
                !(NODE_PORTS.0..=NODE_PORTS.1).contains(&port),
                "{port} is a NodePort"
            );
            assert!(port >= LOWEST);
        }
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("bind it");
    }
}

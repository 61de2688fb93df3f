//! What `up` keeps across restarts of one data dir, so every surface keeps one address:
//! the ports it bound (`<data dir>/addresses.json`) and its tokens (the ingest token and
//! each channel's, in their files). A listener asked for port 0 (the default) takes its
//! remembered address again when that is free (else a fresh port, said in one line);
//! fresh ports come from outside the ephemeral range, where no other program's port-0
//! bind lands while `up` is stopped. `--rotate-tokens` writes fresh tokens.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The remembered addresses, by listener name (`ingest_grpc`, `channel web/web`, …).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Addresses {
    #[serde(default)]
    bound: BTreeMap<String, SocketAddr>,
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("addresses.json")
}

/// A fresh address on `asked`'s IP outside the kernel's ephemeral range
/// ([`streamgate_bus::local::outside_ephemeral`]), so that while `up` is stopped no
/// outgoing connection or port-0 listener of another program takes the port it will ask
/// for again; `asked` (port 0) when none is found.
fn outside_ephemeral(asked: SocketAddr) -> SocketAddr {
    streamgate_bus::local::outside_ephemeral(asked.ip())
        .map_or(asked, |port| SocketAddr::new(asked.ip(), port))
}

impl Addresses {
    /// What the data dir remembers (nothing when the file is missing or unreadable).
    pub(super) fn load(data_dir: &Path) -> Addresses {
        std::fs::read(path(data_dir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The address listener `name` should bind: `asked`, or, when that is port 0, the
    /// remembered address on the same IP if it is free now.
    pub(super) fn pick(&self, name: &str, asked: SocketAddr) -> SocketAddr {
        if asked.port() != 0 {
            return asked;
        }
        let Some(kept) = self
            .bound
            .get(name)
            .copied()
            .filter(|k| k.ip() == asked.ip())
        else {
            return outside_ephemeral(asked);
        };
        match std::net::TcpListener::bind(kept) {
            Ok(probe) => {
                drop(probe);
                kept
            }
            Err(e) => {
                eprintln!("streamgate: {name} cannot have its earlier address {kept} back ({e}): a new port");
                outside_ephemeral(asked)
            }
        }
    }

    /// Records what listener `name` bound.
    pub(super) fn record(&mut self, name: &str, bound: Option<SocketAddr>) {
        if let Some(a) = bound {
            self.bound.insert(name.to_owned(), a);
        }
    }

    /// Writes the addresses (owner-only, like every file of the data dir).
    pub(super) fn save(&self, data_dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        streamgate_bus::local::write_private(&path(data_dir), &text)?;
        Ok(())
    }
}

/// The token in `path` when there is a usable one and `rotate` is off, else a fresh one
/// written there (0600).
pub(super) fn token(path: &Path, rotate: bool) -> Result<String> {
    if !rotate {
        if let Ok(t) = std::fs::read_to_string(path) {
            let t = t.trim();
            if t.len() >= 32 && t.chars().all(|c| c.is_ascii_alphanumeric()) {
                // Narrowed again in case someone widened it.
                streamgate_bus::local::write_private(path, t)?;
                return Ok(t.to_owned());
            }
        }
    }
    let t = streamgate_runtime::rpc::random_token();
    streamgate_bus::local::write_private(path, &t)?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::Addresses;
    use std::net::SocketAddr;

    #[test]
    fn a_fresh_port_comes_from_outside_the_ephemeral_range_and_is_kept() {
        let asked: SocketAddr = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
        let mut memory = Addresses::default();
        let fresh = memory.pick("ingest_http", asked);
        // Which ports are outside the range is held by streamgate_bus's port tests.
        assert!(fresh.port() >= 10_000, "{fresh}");
        memory.record("ingest_http", Some(fresh));
        assert_eq!(memory.pick("ingest_http", asked), fresh, "remembered");
        let explicit: SocketAddr = "127.0.0.1:7555".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(memory.pick("ingest_http", explicit), explicit, "asked for");
    }
}

//! `--nats` for every binary: one server URL or a comma-separated list of a cluster's
//! servers (`nats://10.0.0.1:4222,nats://10.0.0.2:4222`). The client connects to one of
//! them and, when that node goes away, reconnects to another (and to the servers the
//! cluster gossips), so a cluster stays reachable while any of the listed nodes is up.

use async_nats::ServerAddr;

/// A `--nats` value that is not a list of server URLs.
#[derive(Debug, thiserror::Error)]
pub enum NatsAddrError {
    /// The list has no server at all.
    #[error("no NATS server given (expected nats://host:port[,nats://host:port…])")]
    Empty,
    /// One entry is not a server URL.
    #[error("bad NATS server {entry:?}: {reason}")]
    Bad {
        /// The entry as given.
        entry: String,
        /// Why it does not parse.
        reason: String,
    },
}

/// Parses `url[,url…]` (blank entries and surrounding spaces ignored; `host:port`
/// without a scheme means `nats://host:port`).
pub fn parse_servers(list: &str) -> Result<Vec<ServerAddr>, NatsAddrError> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let addr: ServerAddr = entry
            .parse()
            .map_err(|e: std::io::Error| NatsAddrError::Bad {
                entry: entry.to_owned(),
                reason: e.to_string(),
            })?;
        out.push(addr);
    }
    if out.is_empty() {
        return Err(NatsAddrError::Empty);
    }
    Ok(out)
}

/// Connects to the servers of a `--nats` value (see [`parse_servers`]).
pub async fn connect(list: &str) -> anyhow::Result<async_nats::Client> {
    connect_with(list, async_nats::ConnectOptions::new()).await
}

/// [`connect`] with these options.
pub async fn connect_with(
    list: &str,
    options: async_nats::ConnectOptions,
) -> anyhow::Result<async_nats::Client> {
    let servers = parse_servers(list)?;
    options
        .connect(servers)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to NATS at {list}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_or_a_list() {
        let one = parse_servers("nats://127.0.0.1:4222").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].host(), "127.0.0.1");
        assert_eq!(one[0].port(), 4222);
        let three = parse_servers(" nats://127.0.0.1:1, 127.0.0.1:2 ,nats://127.0.0.1:3,").unwrap();
        let ports: Vec<u16> = three.iter().map(ServerAddr::port).collect();
        assert_eq!(ports, [1, 2, 3]);
    }

    #[test]
    fn empty_and_garbage_are_refused() {
        assert!(matches!(parse_servers(""), Err(NatsAddrError::Empty)));
        assert!(matches!(parse_servers(" , "), Err(NatsAddrError::Empty)));
        assert!(matches!(
            parse_servers("nats://127.0.0.1:1,http://x:2"),
            Err(NatsAddrError::Bad { .. })
        ));
    }
}

//! A real 3-node (or n-node) nats-server cluster on loopback, for clustered JetStream
//! tests: every node runs `-js` with its own store dir, a client port and a cluster
//! port, routes to the others, one cluster name and a server name (`n0`, `n1`, …) that
//! stream and meta leaders are reported by. Nodes can be SIGKILLed and restarted on the
//! same ports and store.

use async_nats::ServerAddr;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use streamgate_bus::local::free_port;

/// How long a node may take to accept connections (a restart recovers its store first).
const NODE_START: Duration = Duration::from_secs(20);
/// How long the cluster may take to elect a meta leader and see every peer.
const CLUSTER_READY: Duration = Duration::from_secs(30);

struct Node {
    name: String,
    port: u16,
    cluster_port: u16,
    store: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.store.join("nats-server.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

/// A running nats-server cluster; every node is killed on drop, then the stores go.
pub struct NatsCluster {
    nodes: Vec<Node>,
    binary: PathBuf,
    name: String,
    // Declared after `nodes` so the processes are killed before the stores are removed.
    _dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts a 3-node cluster and waits until JetStream has a meta leader that sees
    /// every node.
    ///
    /// # Panics
    /// When the nodes do not come up or do not form a cluster (with their logs).
    pub async fn start() -> NatsCluster {
        Self::start_nodes(3).await
    }

    /// As [`start`](NatsCluster::start) with `n` nodes.
    pub async fn start_nodes(n: usize) -> NatsCluster {
        let binary = crate::nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
        let mut last = String::new();
        // A few attempts: a probed free port may be taken before the node binds it.
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("sg-nats-cluster-")
                .tempdir()
                .expect("create cluster dir");
            let mut ports = Vec::new();
            while ports.len() < 2 * n {
                let p = free_port().expect("bind an ephemeral port");
                if !ports.contains(&p) {
                    ports.push(p);
                }
            }
            let nodes = (0..n)
                .map(|i| Node {
                    name: format!("n{i}"),
                    port: ports[2 * i],
                    cluster_port: ports[2 * i + 1],
                    store: dir.path().join(format!("n{i}")),
                    child: None,
                })
                .collect();
            let mut cluster = NatsCluster {
                nodes,
                binary: binary.clone(),
                name: format!("sg-test-{:08x}", rand::random::<u32>()),
                _dir: dir,
            };
            let started: Result<(), String> =
                (0..n).try_for_each(|i| cluster.spawn(i).map_err(|e| format!("n{i}: {e}")));
            match started.and_then(|()| (0..n).try_for_each(|i| cluster.wait_accepting(i))) {
                Ok(()) => {
                    cluster.wait_ready().await;
                    return cluster;
                }
                Err(e) => last = e,
            }
        }
        panic!(
            "nats-server cluster ({}) did not start: {last}",
            binary.display()
        );
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| format!("nats://127.0.0.1:{}", n.cluster_port))
            .collect();
        let node = &self.nodes[i];
        std::fs::create_dir_all(&node.store)?;
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(node.log_path())?;
        let child = Command::new(&self.binary)
            .arg("-js")
            .args(["-a", "127.0.0.1"])
            .args(["-p", &node.port.to_string()])
            .args(["-n", &node.name])
            .arg("-sd")
            .arg(node.store.join("js"))
            .args(["--cluster_name", &self.name])
            .args([
                "--cluster",
                &format!("nats://127.0.0.1:{}", node.cluster_port),
            ])
            .args(["--routes", &routes.join(",")])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    fn wait_accepting(&mut self, i: usize) -> Result<(), String> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.nodes[i].port));
        let deadline = Instant::now() + NODE_START;
        loop {
            let node = &mut self.nodes[i];
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    node.child = None;
                    return Err(format!(
                        "{} exited with {status}\n{}",
                        node.name,
                        node.log()
                    ));
                }
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} not accepting after {NODE_START:?}\n{}",
                    node.name,
                    node.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until JetStream has a meta leader and an R`n` stream (n = running nodes)
    /// can be placed, i.e. the meta layer sees every running node.
    ///
    /// # Panics
    /// After 30 s, with every node's log tail.
    pub async fn wait_ready(&self) {
        let running = self.nodes.iter().filter(|n| n.child.is_some()).count();
        let js = self.jetstream().await;
        let probe = format!("SG_TESTKIT_PROBE_{:08x}", rand::random::<u32>());
        let deadline = Instant::now() + CLUSTER_READY;
        loop {
            let cfg = async_nats::jetstream::stream::Config {
                name: probe.clone(),
                subjects: vec![format!("sg.testkit.probe.{probe}")],
                storage: async_nats::jetstream::stream::StorageType::Memory,
                num_replicas: running,
                ..Default::default()
            };
            let last =
                match tokio::time::timeout(Duration::from_secs(5), js.create_stream(cfg)).await {
                    Ok(Ok(_)) => {
                        let _ = js.delete_stream(&probe).await;
                        return;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "create stream timed out".to_owned(),
                };
            if Instant::now() >= deadline {
                panic!(
                    "cluster not ready after {CLUSTER_READY:?} (an R{running} stream cannot be placed: {last})\n{}",
                    self.logs(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true (a cluster has nodes); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node's client URL, comma-separated: a `--nats` value.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(Node::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Node `i`'s server name (`n<i>`), as leaders are reported.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Node `i`'s store directory (survives kill/restart).
    pub fn store_dir(&self, i: usize) -> &Path {
        &self.nodes[i].store
    }

    /// True while node `i` runs.
    pub fn is_running(&mut self, i: usize) -> bool {
        self.nodes[i]
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on its ports and store and waits until it accepts
    /// connections (call [`wait_ready`](NatsCluster::wait_ready) to wait for it to
    /// rejoin the meta layer).
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        if let Err(e) = self.spawn(i) {
            panic!("restart {}: {e}", self.nodes[i].name);
        }
        if let Err(e) = self.wait_accepting(i) {
            panic!("restart: {e}");
        }
    }

    /// The last `lines` lines of every node's log.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let log = n.log();
            let all: Vec<&str> = log.lines().collect();
            out.push_str(&format!("--- {} ---\n", n.name));
            out.push_str(&all[all.len().saturating_sub(lines)..].join("\n"));
            out.push('\n');
        }
        out
    }

    /// Every node's client address (for `async_nats::connect`).
    pub fn server_addrs(&self) -> Vec<ServerAddr> {
        self.nodes
            .iter()
            .map(|n| n.url().parse().expect("node URL"))
            .collect()
    }

    /// A client on every node's address that reconnects forever (tests kill nodes on
    /// purpose).
    pub async fn client(&self) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connect(self.server_addrs())
            .await
            .expect("connect to the nats-server cluster")
    }

    /// A JetStream context on [`client`](NatsCluster::client).
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(self.client().await)
    }

    /// The index of the node leading `stream` (`$JS.API.STREAM.INFO` cluster.leader),
    /// waiting up to `patience` for the stream to have a leader.
    ///
    /// # Panics
    /// When no leader is reported in time.
    pub async fn stream_leader(
        &self,
        js: &async_nats::jetstream::Context,
        stream: &str,
        patience: Duration,
    ) -> usize {
        let deadline = Instant::now() + patience;
        loop {
            let last = match stream_leader_name(js, stream).await {
                Ok(Some(name)) => match self.index_of(&name) {
                    Some(i) => return i,
                    None => format!("unknown leader {name}"),
                },
                Ok(None) => "no leader".to_owned(),
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "stream {stream}: no leader after {patience:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every replica of `stream` is current and online (e.g. a restarted
    /// node has caught up).
    ///
    /// # Panics
    /// When they are not within `patience`.
    pub async fn wait_stream_current(
        &self,
        js: &async_nats::jetstream::Context,
        stream: &str,
        patience: Duration,
    ) {
        let deadline = Instant::now() + patience;
        loop {
            let last = match js.get_stream(stream).await {
                Ok(s) => {
                    let info = s.cached_info();
                    match &info.cluster {
                        Some(c) if c.leader.is_some() => {
                            let want = info.config.num_replicas.saturating_sub(1);
                            let good = c
                                .replicas
                                .iter()
                                .filter(|p| p.current && !p.offline)
                                .count();
                            if good >= want {
                                return;
                            }
                            format!("{good} of {want} followers current: {c:?}")
                        }
                        other => format!("cluster info {other:?}"),
                    }
                }
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "stream {stream}: replicas not current after {patience:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The server name of `stream`'s leader, if it has one now.
pub async fn stream_leader_name(
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> Result<Option<String>, String> {
    let s = tokio::time::timeout(Duration::from_secs(5), js.get_stream(stream))
        .await
        .map_err(|_| "stream info timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(s.cached_info()
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone()))
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

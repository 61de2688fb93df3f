//! The Kubernetes manifests as local processes: `deploy/k8s/overlays/{prod,dev}` rendered
//! the way `deploy/k8s/check.sh` renders them (`tools/render.py`), and every Deployment's
//! container started as a child process with its own `command`/`args` and environment
//! (`envFrom` ConfigMaps/Secrets, `env` with `valueFrom` and Kubernetes `$(VAR)`
//! expansion), against a 3-node loopback nats-server cluster (testkit `NatsCluster`) and a
//! fresh PostgreSQL database. A run goes in through the normalizer's ingest front door;
//! the webhook receiver must apply its `final` exactly once and the archive must hold the
//! run exactly as `streamgate normalize` prints it. So the manifests' configuration is
//! known to work, whatever it becomes.
//!
//! The only overrides (what cannot apply on one machine), all printed on failure:
//! - Service addresses: `nats:4222` in a `nats://` value becomes every loopback cluster
//!   node (credentials kept); a `postgres://…@postgres:5432/…` value becomes the fresh
//!   test database's URL (`$STREAMGATE_PG_URL`, default
//!   `postgres://postgres@127.0.0.1:5432/postgres`, with trust auth).
//! - Ports: every `0.0.0.0:<port>` in a value becomes `127.0.0.1:<free port>`, and every
//!   declared `containerPort` the environment does not name gets the binary's listen
//!   variable (`STREAMGATE_INGEST_GRPC`, …) set to `127.0.0.1:<free port>`: all
//!   containers share one host here.
//! - Operator Secrets: the rendered Secrets' values are used as they are (placeholders
//!   are valid test values); a key of a Secret that is not rendered (one the operator
//!   creates) gets `test-<secret>-<key>`. A `telegram=<bot>@<chat>` channel sink (a bot
//!   token cannot apply locally) becomes `webhook=<local receiver>` with a
//!   `STREAMGATE_CHANNEL_SECRET` added to the same Secret.
//! - File paths: Secret and ConfigMap volumes are written to a temp dir, and a value
//!   under a `mountPath` names the local copy.
//! - Binaries: `/usr/local/bin/<name>` is cargo's `<name>` of this build.
//! - The process environment is cleared except `PATH`.
//!
//! Run: `cargo test -p streamgate --test manifests` (with `STREAMGATE_NATS_SERVER` and
//! PostgreSQL as for every test; the service binaries are built on first use).

use crate::common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use streamgate_bus::{EVENTS_STREAM, RAW_STREAM};
use streamgate_sinks::fakes::{Behavior, FakeServer};
use streamgate_testkit::{NatsCluster, PgDatabase};

/// The capture the run carries (a thinking block and a final answer).
const CAPTURE: &str = "f1/end-turn.sse";
/// The webhook signing secret the test puts into the channel's Secret.
const HOOK_SECRET: &str = "whsec-manifests";
/// How long the run may take from ingest to archive and webhook.
const SETTLE: Duration = Duration::from_secs(60);

/// One test at a time: each runs three nats-servers and every service.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------
// rendering
// ---------------------------------------------------------------------------------------

/// `deploy/k8s/overlays/<overlay>` rendered by `tools/render.py`, as JSON objects (Secret
/// `data` decoded into `stringData`).
fn render(overlay: &str) -> Vec<Value> {
    let k8s = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s");
    let script = r#"
import base64, json, subprocess, sys, yaml
out = subprocess.run([sys.executable, sys.argv[1], sys.argv[2]], check=True,
                     capture_output=True, text=True).stdout
docs = [d for d in yaml.safe_load_all(out) if d]
for d in docs:
    if d.get("kind") == "Secret":
        s = d.setdefault("stringData", {})
        for k, v in (d.pop("data", None) or {}).items():
            s.setdefault(k, base64.b64decode(v).decode())
json.dump(docs, sys.stdout)
"#;
    let out = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg("-c")
        .arg(script)
        .arg(k8s.join("tools/render.py"))
        .arg(k8s.join("overlays").join(overlay))
        .env("PYTHONPATH", python_path())
        .output()
        .expect("python3 (deploy/k8s/check.sh needs it too)");
    assert!(
        out.status.success(),
        "rendering overlays/{overlay} failed (PyYAML comes with deploy/k8s/check.sh's \
         one-time install; run it once):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("rendered JSON")
}

/// `$PYTHONPATH` plus the folder `check.sh` installs PyYAML into.
fn python_path() -> String {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    let pylib = cache.join("streamgate/k8s-check-py");
    match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", pylib.display()),
        _ => pylib.display().to_string(),
    }
}

/// The rendered object of `kind`/`name`.
fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Secrets with test values
// ---------------------------------------------------------------------------------------

/// Every Secret's keys and values as the test uses them.
struct Secrets {
    values: HashMap<String, BTreeMap<String, String>>,
}

impl Secrets {
    /// The rendered Secrets, with a `telegram=` sink turned into the local webhook.
    fn new(docs: &[Value], webhook_url: &str) -> Secrets {
        let mut values = HashMap::new();
        for d in docs.iter().filter(|d| d["kind"] == "Secret") {
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let mut kv: BTreeMap<String, String> = BTreeMap::new();
            if let Some(m) = d["stringData"].as_object() {
                for (k, v) in m {
                    kv.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
                }
            }
            let telegram = kv
                .get("STREAMGATE_CHANNEL_SINK")
                .is_some_and(|s| s.starts_with("telegram="));
            if telegram {
                kv.insert(
                    "STREAMGATE_CHANNEL_SINK".into(),
                    format!("webhook={webhook_url}"),
                );
                kv.insert("STREAMGATE_CHANNEL_SECRET".into(), HOOK_SECRET.into());
            }
            values.insert(name, kv);
        }
        Secrets { values }
    }

    /// One key (a test value when the Secret is not rendered: the operator creates it).
    fn key(&self, secret: &str, key: &str) -> String {
        match self.values.get(secret) {
            Some(kv) => kv
                .get(key)
                .cloned()
                .unwrap_or_else(|| panic!("Secret {secret} has no key {key}")),
            None => format!("test-{secret}-{key}").to_lowercase(),
        }
    }

    /// Every key of a Secret an `envFrom` names.
    fn all(&self, secret: &str) -> BTreeMap<String, String> {
        self.values.get(secret).cloned().unwrap_or_else(|| {
            panic!("envFrom Secret {secret} is not rendered: give the test its keys")
        })
    }
}

// ---------------------------------------------------------------------------------------
// containers
// ---------------------------------------------------------------------------------------

/// One Deployment's (first) container as the manifests describe it.
#[derive(Debug, Clone)]
struct Container {
    deployment: String,
    /// `command` + `args`, `$(VAR)`-expanded.
    argv: Vec<String>,
    /// In Kubernetes order: `envFrom` sources, then `env`.
    env: Vec<(String, String)>,
    ports: Vec<u16>,
    /// Secret/ConfigMap volumes: mount path → files (name → content); a `subPath` mount
    /// is one file, named by the empty string.
    mounts: Vec<(String, BTreeMap<String, String>)>,
}

impl Container {
    fn get(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every Deployment's container.
fn containers(docs: &[Value], secrets: &Secrets) -> Vec<Container> {
    let mut out = Vec::new();
    for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
        let name = d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let spec = &d["spec"]["template"]["spec"]["containers"];
        let c = spec
            .get(0)
            .unwrap_or_else(|| panic!("Deployment {name} has no container"));
        assert!(
            spec.as_array().is_some_and(|a| a.len() == 1),
            "Deployment {name}: one container expected (the test runs one process each)"
        );
        let mut one = container(&name, c, docs, secrets);
        one.mounts = mounts(&d["spec"]["template"]["spec"]["volumes"], c, docs, secrets);
        out.push(one);
    }
    out
}

fn container(deployment: &str, c: &Value, docs: &[Value], secrets: &Secrets) -> Container {
    let mut env: Vec<(String, String)> = Vec::new();
    for src in c["envFrom"].as_array().into_iter().flatten() {
        let prefix = src["prefix"].as_str().unwrap_or_default();
        let kv = if let Some(name) = src["configMapRef"]["name"].as_str() {
            config_map(docs, name)
        } else if let Some(name) = src["secretRef"]["name"].as_str() {
            secrets.all(name)
        } else {
            panic!("{deployment}: envFrom {src}")
        };
        env.extend(kv.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or_default().to_owned();
        let value = match e.get("value") {
            Some(v) => expand(v.as_str().unwrap_or_default(), &env),
            None => value_from(deployment, &e["valueFrom"], docs, secrets),
        };
        env.push((name, value));
    }
    let mut argv = str_list(&c["command"]);
    if argv.is_empty() {
        // deploy/Dockerfile's ENTRYPOINT.
        argv.push("/usr/local/bin/streamgate".into());
    }
    argv.extend(str_list(&c["args"]));
    let argv = argv.iter().map(|a| expand(a, &env)).collect();
    let ports = c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["containerPort"].as_u64())
        .map(|p| u16::try_from(p).expect("port"))
        .collect();
    Container {
        deployment: deployment.to_owned(),
        argv,
        env,
        ports,
        mounts: Vec::new(),
    }
}

/// The container's Secret and ConfigMap volume mounts with their files.
fn mounts(
    volumes: &Value,
    c: &Value,
    docs: &[Value],
    secrets: &Secrets,
) -> Vec<(String, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or_default();
        let Some(v) = volumes
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == name)
        else {
            continue;
        };
        let mut files = if let Some(s) = v["secret"]["secretName"].as_str() {
            secrets.all(s)
        } else if let Some(cm) = v["configMap"]["name"].as_str() {
            config_map(docs, cm)
        } else {
            continue;
        };
        let items = v["secret"]["items"]
            .as_array()
            .or(v["configMap"]["items"].as_array());
        if let Some(items) = items {
            files = items
                .iter()
                .filter_map(|i| {
                    let key = i["key"].as_str()?;
                    Some((i["path"].as_str()?.to_owned(), files.get(key)?.clone()))
                })
                .collect();
        }
        if let Some(sub) = m["subPath"].as_str() {
            let content = files.get(sub).cloned().unwrap_or_default();
            files = BTreeMap::from([(String::new(), content)]);
        }
        let path = m["mountPath"].as_str().unwrap_or_default().to_owned();
        out.push((path, files));
    }
    out
}

fn config_map(docs: &[Value], name: &str) -> BTreeMap<String, String> {
    let cm = object(docs, "ConfigMap", name)
        .unwrap_or_else(|| panic!("ConfigMap {name} is not rendered"));
    cm["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn value_from(deployment: &str, from: &Value, docs: &[Value], secrets: &Secrets) -> String {
    let r = &from["secretKeyRef"];
    if let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str()) {
        return secrets.key(name, key);
    }
    let r = &from["configMapKeyRef"];
    if let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str()) {
        return config_map(docs, name)
            .remove(key)
            .unwrap_or_else(|| panic!("ConfigMap {name} has no key {key}"));
    }
    panic!("{deployment}: valueFrom {from} is not supported by the test")
}

/// Kubernetes `$(VAR)` expansion against the variables defined so far (`$$` escapes;
/// an undefined reference stays as written).
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(close) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=close];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&rest[i..i + close + 3]),
            }
            rest = &after[close + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------
// localizing
// ---------------------------------------------------------------------------------------

/// Where the Kubernetes Services are on this machine.
struct Local {
    /// Where Secret and ConfigMap volumes are written.
    files: PathBuf,
    /// `nats://127.0.0.1:<port>` of every cluster node.
    nats: Vec<String>,
    /// The fresh database.
    pg_url: String,
}

/// The variable each binary reads for a port it listens on by default (the manifests'
/// `containerPort`s that no variable names).
fn listen_var(port: u16) -> Option<&'static str> {
    Some(match port {
        7310 => "STREAMGATE_INGEST_GRPC",
        7311 => "STREAMGATE_INGEST_HTTP",
        7320 => "STREAMGATE_ARCHIVE_GRPC",
        7330 => "STREAMGATE_PROJECTOR_GRPC",
        9090 => "STREAMGATE_METRICS_ADDR",
        _ => return None,
    })
}

/// Rewrites a container for this machine (see the module docs); returns the map from
/// each declared container port to its local address.
fn localize(c: &mut Container, local: &Local) -> BTreeMap<u16, String> {
    let mut ports: BTreeMap<u16, String> = BTreeMap::new();
    let mounted = write_mounts(c, &local.files);
    for (_, v) in c.env.iter_mut() {
        *v = mount_paths(v, &mounted);
        *v = service_addresses(v, local);
        *v = listen_addresses(v, &mut ports);
    }
    for a in c.argv.iter_mut().skip(1) {
        *a = mount_paths(a, &mounted);
        *a = listen_addresses(&service_addresses(a, local), &mut ports);
    }
    for p in c.ports.clone() {
        if ports.contains_key(&p) {
            continue;
        }
        let var = listen_var(p).unwrap_or_else(|| {
            panic!(
                "{}: containerPort {p} is not named by any variable and the test does not \
                 know which variable moves it",
                c.deployment
            )
        });
        let addr = free_addr();
        c.env.push((var.to_owned(), addr.clone()));
        ports.insert(p, addr);
    }
    ports
}

/// Writes the container's volume files under `base`; returns (mount path, local path).
fn write_mounts(c: &Container, base: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, (path, files)) in c.mounts.iter().enumerate() {
        let dir = base.join(format!("{}-{i}", c.deployment));
        std::fs::create_dir_all(&dir).expect("volume dir");
        for (name, content) in files {
            let file = if name.is_empty() {
                dir.join("file")
            } else {
                dir.join(name)
            };
            std::fs::write(&file, content).expect("volume file");
            if name.is_empty() {
                out.push((path.clone(), file.display().to_string()));
            }
        }
        if !files.contains_key("") {
            out.push((path.clone(), dir.display().to_string()));
        }
    }
    // Longest mount path first, so nested mounts win.
    out.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    out
}

/// A value that names a file under a mount path names the local copy instead.
fn mount_paths(v: &str, mounted: &[(String, String)]) -> String {
    for (path, local) in mounted {
        if let Some(rest) = v.strip_prefix(path.as_str()) {
            if rest.is_empty() || rest.starts_with('/') {
                return format!("{local}{rest}");
            }
        }
    }
    v.to_owned()
}

fn free_addr() -> String {
    let port = streamgate_bus::local::free_port().expect("free port");
    format!("127.0.0.1:{port}")
}

/// `0.0.0.0:<port>` → `127.0.0.1:<free port>` (the same port maps to the same address
/// within one container).
fn listen_addresses(v: &str, ports: &mut BTreeMap<u16, String>) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find("0.0.0.0:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "0.0.0.0:".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let port: u16 = after[..digits].parse().expect("listen port");
        out.push_str(ports.entry(port).or_insert_with(free_addr));
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// The Services the services reach, mapped to this machine.
fn service_addresses(v: &str, local: &Local) -> String {
    if let Some(rest) = v.strip_prefix("nats://") {
        let (cred, host) = rest.rsplit_once('@').map_or(("", rest), |(c, h)| (c, h));
        if host == "nats:4222" || host.starts_with("nats.") {
            let at = if cred.is_empty() {
                String::new()
            } else {
                format!("{cred}@")
            };
            return local
                .nats
                .iter()
                .map(|u| u.replacen("nats://", &format!("nats://{at}"), 1))
                .collect::<Vec<_>>()
                .join(",");
        }
    }
    if (v.starts_with("postgres://") || v.starts_with("postgresql://"))
        && (v.contains("@postgres:5432/") || v.contains("@postgres."))
    {
        return local.pg_url.clone();
    }
    v.to_owned()
}

// ---------------------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------------------

/// cargo's build of the binary `/usr/local/bin/<name>` stands for.
fn binary(command: &str) -> PathBuf {
    let name = Path::new(command)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_else(|| panic!("command {command}"));
    let root = PathBuf::from(env!("CARGO_BIN_EXE_streamgate"));
    let dir = root.parent().expect("target dir").to_path_buf();
    if name == "streamgate" {
        return root;
    }
    build_service_binary(name, &dir);
    let bin = dir.join(name);
    assert!(bin.exists(), "no binary {} after the build", bin.display());
    bin
}

/// Builds `name` (a service package's binary of the same name) with this test's profile:
/// `cargo test -p streamgate` builds only this package's binaries. A no-op when current.
fn build_service_binary(name: &str, dir: &Path) {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|b| b == name) {
        return;
    }
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "-p", name, "--bin", name]);
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let status = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("cargo build -p {name}: {e}"));
    assert!(status.success(), "cargo build -p {name} failed");
    built.push(name.to_owned());
}

/// How often a container may exit and be started again, as the kubelet would (a service
/// exits when its first connect or stream/bucket creation fails, e.g. while the fresh
/// cluster is still electing leaders under load).
const MAX_RESTARTS: u32 = 5;

/// A container as a child process, restarted like a Kubernetes pod's container (up to
/// [`MAX_RESTARTS`] times) and killed on drop.
struct Proc {
    container: Container,
    log: PathBuf,
    child: Child,
    restarts: u32,
}

impl Proc {
    fn spawn(c: &Container, logs: &Path) -> Proc {
        let log = logs.join(format!("{}.log", c.deployment));
        let child = Proc::start(c, &log);
        Proc {
            container: c.clone(),
            log,
            child,
            restarts: 0,
        }
    }

    fn start(c: &Container, log: &Path) -> Child {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        Command::new(binary(&c.argv[0]))
            .args(&c.argv[1..])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(c.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", c.deployment))
    }

    /// Starts the process again when it has exited; panics with the log after
    /// [`MAX_RESTARTS`].
    fn keep_running(&mut self) {
        let Ok(Some(status)) = self.child.try_wait() else {
            return;
        };
        let name = &self.container.deployment;
        assert!(
            self.restarts < MAX_RESTARTS,
            "{name} exited ({status}) after {} restarts:\n{}",
            self.restarts,
            self.log_tail()
        );
        self.restarts += 1;
        eprintln!(
            "{name} exited ({status}); restart {}\n{}",
            self.restarts,
            tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 3)
        );
        self.child = Proc::start(&self.container, &self.log);
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!(
            "--- {} ({} restarts) ---\n{}",
            self.container.deployment,
            self.restarts,
            tail(&text, 30)
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every address accepts TCP connections, every process still running.
fn wait_listening(procs: &mut [Proc], addrs: &[String]) {
    let deadline = Instant::now() + PATIENCE;
    for a in addrs {
        while TcpStream::connect(a).is_err() {
            procs.iter_mut().for_each(Proc::keep_running);
            assert!(Instant::now() < deadline, "nothing listens on {a}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// ---------------------------------------------------------------------------------------
// the test
// ---------------------------------------------------------------------------------------

/// Everything one overlay's run needs.
struct Deployed {
    procs: Vec<Proc>,
    containers: Vec<(Container, BTreeMap<u16, String>)>,
    js: async_nats::jetstream::Context,
    _logs: tempfile::TempDir,
}

impl Deployed {
    fn one(&self, deployment: &str) -> &(Container, BTreeMap<u16, String>) {
        self.containers
            .iter()
            .find(|(c, _)| c.deployment == deployment)
            .unwrap_or_else(|| panic!("no Deployment {deployment}"))
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for p in &self.procs {
            s.push_str(&p.log_tail());
            s.push('\n');
        }
        for (c, ports) in &self.containers {
            s.push_str(&format!("{}: {:?} ports {ports:?}\n", c.deployment, c.argv));
        }
        s
    }
}

/// Renders `overlay`, starts every Deployment as a process and waits until each listens
/// on its ports and the partitioned consumers exist.
async fn deploy(overlay: &str, cluster: &NatsCluster, pg: &PgDatabase, hook: &str) -> Deployed {
    let docs = render(overlay);
    let secrets = Secrets::new(&docs, hook);
    let logs = tempfile::tempdir().expect("log dir");
    let local = Local {
        nats: (0..cluster.len()).map(|i| cluster.url(i)).collect(),
        pg_url: pg.url().to_owned(),
        files: logs.path().join("volumes"),
    };
    let mut containers = Vec::new();
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for mut c in self::containers(&docs, &secrets) {
        let ports = localize(&mut c, &local);
        addrs.extend(ports.values().cloned());
        procs.push(Proc::spawn(&c, logs.path()));
        containers.push((c, ports));
    }
    wait_listening(&mut procs, &addrs);
    let mut d = Deployed {
        procs,
        containers,
        js: cluster.jetstream().await,
        _logs: logs,
    };
    wait_consumers(&mut d).await;
    d
}

/// The normalizer's and every channel's partition consumers, and the archiver's.
async fn wait_consumers(d: &mut Deployed) {
    let mut want = Vec::new();
    for (c, _) in &d.containers {
        let partitions: u32 = c
            .get("STREAMGATE_PARTITIONS")
            .map_or(streamgate_bus::DEFAULT_PARTITIONS, |p| {
                p.parse().expect("partitions")
            });
        let bin = Path::new(&c.argv[0]).file_name().and_then(|n| n.to_str());
        let (stream, group) = match bin {
            Some("streamgate-normalizer") => (RAW_STREAM, "sg-normalizer".to_owned()),
            Some("streamgate-projector") => (
                EVENTS_STREAM,
                format!(
                    "sg-projector-{}",
                    c.get("STREAMGATE_CHANNEL_NAME").unwrap_or("")
                ),
            ),
            Some("streamgate-archiver") => {
                want.push((EVENTS_STREAM, "sg-archiver".to_owned()));
                continue;
            }
            _ => continue,
        };
        for p in 0..partitions {
            let durable = streamgate_bus::subject::partition_durable(&group, partitions, p);
            want.push((stream, durable));
        }
    }
    let deadline = Instant::now() + PATIENCE;
    for (stream, durable) in want {
        while !consumer_exists(&d.js, stream, &durable).await {
            d.procs.iter_mut().for_each(Proc::keep_running);
            assert!(
                Instant::now() < deadline,
                "consumer {durable} on {stream} never appeared\n{}",
                d.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn consumer_exists(js: &async_nats::jetstream::Context, stream: &str, durable: &str) -> bool {
    matches!(
        streamgate_bus::incarnation::current(js, stream, durable).await,
        Ok(Some(_))
    )
}

/// `streamgate ingest` of the capture as `run` into the normalizer's gRPC front door,
/// with the ingest token from the normalizer's environment.
fn ingest(d: &Deployed, run: &str) {
    let (normalizer, ports) = d.one("normalizer");
    let grpc = ports.get(&7310).expect("the normalizer's ingest port 7310");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_streamgate"));
    cmd.env_clear()
        .arg("ingest")
        .args(["--addr", grpc, "--family", "f1", "--run", run])
        .args(["--tenant", TENANT, "--session", &format!("session-{run}")])
        .arg(root().join("fixtures").join(CAPTURE));
    if let Some(token) = normalizer.get("STREAMGATE_INGEST_TOKEN") {
        cmd.args(["--token", token]);
    }
    let out = cmd.output().expect("streamgate ingest");
    assert!(
        out.status.success(),
        "streamgate ingest failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.logs()
    );
}

/// Applied webhook `final`s of `run`, once they stop changing.
async fn finals_of(fake: &FakeServer, run: &str, d: &Deployed) -> usize {
    let count = || {
        fake.events()
            .iter()
            .filter(|e| e["op"] == "final" && e["run_id"] == run)
            .count()
    };
    let deadline = Instant::now() + SETTLE;
    while count() == 0 {
        assert!(
            Instant::now() < deadline,
            "no webhook final for {run} within {SETTLE:?}; calls {:?}\n{}",
            fake.calls().iter().map(|c| &c.api).collect::<Vec<_>>(),
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Negative window, not a wait: a late repeat of the final gets 1 s to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    count()
}

async fn run_overlay(overlay: &str) {
    let _serial = SERIAL.lock().await;
    let cluster = NatsCluster::start().await;
    let pg = PgDatabase::create().await;
    let fake = FakeServer::webhook(HOOK_SECRET, Behavior::default())
        .await
        .expect("webhook receiver");
    let mut d = deploy(overlay, &cluster, &pg, &fake.base_url).await;
    let run = format!("k8s-{overlay}-1");
    ingest(&d, &run);

    let store = streamgate_archive::open_store(pg.url())
        .await
        .expect("open the archive");
    let want = expected("f1", &fixture(CAPTURE));
    let got = wait_run(store.as_ref(), &run, want.len(), SETTLE).await;
    assert_archive_eq(&run, &got, &want, overlay);
    assert_eq!(
        finals_of(&fake, &run, &d).await,
        1,
        "{overlay}: the webhook applied the final of {run} not exactly once\n{}",
        d.logs()
    );
    d.procs.iter_mut().for_each(Proc::keep_running);
}

/// `overlays/prod` (R3 streams and buckets, KEDA) against the 3-node cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prod_overlay_as_processes_delivers_a_run_to_the_webhook_and_the_archive() {
    run_overlay("prod").await;
}

/// `overlays/dev` (R1) against the same kind of cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_overlay_as_processes_delivers_a_run_to_the_webhook_and_the_archive() {
    run_overlay("dev").await;
}

#[test]
fn kubernetes_variable_expansion() {
    let env = vec![("A".to_owned(), "x".to_owned())];
    assert_eq!(expand("u:$(A)@h", &env), "u:x@h");
    assert_eq!(expand("$(B)-$$(A)-$", &env), "$(B)-$(A)-$");
}

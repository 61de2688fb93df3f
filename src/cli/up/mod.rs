//! `streamgate up`: the whole pipeline in one process on embedded defaults — a spawned
//! local nats-server (unless `--nats` is given), the normalizer with its gRPC and HTTP
//! front doors, the archiver on SQLite under the data dir, and a terminal channel — and
//! `<data dir>/up.json` so `ingest`, `runs` and `replay` find it without flags.
//!
//! Projector channels: `--channel <kind>=<target>` (repeatable: `web=127.0.0.1:0`,
//! `webhook=http://…` with `--channel-secret`, `telegram=<bot token>@<chat>`,
//! `plain=stdout`, `json=<SinkConfig JSON>`) adds channels; without any, `up` runs a web
//! channel on a free local port (`--no-web` drops it). Each channel's ProjectorService
//! token is written to `<data dir>/channel-<name>.token`, never printed; `up.json` lists
//! the channels' addresses (`streamgate tail` finds them there).
//!
//! The spawned nats-server requires a user and password, fresh at every start: its config
//! file `<data dir>/nats/nats-server.conf` holds them, `up.json` gives them to local
//! clients, and `<data dir>/nats.env` is a `--config` file for a service joining this
//! instance (`streamgate projector --config <data dir>/nats.env …`). All are 0600 in a
//! 0700 data dir; none is printed.
//!
//! Ingest needs a token: `up` writes an all-tenant token to
//! `<data dir>/ingest.token` (mode 0600, never printed), and
//! `streamgate ingest` sends it by default when it talks to this instance
//! (`curl -H "Authorization: Bearer $(cat .streamgate/ingest.token)"` for HTTP).
//! `--ingest-tokens <file>` adds tokens scoped to tenants.
//!
//! A data dir keeps its addresses and tokens across restarts ([`remembered`]): the
//! listeners take their earlier ports again when free, the ingest and channel tokens stay
//! (`--rotate-tokens` writes fresh ones), so a page, a script or a client keeps working
//! after `up` restarts.
//!
//! TLS: `--tls-cert/--tls-key` (and `--tls-client-ca` for mTLS; `STREAMGATE_TLS_*`)
//! apply to every server `up` starts. `up.json` then records `https://` gRPC addresses
//! and `"tls": true` (`"mtls": true`), so `ingest`, `runs`, `replay`, `tail` and
//! `settings` connect with TLS, trusting their `--ca` (`STREAMGATE_CA`) and presenting
//! `--client-cert/--client-key`; the banner prints `https://` pages.

mod broker;
mod demo;
mod remembered;

use super::discover::{channel_token_path, ingest_token_path, ChannelEntry, Instance};
use anyhow::{Context, Result};
use broker::{DataDirLock, SupervisedNats};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use streamgate_archiver::{ArchiverListen, ConsumerConfig};
use streamgate_bus::local::LocalAuth;
use streamgate_normalizer::ingest::Ingestor;
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_runtime::nats::NatsAuth;
use streamgate_runtime::serve::ServeArgs;
use streamgate_runtime::{init_telemetry, NatsArgs, TelemetryArgs};

/// Flags of `streamgate up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where the local instance keeps its broker store, archive and `up.json`.
    #[arg(long, default_value = super::discover::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// `--nats`: use this NATS server instead of spawning one (a URL, or a cluster's
    /// servers comma-separated: `nats://a:4222,nats://b:4222,nats://c:4222`), with these
    /// credentials.
    #[command(flatten)]
    pub nats: NatsArgs,
    /// JetStream replicas of the streams and KV buckets `up` creates (and of existing
    /// streams, which are scaled to it): 3 on a 3-node cluster. Needs `--nats`; the
    /// spawned local server is a single node.
    #[arg(long, env = "STREAMGATE_REPLICAS", default_value_t = 1)]
    pub replicas: usize,
    /// Do not keep the provider's raw chunks in the archive. By default `up` keeps them,
    /// so `streamgate verify` and `backfill` can re-normalize its runs.
    #[arg(long)]
    pub no_archive_raw: bool,
    /// Retention policies of the archive: `<tenant>:strip=<N>d,drop=<M>d`, `;`-separated,
    /// `*` for every tenant (see `streamgate retention`).
    #[arg(long, env = "STREAMGATE_RETENTION", default_value = "")]
    pub retention: streamgate_archiver::retention::Policies,
    /// Index the thinking of ended runs for `streamgate runs --search … --thinking`
    /// (reasoning is sensitive: off unless asked for).
    #[arg(long, env = "STREAMGATE_SEARCH_THINKING")]
    pub search_thinking: bool,
    /// Prices per million tokens for the cost of runs (`runs --stats`):
    /// `<model or prefix*>:input=<p>,output=<p>,cache_read=<p>,cache_write=<p>`, `;`-separated.
    #[arg(long, env = "STREAMGATE_PRICES", default_value = "")]
    pub prices: streamgate_archiver::accounting::Prices,
    /// Continuous export of ended runs as OpenTelemetry GenAI traces.
    #[command(flatten)]
    pub export: streamgate_archiver::genai::follow::ExportArgs,
    /// Archive URL (default: SQLite at `<data dir>/archive.db`).
    #[arg(long, env = "STREAMGATE_ARCHIVE_URL")]
    pub archive: Option<String>,
    /// gRPC ingest address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub ingest_grpc: SocketAddr,
    /// HTTP ingest address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub ingest_http: SocketAddr,
    /// ArchiveService address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub archive_grpc: SocketAddr,
    /// Seconds without a chunk before a run is closed with a timeout marker.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout_secs: u64,
    /// Ingest the project's bundled captures, show each run's final answer, and exit
    /// once all are archived and shown (add `--stay` to keep serving afterwards).
    #[arg(long)]
    pub demo: bool,
    /// With --demo: keep serving after the demo (to open the web page or `tail`).
    #[arg(long, requires = "demo")]
    pub stay: bool,
    /// Accepted for older scripts: `--demo` now exits after the demo by itself.
    #[arg(long, requires = "demo", hide = true)]
    pub exit_after_demo: bool,
    /// Do not print events (no terminal channel).
    #[arg(long)]
    pub quiet: bool,
    /// Terminal channel prints every raw event instead of the status-line rendering.
    #[arg(long)]
    pub raw_events: bool,
    /// Projector channel `<kind>=<target>` (repeatable): `web=127.0.0.1:0`,
    /// `webhook=<url>`, `telegram=<bot token>@<chat>`, `plain=stdout`, `json=<SinkConfig>`.
    #[arg(long = "channel", value_name = "KIND=TARGET", hide_env_values = true)]
    pub channels: Vec<String>,
    /// Signing secret of `webhook=` channels.
    #[arg(long, env = "STREAMGATE_CHANNEL_SECRET", hide_env_values = true)]
    pub channel_secret: Option<String>,
    /// No default web channel.
    #[arg(long)]
    pub no_web: bool,
    /// `/reasoning` default of every channel (off, on or stream; a web channel's own
    /// default is `on`); `streamgate settings` changes one chat's on a running instance.
    #[arg(long)]
    pub reasoning: Option<streamgate_projection::Reasoning>,
    /// `/verbose` default of every channel (off, on or full).
    #[arg(long)]
    pub verbose: Option<streamgate_projection::Verbose>,
    /// The ACP dedupe plan's knobs, every channel's default (delivery mode, repeat
    /// suppression, tag visibility, budgets); `streamgate settings` changes one chat's.
    #[command(flatten)]
    pub knobs: streamgate_projector::cli::KnobArgs,
    /// An origin (`https://app.example`) whose browser apps may call every channel's run
    /// stream across origins with the channel's token (repeat); none by default.
    #[arg(
        long = "cors-origin",
        env = "STREAMGATE_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// Fresh ingest and channel tokens (by default a data dir keeps its tokens, and its
    /// ports, across restarts: every address and credential stays valid).
    #[arg(long)]
    pub rotate_tokens: bool,
    /// Token file of extra ingest tokens scoped to tenants (lines `<token> <tenant>[,…]`
    /// or `<token> *`, mode 0600), besides the all-tenant `<data dir>/ingest.token`.
    #[arg(long, env = "STREAMGATE_INGEST_TOKENS")]
    pub ingest_tokens: Option<PathBuf>,
    /// Partition count. Default: the count the streams already record (an existing data
    /// dir or `--nats` deployment keeps its own), else 8.
    #[arg(long, env = "STREAMGATE_PARTITIONS")]
    pub partitions: Option<u32>,
    /// TLS of every server `up` starts (ingest gRPC and HTTP, archive gRPC, each
    /// channel's ProjectorService and web page): `--tls-cert/--tls-key`, and
    /// `--tls-client-ca` for mTLS; and their connection limits.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Logs, metrics and span export.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// How long a stop may take before whatever is still busy (a chat op being retried, a
/// slow flush) is abandoned: SIGTERM ends `up` within 10 s.
const STOP_BUDGET: Duration = Duration::from_secs(7);

/// Runs the subcommand until Ctrl-C / SIGTERM (with `--demo`, until the demo is archived
/// and shown, unless `--stay`).
pub async fn run(args: UpArgs) -> Result<()> {
    let mut telemetry = args.telemetry.config("streamgate");
    // Library INFO chatter (consumers created, leases taken) stays out of this terminal;
    // the banner, the channels and warnings stay. RUST_LOG=info brings it back.
    telemetry.default_filter = "warn";
    init_telemetry(&telemetry)?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    private_dir(&data_dir)?;
    let _lock = DataDirLock::acquire(&data_dir)?;
    let shutdown = streamgate_runtime::shutdown::on_signal();

    let replicas = args.replicas.max(1);
    if replicas > 1 && args.nats.nats.is_none() {
        anyhow::bail!("--replicas {replicas} needs --nats <cluster servers>: the local nats-server `up` spawns is a single node");
    }
    // The local broker's credentials: fresh at every start, never printed.
    let local_auth = args.nats.nats.is_none().then(|| LocalAuth {
        user: LOCAL_NATS_USER.to_owned(),
        password: streamgate_runtime::rpc::random_token(),
    });
    let local_nats = match &local_auth {
        Some(auth) => Some(SupervisedNats::start(data_dir.join("nats"), auth.clone()).await?),
        None => None,
    };
    let (nats_url, nats_auth) = match (&local_nats, &local_auth) {
        (Some(n), Some(auth)) => (
            n.url().to_owned(),
            NatsAuth::UserPassword {
                user: auth.user.clone(),
                password: auth.password.clone(),
            },
        ),
        _ => (args.nats.servers().to_owned(), args.nats.auth()),
    };
    let nats = streamgate_runtime::nats::connect_auth(&nats_url, &nats_auth).await?;
    // Every lease group of this process renews over a connection of its own, so ingest,
    // normalization and delivery on `nats` never delay a renewal.
    let lease_nats = streamgate_runtime::nats::connect_auth(&nats_url, &nats_auth).await?;
    if let Some(auth) = &local_auth {
        write_nats_env(&data_dir, &nats_url, auth)?;
    }
    let archive_url = args
        .archive
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("archive.db").display()));
    let store = streamgate_archive::open_store(&archive_url).await?;
    let operator_token = streamgate_runtime::rpc::random_token();
    let serve = args.serve.options();
    let tls = serve.tls.is_some();
    let mtls = serve.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    // Checked now, before anything listens: a bad certificate or key is named at once.
    if let Some(files) = &serve.tls {
        files.server_config()?;
    }
    let partitions = match args.partitions {
        Some(p) => p.max(1),
        None => recorded_partitions(&async_nats::jetstream::new(nats.clone()))
            .await
            .unwrap_or(streamgate_bus::DEFAULT_PARTITIONS),
    };

    let mut normalizer_cfg = NormalizerConfig {
        idle_timeout: Duration::from_secs(args.idle_timeout_secs),
        lease_nats: Some(lease_nats.clone()),
        ..NormalizerConfig::default()
    };
    normalizer_cfg.streams.replicas = replicas;
    // Ingest is never open on `up`: an all-tenant token, found by `streamgate ingest`,
    // kept across restarts (`--rotate-tokens` for a fresh one), as are the ports.
    let ingest_token = remembered::token(&ingest_token_path(&data_dir), args.rotate_tokens)?;
    let mut addresses = remembered::Addresses::load(&data_dir);
    let normalizer = streamgate_normalizer::start(
        nats.clone(),
        normalizer_cfg,
        Listeners {
            grpc: Some(addresses.pick("ingest_grpc", args.ingest_grpc)),
            http: Some(addresses.pick("ingest_http", args.ingest_http)),
            ingest_token: Some(ingest_token),
            ingest_tokens: args.ingest_tokens.clone(),
            partitions,
            serve: serve.clone(),
        },
        shutdown.clone(),
    )
    .await?;
    let mut archiver = streamgate_archiver::start(
        nats.clone(),
        store.clone(),
        ConsumerConfig {
            archive_raw: !args.no_archive_raw,
            retention: args.retention.clone(),
            export_otlp: args.export.config(),
            search_thinking: args.search_thinking,
            ..ConsumerConfig::default()
        },
        ArchiverListen {
            grpc: Some(addresses.pick("archive_grpc", args.archive_grpc)),
            operator_token: operator_token.clone(),
            partitions,
            serve: serve.clone(),
            prices: args.prices.clone(),
            currency: "USD".to_owned(),
        },
        shutdown.clone(),
    )
    .await?;
    let addr = |a: Option<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    // gRPC addresses in up.json carry the scheme when TLS is on, so the clients connect
    // with TLS (with their --ca) even without being told.
    let grpc_addr = |a: Option<SocketAddr>| match a {
        Some(a) if tls => format!("https://{a}"),
        a => addr(a),
    };
    let mut specs = args.channels.clone();
    if specs.is_empty() && !args.no_web {
        specs.push("web=127.0.0.1:0".to_owned());
    }
    let mut projectors = Vec::new();
    // The web pages' addresses carry their channel's token, as a notebook server's do:
    // the page sets it as a cookie and drops it from the address.
    let mut page_tokens = std::collections::HashMap::new();
    let mut channels = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let kind = spec.split_once('=').map_or(spec.as_str(), |(k, _)| k);
        let name = if i == 0 {
            kind.to_owned()
        } else {
            format!("{kind}-{i}")
        };
        let mut cfg = streamgate_projector::config::parse_channel_spec(
            &name,
            spec,
            args.channel_secret.as_deref(),
        )?;
        cfg.partitions = partitions;
        cfg.replicas = replicas;
        cfg.lease_nats = Some(lease_nats.clone());
        cfg.serve = serve.clone();
        if let Some(r) = args.reasoning {
            cfg.settings.reasoning = r;
        }
        if let Some(v) = args.verbose {
            cfg.settings.verbose = v;
        }
        args.knobs.apply(&mut cfg.settings);
        cfg.cors_origins = streamgate_projector::run_stream::check_origins(&args.cors_origins)?;
        let token = remembered::token(&channel_token_path(&data_dir, &name), args.rotate_tokens)?;
        cfg.token = Some(token.clone());
        page_tokens.insert(name.clone(), token);
        if let streamgate_projector::config::ChannelSink::Web { listen } = &mut cfg.sink {
            *listen = addresses.pick(&format!("channel {name} web"), *listen);
        }
        let grpc = addresses.pick(
            &format!("channel {name} grpc"),
            SocketAddr::from(([127, 0, 0, 1], 0)),
        );
        let p = streamgate_projector::start(nats.clone(), cfg, Some(grpc), shutdown.clone())
            .await
            .with_context(|| format!("cannot start channel {name}"))?;
        addresses.record(&format!("channel {name} web"), p.web);
        addresses.record(&format!("channel {name} grpc"), p.grpc);
        projectors.push((format!("channel {name}"), p.tasks));
        channels.push(ChannelEntry {
            name,
            kind: kind.to_owned(),
            grpc: grpc_addr(p.grpc),
            web: p.web.map(|w| w.to_string()),
        });
    }
    let instance = Instance {
        pid: std::process::id(),
        nats_url: nats_url.clone(),
        nats_user: local_auth.as_ref().map(|a| a.user.clone()),
        nats_password: local_auth.as_ref().map(|a| a.password.clone()),
        ingest_grpc: grpc_addr(normalizer.grpc),
        ingest_http: addr(normalizer.http),
        archive_grpc: grpc_addr(archiver.grpc),
        tls,
        mtls,
        operator_token,
        partitions,
        channels,
    };
    addresses.record("ingest_grpc", normalizer.grpc);
    addresses.record("ingest_http", normalizer.http);
    addresses.record("archive_grpc", archiver.grpc);
    addresses.save(&data_dir)?;
    // Written last: a client that finds up.json finds everything listening.
    instance.write(&data_dir)?;
    if args.demo && !args.stay {
        // Its addresses would be dead by the time anyone used them: the demo ends, and
        // so does this process.
        eprintln!(
            "streamgate is up for the demo: it exits once every run is shown (--stay keeps it serving, with its addresses)"
        );
    } else {
        print_addresses(
            &instance,
            &args,
            &data_dir,
            &archive_url,
            &page_tokens,
            tls,
            mtls,
        );
    }

    let js = async_nats::jetstream::new(nats.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let (settled_tx, settled_rx) = tokio::sync::mpsc::unbounded_channel();
    if !args.quiet {
        let (js, stop) = (js.clone(), shutdown.clone());
        if args.raw_events {
            tasks.spawn(async move { crate::terminal::follow(js, stop).await });
        } else {
            let settled = Some(settled_tx);
            let mut settings = streamgate_projection::Settings::default();
            settings.reasoning = args.reasoning.unwrap_or(settings.reasoning);
            settings.verbose = args.verbose.unwrap_or(settings.verbose);
            args.knobs.apply(&mut settings);
            tasks.spawn(async move {
                crate::terminal::follow_status(js, stop, settings, settled).await
            });
        }
    }
    let shown = (!args.quiet && !args.raw_events).then_some(settled_rx);
    if args.demo {
        let ingestor = Ingestor::new(js.clone(), partitions);
        let (stop, store, stay) = (shutdown.clone(), store.clone(), args.stay);
        tasks.spawn(async move {
            demo::run(ingestor, &*store, shown).await?;
            if stay {
                eprintln!("demo done; still serving (Ctrl-C to stop)");
            } else {
                stop.cancel();
            }
            Ok(())
        });
    }
    let broker_failed = async {
        match &local_nats {
            Some(n) => Some(n.failed().await),
            None => std::future::pending().await,
        }
    };
    // The archiver's tasks end early only on an error no retry gets past (a store that
    // cannot take writes again): the standalone archiver exits on one, and so does this.
    let fatal = tokio::select! {
        () = shutdown.cancelled() => None,
        reason = broker_failed => reason,
        reason = first_failure("archiver", &mut archiver.tasks) => Some(reason),
    };
    shutdown.cancel();
    Instance::remove(&data_dir);
    let _ = std::fs::remove_file(data_dir.join(NATS_ENV));
    let services = [
        ("normalizer".to_owned(), normalizer.tasks),
        ("archiver".to_owned(), archiver.tasks),
        ("terminal and demo".to_owned(), tasks),
    ]
    .into_iter()
    .chain(projectors)
    .collect();
    let stopped = stop_within(services, STOP_BUDGET).await;
    streamgate_runtime::telemetry::flush().await;
    // Every service is done: close our connection first, so the broker's exit is not
    // reported as a connection error.
    drop(js);
    let _ = tokio::time::timeout(Duration::from_secs(1), nats.drain()).await;
    if let Some(server) = local_nats {
        // A clean stop: the broker flushes what the services just acknowledged.
        server.stop(Duration::from_secs(2)).await;
    }
    if let Some(reason) = fatal {
        anyhow::bail!("{reason}");
    }
    stopped
}

/// Why the first of `set`'s tasks to fail failed (`name` says whose); never ready while
/// none does. Tasks that end well are joined and forgotten.
async fn first_failure(name: &str, set: &mut tokio::task::JoinSet<Result<()>>) -> String {
    while let Some(done) = set.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return format!("the {name} stopped: {e:#}"),
            Err(e) => return format!("the {name} stopped: {e}"),
        }
    }
    std::future::pending().await
}

/// Joins every task set, giving them `budget` in all; what is still running then is
/// aborted with a warning. The first task error is returned.
async fn stop_within(
    sets: Vec<(String, tokio::task::JoinSet<Result<()>>)>,
    budget: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + budget;
    let mut first_error = None;
    for (name, mut set) in sets {
        loop {
            match tokio::time::timeout_at(deadline, set.join_next()).await {
                Ok(None) => break,
                Ok(Some(Ok(Ok(())))) => {}
                Ok(Some(Ok(Err(e)))) => {
                    first_error.get_or_insert(e);
                }
                Ok(Some(Err(e))) => {
                    first_error.get_or_insert(e.into());
                }
                Err(_) => {
                    eprintln!(
                        "warning: {name}: {} task(s) still busy after {}s; stopping without them",
                        set.len(),
                        budget.as_secs()
                    );
                    set.abort_all();
                    break;
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Makes the data dir private to its owner: it holds the archive, the broker's store
/// and tokens.
fn private_dir(dir: &std::path::Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.display()))?;
    }
    Ok(())
}

/// The user of the local broker.
const LOCAL_NATS_USER: &str = "streamgate";

/// `--config` file for a service joining the local instance: its broker and credentials.
const NATS_ENV: &str = "nats.env";

/// Writes `<data dir>/nats.env` (0600).
fn write_nats_env(data_dir: &std::path::Path, url: &str, auth: &LocalAuth) -> Result<()> {
    let path = data_dir.join(NATS_ENV);
    let text = format!(
        "# The broker of the running `streamgate up` and its credentials (private).\n\
         STREAMGATE_NATS_URL={url}\n\
         STREAMGATE_NATS_USER={}\n\
         STREAMGATE_NATS_PASSWORD={}\n",
        auth.user, auth.password
    );
    streamgate_bus::local::write_private(&path, &text)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The partition count `SG_RAW` records, if the stream exists and records one.
async fn recorded_partitions(js: &async_nats::jetstream::Context) -> Option<u32> {
    let raw = js.get_stream(streamgate_bus::RAW_STREAM).await.ok()?;
    raw.cached_info()
        .config
        .metadata
        .get(streamgate_bus::PARTITIONS_METADATA)?
        .parse()
        .ok()
}

/// What `up` prints once everything listens: each address and where its token is.
fn print_addresses(
    instance: &Instance,
    args: &UpArgs,
    data_dir: &std::path::Path,
    archive_url: &str,
    page_tokens: &std::collections::HashMap<String, String>,
    tls: bool,
    mtls: bool,
) {
    let http_scheme = if tls { "https" } else { "http" };
    eprintln!("streamgate is up");
    eprintln!(
        "  nats            {}",
        streamgate_runtime::nats::redact_servers(&instance.nats_url)
    );
    eprintln!("  ingest (gRPC)   {}", instance.ingest_grpc);
    eprintln!(
        "  ingest (HTTP)   {http_scheme}://{}/v1/ingest/<tenant>/<run>?family=<f>",
        instance.ingest_http
    );
    eprintln!(
        "  ingest token    {}  (Authorization: Bearer …)",
        ingest_token_path(data_dir).display()
    );
    eprintln!(
        "  archive (gRPC)  {}  (operator token in {}/up.json)",
        instance.archive_grpc,
        data_dir.display()
    );
    eprintln!("  archive store   {archive_url}");
    if !args.quiet {
        eprintln!("  channel         terminal (this window)");
    }
    for c in &instance.channels {
        match &c.web {
            Some(web) => eprintln!(
                "  channel         {}: {http_scheme}://{web}/?token={}  (ProjectorService {})",
                c.name,
                page_tokens.get(&c.name).map_or("", String::as_str),
                c.grpc
            ),
            None => eprintln!(
                "  channel         {} ({}; ProjectorService {})",
                c.name, c.kind, c.grpc
            ),
        }
    }
    if tls {
        eprintln!(
            "  TLS             every server above{}; clients: --ca <CA certificate>{}",
            if mtls {
                ", client certificates required"
            } else {
                ""
            },
            if mtls {
                " --client-cert <cert> --client-key <key>"
            } else {
                ""
            }
        );
    }
    eprintln!(
        "try: streamgate ingest capture.sse --family f1 --run r1 && streamgate replay r1 --json"
    );
    eprintln!("     streamgate tail   (follow runs live through a channel)");
}

#[cfg(test)]
mod tests {
    use super::first_failure;
    use std::time::Duration;

    #[tokio::test]
    async fn the_first_task_to_fail_names_its_service_and_one_that_ends_well_does_not() {
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async { Ok(()) });
        set.spawn(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            anyhow::bail!("the archive cannot take writes again")
        });
        let reason = first_failure("archiver", &mut set).await;
        assert_eq!(
            reason,
            "the archiver stopped: the archive cannot take writes again"
        );
        let mut quiet = tokio::task::JoinSet::new();
        quiet.spawn(async { Ok(()) });
        let waited = tokio::time::timeout(
            Duration::from_millis(50),
            first_failure("archiver", &mut quiet),
        )
        .await;
        assert!(waited.is_err(), "no task failed, so no reason to stop");
    }
}

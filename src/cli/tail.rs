//! `streamgate tail`: the terminal channel (spec tier C) as a client of a projector
//! channel's `ProjectorService`. It watches every run of the channel in one stream
//! (`Watch`: active runs replayed, then every event live, so a run that starts and ends
//! within milliseconds is seen whole) and renders the events itself through the
//! projection core at the status-line tier — the same rendering `streamgate up` shows
//! (`terminal`): a live status line per run on a TTY, then the settle summary, notices
//! and the final answer as lasting lines.
//!
//! The events arrive display-safe: the channel passes them through the projection's one
//! redactor (thinking, commentary and tool text masked on accumulated text, finals
//! verbatim), so neither the rendering nor `--raw-events` can show a secret.
//!
//! Without `--addr` it finds the local `streamgate up` through `<data dir>/up.json` and
//! the channel's token in `<data dir>/channel-<name>.token`, and looks both up again on
//! every reconnect: a restarted `up` listens elsewhere with a new token.
//!
//! Reconnects (spec §7.3): each run's projection lives here, so after a broken stream the
//! watch resumes each open run from its `last_seq` (`lastRenderedSeq`); the server replays
//! from the next seq without gaps, and anything at or below `last_seq` would be ignored
//! by the projection anyway — no duplicate, no gap. A run that ended while disconnected
//! gets no progress replay (spec §7.3); tail says so.

use super::channel_client::{Client, Target};
use super::discover::{Instance, DEFAULT_DATA_DIR};
use crate::terminal::{print_event, print_ops, STATUS_TIER};
use anyhow::Result;
use std::collections::{HashMap, HashSet};
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;
use streamgate_grammar::RunEvent;
use streamgate_projection::{DraftKey, Op, Reasoning, RunProjection, Settings, Verbose};
use streamgate_proto::v1;
use tokio_util::sync::CancellationToken;

/// Flags of `streamgate tail`.
#[derive(Debug, Clone, clap::Args)]
pub struct TailArgs {
    /// ProjectorService address of the channel (default: the local `streamgate up`'s).
    #[arg(long, env = "STREAMGATE_PROJECTOR_ADDR")]
    pub addr: Option<String>,
    /// The channel's bearer token (default: the local instance's token file).
    #[arg(long, env = "STREAMGATE_CHANNEL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Channel of the local instance (default: its web channel, else its first).
    #[arg(long)]
    pub channel: Option<String>,
    /// Follow this run only: wait for it to start, exit when it ends.
    #[arg(long)]
    pub run: Option<String>,
    /// Only runs of this tenant (a run id is unique only within its tenant; without it,
    /// every tenant's runs, and `--run` names the only tenant with that run id).
    #[arg(long)]
    pub tenant: Option<String>,
    /// `/reasoning` for this terminal: off, on (`stream` shows as `on`: a status line).
    #[arg(long, default_value = "off")]
    pub reasoning: Reasoning,
    /// `/verbose` for this terminal: off, on (`full` shows as `on`).
    #[arg(long, default_value = "on")]
    pub verbose: Verbose,
    /// Print every event as one line instead of the status-line rendering.
    #[arg(long)]
    pub raw_events: bool,
    /// TLS to the channel.
    #[command(flatten)]
    pub tls: streamgate_runtime::serve::ClientTlsArgs,
    /// Data dir of the local instance to find.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

/// Output mode shared by every run's follower.
#[derive(Debug, Clone, Copy)]
struct View {
    tty: bool,
    raw: bool,
}

/// Reconnect pacing: from 100 ms, doubling, at most 2 s.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(100))
    }

    /// Waits the current delay (or until `stop`); false when stopped.
    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        tokio::select! {
            () = stop.cancelled() => false,
            () = tokio::time::sleep(d) => true,
        }
    }
}

/// Connects, retrying until it works or `stop` fires. Says once on stderr that it is
/// waiting, and why.
async fn connect(target: &Target, stop: &CancellationToken) -> Option<Client> {
    let mut backoff = Backoff::new();
    let mut told = false;
    loop {
        match target.connect().await {
            Ok(c) => return Some(c),
            Err(e) => {
                if !told {
                    eprintln!("streamgate tail: {e:#}; retrying…");
                    told = true;
                }
                if !backoff.wait(stop).await {
                    return None;
                }
            }
        }
    }
}

/// A run: (tenant, run id) — a run id is unique only within its tenant.
type RunKey = (String, String);

/// The runs this terminal renders, each with its own projection.
struct Runs {
    only: Option<String>,
    tenant: Option<String>,
    settings: Settings,
    view: View,
    open: HashMap<RunKey, RunProjection>,
}

impl Runs {
    /// Renders one event; true when it ended the run `--run` asked for.
    fn render(&mut self, ev: &RunEvent) -> bool {
        let run = &ev.envelope.run_id;
        if self.only.as_ref().is_some_and(|want| want != run)
            || self
                .tenant
                .as_ref()
                .is_some_and(|want| *want != ev.envelope.tenant)
        {
            return false;
        }
        let key = (ev.envelope.tenant.clone(), run.clone());
        let proj = self.open.entry(key.clone()).or_insert_with(|| {
            eprintln!(
                "streamgate tail: following run {run}{}",
                ev.envelope
                    .session_key
                    .as_deref()
                    .map(|s| format!(" (chat {s})"))
                    .unwrap_or_default()
            );
            RunProjection::for_run(&ev.envelope.tenant, run)
        });
        // The server sends each seq once, in order; a seq already rendered (a replay
        // overlapping the last connection) is skipped here as the projection would.
        if ev.event.seq <= proj.last_seq() {
            return false;
        }
        let ops = proj.apply_run_event(ev, &self.settings, STATUS_TIER);
        if self.view.raw {
            print_event(ev, self.view.tty);
        } else {
            print_ops(run, &ops, self.view.tty);
        }
        if ev.event.is_terminal() {
            self.open.remove(&key);
            return self.only.is_some();
        }
        false
    }

    /// After a reconnect: runs followed before that are no longer active ended while
    /// this terminal was away (no progress replay, spec §7.3).
    fn forget_ended(&mut self, active: &HashSet<RunKey>) {
        self.open.retain(|key, proj| {
            let run = &key.1;
            if active.contains(key) {
                return true;
            }
            eprintln!(
                "streamgate tail: run {run} ended while disconnected (after seq {}); \
                 `streamgate replay {run}` shows the rest",
                proj.last_seq()
            );
            false
        });
    }
}

/// How one `Watch` stream ended.
enum Ended {
    /// `--run`'s run ended, or Ctrl-C.
    Done,
    /// The stream broke: watch again with the last rendered seqs.
    Broken,
}

/// How long a reconnecting tail waits for its runs to show up as active again: a
/// restarted channel recovers its runs in flight shortly after it starts listening.
const RECOVERY_GRACE: Duration = Duration::from_secs(5);

/// The channel's active runs, asked until every run of `open` is among them or
/// [`RECOVERY_GRACE`] has passed; `None` when the channel cannot be asked.
async fn active_among(
    client: &mut Client,
    open: &HashMap<RunKey, RunProjection>,
    stop: &CancellationToken,
) -> Option<HashSet<RunKey>> {
    let deadline = tokio::time::Instant::now() + RECOVERY_GRACE;
    loop {
        let active: HashSet<RunKey> = client
            .list_active_runs(v1::ListActiveRunsRequest {})
            .await
            .ok()?
            .into_inner()
            .runs
            .into_iter()
            .map(|r| (r.tenant, r.run_id))
            .collect();
        if open.keys().all(|r| active.contains(r)) || tokio::time::Instant::now() >= deadline {
            return Some(active);
        }
        tokio::select! {
            () = stop.cancelled() => return Some(active),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// Renders one `Watch` stream into `runs`.
async fn watch_once(client: &mut Client, runs: &mut Runs, stop: &CancellationToken) -> Ended {
    if !runs.open.is_empty() {
        let Some(active) = active_among(client, &runs.open, stop).await else {
            return Ended::Broken;
        };
        runs.forget_ended(&active);
        for ((_, run), proj) in &runs.open {
            eprintln!(
                "streamgate tail: run {run} resumed after seq {}",
                proj.last_seq()
            );
        }
    }
    let after = runs
        .open
        .iter()
        .map(|((tenant, run_id), proj)| v1::RunSeq {
            tenant: tenant.clone(),
            run_id: run_id.clone(),
            seq: proj.last_seq(),
        })
        .collect();
    let request = v1::WatchRequest {
        after_seq: HashMap::new(),
        after,
    };
    let mut stream = match client.watch(request).await {
        Ok(s) => s.into_inner(),
        Err(_) => return Ended::Broken,
    };
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => return Ended::Done,
            m = stream.message() => m,
        };
        let ev = match msg {
            Ok(Some(e)) => e,
            Ok(None) | Err(_) => return Ended::Broken,
        };
        let Ok(ev) = RunEvent::try_from(ev) else {
            continue;
        };
        if runs.render(&ev) {
            return Ended::Done;
        }
    }
}

/// `--run X` for a run that is not active: when the channel remembers it ended, prints
/// its final answer and says so (true: nothing left to wait for); otherwise says that it
/// waits, and how to see a run that ended longer ago.
async fn ended_already(client: &mut Client, run: &str, tenant: Option<&str>, tty: bool) -> bool {
    let active = client
        .list_active_runs(v1::ListActiveRunsRequest {})
        .await
        .is_ok_and(|r| {
            r.into_inner()
                .runs
                .iter()
                .any(|r| r.run_id == run && tenant.is_none_or(|t| t == r.tenant))
        });
    if active {
        return false;
    }
    match client
        .get_ended_run(v1::GetEndedRunRequest {
            run_id: run.to_owned(),
            tenant: tenant.unwrap_or_default().to_owned(),
        })
        .await
    {
        Ok(ended) => {
            let ended = ended.into_inner();
            let ops: Vec<Op> = ended
                .final_text
                .into_iter()
                .map(|text| Op::Final {
                    key: DraftKey {
                        run_id: run.to_owned(),
                        tenant: ended.tenant.clone(),
                    },
                    text,
                    truncated: false,
                    suffix: None,
                    seq: 0,
                })
                .collect();
            if ops.is_empty() {
                eprintln!("streamgate tail: run {run} has ended without a final answer");
            } else {
                print_ops(run, &ops, tty);
            }
            eprintln!(
                "streamgate tail: run {run} has ended; `streamgate replay {run}` shows all of it"
            );
            true
        }
        Err(_) => {
            eprintln!(
                "streamgate tail: run {run} is not active on this channel; waiting for it to \
                 start (if it ended earlier, `streamgate replay {run}` shows it)"
            );
            false
        }
    }
}

/// Runs `streamgate tail` until Ctrl-C (or, with `--run`, until that run ends).
pub async fn run(args: TailArgs) -> Result<()> {
    let stop = streamgate_runtime::shutdown::on_signal();
    let target = Target {
        addr: args.addr.clone(),
        token: args.token.clone(),
        channel: args.channel.clone(),
        data_dir: args.data_dir.clone(),
        tls: args.tls.clone(),
    };
    // Fail fast on what retrying cannot fix (no such channel, no token file) only when
    // an instance is there to ask; a missing one may still be starting.
    if args.addr.is_none() && Instance::read(&args.data_dir).is_ok() {
        target.resolve()?;
    }
    let mut runs = Runs {
        only: args.run.clone(),
        tenant: args.tenant.clone(),
        settings: Settings {
            reasoning: args.reasoning,
            verbose: args.verbose,
            ..Settings::default()
        },
        view: View {
            tty: std::io::stdout().is_terminal(),
            raw: args.raw_events,
        },
        open: HashMap::new(),
    };
    let mut backoff = Backoff::new();
    let mut first = true;
    while let Some(mut client) = connect(&target, &stop).await {
        if let (Some(run), true) = (args.run.as_deref(), first) {
            first = false;
            if ended_already(&mut client, run, args.tenant.as_deref(), runs.view.tty).await {
                break;
            }
        }
        match watch_once(&mut client, &mut runs, &stop).await {
            Ended::Done => break,
            // `up` restarted or went away: find it again.
            Ended::Broken => {
                if !backoff.wait(&stop).await {
                    break;
                }
            }
        }
    }
    Ok(())
}

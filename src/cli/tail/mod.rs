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
//! What it prints ([`screen`]): on a TTY a live block, one line per open run (its
//! thinking, current tool or last commentary, redrawn in place), with each run's final
//! answer rendered for the terminal above it ([`markdown`]: headings bold, code dimmed,
//! lists indented), in colour unless `NO_COLOR` is set; piped, only the lasting lines.
//! `--json` prints each display-safe event as one JSON line instead, `--raw-events` as a
//! short human line. Notices that only say what this terminal cannot show are not
//! printed.
//!
//! Reconnects (spec §7.3): each run's projection lives here, so after a broken stream the
//! watch resumes each open run from its `last_seq` (`lastRenderedSeq`); the server replays
//! from the next seq without gaps, and anything at or below `last_seq` would be ignored
//! by the projection anyway — no duplicate, no gap. A run that ended while disconnected
//! gets no progress replay (spec §7.3); tail says so.
//!
//! Every few seconds it also asks for the channel's parked finals (a chat API that failed
//! a final until its retries ran out) and prints each once, with the command that sends
//! it again.

mod markdown;
mod screen;

use super::channel_client::{ChannelFlags, Client, Target};
use super::discover::Instance;
use crate::terminal::{print_event, print_ops, STATUS_TIER};
use anyhow::Result;
use screen::Screen;
use std::collections::{HashMap, HashSet};
use std::io::IsTerminal as _;
use std::time::Duration;
use streamgate_grammar::RunEvent;
use streamgate_projection::{DraftKey, Op, Reasoning, RunProjection, Settings, Verbose};
use streamgate_proto::v1;
use tokio_util::sync::CancellationToken;

/// Flags of `streamgate tail`.
#[derive(Debug, Clone, clap::Args)]
pub struct TailArgs {
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
    #[arg(long, conflicts_with = "json")]
    pub raw_events: bool,
    /// Print every (display-safe) event as one JSON line, as `replay --json` does.
    #[arg(long)]
    pub json: bool,
    /// Where the channel is.
    #[command(flatten)]
    pub at: ChannelFlags,
}

/// Output mode shared by every run's follower.
#[derive(Debug, Clone, Copy)]
struct View {
    tty: bool,
    raw: bool,
    json: bool,
}

/// Reconnect pacing: from 100 ms, doubling, at most 2 s (backon's exponential backoff).
struct Backoff(backon::ExponentialBackoff);

impl Backoff {
    fn new() -> Backoff {
        use backon::BackoffBuilder as _;
        Backoff(
            backon::ExponentialBuilder::new()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(2))
                .without_max_times()
                .build(),
        )
    }

    /// Waits the current delay (or until `stop`); false when stopped.
    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let d = self.0.next().unwrap_or(Duration::from_secs(2));
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
                    eprintln!("streamgate tail: {}; retrying…", unreachable(target, &e));
                    told = true;
                }
                if !backoff.wait(stop).await {
                    return None;
                }
            }
        }
    }
}

/// One line on why the channel cannot be reached: no local instance, or the address
/// refusing (the raw error of a missing `up.json` says only "No such file or directory").
fn unreachable(target: &Target, e: &anyhow::Error) -> String {
    if target.addr.is_none() && Instance::read(&target.data_dir).is_err() {
        return format!(
            "no streamgate instance is running with data dir {} (start one with `streamgate up`)",
            target.data_dir.display()
        );
    }
    format!("cannot reach the channel ({e:#}); is `streamgate up` running?")
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
    screen: Screen,
    /// Parked finals already reported (tenant, run, chat).
    parked: HashSet<(String, String, String)>,
}

impl Runs {
    /// Says something about the follow itself: dimmed above the live block on a TTY, on
    /// stderr otherwise.
    fn say(&mut self, msg: &str) {
        if self.view.tty && !self.view.json && !self.view.raw {
            let line = self.screen.style.dim(&format!("streamgate tail: {msg}"));
            self.screen.lasting(&line);
        } else {
            eprintln!("streamgate tail: {msg}");
        }
    }

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
        if !self.open.contains_key(&key) {
            if !self.view.tty {
                let chat = ev
                    .envelope
                    .session_key
                    .as_deref()
                    .map(|s| format!(" (chat {s})"))
                    .unwrap_or_default();
                self.say(&format!("following run {run}{chat}"));
            }
            self.open.insert(
                key.clone(),
                RunProjection::for_run(&ev.envelope.tenant, run),
            );
        }
        let Some(proj) = self.open.get_mut(&key) else {
            return false;
        };
        // The server sends each seq once, in order; a seq already rendered (a replay
        // overlapping the last connection) is skipped here as the projection would.
        if ev.event.seq <= proj.last_seq() {
            return false;
        }
        let ops = proj.apply_run_event(ev, &self.settings, STATUS_TIER);
        if self.view.json {
            println!("{}", ev.to_json());
        } else if self.view.raw {
            print_event(ev, self.view.tty);
        } else {
            self.show(run, ev, &ops);
        }
        if ev.event.is_terminal() {
            self.open.remove(&key);
            self.screen.done(run);
            return self.only.is_some();
        }
        false
    }

    /// The status-line rendering of one event's ops: the live line, then lasting lines.
    fn show(&mut self, run: &str, ev: &RunEvent, ops: &[Op]) {
        let style = self.screen.style;
        let mut live = None;
        for op in ops {
            match op {
                Op::Typing => {}
                Op::Draft { text, .. } => {
                    live = text
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .map(str::to_owned);
                }
                Op::Settle { text, .. }
                | Op::Retract {
                    placeholder: text, ..
                } => {
                    let line = format!("{} {text}", style.cyan(run));
                    self.screen.done(run);
                    self.screen.lasting(&line);
                }
                Op::Dismiss { .. } => self.screen.done(run),
                Op::Final { text, suffix, .. } => {
                    let mut block = format!(
                        "{} {}\n",
                        style.bold(&style.cyan(run)),
                        style.green("✅ final answer:")
                    );
                    block.push_str(&markdown::render(text, style, "      "));
                    if let Some(s) = suffix {
                        block.push_str(&format!("\n      {}", style.yellow(s)));
                    }
                    self.screen.done(run);
                    self.screen.lasting(&block);
                }
                // What this terminal cannot show is no news to its reader.
                Op::Notice { text, .. } if text.starts_with("ℹ️") => {}
                Op::Notice { text, .. } => {
                    let line = format!("{} {}", style.cyan(run), style.red(text));
                    self.screen.lasting(&line);
                }
            }
        }
        if ev.event.is_terminal() {
            return;
        }
        // Nothing to show yet (thinking hidden, a tool starting): say what it is doing.
        let line = live.or_else(|| match &ev.event.data {
            streamgate_grammar::EventData::Thinking(_) => Some("🧠 thinking…".to_owned()),
            streamgate_grammar::EventData::Lifecycle(_) => Some("starting…".to_owned()),
            _ => None,
        });
        if let Some(line) = line {
            self.screen.live(run, &line);
        }
    }

    /// Reports finals the channel parked since the last look (their retries ran out: the
    /// chat went on without them), and parked ones that have been delivered since.
    fn parked_now(&mut self, finals: Vec<v1::ParkedFinal>) {
        let now: HashSet<(String, String, String)> = finals
            .iter()
            .map(|f| (f.tenant.clone(), f.run_id.clone(), f.chat_id.clone()))
            .collect();
        for f in finals {
            let key = (f.tenant.clone(), f.run_id.clone(), f.chat_id.clone());
            if self.parked.contains(&key) {
                continue;
            }
            let style = self.screen.style;
            let line = format!(
                "{} {}",
                style.cyan(&f.run_id),
                style.red(&format!(
                    "⚠ final parked in chat {} after its retries ({}); `streamgate parked <channel> --resend` sends it again",
                    f.chat_id, f.error
                ))
            );
            self.screen.lasting(&line);
            self.parked.insert(key);
        }
        let delivered: Vec<_> = self.parked.difference(&now).cloned().collect();
        for key in delivered {
            self.parked.remove(&key);
            self.say(&format!(
                "run {}: its parked final is no longer parked",
                key.1
            ));
        }
    }

    /// After a reconnect: runs followed before that are no longer active ended while
    /// this terminal was away (no progress replay, spec §7.3).
    fn forget_ended(&mut self, active: &HashSet<RunKey>) {
        let gone: Vec<(RunKey, u64)> = self
            .open
            .iter()
            .filter(|(key, _)| !active.contains(*key))
            .map(|(key, proj)| (key.clone(), proj.last_seq()))
            .collect();
        for (key, seq) in gone {
            let run = &key.1;
            self.open.remove(&key);
            self.screen.done(run);
            self.say(&format!(
                "run {run} ended while disconnected (after seq {seq}); \
                 `streamgate replay {run}` shows the rest"
            ));
        }
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

/// How often tail asks the channel for parked finals.
const PARKED_CHECK: Duration = Duration::from_secs(5);

/// Renders one `Watch` stream into `runs`.
async fn watch_once(client: &mut Client, runs: &mut Runs, stop: &CancellationToken) -> Ended {
    if !runs.open.is_empty() {
        let Some(active) = active_among(client, &runs.open, stop).await else {
            return Ended::Broken;
        };
        runs.forget_ended(&active);
        let resumed: Vec<String> = runs
            .open
            .iter()
            .map(|((_, run), proj)| format!("run {run} resumed after seq {}", proj.last_seq()))
            .collect();
        for msg in resumed {
            runs.say(&msg);
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
    let mut parked_check = tokio::time::interval(PARKED_CHECK);
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => return Ended::Done,
            _ = parked_check.tick(), if !runs.view.json => {
                // A channel without the call (older) simply has nothing to report.
                if let Ok(r) = client.list_parked(v1::ListParkedRequest {}).await {
                    runs.parked_now(r.into_inner().finals);
                }
                continue;
            }
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
    let target = args.at.target(args.channel.clone());
    // Fail fast on what retrying cannot fix (no such channel, no token file) only when
    // an instance is there to ask; a missing one may still be starting.
    if args.at.addr.is_none() && Instance::read(&args.at.data_dir).is_ok() {
        target.resolve()?;
    }
    let tty = std::io::stdout().is_terminal();
    let mut runs = Runs {
        only: args.run.clone(),
        tenant: args.tenant.clone(),
        settings: Settings {
            reasoning: args.reasoning,
            verbose: args.verbose,
            ..Settings::default()
        },
        view: View {
            tty,
            raw: args.raw_events,
            json: args.json,
        },
        open: HashMap::new(),
        screen: Screen::new(tty, tty && std::env::var_os("NO_COLOR").is_none()),
        parked: HashSet::new(),
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

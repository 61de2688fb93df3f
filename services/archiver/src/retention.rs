//! Retention (docs/architecture.md §5): per-tenant policies that, after N days, replace a run's
//! thinking text and tool payloads with stubs holding their sizes and hashes (the run's
//! answers, tools, timings and usage stay; folds and timelines still work) and drop its
//! raw chunks, and after M days drop the whole run.
//!
//! Policies come from `--retention` / `STREAMGATE_RETENTION`: `<tenant>:strip=<N>d,drop=<M>d`,
//! `;`-separated, `*` for every tenant without a policy of its own. The archiver enforces
//! them every `--retention-interval-secs` (replicas may overlap: both stages are
//! idempotent), and `streamgate retention` shows them and what is due, or applies them now.

use std::sync::Arc;
use std::time::Duration;
use streamgate_archive::{ArchiveError, RunFilter, RunRecord, Store};

/// One tenant's policy (or everyone's, `tenant: None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The tenant, `None` for `*`.
    pub tenant: Option<String>,
    /// Age after which thinking text and tool payloads become stubs.
    pub strip_after: Option<Duration>,
    /// Age after which the run goes.
    pub drop_after: Option<Duration>,
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let days = |d: &Duration| format!("{}d", d.as_secs() / 86_400);
        let parts: Vec<String> = [
            self.strip_after
                .as_ref()
                .map(|d| format!("strip={}", days(d))),
            self.drop_after
                .as_ref()
                .map(|d| format!("drop={}", days(d))),
        ]
        .into_iter()
        .flatten()
        .collect();
        write!(
            f,
            "{}:{}",
            self.tenant.as_deref().unwrap_or("*"),
            parts.join(",")
        )
    }
}

/// Every configured policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies(pub Vec<Policy>);

impl std::str::FromStr for Policies {
    type Err = String;

    /// `acme:strip=7d,drop=90d;*:strip=30d` (also newline-separated).
    fn from_str(s: &str) -> Result<Policies, String> {
        let mut out = Vec::new();
        for spec in s
            .split([';', '\n'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (tenant, rules) = spec
                .rsplit_once(':')
                .ok_or_else(|| format!("`{spec}`: expected <tenant|*>:strip=<N>d,drop=<M>d"))?;
            let mut policy = Policy {
                tenant: (tenant != "*").then(|| tenant.to_owned()),
                strip_after: None,
                drop_after: None,
            };
            for rule in rules.split(',').map(str::trim) {
                let (key, value) = rule
                    .split_once('=')
                    .ok_or_else(|| format!("`{rule}`: expected strip=<N>d or drop=<M>d"))?;
                let days: u64 = value
                    .strip_suffix('d')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("`{value}`: a number of days, like 30d"))?;
                let age = Some(Duration::from_secs(days * 86_400));
                match key {
                    "strip" => policy.strip_after = age,
                    "drop" => policy.drop_after = age,
                    _ => return Err(format!("`{key}`: the rules are strip and drop")),
                }
            }
            if out.iter().any(|p: &Policy| p.tenant == policy.tenant) {
                return Err(format!("two policies for `{tenant}`"));
            }
            out.push(policy);
        }
        Ok(Policies(out))
    }
}

impl Policies {
    /// No policy at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The policy that governs `tenant`'s runs.
    fn governs(&self, policy: &Policy, tenant: &str) -> bool {
        match &policy.tenant {
            Some(t) => t == tenant,
            None => !self.0.iter().any(|p| p.tenant.as_deref() == Some(tenant)),
        }
    }
}

/// What one pass did (or, without `apply`, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Runs whose thinking and tool payloads became stubs.
    pub stripped_runs: u64,
    /// Events rewritten as stubs.
    pub stripped_events: u64,
    /// Runs dropped.
    pub dropped_runs: u64,
    /// Events dropped with them.
    pub dropped_events: u64,
}

/// One pass of every policy at `now_ms`: drops first (a run due for both is dropped,
/// not stripped first), then strips.
pub async fn enforce(
    store: &dyn Store,
    policies: &Policies,
    now_ms: i64,
    apply: bool,
) -> Result<RetentionReport, ArchiveError> {
    let mut report = RetentionReport::default();
    for policy in &policies.0 {
        if let Some(age) = policy.drop_after {
            for run in due(store, policies, policy, cutoff(now_ms, age), false).await? {
                report.dropped_runs += 1;
                report.dropped_events += match apply {
                    true => store.drop_run(&run.tenant, &run.run_id).await?,
                    false => run.event_count,
                };
            }
        }
        if let Some(age) = policy.strip_after {
            for run in due(store, policies, policy, cutoff(now_ms, age), true).await? {
                report.stripped_runs += 1;
                if apply {
                    report.stripped_events +=
                        store.strip_run(&run.tenant, &run.run_id, now_ms).await?;
                }
            }
        }
    }
    Ok(report)
}

fn cutoff(now_ms: i64, age: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
}

/// The runs `policy` governs that started before `before_ms` (only unstripped ones for
/// the strip stage).
async fn due(
    store: &dyn Store,
    policies: &Policies,
    policy: &Policy,
    before_ms: i64,
    unstripped: bool,
) -> Result<Vec<RunRecord>, ArchiveError> {
    let mut filter = RunFilter {
        tenant: policy.tenant.clone(),
        until_ts_ms: Some(before_ms),
        unstripped,
        limit: 1000,
        ..RunFilter::default()
    };
    let mut out = Vec::new();
    loop {
        let page = store.list_runs(&filter).await?;
        out.extend(
            page.runs
                .into_iter()
                .filter(|r| policies.governs(policy, &r.tenant)),
        );
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => return Ok(out),
        }
    }
}

/// Enforces `policies` every `interval` until `shutdown`, counting what it does.
pub async fn run(
    store: Arc<dyn Store>,
    policies: Policies,
    interval: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    if policies.is_empty() {
        return Ok(());
    }
    tracing::info!(policies = %policies.0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "), "retention enforced");
    let mut tick = tokio::time::interval(interval.max(Duration::from_secs(1)));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        match enforce(
            &*store,
            &policies,
            streamgate_runtime::clock::now_ms(),
            true,
        )
        .await
        {
            Ok(r) => {
                metrics::counter!("streamgate_archiver_retention_stripped_runs_total")
                    .increment(r.stripped_runs);
                metrics::counter!("streamgate_archiver_retention_dropped_runs_total")
                    .increment(r.dropped_runs);
                if r.stripped_runs + r.dropped_runs > 0 {
                    tracing::info!(?r, "retention pass");
                }
            }
            Err(e) => tracing::warn!(error = %e, "retention pass failed; next pass retries"),
        }
    }
}

//! `verify` and `backfill` against both stores: an adapter change simulated by archiving,
//! for some runs, events an "older adapter" made (today's events altered, stamped with
//! adapter version 0) next to their real raw chunks.
//!
//! Every fixture of every family is archived the way the live pipeline archives it (raw
//! chunks of 4 KiB, the events each chunk yields enveloped with its ingest time, then the
//! close marker). Verify must report exactly the altered runs, with the part of the run
//! the alteration touched; `backfill --apply` writes them as generation 2; a second
//! backfill writes nothing; replay reads generation 2 and generation 1 stays readable.

use std::path::Path;
use std::sync::Arc;
use streamgate_archive::{
    open_store, ArchivedEvent, GenerationOutcome, NewGeneration, Provenance, RawChunkRecord,
    RunProvenance, RunStatusKind, Store,
};
use streamgate_archiver::history::backfill::{backfill_run, Applied};
use streamgate_archiver::history::verify::verify_run;
use streamgate_archiver::history::{runs_in_scope, Scope, Verdict};
use streamgate_grammar::{Envelope, EventData, RunEvent};
use streamgate_testkit::PgDatabase;
use streamgate_wire::{Close, FamilyChoice, Normalizer};

const MAX_PAYLOAD: usize = 1 << 20;
const TENANT: &str = "acme";

/// How the "older adapter" differed for a run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    None,
    /// Its final answer lacked the last character.
    FinalAnswer,
    /// It emitted no terminal lifecycle event.
    DroppedEnd,
    /// Its first thinking delta was different.
    Thinking,
}

struct Archived {
    run_id: String,
    change: Change,
    today: Vec<RunEvent>,
}

/// Every fixture capture: (run id, family, bytes).
fn fixtures() -> Vec<(String, String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(index) = std::fs::read_to_string(dir.join("index.tsv")) else {
            continue;
        };
        for line in index.lines().skip(1) {
            let cols: Vec<&str> = line.split('\t').collect();
            let (Some(family), Some(capture)) = (cols.get(1), cols.get(2)) else {
                continue;
            };
            let bytes = std::fs::read(dir.join(capture)).unwrap();
            let id = format!("{}-{}", dir.file_name().unwrap().to_string_lossy(), capture)
                .replace(['.', '/'], "_");
            out.push((id, (*family).to_owned(), bytes));
        }
    }
    out
}

/// What the live normalizer archives for a capture: raw chunks and the events each
/// yields, enveloped as the run table envelopes them.
fn live(
    run_id: &str,
    family: &str,
    bytes: &[u8],
    close: bool,
) -> (Vec<RawChunkRecord>, Vec<RunEvent>) {
    let mut n = Normalizer::new(family.parse().unwrap_or(FamilyChoice::Auto));
    let mut chunks = Vec::new();
    let mut events = Vec::new();
    let pieces: Vec<&[u8]> = bytes.chunks(4096).collect();
    let total = pieces.len() + usize::from(close);
    for i in 0..total {
        let body = pieces.get(i).copied().unwrap_or_default();
        let is_close = close && i == total - 1;
        let ts = 1_700_000_000_000 + i as i64;
        n.feed(body);
        if is_close {
            n.close(Close::Normal);
        }
        chunks.push(RawChunkRecord {
            tenant: TENANT.into(),
            run_id: run_id.into(),
            chunk: i as u64,
            family: family.into(),
            ingest_ts_ms: ts,
            close: is_close.then(|| "normal".to_owned()),
            body: body.to_vec(),
        });
        let envelope = Envelope {
            tenant: TENANT.into(),
            session_key: Some("s1".into()),
            run_id: run_id.into(),
            ts_ms: ts,
        };
        events.extend(n.drain().map(|event| RunEvent {
            envelope: envelope.clone(),
            event,
        }));
    }
    (chunks, events)
}

/// Today's events as an older adapter would have made them, or `None` when the run has
/// nothing that change could touch.
fn older(today: &[RunEvent], change: Change) -> Option<Vec<RunEvent>> {
    let mut old = today.to_vec();
    match change {
        Change::None => return Some(old),
        Change::FinalAnswer => {
            let ev = old.iter_mut().rev().find(|e| {
                matches!(&e.event.data, EventData::Assistant(a)
                    if a.phase == Some(streamgate_grammar::AssistantPhase::FinalAnswer)
                        && a.text.as_ref().is_some_and(|t| t.chars().count() > 1))
            })?;
            if let EventData::Assistant(a) = &mut ev.event.data {
                let t = a.text.as_mut()?;
                t.pop();
            }
        }
        Change::DroppedEnd => {
            let last = old.last()?;
            if !matches!(&last.event.data, EventData::Lifecycle(_)) {
                return None;
            }
            old.pop();
        }
        Change::Thinking => {
            let ev = old.iter_mut().find(|e| {
                matches!(&e.event.data, EventData::Thinking(t) if t.delta.as_ref().is_some_and(|d| !d.is_empty()))
            })?;
            if let EventData::Thinking(t) = &mut ev.event.data {
                t.delta.as_mut()?.push_str(" (as the old adapter read it)");
            }
        }
    }
    Some(old)
}

fn stamp(run_id: &str, version: u32) -> RunProvenance {
    RunProvenance {
        tenant: TENANT.into(),
        run_id: run_id.into(),
        provenance: Provenance {
            adapter: "test".into(),
            adapter_version: version,
            grammar_version: 1,
        },
    }
}

/// Archives every fixture; some as an older adapter made them. Returns what was archived.
async fn archive(store: &dyn Store) -> Vec<Archived> {
    let mut out = Vec::new();
    let changes = [Change::FinalAnswer, Change::DroppedEnd, Change::Thinking];
    for (i, (run_id, family, bytes)) in fixtures().into_iter().enumerate() {
        // Every third run is a candidate for a change.
        let (chunks, today) = live(&run_id, &family, &bytes, true);
        let wanted = if i % 3 == 0 {
            changes[(i / 3) % 3]
        } else {
            Change::None
        };
        let (change, events) = match older(&today, wanted) {
            Some(old) => (wanted, old),
            None => (Change::None, today.clone()),
        };
        store.insert_raw(&chunks).await.unwrap();
        let archived: Vec<ArchivedEvent> = events
            .into_iter()
            .enumerate()
            .map(|(j, event)| ArchivedEvent {
                event,
                journal_seq: 1 + j as u64,
            })
            .collect();
        if !archived.is_empty() {
            store.insert_batch(&archived).await.unwrap();
        }
        let version = if change == Change::None { 1 } else { 0 };
        store
            .record_provenance(&[stamp(&run_id, version)])
            .await
            .unwrap();
        out.push(Archived {
            run_id,
            change,
            today,
        });
    }
    out
}

async fn all_runs(store: &dyn Store) -> Vec<streamgate_archive::RunRecord> {
    let mut runs = Vec::new();
    runs_in_scope(store, &Scope::default(), |page| {
        runs.extend(page);
        async { Ok(true) }
    })
    .await
    .unwrap();
    runs
}

async fn all_events(store: &dyn Store, run_id: &str, generation: Option<u32>) -> Vec<RunEvent> {
    let events = match generation {
        None => store.events_after(TENANT, run_id, 0, 0).await.unwrap(),
        Some(g) => store
            .generation_events_after(TENANT, run_id, g, 0, 0)
            .await
            .unwrap(),
    };
    events.into_iter().map(|e| e.event).collect()
}

fn lines(events: &[RunEvent]) -> Vec<String> {
    events.iter().map(RunEvent::to_json).collect()
}

async fn verify_reports_exactly_the_changed_runs_and_backfill_fixes_them(store: Arc<dyn Store>) {
    let store = &*store;
    let archived = archive(store).await;
    let changed: Vec<&Archived> = archived
        .iter()
        .filter(|a| a.change != Change::None)
        .collect();
    assert!(
        changed.len() >= 20,
        "the fixtures give enough changed runs ({})",
        changed.len()
    );
    for change in [Change::FinalAnswer, Change::DroppedEnd, Change::Thinking] {
        assert!(
            changed.iter().any(|a| a.change == change),
            "{change:?} is simulated"
        );
    }

    // verify: exactly the changed runs differ, each in the part that was changed.
    let runs = all_runs(store).await;
    let with_tokens = runs
        .iter()
        .filter(|r| r.tokens.is_some_and(|t| t.input > 0 && t.output > 0))
        .count();
    assert!(
        with_tokens > 50,
        "most captures report usage ({with_tokens})"
    );
    assert_eq!(runs.len(), archived.len());
    for run in &runs {
        let a = archived.iter().find(|a| a.run_id == run.run_id).unwrap();
        assert_eq!(run.generation, 1);
        let want_version = if a.change == Change::None { 1 } else { 0 };
        assert_eq!(
            run.provenance.as_ref().map(|p| p.adapter_version),
            Some(want_version)
        );
        // Accounting equals the usage the capture reported (per field the largest).
        let usages = older(&a.today, a.change)
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.event.data {
                EventData::Lifecycle(l) => l
                    .usage
                    .map(|u| streamgate_grammar::usage::Tokens::from_usage(&u)),
                _ => None,
            });
        let want = usages.reduce(|x, y| x.max(y));
        assert_eq!(run.tokens, want, "{}", run.run_id);
        let (report, kept) = verify_run(store, run, MAX_PAYLOAD, false).await.unwrap();
        assert!(kept.is_none());
        assert!(report.raw_bytes > 0 || a.today.is_empty(), "{}", run.run_id);
        match (&report.verdict, a.change) {
            (Verdict::Identical, Change::None) => {}
            (Verdict::Differs(d), change) if change != Change::None => {
                let part = match change {
                    Change::FinalAnswer => "final answer",
                    Change::DroppedEnd => "lifecycle",
                    _ => "thinking",
                };
                assert_eq!(d.parts, vec![part], "{}: {d:?}", run.run_id);
                assert_eq!(d.events, 1, "{}", run.run_id);
            }
            (v, c) => panic!("{}: verdict {v:?} for change {c:?}", run.run_id),
        }
        assert!(!report.open);
        assert_eq!(
            report.made_today.as_ref().map(|p| p.adapter_version),
            Some(1)
        );
    }

    // backfill --apply: the changed runs get generation 2 (dry run first: nothing).
    for run in &runs {
        let (_, applied) = backfill_run(store, run, MAX_PAYLOAD, false, 5)
            .await
            .unwrap();
        assert_eq!(applied, Applied::Nothing);
    }
    for run in &runs {
        let a = archived.iter().find(|a| a.run_id == run.run_id).unwrap();
        let (_, applied) = backfill_run(store, run, MAX_PAYLOAD, true, 5)
            .await
            .unwrap();
        let want = if a.change == Change::None {
            Applied::Nothing
        } else {
            Applied::Written(2)
        };
        assert_eq!(applied, want, "{}", run.run_id);
    }

    // A second backfill changes nothing; everything verifies identical.
    for run in &all_runs(store).await {
        let (report, applied) = backfill_run(store, run, MAX_PAYLOAD, true, 6)
            .await
            .unwrap();
        assert_eq!(applied, Applied::Nothing, "{}", run.run_id);
        assert_eq!(report.verdict, Verdict::Identical, "{}", run.run_id);
    }

    // Replay reads the latest generation; generation 1 keeps what the older adapter made.
    for a in &changed {
        let run = store.get_run(TENANT, &a.run_id).await.unwrap().unwrap();
        assert_eq!(run.generation, 2);
        let p = run.provenance.clone().unwrap();
        assert_eq!((p.adapter_version, p.grammar_version), (1, 1));
        assert_eq!(run.event_count, a.today.len() as u64);
        assert_eq!(run.session_key.as_deref(), Some("s1"));
        if a.change == Change::DroppedEnd {
            assert_ne!(
                run.status,
                RunStatusKind::Open,
                "the new generation ends the run"
            );
        }
        let latest = all_events(store, &a.run_id, None).await;
        assert_eq!(lines(&latest), lines(&a.today), "{}", a.run_id);
        assert_eq!(
            lines(&all_events(store, &a.run_id, Some(2)).await),
            lines(&a.today)
        );
        let first = all_events(store, &a.run_id, Some(1)).await;
        let older_events = older(&a.today, a.change).unwrap();
        assert_eq!(lines(&first), lines(&older_events), "{}", a.run_id);
        assert!(all_events(store, &a.run_id, Some(3)).await.is_empty());
    }
    // The journal still holds every current event once (positions kept).
    let journal = store.journal_after(0, 0).await.unwrap();
    let total: usize = archived.iter().map(|a| a.today.len()).sum();
    assert_eq!(journal.len(), total);

    // A stale backfill (replacing generation 1 again) writes nothing.
    let a = changed[0];
    let outcome = store
        .write_generation(&NewGeneration {
            tenant: TENANT,
            run_id: &a.run_id,
            replaces: 1,
            events: &a.today,
            provenance: stamp(&a.run_id, 1).provenance,
            at_ms: 7,
        })
        .await
        .unwrap();
    assert_eq!(outcome, GenerationOutcome::Stale { current: 2 });
}

/// An open run that differs is reported but left alone; a run without raw chunks cannot
/// be verified and says so.
async fn open_runs_wait_and_runs_without_raw_chunks_say_so(store: Arc<dyn Store>) {
    let store = &*store;
    let (id, family, bytes) = fixtures().into_iter().find(|(_, f, _)| f == "f1").unwrap();
    let (chunks, today) = live(&id, &family, &bytes, false);
    let old = older(&today, Change::FinalAnswer).or_else(|| older(&today, Change::Thinking));
    let old = old.expect("an f1 fixture with an answer or thinking");
    store.insert_raw(&chunks).await.unwrap();
    let archived: Vec<ArchivedEvent> = old
        .into_iter()
        .filter(|e| !matches!(&e.event.data, EventData::Lifecycle(l) if l.phase != streamgate_grammar::LifecyclePhase::Start))
        .map(|event| ArchivedEvent { event, journal_seq: 1 })
        .collect();
    store.insert_batch(&archived).await.unwrap();
    let run = store.get_run(TENANT, &id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatusKind::Open);
    assert!(run.provenance.is_none(), "nothing recorded what made it");
    let (report, applied) = backfill_run(store, &run, MAX_PAYLOAD, true, 5)
        .await
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Differs(_)));
    assert!(report.open);
    assert_eq!(applied, Applied::SkippedOpen);
    assert_eq!(
        store
            .get_run(TENANT, &id)
            .await
            .unwrap()
            .unwrap()
            .generation,
        1
    );

    // No raw chunks.
    let bare: Vec<ArchivedEvent> = today
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.envelope.run_id = "bare".into();
            ArchivedEvent {
                event: e,
                journal_seq: 2,
            }
        })
        .collect();
    store.insert_batch(&bare).await.unwrap();
    let run = store.get_run(TENANT, "bare").await.unwrap().unwrap();
    let (report, applied) = backfill_run(store, &run, MAX_PAYLOAD, true, 5)
        .await
        .unwrap();
    assert_eq!(report.verdict, Verdict::NoRawChunks);
    assert_eq!(applied, Applied::Nothing);
}

/// Retention: `acme`'s runs (old) get their thinking text and tool payloads replaced by
/// stubs and lose their raw chunks — answers, folds and timelines stay — while every
/// other tenant's old runs are dropped under `*`; a dry run changes nothing and a second
/// pass finds nothing to do.
async fn retention_strips_then_drops(store: Arc<dyn Store>) {
    use streamgate_archiver::retention::{enforce, Policies};
    use streamgate_grammar::RunState;
    let store = &*store;
    let archived = archive(store).await;
    // The same runs under another tenant.
    for a in &archived {
        let run = store.get_run(TENANT, &a.run_id).await.unwrap().unwrap();
        let events: Vec<ArchivedEvent> = store
            .events_after(TENANT, &a.run_id, 0, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|mut e| {
                e.event.envelope.tenant = "globex".into();
                e
            })
            .collect();
        if !events.is_empty() {
            store.insert_batch(&events).await.unwrap();
        }
        assert!(run.stripped_at_ms.is_none());
    }
    let policies: Policies = "acme:strip=30d; *:drop=400d".parse().unwrap();
    let now = 1_700_000_000_000 + 500 * 86_400_000;
    let runs = archived.len() as u64;

    let dry = enforce(store, &policies, now, false).await.unwrap();
    assert_eq!((dry.stripped_runs, dry.dropped_runs), (runs, runs));
    assert!(store
        .get_run("globex", &archived[0].run_id)
        .await
        .unwrap()
        .is_some());

    let done = enforce(store, &policies, now, true).await.unwrap();
    assert_eq!((done.stripped_runs, done.dropped_runs), (runs, runs));
    assert!(done.stripped_events > 0);
    let mut thinking_runs = 0;
    for a in &archived {
        assert!(store.get_run("globex", &a.run_id).await.unwrap().is_none());
        let run = store.get_run(TENANT, &a.run_id).await.unwrap().unwrap();
        assert_eq!(run.stripped_at_ms, Some(now));
        assert!(store
            .raw_chunks(TENANT, &a.run_id)
            .await
            .unwrap()
            .is_empty());
        let kept: Vec<RunEvent> = all_events(store, &a.run_id, None).await;
        let old = older(&a.today, a.change).unwrap();
        assert_eq!(kept.len(), old.len(), "stripping keeps every event");
        let before = RunState::fold(old.iter().map(|e| &e.event));
        let after = RunState::fold(kept.iter().map(|e| &e.event));
        // Answers, tools and segments stay; their texts are stubs.
        assert_eq!(after.final_text, before.final_text, "{}", a.run_id);
        assert_eq!(after.thinking.len(), before.thinking.len(), "{}", a.run_id);
        assert_eq!(after.items.len(), before.items.len(), "{}", a.run_id);
        for (b, k) in before.thinking.iter().zip(&after.thinking) {
            if b.text.len() > 40 {
                thinking_runs += 1;
                let lines = lines(&kept).join("\n");
                assert!(!lines.contains(&b.text), "{}: thinking text kept", a.run_id);
                assert!(k.text.contains("[retention: "), "{}", a.run_id);
            }
        }
        for (b, k) in before.items.iter().zip(&after.items) {
            assert_eq!(b.name, k.name);
        }
    }
    assert!(
        thinking_runs > 5,
        "the fixtures have thinking ({thinking_runs})"
    );

    let again = enforce(store, &policies, now, true).await.unwrap();
    assert_eq!((again.stripped_runs, again.dropped_runs), (0, 0));
}

async fn sqlite() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("archive.db").display());
    let store = open_store(&url).await.unwrap();
    (dir, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_verify_and_backfill() {
    let (_dir, store) = sqlite().await;
    verify_reports_exactly_the_changed_runs_and_backfill_fixes_them(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_and_backfill() {
    let db = PgDatabase::create().await;
    let store = open_store(db.url()).await.unwrap();
    verify_reports_exactly_the_changed_runs_and_backfill_fixes_them(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_open_and_bare_runs() {
    let (_dir, store) = sqlite().await;
    open_runs_wait_and_runs_without_raw_chunks_say_so(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_open_and_bare_runs() {
    let db = PgDatabase::create().await;
    let store = open_store(db.url()).await.unwrap();
    open_runs_wait_and_runs_without_raw_chunks_say_so(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_retention() {
    let (_dir, store) = sqlite().await;
    retention_strips_then_drops(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention() {
    let db = PgDatabase::create().await;
    let store = open_store(db.url()).await.unwrap();
    retention_strips_then_drops(store).await;
}

//! One behavioural suite, run against both backends: a fresh SQLite file in a temp dir
//! and a fresh PostgreSQL database on the local server (127.0.0.1:5432, or
//! `$STREAMGATE_PG_URL`). Every test exists once per backend (`sqlite::*`,
//! `postgres::*`), so the backends cannot drift apart.

mod common;

use common::*;
use std::sync::Arc;
use streamgate_archive::{
    id_hash, open_store, ArchiveError, ArchivedEvent, EraseScope, Erasure, InsertOutcome,
    NewGeneration, Provenance, RawChunkRecord, RunFilter, RunPage, RunProvenance, RunStatusKind,
    Store,
};
use streamgate_grammar::usage::Tokens;
use streamgate_grammar::{Assistant, AssistantPhase, EventData, Json, StopReason};

/// Where a test's store lives; `open` may be called again to test reopening.
enum Backend {
    Sqlite(tempfile::TempDir),
    Postgres(PgDb),
}

impl Backend {
    fn sqlite() -> Backend {
        Backend::Sqlite(tempfile::tempdir().expect("tempdir"))
    }

    async fn postgres() -> Backend {
        Backend::Postgres(PgDb::create().await)
    }

    /// Opens through `open_store`, so the URL dispatch is exercised too.
    async fn open(&self) -> Arc<dyn Store> {
        let url = match self {
            Backend::Sqlite(dir) => format!("sqlite://{}", dir.path().join("archive.db").display()),
            Backend::Postgres(db) => db.url().to_owned(),
        };
        open_store(&url).await.expect("open store")
    }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::sqlite()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::postgres().await).await
                }
            )*
        }
    };
}

both_backends!(
    idempotent_reinsert,
    conflict_is_counted_and_original_kept,
    runs_row_follows_start_to_end,
    runs_row_is_independent_of_batch_order,
    runs_indexes_follow_a_late_session_and_an_earlier_start,
    events_after_and_journal_after_order_and_limit,
    journal_pages_never_split_a_batch_message,
    list_runs_filters_and_cursor_pagination,
    raw_chunks_round_trip_and_idempotent,
    reopen_persists_everything,
    concurrent_overlapping_batches_count_each_event_once,
    same_run_id_under_two_tenants_is_two_runs,
    upgrade_from_version_1_keeps_rows,
    erase_removes_runs_from_every_table_and_audits_without_ids,
    search_finds_runs_by_a_phrase_of_their_answer,
    thinking_search_holds_what_was_indexed_until_retention_or_erasure,
    accounting_merges_usage_across_batches_in_any_order,
    provenance_keeps_the_lowest_versions_seen,
    a_batch_and_its_provenance_commit_together,
);

fn outcome(inserted: u64, duplicates: u64, conflicts: u64) -> InsertOutcome {
    InsertOutcome {
        inserted,
        duplicates,
        conflicts,
    }
}

async fn idempotent_reinsert(backend: Backend) {
    let store = backend.open().await;
    let run = whole_run("t1", "run-a", 1_000, 3, 1);
    assert_eq!(store.insert_batch(&run).await.unwrap(), outcome(5, 0, 0));
    assert_eq!(store.insert_batch(&run).await.unwrap(), outcome(0, 5, 0));

    // A re-publish after the dedupe window has a new stream sequence: same event.
    let republished: Vec<ArchivedEvent> = run
        .iter()
        .map(|e| ArchivedEvent {
            journal_seq: e.journal_seq + 100,
            ..e.clone()
        })
        .collect();
    assert_eq!(
        store.insert_batch(&republished).await.unwrap(),
        outcome(0, 5, 0)
    );

    // A key repeated inside one batch: first inserted, second a duplicate.
    let extra = archived(env("t1", Some("chat-1"), "run-b", 7), 1, delta("x"), 50);
    let batch = vec![extra.clone(), extra.clone()];
    assert_eq!(store.insert_batch(&batch).await.unwrap(), outcome(1, 1, 0));

    assert_eq!(store.insert_batch(&[]).await.unwrap(), outcome(0, 0, 0));
    assert_eq!(store.events_after("t1", "run-a", 0, 0).await.unwrap(), run);
    assert_eq!(
        store
            .get_run("t1", "run-a")
            .await
            .unwrap()
            .unwrap()
            .event_count,
        5
    );
    assert_eq!(
        store
            .get_run("t1", "run-b")
            .await
            .unwrap()
            .unwrap()
            .event_count,
        1
    );
    assert_eq!(store.conflicts_total(), 0);
}

async fn conflict_is_counted_and_original_kept(backend: Backend) {
    let store = backend.open().await;
    let e = |text: &str, ts: i64| archived(env("t1", None, "run-c", ts), 2, delta(text), 10);
    let original = e("hello", 100);
    assert_eq!(
        store
            .insert_batch(std::slice::from_ref(&original))
            .await
            .unwrap(),
        outcome(1, 0, 0)
    );

    // Different payload, same key.
    assert_eq!(
        store.insert_batch(&[e("HELLO", 100)]).await.unwrap(),
        outcome(0, 0, 1)
    );
    // Same payload, different envelope timestamp: also not the same event.
    assert_eq!(
        store.insert_batch(&[e("hello", 101)]).await.unwrap(),
        outcome(0, 0, 1)
    );
    // A conflict inside a batch does not stop the rest of it.
    let fresh = archived(env("t1", None, "run-c", 100), 3, delta(" world"), 11);
    assert_eq!(
        store
            .insert_batch(&[e("bye", 100), fresh.clone()])
            .await
            .unwrap(),
        outcome(1, 0, 1)
    );
    // Two versions of a new key in one batch: the first wins, the second conflicts.
    let v1 = archived(env("t1", None, "run-c", 100), 4, delta("v1"), 12);
    let v2 = archived(env("t1", None, "run-c", 100), 4, delta("v2"), 13);
    assert_eq!(
        store.insert_batch(&[v1.clone(), v2]).await.unwrap(),
        outcome(1, 0, 1)
    );

    assert_eq!(store.conflicts_total(), 4);
    assert_eq!(
        store.events_after("t1", "run-c", 0, 0).await.unwrap(),
        vec![original, fresh, v1]
    );
    let run = store.get_run("t1", "run-c").await.unwrap().unwrap();
    assert_eq!((run.event_count, run.first_seq, run.last_seq), (3, 2, 4));
}

async fn runs_row_follows_start_to_end(backend: Backend) {
    let store = backend.open().await;
    assert_eq!(store.get_run("t1", "run-d").await.unwrap(), None);
    let e = |seq: u64| env("t1", Some("chat-9"), "run-d", 5_000 + seq as i64);

    store
        .insert_batch(&[archived(e(1), 1, start("openai", "gpt-x"), 1)])
        .await
        .unwrap();
    let run = store.get_run("t1", "run-d").await.unwrap().unwrap();
    assert_eq!(run.tenant, "t1");
    assert_eq!(run.session_key.as_deref(), Some("chat-9"));
    assert_eq!(run.provider.as_deref(), Some("openai"));
    assert_eq!(run.model.as_deref(), Some("gpt-x"));
    assert_eq!(run.status, RunStatusKind::Open);
    assert_eq!(run.stop_reason, None);
    assert_eq!(run.usage, None);
    assert_eq!((run.first_seq, run.last_seq, run.event_count), (1, 1, 1));
    assert_eq!((run.first_ts_ms, run.last_ts_ms), (5_001, 5_001));

    store
        .insert_batch(&[
            archived(e(2), 2, delta("a"), 2),
            archived(e(3), 3, delta("b"), 3),
        ])
        .await
        .unwrap();
    let run = store.get_run("t1", "run-d").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatusKind::Open);
    assert_eq!((run.first_seq, run.last_seq, run.event_count), (1, 3, 3));

    let usage = r#"{"input_tokens":3,"cost":0.0026784,"n":1.0}"#;
    store
        .insert_batch(&[archived(
            e(4),
            4,
            end(StopReason::Truncated, Some(usage)),
            4,
        )])
        .await
        .unwrap();
    let run = store.get_run("t1", "run-d").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatusKind::Ended);
    assert_eq!(run.stop_reason.as_deref(), Some("truncated"));
    // Provider JSON comes back byte for byte (no float re-formatting).
    assert_eq!(run.usage.as_ref().map(|u| u.get()), Some(usage));
    assert_eq!((run.first_seq, run.last_seq, run.event_count), (1, 4, 4));
    assert_eq!((run.first_ts_ms, run.last_ts_ms), (5_001, 5_004));

    // A run that dies.
    let f = |seq: u64| env("t1", None, "run-e", seq as i64);
    store
        .insert_batch(&[
            archived(f(1), 1, start("google", "gemini-x"), 5),
            archived(f(2), 2, error(StopReason::StreamClosed), 6),
        ])
        .await
        .unwrap();
    let run = store.get_run("t1", "run-e").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatusKind::Failed);
    assert_eq!(run.stop_reason.as_deref(), Some("stream_closed"));
    assert_eq!(run.session_key, None);
}

async fn runs_row_is_independent_of_batch_order(backend: Backend) {
    let store = backend.open().await;
    let run = whole_run("t2", "run-f", 10_000, 4, 1); // seq 1..=6, end at 6
                                                      // The end first, then the middle, then the start (archiver replicas commit batches
                                                      // of one run in any order).
    store.insert_batch(&run[5..]).await.unwrap();
    let r = store.get_run("t2", "run-f").await.unwrap().unwrap();
    assert_eq!(r.status, RunStatusKind::Ended);
    assert_eq!(r.provider, None);
    assert_eq!((r.first_seq, r.last_seq), (6, 6));
    store.insert_batch(&run[2..5]).await.unwrap();
    store.insert_batch(&run[..2]).await.unwrap();
    let r = store.get_run("t2", "run-f").await.unwrap().unwrap();
    assert_eq!(r.status, RunStatusKind::Ended);
    assert_eq!(r.stop_reason.as_deref(), Some("completed"));
    assert_eq!(r.provider.as_deref(), Some("anthropic"));
    assert_eq!(r.model.as_deref(), Some("claude-x"));
    assert_eq!((r.first_seq, r.last_seq, r.event_count), (1, 6, 6));
    assert_eq!((r.first_ts_ms, r.last_ts_ms), (10_001, 10_006));
    assert!(r.usage.is_some());
}

/// The `runs` columns behind an index (`session_key`, `first_ts_ms`) change where a
/// batch changes them, and the indexes find the run by the new values: a session key
/// that only a later batch carries, an earlier start committed after a later event.
async fn runs_indexes_follow_a_late_session_and_an_earlier_start(backend: Backend) {
    let store = backend.open().await;
    let e = |session, seq: u64| env("t7", session, "run-late", 30_000 + seq as i64);
    store
        .insert_batch(&[archived(e(None, 5), 5, delta("e"), 1)])
        .await
        .unwrap();
    let by = |session: Option<&str>, since: Option<i64>| RunFilter {
        tenant: Some("t7".into()),
        session_key: session.map(str::to_owned),
        // Only the earlier start in range: a row that kept 30_005 is not found.
        since_ts_ms: since,
        until_ts_ms: since.map(|t| t + 1),
        ..RunFilter::default()
    };
    let found = |page: RunPage| page.runs.iter().map(|r| r.first_ts_ms).collect::<Vec<_>>();
    assert!(found(store.list_runs(&by(Some("chat-late"), None)).await.unwrap()).is_empty());

    store
        .insert_batch(&[archived(
            e(Some("chat-late"), 1),
            1,
            start("openai", "gpt-x"),
            2,
        )])
        .await
        .unwrap();
    let run = store.get_run("t7", "run-late").await.unwrap().unwrap();
    assert_eq!(run.session_key.as_deref(), Some("chat-late"));
    assert_eq!(
        (run.first_ts_ms, run.last_ts_ms, run.event_count),
        (30_001, 30_005, 2)
    );
    let session = store.list_runs(&by(Some("chat-late"), None)).await.unwrap();
    assert_eq!(found(session), vec![30_001]);
    // The time index holds the earlier start: found from it, not only from the later one.
    let since = store.list_runs(&by(None, Some(30_001))).await.unwrap();
    assert_eq!(found(since), vec![30_001]);

    // A batch without a session key leaves the one stored.
    store
        .insert_batch(&[archived(e(None, 6), 6, delta("f"), 3)])
        .await
        .unwrap();
    let run = store.get_run("t7", "run-late").await.unwrap().unwrap();
    assert_eq!(run.session_key.as_deref(), Some("chat-late"));
    assert_eq!((run.first_ts_ms, run.event_count), (30_001, 3));
}

async fn events_after_and_journal_after_order_and_limit(backend: Backend) {
    let store = backend.open().await;
    // Two runs interleaved on the journal: run-g on odd journal seqs, run-h on even.
    let mut all = Vec::new();
    for seq in 1..=5u64 {
        all.push(archived(
            env("t", None, "run-g", seq as i64),
            seq,
            delta(&format!("g{seq}")),
            2 * seq - 1,
        ));
        all.push(archived(
            env("t", None, "run-h", seq as i64),
            seq,
            delta(&format!("h{seq}")),
            2 * seq,
        ));
    }
    // Inserted in reverse, split over two batches: order must come from the queries.
    let mut reversed = all.clone();
    reversed.reverse();
    store.insert_batch(&reversed[..4]).await.unwrap();
    store.insert_batch(&reversed[4..]).await.unwrap();

    let g: Vec<_> = all
        .iter()
        .filter(|e| e.event.envelope.run_id == "run-g")
        .cloned()
        .collect();
    assert_eq!(store.events_after("t", "run-g", 0, 0).await.unwrap(), g);
    let seqs = |v: &[ArchivedEvent]| v.iter().map(|e| e.event.event.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(&store.events_after("t", "run-g", 2, 2).await.unwrap()),
        vec![3, 4]
    );
    assert_eq!(
        seqs(&store.events_after("t", "run-g", 4, 10).await.unwrap()),
        vec![5]
    );
    assert!(store
        .events_after("t", "run-g", 5, 0)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .events_after("t", "nope", 0, 0)
        .await
        .unwrap()
        .is_empty());

    assert_eq!(store.journal_after(0, 0).await.unwrap(), all);
    let journal = |v: &[ArchivedEvent]| v.iter().map(|e| e.journal_seq).collect::<Vec<_>>();
    assert_eq!(
        journal(&store.journal_after(3, 2).await.unwrap()),
        vec![4, 5]
    );
    assert_eq!(
        journal(&store.journal_after(8, 100).await.unwrap()),
        vec![9, 10]
    );
    assert!(store.journal_after(10, 0).await.unwrap().is_empty());
}

async fn journal_pages_never_split_a_batch_message(backend: Backend) {
    let store = backend.open().await;
    // Journal entries (SG_EVENTS messages): 1 = run-a seqs 1..=3, 2 = run-b seq 1,
    // 3 = run-a seqs 4..=5. Events of one entry share its journal_seq.
    let entries: [(&str, std::ops::RangeInclusive<u64>, u64); 3] = [
        ("run-a", 1..=3, 1),
        ("run-b", 1..=1, 2),
        ("run-a", 4..=5, 3),
    ];
    let mut all = Vec::new();
    for (run, seqs, journal_seq) in entries {
        for seq in seqs {
            all.push(archived(
                env("t", None, run, seq as i64),
                seq,
                delta(&format!("{run}-{seq}")),
                journal_seq,
            ));
        }
    }
    store.insert_batch(&all).await.unwrap();
    let journal = |v: &[ArchivedEvent]| v.iter().map(|e| e.journal_seq).collect::<Vec<_>>();
    // A limit inside entry 1 rounds up to its end.
    assert_eq!(
        journal(&store.journal_after(0, 2).await.unwrap()),
        [1, 1, 1]
    );
    assert_eq!(
        journal(&store.journal_after(0, 4).await.unwrap()),
        [1, 1, 1, 2]
    );
    assert_eq!(journal(&store.journal_after(2, 1).await.unwrap()), [3, 3]);
    // Paging with limit 1, resuming after the last journal_seq seen, yields everything.
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = store.journal_after(after, 1).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.journal_seq;
        paged.extend(page);
    }
    assert_eq!(paged, store.journal_after(0, 0).await.unwrap());
    assert_eq!(paged.len(), all.len());
}

async fn list_runs_filters_and_cursor_pagination(backend: Backend) {
    let store = backend.open().await;
    // 23 runs: tenants a/b, sessions s0..s2, providers p0/p1, every third run ended,
    // first_ts in pairs so the run_id tie-break is exercised.
    let mut batch = Vec::new();
    for i in 0..23u64 {
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        let session = format!("s{}", i % 3);
        let run = format!("run-{i:02}");
        let ts = 1_000 + (i / 2) as i64;
        let e = env(tenant, Some(&session), &run, ts);
        batch.push(archived(
            e.clone(),
            1,
            start(&format!("p{}", i % 2), &format!("m{}", i % 4)),
            0,
        ));
        if i % 3 == 0 {
            batch.push(archived(e, 2, end(StopReason::Completed, None), 0));
        }
    }
    store.insert_batch(&batch).await.unwrap();

    // Expected global order: first_ts desc, run_id asc.
    let mut expected: Vec<(i64, String)> = (0..23u64)
        .map(|i| (1_000 + (i / 2) as i64, format!("run-{i:02}")))
        .collect();
    expected.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
    let expected: Vec<String> = expected.into_iter().map(|x| x.1).collect();

    // Walk every page of 5.
    let mut seen = Vec::new();
    let mut filter = RunFilter {
        limit: 5,
        ..RunFilter::default()
    };
    let mut pages = 0;
    loop {
        let page = store.list_runs(&filter).await.unwrap();
        pages += 1;
        assert!(page.runs.len() <= 5);
        seen.extend(page.runs.iter().map(|r| r.run_id.clone()));
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(pages, 5);
    assert_eq!(seen, expected);

    // An exact multiple of the page size ends without an empty trailing page.
    let page = store
        .list_runs(&RunFilter {
            limit: 23,
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(page.runs.len(), 23);
    assert_eq!(page.next_cursor, None);
    // limit 0 means 100.
    assert_eq!(
        store
            .list_runs(&RunFilter::default())
            .await
            .unwrap()
            .runs
            .len(),
        23
    );

    let ids = |f: RunFilter| {
        let store = store.clone();
        async move {
            let mut v: Vec<String> = store
                .list_runs(&f)
                .await
                .unwrap()
                .runs
                .into_iter()
                .map(|r| r.run_id)
                .collect();
            v.sort();
            v
        }
    };
    let expect = |pred: &dyn Fn(u64) -> bool| -> Vec<String> {
        (0..23u64)
            .filter(|i| pred(*i))
            .map(|i| format!("run-{i:02}"))
            .collect()
    };
    assert_eq!(
        ids(RunFilter {
            tenant: Some("a".into()),
            ..Default::default()
        })
        .await,
        expect(&|i| i % 2 == 0)
    );
    assert_eq!(
        ids(RunFilter {
            session_key: Some("s1".into()),
            ..Default::default()
        })
        .await,
        expect(&|i| i % 3 == 1)
    );
    assert_eq!(
        ids(RunFilter {
            status: Some(RunStatusKind::Ended),
            ..Default::default()
        })
        .await,
        expect(&|i| i % 3 == 0)
    );
    assert_eq!(
        ids(RunFilter {
            status: Some(RunStatusKind::Open),
            ..Default::default()
        })
        .await,
        expect(&|i| i % 3 != 0)
    );
    assert!(ids(RunFilter {
        status: Some(RunStatusKind::Failed),
        ..Default::default()
    })
    .await
    .is_empty());
    assert_eq!(
        ids(RunFilter {
            provider: Some("p1".into()),
            ..Default::default()
        })
        .await,
        expect(&|i| i % 2 == 1)
    );
    assert_eq!(
        ids(RunFilter {
            model: Some("m2".into()),
            ..Default::default()
        })
        .await,
        expect(&|i| i % 4 == 2)
    );
    assert_eq!(
        ids(RunFilter {
            since_ts_ms: Some(1_005),
            until_ts_ms: Some(1_007),
            ..Default::default()
        })
        .await,
        expect(&|i| (10..14).contains(&i))
    );
    // Filters combine, and pagination works under a filter.
    let f = RunFilter {
        tenant: Some("b".into()),
        status: Some(RunStatusKind::Open),
        limit: 2,
        ..Default::default()
    };
    let mut got = Vec::new();
    let mut f2 = f.clone();
    loop {
        let page = store.list_runs(&f2).await.unwrap();
        got.extend(page.runs.into_iter().map(|r| r.run_id));
        match page.next_cursor {
            Some(c) => f2.cursor = Some(c),
            None => break,
        }
    }
    got.sort();
    assert_eq!(got, expect(&|i| i % 2 == 1 && i % 3 != 0));

    let bad = store
        .list_runs(&RunFilter {
            cursor: Some("garbage".into()),
            ..Default::default()
        })
        .await;
    assert!(matches!(bad, Err(ArchiveError::BadCursor(_))), "{bad:?}");
}

async fn raw_chunks_round_trip_and_idempotent(backend: Backend) {
    let store = backend.open().await;
    let chunk = |n: u64, body: &[u8], close: Option<&str>| RawChunkRecord {
        tenant: "t".into(),
        run_id: "run-raw".into(),
        chunk: n,
        family: "f1".into(),
        ingest_ts_ms: 1_700_000_000_000 + n as i64,
        close: close.map(str::to_owned),
        body: body.to_vec(),
    };
    let c0 = chunk(0, b"event: message_start\ndata: {}\n\n", None);
    let c1 = chunk(1, &[0, 159, 146, 150, 255, 10], None);
    let c2 = chunk(2, b"", Some("normal"));
    assert_eq!(
        store.insert_raw(&[c2.clone(), c0.clone()]).await.unwrap(),
        2
    );
    // Re-delivery of chunk 0 with other bytes keeps the original; chunk 1 is new.
    assert_eq!(
        store
            .insert_raw(&[chunk(0, b"other", None), c1.clone()])
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.insert_raw(&[]).await.unwrap(), 0);
    assert_eq!(
        store.raw_chunks("t", "run-raw").await.unwrap(),
        vec![c0.clone(), c1.clone(), c2.clone()]
    );
    assert!(store.raw_chunks("t", "other").await.unwrap().is_empty());
    // The key holds the tenant: the same run id and chunk under another tenant is new.
    let other = RawChunkRecord {
        tenant: "u".into(),
        body: b"other tenant".to_vec(),
        ..c0.clone()
    };
    assert_eq!(
        store
            .insert_raw(std::slice::from_ref(&other))
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.raw_chunks("u", "run-raw").await.unwrap(), vec![other]);
    assert_eq!(
        store.raw_chunks("t", "run-raw").await.unwrap(),
        vec![c0, c1, c2]
    );
}

async fn reopen_persists_everything(backend: Backend) {
    let run = whole_run("t", "run-p", 42, 2, 7);
    {
        let store = backend.open().await;
        store.insert_batch(&run).await.unwrap();
        store
            .insert_raw(&[RawChunkRecord {
                tenant: "t".into(),
                run_id: "run-p".into(),
                chunk: 0,
                family: "f2".into(),
                ingest_ts_ms: 42,
                close: None,
                body: b"{}".to_vec(),
            }])
            .await
            .unwrap();
    }
    // Reopening re-runs the (idempotent) migrations on an existing schema.
    let store = backend.open().await;
    let again = backend.open().await;
    assert_eq!(store.events_after("t", "run-p", 0, 0).await.unwrap(), run);
    assert_eq!(again.journal_after(0, 0).await.unwrap(), run);
    let r = store.get_run("t", "run-p").await.unwrap().unwrap();
    assert_eq!((r.event_count, r.status), (4, RunStatusKind::Ended));
    assert_eq!(store.raw_chunks("t", "run-p").await.unwrap().len(), 1);
    // Dedupe state survives too.
    assert_eq!(store.insert_batch(&run).await.unwrap(), outcome(0, 4, 0));
}

async fn concurrent_overlapping_batches_count_each_event_once(backend: Backend) {
    let store = backend.open().await;
    // 8 runs of 50 events; four writers insert overlapping halves concurrently.
    let events: Vec<ArchivedEvent> = (0..8)
        .flat_map(|r| whole_run("t", &format!("run-{r}"), r * 1_000, 48, (r as u64) * 50 + 1))
        .collect();
    let total = events.len() as u64;
    let mut tasks = Vec::new();
    for w in 0..4usize {
        let store = store.clone();
        let mine: Vec<ArchivedEvent> = events
            .iter()
            .enumerate()
            .filter(|(i, _)| (i / 25 + w) % 2 == 0)
            .map(|(_, e)| e.clone())
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut sum = InsertOutcome::default();
            for chunk in mine.chunks(40) {
                // Deadlocks or serialization failures are retryable by contract.
                let o = loop {
                    match store.insert_batch(chunk).await {
                        Ok(o) => break o,
                        Err(ArchiveError::Postgres(e)) if e.code().is_some() => continue,
                        Err(e) => panic!("{e}"),
                    }
                };
                sum.inserted += o.inserted;
                sum.duplicates += o.duplicates;
                sum.conflicts += o.conflicts;
            }
            sum
        }));
    }
    let mut sum = InsertOutcome::default();
    for t in tasks {
        let o = t.await.unwrap();
        sum.inserted += o.inserted;
        sum.duplicates += o.duplicates;
        sum.conflicts += o.conflicts;
    }
    assert_eq!(sum.inserted, total);
    assert_eq!(sum.duplicates, total);
    assert_eq!(sum.conflicts, 0);
    for r in 0..8 {
        let run = store
            .get_run("t", &format!("run-{r}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((run.event_count, run.first_seq, run.last_seq), (50, 1, 50));
        assert_eq!(run.status, RunStatusKind::Ended);
    }
    assert_eq!(store.journal_after(0, 0).await.unwrap().len() as u64, total);
}

/// SQLite-only: URL parameters of `open_store`.
#[tokio::test]
async fn sqlite_url_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let url = format!(
        "sqlite://{}?synchronous=normal&writer_priority=normal",
        db.display()
    );
    let store = open_store(&url)
        .await
        .expect("normal durability and priority");
    store
        .insert_batch(&whole_run("t", "run-u", 0, 1, 1))
        .await
        .unwrap();
    drop(store);
    // The file is the one named before '?', and a plain path works too.
    let plain = open_store(db.to_str().unwrap()).await.unwrap();
    assert_eq!(
        plain.events_after("t", "run-u", 0, 0).await.unwrap().len(),
        3
    );
    for bad in [
        "?synchronous=off",
        "?journal=wal",
        "?page_size=3000",
        "?page_size=256",
        "?page_size=131072",
        "?page_size=",
        "?writer_priority=high",
        "?writer_priority=-10",
    ] {
        let r = open_store(&format!("sqlite://{}{bad}", db.display())).await;
        assert!(matches!(r, Err(ArchiveError::Config(_))), "{bad}");
    }
    assert!(matches!(
        open_store("sqlite://").await,
        Err(ArchiveError::Config(_))
    ));
}

/// SQLite-only: the WAL keeps its size while writes flow (shrinking it inside commits
/// stalled them) but is given back to the disk once writes pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_wal_shrinks_when_writes_pause() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.db");
    let store = open_store(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    for r in 0..20 {
        store
            .insert_batch(&whole_run("t", &format!("run-{r}"), 0, 200, 1))
            .await
            .unwrap();
    }
    let wal = dir.path().join("w.db-wal");
    let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(size() > 0, "writes go through the WAL");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while size() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(size(), 0, "the idle WAL was not truncated");
    // Everything is still there, and writing again works.
    assert_eq!(store.journal_after(0, 0).await.unwrap().len(), 20 * 202);
    store
        .insert_batch(&whole_run("t", "run-after", 0, 1, 1))
        .await
        .unwrap();
}

/// A run id is unique only within its tenant (docs/architecture.md §3): the same id under two
/// tenants is two runs with their own events, `runs` row and raw chunks, never a conflict.
async fn same_run_id_under_two_tenants_is_two_runs(backend: Backend) {
    let store = backend.open().await;
    let acme = whole_run("acme", "r1", 1_000, 2, 1);
    let mut globex = whole_run("globex", "r1", 1_000, 5, 10);
    // Same seqs, different content: under one key this would be a conflict.
    for ev in &mut globex {
        ev.event.envelope.session_key = Some("chat-globex".into());
    }
    // Both runs in one batch, interleaved: sorting and the runs upsert group by tenant.
    let mut both: Vec<ArchivedEvent> = acme.iter().chain(&globex).cloned().collect();
    both.sort_by_key(|e| e.event.event.seq);
    assert_eq!(store.insert_batch(&both).await.unwrap(), outcome(11, 0, 0));
    assert_eq!(store.insert_batch(&both).await.unwrap(), outcome(0, 11, 0));
    assert_eq!(store.conflicts_total(), 0);

    assert_eq!(store.events_after("acme", "r1", 0, 0).await.unwrap(), acme);
    assert_eq!(
        store.events_after("globex", "r1", 0, 0).await.unwrap(),
        globex
    );
    assert!(store
        .events_after("initech", "r1", 0, 0)
        .await
        .unwrap()
        .is_empty());
    let a = store.get_run("acme", "r1").await.unwrap().unwrap();
    let g = store.get_run("globex", "r1").await.unwrap().unwrap();
    assert_eq!((a.tenant.as_str(), a.event_count), ("acme", 4));
    assert_eq!((g.tenant.as_str(), g.event_count), ("globex", 7));
    assert_eq!(g.session_key.as_deref(), Some("chat-globex"));
    assert_eq!(store.get_run("initech", "r1").await.unwrap(), None);

    // Both appear in the list, tenant breaking the tie, and pages never lose one.
    let all = store.list_runs(&RunFilter::default()).await.unwrap();
    let keys: Vec<(String, String)> = all
        .runs
        .iter()
        .map(|r| (r.tenant.clone(), r.run_id.clone()))
        .collect();
    assert_eq!(
        keys,
        [("acme".into(), "r1".into()), ("globex".into(), "r1".into())]
    );
    let first = store
        .list_runs(&RunFilter {
            limit: 1,
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(first.runs[0].tenant, "acme");
    let second = store
        .list_runs(&RunFilter {
            limit: 1,
            cursor: first.next_cursor,
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(second.runs[0].tenant, "globex");
    assert_eq!(second.next_cursor, None);
    let only = store
        .list_runs(&RunFilter {
            tenant: Some("globex".into()),
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(only.runs, vec![g]);
}

/// A version-1 archive (schema and rows written with the released version-1 SQL, as an
/// old binary left it) opens with the current code: migration 2 keeps every row, and the
/// new key lets the same run id exist under a second tenant.
async fn upgrade_from_version_1_keeps_rows(backend: Backend) {
    let old = whole_run("acme", "r1", 500, 1, 1);
    let json = |i: usize| old[i].event.event.to_json();
    match &backend {
        Backend::Sqlite(dir) => {
            let conn = rusqlite::Connection::open(dir.path().join("archive.db")).unwrap();
            conn.execute_batch(&format!(
                "CREATE TABLE schema_migrations (version BIGINT NOT NULL PRIMARY KEY, \
                 applied_at_ms BIGINT NOT NULL);
                 BEGIN; {} INSERT INTO schema_migrations VALUES (1, 0); COMMIT;",
                include_str!("v1/sqlite.sql")
            ))
            .unwrap();
            for (i, e) in old.iter().enumerate() {
                conn.execute(
                    "INSERT INTO events (run_id, seq, journal_seq, tenant, session_key, \
                     stream, phase, ts_ms, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    rusqlite::params![
                        "r1",
                        e.event.event.seq as i64,
                        e.journal_seq as i64,
                        "acme",
                        "chat-1",
                        e.event.event.stream().as_str(),
                        Option::<&str>::None,
                        e.event.envelope.ts_ms,
                        json(i),
                    ],
                )
                .unwrap();
            }
            conn.execute_batch(
                "INSERT INTO runs (run_id, tenant, session_key, provider, model, status, \
                 stop_reason, terminal_seq, usage, usage_seq, first_seq, last_seq, \
                 first_ts_ms, last_ts_ms, event_count) VALUES ('r1', 'acme', 'chat-1', \
                 'anthropic', 'claude-x', 'ended', 'completed', 3, NULL, NULL, 1, 3, 501, \
                 503, 3);
                 INSERT INTO raw_chunks (run_id, chunk, tenant, family, ingest_ts_ms, close, \
                 body) VALUES ('r1', 0, 'acme', 'f1', 500, NULL, X'0102');",
            )
            .unwrap();
        }
        Backend::Postgres(db) => {
            let (client, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
                .await
                .unwrap();
            let task = tokio::spawn(conn);
            client
                .batch_execute(&format!(
                    "CREATE TABLE schema_migrations (version BIGINT NOT NULL PRIMARY KEY, \
                     applied_at_ms BIGINT NOT NULL);
                     BEGIN; {} INSERT INTO schema_migrations VALUES (1, 0); COMMIT;",
                    include_str!("v1/postgres.sql")
                ))
                .await
                .unwrap();
            for (i, e) in old.iter().enumerate() {
                client
                    .execute(
                        "INSERT INTO events (run_id, seq, journal_seq, tenant, session_key, \
                         stream, phase, ts_ms, payload) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                        &[
                            &"r1",
                            &(e.event.event.seq as i64),
                            &(e.journal_seq as i64),
                            &"acme",
                            &"chat-1",
                            &e.event.event.stream().as_str(),
                            &Option::<&str>::None,
                            &e.event.envelope.ts_ms,
                            &json(i),
                        ],
                    )
                    .await
                    .unwrap();
            }
            client
                .batch_execute(
                    "INSERT INTO runs (run_id, tenant, session_key, provider, model, status, \
                     stop_reason, terminal_seq, usage, usage_seq, first_seq, last_seq, \
                     first_ts_ms, last_ts_ms, event_count) VALUES ('r1', 'acme', 'chat-1', \
                     'anthropic', 'claude-x', 'ended', 'completed', 3, NULL, NULL, 1, 3, 501, \
                     503, 3);
                     INSERT INTO raw_chunks (run_id, chunk, tenant, family, ingest_ts_ms, \
                     close, body) VALUES ('r1', 0, 'acme', 'f1', 500, NULL, '\\x0102');",
                )
                .await
                .unwrap();
            drop(client);
            let _ = task.await;
        }
    }

    // Open with the current code: migration 2 runs and the version-1 rows survive.
    let store = backend.open().await;
    assert_eq!(store.events_after("acme", "r1", 0, 0).await.unwrap(), old);
    assert_eq!(store.journal_after(0, 0).await.unwrap(), old);
    let run = store.get_run("acme", "r1").await.unwrap().unwrap();
    assert_eq!(
        (
            run.status,
            run.event_count,
            run.first_seq,
            run.last_seq,
            run.provider.as_deref()
        ),
        (RunStatusKind::Ended, 3, 1, 3, Some("anthropic"))
    );
    let raw = store.raw_chunks("acme", "r1").await.unwrap();
    assert_eq!(
        (raw.len(), raw[0].body.as_slice()),
        (1, [1u8, 2].as_slice())
    );
    // The old key still dedupes the old run.
    assert_eq!(store.insert_batch(&old).await.unwrap(), outcome(0, 3, 0));

    // The new key: the same run id under another tenant is a second run, not a conflict.
    let globex = whole_run("globex", "r1", 900, 4, 10);
    assert_eq!(store.insert_batch(&globex).await.unwrap(), outcome(6, 0, 0));
    assert_eq!(store.conflicts_total(), 0);
    assert_eq!(
        store.events_after("globex", "r1", 0, 0).await.unwrap(),
        globex
    );
    assert_eq!(store.events_after("acme", "r1", 0, 0).await.unwrap(), old);
    assert_eq!(
        store
            .get_run("globex", "r1")
            .await
            .unwrap()
            .unwrap()
            .event_count,
        6
    );
    let chunk = RawChunkRecord {
        tenant: "globex".into(),
        run_id: "r1".into(),
        chunk: 0,
        family: "f2".into(),
        ingest_ts_ms: 900,
        close: None,
        body: b"globex".to_vec(),
    };
    assert_eq!(store.insert_raw(&[chunk]).await.unwrap(), 1);
    assert_eq!(store.raw_chunks("acme", "r1").await.unwrap(), raw);
    let runs = store.list_runs(&RunFilter::default()).await.unwrap().runs;
    assert_eq!(runs.len(), 2);
    // Reopening does not apply anything again.
    drop(store);
    let again = backend.open().await;
    assert_eq!(again.events_after("acme", "r1", 0, 0).await.unwrap(), old);
}

/// Erasure by run, by session and of a whole tenant: every table that held the runs
/// (events of both generations, raw chunks, runs) is empty of them, other runs and
/// tenants are untouched, the audit keeps who/when/what with ids only as hashes, and a
/// repeat removes nothing.
async fn erase_removes_runs_from_every_table_and_audits_without_ids(backend: Backend) {
    let store = backend.open().await;
    let mut all = Vec::new();
    for (tenant, run, session) in [
        ("acme", "r1", "chat-1"),
        ("acme", "r2", "chat-1"),
        ("acme", "r3", "chat-2"),
        ("globex", "r1", "chat-1"),
    ] {
        let mut events = whole_run(tenant, run, 1_000, 3, 1);
        for e in &mut events {
            e.event.envelope.session_key = Some(session.into());
        }
        store.insert_batch(&events).await.unwrap();
        store
            .insert_raw(&[RawChunkRecord {
                tenant: tenant.into(),
                run_id: run.into(),
                chunk: 0,
                family: "f1".into(),
                ingest_ts_ms: 1,
                close: None,
                body: b"raw bytes".to_vec(),
            }])
            .await
            .unwrap();
        all.push((tenant, run, events));
    }
    // r2 has a second generation: both go.
    let (_, _, r2) = &all[1];
    let second: Vec<_> = r2.iter().map(|e| e.event.clone()).collect();
    second_generation(&*store, "acme", "r2", &second).await;

    let erase = |scope: EraseScope| {
        let store = store.clone();
        async move {
            store
                .erase(&Erasure {
                    tenant: "acme",
                    scope: &scope,
                    actor: "dpo from 10.0.0.1",
                    at_ms: 42,
                })
                .await
                .unwrap()
        }
    };
    let by_session = erase(EraseScope::Session("chat-1".into())).await;
    let mut runs = by_session.runs.clone();
    runs.sort();
    assert_eq!(runs, ["r1", "r2"]);
    assert_eq!(
        by_session.events,
        5 + 5 + 5,
        "r1, and both generations of r2"
    );
    assert_eq!(by_session.raw_chunks, 2);
    for run in ["r1", "r2"] {
        assert_eq!(store.get_run("acme", run).await.unwrap(), None);
        assert!(store
            .events_after("acme", run, 0, 0)
            .await
            .unwrap()
            .is_empty());
        for g in [1, 2] {
            assert!(store
                .generation_events_after("acme", run, g, 0, 0)
                .await
                .unwrap()
                .is_empty());
        }
        assert!(store.raw_chunks("acme", run).await.unwrap().is_empty());
    }
    // Other sessions and tenants stay, even under the same run id.
    assert!(store.get_run("acme", "r3").await.unwrap().is_some());
    assert_eq!(
        store.events_after("globex", "r1", 0, 0).await.unwrap(),
        all[3].2
    );
    assert_eq!(store.raw_chunks("globex", "r1").await.unwrap().len(), 1);

    let again = erase(EraseScope::Session("chat-1".into())).await;
    assert_eq!(
        (again.runs.len(), again.events, again.raw_chunks),
        (0, 0, 0)
    );
    let one = erase(EraseScope::Run("r3".into())).await;
    assert_eq!((one.runs.len(), one.events, one.raw_chunks), (1, 5, 1));
    let rest = erase(EraseScope::All).await;
    assert_eq!(rest.runs.len(), 0);
    assert!(store
        .list_runs(&RunFilter {
            tenant: Some("acme".into()),
            ..RunFilter::default()
        })
        .await
        .unwrap()
        .runs
        .is_empty());
    assert!(store
        .journal_after(0, 0)
        .await
        .unwrap()
        .iter()
        .all(|e| e.event.envelope.tenant == "globex"));

    let audit = store.erasures(Some("acme"), 0).await.unwrap();
    assert_eq!(audit.len(), 4);
    let first = &audit[3];
    assert_eq!(first.id, by_session.audit_id);
    assert_eq!(
        (first.scope.as_str(), first.actor.as_str(), first.at_ms),
        ("session", "dpo from 10.0.0.1", 42)
    );
    assert_eq!(first.scope_hash, id_hash("acme", "chat-1"));
    let mut hashes = first.run_hashes.clone();
    hashes.sort();
    let mut want = vec![id_hash("acme", "r1"), id_hash("acme", "r2")];
    want.sort();
    assert_eq!(hashes, want);
    assert_eq!((first.events, first.raw_chunks), (15, 2));
    assert!(audit
        .iter()
        .all(|e| !format!("{e:?}").contains("chat-1") && !format!("{e:?}").contains("\"r1\"")));
    assert!(store.erasures(Some("globex"), 0).await.unwrap().is_empty());
}

/// A run whose final answer is `answer`.
fn answered(tenant: &str, run: &str, answer: &str) -> Vec<ArchivedEvent> {
    let mut events = whole_run(tenant, run, 1_000, 1, 1);
    let last = events.pop().unwrap();
    events.push(archived(
        env(tenant, Some("chat-1"), run, 1_100),
        3,
        EventData::Assistant(Assistant {
            phase: Some(AssistantPhase::FinalAnswer),
            text: Some(answer.to_owned()),
            ..Assistant::default()
        }),
        3,
    ));
    let mut end = last;
    end.event.event.seq = 4;
    events.push(end);
    events
}

/// Search: a phrase of an answer finds its run (words in order, any case), scoped by
/// tenant; syntax in the phrase is taken as words; erasing a run takes it out of the
/// index and a new generation replaces its answer there.
async fn search_finds_runs_by_a_phrase_of_their_answer(backend: Backend) {
    let store = backend.open().await;
    for (tenant, run, answer) in [
        (
            "acme",
            "r1",
            "The orbit of Phobos decays by 1.8 metres per century.",
        ),
        (
            "acme",
            "r2",
            "Deimos, the smaller moon, drifts slowly outward.",
        ),
        (
            "globex",
            "r3",
            "Phobos will break up into a ring in 50 million years.",
        ),
    ] {
        store
            .insert_batch(&answered(tenant, run, answer))
            .await
            .unwrap();
    }
    let found = |tenant: Option<&'static str>, phrase: &'static str| {
        let store = store.clone();
        async move {
            let mut hits: Vec<String> = store
                .search_runs(tenant, phrase, 0)
                .await
                .unwrap()
                .into_iter()
                .map(|h| format!("{}/{}", h.tenant, h.run_id))
                .collect();
            hits.sort();
            hits
        }
    };
    assert_eq!(found(None, "orbit of Phobos").await, ["acme/r1"]);
    assert_eq!(found(None, "phobos").await, ["acme/r1", "globex/r3"]);
    assert_eq!(found(Some("acme"), "Phobos").await, ["acme/r1"]);
    assert_eq!(
        found(None, "Phobos orbit").await,
        Vec::<String>::new(),
        "words in order"
    );
    assert_eq!(found(None, "smaller moon").await, ["acme/r2"]);
    assert_eq!(found(None, "\"moon OR NEAR(").await, Vec::<String>::new());
    let hit = &store.search_runs(None, "smaller moon", 0).await.unwrap()[0];
    // FTS5 brackets the phrase, PostgreSQL each word.
    assert!(
        hit.snippet.contains("[smaller moon]") || hit.snippet.contains("[smaller] [moon]"),
        "{}",
        hit.snippet
    );

    // A new generation's answer replaces the old one in the index.
    let mut second: Vec<_> = answered("acme", "r2", "Deimos keeps a nearly circular orbit.")
        .into_iter()
        .map(|e| e.event)
        .collect();
    second.sort_by_key(|e| e.event.seq);
    second_generation(&*store, "acme", "r2", &second).await;
    assert_eq!(found(None, "smaller moon").await, Vec::<String>::new());
    assert_eq!(found(None, "circular orbit").await, ["acme/r2"]);

    // Erased: gone from the index.
    store
        .erase(&Erasure {
            tenant: "globex",
            scope: &EraseScope::All,
            actor: "t",
            at_ms: 1,
        })
        .await
        .unwrap();
    assert_eq!(found(None, "phobos").await, ["acme/r1"]);
}

/// The opt-in thinking search: a run is listed as not indexed until its segments are
/// put in; then a phrase of its thinking finds it (and the answer search does not);
/// re-indexing replaces; retention's strip and an erasure take the rows out.
async fn thinking_search_holds_what_was_indexed_until_retention_or_erasure(backend: Backend) {
    let store = backend.open().await;
    store
        .insert_batch(&answered("acme", "r1", "The comet returns in 2061."))
        .await
        .unwrap();
    let unindexed = |store: Arc<dyn Store>| async move {
        store
            .list_runs(&RunFilter {
                thinking_unindexed: true,
                ..RunFilter::default()
            })
            .await
            .unwrap()
            .runs
            .len()
    };
    assert_eq!(unindexed(store.clone()).await, 1);
    let segments = [
        (2, "Halley's period is about 76 years.".to_owned()),
        (
            5,
            "So the tail points away from the sun again in 2061.".to_owned(),
        ),
    ];
    store
        .index_thinking("acme", "r1", &segments, 10)
        .await
        .unwrap();
    store
        .index_thinking("acme", "r1", &segments, 11)
        .await
        .unwrap();
    assert_eq!(unindexed(store.clone()).await, 0);
    let found = |phrase: &'static str| {
        let store = store.clone();
        async move {
            store
                .search_thinking(Some("acme"), phrase, 0)
                .await
                .unwrap()
                .into_iter()
                .map(|h| (h.run_id, h.snippet))
                .collect::<Vec<_>>()
        }
    };
    let hits = found("tail points away").await;
    assert_eq!(hits.len(), 1, "one hit per run, indexed twice: {hits:?}");
    assert_eq!(hits[0].0, "r1");
    assert!(
        hits[0].1.contains("tail") && hits[0].1.contains('['),
        "{hits:?}"
    );
    assert!(store
        .search_runs(None, "tail points away", 0)
        .await
        .unwrap()
        .is_empty());
    assert!(
        found("comet returns").await.is_empty(),
        "answers are not thinking"
    );
    assert!(store
        .search_thinking(Some("globex"), "tail points", 0)
        .await
        .unwrap()
        .is_empty());

    store.strip_run("acme", "r1", 20).await.unwrap();
    assert!(found("tail points away").await.is_empty(), "stripped");

    store
        .index_thinking("acme", "r1", &segments, 30)
        .await
        .unwrap();
    assert_eq!(found("period is about").await.len(), 1);
    store
        .erase(&Erasure {
            tenant: "acme",
            scope: &EraseScope::Run("r1".to_owned()),
            actor: "t",
            at_ms: 40,
        })
        .await
        .unwrap();
    assert!(found("period is about").await.is_empty(), "erased");
}

/// Accounting: Anthropic reports input at the start and output at the end; whatever
/// order the batches commit in, the run's tokens are the per-field maximum, its first
/// token time the earliest content event; the stats add runs up per tenant, model, day.
async fn accounting_merges_usage_across_batches_in_any_order(backend: Backend) {
    let store = backend.open().await;
    let mk = |run: &str| {
        let mut events = whole_run("acme", run, 1_000, 2, 1);
        if let EventData::Lifecycle(l) = &mut events[0].event.event.data {
            l.usage =
                Json::parse(r#"{"input_tokens":10,"cache_read_input_tokens":4,"output_tokens":1}"#);
        }
        if let EventData::Lifecycle(l) = &mut events[3].event.event.data {
            l.usage = Json::parse(r#"{"output_tokens":6}"#);
        }
        events
    };
    let r1 = mk("r1");
    // Later batch first.
    store.insert_batch(&r1[2..]).await.unwrap();
    store.insert_batch(&r1[..2]).await.unwrap();
    store.insert_batch(&mk("r2")).await.unwrap();
    let run = store.get_run("acme", "r1").await.unwrap().unwrap();
    let want = Tokens {
        input: 10,
        output: 6,
        reasoning: 0,
        cache_read: 4,
        cache_write: 0,
    };
    assert_eq!(run.tokens, Some(want));
    assert_eq!(run.first_token_ts_ms, Some(1_002), "the first delta");
    assert_eq!(run.first_answer_ts_ms, Some(1_002));

    // A run whose events carry no usage has no tokens.
    let mut bare = whole_run("acme", "r3", 1_000, 1, 1);
    for e in &mut bare {
        if let EventData::Lifecycle(l) = &mut e.event.event.data {
            l.usage = None;
        }
    }
    store.insert_batch(&bare).await.unwrap();
    assert_eq!(
        store.get_run("acme", "r3").await.unwrap().unwrap().tokens,
        None
    );

    let stats = store.run_stats(&Default::default()).await.unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    let row = &stats[0];
    assert_eq!(
        (row.tenant.as_str(), row.model.as_str(), row.day),
        ("acme", "claude-x", 0)
    );
    assert_eq!(row.runs, 3);
    assert_eq!(
        row.tokens,
        Tokens {
            input: 20,
            output: 12,
            reasoning: 0,
            cache_read: 8,
            cache_write: 0
        }
    );
    // One ms from each run's start to its first delta.
    assert_eq!((row.ttft_runs, row.ttft_ms_sum), (3, 3));
    let none = store
        .run_stats(&streamgate_archive::StatsFilter {
            tenant: Some("globex".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// Writes `events` as the run's generation 2.
async fn second_generation(
    store: &dyn Store,
    tenant: &str,
    run_id: &str,
    events: &[streamgate_grammar::RunEvent],
) {
    let outcome = store
        .write_generation(&NewGeneration {
            tenant,
            run_id,
            replaces: 1,
            events,
            provenance: Provenance {
                adapter: "f1".into(),
                adapter_version: 1,
                grammar_version: 1,
            },
            at_ms: 5,
        })
        .await
        .unwrap();
    assert_eq!(outcome, streamgate_archive::GenerationOutcome::Written(2));
}

/// The archiver stamps every run of every batch; the stamp only ever moves down, and
/// each version on its own (a newer adapter on an older grammar keeps the older adapter).
async fn provenance_keeps_the_lowest_versions_seen(backend: Backend) {
    let store = backend.open().await;
    let stamp = |adapter: &str, adapter_version: u32, grammar_version: u32| RunProvenance {
        tenant: "t1".into(),
        run_id: "run-p".into(),
        provenance: Provenance {
            adapter: adapter.into(),
            adapter_version,
            grammar_version,
        },
    };
    let stamped = || async {
        let run = store.get_run("t1", "run-p").await.unwrap().unwrap();
        run.provenance
            .map(|p| (p.adapter, p.adapter_version, p.grammar_version))
    };
    let owned = |a: &str, av: u32, gv: u32| Some((a.to_owned(), av, gv));

    // Not archived yet: skipped, no error.
    store.record_provenance(&[stamp("f1", 3, 2)]).await.unwrap();
    let e = |seq: u64| env("t1", None, "run-p", seq as i64);
    store
        .insert_batch(&[archived(e(1), 1, start("anthropic", "m"), 1)])
        .await
        .unwrap();
    assert_eq!(stamped().await, None);

    store.record_provenance(&[stamp("f1", 3, 2)]).await.unwrap();
    assert_eq!(stamped().await, owned("f1", 3, 2));
    // The same stamp again, and a newer one: unchanged.
    store.record_provenance(&[stamp("f1", 3, 2)]).await.unwrap();
    store
        .record_provenance(&[stamp("f1/new", 4, 3)])
        .await
        .unwrap();
    assert_eq!(stamped().await, owned("f1", 3, 2));
    // An older grammar alone moves only the grammar version.
    store
        .record_provenance(&[stamp("f1/new", 4, 1)])
        .await
        .unwrap();
    assert_eq!(stamped().await, owned("f1", 3, 1));
    // An older adapter alone moves the adapter and its version.
    store
        .record_provenance(&[stamp("f1/old", 2, 2)])
        .await
        .unwrap();
    assert_eq!(stamped().await, owned("f1/old", 2, 1));
}

/// The archiver's commit: a run's first batch is stamped by the same call that archives
/// it, batches committed concurrently (SQLite merges them into one transaction) each stamp
/// their own runs, and a run named twice in one call keeps the lower of each version.
async fn a_batch_and_its_provenance_commit_together(backend: Backend) {
    let store = backend.open().await;
    let stamp = |run_id: &str, adapter_version: u32, grammar_version: u32| RunProvenance {
        tenant: "t1".into(),
        run_id: run_id.into(),
        provenance: Provenance {
            adapter: format!("f1/{adapter_version}"),
            adapter_version,
            grammar_version,
        },
    };
    let first = |run_id: &str| archived(env("t1", None, run_id, 1), 1, start("anthropic", "m"), 1);
    let inserted = store
        .insert_batch_with_provenance(&[first("run-a")], &[stamp("run-a", 3, 2)])
        .await
        .unwrap();
    assert_eq!(inserted, outcome(1, 0, 0));

    let batches: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let run = format!("run-c{i}");
            tokio::spawn(async move {
                let events = [first(&run)];
                let runs = [stamp(&run, 10 + i, 1), stamp(&run, 20, 0)];
                store.insert_batch_with_provenance(&events, &runs).await
            })
        })
        .collect();
    for batch in batches {
        assert_eq!(batch.await.unwrap().unwrap(), outcome(1, 0, 0));
    }

    let stamped = |run_id: String| {
        let store = store.clone();
        async move {
            let run = store.get_run("t1", &run_id).await.unwrap().unwrap();
            run.provenance
                .map(|p| (p.adapter, p.adapter_version, p.grammar_version))
        }
    };
    assert_eq!(
        stamped("run-a".into()).await,
        Some(("f1/3".to_owned(), 3, 2))
    );
    for i in 0..8u32 {
        assert_eq!(
            stamped(format!("run-c{i}")).await,
            Some((format!("f1/{}", 10 + i), 10 + i, 0)),
            "run-c{i}"
        );
    }
    // Provenance alone (no events) still goes through the rule.
    store
        .insert_batch_with_provenance(&[], &[stamp("run-a", 2, 2)])
        .await
        .unwrap();
    assert_eq!(
        stamped("run-a".into()).await,
        Some(("f1/2".to_owned(), 2, 2))
    );
}

/// SQLite-only: a new archive is made with 8 KiB pages (fewer B-tree splits under the
/// archiver's batches than 4 KiB, fewer bytes per commit than 16 KiB), or the URL's
/// `page_size`; one made before keeps its pages — in WAL mode only a VACUUM outside it
/// could change them — and works as before.
#[tokio::test]
async fn sqlite_new_archives_get_8_kib_pages_and_old_ones_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let page_size = |db: &std::path::Path| -> i64 {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap()
    };
    let new = dir.path().join("new.db");
    let old = dir.path().join("old.db");
    // One made by the versions that gave new archives 16 KiB pages.
    let sixteen = dir.path().join("sixteen.db");
    for (db, size) in [(&old, 4096), (&sixteen, 16 << 10)] {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA page_size = {size}; PRAGMA journal_mode = WAL; CREATE TABLE before_us (x);"
        ))
        .unwrap();
    }
    // `page_size` makes a new archive with that size and leaves an existing one as it is.
    let small = dir.path().join("small.db");
    let small_url = format!(
        "sqlite://{}?page_size=4096&synchronous=normal",
        small.display()
    );
    let old_url = format!("sqlite://{}?page_size=8192", old.display());
    for (url, db, want) in [
        (format!("sqlite://{}", new.display()), &new, 8 << 10),
        (format!("sqlite://{}", old.display()), &old, 4096),
        (
            format!("sqlite://{}", sixteen.display()),
            &sixteen,
            16 << 10,
        ),
        (small_url, &small, 4096),
        (old_url, &old, 4096),
    ] {
        let store = open_store(&url).await.unwrap();
        store
            .insert_batch(&whole_run("t", "run-p", 0, 50, 1))
            .await
            .unwrap();
        assert_eq!(
            store.events_after("t", "run-p", 0, 0).await.unwrap().len(),
            52
        );
        assert_eq!(page_size(db), want, "{}", db.display());
    }
}

//! Runs in flight, per partition, in the KV bucket [`OPEN_RUNS_BUCKET`] (`SG_OPEN_RUNS`).
//!
//! A replica learns of a run from its chunks. A run whose producer vanished sends no
//! more chunks, so a replica that did not see it (restarted, or new owner of the
//! partition) would never close it with a `timeout` marker. The registry closes that
//! gap: a run's entry is written when the run starts and removed when it closes, both
//! before the chunk that caused it is acknowledged; a worker taking a partition reads
//! the partition's entries and hands each run to its idle reaper.
//!
//! Keys are `<partition>.<tenant>.<run>` ([`streamgate_bus::kv`] tokens, partition
//! zero-padded); the value is the run's `SG_RAW` subject. The cost is two KV writes per
//! run, whatever its length, and a read of one partition's open runs when it is taken.
//!
//! The writes here do not erase the versions they replace (nor do the projectors' in
//! `SG_DELIVERY`): the value names nothing its key does not, and the close's tombstone
//! keeps the key, so erasing the open version on close hid nothing. It cost the broker
//! a rewrite of the bucket's block file per run, one that grows with every run the
//! block holds (docs/performance.md, twelfth stop). A run's versions stay addressable,
//! so erasing the run (`streamgate_bus::erase`) still overwrites every one of them; and
//! they live as long as the run's raw chunks (the bucket's age limit is `SG_RAW`'s), so
//! the bucket no longer grows by a tombstone per run forever.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use streamgate_bus::subject::{partition_label, RunAddr};
use streamgate_bus::StreamSettings;

/// The bucket of open runs.
pub const OPEN_RUNS_BUCKET: &str = streamgate_bus::kv::OPEN_RUNS_BUCKET;

/// The registry of a deployment's open runs.
#[derive(Clone)]
pub struct OpenRuns {
    kv: kv::Store,
    partitions: u32,
}

impl OpenRuns {
    /// Gets or creates the bucket (file storage, copies and age limit as `streams` gives
    /// them for `SG_RAW`: an entry is kept as long as the chunks it points at).
    pub async fn open(
        js: &jetstream::Context,
        partitions: u32,
        streams: &StreamSettings,
    ) -> anyhow::Result<OpenRuns> {
        let kv = streamgate_bus::kv::open_erasable(
            js,
            kv::Config {
                bucket: OPEN_RUNS_BUCKET.to_owned(),
                description: "streamgate runs started and not yet closed, per partition".to_owned(),
                // A run's open version and its tombstone, with room for a rebuild's
                // second open; the run's erasure overwrites them all.
                history: streamgate_bus::kv::ERASABLE_HISTORY,
                max_age: streams.raw_max_age,
                storage: jetstream::stream::StorageType::File,
                num_replicas: streams.replicas.max(1),
                ..Default::default()
            },
        )
        .await?;
        Ok(OpenRuns {
            kv,
            partitions: partitions.max(1),
        })
    }

    fn key(&self, addr: &RunAddr) -> String {
        format!(
            "{}.{}",
            partition_label(self.partitions, addr.partition),
            streamgate_bus::kv::key(&[&addr.tenant, &addr.run_id])
        )
    }

    /// Records that `addr` started (`open`) or closed (`!open`, a tombstone). Idempotent.
    pub async fn record(&self, addr: &RunAddr, open: bool) -> anyhow::Result<()> {
        let key = self.key(addr);
        if open {
            let subject = Bytes::from(addr.raw_subject());
            self.kv.put(key, subject).await?;
        } else {
            self.kv.delete(key).await?;
        }
        Ok(())
    }

    /// The runs of `partition` recorded as open, by their `SG_RAW` subject.
    pub async fn in_partition(&self, partition: u32) -> anyhow::Result<Vec<RunAddr>> {
        let prefix = format!("{}.", partition_label(self.partitions, partition));
        let mut out = Vec::new();
        for entry in streamgate_bus::kv::current(&self.kv, &prefix).await? {
            if entry.deleted {
                continue;
            }
            match std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|s| RunAddr::parse_subject(s).ok())
            {
                Some(addr) => out.push(addr),
                None => tracing::warn!(key = %entry.key, "skipping unreadable open-run entry"),
            }
        }
        Ok(out)
    }
}

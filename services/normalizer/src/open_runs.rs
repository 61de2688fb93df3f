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

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use streamgate_bus::subject::{partition_label, RunAddr};

/// The bucket of open runs.
pub const OPEN_RUNS_BUCKET: &str = streamgate_bus::kv::OPEN_RUNS_BUCKET;

/// The registry of a deployment's open runs.
#[derive(Clone)]
pub struct OpenRuns {
    kv: kv::Store,
    partitions: u32,
}

impl OpenRuns {
    /// Gets or creates the bucket (file storage, `replicas` copies).
    pub async fn open(
        js: &jetstream::Context,
        partitions: u32,
        replicas: usize,
    ) -> anyhow::Result<OpenRuns> {
        let kv = streamgate_bus::kv::open_erasable(
            js,
            kv::Config {
                bucket: OPEN_RUNS_BUCKET.to_owned(),
                description: "streamgate runs started and not yet closed, per partition".to_owned(),
                // Room for the writes below to erase the versions they replace.
                history: streamgate_bus::kv::ERASABLE_HISTORY,
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas.max(1),
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

    /// Records that `addr` started (`open`) or closed (`!open`). Idempotent.
    pub async fn record(&self, addr: &RunAddr, open: bool) -> anyhow::Result<()> {
        let key = self.key(addr);
        if open {
            let subject = Bytes::from(addr.raw_subject());
            streamgate_bus::kv::put_erasing(&self.kv, &key, subject).await?;
        } else {
            streamgate_bus::kv::delete_erasing(&self.kv, &key).await?;
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

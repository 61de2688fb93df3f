//! How far a partition is processed, kept in `SG_DELIVERY` under `resume.<consumer>`.
//!
//! A partition's consumer lives in the broker's memory (`streamgate_bus::memory_pull`):
//! a file of its own, written after every delivery and ack, cost the broker most of its
//! CPU with many channels. A broker that restarts forgets such a consumer; the next one
//! starts right after the point recorded here instead of at the start of `SG_EVENTS`.
//! What lies between the recorded point and what was processed is delivered again, as
//! after an ack timeout, and the projection and the delivery state make that a no-op.

use async_nats::jetstream::kv::Store;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use streamgate_bus::memory_pull::ResumePoint;

use crate::error::{nats, ProjectorError};

/// How often a partition writes its point while it moves: what a broker restart can
/// deliver again is about this much of the partition's messages.
pub(super) const SAVE_EVERY: Duration = Duration::from_secs(2);

/// How often an unchanged point is written again: `SG_DELIVERY` expires a key a week
/// after its last write ([`crate::kv::DELIVERY_TTL`]), and an idle partition's point
/// must outlive that.
const REFRESH_EVERY: Duration = Duration::from_secs(24 * 3600);

/// How long one write may take before it is given up until the next round.
const SAVE_PATIENCE: Duration = Duration::from_secs(2);

/// The key of a partition consumer's point.
fn key(consumer: &str) -> String {
    streamgate_bus::kv::key(&["resume", consumer])
}

/// The point recorded for `consumer`, if any. An error is an error (a partition that
/// cannot tell where it was must not start elsewhere).
pub(super) async fn load(
    kv: &Store,
    consumer: &str,
) -> Result<Option<ResumePoint>, ProjectorError> {
    let value = kv
        .get(key(consumer))
        .await
        .map_err(nats("read resume point"))?;
    Ok(value.and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()))
}

/// Which of a partition's taken messages are settled (processed and acked, or
/// terminated), and the point below which all are.
#[derive(Debug)]
pub(super) struct Progress {
    /// Taken and not yet settled (a message left for redelivery stays here until it
    /// comes back and is settled).
    open: BTreeSet<u64>,
    /// The highest stream sequence taken (or the recorded point, before any).
    highest: u64,
    /// The point last written and when.
    saved: (ResumePoint, Instant),
}

impl Progress {
    /// Progress of a consumer that delivers everything after `from`; `recorded` is what
    /// the bucket holds now.
    pub(super) fn new(from: ResumePoint, recorded: Option<ResumePoint>) -> Progress {
        Progress {
            open: BTreeSet::new(),
            highest: from,
            saved: (recorded.unwrap_or(0), Instant::now()),
        }
    }

    /// A message was taken from the consumer.
    pub(super) fn taken(&mut self, seq: u64) {
        self.open.insert(seq);
        self.highest = self.highest.max(seq);
    }

    /// A taken message is done with for good.
    pub(super) fn settled(&mut self, seq: u64) {
        self.open.remove(&seq);
    }

    /// Every message up to this stream sequence is settled.
    pub(super) fn point(&self) -> ResumePoint {
        self.open.first().map_or(self.highest, |first| first - 1)
    }

    /// Writes the point when it moved (or is due a refresh); a failed write is tried
    /// again next round.
    pub(super) async fn save(&mut self, kv: &Store, consumer: &str) {
        let point = self.point();
        let (saved, at) = self.saved;
        if point <= saved && at.elapsed() < REFRESH_EVERY {
            return;
        }
        let put = kv.put(key(consumer), point.to_string().into());
        match tokio::time::timeout(SAVE_PATIENCE, put).await {
            Ok(Ok(_)) => self.saved = (point, Instant::now()),
            Ok(Err(e)) => tracing::debug!(consumer, error = %e, "resume point not written"),
            Err(_) => tracing::debug!(consumer, "resume point write timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_point_is_below_the_first_unsettled_message() {
        let mut p = Progress::new(10, Some(10));
        assert_eq!(p.point(), 10);
        for seq in [11, 12, 13] {
            p.taken(seq);
        }
        assert_eq!(p.point(), 10);
        p.settled(12);
        p.settled(13);
        assert_eq!(p.point(), 10, "11 is still open");
        p.settled(11);
        assert_eq!(p.point(), 13);
        // Left for redelivery: open until it comes back and is settled.
        p.taken(14);
        p.taken(15);
        p.settled(15);
        assert_eq!(p.point(), 13);
        p.taken(14);
        p.settled(14);
        assert_eq!(p.point(), 15);
    }
}

//! How far a partition is processed, kept in `SG_DELIVERY` under `resume.<consumer>`.
//!
//! A partition's consumer lives in the broker's memory (`streamgate_bus::memory_pull`):
//! a file of its own, written after every delivery and ack, cost the broker most of its
//! CPU with many channels. A broker that restarts forgets such a consumer; the next one
//! starts right after the point recorded here instead of at the start of `SG_EVENTS`.
//! What lies between the recorded point and what was processed is delivered again, as
//! after an ack timeout, and the projection and the delivery state make that a no-op.
//! The point is only as good as the partition's view of its consumer: a delivery it
//! missed (consumer sequences with a gap) ends the partition's worker, which writes the
//! point it has, and the next one starts a new consumer after the later of that point
//! and the broker's ack floor.

use async_nats::jetstream::kv::Store;
use futures::FutureExt as _;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use streamgate_bus::memory_pull::ResumePoint;
use tokio::task::JoinHandle;

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
/// cannot tell where it was must not start elsewhere); a value that is no number is
/// reported and left out.
pub(super) async fn load(
    kv: &Store,
    consumer: &str,
) -> Result<Option<ResumePoint>, ProjectorError> {
    let Some(value) = kv
        .get(key(consumer))
        .await
        .map_err(nats("read resume point"))?
    else {
        return Ok(None);
    };
    let point = std::str::from_utf8(&value)
        .ok()
        .and_then(|v| v.parse().ok());
    if point.is_none() {
        tracing::warn!(consumer, "resume point is not a number: ignored");
    }
    Ok(point)
}

/// Writes `point` for `consumer`; whether it was written.
async fn write(kv: Store, consumer: String, point: ResumePoint) -> bool {
    let put = kv.put(key(&consumer), point.to_string().into());
    match tokio::time::timeout(SAVE_PATIENCE, put).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::debug!(consumer, error = %e, "resume point not written");
            false
        }
        Err(_) => {
            tracing::debug!(consumer, "resume point write timed out");
            false
        }
    }
}

/// A delivery the partition did not expect: one was missed before it (lost in flight
/// on a reconnect), or the consumer started over (recreated without its state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Missed {
    pub expected: u64,
    pub got: u64,
}

/// Which of a partition's deliveries are settled (processed, their ack sent, or
/// terminated), and the point below which every one is. It holds only while the
/// partition has seen every delivery of its consumer, which [`Progress::taken`] checks.
#[derive(Debug)]
pub(super) struct Progress {
    /// Taken and not yet settled (a message left for redelivery stays here until it
    /// comes back and is settled).
    open: BTreeSet<u64>,
    /// The highest stream sequence taken (or the consumer's start, before any).
    highest: u64,
    /// The consumer sequence of the next delivery.
    next_delivery: u64,
    /// The point last written and when (none: the bucket holds no point, or one that
    /// was not used and must be overwritten).
    saved: Option<(ResumePoint, Instant)>,
    /// The write under way: its point.
    writing: Option<(ResumePoint, JoinHandle<bool>)>,
}

impl Progress {
    /// Progress of a new consumer that delivers everything after `from`; `recorded` is
    /// what the bucket holds now. A recorded point beyond `from` was not used (it lay
    /// past the stream's end) and is overwritten at the first save.
    pub(super) fn new(from: ResumePoint, recorded: Option<ResumePoint>) -> Progress {
        Progress {
            open: BTreeSet::new(),
            highest: from,
            next_delivery: 1,
            saved: recorded.filter(|&r| r <= from).map(|r| (r, Instant::now())),
            writing: None,
        }
    }

    /// A delivery was taken: its stream and consumer sequences. A delivery out of
    /// consumer order is not taken: the partition's record no longer holds.
    pub(super) fn taken(&mut self, stream_seq: u64, consumer_seq: u64) -> Result<(), Missed> {
        if consumer_seq != self.next_delivery {
            return Err(Missed {
                expected: self.next_delivery,
                got: consumer_seq,
            });
        }
        self.next_delivery += 1;
        self.open.insert(stream_seq);
        self.highest = self.highest.max(stream_seq);
        Ok(())
    }

    /// A taken message is done with for good.
    pub(super) fn settled(&mut self, seq: u64) {
        self.open.remove(&seq);
    }

    /// Every message up to this stream sequence is settled.
    pub(super) fn point(&self) -> ResumePoint {
        self.open.first().map_or(self.highest, |first| first - 1)
    }

    /// Starts writing the point when it moved (or is due a refresh), in a task of its
    /// own so the partition's messages go on meanwhile; one write at a time, and a
    /// failed one is tried again next round.
    pub(super) fn save(&mut self, kv: &Store, consumer: &str) {
        if self
            .writing
            .as_ref()
            .is_some_and(|(_, task)| !task.is_finished())
        {
            return;
        }
        if let Some((point, task)) = self.writing.take() {
            // Unconstrained: a finished task's result must not wait on the caller's
            // cooperative budget.
            let written = tokio::task::unconstrained(task).now_or_never();
            self.wrote(point, written.is_some_and(|r| r.unwrap_or(false)));
        }
        let point = self.point();
        if let Some((saved, at)) = self.saved {
            if point <= saved && at.elapsed() < REFRESH_EVERY {
                return;
            }
        }
        let task = tokio::spawn(write(kv.clone(), consumer.to_owned(), point));
        self.writing = Some((point, task));
    }

    /// Writes the point now (after the write under way), as a partition ends.
    pub(super) async fn save_now(&mut self, kv: &Store, consumer: &str) {
        if let Some((point, task)) = self.writing.take() {
            self.wrote(point, task.await.unwrap_or(false));
        }
        let point = self.point();
        if self.saved.map(|(saved, _)| saved) != Some(point) {
            let written = write(kv.clone(), consumer.to_owned(), point).await;
            self.wrote(point, written);
        }
    }

    /// Records a write of `point` that ended, `written` or not.
    fn wrote(&mut self, point: ResumePoint, written: bool) {
        if written {
            self.saved = Some((point, Instant::now()));
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
        for (dseq, seq) in [(1, 11), (2, 12), (3, 13)] {
            p.taken(seq, dseq).unwrap();
        }
        assert_eq!(p.point(), 10);
        p.settled(12);
        p.settled(13);
        assert_eq!(p.point(), 10, "11 is still open");
        p.settled(11);
        assert_eq!(p.point(), 13);
        // Left for redelivery: open until it comes back and is settled.
        p.taken(14, 4).unwrap();
        p.taken(15, 5).unwrap();
        p.settled(15);
        assert_eq!(p.point(), 13);
        p.taken(14, 6).unwrap();
        p.settled(14);
        assert_eq!(p.point(), 15);
    }

    #[test]
    fn a_recorded_point_that_was_not_used_is_overwritten() {
        let p = Progress::new(40, Some(90));
        assert!(p.saved.is_none(), "90 lay past the stream's end");
        let p = Progress::new(90, Some(40));
        assert_eq!(p.saved.map(|s| s.0), Some(40));
    }

    #[test]
    fn a_delivery_out_of_consumer_order_is_not_taken() {
        let mut p = Progress::new(0, None);
        p.taken(5, 1).unwrap();
        p.settled(5);
        // Delivery 2 was lost in flight: 3's point could pass it.
        assert_eq!(
            p.taken(9, 3),
            Err(Missed {
                expected: 2,
                got: 3
            })
        );
        assert_eq!(p.point(), 5);
        // The consumer started over (recreated without its state).
        assert_eq!(
            p.taken(1, 1),
            Err(Missed {
                expected: 2,
                got: 1
            })
        );
    }
}

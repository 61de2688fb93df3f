//! Which of a partition's messages may be processed at once: [`Lanes`].
//!
//! A partition carries many runs in many chats. Processing its messages one at a time
//! made every run wait for the slowest step of any other — a new run's settings read
//! and active-run marker write, a restarted run's rebuild from `SG_EVENTS` — so latency
//! grew with the number of concurrent runs, not with load. Each message names two
//! keys: its run (the subject) and its chat. Messages that share a key are processed
//! one after the other in arrival order (a run's events fold in order; a chat's ops,
//! across runs, reach it in the order they were published), the others at once, up to
//! a bound.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;

/// Messages waiting for their turn, and how many are in flight, by the keys that order
/// them. Pure bookkeeping: the caller runs what [`Lanes::ready`] hands out and reports
/// each one [`Lanes::done`].
pub(super) struct Lanes<K, T> {
    /// Waiting messages in arrival order, with their keys.
    waiting: VecDeque<(Vec<K>, T)>,
    /// Keys of the messages in flight.
    busy: HashSet<K>,
    in_flight: usize,
    limit: usize,
}

impl<K: Eq + Hash + Clone, T> Lanes<K, T> {
    /// At most `limit` (at least 1) in flight at once.
    pub(super) fn new(limit: usize) -> Lanes<K, T> {
        Lanes {
            waiting: VecDeque::new(),
            busy: HashSet::new(),
            in_flight: 0,
            limit: limit.max(1),
        }
    }

    /// Messages waiting or in flight.
    pub(super) fn len(&self) -> usize {
        self.waiting.len() + self.in_flight
    }

    /// Whether nothing is waiting or in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `item`, ordered after every earlier message that shares one of `keys`.
    pub(super) fn push(&mut self, keys: Vec<K>, item: T) {
        self.waiting.push_back((keys, item));
    }

    /// The messages that may start now, in arrival order, marked in flight: none of
    /// their keys is in flight or named by an earlier waiting message.
    pub(super) fn ready(&mut self) -> Vec<(Vec<K>, T)> {
        let mut out = Vec::new();
        // Keys of the waiting messages passed over: a later message naming one waits.
        let mut passed: HashSet<K> = HashSet::new();
        let mut i = 0;
        while i < self.waiting.len() && self.in_flight < self.limit {
            let keys = &self.waiting[i].0;
            let free = keys
                .iter()
                .all(|k| !self.busy.contains(k) && !passed.contains(k));
            if !free {
                passed.extend(keys.iter().cloned());
                i += 1;
                continue;
            }
            let Some((keys, item)) = self.waiting.remove(i) else {
                break;
            };
            self.busy.extend(keys.iter().cloned());
            self.in_flight += 1;
            out.push((keys, item));
        }
        out
    }

    /// A message handed out by [`Lanes::ready`] finished: its keys are free again.
    pub(super) fn done(&mut self, keys: &[K]) {
        for k in keys {
            self.busy.remove(k);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::Lanes;

    fn names<K>(ready: Vec<(Vec<K>, &'static str)>) -> Vec<&'static str> {
        ready.into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn different_runs_in_different_chats_start_at_once() {
        let mut lanes = Lanes::new(8);
        lanes.push(vec!["run:a", "chat:1"], "a1");
        lanes.push(vec!["run:b", "chat:2"], "b1");
        assert_eq!(names(lanes.ready()), ["a1", "b1"]);
        assert_eq!(lanes.len(), 2);
    }

    #[test]
    fn a_run_s_messages_go_one_after_the_other_in_order() {
        let mut lanes = Lanes::new(8);
        lanes.push(vec!["run:a", "chat:1"], "a1");
        lanes.push(vec!["run:a", "chat:1"], "a2");
        lanes.push(vec!["run:a", "chat:1"], "a3");
        assert_eq!(names(lanes.ready()), ["a1"]);
        assert!(lanes.ready().is_empty(), "a2 waits for a1");
        lanes.done(&["run:a", "chat:1"]);
        assert_eq!(names(lanes.ready()), ["a2"]);
        lanes.done(&["run:a", "chat:1"]);
        assert_eq!(names(lanes.ready()), ["a3"]);
        lanes.done(&["run:a", "chat:1"]);
        assert!(lanes.is_empty());
    }

    #[test]
    fn two_runs_of_one_chat_keep_the_chat_s_order() {
        let mut lanes = Lanes::new(8);
        lanes.push(vec!["run:a", "chat:1"], "a-final");
        lanes.push(vec!["run:b", "chat:1"], "b-first");
        lanes.push(vec!["run:c", "chat:2"], "c-first");
        // The other chat is not held up; the chat's next run waits for the first.
        assert_eq!(names(lanes.ready()), ["a-final", "c-first"]);
        lanes.done(&["run:a", "chat:1"]);
        assert_eq!(names(lanes.ready()), ["b-first"]);
    }

    #[test]
    fn a_message_passed_over_holds_back_later_ones_that_share_a_key() {
        let mut lanes = Lanes::new(8);
        lanes.push(vec!["run:a", "chat:1"], "a1");
        assert_eq!(names(lanes.ready()), ["a1"]);
        // b1 waits for chat:1; b2 (another chat, same run) must not overtake it.
        lanes.push(vec!["run:b", "chat:1"], "b1");
        lanes.push(vec!["run:b", "chat:2"], "b2");
        assert!(lanes.ready().is_empty());
        lanes.done(&["run:a", "chat:1"]);
        assert_eq!(names(lanes.ready()), ["b1"]);
        lanes.done(&["run:b", "chat:1"]);
        assert_eq!(names(lanes.ready()), ["b2"]);
    }

    #[test]
    fn no_more_than_the_limit_in_flight() {
        let mut lanes = Lanes::new(2);
        for (i, t) in ["x", "y", "z"].into_iter().enumerate() {
            lanes.push(vec![i], t);
        }
        assert_eq!(names(lanes.ready()), ["x", "y"]);
        lanes.done(&[0]);
        assert_eq!(names(lanes.ready()), ["z"]);
    }

    #[test]
    fn a_message_without_keys_is_never_held_back() {
        let mut lanes: Lanes<&str, &str> = Lanes::new(4);
        lanes.push(vec!["run:a"], "a1");
        lanes.push(vec!["run:a"], "a2");
        lanes.push(vec![], "undecodable");
        assert_eq!(names(lanes.ready()), ["a1", "undecodable"]);
    }
}

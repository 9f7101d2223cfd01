//! Events the node-level managers (eviction, image GC) record, kept in memory for
//! `/api/v1/events`: the newest [`MAX_EVENTS`], repeats counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// How many distinct events are kept.
pub const MAX_EVENTS: usize = 200;

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Involved {
    /// The node itself.
    Node,
    /// A pod.
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its UID.
        uid: String,
    },
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// What it is about.
    pub involved: Involved,
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// The kubelet's reason (`Evicted`, `EvictionThresholdMet`, `FreeDiskSpaceFailed`, ...).
    pub reason: String,
    /// The message.
    pub message: String,
    /// How many times it happened.
    pub count: u32,
    /// First and last time, nanoseconds since the Unix epoch.
    pub first: i64,
    /// See `first`.
    pub last: i64,
}

/// A shared, bounded event log. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct NodeEvents {
    inner: Arc<Mutex<VecDeque<NodeEvent>>>,
    /// Counts the records (bumped after each one, outside the lock).
    version: Arc<AtomicU64>,
}

impl NodeEvents {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an event at `now` (wall-clock nanoseconds); a repeat of the same involved object,
    /// reason and message counts up.
    pub fn record(&self, involved: Involved, type_: &'static str, reason: &str, message: String, now: i64) {
        self.push_or_count(involved, type_, reason, message, now);
        self.version.fetch_add(1, Ordering::Release);
    }

    fn push_or_count(
        &self,
        involved: Involved,
        type_: &'static str,
        reason: &str,
        message: String,
        now: i64,
    ) {
        let mut events = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) =
            events.iter_mut().find(|e| e.involved == involved && e.reason == reason && e.message == message)
        {
            e.count = e.count.saturating_add(1);
            e.last = now;
            return;
        }
        if events.len() >= MAX_EVENTS {
            events.pop_front();
        }
        events.push_back(NodeEvent {
            involved,
            type_,
            reason: reason.to_string(),
            message,
            count: 1,
            first: now,
            last: now,
        });
    }

    /// The number of records so far. Loaded before a [`list`](Self::list), it tells later whether
    /// the list may have changed since: not while the version is the same.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The events, oldest first.
    pub fn list(&self) -> Vec<NodeEvent> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_moves_the_version_and_a_repeat_counts_up() {
        let events = NodeEvents::new();
        let v0 = events.version();
        events.record(Involved::Node, "Warning", "FreeDiskSpaceFailed", "no space".into(), 1);
        let v1 = events.version();
        assert_ne!(v1, v0);
        events.record(Involved::Node, "Warning", "FreeDiskSpaceFailed", "no space".into(), 2);
        assert_ne!(events.version(), v1, "a repeat changes the count: a change");
        let list = events.list();
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].count, list[0].first, list[0].last), (2, 1, 2));
    }
}

//! Timers that hold memory only while they hold a timer: a [`DelayQueue`] made on the first
//! insert and dropped once it is empty again.
//!
//! A `DelayQueue` allocates its timing wheel when it is made (six levels of 64 slots, about 6 KiB)
//! and keeps it until it is dropped. An engine has two (the executor's back-offs and the engine's
//! rechecks) and a node runs a dozen engines, most of them with no timer pending for hours; a
//! process of many hollow nodes has hundreds. Here an idle engine's timers cost one `Option`.
//!
//! Keys are the queue's own ([`delay_queue::Key`]): valid from the insert until the timer expires
//! or is removed, as with a `DelayQueue`. A queue is dropped only when empty, when no key is valid.

use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

/// A [`DelayQueue`] of `T` that exists only while it holds a timer.
pub(crate) struct Timers<T> {
    queue: Option<DelayQueue<T>>,
}

impl<T> Timers<T> {
    /// No timers, and nothing allocated.
    pub(crate) fn new() -> Self {
        Timers { queue: None }
    }

    /// `value` expires at `when`.
    pub(crate) fn insert_at(&mut self, value: T, when: Instant) -> delay_queue::Key {
        self.queue.get_or_insert_with(DelayQueue::new).insert_at(value, when)
    }

    /// `value` expires after `timeout`.
    pub(crate) fn insert(&mut self, value: T, timeout: Duration) -> delay_queue::Key {
        self.queue.get_or_insert_with(DelayQueue::new).insert(value, timeout)
    }

    /// Removes the timer of `key`, if it is still pending; its value, if it was.
    pub(crate) fn remove(&mut self, key: &delay_queue::Key) -> Option<T> {
        let queue = self.queue.as_mut()?;
        let removed = queue.try_remove(key).map(delay_queue::Expired::into_inner);
        if queue.is_empty() {
            self.queue = None;
        }
        removed
    }

    /// The next expired value; `Ready(None)` when there are no timers.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let Some(queue) = self.queue.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = queue.poll_expired(cx).map(|e| e.map(delay_queue::Expired::into_inner));
        if queue.is_empty() {
            self.queue = None;
        }
        polled
    }

    /// How many timers are pending.
    pub(crate) fn len(&self) -> usize {
        self.queue.as_ref().map_or(0, DelayQueue::len)
    }

    /// Whether no timer is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_none()
    }

    /// Whether the queue is allocated (for tests).
    #[cfg(test)]
    fn allocated(&self) -> bool {
        self.queue.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next<T>(timers: &mut Timers<T>) -> Option<T> {
        std::future::poll_fn(|cx| timers.poll_expired(cx)).await
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_exists_only_while_a_timer_is_pending() {
        let mut timers = Timers::new();
        assert!(timers.is_empty() && !timers.allocated());
        assert_eq!(next(&mut timers).await, None::<u32>);

        let a = timers.insert(1, Duration::from_secs(2));
        timers.insert_at(2, Instant::now() + Duration::from_secs(1));
        assert_eq!(timers.len(), 2);
        assert!(timers.allocated());

        let start = Instant::now();
        assert_eq!(next(&mut timers).await, Some(2));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert!(timers.allocated(), "one timer is still pending");
        assert_eq!(timers.remove(&a), Some(1));
        assert!(timers.is_empty() && !timers.allocated(), "the last removal drops the queue");
        assert_eq!(timers.remove(&a), None, "a key no longer pending");

        timers.insert(3, Duration::from_secs(5));
        assert_eq!(next(&mut timers).await, Some(3));
        assert!(!timers.allocated(), "the last expiry drops the queue");
        assert_eq!(timers.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_timer_does_not_expire_and_the_others_keep_their_order() {
        let mut timers = Timers::new();
        let keys: Vec<_> = (0..5u64).map(|i| timers.insert(i, Duration::from_secs(10 - i))).collect();
        assert_eq!(timers.remove(&keys[2]), Some(2));
        let mut seen = Vec::new();
        while let Some(v) = next(&mut timers).await {
            seen.push(v);
        }
        assert_eq!(seen, vec![4, 3, 1, 0]);
        assert!(!timers.allocated());
    }
}

//! The changes nodelet makes to containers itself: a container it is stopping or removing, and for
//! [`KEEP`] after. The runtime's events about such a container (its exit, its removal) need not make
//! the PLEG read its pod: the operation that made the change reads the pod's state when it ends. A
//! hundred pods removed at once made as many reads again, each a listing on a busy runtime.
//!
//! A change is marked before the call and kept only once the call succeeded; a call that failed or
//! was cancelled forgets its mark, so the events are followed as any other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How long after its change an event about a container still counts as nodelet's own (the runtime's
/// events can lag its calls' answers under load).
pub(crate) const KEEP: Duration = Duration::from_secs(10);

/// At most this many containers are remembered: a change beyond it is not marked, and its events are
/// followed as any other (memory stays bounded whatever happens).
const MAX: usize = 4096;

/// Containers nodelet is changing or changed within the last 10 s, by ID; `None`: the call is running.
/// Cheap to clone; clones share the marks.
#[derive(Debug, Clone, Default)]
pub struct OwnChanges(Arc<Mutex<HashMap<String, Option<Instant>>>>);

impl OwnChanges {
    fn marks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Instant>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the container `id` as being changed by nodelet, until the returned guard is dropped
    /// ([`Change::done`] keeps the mark for [`KEEP`] more).
    pub(crate) fn begin(&self, id: &str) -> Change<'_> {
        let mut marks = self.marks();
        if marks.len() >= MAX {
            let now = Instant::now();
            marks.retain(|_, done| done.is_none_or(|at| now.duration_since(at) < KEEP));
        }
        let marked = marks.len() < MAX || marks.contains_key(id);
        if marked {
            marks.insert(id.to_owned(), None);
        }
        Change { own: self, id: marked.then(|| id.to_owned()) }
    }

    /// Whether an event about the container `id` reports a change nodelet is making or made within
    /// the last 10 s.
    pub fn caused(&self, id: &str) -> bool {
        let mut marks = self.marks();
        match marks.get(id) {
            Some(None) => true,
            Some(Some(at)) if at.elapsed() < KEEP => true,
            Some(Some(_)) => {
                marks.remove(id);
                false
            }
            None => false,
        }
    }

    /// How many containers are marked.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.marks().len()
    }
}

/// A change in progress (see [`OwnChanges::begin`]): dropped without [`done`](Change::done), the
/// mark goes.
#[derive(Debug)]
pub(crate) struct Change<'a> {
    own: &'a OwnChanges,
    id: Option<String>,
}

impl Change<'_> {
    /// The change succeeded: its events count as nodelet's own for [`KEEP`] more.
    pub(crate) fn done(mut self) {
        if let Some(id) = self.id.take() {
            self.own.marks().insert(id, Some(Instant::now()));
        }
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.own.marks().remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_counts_while_it_runs_and_for_a_while_after_it_succeeded() {
        let own = OwnChanges::default();
        assert!(!own.caused("c1"));
        let change = own.begin("c1");
        assert!(own.caused("c1"), "while the call runs");
        change.done();
        tokio::time::sleep(KEEP - Duration::from_millis(1)).await;
        assert!(own.caused("c1"), "an event that lags the call's answer");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!own.caused("c1"), "then events are followed again");
        assert_eq!(own.len(), 0, "and the mark is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_or_cancelled_change_is_forgotten_at_once() {
        let own = OwnChanges::default();
        drop(own.begin("c1"));
        assert!(!own.caused("c1"));
        let cancelled = async {
            let _change = own.begin("c2");
            std::future::pending::<()>().await;
        };
        assert!(tokio::time::timeout(Duration::from_millis(5), cancelled).await.is_err());
        assert!(!own.caused("c2"), "the dropped future took its mark along");
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_containers_are_marked() {
        let own = OwnChanges::default();
        for i in 0..MAX {
            own.begin(&format!("c{i}")).done();
        }
        let change = own.begin("one-more");
        assert!(!own.caused("one-more"), "beyond the bound a change is not marked");
        drop(change);
        tokio::time::sleep(KEEP).await;
        own.begin("later").done();
        assert!(own.caused("later"), "expired marks make room");
        assert_eq!(own.len(), 1);
    }
}

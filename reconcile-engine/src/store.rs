//! Typed desired-state and actual-state stores: one writer, cheap-clone readers, change
//! notification and a "synced once" gate.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::{Notify, watch};

use crate::{Key, Set};

/// Creates an empty store and returns its reader and its single writer.
///
/// The [`Writer`] is deliberately not `Clone`: exactly one populator (for desired state) or the
/// engine (for actual state) owns it. [`Store`] readers are cheap clones of one shared map.
///
/// ```
/// let (store, mut writer) = reconcile_engine::store::<String, u32>();
/// writer.insert("a".to_string(), 1);
/// assert_eq!(store.get(&"a".to_string()).as_deref(), Some(&1));
/// assert!(!store.is_synced());
/// writer.mark_synced();
/// assert!(store.is_synced());
/// ```
pub fn store<K: Key, V: Send + Sync + 'static>() -> (Store<K, V>, Writer<K, V>) {
    let (synced, _) = watch::channel(SyncState::Loading);
    let shared = Arc::new(Shared {
        map: DashMap::default(),
        len: AtomicUsize::new(0),
        version: AtomicU64::new(0),
        subscribers: Mutex::new(Vec::new()),
        has_subscribers: AtomicBool::new(false),
        synced,
    });
    (Store { shared: shared.clone() }, Writer { shared })
}

struct Shared<K, V> {
    map: DashMap<K, Arc<V>, ahash::RandomState>,
    /// Kept by the writer, so that readers never lock every shard to count.
    len: AtomicUsize,
    /// Counts writes (after each one lands, before subscribers hear of it): a value read after
    /// loading version `v` is still current while the version is `v`.
    version: AtomicU64,
    subscribers: Mutex<Vec<Weak<SubShared<K>>>>,
    /// Whether `subscribers` may be non-empty, so that a write to a store nobody subscribed to
    /// takes no lock. Set under the lock by `subscribe`, cleared under it once every
    /// subscription was dropped.
    has_subscribers: AtomicBool,
    synced: watch::Sender<SyncState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncState {
    Loading,
    Synced,
    /// The writer was dropped before it ever synced.
    Abandoned,
}

impl<K: Key, V> Shared<K, V> {
    fn notify(&self, key: &K) {
        if !self.has_subscribers.load(Ordering::Acquire) {
            return;
        }
        let mut subs = self.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        subs.retain(|weak| match weak.upgrade() {
            Some(sub) => {
                sub.dirty.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone());
                sub.notify.notify_one();
                true
            }
            None => false,
        });
        if subs.is_empty() {
            self.has_subscribers.store(false, Ordering::Release);
        }
    }
}

/// A cheap-clone, read-only view of a store.
///
/// Values are kept behind `Arc`, so [`get`](Store::get) never copies a value and never blocks
/// the writer for longer than a map lookup.
pub struct Store<K, V> {
    shared: Arc<Shared<K, V>>,
}

impl<K, V> Clone for Store<K, V> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<K: Key, V> fmt::Debug for Store<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("len", &self.shared.map.len())
            .field("synced", &*self.shared.synced.borrow())
            .finish()
    }
}

impl<K: Key, V: Send + Sync + 'static> Store<K, V> {
    /// The value stored for `key`, if any.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        if self.is_empty() {
            return None;
        }
        self.shared.map.get(key).map(|entry| entry.value().clone())
    }

    /// Whether the store holds `key`.
    pub fn contains_key(&self, key: &K) -> bool {
        !self.is_empty() && self.shared.map.contains_key(key)
    }

    /// The number of writes so far (bumped after each write lands). Loaded before a
    /// [`get`](Store::get) or a listing, it tells later whether what was read may have changed
    /// since: not while the version is the same.
    pub fn version(&self) -> u64 {
        self.shared.version.load(Ordering::Acquire)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.shared.len.load(Ordering::Relaxed)
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All keys, in no particular order.
    pub fn keys(&self) -> Vec<K> {
        self.shared.map.iter().map(|entry| entry.key().clone()).collect()
    }

    /// A copy of every entry, in no particular order (values are shared, not cloned).
    pub fn entries(&self) -> Vec<(K, Arc<V>)> {
        self.shared.map.iter().map(|entry| (entry.key().clone(), entry.value().clone())).collect()
    }

    /// A copy of every entry whose key `keep` accepts (values are shared, not cloned).
    pub(crate) fn entries_where(&self, mut keep: impl FnMut(&K) -> bool) -> Vec<(K, Arc<V>)> {
        self.shared
            .map
            .iter()
            .filter(|entry| keep(entry.key()))
            .map(|entry| (entry.key().clone(), entry.value().clone()))
            .collect()
    }

    /// Calls `f` for every entry. Do not write to this store from inside `f`.
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for entry in self.shared.map.iter() {
            f(entry.key(), entry.value());
        }
    }

    /// Whether the writer has declared the store complete once ([`Writer::mark_synced`]).
    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow() == SyncState::Synced
    }

    /// Waits until the writer has declared the store complete once. Returns at once if it has.
    /// Returns [`WriterDropped`] if the writer was dropped without ever syncing.
    pub async fn wait_until_synced(&self) -> Result<(), WriterDropped> {
        let mut rx = self.shared.synced.subscribe();
        match rx.wait_for(|state| *state != SyncState::Loading).await.map(|state| *state) {
            Ok(SyncState::Synced) => Ok(()),
            _ => Err(WriterDropped),
        }
    }

    /// Waits until the "synced" flag may have changed (it changes at most once, from `false` to
    /// `true`, or never if the writer is dropped first), for `select!` loops. Cancel-safe.
    pub async fn synced_changed(&self, rx: &mut SyncWatch) -> bool {
        match rx.0.changed().await {
            Ok(()) => *rx.0.borrow_and_update() == SyncState::Synced,
            Err(_) => std::future::pending().await,
        }
    }

    /// A handle for [`synced_changed`](Store::synced_changed).
    pub fn sync_watch(&self) -> SyncWatch {
        SyncWatch(self.shared.synced.subscribe())
    }

    /// Subscribes to changes: every key written from now on is reported, coalesced, by the
    /// returned [`Subscription`].
    pub fn subscribe(&self) -> Subscription<K> {
        self.subscribe_with(Arc::new(Notify::new()))
    }

    /// Subscribes with a [`Notify`] shared with other subscriptions, so one task can wait for a
    /// change in any of several stores.
    pub(crate) fn subscribe_with(&self, notify: Arc<Notify>) -> Subscription<K> {
        let sub = Arc::new(SubShared { dirty: Mutex::new(Set::default()), notify });
        let mut subs = self.shared.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        subs.push(Arc::downgrade(&sub));
        self.shared.has_subscribers.store(true, Ordering::Release);
        drop(subs);
        Subscription { shared: sub }
    }
}

/// The single writer of a store. Not `Clone`: one owner writes, everyone else reads.
pub struct Writer<K, V> {
    shared: Arc<Shared<K, V>>,
}

impl<K: Key, V> fmt::Debug for Writer<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer").field("len", &self.shared.map.len()).finish()
    }
}

impl<K: Key, V: Send + Sync + 'static> Writer<K, V> {
    /// A reader of this store.
    pub fn reader(&self) -> Store<K, V> {
        Store { shared: self.shared.clone() }
    }

    /// Sets the value for `key` and notifies subscribers.
    pub fn insert(&mut self, key: K, value: V) {
        self.insert_arc(key, Arc::new(value));
    }

    /// Sets an already shared value for `key` and notifies subscribers.
    pub fn insert_arc(&mut self, key: K, value: Arc<V>) {
        // A copy of the key for the subscribers, only if there are any. Asked once the value is
        // in place (under the shard's lock): a subscription made before a reader could see the
        // value is then seen here.
        let subscribed = || self.shared.has_subscribers.load(Ordering::Acquire);
        let notified = match self.shared.map.entry(key) {
            Entry::Occupied(mut entry) => {
                entry.insert(value);
                subscribed().then(|| entry.key().clone())
            }
            Entry::Vacant(entry) => {
                self.shared.len.fetch_add(1, Ordering::Relaxed);
                let entry = entry.insert(value);
                subscribed().then(|| entry.key().clone())
            }
        };
        self.shared.version.fetch_add(1, Ordering::Release);
        if let Some(key) = notified {
            self.shared.notify(&key);
        }
    }

    /// Removes `key`, returning its value; subscribers are notified only if it was present.
    pub fn remove(&mut self, key: &K) -> Option<Arc<V>> {
        let old = self.shared.map.remove(key).map(|(_, v)| v);
        if old.is_some() {
            self.shared.len.fetch_sub(1, Ordering::Relaxed);
            self.shared.version.fetch_add(1, Ordering::Release);
            self.shared.notify(key);
        }
        old
    }

    /// Declares the store complete: everything the source knows has been written once. Readers
    /// waiting in [`Store::wait_until_synced`] wake up; the engine starts running teardown
    /// operations. Calling it again has no effect.
    pub fn mark_synced(&mut self) {
        self.shared
            .synced
            .send_if_modified(|state| std::mem::replace(state, SyncState::Synced) != SyncState::Synced);
    }
}

impl<K, V> Drop for Writer<K, V> {
    fn drop(&mut self) {
        self.shared.synced.send_if_modified(|state| {
            let abandon = *state == SyncState::Loading;
            if abandon {
                *state = SyncState::Abandoned;
            }
            abandon
        });
    }
}

/// Observes a store's "synced" flag; see [`Store::synced_changed`].
#[derive(Debug)]
pub struct SyncWatch(watch::Receiver<SyncState>);

impl<K: Key, V: PartialEq + Send + Sync + 'static> Writer<K, V> {
    /// Sets `key` to `value` unless it already holds an equal value; returns whether it changed.
    /// Unchanged values notify nobody.
    pub fn upsert(&mut self, key: K, value: V) -> bool {
        if self.shared.map.get(&key).is_some_and(|old| **old == value) {
            return false;
        }
        self.insert(key, value);
        true
    }

    /// [`upsert`](Writer::upsert) of an already shared value: a value that is the one the store
    /// holds (the same `Arc`) is not compared at all.
    pub fn upsert_arc(&mut self, key: K, value: Arc<V>) -> bool {
        if self.shared.map.get(&key).is_some_and(|old| Arc::ptr_eq(&old, &value) || **old == *value) {
            return false;
        }
        self.insert_arc(key, value);
        true
    }

    /// Makes the store hold exactly `entries`: keys not listed are removed, changed values are
    /// replaced, equal values are left alone. Returns the number of keys that changed. This is
    /// what a populator calls after a full listing of its source.
    pub fn replace_all(&mut self, entries: impl IntoIterator<Item = (K, V)>) -> usize {
        self.replace_all_arc(entries.into_iter().map(|(key, value)| (key, Arc::new(value))))
    }

    /// [`replace_all`](Writer::replace_all) of already shared values: a populator that keeps the
    /// values it wrote last time and hands the same `Arc`s again pays no comparison for them.
    pub fn replace_all_arc(&mut self, entries: impl IntoIterator<Item = (K, Arc<V>)>) -> usize {
        let mut seen = Set::default();
        let mut changed = 0;
        for (key, value) in entries {
            seen.insert(key.clone());
            changed += usize::from(self.upsert_arc(key, value));
        }
        let stale: Vec<K> =
            self.shared.map.iter().filter(|e| !seen.contains(e.key())).map(|e| e.key().clone()).collect();
        for key in stale {
            changed += usize::from(self.remove(&key).is_some());
        }
        changed
    }
}

/// Returned by [`Store::wait_until_synced`] when the writer was dropped before the store synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("store writer was dropped before the store synced")]
pub struct WriterDropped;

struct SubShared<K> {
    dirty: Mutex<Set<K>>,
    notify: Arc<Notify>,
}

/// Coalesced change notifications of one store: the set of keys written since the last
/// [`drain`](Subscription::drain). A key written many times appears once.
pub struct Subscription<K> {
    shared: Arc<SubShared<K>>,
}

impl<K: Key> fmt::Debug for Subscription<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl<K: Key> Subscription<K> {
    /// Waits until at least one key changed since the last drain (returns at once if one did).
    /// Cancel-safe.
    pub async fn changed(&self) {
        loop {
            if !self.shared.dirty.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
                return;
            }
            self.shared.notify.notified().await;
        }
    }

    /// Takes the changed keys (each once, in no particular order), leaving the set empty.
    pub fn drain(&self) -> Vec<K> {
        let taken = std::mem::take(&mut *self.shared.dirty.lock().unwrap_or_else(PoisonError::into_inner));
        taken.into_iter().collect()
    }

    /// Whether no change is waiting to be drained.
    pub fn is_empty(&self) -> bool {
        self.shared.dirty.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn subscription_should_coalesce_repeated_writes_to_one_key() {
        let (store, mut writer) = store::<u32, String>();
        let sub = store.subscribe();
        writer.insert(1, "a".into());
        writer.insert(1, "b".into());
        writer.insert(2, "c".into());
        tokio::time::timeout(Duration::from_secs(1), sub.changed()).await.expect("notified");
        let mut keys = sub.drain();
        keys.sort();
        assert_eq!(keys, vec![1, 2]);
        assert!(sub.drain().is_empty());
        assert_eq!(store.get(&1).as_deref().map(String::as_str), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn changed_should_wait_for_a_write_that_happens_later() {
        let (store, mut writer) = store::<u32, u32>();
        let sub = store.subscribe();
        let waiter = tokio::spawn(async move {
            sub.changed().await;
            sub.drain()
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(!waiter.is_finished());
        writer.insert(7, 7);
        let keys = tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("woke").expect("join");
        assert!(keys.contains(&7));
    }

    #[test]
    fn upsert_and_replace_all_should_notify_only_real_changes() {
        let (store, mut writer) = store::<u32, u32>();
        let sub = store.subscribe();
        assert!(writer.upsert(1, 1));
        assert!(!writer.upsert(1, 1));
        sub.drain();
        let changed = writer.replace_all([(1, 1), (2, 2)]);
        assert_eq!(changed, 1);
        assert_eq!(sub.drain(), vec![2]);
        let changed = writer.replace_all([(2, 3)]);
        assert_eq!(changed, 2);
        assert!(!store.contains_key(&1));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn replace_all_arc_should_not_compare_the_values_it_already_holds() {
        static COMPARED: AtomicUsize = AtomicUsize::new(0);
        #[derive(Debug)]
        struct Counted(u32);
        impl PartialEq for Counted {
            fn eq(&self, other: &Self) -> bool {
                COMPARED.fetch_add(1, Ordering::Relaxed);
                self.0 == other.0
            }
        }
        let (store, mut writer) = store::<u32, Counted>();
        let sub = store.subscribe();
        let (one, two) = (Arc::new(Counted(1)), Arc::new(Counted(2)));
        assert_eq!(writer.replace_all_arc([(1, one.clone()), (2, two.clone())]), 2);
        sub.drain();
        let compared = COMPARED.load(Ordering::Relaxed);
        assert_eq!(writer.replace_all_arc([(1, one.clone()), (2, two.clone())]), 0);
        assert_eq!(COMPARED.load(Ordering::Relaxed), compared, "the same Arcs are not compared");
        assert_eq!(writer.replace_all_arc([(1, Arc::new(Counted(1))), (2, Arc::new(Counted(3)))]), 1);
        assert_eq!(COMPARED.load(Ordering::Relaxed), compared + 2, "new Arcs are");
        assert!(store.get(&1).is_some_and(|v| Arc::ptr_eq(&v, &one)), "an equal value is left alone");
        assert_eq!(store.get(&2).map(|v| v.0), Some(3));
        assert_eq!(sub.drain(), vec![2]);
        assert_eq!(writer.replace_all_arc([(2, two)]), 2, "1 removed, 2 changed back");
    }

    #[test]
    fn removing_an_absent_key_should_not_notify() {
        let (store, mut writer) = store::<u32, u32>();
        let sub = store.subscribe();
        assert!(writer.remove(&3).is_none());
        assert!(sub.drain().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_synced_should_hold_until_mark_synced_and_fail_if_writer_dropped() {
        let (store, mut writer) = store::<u32, u32>();
        let reader = store.clone();
        let waiter = tokio::spawn(async move { reader.wait_until_synced().await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(!waiter.is_finished());
        writer.mark_synced();
        assert_eq!(waiter.await.expect("join"), Ok(()));

        let (store2, writer2) = super::store::<u32, u32>();
        drop(writer2);
        assert_eq!(store2.wait_until_synced().await, Err(WriterDropped));
    }

    #[test]
    fn dropped_subscriptions_should_be_pruned() {
        let (store, mut writer) = store::<u32, u32>();
        let sub = store.subscribe();
        drop(sub);
        writer.insert(1, 1);
        assert!(store.shared.subscribers.lock().expect("lock").is_empty());
    }

    #[test]
    fn a_subscription_after_every_earlier_one_was_dropped_should_hear_of_writes() {
        let (store, mut writer) = store::<u32, u32>();
        drop(store.subscribe());
        writer.insert(1, 1); // prunes the dropped subscription: nobody listens now
        let sub = store.subscribe();
        writer.insert(2, 2);
        writer.insert(1, 3);
        writer.remove(&2);
        let mut keys = sub.drain();
        keys.sort();
        assert_eq!(keys, vec![1, 2]);
    }

    #[test]
    fn the_version_should_change_with_every_write_and_only_then() {
        let (store, mut writer) = store::<u32, u32>();
        let v0 = store.version();
        writer.insert(1, 1);
        let v1 = store.version();
        assert_ne!(v0, v1);
        assert!(writer.remove(&7).is_none());
        assert!(!writer.upsert(1, 1));
        assert_eq!(store.version(), v1, "a write that changed nothing keeps the version");
        writer.remove(&1);
        assert_ne!(store.version(), v1);
    }
}

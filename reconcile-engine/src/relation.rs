//! Relations: how one pair is planned again when another pair's stores change.
//!
//! A reconciler reads other pairs' stores as its side inputs (its
//! [`Reconciler::Inputs`](crate::Reconciler::Inputs), shown by every [`View`](crate::View)). A
//! **relation** ([`EngineBuilder::watches`](crate::EngineBuilder::watches)) subscribes to such a
//! store and maps every changed key (present or deleted) to keys of this engine, which the engine
//! plans again. Together they replace hand-written wake tasks: the reconciler stays a pure
//! function of what its view shows, and the engine knows when to look again.

use std::sync::Arc;

use prometheus::IntCounter;
use tokio::sync::Notify;

use crate::store::Subscription;
use crate::{Key, Store};

/// Maps a changed key of a watched store to keys of the watching engine.
type MapFn<K> = Box<dyn Fn(&mut dyn FnMut(K)) + Send + Sync>;

/// Whether a relation's subscription holds changes not yet mapped.
type PendingFn = Box<dyn Fn() -> bool + Send + Sync>;

/// Subscribes a relation's store, signalling the given [`Notify`].
type StartFn<K> = Box<dyn FnOnce(Arc<Notify>) -> (MapFn<K>, PendingFn) + Send>;

/// A declared relation before the engine is built: its name, and how to subscribe it.
pub(crate) struct RelationSpec<K> {
    pub(crate) name: String,
    pub(crate) start: StartFn<K>,
}

impl<K: Key> RelationSpec<K> {
    pub(crate) fn new<K2, V2, I, F>(name: String, store: Store<K2, V2>, mapper: F) -> Self
    where
        K2: Key,
        V2: Send + Sync + 'static,
        I: IntoIterator<Item = K>,
        F: Fn(&K2, Option<&V2>) -> I + Send + Sync + 'static,
    {
        let start = move |notify: Arc<Notify>| {
            let sub: Subscription<K2> = store.subscribe_with(notify);
            let sub = Arc::new(sub);
            let pending = {
                let sub = sub.clone();
                Box::new(move || !sub.is_empty()) as PendingFn
            };
            let map = Box::new(move |out: &mut dyn FnMut(K)| {
                for changed in sub.drain() {
                    let value = store.get(&changed);
                    for key in mapper(&changed, value.as_deref()) {
                        out(key);
                    }
                }
            }) as MapFn<K>;
            (map, pending)
        };
        Self { name, start: Box::new(start) }
    }
}

/// A running relation of an engine.
pub(crate) struct Relation<K> {
    pub(crate) name: String,
    map: MapFn<K>,
    pending: PendingFn,
    pub(crate) wakeups: IntCounter,
}

/// The relations of one engine, all signalling one [`Notify`].
pub(crate) struct Relations<K> {
    relations: Vec<Relation<K>>,
    notify: Arc<Notify>,
}

impl<K: Key> Relations<K> {
    pub(crate) fn start(specs: Vec<RelationSpec<K>>, wakeups: impl Fn(&str) -> IntCounter) -> Self {
        let notify = Arc::new(Notify::new());
        let relations = specs
            .into_iter()
            .map(|spec| {
                let (map, pending) = (spec.start)(notify.clone());
                let wakeups = wakeups(&spec.name);
                Relation { name: spec.name, map, pending, wakeups }
            })
            .collect();
        Self { relations, notify }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.relations.is_empty()
    }

    /// Waits until a watched store changed since the last [`drain`](Self::drain). Cancel-safe.
    pub(crate) async fn changed(&self) {
        loop {
            if self.relations.iter().any(|r| (r.pending)()) {
                return;
            }
            self.notify.notified().await;
        }
    }

    /// Maps every change since the last drain to keys of this engine and hands them to `wake`.
    pub(crate) fn drain(&mut self, mut wake: impl FnMut(K)) {
        for relation in &self.relations {
            let mut n = 0u64;
            (relation.map)(&mut |key| {
                n += 1;
                wake(key);
            });
            if n > 0 {
                relation.wakeups.inc_by(n);
                tracing::trace!(relation = %relation.name, keys = n, "relation woke keys");
            }
        }
    }
}

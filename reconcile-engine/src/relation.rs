//! Relations and side inputs: how one pair depends on another pair's stores.
//!
//! A **side input** is a read-only [`Store`] a reconciler reads besides its own desired and actual
//! stores, registered on the builder ([`EngineBuilder::reads`](crate::EngineBuilder::reads)) and
//! read in `reconcile()` through [`View::input`](crate::View::input). A **relation**
//! ([`EngineBuilder::watches`](crate::EngineBuilder::watches)) also subscribes to that store and
//! maps every changed key (present or deleted) to keys of this engine, which the engine plans
//! again. Together they replace hand-written wake tasks: the reconciler stays a pure function of
//! what its [`View`](crate::View) shows, and the engine knows when to look again.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use prometheus::IntCounter;
use tokio::sync::Notify;

use crate::store::Subscription;
use crate::{Key, Store};

/// The side inputs of one engine: read-only stores its reconciler reads through
/// [`View::input`](crate::View::input), one per store type (`Store<K, V>`).
///
/// The engine keeps the inputs registered with
/// [`EngineBuilder::reads`](crate::EngineBuilder::reads) and
/// [`EngineBuilder::watches`](crate::EngineBuilder::watches). Tests of a reconciler build their
/// own and pass them to [`View::with_inputs`](crate::View::with_inputs):
///
/// ```
/// use reconcile_engine::{Inputs, store};
///
/// let (devices, mut writer) = store::<String, bool>();
/// writer.insert("sda".into(), true);
/// let inputs = Inputs::new().with(devices);
/// let read = inputs.get::<String, bool>().expect("registered");
/// assert_eq!(read.get(&"sda".to_string()).as_deref(), Some(&true));
/// assert!(inputs.get::<u32, bool>().is_none());
/// ```
#[derive(Default)]
pub struct Inputs {
    stores: Vec<(TypeId, Box<dyn Any + Send + Sync>)>,
}

impl fmt::Debug for Inputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inputs").field("stores", &self.stores.len()).finish()
    }
}

/// No inputs, for views built without any.
pub(crate) static NO_INPUTS: Inputs = Inputs { stores: Vec::new() };

impl Inputs {
    /// No side inputs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `store` as the input of its type, replacing an earlier store of the same type.
    #[must_use]
    pub fn with<K: Key, V: Send + Sync + 'static>(mut self, store: Store<K, V>) -> Self {
        self.insert(store);
        self
    }

    /// Adds `store` as the input of its type, replacing an earlier store of the same type.
    pub fn insert<K: Key, V: Send + Sync + 'static>(&mut self, store: Store<K, V>) {
        let id = TypeId::of::<Store<K, V>>();
        self.stores.retain(|(t, _)| *t != id);
        self.stores.push((id, Box::new(store)));
    }

    /// The input of type `Store<K, V>`, if one was registered.
    pub fn get<K: Key, V: Send + Sync + 'static>(&self) -> Option<&Store<K, V>> {
        let id = TypeId::of::<Store<K, V>>();
        self.stores.iter().find(|(t, _)| *t == id).and_then(|(_, s)| s.downcast_ref())
    }

    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.stores.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }
}

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

//! The node's metric families: a Prometheus registry and the metrics registered in it, each kind made
//! once ([`MetricFamilies::get`]).
//!
//! A real node has one set for `/metrics` and one for `/metrics/probes`, its own. The hollow nodes of one
//! `nodelet hollow` process share one set (none of them serves `/metrics`): every node records into the
//! same metrics, so counters and histograms add up over the nodes and a gauge holds what the node that
//! set it last saw, and the metrics' memory is paid once per process instead of once per node.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::Registry;

/// A registry and the metrics made in it, by type. Cheap to clone (clones share both).
#[derive(Clone, Default)]
pub struct MetricFamilies {
    registry: Registry,
    made: Arc<Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>>,
}

impl std::fmt::Debug for MetricFamilies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made = self.made.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("MetricFamilies").field("made", &made).finish_non_exhaustive()
    }
}

impl MetricFamilies {
    /// An empty registry with nothing made yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The registry (what `/metrics` gathers).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The metrics of type `T`: made by `make` in [`registry`](Self::registry) the first time, the same
    /// metrics (a clone) every later time. `make` registers its families; an error of `make` is returned
    /// and nothing is kept, so a later call tries again.
    pub fn get<T, F>(&self, make: F) -> Result<T, prometheus::Error>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce(&Registry) -> Result<T, prometheus::Error>,
    {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = made.get(&TypeId::of::<T>()).and_then(|m| m.downcast_ref::<T>()) {
            return Ok(kept.clone());
        }
        let metrics = make(&self.registry)?;
        made.insert(TypeId::of::<T>(), Box::new(metrics.clone()));
        Ok(metrics)
    }
}

/// A node's two sets: `/metrics`'s and `/metrics/probes`'s (the prober's metrics are served apart, as
/// the kubelet does).
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeFamilies {
    /// `/metrics`.
    pub(crate) main: MetricFamilies,
    /// `/metrics/probes`.
    pub(crate) probes: MetricFamilies,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Started(prometheus::IntCounter);

    fn started(registry: &Registry) -> Result<Started, prometheus::Error> {
        let c = prometheus::IntCounter::new("test_started_total", "Started things.")?;
        registry.register(Box::new(c.clone()))?;
        Ok(Started(c))
    }

    fn text(families: &MetricFamilies) -> String {
        prometheus::TextEncoder::new().encode_to_string(&families.registry().gather()).unwrap_or_default()
    }

    #[test]
    fn a_kind_is_made_and_registered_once_and_every_getter_records_into_it() {
        let families = MetricFamilies::new();
        let a = families.get(started).expect("made");
        // A second `make` would fail with AlreadyReg: it is not called.
        let b = families.clone().get(started).expect("the same metrics");
        a.0.inc();
        b.0.inc_by(2);
        assert_eq!(a.0.get(), 3);
        assert!(text(&families).contains("test_started_total 3"), "{}", text(&families));
        assert!(format!("{families:?}").contains("made: 1"));
    }

    #[test]
    fn separate_families_make_separate_metrics() {
        let (one, two) = (MetricFamilies::new(), MetricFamilies::new());
        one.get(started).expect("made").0.inc();
        two.get(started).expect("made");
        assert!(text(&one).contains("test_started_total 1"));
        assert!(text(&two).contains("test_started_total 0"));
    }

    #[test]
    fn a_failed_make_keeps_nothing_and_the_next_call_tries_again() {
        let families = MetricFamilies::new();
        let failed = families.get::<Started, _>(|_| Err(prometheus::Error::AlreadyReg));
        assert!(failed.is_err());
        families.get(started).expect("made on the second call").0.inc();
        assert!(text(&families).contains("test_started_total 1"));
    }
}

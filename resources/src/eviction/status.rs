//! The eviction pair's status: the node's pressure conditions as the node object shows them
//! ([`PressureView`]), updated by the [`EvictionDriver`](super::driver::EvictionDriver) at every
//! pass.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError, RwLock};

use crate::model::pressure::Condition;

/// One pressure condition as the node status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionStatus {
    /// The condition.
    pub condition: Condition,
    /// Whether the node is under this pressure.
    pub pressure: bool,
    /// When it last changed, nanoseconds since the Unix epoch.
    pub last_transition: i64,
    /// When it was last checked.
    pub last_heartbeat: i64,
}

/// The node's pressure conditions, shared with whoever shows the node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PressureView {
    inner: Arc<RwLock<Vec<ConditionStatus>>>,
}

impl PressureView {
    /// Every condition `False` since `now`.
    pub fn new(now: i64) -> Self {
        let all = Condition::ALL
            .into_iter()
            .map(|condition| ConditionStatus {
                condition,
                pressure: false,
                last_transition: now,
                last_heartbeat: now,
            })
            .collect();
        Self { inner: Arc::new(RwLock::new(all)) }
    }

    /// The conditions, in the kubelet's order.
    pub fn conditions(&self) -> Vec<ConditionStatus> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Sets which conditions are true at `now`; returns the ones that changed.
    pub(crate) fn update(&self, pressure: &BTreeSet<Condition>, now: i64) -> Vec<(Condition, bool)> {
        let mut changed = Vec::new();
        let mut all = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        for c in all.iter_mut() {
            let p = pressure.contains(&c.condition);
            if p != c.pressure {
                c.pressure = p;
                c.last_transition = now;
                changed.push((c.condition, p));
            }
            c.last_heartbeat = now;
        }
        changed
    }
}

//! What other pairs read of the sandbox pair: a pod's sandboxes as this pair's actual store has
//! them, and the last failed sandbox operation of a pod (for pod status and events).

use std::sync::Arc;

use reconcile_engine::{OpStatus, Store};

use super::ops::SandboxOp;
use crate::model::actual::{PodSandboxes, SandboxRecord};
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::runtime::RuntimeError;

/// The last failed operation on a pod's sandboxes, as the engine records it.
pub type SandboxOpStatus = OpStatus<SandboxOp, RuntimeError>;

/// Read access to the sandbox pair's stores.
#[derive(Debug, Clone)]
pub struct SandboxView {
    actual: Store<PodUid, PodSandboxes>,
    failures: Option<Store<PodUid, SandboxOpStatus>>,
}

impl SandboxView {
    /// A view of the sandbox actual store `actual` and (if given) the sandbox engine's failures.
    pub fn new(
        actual: Store<PodUid, PodSandboxes>,
        failures: Option<Store<PodUid, SandboxOpStatus>>,
    ) -> Self {
        Self { actual, failures }
    }

    /// The sandbox actual store.
    pub fn actual(&self) -> &Store<PodUid, PodSandboxes> {
        &self.actual
    }

    /// The sum of its stores' [versions](Store::version) (wrapping): the same while neither changed.
    pub fn version(&self) -> u64 {
        self.actual.version().wrapping_add(self.failures.as_ref().map_or(0, Store::version))
    }

    /// The pod `uid`'s sandboxes as the sandbox pair has them (newest first). A ready sandbox that no
    /// longer fits `pod` (see [`super::desired::SandboxSpec::matches`]) shows as not ready: the pod's
    /// containers must stop so that the sandbox pair can replace it.
    pub fn sandboxes(&self, pod: Option<&DesiredPod>, uid: &str) -> Vec<SandboxRecord> {
        let mut sandboxes = self.actual.get(&uid.to_owned()).map(|s| s.sandboxes.clone()).unwrap_or_default();
        if let Some(pod) = pod {
            for s in &mut sandboxes {
                s.ready &= fits(pod, s);
            }
        }
        sandboxes
    }

    /// The pod's sandboxes as the sandbox pair has them.
    pub fn of(&self, uid: &str) -> Option<Arc<PodSandboxes>> {
        self.actual.get(&uid.to_owned())
    }

    /// The last failed operation on the pod's sandboxes, if any.
    pub fn failure(&self, uid: &str) -> Option<Arc<SandboxOpStatus>> {
        self.failures.as_ref()?.get(&uid.to_owned())
    }

    /// The error of the pod's last failed attempt to create its sandbox, if its last failed operation was one.
    pub fn create_failure(&self, uid: &str) -> Option<String> {
        self.failure(uid).and_then(|f| match &f.op {
            SandboxOp::Create { .. } => Some(f.error.to_string()),
            _ => None,
        })
    }

    /// Every pod whose last sandbox operation failed.
    pub fn failures(&self) -> Vec<(PodUid, Arc<SandboxOpStatus>)> {
        self.failures.as_ref().map(Store::entries).unwrap_or_default()
    }
}

/// Whether the spec `pod` would get matches `sandbox` (see [`super::desired::SandboxSpec::matches`]).
pub fn fits(pod: &DesiredPod, sandbox: &SandboxRecord) -> bool {
    sandbox.host_network == pod.host_network()
}

/// The mapper of the pod pair's relation on the sandbox actual store: a pod's sandboxes changed,
/// plan the pod again (the same key).
pub fn pod_of_sandboxes(uid: &PodUid, _sandboxes: Option<&PodSandboxes>) -> Option<PodUid> {
    Some(uid.clone())
}

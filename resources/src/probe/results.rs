//! Probe results: one entry per running container that has probes, keyed by the runtime's
//! container ID, in a [`reconcile_engine::Store`] the prober owns the writer of. The pod reconciler
//! and the status code hold readers; the pod engine watches the store (relation `probes`, mapper
//! [`pod_of_probes`]), so a changed result plans the container's pod again.

use reconcile_engine::Store;

use super::desired::ProbeKind;
use crate::model::pod::PodUid;

/// A probe's current result, as the kubelet's results managers keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// The probe passed (for `successThreshold` runs in a row).
    Success,
    /// The probe failed (for `failureThreshold` runs in a row).
    Failure,
    /// Not known yet (a startup probe that has not decided).
    Unknown,
}

/// The last failed run of a probe, for events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// Which probe.
    pub kind: ProbeKind,
    /// What the handler said (`HTTP probe failed with statuscode: 500`, a command's output, …).
    pub message: String,
    /// Failed runs of this container's probes so far.
    pub count: u32,
}

/// The probe results of one container (one attempt: a restarted container has a new ID and
/// starts afresh).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerProbes {
    /// The pod's UID.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The container's name.
    pub container: String,
    /// Liveness result, if the container has the probe (starts as `Success`).
    pub liveness: Option<ProbeResult>,
    /// Readiness result, if the container has the probe (starts as `Failure`).
    pub readiness: Option<ProbeResult>,
    /// Startup result, if the container has the probe (starts as `Unknown`).
    pub startup: Option<ProbeResult>,
    /// The last failed run, if any.
    pub last_failure: Option<ProbeFailure>,
}

impl ContainerProbes {
    /// The kubelet's initial results for a container with the given probes.
    pub fn initial(
        pod_uid: &str,
        namespace: &str,
        pod_name: &str,
        container: &str,
        kinds: impl IntoIterator<Item = ProbeKind>,
    ) -> Self {
        let mut entry = ContainerProbes {
            pod_uid: pod_uid.to_string(),
            namespace: namespace.to_string(),
            pod_name: pod_name.to_string(),
            container: container.to_string(),
            liveness: None,
            readiness: None,
            startup: None,
            last_failure: None,
        };
        for kind in kinds {
            let initial = match kind {
                ProbeKind::Liveness => ProbeResult::Success,
                ProbeKind::Readiness => ProbeResult::Failure,
                ProbeKind::Startup => ProbeResult::Unknown,
            };
            *entry.result_mut(kind) = Some(initial);
        }
        entry
    }

    /// The result of the probe `kind` (`None`: the container has no such probe).
    pub fn result(&self, kind: ProbeKind) -> Option<ProbeResult> {
        match kind {
            ProbeKind::Liveness => self.liveness,
            ProbeKind::Readiness => self.readiness,
            ProbeKind::Startup => self.startup,
        }
    }

    /// The result slot of the probe `kind`.
    pub fn result_mut(&mut self, kind: ProbeKind) -> &mut Option<ProbeResult> {
        match kind {
            ProbeKind::Liveness => &mut self.liveness,
            ProbeKind::Readiness => &mut self.readiness,
            ProbeKind::Startup => &mut self.startup,
        }
    }

    /// Whether the startup probe (if any) has succeeded.
    pub fn started(&self) -> bool {
        self.startup.is_none_or(|r| r == ProbeResult::Success)
    }

    /// The probe whose failure gets the container killed: liveness or startup, if either failed.
    pub fn fatal_failure(&self) -> Option<ProbeKind> {
        if self.startup == Some(ProbeResult::Failure) {
            Some(ProbeKind::Startup)
        } else if self.liveness == Some(ProbeResult::Failure) {
            Some(ProbeKind::Liveness)
        } else {
            None
        }
    }
}

/// A reader of the probe results, keyed by container ID.
pub type ProbeResults = Store<String, ContainerProbes>;

/// The mapper of the pod engine's relation on the results store: a container's results changed,
/// plan its pod again. A removed entry maps to nothing: it goes when the runtime no longer has the
/// container, a change of the pod store that already planned the pod.
pub fn pod_of_probes(_container_id: &String, results: Option<&ContainerProbes>) -> Option<PodUid> {
    results.map(|r| r.pod_uid.clone())
}

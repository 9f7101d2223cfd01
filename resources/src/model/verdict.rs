//! The node's verdicts on its pods: the value of the verdict store (`Store<PodUid, Verdict>`) that the eviction
//! pair's verdict populator writes (admission, deadlines, evictions) and the pod, volume and sandbox pairs read.
//!
//! - [`Verdict`]: admitted (with a pending in-place resize that could not be granted, if any), or stopped for
//!   good ([`Stopped`]): refused at admission or evicted under node pressure.
//! - [`ResizeDecision`]: what admission says of a running pod's new requests.
//! - [`pod_requests`]: a pod's requests as admission counts them.

use std::time::Duration;

use crate::model::pod::{DesiredPod, is_sidecar};

/// The status reason of a pod stopped at its `activeDeadlineSeconds`.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// Why a pod was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerdictKind {
    /// Stopped while admitted: evicted because of node pressure or a local storage limit, or past
    /// its `activeDeadlineSeconds`.
    Evicted,
    /// Refused before it ran (admission).
    Rejected,
}

/// A pod stopped for good, as its status shows it: phase `Failed` with this reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// Evicted or rejected.
    pub kind: VerdictKind,
    /// The status reason (`Evicted`, `OutOfcpu`, `NodeAffinity`, ...).
    pub reason: String,
    /// The status message.
    pub message: String,
    /// The grace period its containers are killed with.
    pub grace: Duration,
    /// When it was decided, nanoseconds since the Unix epoch (0 when unknown).
    pub at: i64,
    /// Whether the status gets the `DisruptionTarget` condition: the kubelet sets it for a
    /// node-pressure eviction, not for an eviction over a local storage limit.
    pub disruption_target: bool,
}

/// The node's word on one pod: the value of the verdict store (`Store<PodUid, Verdict>`), written
/// only by the [`VerdictPopulator`](crate::eviction::populator::VerdictPopulator). A pod without a verdict
/// has not been through admission yet: it does not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted: the pod may run.
    Admitted {
        /// The pod's own requests admission granted (without RuntimeClass overhead): what its
        /// containers may be given. A spec asking for other requests is an in-place resize, applied
        /// once granted.
        granted: Requests,
        /// The requests of a resize that could not be granted, and why (`Deferred`, `Infeasible`).
        resize: Option<(Requests, ResizeDecision)>,
    },
    /// Refused at admission, or evicted: the pod never runs (again).
    Stopped(Stopped),
}

impl Verdict {
    /// Admitted with the requests `pod` has, nothing pending.
    pub fn admitted(pod: &DesiredPod) -> Self {
        Verdict::Admitted { granted: pod_requests(pod), resize: None }
    }

    /// Refused at admission with the status `reason` and `message`.
    pub fn rejected(reason: &str, message: String) -> Self {
        Verdict::Stopped(Stopped {
            kind: VerdictKind::Rejected,
            reason: reason.to_owned(),
            message,
            grace: Duration::ZERO,
            at: 0,
            disruption_target: false,
        })
    }

    /// Evicted under node pressure, with the kubelet's reason `Evicted` (and the
    /// `DisruptionTarget` condition).
    pub fn evicted(message: String, grace: Duration, at: i64) -> Self {
        Self::evicted_with(message, grace, at, true)
    }

    /// Evicted over a local storage limit (emptyDir `sizeLimit`, `ephemeral-storage` limits), with
    /// the kubelet's reason `Evicted` and, as the kubelet does, no `DisruptionTarget` condition.
    pub fn evicted_over_limit(message: String, grace: Duration, at: i64) -> Self {
        Self::evicted_with(message, grace, at, false)
    }

    /// Stopped because it was active on the node longer than its `activeDeadlineSeconds`: the
    /// kubelet's reason `DeadlineExceeded` and message, its containers killed with `grace` (the
    /// pod's own grace period), no `DisruptionTarget` condition.
    pub fn deadline_exceeded(grace: Duration, at: i64) -> Self {
        Verdict::Stopped(Stopped {
            kind: VerdictKind::Evicted,
            reason: DEADLINE_EXCEEDED.into(),
            message: "Pod was active on the node longer than the specified deadline".into(),
            grace,
            at,
            disruption_target: false,
        })
    }

    fn evicted_with(message: String, grace: Duration, at: i64, disruption_target: bool) -> Self {
        Verdict::Stopped(Stopped {
            kind: VerdictKind::Evicted,
            reason: "Evicted".into(),
            message,
            grace,
            at,
            disruption_target,
        })
    }

    /// The stop, if the pod is refused or evicted.
    pub fn stopped(&self) -> Option<&Stopped> {
        match self {
            Verdict::Stopped(s) => Some(s),
            Verdict::Admitted { .. } => None,
        }
    }

    /// Whether the pod may run.
    pub fn is_admitted(&self) -> bool {
        matches!(self, Verdict::Admitted { .. })
    }

    /// Admission's word on the requests `pod` (this verdict's pod, as its spec is now) asks for:
    /// `Accepted` when granted, `Deferred` or `Infeasible` when refused for now or for good,
    /// `None` while not decided yet (or the pod is stopped).
    pub fn resize_for(&self, pod: &DesiredPod) -> Option<ResizeDecision> {
        let Verdict::Admitted { granted, resize } = self else { return None };
        let asked = pod_requests(pod);
        if asked == *granted {
            return Some(ResizeDecision::Accepted);
        }
        resize.filter(|(r, _)| *r == asked).map(|(_, d)| d)
    }

    /// The requests granted, if admitted.
    pub fn granted(&self) -> Option<Requests> {
        match self {
            Verdict::Admitted { granted, .. } => Some(*granted),
            Verdict::Stopped(_) => None,
        }
    }
}

/// A pod's (cpu millicores, memory bytes) requests.
pub type Requests = (i64, i64);

/// A pod's requests as admission counts them: the larger of the sum over its app containers and
/// sidecars and the largest init container (plus the sidecars started before it), per resource (a request defaults to the limit when only that is set).
pub fn pod_requests(pod: &DesiredPod) -> Requests {
    let request = |c: &k8s_openapi::api::core::v1::Container, name: &str, scale: i64| -> i64 {
        let res = c.resources.as_ref();
        res.and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(name))
            .or_else(|| res.and_then(|r| r.limits.as_ref()).and_then(|l| l.get(name)))
            .and_then(|q| crate::quantity::Quantity::parse(&q.0))
            .map_or(0, |q| q.scaled_ceil(scale))
    };
    // Sidecars run beside everything started after them: they add to the app containers' sum and
    // to every later init container (the API's `PodRequests`).
    let sum = |name: &str, scale: i64| -> i64 {
        let mut running =
            pod.containers().iter().map(|c| request(c, name, scale)).fold(0_i64, i64::saturating_add);
        let (mut sidecars, mut init) = (0_i64, 0_i64);
        for c in pod.init_containers() {
            let own = request(c, name, scale);
            let peak = if is_sidecar(c) {
                running = running.saturating_add(own);
                sidecars = sidecars.saturating_add(own);
                sidecars
            } else {
                own.saturating_add(sidecars)
            };
            init = init.max(peak);
        }
        running.max(init)
    };
    (sum("cpu", 1000), sum("memory", 1))
}

/// What admission says of a running pod's new requests (in-place resize), as `status.resize` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeDecision {
    /// The node has room: the new requests are the pod's allocation now.
    Accepted,
    /// Not now: other pods use what it needs (tried again at every sync).
    Deferred,
    /// Never: more than the node's allocatable resources.
    Infeasible,
}

impl ResizeDecision {
    /// The `status.resize` value while the resize is pending or under way.
    pub fn status(self) -> &'static str {
        match self {
            ResizeDecision::Accepted => "InProgress",
            ResizeDecision::Deferred => "Deferred",
            ResizeDecision::Infeasible => "Infeasible",
        }
    }
}

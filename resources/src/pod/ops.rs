//! The operations of the pod reconciler: each one step the kubelet's pod worker also takes
//! (sandboxes are the sandbox pair's: [`crate::sandbox::ops`]).

use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::Operation;

use super::driver::ContainerKind;
use crate::model::pod::DesiredPod;
use crate::model::volumes::PodVolumes;

/// How many pod operations the pod engine runs at once: no bound (`0`). The engine already runs at
/// most one operation per pod, and admission bounds the pods (`maxPods`), so this is the kubelet's
/// one worker per pod; a smaller bound would let a few slow operations (postStart hooks that take
/// minutes, long grace periods) of many pods hold every slot and starve the other pods.
pub const MAX_CONCURRENT_OPS: usize = 0;

/// One step on one pod. At most one runs per pod at a time (the engine's per-key guarantee).
#[derive(Debug, Clone, PartialEq)]
pub enum PodOp {
    /// Read the pod's state from the runtime again (after an operation whose result is unknown).
    Refresh,
    /// Pull the image if needed, then create and start one container.
    StartContainer {
        /// The pod.
        pod: Arc<DesiredPod>,
        /// The sandbox to start it in.
        sandbox_id: String,
        /// The container's name.
        name: String,
        /// Init, app or ephemeral container.
        kind: ContainerKind,
        /// Its restart count (0 for the first run).
        restart_count: u32,
        /// The restart count at which this spec of the container first ran (the crash-loop back-off counts
        /// from there: [`ContainerRecord::backoff_since`](crate::model::actual::ContainerRecord::backoff_since)).
        backoff_since: u32,
        /// The pod's volumes, set up (what the container's `volumeMounts` refer to).
        volumes: Arc<PodVolumes>,
    },
    /// Stop running containers (whose spec changed) with the pod's grace period.
    KillContainers {
        /// Their IDs.
        ids: Vec<String>,
        /// The grace period.
        grace: Duration,
    },
    /// Change a running container's CPU and memory in place (in-place resize).
    ResizeContainer {
        /// The container's runtime ID.
        id: String,
        /// Its new cgroup settings.
        resources: crate::model::cgroup::CgroupResources,
    },
    /// Stop every container (with the grace period); with `remove`, also remove them and the pod's
    /// logs (the pod is gone from desired state). Its sandboxes are the sandbox pair's.
    KillPod {
        /// The grace period.
        grace: Duration,
        /// Remove the containers afterwards.
        remove: bool,
    },
    /// Remove dead containers (with their logs) that container GC chose (see [`super::gc`]).
    PruneContainers {
        /// Their IDs.
        ids: Vec<String>,
    },
}

impl Operation for PodOp {
    fn kind(&self) -> &'static str {
        match self {
            PodOp::Refresh => "refresh",
            // Its own kind, so that a failing ephemeral container's back-off never holds up the
            // start of the pod's other containers.
            PodOp::StartContainer { kind: ContainerKind::Ephemeral, .. } => "start_ephemeral_container",
            PodOp::StartContainer { .. } => "start_container",
            PodOp::KillContainers { .. } => "kill_containers",
            PodOp::ResizeContainer { .. } => "resize_container",
            PodOp::KillPod { remove: false, .. } => "kill_pod",
            PodOp::KillPod { remove: true, .. } => "remove_pod",
            PodOp::PruneContainers { .. } => "prune_containers",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, PodOp::KillPod { remove: true, .. })
    }

    /// A container start (with its postStart hook) is given up only when the pod is being
    /// terminated, as the kubelet's pod worker cancels a sync only when the pod is killed: the plan
    /// is to kill the pod (it is deleted, evicted, past its `activeDeadlineSeconds`, finished, or
    /// its sandbox is gone), or no operation at all (the same cases once nothing else of the pod
    /// runs; also, rarely, the pod's volumes no longer ready). Any other new plan (the pod changed
    /// in a field that does not touch this start, another container's probe failed) waits for the
    /// start to end and is made again from its outcome. Every other operation is given up whenever
    /// the plan changes.
    fn given_up_for(&self, next: Option<&Self>) -> bool {
        match self {
            PodOp::StartContainer { .. } => matches!(next, None | Some(PodOp::KillPod { .. })),
            _ => true,
        }
    }

    fn timeout(&self) -> Option<Duration> {
        match self {
            // An image pull can take long; the runtime client bounds the pull itself.
            PodOp::StartContainer { .. } => Some(Duration::from_secs(30 * 60)),
            // Containers get their whole grace period, then the runtime's own time to kill.
            PodOp::KillContainers { grace, .. } | PodOp::KillPod { grace, .. } => {
                Some(*grace + Duration::from_secs(120))
            }
            PodOp::PruneContainers { .. } => Some(Duration::from_secs(120)),
            PodOp::Refresh | PodOp::ResizeContainer { .. } => None,
        }
    }
}

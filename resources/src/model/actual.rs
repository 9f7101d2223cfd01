//! Actual state of pods as the runtime reports it for each pod UID, in two records with one owner each:
//! the pod pair's actual value ([`PodActual`]: the pod's containers) and the sandbox pair's
//! ([`PodSandboxes`]: its sandboxes). A runtime read of a pod gives both apart ([`ListedPod`]); no record
//! carries the other's facts.
//!
//! **Who reads a pod's sandboxes from where.** Every reader of a store takes the sandbox records from the
//! sandbox pair's actual store (`Store<PodUid, PodSandboxes>`): the pod reconciler and pod status
//! (`SandboxView::sandboxes`), the sandbox reconciler, the prober (`probe::worker`), the verdict populator
//! (a pod already in the runtime, the start of an active deadline), the node's `/runningpods` and
//! `kubelet_running_pods`. A runtime read's [`ListedPod::sandboxes`] is read only where that read is at
//! hand before it reaches a store: the pod driver (the start duration, from the pod's first sandbox) and
//! the PLEG (which reports that read's sandboxes to the sandbox pair and its containers to the pod pair).
//!
//! **Why joining the two stores decides as the one listing did.** The PLEG reports one listing to both
//! stores, but each engine applies its observation in its own loop, so a reader may see one store ahead
//! of the other. It never sees a container in a sandbox that the sandbox store lacks: a sandbox enters
//! that store from its `Create` outcome (or from the start-up reconstruction, which the pod engine and
//! the verdict populator wait for; the prober probes no container of a pod before that store has the
//! pod's sandbox) before the pod pair starts any container in it, and the sandbox pair stops or removes a
//! sandbox only once the pod actual store shows its containers stopped or gone. What is left is a sandbox
//! dying under running containers: for the length of one engine pass one store shows it dead and the
//! other not, and the readers act on it at the next change of either store (the pod reconciler kills the
//! containers, the prober stops their workers), as they did on the listing.
//!
//! Everything here is rebuilt from the runtime (labels and annotations nodelet puts on what it
//! creates), so a restarted nodelet finds its pods again.
//!
//! Two rules on these records are shared by the pod and sandbox pairs: whether a pod has [`finished`] (its
//! sandbox is released) and which of its sandboxes are dead ([`dead_sandboxes`], the kubelet's sandbox GC).

use std::sync::Arc;

use crate::model::pod::{DesiredPod, RestartPolicy, is_sidecar};

/// What the runtime has for one pod, as one read of it saw it: its containers (the pod pair's actual
/// value) and its sandboxes (the sandbox pair's), apart. A runtime may hand out the same `Arc`s again
/// for a pod unchanged since its last listing (see
/// [`PodRuntime::list_pods`](crate::pod::driver::PodRuntime::list_pods)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListedPod {
    /// The pod's containers. A pod the runtime has only sandboxes of has one too, without containers
    /// (its identity from the sandboxes' labels).
    pub pod: Arc<PodActual>,
    /// Its sandboxes (`None`: it has none).
    pub sandboxes: Option<Arc<PodSandboxes>>,
}

impl ListedPod {
    /// Whether `self` and `other` hold the same allocations (a runtime handed out the same read again).
    pub fn same(&self, other: &ListedPod) -> bool {
        Arc::ptr_eq(&self.pod, &other.pod)
            && match (&self.sandboxes, &other.sandboxes) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// What the runtime has of one pod's containers: the pod pair's actual value. Its sandboxes are the
/// sandbox pair's ([`PodSandboxes`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodActual {
    /// The pod's UID.
    pub uid: String,
    /// Its namespace, as labelled.
    pub namespace: String,
    /// Its name, as labelled.
    pub name: String,
    /// Its containers, every attempt, newest first.
    pub containers: Vec<ContainerRecord>,
    /// The pod's termination grace period in seconds, from the annotation nodelet puts on its
    /// containers (`io.kubernetes.pod.terminationGracePeriod`), for tearing down a pod whose
    /// manifest is gone.
    pub termination_grace_secs: Option<u64>,
    /// An operation on this pod ended with an unknown result: refresh from the runtime before
    /// planning anything else.
    pub needs_refresh: bool,
}

/// A pod sandbox.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SandboxRecord {
    /// Runtime ID.
    pub id: String,
    /// Whether the runtime reports it ready.
    pub ready: bool,
    /// The pod IP, if it has a network of its own.
    pub ip: Option<String>,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// Which attempt this sandbox is (0 for the first).
    pub attempt: u32,
    /// Whether it shares the node's network namespace (made for a `hostNetwork` pod).
    pub host_network: bool,
    /// The runtime handler it runs with (`""`: the runtime's default).
    pub runtime_handler: String,
}

/// The sandboxes of one pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSandboxes {
    /// The pod's UID.
    pub uid: String,
    /// Its namespace, as labelled.
    pub namespace: String,
    /// Its name, as labelled.
    pub name: String,
    /// Its sandboxes, newest first (normally one; more after a sandbox was replaced).
    pub sandboxes: Vec<SandboxRecord>,
    /// An operation ended with an unknown result: read the runtime again before planning.
    pub needs_refresh: bool,
}

impl PodSandboxes {
    /// The newest sandbox, if any.
    pub fn newest(&self) -> Option<&SandboxRecord> {
        self.sandboxes.first()
    }

    /// The newest sandbox if it is ready.
    pub fn ready(&self) -> Option<&SandboxRecord> {
        self.newest().filter(|s| s.ready)
    }
}

/// The state of a container as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    #[default]
    Unknown,
}

/// One container (one attempt of one container of the pod).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContainerRecord {
    /// Runtime ID.
    pub id: String,
    /// The container's name in the pod spec.
    pub name: String,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// Its restart count (the attempt number), from its annotation.
    pub restart_count: u32,
    /// The restart count at which its spec (hash without `resources`) was first run, from its annotation
    /// (`None` on containers created before nodelet recorded it: counted from 0). The crash-loop back-off
    /// counts the restarts since then, as the kubelet keys its back-off by the container's spec hash: a new
    /// image starts the back-off afresh.
    pub backoff_since: Option<u32>,
    /// Hash of the container spec it was created from, from its annotation.
    pub spec_hash: Option<String>,
    /// The same without `resources` (containers created by nodelet ≥ 0.1 with resize support).
    pub spec_hash_without_resources: Option<String>,
    /// Its CPU and memory cgroup settings as the runtime reports them (`None`: not reported).
    pub applied: Option<crate::model::cgroup::CgroupResources>,
    /// Its state.
    pub state: ContainerState,
    /// The image as asked for.
    pub image: String,
    /// The image the runtime resolved (digest reference).
    pub image_ref: String,
    /// Creation, start and finish times, nanoseconds since the Unix epoch (0 when not yet).
    pub created_at: i64,
    /// See `created_at`.
    pub started_at: i64,
    /// See `created_at`.
    pub finished_at: i64,
    /// Exit code, once exited.
    pub exit_code: i32,
    /// Runtime reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Runtime message.
    pub message: String,
    /// Where its log is.
    pub log_path: String,
    /// For a sidecar (an init container with `restartPolicy: Always`), its index among the init
    /// containers: sidecars are stopped after the other containers, the last one first.
    pub sidecar: Option<u32>,
}

impl PodActual {
    /// The newest attempt of the container named `name`, if any.
    pub fn container(&self, name: &str) -> Option<&ContainerRecord> {
        self.containers.iter().filter(|c| c.name == name).max_by_key(|c| (c.restart_count, c.created_at))
    }

    /// The attempt before the newest of the container named `name`, if any (for `lastState`).
    pub fn previous(&self, name: &str) -> Option<&ContainerRecord> {
        let newest = self.container(name)?;
        self.containers
            .iter()
            .filter(|c| c.name == name && c.id != newest.id)
            .max_by_key(|c| (c.restart_count, c.created_at))
    }

    /// Whether any container of the pod is running.
    pub fn any_running(&self) -> bool {
        self.containers.iter().any(|c| c.state == ContainerState::Running)
    }
}

/// Whether every app container of `pod` has finished for good (`Some(succeeded)`), as its restart
/// policy says; sidecars do not count. A finished pod's sandbox is released.
pub fn finished(pod: &DesiredPod, actual: &PodActual) -> Option<bool> {
    let policy = pod.restart_policy();
    if policy == RestartPolicy::Always {
        return None;
    }
    let init_failed = pod.init_containers().iter().filter(|c| !is_sidecar(c)).any(|c| {
        actual.container(&c.name).is_some_and(|r| r.state == ContainerState::Exited && r.exit_code != 0)
    });
    if init_failed && policy == RestartPolicy::Never {
        return Some(false);
    }
    let mut succeeded = true;
    for c in pod.containers() {
        let r = actual.container(&c.name)?;
        if r.state != ContainerState::Exited || policy.restarts(r.exit_code) {
            return None;
        }
        succeeded &= r.exit_code == 0;
    }
    Some(succeeded)
}

/// The kubelet's sandbox GC for a pod that is still desired: its sandboxes that are not ready, not
/// its newest and hold no container (`in_use`). The sandbox pair removes these
/// (its `SandboxOp::Prune`); the pod pair's container GC leaves them to it.
pub fn dead_sandboxes(sandboxes: &[SandboxRecord], in_use: impl Fn(&str) -> bool) -> Vec<String> {
    let newest = sandboxes.iter().max_by_key(|s| (s.attempt, s.created_at)).map(|s| s.id.as_str());
    sandboxes
        .iter()
        .filter(|s| !s.ready && Some(s.id.as_str()) != newest && !in_use(&s.id))
        .map(|s| s.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, ready: bool, attempt: u32, created_at: i64) -> SandboxRecord {
        SandboxRecord { id: id.into(), ready, attempt, created_at, ..SandboxRecord::default() }
    }

    #[test]
    fn dead_sandboxes_go_unless_ready_newest_or_in_use() {
        let sandboxes = vec![
            sandbox("newest-not-ready", false, 3, 30),
            sandbox("ready", true, 2, 20),
            sandbox("old-with-container", false, 1, 10),
            sandbox("old-empty", false, 0, 0),
        ];
        let dead = dead_sandboxes(&sandboxes, |id| id == "old-with-container");
        assert_eq!(dead, vec!["old-empty".to_owned()]);
        assert!(dead_sandboxes(&sandboxes[3..], |_| false).is_empty(), "the only one is the newest");
    }

    #[test]
    fn a_listed_pod_is_the_same_only_with_the_same_allocations_of_both_parts() {
        let pod = Arc::new(PodActual { uid: "u".into(), ..PodActual::default() });
        let sandboxes = Arc::new(PodSandboxes { uid: "u".into(), ..PodSandboxes::default() });
        let listed = ListedPod { pod: pod.clone(), sandboxes: Some(sandboxes.clone()) };
        assert!(listed.same(&listed.clone()));
        let equal_copy =
            ListedPod { pod: Arc::new(PodActual::clone(&pod)), sandboxes: Some(sandboxes.clone()) };
        assert!(!listed.same(&equal_copy), "equal containers, another allocation");
        let other_sandboxes =
            ListedPod { pod: pod.clone(), sandboxes: Some(Arc::new(PodSandboxes::clone(&sandboxes))) };
        assert!(!listed.same(&other_sandboxes), "equal sandboxes, another allocation");
        let without = ListedPod { pod: pod.clone(), sandboxes: None };
        assert!(!listed.same(&without) && !without.same(&listed));
        assert!(without.same(&ListedPod { pod, sandboxes: None }));
    }
}

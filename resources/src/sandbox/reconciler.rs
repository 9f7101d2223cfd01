//! The sandbox reconciler: from a pod's desired sandbox and the sandboxes the runtime has, the next
//! step.
//!
//! As the kubelet's `computePodActions` for sandboxes: a pod that has no ready sandbox gets one
//! (the next attempt), once its volumes are set up and nothing of it still runs; a sandbox that died
//! or no longer fits the pod (its network mode changed) is replaced, but only after the pod pair has
//! stopped the pod's containers (the sandbox is never torn down under running containers); a pod
//! that is done, being deleted, evicted or refused has its sandbox stopped once its containers are;
//! a pod that is gone has its sandboxes stopped and removed once the pod pair removed its
//! containers.
//!
//! Side inputs (until the engine has declared relations): the pod actual store, the volume gate and
//! the node's verdicts; the daemon wakes this pair's keys when they change.

use std::sync::{Arc, OnceLock};

use reconcile_engine::{Plan, Reconciler, Store, Update, View};

use super::actual::PodSandboxes;
use super::desired::SandboxSpec;
use super::ops::SandboxOp;
use crate::pod::actual::{ContainerState, PodActual};
use crate::pod::desired::PodUid;
use crate::volume::status::{VolumeGate, VolumeReadiness};

/// The pod pair's actual store, set once the pod engine is built (this reconciler is built first).
pub type PodActualSlot = Arc<OnceLock<Store<PodUid, PodActual>>>;

/// The sandbox reconciler.
#[derive(Debug)]
pub struct SandboxReconciler {
    // relation: watches the pod actual store, key = the pod UID (the same key).
    pods: PodActualSlot,
    // relation: watches the volume actual store, key (volume, pod UID) → pod UID.
    volumes: Option<VolumeGate>,
    verdicts: Option<crate::eviction::verdict::PodVerdicts>,
}

impl SandboxReconciler {
    /// A reconciler that reads the pod pair's actual store from `pods` (nothing is planned while it
    /// is unset).
    pub fn new(pods: PodActualSlot) -> Self {
        Self { pods, volumes: None, verdicts: None }
    }

    /// Creates a sandbox only once `gate` reports all of the pod's volumes set up (the kubelet's
    /// WaitForAttachAndMount comes before the sandbox).
    pub fn with_volumes(mut self, gate: VolumeGate) -> Self {
        self.volumes = Some(gate);
        self
    }

    /// Pods refused at admission never get a sandbox; evicted pods have theirs stopped.
    pub fn with_verdicts(mut self, verdicts: crate::eviction::verdict::PodVerdicts) -> Self {
        self.verdicts = Some(verdicts);
        self
    }

    /// Whether the pod no longer needs a running sandbox: it is being deleted, was refused or
    /// evicted, or all its app containers finished for good.
    fn released(
        &self,
        spec: &SandboxSpec,
        sandboxes: Option<&PodSandboxes>,
        pod: Option<&PodActual>,
    ) -> bool {
        if spec.pod.deletion_grace().is_some() {
            return true;
        }
        let started =
            sandboxes.is_some_and(|s| !s.sandboxes.is_empty()) || pod.is_some_and(|p| !p.is_empty());
        // The same admission the pod pair asks (whichever asks first decides; the verdict is kept).
        if self.verdicts.as_ref().is_some_and(|v| v.admit(&spec.pod, started).is_some()) {
            return true;
        }
        pod.is_some_and(|p| crate::pod::reconciler::finished(&spec.pod, p).is_some())
    }
}

/// IDs of `ids` in which no container of `pod` runs.
fn without_running(ids: Vec<String>, pod: Option<&PodActual>) -> Vec<String> {
    ids.into_iter()
        .filter(|id| {
            !pod.is_some_and(|p| {
                p.containers.iter().any(|c| c.sandbox_id == *id && c.state == ContainerState::Running)
            })
        })
        .collect()
}

impl Reconciler<SandboxSpec, PodSandboxes> for SandboxReconciler {
    type Key = PodUid;
    type Op = SandboxOp;

    fn reconcile(&self, view: &View<'_, PodUid, SandboxSpec, PodSandboxes>) -> Plan<SandboxOp> {
        if view.actual.is_some_and(|a| a.needs_refresh) {
            return Plan::Run(SandboxOp::Refresh);
        }
        // The desired sandboxes sync only after the pod actual store did (see the populator): before
        // that, whether containers still run is unknown.
        let Some(pods) = self.pods.get().filter(|_| view.desired_synced) else { return Plan::Idle };
        self.plan(view.desired, view.actual, pods.get(view.key).as_deref())
    }

    fn uncertain(
        &self,
        _key: &PodUid,
        _op: &SandboxOp,
        actual: Option<&PodSandboxes>,
    ) -> Update<PodSandboxes> {
        // Whatever happened, the runtime knows: read it again before the next step.
        let mut next = actual.cloned().unwrap_or_default();
        next.needs_refresh = true;
        Update::Set(next)
    }
}

impl SandboxReconciler {
    /// The plan for one pod from its desired sandbox, its sandboxes and its containers (`pod`).
    fn plan(
        &self,
        desired: Option<&SandboxSpec>,
        actual: Option<&PodSandboxes>,
        pod: Option<&PodActual>,
    ) -> Plan<SandboxOp> {
        let running = pod.is_some_and(PodActual::any_running);
        let sandboxes = actual.map_or(&[][..], |a| a.sandboxes.as_slice());
        let ready: Vec<String> = sandboxes.iter().filter(|s| s.ready).map(|s| s.id.clone()).collect();
        let wanted = desired.filter(|spec| !self.released(spec, actual, pod));
        let Some(spec) = wanted else {
            if !ready.is_empty() {
                // Stopped once the pod pair has stopped the containers (woken by the pod actual store).
                let ids = without_running(ready, pod);
                return if ids.is_empty() { Plan::Idle } else { Plan::Run(SandboxOp::Stop { ids }) };
            }
            if desired.is_none() && !sandboxes.is_empty() && pod.is_none_or(|p| p.containers.is_empty()) {
                return Plan::Run(SandboxOp::Remove {
                    ids: sandboxes.iter().map(|s| s.id.clone()).collect(),
                });
            }
            return Plan::Idle;
        };
        match sandboxes.first() {
            Some(newest) if newest.ready && spec.matches(newest) => {
                // More than one ready sandbox: the older ones are stopped (as the kubelet does).
                let older = without_running(ready.into_iter().filter(|id| *id != newest.id).collect(), pod);
                if older.is_empty() { Plan::Idle } else { Plan::Run(SandboxOp::Stop { ids: older }) }
            }
            // No ready sandbox that fits: once nothing of the pod runs, the ready ones (that no
            // longer fit) are stopped and a new one made.
            _ if running => Plan::Idle,
            _ if !ready.is_empty() => Plan::Run(SandboxOp::Stop { ids: ready }),
            _ => {
                if let Some(gate) = &self.volumes
                    && let VolumeReadiness::Waiting(_) = gate.check(&spec.pod)
                {
                    return Plan::Idle;
                }
                let attempt = sandboxes.iter().map(|s| s.attempt + 1).max().unwrap_or(0);
                Plan::Run(SandboxOp::Create { spec: Arc::new(spec.clone()), attempt })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::actual::{ContainerRecord, SandboxRecord};
    use crate::pod::desired::{DesiredPod, PodSource};
    use k8s_openapi::api::core::v1::Pod;

    fn spec(uid: &str, extra: serde_json::Value) -> SandboxSpec {
        let mut spec = serde_json::json!({"containers": [{"name": "web", "image": "busybox"}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": spec,
        }))
        .expect("test pod");
        SandboxSpec::of(Arc::new(DesiredPod { pod, source: PodSource::Http }))
    }

    fn sandbox(id: &str, ready: bool, attempt: u32) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            ready,
            attempt,
            created_at: i64::from(attempt) + 1,
            ..SandboxRecord::default()
        }
    }

    fn sandboxes(list: Vec<SandboxRecord>) -> PodSandboxes {
        PodSandboxes { uid: "u".into(), sandboxes: list, ..PodSandboxes::default() }
    }

    fn containers(list: &[(&str, ContainerState, i32)]) -> PodActual {
        PodActual {
            uid: "u".into(),
            containers: list
                .iter()
                .map(|(sandbox, state, exit_code)| ContainerRecord {
                    id: format!("c-{sandbox}"),
                    name: "web".into(),
                    sandbox_id: (*sandbox).into(),
                    state: *state,
                    exit_code: *exit_code,
                    ..ContainerRecord::default()
                })
                .collect(),
            ..PodActual::default()
        }
    }

    fn reconciler() -> SandboxReconciler {
        SandboxReconciler::new(PodActualSlot::default())
    }

    fn stop(ids: &[&str]) -> Plan<SandboxOp> {
        Plan::Run(SandboxOp::Stop { ids: ids.iter().map(|s| (*s).to_string()).collect() })
    }

    #[test]
    fn a_pod_without_a_sandbox_gets_its_first() {
        let spec = spec("u", serde_json::json!({}));
        let plan = reconciler().plan(Some(&spec), None, None);
        assert_eq!(plan, Plan::Run(SandboxOp::Create { spec: Arc::new(spec), attempt: 0 }));
    }

    #[test]
    fn a_dead_sandbox_is_replaced_only_once_its_containers_stopped() {
        let spec = spec("u", serde_json::json!({}));
        let actual = sandboxes(vec![sandbox("s0", false, 0)]);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(Some(&spec), Some(&actual), Some(&running)), Plan::Idle);
        let exited = containers(&[("s0", ContainerState::Exited, 137)]);
        assert_eq!(
            reconciler().plan(Some(&spec), Some(&actual), Some(&exited)),
            Plan::Run(SandboxOp::Create { spec: Arc::new(spec), attempt: 1 })
        );
    }

    #[test]
    fn a_sandbox_whose_network_mode_changed_is_stopped_after_its_containers_then_replaced() {
        let spec = spec("u", serde_json::json!({"hostNetwork": true}));
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(Some(&spec), Some(&actual), Some(&running)), Plan::Idle);
        let exited = containers(&[("s0", ContainerState::Exited, 0)]);
        assert_eq!(reconciler().plan(Some(&spec), Some(&actual), Some(&exited)), stop(&["s0"]));
        let stopped = sandboxes(vec![sandbox("s0", false, 0)]);
        assert!(matches!(
            reconciler().plan(Some(&spec), Some(&stopped), Some(&exited)),
            Plan::Run(SandboxOp::Create { attempt: 1, .. })
        ));
        let mut fitting = sandbox("s1", true, 1);
        fitting.host_network = true;
        let replaced = sandboxes(vec![fitting, sandbox("s0", false, 0)]);
        assert_eq!(reconciler().plan(Some(&spec), Some(&replaced), Some(&exited)), Plan::Idle);
    }

    #[test]
    fn a_pod_that_is_gone_loses_its_sandboxes_after_its_containers() {
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(None, Some(&actual), Some(&running)), Plan::Idle);
        let exited = containers(&[("s0", ContainerState::Exited, 0)]);
        assert_eq!(reconciler().plan(None, Some(&actual), Some(&exited)), stop(&["s0"]));
        let stopped = sandboxes(vec![sandbox("s0", false, 0)]);
        assert_eq!(reconciler().plan(None, Some(&stopped), Some(&exited)), Plan::Idle, "containers first");
        assert_eq!(
            reconciler().plan(None, Some(&stopped), None),
            Plan::Run(SandboxOp::Remove { ids: vec!["s0".into()] })
        );
        assert_eq!(reconciler().plan(None, None, None), Plan::Idle);
    }

    #[test]
    fn a_finished_or_deleted_pod_has_its_sandbox_stopped_and_never_a_new_one() {
        let never = spec("u", serde_json::json!({"restartPolicy": "Never"}));
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        let exited = containers(&[("s0", ContainerState::Exited, 0)]);
        assert_eq!(reconciler().plan(Some(&never), Some(&actual), Some(&exited)), stop(&["s0"]));
        let stopped = sandboxes(vec![sandbox("s0", false, 0)]);
        assert_eq!(reconciler().plan(Some(&never), Some(&stopped), Some(&exited)), Plan::Idle);

        let mut deleted = spec("u", serde_json::json!({}));
        let mut pod = (*deleted.pod).clone();
        pod.pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        pod.pod.metadata.deletion_grace_period_seconds = Some(30);
        deleted.pod = Arc::new(pod);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(Some(&deleted), Some(&actual), Some(&running)), Plan::Idle);
        let killed = containers(&[("s0", ContainerState::Exited, 137)]);
        assert_eq!(reconciler().plan(Some(&deleted), Some(&actual), Some(&killed)), stop(&["s0"]));
        assert_eq!(reconciler().plan(Some(&deleted), Some(&stopped), Some(&killed)), Plan::Idle);
    }

    #[test]
    fn of_two_ready_sandboxes_the_older_is_stopped() {
        let spec = spec("u", serde_json::json!({}));
        let actual = sandboxes(vec![sandbox("s1", true, 1), sandbox("s0", true, 0)]);
        let running = containers(&[("s1", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(Some(&spec), Some(&actual), Some(&running)), stop(&["s0"]));
    }
}

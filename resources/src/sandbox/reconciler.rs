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
//! Dead sandboxes of a pod that is still desired, beyond its newest and holding no container, are
//! removed as the kubelet's container GC does ([`dead_sandboxes`](crate::model::actual::dead_sandboxes)).
//!
//! A sandbox is made only for a pod the verdict populator admitted (a pod without a verdict waits;
//! this reconciler never decides admission, it reads the verdict store).
//!
//! Side inputs ([`SandboxInputs`], read through the [`View`]; each store also a declared relation of
//! the pair's engine, see [`super::pair`]): the pod pair's actual store (key = the pod UID), the
//! verdict store (key = the pod UID; without it every pod counts as admitted) and the volume pair's
//! stores (the actual one watched, key (volume, pod UID) → pod UID; without them pods have no
//! volumes to wait for).

use std::sync::Arc;

use reconcile_engine::{Plan, Reconciler, Store, Update, View};

use super::desired::SandboxSpec;
use super::ops::SandboxOp;
use crate::model::actual::PodSandboxes;
use crate::model::actual::{ContainerState, PodActual};
use crate::model::pod::PodUid;
use crate::model::verdict::Verdict;
use crate::model::volumes::VolumeReadiness;
use crate::volume::status::VolumeGate;

/// What the sandbox reconciler reads besides its own stores.
#[derive(Debug, Clone)]
pub struct SandboxInputs {
    /// The pod pair's actual store: a sandbox is stopped or replaced only once nothing of the pod
    /// runs in it.
    pub pods: Store<PodUid, PodActual>,
    /// The node's verdicts (written only by the verdict populator): a sandbox only for an
    /// admitted pod. `None`: every pod counts as admitted.
    pub verdicts: Option<Store<PodUid, Verdict>>,
    /// The volume pair's stores: a sandbox waits for the pod's volumes (the kubelet's
    /// WaitForAttachAndMount). `None`: pods have no volumes to wait for.
    pub volumes: Option<VolumeGate>,
}

/// The sandbox reconciler: a pure function of its view and side inputs.
#[derive(Debug, Default)]
pub struct SandboxReconciler;

/// What the verdict store says of a desired pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// No verdict yet: nothing is done for the pod.
    Waiting,
    /// Admitted (or verdicts are not applied).
    Admitted,
    /// Refused or evicted: it never runs again.
    Stopped,
}

impl SandboxReconciler {
    /// The reconciler.
    pub fn new() -> Self {
        Self
    }

    /// What the node's verdicts among `inputs` (written only by the
    /// [`VerdictPopulator`](crate::eviction::populator::VerdictPopulator)) say of the pod: a sandbox
    /// is made only for an admitted pod, a pod without a verdict waits, a refused or evicted pod has
    /// its sandbox stopped.
    fn admission(inputs: &SandboxInputs, spec: &SandboxSpec) -> Admission {
        let Some(verdicts) = &inputs.verdicts else { return Admission::Admitted };
        match verdicts.get(&spec.pod.uid().to_owned()) {
            None => Admission::Waiting,
            Some(v) if v.stopped().is_some() => Admission::Stopped,
            Some(v) if v.is_admitted() => Admission::Admitted,
            Some(_) => Admission::Waiting,
        }
    }

    /// Whether the pod no longer needs a running sandbox: it is being deleted, was refused or
    /// evicted, or all its app containers finished for good.
    fn released(&self, spec: &SandboxSpec, admission: Admission, pod: Option<&PodActual>) -> bool {
        if spec.pod.deletion_grace().is_some() || admission == Admission::Stopped {
            return true;
        }
        pod.is_some_and(|p| crate::model::actual::finished(&spec.pod, p).is_some())
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
    type Inputs = SandboxInputs;

    fn reconcile(
        &self,
        view: &View<'_, PodUid, SandboxSpec, PodSandboxes, SandboxInputs>,
    ) -> Plan<SandboxOp> {
        if view.actual.is_some_and(|a| a.needs_refresh) {
            return Plan::Run(SandboxOp::Refresh);
        }
        let pod = view.inputs.pods.get(view.key);
        let plan = self.plan(view.inputs, view.desired, view.actual, pod.as_deref());
        // Until every pod source has reported (see the populator), a pod without a desired
        // sandbox may be one a source has not listed yet: only sandboxes are made, nothing is
        // stopped, removed or pruned. The engine plans every pod again once the store syncs.
        match plan {
            Plan::Run(SandboxOp::Create { .. }) => plan,
            _ if !view.desired_synced => Plan::Idle,
            _ => plan,
        }
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
        inputs: &SandboxInputs,
        desired: Option<&SandboxSpec>,
        actual: Option<&PodSandboxes>,
        pod: Option<&PodActual>,
    ) -> Plan<SandboxOp> {
        let running = pod.is_some_and(PodActual::any_running);
        let sandboxes = actual.map_or(&[][..], |a| a.sandboxes.as_slice());
        let admission = desired.map_or(Admission::Admitted, |spec| Self::admission(inputs, spec));
        if admission == Admission::Waiting {
            return Plan::Idle;
        }
        let ready: Vec<String> = sandboxes.iter().filter(|s| s.ready).map(|s| s.id.clone()).collect();
        let wanted = desired.filter(|spec| !self.released(spec, admission, pod));
        let Some(spec) = wanted else {
            // A pod that is gone and whose containers the pod pair has removed: its sandboxes are
            // stopped and removed in one operation (no separate stop first: one runtime listing
            // and one wake-up less per pod, which adds up when a hundred pods go at once).
            if desired.is_none() && !sandboxes.is_empty() && pod.is_none_or(|p| p.containers.is_empty()) {
                return Plan::Run(SandboxOp::Remove {
                    ids: sandboxes.iter().map(|s| s.id.clone()).collect(),
                });
            }
            if !ready.is_empty() {
                // Stopped once the pod pair has stopped the containers (woken by the pod actual store).
                let ids = without_running(ready, pod);
                return if ids.is_empty() { Plan::Idle } else { Plan::Run(SandboxOp::Stop { ids }) };
            }
            return if desired.is_some() { prune(sandboxes, pod) } else { Plan::Idle };
        };
        match sandboxes.first() {
            Some(newest) if newest.ready && spec.matches(newest) => {
                // More than one ready sandbox: the older ones are stopped (as the kubelet does).
                let older = without_running(ready.into_iter().filter(|id| *id != newest.id).collect(), pod);
                if older.is_empty() {
                    prune(sandboxes, pod)
                } else {
                    Plan::Run(SandboxOp::Stop { ids: older })
                }
            }
            // No ready sandbox that fits: once nothing of the pod runs, the ready ones (that no
            // longer fit) are stopped and a new one made.
            _ if running => Plan::Idle,
            _ if !ready.is_empty() => Plan::Run(SandboxOp::Stop { ids: ready }),
            _ => {
                // The kubelet's WaitForAttachAndMount comes before the sandbox.
                if let Some(gate) = &inputs.volumes
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

/// Container GC of a desired pod's sandboxes: the dead ones beyond the newest that hold no
/// container (the pod pair prunes the containers first; its actual store wakes this pair).
fn prune(sandboxes: &[crate::model::actual::SandboxRecord], pod: Option<&PodActual>) -> Plan<SandboxOp> {
    let ids = crate::model::actual::dead_sandboxes(sandboxes, |id| {
        pod.is_some_and(|p| p.containers.iter().any(|c| c.sandbox_id == id))
    });
    if ids.is_empty() { Plan::Idle } else { Plan::Run(SandboxOp::Prune { ids }) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::actual::{ContainerRecord, SandboxRecord};
    use crate::model::pod::{DesiredPod, PodSource};
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
        SandboxReconciler::new()
    }

    /// Inputs with an empty pod store, no verdicts and no volumes.
    fn no_inputs() -> SandboxInputs {
        SandboxInputs { pods: reconcile_engine::store().0, verdicts: None, volumes: None }
    }

    fn stop(ids: &[&str]) -> Plan<SandboxOp> {
        Plan::Run(SandboxOp::Stop { ids: ids.iter().map(|s| (*s).to_string()).collect() })
    }

    #[test]
    fn before_every_pod_source_reported_sandboxes_are_made_but_none_is_stopped_or_removed() {
        let (pod_actual, _pod_writer) = reconcile_engine::store::<PodUid, PodActual>();
        let inputs = SandboxInputs { pods: pod_actual, verdicts: None, volumes: None };
        let r = SandboxReconciler::new();
        let (desired_store, _dw) = reconcile_engine::store::<PodUid, SandboxSpec>();
        let (actual_store, _aw) = reconcile_engine::store::<PodUid, PodSandboxes>();
        let key: PodUid = "u".into();
        let spec = spec("u", serde_json::json!({}));
        let view = |desired, actual, synced| {
            r.reconcile(
                &View::new(&key, desired, actual, &desired_store, &actual_store)
                    .with_inputs(&inputs)
                    .with_desired_synced(synced),
            )
        };
        // A static pod starts while the API source has not reported.
        assert!(matches!(view(Some(&spec), None, false), Plan::Run(SandboxOp::Create { .. })));
        // A ready sandbox of a pod no source has listed yet is kept until every source reported.
        let ready = sandboxes(vec![sandbox("s0", true, 0)]);
        assert_eq!(view(None, Some(&ready), false), Plan::Idle);
        // then stopped and removed in one operation (it has no container)
        assert_eq!(view(None, Some(&ready), true), Plan::Run(SandboxOp::Remove { ids: vec!["s0".into()] }));
        let dead = sandboxes(vec![sandbox("s0", false, 0)]);
        assert_eq!(view(None, Some(&dead), false), Plan::Idle);
        assert!(matches!(view(None, Some(&dead), true), Plan::Run(SandboxOp::Remove { .. })));
    }

    #[test]
    fn a_pod_without_a_sandbox_gets_its_first() {
        let spec = spec("u", serde_json::json!({}));
        let plan = reconciler().plan(&no_inputs(), Some(&spec), None, None);
        assert_eq!(plan, Plan::Run(SandboxOp::Create { spec: Arc::new(spec), attempt: 0 }));
    }

    #[test]
    fn a_dead_sandbox_is_replaced_only_once_its_containers_stopped() {
        let spec = spec("u", serde_json::json!({}));
        let actual = sandboxes(vec![sandbox("s0", false, 0)]);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&running)), Plan::Idle);
        let exited = containers(&[("s0", ContainerState::Exited, 137)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&exited)),
            Plan::Run(SandboxOp::Create { spec: Arc::new(spec), attempt: 1 })
        );
    }

    #[test]
    fn a_sandbox_whose_network_mode_changed_is_stopped_after_its_containers_then_replaced() {
        let spec = spec("u", serde_json::json!({"hostNetwork": true}));
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&running)), Plan::Idle);
        let exited = containers(&[("s0", ContainerState::Exited, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&exited)), stop(&["s0"]));
        let stopped = sandboxes(vec![sandbox("s0", false, 0)]);
        assert!(matches!(
            reconciler().plan(&no_inputs(), Some(&spec), Some(&stopped), Some(&exited)),
            Plan::Run(SandboxOp::Create { attempt: 1, .. })
        ));
        let mut fitting = sandbox("s1", true, 1);
        fitting.host_network = true;
        let replaced = sandboxes(vec![fitting, sandbox("s0", false, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), Some(&spec), Some(&replaced), Some(&exited)), Plan::Idle);
    }

    #[test]
    fn a_pod_that_is_gone_loses_its_sandboxes_after_its_containers() {
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), None, Some(&actual), Some(&running)), Plan::Idle);
        let exited = containers(&[("s0", ContainerState::Exited, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), None, Some(&actual), Some(&exited)), stop(&["s0"]));
        let stopped = sandboxes(vec![sandbox("s0", false, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), None, Some(&stopped), Some(&exited)),
            Plan::Idle,
            "containers first"
        );
        assert_eq!(
            reconciler().plan(&no_inputs(), None, Some(&stopped), None),
            Plan::Run(SandboxOp::Remove { ids: vec!["s0".into()] })
        );
        assert_eq!(reconciler().plan(&no_inputs(), None, None, None), Plan::Idle);
    }

    #[test]
    fn a_gone_pod_whose_containers_were_removed_has_its_ready_sandbox_removed_without_a_separate_stop() {
        let ready = sandboxes(vec![sandbox("s1", true, 1), sandbox("s0", false, 0)]);
        let remove_both = Plan::Run(SandboxOp::Remove { ids: vec!["s1".into(), "s0".into()] });
        // the pod pair removed the containers: its actual state has none left (or no entry at all)
        let emptied = containers(&[]);
        assert_eq!(reconciler().plan(&no_inputs(), None, Some(&ready), Some(&emptied)), remove_both);
        assert_eq!(reconciler().plan(&no_inputs(), None, Some(&ready), None), remove_both);
        // a container still there (even exited) keeps the two steps: stop now, remove after it
        let exited = containers(&[("s1", ContainerState::Exited, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), None, Some(&ready), Some(&exited)), stop(&["s1"]));
        // a pod still desired but finished is only stopped, never removed
        let finished = spec("u", serde_json::json!({"restartPolicy": "Never"}));
        let exited_ok = containers(&[("s1", ContainerState::Exited, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&finished), Some(&ready), Some(&exited_ok)),
            stop(&["s1"])
        );
    }

    #[test]
    fn a_finished_or_deleted_pod_has_its_sandbox_stopped_and_never_a_new_one() {
        let never = spec("u", serde_json::json!({"restartPolicy": "Never"}));
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        let exited = containers(&[("s0", ContainerState::Exited, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&never), Some(&actual), Some(&exited)),
            stop(&["s0"])
        );
        let stopped = sandboxes(vec![sandbox("s0", false, 0)]);
        assert_eq!(reconciler().plan(&no_inputs(), Some(&never), Some(&stopped), Some(&exited)), Plan::Idle);

        let mut deleted = spec("u", serde_json::json!({}));
        let mut pod = (*deleted.pod).clone();
        pod.pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        pod.pod.metadata.deletion_grace_period_seconds = Some(30);
        deleted.pod = Arc::new(pod);
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&deleted), Some(&actual), Some(&running)),
            Plan::Idle
        );
        let killed = containers(&[("s0", ContainerState::Exited, 137)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&deleted), Some(&actual), Some(&killed)),
            stop(&["s0"])
        );
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&deleted), Some(&stopped), Some(&killed)),
            Plan::Idle
        );
    }

    #[test]
    fn of_two_ready_sandboxes_the_older_is_stopped() {
        let spec = spec("u", serde_json::json!({}));
        let actual = sandboxes(vec![sandbox("s1", true, 1), sandbox("s0", true, 0)]);
        let running = containers(&[("s1", ContainerState::Running, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&running)),
            stop(&["s0"])
        );
    }

    #[test]
    fn a_sandbox_only_for_an_admitted_pod() {
        let spec = spec("u", serde_json::json!({}));
        let (verdicts, mut writer) = reconcile_engine::store::<PodUid, Verdict>();
        let inputs = SandboxInputs { verdicts: Some(verdicts), ..no_inputs() };
        let r = reconciler();
        // No verdict yet: wait (nothing made, nothing stopped).
        assert_eq!(r.plan(&inputs, Some(&spec), None, None), Plan::Idle);
        let actual = sandboxes(vec![sandbox("s0", true, 0)]);
        assert_eq!(r.plan(&inputs, Some(&spec), Some(&actual), None), Plan::Idle);
        writer.insert("u".into(), Verdict::admitted(&spec.pod));
        assert_eq!(
            r.plan(&inputs, Some(&spec), None, None),
            Plan::Run(SandboxOp::Create { spec: Arc::new(spec.clone()), attempt: 0 })
        );
        // Evicted: the sandbox is stopped once the containers are, and never made again.
        writer.insert("u".into(), Verdict::evicted("out of memory".into(), std::time::Duration::ZERO, 0));
        let running = containers(&[("s0", ContainerState::Running, 0)]);
        assert_eq!(r.plan(&inputs, Some(&spec), Some(&actual), Some(&running)), Plan::Idle);
        let killed = containers(&[("s0", ContainerState::Exited, 137)]);
        assert_eq!(r.plan(&inputs, Some(&spec), Some(&actual), Some(&killed)), stop(&["s0"]));
        assert_eq!(r.plan(&inputs, Some(&spec), None, None), Plan::Idle);
    }

    #[test]
    fn dead_sandboxes_beyond_the_newest_are_pruned_once_empty() {
        let spec = spec("u", serde_json::json!({}));
        let actual =
            sandboxes(vec![sandbox("s2", true, 2), sandbox("s1", false, 1), sandbox("s0", false, 0)]);
        // s1 still holds a dead container (the pod pair prunes it first).
        let pod = containers(&[("s2", ContainerState::Running, 0), ("s1", ContainerState::Exited, 1)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&pod)),
            Plan::Run(SandboxOp::Prune { ids: vec!["s0".into()] })
        );
        let pod = containers(&[("s2", ContainerState::Running, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&spec), Some(&actual), Some(&pod)),
            Plan::Run(SandboxOp::Prune { ids: vec!["s1".into(), "s0".into()] })
        );
        // The newest stays even when dead (a finished pod's status reads it).
        let never = self::spec("u", serde_json::json!({"restartPolicy": "Never"}));
        let done = sandboxes(vec![sandbox("s1", false, 1), sandbox("s0", false, 0)]);
        let exited = containers(&[("s1", ContainerState::Exited, 0)]);
        assert_eq!(
            reconciler().plan(&no_inputs(), Some(&never), Some(&done), Some(&exited)),
            Plan::Run(SandboxOp::Prune { ids: vec!["s0".into()] })
        );
    }
}

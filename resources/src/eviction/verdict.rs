//! Pods the node stopped for good: evicted under pressure, or refused at admission. The pod
//! reconciler consults [`PodVerdicts`] before running a pod and the status shows the verdict.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use reconcile_engine::Plan;

use super::rank::is_critical;
use super::signal::Condition;
use crate::pod::actual::PodActual;
use crate::pod::desired::DesiredPod;
use crate::pod::ops::PodOp;
use crate::pod::status::qos_class;

/// The taint a pod tolerates to be admitted under memory pressure when it is BestEffort.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// Why a pod was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerdictKind {
    /// Evicted while running, because of node pressure.
    Evicted,
    /// Refused before it ran (admission).
    Rejected,
}

/// A pod stopped for good, as its status shows it: phase `Failed` with this reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Evicted or rejected.
    pub kind: VerdictKind,
    /// The status reason (`Evicted`).
    pub reason: String,
    /// The status message.
    pub message: String,
    /// The grace period its containers are killed with.
    pub grace: Duration,
    /// When it was decided, nanoseconds since the Unix epoch (0 when unknown).
    pub at: i64,
}

#[derive(Debug, Default)]
struct Inner {
    verdicts: HashMap<String, Verdict>,
    admitted: HashSet<String>,
    conditions: BTreeSet<Condition>,
}

/// The node's verdicts on its pods, and the pressure conditions admission reads. Cheap to
/// clone; every clone shares the same state.
#[derive(Debug, Clone, Default)]
pub struct PodVerdicts {
    inner: Arc<RwLock<Inner>>,
}

fn tolerates_memory_pressure(pod: &DesiredPod) -> bool {
    pod.spec().tolerations.iter().flatten().any(|t| {
        let key_matches = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == MEMORY_PRESSURE_TAINT,
        };
        key_matches && t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule")
    })
}

impl PodVerdicts {
    /// No verdicts, no pressure.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The verdict on the pod `uid`, if any.
    pub fn verdict(&self, uid: &str) -> Option<Verdict> {
        self.read().verdicts.get(uid).cloned()
    }

    /// Every verdict, by pod UID.
    pub fn all(&self) -> Vec<(String, Verdict)> {
        self.read().verdicts.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The pressure conditions admission applies now.
    pub fn conditions(&self) -> BTreeSet<Condition> {
        self.read().conditions.clone()
    }

    /// Sets the pressure conditions (the eviction manager does, every pass).
    pub fn set_conditions(&self, conditions: BTreeSet<Condition>) {
        self.write().conditions = conditions;
    }

    /// Records that `uid` is evicted: the pod reconciler kills it and never starts it again.
    pub fn evict(&self, uid: &str, message: String, grace: Duration, at: i64) {
        let verdict = Verdict { kind: VerdictKind::Evicted, reason: "Evicted".into(), message, grace, at };
        self.write().verdicts.insert(uid.to_string(), verdict);
    }

    /// Forgets pods for which `keep` is false (gone from the desired state).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut inner = self.write();
        inner.verdicts.retain(|uid, _| keep(uid));
        inner.admitted.retain(|uid| keep(uid));
    }

    /// Admission, as the kubelet's eviction admit handler: under memory pressure alone,
    /// BestEffort pods are refused unless they tolerate the memory-pressure taint; under any
    /// other pressure every pod is refused; critical pods are always admitted. A pod is admitted
    /// once (`started`: it already has something in the runtime, e.g. after a restart of nodelet)
    /// and stays admitted. Returns the verdict that stops the pod, if any.
    pub fn admit(&self, pod: &DesiredPod, started: bool) -> Option<Verdict> {
        let uid = pod.uid();
        {
            let inner = self.read();
            if let Some(v) = inner.verdicts.get(uid) {
                return Some(v.clone());
            }
            if inner.admitted.contains(uid) {
                return None;
            }
        }
        let mut inner = self.write();
        let conditions = &inner.conditions;
        let refuse = !started
            && !conditions.is_empty()
            && !is_critical(pod)
            && !(conditions.len() == 1
                && conditions.contains(&Condition::MemoryPressure)
                && (qos_class(pod) != "BestEffort" || tolerates_memory_pressure(pod)));
        if refuse {
            let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
            let verdict = Verdict {
                kind: VerdictKind::Rejected,
                reason: "Evicted".into(),
                message: format!("The node had condition: [{}]. ", names.join(", ")),
                grace: Duration::ZERO,
                at: 0,
            };
            inner.verdicts.insert(uid.to_string(), verdict.clone());
            return Some(verdict);
        }
        inner.admitted.insert(uid.to_string());
        None
    }
}

/// The plan for a pod under a verdict: stop whatever still runs (keeping the containers for
/// their status and logs), then nothing.
pub fn plan_stopped(actual: Option<&PodActual>, verdict: &Verdict) -> Plan<PodOp> {
    match actual {
        Some(a) if a.any_running() || a.sandboxes.iter().any(|s| s.ready) => {
            Plan::Run(PodOp::KillPod { grace: verdict.grace, remove: false })
        }
        _ => Plan::Idle,
    }
}

/// The status of a pod under `verdict`: phase `Failed` with its reason and message; an evicted
/// pod also gets the `DisruptionTarget` condition (reason `TerminationByKubelet`), as the
/// kubelet sets it. `now` is wall-clock nanoseconds.
pub fn apply(verdict: &Verdict, mut status: PodStatus, now: i64) -> PodStatus {
    status.phase = Some("Failed".into());
    status.reason = Some(verdict.reason.clone());
    status.message = Some(verdict.message.clone());
    if verdict.kind == VerdictKind::Evicted {
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(verdict.message.clone()),
            last_transition_time: crate::pod::status::time(if verdict.at > 0 { verdict.at } else { now }),
            ..PodCondition::default()
        });
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::desired::PodSource;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(uid: &str, spec: serde_json::Value) -> DesiredPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": spec,
        }))
        .unwrap_or_default();
        DesiredPod { pod, source: PodSource::Http }
    }

    fn best_effort(uid: &str) -> DesiredPod {
        pod(uid, serde_json::json!({"containers": [{"name": "c", "image": "i"}]}))
    }

    fn burstable(uid: &str) -> DesiredPod {
        pod(
            uid,
            serde_json::json!({"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"memory": "10Mi"}}}]}),
        )
    }

    #[test]
    fn memory_pressure_refuses_best_effort_pods_only() {
        let v = PodVerdicts::new();
        v.set_conditions([Condition::MemoryPressure].into());
        let refused = v.admit(&best_effort("be"), false).map(|v| v.message);
        assert_eq!(refused.as_deref(), Some("The node had condition: [MemoryPressure]. "));
        assert_eq!(v.admit(&burstable("bu"), false), None);
        let tolerant = pod(
            "tol",
            serde_json::json!({"containers": [{"name": "c", "image": "i"}],
                "tolerations": [{"key": MEMORY_PRESSURE_TAINT, "operator": "Exists",
                                 "effect": "NoSchedule"}]}),
        );
        assert_eq!(v.admit(&tolerant, false), None);
        assert_eq!(v.verdict("be").map(|v| v.kind), Some(VerdictKind::Rejected), "the refusal is remembered");
    }

    #[test]
    fn disk_pressure_refuses_every_pod_but_critical_ones_and_admitted_pods_stay() {
        let v = PodVerdicts::new();
        assert_eq!(v.admit(&burstable("running"), false), None);
        v.set_conditions([Condition::DiskPressure].into());
        assert!(v.admit(&burstable("new"), false).is_some());
        assert_eq!(v.admit(&burstable("running"), false), None, "an admitted pod is not refused later");
        assert_eq!(v.admit(&burstable("adopted"), true), None, "a pod already in the runtime is admitted");
        let critical = pod(
            "crit",
            serde_json::json!({"containers": [{"name": "c", "image": "i"}], "priority": 2_000_001_000}),
        );
        assert_eq!(v.admit(&critical, false), None);
        v.set_conditions(BTreeSet::new());
        assert!(v.admit(&burstable("new"), false).is_some(), "a refused pod stays refused");
        v.retain(|uid| uid != "new");
        assert_eq!(v.admit(&burstable("new"), false), None, "forgotten once gone from the desired state");
    }

    #[test]
    fn an_evicted_pod_is_killed_then_left_alone() {
        let v = PodVerdicts::new();
        v.evict("p", "The node was low on resource: memory. ".into(), Duration::from_secs(1), 1);
        let verdict = v.admit(&burstable("p"), true).unwrap_or_else(|| panic!("evicted"));
        let mut actual = PodActual::default();
        actual.containers.push(crate::pod::actual::ContainerRecord {
            state: crate::pod::actual::ContainerState::Running,
            ..Default::default()
        });
        assert_eq!(
            plan_stopped(Some(&actual), &verdict),
            Plan::Run(PodOp::KillPod { grace: Duration::from_secs(1), remove: false })
        );
        actual.containers[0].state = crate::pod::actual::ContainerState::Exited;
        assert_eq!(plan_stopped(Some(&actual), &verdict), Plan::Idle);
    }
}

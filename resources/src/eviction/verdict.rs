//! Pods the node stopped for good: evicted under pressure, or refused at admission (node pressure,
//! or, once [`PodVerdicts::set_resources`] gave the node's allocatable resources, not enough
//! `pods`, `cpu` or `memory` left: the kubelet's `OutOfpods`, `OutOfcpu`, `OutOfmemory`, counting
//! RuntimeClass overhead; once [`PodVerdicts::set_node_labels`] gave the node's labels, a
//! `nodeSelector` (with the RuntimeClass's) they do not match: `NodeAffinity`). The pod
//! reconciler consults [`PodVerdicts`] before running a pod and the status shows the verdict.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use reconcile_engine::Plan;

use super::rank::is_critical;
use super::signal::Condition;
use crate::pod::actual::PodActual;
use crate::pod::desired::{DesiredPod, is_sidecar};
use crate::pod::ops::PodOp;
use crate::pod::runtime_class::{self, RuntimeClasses};
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

/// What admission checks a new pod's requests against: the node's allocatable resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeResources {
    /// Allocatable CPU, in millicores.
    pub cpu_milli: i64,
    /// Allocatable memory, in bytes.
    pub memory_bytes: i64,
    /// `maxPods`.
    pub max_pods: usize,
}

/// A pod's requests as admission counts them: the larger of the sum over its app containers and
/// sidecars and the largest init container (plus the sidecars started before it), per resource (a request defaults to the limit when only that is set).
fn pod_requests(pod: &DesiredPod) -> (i64, i64) {
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

/// A pod's requests plus its RuntimeClass overhead, as admission counts them.
fn requests_with_overhead(pod: &DesiredPod, classes: Option<&dyn RuntimeClasses>) -> (i64, i64) {
    let overhead = runtime_class::overhead(pod, classes);
    let extra = |name: &str, scale: i64| {
        overhead
            .get(name)
            .and_then(|q| crate::quantity::Quantity::parse(&q.0))
            .map_or(0, |q| q.scaled_ceil(scale))
    };
    let (cpu, memory) = pod_requests(pod);
    (cpu.saturating_add(extra("cpu", 1000)), memory.saturating_add(extra("memory", 1)))
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

#[derive(Debug, Default)]
struct Inner {
    verdicts: HashMap<String, Verdict>,
    /// Admitted pods and their (cpu milli, memory bytes) requests.
    admitted: HashMap<String, (i64, i64)>,
    conditions: BTreeSet<Condition>,
    resources: Option<NodeResources>,
    classes: Option<ClassLookup>,
    node_labels: Option<BTreeMap<String, String>>,
    node_taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

/// The RuntimeClass lookup admission uses (for overhead and node selectors).
#[derive(Clone)]
struct ClassLookup(Arc<dyn RuntimeClasses>);

impl std::fmt::Debug for ClassLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClassLookup")
    }
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

    /// Makes admission refuse pods that do not fit in `resources` besides the pods admitted
    /// before them.
    pub fn set_resources(&self, resources: NodeResources) {
        self.write().resources = Some(resources);
    }

    /// Lets admission add the pods' RuntimeClass overhead to their requests and require their
    /// class's `scheduling.nodeSelector`.
    pub fn set_runtime_classes(&self, classes: Arc<dyn RuntimeClasses>) {
        self.write().classes = Some(ClassLookup(classes));
    }

    /// Makes admission refuse pods whose `nodeSelector` (merged with their RuntimeClass's) the
    /// node's `labels` do not match: the kubelet's `NodeAffinity`.
    pub fn set_node_labels(&self, labels: BTreeMap<String, String>) {
        self.write().node_labels = Some(labels);
    }

    /// Admission of an admitted pod's changed requests (in-place resize): without the node's
    /// resources, or when the node has room for them besides the other pods, the new requests
    /// become the pod's allocation; otherwise the resize waits (`Deferred`) or is refused
    /// (`Infeasible`, more than the node has). With `commit` false it only asks.
    pub fn resize(&self, pod: &DesiredPod, commit: bool) -> ResizeDecision {
        let mut inner = self.write();
        let classes = inner.classes.clone();
        let requests = requests_with_overhead(pod, classes.as_ref().map(|c| &*c.0));
        let uid = pod.uid();
        let Some(node) = inner.resources else { return ResizeDecision::Accepted };
        if inner.admitted.get(uid) == Some(&requests) {
            return ResizeDecision::Accepted;
        }
        if requests.0 > node.cpu_milli || requests.1 > node.memory_bytes {
            return ResizeDecision::Infeasible;
        }
        let others = inner.admitted.iter().filter(|(u, _)| u.as_str() != uid);
        let (cpu, memory) =
            others.fold((0_i64, 0_i64), |(c, m), (_, r)| (c.saturating_add(r.0), m.saturating_add(r.1)));
        if cpu.saturating_add(requests.0) > node.cpu_milli
            || memory.saturating_add(requests.1) > node.memory_bytes
        {
            return ResizeDecision::Deferred;
        }
        if commit {
            inner.admitted.insert(uid.to_owned(), requests);
        }
        ResizeDecision::Accepted
    }

    /// Makes admission refuse pods that do not tolerate (with their RuntimeClass's tolerations) the
    /// node's `NoExecute` taints among `taints`: the kubelet's `TaintToleration`.
    pub fn set_node_taints(&self, taints: Vec<k8s_openapi::api::core::v1::Taint>) {
        self.write().node_taints = taints.into_iter().filter(|t| t.effect == "NoExecute").collect();
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
        inner.admitted.retain(|uid, _| keep(uid));
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
            if inner.admitted.contains_key(uid) {
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
        let classes = inner.classes.clone();
        let classes = classes.as_ref().map(|c| &*c.0);
        let requests = requests_with_overhead(pod, classes);
        if !started
            && let Some(verdict) = inner.resources.and_then(|r| Self::fits(&inner.admitted, r, requests))
        {
            inner.verdicts.insert(uid.to_string(), verdict.clone());
            return Some(verdict);
        }
        if !started
            && let Some(labels) = &inner.node_labels
            && !runtime_class::node_selector(pod, classes).iter().all(|(k, v)| labels.get(k) == Some(v))
        {
            let verdict = Verdict {
                kind: VerdictKind::Rejected,
                reason: "NodeAffinity".into(),
                message: "Predicate NodeAffinity failed".into(),
                grace: Duration::ZERO,
                at: 0,
            };
            inner.verdicts.insert(uid.to_string(), verdict.clone());
            return Some(verdict);
        }
        if !started && !inner.node_taints.is_empty() {
            let tolerations = runtime_class::tolerations(pod, classes);
            let untolerated = inner
                .node_taints
                .iter()
                .any(|taint| !tolerations.iter().any(|t| runtime_class::tolerates(t, taint)));
            if untolerated {
                let verdict = Verdict {
                    kind: VerdictKind::Rejected,
                    reason: "TaintToleration".into(),
                    message: "Predicate TaintToleration failed".into(),
                    grace: Duration::ZERO,
                    at: 0,
                };
                inner.verdicts.insert(uid.to_string(), verdict.clone());
                return Some(verdict);
            }
        }
        inner.admitted.insert(uid.to_string(), requests);
        None
    }

    /// The kubelet's resource fit check: `None` when a pod with `requests` fits beside `admitted`.
    fn fits(
        admitted: &HashMap<String, (i64, i64)>,
        node: NodeResources,
        requests: (i64, i64),
    ) -> Option<Verdict> {
        let refuse = |resource: &str, requested: i64, used: i64, capacity: i64| Verdict {
            kind: VerdictKind::Rejected,
            reason: format!("OutOf{resource}"),
            message: format!(
                "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
            grace: Duration::ZERO,
            at: 0,
        };
        let pods = i64::try_from(admitted.len()).unwrap_or(i64::MAX);
        let max_pods = i64::try_from(node.max_pods).unwrap_or(i64::MAX);
        if pods + 1 > max_pods {
            return Some(refuse("pods", 1, pods, max_pods));
        }
        let used_cpu = admitted.values().map(|r| r.0).fold(0_i64, i64::saturating_add);
        if requests.0 > 0 && used_cpu.saturating_add(requests.0) > node.cpu_milli {
            return Some(refuse("cpu", requests.0, used_cpu, node.cpu_milli));
        }
        let used_memory = admitted.values().map(|r| r.1).fold(0_i64, i64::saturating_add);
        if requests.1 > 0 && used_memory.saturating_add(requests.1) > node.memory_bytes {
            return Some(refuse("memory", requests.1, used_memory, node.memory_bytes));
        }
        None
    }
}

/// The plan for a pod under a verdict: stop whatever still runs (keeping the containers for
/// their status and logs), then nothing.
pub fn plan_stopped(actual: Option<&PodActual>, verdict: &Verdict) -> Plan<PodOp> {
    match actual {
        // The sandbox pair stops the sandbox once no container runs.
        Some(a) if a.any_running() => Plan::Run(PodOp::KillPod { grace: verdict.grace, remove: false }),
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

    fn requesting(uid: &str, cpu: &str, memory: &str) -> DesiredPod {
        pod(
            uid,
            serde_json::json!({
                "initContainers": [{"name": "i", "image": "i", "resources": {"limits": {"cpu": "1500m"}}}],
                "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": memory}}},
                {"name": "b", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}),
        )
    }

    #[test]
    fn requests_count_app_containers_summed_or_the_largest_init_container() {
        assert_eq!(
            pod_requests(&requesting("p", "500m", "1Gi")),
            (1500, 1 << 30),
            "init limit 1500m > 2×500m"
        );
        assert_eq!(pod_requests(&requesting("p", "1", "1Mi")), (2000, 1 << 20));
        assert_eq!(pod_requests(&best_effort("p")), (0, 0));
    }

    #[test]
    fn sidecars_add_to_the_app_containers_and_to_later_init_containers() {
        let cpu = |m: &str| serde_json::json!({"requests": {"cpu": m}});
        let with = |init_last: &str| {
            pod(
                "p",
                serde_json::json!({
                    "initContainers": [
                        {"name": "s1", "image": "i", "restartPolicy": "Always", "resources": cpu("200m")},
                        {"name": "s2", "image": "i", "restartPolicy": "Always", "resources": cpu("300m")},
                        {"name": "i", "image": "i", "resources": cpu(init_last)}],
                    "containers": [{"name": "a", "image": "i", "resources": cpu("100m")}]}),
            )
        };
        // running: 100 + 200 + 300; the init container runs beside both sidecars: 500 + its own
        assert_eq!(pod_requests(&with("50m")).0, 600);
        assert_eq!(pod_requests(&with("400m")).0, 900);
    }

    #[test]
    fn pods_that_do_not_fit_are_refused_with_the_kubelets_reasons() {
        let v = PodVerdicts::new();
        v.set_resources(NodeResources { cpu_milli: 4000, memory_bytes: 3 << 30, max_pods: 3 });
        assert_eq!(v.admit(&requesting("a", "1", "1Gi"), false), None);
        let cpu = v.admit(&requesting("b", "2", "1Gi"), false).map(|v| (v.reason, v.message));
        assert_eq!(
            cpu,
            Some((
                "OutOfcpu".to_owned(),
                "Pod was rejected: Node didn't have enough resource: cpu, requested: 4000, used: 2000, capacity: 4000"
                    .to_owned()
            ))
        );
        let memory = v.admit(&requesting("c", "100m", "3Gi"), false).map(|v| v.reason);
        assert_eq!(memory.as_deref(), Some("OutOfmemory"));
        // A refusal is final for that pod; other pods still fit.
        assert!(v.admit(&requesting("b", "2", "1Gi"), false).is_some());
        assert_eq!(v.admit(&best_effort("d"), false), None);
        assert_eq!(v.admit(&best_effort("e"), false), None);
        let pods = v.admit(&best_effort("f"), false).map(|v| v.reason);
        assert_eq!(pods.as_deref(), Some("OutOfpods"));
        // Pods that already run (after a restart of nodelet) are admitted whatever they request.
        assert_eq!(v.admit(&requesting("g", "8", "8Gi"), true), None);
        // A pod that is gone frees its share.
        v.retain(|uid| uid != "a" && uid != "g");
        assert_eq!(v.admit(&requesting("h", "1", "1Gi"), false), None);
    }

    struct OneClass(k8s_openapi::api::node::v1::RuntimeClass);

    impl RuntimeClasses for OneClass {
        fn runtime_class(&self, name: &str) -> Option<k8s_openapi::api::node::v1::RuntimeClass> {
            (self.0.metadata.name.as_deref() == Some(name)).then(|| self.0.clone())
        }
    }

    #[test]
    fn runtime_class_overhead_counts_and_node_selectors_must_match() {
        let v = PodVerdicts::new();
        v.set_resources(NodeResources { cpu_milli: 2000, memory_bytes: 1 << 30, max_pods: 10 });
        v.set_node_labels(BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())]));
        let class = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "heavy"}, "handler": "runc",
            "overhead": {"podFixed": {"cpu": "1500m"}},
            "scheduling": {"nodeSelector": {"kubernetes.io/os": "linux"}}}))
        .unwrap_or_default();
        v.set_runtime_classes(Arc::new(OneClass(class)));
        let with_class = |uid: &str, class: &str| {
            pod(
                uid,
                serde_json::json!({"runtimeClassName": class, "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "400m"}}}]}),
            )
        };
        assert_eq!(v.admit(&with_class("a", "heavy"), false), None, "1900m of 2000m");
        let refused = v.admit(&with_class("b", "heavy"), false).map(|v| v.reason);
        assert_eq!(refused.as_deref(), Some("OutOfcpu"), "the overhead counts");
        // a class not (yet) known adds nothing; the sandbox creation reports it
        v.retain(|uid| uid != "a");
        assert_eq!(v.admit(&with_class("c", "unknown"), false), None);
        let elsewhere = pod(
            "d",
            serde_json::json!({"nodeSelector": {"kubernetes.io/os": "windows"}, "containers": [{"name": "c", "image": "i"}]}),
        );
        let refused = v.admit(&elsewhere, false).map(|v| (v.reason, v.message));
        assert_eq!(refused, Some(("NodeAffinity".to_owned(), "Predicate NodeAffinity failed".to_owned())));
    }

    #[test]
    fn pods_must_tolerate_the_nodes_no_execute_taints_with_their_class_tolerations() {
        let v = PodVerdicts::new();
        let taint = |key: &str, effect: &str| k8s_openapi::api::core::v1::Taint {
            key: key.to_owned(),
            value: Some("x".to_owned()),
            effect: effect.to_owned(),
            ..Default::default()
        };
        v.set_node_taints(vec![taint("dedicated", "NoExecute"), taint("soft", "NoSchedule")]);
        let class = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "tolerant"}, "handler": "runc",
            "scheduling": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}))
        .unwrap_or_default();
        v.set_runtime_classes(Arc::new(OneClass(class)));
        let plain = pod("a", serde_json::json!({"containers": [{"name": "c", "image": "i"}]}));
        let refused = v.admit(&plain, false).map(|v| (v.reason, v.message));
        assert_eq!(
            refused,
            Some(("TaintToleration".to_owned(), "Predicate TaintToleration failed".to_owned()))
        );
        let own = pod(
            "b",
            serde_json::json!({"tolerations": [{"key": "dedicated", "value": "x", "effect": "NoExecute"}],
            "containers": [{"name": "c", "image": "i"}]}),
        );
        assert_eq!(v.admit(&own, false), None, "its own toleration; NoSchedule taints are the scheduler's");
        let classy = pod(
            "c",
            serde_json::json!({"runtimeClassName": "tolerant", "containers": [{"name": "c", "image": "i"}]}),
        );
        assert_eq!(v.admit(&classy, false), None, "the class's toleration");
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

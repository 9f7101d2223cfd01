//! The admission decisions behind the node's verdicts ([`Verdict`], in [`crate::model::verdict`]: the value of
//! the verdict store, which only the [`VerdictPopulator`](super::populator::VerdictPopulator) writes).
//!
//! [`Admission`]: the kubelet's admit handlers as plain state owned by that populator: node pressure (the
//! eviction pair's conditions), the sysctl allowlist (`SysctlForbidden`), the pod's OS
//! (`PodOSSelectorNodeLabelDoesNotMatch`, `PodOSNotSupported`), the resource fit against the node's allocatable
//! resources (`OutOfpods`, `OutOfcpu`, `OutOfmemory`, counting RuntimeClass overhead), the node selector
//! (`NodeAffinity`) and `NoExecute` taints (`TaintToleration`); and in-place resize decisions
//! ([`ResizeDecision`]) against the same accounting. What the pod pair does with a stopped pod is its own
//! ([`crate::pod::verdict`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::rank::is_critical;
use crate::common::runtime_class::{self, RuntimeClasses};
use crate::common::sysctl::{self, SysctlAllowlist};
use crate::model::pod::DesiredPod;
use crate::model::pressure::Condition;
use crate::model::qos::{QosClass, qos_class};
use crate::model::verdict::{ResizeDecision, Stopped, Verdict, VerdictKind, pod_requests};

/// The taint a pod tolerates to be admitted under memory pressure when it is BestEffort.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

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

/// The RuntimeClass lookup admission uses (for overhead and node selectors).
#[derive(Clone)]
struct ClassLookup(Arc<dyn RuntimeClasses>);

impl std::fmt::Debug for ClassLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClassLookup")
    }
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

/// The admission decisions of the node, as plain state: what the node offers (allocatable
/// resources, labels, `NoExecute` taints, RuntimeClasses) and the requests of the pods admitted so
/// far. Owned by the [`VerdictPopulator`](super::populator::VerdictPopulator), the only one that
/// decides; nothing else holds it.
#[derive(Debug, Default)]
pub struct Admission {
    /// Admitted pods and their (cpu milli, memory bytes) requests.
    admitted: HashMap<String, (i64, i64)>,
    resources: Option<NodeResources>,
    classes: Option<ClassLookup>,
    node_labels: Option<BTreeMap<String, String>>,
    node_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    sysctls: SysctlAllowlist,
}

impl Admission {
    /// Admits every pod that the pressure conditions allow.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes admission refuse pods that do not fit in `resources` besides the pods admitted
    /// before them.
    pub fn with_resources(mut self, resources: NodeResources) -> Self {
        self.resources = Some(resources);
        self
    }

    /// Lets admission add the pods' RuntimeClass overhead to their requests and require their
    /// class's `scheduling.nodeSelector`.
    pub fn with_runtime_classes(mut self, classes: Arc<dyn RuntimeClasses>) -> Self {
        self.classes = Some(ClassLookup(classes));
        self
    }

    /// Makes admission refuse pods whose `nodeSelector` (merged with their RuntimeClass's) the
    /// node's `labels` do not match: the kubelet's `NodeAffinity`.
    pub fn with_node_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.node_labels = Some(labels);
        self
    }

    /// Makes admission refuse pods that do not tolerate (with their RuntimeClass's tolerations) the
    /// node's `NoExecute` taints among `taints`: the kubelet's `TaintToleration`.
    pub fn with_node_taints(mut self, taints: Vec<k8s_openapi::api::core::v1::Taint>) -> Self {
        self.node_taints = taints.into_iter().filter(|t| t.effect == "NoExecute").collect();
        self
    }

    /// Makes admission allow the sysctls of `allowlist` (the safe set and the node's
    /// `allowedUnsafeSysctls`) instead of the safe set alone.
    pub fn with_sysctls(mut self, allowlist: SysctlAllowlist) -> Self {
        self.sysctls = allowlist;
        self
    }

    fn classes(&self) -> Option<&dyn RuntimeClasses> {
        self.classes.as_ref().map(|c| &*c.0)
    }

    /// Forgets the pod `uid` (gone from the desired state): its share is free again.
    pub fn forget(&mut self, uid: &str) {
        self.admitted.remove(uid);
    }

    /// Whether `uid` was admitted (and not forgotten since).
    pub fn is_admitted(&self, uid: &str) -> bool {
        self.admitted.contains_key(uid)
    }

    /// Admission of an admitted pod's requests as its spec has them now (in-place resize):
    /// `None` when they are what it was admitted with. Otherwise, without the node's resources
    /// or when the node has room for them besides the other pods, the new requests become the
    /// pod's allocation (`Accepted`); else the resize waits (`Deferred`) or is refused
    /// (`Infeasible`, more than the node has).
    pub fn resize(&mut self, pod: &DesiredPod) -> Option<ResizeDecision> {
        let requests = requests_with_overhead(pod, self.classes());
        let uid = pod.uid();
        if self.admitted.get(uid) == Some(&requests) {
            return None;
        }
        if let Some(node) = self.resources {
            if requests.0 > node.cpu_milli || requests.1 > node.memory_bytes {
                return Some(ResizeDecision::Infeasible);
            }
            let others = self.admitted.iter().filter(|(u, _)| u.as_str() != uid);
            let (cpu, memory) =
                others.fold((0_i64, 0_i64), |(c, m), (_, r)| (c.saturating_add(r.0), m.saturating_add(r.1)));
            if cpu.saturating_add(requests.0) > node.cpu_milli
                || memory.saturating_add(requests.1) > node.memory_bytes
            {
                return Some(ResizeDecision::Deferred);
            }
        }
        self.admitted.insert(uid.to_owned(), requests);
        Some(ResizeDecision::Accepted)
    }

    /// Admission of a new pod, as the kubelet's admit handlers decide it, under the pressure
    /// `conditions`: under memory pressure alone, BestEffort pods are refused unless they
    /// tolerate the memory-pressure taint; under any other pressure every pod is refused;
    /// critical pods are always admitted. Then, in the kubelet's order, the sysctls
    /// (`SysctlForbidden`), a `kubernetes.io/os` pod label other than the node's OS
    /// (`PodOSSelectorNodeLabelDoesNotMatch`), a `spec.os.name` other than the node's OS
    /// (`PodOSNotSupported`), the resource fit (`OutOfpods`, `OutOfcpu`, `OutOfmemory`), the node
    /// selector (`NodeAffinity`) and the `NoExecute` taints (`TaintToleration`). A pod that is `started` (it already has something in the runtime,
    /// e.g. after a restart of nodelet) is admitted whatever it asks. An admitted pod's requests
    /// count against every later pod until it is [`forget`](Self::forget)-ten.
    pub fn admit(&mut self, pod: &DesiredPod, started: bool, conditions: &BTreeSet<Condition>) -> Verdict {
        let uid = pod.uid();
        let requests = requests_with_overhead(pod, self.classes());
        if started {
            self.admitted.insert(uid.to_owned(), requests);
            return Verdict::admitted(pod);
        }
        let refuse = !conditions.is_empty()
            && !is_critical(pod)
            && !(conditions.len() == 1
                && conditions.contains(&Condition::MemoryPressure)
                && (qos_class(pod) != QosClass::BestEffort || tolerates_memory_pressure(pod)));
        if refuse {
            let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
            return Verdict::rejected("Evicted", format!("The node had condition: [{}]. ", names.join(", ")));
        }
        if let Some(Err(message)) = pod.pod.spec.as_ref().map(|spec| self.sysctls.admit(spec)) {
            return Verdict::rejected(sysctl::FORBIDDEN_REASON, message.to_string());
        }
        if let Some(refused) = reject_os(pod) {
            return refused;
        }
        if let Some(stop) = self.resources.and_then(|r| Self::fits(&self.admitted, r, requests)) {
            return Verdict::Stopped(stop);
        }
        if let Some(labels) = &self.node_labels
            && !runtime_class::node_selector(pod, self.classes())
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        {
            return Verdict::rejected("NodeAffinity", "Predicate NodeAffinity failed".into());
        }
        if !self.node_taints.is_empty() {
            let tolerations = runtime_class::tolerations(pod, self.classes());
            let untolerated = self
                .node_taints
                .iter()
                .any(|taint| !tolerations.iter().any(|t| runtime_class::tolerates(t, taint)));
            if untolerated {
                return Verdict::rejected("TaintToleration", "Predicate TaintToleration failed".into());
            }
        }
        self.admitted.insert(uid.to_owned(), requests);
        Verdict::admitted(pod)
    }

    /// The kubelet's resource fit check: `None` when a pod with `requests` fits beside `admitted`.
    fn fits(
        admitted: &HashMap<String, (i64, i64)>,
        node: NodeResources,
        requests: (i64, i64),
    ) -> Option<Stopped> {
        let refuse = |resource: &str, requested: i64, used: i64, capacity: i64| Stopped {
            kind: VerdictKind::Rejected,
            reason: format!("OutOf{resource}"),
            message: format!(
                "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
            grace: Duration::ZERO,
            at: 0,
            disruption_target: false,
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

/// The node's OS, as the kubelet's `runtime.GOOS` names it.
const NODE_OS: &str = std::env::consts::OS;

/// The kubelet's OS checks (`pkg/kubelet/lifecycle/predicate.go`): a pod whose `kubernetes.io/os`
/// label (its label, as the kubelet reads it, not its node selector) is not the node's OS, or whose
/// `spec.os.name` is not the node's OS.
fn reject_os(pod: &DesiredPod) -> Option<Verdict> {
    let label = pod.pod.metadata.labels.as_ref().and_then(|l| l.get(OS_LABEL));
    if label.is_some_and(|os| os != NODE_OS) {
        return Some(Verdict::rejected(
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".into(),
        ));
    }
    let os = pod.pod.spec.as_ref().and_then(|s| s.os.as_ref());
    if os.is_some_and(|os| os.name != NODE_OS) {
        return Some(Verdict::rejected(
            "PodOSNotSupported",
            "Failed to admit pod as the OS field doesn't match node OS".into(),
        ));
    }
    None
}

/// The node label naming the OS.
const OS_LABEL: &str = "kubernetes.io/os";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pod::PodSource;
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

    /// Admission without pressure; the stop, if refused.
    fn admit(a: &mut Admission, pod: &DesiredPod, started: bool) -> Option<Stopped> {
        a.admit(pod, started, &BTreeSet::new()).stopped().cloned()
    }

    #[test]
    fn pods_that_do_not_fit_are_refused_with_the_kubelets_reasons() {
        let mut a = Admission::new().with_resources(NodeResources {
            cpu_milli: 4000,
            memory_bytes: 3 << 30,
            max_pods: 3,
        });
        assert_eq!(admit(&mut a, &requesting("a", "1", "1Gi"), false), None);
        let cpu = admit(&mut a, &requesting("b", "2", "1Gi"), false).map(|v| (v.reason, v.message));
        assert_eq!(
            cpu,
            Some((
                "OutOfcpu".to_owned(),
                "Pod was rejected: Node didn't have enough resource: cpu, requested: 4000, used: 2000, capacity: 4000"
                    .to_owned()
            ))
        );
        let memory = admit(&mut a, &requesting("c", "100m", "3Gi"), false).map(|v| v.reason);
        assert_eq!(memory.as_deref(), Some("OutOfmemory"));
        // Refused pods take no share; other pods still fit.
        assert!(!a.is_admitted("b"));
        assert_eq!(admit(&mut a, &best_effort("d"), false), None);
        assert_eq!(admit(&mut a, &best_effort("e"), false), None);
        let pods = admit(&mut a, &best_effort("f"), false).map(|v| v.reason);
        assert_eq!(pods.as_deref(), Some("OutOfpods"));
        // Pods that already run (after a restart of nodelet) are admitted whatever they request.
        assert_eq!(admit(&mut a, &requesting("g", "8", "8Gi"), true), None);
        // A pod that is gone frees its share.
        a.forget("a");
        a.forget("g");
        assert_eq!(admit(&mut a, &requesting("h", "1", "1Gi"), false), None);
    }

    struct OneClass(k8s_openapi::api::node::v1::RuntimeClass);

    impl RuntimeClasses for OneClass {
        fn runtime_class(&self, name: &str) -> Option<k8s_openapi::api::node::v1::RuntimeClass> {
            (self.0.metadata.name.as_deref() == Some(name)).then(|| self.0.clone())
        }
    }

    #[test]
    fn runtime_class_overhead_counts_and_node_selectors_must_match() {
        let class = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "heavy"}, "handler": "runc",
            "overhead": {"podFixed": {"cpu": "1500m"}},
            "scheduling": {"nodeSelector": {"kubernetes.io/os": "linux"}}}))
        .unwrap_or_default();
        let mut a = Admission::new()
            .with_resources(NodeResources { cpu_milli: 2000, memory_bytes: 1 << 30, max_pods: 10 })
            .with_node_labels(BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())]))
            .with_runtime_classes(Arc::new(OneClass(class)));
        let with_class = |uid: &str, class: &str| {
            pod(
                uid,
                serde_json::json!({"runtimeClassName": class, "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "400m"}}}]}),
            )
        };
        assert_eq!(admit(&mut a, &with_class("a", "heavy"), false), None, "1900m of 2000m");
        let refused = admit(&mut a, &with_class("b", "heavy"), false).map(|v| v.reason);
        assert_eq!(refused.as_deref(), Some("OutOfcpu"), "the overhead counts");
        // a class not (yet) known adds nothing; the sandbox creation reports it
        a.forget("a");
        assert_eq!(admit(&mut a, &with_class("c", "unknown"), false), None);
        let elsewhere = pod(
            "d",
            serde_json::json!({"nodeSelector": {"kubernetes.io/os": "windows"}, "containers": [{"name": "c", "image": "i"}]}),
        );
        let refused = admit(&mut a, &elsewhere, false).map(|v| (v.reason, v.message));
        assert_eq!(refused, Some(("NodeAffinity".to_owned(), "Predicate NodeAffinity failed".to_owned())));
    }

    #[test]
    fn pods_must_tolerate_the_nodes_no_execute_taints_with_their_class_tolerations() {
        let taint = |key: &str, effect: &str| k8s_openapi::api::core::v1::Taint {
            key: key.to_owned(),
            value: Some("x".to_owned()),
            effect: effect.to_owned(),
            ..Default::default()
        };
        let class = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "tolerant"}, "handler": "runc",
            "scheduling": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}))
        .unwrap_or_default();
        let mut a = Admission::new()
            .with_node_taints(vec![taint("dedicated", "NoExecute"), taint("soft", "NoSchedule")])
            .with_runtime_classes(Arc::new(OneClass(class)));
        let plain = pod("a", serde_json::json!({"containers": [{"name": "c", "image": "i"}]}));
        let refused = admit(&mut a, &plain, false).map(|v| (v.reason, v.message));
        assert_eq!(
            refused,
            Some(("TaintToleration".to_owned(), "Predicate TaintToleration failed".to_owned()))
        );
        let own = pod(
            "b",
            serde_json::json!({"tolerations": [{"key": "dedicated", "value": "x", "effect": "NoExecute"}],
            "containers": [{"name": "c", "image": "i"}]}),
        );
        assert_eq!(
            admit(&mut a, &own, false),
            None,
            "its own toleration; NoSchedule taints are the scheduler's"
        );
        let classy = pod(
            "c",
            serde_json::json!({"runtimeClassName": "tolerant", "containers": [{"name": "c", "image": "i"}]}),
        );
        assert_eq!(admit(&mut a, &classy, false), None, "the class's toleration");
    }

    #[test]
    fn unsafe_sysctls_and_other_oses_are_refused_with_the_kubelets_texts() {
        let mut a = Admission::new();
        let sysctl = |uid: &str, name: &str| {
            pod(
                uid,
                serde_json::json!({"containers": [{"name": "c", "image": "i"}],
                    "securityContext": {"sysctls": [{"name": name, "value": "1"}]}}),
            )
        };
        assert_eq!(admit(&mut a, &sysctl("safe", "kernel.shm_rmid_forced"), false), None);
        let refused = admit(&mut a, &sysctl("unsafe", "kernel.msgmax"), false).map(|v| (v.reason, v.message));
        assert_eq!(
            refused,
            Some((
                "SysctlForbidden".to_owned(),
                r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#.to_owned()
            ))
        );
        let mut allowing = Admission::new()
            .with_sysctls(SysctlAllowlist::new(&["kernel.msg*".to_owned()]).expect("valid patterns"));
        assert_eq!(admit(&mut allowing, &sysctl("unsafe", "kernel.msgmax"), false), None);

        let windows = pod(
            "win",
            serde_json::json!({"os": {"name": "windows"}, "containers": [{"name": "c", "image": "i"}]}),
        );
        let refused = admit(&mut a, &windows, false).map(|v| (v.kind, v.reason, v.message));
        assert_eq!(
            refused,
            Some((
                VerdictKind::Rejected,
                "PodOSNotSupported".to_owned(),
                "Failed to admit pod as the OS field doesn't match node OS".to_owned()
            ))
        );
        let linux = pod(
            "lin",
            serde_json::json!({"os": {"name": "linux"}, "containers": [{"name": "c", "image": "i"}]}),
        );
        assert_eq!(admit(&mut a, &linux, false), None);

        let mut labelled = best_effort("labelled");
        labelled.pod.metadata.labels = Some(BTreeMap::from([(OS_LABEL.to_owned(), "windows".to_owned())]));
        let refused = admit(&mut a, &labelled, false).map(|v| (v.reason, v.message));
        assert_eq!(
            refused,
            Some((
                "PodOSSelectorNodeLabelDoesNotMatch".to_owned(),
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".to_owned()
            ))
        );
        labelled.pod.metadata.labels = Some(BTreeMap::from([(OS_LABEL.to_owned(), "linux".to_owned())]));
        assert_eq!(admit(&mut a, &labelled, false), None);
    }

    #[test]
    fn memory_pressure_refuses_best_effort_pods_only() {
        let mut a = Admission::new();
        let memory = BTreeSet::from([Condition::MemoryPressure]);
        let refused = a.admit(&best_effort("be"), false, &memory);
        assert_eq!(
            refused.stopped().map(|v| (v.kind.clone(), v.message.as_str())),
            Some((VerdictKind::Rejected, "The node had condition: [MemoryPressure]. "))
        );
        assert_eq!(a.admit(&burstable("bu"), false, &memory), Verdict::admitted(&burstable("bu")));
        let tolerant = pod(
            "tol",
            serde_json::json!({"containers": [{"name": "c", "image": "i"}],
                "tolerations": [{"key": MEMORY_PRESSURE_TAINT, "operator": "Exists",
                                 "effect": "NoSchedule"}]}),
        );
        assert_eq!(a.admit(&tolerant, false, &memory), Verdict::admitted(&tolerant));
    }

    #[test]
    fn disk_pressure_refuses_every_pod_but_critical_and_started_ones() {
        let mut a = Admission::new();
        let disk = BTreeSet::from([Condition::DiskPressure]);
        let refused = a.admit(&burstable("new"), false, &disk);
        assert_eq!(
            refused.stopped().map(|s| s.message.as_str()),
            Some("The node had condition: [DiskPressure]. ")
        );
        assert!(!a.is_admitted("new"));
        assert!(a.admit(&burstable("adopted"), true, &disk).is_admitted(), "already in the runtime");
        let critical = pod(
            "crit",
            serde_json::json!({"containers": [{"name": "c", "image": "i"}], "priority": 2_000_001_000}),
        );
        assert!(a.admit(&critical, false, &disk).is_admitted());
    }

    #[test]
    fn a_resize_is_accepted_and_committed_deferred_or_infeasible() {
        let cpu = |uid: &str, m: &str| {
            pod(
                uid,
                serde_json::json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": m}}}]}),
            )
        };
        let mut a = Admission::new().with_resources(NodeResources {
            cpu_milli: 1000,
            memory_bytes: 1 << 30,
            max_pods: 10,
        });
        assert_eq!(admit(&mut a, &cpu("small", "400m"), false), None);
        assert_eq!(admit(&mut a, &cpu("other", "500m"), false), None);
        assert_eq!(a.resize(&cpu("small", "400m")), None, "unchanged");
        assert_eq!(a.resize(&cpu("small", "600m")), Some(ResizeDecision::Deferred), "600m + 500m");
        assert_eq!(a.resize(&cpu("small", "1200m")), Some(ResizeDecision::Infeasible), "more than the node");
        assert_eq!(a.resize(&cpu("small", "500m")), Some(ResizeDecision::Accepted), "500m + 500m");
        assert_eq!(a.resize(&cpu("small", "500m")), None, "committed");
        let refused = admit(&mut a, &cpu("third", "1m"), false).map(|s| s.reason);
        assert_eq!(refused.as_deref(), Some("OutOfcpu"), "the committed requests count");
        a.forget("other");
        assert_eq!(a.resize(&cpu("small", "600m")), Some(ResizeDecision::Accepted));
    }
}

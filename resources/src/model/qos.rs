//! A pod's QoS class, as the kubelet and the API server compute it (`GetPodQOS` and `ComputePodQOS` of
//! `pkg/apis/core/v1/helper/qos`, Kubernetes 1.28): the one computation of the project, used by the pod status,
//! eviction's admission under memory pressure and the CRI spec (`oom_score_adj`).
//!
//! The rules, exactly as upstream:
//! - the class the API server recorded in `status.qosClass` wins (it is immutable once the pod exists: the API
//!   server refuses a resize that would change it); nodelet computes it only for a pod without one (static pods);
//! - only `cpu` and `memory` count (not `ephemeral-storage`, hugepages or extended resources), and only values
//!   above zero;
//! - app and init containers count (ephemeral containers do not), their requests and limits summed per resource;
//! - **BestEffort**: no container requests or limits CPU or memory;
//! - **Guaranteed**: every container has CPU and memory limits, and the summed requests equal the summed limits
//!   for both, compared by value (`1` and `1000m` are equal);
//! - **Burstable**: anything else.
//!
//! A request left unset reads as its limit, as the API server's defaulting (and nodelet's, for static pods)
//! writes it. Quantities are compared in nano-units (exact for every quantity with at most nine decimals; finer
//! ones round up).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::model::pod::DesiredPod;
use crate::quantity::Quantity;

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has CPU and memory limits, and the requests equal them.
    Guaranteed,
    /// Some requests or limits, not Guaranteed.
    Burstable,
    /// No CPU or memory requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// The name the API writes (`Guaranteed`, `Burstable`, `BestEffort`).
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    /// The class named `name`, if it is one.
    pub fn from_name(name: &str) -> Option<QosClass> {
        match name {
            "Guaranteed" => Some(QosClass::Guaranteed),
            "Burstable" => Some(QosClass::Burstable),
            "BestEffort" => Some(QosClass::BestEffort),
            _ => None,
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pod's QoS class (`GetPodQOS`): the one in its status when the API server recorded one, else
/// [`compute_qos_class`].
pub fn qos_class(pod: &DesiredPod) -> QosClass {
    pod.pod
        .status
        .as_ref()
        .and_then(|s| s.qos_class.as_deref())
        .and_then(QosClass::from_name)
        .unwrap_or_else(|| compute_qos_class(pod.init_containers().iter().chain(pod.containers())))
}

/// The resources QoS counts.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// The QoS class of a pod with these (app and init) containers (`ComputePodQOS`); see the [module docs](self).
pub fn compute_qos_class<'a>(containers: impl IntoIterator<Item = &'a Container>) -> QosClass {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    for container in containers {
        let resources = container.resources.as_ref();
        let container_limits = resources.and_then(|r| r.limits.as_ref());
        let container_requests = resources.and_then(|r| r.requests.as_ref());
        let mut limits_found = 0;
        for name in QOS_RESOURCES {
            let limit = positive(container_limits, name);
            // Defaulting: an unset request is the limit.
            let request = match container_requests.and_then(|r| r.get(name)) {
                Some(_) => positive(container_requests, name),
                None => limit,
            };
            if let Some(request) = request {
                let sum = requests.entry(name).or_default();
                *sum = sum.saturating_add(request);
            }
            if let Some(limit) = limit {
                limits_found += 1;
                let sum = limits.entry(name).or_default();
                *sum = sum.saturating_add(limit);
            }
        }
        if limits_found < QOS_RESOURCES.len() {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed
        && requests.len() == limits.len()
        && requests.iter().all(|(name, r)| limits.get(name) == Some(r))
    {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// `map[name]` in nano-units when it parses and is above zero (an unparsable value counts as unset: validation
/// refuses it before a pod gets here).
fn positive(map: Option<&BTreeMap<String, ApiQuantity>>, name: &str) -> Option<i128> {
    let quantity = Quantity::parse(&map?.get(name)?.0)?;
    quantity.nanos().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus, ResourceRequirements};

    use super::*;
    use crate::model::pod::PodSource;

    fn list(cpu: &str, memory: &str) -> Option<BTreeMap<String, ApiQuantity>> {
        let mut map = BTreeMap::new();
        if !cpu.is_empty() {
            map.insert("cpu".to_owned(), ApiQuantity(cpu.to_owned()));
        }
        if !memory.is_empty() {
            map.insert("memory".to_owned(), ApiQuantity(memory.to_owned()));
        }
        Some(map)
    }

    /// `newContainer(name, requests, limits)` of upstream's test.
    fn container(requests: (&str, &str), limits: (&str, &str)) -> Container {
        Container {
            name: "c".to_owned(),
            resources: Some(ResourceRequirements {
                requests: list(requests.0, requests.1),
                limits: list(limits.0, limits.1),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> DesiredPod {
        DesiredPod {
            pod: Pod {
                spec: Some(PodSpec { containers, init_containers: Some(init), ..PodSpec::default() }),
                ..Pod::default()
            },
            source: PodSource::Api,
        }
    }

    const NONE: (&str, &str) = ("", "");

    /// Issue 37, point 12: requests cpu `1` with limits cpu `1000m` are equal by value (the strings differ).
    #[test]
    fn one_cpu_and_1000m_are_guaranteed() {
        let p = pod(vec![container(("1", "64Mi"), ("1000m", "67108864"))], vec![]);
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        let p = pod(vec![container(("0.5", "1Gi"), ("500m", "1024Mi"))], vec![]);
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        let p = pod(vec![container(("1", "64Mi"), ("1001m", "64Mi"))], vec![]);
        assert_eq!(qos_class(&p), QosClass::Burstable);
    }

    /// `TestComputePodQOS` of Kubernetes 1.28 (`pkg/apis/core/v1/helper/qos/qos_test.go`), every case.
    #[test]
    fn upstream_compute_pod_qos_cases() {
        use QosClass::{BestEffort, Burstable, Guaranteed};
        let hugepages = |mut c: Container| {
            if let Some(r) = c.resources.as_mut() {
                for map in [r.requests.as_mut(), r.limits.as_mut()].into_iter().flatten() {
                    map.insert("hugepages-2Mi".to_owned(), ApiQuantity("1Gi".to_owned()));
                }
            }
            c
        };
        let cases: Vec<(&str, DesiredPod, QosClass)> = vec![
            ("guaranteed", pod(vec![container(("100m", "100Mi"), ("100m", "100Mi"))], vec![]), Guaranteed),
            (
                "guaranteed-guaranteed",
                pod(
                    vec![
                        container(("100m", "100Mi"), ("100m", "100Mi")),
                        container(("100m", "100Mi"), ("100m", "100Mi")),
                    ],
                    vec![],
                ),
                Guaranteed,
            ),
            (
                "best-effort-best-effort",
                pod(vec![container(NONE, NONE), container(NONE, NONE)], vec![]),
                BestEffort,
            ),
            ("best-effort", pod(vec![container(NONE, NONE)], vec![]), BestEffort),
            (
                "best-effort-burstable",
                pod(vec![container(NONE, NONE), container(("1", ""), ("2", ""))], vec![]),
                Burstable,
            ),
            (
                "best-effort-guaranteed",
                pod(vec![container(NONE, NONE), container(("10m", "100Mi"), ("10m", "100Mi"))], vec![]),
                Burstable,
            ),
            (
                "burstable-cpu-guaranteed-memory",
                pod(vec![container(("", "100Mi"), ("", "100Mi"))], vec![]),
                Burstable,
            ),
            ("burstable-no-limits", pod(vec![container(("100m", "100Mi"), NONE)], vec![]), Burstable),
            (
                "burstable-guaranteed",
                pod(
                    vec![
                        container(("1", "100Mi"), ("2", "100Mi")),
                        container(("100m", "100Mi"), ("100m", "100Mi")),
                    ],
                    vec![],
                ),
                Burstable,
            ),
            (
                "burstable-unbounded-but-requests-match-limits",
                pod(
                    vec![container(("100m", "100Mi"), ("200m", "200Mi")), container(("100m", "100Mi"), NONE)],
                    vec![],
                ),
                Burstable,
            ),
            ("burstable-1", pod(vec![container(("10m", "100Mi"), ("100m", "200Mi"))], vec![]), Burstable),
            ("burstable-2", pod(vec![container(("0", "0"), ("100m", "200Mi"))], vec![]), Burstable),
            (
                "best-effort-hugepages",
                pod(vec![hugepages(container(("0", "0"), ("0", "0")))], vec![]),
                BestEffort,
            ),
            (
                "init-container",
                pod(vec![container(NONE, NONE)], vec![container(("10m", "100Mi"), ("100m", "200Mi"))]),
                Burstable,
            ),
        ];
        for (name, p, expected) in cases {
            assert_eq!(qos_class(&p), expected, "{name}");
        }
    }

    /// Beyond upstream's table: defaulting, sums across containers, init containers, other resources.
    #[test]
    fn defaulted_requests_sums_and_other_resources() {
        // Limits only: the requests default to them.
        assert_eq!(qos_class(&pod(vec![container(NONE, ("1", "1Gi"))], vec![])), QosClass::Guaranteed);
        // An init container without limits makes the pod Burstable.
        let p = pod(vec![container(NONE, ("1", "1Gi"))], vec![container(("1", ""), NONE)]);
        assert_eq!(qos_class(&p), QosClass::Burstable);
        // Guaranteed init and app containers.
        let p = pod(vec![container(NONE, ("1", "1Gi"))], vec![container(NONE, ("2", "2Gi"))]);
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        // Ephemeral storage does not count.
        let mut c = container(("1", "1Gi"), ("1", "1Gi"));
        if let Some(limits) = c.resources.as_mut().and_then(|r| r.limits.as_mut()) {
            limits.insert("ephemeral-storage".to_owned(), ApiQuantity("1Gi".to_owned()));
        }
        assert_eq!(qos_class(&pod(vec![c], vec![])), QosClass::Guaranteed);
    }

    /// The class the API server recorded wins, as in `GetPodQOS`; an unknown name is computed over.
    #[test]
    fn the_recorded_class_wins() {
        let mut p = pod(vec![container(("1", "1Gi"), ("2", "1Gi"))], vec![]);
        assert_eq!(qos_class(&p), QosClass::Burstable);
        p.pod.status = Some(PodStatus { qos_class: Some("Guaranteed".to_owned()), ..PodStatus::default() });
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        p.pod.status = Some(PodStatus { qos_class: Some("Platinum".to_owned()), ..PodStatus::default() });
        assert_eq!(qos_class(&p), QosClass::Burstable);
    }
}

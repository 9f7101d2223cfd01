//! Which pod goes first under pressure, as the kubelet ranks them, and the eviction message.

use std::cmp::Ordering;

use super::signal::PodUsage;

use super::state::Met;
use crate::model::pod::DesiredPod;
use crate::model::pressure::{Condition, Signal};
use crate::quantity::Quantity;

/// Priority at and above which a pod is system-critical (`system-cluster-critical`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A pod's priority: `spec.priority`, else the built-in system classes' values, else 0.
pub fn priority(pod: &DesiredPod) -> i32 {
    let spec = pod.spec();
    if let Some(p) = spec.priority {
        return p;
    }
    match spec.priority_class_name.as_deref() {
        Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
        Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
        _ => 0,
    }
}

/// Whether the pod is system-critical and never evicted (nodelet does not treat every static
/// pod as critical, unlike the kubelet; see the architecture notes).
pub fn is_critical(pod: &DesiredPod) -> bool {
    priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// The sum of the app containers' requests of `resource`, in whole units (bytes).
pub fn request(pod: &DesiredPod, resource: &str) -> u64 {
    pod.containers()
        .iter()
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(resource))
        .filter_map(|q| Quantity::parse(&q.0))
        .map(|q| u64::try_from(q.scaled_ceil(1)).unwrap_or(0))
        .fold(0u64, u64::saturating_add)
}

/// A pod with what it uses, ready to rank.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// The pod.
    pub pod: &'a DesiredPod,
    /// Its usage (`PodUsage::default()` when no stats exist).
    pub usage: PodUsage,
}

fn usage_of(c: &Candidate<'_>, signal: Signal) -> (Option<u64>, u64) {
    match signal.condition() {
        Condition::MemoryPressure => (c.usage.memory, request(c.pod, "memory")),
        Condition::DiskPressure if signal.resource() == "inodes" => (c.usage.inodes, 0),
        Condition::DiskPressure => (c.usage.disk, request(c.pod, "ephemeral-storage")),
        Condition::PidPressure => (c.usage.processes, 0),
    }
}

/// Orders two candidates for `signal`: the one to evict first is `Less`.
///
/// Memory and disk: pods whose usage exceeds their request (or whose stats are missing) first,
/// then lower priority, then more usage above the request. PIDs: lower priority, then more
/// processes.
pub fn compare(signal: Signal, a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let (ua, ra) = usage_of(a, signal);
    let (ub, rb) = usage_of(b, signal);
    let exceeds = |u: Option<u64>, r: u64| u.is_none_or(|u| u > r);
    let above = |u: Option<u64>, r: u64| u.map_or(0, |u| u.saturating_sub(r));
    let by_priority = priority(a.pod).cmp(&priority(b.pod));
    if signal.condition() == Condition::PidPressure {
        return by_priority.then(ub.unwrap_or(0).cmp(&ua.unwrap_or(0)));
    }
    exceeds(ub, rb).cmp(&exceeds(ua, ra)).then(by_priority).then(above(ub, rb).cmp(&above(ua, ra)))
}

/// The candidates in eviction order for `signal` (critical pods excluded).
pub fn rank<'a>(signal: Signal, mut candidates: Vec<Candidate<'a>>) -> Vec<Candidate<'a>> {
    candidates.retain(|c| !is_critical(c.pod));
    candidates.sort_by(|a, b| compare(signal, a, b).then_with(|| a.pod.name().cmp(b.pod.name())));
    candidates
}

/// Bytes as the kubelet prints quantities in messages: the largest binary unit that divides
/// exactly (`123Ki`, `1Gi`), else the plain number.
pub fn format_quantity(n: u64) -> String {
    for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        let unit = 1u64 << shift;
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// The kubelet's eviction message: `The node was low on resource: memory. Threshold quantity:
/// 100Mi, available: 80Mi. Container app was using 300Mi, request is 0, has larger consumption
/// of memory. `
pub fn eviction_message(met: &Met, candidate: &Candidate<'_>) -> String {
    let signal = met.threshold.signal;
    let resource = signal.resource();
    let fmt =
        |n: u64| if resource == "pids" || resource == "inodes" { n.to_string() } else { format_quantity(n) };
    let mut message = format!(
        "The node was low on resource: {resource}. Threshold quantity: {}, available: {}. ",
        fmt(met.limit()),
        fmt(met.observed.available)
    );
    let (used, requested) = usage_of(candidate, signal);
    if let (Some(used), true) = (used, resource == "memory" || resource == "ephemeral-storage")
        && let Some(c) = candidate.pod.containers().first()
    {
        message.push_str(&format!(
            "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
            c.name,
            format_quantity(used),
            format_quantity(requested)
        ));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::signal::{Amount, Observation, Threshold};
    use crate::model::pod::PodSource;
    use k8s_openapi::api::core::v1::Pod;

    const MI: u64 = 1 << 20;

    fn pod(name: &str, memory_request: Option<&str>, priority: Option<i32>) -> DesiredPod {
        let mut container = serde_json::json!({"name": "app", "image": "busybox"});
        if let Some(r) = memory_request {
            container["resources"] = serde_json::json!({"requests": {"memory": r}});
        }
        let mut spec = serde_json::json!({"containers": [container]});
        if let Some(p) = priority {
            spec["priority"] = serde_json::json!(p);
        }
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": spec,
        }))
        .unwrap_or_default();
        DesiredPod { pod, source: PodSource::Http }
    }

    fn cand(pod: &DesiredPod, memory: Option<u64>) -> Candidate<'_> {
        Candidate { pod, usage: PodUsage { memory, ..PodUsage::default() } }
    }

    fn names(ranked: &[Candidate<'_>]) -> Vec<String> {
        ranked.iter().map(|c| c.pod.name().to_string()).collect()
    }

    #[test]
    fn memory_ranks_usage_above_request_then_priority_then_usage() {
        let within = pod("within", Some("500Mi"), Some(-10));
        let above_small = pod("above-small", Some("100Mi"), None);
        let above_big = pod("above-big", None, None);
        let above_high_prio = pod("above-high-prio", None, Some(1000));
        let no_stats = pod("no-stats", Some("1Gi"), Some(5));
        let ranked = rank(
            Signal::MemoryAvailable,
            vec![
                cand(&within, Some(400 * MI)),
                cand(&above_small, Some(150 * MI)),
                cand(&above_big, Some(300 * MI)),
                cand(&above_high_prio, Some(900 * MI)),
                cand(&no_stats, None),
            ],
        );
        assert_eq!(
            names(&ranked),
            ["above-big", "above-small", "no-stats", "above-high-prio", "within"],
            "exceeding the request first (missing stats count as exceeding), then lower priority, then more \
             above the request; a pod within its request goes last even with the lowest priority"
        );
    }

    #[test]
    fn critical_pods_are_never_candidates() {
        let critical = pod("critical", None, Some(SYSTEM_CRITICAL_PRIORITY));
        let mut by_class = pod("node-critical", None, None);
        if let Some(spec) = by_class.pod.spec.as_mut() {
            spec.priority_class_name = Some("system-node-critical".into());
        }
        let normal = pod("normal", Some("1Gi"), None);
        let ranked = rank(
            Signal::MemoryAvailable,
            vec![cand(&critical, Some(9 * MI)), cand(&by_class, Some(9 * MI)), cand(&normal, Some(MI))],
        );
        assert_eq!(names(&ranked), ["normal"]);
    }

    #[test]
    fn pids_rank_by_priority_then_processes() {
        let a = pod("a", None, Some(1));
        let b = pod("b", None, None);
        let c = pod("c", None, None);
        let with = |p, n| Candidate { pod: p, usage: PodUsage { processes: Some(n), ..PodUsage::default() } };
        let ranked = rank(Signal::PidAvailable, vec![with(&a, 500), with(&b, 10), with(&c, 20)]);
        assert_eq!(names(&ranked), ["c", "b", "a"]);
    }

    #[test]
    fn the_message_names_the_resource_the_threshold_and_the_usage() {
        let p = pod("hog", Some("64Mi"), None);
        let met = Met {
            threshold: Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI)),
            observed: Observation { available: 80 * MI, capacity: 1000 * MI },
        };
        assert_eq!(
            eviction_message(&met, &cand(&p, Some(300 * MI))),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
             Container app was using 300Mi, request is 64Mi, has larger consumption of memory. "
        );
        assert_eq!(format_quantity(1536), "1536");
        assert_eq!(format_quantity(3 << 10), "3Ki");
    }
}

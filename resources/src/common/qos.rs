//! A pod's QoS class, as the API server and the kubelet compute it (`GetPodQOS`).

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::pod::desired::DesiredPod;

/// The pod's QoS class, as the API server computes it.
pub fn qos_class(pod: &DesiredPod) -> &'static str {
    let all: Vec<&Container> = pod.init_containers().iter().chain(pod.containers()).collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &all {
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let request: Option<&Quantity> = requests.and_then(|r| r.get(name));
            let limit: Option<&Quantity> = limits.and_then(|l| l.get(name));
            any |= request.is_some() || limit.is_some();
            match (request, limit) {
                (Some(r), Some(l)) if r == l => {}
                (None, Some(_)) => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

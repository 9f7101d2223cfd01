//! How big a memory-backed volume's tmpfs is, as the kubelet sizes it (`SizeMemoryBackedVolumes`,
//! on by default since 1.22, GA in 1.32; the emptyDir plugin's `calculateEmptyDirMemorySize`).
//!
//! The memory-backed volumes are `emptyDir` with `medium: Memory`, and `secret`, `downwardAPI`
//! and `projected` volumes, which the kubelet backs with a memory emptyDir (their
//! `wrappedVolumeSpec`); `configMap` stays on disk. The size is the node's allocatable memory
//! (the pods together cannot use more), lowered to the pod's memory limit when the pod has one,
//! lowered to the emptyDir's `sizeLimit` when that is smaller still. Each tmpfs is charged to
//! the memory cgroup of whoever writes into it, so its size is only an upper bound.

use crate::model::pod::{DesiredPod, is_sidecar};
use crate::quantity::Quantity;

/// The pod's memory limit as its pod cgroup gets it (the kubelet's `ResourceConfigForPod`): only
/// when every container (init and app) limits its memory, the larger of the app and sidecar
/// containers' limits summed and any other init container's, plus the RuntimeClass overhead.
pub fn pod_memory_limit(pod: &DesiredPod) -> Option<u64> {
    let limit_of = |c: &k8s_openapi::api::core::v1::Container| -> Option<u64> {
        let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        let q = Quantity::parse(&q.0).filter(|q| !q.is_negative())?;
        Some(u64::try_from(q.scaled_ceil(1)).unwrap_or(u64::MAX)).filter(|b| *b > 0)
    };
    let mut sum = 0_u64;
    for c in pod.containers().iter().chain(pod.init_containers().iter().filter(|c| is_sidecar(c))) {
        sum = sum.saturating_add(limit_of(c)?);
    }
    for c in pod.init_containers().iter().filter(|c| !is_sidecar(c)) {
        sum = sum.max(limit_of(c)?);
    }
    let overhead = pod
        .spec()
        .overhead
        .as_ref()
        .and_then(|o| o.get("memory"))
        .and_then(|q| Quantity::parse(&q.0))
        .filter(|q| !q.is_negative())
        .map_or(0, |q| u64::try_from(q.scaled_ceil(1)).unwrap_or(u64::MAX));
    Some(sum.saturating_add(overhead))
}

/// The size of a memory-backed volume's tmpfs: `node_allocatable` (the node's allocatable memory),
/// lowered to `pod_limit` and then to `size_limit` where each is positive and not larger. `None`
/// (no `size=` option: the kernel's default of half the RAM) only when the allocatable memory is
/// unknown and neither limit is set.
pub fn tmpfs_size(
    node_allocatable: Option<u64>,
    pod_limit: Option<u64>,
    size_limit: Option<u64>,
) -> Option<u64> {
    let mut size = node_allocatable.filter(|b| *b > 0);
    for limit in [pod_limit, size_limit].into_iter().flatten().filter(|b| *b > 0) {
        if size.is_none_or(|s| limit <= s) {
            size = Some(limit);
        }
    }
    size
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pod::PodSource;

    const MI: u64 = 1 << 20;

    fn pod(spec: serde_json::Value) -> DesiredPod {
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        DesiredPod { pod, source: PodSource::Http }
    }

    fn limited(name: &str, memory: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "image": "busybox", "resources": {"limits": {"memory": memory}}})
    }

    #[test]
    fn a_pod_has_a_memory_limit_only_when_every_container_has_one() {
        let both = pod(serde_json::json!({"containers": [limited("a", "64Mi"), limited("b", "32Mi")]}));
        assert_eq!(pod_memory_limit(&both), Some(96 * MI));
        let one =
            pod(serde_json::json!({"containers": [limited("a", "64Mi"), {"name": "b", "image": "busybox"}]}));
        assert_eq!(pod_memory_limit(&one), None);
        let init_unlimited = pod(serde_json::json!({
            "initContainers": [{"name": "i", "image": "busybox"}],
            "containers": [limited("a", "64Mi")],
        }));
        assert_eq!(pod_memory_limit(&init_unlimited), None);
        let zero = pod(serde_json::json!({"containers": [limited("a", "0")]}));
        assert_eq!(pod_memory_limit(&zero), None);
    }

    #[test]
    fn the_pod_limit_takes_init_containers_sidecars_and_overhead_into_account() {
        let big_init = pod(serde_json::json!({
            "initContainers": [limited("i", "256Mi")],
            "containers": [limited("a", "64Mi"), limited("b", "64Mi")],
        }));
        assert_eq!(pod_memory_limit(&big_init), Some(256 * MI));
        let mut sidecar = limited("s", "16Mi");
        sidecar["restartPolicy"] = "Always".into();
        let with_sidecar = pod(serde_json::json!({
            "initContainers": [sidecar, limited("i", "32Mi")],
            "containers": [limited("a", "64Mi")],
            "overhead": {"memory": "8Mi"},
        }));
        assert_eq!(pod_memory_limit(&with_sidecar), Some(88 * MI));
    }

    #[test]
    fn the_tmpfs_is_the_smallest_of_allocatable_pod_limit_and_size_limit() {
        assert_eq!(tmpfs_size(Some(1024 * MI), None, None), Some(1024 * MI));
        assert_eq!(tmpfs_size(Some(1024 * MI), Some(64 * MI), None), Some(64 * MI));
        assert_eq!(tmpfs_size(Some(1024 * MI), Some(64 * MI), Some(8 * MI)), Some(8 * MI));
        // A limit above what the node has, or zero, changes nothing.
        assert_eq!(tmpfs_size(Some(1024 * MI), Some(4096 * MI), Some(0)), Some(1024 * MI));
        assert_eq!(tmpfs_size(Some(1024 * MI), Some(64 * MI), Some(128 * MI)), Some(64 * MI));
        // Allocatable unknown: the limits alone, else the kernel's default.
        assert_eq!(tmpfs_size(None, Some(64 * MI), Some(128 * MI)), Some(64 * MI));
        assert_eq!(tmpfs_size(None, None, None), None);
    }
}

//! In-place pod resize (KEP-1287): a running container's CPU and memory changed through the API are
//! applied to it without a restart when its `resizePolicy` allows it.
//!
//! - [`CgroupResources`] (in [`crate::model::cgroup`]): the cgroup settings a container's requests and limits
//!   mean, both for creating containers and for telling whether a running one (whose settings the runtime
//!   reports) must be resized.
//! - [`container_hash_without_resources`]: the spec hash that decides whether a container must be
//!   replaced; resources are left out so that a resize is not a replacement.
//! - [`needs_restart`]: whether a resize needs the container restarted (`RestartContainer` policy
//!   for a resource that changed).

use k8s_openapi::api::core::v1::Container;

use crate::model::cgroup::CgroupResources;

/// Whether resizing `container` from `applied` to what its spec asks needs a restart: a resource
/// that changed has `resizePolicy` `RestartContainer` (the default is `NotRequired`).
pub fn needs_restart(container: &Container, applied: &CgroupResources) -> bool {
    let wanted = CgroupResources::of(container);
    let restarts = |resource: &str| {
        container
            .resize_policy
            .iter()
            .flatten()
            .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
    };
    (wanted.cpu_differs(applied) && restarts("cpu")) || (wanted.memory_differs(applied) && restarts("memory"))
}

/// The hash nodelet records on each container to notice a changed spec, leaving out `resources`
/// (a change there is a resize, not a replacement): 64-bit FNV-1a of the rest of the container's JSON.
pub fn container_hash_without_resources(container: &Container) -> String {
    let mut c = container.clone();
    c.resources = None;
    crate::pod::driver::container_hash(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(resources: serde_json::Value, policy: serde_json::Value) -> Container {
        serde_json::from_value(
            serde_json::json!({"name": "c", "image": "i", "resources": resources, "resizePolicy": policy}),
        )
        .unwrap_or_default()
    }

    #[test]
    fn settings_follow_the_kubelets_formulas() {
        let c = container(
            serde_json::json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "128Mi"}}),
            serde_json::json!([]),
        );
        let r = CgroupResources::of(&c);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit),
            (256, 50_000, 100_000, 128 << 20)
        );
        let none = CgroupResources::of(&container(serde_json::json!({}), serde_json::json!([])));
        assert_eq!(none, CgroupResources { cpu_shares: 2, ..CgroupResources::default() });
    }

    #[test]
    fn restarts_only_for_a_changed_resource_with_restart_container() {
        let applied = CgroupResources::of(&container(
            serde_json::json!({"limits": {"cpu": "500m", "memory": "128Mi"}}),
            serde_json::json!([]),
        ));
        let policy = serde_json::json!([{"resourceName": "cpu", "restartPolicy": "NotRequired"}, {"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        let more_cpu =
            container(serde_json::json!({"limits": {"cpu": "1", "memory": "128Mi"}}), policy.clone());
        assert!(!needs_restart(&more_cpu, &applied));
        let more_memory =
            container(serde_json::json!({"limits": {"cpu": "500m", "memory": "256Mi"}}), policy);
        assert!(needs_restart(&more_memory, &applied));
        assert_eq!(
            container_hash_without_resources(&more_cpu),
            container_hash_without_resources(&more_memory)
        );
    }
}

//! In-place pod resize (KEP-1287): a running container's CPU and memory changed through the API are
//! applied to it without a restart when its `resizePolicy` allows it.
//!
//! - [`CgroupResources`]: the cgroup settings a container's requests and limits mean (the kubelet's
//!   `generateLinuxContainerResources`), both for creating containers and for telling whether a
//!   running one (whose settings the runtime reports) must be resized.
//! - [`container_hash_without_resources`]: the spec hash that decides whether a container must be
//!   replaced; resources are left out so that a resize is not a replacement.
//! - [`needs_restart`]: whether a resize needs the container restarted (`RestartContainer` policy
//!   for a resource that changed).

use k8s_openapi::api::core::v1::Container;

use crate::quantity::Quantity;

/// CFS period the kubelet uses, in microseconds.
pub const CPU_PERIOD_US: i64 = 100_000;
/// Smallest CFS quota the kubelet sets, in microseconds.
pub const MIN_CPU_QUOTA_US: i64 = 1_000;
/// Smallest and largest cgroup v1 `cpu.shares`.
pub const MIN_CPU_SHARES: i64 = 2;
/// See [`MIN_CPU_SHARES`].
pub const MAX_CPU_SHARES: i64 = 262_144;

/// The cgroup settings of a container's CPU and memory (0 where unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupResources {
    /// `cpu.shares` (from the CPU request, else the limit).
    pub cpu_shares: i64,
    /// CFS quota in microseconds (from the CPU limit; 0: none).
    pub cpu_quota: i64,
    /// CFS period in microseconds (0 without a quota).
    pub cpu_period: i64,
    /// Memory limit in bytes (0: none).
    pub memory_limit: i64,
}

impl CgroupResources {
    /// The settings for these requests and limits.
    pub fn from_quantities(
        cpu_request: Option<Quantity>,
        cpu_limit: Option<Quantity>,
        memory_limit: Option<Quantity>,
    ) -> Self {
        let shares_from = match (cpu_request.filter(|q| !q.is_zero()), cpu_limit) {
            (None, Some(limit)) => limit.scaled_ceil(1000),
            (request, _) => request.map_or(0, |q| q.scaled_ceil(1000)),
        };
        let cpu_shares = if shares_from <= 0 {
            MIN_CPU_SHARES
        } else {
            (shares_from.saturating_mul(1024) / 1000).clamp(MIN_CPU_SHARES, MAX_CPU_SHARES)
        };
        let (cpu_quota, cpu_period) = match cpu_limit.filter(|q| !q.is_zero()) {
            Some(limit) => {
                let quota = limit.scaled_ceil(1000).saturating_mul(CPU_PERIOD_US) / 1000;
                (quota.max(MIN_CPU_QUOTA_US), CPU_PERIOD_US)
            }
            None => (0, 0),
        };
        let memory_limit = memory_limit.map_or(0, |q| q.scaled_ceil(1).max(0));
        Self { cpu_shares, cpu_quota, cpu_period, memory_limit }
    }

    /// The settings of `container` (unparsable quantities count as unset: validation refuses them).
    pub fn of(container: &Container) -> Self {
        let get = |kind: &str, name: &str| {
            let resources = container.resources.as_ref()?;
            let map = if kind == "limits" { resources.limits.as_ref() } else { resources.requests.as_ref() };
            map?.get(name).and_then(|q| Quantity::parse(&q.0))
        };
        Self::from_quantities(get("requests", "cpu"), get("limits", "cpu"), get("limits", "memory"))
    }

    /// Whether the CPU settings differ (the period only matters with a quota: runtimes report
    /// their default period for containers without one).
    pub fn cpu_differs(&self, other: &Self) -> bool {
        self.cpu_shares != other.cpu_shares
            || self.cpu_quota != other.cpu_quota
            || (self.cpu_quota != 0 && self.cpu_period != other.cpu_period)
    }

    /// Whether the memory settings differ.
    pub fn memory_differs(&self, other: &Self) -> bool {
        self.memory_limit != other.memory_limit
    }
}

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

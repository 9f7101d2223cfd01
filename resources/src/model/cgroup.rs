//! The cgroup settings of a container's CPU and memory (the kubelet's `generateLinuxContainerResources`): what
//! the CRI spec creates a container with, what the runtime reports of a running one, and what an in-place
//! resize compares.

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

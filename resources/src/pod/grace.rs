//! The node's upper bound on grace periods (`nodelet.maxTerminationGracePeriodSeconds`): no pod, from
//! any source, is given longer than this to stop.
//!
//! [`cap_grace_periods`] lowers every grace period a pod carries when it enters the desired state
//! (`spec.terminationGracePeriodSeconds`, `metadata.deletionGracePeriodSeconds`, and the probe-level
//! `terminationGracePeriodSeconds` a failed liveness or startup probe kills with), so the status, the
//! runtime's records and every kill see the capped value. [`PodDriver`](super::driver::PodDriver) caps
//! the grace of every kill once more ([`GraceCap::apply`]), for grace periods that come from elsewhere
//! (containers recorded before the cap was lowered, evictions).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Probe};

use crate::model::pod::DEFAULT_GRACE_PERIOD;

/// An upper bound on grace periods; [`GraceCap::NONE`] bounds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraceCap(Option<Duration>);

impl GraceCap {
    /// No bound.
    pub const NONE: GraceCap = GraceCap(None);

    /// At most `max` (whole seconds count: grace periods are whole seconds).
    pub fn at_most(max: Duration) -> Self {
        GraceCap(Some(max))
    }

    /// The bound, if any.
    pub fn max(self) -> Option<Duration> {
        self.0
    }

    /// `grace`, lowered to the bound.
    pub fn apply(self, grace: Duration) -> Duration {
        self.0.map_or(grace, |max| grace.min(max))
    }

    /// The bound in whole seconds, as the API's `int64` fields hold it.
    fn seconds(self) -> Option<i64> {
        self.0.map(|max| i64::try_from(max.as_secs()).unwrap_or(i64::MAX))
    }
}

/// Lowers every grace period of `pod` to `cap` (an unset `spec.terminationGracePeriodSeconds` counts as
/// the default 30 s); returns whether anything changed.
pub fn cap_grace_periods(pod: &mut Pod, cap: GraceCap) -> bool {
    let Some(max) = cap.seconds() else { return false };
    let lower = |value: &mut Option<i64>, unset: Option<i64>| -> bool {
        match value.or(unset) {
            Some(v) if v > max => {
                *value = Some(max);
                true
            }
            _ => false,
        }
    };
    let mut changed = false;
    let default = i64::try_from(DEFAULT_GRACE_PERIOD.as_secs()).ok();
    if let Some(spec) = pod.spec.as_mut() {
        changed |= lower(&mut spec.termination_grace_period_seconds, default);
        let containers = spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            for probe in [c.liveness_probe.as_mut(), c.startup_probe.as_mut()].into_iter().flatten() {
                changed |= lower_probe(probe, max);
            }
        }
    }
    changed |= lower(&mut pod.metadata.deletion_grace_period_seconds, None);
    changed
}

fn lower_probe(probe: &mut Probe, max: i64) -> bool {
    match probe.termination_grace_period_seconds {
        Some(v) if v > max => {
            probe.termination_grace_period_seconds = Some(max);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod")
    }

    #[test]
    fn every_grace_period_of_a_pod_is_lowered_to_the_cap() {
        let mut p = pod(serde_json::json!({
            "metadata": {"name": "p", "deletionGracePeriodSeconds": 600},
            "spec": {
                "terminationGracePeriodSeconds": 3600,
                "containers": [{"name": "a", "livenessProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 900}}],
                "initContainers": [{"name": "s", "restartPolicy": "Always", "startupProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 120}}],
            },
        }));
        assert!(cap_grace_periods(&mut p, GraceCap::at_most(Duration::from_secs(60))));
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.termination_grace_period_seconds, Some(60));
        assert_eq!(p.metadata.deletion_grace_period_seconds, Some(60));
        let liveness =
            spec.containers[0].liveness_probe.as_ref().and_then(|p| p.termination_grace_period_seconds);
        assert_eq!(liveness, Some(60));
        let startup = spec.init_containers.as_ref().and_then(|c| c[0].startup_probe.as_ref());
        assert_eq!(startup.and_then(|p| p.termination_grace_period_seconds), Some(60));
        // Capped once, nothing changes again.
        assert!(!cap_grace_periods(&mut p, GraceCap::at_most(Duration::from_secs(60))));
    }

    #[test]
    fn shorter_grace_periods_and_no_cap_leave_the_pod_as_it_is() {
        let json = serde_json::json!({
            "metadata": {"name": "p", "deletionGracePeriodSeconds": 0},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [{"name": "a"}]},
        });
        let mut p = pod(json.clone());
        assert!(!cap_grace_periods(&mut p, GraceCap::at_most(Duration::from_secs(10))));
        assert_eq!(p, pod(json.clone()));
        let mut huge = pod(
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"terminationGracePeriodSeconds": i64::MAX, "containers": [{"name": "a"}]}}),
        );
        assert!(!cap_grace_periods(&mut huge, GraceCap::NONE));
        assert_eq!(huge.spec.and_then(|s| s.termination_grace_period_seconds), Some(i64::MAX));
    }

    #[test]
    fn an_unset_grace_period_counts_as_the_default_30_seconds() {
        let mut p =
            pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}}));
        assert!(!cap_grace_periods(&mut p, GraceCap::at_most(Duration::from_secs(30))));
        assert!(cap_grace_periods(&mut p, GraceCap::at_most(Duration::from_secs(10))));
        assert_eq!(p.spec.and_then(|s| s.termination_grace_period_seconds), Some(10));
    }

    #[test]
    fn kills_are_capped_too() {
        let cap = GraceCap::at_most(Duration::from_secs(10));
        assert_eq!(cap.apply(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(cap.apply(Duration::from_secs(3)), Duration::from_secs(3));
        assert_eq!(GraceCap::NONE.apply(Duration::MAX), Duration::MAX);
    }
}

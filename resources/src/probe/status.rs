//! What probe results mean for a pod: the containers' `started` and `ready` flags, the containers
//! a liveness or startup failure must restart, and the words of the matching events.

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use super::desired::{ProbeKind, ProbeSpec};
use super::results::{ProbeResult, ProbeResults};
use crate::model::actual::{ContainerRecord, ContainerState, PodActual};
use crate::model::pod::DesiredPod;

/// Whether a running container counts as started: no startup probe, or it succeeded. Without a
/// prober (`results` is `None`) probes are ignored.
pub fn container_started(spec: &Container, record: &ContainerRecord, results: Option<&ProbeResults>) -> bool {
    if record.state != ContainerState::Running {
        return false;
    }
    let Some(results) = results else { return true };
    if spec.startup_probe.is_none() {
        return true;
    }
    results.get(&record.id).is_some_and(|r| r.startup == Some(ProbeResult::Success))
}

/// Whether a running container is ready: started, and its readiness probe (if any) succeeded
/// (readiness starts as failure). Without a prober probes are ignored.
pub fn container_ready(spec: &Container, record: &ContainerRecord, results: Option<&ProbeResults>) -> bool {
    if !container_started(spec, record, results) {
        return false;
    }
    let Some(results) = results else { return true };
    if spec.readiness_probe.is_none() {
        return true;
    }
    results.get(&record.id).is_some_and(|r| r.readiness == Some(ProbeResult::Success))
}

/// The event message of a container killed because a probe failed (the kubelet's words).
pub fn kill_message(container: &str, kind: ProbeKind) -> String {
    let probe = match kind {
        ProbeKind::Startup => "startup",
        _ => "liveness",
    };
    format!("Container {container} failed {probe} probe, will be restarted")
}

/// If a container of the pod was killed (or is to be) because its liveness or startup probe
/// failed, why: the message for its `lastState.terminated`.
pub fn killed_because(record: &ContainerRecord, results: Option<&ProbeResults>) -> Option<String> {
    let kind = results?.get(&record.id)?.fatal_failure()?;
    Some(kill_message(&record.name, kind))
}

/// The running app and sidecar containers of the pod whose liveness or startup probe failed, and the grace
/// period to kill them with (the failed probe's `terminationGracePeriodSeconds`, else the pod's;
/// the shortest when several).
pub fn unhealthy(
    pod: &DesiredPod,
    actual: &PodActual,
    results: &ProbeResults,
) -> Option<(Vec<String>, Duration)> {
    if results.is_empty() {
        return None;
    }
    let mut ids = Vec::new();
    let mut grace: Option<Duration> = None;
    for c in pod.long_running() {
        let Some(record) = actual.container(&c.name).filter(|r| r.state == ContainerState::Running) else {
            continue;
        };
        let Some(kind) = results.get(&record.id).and_then(|r| r.fatal_failure()) else { continue };
        let probe_grace = kind
            .of(c)
            .map(|p| ProbeSpec::new(kind, p, &[]))
            .and_then(|p| p.termination_grace)
            .unwrap_or_else(|| pod.grace_period());
        grace = Some(grace.map_or(probe_grace, |g| g.min(probe_grace)));
        ids.push(record.id.clone());
    }
    Some((ids, grace?))
}

//! What the pod pair does with a pod the node stopped for good (a [`Stopped`] verdict: refused at admission or
//! evicted): its plan (kill what still runs, keep the containers for their status and logs) and its status
//! (phase `Failed`, the verdict's reason and message).

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use reconcile_engine::Plan;

use super::ops::PodOp;
use crate::model::actual::PodActual;
use crate::model::verdict::{Stopped, VerdictKind};

/// The plan for a pod under a verdict: stop whatever still runs (keeping the containers for
/// their status and logs), then nothing.
pub fn plan_stopped(actual: Option<&PodActual>, verdict: &Stopped) -> Plan<PodOp> {
    match actual {
        // The sandbox pair stops the sandbox once no container runs.
        Some(a) if a.any_running() => Plan::Run(PodOp::KillPod { grace: verdict.grace, remove: false }),
        _ => Plan::Idle,
    }
}

/// The status of a pod under `verdict`: phase `Failed` with its reason and message; a pod evicted
/// under node pressure also gets the `DisruptionTarget` condition (reason `TerminationByKubelet`),
/// as the kubelet sets it. `now` is wall-clock nanoseconds.
pub fn apply(verdict: &Stopped, mut status: PodStatus, now: i64) -> PodStatus {
    status.phase = Some("Failed".into());
    status.reason = Some(verdict.reason.clone());
    status.message = Some(verdict.message.clone());
    if verdict.kind == VerdictKind::Evicted && verdict.disruption_target {
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(verdict.message.clone()),
            last_transition_time: crate::common::time::time(if verdict.at > 0 { verdict.at } else { now }),
            ..PodCondition::default()
        });
    }
    status
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::verdict::Verdict;

    #[test]
    fn an_evicted_pod_is_killed_then_left_alone() {
        let verdict =
            Verdict::evicted("The node was low on resource: memory. ".into(), Duration::from_secs(1), 1);
        let Some(stopped) = verdict.stopped() else { panic!("evicted") };
        assert!(!verdict.is_admitted());
        let mut actual = PodActual::default();
        actual.containers.push(crate::model::actual::ContainerRecord {
            state: crate::model::actual::ContainerState::Running,
            ..Default::default()
        });
        assert_eq!(
            plan_stopped(Some(&actual), stopped),
            Plan::Run(PodOp::KillPod { grace: Duration::from_secs(1), remove: false })
        );
        actual.containers[0].state = crate::model::actual::ContainerState::Exited;
        assert_eq!(plan_stopped(Some(&actual), stopped), Plan::Idle);
    }
}

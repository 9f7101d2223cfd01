//! A pod's v1 `PodStatus`, computed from its desired spec, what the runtime has (its sandboxes as
//! the sandbox pair has them: pod IP, `PodReadyToStartContainers`), and the last failed operation
//! on it (a failed sandbox creation from the sandbox pair). Ephemeral containers have statuses of their own and count neither for
//! the phase nor for readiness.

use k8s_openapi::api::core::v1::{
    Container, ContainerState as V1State, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use reconcile_engine::{OpError, OpStatus};

use super::actual::{ContainerRecord, ContainerState, PodActual};
use super::desired::{DesiredPod, RestartPolicy, is_sidecar};
use super::driver::RuntimeError;
use super::ops::PodOp;
use super::reconciler::{PodReconciler, Progress};
use super::resize::CgroupResources;
use crate::eviction::verdict::ResizeDecision;
use crate::probe::status as probe_status;

/// The last failed operation on a pod, as the engine records it.
pub type PodOpStatus = OpStatus<PodOp, RuntimeError>;

pub use crate::common::qos::qos_class;
pub use crate::common::time::time;

/// The runtime's ID of a container, as the kubelet shows it (`containerd://<id>`).
pub fn container_id(record: &ContainerRecord) -> String {
    format!("containerd://{}", record.id)
}

/// Computes the pod's status. `inputs` are the side inputs the pod engine's reconciler reads (the
/// verdict store, the sandbox pair's stores, the volume stores: see [`super::reconciler`]). `now` is
/// wall-clock nanoseconds (for crash-loop messages).
pub fn pod_status(
    reconciler: &PodReconciler,
    inputs: &reconcile_engine::Inputs,
    pod: &DesiredPod,
    actual: Option<&PodActual>,
    failure: Option<&PodOpStatus>,
    now: i64,
) -> PodStatus {
    let joined = reconciler.joined(inputs, Some(pod), actual.unwrap_or(&PodActual::default()));
    let actual = &joined;
    let progress = reconciler.progress(pod, actual);
    let sandbox = actual.sandbox().filter(|s| s.ready);
    let policy = pod.restart_policy();

    let init_statuses: Vec<ContainerStatus> = pod
        .init_containers()
        .iter()
        .map(|c| {
            if is_sidecar(c) {
                // Restarted whenever it exits, until the pod is done; `started` and `ready` from its
                // probes, as an app container.
                let finished = matches!(progress, Progress::Finished { .. });
                return container_status(reconciler, c, actual, failure, "PodInitializing", now, |_| {
                    !finished
                });
            }
            let mut status =
                container_status(reconciler, c, actual, failure, "PodInitializing", now, |code| {
                    code != 0 && policy != RestartPolicy::Never
                });
            // An init container that completed is ready, as the kubelet reports it.
            let completed =
                status.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code == 0);
            status.ready = completed;
            status
        })
        .collect();
    // Initialized once every init container succeeded (sidecars: started); a pod that finished
    // because one failed never was.
    let initialized = match progress {
        Progress::Started => true,
        Progress::Finished { .. } => pod.init_containers().iter().filter(|c| !is_sidecar(c)).all(|c| {
            actual.container(&c.name).is_some_and(|r| r.state == ContainerState::Exited && r.exit_code == 0)
        }),
        Progress::NoSandbox | Progress::Initializing(_) => false,
    };
    let app_waiting = if initialized { "ContainerCreating" } else { "PodInitializing" };
    let statuses: Vec<ContainerStatus> = pod
        .containers()
        .iter()
        .map(|c| {
            container_status(reconciler, c, actual, failure, app_waiting, now, |code| policy.restarts(code))
        })
        .collect();

    // Sidecars count for readiness, as the kubelet counts them.
    let sidecar_statuses = init_statuses.iter().zip(pod.init_containers()).filter(|(_, c)| is_sidecar(c));
    let containers_ready = !statuses.is_empty()
        && statuses.iter().all(|s| s.ready)
        && sidecar_statuses.into_iter().all(|(s, _)| s.ready);
    let phase = match progress {
        Progress::Finished { succeeded: true } => "Succeeded",
        Progress::Finished { succeeded: false } => "Failed",
        Progress::Started if statuses.iter().all(|s| s.started == Some(true) || s.last_state.is_some()) => {
            "Running"
        }
        _ if statuses.iter().any(|s| s.state.as_ref().and_then(|st| st.running.as_ref()).is_some()) => {
            "Running"
        }
        _ => "Pending",
    };
    let start_time = actual.sandboxes.iter().map(|s| s.created_at).filter(|t| *t > 0).min().and_then(time);
    let ready_to_start = sandbox.is_some();
    let condition = |kind: &str, ok: bool, reason: Option<&str>| PodCondition {
        type_: kind.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: if ok { None } else { reason.map(str::to_string) },
        ..PodCondition::default()
    };
    let not_ready_reason =
        if phase == "Succeeded" || phase == "Failed" { "PodCompleted" } else { "ContainersNotReady" };
    let conditions = vec![
        condition("PodReadyToStartContainers", ready_to_start, None),
        condition("Initialized", initialized, Some("ContainersNotInitialized")),
        condition("Ready", containers_ready, Some(not_ready_reason)),
        condition("ContainersReady", containers_ready, Some(not_ready_reason)),
        condition("PodScheduled", true, None),
    ];
    // In-place resize: while a running container's cgroup settings differ from its spec, admission's
    // word on it (InProgress, Deferred, Infeasible, or Proposed before it is decided); the containers' allocated and applied resources.
    let resizing = pod.long_running().any(|c| {
        actual
            .container(&c.name)
            .filter(|r| r.state == ContainerState::Running)
            .and_then(|r| r.applied)
            .is_some_and(|applied| {
                let wanted = CgroupResources::of(c);
                wanted.cpu_differs(&applied) || wanted.memory_differs(&applied)
            })
    });
    // `None` inside: not decided yet, the API's `Proposed`.
    let resize = resizing.then(|| reconciler.resize_decision(inputs, pod));
    let allocated = matches!(resize, None | Some(Some(ResizeDecision::Accepted)));
    let mut statuses = statuses;
    for (status, c) in statuses.iter_mut().zip(pod.containers()) {
        add_resources(status, c, actual, allocated);
    }
    let ip = sandbox.and_then(|s| s.ip.clone());
    // The sandbox pair's last failure to create the pod's sandbox.
    let failure_message =
        reconciler.sandboxes(inputs).and_then(|v| v.failure(pod.uid())).and_then(|f| match &f.op {
            crate::sandbox::ops::SandboxOp::Create { .. } => Some(f.error.to_string()),
            _ => None,
        });
    let ephemeral_statuses = ephemeral_statuses(reconciler, pod, actual, failure, app_waiting, now);
    let status = PodStatus {
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty()).then_some(ephemeral_statuses),
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time,
        qos_class: Some(qos_class(pod).to_string()),
        message: failure_message,
        resize: resize.map(|r| r.map_or("Proposed", ResizeDecision::status).to_string()),
        ..PodStatus::default()
    };
    // An evicted or refused pod is Failed with the verdict's reason and message.
    match reconciler.verdict(inputs, pod.uid()).as_deref().and_then(|v| v.stopped()) {
        Some(stopped) => crate::eviction::verdict::apply(stopped, status, now),
        None => status,
    }
}

/// `ephemeralContainerStatuses`, as the kubelet reports them: waiting until created (with the
/// reason its start failed, if it did), then running, then terminated for good (never restarted);
/// never ready, and without `started` (no probes).
fn ephemeral_statuses(
    reconciler: &PodReconciler,
    pod: &DesiredPod,
    actual: &PodActual,
    failure: Option<&PodOpStatus>,
    waiting_reason: &str,
    now: i64,
) -> Vec<ContainerStatus> {
    pod.ephemeral_containers()
        .iter()
        .map(|c| {
            let mut status = container_status(reconciler, c, actual, failure, waiting_reason, now, |_| false);
            status.ready = false;
            status.started = None;
            status
        })
        .collect()
}

fn container_status(
    reconciler: &PodReconciler,
    spec: &Container,
    actual: &PodActual,
    failure: Option<&PodOpStatus>,
    waiting_reason: &str,
    now: i64,
    restarts: impl Fn(i32) -> bool,
) -> ContainerStatus {
    let newest = actual.container(&spec.name);
    let previous = actual.previous(&spec.name);
    // A failed start of this container (image pull, config) is why it is waiting.
    let start_failure = failure.and_then(|f| match (&f.op, &f.error) {
        (PodOp::StartContainer { name, .. }, OpError::Driver(e)) if *name == spec.name => Some((f, e)),
        _ => None,
    });
    let waiting = |reason: &str, message: Option<String>| V1State {
        waiting: Some(ContainerStateWaiting { reason: Some(reason.to_string()), message }),
        ..V1State::default()
    };
    let mut last_state = previous.map(terminated);
    let (state, ready, started) = match newest {
        Some(c) if c.state == ContainerState::Running => (
            V1State {
                running: Some(ContainerStateRunning { started_at: time(c.started_at) }),
                ..V1State::default()
            },
            // Readiness and startup probes decide, when the container has them.
            probe_status::container_ready(spec, c, reconciler.probes()),
            probe_status::container_started(spec, c, reconciler.probes()),
        ),
        Some(c) if c.state == ContainerState::Exited => {
            if restarts(c.exit_code) {
                // Waiting to restart: the exited attempt is the last state.
                last_state = Some(terminated(c));
                let delay = reconciler.backoff().delay(c);
                let since = u64::try_from(now.saturating_sub(c.finished_at)).unwrap_or(0);
                let in_backoff = u128::from(since) < delay.as_nanos();
                match start_failure {
                    Some((f, e)) => {
                        (waiting(&image_reason(e.reason, f.failures), Some(e.message.clone())), false, false)
                    }
                    None if in_backoff => (
                        waiting(
                            "CrashLoopBackOff",
                            Some(format!(
                                "back-off {}s restarting failed container={} pod={}",
                                delay.as_secs(),
                                spec.name,
                                actual.name
                            )),
                        ),
                        false,
                        false,
                    ),
                    None => (waiting("ContainerCreating", None), false, false),
                }
            } else {
                (terminated(c), false, false)
            }
        }
        _ => match start_failure {
            Some((f, e)) => {
                (waiting(&image_reason(e.reason, f.failures), Some(e.message.clone())), false, false)
            }
            None => (waiting(waiting_reason, None), false, false),
        },
    };
    // A container killed because its liveness or startup probe failed says so in its lastState.
    let last_record = match newest {
        Some(c) if c.state == ContainerState::Exited && restarts(c.exit_code) => Some(c),
        _ => previous,
    };
    if let Some(message) = last_record.and_then(|r| probe_status::killed_because(r, reconciler.probes()))
        && let Some(t) = last_state.as_mut().and_then(|s| s.terminated.as_mut())
    {
        t.message = Some(message);
    }
    ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: newest.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: newest.map(container_id),
        restart_count: newest.map_or(0, |c| i32::try_from(c.restart_count).unwrap_or(i32::MAX)),
        ready,
        started: Some(started),
        state: Some(state),
        last_state,
        ..ContainerStatus::default()
    }
}

/// A running container's `allocatedResources` (its spec's requests once admission accepted them;
/// while a resize waits, the CPU request its cgroup has) and `resources` (what its cgroup has).
fn add_resources(status: &mut ContainerStatus, spec: &Container, actual: &PodActual, allocated: bool) {
    let Some(applied) =
        actual.container(&spec.name).filter(|r| r.state == ContainerState::Running).and_then(|r| r.applied)
    else {
        return;
    };
    let requests = spec.resources.as_ref().and_then(|r| r.requests.clone()).unwrap_or_default();
    let shares_cpu =
        || Quantity(format!("{}m", applied.cpu_shares.saturating_mul(1000).saturating_add(1023) / 1024));
    let cpu_request = match requests.get("cpu") {
        Some(q) if allocated || CgroupResources::of(spec).cpu_shares == applied.cpu_shares => q.clone(),
        _ => shares_cpu(),
    };
    let mut alloc = std::collections::BTreeMap::new();
    if requests.contains_key("cpu") || !allocated {
        alloc.insert("cpu".to_owned(), cpu_request.clone());
    }
    if let Some(memory) = requests.get("memory").filter(|_| allocated) {
        alloc.insert("memory".to_owned(), memory.clone());
    }
    let mut limits = std::collections::BTreeMap::new();
    if applied.cpu_quota > 0 && applied.cpu_period > 0 {
        limits.insert(
            "cpu".to_owned(),
            Quantity(format!("{}m", applied.cpu_quota.saturating_mul(1000) / applied.cpu_period)),
        );
    }
    if applied.memory_limit > 0 {
        limits.insert("memory".to_owned(), Quantity(applied.memory_limit.to_string()));
    }
    status.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: (!alloc.is_empty()).then(|| alloc.clone()),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    });
    status.allocated_resources = (!alloc.is_empty()).then_some(alloc);
}

/// `ErrImagePull` becomes `ImagePullBackOff` once pulls keep failing, as in the kubelet.
fn image_reason(reason: &str, failures: u32) -> String {
    if reason == "ErrImagePull" && failures > 1 { "ImagePullBackOff".to_string() } else { reason.to_string() }
}

fn terminated(c: &ContainerRecord) -> V1State {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    };
    V1State {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(reason),
            message: (!c.message.is_empty()).then(|| c.message.clone()),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            container_id: Some(container_id(c)),
            ..ContainerStateTerminated::default()
        }),
        ..V1State::default()
    }
}

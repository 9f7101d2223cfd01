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

use super::ops::PodOp;
use super::reconciler::{PodReconciler, Progress};
use crate::model::actual::{ContainerRecord, ContainerState, PodActual};
use crate::model::cgroup::CgroupResources;
use crate::model::pod::{DesiredPod, RestartPolicy, is_sidecar};
use crate::model::runtime::RuntimeError;
use crate::model::verdict::ResizeDecision;
use crate::probe::status as probe_status;

/// The last failed operation on a pod, as the engine records it.
pub type PodOpStatus = OpStatus<PodOp, RuntimeError>;

pub use crate::common::time::time;
use crate::model::qos::qos_class;

/// The runtime's ID of a container, as the kubelet shows it (`containerd://<id>`).
pub fn container_id(record: &ContainerRecord) -> String {
    format!("containerd://{}", record.id)
}

/// Computes the pod's status. `inputs` are the side inputs the pod engine's reconciler reads (the
/// verdict store, the sandbox pair's stores, the volume stores: see [`super::reconciler`]). `now` is
/// wall-clock nanoseconds (for crash-loop messages).
pub fn pod_status(
    reconciler: &PodReconciler,
    inputs: &super::reconciler::PodInputs,
    pod: &DesiredPod,
    actual: Option<&PodActual>,
    failure: Option<&PodOpStatus>,
    now: i64,
) -> PodStatus {
    let empty = PodActual::default();
    let actual = actual.unwrap_or(&empty);
    // By the desired pod's UID: the sandbox pair may have made the pod's sandbox before the runtime
    // reports any container of it (no actual value yet).
    let sandboxes = reconciler.pod_sandboxes(inputs, Some(pod), pod.uid());
    let progress = reconciler.progress(pod, actual, sandboxes.first());
    let sandbox = sandboxes.first().filter(|s| s.ready);
    let policy = pod.restart_policy();
    // A pod stopped for good (refused, evicted, past its active deadline) restarts nothing: its
    // containers show how they ended.
    let stopped = reconciler.verdict(inputs, pod.uid()).as_deref().is_some_and(|v| v.stopped().is_some());

    let init_statuses: Vec<ContainerStatus> = pod
        .init_containers()
        .iter()
        .map(|c| {
            if is_sidecar(c) {
                // Restarted whenever it exits, until the pod is done; `started` and `ready` from its
                // probes, as an app container.
                let finished = matches!(progress, Progress::Finished { .. });
                return container_status(reconciler, c, actual, failure, "PodInitializing", now, |_| {
                    !finished && !stopped
                });
            }
            let mut status =
                container_status(reconciler, c, actual, failure, "PodInitializing", now, |code| {
                    !stopped && code != 0 && policy != RestartPolicy::Never
                });
            // An init container that completed is ready, as the kubelet reports it.
            let completed =
                status.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code == 0);
            status.ready = completed;
            status
        })
        .collect();
    // Whether the app containers are past initialization, for their waiting reason (the condition is
    // decided from the statuses below): every init container succeeded (sidecars: started); a pod
    // that finished because one failed never was.
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
            container_status(reconciler, c, actual, failure, app_waiting, now, |code| {
                !stopped && policy.restarts(code)
            })
        })
        .collect();

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
    let start_time = sandboxes.iter().map(|s| s.created_at).filter(|t| *t > 0).min().and_then(time);
    let no_reason = PodCondition { status: "True".into(), ..PodCondition::default() };
    let ready_to_start = PodCondition {
        type_: "PodReadyToStartContainers".into(),
        status: if sandbox.is_some() { "True" } else { "False" }.into(),
        ..PodCondition::default()
    };
    let containers_ready = containers_ready_condition(pod, &init_statuses, &statuses, phase);
    // Conditions others set (readiness gates) are in the pod's own status, when it has one; the
    // cluster's status manager decides `Ready` again with the API's conditions.
    let others = pod.pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let conditions = vec![
        ready_to_start,
        initialized_condition(pod, &init_statuses, &statuses, phase),
        pod_ready_condition(pod.pod.spec.as_ref(), &containers_ready, others),
        containers_ready,
        PodCondition { type_: "PodScheduled".into(), ..no_reason },
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
    let failure_message = reconciler.sandboxes(inputs).and_then(|v| v.create_failure(pod.uid()));
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
        qos_class: Some(qos_class(pod).as_str().to_owned()),
        message: failure_message,
        resize: resize.map(|r| r.map_or("Proposed", ResizeDecision::status).to_string()),
        ..PodStatus::default()
    };
    // An evicted or refused pod is Failed with the verdict's reason and message.
    match reconciler.verdict(inputs, pod.uid()).as_deref().and_then(|v| v.stopped()) {
        Some(stopped) => crate::pod::verdict::apply(stopped, status, now),
        None => status,
    }
}

/// The condition types the kubelet owns (`PodConditionByKubelet`): their statuses are computed here;
/// every other type is someone else's (readiness gates, controllers) and kept as the API has it.
pub const KUBELET_CONDITIONS: [&str; 5] =
    ["PodScheduled", "Ready", "Initialized", "ContainersReady", "PodReadyToStartContainers"];

/// Go's `fmt.Sprintf("%s", names)` of a string slice: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// The names of `containers` with no status in `statuses` ("unknown"), and of those whose status
/// `incomplete` says is not there yet.
fn sort_out<'a>(
    containers: impl Iterator<Item = &'a Container>,
    statuses: &[&ContainerStatus],
    incomplete: impl Fn(&Container, &ContainerStatus) -> bool,
) -> (Vec<&'a str>, Vec<&'a str>) {
    let (mut unknown, mut not_yet) = (Vec::new(), Vec::new());
    for c in containers {
        match statuses.iter().find(|s| s.name == c.name) {
            None => unknown.push(c.name.as_str()),
            Some(s) if incomplete(c, s) => not_yet.push(c.name.as_str()),
            Some(_) => {}
        }
    }
    (unknown, not_yet)
}

/// `containers with unknown status: [a], containers with <what> status: [b c]`: empty when both
/// lists are.
fn not_ready_message(unknown: &[&str], not_yet: &[&str], what: &str) -> String {
    let mut parts = Vec::new();
    if !unknown.is_empty() {
        parts.push(format!("containers with unknown status: {}", go_list(unknown)));
    }
    if !not_yet.is_empty() {
        parts.push(format!("containers with {what} status: {}", go_list(not_yet)));
    }
    parts.join(", ")
}

/// The `ContainersReady` condition, as the kubelet's `GenerateContainersReadyCondition`
/// (`pkg/kubelet/status/generate.go`) decides it: `True` when every app container and sidecar is
/// ready; else `False` with `PodCompleted` (a `Succeeded` pod), `PodFailed` (a `Failed` pod) or
/// `ContainersNotReady` and `containers with unready status: [a b]`.
fn containers_ready_condition(
    pod: &DesiredPod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let all: Vec<&ContainerStatus> = init_statuses.iter().chain(statuses).collect();
    let containers = pod.init_containers().iter().filter(|c| is_sidecar(c)).chain(pod.containers());
    let (unknown, unready) = sort_out(containers, &all, |_, s| !s.ready);
    let not_ready = |reason: &str, message: String| PodCondition {
        type_: "ContainersReady".into(),
        status: "False".into(),
        reason: Some(reason.into()),
        message: (!message.is_empty()).then_some(message),
        ..PodCondition::default()
    };
    if phase == "Succeeded" && unknown.is_empty() {
        return not_ready("PodCompleted", String::new());
    }
    if phase == "Failed" {
        return not_ready("PodFailed", String::new());
    }
    let message = not_ready_message(&unknown, &unready, "unready");
    if !message.is_empty() {
        return not_ready("ContainersNotReady", message);
    }
    PodCondition { type_: "ContainersReady".into(), status: "True".into(), ..PodCondition::default() }
}

/// The `Ready` condition, as the kubelet's `GeneratePodReadyCondition` decides it from
/// `ContainersReady` and the pod's readiness gates (`spec.readinessGates`) over `conditions` (the
/// pod's conditions, those others set included): `ContainersReady`'s status, reason and message
/// while it is not `True`; else `False` with `ReadinessGatesNotReady` while a gate's condition is
/// missing (`corresponding condition of pod readiness gate "x" does not exist.`) or not `True`
/// (`the status of pod readiness gate "x" is not "True", but False`); else `True`.
pub fn pod_ready_condition(
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
    containers_ready: &PodCondition,
    conditions: &[PodCondition],
) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition { type_: "Ready".into(), ..containers_ready.clone() };
    }
    let gates = spec.and_then(|s| s.readiness_gates.as_deref()).unwrap_or_default();
    let unready: Vec<String> = gates
        .iter()
        .filter_map(|gate| match conditions.iter().find(|c| c.type_ == gate.condition_type) {
            None => Some(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gate.condition_type
            )),
            Some(c) if c.status != "True" => Some(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                gate.condition_type, c.status
            )),
            Some(_) => None,
        })
        .collect();
    if !unready.is_empty() {
        return PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("ReadinessGatesNotReady".into()),
            message: Some(unready.join(", ")),
            ..PodCondition::default()
        };
    }
    PodCondition { type_: "Ready".into(), status: "True".into(), ..PodCondition::default() }
}

/// The `Initialized` condition, as the kubelet's `GeneratePodInitializedCondition` decides it:
/// `True` with `PodCompleted` for a `Succeeded` pod; `True` once an app container has run (running
/// or terminated) or every init container completed (a sidecar: started); else `False` with
/// `ContainersNotInitialized` and `containers with incomplete status: [a b]`, the init containers
/// not done yet in spec order.
fn initialized_condition(
    pod: &DesiredPod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let all: Vec<&ContainerStatus> = init_statuses.iter().chain(statuses).collect();
    let (unknown, incomplete) = sort_out(pod.init_containers().iter(), &all, |c, s| {
        if is_sidecar(c) { s.started != Some(true) } else { !s.ready }
    });
    let done = |reason: Option<&str>| PodCondition {
        type_: "Initialized".into(),
        status: "True".into(),
        reason: reason.map(Into::into),
        ..PodCondition::default()
    };
    if phase == "Succeeded" && unknown.is_empty() {
        return done(Some("PodCompleted"));
    }
    let app_started = statuses.iter().any(|s| {
        pod.containers().iter().any(|c| c.name == s.name)
            && s.state.as_ref().is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    });
    if app_started {
        return done(None);
    }
    let message = not_ready_message(&unknown, &incomplete, "incomplete");
    if message.is_empty() {
        return done(None);
    }
    PodCondition {
        type_: "Initialized".into(),
        status: "False".into(),
        reason: Some("ContainersNotInitialized".into()),
        message: Some(message),
        ..PodCondition::default()
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::model::pod::PodSource;

    fn pod(spec: serde_json::Value) -> DesiredPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": spec,
        }))
        .unwrap_or_default();
        DesiredPod { pod, source: PodSource::Http }
    }

    fn waiting(name: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(V1State {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("PodInitializing".into()),
                    message: None,
                }),
                ..V1State::default()
            }),
            ..ContainerStatus::default()
        }
    }

    fn exited(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready: code == 0,
            state: Some(V1State {
                terminated: Some(ContainerStateTerminated { exit_code: code, ..Default::default() }),
                ..V1State::default()
            }),
            ..ContainerStatus::default()
        }
    }

    fn running(name: &str, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            started: Some(true),
            state: Some(V1State { running: Some(ContainerStateRunning::default()), ..V1State::default() }),
            ..ContainerStatus::default()
        }
    }

    fn summary(c: &PodCondition) -> (&str, Option<&str>, Option<&str>) {
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref())
    }

    fn two_inits() -> DesiredPod {
        pod(serde_json::json!({
            "initContainers": [{"name": "init1", "image": "i"}, {"name": "init2", "image": "i"}],
            "containers": [{"name": "run1", "image": "i"}, {"name": "run2", "image": "i"}],
        }))
    }

    #[test]
    fn a_ready_sandbox_shows_its_ip_before_the_runtime_reports_any_container() {
        use crate::model::actual::{PodSandboxes, SandboxRecord};
        use crate::sandbox::status::SandboxView;
        let (sandboxes, mut writer) = reconcile_engine::store::<crate::model::pod::PodUid, PodSandboxes>();
        let sandbox = SandboxRecord {
            id: "s".into(),
            ready: true,
            ip: Some("198.18.0.7".into()),
            ..SandboxRecord::default()
        };
        writer.insert(
            "u".into(),
            PodSandboxes { uid: "u".into(), sandboxes: vec![sandbox], ..PodSandboxes::default() },
        );
        writer.mark_synced();
        let inputs = super::super::reconciler::PodInputs {
            sandboxes: Some(SandboxView::new(sandboxes, None)),
            ..Default::default()
        };
        let desired = pod(serde_json::json!({"containers": [{"name": "app", "image": "busybox"}]}));
        let status = pod_status(
            &PodReconciler::new(super::super::reconciler::CrashLoopBackOff::default()),
            &inputs,
            &desired,
            None,
            None,
            0,
        );
        assert_eq!(
            status.pod_ip.as_deref(),
            Some("198.18.0.7"),
            "no actual value yet, the sandbox store has one"
        );
    }

    #[test]
    fn initialized_names_the_init_containers_not_done_in_spec_order() {
        let p = two_inits();
        let apps = [waiting("run1"), waiting("run2")];
        let c = initialized_condition(&p, &[waiting("init1"), waiting("init2")], &apps, "Pending");
        assert_eq!(
            summary(&c),
            (
                "False",
                Some("ContainersNotInitialized"),
                Some("containers with incomplete status: [init1 init2]")
            )
        );
        let c = initialized_condition(&p, &[exited("init1", 0), running("init2", false)], &apps, "Pending");
        assert_eq!(summary(&c).2, Some("containers with incomplete status: [init2]"));
        // A failed init container of a Never pod: the pod failed, never initialized.
        let c = initialized_condition(&p, &[exited("init1", 1), waiting("init2")], &apps, "Failed");
        assert_eq!(summary(&c).2, Some("containers with incomplete status: [init1 init2]"));
        let c = initialized_condition(&p, &[exited("init1", 0), exited("init2", 0)], &apps, "Pending");
        assert_eq!(summary(&c), ("True", None, None));
        // An app container that ran: initialized, whatever the init statuses say now.
        let c = initialized_condition(
            &p,
            &[waiting("init1")],
            &[running("run1", true), waiting("run2")],
            "Running",
        );
        assert_eq!(summary(&c), ("True", None, None));
        let c = initialized_condition(&p, &[exited("init1", 0), exited("init2", 0)], &apps, "Succeeded");
        assert_eq!(summary(&c), ("True", Some("PodCompleted"), None));
        // A status missing is unknown.
        let c = initialized_condition(&p, &[exited("init1", 1)], &apps, "Pending");
        assert_eq!(
            summary(&c).2,
            Some("containers with unknown status: [init2], containers with incomplete status: [init1]")
        );
        let none = pod(serde_json::json!({"containers": [{"name": "run1", "image": "i"}]}));
        assert_eq!(
            summary(&initialized_condition(&none, &[], &[waiting("run1")], "Pending")),
            ("True", None, None)
        );
    }

    #[test]
    fn containers_ready_names_the_unready_containers_and_sidecars() {
        let p = pod(serde_json::json!({
            "initContainers": [{"name": "init", "image": "i"}, {"name": "side", "image": "i", "restartPolicy": "Always"}],
            "containers": [{"name": "run1", "image": "i"}, {"name": "run2", "image": "i"}],
        }));
        let inits = [exited("init", 0), running("side", false)];
        let c = containers_ready_condition(&p, &inits, &[running("run1", true), waiting("run2")], "Running");
        assert_eq!(
            summary(&c),
            ("False", Some("ContainersNotReady"), Some("containers with unready status: [side run2]"))
        );
        let ready = [exited("init", 0), running("side", true)];
        let c = containers_ready_condition(
            &p,
            &ready,
            &[running("run1", true), running("run2", true)],
            "Running",
        );
        assert_eq!(summary(&c), ("True", None, None));
        let c = containers_ready_condition(&p, &ready, &[exited("run1", 0), exited("run2", 0)], "Succeeded");
        assert_eq!(summary(&c), ("False", Some("PodCompleted"), None));
        let c = containers_ready_condition(&p, &ready, &[exited("run1", 1), exited("run2", 0)], "Failed");
        assert_eq!(summary(&c), ("False", Some("PodFailed"), None));
        let c = containers_ready_condition(&p, &ready, &[running("run1", true)], "Running");
        assert_eq!(summary(&c).2, Some("containers with unknown status: [run2]"));
    }

    #[test]
    fn ready_follows_containers_ready_then_the_readiness_gates() {
        let p = pod(serde_json::json!({
            "containers": [{"name": "c", "image": "i"}],
            "readinessGates": [{"conditionType": "example.com/a"}, {"conditionType": "example.com/b"}],
        }));
        let spec = p.pod.spec.as_ref();
        let not_ready = PodCondition {
            type_: "ContainersReady".into(),
            status: "False".into(),
            reason: Some("ContainersNotReady".into()),
            message: Some("containers with unready status: [c]".into()),
            ..PodCondition::default()
        };
        let r = pod_ready_condition(spec, &not_ready, &[]);
        assert_eq!((r.type_.as_str(), summary(&r)), ("Ready", summary(&not_ready)));
        let ready = PodCondition {
            type_: "ContainersReady".into(),
            status: "True".into(),
            ..PodCondition::default()
        };
        let gate =
            |t: &str, s: &str| PodCondition { type_: t.into(), status: s.into(), ..PodCondition::default() };
        let r = pod_ready_condition(spec, &ready, &[gate("example.com/a", "True")]);
        assert_eq!(
            summary(&r),
            (
                "False",
                Some("ReadinessGatesNotReady"),
                Some(r#"corresponding condition of pod readiness gate "example.com/b" does not exist."#)
            )
        );
        let r = pod_ready_condition(
            spec,
            &ready,
            &[gate("example.com/a", "False"), gate("example.com/b", "Unknown")],
        );
        assert_eq!(
            summary(&r).2,
            Some(
                r#"the status of pod readiness gate "example.com/a" is not "True", but False, the status of pod readiness gate "example.com/b" is not "True", but Unknown"#
            )
        );
        let r = pod_ready_condition(
            spec,
            &ready,
            &[gate("example.com/b", "True"), gate("example.com/a", "True")],
        );
        assert_eq!(summary(&r), ("True", None, None));
        assert_eq!(summary(&pod_ready_condition(None, &ready, &[])), ("True", None, None));
    }
}

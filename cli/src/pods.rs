//! `kubectl get pods` presentation: READY, STATUS, RESTARTS and AGE computed like kubectl's pod printer, and
//! its tab-aligned table.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

/// One row of the pods table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodRow {
    /// metadata.namespace.
    pub(crate) namespace: String,
    /// metadata.name.
    pub(crate) name: String,
    /// `ready/total`.
    pub(crate) ready: String,
    /// The STATUS column.
    pub(crate) status: String,
    /// `N` or `N (AGE ago)`.
    pub(crate) restarts: String,
    /// Time since creation.
    pub(crate) age: String,
    /// First pod IP or `<none>`.
    pub(crate) ip: String,
    /// spec.nodeName or `<none>`.
    pub(crate) node: String,
    /// status.nominatedNodeName or `<none>`.
    pub(crate) nominated_node: String,
    /// `true/total` readiness gates or `<none>`.
    pub(crate) readiness_gates: String,
}

fn is_restartable_init(c: Option<&Container>) -> bool {
    c.is_some_and(|c| c.restart_policy.as_deref() == Some("Always"))
}

fn last_termination(c: &ContainerStatus) -> Option<Timestamp> {
    c.last_state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0)
}

fn later(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Computes the row for `pod` at time `now`, following kubectl's `printPod`.
pub(crate) fn pod_row(pod: &Pod, now: Timestamp) -> PodRow {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let init_containers = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    let mut total = containers.len();
    let mut ready = 0usize;
    let mut restarts: i64 = 0;
    let mut last_restart: Option<Timestamp> = None;

    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
    let mut reason = match status.and_then(|s| s.reason.clone()).filter(|r| !r.is_empty()) {
        Some(r) => r,
        None => phase.clone(),
    };
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    if conditions.iter().any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"))
    {
        reason = "SchedulingGated".into();
    }
    let init_spec = |name: &str| init_containers.iter().find(|c| c.name == name);
    total += init_containers.iter().filter(|c| is_restartable_init(Some(c))).count();

    let mut sidecar_restarts: i64 = 0;
    let mut sidecar_last_restart: Option<Timestamp> = None;
    let mut initializing = false;
    let init_statuses = status.and_then(|s| s.init_container_statuses.as_deref()).unwrap_or_default();
    for (i, c) in init_statuses.iter().enumerate() {
        restarts += i64::from(c.restart_count);
        last_restart = later(last_restart, last_termination(c));
        let restartable = is_restartable_init(init_spec(&c.name));
        if restartable {
            sidecar_restarts += i64::from(c.restart_count);
            sidecar_last_restart = later(sidecar_last_restart, last_termination(c));
        }
        let state = c.state.as_ref();
        let terminated = state.and_then(|s| s.terminated.as_ref());
        let waiting = state.and_then(|s| s.waiting.as_ref());
        if terminated.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if restartable && c.started == Some(true) {
            if c.ready {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if t.signal.unwrap_or(0) != 0 => format!("Init:Signal:{}", t.signal.unwrap_or(0)),
                None => format!("Init:ExitCode:{}", t.exit_code),
            };
        } else if let Some(r) =
            waiting.and_then(|w| w.reason.as_deref()).filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            reason = format!("Init:{r}");
        } else {
            reason = format!("Init:{i}/{}", init_containers.len());
        }
        initializing = true;
        break;
    }

    let initialized = conditions.iter().any(|c| c.type_ == "Initialized" && c.status == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut has_running = false;
        let statuses = status.and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
        for c in statuses.iter().rev() {
            restarts += i64::from(c.restart_count);
            last_restart = later(last_restart, last_termination(c));
            let state = c.state.as_ref();
            let waiting = state.and_then(|s| s.waiting.as_ref());
            let terminated = state.and_then(|s| s.terminated.as_ref());
            if let Some(r) = waiting.and_then(|w| w.reason.as_deref()).filter(|r| !r.is_empty()) {
                reason = r.to_owned();
            } else if let Some(t) = terminated {
                reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => r.to_owned(),
                    None if t.signal.unwrap_or(0) != 0 => format!("Signal:{}", t.signal.unwrap_or(0)),
                    None => format!("ExitCode:{}", t.exit_code),
                };
            } else if c.ready && state.is_some_and(|s| s.running.is_some()) {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            reason = if pod_ready { "Running".into() } else { "NotReady".into() };
        }
    }

    let deleting = pod.metadata.deletion_timestamp.is_some();
    if deleting && status.and_then(|s| s.reason.as_deref()) == Some("NodeLost") {
        reason = "Unknown".into();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }

    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", human_duration_since(t, now)),
        _ => restarts.to_string(),
    };
    let age = match &pod.metadata.creation_timestamp {
        Some(t) => human_duration_since(t.0, now),
        None => "<unknown>".into(),
    };
    let ip = status
        .and_then(|s| {
            s.pod_ips.as_ref().and_then(|ips| ips.first().map(|i| i.ip.clone())).or_else(|| s.pod_ip.clone())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "<none>".into());
    let node =
        spec.and_then(|s| s.node_name.clone()).filter(|s| !s.is_empty()).unwrap_or_else(|| "<none>".into());
    let nominated_node = status
        .and_then(|s| s.nominated_node_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "<none>".into());
    let readiness_gates = match spec.and_then(|s| s.readiness_gates.as_deref()).filter(|g| !g.is_empty()) {
        Some(gates) => {
            let true_count = gates
                .iter()
                .filter(|g| conditions.iter().any(|c| c.type_ == g.condition_type && c.status == "True"))
                .count();
            format!("{true_count}/{}", gates.len())
        }
        None => "<none>".into(),
    };
    PodRow {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        ready: format!("{ready}/{total}"),
        status: reason,
        restarts,
        age,
        ip,
        node,
        nominated_node,
        readiness_gates,
    }
}

/// kubectl's `duration.HumanDuration` of `now - then`.
pub(crate) fn human_duration_since(then: Timestamp, now: Timestamp) -> String {
    let nanos = now.as_nanosecond() - then.as_nanosecond();
    let seconds = nanos.div_euclid(1_000_000_000);
    human_duration_secs(i64::try_from(seconds).unwrap_or(i64::MAX))
}

/// kubectl's `duration.HumanDuration` for a whole number of seconds.
pub(crate) fn human_duration_secs(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Renders rows like kubectl's tabwriter (minimum cell width 6, padding 3, last column unpadded).
pub(crate) fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cols = headers.len();
    let mut widths = vec![0usize; cols];
    for (i, h) in headers.iter().enumerate() {
        widths[i] = h.chars().count();
    }
    for r in rows {
        for (i, cell) in r.iter().enumerate().take(cols) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let w = (widths[i] + 3).max(6);
                l.push_str(cell);
                l.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

/// The table `get pods` prints.
pub(crate) fn pods_table(rows: &[PodRow], wide: bool, with_namespace: bool) -> String {
    let mut headers = Vec::new();
    if with_namespace {
        headers.push("NAMESPACE");
    }
    headers.extend(["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    if wide {
        headers.extend(["IP", "NODE", "NOMINATED NODE", "READINESS GATES"]);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = Vec::new();
            if with_namespace {
                c.push(r.namespace.clone());
            }
            c.extend([r.name.clone(), r.ready.clone(), r.status.clone(), r.restarts.clone(), r.age.clone()]);
            if wide {
                c.extend([r.ip.clone(), r.node.clone(), r.nominated_node.clone(), r.readiness_gates.clone()]);
            }
            c
        })
        .collect();
    render_table(&headers, &cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2024-05-01T12:00:00Z".parse().expect("ts")
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod json")
    }

    fn base(containers: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"name": "web-node1", "namespace": "default", "creationTimestamp": "2024-05-01T11:55:00Z"},
            "spec": {"nodeName": "node1", "containers": containers.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>()},
            "status": {"phase": "Pending"}
        })
    }

    fn running(name: &str, ready: bool, restarts: i32) -> serde_json::Value {
        serde_json::json!({"name": name, "ready": ready, "restartCount": restarts, "image": "i", "imageID": "",
                           "state": {"running": {"startedAt": "2024-05-01T11:56:00Z"}}})
    }

    #[test]
    fn a_running_ready_pod() {
        let mut p = base(&["httpd"]);
        p["status"] = serde_json::json!({"phase": "Running", "podIP": "198.18.0.5", "podIPs": [{"ip": "198.18.0.5"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [running("httpd", true, 0)]});
        let r = pod_row(&pod(p), now());
        assert_eq!(
            (r.ready.as_str(), r.status.as_str(), r.restarts.as_str(), r.age.as_str()),
            ("1/1", "Running", "0", "5m")
        );
        assert_eq!((r.ip.as_str(), r.node.as_str()), ("198.18.0.5", "node1"));
    }

    #[test]
    fn a_crash_looping_container_shows_crashloopbackoff_and_restarts_with_age() {
        let mut p = base(&["app"]);
        p["status"] = serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": "app", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2024-05-01T11:59:30Z"}}}]});
        let r = pod_row(&pod(p), now());
        assert_eq!(r.status, "CrashLoopBackOff");
        assert_eq!(r.restarts, "3 (30s ago)");
        assert_eq!(r.ready, "0/1");
    }

    #[test]
    fn terminated_containers_show_their_reason_or_exit_code() {
        let mut p = base(&["job"]);
        p["status"] = serde_json::json!({"phase": "Succeeded", "containerStatuses": [{
            "name": "job", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]});
        assert_eq!(pod_row(&pod(p.clone()), now()).status, "Completed");
        p["status"]["containerStatuses"][0]["state"] = serde_json::json!({"terminated": {"exitCode": 2}});
        assert_eq!(pod_row(&pod(p.clone()), now()).status, "ExitCode:2");
        p["status"]["containerStatuses"][0]["state"] =
            serde_json::json!({"terminated": {"exitCode": 137, "signal": 9}});
        assert_eq!(pod_row(&pod(p), now()).status, "Signal:9");
    }

    #[test]
    fn completed_with_a_running_container_is_running_or_notready() {
        let mut p = base(&["a", "b"]);
        p["status"] = serde_json::json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {"name": "a", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                running("b", true, 0)]});
        let r = pod_row(&pod(p), now());
        assert_eq!((r.status.as_str(), r.ready.as_str()), ("NotReady", "1/2"));
    }

    #[test]
    fn image_pull_errors_show_as_the_waiting_reason() {
        let mut p = base(&["app"]);
        p["status"] = serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "app", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff"}}}]});
        assert_eq!(pod_row(&pod(p), now()).status, "ImagePullBackOff");
    }

    #[test]
    fn init_containers_show_progress_and_failures() {
        let mut p = base(&["app"]);
        p["spec"]["initContainers"] = serde_json::json!([{"name": "i1"}, {"name": "i2"}]);
        p["status"] = serde_json::json!({"phase": "Pending", "initContainerStatuses": [
            {"name": "i1", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "i2", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {}}}],
            "containerStatuses": [{"name": "app", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"waiting": {"reason": "PodInitializing"}}}]});
        assert_eq!(pod_row(&pod(p.clone()), now()).status, "Init:1/2");
        p["status"]["initContainerStatuses"][1]["state"] =
            serde_json::json!({"terminated": {"exitCode": 1, "reason": "Error"}});
        p["status"]["initContainerStatuses"][1]["restartCount"] = serde_json::json!(2);
        let r = pod_row(&pod(p.clone()), now());
        assert_eq!((r.status.as_str(), r.restarts.as_str()), ("Init:Error", "2"));
        p["status"]["initContainerStatuses"][1]["state"] =
            serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        assert_eq!(pod_row(&pod(p), now()).status, "Init:CrashLoopBackOff");
    }

    #[test]
    fn sidecars_count_in_ready_and_total() {
        let mut p = base(&["app"]);
        p["spec"]["initContainers"] = serde_json::json!([{"name": "proxy", "restartPolicy": "Always"}]);
        p["status"] = serde_json::json!({"phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
            "initContainerStatuses": [{"name": "proxy", "ready": true, "started": true, "restartCount": 1, "image": "i", "imageID": "", "state": {"running": {}}}],
            "containerStatuses": [running("app", true, 0)]});
        let r = pod_row(&pod(p), now());
        assert_eq!((r.ready.as_str(), r.status.as_str(), r.restarts.as_str()), ("2/2", "Running", "1"));
    }

    #[test]
    fn a_pod_being_deleted_is_terminating() {
        let mut p = base(&["app"]);
        p["metadata"]["deletionTimestamp"] = serde_json::json!("2024-05-01T11:59:59Z");
        p["status"] = serde_json::json!({"phase": "Running", "containerStatuses": [running("app", true, 0)]});
        assert_eq!(pod_row(&pod(p), now()).status, "Terminating");
    }

    #[test]
    fn durations_are_humanized_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 600, "3h10m"),
            (10 * 3600, "10h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (800 * 86400, "2y70d"),
            (3000 * 86400, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration_secs(secs), want, "{secs}s");
        }
    }

    #[test]
    fn table_columns_align_like_kubectls_tabwriter() {
        let rows = vec![PodRow {
            namespace: "default".into(),
            name: "web-node1".into(),
            ready: "1/1".into(),
            status: "Running".into(),
            restarts: "0".into(),
            age: "5m".into(),
            ip: "198.18.0.5".into(),
            node: "node1".into(),
            nominated_node: "<none>".into(),
            readiness_gates: "<none>".into(),
        }];
        assert_eq!(
            pods_table(&rows, false, false),
            "NAME        READY   STATUS    RESTARTS   AGE\nweb-node1   1/1     Running   0          5m\n"
        );
        let wide = pods_table(&rows, true, true);
        assert!(wide.starts_with("NAMESPACE   NAME        READY   STATUS    RESTARTS   AGE   IP           NODE    NOMINATED NODE   READINESS GATES\n"), "{wide}");
    }
}

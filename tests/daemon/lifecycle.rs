//! Starting pods: what `/pods` and the runtime show for a running web pod, and init containers.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use nodelet_cri::labels;
use nodelet_cri::proto;
use serde_json::json;
use tokio::time::sleep;

use crate::support::{
    Nodelet, condition, container, cri_state, env_or_skip, init_container, nodelet_cli, phase, pod_ip,
    runtime_id, sleep_until_term, terminated, uid, waiting,
};

const WEB_PORT: u16 = 8080;

#[tokio::test]
async fn a_web_pod_runs_serves_its_page_and_is_labelled_in_the_runtime() {
    let env = env_or_skip!("a_web_pod_runs_serves_its_page_and_is_labelled_in_the_runtime");
    let n = Nodelet::start(&env, "web").await;
    let script = format!(
        "mkdir -p /var/www; echo \"hello from $(hostname)\" > /var/www/index.html; trap 'exit 0' TERM; \
         httpd -f -p {WEB_PORT} -h /var/www & wait $!"
    );
    let mut manifest = n.pod_manifest(
        "web",
        json!({
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "httpd",
                "command": ["sh", "-c", script],
                "ports": [{"containerPort": WEB_PORT, "protocol": "TCP"}],
            }],
        }),
    );
    manifest["metadata"]["labels"] = json!({"app": "web"});
    n.write_manifest("web.yaml", &manifest);

    let pod = n.wait_running("web").await;
    let name = n.pod_name("web");
    let uid = uid(&pod);

    // metadata: the node suffix, the config annotations, the manifest's labels, the node
    assert_eq!(pod.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(pod.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str), Some("web"));
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("kubernetes.io/config.source").map(String::as_str),
        Some("file"),
        "{annotations:?}"
    );
    assert_eq!(annotations.get("kubernetes.io/config.hash"), Some(&uid), "the config hash is the UID");
    let seen = annotations.get("kubernetes.io/config.seen").cloned().unwrap_or_default();
    assert!(seen.parse::<Timestamp>().is_ok(), "config.seen is an RFC 3339 time: {seen:?}");
    assert!(pod.metadata.creation_timestamp.is_some(), "creationTimestamp");
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(n.node()));

    // status
    let status = pod.status.clone().unwrap_or_default();
    for kind in ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"] {
        let c = condition(&pod, kind).unwrap_or_else(|| panic!("condition {kind} missing: {status:?}"));
        assert_eq!(c.status, "True", "condition {kind}: {c:?}");
    }
    let ip = pod_ip(&pod);
    let ips: Vec<String> = status.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect();
    assert_eq!(ips, vec![ip.to_string()], "podIPs");
    assert!(status.start_time.is_some(), "startTime");
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    let httpd = container(&pod, "httpd").unwrap_or_else(|| panic!("no status of httpd: {status:?}"));
    let running_since =
        httpd.state.as_ref().and_then(|s| s.running.as_ref()).and_then(|r| r.started_at.clone());
    assert!(running_since.is_some(), "state.running.startedAt: {httpd:?}");
    assert!(httpd.ready, "ready");
    assert_eq!(httpd.started, Some(true));
    assert_eq!(httpd.restart_count, 0);
    assert_eq!(httpd.image, env.busybox);
    assert!(!httpd.image_id.is_empty(), "imageID");
    assert!(httpd.last_state.as_ref().is_none_or(|s| s.terminated.is_none()), "no last state: {httpd:?}");
    let container_id = runtime_id(httpd);

    // `nodelet get pods -o wide`, like kubectl
    let server = format!("http://127.0.0.1:{}", n.ports().read_only);
    let table = nodelet_cli(&["get", "pods", "-o", "wide", "--server", &server]).await;
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.get(..4), Some(&[name.as_str(), "1/1", "Running", "0"][..]), "{table}");
    assert!(row.contains(&ip.to_string().as_str()) && row.contains(&n.node()), "IP and node: {table}");

    // the page, from the pod IP (in 198.18.0.0/16, checked by pod_ip)
    let url = format!("http://{ip}:{WEB_PORT}/");
    let body = n
        .wait_for(&format!("GET {url}"), Duration::from_secs(10), async || {
            let r = n.http().get(&url).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            r.text().await.ok()
        })
        .await;
    assert_eq!(body.trim(), format!("hello from {name}"), "the page names the pod's hostname");

    // the runtime: one sandbox and one container, with the kubelet's labels (what crictl shows)
    let sandboxes = n.sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let sandbox = &sandboxes[0];
    assert_eq!(sandbox.state, proto::PodSandboxState::SandboxReady as i32);
    for (key, value) in [
        (labels::POD_NAME, name.as_str()),
        (labels::POD_NAMESPACE, "default"),
        (labels::POD_UID, uid.as_str()),
    ] {
        assert_eq!(sandbox.labels.get(key).map(String::as_str), Some(value), "sandbox label {key}");
    }
    assert_eq!(sandbox.labels.get("app").map(String::as_str), Some("web"), "pod labels reach the sandbox");
    let meta = sandbox.metadata.clone().unwrap_or_default();
    assert_eq!(
        (meta.name.as_str(), meta.namespace.as_str(), meta.uid.as_str()),
        (name.as_str(), "default", uid.as_str())
    );
    let containers = n.containers().await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let c = &containers[0];
    assert_eq!(c.id, container_id, "containerID is the runtime's");
    assert_eq!(c.pod_sandbox_id, sandbox.id);
    assert_eq!(cri_state(c), proto::ContainerState::ContainerRunning);
    for (key, value) in [
        (labels::POD_NAME, name.as_str()),
        (labels::POD_NAMESPACE, "default"),
        (labels::POD_UID, uid.as_str()),
        (labels::CONTAINER_NAME, "httpd"),
    ] {
        assert_eq!(c.labels.get(key).map(String::as_str), Some(value), "container label {key}");
    }
    assert_eq!(c.annotations.get(labels::CONTAINER_RESTART_COUNT).map(String::as_str), Some("0"));

    // the pod cgroup is under --cgroup-root
    let cgroup = format!("{}/pod{uid}", env.cgroup_parent.trim_matches('/'));
    assert!(cgroup_exists(&cgroup), "no cgroup {cgroup} in any hierarchy under /sys/fs/cgroup");

    n.shutdown().await;
}

/// Whether the cgroup (relative path) exists in cgroup v2 or in any v1 hierarchy.
pub(crate) fn cgroup_exists(cgroup: &str) -> bool {
    let root = Path::new("/sys/fs/cgroup");
    root.join(cgroup).is_dir()
        || std::fs::read_dir(root)
            .map(|entries| entries.flatten().any(|e| e.path().join(cgroup).is_dir()))
            .unwrap_or(false)
}

/// (timestamp, text) of each line of a CRI log file.
fn log_lines(path: &Path) -> Vec<(Timestamp, String)> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let ts = parts.next().and_then(|t| t.parse::<Timestamp>().ok());
            let (stream, tag, content) = (parts.next(), parts.next(), parts.next());
            match (ts, stream, tag, content) {
                (Some(ts), Some("stdout" | "stderr"), Some("F" | "P"), Some(content)) => {
                    (ts, content.to_owned())
                }
                _ => panic!("not a CRI log line in {}: {line:?}", path.display()),
            }
        })
        .collect()
}

/// When `text` was logged by container `container` (restart 0) of the pod.
fn logged_at(n: &Nodelet, pod: &Pod, container: &str, text: &str) -> Timestamp {
    let dir = n.logs_dir().join(format!(
        "default_{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        uid(pod)
    ));
    let path = dir.join(container).join("0.log");
    let lines = log_lines(&path);
    match lines.iter().find(|(_, l)| l == text) {
        Some((ts, _)) => *ts,
        None => panic!("{} does not hold {text:?}: {lines:?}", path.display()),
    }
}

#[tokio::test]
async fn init_containers_run_one_after_the_other_before_the_app() {
    let env = env_or_skip!("init_containers_run_one_after_the_other_before_the_app");
    let n = Nodelet::start(&env, "init").await;
    let init = |name: &str| json!({"name": name, "command": ["sh", "-c", format!("echo {name} start; sleep 1; echo {name} done")]});
    n.write_manifest(
        "init.yaml",
        &n.pod_manifest(
            "init",
            json!({
                "terminationGracePeriodSeconds": 5,
                "initContainers": [init("init1"), init("init2")],
                "containers": [{"name": "app", "command": sleep_until_term("echo app start; ")}],
            }),
        ),
    );
    let pod = n.wait_running("init").await;
    assert_eq!(condition(&pod, "Initialized").map(|c| c.status.as_str()), Some("True"));
    for name in ["init1", "init2"] {
        let s = init_container(&pod, name).unwrap_or_else(|| panic!("no status of {name}: {:?}", pod.status));
        assert_eq!(terminated(s), Some((0, "Completed".to_owned())), "{name}: {s:?}");
        assert_eq!(s.restart_count, 0, "{name}");
        assert!(s.ready, "a completed init container is ready, as the kubelet reports it: {s:?}");
    }

    // the runtime's nanosecond timestamps: init1 exited before init2 started, init2 before the app
    let mut by_name = std::collections::HashMap::new();
    for c in n.containers_of(&uid(&pod)).await {
        let name = c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default();
        let status = n.container_status(&c.id).await;
        assert!(by_name.insert(name.clone(), status).is_none(), "one container {name}");
    }
    let at = |name: &str| match by_name.get(name) {
        Some(s) => (s.started_at, s.finished_at),
        None => panic!("no container {name} in the runtime: {by_name:?}"),
    };
    let (init1, init2, app) = (at("init1"), at("init2"), at("app"));
    assert!(init1.1 - init1.0 >= 900_000_000, "init1 ran its second: {init1:?}");
    assert!(init1.1 <= init2.0, "init2 started before init1 finished: {init1:?} {init2:?}");
    assert!(init2.1 <= app.0, "the app started before init2 finished: {init2:?} {app:?}");

    // the log files tell the same story
    let init1_done = logged_at(&n, &pod, "init1", "init1 done");
    let init2_start = logged_at(&n, &pod, "init2", "init2 start");
    let init2_done = logged_at(&n, &pod, "init2", "init2 done");
    let app_start = logged_at(&n, &pod, "app", "app start");
    assert!(
        init1_done < init2_start && init2_start < init2_done && init2_done < app_start,
        "log order: init1 done {init1_done}, init2 start {init2_start}, init2 done {init2_done}, app start {app_start}"
    );

    // and /pods, to the second
    let secs = |s: Option<&k8s_openapi::api::core::v1::ContainerStatus>, started: bool| {
        let t = s.and_then(|s| s.state.as_ref()).and_then(|st| st.terminated.as_ref());
        let time = if started {
            t.and_then(|t| t.started_at.clone())
        } else {
            t.and_then(|t| t.finished_at.clone())
        };
        time.map(|t| t.0).unwrap_or_else(|| panic!("no terminated time in {s:?}"))
    };
    let app_running = container(&pod, "app")
        .and_then(|s| s.state.as_ref())
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.clone())
        .map(|t| t.0);
    let (i1_end, i2_start, i2_end) = (
        secs(init_container(&pod, "init1"), false),
        secs(init_container(&pod, "init2"), true),
        secs(init_container(&pod, "init2"), false),
    );
    assert!(i1_end <= i2_start && i2_start < i2_end, "{i1_end} {i2_start} {i2_end}");
    assert!(app_running.is_some_and(|a| i2_end <= a), "app started {app_running:?}, init2 finished {i2_end}");

    n.shutdown().await;
}

#[tokio::test]
async fn a_failing_init_container_fails_a_never_pod_and_the_app_never_starts() {
    let env = env_or_skip!("a_failing_init_container_fails_a_never_pod_and_the_app_never_starts");
    let n = Nodelet::start(&env, "initfail").await;
    n.write_manifest(
        "initfail.yaml",
        &n.pod_manifest(
            "initfail",
            json!({
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "initContainers": [{"name": "init", "command": ["sh", "-c", "echo giving up; exit 3"]}],
                "containers": [{"name": "app", "command": sleep_until_term("")}],
            }),
        ),
    );
    let pod =
        n.wait_for_pod("initfail", "phase Failed", Duration::from_secs(30), |p| phase(p) == "Failed").await;
    let init = init_container(&pod, "init").unwrap_or_else(|| panic!("no init status: {:?}", pod.status));
    assert_eq!(terminated(init), Some((3, "Error".to_owned())), "{init:?}");
    assert_eq!(init.restart_count, 0);
    assert!(!init.ready, "a failed init container is not ready");
    let app = container(&pod, "app").unwrap_or_else(|| panic!("no app status: {:?}", pod.status));
    assert!(app.container_id.is_none() && !app.ready && app.started != Some(true), "{app:?}");
    assert_eq!(waiting(app).map(|w| w.0), Some("PodInitializing".to_owned()), "{app:?}");
    assert_eq!(condition(&pod, "Ready").map(|c| c.status.as_str()), Some("False"));
    assert_eq!(
        condition(&pod, "Initialized").map(|c| (
            c.status.as_str(),
            c.reason.as_deref(),
            c.message.as_deref()
        )),
        Some(("False", Some("ContainersNotInitialized"), Some("containers with incomplete status: [init]"))),
        "the init container failed: the pod is not initialized"
    );
    assert_eq!(
        condition(&pod, "Ready").map(|c| (c.reason.as_deref(), c.message.as_deref())),
        Some((Some("PodFailed"), None)),
        "a Failed pod's Ready condition, as the kubelet's"
    );

    // Nothing starts later either: the init container is not retried and the app never created.
    sleep(Duration::from_secs(3)).await;
    let containers = n.containers_of(&uid(&pod)).await;
    let names: Vec<&str> =
        containers.iter().filter_map(|c| c.labels.get(labels::CONTAINER_NAME).map(String::as_str)).collect();
    assert_eq!(names, vec!["init"], "only the failed init container ever ran: {containers:?}");
    let pod = n.pod("initfail").await.unwrap_or_else(|| panic!("the pod vanished"));
    assert_eq!(phase(&pod), "Failed");
    // `nodelet get pods` shows it like kubectl: the init container's failure.
    let server = format!("http://127.0.0.1:{}", n.ports().read_only);
    let table = nodelet_cli(&["get", "pods", &n.pod_name("initfail"), "--server", &server]).await;
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        row.get(..4),
        Some(&[n.pod_name("initfail").as_str(), "0/1", "Init:Error", "0"][..]),
        "{table}"
    );

    n.shutdown().await;
}

/// A sidecar's command: says it is up, then (after `ready_after` seconds) creates /tmp/started for its
/// startup probe; on SIGTERM it takes a second to stop (so the stop order shows in the runtime's times).
fn sidecar_command(ready_after: u32) -> serde_json::Value {
    json!([
        "sh",
        "-c",
        format!(
            "trap 'sleep 1; exit 0' TERM; echo up; sleep {ready_after}; touch /tmp/started; \
         while true; do sleep 1 & wait $!; done"
        )
    ])
}

#[tokio::test]
async fn sidecars_start_in_order_restart_on_exit_and_stop_after_the_app() {
    let env = env_or_skip!("sidecars_start_in_order_restart_on_exit_and_stop_after_the_app");
    let n = Nodelet::start(&env, "sidecars").await;
    let startup = json!({"exec": {"command": ["test", "-f", "/tmp/started"]}, "periodSeconds": 1, "failureThreshold": 30});
    // A long-running pod: the proxy must pass its startup probe before the next init container starts;
    // `flaky` exits after a few seconds and is restarted beside the running app.
    n.write_manifest(
        "mesh.yaml",
        &n.pod_manifest(
            "mesh",
            json!({
                "terminationGracePeriodSeconds": 5,
                "initContainers": [
                    {"name": "setup", "command": ["sh", "-c", "echo set up"]},
                    {"name": "proxy", "restartPolicy": "Always", "command": sidecar_command(2), "startupProbe": startup},
                    {"name": "flaky", "restartPolicy": "Always", "command": ["sh", "-c", "sleep 3; exit 1"]},
                ],
                "containers": [{"name": "app", "command": sleep_until_term("")}],
            }),
        ),
    );
    // A Job-like pod: completes when its app is done; its sidecars are then stopped, the last one first.
    n.write_manifest(
        "job.yaml",
        &n.pod_manifest(
            "job",
            json!({
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 10,
                "initContainers": [
                    {"name": "first", "restartPolicy": "Always", "command": sidecar_command(0)},
                    {"name": "second", "restartPolicy": "Always", "command": sidecar_command(0)},
                ],
                "containers": [{"name": "work", "command": ["sh", "-c", "sleep 2; echo done"]}],
            }),
        ),
    );

    let pod = n.wait_running("mesh").await;
    assert_eq!(condition(&pod, "Initialized").map(|c| c.status.as_str()), Some("True"));
    let proxy = init_container(&pod, "proxy").unwrap_or_else(|| panic!("no proxy status: {:?}", pod.status));
    assert_eq!((proxy.started, proxy.ready), (Some(true), true), "{proxy:?}");
    assert!(proxy.state.as_ref().and_then(|s| s.running.as_ref()).is_some(), "{proxy:?}");

    let started_at = |containers: &[(String, proto::ContainerStatus)], name: &str| {
        containers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, s)| s.started_at)
            .min()
            .unwrap_or_else(|| panic!("no container {name}"))
    };
    let statuses = async |uid: &str| {
        let mut all = Vec::new();
        for c in n.containers_of(uid).await {
            let name = c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default();
            all.push((name, n.container_status(&c.id).await));
        }
        all
    };
    let mesh = statuses(&uid(&pod)).await;
    let (setup, proxy, flaky, app) = (
        started_at(&mesh, "setup"),
        started_at(&mesh, "proxy"),
        started_at(&mesh, "flaky"),
        started_at(&mesh, "app"),
    );
    assert!(setup < proxy && proxy < flaky && flaky <= app, "start order: {mesh:?}");
    assert!(
        flaky - proxy >= 2_000_000_000,
        "flaky started before the proxy's startup probe passed: {mesh:?}"
    );

    // the flaky sidecar is restarted (the pod's restartPolicy does not matter); the app is not touched
    let app_id = runtime_id(container(&pod, "app").expect("app status"));
    let pod = n
        .wait_for_pod("mesh", "the flaky sidecar restarted", Duration::from_secs(30), |p| {
            init_container(p, "flaky").is_some_and(|s| s.restart_count >= 1)
        })
        .await;
    assert_eq!(container(&pod, "app").map(|s| s.restart_count), Some(0));
    assert_eq!(container(&pod, "app").map(runtime_id), Some(app_id));
    assert_eq!(phase(&pod), "Running");

    // the job completes when its app is done, and stops its sidecars: second, then first
    let job = n
        .wait_for_pod("job", "Succeeded with its sidecars stopped", Duration::from_secs(40), |p| {
            phase(p) == "Succeeded"
                && ["first", "second"].iter().all(|s| {
                    init_container(p, s)
                        .and_then(|c| c.state.as_ref())
                        .is_some_and(|st| st.terminated.is_some())
                })
        })
        .await;
    let finished = statuses(&uid(&job)).await;
    let finished_at = |name: &str| {
        finished
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.finished_at)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let (work, second, first) = (finished_at("work"), finished_at("second"), finished_at("first"));
    assert!(work < second && second < first, "stop order: {finished:?}");
    assert!(first - second >= 900_000_000, "first was stopped only after second had stopped: {finished:?}");
    assert_eq!(container(&job, "work").and_then(terminated), Some((0, "Completed".to_owned())));

    n.shutdown().await;
}

#[tokio::test]
async fn runtime_classes_pick_the_sandbox_handler_and_unknown_ones_keep_the_pod_from_starting() {
    let env =
        env_or_skip!("runtime_classes_pick_the_sandbox_handler_and_unknown_ones_keep_the_pod_from_starting");
    let n = Nodelet::start(&env, "rtclass").await;
    let class = |name: &str, handler: &str| {
        format!(
            "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: {name}\nhandler: {handler}\n"
        )
    };
    n.write_manifest_text(
        "classes.yaml",
        &format!("{}---\n{}", class("standard", "runc"), class("broken", "no-such-handler")),
    );
    let with_class = |name: &str, class: &str| {
        n.pod_manifest(
            name,
            json!({"runtimeClassName": class, "terminationGracePeriodSeconds": 1,
                   "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        )
    };
    n.write_manifest("standard.yaml", &with_class("standard", "standard"));
    n.write_manifest("missing.yaml", &with_class("missing", "later"));
    n.write_manifest("broken.yaml", &with_class("broken", "broken"));

    // the class's handler runs the sandbox (a pod without a class gets the runtime's default, "")
    let pod = n.wait_running("standard").await;
    let sandboxes = n.sandboxes_of(&uid(&pod)).await;
    assert_eq!(sandboxes.iter().map(|s| s.runtime_handler.as_str()).collect::<Vec<_>>(), vec!["runc"]);

    // an unknown class, and a handler the runtime does not have: Pending, saying why, with an event
    for (name, text) in
        [("missing", "runtimeclass.node.k8s.io \"later\" not found"), ("broken", "no-such-handler")]
    {
        let pod = n
            .wait_for_pod(
                name,
                &format!("Pending with a message naming {text:?}"),
                Duration::from_secs(30),
                |p| {
                    phase(p) == "Pending"
                        && p.status
                            .as_ref()
                            .and_then(|s| s.message.as_deref())
                            .is_some_and(|m| m.contains(text))
                },
            )
            .await;
        assert!(n.sandboxes_of(&uid(&pod)).await.is_empty(), "{name}: no sandbox");
        assert!(
            container(&pod, "app").and_then(|c| c.state.as_ref()).and_then(|s| s.running.as_ref()).is_none()
        );
    }
    let events = n
        .wait_for("a FailedCreatePodSandBox event", Duration::from_secs(10), async || {
            let body = n.main_get_text("/api/v1/events").await?;
            body.contains("FailedCreatePodSandBox").then_some(body)
        })
        .await;
    assert!(
        events.contains("Failed to create pod sandbox: runtimeclass.node.k8s.io \\\"later\\\" not found"),
        "{events}"
    );

    // once the class exists, the pod starts (at its next sandbox attempt)
    n.write_manifest_text(
        "classes.yaml",
        &format!(
            "{}---\n{}---\n{}",
            class("standard", "runc"),
            class("broken", "no-such-handler"),
            class("later", "runc")
        ),
    );
    n.wait_for_pod("missing", "Running once its class exists", Duration::from_secs(60), |p| {
        phase(p) == "Running"
    })
    .await;

    n.shutdown().await;
}

//! Probes and lifecycle hooks on the real runtime: every handler (`exec`, `httpGet` on busybox `httpd`,
//! `tcpSocket`, `grpc` on the `grpc-health` test image) for every probe kind, readiness flipping both ways in
//! `/pods`, liveness and startup failures restarting containers (restart counts, `lastState`, events),
//! startup gating, and `postStart`/`preStop` effects and ordering. Periods are 1 s and thresholds 1, so each
//! test takes seconds.
//!
//! HTTP hooks go to a server of the test on 127.0.0.1 (`host: 127.0.0.1`): nodelet runs hooks from the
//! node, like the kubelet, so the test sees exactly when they arrive.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use nodelet_cri::{CriClient, CriConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep};

use crate::support::{Env, Nodelet, condition, container, env_or_skip, runtime_id, uid, waiting};

const HTTP_PORT: i32 = 8080;
const TCP_PORT: i32 = 8081;
const GRPC_PORT: i32 = 50051;
/// Long enough for a pod to start and a few probe periods of 1 s to pass on a busy machine.
const WAIT: Duration = Duration::from_secs(40);

/// The gRPC health server image, or `None` after a skip note (a panic under `NODELET_REQUIRE_RUNTIME=1`).
fn grpc_image(test: &str) -> Option<String> {
    match std::env::var("NODELET_TEST_GRPC_HEALTH_IMAGE") {
        Ok(image) if !image.trim().is_empty() => Some(image),
        _ if std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1") => {
            panic!(
                "NODELET_TEST_GRPC_HEALTH_IMAGE is unset: scripts/runtime-up.sh builds the image with cargo"
            )
        }
        _ => {
            eprintln!("SKIP {test}: NODELET_TEST_GRPC_HEALTH_IMAGE is unset");
            None
        }
    }
}

/// A probe of `kind` spec with period 1 s and thresholds 1 around `handler`.
fn probe(handler: Value) -> Value {
    let mut p = json!({"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1});
    if let (Some(p), Some(h)) = (p.as_object_mut(), handler.as_object()) {
        p.extend(h.clone());
    }
    p
}

/// `live` as startup and liveness probe, `ready` as readiness probe. Startup and liveness tolerate two slow answers in a row (the machine may be busy); readiness flips at once.
fn set_probes(container: &mut Value, live: Value, ready: Value) {
    container["startupProbe"] = probe(live.clone());
    container["startupProbe"]["failureThreshold"] = json!(3);
    container["livenessProbe"] = probe(live);
    container["livenessProbe"]["failureThreshold"] = json!(3);
    container["readinessProbe"] = probe(ready);
}

/// A shell command that runs `setup`, then waits for SIGTERM and exits 0 (echoing `term` to its log).
fn serve(setup: &str) -> Value {
    json!([
        "sh",
        "-c",
        format!("{setup}trap 'echo term; exit 0' TERM; while true; do sleep 1 & wait $!; done")
    ])
}

/// ExecSync in a container (10 s); returns (exit code, output).
async fn exec(env: &Env, id: &str, cmd: &[&str]) -> (i32, String) {
    let cri = match CriClient::connect(CriConfig::new(env.endpoint.clone())).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to {}: {e}", env.endpoint),
    };
    let cmd = cmd.iter().map(|s| (*s).to_owned()).collect();
    match cri.exec_sync(id, cmd, Duration::from_secs(10)).await {
        Ok(out) => (out.exit_code, format!("{}{}", out.stdout_lossy(), out.stderr_lossy())),
        Err(e) => panic!("exec in {id}: {e}"),
    }
}

/// Runs `cmd` in the running container `name` of the pod, asserting success.
async fn exec_in(env: &Env, pod: &Pod, name: &str, cmd: &[&str]) {
    let Some(status) = container(pod, name) else { panic!("no container {name}") };
    let (code, out) = exec(env, &runtime_id(status), cmd).await;
    assert_eq!(code, 0, "{cmd:?} in {name}: {out}");
}

fn ready(pod: &Pod, name: &str) -> bool {
    container(pod, name).is_some_and(|c| c.ready)
}

fn pod_ready(pod: &Pod) -> Option<String> {
    condition(pod, "Ready").map(|c| c.status.clone())
}

fn restarts(pod: &Pod, name: &str) -> i32 {
    container(pod, name).map_or(0, |c| c.restart_count)
}

fn last_message(status: &ContainerStatus) -> String {
    status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.message.clone())
        .unwrap_or_default()
}

/// `GET path` on the read-only port, as text.
async fn get_text(n: &Nodelet, path: &str) -> String {
    match n.main_get_text(path).await {
        Some(body) => body,
        None => panic!("GET {path} on the main port: no answer"),
    }
}

/// The value of the `prober_probe_total` series with these labels (0 if absent).
fn probe_total(metrics: &str, container: &str, kind: &str, result: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{"))
        .filter(|l| {
            l.contains(&format!("container=\"{container}\""))
                && l.contains(&format!("probe_type=\"{kind}\""))
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test]
async fn every_handler_runs_every_probe_kind_and_readiness_follows_it_both_ways() {
    let test = "every_handler_runs_every_probe_kind_and_readiness_follows_it_both_ways";
    let env = env_or_skip!(test);
    let Some(grpc) = grpc_image(test) else { return };
    let n = Nodelet::start(&env, "probes").await;
    // Each container: startup and liveness on one resource, readiness on another, so readiness flips alone.
    let mut http = json!({
        "name": "http",
        "command": serve(&format!("mkdir -p /www && echo ok > /www/live && echo ok > /www/ready && httpd -p {HTTP_PORT} -h /www; ")),
        "ports": [{"name": "web", "containerPort": HTTP_PORT}],
    });
    let headers = json!([{"name": "X-Probe", "value": "1"}]);
    set_probes(
        &mut http,
        json!({"httpGet": {"port": "web", "path": "/live", "httpHeaders": headers}}),
        json!({"httpGet": {"port": HTTP_PORT, "path": "/ready"}}),
    );
    let ready_port = TCP_PORT + 1;
    let mut tcp = json!({
        "name": "tcp",
        "command": serve(&format!("httpd -f -p {TCP_PORT} -h / & httpd -f -p {ready_port} -h / & echo $! > /tmp/ready.pid; ")),
    });
    set_probes(
        &mut tcp,
        json!({"tcpSocket": {"port": TCP_PORT}}),
        json!({"tcpSocket": {"port": ready_port}}),
    );
    let mut exec_c = json!({"name": "exec", "command": serve("touch /tmp/live /tmp/ready; ")});
    set_probes(
        &mut exec_c,
        json!({"exec": {"command": ["cat", "/tmp/live"]}}),
        json!({"exec": {"command": ["cat", "/tmp/ready"]}}),
    );
    let mut grpc_c = json!({
        "name": "grpc",
        "image": grpc,
        "args": ["--port", GRPC_PORT.to_string(), "--service", "svc", "--down-file", "/tmp/down"],
    });
    set_probes(
        &mut grpc_c,
        json!({"grpc": {"port": GRPC_PORT}}),
        json!({"grpc": {"port": GRPC_PORT, "service": "svc"}}),
    );
    n.write_manifest(
        "probes.yaml",
        &n.pod_manifest(
            "probes",
            json!({"terminationGracePeriodSeconds": 2, "containers": [http, tcp, exec_c, grpc_c]}),
        ),
    );
    let names = ["http", "tcp", "exec", "grpc"];

    // Startup, then liveness and readiness pass for every handler: started, ready, never restarted.
    let pod = n
        .wait_for_pod("probes", "all four containers ready", WAIT, |p| {
            names.iter().all(|c| ready(p, c)) && pod_ready(p).as_deref() == Some("True")
        })
        .await;
    for name in names {
        let c = container(&pod, name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(c.started, Some(true), "{name} started");
    }
    assert_eq!(condition(&pod, "ContainersReady").map(|c| c.status.as_str()), Some("True"));
    sleep(Duration::from_secs(2)).await;
    let metrics = get_text(&n, "/metrics/probes").await;
    for name in names {
        for kind in ["Startup", "Liveness", "Readiness"] {
            assert!(
                probe_total(&metrics, name, kind, "successful") >= 1.0,
                "{kind} probe of {name} ran and passed:\n{}",
                metrics.lines().filter(|l| l.starts_with("prober_")).collect::<Vec<_>>().join("\n")
            );
        }
    }
    assert!(metrics.contains("prober_probe_duration_seconds_bucket{"), "duration histogram");

    // Readiness flips off and on again, per handler, as /pods shows; nothing restarts.
    let flips: [(&str, &[&str], &[&str]); 4] = [
        ("http", &["rm", "/www/ready"], &["sh", "-c", "echo ok > /www/ready"]),
        ("tcp", &["sh", "-c", "kill $(cat /tmp/ready.pid)"], &["httpd", "-p", "8082", "-h", "/"]),
        ("exec", &["rm", "/tmp/ready"], &["touch", "/tmp/ready"]),
        ("grpc", &["touch", "/tmp/down"], &["rm", "/tmp/down"]),
    ];
    for (name, down, up) in flips {
        let pod = n.pod("probes").await.unwrap_or_else(|| panic!("pod gone"));
        exec_in(&env, &pod, name, down).await;
        let off = n.wait_for_pod("probes", &format!("{name} not ready"), WAIT, |p| !ready(p, name)).await;
        assert_eq!(pod_ready(&off).as_deref(), Some("False"), "{name} down: the pod is not Ready");
        let containers_ready = condition(&off, "ContainersReady").map(|c| c.status.clone());
        assert_eq!(containers_ready.as_deref(), Some("False"), "{name} down: ContainersReady");
        assert_eq!(container(&off, name).and_then(|c| c.started), Some(true), "{name} stays started");
        exec_in(&env, &off, name, up).await;
        n.wait_for_pod("probes", &format!("{name} ready again"), WAIT, |p| {
            ready(p, name) && pod_ready(p).as_deref() == Some("True")
        })
        .await;
    }
    let pod = n.pod("probes").await.unwrap_or_else(|| panic!("pod gone"));
    for name in names {
        assert_eq!(restarts(&pod, name), 0, "readiness failures never restart {name}");
    }
    let events = get_text(&n, "/api/v1/events").await;
    assert!(events.contains("Readiness probe failed"), "Unhealthy events: {events}");
    n.shutdown().await;
}

#[tokio::test]
async fn failing_liveness_and_startup_probes_restart_containers_with_every_handler() {
    let test = "failing_liveness_and_startup_probes_restart_containers_with_every_handler";
    let env = env_or_skip!(test);
    let Some(grpc) = grpc_image(test) else { return };
    let n = Nodelet::start(&env, "liveness").await;
    // Each container passes until the test breaks its liveness handler; the startup container never starts.
    let mut http = json!({"name": "http", "command": serve(&format!("mkdir -p /www && echo ok > /www/live && httpd -p {HTTP_PORT} -h /www; "))});
    http["livenessProbe"] = probe(json!({"httpGet": {"port": HTTP_PORT, "path": "/live"}}));
    http["livenessProbe"]["failureThreshold"] = json!(2);
    let mut tcp = json!({"name": "tcp", "command": serve(&format!("httpd -p {TCP_PORT} -h /; "))});
    tcp["livenessProbe"] = probe(json!({"tcpSocket": {"port": TCP_PORT}}));
    tcp["livenessProbe"]["failureThreshold"] = json!(2);
    let mut exec_c = json!({"name": "exec", "command": serve("touch /tmp/live; ")});
    exec_c["livenessProbe"] = probe(json!({"exec": {"command": ["cat", "/tmp/live"]}}));
    exec_c["livenessProbe"]["failureThreshold"] = json!(2);
    let mut grpc_c = json!({"name": "grpc", "image": grpc, "args": ["--port", GRPC_PORT.to_string(), "--service", "svc", "--down-file", "/tmp/down"]});
    grpc_c["livenessProbe"] = probe(json!({"grpc": {"port": GRPC_PORT, "service": "svc"}}));
    grpc_c["livenessProbe"]["failureThreshold"] = json!(2);
    let mut startup = json!({"name": "startup", "command": serve("")});
    startup["startupProbe"] = probe(json!({"exec": {"command": ["cat", "/tmp/never"]}}));
    n.write_manifest(
        "liveness.yaml",
        &n.pod_manifest(
            "liveness",
            json!({"terminationGracePeriodSeconds": 2, "containers": [http, tcp, exec_c, grpc_c, startup]}),
        ),
    );
    let names = ["http", "tcp", "exec", "grpc"];
    n.wait_for_pod("liveness", "the liveness containers running", WAIT, |p| {
        names.iter().all(|c| ready(p, c))
    })
    .await;
    sleep(Duration::from_secs(2)).await;
    let pod = n.pod("liveness").await.unwrap_or_else(|| panic!("pod gone"));
    for name in names {
        assert_eq!(restarts(&pod, name), 0, "{name}: a passing liveness probe restarts nothing");
    }
    let breaks: [(&str, &[&str]); 4] = [
        ("http", &["rm", "/www/live"]),
        ("tcp", &["killall", "httpd"]),
        ("exec", &["rm", "/tmp/live"]),
        ("grpc", &["touch", "/tmp/down"]),
    ];
    for (name, cmd) in breaks {
        exec_in(&env, &pod, name, cmd).await;
    }
    let pod = n
        .wait_for_pod("liveness", "every broken container restarted", WAIT, |p| {
            names.iter().all(|c| restarts(p, c) >= 1) && restarts(p, "startup") >= 1
        })
        .await;
    for name in names {
        let c = container(&pod, name).unwrap_or_else(|| panic!("no {name}"));
        if c.restart_count == 1 {
            assert_eq!(
                last_message(c),
                format!("Container {name} failed liveness probe, will be restarted"),
                "{name}: lastState says why"
            );
        }
    }
    let startup = container(&pod, "startup").unwrap_or_else(|| panic!("no startup container"));
    assert_eq!(startup.started, Some(false), "a container whose startup probe fails never counts as started");
    let events = get_text(&n, "/api/v1/events").await;
    for name in names {
        assert!(
            events.contains(&format!("Container {name} failed liveness probe, will be restarted")),
            "Killing event for {name}: {events}"
        );
    }
    assert!(events.contains("Container startup failed startup probe, will be restarted"), "{events}");
    assert!(events.contains("Liveness probe failed"), "Unhealthy events: {events}");
    n.shutdown().await;
}

#[tokio::test]
async fn a_startup_probe_holds_liveness_and_readiness_until_it_succeeds() {
    let env = env_or_skip!("a_startup_probe_holds_liveness_and_readiness_until_it_succeeds");
    let n = Nodelet::start(&env, "startup").await;
    // Liveness fails from the start: if it ran before the startup probe passed, the container would restart.
    let mut app = json!({"name": "app", "command": serve("")});
    app["startupProbe"] =
        json!({"exec": {"command": ["cat", "/tmp/started"]}, "periodSeconds": 1, "failureThreshold": 60});
    app["livenessProbe"] = probe(json!({"exec": {"command": ["cat", "/tmp/alive"]}}));
    app["readinessProbe"] = probe(json!({"exec": {"command": ["true"]}}));
    n.write_manifest(
        "startup.yaml",
        &n.pod_manifest("startup", json!({"terminationGracePeriodSeconds": 2, "containers": [app]})),
    );
    let pod = n
        .wait_for_pod("startup", "app running", WAIT, |p| {
            container(p, "app").and_then(|c| c.state.as_ref()).is_some_and(|s| s.running.is_some())
        })
        .await;
    for _ in 0..8 {
        let pod = n.pod("startup").await.unwrap_or_else(|| panic!("pod gone"));
        let app = container(&pod, "app").unwrap_or_else(|| panic!("no app"));
        assert_eq!((app.started, app.ready, app.restart_count), (Some(false), false, 0), "held: {app:?}");
        assert_eq!(pod_ready(&pod).as_deref(), Some("False"));
        sleep(Duration::from_millis(500)).await;
    }
    let metrics = get_text(&n, "/metrics/probes").await;
    assert_eq!(probe_total(&metrics, "app", "Liveness", "failed"), 0.0, "liveness never ran");
    assert!(probe_total(&metrics, "app", "Startup", "failed") >= 3.0, "the startup probe ran");

    // Started: readiness runs (ready), and liveness runs too (it fails: the container restarts).
    exec_in(&env, &pod, "app", &["touch", "/tmp/started"]).await;
    n.wait_for_pod("startup", "app started and ready", WAIT, |p| {
        container(p, "app").is_some_and(|c| c.started == Some(true) && c.ready) || restarts(p, "app") > 0
    })
    .await;
    let pod = n.wait_for_pod("startup", "liveness restarts app", WAIT, |p| restarts(p, "app") >= 1).await;
    let app = container(&pod, "app").unwrap_or_else(|| panic!("no app"));
    assert_eq!(last_message(app), "Container app failed liveness probe, will be restarted");
    n.shutdown().await;
}

/// Requests a test HTTP server on 127.0.0.1 received: (path, when).
type Hits = Arc<Mutex<Vec<(String, Instant)>>>;

/// A plain HTTP server on 127.0.0.1 that answers every request 200 and records it.
async fn hook_server() -> (u16, Hits) {
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let hits: Hits = Arc::default();
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0_u8; 4096];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = request.split(' ').nth(1).unwrap_or_default().to_owned();
                seen.lock().unwrap_or_else(PoisonError::into_inner).push((path, Instant::now()));
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
            });
        }
    });
    (port, hits)
}

fn hit(hits: &Hits, path: &str) -> Option<Instant> {
    hits.lock().unwrap_or_else(PoisonError::into_inner).iter().find(|(p, _)| p == path).map(|(_, t)| *t)
}

/// The CRI log of attempt `restart` of container `name`: (time, line).
fn log_lines(n: &Nodelet, pod: &Pod, name: &str, restart: u32) -> Vec<(Timestamp, String)> {
    let dir: PathBuf = n.logs_dir().join(format!(
        "default_{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        uid(pod)
    ));
    let path = dir.join(name).join(format!("{restart}.log"));
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(4, ' ');
            let ts = parts.next()?.parse::<Timestamp>().ok()?;
            let (_stream, _tag, content) = (parts.next()?, parts.next()?, parts.next()?);
            Some((ts, content.to_owned()))
        })
        .collect()
}

fn logged(lines: &[(Timestamp, String)], text: &str) -> Option<Timestamp> {
    lines.iter().find(|(_, l)| l == text).map(|(t, _)| *t)
}

#[tokio::test]
async fn lifecycle_hooks_run_around_start_and_stop_in_order() {
    let env = env_or_skip!("lifecycle_hooks_run_around_start_and_stop_in_order");
    let n = Nodelet::start(&env, "hooks").await;
    let (port, hits) = hook_server().await;
    let grace = 6;
    // exec: postStart writes a file the test reads; preStop writes into the main process's log, then takes
    //   2 s, before SIGTERM (which the main process logs as `term`).
    // httpGet: both hooks call the test's server.
    // sleep: postStart sleeps 2 s (the next container starts only after it); preStop sleeps 2 s.
    // The `stubborn` container ignores SIGTERM: its preStop takes 2 s of the grace, the kill comes at the
    // end of the grace period, not 2 s after it.
    let containers = json!([
        {
            "name": "exec",
            "command": serve("echo main-started; "),
            "lifecycle": {
                "postStart": {"exec": {"command": ["sh", "-c", "echo poststart > /tmp/poststart"]}},
                "preStop": {"exec": {"command": ["sh", "-c", "echo prestop > /proc/1/fd/1; sleep 2"]}},
            },
        },
        {
            "name": "http",
            "command": serve(""),
            "lifecycle": {
                "postStart": {"httpGet": {"host": "127.0.0.1", "port": port, "path": "/poststart"}},
                "preStop": {"httpGet": {"host": "127.0.0.1", "port": port, "path": "/prestop"}},
            },
        },
        {
            "name": "sleep",
            "command": serve(""),
            "lifecycle": {"postStart": {"sleep": {"seconds": 2}}, "preStop": {"sleep": {"seconds": 2}}},
        },
        {"name": "after-sleep", "command": serve("")},
        {
            "name": "stubborn",
            "command": ["sh", "-c", "trap 'echo ignored-term' TERM; while true; do sleep 1 & wait $!; done"],
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop > /proc/1/fd/1; sleep 2"]}}},
        },
    ]);
    // Each container is restarted by its liveness probe once the test creates /tmp/die in it.
    let mut containers = containers;
    for c in containers.as_array_mut().into_iter().flatten() {
        c["livenessProbe"] = probe(json!({"exec": {"command": ["sh", "-c", "test ! -e /tmp/die"]}}));
        c["livenessProbe"]["failureThreshold"] = json!(2);
    }
    n.write_manifest(
        "hooks.yaml",
        &n.pod_manifest("hooks", json!({"terminationGracePeriodSeconds": grace, "containers": containers})),
    );
    let names = ["exec", "http", "sleep", "after-sleep", "stubborn"];
    let pod = n
        .wait_for_pod("hooks", "all running", WAIT, |p| {
            names
                .iter()
                .all(|c| container(p, c).and_then(|s| s.state.as_ref()).is_some_and(|s| s.running.is_some()))
        })
        .await;

    // postStart effects: the exec hook's file, the HTTP hook's request, the sleep hook's delay.
    exec_in(&env, &pod, "exec", &["cat", "/tmp/poststart"]).await;
    assert!(hit(&hits, "/poststart").is_some(), "the postStart httpGet reached the server");
    let started = |name: &str| -> Timestamp {
        let at = container(&pod, name)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.as_ref())
            .map(|t| t.0);
        at.unwrap_or_else(|| panic!("{name} has no start time"))
    };
    let gap = started("after-sleep").duration_since(started("sleep"));
    assert!(gap.as_secs_f64() >= 2.0, "the next container starts after the 2 s postStart sleep: {gap:?}");

    // Restarting every container (liveness): preStop, then SIGTERM, within the grace period.
    let changed_at = Instant::now();
    for name in names {
        exec_in(&env, &pod, name, &["touch", "/tmp/die"]).await;
    }
    let pod = n
        .wait_for_pod("hooks", "all restarted", Duration::from_secs(60), |p| {
            names.iter().all(|c| restarts(p, c) >= 1)
        })
        .await;
    let prestop_http = hit(&hits, "/prestop").unwrap_or_else(|| panic!("the preStop httpGet never came"));
    assert!(prestop_http >= changed_at);

    let lines = log_lines(&n, &pod, "exec", 0);
    let pre =
        logged(&lines, "prestop").unwrap_or_else(|| panic!("no preStop output in exec's log: {lines:?}"));
    let term = logged(&lines, "term").unwrap_or_else(|| panic!("no SIGTERM in exec's log: {lines:?}"));
    let waited = term.duration_since(pre).as_secs_f64();
    assert!(waited >= 1.9, "SIGTERM only after the 2 s preStop hook: {waited}s\n{lines:?}");

    // The stubborn container: killed at the end of the grace period counted from the preStop start.
    let lines = log_lines(&n, &pod, "stubborn", 0);
    let pre =
        logged(&lines, "prestop").unwrap_or_else(|| panic!("no preStop output in stubborn's log: {lines:?}"));
    let term =
        logged(&lines, "ignored-term").unwrap_or_else(|| panic!("no SIGTERM in stubborn's log: {lines:?}"));
    let term_after = term.duration_since(pre).as_secs_f64();
    assert!((1.9..3.5).contains(&term_after), "SIGTERM right after the preStop: {term_after}s");
    let stubborn = container(&pod, "stubborn").unwrap_or_else(|| panic!("no stubborn"));
    let finished = stubborn
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.as_ref())
        .map(|t| t.0)
        .unwrap_or_else(|| panic!("no lastState of stubborn: {stubborn:?}"));
    let killed_after = finished.duration_since(pre).as_secs_f64();
    assert!(
        // (the hook's output is logged a moment after nodelet starts it: runc takes a while to exec)
        killed_after >= f64::from(grace) - 1.5 && killed_after <= f64::from(grace) + 1.5,
        "killed {killed_after}s after the preStop started: the grace period ({grace}s) includes the hook"
    );
    n.shutdown().await;
}

#[tokio::test]
async fn a_failing_post_start_hook_kills_the_container() {
    let env = env_or_skip!("a_failing_post_start_hook_kills_the_container");
    let n = Nodelet::start(&env, "poststart").await;
    let app = json!({
        "name": "app",
        "command": serve(""),
        "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "echo broken hook; exit 3"]}}},
    });
    n.write_manifest(
        "poststart.yaml",
        &n.pod_manifest("poststart", json!({"terminationGracePeriodSeconds": 2, "containers": [app]})),
    );
    let pod = n
        .wait_for_pod("poststart", "app restarted after its postStart failed", WAIT, |p| {
            restarts(p, "app") >= 1
        })
        .await;
    let app = container(&pod, "app").unwrap_or_else(|| panic!("no app"));
    assert!(!app.ready);
    assert!(app.state.as_ref().is_none_or(|s| s.running.is_none()) || app.restart_count >= 1);
    let events = get_text(&n, "/api/v1/events").await;
    assert!(events.contains("PostStartHookError") && events.contains("broken hook"), "{events}");
    if let Some((reason, _)) = waiting(app) {
        assert!(
            ["PostStartHookError", "CrashLoopBackOff", "ContainerCreating"].contains(&reason.as_str()),
            "{reason}"
        );
    }
    n.shutdown().await;
}

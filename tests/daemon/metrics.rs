//! The kubelet's other metric endpoints on the real runtime: `/metrics/probes` (the prober's series, with
//! `pod_uid`, gone with the pod) and `/metrics/cadvisor` (cAdvisor's `container_*` series of the pod's
//! container, pod cgroup and the machine), on the read-only port and, with authentication, the main port.

use std::time::Duration;

use serde_json::json;

use crate::stats::promtool;
use crate::support::{Nodelet, TOKEN, container, env_or_skip, runtime_id, uid};

const MIB: f64 = 1024.0 * 1024.0;

/// `GET <path>` on the read-only port, as text; panics unless it is a 200 in the Prometheus text format.
async fn read_only(n: &Nodelet, path: &str) -> String {
    let url = format!("http://127.0.0.1:{}{path}", n.ports().read_only);
    match n.http().get(&url).send().await {
        Ok(r) if r.status().is_success() => {
            let kind = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
            assert!(kind.starts_with("text/plain; version=0.0.4"), "GET {url}: content type {kind:?}");
            r.text().await.unwrap_or_default()
        }
        Ok(r) => panic!("GET {url}: {}: {}", r.status(), r.text().await.unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// The series `name{…}` (the part before the value) whose labels include every one of `labels`, with
/// their values.
fn series<'a>(text: &'a str, name: &str, labels: &[&str]) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            // `name{labels} value [timestamp]` or `name value [timestamp]`.
            let (series, rest) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once('}')?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let value = rest.split_whitespace().next()?.parse().ok()?;
            labels.iter().all(|want| series.split(',').any(|pair| pair == *want)).then_some((series, value))
        })
        .collect()
}

/// The single series `name{labels…}`; panics showing `text` when there is not exactly one.
fn one(text: &str, name: &str, labels: &[&str]) -> f64 {
    let found = series(text, name, labels);
    match found.as_slice() {
        [(_, v)] => *v,
        _ => panic!("{} series {name}{labels:?}, want 1:\n{text}", found.len()),
    }
}

#[tokio::test]
async fn probe_and_cadvisor_metrics_show_the_pod_and_forget_it_when_it_goes() {
    let env = env_or_skip!("probe_and_cadvisor_metrics_show_the_pod_and_forget_it_when_it_goes");
    let n = Nodelet::start(&env, "metrics").await;
    // 16 MiB in /dev/shm (memory charged to the container) and a few hundred ms of CPU, then ready.
    let script = "head -c 16777216 /dev/zero > /dev/shm/fill && \
                  i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; \
                  touch /tmp/ready && exec sleep 3600";
    n.write_manifest(
        "metrics.yaml",
        &n.pod_manifest(
            "metrics",
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app",
                    "command": ["sh", "-c", script],
                    "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1},
                }],
            }),
        ),
    );
    let pod = n.wait_running("metrics").await;
    let pod_uid = uid(&pod);
    let pod_name = n.pod_name("metrics");
    let Some(status) = container(&pod, "app") else { panic!("no status of app") };
    let container_id = runtime_id(status);

    // /metrics/probes: the readiness probe's runs, with the pod's UID; not on /metrics.
    let uid_label = format!("pod_uid=\"{pod_uid}\"");
    let pod_label = format!("pod=\"{pod_name}\"");
    let probe_labels = [
        "container=\"app\"",
        "namespace=\"default\"",
        pod_label.as_str(),
        uid_label.as_str(),
        "probe_type=\"Readiness\"",
        "result=\"successful\"",
    ];
    let probes = n
        .wait_for("two successful readiness probes on /metrics/probes", Duration::from_secs(20), async || {
            let text = read_only(&n, "/metrics/probes").await;
            (series(&text, "prober_probe_total", &probe_labels).first().is_some_and(|(_, v)| *v >= 2.0))
                .then_some(text)
        })
        .await;
    assert!(probes.contains("# TYPE prober_probe_total counter\n"), "{probes}");
    let runs = one(
        &probes,
        "prober_probe_duration_seconds_count",
        &["container=\"app\"", pod_label.as_str(), "probe_type=\"Readiness\""],
    );
    assert!(runs >= 2.0, "duration histogram counts the runs: {runs}\n{probes}");
    if let Err(problems) = promtool(&probes) {
        panic!("/metrics/probes fails promtool:\n{problems}\n{probes}");
    }
    let metrics = read_only(&n, "/metrics").await;
    assert!(!metrics.contains("prober_probe_total"), "prober metrics are not on /metrics");
    // The container start is counted with its type.
    assert!(
        series(&metrics, "kubelet_started_containers_total", &["container_type=\"container\""])
            .first()
            .is_some_and(|(_, v)| *v >= 1.0),
        "kubelet_started_containers_total{{container_type=\"container\"}}:\n{metrics}"
    );
    assert!(
        series(&metrics, "kubelet_desired_pods", &["static=\"true\""])
            .first()
            .is_some_and(|(_, v)| *v >= 1.0),
        "kubelet_desired_pods{{static=\"true\"}}:\n{metrics}"
    );

    // /metrics/cadvisor: the container's CPU and memory with cAdvisor's labels; its cgroup exists.
    let cgroup_prefix = format!("{}/pod{pod_uid}", env.cgroup_parent.trim_end_matches('/'));
    let id_label = format!("id=\"{cgroup_prefix}/{container_id}\"");
    let name_label = format!("name=\"{container_id}\"");
    let image_label = format!("image=\"{}\"", env.busybox);
    let app = [
        "container=\"app\"",
        "namespace=\"default\"",
        pod_label.as_str(),
        id_label.as_str(),
        name_label.as_str(),
        image_label.as_str(),
    ];
    let cadvisor = n
        .wait_for("the container's memory on /metrics/cadvisor", Duration::from_secs(30), async || {
            let text = read_only(&n, "/metrics/cadvisor").await;
            let ws = series(&text, "container_memory_working_set_bytes", &app);
            ws.first().is_some_and(|(_, v)| *v >= 16.0 * MIB).then_some(text)
        })
        .await;
    let mut cpu_labels = app.to_vec();
    cpu_labels.push("cpu=\"total\"");
    let cpu = one(&cadvisor, "container_cpu_usage_seconds_total", &cpu_labels);
    assert!(cpu > 0.0 && cpu < 3600.0, "container CPU seconds {cpu}");
    let usage = one(&cadvisor, "container_memory_usage_bytes", &app);
    let ws = one(&cadvisor, "container_memory_working_set_bytes", &app);
    assert!(usage >= ws && (16.0 * MIB..1024.0 * MIB).contains(&ws), "usage {usage}, working set {ws}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let start = one(&cadvisor, "container_start_time_seconds", &app);
    assert!(start > now - 600.0 && start <= now + 1.0, "start time {start}, now {now}");
    let seen = one(&cadvisor, "container_last_seen", &app);
    assert!((seen - now).abs() < 60.0, "last seen {seen}, now {now}");
    // (cgroup v2: one hierarchy; v1: the memory controller's.)
    let rel = format!("{}/{container_id}", cgroup_prefix.trim_start_matches('/'));
    let is_cgroup = ["/sys/fs/cgroup", "/sys/fs/cgroup/memory"]
        .iter()
        .any(|root| std::path::Path::new(root).join(&rel).join("cgroup.procs").is_file());
    assert!(is_cgroup, "the id label is the container's cgroup: {rel}");
    // The pod's cgroup: CPU, and its network per interface.
    let pod_id = format!("id=\"{cgroup_prefix}\"");
    let pod_series = ["container=\"\"", pod_label.as_str(), pod_id.as_str(), "cpu=\"total\""];
    assert!(
        one(&cadvisor, "container_cpu_usage_seconds_total", &pod_series) >= cpu,
        "pod CPU ≥ container CPU"
    );
    let pod_net =
        series(&cadvisor, "container_network_receive_bytes_total", &[pod_label.as_str(), pod_id.as_str()]);
    assert!(pod_net.iter().any(|(s, _)| s.contains("interface=\"eth0\"")), "pod network:\n{cadvisor}");
    // The machine.
    assert!(one(&cadvisor, "machine_cpu_cores", &[]) >= 1.0, "{cadvisor}");
    assert!(one(&cadvisor, "machine_memory_bytes", &[]) > 64.0 * MIB, "{cadvisor}");
    assert!(one(&cadvisor, "container_memory_working_set_bytes", &["id=\"/\""]) > 0.0, "{cadvisor}");
    assert_eq!(one(&cadvisor, "container_scrape_error", &[]), 0.0);
    if let Err(problems) = promtool(&cadvisor) {
        panic!("/metrics/cadvisor fails promtool:\n{problems}\n{cadvisor}");
    }

    // The main port: 401 without credentials, the same series with the token.
    let https = n.main_client();
    for (path, want) in [
        ("/metrics/probes", "prober_probe_total{"),
        ("/metrics/cadvisor", "container_cpu_usage_seconds_total{"),
    ] {
        let url = n.main_url(path);
        let refused = https.get(&url).send().await.map(|r| r.status().as_u16()).unwrap_or_default();
        assert_eq!(refused, 401, "{path} without credentials");
        let text = match https.get(&url).bearer_auth(TOKEN).send().await {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            other => panic!("GET {url}: {other:?}"),
        };
        assert!(text.contains(want) && text.contains(&pod_label), "{path} on the main port:\n{text}");
    }

    // The pod goes: so do its probe series and its cAdvisor series.
    n.remove_manifest("metrics.yaml");
    n.wait_for("the pod to be gone from /pods", Duration::from_secs(30), async || {
        n.pod("metrics").await.is_none().then_some(())
    })
    .await;
    let probes = read_only(&n, "/metrics/probes").await;
    assert!(
        !probes.contains(&uid_label) && !probes.contains(&pod_label),
        "probe series outlive the pod:\n{probes}"
    );
    n.wait_for("the pod's series to leave /metrics/cadvisor", Duration::from_secs(30), async || {
        (!read_only(&n, "/metrics/cadvisor").await.contains(&pod_label)).then_some(())
    })
    .await;
    n.shutdown().await;
}

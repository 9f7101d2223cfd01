//! Stats (`/stats/summary`, `/metrics/resource`), `/metrics` through `promtool`, container garbage
//! collection and OOM kills, on the real runtime.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Nodelet, StartOptions, TOKEN, container, env_or_skip, uid};

const MIB: u64 = 1024 * 1024;

/// `GET <path>` on the read-only port, as text.
pub(crate) async fn read_only(n: &Nodelet, path: &str) -> String {
    let url = format!("http://127.0.0.1:{}{path}", n.ports().read_only);
    match n.http().get(&url).send().await {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        Ok(r) => panic!("GET {url}: {}: {}", r.status(), r.text().await.unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// `promtool check metrics` of `text`; returns its complaints when it fails.
pub(crate) fn promtool(text: &str) -> Result<(), String> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!("cannot run promtool (scripts/install-deps.sh installs it): {e}"),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(text.as_bytes());
    }
    match child.wait_with_output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        }
        Err(e) => panic!("promtool: {e}"),
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The value of the sample `name{labels…}` whose label set contains every one of `labels`.
pub(crate) fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, rest) = l.split_once(' ')?;
        let matches = (series == name || series.starts_with(&format!("{name}{{")))
            && labels.iter().all(|want| series.contains(want));
        if matches { rest.split_whitespace().next()?.parse().ok() } else { None }
    })
}

#[tokio::test]
async fn stats_summary_and_resource_metrics_show_what_the_pod_uses() {
    let env = env_or_skip!("stats_summary_and_resource_metrics_show_what_the_pod_uses");
    // The summary is gathered every housekeeping interval (10 s by default), the volumes measured every
    // volumeStatsAggPeriod (1 m by default); 2 s keeps the test short.
    let options = StartOptions {
        config_extra: "volumeStatsAggPeriod: 2s".into(),
        nodelet_extra: "housekeepingInterval: 2s".into(),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "stats", options).await;
    // 24 MiB in /dev/shm (memory, charged to the container), 8 MiB in the writable layer, 5 MiB in an
    // emptyDir, ~290 KB of log.
    let script = "head -c 25165824 /dev/zero > /dev/shm/fill && \
                  head -c 8388608 /dev/zero > /tmp/layer && \
                  head -c 5242880 /dev/zero > /scratch/data && \
                  seq 1 50000 && touch /tmp/done && exec sleep 3600";
    n.write_manifest(
        "stats.yaml",
        &n.pod_manifest(
            "stats",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{
                    "name": "hog",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
            }),
        ),
    );
    let pod = n.wait_running("stats").await;
    let pod_uid = uid(&pod);
    let pod_name = n.pod_name("stats");

    // Poll until the numbers show what the container wrote.
    let summary: Value = n
        .wait_for("the summary to show the pod's usage", Duration::from_secs(30), async || {
            let s: Value = serde_json::from_str(&read_only(&n, "/stats/summary").await).ok()?;
            let p = s["pods"].as_array()?.iter().find(|p| p["podRef"]["uid"] == pod_uid.as_str())?.clone();
            let c = p["containers"].as_array()?.iter().find(|c| c["name"] == "hog")?.clone();
            let scratch = p["volume"].as_array()?.iter().find(|v| v["name"] == "scratch")?.clone();
            let ok = u(&c["memory"]["workingSetBytes"]) >= 24 * MIB
                && u(&c["rootfs"]["usedBytes"]) >= 8 * MIB
                && u(&scratch["usedBytes"]) >= 5 * MIB
                && u(&c["logs"]["usedBytes"]) >= 200_000;
            ok.then_some(s)
        })
        .await;
    let node = &summary["node"];
    assert_eq!(node["nodeName"], n.node());
    let mem = &node["memory"];
    assert!(u(&mem["workingSetBytes"]) > 0 && u(&mem["availableBytes"]) > 0, "{mem}");
    assert!(u(&mem["usageBytes"]) >= u(&mem["workingSetBytes"]), "{mem}");
    let fs = &node["fs"];
    assert!(u(&fs["capacityBytes"]) >= u(&fs["availableBytes"]) && u(&fs["availableBytes"]) > 0, "{fs}");
    assert!(u(&fs["inodes"]) >= u(&fs["inodesFree"]) && u(&fs["inodesFree"]) > 0, "{fs}");
    assert!(u(&node["runtime"]["imageFs"]["usedBytes"]) > 0, "{node}");
    assert!(u(&node["runtime"]["imageFs"]["capacityBytes"]) > 0, "{node}");
    let rlimit = &node["rlimit"];
    assert!(u(&rlimit["maxpid"]) > u(&rlimit["curproc"]) && u(&rlimit["curproc"]) > 0, "{rlimit}");
    assert!(u(&node["cpu"]["usageCoreNanoSeconds"]) > 0, "{node}");

    let p = summary["pods"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["podRef"]["uid"] == pod_uid.as_str()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(p["podRef"]["name"], pod_name.as_str());
    assert_eq!(p["podRef"]["namespace"], "default");
    assert!(u(&p["memory"]["workingSetBytes"]) >= 24 * MIB, "pod memory: {}", p["memory"]);
    assert!(u(&p["cpu"]["usageCoreNanoSeconds"]) > 0, "pod cpu: {}", p["cpu"]);
    // Local ephemeral storage: writable layer + logs + the emptyDir.
    assert!(u(&p["ephemeral-storage"]["usedBytes"]) >= 13 * MIB, "{}", p["ephemeral-storage"]);
    assert!(u(&p["process_stats"]["process_count"]) >= 1, "{}", p["process_stats"]);
    // The pod's own network namespace (from the runtime, or read from the sandbox's namespace where
    // the runtime must not be asked for sandbox stats).
    let interfaces: Vec<&str> = p["network"]["interfaces"]
        .as_array()
        .map(|i| i.iter().filter_map(|i| i["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(interfaces.contains(&"eth0"), "pod network: {}", p["network"]);
    assert!(p["network"]["rxBytes"].as_u64().is_some(), "pod network: {}", p["network"]);
    let c = &p["containers"][0];
    assert!(c["startTime"].as_str().is_some_and(|t| t.ends_with('Z')), "{c}");

    // The main port serves the same, with authentication; CPU and memory only on request.
    let https = n.main_client();
    let url = n.main_url("/stats/summary?only_cpu_and_memory=true");
    let refused = https.get(&url).send().await.map(|r| r.status().as_u16()).unwrap_or_default();
    assert_eq!(refused, 401);
    let text = match https.get(&url).bearer_auth(TOKEN).send().await {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        other => panic!("GET {url}: {other:?}"),
    };
    let small: Value = serde_json::from_str(&text).unwrap_or_default();
    let sp =
        small["pods"].as_array().and_then(|ps| ps.iter().find(|p| p["podRef"]["uid"] == pod_uid.as_str()));
    let sp = sp.cloned().unwrap_or_default();
    assert!(u(&sp["memory"]["workingSetBytes"]) >= 24 * MIB, "{sp}");
    assert!(sp.get("volume").is_none() && sp.get("ephemeral-storage").is_none(), "{sp}");
    assert!(small["node"].get("fs").is_none(), "{}", small["node"]);

    // /metrics/resource carries the same numbers and passes promtool.
    let resource = read_only(&n, "/metrics/resource").await;
    let pod_label = format!("pod=\"{pod_name}\"");
    let labels = ["container=\"hog\"", "namespace=\"default\"", pod_label.as_str()];
    let ws = sample(&resource, "container_memory_working_set_bytes", &labels).unwrap_or(0.0);
    assert!(ws >= (24 * MIB) as f64, "container_memory_working_set_bytes {ws}:\n{resource}");
    assert!(sample(&resource, "container_cpu_usage_seconds_total", &labels).is_some_and(|v| v > 0.0));
    assert!(sample(&resource, "container_start_time_seconds", &labels).is_some_and(|v| v > 1.6e9));
    assert!(sample(&resource, "pod_memory_working_set_bytes", &labels[1..]).is_some_and(|v| v >= ws));
    assert!(sample(&resource, "node_memory_working_set_bytes", &[]).is_some_and(|v| v > 0.0));
    assert_eq!(sample(&resource, "resource_scrape_error", &[]), Some(0.0));
    if let Err(problems) = promtool(&resource) {
        panic!("/metrics/resource fails promtool:\n{problems}\n{resource}");
    }

    // /metrics: the kubelet's names, and promtool is happy with all of it.
    let metrics = read_only(&n, "/metrics").await;
    // containerd before 1.6.22 can crash when sandbox stats meet a sandbox listing: never asked there.
    if !n.cri().sandbox_stats_are_safe().await {
        let asked = metrics.lines().find(|l| l.contains("operation_type=\"list_podsandbox_stats\""));
        assert_eq!(asked, None, "nodelet asked an unsafe runtime for sandbox stats");
    }
    for (name, labels) in [
        ("kubelet_runtime_operations_total", &["operation_type=\"run_podsandbox\""][..]),
        ("kubelet_runtime_operations_duration_seconds_count", &["operation_type=\"create_container\""][..]),
        ("kubelet_pod_start_duration_seconds_count", &[][..]),
        ("kubelet_pod_worker_duration_seconds_count", &["operation_type=\"create\""][..]),
        ("kubelet_started_pods_total", &[][..]),
        ("kubelet_running_pods", &[][..]),
    ] {
        assert!(
            sample(&metrics, name, labels).is_some_and(|v| v >= 1.0),
            "{name}{labels:?} missing:\n{metrics}"
        );
    }
    if let Err(problems) = promtool(&metrics) {
        panic!("/metrics fails promtool:\n{problems}");
    }
    n.shutdown().await;
}

#[tokio::test]
async fn housekeeping_reads_container_cpu_and_memory_from_cgroups_and_asks_the_runtime_once_a_period() {
    let env = env_or_skip!(
        "housekeeping_reads_container_cpu_and_memory_from_cgroups_and_asks_the_runtime_once_a_period"
    );
    // A round every second; the runtime's container stats (writable layers) every volumeStatsAggPeriod (1 m).
    let options =
        StartOptions { nodelet_extra: "housekeepingInterval: 1s".into(), ..StartOptions::default() };
    let n = Nodelet::start_with(&env, "hk", options).await;
    let script = "head -c 16777216 /dev/zero > /dev/shm/fill && exec sleep 3600";
    n.write_manifest(
        "hk.yaml",
        &n.pod_manifest(
            "hk",
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "hog", "command": ["sh", "-c", script]}],
            }),
        ),
    );
    let pod_uid = uid(&n.wait_running("hk").await);
    let hog = async || -> Option<Value> {
        let s: Value = serde_json::from_str(&read_only(&n, "/stats/summary").await).ok()?;
        let p = s["pods"].as_array()?.iter().find(|p| p["podRef"]["uid"] == pod_uid.as_str())?.clone();
        p["containers"].as_array()?.iter().find(|c| c["name"] == "hog").cloned()
    };
    // The container came after the first round's ListContainerStats: its numbers are its cgroup's, the
    // CPU rate from two of nodelet's own samples.
    let first = n
        .wait_for("the container's memory and CPU rate in the summary", Duration::from_secs(20), async || {
            let c = hog().await?;
            (u(&c["memory"]["workingSetBytes"]) >= 16 * MIB && c["cpu"]["usageNanoCores"].is_u64())
                .then_some(c)
        })
        .await;
    let asked = async || {
        sample(
            &read_only(&n, "/metrics").await,
            "kubelet_runtime_operations_total",
            &["operation_type=\"list_container_stats\""],
        )
        .unwrap_or(0.0)
    };
    let before = asked().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = hog().await.unwrap_or_default();
    assert_ne!(later["cpu"]["time"], first["cpu"]["time"], "no newer round: {later}");
    assert!(u(&later["memory"]["workingSetBytes"]) >= 16 * MIB, "{later}");
    assert_eq!(asked().await, before, "ListContainerStats in a housekeeping round within the period");
    assert!(before <= 2.0, "ListContainerStats {before} times in a few rounds");
}

#[tokio::test]
async fn dead_attempts_of_a_crash_looping_container_are_collected_with_their_logs() {
    let env = env_or_skip!("dead_attempts_of_a_crash_looping_container_are_collected_with_their_logs");
    let options =
        StartOptions { nodelet_extra: "containerGC: {period: 1s}".to_owned(), ..StartOptions::default() };
    let n = Nodelet::start_with(&env, "cgc", options).await;
    n.write_manifest(
        "crash.yaml",
        &n.pod_manifest(
            "crash",
            json!({
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "command": ["sh", "-c", "echo crashing; exit 3"]}],
            }),
        ),
    );
    let pod = n.wait_for_pod("crash", "created", Duration::from_secs(20), |_| true).await;
    let pod_uid = uid(&pod);
    let log_dir = n.logs_dir().join(format!("default_{}_{pod_uid}", n.pod_name("crash"))).join("app");
    // Without GC the pod driver keeps two attempts (the newest and the one before it) at all times once
    // it restarted; with it, while the newest waits in back-off, it is the only one, with the only log.
    let (attempt, logs) = n
        .wait_for("only the newest dead attempt to remain", Duration::from_secs(30), async || {
            let containers = n.containers_of(&pod_uid).await;
            let [only] = containers.as_slice() else { return None };
            let attempt = only.metadata.as_ref().map_or(0, |m| m.attempt);
            let mut logs: Vec<String> = std::fs::read_dir(&log_dir)
                .ok()?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            logs.sort();
            (attempt >= 2 && logs == [format!("{attempt}.log")]).then_some((attempt, logs))
        })
        .await;
    // Status still shows the last attempt: restart count and exit code.
    let pod = n.pod("crash").await.unwrap_or_default();
    let app = container(&pod, "app").cloned().unwrap_or_default();
    assert!(u64::try_from(app.restart_count).unwrap_or(0) >= u64::from(attempt), "{app:?} {logs:?}");
    let last = app.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code);
    assert_eq!(last, Some(3), "{app:?}");
    assert!(n.log().contains("container GC removed dead containers"), "{}", n.log());
    n.shutdown().await;
}

#[tokio::test]
async fn the_node_wide_dead_container_cap_removes_what_the_per_pod_policy_keeps() {
    let env = env_or_skip!("the_node_wide_dead_container_cap_removes_what_the_per_pod_policy_keeps");
    // Per pod, up to 5 dead attempts may stay; on the node only 1: the node-wide decision (made every
    // second) removes the previous attempt, which the per-pod policy alone would keep.
    let options = StartOptions {
        nodelet_extra: "containerGC: {period: 1s, maxPerPodContainer: 5, maxContainers: 1}".to_owned(),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "cgcmax", options).await;
    n.write_manifest(
        "crash.yaml",
        &n.pod_manifest(
            "crash",
            json!({
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "command": ["sh", "-c", "exit 3"]}],
            }),
        ),
    );
    let pod = n.wait_for_pod("crash", "created", Duration::from_secs(20), |_| true).await;
    let pod_uid = uid(&pod);
    n.wait_for("only the newest dead attempt to remain", Duration::from_secs(30), async || {
        let containers = n.containers_of(&pod_uid).await;
        let [only] = containers.as_slice() else { return None };
        (only.metadata.as_ref().map_or(0, |m| m.attempt) >= 2).then_some(())
    })
    .await;
    let pod = n.pod("crash").await.unwrap_or_default();
    let app = container(&pod, "app").cloned().unwrap_or_default();
    assert_eq!(app.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code), Some(3));
    assert!(n.log().contains("container GC removed dead containers"), "{}", n.log());
    n.shutdown().await;
}

#[tokio::test]
async fn an_oom_killed_container_shows_oomkilled_and_an_event() {
    let env = env_or_skip!("an_oom_killed_container_shows_oomkilled_and_an_event");
    let n = Nodelet::start(&env, "oom").await;
    n.write_manifest(
        "oom.yaml",
        &n.pod_manifest(
            "oom",
            json!({
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "eat",
                    // `tail` keeps the endless line of zeros in memory until the OOM killer stops it.
                    "command": ["sh", "-c", "tail /dev/zero"],
                    "resources": {"limits": {"memory": "16Mi"}},
                }],
            }),
        ),
    );
    let pod = n
        .wait_for_pod("oom", "lastState OOMKilled", Duration::from_secs(30), |p| {
            container(p, "eat")
                .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
                .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled") && t.exit_code == 137)
        })
        .await;
    let pod_name = n.pod_name("oom");
    let events: Value = serde_json::from_str(&n.main_get_text("/api/v1/events").await.unwrap_or_default())
        .unwrap_or_default();
    let oom = events["items"].as_array().and_then(|items| {
        items.iter().find(|e| e["reason"] == "OOMKilling" && e["involvedObject"]["name"] == pod_name.as_str())
    });
    let oom = oom.cloned().unwrap_or_default();
    assert_eq!(oom["type"], "Warning", "{events}");
    assert_eq!(oom["involvedObject"]["uid"], uid(&pod).as_str());
    assert_eq!(oom["involvedObject"]["fieldPath"], "spec.containers{eat}");
    assert!(oom["message"].as_str().is_some_and(|m| m.contains("Container eat was OOM-killed")), "{oom}");
    n.shutdown().await;
}

/// The value and millisecond timestamp of the sample `name{labels…}` in a Prometheus text exposition.
fn timed_sample(text: &str, name: &str, labels: &[&str]) -> Option<(f64, i64)> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, rest) = l.split_once(' ')?;
        let matches = (series == name || series.starts_with(&format!("{name}{{")))
            && labels.iter().all(|want| series.contains(want));
        let mut fields = rest.split_whitespace();
        if matches { Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?)) } else { None }
    })
}

/// One reading of a cgroup straight from the kernel's files: when (ns since the epoch), cumulative CPU (ns)
/// and memory working set (usage minus inactive file pages, as the kubelet and containerd compute it).
#[derive(Debug, Clone, Copy)]
struct CgroupReading {
    at: i64,
    cpu_ns: u64,
    working_set: u64,
}

fn read_number(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_keyed(path: &std::path::Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Reads the cgroup `rel` (e.g. `/nodelet-test/pod<uid>`) under `/sys/fs/cgroup`, v1 or v2.
fn read_cgroup(rel: &str) -> Option<CgroupReading> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let rel = rel.trim_start_matches('/');
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    let at = i64::try_from(at).ok()?;
    if root.join("cgroup.controllers").exists() {
        let dir = root.join(rel);
        let cpu_ns = read_keyed(&dir.join("cpu.stat"), "usage_usec")?.checked_mul(1000)?;
        let usage = read_number(&dir.join("memory.current"))?;
        let inactive = read_keyed(&dir.join("memory.stat"), "inactive_file").unwrap_or(0);
        Some(CgroupReading { at, cpu_ns, working_set: usage.saturating_sub(inactive) })
    } else {
        let cpu_ns = read_number(&root.join("cpuacct").join(rel).join("cpuacct.usage"))?;
        let memory = root.join("memory").join(rel);
        let usage = read_number(&memory.join("memory.usage_in_bytes"))?;
        let inactive = read_keyed(&memory.join("memory.stat"), "total_inactive_file").unwrap_or(0);
        Some(CgroupReading { at, cpu_ns, working_set: usage.saturating_sub(inactive) })
    }
}

/// The readings of a cgroup taken every 20 ms by a background task, until dropped.
struct CgroupSampler {
    readings: std::sync::Arc<std::sync::Mutex<Vec<CgroupReading>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CgroupSampler {
    fn start(rel: String) -> Self {
        let readings = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = readings.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(r) = read_cgroup(&rel) {
                    out.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        CgroupSampler { readings, task }
    }

    /// The last reading at or before `at_ns - slack` and the first at or after `at_ns + slack`.
    fn around(&self, at_ns: i64, slack: Duration) -> Option<(CgroupReading, CgroupReading)> {
        let slack = i64::try_from(slack.as_nanos()).unwrap_or(i64::MAX);
        let readings = self.readings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = readings.iter().rev().find(|r| r.at <= at_ns - slack)?;
        let after = readings.iter().find(|r| r.at >= at_ns + slack)?;
        Some((*before, *after))
    }
}

impl Drop for CgroupSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Checks a cumulative CPU figure (`seconds`, read at `at_ms`) and a working set against the cgroup readings
/// around that moment: the CPU between the readings `slack` before and after (the time between the runtime's or
/// nodelet's read and the moment stamped on it), the working set within 2 MiB or 5 % of theirs.
fn check_against_cgroup(
    what: &str,
    sampler: &CgroupSampler,
    cpu: (f64, i64),
    working_set: f64,
    slack: Duration,
) {
    let (seconds, at_ms) = cpu;
    let at = at_ms * 1_000_000;
    let Some((before, after)) = sampler.around(at, slack) else {
        panic!("{what}: no cgroup readings around {at_ms} ms");
    };
    let cpu_ns = seconds * 1e9;
    let (low, high) = (before.cpu_ns as f64, after.cpu_ns as f64);
    eprintln!(
        "{what}: CPU {cpu_ns:.0} ns, cgroup {low:.0}..{high:.0} ns (±{slack:?}); working set {working_set:.0}, \
         cgroup {}..{}",
        before.working_set, after.working_set
    );
    // 1 ms of slack for the float seconds of the exposition.
    assert!(
        cpu_ns >= low - 1e6 && cpu_ns <= high + 1e6,
        "{what}: CPU {cpu_ns:.0} ns is outside the cgroup's {low:.0}..{high:.0} ns around its time"
    );
    let (low, high) =
        (before.working_set.min(after.working_set) as f64, before.working_set.max(after.working_set) as f64);
    let tolerance = (2.0 * MIB as f64).max(high * 0.05);
    assert!(
        working_set >= low - tolerance && working_set <= high + tolerance,
        "{what}: working set {working_set:.0} vs the cgroup's {low:.0}..{high:.0} (tolerance {tolerance:.0})"
    );
}

/// The pods' CPU and memory that nodelet serves come from the runtime where it serves them (containerd 2.x:
/// `ListPodSandboxStats`, with the pod's containers) and from the cgroups where it does not (containerd
/// 1.6.20, which must not be asked): either way they are the cgroups' numbers. A pod burns CPU in a busy loop
/// and holds 32 MiB; its pod and container cgroups are read every 20 ms by the test; `/metrics/resource`'s
/// cumulative CPU (with its millisecond timestamp) must lie between the cgroup readings around its time,
/// and its working set within 2 MiB or 5 %. On the 2.x runtime the runtime's own answer to
/// `ListPodSandboxStats` is held against the cgroups the same way.
#[tokio::test]
async fn pod_cpu_and_memory_are_the_cgroups_numbers_from_the_runtime_or_the_cgroups() {
    let env = env_or_skip!("pod_cpu_and_memory_are_the_cgroups_numbers_from_the_runtime_or_the_cgroups");
    let runtime_serves_them = crate::support::containerd_major() >= 2;
    let options =
        StartOptions { nodelet_extra: "housekeepingInterval: 1s".into(), ..StartOptions::default() };
    let n = Nodelet::start_with(&env, "busy", options).await;
    let script = "head -c 33554432 /dev/zero > /dev/shm/fill && while :; do :; done";
    n.write_manifest(
        "busy.yaml",
        &n.pod_manifest(
            "busy",
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "busy", "command": ["sh", "-c", script]}],
            }),
        ),
    );
    let pod = n.wait_running("busy").await;
    let pod_uid = uid(&pod);
    let pod_name = n.pod_name("busy");
    let container_id = n
        .containers_of(&pod_uid)
        .await
        .into_iter()
        .find(|c| c.state == nodelet_cri::proto::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .unwrap_or_else(|| panic!("no running container in pod {pod_uid}"));
    let pod_cgroup = format!("/{}/pod{pod_uid}", env.cgroup_parent.trim_matches('/'));
    let pod_sampler = CgroupSampler::start(pod_cgroup.clone());
    let container_sampler = CgroupSampler::start(format!("{pod_cgroup}/{container_id}"));
    let pod_label = format!("pod=\"{pod_name}\"");
    let pod_labels = ["namespace=\"default\"", pod_label.as_str()];
    let container_labels = ["container=\"busy\"", "namespace=\"default\"", pod_label.as_str()];

    // Until the 32 MiB show.
    n.wait_for("the pod's memory in /metrics/resource", Duration::from_secs(30), async || {
        let text = read_only(&n, "/metrics/resource").await;
        let ws = sample(&text, "container_memory_working_set_bytes", &container_labels)?;
        (ws >= (32 * MIB) as f64).then_some(())
    })
    .await;
    // The fill is over: the working set holds still from here on.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Three housekeeping rounds, each checked against the cgroups.
    let slack = Duration::from_millis(300);
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let text = read_only(&n, "/metrics/resource").await;
        let pod_cpu = timed_sample(&text, "pod_cpu_usage_seconds_total", &pod_labels);
        let container_cpu = timed_sample(&text, "container_cpu_usage_seconds_total", &container_labels);
        let (Some(pod_cpu), Some(container_cpu)) = (pod_cpu, container_cpu) else {
            panic!("no CPU samples of the pod:\n{text}");
        };
        if !seen.insert(pod_cpu.1) {
            continue;
        }
        // Readings after the stamped time are needed too.
        tokio::time::sleep(slack + Duration::from_millis(100)).await;
        let pod_ws = sample(&text, "pod_memory_working_set_bytes", &pod_labels).unwrap_or(-1.0);
        let container_ws =
            sample(&text, "container_memory_working_set_bytes", &container_labels).unwrap_or(-1.0);
        check_against_cgroup("pod (served)", &pod_sampler, pod_cpu, pod_ws, slack);
        check_against_cgroup("container (served)", &container_sampler, container_cpu, container_ws, slack);
    }

    let metrics = read_only(&n, "/metrics").await;
    let asked =
        sample(&metrics, "kubelet_runtime_operations_total", &["operation_type=\"list_podsandbox_stats\""]);
    let failed = sample(
        &metrics,
        "kubelet_runtime_operations_errors_total",
        &["operation_type=\"list_podsandbox_stats\""],
    );
    if runtime_serves_them {
        // The numbers served were the runtime's: asked every round, never failing.
        assert!(asked.is_some_and(|v| v >= 3.0), "ListPodSandboxStats asked {asked:?} times");
        assert_eq!(failed.unwrap_or(0.0), 0.0, "ListPodSandboxStats failed");

        // And the runtime's own answer against the cgroups, with the runtime's nanosecond timestamps.
        let filter = nodelet_cri::SandboxFilter::all().label(nodelet_cri::labels::POD_UID, pod_uid.clone());
        let answer = n.cri().list_pod_sandbox_stats(&filter).await.expect("ListPodSandboxStats");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let linux = answer.first().and_then(|s| s.linux.clone()).unwrap_or_default();
        let value = |v: &Option<nodelet_cri::proto::UInt64Value>| v.as_ref().map_or(-1.0, |v| v.value as f64);
        let (cpu, memory) = (linux.cpu.unwrap_or_default(), linux.memory.unwrap_or_default());
        let cpu_ms = cpu.timestamp / 1_000_000;
        let slack = Duration::from_millis(100);
        let pod_cpu = (value(&cpu.usage_core_nano_seconds) / 1e9, cpu_ms);
        check_against_cgroup("pod (runtime)", &pod_sampler, pod_cpu, value(&memory.working_set_bytes), slack);
        let container = linux
            .containers
            .iter()
            .find(|c| c.attributes.as_ref().is_some_and(|a| a.id == container_id))
            .cloned()
            .unwrap_or_else(|| panic!("the runtime's pod stats have no container {container_id}: {linux:?}"));
        let (cpu, memory) = (container.cpu.unwrap_or_default(), container.memory.unwrap_or_default());
        let container_cpu = (value(&cpu.usage_core_nano_seconds) / 1e9, cpu.timestamp / 1_000_000);
        let ws = value(&memory.working_set_bytes);
        check_against_cgroup("container (runtime)", &container_sampler, container_cpu, ws, slack);
    } else {
        // containerd before 1.6.22 must not be asked: the numbers served were the cgroups'.
        assert!(
            !n.cri().sandbox_stats_are_safe().await,
            "containerd {} serves sandbox stats",
            crate::support::containerd_major()
        );
        assert_eq!(asked, None, "nodelet asked an unsafe runtime for sandbox stats");
    }

    n.shutdown().await;
}

/// Without a cgroup root (nodelet's default) the pods' sandboxes have no cgroup parent, and containerd 2.x
/// fails `ListPodSandboxStats` for all of them ("failed to decode sandbox container metrics … cgroupPath is
/// empty", logged by containerd every housekeeping round): nodelet does not ask, and the pods' CPU and memory
/// are their containers' sums (`ListContainerStats`), on either runtime.
#[tokio::test]
async fn without_a_cgroup_root_pod_stats_are_the_containers_sums_and_sandbox_stats_are_not_asked() {
    let env = env_or_skip!(
        "without_a_cgroup_root_pod_stats_are_the_containers_sums_and_sandbox_stats_are_not_asked"
    );
    let options = StartOptions {
        nodelet_extra: "housekeepingInterval: 1s".into(),
        no_cgroup_root: true,
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "noroot", options).await;
    let script = "head -c 16777216 /dev/zero > /dev/shm/fill && exec sleep 3600";
    n.write_manifest(
        "noroot.yaml",
        &n.pod_manifest(
            "noroot",
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "command": ["sh", "-c", script]}],
            }),
        ),
    );
    let pod = n.wait_running("noroot").await;
    let pod_uid = uid(&pod);
    let p = n
        .wait_for("the pod's memory in the summary", Duration::from_secs(30), async || {
            let s: Value = serde_json::from_str(&read_only(&n, "/stats/summary").await).ok()?;
            let p = s["pods"].as_array()?.iter().find(|p| p["podRef"]["uid"] == pod_uid.as_str())?.clone();
            (u(&p["memory"]["workingSetBytes"]) >= 16 * MIB).then_some(p)
        })
        .await;
    let c = &p["containers"][0];
    assert_eq!(
        p["memory"]["workingSetBytes"], c["memory"]["workingSetBytes"],
        "the pod's is its container's: {p}"
    );
    assert_eq!(p["cpu"]["usageCoreNanoSeconds"], c["cpu"]["usageCoreNanoSeconds"], "{p}");
    // Rounds went by meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = read_only(&n, "/metrics").await;
    let op = ["operation_type=\"list_podsandbox_stats\""];
    assert_eq!(
        sample(&metrics, "kubelet_runtime_operations_total", &op),
        None,
        "ListPodSandboxStats was asked"
    );
    let listed =
        sample(&metrics, "kubelet_runtime_operations_total", &["operation_type=\"list_container_stats\""]);
    assert!(listed.is_some_and(|v| v >= 2.0), "ListContainerStats asked {listed:?} times");
    let failed = sample(
        &metrics,
        "kubelet_runtime_operations_errors_total",
        &["operation_type=\"list_container_stats\""],
    );
    assert_eq!(failed.unwrap_or(0.0), 0.0, "ListContainerStats failed");
    n.shutdown().await;
}

/// containerd 2.x fails `ListPodSandboxStats` for a sandbox without a cgroup parent (a nodelet without a
/// cgroup root) and logs each failed call at error level: containerd's log filled with one such line per
/// housekeeping round. A nodelet without a cgroup root does not ask for sandbox stats (the pod's numbers are
/// its containers' sums), and after any failed call it waits a back-off (a minute at first, unit-tested in
/// `sandbox_stats_backoff`); so containerd logs no such failure for nodelet's sandbox, here over ten rounds
/// of a second. containerd 1.6.20 is never asked (`sandbox_stats_are_safe`).
#[tokio::test]
async fn a_runtime_whose_sandbox_stats_fail_is_not_asked_again_at_every_housekeeping_round() {
    const TEST: &str = "a_runtime_whose_sandbox_stats_fail_is_not_asked_again_at_every_housekeeping_round";
    let env = env_or_skip!(TEST);
    let log = std::path::PathBuf::from(std::env::var("NODELET_TEST_CONTAINERD_LOG").unwrap_or_else(|_| {
        panic!("{TEST}: NODELET_TEST_CONTAINERD_LOG is unset: source the runtime's env.sh")
    }));
    let major = crate::support::containerd_major();
    let options = StartOptions {
        nodelet_extra: "housekeepingInterval: 1s".into(),
        no_cgroup_root: true,
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "sbstats", options).await;
    n.write_manifest(
        "sbstats.yaml",
        &n.pod_manifest(
            "sbstats",
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "command": crate::support::sleep_until_term("")}],
            }),
        ),
    );
    let pod = n.wait_running("sbstats").await;
    let pod_uid = uid(&pod);
    let sandbox = n.sandboxes_of(&pod_uid).await.first().map(|s| s.id.clone()).expect("a sandbox");
    // ten housekeeping rounds, and a summary that shows the pod
    tokio::time::sleep(Duration::from_secs(10)).await;
    let summary: Value = serde_json::from_str(&read_only(&n, "/stats/summary").await).expect("JSON summary");
    let pods = summary["pods"].as_array().cloned().unwrap_or_default();
    assert!(
        pods.iter().any(|p| p["podRef"]["uid"] == pod_uid.as_str()),
        "the pod is in the summary: {summary}"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let failed = text
        .lines()
        .filter(|l| l.contains("ListPodSandboxStats failed") && l.contains(sandbox.as_str()))
        .count();
    assert_eq!(
        failed,
        0,
        "containerd {major}.x logged failed ListPodSandboxStats calls for sandbox {sandbox} (nodelet log:\n{})",
        n.log_tail(20)
    );
    n.shutdown().await;
}

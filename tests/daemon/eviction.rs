//! Node pressure on the real runtime:
//!
//! - **memory**: a hard `memory.available` threshold set 1.5Gi below what nodelet sees available (a margin
//!   for what else runs on the machine), a pod that allocates 3Gi (safe with the 6Gi the test asks to be
//!   available): it is evicted (Failed,
//!   `Evicted`, the kubelet's message), the node reports `MemoryPressure`, BestEffort pods are refused while
//!   other pods are admitted, a critical pod is left alone;
//! - **disk and images**: nodelet's root directory on a 96 MiB ext4 loop filesystem, with nodelet's own
//!   containerd under it (so nodefs and imagefs are that small filesystem and image GC touches no image other
//!   tests use): unused images are garbage collected LRU-first while images in use stay, then a pod filling
//!   an emptyDir brings `DiskPressure`, is evicted, its emptyDir is released, new pods are refused, and the
//!   condition clears after the transition period;
//! - **node status**: `/api/v1/nodes/<node>` shows the machine as the test reads it itself (CPUs, memory,
//!   the root filesystem's size, boot id), allocatable as capacity minus the hard eviction thresholds,
//!   the node's addresses and port, and `nodelet get nodes -o wide` shows them.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodelet_cri::{CriClient, CriConfig};
use serde_json::{Value, json};

use crate::support::{Nodelet, StartOptions, TOKEN, condition, env_or_skip, phase};

const MI: u64 = 1 << 20;

/// `GET path` on the read-only port, as JSON.
async fn get_json(n: &Nodelet, path: &str) -> Value {
    let Some(body) = n.main_get_text(path).await else { panic!("GET {path} on the main port: no answer") };
    match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => panic!("GET {path}: not JSON: {e}: {body}"),
    }
}

/// The status (`True`/`False`) of the node condition `kind` on `/api/v1/nodes/<node>`.
async fn node_condition(n: &Nodelet, kind: &str) -> String {
    let node = get_json(n, &format!("/api/v1/nodes/{}", n.node())).await;
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The value of the series `series` (name with labels, as exposed) on `/metrics`.
async fn metric(n: &Nodelet, series: &str) -> Option<f64> {
    let url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let text = n.http().get(&url).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `(phase, reason, message)` of a pod's status.
fn verdict(pod: &Pod) -> (String, String, String) {
    let s = pod.status.clone().unwrap_or_default();
    (phase(pod).to_owned(), s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

/// A container that runs `script` in `sh` and then sleeps; it exits on SIGTERM.
fn sh(name: &str, script: &str) -> Value {
    let script = format!("trap 'exit 0' TERM; {script}; while true; do sleep 1 & wait $!; done");
    json!({"name": name, "command": ["sh", "-c", script]})
}

async fn has_sandbox(n: &Nodelet, pod: &Pod) -> bool {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    !n.sandboxes_of(&uid).await.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_evicts_the_pod_over_its_request_and_refuses_best_effort_pods() {
    let env = env_or_skip!("memory_pressure_evicts_the_pod_over_its_request_and_refuses_best_effort_pods");
    let options =
        StartOptions { nodelet_extra: "evictionMonitoringPeriod: 1s".into(), ..StartOptions::default() };
    let mut n = Nodelet::start_with(&env, "mem", options).await;
    // What nodelet counts as available memory now; the threshold goes 1.5Gi below it.
    let summary = get_json(&n, "/stats/summary").await;
    let available = summary["node"]["memory"]["availableBytes"].as_u64().unwrap_or_else(|| {
        panic!("/stats/summary has no node.memory.availableBytes: {summary}");
    });
    assert!(available > 6144 * MI, "the test needs 6Gi of free memory, nodelet sees {available} bytes");
    let threshold = (available - 1536 * MI) / MI;
    let config = std::fs::read_to_string(n.config_path()).unwrap_or_default().replace(
        "evictionHard: {memory.available: 100Mi}",
        &format!("evictionHard: {{memory.available: {threshold}Mi}}\nevictionPressureTransitionPeriod: 15s"),
    );
    assert!(config.contains(&format!("{threshold}Mi")), "{config}");
    if let Err(e) = std::fs::write(n.config_path(), config) {
        panic!("cannot rewrite the config: {e}");
    }
    n.stop().await;
    n.start_again().await;
    assert_eq!(node_condition(&n, "MemoryPressure").await, "False");

    // A critical pod, a pod within its request, and a BestEffort pod that allocates 3Gi after 3 s (dd holds
    // its buffer while it waits to write it into a pipe nobody reads).
    let critical = json!({"priorityClassName": "system-node-critical", "containers": [sh("app", "true")]});
    n.write_manifest("critical.yaml", &n.pod_manifest("critical", critical));
    let mut steady = sh("app", "true");
    steady["resources"] = json!({"requests": {"memory": "64Mi"}});
    n.write_manifest("steady.yaml", &n.pod_manifest("steady", json!({"containers": [steady]})));
    let hog = sh("app", "sleep 3; for i in 1 2 3; do dd if=/dev/zero bs=1000M count=1 | sleep 3600 & done");
    n.write_manifest("hog.yaml", &n.pod_manifest("hog", json!({"containers": [hog]})));

    let evicted =
        n.wait_for_pod("hog", "evicted", Duration::from_secs(60), |p| verdict(p).1 == "Evicted").await;
    let (phase_, _, message) = verdict(&evicted);
    assert_eq!(phase_, "Failed");
    assert!(
        message
            .starts_with(&format!("The node was low on resource: memory. Threshold quantity: {threshold}Mi")),
        "{message}"
    );
    assert!(message.contains("Container app was using") && message.contains("request is 0"), "{message}");
    assert!(
        condition(&evicted, "DisruptionTarget")
            .is_some_and(|c| c.reason.as_deref() == Some("TerminationByKubelet")),
        "{evicted:?}"
    );
    assert_eq!(node_condition(&n, "MemoryPressure").await, "True");
    // The same NodeList on the main port (authenticated), and 404 for another node's name.
    let https = n.main_client();
    let url = n.main_url("/api/v1/nodes");
    let list: Value = match https.get(&url).bearer_auth(TOKEN).send().await {
        Ok(r) => serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or_default(),
        Err(e) => panic!("GET {url}: {e}"),
    };
    let conditions = &list["items"][0]["status"]["conditions"];
    let pressure = conditions.as_array().into_iter().flatten().find(|c| c["type"] == "MemoryPressure");
    assert_eq!(pressure.map(|c| c["status"].clone()), Some(json!("True")), "{list}");
    assert_eq!(pressure.map(|c| c["reason"].clone()), Some(json!("KubeletHasInsufficientMemory")));
    let url = n.main_url("/api/v1/nodes/no-such-node");
    let status = https.get(&url).bearer_auth(TOKEN).send().await.map(|r| r.status().as_u16()).unwrap_or(0);
    assert_eq!(status, 404, "GET {url}");
    // The hog's containers are killed and not started again.
    n.wait_for_pod("hog", "no container running", Duration::from_secs(30), |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_none())))
    })
    .await;

    // Under memory pressure: a BestEffort pod is refused, a Burstable one is admitted.
    n.write_manifest("late-be.yaml", &n.pod_manifest("late-be", json!({"containers": [sh("app", "true")]})));
    let mut late = sh("app", "true");
    late["resources"] = json!({"requests": {"memory": "16Mi"}});
    n.write_manifest("late-bu.yaml", &n.pod_manifest("late-bu", json!({"containers": [late]})));
    let refused =
        n.wait_for_pod("late-be", "refused", Duration::from_secs(20), |p| phase(p) == "Failed").await;
    assert_eq!(
        verdict(&refused),
        ("Failed".into(), "Evicted".into(), "The node had condition: [MemoryPressure]. ".into())
    );
    assert!(!has_sandbox(&n, &refused).await, "a refused pod never gets a sandbox");
    n.wait_running("late-bu").await;
    for name in ["critical", "steady"] {
        let p = n.pod(name).await.unwrap_or_else(|| panic!("{name} is gone"));
        assert_eq!(phase(&p), "Running", "{name} must not be evicted: {:?}", verdict(&p));
    }

    // What users see: the node's conditions, the metric, the event.
    let table = n.cli_main(&["get", "nodes"]).await;
    assert!(table.contains(n.node()) && table.contains("MemoryPressure"), "{table}");
    assert_eq!(metric(&n, "kubelet_evictions_total{eviction_signal=\"memory.available\"}").await, Some(1.0));
    let events = get_json(&n, "/api/v1/events").await;
    let evicted_event = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == n.pod_name("hog").as_str());
    assert!(evicted_event, "an Evicted event for the hog: {events}");

    // The pressure is gone with the hog: the condition clears after the transition period.
    n.wait_for("MemoryPressure to clear", Duration::from_secs(60), async || {
        (node_condition(&n, "MemoryPressure").await == "False").then_some(())
    })
    .await;
    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------- disk and images

/// A small ext4 filesystem on a loop device, mounted at `mountpoint`; unmounted (lazily if busy) on drop.
struct LoopFs {
    image: PathBuf,
    mountpoint: PathBuf,
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(cmd).args(args).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("{cmd} {args:?}: {}: {}", o.status, String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("{cmd}: {e}")),
    }
}

impl LoopFs {
    fn mount(dir: &Path, size_mib: u64) -> Result<LoopFs, String> {
        let image = dir.join("fs.img");
        let mountpoint = dir.join("root");
        std::fs::create_dir_all(&mountpoint).map_err(|e| e.to_string())?;
        let file = std::fs::File::create(&image).map_err(|e| e.to_string())?;
        file.set_len(size_mib * MI).map_err(|e| e.to_string())?;
        let (img, mnt) = (image.display().to_string(), mountpoint.display().to_string());
        // -m 0: no blocks reserved for root, so free and available space agree.
        run("mkfs.ext4", &["-q", "-F", "-m", "0", &img])?;
        run("mount", &["-o", "loop", &img, &mnt])?;
        Ok(LoopFs { image, mountpoint })
    }

    fn available(&self) -> u64 {
        rustix::fs::statvfs(&self.mountpoint).map_or(0, |s| s.f_bavail * s.f_frsize)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let mnt = self.mountpoint.display().to_string();
        // Still busy (a process exiting, a test that panicked): detach it now, freed once unused.
        if run("umount", &[&mnt]).is_err()
            && let Err(e) = run("umount", &["-l", &mnt])
        {
            eprintln!("cannot unmount {mnt}: {e}");
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// The image references (tags) the runtime at `endpoint` holds.
async fn image_tags(endpoint: &str) -> Vec<String> {
    let cri = match CriClient::connect(CriConfig::new(endpoint.to_owned())).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to {endpoint}: {e}"),
    };
    match cri.list_images(None).await {
        Ok(images) => images.into_iter().flat_map(|i| i.repo_tags).collect(),
        Err(e) => panic!("ListImages on {endpoint}: {e}"),
    }
}

fn mounted_as_root() -> bool {
    rustix::process::geteuid().is_root() && Path::new("/dev/loop-control").exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_pressure_collects_unused_images_then_evicts_the_pod_filling_the_disk() {
    let env = env_or_skip!("disk_pressure_collects_unused_images_then_evicts_the_pod_filling_the_disk");
    let Some(registry_image) = std::env::var("NODELET_TEST_REGISTRY_BUSYBOX2").ok().filter(|s| !s.is_empty())
    else {
        panic!("NODELET_TEST_REGISTRY_BUSYBOX2 is unset: source /tmp/nodelet-test/env.sh");
    };
    let images = PathBuf::from(std::env::var("NODELET_TEST_IMAGE_DIR").unwrap_or_default());
    if !mounted_as_root() {
        if std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1") {
            panic!("this test mounts a loop filesystem: it needs root and /dev/loop-control");
        }
        eprintln!("SKIP: not root or no loop devices");
        return;
    }
    let dir = match tempfile::Builder::new().prefix("nodelet-e2e-disk-").tempdir() {
        Ok(d) => d,
        Err(e) => panic!("cannot create a temporary directory: {e}"),
    };
    // Only the sandbox and busybox images are preloaded; busybox:v2 comes from the local registry.
    let preload = dir.path().join("images");
    let _ = std::fs::create_dir_all(&preload);
    for tar in ["pause.tar", "busybox.tar"] {
        if let Err(e) = std::fs::copy(images.join(tar), preload.join(tar)) {
            panic!("cannot copy {tar} from {}: {e} (NODELET_TEST_IMAGE_DIR)", images.display());
        }
    }
    let fs = match LoopFs::mount(dir.path(), 96) {
        Ok(fs) => fs,
        Err(e) => panic!("cannot make the loop filesystem: {e}"),
    };
    let options = StartOptions {
        // Image GC whenever images take any space; disk pressure below 40% free.
        config_extra: "imageGCHighThresholdPercent: 1\n\
                       imageGCLowThresholdPercent: 0\n\
                       imageMinimumGCAge: 6s\n\
                       evictionHard: {nodefs.available: 40%, imagefs.available: 1%}\n\
                       evictionPressureTransitionPeriod: 4s"
            .into(),
        nodelet_extra: "imageGCPeriod: 1s\nevictionMonitoringPeriod: 1s".into(),
        root_dir: Some(fs.mountpoint.clone()),
        embedded_runtime: Some(preload),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "disk", options).await;
    let endpoint = n.endpoint().to_owned();
    assert_eq!(node_condition(&n, "DiskPressure").await, "False", "{} bytes free", fs.available());

    // Two pods on the host network (no CNI): one on busybox, one on busybox:v2 pulled from the registry.
    let host = |containers: Value| json!({"hostNetwork": true, "containers": containers});
    n.write_manifest("local.yaml", &n.pod_manifest("local", host(json!([sh("app", "true")]))));
    let mut v2 = sh("app", "true");
    v2["image"] = json!(registry_image);
    n.write_manifest("v2.yaml", &n.pod_manifest("v2", host(json!([v2]))));
    n.wait_running("local").await;
    n.wait_running("v2").await;
    let tags = image_tags(&endpoint).await;
    assert!(tags.contains(&registry_image), "{tags:?}");

    // busybox:v2 is no longer used once its pod is gone: after its minimum age, GC removes it; the image
    // in use and the sandbox image stay.
    n.remove_manifest("v2.yaml");
    n.wait_for("busybox:v2 to be garbage collected", Duration::from_secs(40), async || {
        (!image_tags(&endpoint).await.contains(&registry_image)).then_some(())
    })
    .await;
    let tags = image_tags(&endpoint).await;
    for kept in [env.busybox.as_str(), "localhost/nodelet/pause:3.9"] {
        assert!(tags.iter().any(|t| t == kept), "{kept} must stay: {tags:?}");
    }
    // The counter moves when the removal operation completes, a moment after the runtime forgot the image.
    n.wait_for("the space-reason image GC counter", Duration::from_secs(10), async || {
        (metric(&n, "kubelet_image_garbage_collected_total{reason=\"space\"}").await >= Some(1.0))
            .then_some(())
    })
    .await;

    // A pod filling an emptyDir: DiskPressure, the pod is evicted and its emptyDir released.
    let free = fs.available();
    let fill_mib = free / MI * 3 / 4;
    let filler =
        sh("app", &format!("dd if=/dev/zero of=/data/fill bs=1M count={fill_mib} 2>/dev/null; echo filled"));
    let mut spec = host(json!([filler]));
    spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    spec["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    n.write_manifest("filler.yaml", &n.pod_manifest("filler", spec));
    let evicted =
        n.wait_for_pod("filler", "evicted", Duration::from_secs(60), |p| verdict(p).1 == "Evicted").await;
    let (phase_, _, message) = verdict(&evicted);
    assert_eq!(phase_, "Failed");
    assert!(message.starts_with("The node was low on resource: ephemeral-storage."), "{message}");
    assert_eq!(node_condition(&n, "DiskPressure").await, "True");
    // Under disk pressure every new pod is refused.
    let mut late = sh("app", "true");
    late["resources"] = json!({"requests": {"memory": "16Mi"}});
    n.write_manifest("late.yaml", &n.pod_manifest("late", host(json!([late]))));
    let refused = n.wait_for_pod("late", "refused", Duration::from_secs(20), |p| phase(p) == "Failed").await;
    assert_eq!(verdict(&refused).2, "The node had condition: [DiskPressure]. ");
    // The evicted pod's emptyDir is removed: the space comes back and the condition clears.
    n.wait_for("DiskPressure to clear", Duration::from_secs(40), async || {
        (node_condition(&n, "DiskPressure").await == "False").then_some(())
    })
    .await;
    assert!(fs.available() > free / 2, "the emptyDir was released: {} bytes free", fs.available());
    let local = n.pod("local").await.unwrap_or_else(|| panic!("local is gone"));
    assert_eq!(phase(&local), "Running", "only one pod is evicted: {:?}", verdict(&local));
    assert_eq!(metric(&n, "kubelet_evictions_total{eviction_signal=\"nodefs.available\"}").await, Some(1.0));
    n.shutdown().await;
    drop(fs);
}

// ------------------------------------------------------------------------------------------- node status

/// A quantity as a number (bytes, CPUs, pods): `110`, `16389712Ki`, `2Mi`, `1k`.
fn quantity(q: &Value) -> u64 {
    let Some(s) = q.as_str() else { panic!("not a quantity: {q}") };
    let units: [(&str, u64); 7] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (number, unit) =
        units.iter().find_map(|(suffix, m)| Some((s.strip_suffix(suffix)?, *m))).unwrap_or((s, 1));
    match number.parse::<u64>() {
        Ok(n) => n * unit,
        Err(e) => panic!("quantity {s:?}: {e}"),
    }
}

fn read_trimmed(path: &str) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) => s.trim().to_owned(),
        Err(e) => panic!("cannot read {path}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_shows_the_machines_capacity_allocatable_addresses_and_system_info() {
    let env = env_or_skip!("node_status_shows_the_machines_capacity_allocatable_addresses_and_system_info");
    // An absolute memory threshold and a percentage of the root filesystem (small: the shared disk may be
    // nearly full, and disk pressure would make nodelet reclaim images other tests use).
    let options = StartOptions {
        config_extra: "evictionHard: {memory.available: 100Mi, nodefs.available: 1%}".into(),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "node-status", options).await;
    let node = get_json(&n, &format!("/api/v1/nodes/{}", n.node())).await;
    let status = &node["status"];
    eprintln!("node status: {}", serde_json::to_string_pretty(status).unwrap_or_default());
    let capacity = &status["capacity"];
    let allocatable = &status["allocatable"];

    // Capacity: what the test reads from the machine itself.
    let nproc =
        match Command::new("nproc").env_remove("OMP_NUM_THREADS").env_remove("OMP_THREAD_LIMIT").output() {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            other => panic!("nproc: {other:?}"),
        };
    assert_eq!(capacity["cpu"], json!(nproc), "{status}");
    let mem_total_kib: u64 = read_trimmed("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no MemTotal in /proc/meminfo"));
    assert_eq!(quantity(&capacity["memory"]), mem_total_kib * 1024, "{status}");
    assert_eq!(capacity["pods"], json!("110"));
    let fs = match rustix::fs::statvfs(n.root_dir()) {
        Ok(fs) => fs,
        Err(e) => panic!("statvfs {}: {e}", n.root_dir().display()),
    };
    let storage = fs.f_blocks * fs.f_frsize;
    assert_eq!(quantity(&capacity["ephemeral-storage"]), storage, "{status}");
    let hugepages: u64 = capacity
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("hugepages-"))
        .map(|(_, v)| quantity(v))
        .sum();
    assert!(capacity.get("hugepages-2Mi").is_some() || capacity.get("hugepages-1Gi").is_some(), "{status}");

    // Allocatable: capacity minus the hard thresholds (1% as the kubelet computes it, a float32 fraction),
    // memory minus the huge pages too.
    assert_eq!(quantity(&allocatable["memory"]), mem_total_kib * 1024 - 100 * MI - hugepages, "{status}");
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let one_percent = (storage as f64 * f64::from(0.01_f32)) as u64;
    assert_eq!(quantity(&allocatable["ephemeral-storage"]), storage - one_percent, "{status}");
    assert_eq!(allocatable["cpu"], capacity["cpu"]);
    assert_eq!(allocatable["pods"], capacity["pods"]);

    // Addresses: the node name, and one of the machine's own IPv4 addresses.
    let addresses = status["addresses"].as_array().cloned().unwrap_or_default();
    let of_type = |t: &str| {
        addresses
            .iter()
            .find(|a| a["type"] == t)
            .and_then(|a| a["address"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(of_type("Hostname"), n.node(), "{status}");
    let internal_ip = of_type("InternalIP");
    let ip: Ipv4Addr =
        internal_ip.parse().unwrap_or_else(|e| panic!("InternalIP {internal_ip:?}: {e}: {status}"));
    assert!(!ip.is_loopback(), "{status}");
    assert!(
        read_trimmed("/proc/net/fib_trie").contains(&format!("|-- {ip}\n")),
        "{ip} is not this machine's"
    );

    // System information and the main port.
    let info = &status["nodeInfo"];
    assert_eq!(info["bootID"], json!(read_trimmed("/proc/sys/kernel/random/boot_id")));
    assert_eq!(info["kernelVersion"], json!(read_trimmed("/proc/sys/kernel/osrelease")));
    if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
        assert_eq!(info["machineID"], json!(id.trim()));
    }
    let os_image = info["osImage"].as_str().unwrap_or_default().to_owned();
    assert!(!os_image.is_empty() && read_trimmed("/etc/os-release").contains(&os_image), "{status}");
    let runtime = info["containerRuntimeVersion"].as_str().unwrap_or_default().to_owned();
    assert!(runtime.starts_with("containerd://") && runtime.len() > "containerd://".len(), "{status}");
    assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], json!(n.ports().main));

    // The same on the main port.
    let url = n.main_url("/api/v1/nodes");
    let list: Value = match n.main_client().get(&url).bearer_auth(TOKEN).send().await {
        Ok(r) => serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or_default(),
        Err(e) => panic!("GET {url}: {e}"),
    };
    assert_eq!(list["items"][0]["status"]["capacity"], *capacity, "{list}");
    assert_eq!(list["items"][0]["status"]["addresses"], status["addresses"], "{list}");

    // What a user sees: kubectl's columns, and the wide ones.
    let table = n.cli_main(&["get", "nodes"]).await;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "PRESSURE"], "{table}");
    let wide = n.cli_main(&["get", "nodes", "-o", "wide"]).await;
    let mut lines = wide.lines();
    let header = lines.next().unwrap_or_default();
    let row = lines.next().unwrap_or_default();
    for h in ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"] {
        assert!(header.contains(h), "{wide}");
    }
    for cell in [n.node(), internal_ip.as_str(), os_image.as_str(), runtime.as_str()] {
        assert!(row.contains(cell), "{cell:?} in {wide}");
    }
    assert!(row.contains(&read_trimmed("/proc/sys/kernel/osrelease")), "{wide}");
    n.shutdown().await;
}

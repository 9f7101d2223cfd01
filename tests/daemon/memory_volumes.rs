//! Memory-backed volumes on the real runtime, as the kubelet backs them:
//!
//! - secret, downwardAPI and projected volumes are each a tmpfs on the host (a configMap stays on
//!   disk), sized to the pod's memory limit, with the right content, the `..data` swap on update,
//!   and no mount left after the pod is removed;
//! - a big projected volume does not count towards the pod's local ephemeral storage: its pod, with
//!   an `ephemeral-storage` limit smaller than the volume, is not evicted, while `/stats/summary`
//!   reports the volume's used bytes from the background volume measurement (`volumeStatsAggPeriod`
//!   set short), and the bytes a pod writes into an emptyDir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    Nodelet, StartOptions, container, env_or_skip, phase, runtime_id, sleep_until_term, uid,
};

const MI: u64 = 1 << 20;

const OBJECTS: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: default}
data:
  greeting: GREETING
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret, namespace: default}
data:
  token: c2VjcmV0LXRva2Vu
"#;

/// The filesystem type and super options of the mount at `path`, from this process's mount table
/// (`None` when `path` is not a mount point).
fn mount_at(path: &Path) -> Option<(String, String)> {
    let path = path.to_string_lossy().into_owned();
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (left.split(' ').nth(4)? == path).then_some(())?;
        let mut fields = right.split(' ');
        let fstype = fields.next()?.to_owned();
        let options = fields.nth(1)?.to_owned();
        Some((fstype, options))
    })
}

/// The mount points at or beneath `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_owned))
        .filter(|p| *p == dir || p.starts_with(&format!("{dir}/")))
        .collect()
}

fn volume_dir(n: &Nodelet, uid: &str, plugin: &str, name: &str) -> PathBuf {
    n.root_dir().join("pods").join(uid).join("volumes").join(plugin).join(name)
}

/// `GET path` on the read-only port, as JSON (`Null` when unreadable).
async fn get_json(n: &Nodelet, path: &str) -> Value {
    match n.main_get_text(path).await {
        Some(body) => serde_json::from_str(&body).unwrap_or_default(),
        None => Value::Null,
    }
}

/// The value of the series `series` (name with labels, as exposed) on `/metrics`.
async fn metric(n: &Nodelet, series: &str) -> Option<f64> {
    let url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let text = n.http().get(&url).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_downward_api_and_projected_volumes_are_a_tmpfs_of_the_pods_memory_limit_and_go_with_the_pod()
{
    let env = env_or_skip!(
        "secret_downward_api_and_projected_volumes_are_a_tmpfs_of_the_pods_memory_limit_and_go_with_the_pod"
    );
    let n = Nodelet::start(&env, "memvol").await;
    n.write_manifest_text("objects.yaml", &OBJECTS.replace("GREETING", "hello-v1"));
    n.write_manifest(
        "memvol.yaml",
        &n.pod_manifest(
            "memvol",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "app-config"}},
                    {"name": "sec", "secret": {"secretName": "app-secret"}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    ]}},
                    {"name": "all", "projected": {"sources": [
                        {"configMap": {"name": "app-config"}},
                        {"secret": {"name": "app-secret"}},
                        {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                    ]}},
                ],
                "containers": [{
                    "name": "app",
                    "command": sleep_until_term(""),
                    "resources": {"limits": {"memory": "64Mi"}},
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/cfg"},
                        {"name": "sec", "mountPath": "/sec"},
                        {"name": "info", "mountPath": "/info"},
                        {"name": "all", "mountPath": "/all"},
                    ],
                }],
            }),
        ),
    );
    let pod = n.wait_running("memvol").await;
    let pod_uid = uid(&pod);
    let id = runtime_id(container(&pod, "app").unwrap_or_else(|| panic!("no status of container app")));

    // On the host: a tmpfs of the pod's memory limit (64Mi) under each, filled through the `..data` swap;
    // the configMap on disk.
    for (plugin, name) in [
        ("kubernetes.io~secret", "sec"),
        ("kubernetes.io~downward-api", "info"),
        ("kubernetes.io~projected", "all"),
    ] {
        let dir = volume_dir(&n, &pod_uid, plugin, name);
        let (fstype, options) =
            mount_at(&dir).unwrap_or_else(|| panic!("{} is not a mount point", dir.display()));
        assert_eq!(fstype, "tmpfs", "{}", dir.display());
        assert!(options.split(',').any(|o| o == "size=65536k"), "{}: {options}", dir.display());
        let data = std::fs::read_link(dir.join("..data"))
            .unwrap_or_else(|e| panic!("{}: ..data: {e}", dir.display()));
        assert!(data.to_string_lossy().starts_with("..20"), "{}", data.display());
    }
    assert_eq!(mount_at(&volume_dir(&n, &pod_uid, "kubernetes.io~configmap", "cfg")), None);

    // In the container: the content, read-only.
    let read = async |path: &str| n.exec(&id, &["cat", path]).await;
    assert_eq!(read("/sec/token").await, (0, "secret-token".to_owned()));
    assert_eq!(read("/info/name").await, (0, n.pod_name("memvol")));
    assert_eq!(read("/all/greeting").await, (0, "hello-v1".to_owned()));
    assert_eq!(read("/all/token").await, (0, "secret-token".to_owned()));
    assert_eq!(read("/all/ns").await, (0, "default".to_owned()));
    let (code, _) = n.exec(&id, &["touch", "/all/new"]).await;
    assert_ne!(code, 0, "a projected volume was writable");

    // An update of the ConfigMap reaches the projected volume on its tmpfs, without a restart.
    n.write_manifest_text("objects.yaml", &OBJECTS.replace("GREETING", "hello-v2"));
    n.wait_for("the updated greeting in the projected volume", Duration::from_secs(30), async || {
        (read("/all/greeting").await.1 == "hello-v2").then_some(())
    })
    .await;
    let dir = volume_dir(&n, &pod_uid, "kubernetes.io~projected", "all");
    assert!(mount_at(&dir).is_some_and(|(t, _)| t == "tmpfs"), "still one tmpfs after the update");
    let pod = n.pod("memvol").await.unwrap_or_else(|| panic!("pod listed"));
    assert_eq!(container(&pod, "app").map(|c| c.restart_count), Some(0));

    // Removed: no mount and no directory of the pod is left.
    n.remove_manifest("memvol.yaml");
    let pod_dir = n.root_dir().join("pods").join(&pod_uid);
    n.wait_for("the pod and its directory gone", Duration::from_secs(60), async || {
        (n.pod("memvol").await.is_none() && !pod_dir.exists()).then_some(())
    })
    .await;
    assert_eq!(mounts_under(&n.root_dir()), Vec::<String>::new(), "leaked mounts");
    n.shutdown().await;
}

/// Three ConfigMaps of `bytes` each (keys `blob1`, `blob2`, `blob3`).
fn big_config_maps(bytes: usize) -> String {
    let blob = "a".repeat(bytes);
    (1..=3)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big-{i}, namespace: default}}\ndata:\n  blob{i}: {blob}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_projected_volume_is_not_local_storage_and_the_summary_reports_measured_volumes() {
    let env =
        env_or_skip!("a_big_projected_volume_is_not_local_storage_and_the_summary_reports_measured_volumes");
    let options = StartOptions {
        config_extra: "volumeStatsAggPeriod: 1s".into(),
        nodelet_extra: "evictionMonitoringPeriod: 1s\nhousekeepingInterval: 1s".into(),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "bigproj", options).await;
    n.write_manifest_text("big.yaml", &big_config_maps(900_000));
    // ~2.7 MB of projected files against a 1Mi ephemeral-storage limit: on disk, it would be evicted.
    n.write_manifest(
        "bigproj.yaml",
        &n.pod_manifest(
            "bigproj",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "big", "projected": {"sources": [
                    {"configMap": {"name": "big-1"}},
                    {"configMap": {"name": "big-2"}},
                    {"configMap": {"name": "big-3"}},
                ]}}],
                "containers": [{
                    "name": "app",
                    "command": sleep_until_term(""),
                    "resources": {"limits": {"ephemeral-storage": "1Mi", "memory": "64Mi"}},
                    "volumeMounts": [{"name": "big", "mountPath": "/big"}],
                }],
            }),
        ),
    );
    // A pod that writes 3 MiB into an emptyDir a few seconds after it starts.
    n.write_manifest(
        "writer.yaml",
        &n.pod_manifest(
            "writer",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{
                    "name": "app",
                    "command": sleep_until_term("sleep 3; head -c 3145728 /dev/zero > /scratch/fill; "),
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
            }),
        ),
    );
    let big_uid = uid(&n.wait_running("bigproj").await);
    let writer_uid = uid(&n.wait_running("writer").await);
    let volume_used = |summary: &Value, pod_uid: &str, name: &str| -> Option<u64> {
        let pod = summary["pods"].as_array()?.iter().find(|p| p["podRef"]["uid"] == pod_uid)?;
        pod["volume"].as_array()?.iter().find(|v| v["name"] == name)?["usedBytes"].as_u64()
    };
    // The summary reports both volumes, measured in the background.
    let summary = n
        .wait_for("the summary to report both volumes' used bytes", Duration::from_secs(30), async || {
            let s = get_json(&n, "/stats/summary").await;
            let big = volume_used(&s, &big_uid, "big")?;
            let scratch = volume_used(&s, &writer_uid, "scratch")?;
            (big >= 2_700_000 && scratch >= 3 * MI).then_some(s)
        })
        .await;
    // The projected volume is memory: the pod's ephemeral storage is its logs and writable layer only.
    let pod = summary["pods"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["podRef"]["uid"] == big_uid.as_str()))
        .cloned()
        .unwrap_or_default();
    let ephemeral = pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap_or(0);
    assert!(ephemeral < MI, "ephemeral storage {ephemeral} counts the projected volume: {pod}");
    // Several eviction and measurement periods later, it still runs.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pod = n.pod("bigproj").await.unwrap_or_else(|| panic!("the pod is gone"));
    assert_eq!(phase(&pod), "Running", "{:?}", pod.status);
    assert_eq!(
        metric(&n, "kubelet_evictions_total{eviction_signal=\"ephemeralpodfs.limit\"}").await,
        Some(0.0)
    );
    n.shutdown().await;
}

//! Local storage capacity isolation on the real runtime (`localStorageCapacityIsolation`), with the
//! eviction pair sampling every second:
//!
//! - a pod writing 4 MiB into an emptyDir with `sizeLimit: 1Mi` is evicted (Failed, `Evicted`, the
//!   kubelet's message, an `Evicted` event, `kubelet_evictions_total{eviction_signal="emptydirfs.limit"}`,
//!   no `DisruptionTarget` condition, as the kubelet);
//! - a pod whose container (limit `ephemeral-storage: 2Mi`) writes 8 MiB into its root filesystem is
//!   evicted with the kubelet's container message (the writable layer as containerd reports it) when
//!   the writable layers are on the root directory's filesystem; on a dedicated image filesystem
//!   only the container's logs count, as in the kubelet, and it keeps running (the test finds the
//!   layout as nodelet does, through CRI `ImageFsInfo`);
//! - a pod whose two containers have 1Mi each, writing 4 MiB into an emptyDir without a `sizeLimit`, is
//!   evicted with the kubelet's pod message (the sum of the limits, 2Mi);
//! - a healthy neighbour with limits it stays within keeps running;
//! - with `localStorageCapacityIsolation: false`, the same pods keep running once `/stats/summary` shows
//!   them over their limits;
//! - a pod whose container (limit `ephemeral-storage: 1Mi`) writes 2.3 MiB as 300 small files into an
//!   emptyDir, with the measurement's entry budget set to 50 entries a pass, is evicted all the same:
//!   the walk resumes across passes until it has counted past the limit;
//! - in each case nodelet is alive at the end and its peak RSS stays under [`PEAK_RSS_MIB`].

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::support::{Nodelet, StartOptions, condition, env_or_skip, phase};

const MI: u64 = 1 << 20;

/// nodelet's peak RSS (VmHWM) bound through each case. A debug build, measured on the test machine, peaked at
/// 60 MiB in these cases (four pods measured every second; start-up is nearly all of it); 80 MiB leaves
/// room for noise while a leak or an unbounded buffer of 20 MiB fails.
const PEAK_RSS_MIB: u64 = 80;

/// The usage `/stats/summary` shows for container `container` of pod `uid`'s writable layer.
async fn rootfs_used(n: &Nodelet, uid: &str, container: &str) -> Option<u64> {
    let summary = get_json(n, "/stats/summary").await;
    let pod = summary["pods"].as_array()?.iter().find(|p| p["podRef"]["uid"] == uid)?.clone();
    pod["containers"].as_array()?.iter().find(|c| c["name"] == container)?["rootfs"]["usedBytes"].as_u64()
}

/// The value of the series `series` (name with labels, as exposed) on `/metrics`.
async fn metric(n: &Nodelet, series: &str) -> Option<f64> {
    let url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let text = n.http().get(&url).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `GET path` on the read-only port, as JSON (`Null` when unreadable).
async fn get_json(n: &Nodelet, path: &str) -> Value {
    match n.main_get_text(path).await {
        Some(body) => serde_json::from_str(&body).unwrap_or_default(),
        None => Value::Null,
    }
}

/// A container that runs `script` in `sh` and then sleeps; it exits on SIGTERM.
fn sh(name: &str, script: &str, limit: Option<&str>) -> Value {
    let script = format!("trap 'exit 0' TERM; {script}; while true; do sleep 1 & wait $!; done");
    let mut c = json!({"name": name, "command": ["sh", "-c", script]});
    if let Some(l) = limit {
        c["resources"] = json!({"limits": {"ephemeral-storage": l}});
    }
    c
}

/// An emptyDir pod: `mib` MiB written into `/data`, the volume limited to `size_limit`.
fn empty_dir_pod(n: &Nodelet, name: &str, mib: u32, size_limit: &str) -> Value {
    let mut c = sh("app", &format!("dd if=/dev/zero of=/data/fill bs=1M count={mib}"), None);
    c["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/data"}]);
    n.pod_manifest(
        name,
        json!({"containers": [c], "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": size_limit}}]}),
    )
}

/// A pod whose container `writer` (limit 2Mi) writes 8 MiB into its root filesystem, beside an idle
/// container with a large limit (so the pod's total stays within the sum of the limits).
fn rootfs_pod(n: &Nodelet, name: &str) -> Value {
    let writer = sh("writer", "dd if=/dev/zero of=/fill bs=1M count=8", Some("2Mi"));
    let idle = sh("idle", "true", Some("100Mi"));
    n.pod_manifest(name, json!({"containers": [writer, idle]}))
}

fn reason_and_message(pod: &Pod) -> (String, String, String) {
    let s = pod.status.clone().unwrap_or_default();
    (phase(pod).to_owned(), s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_their_local_storage_limits_are_evicted_and_their_neighbour_is_not() {
    let env = env_or_skip!("pods_over_their_local_storage_limits_are_evicted_and_their_neighbour_is_not");
    let options =
        StartOptions { nodelet_extra: "evictionMonitoringPeriod: 1s".into(), ..StartOptions::default() };
    let mut n = Nodelet::start_with(&env, "lsi", options).await;
    // Where the writable layers are decides whether they count for a container's limit.
    let dedicated_image_fs = n.dedicated_image_fs().await;
    assert_eq!(metric(&n, "kubelet_evictions_total{eviction_signal=\"emptydirfs.limit\"}").await, Some(0.0));

    // The neighbour stays within its limits: 1 MiB in a 10Mi emptyDir, a 50Mi container limit.
    let mut neighbour = empty_dir_pod(&n, "neighbour", 1, "10Mi");
    neighbour["spec"]["containers"][0]["resources"] = json!({"limits": {"ephemeral-storage": "50Mi"}});
    n.write_manifest("neighbour.yaml", &neighbour);
    n.write_manifest("scratch.yaml", &empty_dir_pod(&n, "scratch", 4, "1Mi"));
    n.write_manifest("rootfs.yaml", &rootfs_pod(&n, "rootfs"));
    let mut filler = sh("filler", "dd if=/dev/zero of=/data/fill bs=1M count=4", Some("1Mi"));
    filler["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/data"}]);
    let total = json!({
        "containers": [filler, sh("idle", "true", Some("1Mi"))],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    });
    n.write_manifest("total.yaml", &n.pod_manifest("total", total));
    let neighbour_before = n.wait_running("neighbour").await;

    let evicted = |p: &Pod| reason_and_message(p).1 == "Evicted";
    let scratch = n.wait_for_pod("scratch", "evicted", Duration::from_secs(30), evicted).await;
    assert_eq!(
        reason_and_message(&scratch),
        (
            "Failed".into(),
            "Evicted".into(),
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ".into()
        )
    );
    assert!(condition(&scratch, "DisruptionTarget").is_none(), "the kubelet sets none here: {scratch:?}");

    let total = n.wait_for_pod("total", "evicted", Duration::from_secs(30), evicted).await;
    assert_eq!(
        reason_and_message(&total),
        (
            "Failed".into(),
            "Evicted".into(),
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. ".into()
        )
    );

    // containerd refreshes the writable layers' usage every 10 s (stats_collect_period).
    let mut gone = vec!["scratch", "total"];
    if dedicated_image_fs {
        // Only the logs count: the 8 MiB in the writable layer, measured, evict nothing.
        let rootfs_uid = uid(&n, "rootfs").await;
        n.wait_for("the writer's 8 MiB in /stats/summary", Duration::from_secs(45), async || {
            rootfs_used(&n, &rootfs_uid, "writer").await.filter(|b| *b >= 8 * MI)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rootfs = n.pod("rootfs").await.unwrap_or_else(|| panic!("rootfs is gone"));
        assert_eq!(
            phase(&rootfs),
            "Running",
            "on a dedicated image filesystem: {:?}",
            reason_and_message(&rootfs)
        );
    } else {
        let rootfs = n.wait_for_pod("rootfs", "evicted", Duration::from_secs(45), evicted).await;
        assert_eq!(
            reason_and_message(&rootfs),
            (
                "Failed".into(),
                "Evicted".into(),
                "Container writer exceeded its local ephemeral storage limit \"2Mi\". ".into()
            ),
            "the writable layers are on nodelet's root filesystem, so the writable layer counts"
        );
        gone.push("rootfs");
    }
    // Their containers are stopped, and not started again.
    for name in gone {
        n.wait_for_pod(name, "no container running", Duration::from_secs(30), |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_none())))
        })
        .await;
    }

    // What users see: the metric by limit, the events.
    let container_evictions = if dedicated_image_fs { 0.0 } else { 1.0 };
    for (signal, count) in [
        ("emptydirfs.limit", 1.0),
        ("ephemeralcontainerfs.limit", container_evictions),
        ("ephemeralpodfs.limit", 1.0),
    ] {
        let series = format!("kubelet_evictions_total{{eviction_signal=\"{signal}\"}}");
        assert_eq!(metric(&n, &series).await, Some(count), "{series}");
    }
    let events = get_json(&n, "/api/v1/events").await;
    let mut expected = vec![("scratch", "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")];
    if !dedicated_image_fs {
        expected.push(("rootfs", "Container writer exceeded its local ephemeral storage limit \"2Mi\". "));
    }
    for (name, message) in expected {
        let found = events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "Evicted"
                && e["type"] == "Warning"
                && e["message"] == message
                && e["involvedObject"]["name"] == n.pod_name(name).as_str()
        });
        assert!(found, "an Evicted event for {name}: {events}");
    }
    n.assert_untouched("neighbour", &neighbour_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "pods over their local storage limits");
    n.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_local_storage_capacity_isolation_nothing_is_evicted() {
    let env = env_or_skip!("without_local_storage_capacity_isolation_nothing_is_evicted");
    let options = StartOptions {
        config_extra: "localStorageCapacityIsolation: false\nvolumeStatsAggPeriod: 1s".into(),
        nodelet_extra: "evictionMonitoringPeriod: 1s\nhousekeepingInterval: 1s".into(),
        ..StartOptions::default()
    };
    let mut n = Nodelet::start_with(&env, "lsi-off", options).await;
    n.write_manifest("scratch.yaml", &empty_dir_pod(&n, "scratch", 4, "1Mi"));
    n.write_manifest("rootfs.yaml", &rootfs_pod(&n, "rootfs"));
    n.wait_running("scratch").await;
    n.wait_running("rootfs").await;
    // Both are over their limits as the node measures them (containerd's writable layer usage is at most
    // 10 s old) ...
    let (scratch_uid, rootfs_uid) = (uid(&n, "scratch").await, uid(&n, "rootfs").await);
    n.wait_for("both pods over their limits in /stats/summary", Duration::from_secs(45), async || {
        let summary = get_json(&n, "/stats/summary").await;
        let pod = |uid: &str| {
            summary["pods"].as_array().into_iter().flatten().find(|p| p["podRef"]["uid"] == uid).cloned()
        };
        let volume =
            pod(&scratch_uid)?["volume"].as_array()?.iter().find(|v| v["name"] == "scratch")?["usedBytes"]
                .as_u64()?;
        let writer = rootfs_used(&n, &rootfs_uid, "writer").await?;
        (volume >= 4 * MI && writer >= 8 * MI).then_some(())
    })
    .await;
    // ... and several eviction periods later they still run.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for name in ["scratch", "rootfs"] {
        let p = n.pod(name).await.unwrap_or_else(|| panic!("{name} is gone"));
        assert_eq!(phase(&p), "Running", "{name}: {:?}", reason_and_message(&p));
    }
    for signal in ["emptydirfs.limit", "ephemeralcontainerfs.limit", "ephemeralpodfs.limit"] {
        let series = format!("kubelet_evictions_total{{eviction_signal=\"{signal}\"}}");
        assert_eq!(metric(&n, &series).await, Some(0.0), "{series}");
    }
    n.assert_alive_within(PEAK_RSS_MIB, "without local storage capacity isolation");
    n.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_more_files_than_one_walk_budget_is_still_evicted() {
    let env = env_or_skip!("a_pod_with_more_files_than_one_walk_budget_is_still_evicted");
    let options = StartOptions {
        nodelet_extra: "evictionMonitoringPeriod: 1s\nlocalStorageEntryBudget: 50".into(),
        ..StartOptions::default()
    };
    let mut n = Nodelet::start_with(&env, "lsi-files", options).await;
    // 300 files of 8 KiB (2.3 MiB) in three directories: no pass of 50 entries counts past 1Mi.
    let script = "for d in 0 1 2; do mkdir -p /data/$d; i=0; while [ $i -lt 100 ]; do \
                  head -c 8192 /dev/zero > /data/$d/f$i; i=$((i+1)); done; done";
    let mut c = sh("app", script, Some("1Mi"));
    c["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/data"}]);
    let spec = json!({"containers": [c], "volumes": [{"name": "scratch", "emptyDir": {}}]});
    n.write_manifest("files.yaml", &n.pod_manifest("files", spec));
    let evicted = |p: &Pod| reason_and_message(p).1 == "Evicted";
    let files = n.wait_for_pod("files", "evicted", Duration::from_secs(60), evicted).await;
    assert_eq!(
        reason_and_message(&files),
        (
            "Failed".into(),
            "Evicted".into(),
            "Pod ephemeral local storage usage exceeds the total limit of containers 1Mi. ".into()
        )
    );
    let series = "kubelet_evictions_total{eviction_signal=\"ephemeralpodfs.limit\"}";
    assert_eq!(metric(&n, series).await, Some(1.0), "{series}");
    n.assert_alive_within(PEAK_RSS_MIB, "a pod with more files than one walk budget");
    n.shutdown().await;
}

async fn uid(n: &Nodelet, name: &str) -> String {
    n.pod(name).await.and_then(|p| p.metadata.uid).unwrap_or_else(|| panic!("{name} has no UID"))
}

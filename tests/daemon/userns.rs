//! Pods in their own user namespace (`spec.hostUsers: false`, KEP-127) against the real containerd.
//!
//! containerd 2.x with runc ≥ 1.2 reports `user_namespaces` for its handlers: such a pod must run with its
//! own range (not `0 0 4294967295`), keep it across a restart of nodelet and free it when it goes. containerd
//! 1.x reports no handler features: the pod must not run at all (never with the host's users), with an error
//! naming `spec.hostUsers`.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Nodelet, containerd_major, env_or_skip, sleep_until_term, uid};

/// The first range nodelet gives (block 2 of 65536 IDs, as the kubelet).
const FIRST_HOST_ID: u64 = 2 * 65536;

fn manifest(n: &Nodelet, name: &str) -> Value {
    n.pod_manifest(
        name,
        json!({"hostUsers": false, "terminationGracePeriodSeconds": 2,
               "volumes": [{"name": "data", "emptyDir": {}}],
               "containers": [{"name": "app", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                               "command": sleep_until_term("echo written > /data/by-root; ")}]}),
    )
}

/// `/proc/self/uid_map` of the pod's container, one mapping per line, fields single-spaced.
async fn uid_map(n: &Nodelet, container_id: &str) -> String {
    let (code, out) = n.exec(container_id, &["cat", "/proc/self/uid_map"]).await;
    assert_eq!(code, 0, "{out}");
    out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n")
}

/// The host ID the pod's allocation file gives it.
fn allocated_host_id(file: &PathBuf) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    assert_eq!(value["uidMappings"], value["gidMappings"], "{text}");
    assert_eq!(value["uidMappings"][0]["containerId"], 0, "{text}");
    assert_eq!(value["uidMappings"][0]["length"], 65536, "{text}");
    value["uidMappings"][0]["hostId"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_users_false_pod_gets_its_own_range_or_is_refused() {
    let env = env_or_skip!("a_host_users_false_pod_gets_its_own_range_or_is_refused");
    let major = containerd_major();
    let mut n = Nodelet::start(&env, "userns").await;
    n.write_manifest("a.json", &manifest(&n, "ua"));

    if major < 2 {
        // No handler features on containerd 1.x: the pod never runs, and the reason names the field.
        let pod = n
            .wait_for_pod("ua", "the sandbox refused naming spec.hostUsers", Duration::from_secs(30), |p| {
                serde_json::to_string(p).unwrap_or_default().contains("spec.hostUsers")
            })
            .await;
        let text = serde_json::to_string(&pod).unwrap_or_default();
        let status = serde_json::to_string(&pod.status).unwrap_or_default();
        eprintln!("refused on containerd {major}: {status}");
        assert!(
            text.contains("does not support user namespaces")
                || text.contains("reports no runtime handler features"),
            "{text}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(n.sandboxes_of(&uid(&pod)).await.is_empty(), "no sandbox was made");
        assert!(n.containers_of(&uid(&pod)).await.is_empty(), "no container was made");
        assert!(!n.root_dir().join("pods").join(uid(&pod)).join("userns").exists(), "no range was given");
        n.shutdown().await;
        return;
    }

    let pod = n.wait_running("ua").await;
    let pod_uid = uid(&pod);
    let file = n.root_dir().join("pods").join(&pod_uid).join("userns");
    let host_id = allocated_host_id(&file).unwrap_or_else(|| panic!("no allocation in {}", file.display()));
    assert_eq!(host_id, FIRST_HOST_ID, "the first free range from block 2");
    let container = n.containers_of(&pod_uid).await.into_iter().next().expect("the container");
    assert_eq!(
        uid_map(&n, &container.id).await,
        format!("0 {host_id} 65536"),
        "the pod's own range, not the host's"
    );
    let (code, out) = n.exec(&container.id, &["id", "-u"]).await;
    assert_eq!((code, out.trim()), (0, "0"), "root in the pod");

    // A file the pod's root wrote to its emptyDir, seen from the host.
    let written =
        n.root_dir().join("pods").join(&pod_uid).join("volumes/kubernetes.io~empty-dir/data/by-root");
    let meta = n
        .wait_for("the file the pod wrote", Duration::from_secs(10), async || {
            std::fs::metadata(&written).ok()
        })
        .await;
    eprintln!("emptyDir file owner on the host: uid {} gid {}", meta.uid(), meta.gid());
    assert_eq!(
        (u64::from(meta.uid()), u64::from(meta.gid())),
        (host_id, host_id),
        "owned by the pod's root on the host"
    );

    // A restart of nodelet keeps the range: the pod is untouched and the next pod gets the next range.
    n.stop().await;
    n.start_again().await;
    n.write_manifest("b.json", &manifest(&n, "ub"));
    let second = n.wait_running("ub").await;
    let second_file = n.root_dir().join("pods").join(uid(&second)).join("userns");
    assert_eq!(
        allocated_host_id(&second_file),
        Some(FIRST_HOST_ID + 65536),
        "the first range is still taken"
    );
    assert_eq!(allocated_host_id(&file), Some(host_id), "kept across the restart");
    assert_eq!(uid_map(&n, &container.id).await, format!("0 {host_id} 65536"));

    // The pod goes: its range is freed (the file goes) and given to the next pod.
    n.remove_manifest("a.json");
    n.wait_for("the first pod's range to be freed", Duration::from_secs(60), async || {
        (!file.exists()).then_some(())
    })
    .await;
    n.write_manifest("c.json", &manifest(&n, "uc"));
    let third = n.wait_running("uc").await;
    let third_file = n.root_dir().join("pods").join(uid(&third)).join("userns");
    assert_eq!(allocated_host_id(&third_file), Some(FIRST_HOST_ID), "the freed range is given again");
    n.shutdown().await;
}

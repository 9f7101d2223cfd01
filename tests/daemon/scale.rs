//! Scale: 110 pods (the kubelet's default `maxPods`) on one nodelet and the real containerd: all become
//! Running with the right statuses, and once their manifests are gone nothing of them is left — no
//! container or sandbox in the runtime, no network namespace, no mount, no pod cgroup, no pod directory.
//!
//! No timing is asserted (the CI machine has 2 cores shared with other tests); the deadlines are only there
//! so that a stuck pod fails the test instead of hanging it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use nodelet_cri::{labels, proto};
use serde_json::{Value, json};

use crate::lifecycle::cgroup_exists;
use crate::support::{
    Nodelet, condition, container, cri_state, env_or_skip, phase, pod_ip, runtime_id, sleep_until_term, uid,
};

/// The kubelet's default `maxPods`.
const PODS: usize = 110;

fn pod_file(i: usize) -> String {
    format!("scale-{i:03}.yaml")
}

/// Lines of this process's mount table (the runtime runs in the same mount namespace) that mention `needle`.
fn mounts_mentioning(table: &str, needle: &str) -> Vec<String> {
    table.lines().filter(|l| l.contains(needle)).map(str::to_owned).collect()
}

#[tokio::test]
async fn one_hundred_and_ten_pods_run_with_the_right_statuses_and_leave_nothing_behind() {
    let env = env_or_skip!("one_hundred_and_ten_pods_run_with_the_right_statuses_and_leave_nothing_behind");
    let n = Nodelet::start(&env, "scale").await;

    for i in 0..PODS {
        let manifest = n.pod_manifest(
            &format!("scale-{i:03}"),
            json!({
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "sleep", "command": sleep_until_term("")}],
            }),
        );
        n.write_manifest(&pod_file(i), &manifest);
    }

    // every pod Running and Ready in /pods
    let pods = n
        .wait_for(&format!("{PODS} pods Running and Ready"), Duration::from_secs(300), async || {
            let pods = n.pods().await.items;
            let ready = pods
                .iter()
                .filter(|p| {
                    phase(p) == "Running" && condition(p, "Ready").is_some_and(|c| c.status == "True")
                })
                .count();
            (pods.len() == PODS && ready == PODS).then_some(pods)
        })
        .await;

    // statuses: each pod its own IP in the pod network, its container running, ready, never restarted
    let mut ips = HashSet::new();
    let mut containers_by_pod = HashMap::new();
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        for kind in ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"] {
            let c = condition(pod, kind).unwrap_or_else(|| panic!("{name}: condition {kind} missing"));
            assert_eq!(c.status, "True", "{name}: condition {kind}: {c:?}");
        }
        assert!(ips.insert(pod_ip(pod)), "{name}: pod IP {} is not unique", pod_ip(pod));
        let status = pod.status.clone().unwrap_or_default();
        assert!(status.start_time.is_some(), "{name}: startTime");
        assert_eq!(status.container_statuses.as_ref().map(Vec::len), Some(1), "{name}: {status:?}");
        let sleep = container(pod, "sleep").unwrap_or_else(|| panic!("{name}: no status of container sleep"));
        assert!(sleep.state.as_ref().and_then(|s| s.running.as_ref()).is_some(), "{name}: {sleep:?}");
        assert!(sleep.ready, "{name}: container not ready");
        assert_eq!(sleep.restart_count, 0, "{name}: restarted");
        containers_by_pod.insert(uid(pod), runtime_id(sleep));
    }
    assert_eq!(containers_by_pod.len(), PODS, "every pod has its own UID");

    // the runtime: one ready sandbox and one running container per pod, and nothing else of this node
    let sandboxes = n.sandboxes().await;
    let containers = n.containers().await;
    assert_eq!(sandboxes.len(), PODS, "sandboxes of this node in the runtime");
    assert_eq!(containers.len(), PODS, "containers of this node in the runtime");
    let mut sandbox_of_pod = HashMap::new();
    for s in &sandboxes {
        assert_eq!(s.state, proto::PodSandboxState::SandboxReady as i32, "sandbox {}", s.id);
        let pod_uid = s.labels.get(labels::POD_UID).cloned().unwrap_or_default();
        assert!(containers_by_pod.contains_key(&pod_uid), "sandbox {} of an unknown pod {pod_uid:?}", s.id);
        sandbox_of_pod.insert(pod_uid, s.id.clone());
    }
    for c in &containers {
        assert_eq!(cri_state(c), proto::ContainerState::ContainerRunning, "container {}", c.id);
        let pod_uid = c.labels.get(labels::POD_UID).cloned().unwrap_or_default();
        assert_eq!(containers_by_pod.get(&pod_uid), Some(&c.id), "the status names the runtime's container");
        assert_eq!(
            sandbox_of_pod.get(&pod_uid),
            Some(&c.pod_sandbox_id),
            "container {} in its pod's sandbox",
            c.id
        );
    }

    // /stats/summary lists every pod with its CPU and memory (gathered in the background every 10 s)
    let summary_url = format!("http://127.0.0.1:{}/stats/summary", n.ports().read_only);
    let read_summary = async || -> Option<Value> {
        let response = n.http().get(&summary_url).send().await.ok()?;
        serde_json::from_slice(&response.bytes().await.ok()?).ok()
    };
    n.wait_for(
        &format!("/stats/summary to list {PODS} pods with CPU and memory"),
        Duration::from_secs(60),
        async || {
            let summary = read_summary().await?;
            let pods = summary["pods"].as_array()?;
            let complete = pods.iter().filter(|p| {
                containers_by_pod.contains_key(p["podRef"]["uid"].as_str().unwrap_or_default())
                    && p["cpu"]["usageCoreNanoSeconds"].as_u64().is_some()
                    && p["memory"]["workingSetBytes"].as_u64().is_some()
            });
            (complete.count() == PODS).then_some(())
        },
    )
    .await;
    // Requests are served the summary gathered last: of three in a row (well within the 10 s housekeeping
    // interval), at most one gathering can fall between, so two neighbours are the same summary.
    let mut times = Vec::new();
    for _ in 0..3 {
        let summary = read_summary().await.unwrap_or_default();
        // the node's cumulative CPU time: it moves between any two readings on this busy machine
        times.push(summary["node"]["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or_default());
    }
    assert!(
        times[0] > 0 && (times[0] == times[1] || times[1] == times[2]),
        "/stats/summary is gathered per request, not served from the housekeeping round: node CPU {times:?}"
    );

    // what must go with the pods: network namespaces, cgroups, pod directories
    let mut netns: Vec<PathBuf> = Vec::new();
    for s in &sandboxes {
        let path = n.sandbox_netns(&s.id).await.unwrap_or_else(|| panic!("sandbox {} has no netns", s.id));
        assert!(path.exists(), "netns {} of sandbox {}", path.display(), s.id);
        netns.push(path);
    }
    let cgroups: Vec<String> =
        containers_by_pod.keys().map(|u| format!("{}/pod{u}", env.cgroup_parent.trim_matches('/'))).collect();
    for cgroup in &cgroups {
        assert!(cgroup_exists(cgroup), "pod cgroup {cgroup} while running");
    }
    let pods_dir = n.root_dir().join("pods");

    // remove every manifest: /pods empty, the runtime empty of this node
    for i in 0..PODS {
        n.remove_manifest(&pod_file(i));
    }
    n.wait_for("/pods to be empty", Duration::from_secs(300), async || {
        n.pods().await.items.is_empty().then_some(())
    })
    .await;
    n.wait_for("the runtime to hold nothing of this node", Duration::from_secs(120), async || {
        (n.sandboxes().await.is_empty() && n.containers().await.is_empty()).then_some(())
    })
    .await;
    n.wait_for("the pod cgroups and directories to go", Duration::from_secs(60), async || {
        let dirs_left = std::fs::read_dir(&pods_dir).map(|d| d.count()).unwrap_or(0);
        (dirs_left == 0 && !cgroups.iter().any(|c| cgroup_exists(c))).then_some(())
    })
    .await;

    // no network namespace file and no mount of these pods is left
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for path in &netns {
        assert!(!path.exists(), "network namespace {} is left", path.display());
        let left = mounts_mentioning(&table, &path.display().to_string());
        assert!(left.is_empty(), "mounts of {} are left: {left:?}", path.display());
    }
    for s in &sandboxes {
        let left = mounts_mentioning(&table, &s.id);
        assert!(left.is_empty(), "mounts of sandbox {} are left: {left:?}", s.id);
    }
    for id in containers_by_pod.values() {
        let left = mounts_mentioning(&table, id);
        assert!(left.is_empty(), "mounts of container {id} are left: {left:?}");
    }
    let root = n.root_dir().display().to_string();
    let left = mounts_mentioning(&table, &root);
    assert!(left.is_empty(), "mounts under nodelet's root {root} are left: {left:?}");

    n.shutdown().await;
}

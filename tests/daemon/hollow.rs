//! `nodelet hollow` against a real control plane of the test's own (envtest with kube-controller-manager
//! and kube-scheduler): 20 hollow nodes register and are Ready, a Deployment of 100 pods is scheduled
//! across them and every pod is Running with its own IP, the Deployment's deletion takes every pod away,
//! and in between the API server's request counters (`apiserver_request_total`) over two equal steady
//! windows show no periodic LIST of pods, Secrets or ConfigMaps, a bounded request rate per node and no
//! growth from one window to the next, and its watch gauge (`apiserver_longrunning_requests`) shows at
//! most 3 watches per node and none of RuntimeClasses (no pod names one).
//!
//! The nodes read thresholds of `evictionHard` that any machine crosses: a hollow node measures no signal
//! of the machine, so none of its pods is evicted.
//!
//! Needs only the control plane (no container runtime): skipped without `NODELET_TEST_ENVTEST_ENV`,
//! a failure then with `NODELET_REQUIRE_CLUSTER=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::time::{Instant, sleep};

use crate::cluster_support::{ControlPlane, admin_client, cluster_env, mint_node_kubeconfig};
use crate::support::nodelet_binary;

const NODES: u32 = 20;
const PODS: i32 = 100;
/// Each steady window; the Lease is renewed every 10 s, node status checked every 10 s.
const WINDOW: Duration = Duration::from_secs(30);
/// Per node and second, over all verbs but WATCH (the whole API server's count, its controllers' leader
/// election and discovery included, about 0.01 here): a Lease renewal every 10 s is 0.1, up to 0.13 when a
/// renewal more falls into a window. One more request per node every 10 s (a kubelet's GET of its Node,
/// a status patch every 10 s) makes it 0.2 or more and fails.
const MAX_REQUESTS_PER_NODE_SECOND: f64 = 0.17;

/// `apiserver_request_total` summed by (verb, resource, subresource).
type Counts = BTreeMap<(String, String, String), f64>;

fn parse_request_totals(text: &str) -> Counts {
    parse_counts(text, "apiserver_request_total")
}

/// `metric` (a counter or gauge with `verb`, `resource` and `subresource` labels) summed by those three.
fn parse_counts(text: &str, metric: &str) -> Counts {
    let mut counts = Counts::new();
    let start = format!("{metric}{{");
    for line in text.lines().filter(|l| l.starts_with(&start)) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let label = |name: &str| {
            let key = format!("{name}=\"");
            labels
                .split_once(&key)
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(v, _)| v.to_owned())
                .unwrap_or_default()
        };
        *counts.entry((label("verb"), label("resource"), label("subresource"))).or_default() += value;
    }
    counts
}

async fn request_totals(client: &kube::Client) -> Counts {
    parse_request_totals(&api_server_metrics(client).await)
}

async fn api_server_metrics(client: &kube::Client) -> String {
    let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
    client.request_text(request).await.expect("the API server's /metrics")
}

/// The watches the API server holds (`apiserver_longrunning_requests`, verb WATCH), by resource.
async fn watches_held(client: &kube::Client) -> BTreeMap<String, f64> {
    let mut held = BTreeMap::new();
    for ((verb, resource, _), n) in
        parse_counts(&api_server_metrics(client).await, "apiserver_longrunning_requests")
    {
        if verb == "WATCH" {
            *held.entry(resource).or_default() += n;
        }
    }
    held
}

fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

fn non_watch_total(counts: &Counts) -> f64 {
    counts.iter().filter(|((verb, _, _), _)| verb != "WATCH").map(|(_, v)| v).sum()
}

/// Waits until `check` gives `Ok`, or panics with its last `Err` and the tail of the hollow nodes' log
/// after `timeout`.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, log: &Path, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(()) => return,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}: {last}\nhollow log:\n{}",
            tail(log)
        );
        sleep(Duration::from_millis(500)).await;
    }
}

/// How many pods are on each (node, phase, Ready condition): where a wait for Running stands.
fn pod_summary(pods: &[Pod]) -> BTreeMap<(String, String, String), usize> {
    let mut summary = BTreeMap::new();
    for pod in pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "-".into());
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "-".into());
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| format!("{} {}", c.status, c.reason.as_deref().unwrap_or("")))
            .unwrap_or_else(|| "-".into());
        *summary.entry((node, phase, ready)).or_insert(0) += 1;
    }
    summary
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_hollow_nodes_run_a_hundred_pods_without_growing_requests() {
    let Some(suite) = cluster_env("twenty_hollow_nodes_run_a_hundred_pods_without_growing_requests") else {
        return;
    };
    let plane = ControlPlane::start_with_controllers(&suite).await;
    let env = plane.env();
    if let Err(e) = env.controllers_running() {
        panic!("the test's control plane: {e}");
    }
    let dir = tempfile::Builder::new().prefix("nodelet-hollow-").tempdir().expect("tempdir");
    let kubeconfigs = dir.path().join("kubeconfigs");
    std::fs::create_dir_all(&kubeconfigs).expect("mkdir");
    for i in 0..NODES {
        let name = format!("hollow-{i}");
        mint_node_kubeconfig(&env, &name, &kubeconfigs.join(format!("{name}.kubeconfig"))).await;
    }
    // Thresholds the machine under the test always crosses (a disk or memory never 99 % free): a hollow
    // node's host is made up, so the machine's memory and disks must never evict its pods (they did, once
    // the CI machine's disk was 92 % full).
    let config = dir.path().join("kubelet.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  \
         memory.available: \"99%\"\n  nodefs.available: \"99%\"\n  imagefs.available: \"99%\"\n",
    )
    .expect("config");
    let log = dir.path().join("hollow.log");
    let log_file = std::fs::File::create(&log).expect("log file");
    let mut hollow = tokio::process::Command::new(nodelet_binary())
        .args(["hollow", "--nodes", &NODES.to_string(), "--name-prefix", "hollow-", "--kubeconfig-dir"])
        .arg(&kubeconfigs)
        .arg("--root-dir")
        .arg(dir.path().join("nodes"))
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .expect("nodelet hollow");
    let client = admin_client(&env).await;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until("20 Ready hollow nodes", Duration::from_secs(90), &log, || {
        let nodes = nodes.clone();
        async move {
            let list = nodes.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            let ready = list
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            if ready == NODES as usize { Ok(()) } else { Err(format!("{ready} Ready")) }
        }
    })
    .await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "hollow-web"},
        "spec": {
            "replicas": PODS,
            "selector": {"matchLabels": {"app": "hollow-web"}},
            "template": {
                "metadata": {"labels": {"app": "hollow-web"}},
                "spec": {"containers": [{"name": "web", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}
            }
        }
    }))
    .expect("deployment");
    deployments.create(&PostParams::default(), &deployment).await.expect("create the Deployment");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let selector = ListParams::default().labels("app=hollow-web");
    wait_until("100 Running pods with IPs on the hollow nodes", Duration::from_secs(180), &log, || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let list = pods.list(&selector).await.map_err(|e| e.to_string())?;
            let running: Vec<&Pod> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().is_some_and(|s| s.phase.as_deref() == Some("Running")))
                .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
                .collect();
            if running.len() == PODS as usize && list.items.len() == PODS as usize {
                Ok(())
            } else {
                Err(format!(
                    "{} of {} Running with an IP; by (node, phase, Ready): {:?}",
                    running.len(),
                    list.items.len(),
                    pod_summary(&list.items)
                ))
            }
        }
    })
    .await;
    let list = pods.list(&selector).await.expect("list pods");
    let ips: BTreeSet<(String, String)> = list
        .items
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            Some((node, p.status.as_ref()?.pod_ip.clone()?))
        })
        .collect();
    assert_eq!(ips.len(), PODS as usize, "every pod has a node and an IP of its own: {ips:?}");
    let on_nodes: BTreeSet<&str> = ips.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(on_nodes.len(), NODES as usize, "the pods spread over every hollow node: {on_nodes:?}");
    let distinct_ips: BTreeSet<&str> = ips.iter().map(|(_, ip)| ip.as_str()).collect();
    assert_eq!(distinct_ips.len(), PODS as usize, "made-up IPs are unique across nodes");

    // Steady state: let the last status patches land, then two equal windows.
    sleep(Duration::from_secs(15)).await;
    // the watches the API server holds, the nodes' among them (less those left once the nodes are gone:
    // below)
    let watches_steady = watches_held(&client).await;
    let t0 = request_totals(&client).await;
    sleep(WINDOW).await;
    let t1 = request_totals(&client).await;
    sleep(WINDOW).await;
    let t2 = request_totals(&client).await;
    let (w1, w2) = (delta(&t0, &t1), delta(&t1, &t2));
    let report = format!("window 1: {w1:#?}\nwindow 2: {w2:#?}\nhollow log:\n{}", tail(&log));
    eprintln!(
        "steady windows of {WINDOW:?}: {:.0} then {:.0} requests (WATCH excluded)\nwindow 1: {w1:#?}\nwindow 2: {w2:#?}",
        non_watch_total(&w1),
        non_watch_total(&w2)
    );
    for w in [&w1, &w2] {
        for ((verb, resource, _), n) in w.iter() {
            assert!(
                !(verb == "LIST" && ["pods", "secrets", "configmaps"].contains(&resource.as_str())),
                "a LIST of {resource} ({n}) in steady state\n{report}"
            );
        }
        let rate = non_watch_total(w) / f64::from(NODES) / WINDOW.as_secs_f64();
        assert!(
            rate <= MAX_REQUESTS_PER_NODE_SECOND,
            "{rate:.3} requests per node and second in steady state (at most {MAX_REQUESTS_PER_NODE_SECOND})\n{report}"
        );
    }
    let (n1, n2) = (non_watch_total(&w1), non_watch_total(&w2));
    assert!(n2 <= n1 * 1.5 + 10.0, "requests grow from one window to the next: {n1} then {n2}\n{report}");
    assert!(n1 > 0.0, "no request at all in a window: the counters are not read\n{report}");
    assert!(
        w1.keys().any(|(verb, resource, _)| verb == "PATCH" && resource == "leases"),
        "no Lease renewal (a PATCH) in a steady window\n{report}"
    );

    deployments.delete("hollow-web", &DeleteParams::foreground()).await.expect("delete the Deployment");
    wait_until("every pod of the Deployment gone", Duration::from_secs(180), &log, || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let n = pods.list(&selector).await.map_err(|e| e.to_string())?.items.len();
            if n == 0 { Ok(()) } else { Err(format!("{n} pods left")) }
        }
    })
    .await;
    assert!(hollow.try_wait().expect("status").is_none(), "nodelet hollow exited\n{}", tail(&log));
    if let Some(pid) = hollow.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let stopped = tokio::time::timeout(Duration::from_secs(30), hollow.wait()).await;
    assert!(
        matches!(stopped, Ok(Ok(s)) if s.success()),
        "nodelet hollow on SIGTERM: {stopped:?}\n{}",
        tail(&log)
    );

    // The nodes' watches: those the API server held in steady state less those left once the nodes are gone
    // (the controllers' and the API server's own, which start at their own pace and so cannot be read before
    // the nodes): their pods, the ConfigMap their pods use (kube-root-ca.crt), Services; no RuntimeClasses,
    // which no pod names.
    let pods_watched = |w: &BTreeMap<String, f64>| w.get("pods").copied().unwrap_or(0.0);
    let mut watches_after = watches_held(&client).await;
    for _ in 0..30 {
        sleep(Duration::from_millis(500)).await;
        let now = watches_held(&client).await;
        // the API server has seen the nodes' connections close, and nothing moves any more
        let gone = pods_watched(&watches_steady) - pods_watched(&now) >= f64::from(NODES);
        let settled = now == watches_after;
        watches_after = now;
        if gone && settled {
            break;
        }
    }
    let by_nodes: BTreeMap<&str, f64> = watches_steady
        .iter()
        .map(|(r, n)| (r.as_str(), n - watches_after.get(r).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n != 0.0)
        .collect();
    eprintln!("watches of the hollow nodes, by resource: {by_nodes:?}");
    assert_eq!(by_nodes.get("pods").copied(), Some(f64::from(NODES)), "one pod watch per node: {by_nodes:?}");
    assert!(
        !by_nodes.contains_key("runtimeclasses"),
        "RuntimeClasses watched, though no pod names one: {by_nodes:?}"
    );
    let per_node = by_nodes.values().sum::<f64>() / f64::from(NODES);
    assert!(
        per_node <= 3.0,
        "{per_node:.2} watches per node (3: pods, Services, one ConfigMap): {by_nodes:?}"
    );
    drop(plane);
}

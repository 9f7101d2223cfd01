//! Cluster mode (`--kubeconfig`): nodelet against a real Kubernetes v1.28.7 API server (envtest), with the
//! node's own identity `system:node:<node>` (authorization Node,RBAC; admission NodeRestriction). Node
//! registration, the node Lease, pods from the API, graceful deletion, crash loops, events, mirror pods, an
//! API server outage, a Deployment scheduled onto the node, and the main port's TokenReview and
//! SubjectAccessReview checks (with `kubectl logs` through the API server), and what the e2e
//! `[NodeConformance]` specs check of admission (unsafe sysctls, another OS), downward API environment
//! variables, pod conditions (init containers, readiness gates) and `activeDeadlineSeconds` set by an
//! update. The fixture is
//! [`ClusterNode`](crate::cluster_support::ClusterNode); every check reads the API with an admin client.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, sleep_until};

use crate::cluster_support::{
    ClusterNode, ControlPlane, LEASE_DURATION_SECONDS, cluster_or_skip, kubectl_holding_stdin,
    parse_env_file, pretty,
};
use crate::support::{
    StartOptions, condition, container, cri_state, phase, runtime_id, sleep_until_term, terminated, uid,
    waiting,
};

/// The generous bound of the waits for something nodelet should do within seconds.
const WAIT: Duration = Duration::from_secs(60);

/// `kubernetes.io/arch` of this machine (Go's GOARCH names).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// The node condition `kind`.
fn node_condition<'a>(node: &'a Node, kind: &str) -> Option<&'a NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind)
}

/// Whether the pod's condition `kind` is True.
fn is_true(pod: &Pod, kind: &str) -> bool {
    condition(pod, kind).is_some_and(|c| c.status == "True")
}

/// The running containers of a CRI list.
fn running(containers: &[nodelet_cri::proto::Container]) -> Vec<String> {
    containers
        .iter()
        .filter(|c| cri_state(c) == nodelet_cri::proto::ContainerState::ContainerRunning)
        .map(|c| c.id.clone())
        .collect()
}

/// A container that runs `sleep 1`, then exits 1 (restartPolicy Always: a crash loop).
fn crash_loop_spec() -> Value {
    json!({
        "restartPolicy": "Always",
        "containers": [{"name": "main", "command": ["sh", "-c", "sleep 1; exit 1"]}],
    })
}

// ------------------------------------------------------------------------------------------------ (a) the Node

#[tokio::test]
async fn the_node_registers_with_its_labels_taints_addresses_and_capacity_and_is_ready() {
    let (env, cluster) =
        cluster_or_skip!("the_node_registers_with_its_labels_taints_addresses_and_capacity_and_is_ready");
    let options = StartOptions {
        extra_args: vec![
            "--node-labels".to_owned(),
            "e2e.nodelet.io/suite=cluster,e2e.nodelet.io/role=register".to_owned(),
            "--register-with-taints".to_owned(),
            "e2e.nodelet.io/dedicated=register:NoSchedule".to_owned(),
        ],
        ..StartOptions::default()
    };
    let n = ClusterNode::start_with(&env, &cluster, "register", options).await;
    let node = n
        .wait_until(&format!("Node {} with condition Ready=True", n.node()), WAIT, async || {
            match n.node_object().await {
                Some(node) if node_condition(&node, "Ready").is_some_and(|c| c.status == "True") => Ok(node),
                Some(node) => Err(pretty(&node)),
                None => Err("no such Node".to_owned()),
            }
        })
        .await;
    let dump = pretty(&node);

    // labels: the well-known ones and --node-labels
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (key, value) in [
        ("kubernetes.io/hostname", n.node()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", go_arch()),
        ("e2e.nodelet.io/suite", "cluster"),
        ("e2e.nodelet.io/role", "register"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "label {key} of the Node:\n{dump}");
    }

    // --register-with-taints
    let spec = node.spec.clone().unwrap_or_default();
    let taints = spec.taints.unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "e2e.nodelet.io/dedicated"
            && t.value.as_deref() == Some("register")
            && t.effect == "NoSchedule"),
        "spec.taints lacks e2e.nodelet.io/dedicated=register:NoSchedule:\n{dump}"
    );

    // conditions
    let status = node.status.clone().unwrap_or_default();
    let ready = node_condition(&node, "Ready").map(|c| c.reason.clone().unwrap_or_default());
    assert_eq!(ready.as_deref(), Some("KubeletReady"), "reason of condition Ready:\n{dump}");
    for kind in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        let c = node_condition(&node, kind).map(|c| c.status.as_str());
        assert_eq!(c, Some("False"), "condition {kind}:\n{dump}");
    }

    // addresses: InternalIP from --node-ip, Hostname
    let addresses = status.addresses.clone().unwrap_or_default();
    let has = |kind: &str, address: &str| addresses.iter().any(|a| a.type_ == kind && a.address == address);
    assert!(has("InternalIP", "127.0.0.1"), "no InternalIP 127.0.0.1 (--node-ip):\n{dump}");
    assert!(has("Hostname", n.node()), "no Hostname address {}:\n{dump}", n.node());

    // the kubelet endpoint the API server uses for logs and exec: nodelet's main port
    let port = status.daemon_endpoints.as_ref().and_then(|d| d.kubelet_endpoint.as_ref()).map(|e| e.port);
    assert_eq!(port, Some(i32::from(n.ports().main)), "daemonEndpoints.kubeletEndpoint.Port:\n{dump}");

    // capacity and allocatable
    for (what, list) in [("capacity", &status.capacity), ("allocatable", &status.allocatable)] {
        let list = list.clone().unwrap_or_default();
        for resource in ["cpu", "memory", "pods"] {
            let q = list.get(resource).map(|q| q.0.clone()).unwrap_or_default();
            assert!(!q.is_empty() && q != "0", "status.{what}.{resource} is {q:?}:\n{dump}");
        }
    }
    let runtime = status.node_info.as_ref().map(|i| i.container_runtime_version.clone()).unwrap_or_default();
    assert!(runtime.starts_with("containerd://"), "nodeInfo.containerRuntimeVersion {runtime:?}:\n{dump}");

    // what an operator sees: `kubectl get nodes`
    let (ok, out, err) = n.kubectl(&["get", "nodes", "--no-headers"], None).await;
    assert!(ok, "kubectl get nodes: {err}");
    let row: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&n.node()))
        .unwrap_or_default();
    assert_eq!(
        row.get(1).copied(),
        Some("Ready"),
        "kubectl get nodes does not list {} Ready:\n{out}",
        n.node()
    );

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (b) the Lease

#[tokio::test]
async fn the_node_lease_is_renewed_and_a_deleted_node_registers_again() {
    let (env, cluster) = cluster_or_skip!("the_node_lease_is_renewed_and_a_deleted_node_registers_again");
    let n = ClusterNode::start(&env, &cluster, "lease").await;
    let node = n.node().to_owned();
    let held = async |what: &str| {
        n.wait_until(&format!("Lease kube-node-lease/{node} held by {node}: {what}"), WAIT, async || {
            let Some(lease) = n.lease().await else { return Err("no such Lease".to_owned()) };
            let spec = lease.spec.clone().unwrap_or_default();
            match (spec.holder_identity.as_deref(), spec.renew_time) {
                (Some(h), Some(t)) if h == node => Ok((lease, t.0)),
                _ => Err(pretty(&lease)),
            }
        })
        .await
    };
    let (lease, first) = held("with a renewTime").await;
    let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
    assert_eq!(duration, Some(LEASE_DURATION_SECONDS), "leaseDurationSeconds:\n{}", pretty(&lease));

    // renewals every quarter of the 8 s lease: a second look 5 s later sees a later renewTime
    sleep(Duration::from_secs(5)).await;
    let (lease, second) = held("renewed").await;
    assert!(
        second > first,
        "the Lease's renewTime did not advance in 5 s (first {first}, now {second}; lease duration \
         {LEASE_DURATION_SECONDS} s):\n{}\n{}",
        pretty(&lease),
        n.tail()
    );

    // a deleted Node object is registered again
    let Some(old) = n.node_object().await else { panic!("no Node {node}\n{}", n.tail()) };
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    let nodes: Api<Node> = Api::all(n.client());
    if let Err(e) = nodes.delete(&node, &DeleteParams::default()).await {
        panic!("cannot delete Node {node}: {e}");
    }
    let again = n
        .wait_until(&format!("Node {node} registered again (new UID)"), Duration::from_secs(15), async || {
            match n.node_object().await {
                Some(x) if x.metadata.uid.as_deref().is_some_and(|u| u != old_uid) => Ok(x),
                Some(x) => Err(format!("still the old object (UID {old_uid}):\n{}", pretty(&x))),
                None => Err("no such Node".to_owned()),
            }
        })
        .await;
    let labels = again.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(node.as_str()),
        "the re-registered Node:\n{}",
        pretty(&again)
    );
    n.wait_until(&format!("the re-registered Node {node} Ready=True"), WAIT, async || {
        match n.node_object().await {
            Some(x) if node_condition(&x, "Ready").is_some_and(|c| c.status == "True") => Ok(()),
            Some(x) => Err(pretty(&x)),
            None => Err("no such Node".to_owned()),
        }
    })
    .await;

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (c, i) a pod

#[tokio::test]
async fn a_pod_from_the_api_runs_and_its_status_reaches_the_api_without_forbidden_requests() {
    let (env, cluster) =
        cluster_or_skip!("a_pod_from_the_api_runs_and_its_status_reaches_the_api_without_forbidden_requests");
    let n = ClusterNode::start(&env, &cluster, "apipod").await;
    let manifest = n.api_pod_manifest(
        "sleeper",
        json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}),
    );
    let created = n.create_pod(&manifest).await;
    let pod = n.wait_api_running("sleeper").await;
    let dump = pretty(&pod);
    let uid = uid(&pod);
    assert_eq!(uid, self::uid(&created), "the pod in the API is the one created");

    let status = pod.status.clone().unwrap_or_default();
    let ip = status.pod_ip.clone().unwrap_or_default();
    let in_pod_network = ip.parse::<Ipv4Addr>().is_ok_and(|v4| v4.octets()[..2] == [198, 18]);
    assert!(in_pod_network, "podIP {ip:?} is not in the pod network 198.18.0.0/16:\n{dump}");
    let first_ip = status.pod_ips.iter().flatten().next().map(|p| p.ip.clone());
    assert_eq!(first_ip.as_deref(), Some(ip.as_str()), "podIPs[0].ip:\n{dump}");
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"), "hostIP (--node-ip):\n{dump}");
    assert!(status.start_time.is_some(), "startTime:\n{dump}");
    assert!(is_true(&pod, "Ready"), "condition Ready:\n{dump}");
    let Some(main) = container(&pod, "main") else { panic!("no status of container main:\n{dump}") };
    assert!(main.state.as_ref().and_then(|s| s.running.as_ref()).is_some(), "state.running:\n{dump}");
    assert!(main.ready, "containerStatuses[0].ready:\n{dump}");
    assert_eq!(main.restart_count, 0, "restartCount:\n{dump}");
    let id = runtime_id(main);

    // the container really runs in containerd, in the pod's one sandbox
    let containers = n.containers_of(&uid).await;
    assert_eq!(running(&containers), vec![id.clone()], "running containers of UID {uid} in the runtime");
    let sandboxes = n.sandboxes_of(&uid).await;
    assert_eq!(sandboxes.len(), 1, "sandboxes of UID {uid}: {sandboxes:?}");

    // NodeRestriction: a few status and lease rounds later, no request of nodelet was refused
    sleep(Duration::from_secs(5)).await;
    n.assert_no_forbidden_in_log();

    n.shutdown().await;
}

#[tokio::test]
async fn a_ready_condition_the_node_controller_set_to_false_is_set_true_again() {
    let (env, cluster) =
        cluster_or_skip!("a_ready_condition_the_node_controller_set_to_false_is_set_true_again");
    let n = ClusterNode::start(&env, &cluster, "reready").await;
    let manifest = n.api_pod_manifest(
        "sleeper",
        json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}),
    );
    n.create_pod(&manifest).await;
    n.wait_api_running("sleeper").await;
    // What the node lifecycle controller does to the pods of a node whose Lease lapsed (MarkPodsNotReady);
    // it leaves them once the node is back, and the kubelet's status manager sets Ready again.
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "NodeNotReady"}
    ]}});
    let patched = n
        .pods_api()
        .patch_status("sleeper", &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(&patch))
        .await;
    match patched {
        Ok(pod) => assert!(!is_true(&pod, "Ready"), "the patch took:\n{}", pretty(&pod)),
        Err(e) => panic!("cannot patch the pod's status: {e}"),
    }
    let started = Instant::now();
    n.wait_api_pod("sleeper", "Ready=True again", Duration::from_secs(30), |p| is_true(p, "Ready")).await;
    // A pass over every pod every 10 s compares the API's conditions with nodelet's.
    assert!(started.elapsed() <= Duration::from_secs(15), "Ready again after {:?}", started.elapsed());
    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (d) deletion

#[tokio::test]
async fn a_pod_deleted_through_the_api_gets_sigterm_and_leaves_the_api_and_the_runtime() {
    let (env, cluster) =
        cluster_or_skip!("a_pod_deleted_through_the_api_gets_sigterm_and_leaves_the_api_and_the_runtime");
    const GRACE: Duration = Duration::from_secs(10);
    let n = ClusterNode::start(&env, &cluster, "graceful").await;
    let out = n.dir().join("out");
    if let Err(e) = std::fs::create_dir_all(&out) {
        panic!("cannot create {}: {e}", out.display());
    }
    let marker = out.join("term");
    let manifest = n.api_pod_manifest(
        "graceful",
        json!({
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "out", "hostPath": {"path": out.display().to_string(), "type": "Directory"}}],
            "containers": [{
                "name": "main",
                "command": ["sh", "-c", "trap 'echo TERM > /out/term; exit 0' TERM; while true; do sleep 1 & wait $!; done"],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}],
            }],
        }),
    );
    n.create_pod(&manifest).await;
    let pod = n.wait_api_running("graceful").await;
    let uid = uid(&pod);
    assert!(!marker.exists(), "{} exists before the deletion", marker.display());

    let deleted_at = Instant::now();
    match n.pods_api().delete("graceful", &DeleteParams::default().grace_period(10)).await {
        Ok(either) => {
            if let Some(p) = either.left() {
                assert!(p.metadata.deletion_timestamp.is_some(), "a graceful deletion:\n{}", pretty(&p));
            }
        }
        Err(e) => panic!("cannot delete pod graceful: {e}"),
    }

    // SIGTERM reaches the container
    let text = n
        .wait_until("the container's TERM marker (SIGTERM delivered)", GRACE, async || {
            std::fs::read_to_string(&marker).map_err(|e| format!("{}: {e}", marker.display()))
        })
        .await;
    assert_eq!(text.trim(), "TERM", "{}", marker.display());

    // nodelet deletes the pod object once its containers stopped: long before the grace period is over
    n.wait_api_pod_gone("graceful", GRACE + Duration::from_secs(10)).await;
    let took = deleted_at.elapsed();
    assert!(
        took < GRACE - Duration::from_secs(2),
        "the pod left the API {took:?} after the deletion although its container exited on SIGTERM at once \
         (grace period {GRACE:?})\n{}",
        n.tail()
    );
    n.wait_runtime_clear_of(&uid, Duration::from_secs(30)).await;

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (e) crash loop

#[tokio::test]
async fn a_crash_looping_pod_reports_its_restarts_and_crash_loop_back_off_in_the_api() {
    let (env, cluster) =
        cluster_or_skip!("a_crash_looping_pod_reports_its_restarts_and_crash_loop_back_off_in_the_api");
    let n = ClusterNode::start(&env, &cluster, "crashloop").await;
    n.create_pod(&n.api_pod_manifest("crasher", crash_loop_spec())).await;

    let mut saw_back_off = false;
    let mut reasons = BTreeSet::new();
    let pod = n
        .wait_until(
            "restartCount >= 2 and, at some point, state.waiting.reason CrashLoopBackOff",
            WAIT,
            async || {
                let Some(pod) = n.api_pod("crasher").await else { return Err("no such pod".to_owned()) };
                if let Some(main) = container(&pod, "main") {
                    if let Some((reason, _)) = waiting(main) {
                        saw_back_off |= reason == "CrashLoopBackOff";
                        reasons.insert(reason);
                    }
                    if main.restart_count >= 2 && saw_back_off {
                        return Ok(pod);
                    }
                }
                Err(format!(
                    "CrashLoopBackOff seen: {saw_back_off}; waiting reasons seen: {reasons:?}; the pod:\n{}",
                    pretty(&pod)
                ))
            },
        )
        .await;
    let Some(main) = container(&pod, "main") else { panic!("no status of main:\n{}", pretty(&pod)) };
    let last = main.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code);
    assert_eq!(last, Some(1), "lastState.terminated.exitCode of a container that exits 1:\n{}", pretty(&pod));

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (g) events

#[tokio::test]
async fn events_of_a_crash_looping_pod_are_recorded_and_aggregated() {
    let (env, cluster) = cluster_or_skip!("events_of_a_crash_looping_pod_are_recorded_and_aggregated");
    const LOOPING: Duration = Duration::from_secs(20);
    const MAX_EVENTS: usize = 30;
    let n = ClusterNode::start(&env, &cluster, "events").await;
    let created = n.create_pod(&n.api_pod_manifest("flapper", crash_loop_spec())).await;
    let created_at = Instant::now();
    let pod_uid = uid(&created);
    let events: Api<Event> = Api::namespaced(n.client(), n.namespace());
    let of_pod = ListParams::default().fields("involvedObject.name=flapper");
    let list = async || -> Vec<Event> {
        match events.list(&of_pod).await {
            Ok(l) => {
                l.items.into_iter().filter(|e| e.involved_object.uid.as_deref() == Some(&pod_uid)).collect()
            }
            Err(e) => panic!("cannot list events of {}: {e}", n.namespace()),
        }
    };
    let summary = |list: &[Event]| -> String {
        list.iter()
            .map(|e| {
                format!(
                    "{} x{:?} (series {:?}) from {:?}/{:?} on {:?}/{:?}: {}",
                    e.reason.as_deref().unwrap_or_default(),
                    e.count,
                    e.series.as_ref().and_then(|s| s.count),
                    e.source.as_ref().and_then(|s| s.component.as_deref()),
                    e.reporting_component,
                    e.source.as_ref().and_then(|s| s.host.as_deref()),
                    e.reporting_instance,
                    e.message.as_deref().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    n.wait_until("events Started and BackOff for pod flapper", WAIT, async || {
        let all = list().await;
        let reasons: BTreeSet<&str> = all.iter().filter_map(|e| e.reason.as_deref()).collect();
        if reasons.contains("Started") && reasons.contains("BackOff") { Ok(()) } else { Err(summary(&all)) }
    })
    .await;

    // who reports them: nodelet, on this node, about this pod
    let node = n.node().to_owned();
    for e in list().await {
        let component = e.source.as_ref().and_then(|s| s.component.as_deref());
        assert!(
            component == Some("nodelet") || e.reporting_component.as_deref() == Some("nodelet"),
            "source.component or reportingComponent should be nodelet:\n{}",
            pretty(&e)
        );
        let host = e.source.as_ref().and_then(|s| s.host.as_deref());
        assert!(
            host == Some(node.as_str()) || e.reporting_instance.as_deref() == Some(node.as_str()),
            "source.host (or reportingInstance) should be {node}:\n{}",
            pretty(&e)
        );
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"), "involvedObject:\n{}", pretty(&e));
        assert_eq!(e.involved_object.namespace.as_deref(), Some(n.namespace()), "{}", pretty(&e));
    }

    // bounded: repeated occurrences update an Event's count instead of creating new Events
    sleep_until(created_at + LOOPING + Duration::from_secs(5)).await;
    let all = list().await;
    assert!(
        all.len() <= MAX_EVENTS,
        "{} Event objects for pod flapper after {LOOPING:?} of crash-looping (at most {MAX_EVENTS}):\n{}",
        all.len(),
        summary(&all)
    );
    let repeated = |e: &Event| e.count.unwrap_or(0).max(e.series.as_ref().and_then(|s| s.count).unwrap_or(0));
    assert!(
        all.iter().filter(|e| e.reason.as_deref() == Some("BackOff")).any(|e| repeated(e) >= 2),
        "no BackOff event with count (or series.count) >= 2 after {LOOPING:?} of crash-looping:\n{}",
        summary(&all)
    );

    // and what an operator sees: `kubectl get events`
    let (ok, out, err) = n
        .kubectl(
            &[
                "get",
                "events",
                "-n",
                n.namespace(),
                "--field-selector",
                "involvedObject.name=flapper",
                "-o",
                "json",
            ],
            None,
        )
        .await;
    assert!(ok, "kubectl get events: {err}");
    let listed: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl get events: {e}: {out}"));
    let reasons: BTreeSet<&str> =
        listed["items"].as_array().into_iter().flatten().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains("Started") && reasons.contains("BackOff"), "kubectl get events: {reasons:?}");

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (f) mirror pods

#[tokio::test]
async fn a_static_pod_gets_a_mirror_pod_that_comes_back_after_deletion_and_goes_with_the_manifest() {
    let (env, cluster) = cluster_or_skip!(
        "a_static_pod_gets_a_mirror_pod_that_comes_back_after_deletion_and_goes_with_the_manifest"
    );
    let n = ClusterNode::start(&env, &cluster, "mirror").await;
    let manifest = n.pod_manifest(
        "static",
        json!({
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "command": sleep_until_term("")}],
        }),
    );
    n.write_manifest("static.yaml", &manifest);
    let name = n.pod_name("static");
    let default_pods: Api<Pod> = Api::namespaced(n.client(), "default");
    let get = async || match default_pods.get_opt(&name).await {
        Ok(p) => p,
        Err(e) => panic!("GET pod default/{name}: {e}"),
    };

    let mirror = n
        .wait_until(&format!("mirror pod default/{name} Running"), WAIT, async || match get().await {
            Some(p) if phase(&p) == "Running" => Ok(p),
            Some(p) => Err(pretty(&p)),
            None => Err("no such pod".to_owned()),
        })
        .await;
    let dump = pretty(&mirror);
    let annotations = mirror.metadata.annotations.clone().unwrap_or_default();
    let hash = annotations.get("kubernetes.io/config.hash").cloned().unwrap_or_default();
    assert!(!hash.is_empty(), "annotation kubernetes.io/config.hash:\n{dump}");
    assert_eq!(
        annotations.get("kubernetes.io/config.mirror"),
        Some(&hash),
        "annotation kubernetes.io/config.mirror = config.hash:\n{dump}"
    );
    let owners = mirror.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owners.iter().any(|o| o.kind == "Node" && o.name == n.node() && o.controller == Some(true)),
        "ownerReference kind Node name {} controller true:\n{dump}",
        n.node()
    );
    let first_uid = uid(&mirror);
    assert_ne!(first_uid, hash, "a mirror pod has a UID of its own:\n{dump}");

    // the static pod's container in the runtime (its pods are labelled with the config hash as UID)
    let before = running(&n.containers_of(&hash).await);
    assert_eq!(before.len(), 1, "running containers of the static pod (UID {hash}): {before:?}");
    let id = before[0].clone();
    if let Some(main) = container(&mirror, "main").filter(|c| c.container_id.is_some()) {
        assert_eq!(
            runtime_id(main),
            id,
            "the mirror pod's containerID is the static pod's container:\n{dump}"
        );
    }

    // `kubectl delete pod` of the mirror: it comes back (new UID); the static pod is not touched
    let (ok, _, err) = n.kubectl(&["delete", "pod", &name, "-n", "default", "--wait=false"], None).await;
    assert!(ok, "kubectl delete pod {name}: {err}");
    let again = n
        .wait_until(&format!("mirror pod default/{name} back with a new UID"), WAIT, async || {
            match get().await {
                Some(p)
                    if p.metadata.uid.as_deref() != Some(first_uid.as_str())
                        && p.metadata.deletion_timestamp.is_none()
                        && phase(&p) == "Running" =>
                {
                    Ok(p)
                }
                Some(p) => Err(pretty(&p)),
                None => Err("no such pod".to_owned()),
            }
        })
        .await;
    let all: Vec<String> = n.containers_of(&hash).await.into_iter().map(|c| c.id).collect();
    assert_eq!(
        all,
        vec![id.clone()],
        "the static pod's container was restarted or replaced when its mirror pod was deleted\nmirror now:\n{}\n{}",
        pretty(&again),
        n.tail()
    );
    assert_eq!(running(&n.containers_of(&hash).await), vec![id], "the static pod's container still runs");

    // removing the manifest removes the mirror pod
    n.remove_manifest("static.yaml");
    n.wait_until(&format!("mirror pod default/{name} to be gone"), WAIT, async || match get().await {
        None => Ok(()),
        Some(p) => Err(pretty(&p)),
    })
    .await;
    n.wait_runtime_clear_of(&hash, Duration::from_secs(30)).await;

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ (h) outage

#[tokio::test]
async fn pods_keep_running_through_an_api_server_outage_and_their_status_catches_up() {
    let (env, suite) =
        cluster_or_skip!("pods_keep_running_through_an_api_server_outage_and_their_status_catches_up");
    const OUTAGE: Duration = Duration::from_secs(30);
    // a control plane of this test's own: stopping the suite's would break the other tests
    let plane = ControlPlane::start(&suite).await;
    let cluster = plane.env();
    let mut n = ClusterNode::start(&env, &cluster, "outage").await;
    n.create_pod(&n.api_pod_manifest(
        "steady",
        json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}),
    ))
    .await;
    n.create_pod(&n.api_pod_manifest(
        "finisher",
        json!({
            "restartPolicy": "Never",
            "containers": [{"name": "main", "command": ["sh", "-c", "sleep 15; exit 0"]}],
        }),
    ))
    .await;
    let steady = n.wait_api_running("steady").await;
    n.wait_api_running("finisher").await;
    let steady_uid = uid(&steady);
    let Some(main) = container(&steady, "main") else { panic!("no status of main:\n{}", pretty(&steady)) };
    let steady_id = runtime_id(main);

    // the outage: kube-apiserver stops (etcd keeps the cluster's state); the finisher exits meanwhile
    plane.stop_apiserver().await;
    if let Ok(p) = n.pods_api().get_opt("steady").await {
        panic!("the API server still answers after it was stopped: {p:?}");
    }
    let until = Instant::now() + OUTAGE;
    while Instant::now() < until {
        if let Some(status) = n.exit_status() {
            panic!("nodelet exited during the API server outage ({status})\n{}", n.tail());
        }
        sleep(Duration::from_secs(1)).await;
    }
    plane.start_again().await;

    // the status change of the outage reaches the API
    let finisher = n
        .wait_api_pod("finisher", "phase Succeeded (its container exited 0 during the outage)", WAIT, |p| {
            phase(p) == "Succeeded"
        })
        .await;
    let exit = container(&finisher, "main").and_then(terminated).map(|(code, _)| code);
    assert_eq!(exit, Some(0), "the finisher's exit code:\n{}", pretty(&finisher));

    // the steady pod was never restarted
    let steady = n.wait_api_running("steady").await;
    let Some(main) = container(&steady, "main") else { panic!("no status of main:\n{}", pretty(&steady)) };
    assert_eq!(
        runtime_id(main),
        steady_id,
        "the container ID changed across the outage:\n{}",
        pretty(&steady)
    );
    assert_eq!(main.restart_count, 0, "restartCount after the outage:\n{}", pretty(&steady));
    let in_runtime: Vec<String> = n.containers_of(&steady_uid).await.into_iter().map(|c| c.id).collect();
    assert_eq!(in_runtime, vec![steady_id.clone()], "the steady pod's containers in the runtime");
    assert_eq!(running(&n.containers_of(&steady_uid).await), vec![steady_id], "still running");
    if let Err(e) = n.healthz_ok().await {
        panic!("nodelet is not healthy after the outage: {e}\n{}", n.tail());
    }

    // the pod watch is back: a pod created after the outage runs. Its reconnection waits out the
    // watcher's back-off (client-go's: 0.8 s doubling to 30 s, jittered), which after a 30 s outage can
    // be most of the wait below; the teardown's deletions would otherwise race it.
    n.create_pod(&n.api_pod_manifest(
        "after",
        json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}),
    ))
    .await;
    n.wait_api_pod("after", "phase Running (the pod watch reconnected)", Duration::from_secs(120), |p| {
        phase(p) == "Running"
    })
    .await;

    n.shutdown().await;
    drop(plane);
}

// ------------------------------------------------------------------------------------------------ (j) Deployment

#[tokio::test]
async fn a_deployment_is_scheduled_onto_the_node_and_its_pods_run() {
    const TEST: &str = "a_deployment_is_scheduled_onto_the_node_and_its_pods_run";
    let (env, cluster) = cluster_or_skip!(TEST);
    if let Err(why) = cluster.controllers_running() {
        let binaries =
            ["kube-controller-manager", "kube-scheduler"].iter().all(|b| cluster.assets.join(b).is_file());
        if binaries && std::env::var("NODELET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
            panic!(
                "{why}, though their binaries are in {}: start the control plane with ENVTEST_CONTROLLERS=1",
                cluster.assets.display()
            );
        }
        eprintln!(
            "SKIP {TEST}: {why} (needs kube-controller-manager and kube-scheduler: ENVTEST_CONTROLLERS=1)"
        );
        return;
    }
    let n = ClusterNode::start(&env, &cluster, "deploy").await;
    let ns = n.namespace().to_owned();
    n.wait_until(&format!("Node {} Ready=True", n.node()), WAIT, async || match n.node_object().await {
        Some(x) if node_condition(&x, "Ready").is_some_and(|c| c.status == "True") => Ok(()),
        Some(x) => Err(pretty(&x)),
        None => Err("no such Node".to_owned()),
    })
    .await;

    let image = format!("--image={}", env.busybox);
    let create =
        ["create", "deployment", "web", &image, "--replicas=3", "-n", &ns, "--dry-run=client", "-o", "json"];
    let args: Vec<&str> = create.iter().copied().chain(["--", "sleep", "3600"]).collect();
    let (ok, out, err) = n.kubectl(&args, None).await;
    assert!(ok, "kubectl {args:?}: {err}");
    let mut deployment: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    deployment["metadata"]["namespace"] = json!(ns);
    let spec = &mut deployment["spec"]["template"]["spec"];
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": n.node()});
    spec["automountServiceAccountToken"] = json!(false);
    spec["terminationGracePeriodSeconds"] = json!(2);
    spec["dnsPolicy"] = json!("None");
    spec["dnsConfig"] = json!({"nameservers": ["127.0.0.1"]});
    for c in spec["containers"].as_array_mut().into_iter().flatten() {
        c["imagePullPolicy"] = json!("IfNotPresent");
    }
    let text = deployment.to_string();
    let (ok, _, err) = n.kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&text)).await;
    assert!(ok, "kubectl apply of\n{}\n: {err}", pretty(&deployment));

    let web = ListParams::default().labels("app=web");
    let list = async || match n.pods_api().list(&web).await {
        Ok(l) => l.items,
        Err(e) => panic!("cannot list the pods of deployment web: {e}"),
    };
    n.wait_until(
        "3 pods of deployment web Running and Ready on the node",
        Duration::from_secs(90),
        async || {
            let pods = list().await;
            let good = pods
                .iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n.node())
                        && phase(p) == "Running"
                        && is_true(p, "Ready")
                })
                .count();
            if good == 3 && pods.len() == 3 { Ok(()) } else { Err(pretty(&pods)) }
        },
    )
    .await;
    let uids: Vec<String> = list().await.iter().map(uid).collect();
    for u in &uids {
        assert_eq!(running(&n.containers_of(u).await).len(), 1, "running containers of pod UID {u}");
    }

    // clean up: the deployment, then its pods leave the API and the runtime
    let (ok, _, err) =
        n.kubectl(&["delete", "deployment", "web", "-n", &ns, "--wait=true", "--timeout=60s"], None).await;
    assert!(ok, "kubectl delete deployment web: {err}");
    n.wait_until("the pods of deployment web to be gone from the API", WAIT, async || {
        let pods = list().await;
        if pods.is_empty() { Ok(()) } else { Err(pretty(&pods)) }
    })
    .await;
    for u in &uids {
        n.wait_runtime_clear_of(u, Duration::from_secs(30)).await;
    }

    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ the kubelet API

/// GET `path` on nodelet's main port with `client` and an optional bearer token: (status, body), or the
/// transport error (e.g. a refused TLS handshake).
async fn main_get(
    n: &ClusterNode,
    client: &reqwest::Client,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let mut request = client.get(n.main_url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| format!("GET {path}: {e:?}"))?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|e| format!("GET {path}: body: {e}"))?;
    Ok((status, body))
}

/// Like [`main_get`], panicking on a transport error.
async fn main_get_ok(
    n: &ClusterNode,
    client: &reqwest::Client,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    match main_get(n, client, path, token).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{}", n.tail()),
    }
}

#[tokio::test]
async fn the_main_port_authenticates_with_token_reviews_and_authorizes_with_subject_access_reviews() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::PostParams;

    let (env, cluster) = cluster_or_skip!(
        "the_main_port_authenticates_with_token_reviews_and_authorizes_with_subject_access_reviews"
    );
    // The API server's CA also signs its kubelet client certificate (user kube-apiserver-kubelet-client,
    // group system:masters): the client CA of nodelet's main port.
    let options = StartOptions {
        config_extra: format!(
            "authentication:\n  x509: {{clientCAFile: {}}}\n  webhook: {{enabled: true, cacheTTL: 30s}}\n\
             authorization:\n  mode: Webhook\n  webhook: {{cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 1s}}",
            cluster.ca.display()
        ),
        ..StartOptions::default()
    };
    let n = ClusterNode::start_with(&env, &cluster, "webhook", options).await;
    let client = n.main_client_with(None);
    let ns = n.namespace().to_owned();

    // (a) the API server's admin token (a static token of the API server, not of nodelet): TokenReview says
    // admin in system:masters, the SubjectAccessReview allows.
    let admin_token = n.cluster().admin_token.clone();
    let (code, body) = main_get_ok(&n, &client, "/pods", Some(&admin_token)).await;
    assert_eq!(code, 200, "GET /pods with the admin token: {body}\n{}", n.tail());
    assert!(body.contains("\"kind\":\"PodList\""), "{body}");

    // (b) a fresh ServiceAccount without RBAC: authenticated, not authorized.
    let accounts: Api<ServiceAccount> = Api::namespaced(n.client(), &ns);
    let sa: ServiceAccount = match serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": ns},
    })) {
        Ok(sa) => sa,
        Err(e) => panic!("bad service account: {e}"),
    };
    if let Err(e) = accounts.create(&PostParams::default(), &sa).await {
        panic!("cannot create service account {ns}/reader: {e}");
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let sa_token = match accounts.create_token_request("reader", &PostParams::default(), &request).await {
        Ok(t) => t.status.and_then(|s| s.token).unwrap_or_default(),
        Err(e) => panic!("cannot request a token of {ns}/reader: {e}"),
    };
    assert!(!sa_token.is_empty(), "the TokenRequest returned no token");
    let sa_user = format!("system:serviceaccount:{ns}:reader");
    let (code, body) = main_get_ok(&n, &client, "/pods", Some(&sa_token)).await;
    assert_eq!(code, 403, "GET /pods as {sa_user}: {body}");
    let forbidden =
        |sub: &str| format!("Forbidden (user={sa_user}, verb=get, resource=nodes, subresource(s)=[{sub}])");
    assert!(body.contains(&forbidden("proxy")), "GET /pods as {sa_user}: {body}");
    let (code, body) = main_get_ok(&n, &client, "/metrics", Some(&sa_token)).await;
    assert_eq!(code, 403, "GET /metrics as {sa_user}: {body}");
    assert!(body.contains(&forbidden("metrics")), "GET /metrics as {sa_user}: {body}");

    // ... then granted nodes/metrics: /metrics within the unauthorized cache TTL (1 s), /pods still not.
    let role_name = format!("e2e-node-metrics-{}", n.node());
    let role: ClusterRole = match serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role_name},
        "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}],
    })) {
        Ok(r) => r,
        Err(e) => panic!("bad cluster role: {e}"),
    };
    let binding: ClusterRoleBinding = match serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    })) {
        Ok(b) => b,
        Err(e) => panic!("bad cluster role binding: {e}"),
    };
    let roles: Api<ClusterRole> = Api::all(n.client());
    let bindings: Api<ClusterRoleBinding> = Api::all(n.client());
    if let Err(e) = roles.create(&PostParams::default(), &role).await {
        panic!("cannot create cluster role {role_name}: {e}");
    }
    if let Err(e) = bindings.create(&PostParams::default(), &binding).await {
        panic!("cannot create cluster role binding {role_name}: {e}");
    }
    let granted_at = Instant::now();
    let metrics = n
        .wait_until("GET /metrics to be allowed after the grant", Duration::from_secs(20), async || {
            match main_get(&n, &client, "/metrics", Some(&sa_token)).await {
                Ok((200, body)) => Ok(body),
                Ok((code, body)) => Err(format!("{code}: {body}")),
                Err(e) => Err(e),
            }
        })
        .await;
    assert!(metrics.contains("# TYPE"), "the metrics: {metrics}");
    assert!(granted_at.elapsed() < Duration::from_secs(10), "allowed only after {:?}", granted_at.elapsed());
    let (code, body) = main_get_ok(&n, &client, "/pods", Some(&sa_token)).await;
    assert_eq!(code, 403, "GET /pods after the nodes/metrics grant: {body}");

    // (c) a forged token: the TokenReview says not authenticated.
    // The service account's header and claims with another signature.
    let signed = sa_token.rsplit_once('.').map_or(sa_token.as_str(), |(head, _)| head);
    let forged = format!("{signed}.{}", "A".repeat(342));
    let (code, body) = main_get_ok(&n, &client, "/pods", Some(&forged)).await;
    assert_eq!(code, 401, "GET /pods with a forged token: {body}");
    let (code, body) = main_get_ok(&n, &client, "/pods", None).await;
    assert_eq!(code, 401, "GET /pods without credentials (anonymous is off): {body}");

    // (d) the API server's kubelet client certificate (envtest's CA): kube-apiserver-kubelet-client in
    // system:masters.
    let pki = cluster.base.join("pki");
    let mut identity = Vec::new();
    for file in ["apiserver-kubelet-client.key", "apiserver-kubelet-client.crt"] {
        match std::fs::read(pki.join(file)) {
            Ok(bytes) => identity.extend(bytes),
            Err(e) => panic!("cannot read {}: {e}", pki.join(file).display()),
        }
    }
    let cert_client = n.main_client_with(Some(&identity));
    let (code, body) = main_get_ok(&n, &cert_client, "/pods", None).await;
    assert_eq!(code, 200, "GET /pods with the API server's kubelet client certificate: {body}");
    // A certificate of another CA naming the same user never authenticates.
    let mut params = match rcgen::CertificateParams::new(Vec::<String>::new()) {
        Ok(p) => p,
        Err(e) => panic!("certificate params: {e}"),
    };
    params.distinguished_name.push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:masters");
    let key = match rcgen::KeyPair::generate() {
        Ok(k) => k,
        Err(e) => panic!("key: {e}"),
    };
    let self_signed = match params.self_signed(&key) {
        Ok(c) => c,
        Err(e) => panic!("self-signed certificate: {e}"),
    };
    let foreign = format!("{}{}", key.serialize_pem(), self_signed.pem());
    let foreign_client = n.main_client_with(Some(foreign.as_bytes()));
    match main_get(&n, &foreign_client, "/pods", None).await {
        Err(_) => {} // the handshake refused the certificate
        Ok((code, body)) => assert_eq!(code, 401, "GET /pods with a self-signed client certificate: {body}"),
    }

    // (e) kubectl logs: the API server fetches the log from nodelet's main port with its kubelet client
    // certificate, authorized by a SubjectAccessReview (nodes/proxy).
    let manifest = n.api_pod_manifest(
        "talker",
        json!({"containers": [{"name": "main", "command": sleep_until_term("echo hello-from-nodelet; ")}]}),
    );
    n.create_pod(&manifest).await;
    n.wait_api_running("talker").await;
    let logs = n
        .wait_until("kubectl logs to show the container's output", WAIT, async || {
            match n.kubectl(&["-n", &ns, "logs", "talker"], None).await {
                (true, out, _) if out.contains("hello-from-nodelet") => Ok(out),
                (ok, out, err) => Err(format!("success {ok}, stdout {out:?}, stderr {err:?}")),
            }
        })
        .await;
    assert_eq!(logs.trim(), "hello-from-nodelet", "kubectl logs");

    // nodelet's own TokenReviews and SubjectAccessReviews were allowed for system:node:<node>.
    n.assert_no_forbidden_in_log();
    let log = n.log();
    for secret in [&admin_token, &sa_token] {
        assert!(!log.contains(secret.as_str()), "a bearer token is in nodelet's log");
    }

    let _ = bindings.delete(&role_name, &DeleteParams::default()).await;
    let _ = roles.delete(&role_name, &DeleteParams::default()).await;
    n.shutdown().await;
}

/// A ClusterRole with `rules` bound to ServiceAccount `namespace/account`; both named `name`.
async fn grant(n: &ClusterNode, name: &str, namespace: &str, account: &str, rules: Value) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::PostParams;
    let role: ClusterRole = match serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
        "rules": rules,
    })) {
        Ok(r) => r,
        Err(e) => panic!("bad cluster role: {e}"),
    };
    let binding: ClusterRoleBinding = match serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    })) {
        Ok(b) => b,
        Err(e) => panic!("bad cluster role binding: {e}"),
    };
    if let Err(e) = Api::<ClusterRole>::all(n.client()).create(&PostParams::default(), &role).await {
        panic!("cannot create cluster role {name}: {e}");
    }
    if let Err(e) = Api::<ClusterRoleBinding>::all(n.client()).create(&PostParams::default(), &binding).await
    {
        panic!("cannot create cluster role binding {name}: {e}");
    }
}

/// Removes what [`grant`] created.
async fn revoke(n: &ClusterNode, name: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let _ = Api::<ClusterRoleBinding>::all(n.client()).delete(name, &DeleteParams::default()).await;
    let _ = Api::<ClusterRole>::all(n.client()).delete(name, &DeleteParams::default()).await;
}

/// A token of a new ServiceAccount `namespace/name` (no RBAC of its own).
async fn service_account_token(n: &ClusterNode, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::PostParams;
    let accounts: Api<ServiceAccount> = Api::namespaced(n.client(), namespace);
    let sa: ServiceAccount = match serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace},
    })) {
        Ok(sa) => sa,
        Err(e) => panic!("bad service account: {e}"),
    };
    if let Err(e) = accounts.create(&PostParams::default(), &sa).await {
        panic!("cannot create service account {namespace}/{name}: {e}");
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    match accounts.create_token_request(name, &PostParams::default(), &request).await {
        Ok(t) => {
            t.status.and_then(|s| s.token).filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("no token"))
        }
        Err(e) => panic!("cannot request a token of {namespace}/{name}: {e}"),
    }
}

/// `POST /run/default/{pod}/app?cmd=…` with a bearer token: (status, body).
async fn main_run(
    n: &ClusterNode,
    client: &reqwest::Client,
    pod: &str,
    cmd: &str,
    token: &str,
) -> (u16, String) {
    let url = n.main_url(&format!("/run/default/{pod}/app?cmd={}", cmd.replace(' ', "+")));
    let response = match client.post(&url).bearer_auth(token).send().await {
        Ok(r) => r,
        Err(e) => panic!("POST {url}: {e:?}\n{}", n.tail()),
    };
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Issue 37: with a KubeletConfiguration that sets nothing but the client CA (what kubeadm writes), the file
/// format's defaults hold (TokenReview on, Webhook authorization): the cluster admin's token works, a
/// ServiceAccount token without RBAC gets 403 from `/exec`, `/run`, `/configz` and `/pods`, `get` on
/// `nodes/proxy` opens the reads but not exec or run (a WebSocket exec is a GET, authorized as `create`),
/// and `create` opens those.
#[tokio::test]
async fn a_client_ca_only_config_authorizes_service_account_tokens_through_rbac_on_nodes_proxy() {
    use crate::exec::{exec_query, shell_pod, ws};

    let (env, cluster) = cluster_or_skip!(
        "a_client_ca_only_config_authorizes_service_account_tokens_through_rbac_on_nodes_proxy"
    );
    let options = StartOptions {
        config_extra: format!("authentication:\n  x509:\n    clientCAFile: {}", cluster.ca.display()),
        ..StartOptions::default()
    };
    let n = ClusterNode::start_with(&env, &cluster, "authz-defaults", options).await;
    let client = n.main_client_with(None);
    let ns = n.namespace().to_owned();
    let (pod, _uid) = shell_pod(&n, "target").await;
    let exec_path = format!("/exec/default/{pod}/app?{}", exec_query(&["echo", "exec-ok"], false, false));

    // The cluster admin's token (a static token of the API server): TokenReview and SubjectAccessReview.
    let admin_token = n.cluster().admin_token.clone();
    let (code, body) = main_get_ok(&n, &client, "/pods", Some(&admin_token)).await;
    assert_eq!(code, 200, "GET /pods with the cluster admin's token: {body}\n{}", n.tail());

    let sa_token = service_account_token(&n, &ns, "intruder").await;
    let sa_user = format!("system:serviceaccount:{ns}:intruder");
    let forbidden = |verb: &str| {
        format!("Forbidden (user={sa_user}, verb={verb}, resource=nodes, subresource(s)=[proxy])")
    };
    for path in ["/pods", "/configz"] {
        let (code, body) = main_get_ok(&n, &client, path, Some(&sa_token)).await;
        assert_eq!(code, 403, "GET {path} as {sa_user}: {body}\n{}", n.tail());
        assert!(body.contains(&forbidden("get")), "GET {path}: {body}");
    }
    let (code, body) = main_run(&n, &client, &pod, "echo run-ok", &sa_token).await;
    assert_eq!(code, 403, "POST /run as {sa_user}: {body}");
    assert!(body.contains(&forbidden("create")), "POST /run: {body}");
    match ws(&n, &exec_path, Some(&sa_token), "v4.channel.k8s.io").await {
        Ok(_) => panic!("a WebSocket exec as {sa_user} without RBAC was let in"),
        Err((code, body)) => {
            assert_eq!(code, 403, "exec as {sa_user}: {body}");
            assert!(body.contains(&forbidden("create")), "exec: {body}");
        }
    }

    // get on nodes/proxy: the reads (after the 30 s the denial may stay cached), not exec or run.
    let reader = format!("e2e-proxy-get-{}", n.node());
    grant(
        &n,
        &reader,
        &ns,
        "intruder",
        json!([{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]),
    )
    .await;
    n.wait_until("GET /pods to be allowed after get on nodes/proxy", WAIT, async || {
        match main_get(&n, &client, "/pods", Some(&sa_token)).await {
            Ok((200, body)) => Ok(body),
            Ok((code, body)) => Err(format!("{code}: {body}")),
            Err(e) => Err(e),
        }
    })
    .await;
    let (code, body) = main_get_ok(&n, &client, "/configz", Some(&sa_token)).await;
    assert_eq!(code, 200, "GET /configz with get on nodes/proxy: {body}");
    match ws(&n, &exec_path, Some(&sa_token), "v4.channel.k8s.io").await {
        Ok(_) => panic!("a WebSocket exec (a GET) was let in with only get on nodes/proxy"),
        Err((code, body)) => {
            assert!(code == 403 && body.contains(&forbidden("create")), "exec: {code} {body}")
        }
    }

    // create on nodes/proxy: /run and /exec.
    let runner = format!("e2e-proxy-create-{}", n.node());
    grant(
        &n,
        &runner,
        &ns,
        "intruder",
        json!([{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["create"]}]),
    )
    .await;
    let out = n
        .wait_until("POST /run to be allowed after create on nodes/proxy", WAIT, async || {
            match main_run(&n, &client, &pod, "echo run-ok", &sa_token).await {
                (200, body) => Ok(body),
                (code, body) => Err(format!("{code}: {body}")),
            }
        })
        .await;
    assert_eq!(out.trim(), "run-ok");
    match ws(&n, &exec_path, Some(&sa_token), "v4.channel.k8s.io").await {
        Ok(_) => {} // 101: the session is open
        Err((code, body)) => panic!("exec with create on nodes/proxy: {code}: {body}\n{}", n.tail()),
    }

    revoke(&n, &reader).await;
    revoke(&n, &runner).await;
    n.remove_manifest("target.yaml");
    n.shutdown().await;
}

/// The fixture reads envtest's `env.sh` without a shell: the lines `start.sh` writes.
#[test]
fn envtest_env_files_are_parsed_without_a_shell() {
    let vars = parse_env_file(
        "export ENVTEST_BASE=\"/tmp/x y\"\nexport APISERVER_URL=\"https://127.0.0.1:26443\"\n# comment\nexport PLAIN=v=1\n",
    );
    assert_eq!(vars.get("ENVTEST_BASE").map(String::as_str), Some("/tmp/x y"));
    assert_eq!(vars.get("APISERVER_URL").map(String::as_str), Some("https://127.0.0.1:26443"));
    assert_eq!(vars.get("PLAIN").map(String::as_str), Some("v=1"));
    assert_eq!(vars.len(), 3, "{vars:?}");
}

// ------------------------------------------------------------------------------------------------ admission

#[tokio::test]
async fn a_pod_that_does_not_fit_the_node_is_refused_with_the_kubelets_reason() {
    let (env, cluster) =
        cluster_or_skip!("a_pod_that_does_not_fit_the_node_is_refused_with_the_kubelets_reason");
    let n = ClusterNode::start(&env, &cluster, "admission").await;
    let manifest = n.api_pod_manifest(
        "greedy",
        json!({"containers": [{"name": "main", "command": ["sleep", "3600"],
                               "resources": {"requests": {"cpu": "100000"}}}]}),
    );
    n.create_pod(&manifest).await;
    let pod = n
        .wait_api_pod("greedy", "phase Failed with reason OutOfcpu", WAIT, |p| {
            phase(p) == "Failed" && p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("OutOfcpu")
        })
        .await;
    let message = pod.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
    assert!(message.contains("Node didn't have enough resource: cpu, requested: 100000000"), "{message}");
    assert!(n.sandboxes_of(&uid(&pod)).await.is_empty(), "a refused pod never gets a sandbox");
    // A pod that fits still runs.
    n.create_pod(&n.api_pod_manifest(
        "small",
        json!({"containers": [{"name": "main", "command": ["sleep", "3600"],
        "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}}}]}),
    ))
    .await;
    n.wait_api_running("small").await;
    n.shutdown().await;
}

#[tokio::test]
async fn a_runtime_class_from_the_api_picks_the_sandbox_handler_and_its_overhead_counts() {
    let (env, cluster) =
        cluster_or_skip!("a_runtime_class_from_the_api_picks_the_sandbox_handler_and_its_overhead_counts");
    let n = ClusterNode::start(&env, &cluster, "rtclass").await;
    // A pod naming no class: the node neither lists nor watches RuntimeClasses for it.
    const WATCHING: &str = "listing and watching RuntimeClasses";
    n.create_pod(
        &n.api_pod_manifest("plain", json!({"containers": [{"name": "main", "command": ["sleep", "3600"]}]})),
    )
    .await;
    n.wait_api_running("plain").await;
    assert!(!n.log().contains(WATCHING), "RuntimeClasses watched before a pod named one\n{}", n.tail());
    // RuntimeClasses are cluster-scoped: one named after this node
    let name = format!("runc-{}", n.node());
    let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(n.client());
    let class = serde_json::from_value(json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
        "handler": "runc", "overhead": {"podFixed": {"cpu": "5m", "memory": "1Mi"}}}))
    .unwrap_or_else(|e| panic!("RuntimeClass: {e}"));
    if let Err(e) = classes.create(&kube::api::PostParams::default(), &class).await {
        panic!("cannot create RuntimeClass {name}: {e}");
    }
    n.create_pod(&n.api_pod_manifest(
        "classy",
        json!({"runtimeClassName": name, "terminationGracePeriodSeconds": 1,
               "containers": [{"name": "main", "command": sleep_until_term("")}]}),
    ))
    .await;
    let pod = n.wait_api_running("classy").await;
    // the API server's RuntimeClass admission copied the overhead into the pod
    let overhead = pod.spec.as_ref().and_then(|s| s.overhead.clone()).unwrap_or_default();
    assert_eq!(overhead.get("cpu").map(|q| q.0.as_str()), Some("5m"), "{}", pretty(&pod));
    let sandboxes = n.sandboxes_of(&uid(&pod)).await;
    assert_eq!(sandboxes.iter().map(|s| s.runtime_handler.as_str()).collect::<Vec<_>>(), vec!["runc"]);
    // the first pod naming a class started the watch, and its sandbox waited for the list rather than fail
    assert!(n.log().contains(WATCHING), "no RuntimeClass watch started\n{}", n.tail());
    let events: Api<Event> = Api::namespaced(n.client(), n.namespace());
    let of_pod = ListParams::default().fields("involvedObject.name=classy");
    let reasons: Vec<String> = match events.list(&of_pod).await {
        Ok(l) => l.items.into_iter().filter_map(|e| e.reason).collect(),
        Err(e) => panic!("cannot list the events of pod classy: {e}"),
    };
    assert!(!reasons.iter().any(|r| r == "FailedCreatePodSandBox"), "events of pod classy: {reasons:?}");
    let _ = classes.delete(&name, &DeleteParams::default()).await;
    n.shutdown().await;
}

#[tokio::test]
async fn a_running_pods_resources_are_resized_in_place_or_with_a_restart_as_its_resize_policy_says() {
    let (env, cluster) = cluster_or_skip!(
        "a_running_pods_resources_are_resized_in_place_or_with_a_restart_as_its_resize_policy_says"
    );
    // kubectl exec reads the container's cgroup through the API server
    let options = crate::cluster_support::api_server_client_options(&cluster);
    let n = ClusterNode::start_with(&env, &cluster, "resize", options).await;
    let resources = |cpu_request: &str, cpu_limit: &str, memory_limit: &str| json!({"requests": {"cpu": cpu_request, "memory": "16Mi"}, "limits": {"cpu": cpu_limit, "memory": memory_limit}});
    n.create_pod(&n.api_pod_manifest(
        "resizable",
        json!({"containers": [{"name": "main", "command": sleep_until_term(""),
            "resources": resources("100m", "200m", "64Mi"),
            "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                             {"resourceName": "memory", "restartPolicy": "RestartContainer"}]}]}),
    ))
    .await;
    let pod = n.wait_api_running("resizable").await;
    let first_id = container(&pod, "main").map(runtime_id).unwrap_or_default();
    let patch =
        |resources: Value| json!({"spec": {"containers": [{"name": "main", "resources": resources}]}});
    let apply = async |body: Value| {
        let params = kube::api::PatchParams::default();
        if let Err(e) = n.pods_api().patch("resizable", &params, &kube::api::Patch::Strategic(body)).await {
            panic!("cannot patch the pod's resources (is InPlacePodVerticalScaling on?): {e}");
        }
    };
    let limits_of = |p: &Pod, key: &str| {
        container(p, "main")
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(key))
            .map(|q| q.0.clone())
    };

    // CPU (NotRequired): the same container, its cgroup changed, reported in the status
    apply(patch(resources("100m", "400m", "64Mi"))).await;
    let pod = n
        .wait_api_pod(
            "resizable",
            "containerStatuses[0].resources.limits.cpu 400m, no resize pending",
            WAIT,
            |p| {
                limits_of(p, "cpu").as_deref() == Some("400m")
                    && p.status.as_ref().is_some_and(|s| s.resize.is_none())
            },
        )
        .await;
    let main = container(&pod, "main").expect("main status");
    assert_eq!((runtime_id(main), main.restart_count), (first_id.clone(), 0), "resized in place");
    let cri = n.container_status(&first_id).await;
    let linux = cri.resources.and_then(|r| r.linux).unwrap_or_default();
    assert_eq!((linux.cpu_quota, linux.cpu_period), (40_000, 100_000), "the runtime applied the new quota");
    // and the container's own cgroup says so (cgroup v1: the container's cpu controller is mounted there;
    // v2: cpu.max)
    let script =
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max";
    let (ok, out, err) =
        n.kubectl(&["exec", "-n", n.namespace(), "resizable", "--", "sh", "-c", script], None).await;
    assert!(ok && out.trim() == "40000", "the container's cgroup quota: {out:?} {err}");
    let allocated = main.allocated_resources.clone().unwrap_or_default();
    assert_eq!(allocated.get("cpu").map(|q| q.0.as_str()), Some("100m"), "{}", pretty(&pod));

    // Memory (RestartContainer): the container is restarted with the new limit
    apply(patch(resources("100m", "400m", "128Mi"))).await;
    let pod = n
        .wait_api_pod("resizable", "restarted with a 128Mi limit", WAIT, |p| {
            container(p, "main").is_some_and(|c| c.restart_count == 1)
                && limits_of(p, "memory").as_deref() == Some(&(128_i64 << 20).to_string())
        })
        .await;
    let second_id = container(&pod, "main").map(runtime_id).unwrap_or_default();
    assert_ne!(second_id, first_id);
    let linux = n.container_status(&second_id).await.resources.and_then(|r| r.linux).unwrap_or_default();
    assert_eq!(linux.memory_limit_in_bytes, 128 << 20);

    // More than the node has: Infeasible, the container keeps what it has
    apply(patch(resources("100000", "100000", "128Mi"))).await;
    let pod = n
        .wait_api_pod("resizable", "status.resize Infeasible", WAIT, |p| {
            p.status.as_ref().and_then(|s| s.resize.as_deref()) == Some("Infeasible")
        })
        .await;
    assert_eq!(container(&pod, "main").map(runtime_id), Some(second_id.clone()));
    assert_eq!(limits_of(&pod, "cpu").as_deref(), Some("400m"));
    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ debugging

/// The status of ephemeral container `name`.
fn ephemeral<'a>(pod: &'a Pod, name: &str) -> Option<&'a k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status.as_ref()?.ephemeral_container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

#[tokio::test]
async fn ephemeral_containers_from_the_api_run_once_in_the_targets_pid_namespace_and_kubectl_debug_attaches()
{
    use kube::api::{Patch, PatchParams};

    let (env, cluster) = cluster_or_skip!(
        "ephemeral_containers_from_the_api_run_once_in_the_targets_pid_namespace_and_kubectl_debug_attaches"
    );
    // The API server reaches the main port with its kubelet client certificate (for `kubectl debug -it`).
    let options = StartOptions {
        config_extra: format!(
            "authentication:\n  x509: {{clientCAFile: {}}}\n  webhook: {{enabled: true, cacheTTL: 30s}}\n\
             authorization:\n  mode: Webhook\n  webhook: {{cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 1s}}",
            cluster.ca.display()
        ),
        ..StartOptions::default()
    };
    let n = ClusterNode::start_with(&env, &cluster, "debug", options).await;
    let ns = n.namespace().to_owned();
    let manifest = n.api_pod_manifest(
        "target",
        json!({"containers": [{"name": "main", "command": sleep_until_term("echo main-is-up; ")}]}),
    );
    n.create_pod(&manifest).await;
    let pod = n.wait_api_running("target").await;
    let uid = uid(&pod);
    let main_id = container(&pod, "main").map(runtime_id);

    // (a) through the API's ephemeralcontainers subresource (a strategic merge patch, as kubectl does): it
    // runs once, sees the target's processes (the `while true` loop of `main`'s shell), and its status
    // reaches the API; it exits 3 and is not restarted.
    let patch = json!({"spec": {"ephemeralContainers": [{
        "name": "debugger",
        "image": env.busybox,
        "imagePullPolicy": "IfNotPresent",
        "targetContainerName": "main",
        "command": ["sh", "-c", "ps -o pid,args; echo debug-done; exit 3"],
    }]}});
    if let Err(e) = n
        .pods_api()
        .patch_subresource("ephemeralcontainers", "target", &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        panic!("PATCH pods/target/ephemeralcontainers: {e}");
    }
    let pod = n
        .wait_api_pod("target", "ephemeral container debugger terminated with 3", WAIT, |p| {
            ephemeral(p, "debugger").and_then(terminated).is_some_and(|(code, _)| code == 3)
        })
        .await;
    let dump = pretty(&pod);
    let debugger = ephemeral(&pod, "debugger").expect("status");
    assert!(!debugger.ready && debugger.restart_count == 0, "{dump}");
    assert_eq!(phase(&pod), "Running", "an ephemeral container's exit does not end the pod:\n{dump}");
    assert!(is_true(&pod, "Ready"), "nor its readiness:\n{dump}");
    assert_eq!(container(&pod, "main").map(runtime_id), main_id, "main is untouched:\n{dump}");
    let logs = n
        .wait_until("kubectl logs -c debugger", WAIT, async || {
            match n.kubectl(&["-n", &ns, "logs", "target", "-c", "debugger"], None).await {
                (true, out, _) if out.contains("debug-done") => Ok(out),
                (ok, out, err) => Err(format!("success {ok}, stdout {out:?}, stderr {err:?}")),
            }
        })
        .await;
    assert!(logs.contains("sleep 1"), "the target's processes are visible (shared PID namespace):\n{logs}");
    // Never started again: one container of that name in the runtime, still exited.
    sleep(Duration::from_secs(12)).await;
    let containers = n.containers_of(&uid).await;
    let debuggers: Vec<_> =
        containers.iter().filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == "debugger")).collect();
    assert_eq!(debuggers.len(), 1, "the ephemeral container was started again: {containers:?}");
    let pod = n.api_pod("target").await.expect("pod");
    assert_eq!(ephemeral(&pod, "debugger").map(|s| s.restart_count), Some(0), "{}", pretty(&pod));

    // (b) `kubectl debug -it --target` (stdin piped: no terminal): it adds an ephemeral container, waits
    // for it to run and attaches through the API server and nodelet's main port.
    let image_arg = format!("--image={}", env.busybox);
    let args = [
        "-n",
        &ns,
        "debug",
        "-i",
        "target",
        &image_arg,
        "--image-pull-policy=IfNotPresent",
        "--target=main",
        "--container=attached",
        "--",
        "sh",
        "-c",
        // main's shell, whose command line is there all along (its `sleep 1` is not, between two sleeps);
        // the brackets keep grep from matching itself
        "read line; echo got-$line; ps -o args | grep -q '[w]hile true' && echo sees-main",
    ];
    let (ok, out, err) = kubectl_holding_stdin(n.cluster(), &args, "hello\n", "sees-main").await;
    assert!(ok, "kubectl debug: stdout {out:?}, stderr {err:?}\n{}", n.tail());
    assert!(out.contains("got-hello"), "stdin reached the ephemeral container: {out:?} {err:?}");
    assert!(out.contains("sees-main"), "it sees main's processes: {out:?} {err:?}");
    let pod = n
        .wait_api_pod("target", "ephemeral container attached terminated", WAIT, |p| {
            ephemeral(p, "attached").and_then(terminated).is_some_and(|(code, _)| code == 0)
        })
        .await;
    assert_eq!(pod.status.and_then(|s| s.ephemeral_container_statuses).map(|s| s.len()), Some(2));

    n.assert_no_forbidden_in_log();
    n.shutdown().await;
}

#[tokio::test]
async fn the_nodes_csinode_object_lists_its_registered_csi_drivers() {
    let (env, cluster) = cluster_or_skip!("the_nodes_csinode_object_lists_its_registered_csi_drivers");
    let n = ClusterNode::start(&env, &cluster, "csinode").await;
    let base = n.root_dir().parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let socket = n.root_dir().join("plugins_registry").join("hostpath.sock");
    let _driver = crate::volumes::Killed(
        std::process::Command::new(crate::volumes::csi_hostpath_binary())
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-dir")
            .arg(base.join("csi-data"))
            .args(["--node-id", n.node()])
            .arg("--topology")
            .arg(format!("{TOPOLOGY_KEY}={}", n.node()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the CSI driver: {e}")),
    );
    const TOPOLOGY_KEY: &str = "topology.hostpath.csi/node";
    const NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";
    let csinodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(n.client());
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(n.client());
    let node_name = n.node().to_owned();
    let found = n
        .wait_until("the CSINode object with the driver", WAIT, async || {
            let object = csinodes.get_opt(&node_name).await.map_err(|e| e.to_string())?;
            let object = object.ok_or_else(|| "no CSINode yet".to_owned())?;
            let ok = object
                .spec
                .drivers
                .iter()
                .any(|d| d.name == "hostpath.csi.nodelet.dev" && d.node_id == node_name);
            if ok { Ok(object) } else { Err(pretty(&object)) }
        })
        .await;
    let owner = found.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.first().map(|o| (o.kind.as_str(), o.name.as_str())), Some(("Node", n.node())));
    let keys = found.spec.drivers.first().and_then(|d| d.topology_keys.clone());
    assert_eq!(keys, Some(vec![TOPOLOGY_KEY.to_owned()]), "{}", pretty(&found.spec));
    // The Node carries the driver's node ID (the kubelet's JSON map) and its topology as a label. They are
    // written before the CSINode, so they are there now.
    let node = nodes.get(&node_name).await.unwrap_or_else(|e| panic!("the Node: {e}"));
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(NODE_ID).map(String::as_str),
        Some(format!("{{\"hostpath.csi.nodelet.dev\":\"{node_name}\"}}").as_str()),
        "{}",
        pretty(&node.metadata)
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(TOPOLOGY_KEY), Some(&node_name), "{}", pretty(&node.metadata));
    // The driver going away empties it and takes the annotation and the label along.
    drop(_driver);
    let _ = std::fs::remove_file(&socket);
    n.wait_until("the CSINode without drivers", WAIT, async || {
        let object = csinodes.get_opt(&node_name).await.map_err(|e| e.to_string())?;
        match object {
            Some(o) if o.spec.drivers.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let node = nodes.get(&node_name).await.unwrap_or_else(|e| panic!("the Node: {e}"));
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert!(!annotations.contains_key(NODE_ID), "{}", pretty(&node.metadata));
    assert!(!labels.contains_key(TOPOLOGY_KEY), "{}", pretty(&node.metadata));
    assert!(labels.contains_key("kubernetes.io/hostname"), "nodelet's own labels stay");
    n.assert_no_forbidden_in_log();
    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ conformance

/// The status `reason` of a pod.
fn status_reason(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.reason.as_deref()
}

/// `(status, reason, message)` of the pod's condition `kind`.
fn condition_summary(pod: &Pod, kind: &str) -> Option<(String, Option<String>, Option<String>)> {
    condition(pod, kind).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn admission_refuses_unsafe_sysctls_and_other_oses_and_downward_env_reads_defaulted_divisors() {
    let (env, cluster) = cluster_or_skip!(
        "admission_refuses_unsafe_sysctls_and_other_oses_and_downward_env_reads_defaulted_divisors"
    );
    let n = ClusterNode::start(&env, &cluster, "conform-admit").await;
    let sleeper = json!([{"name": "main", "command": ["sleep", "3600"]}]);
    n.create_pod(&n.api_pod_manifest(
        "unsafe-sysctl",
        json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "10000000000"}]},
               "containers": sleeper}),
    ))
    .await;
    n.create_pod(&n.api_pod_manifest("windows", json!({"os": {"name": "windows"}, "containers": sleeper})))
        .await;
    n.create_pod(&n.api_pod_manifest(
        "safe-sysctl",
        json!({"restartPolicy": "Never",
               "securityContext": {"sysctls": [{"name": "kernel/shm_rmid_forced", "value": "1"}]},
               "containers": [{"name": "main", "command": ["sh", "-c", "test \"$(cat /proc/sys/kernel/shm_rmid_forced)\" = 1"]}]}),
    ))
    .await;
    // No divisor: the API server stores "0", which means 1. No limits in `defaults`: node allocatable.
    let field = |name: &str, resource: &str, divisor: Option<&str>| {
        let mut selector = json!({"resource": resource});
        if let Some(d) = divisor {
            selector["divisor"] = json!(d);
        }
        json!({"name": name, "valueFrom": {"resourceFieldRef": selector}})
    };
    let env_vars = json!([
        field("CPU_LIMIT", "limits.cpu", None),
        field("MEMORY_LIMIT", "limits.memory", None),
        field("CPU_REQUEST", "requests.cpu", Some("1m")),
        field("MEMORY_REQUEST", "requests.memory", None),
    ]);
    n.create_pod(&n.api_pod_manifest(
        "downward",
        json!({"restartPolicy": "Never", "containers": [
            {"name": "limited", "env": env_vars.clone(),
             "resources": {"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"cpu": "1250m", "memory": "64Mi"}},
             "command": ["sh", "-c", "echo $CPU_LIMIT $MEMORY_LIMIT $CPU_REQUEST $MEMORY_REQUEST; \
                 test \"$CPU_LIMIT $MEMORY_LIMIT $CPU_REQUEST $MEMORY_REQUEST\" = '2 67108864 250 33554432'"]},
            {"name": "defaults", "env": env_vars,
             "command": ["sh", "-c", "echo $CPU_LIMIT $MEMORY_LIMIT $CPU_REQUEST $MEMORY_REQUEST; \
                 test \"$CPU_LIMIT\" -ge 1 && test \"$MEMORY_LIMIT\" -gt 67108864 && test \"$CPU_REQUEST $MEMORY_REQUEST\" = '0 0'"]},
        ]}),
    ))
    .await;

    let refused = async |name: &str, reason: &str| {
        let what = format!("phase Failed with reason {reason}");
        n.wait_api_pod(name, &what, WAIT, |p| phase(p) == "Failed" && status_reason(p) == Some(reason)).await
    };
    let pod = refused("unsafe-sysctl", "SysctlForbidden").await;
    let message = pod.status.as_ref().and_then(|s| s.message.clone());
    assert_eq!(message.as_deref(), Some(r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#));
    assert!(n.sandboxes_of(&uid(&pod)).await.is_empty(), "a refused pod never gets a sandbox");
    let pod = refused("windows", "PodOSNotSupported").await;
    let message = pod.status.as_ref().and_then(|s| s.message.clone());
    assert_eq!(message.as_deref(), Some("Failed to admit pod as the OS field doesn't match node OS"));
    n.wait_api_pod("safe-sysctl", "phase Succeeded (the sysctl set in the pod)", WAIT, |p| {
        phase(p) == "Succeeded"
    })
    .await;
    n.wait_api_pod("downward", "phase Succeeded (both containers saw the values they expect)", WAIT, |p| {
        phase(p) == "Succeeded"
    })
    .await;
    n.shutdown().await;
}

#[tokio::test]
async fn init_and_readiness_gate_conditions_read_as_the_kubelets_and_an_updated_active_deadline_stops_the_pod()
 {
    let (env, cluster) = cluster_or_skip!(
        "init_and_readiness_gate_conditions_read_as_the_kubelets_and_an_updated_active_deadline_stops_the_pod"
    );
    let n = ClusterNode::start(&env, &cluster, "conform-status").await;

    // Init containers not done yet: Initialized names both, Ready the app container.
    n.create_pod(&n.api_pod_manifest(
        "initializing",
        json!({"initContainers": [{"name": "init1", "command": sleep_until_term("")},
                                  {"name": "init2", "command": ["true"]}],
               "containers": [{"name": "run1", "command": sleep_until_term("")}]}),
    ))
    .await;
    let pod = n
        .wait_api_pod("initializing", "init1 running", WAIT, |p| {
            crate::support::init_container(p, "init1")
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some())
        })
        .await;
    let dump = pretty(&pod);
    assert_eq!(
        condition_summary(&pod, "Initialized"),
        Some((
            "False".to_owned(),
            Some("ContainersNotInitialized".to_owned()),
            Some("containers with incomplete status: [init1 init2]".to_owned())
        )),
        "{dump}"
    );
    let unready = Some((
        "False".to_owned(),
        Some("ContainersNotReady".to_owned()),
        Some("containers with unready status: [run1]".to_owned()),
    ));
    assert_eq!(condition_summary(&pod, "Ready"), unready, "{dump}");
    assert_eq!(condition_summary(&pod, "ContainersReady"), unready, "{dump}");

    // Readiness gates: Ready once the containers are ready and both gates' conditions are True.
    let (one, two) = ("example.com/gate-one", "example.com/gate-two");
    n.create_pod(&n.api_pod_manifest(
        "gated",
        json!({"readinessGates": [{"conditionType": one}, {"conditionType": two}],
               "containers": [{"name": "main", "command": sleep_until_term("")}]}),
    ))
    .await;
    let pod = n
        .wait_api_pod("gated", "Running with ContainersReady=True", WAIT, |p| {
            phase(p) == "Running" && is_true(p, "ContainersReady")
        })
        .await;
    let gates_missing = format!(
        "corresponding condition of pod readiness gate {one:?} does not exist., \
         corresponding condition of pod readiness gate {two:?} does not exist."
    );
    assert_eq!(
        condition_summary(&pod, "Ready"),
        Some(("False".to_owned(), Some("ReadinessGatesNotReady".to_owned()), Some(gates_missing))),
        "{}",
        pretty(&pod)
    );
    let set_gate = async |gate: &str, status: &str| {
        let body = json!({"status": {"conditions": [{"type": gate, "status": status}]}});
        let params = kube::api::PatchParams::default();
        if let Err(e) = n.pods_api().patch_status("gated", &params, &kube::api::Patch::Strategic(body)).await
        {
            panic!("cannot patch the gate's condition: {e}");
        }
    };
    let ready_message = |p: &Pod| condition(p, "Ready").and_then(|c| c.message.clone()).unwrap_or_default();
    set_gate(one, "True").await;
    let two_missing = format!("corresponding condition of pod readiness gate {two:?} does not exist.");
    let pod = n
        .wait_api_pod("gated", "Ready False for the second gate only", WAIT, |p| {
            ready_message(p) == two_missing
        })
        .await;
    assert!(!is_true(&pod, "Ready"), "{}", pretty(&pod));
    assert!(is_true(&pod, one), "the gate's condition stays as patched: {}", pretty(&pod));
    set_gate(two, "True").await;
    n.wait_api_pod("gated", "Ready True with both gates True", WAIT, |p| is_true(p, "Ready")).await;
    set_gate(one, "False").await;
    let one_false = format!("the status of pod readiness gate {one:?} is not \"True\", but False");
    n.wait_api_pod("gated", "Ready False again", WAIT, |p| {
        !is_true(p, "Ready") && ready_message(p) == one_false
    })
    .await;

    // activeDeadlineSeconds added to a running pod: it is stopped once it has been active that long.
    n.create_pod(&n.api_pod_manifest(
        "deadline",
        json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}),
    ))
    .await;
    let pod = n.wait_api_running("deadline").await;
    let started = pod.status.as_ref().and_then(|s| s.start_time.clone()).map(|t| t.0);
    let body = json!({"spec": {"activeDeadlineSeconds": 8}});
    let params = kube::api::PatchParams::default();
    if let Err(e) = n.pods_api().patch("deadline", &params, &kube::api::Patch::Strategic(body)).await {
        panic!("cannot add activeDeadlineSeconds: {e}");
    }
    let pod = n
        .wait_api_pod("deadline", "phase Failed with reason DeadlineExceeded", WAIT, |p| {
            phase(p) == "Failed" && status_reason(p) == Some("DeadlineExceeded")
        })
        .await;
    let dump = pretty(&pod);
    let message = pod.status.as_ref().and_then(|s| s.message.clone());
    assert_eq!(
        message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline"),
        "{dump}"
    );
    // The containers are killed with the pod's grace period, then show terminated.
    let pod = n
        .wait_api_pod("deadline", "container main terminated", WAIT, |p| {
            container(p, "main").and_then(terminated).is_some()
        })
        .await;
    assert_eq!(status_reason(&pod), Some("DeadlineExceeded"), "{}", pretty(&pod));
    let finished = container(&pod, "main")
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.clone());
    if let (Some(started), Some(finished)) = (started, finished) {
        let active = finished.0.duration_since(started).as_secs_f64();
        assert!(active >= 7.0, "killed {active} s after its start, before its deadline:\n{}", pretty(&pod));
    }
    n.shutdown().await;
}

// ------------------------------------------------------------------------------------------------ one connection

/// The established TCP connections of process `pid` to `port` (any address): its socket fds matched with
/// the entries of `/proc/PID/net/tcp{,6}` in state `01` (ESTABLISHED) whose remote port is `port`.
fn established_to(pid: u32, port: u16) -> Result<usize, String> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    let inodes: BTreeSet<String> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')).map(str::to_owned)
        })
        .collect();
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let path = format!("/proc/{pid}/net/{table}");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) = (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let remote_port = remote.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "01" && remote_port == Some(port) && inodes.contains(*inode) {
                count += 1;
            }
        }
    }
    Ok(count)
}

#[tokio::test]
async fn the_watches_and_the_status_patches_share_one_connection_and_the_lease_has_its_own() {
    let (env, cluster) =
        cluster_or_skip!("the_watches_and_the_status_patches_share_one_connection_and_the_lease_has_its_own");
    let port = cluster
        .apiserver_url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no port in the API server URL {}", cluster.apiserver_url));
    let n = ClusterNode::start(&env, &cluster, "oneconn").await;
    // a running pod: the pod watch, the Services watch (its environment) and the watches of the objects its
    // volumes use are open, its status was patched, and the Lease is renewed meanwhile
    let manifest = n.api_pod_manifest(
        "sleeper",
        json!({"containers": [{"name": "main", "command": sleep_until_term("")}]}),
    );
    n.create_pod(&manifest).await;
    n.wait_api_running("sleeper").await;
    let Some(pid) = n.pid() else { panic!("nodelet is not running\n{}", n.tail()) };
    // several looks over a few Lease renewals (every 2 s here): two connections each time, the node's (HTTP/2:
    // its watches and patches are streams of it; an HTTP/1 client holds one per watch) and the Lease's own
    // (HTTP/1.1, kept open between renewals)
    let mut seen = Vec::new();
    for _ in 0..5 {
        sleep(Duration::from_secs(2)).await;
        match established_to(pid, port) {
            Ok(count) => seen.push(count),
            Err(e) => panic!("cannot count nodelet's connections: {e}"),
        }
    }
    assert!(
        seen.iter().all(|&count| count == 2),
        "nodelet's established connections to the API server (port {port}) at five looks 2 s apart: {seen:?}, \
         expected 2 each time (the node's and the Lease's)\n{}",
        n.tail()
    );
    n.shutdown().await;
}

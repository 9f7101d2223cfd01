//! What fingerprinting an API pod costs (`nodelet_cluster::fingerprint`, once per pod version the watch
//! delivers), against serializing the same pod with `serde_json::to_vec` in the same run.
//!
//! The pods: 30 replicas of a Deployment as the API server sends them once Running (a busybox container
//! with the service-account token volume, the default tolerations, a status with conditions and a
//! container status; managed fields dropped, as the pod source drops them on receipt).
//!
//! `cargo bench -p nodelet-cluster --bench fingerprint` (release profile); prints ns per pod of each and
//! their ratio. `ROUNDS` (default 2,000) passes over the 30 pods are timed, after 200 for warming up.

use std::hint::black_box;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

const PODS: usize = 30;

/// Replica `i` of the Deployment, Running.
fn pod(i: usize) -> Pod {
    let name = format!("web-7d4b9c8f6d-{i:05}");
    let conditions: Vec<_> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": "2026-12-05T14:00:02Z"}))
        .collect();
    let json = serde_json::json!({
        "metadata": {
            "name": name, "namespace": "bench", "uid": format!("0b6b3c3e-5f4a-4a8e-9d6c-{i:012}"),
            "resourceVersion": format!("{}", 1000 + i), "generateName": "web-7d4b9c8f6d-",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d",
                "uid": "6f1d2c3b-aaaa-4bbb-8ccc-000000000001", "controller": true, "blockOwnerDeletion": true}],
            "creationTimestamp": "2026-12-05T14:00:00Z",
        },
        "spec": {
            "nodeName": "hollow-node-0",
            "containers": [{"name": "busybox", "image": "busybox:1.36", "command": ["sleep", "36000"],
                "imagePullPolicy": "IfNotPresent", "resources": {},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0, "restartPolicy": "Always", "schedulerName": "default-scheduler",
            "securityContext": {}, "serviceAccount": "default", "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300}],
        },
        "status": {
            "phase": "Running", "qosClass": "BestEffort", "hostIP": "127.0.0.1", "podIP": "10.64.0.7",
            "startTime": "2026-12-05T14:00:01Z",
            "conditions": conditions,
            "containerStatuses": [{"name": "busybox", "image": "busybox:1.36", "imageID": "sha256:abcdef",
                "containerID": "nodelet-hollow://c-0001", "ready": true, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": "2026-12-05T14:00:02Z"}}}],
        },
    });
    serde_json::from_value(json).unwrap_or_else(|e| panic!("the benchmark's pod does not decode: {e}"))
}

/// Nanoseconds per pod of `f` over `rounds` passes over `pods`.
fn per_pod(pods: &[Pod], rounds: usize, mut f: impl FnMut(&Pod)) -> f64 {
    for _ in 0..200 {
        pods.iter().for_each(&mut f);
    }
    let start = Instant::now();
    for _ in 0..rounds {
        pods.iter().for_each(&mut f);
    }
    start.elapsed().as_nanos() as f64 / (rounds * pods.len()) as f64
}

fn main() {
    let rounds = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(2_000);
    let pods: Vec<Pod> = (0..PODS).map(pod).collect();
    let bytes = serde_json::to_vec(&pods[0]).map(|b| b.len()).unwrap_or(0);
    let fingerprint = per_pod(&pods, rounds, |p| {
        black_box(nodelet_cluster::fingerprint(black_box(p)));
    });
    let to_vec = per_pod(&pods, rounds, |p| {
        black_box(serde_json::to_vec(black_box(p)).map(|b| b.len()).unwrap_or(0));
    });
    println!(
        "{PODS} pods ({bytes} bytes of JSON each), {rounds} rounds: fingerprint {fingerprint:.0} ns/pod, \
         serde_json::to_vec {to_vec:.0} ns/pod, ratio {:.2}",
        fingerprint / to_vec
    );
}

//! Pod data from the API server in cluster mode: ConfigMaps and Secrets as volumes and environment
//! variables (watched: a change reaches the running pod), projected service-account tokens from the
//! TokenRequest API (the automatic `kube-api-access-*` volume and an audience-bound projection; no
//! `FailedMount` event while the token is requested), a
//! missing ConfigMap that keeps the pod waiting with a `FailedMount` event until it appears, a refused
//! token asked for again within seconds, and no secret in nodelet's log. Against the real API server (envtest) and the real containerd.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster_support::{ClusterNode, cluster_or_skip, pretty};
use crate::support::{phase, uid};

/// The generous bound of the waits for something nodelet should do within seconds.
const WAIT: Duration = Duration::from_secs(60);

async fn create_config_map(n: &ClusterNode, name: &str, data: serde_json::Value) {
    let api: Api<ConfigMap> = Api::namespaced(n.client(), n.namespace());
    let cm: ConfigMap = match serde_json::from_value(json!({"metadata": {"name": name}, "data": data})) {
        Ok(c) => c,
        Err(e) => panic!("bad ConfigMap: {e}"),
    };
    if let Err(e) = api.create(&PostParams::default(), &cm).await {
        panic!("cannot create ConfigMap {name}: {e}");
    }
}

/// Creates the object `value` (JSON) through `api`; panics naming the kind on failure.
async fn create<K>(api: &Api<K>, value: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = match serde_json::from_value(value.clone()) {
        Ok(o) => o,
        Err(e) => panic!("not a {}: {e}: {value}", std::any::type_name::<K>()),
    };
    if let Err(e) = api.create(&PostParams::default(), &object).await {
        panic!("cannot create {value}: {e}");
    }
}

/// The text of the container's first log file (CRI format lines, message parts only).
fn container_output(n: &ClusterNode, pod: &str, uid: &str, container: &str) -> String {
    let path = n.logs_dir().join(format!("{}_{pod}_{uid}", n.namespace())).join(container).join("0.log");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).collect::<Vec<_>>().join("\n")
}

/// Reviews `token` with the admin client for `audience` (empty: the API server's).
async fn review(n: &ClusterNode, token: &str, audience: &str) -> TokenReview {
    let api: Api<TokenReview> = Api::all(n.client());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: (!audience.is_empty()).then(|| vec![audience.to_owned()]),
        },
        ..TokenReview::default()
    };
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => r,
        Err(e) => panic!("TokenReview: {e}"),
    }
}

#[tokio::test]
async fn config_maps_secrets_and_service_account_tokens_reach_api_pods_and_updates_follow() {
    let (env, cluster) =
        cluster_or_skip!("config_maps_secrets_and_service_account_tokens_reach_api_pods_and_updates_follow");
    let n = ClusterNode::start(&env, &cluster, "poddata").await;
    create_config_map(&n, "app-config", json!({"greeting": "hello"})).await;
    let secrets: Api<Secret> = Api::namespaced(n.client(), n.namespace());
    let secret: Secret = match serde_json::from_value(
        json!({"metadata": {"name": "app-secret"}, "stringData": {"password": "s3cret-9f8e7d"}}),
    ) {
        Ok(s) => s,
        Err(e) => panic!("bad Secret: {e}"),
    };
    if let Err(e) = secrets.create(&PostParams::default(), &secret).await {
        panic!("cannot create Secret: {e}");
    }
    let script = "echo PW=$PW; echo CFG=$CFG_greeting; echo FILE=$(cat /cfg/greeting); \
                  echo NS=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace); \
                  test -s /var/run/secrets/kubernetes.io/serviceaccount/ca.crt && echo CA=yes; \
                  echo TOKEN=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token); \
                  echo AUD=$(cat /aud/token); sleep 3600";
    let manifest = n.api_pod_manifest(
        "data",
        json!({
            "automountServiceAccountToken": true,
            "volumes": [
                {"name": "cfg", "configMap": {"name": "app-config"}},
                {"name": "opt", "configMap": {"name": "not-there", "optional": true}},
                {"name": "aud", "projected": {"sources": [{"serviceAccountToken": {
                    "path": "token", "audience": "nodelet-test", "expirationSeconds": 3600}}]}},
            ],
            "containers": [{
                "name": "main",
                "command": ["sh", "-c", script],
                "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "app-secret", "key": "password"}}}],
                "envFrom": [{"configMapRef": {"name": "app-config"}, "prefix": "CFG_"}],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/cfg"},
                    {"name": "opt", "mountPath": "/opt-cfg"},
                    {"name": "aud", "mountPath": "/aud"},
                ],
            }],
        }),
    );
    n.create_pod(&manifest).await;
    let pod = n.wait_api_running("data").await;
    let pod_uid = uid(&pod);
    let output = n
        .wait_until("the container's output", WAIT, async || {
            let out = container_output(&n, "data", &pod_uid, "main");
            if out.contains("AUD=") { Ok(out) } else { Err(out) }
        })
        .await;
    let line =
        |key: &str| output.lines().find_map(|l| l.strip_prefix(key)).map(str::to_owned).unwrap_or_default();
    assert_eq!(line("PW="), "s3cret-9f8e7d", "secretKeyRef\n{output}");
    assert_eq!(line("CFG="), "hello", "envFrom with a prefix\n{output}");
    assert_eq!(line("FILE="), "hello", "configMap volume\n{output}");
    assert_eq!(line("NS="), n.namespace(), "the automatic volume's downwardAPI part\n{output}");
    assert_eq!(line("CA="), "yes", "kube-root-ca.crt in the automatic volume\n{output}");

    // Waiting for a token is not a failed mount: the start (up to its Started event) has no FailedMount.
    let events: Api<Event> = Api::namespaced(n.client(), n.namespace());
    let of_pod = n
        .wait_until("the Started event of pod data", WAIT, async || {
            let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            let of_pod: Vec<Event> = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("data"))
                .collect();
            if of_pod.iter().any(|e| e.reason.as_deref() == Some("Started")) {
                Ok(of_pod)
            } else {
                Err(format!("{} events, none Started", of_pod.len()))
            }
        })
        .await;
    let failed: Vec<String> = of_pod
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedMount"))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect();
    assert!(failed.is_empty(), "FailedMount events at the start of an API pod: {failed:?}");

    // The tokens are real: the API server authenticates them as the pod's service account, bound to it.
    let token = line("TOKEN=");
    let r = review(&n, &token, "").await;
    let status = r.status.unwrap_or_default();
    assert_eq!(status.authenticated, Some(true), "automatic token: {}", pretty(&status));
    let user = status.user.unwrap_or_default();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:default", n.namespace()).as_str())
    );
    let bound = user.extra.unwrap_or_default().get("authentication.kubernetes.io/pod-name").cloned();
    assert_eq!(bound, Some(vec!["data".to_owned()]), "bound to the pod");
    let aud = line("AUD=");
    let r = review(&n, &aud, "nodelet-test").await;
    assert_eq!(r.status.and_then(|s| s.authenticated), Some(true), "the audience-bound token");
    let r = review(&n, &aud, "").await;
    assert_ne!(r.status.and_then(|s| s.authenticated), Some(true), "not valid for the API server's audience");

    // A change of the ConfigMap reaches the running pod's volume (atomically rewritten), no restart.
    let cms: Api<ConfigMap> = Api::namespaced(n.client(), n.namespace());
    let patch = json!({"data": {"greeting": "bonjour"}});
    if let Err(e) = cms.patch("app-config", &PatchParams::default(), &Patch::Merge(&patch)).await {
        panic!("cannot patch the ConfigMap: {e}");
    }
    let file = n.root_dir().join("pods").join(&pod_uid).join("volumes/kubernetes.io~configmap/cfg/greeting");
    n.wait_until("the updated ConfigMap in the pod's volume", WAIT, async || {
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        if text == "bonjour" { Ok(()) } else { Err(text) }
    })
    .await;
    let pod = n.api_pod("data").await;
    assert_eq!(
        pod.as_ref()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c[0].restart_count),
        Some(0)
    );

    // Secrets and tokens never appear in nodelet's log.
    let log = n.log();
    assert!(!log.contains("s3cret-9f8e7d"), "the secret is in nodelet's log");
    assert!(!log.contains(&token[..token.len().min(40)]), "a token is in nodelet's log");
    n.shutdown().await;
}

#[tokio::test]
async fn a_pod_waits_for_a_missing_config_map_with_an_event_and_starts_when_it_appears() {
    let (env, cluster) =
        cluster_or_skip!("a_pod_waits_for_a_missing_config_map_with_an_event_and_starts_when_it_appears");
    let n = ClusterNode::start(&env, &cluster, "waitcm").await;
    let manifest = n.api_pod_manifest(
        "waiter",
        json!({
            "volumes": [{"name": "cfg", "configMap": {"name": "later"}}],
            "containers": [{"name": "main", "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
        }),
    );
    n.create_pod(&manifest).await;
    let events: Api<Event> = Api::namespaced(n.client(), n.namespace());
    let event = n
        .wait_until("a FailedMount event for the missing ConfigMap", WAIT, async || {
            let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("FailedMount")
                        && e.involved_object.name.as_deref() == Some("waiter")
                        && e.message.as_deref().is_some_and(|m| m.contains("\"later\""))
                })
                .ok_or_else(|| "no such event".to_owned())
        })
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"), "{}", pretty(&event));
    let pod = n.api_pod("waiter").await;
    assert_eq!(pod.as_ref().map(phase), Some("Pending"), "waits, not Failed");
    create_config_map(&n, "later", json!({"k": "v"})).await;
    n.wait_api_running("waiter").await;
    n.shutdown().await;
}

#[tokio::test]
async fn a_refused_service_account_token_is_asked_for_again_within_seconds() {
    const TEST: &str = "a_refused_service_account_token_is_asked_for_again_within_seconds";
    let (env, cluster) = cluster_or_skip!(TEST);
    let n = ClusterNode::start(&env, &cluster, "latesa").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(n.client(), n.namespace());
    // The ServiceAccount admission plugin wants the account to exist when the pod is created; the pod is
    // created unscheduled, the account deleted, and only then the pod bound to the node, whose first
    // TokenRequest is refused (the account is not found).
    create(&accounts, json!({"metadata": {"name": "late"}})).await;
    let mut manifest = n.api_pod_manifest(
        "late-token",
        json!({
            "serviceAccountName": "late",
            "automountServiceAccountToken": true,
            "schedulerName": "nobody",
            "containers": [{"name": "main", "command": ["sleep", "3600"]}],
        }),
    );
    if let Some(spec) = manifest["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    n.create_pod(&manifest).await;
    if let Err(e) = accounts.delete("late", &DeleteParams::default()).await {
        panic!("cannot delete service account late: {e}");
    }
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "late-token"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": n.node()},
    });
    if let Err(e) = n
        .pods_api()
        .create_subresource::<serde_json::Value, serde_json::Value>(
            "binding",
            "late-token",
            &PostParams::default(),
            &binding,
        )
        .await
    {
        panic!("cannot bind pod late-token to {}: {e}", n.node());
    }
    n.wait_until("a refused TokenRequest in nodelet's log", WAIT, async || {
        if n.log().contains("requesting a service account token failed") {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pod = n.api_pod("late-token").await;
    assert_eq!(pod.as_ref().map(phase), Some("Pending"), "waits for its token");
    create(&accounts, json!({"metadata": {"name": "late"}})).await;
    let allowed = tokio::time::Instant::now();
    n.wait_api_running("late-token").await;
    // Retried 0.5, 1 and 2 s after each refusal: the token comes within a few seconds of the account,
    // not at a 30 s check.
    let took = allowed.elapsed();
    assert!(took <= Duration::from_secs(10), "Running {took:?} after the account was created\n{}", n.tail());
    n.shutdown().await;
}

#[tokio::test]
async fn a_claim_bound_by_the_control_plane_mounts_its_volume_in_an_api_pod() {
    const TEST: &str = "a_claim_bound_by_the_control_plane_mounts_its_volume_in_an_api_pod";
    let (env, cluster) = cluster_or_skip!(TEST);
    if let Err(why) = cluster.controllers_running() {
        // The PV controller (kube-controller-manager) binds claims.
        let binary = cluster.assets.join("kube-controller-manager").is_file();
        if binary && std::env::var("NODELET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
            panic!("{why}: start the control plane with ENVTEST_CONTROLLERS=1");
        }
        eprintln!("SKIP {TEST}: {why} (needs kube-controller-manager's PV controller)");
        return;
    }
    let n = ClusterNode::start(&env, &cluster, "pvc").await;
    let data = n.dir().join("pv-data");
    if let Err(e) = std::fs::create_dir_all(&data) {
        panic!("cannot create {}: {e}", data.display());
    }
    let pv_name = format!("{}-pv", n.namespace());
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(n.client());
    create(
        &pvs,
        json!({
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": pv_name,
                "hostPath": {"path": data.display().to_string(), "type": "Directory"},
            },
        }),
    )
    .await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(n.client(), n.namespace());
    create(
        &claims,
        json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": pv_name,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await;
    let manifest = n.api_pod_manifest(
        "writer",
        json!({
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "main", "command": ["sh", "-c", "echo from-the-pod > /data/out; sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }),
    );
    n.create_pod(&manifest).await;
    n.wait_api_running("writer").await;
    let out = data.join("out");
    n.wait_until("the pod's file on the claim's volume", WAIT, async || {
        std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))
    })
    .await;
    assert_eq!(std::fs::read_to_string(&out).unwrap_or_default(), "from-the-pod\n");
    n.shutdown().await;
    if let Err(e) = pvs.delete(&pv_name, &Default::default()).await {
        eprintln!("could not delete the PersistentVolume {pv_name}: {e}");
    }
}

#[tokio::test]
async fn a_wait_for_first_consumer_claim_is_bound_by_the_scheduler_to_a_local_volume_of_this_node() {
    const TEST: &str =
        "a_wait_for_first_consumer_claim_is_bound_by_the_scheduler_to_a_local_volume_of_this_node";
    let (env, cluster) = cluster_or_skip!(TEST);
    if let Err(why) = cluster.controllers_running() {
        let binaries =
            ["kube-controller-manager", "kube-scheduler"].iter().all(|b| cluster.assets.join(b).is_file());
        if binaries && std::env::var("NODELET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
            panic!("{why}: start the control plane with ENVTEST_CONTROLLERS=1");
        }
        eprintln!("SKIP {TEST}: {why} (needs kube-scheduler and kube-controller-manager)");
        return;
    }
    let n = ClusterNode::start(&env, &cluster, "wffc").await;
    let data = n.dir().join("local-pv");
    if let Err(e) = std::fs::create_dir_all(&data) {
        panic!("cannot create {}: {e}", data.display());
    }
    let class = format!("{}-local", n.namespace());
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(n.client());
    let sc = match serde_json::from_value(json!({
        "metadata": {"name": class},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    })) {
        Ok(sc) => sc,
        Err(e) => panic!("bad StorageClass: {e}"),
    };
    if let Err(e) = classes.create(&PostParams::default(), &sc).await {
        panic!("cannot create the StorageClass: {e}");
    }
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(n.client());
    let pv_name = format!("{class}-pv");
    create(
        &pvs,
        json!({
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": class,
                "local": {"path": data.display().to_string()},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [n.node()]}]}]}},
            },
        }),
    )
    .await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(n.client(), n.namespace());
    create(
        &claims,
        json!({
            "metadata": {"name": "local"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await;
    // No nodeName: the scheduler picks the node the volume is on and binds the claim first.
    let mut manifest = n.api_pod_manifest(
        "consumer",
        json!({
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "local"}}],
            "containers": [{"name": "main", "command": ["sh", "-c", "echo consumed > /data/out; sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }),
    );
    if let Some(spec) = manifest["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    n.create_pod(&manifest).await;
    let pod = n.wait_api_running("consumer").await;
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(n.node()), "scheduled here");
    let bound = claims.get("local").await.unwrap_or_else(|e| panic!("GET claim: {e}"));
    assert_eq!(bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()), Some(pv_name.as_str()));
    let out = data.join("out");
    n.wait_until("the pod's file on the local volume", WAIT, async || {
        std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))
    })
    .await;
    n.shutdown().await;
    for result in [
        pvs.delete(&pv_name, &Default::default()).await.map(drop),
        classes.delete(&class, &Default::default()).await.map(drop),
    ] {
        if let Err(e) = result {
            eprintln!("cleanup: {e}");
        }
    }
}

/// Objects do not cross sources: a node-local Secret (a manifest's) and an API Secret of the same
/// namespace/name each reach only their own kind of pod, an API pod never falls back to a node-local one,
/// and a static pod cannot mount the claim an API pod on the node uses. Privileged API pods (every CNI and
/// CSI node plugin) run by default, as the API server admitted them.
#[tokio::test]
async fn secrets_and_claims_do_not_cross_sources_and_privileged_api_pods_run_by_default() {
    const TEST: &str = "secrets_and_claims_do_not_cross_sources_and_privileged_api_pods_run_by_default";
    let (env, cluster) = cluster_or_skip!(TEST);
    if let Err(why) = cluster.controllers_running() {
        if std::env::var("NODELET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
            panic!(
                "{why}: start the control plane with ENVTEST_CONTROLLERS=1 (the PV controller binds claims)"
            );
        }
        eprintln!("SKIP {TEST}: {why}");
        return;
    }
    let n = crate::cluster_support::ClusterNode::start(&env, &cluster, "xsrc").await;
    let ns = n.namespace().to_owned();

    // The same namespace/name twice: in the API, and in a manifest for static pods; and one only in a manifest.
    let secrets: Api<Secret> = Api::namespaced(n.client(), &ns);
    create(&secrets, json!({"metadata": {"name": "shared"}, "stringData": {"value": "from-the-api"}})).await;
    let local_secret = |name: &str, value: &str| {
        use base64::Engine as _;
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
               "data": {"value": base64::engine::general_purpose::STANDARD.encode(value)}})
    };
    n.write_manifest(
        "secrets.yaml",
        &json!({"apiVersion": "v1", "kind": "List",
        "items": [local_secret("shared", "from-the-node"), local_secret("node-only", "node-private")]}),
    );

    let reader = |secret: &str| {
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "s", "secret": {"secretName": secret}}],
            "containers": [{"name": "main", "command": ["sh", "-c", "echo FILE=$(cat /s/value); echo ENV=$V; sleep 3600"],
                            "env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": secret, "key": "value"}}}],
                            "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
        })
    };
    // The API pod reads "shared" (so nodelet watches the API's), another API pod asks for "node-only"; then
    // a static pod (the file source) reads "shared" too.
    n.create_pod(&n.api_pod_manifest("api-reader", reader("shared"))).await;
    n.create_pod(&n.api_pod_manifest("api-snoop", reader("node-only"))).await;
    let api_pod = n.wait_api_running("api-reader").await;
    let mut static_reader = n.pod_manifest("static-reader", reader("shared"));
    static_reader["metadata"]["namespace"] = json!(ns);
    n.write_manifest("static-reader.yaml", &static_reader);

    let api_uid = uid(&api_pod);
    let api_out = n
        .wait_until("the API pod's output", WAIT, async || {
            let out = container_output(&n, "api-reader", &api_uid, "main");
            if out.contains("ENV=") { Ok(out) } else { Err(out) }
        })
        .await;
    assert!(api_out.contains("FILE=from-the-api") && api_out.contains("ENV=from-the-api"), "{api_out}");
    let static_name = n.pod_name("static-reader");
    let static_pod = n.wait_for_pod("static-reader", "Running", WAIT, |p| phase(p) == "Running").await;
    let static_uid = uid(&static_pod);
    let static_out = n
        .wait_until("the static pod's output", WAIT, async || {
            let out = container_output(&n, &static_name, &static_uid, "main");
            if out.contains("ENV=") { Ok(out) } else { Err(out) }
        })
        .await;
    assert!(
        static_out.contains("FILE=from-the-node") && static_out.contains("ENV=from-the-node"),
        "a static pod reads the manifest's Secret, never the API's: {static_out}"
    );
    // The API pod asking for a Secret only a manifest has waits: it is not the API's.
    let snoop = n.api_pod("api-snoop").await.unwrap_or_else(|| panic!("api-snoop is gone"));
    assert_ne!(phase(&snoop), "Running", "an API pod read a node-local Secret: {}", pretty(&snoop));
    let snoop_uid = uid(&snoop);
    assert!(n.containers_of(&snoop_uid).await.is_empty(), "an API pod started on a node-local Secret");
    assert!(
        !container_output(&n, "api-snoop", &snoop_uid, "main").contains("node-private"),
        "an API pod read a node-local Secret"
    );

    // A claim the control plane bound, used by an API pod...
    let data = n.dir().join("pv-data");
    std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("cannot create {}: {e}", data.display()));
    let pv_name = format!("{ns}-pv");
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(n.client());
    create(
        &pvs,
        json!({
            "metadata": {"name": pv_name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": pv_name,
                     "hostPath": {"path": data.display().to_string(), "type": "Directory"}},
        }),
    )
    .await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(n.client(), &ns);
    create(
        &claims,
        json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": pv_name,
               "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    let writer = |who: &str| {
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "main", "command": ["sh", "-c", format!("echo {who} > /data/{who}; sleep 3600")],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        })
    };
    n.create_pod(&n.api_pod_manifest("api-writer", writer("api-writer"))).await;
    n.wait_api_running("api-writer").await;
    n.wait_until("the API pod's file on the claim's volume", WAIT, async || {
        std::fs::read_to_string(data.join("api-writer")).map_err(|e| e.to_string())
    })
    .await;
    // ...is not a static pod's to mount.
    let mut static_writer = n.pod_manifest("static-writer", writer("static-writer"));
    static_writer["metadata"]["namespace"] = json!(ns);
    n.write_manifest("static-writer.yaml", &static_writer);
    n.wait_for_pod("static-writer", "listed by nodelet", WAIT, |_| true).await;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!data.join("static-writer").exists(), "a static pod mounted the API pod's claim");
        let pod = n.pod("static-writer").await;
        assert!(pod.as_ref().is_none_or(|p| phase(p) != "Running"), "the static pod runs on the API claim");
    }
    // A privileged API pod, as every CNI or CSI node plugin is: the API server admitted it, so it runs.
    let mut privileged = n.api_pod_manifest(
        "api-privileged",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "command": ["sleep", "3600"]}]}),
    );
    privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    n.create_pod(&privileged).await;
    n.wait_api_running("api-privileged").await;
    let log = n.log();
    assert!(!log.contains("from-the-api") && !log.contains("from-the-node") && !log.contains("node-private"));
    n.shutdown().await;
    if let Err(e) = pvs.delete(&pv_name, &Default::default()).await {
        eprintln!("could not delete the PersistentVolume {pv_name}: {e}");
    }
}

//! Manifests in the manifest directory: add, change, remove, broken; nodelet restarts; two nodelets on one
//! runtime.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use tokio::time::sleep;

use crate::lifecycle::cgroup_exists;
use crate::support::{
    Nodelet, container, cri_state, env_or_skip, init_container, phase, runtime_id, sleep_until_term, uid,
};
use nodelet_cri::proto;

#[tokio::test]
async fn changing_a_manifest_replaces_the_pod_and_removing_it_cleans_up() {
    let env = env_or_skip!("changing_a_manifest_replaces_the_pod_and_removing_it_cleans_up");
    let n = Nodelet::start(&env, "manifests").await;
    let manifest = |version: &str| {
        n.pod_manifest(
            "app",
            json!({
                "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "app", "command": sleep_until_term(&format!("echo {version}; "))}],
            }),
        )
    };

    // add
    n.write_manifest("app.yaml", &manifest("v1"));
    let v1 = n.wait_running("app").await;
    let (uid1, cid1) = (uid(&v1), container(&v1, "app").map(runtime_id).unwrap_or_default());
    let sandbox1: Vec<String> = n.sandboxes_of(&uid1).await.into_iter().map(|s| s.id).collect();
    assert_eq!(sandbox1.len(), 1);

    // change in place: a new pod (new UID), the old one torn down
    n.write_manifest("app.yaml", &manifest("v2"));
    let v2 = n
        .wait_for_pod("app", "replaced by a new UID, Running", Duration::from_secs(30), |p| {
            uid(p) != uid1 && phase(p) == "Running" && container(p, "app").is_some_and(|c| c.ready)
        })
        .await;
    let uid2 = uid(&v2);
    let cid2 = container(&v2, "app").map(runtime_id).unwrap_or_default();
    assert_ne!(cid1, cid2, "a new container");
    let names: Vec<String> = n.pods().await.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, vec![n.pod_name("app")], "one pod of that name");
    n.wait_for("the old pod to leave the runtime", Duration::from_secs(15), async || {
        (n.containers_of(&uid1).await.is_empty() && n.sandboxes_of(&uid1).await.is_empty()).then_some(())
    })
    .await;
    let containers = n.containers().await;
    assert_eq!(containers.len(), 1, "only the new container: {containers:?}");
    assert_eq!(
        (containers[0].id.as_str(), cri_state(&containers[0])),
        (cid2.as_str(), proto::ContainerState::ContainerRunning)
    );
    let log_dir = |uid: &str| n.logs_dir().join(format!("default_{}_{uid}", n.pod_name("app")));
    n.wait_for("the old pod's log directory to go", Duration::from_secs(5), async || {
        (!log_dir(&uid1).exists()).then_some(())
    })
    .await;
    let new_log = log_dir(&uid2).join("app").join("0.log");
    n.wait_for("the new pod to run the new command (its log says v2)", Duration::from_secs(5), async || {
        let log = std::fs::read_to_string(&new_log).unwrap_or_default();
        log.lines().any(|l| l.ends_with(" F v2")).then_some(())
    })
    .await;
    let cgroup = format!("{}/pod{uid2}", env.cgroup_parent.trim_matches('/'));
    assert!(cgroup_exists(&cgroup), "pod cgroup {cgroup} while running");

    // remove: gone from /pods, from the runtime, its logs and its cgroup
    n.remove_manifest("app.yaml");
    n.wait_for("/pods to be empty", Duration::from_secs(10), async || {
        n.pods().await.items.is_empty().then_some(())
    })
    .await;
    n.wait_for("the pod to leave the runtime", Duration::from_secs(15), async || {
        (n.containers_of(&uid2).await.is_empty() && n.sandboxes_of(&uid2).await.is_empty()).then_some(())
    })
    .await;
    n.wait_for("the log directory to go", Duration::from_secs(5), async || {
        (!log_dir(&uid2).exists()).then_some(())
    })
    .await;
    n.wait_for("the pod cgroup to go", Duration::from_secs(5), async || {
        (!cgroup_exists(&cgroup)).then_some(())
    })
    .await;

    n.shutdown().await;
}

#[tokio::test]
async fn a_broken_manifest_is_reported_and_does_not_stop_a_good_one() {
    let env = env_or_skip!("a_broken_manifest_is_reported_and_does_not_stop_a_good_one");
    let n = Nodelet::start(&env, "broken").await;
    n.write_manifest_text(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\n  namespace: default\nspec:\n  containers:\n  \
         - name: app\n    command: [sh, -c, 'sleep 3600']\n",
    );
    n.write_manifest(
        "good.yaml",
        &n.pod_manifest(
            "good",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    n.wait_running("good").await;
    let names: Vec<String> = n.pods().await.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, vec![n.pod_name("good")], "only the good pod runs");

    // nodelet's log names the file, the pod and the field, on one line
    let file = n.manifest_dir().join("broken.yaml").display().to_string();
    let line = n
        .wait_for("a log line about broken.yaml", Duration::from_secs(10), async || {
            n.log()
                .lines()
                .find(|l| l.contains(&file) && l.contains("spec.containers[0].image"))
                .map(str::to_owned)
        })
        .await;
    assert!(line.contains("default/broken"), "the line names the pod: {line}");
    assert!(line.contains("WARN"), "a warning: {line}");

    n.shutdown().await;
}

#[tokio::test]
async fn a_restarted_nodelet_adopts_its_running_pods_without_duplicates() {
    let env = env_or_skip!("a_restarted_nodelet_adopts_its_running_pods_without_duplicates");
    let mut n = Nodelet::start(&env, "restart").await;
    n.write_manifest(
        "plain.yaml",
        &n.pod_manifest(
            "plain",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    n.write_manifest(
        "withinit.yaml",
        &n.pod_manifest(
            "withinit",
            json!({
                "terminationGracePeriodSeconds": 2,
                "initContainers": [{"name": "init", "command": ["sh", "-c", "echo initialized"]}],
                "containers": [{"name": "app", "command": sleep_until_term("")}],
            }),
        ),
    );
    let plain = n.wait_running("plain").await;
    let withinit = n.wait_running("withinit").await;
    let ids = |p: &k8s_openapi::api::core::v1::Pod| {
        let mut ids: Vec<String> = ["app"].iter().filter_map(|c| container(p, c).map(runtime_id)).collect();
        ids.extend(init_container(p, "init").map(runtime_id));
        ids
    };
    let before_ids = (ids(&plain), ids(&withinit));
    let sandboxes_before: BTreeSet<String> = n.sandboxes().await.into_iter().map(|s| s.id).collect();
    let containers_before: BTreeSet<String> = n.containers().await.into_iter().map(|c| c.id).collect();
    assert_eq!((sandboxes_before.len(), containers_before.len()), (2, 3));

    let status = n.stop().await;
    assert!(status.success(), "nodelet exits cleanly on SIGTERM: {status}");
    // The pods keep running without nodelet.
    let running = n
        .containers()
        .await
        .iter()
        .filter(|c| cri_state(c) == proto::ContainerState::ContainerRunning)
        .count();
    assert_eq!(running, 2, "both app containers still run while nodelet is down");

    n.start_again().await;
    let plain = n.wait_running("plain").await;
    let withinit = n.wait_running("withinit").await;
    assert_eq!((ids(&plain), ids(&withinit)), before_ids, "the same containers, adopted");
    // Give a wrong reconciliation time to happen, then count.
    sleep(Duration::from_secs(3)).await;
    let sandboxes_after: BTreeSet<String> = n.sandboxes().await.into_iter().map(|s| s.id).collect();
    let containers_after: BTreeSet<String> = n.containers().await.into_iter().map(|c| c.id).collect();
    assert_eq!(sandboxes_after, sandboxes_before, "no new sandbox");
    assert_eq!(
        containers_after, containers_before,
        "no new container (the init container did not run again)"
    );
    for name in ["plain", "withinit"] {
        let pod = n.pod(name).await.unwrap_or_else(|| panic!("{name} gone"));
        assert_eq!(phase(&pod), "Running", "{name}");
        assert_eq!(container(&pod, "app").map(|c| (c.restart_count, c.ready)), Some((0, true)), "{name}");
    }

    n.shutdown().await;
}

/// Every nodelet lists the runtime's pods at start and removes those it was not asked to run: it must count
/// only its own node's, or a second nodelet on the same runtime (parallel tests, a second instance) would tear
/// down the first one's pods.
#[tokio::test]
async fn two_nodelets_on_one_runtime_leave_each_others_pods_alone() {
    let env = env_or_skip!("two_nodelets_on_one_runtime_leave_each_others_pods_alone");
    let a = Nodelet::start(&env, "first").await;
    a.write_manifest(
        "mine.yaml",
        &a.pod_manifest(
            "mine",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    let pod = a.wait_running("mine").await;
    let cid = container(&pod, "app").map(runtime_id).unwrap_or_default();

    let b = Nodelet::start(&env, "second").await;
    sleep(Duration::from_secs(3)).await;
    assert!(b.pods().await.items.is_empty(), "the second nodelet runs nothing");
    let pod = a.pod("mine").await.unwrap_or_else(|| panic!("pod gone"));
    let app = container(&pod, "app").unwrap_or_else(|| panic!("no app status"));
    assert_eq!(
        (app.container_id.clone(), app.restart_count, phase(&pod)),
        (Some(format!("containerd://{cid}")), 0, "Running"),
        "the first nodelet's pod was disturbed when the second one started; the second one's log:\n{}",
        b.log()
    );
    let containers = a.containers().await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(cri_state(&containers[0]), proto::ContainerState::ContainerRunning);
    assert!(!b.log().contains(&uid(&pod)), "the second nodelet never touched the pod:\n{}", b.log());

    b.shutdown().await;
    a.shutdown().await;
}

/// The manifest URL may hold a credential (user information, a token in the query string, and a redirect's
/// target may hold another): it is in no event, no log line and not in `/configz`, which show it redacted.
#[tokio::test]
async fn the_manifest_urls_credentials_are_in_no_event_log_line_or_configz() {
    use axum::Router;
    use axum::response::Redirect;
    use axum::routing::get;

    let env = env_or_skip!("the_manifest_urls_credentials_are_in_no_event_log_line_or_configz");
    const SECRETS: [&str; 3] = ["pw-5ecr3t-a1", "t0ken-5ecr3t-b2", "hop-5ecr3t-c3"];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    // One pod that runs, one that is broken (an empty image): a problem, so an event and a log line.
    let good = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fetched", "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 1, "dnsPolicy": "None", "dnsConfig": {"nameservers": ["127.0.0.1"]},
                 "containers": [{"name": "app", "image": env.busybox, "imagePullPolicy": "IfNotPresent",
                                 "command": sleep_until_term("")}]},
    });
    let body = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: broken, namespace: default}}\nspec:\n  containers:\n  - {{name: app, image: ''}}\n---\n{good}\n"
    );
    let served = std::sync::Arc::new(std::sync::Mutex::new(body));
    let serving = served.clone();
    let router = Router::new()
        .route("/hop", get(|| async { Redirect::to("/pods?next=hop-5ecr3t-c3") }))
        .route("/pods", get(move || async move { serving.lock().map(|b| b.clone()).unwrap_or_default() }));
    tokio::spawn(async move { axum::serve(listener, router).await });
    let url = format!("http://admin:pw-5ecr3t-a1@{addr}/hop?token=t0ken-5ecr3t-b2");
    let options = crate::support::StartOptions {
        extra_args: vec![
            "--manifest-url".to_owned(),
            url.clone(),
            "--http-check-frequency".to_owned(),
            "1s".to_owned(),
        ],
        ..Default::default()
    };
    let n = Nodelet::start_with(&env, "url-secrets", options).await;
    n.wait_running("fetched").await;
    let shown = format!("http://<redacted>@{addr}/hop?<redacted>");

    let get_json = async |path: &str| -> serde_json::Value {
        let response = n
            .main_client()
            .get(n.main_url(path))
            .bearer_auth(crate::support::TOKEN)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert!(response.status().is_success(), "GET {path}: {}", response.status());
        serde_json::from_str(&response.text().await.unwrap_or_default()).unwrap_or(serde_json::Value::Null)
    };
    let events = n
        .wait_for("an InvalidManifest event for the broken pod", Duration::from_secs(20), async || {
            let events = get_json("/api/v1/events").await;
            let found = events["items"].as_array().into_iter().flatten().any(|e| {
                e["reason"] == "InvalidManifest"
                    && e["message"].as_str().is_some_and(|m| m.contains("broken"))
            });
            found.then_some(events.to_string())
        })
        .await;
    assert!(events.contains(&shown), "the event names the URL, redacted: {events}");
    let configz = get_json("/configz").await;
    assert_eq!(configz["kubeletconfig"]["staticPodURL"], shown.as_str(), "{configz}");
    let log = n.log();
    assert!(log.contains(&shown), "the log names the URL, redacted");
    for secret in SECRETS {
        assert!(!events.contains(secret), "{secret} in the events: {events}");
        assert!(!configz.to_string().contains(secret), "{secret} in /configz: {configz}");
        assert!(!log.contains(secret), "{secret} in nodelet's log:\n{log}");
    }
    // The URL serves nothing any more: its pods go.
    if let Ok(mut body) = served.lock() {
        body.clear();
    }
    n.wait_for("the URL's pod gone", Duration::from_secs(30), async || {
        n.pod("fetched").await.is_none().then_some(())
    })
    .await;
    n.shutdown().await;
}

//! `nodelet debug` against the real containerd (standalone mode): an ephemeral container added to a static
//! pod runs once in it, in the target container's process namespace, is attachable, shows in
//! `ephemeralContainerStatuses`, and is kept (neither lost nor started again) across a nodelet restart; the
//! `POST /debug` route is authenticated like exec. The cluster-mode test (the API's `ephemeralcontainers`
//! subresource and `kubectl debug`) is in `cluster.rs`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use serde_json::json;

use crate::exec::nodelet_streaming_cli;
use crate::support::{Nodelet, StartOptions, TOKEN, env_or_skip, sleep_until_term, uid};

fn ephemeral<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status.as_ref()?.ephemeral_container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

fn exited(pod: &Pod, name: &str) -> Option<i32> {
    ephemeral(pod, name)?.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
}

#[tokio::test]
async fn nodelet_debug_adds_an_ephemeral_container_to_a_static_pod_that_survives_a_restart() {
    let env =
        env_or_skip!("nodelet_debug_adds_an_ephemeral_container_to_a_static_pod_that_survives_a_restart");
    let mut n = Nodelet::start(&env, "debug-cli").await;
    n.write_manifest(
        "dbg.yaml",
        &n.pod_manifest(
            "dbg",
            json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    let pod = n.wait_running("dbg").await;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = n.pod_name("dbg");
    let image = format!("--image={}", env.busybox);

    // -i: added, started once the pod runs, attached; it reads our input and sees app's processes.
    let script = "read x; echo got-$x; ps -o args | grep -q 'sleep 1' && echo sees-app; exit 0";
    let args = [
        "debug",
        &name,
        &image,
        "--image-pull-policy=IfNotPresent",
        "--target=app",
        "-c",
        "dbg1",
        "-i",
        "--",
        "sh",
        "-c",
        script,
    ];
    let (code, out, err) = nodelet_streaming_cli(&n, &args, "hi\n").await;
    assert_eq!(code, 0, "nodelet debug: {out:?} {err:?}\n{}", n.log_tail(40));
    assert!(out.contains("got-hi"), "stdin reached it: {out:?} {err:?}");
    assert!(out.contains("sees-app"), "shared PID namespace: {out:?} {err:?}");
    let pod = n
        .wait_for_pod("dbg", "dbg1 exited 0", Duration::from_secs(30), |p| exited(p, "dbg1") == Some(0))
        .await;
    assert_eq!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Running"));
    let spec = pod.spec.clone().unwrap_or_default();
    let debug = spec.ephemeral_containers.unwrap_or_default();
    assert_eq!(debug.len(), 1, "the desired pod has it");
    assert_eq!(debug[0].target_container_name.as_deref(), Some("app"));

    // Without -i: added and run; a second container of the same name is refused.
    let (code, out, err) = nodelet_streaming_cli(
        &n,
        &[
            "debug",
            &name,
            &image,
            "--image-pull-policy=IfNotPresent",
            "-c",
            "dbg2",
            "--",
            "sh",
            "-c",
            "exit 4",
        ],
        "",
    )
    .await;
    assert_eq!(code, 0, "{out:?} {err:?}");
    n.wait_for_pod("dbg", "dbg2 exited 4", Duration::from_secs(30), |p| exited(p, "dbg2") == Some(4)).await;
    let (code, _, err) = nodelet_streaming_cli(&n, &["debug", &name, &image, "-c", "dbg2"], "").await;
    assert_eq!(code, 1);
    assert!(err.contains("Duplicate value") && err.contains("dbg2"), "{err}");
    let (code, _, err) = nodelet_streaming_cli(&n, &["debug", "nope", &image], "").await;
    assert_eq!(code, 1);
    assert!(err.contains("404") && err.contains("not found"), "{err}");

    // The route is authenticated like exec.
    let response = n
        .main_client()
        .post(n.main_url(&format!("/debug/default/{name}")))
        .body(r#"{"name":"sneaky","image":"busybox"}"#)
        .send()
        .await
        .expect("POST /debug");
    assert_eq!(response.status().as_u16(), 401);

    // Restart: the ephemeral containers are still in the pod, exited, and not started again.
    let count = |containers: &[nodelet_cri::proto::Container], c: &str| {
        containers.iter().filter(|x| x.metadata.as_ref().is_some_and(|m| m.name == c)).count()
    };
    n.stop().await;
    n.start_again().await;
    sleep_secs(10).await;
    let pod = n
        .wait_for_pod("dbg", "both ephemeral containers reported exited", Duration::from_secs(30), |p| {
            exited(p, "dbg1") == Some(0) && exited(p, "dbg2") == Some(4)
        })
        .await;
    assert_eq!(pod.metadata.uid.as_deref(), Some(uid.as_str()), "the same pod");
    let containers = n.containers_of(&uid).await;
    assert_eq!((count(&containers, "dbg1"), count(&containers, "dbg2")), (1, 1), "{containers:?}");
    assert_eq!(count(&containers, "app"), 1, "the pod itself was not restarted");
    assert!(!n.log().contains("sneaky"));
    n.shutdown().await;
}

/// `POST /debug` cannot give a pod what its source's Pod Security level refuses: the whole pod, with the new
/// ephemeral container, is admitted as the API server's PodSecurity admission admits `pods/ephemeralcontainers`.
#[tokio::test]
async fn debug_cannot_add_sys_admin_or_privileged_to_a_baseline_pod() {
    let env = env_or_skip!("debug_cannot_add_sys_admin_or_privileged_to_a_baseline_pod");
    let options =
        StartOptions { nodelet_extra: "podSecurity: {file: baseline}".to_owned(), ..Default::default() };
    let n = Nodelet::start_with(&env, "debug-pss", options).await;
    n.write_manifest(
        "base.yaml",
        &n.pod_manifest(
            "base",
            json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        ),
    );
    let before = n.wait_running("base").await;
    let name = n.pod_name("base");
    let post = async |container: serde_json::Value| {
        let response = n
            .main_client()
            .post(n.main_url(&format!("/debug/default/{name}")))
            .bearer_auth(TOKEN)
            .body(container.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /debug: {e}"));
        let status = response.status().as_u16();
        let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap_or_default())
            .unwrap_or(serde_json::Value::Null);
        (status, body["message"].as_str().unwrap_or_default().to_owned())
    };
    let debugger = |name: &str, security: serde_json::Value| {
        json!({"name": name, "image": env.busybox, "imagePullPolicy": "IfNotPresent",
               "command": ["sleep", "1"], "securityContext": security})
    };
    let (status, message) = post(debugger("admin", json!({"capabilities": {"add": ["SYS_ADMIN"]}}))).await;
    assert_eq!(status, 403, "{message}");
    assert_eq!(
        message,
        format!(
            "pods \"default/{name}\" is forbidden: violates PodSecurity \"baseline:latest\": non-default \
             capabilities (container \"admin\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add)"
        )
    );
    let (status, message) = post(debugger("root", json!({"privileged": true}))).await;
    assert_eq!(status, 403, "{message}");
    assert!(
        message.contains(r#"violates PodSecurity "baseline:latest": privileged (container "root" must not set securityContext.privileged=true)"#),
        "{message}"
    );
    // Nothing was added, nothing started; the pod runs on untouched.
    sleep_secs(3).await;
    let pod = n.pod("base").await.unwrap_or_else(|| panic!("the pod is gone"));
    let spec = pod.spec.clone().unwrap_or_default();
    assert!(spec.ephemeral_containers.unwrap_or_default().is_empty(), "no ephemeral container was added");
    let containers = n.containers_of(&uid(&before)).await;
    assert!(
        containers.iter().all(|c| c.metadata.as_ref().is_none_or(|m| m.name == "app")),
        "only app runs: {containers:?}"
    );
    n.assert_untouched("base", &before).await;
    // What baseline allows is still added.
    let (status, message) = post(debugger("plain", json!({}))).await;
    assert_eq!(status, 201, "{message}");
    n.shutdown().await;
}

async fn sleep_secs(s: u64) {
    tokio::time::sleep(Duration::from_secs(s)).await;
}

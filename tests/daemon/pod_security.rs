//! Local pod security on the real runtime: the Pod Security Standards level of each source (HTTP `baseline`, file
//! `privileged`), `--allow-privileged=false` refusing host namespaces, `seccompDefault` giving containers the
//! runtime's seccomp filter, and the local-path provisioner refusing to delete storage it has no record of.
//! Each case also checks what every hostile-input case does: nodelet is alive at the end, its peak RSS stays
//! under [`PEAK_RSS_MIB`], a healthy pod beside it is untouched, and the refusal names the problem.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Nodelet, StartOptions, container, env_or_skip, runtime_id, sleep_until_term};

/// nodelet's peak RSS (VmHWM) bound through each case. A debug build, measured on the test machine, peaked at
/// 58-60 MiB in these cases (a handful of pods and refusals each; start-up is nearly all of it); 80 MiB
/// leaves room for noise while a leak or an unbounded buffer of 20 MiB fails.
const PEAK_RSS_MIB: u64 = 80;

/// A healthy static pod beside the case, to check that nothing touches it.
fn steady(n: &Nodelet) -> Value {
    n.pod_manifest(
        "steady",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "command": sleep_until_term("")}]}),
    )
}

fn free_port() -> u16 {
    match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => panic!("no free port: {e}"),
    }
}

/// POSTs `pod` to the manifest endpoint on `port`: the status and the body.
async fn submit(n: &Nodelet, port: u16, pod: &Value) -> (u16, String) {
    let response = n
        .http()
        .post(format!("http://127.0.0.1:{port}/pods"))
        .bearer_auth(n.manifest_token())
        .header("content-type", "application/json")
        .body(pod.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /pods: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn the_http_source_refuses_host_network_at_baseline_while_the_file_source_runs_it() {
    let env = env_or_skip!("the_http_source_refuses_host_network_at_baseline_while_the_file_source_runs_it");
    let port = free_port();
    let options = StartOptions {
        extra_args: vec!["--manifest-http-addr".to_owned(), format!("127.0.0.1:{port}")],
        ..Default::default()
    };
    let mut n = Nodelet::start_with(&env, "pss-http", options).await;
    let app = |prefix: &str| json!({"name": "app", "command": sleep_until_term(prefix)});
    let host = |name: &str| {
        n.pod_manifest(
            name,
            json!({"hostNetwork": true, "terminationGracePeriodSeconds": 1, "containers": [app("")]}),
        )
    };

    let (status, body) = submit(&n, port, &host("hostnet")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains(r#"violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"#),
        "the upstream text: {body}"
    );
    assert!(body.contains("default/hostnet"), "names the pod: {body}");

    let plain = n.pod_manifest("plain", json!({"terminationGracePeriodSeconds": 1, "containers": [app("")]}));
    let (status, body) = submit(&n, port, &plain).await;
    assert!((200..300).contains(&status), "{status} {body}");
    let plain_before = n.wait_running("plain").await;
    assert!(n.pod("hostnet").await.is_none(), "the refused pod is not on the node");
    // Refused again while the healthy pod runs: it is not touched.
    let (status, body) = submit(&n, port, &host("hostnet")).await;
    assert_eq!(status, 403, "{body}");
    n.assert_untouched("plain", &plain_before).await;

    // The same pod from the manifest directory runs: static pods are trusted (privileged) by default.
    n.write_manifest("hostnet.yaml", &host("hostnet"));
    n.wait_running("hostnet").await;
    n.assert_untouched("plain", &plain_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "the HTTP source at baseline");
    let url = format!("http://127.0.0.1:{port}/pods/default/plain");
    let removed = n
        .http()
        .delete(&url)
        .bearer_auth(n.manifest_token())
        .send()
        .await
        .unwrap_or_else(|e| panic!("DELETE {url}: {e}"));
    assert!(removed.status().is_success(), "{}", removed.status());
    n.shutdown().await;
}

#[tokio::test]
async fn allow_privileged_false_refuses_a_host_pid_static_pod() {
    let env = env_or_skip!("allow_privileged_false_refuses_a_host_pid_static_pod");
    let options =
        StartOptions { extra_args: vec!["--allow-privileged=false".to_owned()], ..Default::default() };
    let mut n = Nodelet::start_with(&env, "pss-noprv", options).await;
    let spec = |host_pid: bool| {
        json!({"hostPID": host_pid, "terminationGracePeriodSeconds": 1,
               "containers": [{"name": "app", "command": sleep_until_term("")}]})
    };
    n.write_manifest("hostpid.yaml", &n.pod_manifest("hostpid", spec(true)));
    n.write_manifest("plain.yaml", &n.pod_manifest("plain", spec(false)));
    let plain_before = n.wait_running("plain").await;
    let file = n.manifest_dir().join("hostpid.yaml").display().to_string();
    let line = n
        .wait_for("a log line refusing hostpid.yaml", Duration::from_secs(10), async || {
            n.log()
                .lines()
                .find(|l| l.contains(&file) && l.contains("forbidden by --allow-privileged=false"))
                .map(str::to_owned)
        })
        .await;
    assert!(line.contains("spec.hostPID: host namespaces are not allowed"), "{line}");
    assert!(line.contains("default/hostpid"), "names the pod: {line}");
    assert!(n.pod("hostpid").await.is_none(), "the refused pod is not on the node");
    n.assert_untouched("plain", &plain_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "--allow-privileged=false");
    n.shutdown().await;
}

/// Writes `manifest` as `file` in the manifest directory already owned by `uid` with `mode` (through a dotfile
/// nodelet ignores, renamed into place), so that nodelet never sees it otherwise.
fn write_manifest_as(n: &Nodelet, file: &str, manifest: &Value, uid: u32, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = n.manifest_dir();
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, manifest.to_string()).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::os::unix::fs::chown(&tmp, Some(uid), None)
        .unwrap_or_else(|e| panic!("chown {}: {e}", tmp.display()));
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", tmp.display()));
    let path = dir.join(file);
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
    path
}

/// One model for privilege: by default a privileged static pod from a root-owned manifest runs (the kubelet's
/// `--allow-privileged` defaults to true), while a manifest file another user owns, or one anyone may write, is
/// held to `baseline`: whoever wrote it is not known to be root.
#[tokio::test]
async fn privileged_static_pods_run_by_default_and_files_not_owned_by_root_are_held_to_baseline() {
    let env = env_or_skip!(
        "privileged_static_pods_run_by_default_and_files_not_owned_by_root_are_held_to_baseline"
    );
    if !rustix::process::geteuid().is_root() {
        panic!("this test chowns manifest files: run it as root, as the runtime tests are");
    }
    let mut n = Nodelet::start(&env, "pss-default").await;
    let host = |name: &str| {
        n.pod_manifest(
            name,
            json!({"hostNetwork": true, "terminationGracePeriodSeconds": 1,
                   "containers": [{"name": "app", "command": sleep_until_term("")}]}),
        )
    };
    n.write_manifest(
        "priv.yaml",
        &n.pod_manifest(
            "priv",
            json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app",
                   "command": sleep_until_term(""), "securityContext": {"privileged": true}}]}),
        ),
    );
    let priv_before = n.wait_running("priv").await;

    // Owned by nobody (65534), or root's but writable by anyone: refused at baseline, reported naming the file.
    let nobody = write_manifest_as(&n, "nobody.yaml", &host("nobody"), 65534, 0o644);
    let open = write_manifest_as(&n, "open.yaml", &host("open"), 0, 0o666);
    for file in [&nobody, &open] {
        let file = file.display().to_string();
        let line = n
            .wait_for("a log line refusing the untrusted file's pod", Duration::from_secs(10), async || {
                n.log()
                    .lines()
                    .find(|l| l.contains(&file) && l.contains("violates PodSecurity"))
                    .map(str::to_owned)
            })
            .await;
        assert!(
            line.contains(r#"violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"#)
                || line.contains(
                    r#"violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)"#
                ),
            "{line}"
        );
    }
    // The same pod from a root-owned file runs.
    n.write_manifest("rooted.yaml", &host("rooted"));
    n.wait_running("rooted").await;
    assert!(
        n.pod("nobody").await.is_none() && n.pod("open").await.is_none(),
        "the refused pods are not on the node"
    );
    n.assert_untouched("priv", &priv_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "untrusted manifest files");
    n.shutdown().await;
}

/// The manifest endpoint is not an open door for local users: without its token (in a root-only file) a
/// request is refused, and with it a pod may not pose as a Service's endpoint nor pick its namespace.
#[tokio::test]
async fn the_manifest_endpoint_refuses_local_users_without_its_token_and_pods_that_could_pose_as_a_service() {
    let env = env_or_skip!(
        "the_manifest_endpoint_refuses_local_users_without_its_token_and_pods_that_could_pose_as_a_service"
    );
    let port = free_port();
    let options = StartOptions {
        extra_args: vec!["--manifest-http-addr".to_owned(), format!("127.0.0.1:{port}")],
        ..Default::default()
    };
    let mut n = Nodelet::start_with(&env, "pss-http-auth", options).await;
    let app = || json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "command": sleep_until_term("")}]});
    let url = format!("http://127.0.0.1:{port}/pods");

    // A local connection without the token.
    let stranger = n.pod_manifest("stranger", app());
    let response = n
        .http()
        .post(&url)
        .header("content-type", "application/json")
        .body(stranger.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /pods: {e}"));
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "says what is missing: {body}");
    let listed = n.http().get(&url).send().await.unwrap_or_else(|e| panic!("GET /pods: {e}"));
    assert_eq!(listed.status().as_u16(), 401);
    let guessed = n
        .http()
        .post(&url)
        .bearer_auth("0".repeat(64))
        .header("content-type", "application/json")
        .body(stranger.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /pods: {e}"));
    assert_eq!(guessed.status().as_u16(), 401);
    // The token is root's alone.
    let token_file = n.root_dir().join("http-source/token");
    let meta = std::fs::metadata(&token_file).unwrap_or_else(|e| panic!("{}: {e}", token_file.display()));
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        assert_eq!((meta.permissions().mode() & 0o777, meta.uid()), (0o600, 0), "{}", token_file.display());
    }

    // With the token: a label a Service could select, or a namespace not allowed, is refused naming the field.
    let mut dns = n.pod_manifest("dns", app());
    dns["metadata"]["labels"] = json!({"k8s-app": "kube-dns"});
    let (status, body) = submit(&n, port, &dns).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains(r#"pods \"default/dns\" is forbidden: metadata.labels[k8s-app]: Forbidden"#),
        "{body}"
    );
    let mut system = n.pod_manifest("system", app());
    system["metadata"]["namespace"] = json!("kube-system");
    let (status, body) = submit(&n, port, &system).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(r#"metadata.namespace: Forbidden: \"kube-system\""#), "{body}");

    let plain = n.pod_manifest("plain", app());
    let (status, body) = submit(&n, port, &plain).await;
    assert_eq!(status, 201, "{body}");
    let plain_before = n.wait_running("plain").await;
    for name in ["stranger", "dns", "system"] {
        assert!(n.pod(name).await.is_none(), "{name} is not on the node");
    }
    n.assert_untouched("plain", &plain_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "the manifest endpoint's token");
    let delete = format!("{url}/default/plain");
    let anonymous = n.http().delete(&delete).send().await.unwrap_or_else(|e| panic!("DELETE {delete}: {e}"));
    assert_eq!(anonymous.status().as_u16(), 401, "nor can a local user remove a pod");
    let removed = n
        .http()
        .delete(&delete)
        .bearer_auth(n.manifest_token())
        .send()
        .await
        .unwrap_or_else(|e| panic!("DELETE {delete}: {e}"));
    assert!(removed.status().is_success(), "{}", removed.status());
    n.shutdown().await;
}

/// The `Seccomp:` mode of a process in container `id` (0 none, 2 filter).
async fn seccomp_mode(n: &Nodelet, id: &str) -> String {
    let (code, status) = n.exec(id, &["cat", "/proc/self/status"]).await;
    assert_eq!(code, 0, "{status}");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no Seccomp line in {status}"))
}

#[tokio::test]
async fn seccomp_default_gives_containers_the_runtime_default_filter() {
    let env = env_or_skip!("seccomp_default_gives_containers_the_runtime_default_filter");
    let options = StartOptions { config_extra: "seccompDefault: true".to_owned(), ..Default::default() };
    let mut n = Nodelet::start_with(&env, "pss-seccomp", options).await;
    let pod = |sc: Value| {
        json!({"terminationGracePeriodSeconds": 1, "securityContext": sc,
               "containers": [{"name": "app", "command": sleep_until_term("")}]})
    };
    n.write_manifest("default.yaml", &n.pod_manifest("default", pod(json!({}))));
    n.write_manifest(
        "unconfined.yaml",
        &n.pod_manifest("unconfined", pod(json!({"seccompProfile": {"type": "Unconfined"}}))),
    );
    let defaulted = n.wait_running("default").await;
    let unconfined = n.wait_running("unconfined").await;
    let id = |p| container(p, "app").map(runtime_id).unwrap_or_default();
    assert_eq!(seccomp_mode(&n, &id(&defaulted)).await, "2", "RuntimeDefault is a seccomp filter");
    assert_eq!(seccomp_mode(&n, &id(&unconfined)).await, "0", "an explicit Unconfined stays unconfined");
    n.assert_untouched("default", &defaulted).await;
    n.assert_alive_within(PEAK_RSS_MIB, "seccompDefault");
    n.shutdown().await;
}

#[tokio::test]
async fn a_forged_provisioned_volume_is_released_without_deleting_its_data() {
    let env = env_or_skip!("a_forged_provisioned_volume_is_released_without_deleting_its_data");
    let mut n = Nodelet::start(&env, "pss-forged").await;
    n.write_manifest("steady.yaml", &steady(&n));
    let steady_before = n.wait_running("steady").await;
    // A directory where the local-path provisioner would put a volume named "forged", which it never created.
    let dir = n.root_dir().join("storage/local/forged");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(dir.join("precious"), "keep me").unwrap_or_else(|e| panic!("write: {e}"));
    let pv = format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: forged
  annotations: {{pv.kubernetes.io/provisioned-by: nodelet.dev/local-path}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  persistentVolumeReclaimPolicy: Delete
  local: {{path: "{}"}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: ["{}"]}}
"#,
        dir.display(),
        n.node()
    );
    let claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data, namespace: default}\nspec:\n  \
                 storageClassName: manual\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 500Mi}}\n";
    n.write_manifest_text("pv.yaml", &pv);
    n.write_manifest_text("claim.yaml", claim);
    let phase = async |n: &Nodelet| -> Value {
        let Some(body) = n.main_get_text("/api/v1/persistentvolumes").await else { return Value::Null };
        let list: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        list["items"][0]["status"].clone()
    };
    n.wait_for("the forged volume Bound", Duration::from_secs(15), async || {
        (phase(&n).await["phase"] == "Bound").then_some(())
    })
    .await;
    // The claim goes: under Delete the provisioner would remove the directory; without nodelet's own record of
    // provisioning it, the volume fails with a clear message and the data stays.
    n.remove_manifest("claim.yaml");
    let status = n
        .wait_for("the forged volume Failed", Duration::from_secs(15), async || {
            let s = phase(&n).await;
            (s["phase"] == "Failed").then_some(s)
        })
        .await;
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.contains("no provisioning record"), "{status}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("precious")).unwrap_or_default(),
        "keep me",
        "the data stays"
    );
    n.assert_untouched("steady", &steady_before).await;
    n.assert_alive_within(PEAK_RSS_MIB, "a forged provisioned volume");
    n.shutdown().await;
}

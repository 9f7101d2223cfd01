//! Volumes on the real runtime with real mounts: emptyDir (disk and Memory), every hostPath type,
//! configMap/secret/downwardAPI content and updates, subPath attacks, and restarts of nodelet with
//! volumes mounted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::support::{
    Nodelet, StartOptions, container, env_or_skip, phase, pod_ip, runtime_id, sleep_until_term, uid, waiting,
};

/// The mount points at or beneath `dir`, from this process's mount table.
fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.to_string_lossy().into_owned();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| *p == dir || p.starts_with(&format!("{dir}/")))
        .collect()
}

fn is_mount_point(path: &Path) -> bool {
    let path = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(path.as_str()))
}

/// The permission and special bits of `path` (not following a final symlink).
fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(u32::MAX)
}

fn volume_dir(n: &Nodelet, uid: &str, plugin: &str, name: &str) -> PathBuf {
    n.root_dir().join("pods").join(uid).join("volumes").join(plugin).join(name)
}

/// Waits until the pod `name` is gone from `/pods` and its directory from the root.
async fn wait_gone(n: &Nodelet, name: &str, uid: &str) {
    let pod_dir = n.root_dir().join("pods").join(uid);
    n.wait_for(&format!("pod {name} and {} gone", pod_dir.display()), Duration::from_secs(60), async || {
        (n.pod(name).await.is_none() && !pod_dir.exists()).then_some(())
    })
    .await;
}

/// The (reason, message) of every event on `/api/v1/events`.
async fn events(n: &Nodelet) -> Vec<(String, String)> {
    let Some(body) = n.main_get_text("/api/v1/events").await else { return Vec::new() };
    let list: k8s_openapi::List<k8s_openapi::api::core::v1::Event> =
        serde_json::from_str(&body).unwrap_or_default();
    list.items.into_iter().map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default())).collect()
}

fn container_id(pod: &Pod, name: &str) -> String {
    runtime_id(container(pod, name).unwrap_or_else(|| panic!("no status of container {name}")))
}

#[tokio::test]
async fn the_shared_emptydir_example_runs_and_its_containers_share_the_volume() {
    let env = env_or_skip!("the_shared_emptydir_example_runs_and_its_containers_share_the_volume");
    let n = Nodelet::start(&env, "emptydir-example").await;
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/shared-emptydir.yaml");
    let text = std::fs::read_to_string(example).unwrap_or_else(|e| panic!("{example}: {e}"));
    let text = text.replace("localhost/nodelet/busybox:latest", &env.busybox);
    n.write_manifest_text("shared-emptydir.yaml", &text);
    let pod = n.wait_running("shared-emptydir").await;
    let ip = pod_ip(&pod);
    let page = n
        .wait_for("the page over HTTP", Duration::from_secs(20), async || {
            let r = n.http().get(format!("http://{ip}:8081/index.html")).send().await.ok()?;
            r.text().await.ok().filter(|t| t.contains("written by the init container"))
        })
        .await;
    assert!(page.starts_with("written by the init container at "), "{page}");
    let (code, out) = n.exec(&container_id(&pod, "reader"), &["cat", "/shared/index.html"]).await;
    assert_eq!((code, out.as_str()), (0, page.as_str()));
    // The readers mount it read-only.
    let (code, _) = n.exec(&container_id(&pod, "server"), &["touch", "/shared/x"]).await;
    assert_ne!(code, 0, "a readOnly mount was writable");
    n.shutdown().await;
}

#[tokio::test]
async fn emptydir_on_disk_and_in_memory_with_a_size_limit_survive_restarts_and_go_with_the_pod() {
    let env =
        env_or_skip!("emptydir_on_disk_and_in_memory_with_a_size_limit_survive_restarts_and_go_with_the_pod");
    let n = Nodelet::start(&env, "emptydir").await;
    let manifest = n.pod_manifest(
        "scratch",
        json!({
            "terminationGracePeriodSeconds": 2,
            "volumes": [
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "disk", "emptyDir": {}},
            ],
            "containers": [{
                "name": "app",
                "command": sleep_until_term(""),
                "volumeMounts": [{"name": "mem", "mountPath": "/mem"}, {"name": "disk", "mountPath": "/disk"}],
            }],
        }),
    );
    n.write_manifest("scratch.yaml", &manifest);
    let pod = n.wait_running("scratch").await;
    let uid = uid(&pod);
    let id = container_id(&pod, "app");
    let mem = volume_dir(&n, &uid, "kubernetes.io~empty-dir", "mem");
    let disk = volume_dir(&n, &uid, "kubernetes.io~empty-dir", "disk");
    assert!(is_mount_point(&mem), "the Memory emptyDir is not a mount");
    assert!(!is_mount_point(&disk) && disk.is_dir(), "the disk emptyDir is a plain directory");

    let (_, mounts) = n.exec(&id, &["cat", "/proc/mounts"]).await;
    let line = mounts.lines().find(|l| l.split(' ').nth(1) == Some("/mem")).unwrap_or_default().to_owned();
    assert!(line.starts_with("tmpfs /mem tmpfs") && line.contains("size=1024k"), "{line}");
    // Within the limit: fine. Past it: ENOSPC.
    let (code, out) = n.exec(&id, &["dd", "if=/dev/zero", "of=/mem/small", "bs=1024", "count=512"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = n.exec(&id, &["dd", "if=/dev/zero", "of=/mem/big", "bs=1024", "count=2048"]).await;
    assert_ne!(code, 0, "wrote 2 MiB into a 1 MiB emptyDir: {out}");
    assert!(out.contains("No space left"), "{out}");

    // The container's writes reach the host directory and survive a container restart.
    let (code, _) =
        n.exec(&id, &["sh", "-c", "rm /mem/big && echo kept > /disk/file && echo kept > /mem/file"]).await;
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(disk.join("file")).unwrap_or_default(), "kept\n");
    let _ = n.exec(&id, &["kill", "1"]).await;
    let pod = n
        .wait_for_pod("scratch", "restarted once", Duration::from_secs(30), |p| {
            phase(p) == "Running" && container(p, "app").is_some_and(|c| c.restart_count == 1 && c.ready)
        })
        .await;
    let id = container_id(&pod, "app");
    let (code, out) = n.exec(&id, &["cat", "/disk/file", "/mem/file"]).await;
    assert_eq!((code, out.as_str()), (0, "kept\nkept\n"));

    // Unmounted behind nodelet's back: noticed and mounted again.
    let status =
        std::process::Command::new("umount").arg(&mem).status().unwrap_or_else(|e| panic!("umount: {e}"));
    assert!(status.success());
    assert!(!is_mount_point(&mem));
    n.wait_for("the Memory emptyDir mounted again", Duration::from_secs(30), async || {
        is_mount_point(&mem).then_some(())
    })
    .await;

    n.remove_manifest("scratch.yaml");
    wait_gone(&n, &n.pod_name("scratch"), &uid).await;
    assert_eq!(mounts_under(&n.root_dir()), Vec::<String>::new());
    n.shutdown().await;
}

#[tokio::test]
async fn host_path_volumes_of_every_type_are_checked_and_mounted() {
    let env = env_or_skip!("host_path_volumes_of_every_type_are_checked_and_mounted");
    let n = Nodelet::start(&env, "hostpath").await;
    let host = n.root_dir().parent().map(|p| p.join("host")).unwrap_or_default();
    std::fs::create_dir_all(host.join("dir")).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(host.join("file"), "from the host\n").unwrap_or_else(|e| panic!("write: {e}"));
    let _socket =
        std::os::unix::net::UnixListener::bind(host.join("sock")).unwrap_or_else(|e| panic!("bind: {e}"));
    let status = std::process::Command::new("mknod")
        .arg(host.join("blk"))
        .args(["b", "7", "250"])
        .status()
        .unwrap_or_else(|e| panic!("mknod: {e}"));
    assert!(status.success());
    let h = |p: &str| host.join(p).display().to_string();
    let volumes = [
        ("new-dir", h("new/dir"), "DirectoryOrCreate"),
        ("dir", h("dir"), "Directory"),
        ("new-file", h("new-file"), "FileOrCreate"),
        ("file", h("file"), "File"),
        ("sock", h("sock"), "Socket"),
        ("chr", "/dev/null".to_owned(), "CharDevice"),
        ("blk", h("blk"), "BlockDevice"),
        ("any", h("dir"), ""),
    ];
    let spec_volumes: Vec<Value> = volumes
        .iter()
        .map(|(name, path, kind)| json!({"name": name, "hostPath": {"path": path, "type": kind}}))
        .collect();
    let mounts: Vec<Value> =
        volumes.iter().map(|(name, _, _)| json!({"name": name, "mountPath": format!("/v/{name}")})).collect();
    let manifest = n.pod_manifest(
        "hostpaths",
        json!({
            "terminationGracePeriodSeconds": 2,
            "volumes": spec_volumes,
            "containers": [{"name": "app", "command": sleep_until_term(""), "volumeMounts": mounts}],
        }),
    );
    n.write_manifest("hostpaths.yaml", &manifest);
    // A pod whose hostPath has the wrong type does not start, and says why; the other pod is unaffected.
    let wrong = n.pod_manifest(
        "wrong-type",
        json!({
            "volumes": [{"name": "notadir", "hostPath": {"path": h("file"), "type": "Directory"}}],
            "containers": [{"name": "app", "command": sleep_until_term(""),
                            "volumeMounts": [{"name": "notadir", "mountPath": "/x"}]}],
        }),
    );
    n.write_manifest("wrong.yaml", &wrong);

    let pod = n.wait_running("hostpaths").await;
    let id = container_id(&pod, "app");
    let script = "test -d /v/new-dir && test -d /v/dir && test -f /v/new-file && test -s /v/file && \
                  test -S /v/sock && test -c /v/chr && test -b /v/blk && test -d /v/any && cat /v/file";
    let (code, out) = n.exec(&id, &["sh", "-c", script]).await;
    assert_eq!((code, out.as_str()), (0, "from the host\n"));
    assert!(host.join("new/dir").is_dir() && host.join("new-file").is_file());
    let (code, _) = n.exec(&id, &["sh", "-c", "echo from the pod > /v/dir/out"]).await;
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(host.join("dir/out")).unwrap_or_default(), "from the pod\n");

    let event = n
        .wait_for("a FailedMount event for the wrong type", Duration::from_secs(20), async || {
            events(&n).await.into_iter().find(|(reason, _)| reason == "FailedMount")
        })
        .await;
    assert!(event.1.contains("\"notadir\"") && event.1.contains("wrong-type"), "{event:?}");
    let wrong_pod = n.pod("wrong-type").await.unwrap_or_else(|| panic!("wrong-type pod listed"));
    assert_eq!(phase(&wrong_pod), "Pending");
    assert!(n.sandboxes_of(&uid(&wrong_pod)).await.is_empty(), "a sandbox for a pod whose volume failed");

    let hostpaths_uid = uid(&pod);
    n.remove_manifest("hostpaths.yaml");
    wait_gone(&n, &n.pod_name("hostpaths"), &hostpaths_uid).await;
    // Teardown never touches host paths.
    assert!(host.join("dir/out").is_file() && host.join("file").is_file() && host.join("new/dir").is_dir());
    n.shutdown().await;
}

const CONFIG: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: default}
data:
  greeting: GREETING
  other: unused
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret, namespace: default}
data:
  token: c2VjcmV0LXRva2Vu
"#;

#[tokio::test]
async fn config_map_secret_and_downward_api_volumes_have_their_content_and_updates_reach_the_container() {
    let env = env_or_skip!(
        "config_map_secret_and_downward_api_volumes_have_their_content_and_updates_reach_the_container"
    );
    let n = Nodelet::start(&env, "configmap").await;
    n.write_manifest_text("config.yaml", &CONFIG.replace("GREETING", "hello-v1"));
    let mut manifest = n.pod_manifest(
        "configured",
        json!({
            "terminationGracePeriodSeconds": 2,
            "volumes": [
                {"name": "cfg", "configMap": {"name": "app-config",
                    "items": [{"key": "greeting", "path": "greet/hello.txt", "mode": 0o600}]}},
                {"name": "sec", "secret": {"secretName": "app-secret", "defaultMode": 0o400}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                ]}},
                {"name": "all", "projected": {"sources": [
                    {"configMap": {"name": "app-config"}},
                    {"secret": {"name": "app-secret"}},
                ]}},
            ],
            "containers": [{
                "name": "app",
                "command": sleep_until_term(""),
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/cfg"},
                    {"name": "sec", "mountPath": "/sec"},
                    {"name": "info", "mountPath": "/info"},
                    {"name": "all", "mountPath": "/all"},
                ],
            }],
        }),
    );
    manifest["metadata"]["labels"] = json!({"app": "demo"});
    n.write_manifest("configured.yaml", &manifest);
    let pod = n.wait_running("configured").await;
    let id = container_id(&pod, "app");
    let read = async |path: &str| n.exec(&id, &["cat", path]).await;
    assert_eq!(read("/cfg/greet/hello.txt").await, (0, "hello-v1".to_owned()));
    assert_eq!(read("/sec/token").await, (0, "secret-token".to_owned()));
    assert_eq!(read("/info/labels").await, (0, "app=\"demo\"".to_owned()));
    assert_eq!(read("/info/name").await, (0, n.pod_name("configured")));
    assert_eq!(read("/all/other").await, (0, "unused".to_owned()));
    assert_eq!(read("/all/token").await, (0, "secret-token".to_owned()));
    let (_, modes) = n.exec(&id, &["sh", "-c", "stat -L -c %a /cfg/greet/hello.txt /sec/token"]).await;
    assert_eq!(modes, "600\n400\n");
    // Only the listed item is there; the volumes are read-only; the secret lives on a tmpfs.
    let (code, _) = n.exec(&id, &["test", "-e", "/cfg/other"]).await;
    assert_ne!(code, 0);
    let (code, _) = n.exec(&id, &["touch", "/cfg/new"]).await;
    assert_ne!(code, 0, "a configMap volume was writable");
    let (_, mounts) = n.exec(&id, &["cat", "/proc/mounts"]).await;
    assert!(mounts.lines().any(|l| l.starts_with("tmpfs /sec ")), "{mounts}");
    let host_secret = volume_dir(&n, &uid(&pod), "kubernetes.io~secret", "sec");
    assert!(is_mount_point(&host_secret), "the secret is not on a tmpfs on the host");

    // An update of the ConfigMap reaches the running container (through the ..data swap), no restart.
    n.write_manifest_text("config.yaml", &CONFIG.replace("GREETING", "hello-v2"));
    n.wait_for("the updated greeting in the container", Duration::from_secs(30), async || {
        (read("/cfg/greet/hello.txt").await.1 == "hello-v2").then_some(())
    })
    .await;
    let pod = n.pod("configured").await.unwrap_or_else(|| panic!("pod listed"));
    assert_eq!(container(&pod, "app").map(|c| c.restart_count), Some(0));
    assert_eq!(container_id(&pod, "app"), id);

    // A pod whose ConfigMap does not exist waits, saying why.
    let missing = n.pod_manifest(
        "missing-config",
        json!({
            "volumes": [{"name": "cfg", "configMap": {"name": "nope"}}],
            "containers": [{"name": "app", "command": sleep_until_term(""),
                            "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
        }),
    );
    n.write_manifest("missing.yaml", &missing);
    let event = n
        .wait_for("a FailedMount event for the missing ConfigMap", Duration::from_secs(20), async || {
            events(&n).await.into_iter().find(|(_, message)| message.contains("\"nope\""))
        })
        .await;
    assert_eq!(event.0, "FailedMount", "{event:?}");
    assert!(event.1.contains("volume \"cfg\""), "{event:?}");
    let pod = n.pod("missing-config").await.unwrap_or_else(|| panic!("pod listed"));
    assert_eq!(phase(&pod), "Pending");
    n.shutdown().await;
}

/// A pod whose init container plants `setup` in an emptyDir, then mounts `sub_path` of it.
fn sub_path_pod(n: &Nodelet, name: &str, setup: &str, sub_path: Value) -> Value {
    let mut mount = json!({"name": "vol", "mountPath": "/data"});
    if let (Some(m), Some(extra)) = (mount.as_object_mut(), sub_path.as_object()) {
        m.extend(extra.clone());
    }
    n.pod_manifest(
        name,
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "vol", "emptyDir": {}}],
            "initContainers": [{"name": "setup", "command": ["sh", "-c", setup],
                                "volumeMounts": [{"name": "vol", "mountPath": "/vol"}]}],
            "containers": [{"name": "app", "command": sleep_until_term(""),
                            "env": [{"name": "UP", "value": ".."}],
                            "volumeMounts": [mount]}],
        }),
    )
}

#[tokio::test]
async fn sub_path_attacks_through_symlinks_fail_and_good_sub_paths_work() {
    let env = env_or_skip!("sub_path_attacks_through_symlinks_fail_and_good_sub_paths_work");
    let n = Nodelet::start(&env, "subpath").await;
    let plant = "mkdir -p /vol/good/dir /vol/d && echo safe > /vol/good/dir/file && ln -s /etc /vol/evil && \
                 ln -s / /vol/root && ln -s /etc /vol/d/link && ln -s /etc/hostname /vol/file-link";
    let attacks = [
        ("final-link", json!({"subPath": "evil"})),
        ("middle-link", json!({"subPath": "root/etc"})),
        ("nested-link", json!({"subPath": "d/link"})),
        ("file-link", json!({"subPath": "file-link"})),
        ("expr-escape", json!({"subPathExpr": "$(UP)/$(UP)/etc"})),
    ];
    n.write_manifest("good.yaml", &sub_path_pod(&n, "good", plant, json!({"subPath": "good/dir"})));
    for (name, sub) in &attacks {
        n.write_manifest(&format!("{name}.yaml"), &sub_path_pod(&n, name, plant, sub.clone()));
    }
    let pod = n.wait_running("good").await;
    let (code, out) = n.exec(&container_id(&pod, "app"), &["cat", "/data/file"]).await;
    assert_eq!((code, out.as_str()), (0, "safe\n"));

    for (name, _) in &attacks {
        let pod = n
            .wait_for_pod(name, "app waiting with CreateContainerConfigError", Duration::from_secs(30), |p| {
                container(p, "app")
                    .and_then(waiting)
                    .is_some_and(|(reason, _)| reason == "CreateContainerConfigError")
            })
            .await;
        let (_, message) = container(&pod, "app").and_then(waiting).unwrap_or_default();
        assert!(message.contains("subPath"), "{name}: {message}");
        // The container never existed: nothing of the host's /etc was ever mounted into it.
        let app: Vec<_> = n
            .containers_of(&uid(&pod))
            .await
            .into_iter()
            .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == "app"))
            .collect();
        assert!(app.is_empty(), "{name}: an app container was created: {app:?}");
    }
    // The only subPath bind is the good pod's.
    let good = n.root_dir().join("pods").join(uid(&pod)).display().to_string();
    let binds: Vec<String> =
        mounts_under(&n.root_dir()).into_iter().filter(|m| m.contains("volume-subpaths")).collect();
    assert_eq!(binds, vec![format!("{good}/volume-subpaths/vol/app/0")]);
    n.shutdown().await;
}

#[tokio::test]
async fn kill_9_with_volumes_mounted_then_restart_and_delete_leaves_no_double_or_leaked_mounts() {
    let env =
        env_or_skip!("kill_9_with_volumes_mounted_then_restart_and_delete_leaves_no_double_or_leaked_mounts");
    let mut n = Nodelet::start(&env, "vol-restart").await;
    n.write_manifest_text("config.yaml", &CONFIG.replace("GREETING", "hi"));
    let manifest = n.pod_manifest(
        "mounted",
        json!({
            "terminationGracePeriodSeconds": 2,
            "volumes": [
                {"name": "mem", "emptyDir": {"medium": "Memory"}},
                {"name": "disk", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "app-config"}},
                {"name": "sec", "secret": {"secretName": "app-secret"}},
            ],
            "initContainers": [{"name": "setup", "command": ["mkdir", "-p", "/disk/sub"],
                                "volumeMounts": [{"name": "disk", "mountPath": "/disk"}]}],
            "containers": [{
                "name": "app",
                "command": sleep_until_term(""),
                "volumeMounts": [
                    {"name": "mem", "mountPath": "/mem"},
                    {"name": "disk", "mountPath": "/sub", "subPath": "sub"},
                    {"name": "cfg", "mountPath": "/cfg"},
                    {"name": "sec", "mountPath": "/sec"},
                ],
            }],
        }),
    );
    n.write_manifest("mounted.yaml", &manifest);
    let pod = n.wait_running("mounted").await;
    let uid = uid(&pod);
    let id = container_id(&pod, "app");
    let before = mounts_under(&n.root_dir());
    // mem and sec tmpfs, the subPath bind
    assert_eq!(before.len(), 3, "{before:?}");

    n.kill9().await;
    n.start_again().await;
    // Adopted, not restarted; nothing mounted again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = n.wait_running("mounted").await;
    assert_eq!(container_id(&pod, "app"), id);
    let mut after = mounts_under(&n.root_dir());
    let mut sorted = before.clone();
    sorted.sort();
    after.sort();
    assert_eq!(after, sorted, "mounts changed across the restart");
    let (code, out) = n.exec(&id, &["cat", "/cfg/greeting"]).await;
    assert_eq!((code, out.as_str()), (0, "hi"));

    n.remove_manifest("mounted.yaml");
    wait_gone(&n, &n.pod_name("mounted"), &uid).await;
    assert_eq!(mounts_under(&n.root_dir()), Vec::<String>::new(), "leaked mounts");
    n.shutdown().await;
}

#[tokio::test]
async fn a_pod_writes_through_its_claim_into_a_local_persistent_volume() {
    let env = env_or_skip!("a_pod_writes_through_its_claim_into_a_local_persistent_volume");
    let n = Nodelet::start(&env, "local-pv").await;
    let disk = n.root_dir().parent().map(|p| p.join("disk")).unwrap_or_default();
    std::fs::create_dir_all(&disk).unwrap_or_else(|e| panic!("mkdir: {e}"));
    let storage = format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-disk}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  persistentVolumeReclaimPolicy: Retain
  local: {{path: "{}"}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: ["{}"]}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 500Mi}}}}
"#,
        disk.display(),
        n.node()
    );
    // The claim alone first: no volume yet, it is Pending and says why.
    let (pv_doc, claim_doc) = storage.split_once("---").unwrap_or_default();
    n.write_manifest_text("claim.yaml", claim_doc);
    let pending = n
        .wait_for("the claim Pending with a reason", Duration::from_secs(10), async || {
            let table = n.cli_main(&["get", "pvc"]).await;
            table.lines().any(|l| l.starts_with("data ") && l.contains("Pending")).then_some(table)
        })
        .await;
    assert!(pending.contains("manual"), "{pending}");
    let claims = api_list(&n, "/api/v1/persistentvolumeclaims").await;
    let condition =
        claims["items"][0]["status"]["conditions"][0]["message"].as_str().unwrap_or_default().to_owned();
    assert!(condition.contains("no persistent volume of class \"manual\""), "{claims}");
    // The volume arrives: the claim binds.
    n.write_manifest_text("storage.yaml", pv_doc);
    n.wait_for("the claim Bound", Duration::from_secs(10), async || {
        let pvs = api_list(&n, "/api/v1/persistentvolumes").await;
        (pvs["items"][0]["status"]["phase"] == "Bound").then_some(())
    })
    .await;
    let table = n.cli_main(&["get", "pv"]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("local-disk ") && l.contains("Bound") && l.contains("default/data")),
        "{table}"
    );
    let manifest = n.pod_manifest(
        "claimer",
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "app", "command": sleep_until_term("echo from the pod > /data/out; "),
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }),
    );
    n.write_manifest("claimer.yaml", &manifest);
    let pod = n.wait_running("claimer").await;
    let uid = uid(&pod);
    n.wait_for("the pod's write on the local disk", Duration::from_secs(10), async || {
        std::fs::read_to_string(disk.join("out")).ok().filter(|t| t == "from the pod\n")
    })
    .await;
    let target = volume_dir(&n, &uid, "kubernetes.io~local-volume", "data");
    assert!(is_mount_point(&target), "the local volume is not bind-mounted into the pod directory");
    // The claim's volume stats are on /metrics (the local disk's filesystem).
    let metrics_url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let line = n
        .wait_for("kubelet_volume_stats_capacity_bytes of the claim", Duration::from_secs(10), async || {
            let text = n.http().get(&metrics_url).send().await.ok()?.text().await.ok()?;
            text.lines()
                .find(|l| {
                    l.starts_with("kubelet_volume_stats_capacity_bytes{")
                        && l.contains("persistentvolumeclaim=\"data\"")
                        && l.contains("namespace=\"default\"")
                })
                .map(str::to_owned)
        })
        .await;
    let capacity: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let fs = fs_capacity(&disk);
    assert!((capacity - fs).abs() < 1.0, "{line} vs statvfs {fs}");

    // The pod goes: the bind mount goes, the data stays.
    n.remove_manifest("claimer.yaml");
    wait_gone(&n, &n.pod_name("claimer"), &uid).await;
    assert_eq!(mounts_under(&n.root_dir()), Vec::<String>::new());
    assert_eq!(std::fs::read_to_string(disk.join("out")).unwrap_or_default(), "from the pod\n");
    // The claim goes: the volume is Released and, under Retain, keeps its data.
    n.remove_manifest("claim.yaml");
    n.wait_for("the volume Released", Duration::from_secs(10), async || {
        let pvs = api_list(&n, "/api/v1/persistentvolumes").await;
        (pvs["items"][0]["status"]["phase"] == "Released").then_some(())
    })
    .await;
    assert_eq!(std::fs::read_to_string(disk.join("out")).unwrap_or_default(), "from the pod\n");
    n.shutdown().await;
}

/// The size of the filesystem holding `path` (statvfs), in bytes.
fn fs_capacity(path: &Path) -> f64 {
    let st = rustix::fs::statvfs(path).unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()));
    (st.f_blocks * st.f_frsize) as f64
}

/// A v1 List from the read-only port.
async fn api_list(n: &Nodelet, path: &str) -> Value {
    let Some(body) = n.main_get_text(path).await else { return Value::Null };
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

/// The `nodelet-csi-hostpath` binary, built beside this test binary (`cargo nextest run --workspace`
/// builds it for its own tests).
pub(crate) fn csi_hostpath_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let bin = dir.join("nodelet-csi-hostpath");
    assert!(bin.is_file(), "{} is missing: cargo build -p nodelet-csi-hostpath", bin.display());
    bin
}

/// Kills the CSI driver when the test ends, however it ends.
pub(crate) struct Killed(pub(crate) std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A StorageClass `class` of `provisioner` (reclaim Delete, `binding` mode) and a 64 MiB
/// ReadWriteOnce claim `claim` of it in namespace `default`, as one manifest.
fn class_and_claim(class: &str, provisioner: &str, binding: &str, claim: &str) -> String {
    format!(
        r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: {provisioner}
reclaimPolicy: Delete
volumeBindingMode: {binding}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {claim}, namespace: default}}
spec:
  storageClassName: {class}
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 64Mi}}}}
"#
    )
}

/// A running `nodelet-csi-hostpath` for `n`, registered in its plugin registry.
struct CsiDriver {
    _process: Killed,
    /// Where the driver keeps its volumes.
    data: PathBuf,
    /// Its call log (one JSON line per call).
    calls: PathBuf,
}

impl CsiDriver {
    fn start(n: &Nodelet, extra: &[&str]) -> CsiDriver {
        let base = n.root_dir().parent().map(Path::to_path_buf).unwrap_or_default();
        let data = base.join("csi-data");
        let calls = base.join("csi-calls.jsonl");
        std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("mkdir: {e}"));
        let socket = n.root_dir().join("plugins_registry").join("hostpath.sock");
        let process = std::process::Command::new(csi_hostpath_binary())
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-dir")
            .arg(&data)
            .args(["--node-id", n.node()])
            .arg("--call-log")
            .arg(&calls)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the CSI driver: {e}"));
        CsiDriver { _process: Killed(process), data, calls }
    }

    /// Every call the driver received so far, in order.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v.get("method").and_then(Value::as_str).map(str::to_owned))
            .collect()
    }

    /// The volume lifecycle calls the driver received so far, in order.
    fn lifecycle(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|m| {
                matches!(
                    m.as_str(),
                    "CreateVolume"
                        | "ControllerPublishVolume"
                        | "NodeStageVolume"
                        | "NodePublishVolume"
                        | "NodeUnpublishVolume"
                        | "NodeUnstageVolume"
                        | "ControllerUnpublishVolume"
                        | "DeleteVolume"
                )
            })
            .collect()
    }
}

#[tokio::test]
async fn a_claim_of_a_csi_storage_class_is_provisioned_staged_published_and_cleaned_up() {
    let env = env_or_skip!("a_claim_of_a_csi_storage_class_is_provisioned_staged_published_and_cleaned_up");
    let options = crate::support::StartOptions {
        config_extra: "volumeStatsAggPeriod: 1s".into(),
        ..Default::default()
    };
    let n = Nodelet::start_with(&env, "csi", options).await;
    let driver = CsiDriver::start(&n, &[]);
    let storage =
        class_and_claim("csi-hostpath", "hostpath.csi.nodelet.dev", "WaitForFirstConsumer", "scratch");
    n.write_manifest_text("storage.yaml", &storage);
    n.wait_for("the storage class in nodelet get storageclass", Duration::from_secs(10), async || {
        let classes = n.cli_main(&["get", "storageclass"]).await;
        classes
            .lines()
            .any(|l| l.starts_with("csi-hostpath ") && l.contains("hostpath.csi.nodelet.dev"))
            .then_some(())
    })
    .await;
    let manifest = n.pod_manifest(
        "csi-user",
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch"}}],
            "containers": [{"name": "app",
                            "command": sleep_until_term(
                                "echo via csi > /scratch/out; dd if=/dev/urandom of=/scratch/blob bs=1024 count=3072 2>/dev/null; "),
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        }),
    );
    n.write_manifest("csi-user.yaml", &manifest);
    let pod = n.wait_running("csi-user").await;
    let uid = uid(&pod);
    // The claim's events say it was provisioned, as the external-provisioner words it.
    let claim_events = n
        .cli_main(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=scratch",
        ])
        .await;
    assert!(
        claim_events.lines().any(|l| l.contains("Normal")
            && l.contains("ProvisioningSucceeded")
            && l.contains("persistentvolumeclaim/scratch")
            && l.contains("Successfully provisioned volume ")),
        "{claim_events}"
    );
    // The file lands in the driver's data directory.
    let written = n
        .wait_for("the pod's file in the CSI driver's data", Duration::from_secs(10), async || {
            let found = walk_files(&driver.data).into_iter().find(|p| p.ends_with("out"))?;
            (std::fs::read_to_string(&found).ok()? == "via csi\n").then_some(found)
        })
        .await;
    let target = volume_dir(&n, &uid, "kubernetes.io~csi", "scratch").join("mount");
    assert!(is_mount_point(&target), "the CSI volume is not published at {}", target.display());
    // The claim's stats come from the driver (NodeGetVolumeStats): it counts what the volume holds
    // (3 MiB and a line), where statvfs would tell the whole disk's usage.
    let metrics_url = format!("http://127.0.0.1:{}/metrics", n.ports().read_only);
    let used = n
        .wait_for("kubelet_volume_stats_used_bytes of the CSI claim", Duration::from_secs(20), async || {
            let text = n.http().get(&metrics_url).send().await.ok()?.text().await.ok()?;
            let line = text.lines().find(|l| {
                l.starts_with("kubelet_volume_stats_used_bytes{")
                    && l.contains("persistentvolumeclaim=\"scratch\"")
            })?;
            let used: u64 = line.rsplit(' ').next()?.parse().ok()?;
            (used >= 3 << 20).then_some(used)
        })
        .await;
    assert!(used < 4 << 20, "used bytes {used}: not the volume's own usage");
    assert!(driver.calls().contains(&"NodeGetVolumeStats".to_string()));

    // Pod deleted: unpublished, unstaged; then the claim deleted: the volume is deleted (reclaim Delete).
    n.remove_manifest("csi-user.yaml");
    wait_gone(&n, &n.pod_name("csi-user"), &uid).await;
    // The device is unstaged once no pod publishes it (a step of its own, right after).
    n.wait_for("no mounts left", Duration::from_secs(10), async || {
        mounts_under(&n.root_dir()).is_empty().then_some(())
    })
    .await;
    n.remove_manifest("storage.yaml");
    n.wait_for("the CSI volume deleted", Duration::from_secs(20), async || (!written.exists()).then_some(()))
        .await;
    assert_eq!(
        driver.lifecycle(),
        [
            "CreateVolume",
            "NodeStageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "DeleteVolume"
        ],
    );
    n.shutdown().await;
}

#[tokio::test]
async fn a_claim_waiting_for_its_csi_driver_is_provisioned_once_the_driver_registers() {
    let env = env_or_skip!("a_claim_waiting_for_its_csi_driver_is_provisioned_once_the_driver_registers");
    let n = Nodelet::start(&env, "csi-late").await;
    // The claim first, with no CSI driver registered: it waits for its provisioner and says so.
    let storage = class_and_claim("csi-late", "hostpath.csi.nodelet.dev", "Immediate", "late");
    n.write_manifest_text("storage.yaml", &storage);
    n.wait_for("the claim waiting for its provisioner", Duration::from_secs(10), async || {
        let claims = api_list(&n, "/api/v1/persistentvolumeclaims").await;
        let message = claims["items"][0]["status"]["conditions"][0]["message"].as_str()?.to_owned();
        message.contains("hostpath.csi.nodelet.dev").then_some(())
    })
    .await;
    let table = n.cli_main(&["get", "pvc"]).await;
    assert!(table.lines().any(|l| l.starts_with("late ") && l.contains("Pending")), "{table}");
    // The driver registers at the next scan of the plugin directory (every 2 s); the store of
    // registered drivers changes and the claim engine, which watches it, plans the claim again at
    // once: bound well before the engine's first resync (30 s after it started).
    let driver = CsiDriver::start(&n, &[]);
    n.wait_for("the claim Bound once the driver registered", Duration::from_secs(12), async || {
        let table = n.cli_main(&["get", "pvc"]).await;
        table.lines().any(|l| l.starts_with("late ") && l.contains("Bound")).then_some(())
    })
    .await;
    assert_eq!(driver.lifecycle(), ["CreateVolume"]);
    n.remove_manifest("storage.yaml");
    n.wait_for("the CSI volume deleted", Duration::from_secs(20), async || {
        (driver.lifecycle().last().map(String::as_str) == Some("DeleteVolume")).then_some(())
    })
    .await;
    n.shutdown().await;
}

#[tokio::test]
async fn a_csi_device_is_attached_and_staged_once_for_two_pods_survives_kill_9_and_goes_after_the_last_pod() {
    let env = env_or_skip!(
        "a_csi_device_is_attached_and_staged_once_for_two_pods_survives_kill_9_and_goes_after_the_last_pod"
    );
    let mut n = Nodelet::start(&env, "csi-shared").await;
    // A driver with ControllerPublish/Unpublish: its stage and publish fail unless nodelet passes
    // on the publish context that the attach returned.
    let driver = CsiDriver::start(&n, &["--attach"]);
    let storage = class_and_claim("csi-attach", "hostpath.csi.nodelet.dev", "Immediate", "shared");
    n.write_manifest_text("storage.yaml", &storage);
    let user = |name: &str| {
        n.pod_manifest(
            name,
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}],
                "containers": [{"name": "app",
                                "command": sleep_until_term(&format!("echo {name} > /data/{name}; ")),
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            }),
        )
    };
    n.write_manifest("csi-a.yaml", &user("csi-a"));
    n.write_manifest("csi-b.yaml", &user("csi-b"));
    let a = n.wait_running("csi-a").await;
    let b = n.wait_running("csi-b").await;
    let (uid_a, uid_b) = (uid(&a), uid(&b));
    let (id_a, id_b) = (container_id(&a, "app"), container_id(&b, "app"));
    // Both pods write into the same volume: each sees the other's file.
    n.wait_for("each pod's file in the shared volume", Duration::from_secs(10), async || {
        let (ca, _) = n.exec(&id_a, &["cat", "/data/csi-b"]).await;
        let (cb, _) = n.exec(&id_b, &["cat", "/data/csi-a"]).await;
        (ca == 0 && cb == 0).then_some(())
    })
    .await;
    let global = n.root_dir().join("plugins/kubernetes.io/csi/hostpath.csi.nodelet.dev");
    let mut before = mounts_under(&n.root_dir());
    before.sort();
    let staged: Vec<&String> = before.iter().filter(|m| m.ends_with("/globalmount")).collect();
    assert_eq!(staged.len(), 1, "one global mount for the device: {before:?}");
    assert!(staged[0].starts_with(&global.to_string_lossy().into_owned()), "{before:?}");
    assert_eq!(before.len(), 3, "the global mount and one publish per pod: {before:?}");
    // The Node status names the device as in use and attached, as the kubelet names it.
    let node = node_status(&n).await;
    let in_use = node["volumesInUse"].as_array().cloned().unwrap_or_default();
    assert_eq!(in_use.len(), 1, "{node}");
    assert!(
        in_use[0].as_str().is_some_and(|v| v.starts_with("kubernetes.io/csi/hostpath.csi.nodelet.dev^")),
        "{node}"
    );
    assert_eq!(node["volumesAttached"][0]["name"], in_use[0], "{node}");
    assert_eq!(
        driver.lifecycle(),
        [
            "CreateVolume",
            "ControllerPublishVolume",
            "NodeStageVolume",
            "NodePublishVolume",
            "NodePublishVolume"
        ]
    );

    // kill -9 with everything mounted: the restarted nodelet takes the device and both pods over
    // (it attaches and stages again, both idempotent, to be sure) and mounts nothing twice.
    n.kill9().await;
    n.start_again().await;
    n.wait_for("the device taken over", Duration::from_secs(20), async || {
        (driver.lifecycle().len() >= 7).then_some(())
    })
    .await;
    assert_eq!(driver.lifecycle()[5..], ["ControllerPublishVolume", "NodeStageVolume"]);
    assert_eq!(container_id(&n.wait_running("csi-a").await, "app"), id_a);
    let mut after = mounts_under(&n.root_dir());
    after.sort();
    assert_eq!(after, before, "mounts changed across the restart");

    // The first pod goes: its volume is unpublished, the device stays for the second.
    n.remove_manifest("csi-a.yaml");
    wait_gone(&n, &n.pod_name("csi-a"), &uid_a).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(driver.lifecycle()[7..], ["NodeUnpublishVolume"]);
    assert_eq!(mounts_under(&n.root_dir()).len(), 2, "{:?}", mounts_under(&n.root_dir()));
    let (code, _) = n.exec(&id_b, &["cat", "/data/csi-a"]).await;
    assert_eq!(code, 0, "the second pod lost the volume");

    // The last pod goes: unpublished, then unstaged, then detached; nothing left behind.
    n.remove_manifest("csi-b.yaml");
    wait_gone(&n, &n.pod_name("csi-b"), &uid_b).await;
    n.wait_for("the device detached", Duration::from_secs(20), async || {
        driver.lifecycle().contains(&"ControllerUnpublishVolume".to_string()).then_some(())
    })
    .await;
    assert_eq!(
        driver.lifecycle()[8..],
        ["NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"]
    );
    assert_eq!(mounts_under(&n.root_dir()), Vec::<String>::new(), "leaked mounts");
    let node = node_status(&n).await;
    assert!(node.get("volumesInUse").is_none() && node.get("volumesAttached").is_none(), "{node}");
    let left: Vec<_> =
        std::fs::read_dir(&global).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "global directories left: {left:?}");
    n.shutdown().await;
}

/// Every regular file beneath `dir`.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(t) if t.is_file() => out.push(entry.path()),
                _ => {}
            }
        }
    }
    out
}

/// A volume group over a loop device, for one test; torn down on drop (after nodelet is gone).
struct TestVolumeGroup {
    name: String,
    file: PathBuf,
    device: String,
    /// `--driverloaded n` on a kernel without device-mapper (LVM's metadata tools still work).
    lvm_args: Vec<&'static str>,
}

impl TestVolumeGroup {
    fn create(n: &Nodelet, size: &str) -> TestVolumeGroup {
        let base = n.root_dir().parent().map(Path::to_path_buf).unwrap_or_default();
        let file = base.join("lvm-disk.img");
        let run = |program: &str, args: &[&str]| {
            let out = std::process::Command::new(program)
                .args(args)
                .env("LVM_SUPPRESS_FD_WARNINGS", "1")
                .output()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        run("truncate", &["-s", size, &file.to_string_lossy()]);
        let device = run("losetup", &["--find", "--show", &file.to_string_lossy()]);
        let lvm_args = match nodelet_storage::lvm::Activation::detect() {
            nodelet_storage::lvm::Activation::Loop => vec!["--driverloaded", "n"],
            nodelet_storage::lvm::Activation::DeviceMapper => Vec::new(),
        };
        let name = format!("nodelet-e2e-{}", std::process::id());
        let vg = TestVolumeGroup { name, file, device, lvm_args };
        run("pvcreate", &[vg.lvm_args.as_slice(), &["-f", "-y", &vg.device]].concat());
        run("vgcreate", &[vg.lvm_args.as_slice(), &[&vg.name, &vg.device]].concat());
        vg
    }

    /// The logical volumes of the group.
    fn volumes(&self) -> Vec<String> {
        let out = std::process::Command::new("lvs")
            .args(&self.lvm_args)
            .args(["--noheadings", "-o", "lv_name", &self.name])
            .env("LVM_SUPPRESS_FD_WARNINGS", "1")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        out.split_whitespace().map(str::to_owned).collect()
    }

    /// Loop devices over the group's disk (those nodelet made to activate volumes).
    fn volume_loops(&self) -> Vec<String> {
        let out = std::process::Command::new("losetup")
            .args(["-n", "-l", "-O", "NAME,BACK-FILE"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        out.lines()
            .filter_map(|l| l.split_once(' ').map(|(n, b)| (n.to_owned(), b.trim().to_owned())))
            .filter(|(_, back)| *back == self.device)
            .map(|(name, _)| name)
            .collect()
    }
}

impl Drop for TestVolumeGroup {
    fn drop(&mut self) {
        for dev in self.volume_loops() {
            let _ = std::process::Command::new("losetup").args(["-d", &dev]).output();
        }
        let _ = std::process::Command::new("vgremove")
            .args(&self.lvm_args)
            .args(["-f", "-y", &self.name])
            .output();
        let _ = std::process::Command::new("pvremove")
            .args(&self.lvm_args)
            .args(["-f", "-y", &self.device])
            .output();
        let _ = std::process::Command::new("losetup").args(["-d", &self.device]).output();
        let _ = std::fs::remove_file(&self.file);
    }
}

#[tokio::test]
async fn an_lvm_storage_class_provisions_a_logical_volume_for_a_pod_and_deletes_it_with_the_claim() {
    let env = env_or_skip!(
        "an_lvm_storage_class_provisions_a_logical_volume_for_a_pod_and_deletes_it_with_the_claim"
    );
    // The group exists before nodelet starts (as an admin would set a node up); its name is
    // known in advance so that the configuration can name it.
    let name = format!("nodelet-e2e-{}", std::process::id());
    let options = crate::support::StartOptions {
        nodelet_extra: format!("storage: {{lvm: {{volumeGroup: {name}}}}}\n"),
        ..Default::default()
    };
    let n = Nodelet::start_with(&env, "lvm", options).await;
    let vg = TestVolumeGroup::create(&n, "256M");
    assert_eq!(vg.name, name);
    let storage = class_and_claim("lvm", "nodelet.dev/lvm", "WaitForFirstConsumer", "fast");
    n.write_manifest_text("storage.yaml", &storage);
    let manifest = n.pod_manifest(
        "lvm-user",
        json!({
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "fast", "persistentVolumeClaim": {"claimName": "fast"}}],
            "containers": [{"name": "app", "command": sleep_until_term("echo on lvm > /fast/out; df -k /fast > /fast/df; "),
                            "volumeMounts": [{"name": "fast", "mountPath": "/fast"}]}],
        }),
    );
    n.write_manifest("lvm-user.yaml", &manifest);
    let pod = n.wait_running("lvm-user").await;
    let uid = uid(&pod);
    // One logical volume, named after the claim, mounted under the root and bound into the pod.
    let volumes = vg.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert!(volumes[0].starts_with("pvc-"), "{volumes:?}");
    let mount = n.root_dir().join("plugins/kubernetes.io~lvm").join(&name).join(&volumes[0]);
    let out = n
        .wait_for("the pod's file on the logical volume", Duration::from_secs(10), async || {
            std::fs::read_to_string(mount.join("out")).ok().filter(|t| t == "on lvm\n")
        })
        .await;
    assert_eq!(out, "on lvm\n");
    // The pod sees a file system of the claim's size, not the node's disk.
    let df = n
        .wait_for("df inside the pod", Duration::from_secs(10), async || {
            std::fs::read_to_string(mount.join("df")).ok().filter(|t| t.lines().count() >= 2)
        })
        .await;
    let size_kib: u64 =
        df.lines().nth(1).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((40 << 10..=64 << 10).contains(&size_kib), "{df}");
    assert!(is_mount_point(&volume_dir(&n, &uid, "kubernetes.io~local-volume", "fast")));

    // Pod gone, then claim gone: reclaim Delete removes the logical volume (and, under loop
    // activation, its loop device); nothing stays mounted.
    n.remove_manifest("lvm-user.yaml");
    wait_gone(&n, &n.pod_name("lvm-user"), &uid).await;
    n.remove_manifest("storage.yaml");
    n.wait_for("the logical volume removed", Duration::from_secs(20), async || {
        vg.volumes().is_empty().then_some(())
    })
    .await;
    assert_eq!(vg.volume_loops(), Vec::<String>::new());
    assert_eq!(mounts_under(&n.root_dir()), Vec::<String>::new(), "leaked mounts");
    n.shutdown().await;
}

/// `status` of the Node on `/api/v1/nodes` (main port).
async fn node_status(n: &Nodelet) -> serde_json::Value {
    let Some(body) = n.main_get_text("/api/v1/nodes").await else { panic!("GET /api/v1/nodes: no answer") };
    let list: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    list["items"][0]["status"].clone()
}

/// The directory of the upstream CSI programs (`hostpathplugin`, `csi-node-driver-registrar`) that
/// scripts/test.sh unpacks from ../shared/csi; `None` (the test says it did not run) when absent, a
/// failure when the test command provided them (`NODELET_REQUIRE_UPSTREAM_CSI=1`).
fn upstream_csi(test: &str) -> Option<PathBuf> {
    match std::env::var_os("NODELET_TEST_UPSTREAM_CSI").map(PathBuf::from) {
        Some(dir)
            if dir.join("hostpathplugin").is_file() && dir.join("csi-node-driver-registrar").is_file() =>
        {
            Some(dir)
        }
        other => {
            assert!(
                std::env::var("NODELET_REQUIRE_UPSTREAM_CSI").as_deref() != Ok("1"),
                "{test}: NODELET_TEST_UPSTREAM_CSI={other:?} has no hostpathplugin and csi-node-driver-registrar"
            );
            eprintln!("SKIP {test}: no upstream CSI programs (NODELET_TEST_UPSTREAM_CSI)");
            None
        }
    }
}

#[tokio::test]
async fn a_standard_csi_driver_registers_through_node_driver_registrar_and_serves_a_claim() {
    let test = "a_standard_csi_driver_registers_through_node_driver_registrar_and_serves_a_claim";
    let env =
        env_or_skip!("a_standard_csi_driver_registers_through_node_driver_registrar_and_serves_a_claim");
    let Some(bin) = upstream_csi(test) else { return };
    let n = Nodelet::start(&env, "csi-upstream").await;
    let driver = "hostpath.csi.k8s.io";
    let base = n.root_dir().parent().map(Path::to_path_buf).unwrap_or_default();
    // The standard layout: the driver's socket under <root>/plugins/<driver>/, the registrar's in plugins_registry/.
    let socket = n.root_dir().join("plugins").join(driver).join("csi.sock");
    let state = base.join("hostpath-state");
    for dir in [socket.parent().unwrap_or(&base), state.as_path()] {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }
    let log = |name: &str| {
        std::fs::File::create(base.join(name)).unwrap_or_else(|e| panic!("cannot create {name}: {e}"))
    };
    let _plugin = Killed(
        std::process::Command::new(bin.join("hostpathplugin"))
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--nodeid={}", n.node()))
            .arg(format!("--drivername={driver}"))
            .arg(format!("--statedir={}", state.display()))
            .arg("--v=3")
            .stdout(std::process::Stdio::null())
            .stderr(log("hostpathplugin.log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start hostpathplugin: {e}")),
    );
    let _registrar = Killed(
        std::process::Command::new(bin.join("csi-node-driver-registrar"))
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubelet-registration-path={}", socket.display()))
            .arg(format!("--plugin-registration-path={}", n.root_dir().join("plugins_registry").display()))
            .arg("--v=5")
            .stdout(std::process::Stdio::null())
            .stderr(log("registrar.log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start csi-node-driver-registrar: {e}")),
    );
    // The registrar is told it is registered (it exits when told otherwise).
    let registrar_log = || std::fs::read_to_string(base.join("registrar.log")).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !registrar_log().contains("plugin_registered:true") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the registrar was not told it is registered:\n{}\nnodelet:\n{}",
            registrar_log(),
            n.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `nodelet get csinodes`: the node with its one driver.
    let table = n.cli_main(&["get", "csinodes"]).await;
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.get(..2), Some(&[n.node(), "1"][..]), "{table}");

    n.write_manifest_text(
        "storage.yaml",
        &class_and_claim("upstream", driver, "WaitForFirstConsumer", "data"),
    );
    let pod_with = |command: Value| {
        n.pod_manifest(
            "upstream-user",
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                "containers": [{"name": "app", "command": command,
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            }),
        )
    };
    n.write_manifest("user.yaml", &pod_with(sleep_until_term("echo kept > /data/file; ")));
    let pod = n.wait_running("upstream-user").await;
    let written = n
        .wait_for("the pod's file in the driver's state directory", Duration::from_secs(15), async || {
            let found = walk_files(&state).into_iter().find(|p| p.ends_with("file"))?;
            (std::fs::read_to_string(&found).ok()? == "kept\n").then_some(found)
        })
        .await;
    let target = volume_dir(&n, &uid(&pod), "kubernetes.io~csi", "data").join("mount");
    assert!(is_mount_point(&target), "not published at {}", target.display());

    // The data survives the pod: a new pod on the same claim reads it.
    n.remove_manifest("user.yaml");
    wait_gone(&n, &n.pod_name("upstream-user"), &uid(&pod)).await;
    n.write_manifest("user.yaml", &pod_with(sleep_until_term("cat /data/file; ")));
    let again = n.wait_running("upstream-user").await;
    assert_ne!(uid(&again), uid(&pod));
    let logs_url = n.main_url(&format!("/containerLogs/default/{}/app", n.pod_name("upstream-user")));
    let https = n.main_client();
    n.wait_for("the second pod reads the first one's data", Duration::from_secs(10), async || {
        let response = https.get(&logs_url).bearer_auth(crate::support::TOKEN).send().await.ok()?;
        response.text().await.ok()?.contains("kept").then_some(())
    })
    .await;

    // Teardown leaves nothing: no mounts, and the volume is deleted with the claim (reclaim Delete).
    n.remove_manifest("user.yaml");
    wait_gone(&n, &n.pod_name("upstream-user"), &uid(&again)).await;
    n.wait_for("no mounts left", Duration::from_secs(15), async || {
        mounts_under(&n.root_dir()).is_empty().then_some(())
    })
    .await;
    n.remove_manifest("storage.yaml");
    n.wait_for("the volume deleted", Duration::from_secs(20), async || (!written.exists()).then_some(()))
        .await;
    n.shutdown().await;
}

/// The kubelet's e2e "ConfigMap should be consumable from pods in volume as non-root" and "Secrets
/// should be consumable from pods in volume as non-root with defaultMode and fsGroup set": a
/// container running as uid 1000 reads a configMap (on disk, its directory 0777) and, with an
/// `fsGroup`, a secret and a projected secret of `defaultMode: 0440` (files group `fsGroup`,
/// directories setgid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_root_container_reads_its_config_map_and_with_fs_group_its_0440_secrets() {
    let env = env_or_skip!("a_non_root_container_reads_its_config_map_and_with_fs_group_its_0440_secrets");
    let n = Nodelet::start(&env, "nonroot").await;
    n.write_manifest_text(
        "objects.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: default}\ndata: {data-1: value-1}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {name: sec, namespace: default}\ndata: {data-1: dmFsdWUtMQ==}\n",
    );
    let volumes = |fs_group: bool| {
        let mut v = vec![
            json!({"name": "cm", "configMap": {"name": "cm"}}),
            json!({"name": "cm-mapped", "configMap": {"name": "cm", "items": [{"key": "data-1", "path": "path/to/data-2"}]}}),
        ];
        if fs_group {
            v.push(json!({"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o440}}));
            v.push(json!({"name": "proj", "projected": {"defaultMode": 0o440, "sources": [{"secret": {"name": "sec"}}]}}));
        }
        v
    };
    let mounts = |fs_group: bool| {
        let mut m = vec![
            json!({"name": "cm", "mountPath": "/cm"}),
            json!({"name": "cm-mapped", "mountPath": "/cm-mapped"}),
        ];
        if fs_group {
            m.push(json!({"name": "sec", "mountPath": "/sec"}));
            m.push(json!({"name": "proj", "mountPath": "/proj"}));
        }
        m
    };
    for (pod, fs_group) in [("plain", false), ("grouped", true)] {
        let mut sc = json!({"runAsUser": 1000});
        if fs_group {
            sc["fsGroup"] = json!(1234);
        }
        n.write_manifest(
            &format!("{pod}.yaml"),
            &n.pod_manifest(
                pod,
                json!({
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": sc,
                    "volumes": volumes(fs_group),
                    "containers": [{"name": "app", "command": sleep_until_term(""), "volumeMounts": mounts(fs_group)}],
                }),
            ),
        );
    }
    for (pod, fs_group) in [("plain", false), ("grouped", true)] {
        let status = n.wait_running(pod).await;
        let id =
            runtime_id(container(&status, "app").unwrap_or_else(|| panic!("{pod}: no container status")));
        assert_eq!(n.exec(&id, &["id", "-u"]).await, (0, "1000\n".to_owned()), "{pod}");
        assert_eq!(n.exec(&id, &["cat", "/cm/data-1"]).await, (0, "value-1".to_owned()), "{pod}");
        assert_eq!(
            n.exec(&id, &["cat", "/cm-mapped/path/to/data-2"]).await,
            (0, "value-1".to_owned()),
            "{pod}"
        );
        let dir = volume_dir(&n, &uid(&status), "kubernetes.io~configmap", "cm");
        let want = if fs_group { 0o2777 } else { 0o777 };
        assert_eq!(mode_of(&dir), want, "{pod}: {}", dir.display());
        if fs_group {
            for file in ["/sec/data-1", "/proj/data-1"] {
                assert_eq!(n.exec(&id, &["cat", file]).await, (0, "value-1".to_owned()), "{file}");
                // Following the ..data link: the file itself.
                assert_eq!(
                    n.exec(&id, &["stat", "-L", "-c", "%a %g", file]).await,
                    (0, "440 1234\n".to_owned()),
                    "{file}"
                );
            }
            assert_eq!(
                n.exec(&id, &["stat", "-c", "%a %g", "/sec/..data/"]).await,
                (0, "2755 1234\n".to_owned())
            );
            assert_eq!(n.exec(&id, &["stat", "-c", "%a %g", "/sec"]).await, (0, "3777 1234\n".to_owned()));
        } else {
            assert_eq!(
                n.exec(&id, &["stat", "-L", "-c", "%a %g", "/cm/data-1"]).await,
                (0, "644 0\n".to_owned())
            );
        }
    }
    n.remove_manifest("plain.yaml");
    n.remove_manifest("grouped.yaml");
    n.shutdown().await;
}

/// The kubelet-managed /etc/hosts (e2e "KubeletManagedEtcHosts" and "HostAliases"): containers get
/// the pod's file with its IP, hostname, subdomain FQDN and host aliases; a container that mounts
/// something at /etc/hosts keeps that; the file goes with the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_get_the_kubelet_managed_etc_hosts_unless_they_mount_their_own() {
    let env = env_or_skip!("containers_get_the_kubelet_managed_etc_hosts_unless_they_mount_their_own");
    let n = Nodelet::start(&env, "etchosts").await;
    n.write_manifest(
        "hosts.yaml",
        &n.pod_manifest(
            "hosts",
            json!({
                "terminationGracePeriodSeconds": 1,
                "hostname": "web-0",
                "subdomain": "nginx",
                "hostAliases": [{"ip": "123.45.67.89", "hostnames": ["foo.local", "bar.local"]}],
                "volumes": [{"name": "host-hosts", "hostPath": {"path": "/etc/hosts", "type": "File"}}],
                "containers": [
                    {"name": "managed", "command": sleep_until_term("")},
                    {"name": "own", "command": sleep_until_term(""),
                     "volumeMounts": [{"name": "host-hosts", "mountPath": "/etc/hosts"}]},
                ],
            }),
        ),
    );
    let pod = n.wait_running("hosts").await;
    let ip = pod_ip(&pod).to_string();
    // No clusterDomain configured (the kubelet's default ""): the kubelet writes "<sub>.<ns>.svc.".
    let domain = "";
    let managed = runtime_id(container(&pod, "managed").unwrap_or_else(|| panic!("no status of managed")));
    let want = format!(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
         {ip}\tweb-0.nginx.default.svc.{domain}\tweb-0\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo.local\tbar.local\n"
    );
    assert_eq!(n.exec(&managed, &["cat", "/etc/hosts"]).await, (0, want));
    let own = runtime_id(container(&pod, "own").unwrap_or_else(|| panic!("no status of own")));
    let node_hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    assert_eq!(n.exec(&own, &["cat", "/etc/hosts"]).await, (0, node_hosts));
    let file = n.root_dir().join("pods").join(uid(&pod)).join("etc-hosts");
    assert!(file.is_file(), "{}", file.display());

    n.remove_manifest("hosts.yaml");
    let pod_dir = n.root_dir().join("pods").join(uid(&pod));
    n.wait_for("the pod and its directory gone", Duration::from_secs(60), async || {
        (n.pod("hosts").await.is_none() && !pod_dir.exists()).then_some(())
    })
    .await;
    n.shutdown().await;
}

/// The events nodelet serves on its authenticated main port: (reason, message).
async fn main_port_events(n: &Nodelet) -> Vec<(String, String)> {
    let request = n.main_client().get(n.main_url("/api/v1/events")).bearer_auth(crate::support::TOKEN);
    let Ok(response) = request.send().await else { return Vec::new() };
    let list: k8s_openapi::List<k8s_openapi::api::core::v1::Event> =
        serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or_default();
    list.items.into_iter().map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default())).collect()
}

/// Issue 37, point 6: with `--allow-privileged=false` and `allowedHostPaths`, a symlink planted under the allowed
/// prefix that points at `/` does not turn a hostPath into the host's root: the volume is refused with an error
/// naming it and the symlink, and the pod does not start. A plain directory under the prefix, and a symlink
/// that stays beneath it, still work (the runtime mounts what was resolved, bound in the pod's directory).
#[tokio::test]
async fn a_symlink_under_an_allowed_host_path_prefix_cannot_lead_out_of_it() {
    let env = env_or_skip!("a_symlink_under_an_allowed_host_path_prefix_cannot_lead_out_of_it");
    let prefix = std::env::temp_dir().join(format!("nodelet-allowed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let data = prefix.join("data");
    std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("mkdir {}: {e}", data.display()));
    std::fs::write(data.join("hello"), "from the prefix\n").unwrap_or_else(|e| panic!("write: {e}"));
    std::os::unix::fs::symlink("/", prefix.join("escape")).unwrap_or_else(|e| panic!("symlink: {e}"));
    std::os::unix::fs::symlink("../../..", data.join("up")).unwrap_or_else(|e| panic!("symlink: {e}"));
    std::os::unix::fs::symlink("data", prefix.join("inside")).unwrap_or_else(|e| panic!("symlink: {e}"));
    let options = StartOptions {
        extra_args: vec!["--allow-privileged=false".to_owned()],
        nodelet_extra: format!("allowedHostPaths: [{}]\n", prefix.display()),
        ..StartOptions::default()
    };
    let n = Nodelet::start_with(&env, "hostpath-prefix", options).await;
    let pod_with = |name: &str, volume: &str, path: PathBuf, kind: &str| {
        n.pod_manifest(
            name,
            json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": volume, "hostPath": {"path": path, "type": kind}}],
                "containers": [{"name": "app", "command": sleep_until_term(""),
                                "volumeMounts": [{"name": volume, "mountPath": "/v"}]}],
            }),
        )
    };
    n.write_manifest("escape.yaml", &pod_with("escape", "hostroot", prefix.join("escape"), ""));
    n.write_manifest("up.yaml", &pod_with("up", "uproot", prefix.join("data/up/etc"), "Directory"));
    n.write_manifest("plain.yaml", &pod_with("plain", "data", prefix.join("data"), "Directory"));
    n.write_manifest(
        "inside.yaml",
        &pod_with("inside", "made", prefix.join("inside/new"), "DirectoryOrCreate"),
    );

    let plain = n.wait_running("plain").await;
    let (code, out) = n.exec(&container_id(&plain, "app"), &["cat", "/v/hello"]).await;
    assert_eq!((code, out.as_str()), (0, "from the prefix\n"));
    let inside = n.wait_running("inside").await;
    let (code, _) = n.exec(&container_id(&inside, "app"), &["sh", "-c", "echo made > /v/f"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        std::fs::read_to_string(data.join("new/f")).unwrap_or_default(),
        "made\n",
        "created beneath the prefix"
    );

    for (pod, volume, component) in [("escape", "hostroot", "escape"), ("up", "uproot", "data/up")] {
        let event = n
            .wait_for(&format!("a FailedMount event for {pod}"), Duration::from_secs(20), async || {
                main_port_events(&n).await.into_iter().find(|(reason, message)| {
                    reason == "FailedMount" && message.contains(&format!("\"{volume}\""))
                })
            })
            .await;
        let component = prefix.join(component).display().to_string();
        assert!(
            event.1.contains(&component) && event.1.contains("leads out of the allowed prefix"),
            "the refusal names the volume and the symlink: {event:?}"
        );
        let refused = n.pod(pod).await.unwrap_or_else(|| panic!("pod {pod} listed"));
        assert_eq!(phase(&refused), "Pending", "{pod}");
        assert!(n.sandboxes_of(&uid(&refused)).await.is_empty(), "{pod}: a sandbox for a refused volume");
    }
    n.shutdown().await;
    let _ = std::fs::remove_dir_all(&prefix);
}

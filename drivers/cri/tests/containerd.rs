//! Integration tests of `nodelet-cri` against a REAL containerd (CRI v1), not a mock.
//!
//! Environment (written by `scripts/runtime-up.sh` into `/tmp/nodelet-test/env.sh`):
//!
//! | variable | use |
//! |---|---|
//! | `NODELET_TEST_CRI_ENDPOINT` | `unix:///…/containerd.sock`; unset → the tests print a skip note and pass, unless `NODELET_REQUIRE_RUNTIME=1`, then they panic |
//! | `NODELET_TEST_BUSYBOX_IMAGE` | a busybox image already present in the runtime (required) |
//! | `NODELET_TEST_LOG_DIR` | directory under which pod log directories are created (required) |
//! | `NODELET_TEST_REGISTRY_BUSYBOX2` | an image only in the local registry, so pulling it downloads (required by the pull test) |
//! | `NODELET_TEST_PAUSE_IMAGE` | the sandbox image; checked to be present (optional) |
//! | `NODELET_TEST_CGROUP_PARENT` | cgroup parent under which each pod gets `pod<uid>` (optional) |
//!
//! Every sandbox uses DNS server 127.0.0.1 (the host resolver is in a forbidden range). Traffic goes only to
//! the pod network 198.18.0.0/16 (pods and the bridge address), which every test asserts before connecting.
//! Each test removes its sandboxes, pod cgroups and log directories even when it fails (see [`Cleanup`]).

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nodelet_cri::labels::{self, PodIdentity};
use nodelet_cri::proto::{self, ContainerState, PodSandboxState};
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, CriError, RuntimeEvent, SandboxFilter};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use common::{
    http_get, in_pod_network, lock_busybox2, random_hex, random_uid, required, short, subscribed_events, var,
    wait_event,
};

/// A label unique to one test, so parallel tests (and leftovers of other runs) never see each other's objects.
const TEST_RUN_LABEL: &str = "io.nodelet.test-run";
const POD_NAMESPACE: &str = "nodelet-cri-test";
const HTTPD_PORT: u16 = 8080;
const LOG_MARKER: &str = "nodelet-cri-test: starting httpd";

// ------------------------------------------------------------------------------------------------ environment

struct TestEnv {
    endpoint: String,
    busybox: String,
    log_dir: PathBuf,
    busybox2: Option<String>,
    pause: Option<String>,
    cgroup_parent: Option<String>,
}

/// Reads the environment; `None` means "no runtime configured, skip".
fn test_env(test: &str) -> Option<TestEnv> {
    init_tracing();
    let Some(endpoint) = var("NODELET_TEST_CRI_ENDPOINT") else {
        if var("NODELET_REQUIRE_RUNTIME").as_deref() == Some("1") {
            panic!(
                "NODELET_REQUIRE_RUNTIME=1 but NODELET_TEST_CRI_ENDPOINT is unset: start the runtime with \
                 scripts/runtime-up.sh and source /tmp/nodelet-test/env.sh"
            );
        }
        eprintln!("SKIP {test}: NODELET_TEST_CRI_ENDPOINT is unset (no container runtime to test against)");
        return None;
    };
    Some(TestEnv {
        endpoint,
        busybox: required("NODELET_TEST_BUSYBOX_IMAGE"),
        log_dir: PathBuf::from(required("NODELET_TEST_LOG_DIR")),
        busybox2: var("NODELET_TEST_REGISTRY_BUSYBOX2"),
        pause: var("NODELET_TEST_PAUSE_IMAGE"),
        cgroup_parent: var("NODELET_TEST_CGROUP_PARENT"),
    })
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn client_config(env: &TestEnv) -> CriConfig {
    CriConfig::new(env.endpoint.clone())
        .with_runtime_request_timeout(Duration::from_secs(60))
        .with_image_pull_timeout(Some(Duration::from_secs(120)))
        .with_exec_sync_margin(Duration::from_secs(10))
}

/// A lean listing's entries as the map the full listing has.
fn entries(entries: &[nodelet_cri::listing::Entry]) -> std::collections::HashMap<String, String> {
    entries.iter().map(|e| (e.key.as_str().to_owned(), e.value.as_str().to_owned())).collect()
}

async fn connect(env: &TestEnv) -> CriClient {
    match CriClient::connect(client_config(env)).await {
        Ok(c) => c,
        Err(e) => panic!("cannot connect to {}: {e}", env.endpoint),
    }
}

macro_rules! env_or_skip {
    ($test:expr) => {
        match test_env($test) {
            Some(env) => env,
            None => return,
        }
    };
}

// ------------------------------------------------------------------------------------------------ cleanup guard

/// Removes what a test created — sandboxes (and with them their containers), pod cgroups and pod log
/// directories — when dropped, also when the test panics. The happy path calls [`Cleanup::run`] instead, which
/// reports errors.
struct Cleanup {
    config: CriConfig,
    sandboxes: Vec<String>,
    dirs: Vec<PathBuf>,
    cgroups: Vec<String>,
}

impl Cleanup {
    fn new(env: &TestEnv) -> Self {
        Cleanup { config: client_config(env), sandboxes: Vec::new(), dirs: Vec::new(), cgroups: Vec::new() }
    }

    /// Stops and removes every tracked sandbox, then removes directories; returns what failed.
    async fn remove_all(
        cri: &CriClient,
        sandboxes: &[String],
        dirs: &[PathBuf],
        cgroups: &[String],
    ) -> Vec<String> {
        let mut errors = Vec::new();
        for id in sandboxes {
            if let Err(e) = cri.stop_pod_sandbox(id).await
                && !e.is_not_found()
            {
                errors.push(format!("stop sandbox {id}: {e}"));
            }
            if let Err(e) = cri.remove_pod_sandbox(id).await
                && !e.is_not_found()
            {
                errors.push(format!("remove sandbox {id}: {e}"));
            }
        }
        for dir in dirs {
            if let Err(e) = std::fs::remove_dir_all(dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                errors.push(format!("remove {}: {e}", dir.display()));
            }
        }
        for cgroup in cgroups {
            remove_cgroup(cgroup);
        }
        errors
    }

    /// Happy-path cleanup: everything must go away without error.
    async fn run(mut self, cri: &CriClient) {
        let sandboxes = std::mem::take(&mut self.sandboxes);
        let dirs = std::mem::take(&mut self.dirs);
        let cgroups = std::mem::take(&mut self.cgroups);
        let errors = Self::remove_all(cri, &sandboxes, &dirs, &cgroups).await;
        assert!(errors.is_empty(), "cleanup failed: {errors:?}");
        for id in &sandboxes {
            match cri.pod_sandbox_status(id).await {
                Err(e) if e.is_not_found() => {}
                other => panic!("sandbox {id} still there after removal: {other:?}"),
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.sandboxes.is_empty() && self.dirs.is_empty() && self.cgroups.is_empty() {
            return;
        }
        let config = self.config.clone();
        let sandboxes = std::mem::take(&mut self.sandboxes);
        let dirs = std::mem::take(&mut self.dirs);
        let cgroups = std::mem::take(&mut self.cgroups);
        eprintln!("cleanup guard: removing sandboxes {sandboxes:?}");
        // The test's runtime may be unwinding (and is blocked here anyway): use a fresh runtime and connection
        // on a separate thread.
        let worker = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return vec![format!("cannot build a runtime for cleanup: {e}")],
            };
            rt.block_on(async move {
                match CriClient::connect(config).await {
                    Ok(cri) => Cleanup::remove_all(&cri, &sandboxes, &dirs, &cgroups).await,
                    Err(e) => vec![format!("cannot connect for cleanup: {e}")],
                }
            })
        });
        match worker.join() {
            Ok(errors) if errors.is_empty() => {}
            Ok(errors) => eprintln!("cleanup guard: errors: {errors:?}"),
            Err(_) => eprintln!("cleanup guard: cleanup thread panicked"),
        }
    }
}

/// Removes a pod cgroup directory (only if empty; best effort) in every cgroup v1 hierarchy and in cgroup v2.
fn remove_cgroup(cgroup: &str) {
    let rel = cgroup.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let _ = std::fs::remove_dir(root.join(rel));
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let _ = std::fs::remove_dir(entry.path().join(rel));
        }
    }
}

// ------------------------------------------------------------------------------------------------ pod helpers

struct TestPod {
    identity: PodIdentity,
    run_label: String,
    config: proto::PodSandboxConfig,
    log_dir: PathBuf,
}

/// Builds a sandbox config like the kubelet's: labels, log directory, DNS, cgroup parent, optional hostPort.
/// Creates the pod log directory (and the container's subdirectory) and registers everything with `cleanup`.
fn test_pod(
    env: &TestEnv,
    cleanup: &mut Cleanup,
    name_prefix: &str,
    managed: bool,
    port_mappings: Vec<proto::PortMapping>,
) -> TestPod {
    let name = format!("{name_prefix}-{}", random_hex(6));
    let uid = random_uid();
    let identity = PodIdentity::new(name.clone(), POD_NAMESPACE, uid.clone());
    let run_label = random_hex(16);

    let mut pod_labels = labels::sandbox_labels(&identity);
    if !managed {
        pod_labels.remove(labels::MANAGED);
    }
    pod_labels.insert(TEST_RUN_LABEL.to_owned(), run_label.clone());

    let log_dir = env.log_dir.join(format!("{POD_NAMESPACE}_{name}_{uid}"));
    if let Err(e) = std::fs::create_dir_all(log_dir.join("web")) {
        panic!("cannot create pod log dir {}: {e}", log_dir.display());
    }
    cleanup.dirs.push(log_dir.clone());

    let cgroup_parent = match &env.cgroup_parent {
        Some(parent) => {
            let cg = format!("{}/pod{uid}", parent.trim_end_matches('/'));
            cleanup.cgroups.push(cg.clone());
            cg
        }
        None => String::new(),
    };

    let config = proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: POD_NAMESPACE.to_owned(),
            attempt: 0,
        }),
        hostname: name,
        log_directory: log_dir.to_string_lossy().into_owned(),
        dns_config: Some(proto::DnsConfig { servers: vec!["127.0.0.1".to_owned()], ..Default::default() }),
        port_mappings,
        labels: pod_labels,
        annotations: HashMap::from([("nodelet.test/annotation".to_owned(), "yes".to_owned())]),
        linux: Some(proto::LinuxPodSandboxConfig { cgroup_parent, ..Default::default() }),
        ..Default::default()
    };
    TestPod { identity, run_label, config, log_dir }
}

/// Runs the sandbox and registers it with the cleanup guard.
async fn run_sandbox(cri: &CriClient, cleanup: &mut Cleanup, pod: &TestPod) -> String {
    let started = Instant::now();
    let id = match cri.run_pod_sandbox(pod.config.clone(), "").await {
        Ok(id) => id,
        Err(e) => panic!("RunPodSandbox: {e}"),
    };
    cleanup.sandboxes.push(id.clone());
    eprintln!("RunPodSandbox {} in {:?}", short(&id), started.elapsed());
    id
}

/// A container of busybox in the test pod: `command`, logging to `web/0.log`, 64 MiB memory limit.
fn container_config(env: &TestEnv, pod: &TestPod, command: &[&str]) -> proto::ContainerConfig {
    let mut container_labels = labels::container_labels(&pod.identity, "web");
    container_labels.insert(TEST_RUN_LABEL.to_owned(), pod.run_label.clone());
    proto::ContainerConfig {
        metadata: Some(proto::ContainerMetadata { name: "web".to_owned(), attempt: 0 }),
        image: Some(proto::ImageSpec { image: env.busybox.clone(), ..Default::default() }),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        log_path: "web/0.log".to_owned(),
        labels: container_labels,
        annotations: labels::container_annotations(0x00c0_ffee, 0, Some(1)),
        linux: Some(proto::LinuxContainerConfig {
            resources: Some(proto::LinuxContainerResources {
                memory_limit_in_bytes: 64 * 1024 * 1024,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn httpd_command() -> Vec<&'static str> {
    vec!["sh", "-c", "echo 'nodelet-cri-test: starting httpd'; exec httpd -f -p 8080 -h /var/www"]
}

async fn create_and_start(
    cri: &CriClient,
    sandbox_id: &str,
    pod: &TestPod,
    config: proto::ContainerConfig,
) -> String {
    let id = match cri.create_container(sandbox_id, config, pod.config.clone()).await {
        Ok(id) => id,
        Err(e) => panic!("CreateContainer: {e}"),
    };
    if let Err(e) = cri.start_container(&id).await {
        panic!("StartContainer {id}: {e}");
    }
    id
}

async fn pod_ip(cri: &CriClient, sandbox_id: &str) -> Ipv4Addr {
    let status = match cri.pod_sandbox_status(sandbox_id).await {
        Ok(s) => s,
        Err(e) => panic!("PodSandboxStatus: {e}"),
    };
    assert_eq!(status.state(), PodSandboxState::SandboxReady, "sandbox not ready: {status:?}");
    let ip = status.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default();
    let ip: Ipv4Addr = match ip.parse() {
        Ok(ip) => ip,
        Err(e) => panic!("pod IP {ip:?} is not IPv4: {e}"),
    };
    assert!(in_pod_network(IpAddr::V4(ip)), "pod IP {ip} is outside 198.18.0.0/16");
    ip
}

async fn exec(cri: &CriClient, id: &str, cmd: &[&str]) -> nodelet_cri::ExecSyncOutput {
    let cmd: Vec<String> = cmd.iter().map(|s| (*s).to_owned()).collect();
    match cri.exec_sync(id, cmd.clone(), Duration::from_secs(10)).await {
        Ok(out) => out,
        Err(e) => panic!("ExecSync {cmd:?}: {e}"),
    }
}

/// Polls ContainerStatus until the container is EXITED (it lags the exit event by tens of milliseconds).
async fn wait_exited(cri: &CriClient, id: &str) -> proto::ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cri.container_status(id).await {
            Ok(s) if s.state() == ContainerState::ContainerExited => return s,
            Ok(s) if Instant::now() < deadline => tracing::debug!(state = ?s.state(), "not exited yet"),
            other => panic!("container {id} did not reach EXITED: {other:?}"),
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Checks that the container's log file is in the CRI format and contains `marker` (written at start).
async fn check_cri_log(path: &Path, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let content = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = content.lines().find(|l| l.ends_with(marker)) {
            // <RFC 3339 timestamp> <stdout|stderr> <F|P> <message>
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            assert_eq!(fields.len(), 4, "not a CRI log line: {line:?}");
            assert!(fields[0].len() >= 20 && fields[0].contains('T'), "bad timestamp in {line:?}");
            assert_eq!(fields[1], "stdout", "bad stream in {line:?}");
            assert_eq!(fields[2], "F", "bad tag in {line:?}");
            assert_eq!(fields[3], marker);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no line ending with {marker:?} in {}: {content:?}",
            path.display()
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// A unix socket proxy in front of the runtime socket whose connections can be severed, to exercise the
/// event stream's reconnect path without touching the runtime itself.
struct SocketProxy {
    dir: PathBuf,
    path: PathBuf,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl SocketProxy {
    fn start(upstream: PathBuf) -> Self {
        let dir = std::env::temp_dir().join(format!("nodelet-cri-proxy-{}", random_hex(12)));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            panic!("cannot create {}: {e}", dir.display());
        }
        let path = dir.join("proxy.sock");
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => panic!("cannot bind {}: {e}", path.display()),
        };
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let conns = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut downstream, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut up) = UnixStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut downstream, &mut up).await;
                    }
                });
                conns.lock().unwrap_or_else(|e| e.into_inner()).push(task);
            }
        });
        SocketProxy { dir, path, accept, connections }
    }

    /// Closes every proxied connection (both ends); new connections are still accepted.
    fn sever(&self) -> usize {
        let mut conns = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let n = conns.len();
        for task in conns.drain(..) {
            task.abort();
        }
        n
    }
}

impl Drop for SocketProxy {
    fn drop(&mut self) {
        self.sever();
        self.accept.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------------------------------------------ tests

#[tokio::test]
async fn version_status_and_errors() {
    let env = env_or_skip!("version_status_and_errors");
    let started = Instant::now();
    let cri = connect(&env).await;

    let version = cri.version().await.expect("Version");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");
    assert!(!version.runtime_name.is_empty() && !version.runtime_version.is_empty(), "{version:?}");
    eprintln!(
        "runtime {} {} (CRI {})",
        version.runtime_name, version.runtime_version, version.runtime_api_version
    );

    let readiness = cri.status().await.expect("Status");
    assert!(readiness.is_ready(), "runtime not ready: {:?}", readiness.not_ready_reason());

    let fs = cri.image_fs_info().await.expect("ImageFsInfo");
    assert!(!fs.image_filesystems.is_empty(), "{fs:?}");

    // Images the tests rely on are present.
    assert!(
        cri.image_status(&env.busybox).await.expect("ImageStatus busybox").is_some(),
        "{} missing",
        env.busybox
    );
    if let Some(pause) = &env.pause {
        assert!(cri.image_status(pause).await.expect("ImageStatus pause").is_some(), "{pause} missing");
    }
    let images = cri.list_images(None).await.expect("ListImages");
    assert!(images.iter().any(|i| i.repo_tags.contains(&env.busybox)), "busybox not listed");

    // Errors are typed and name the call.
    let bogus = "0000000000000000000000000000000000000000000000000000000000000bad";
    let err = cri.container_status(bogus).await.expect_err("bogus container");
    assert!(err.is_not_found(), "{err:?}");
    assert_eq!(err.call(), Some("ContainerStatus"));
    let err = cri.pod_sandbox_status(bogus).await.expect_err("bogus sandbox");
    assert!(err.is_not_found(), "{err:?}");
    let err = cri.start_container(bogus).await.expect_err("bogus start");
    assert!(err.is_not_found(), "{err:?}");
    assert!(cri.image_status("localhost/nodelet/does-not-exist:1").await.expect("ImageStatus").is_none());
    // Removing what does not exist is not an error on containerd (reconcilers rely on idempotency).
    cri.remove_container(bogus).await.expect("RemoveContainer of a missing container");
    cri.remove_pod_sandbox(bogus).await.expect("RemovePodSandbox of a missing sandbox");

    eprintln!("version_status_and_errors: {:?}", started.elapsed());
}

#[tokio::test]
async fn pull_and_remove_image() {
    let env = env_or_skip!("pull_and_remove_image");
    let image = env.busybox2.clone().unwrap_or_else(|| required("NODELET_TEST_REGISTRY_BUSYBOX2"));
    let cri = connect(&env).await;
    // Other tests (in other processes) pull and remove the same image: take their lock.
    let _lock = lock_busybox2();

    // Start from "absent" so the pull really downloads. RemoveImage deletes every tag of the same image, which
    // is why only this registry-only image is ever removed.
    if cri.image_status(&image).await.expect("ImageStatus").is_some() {
        cri.remove_image(&image).await.expect("RemoveImage (pre-clean)");
    }
    assert!(cri.image_status(&image).await.expect("ImageStatus").is_none());

    let started = Instant::now();
    let image_ref = cri.pull_image(&image, None, None).await.expect("PullImage");
    let cold = started.elapsed();
    assert!(!image_ref.is_empty());

    let status = cri.image_status(&image).await.expect("ImageStatus").expect("image present after pull");
    assert!(status.repo_tags.contains(&image), "{status:?}");
    assert!(status.size > 0, "{status:?}");
    let listed = cri.list_images(Some(&image)).await.expect("ListImages(filter)");
    assert!(listed.iter().any(|i| i.id == status.id), "{listed:?}");

    // Pulling again with credentials: the local registry does not ask for them, so they are simply unused.
    let auth =
        proto::AuthConfig { username: "nodelet".into(), password: "unused".into(), ..Default::default() };
    let started = Instant::now();
    let again = cri.pull_image(&image, Some(auth), None).await.expect("PullImage(again, auth)");
    let warm = started.elapsed();
    assert_eq!(again, image_ref);

    cri.remove_image(&image).await.expect("RemoveImage");
    assert!(cri.image_status(&image).await.expect("ImageStatus").is_none(), "image still present");
    cri.remove_image(&image).await.expect("RemoveImage is idempotent");
    // The pre-provisioned busybox is untouched.
    assert!(cri.image_status(&env.busybox).await.expect("ImageStatus").is_some());
    eprintln!("pull_and_remove_image: {image} -> {image_ref}: cold {cold:?}, warm {warm:?}");
}

#[tokio::test]
async fn pod_round_trip() {
    let env = env_or_skip!("pod_round_trip");
    let test_started = Instant::now();
    let cri = connect(&env).await;
    let mut cleanup = Cleanup::new(&env);
    let mut events = subscribed_events(&cri).await;

    // Sandbox.
    let pod = test_pod(&env, &mut cleanup, "round-trip", true, Vec::new());
    let sandbox_id = run_sandbox(&cri, &mut cleanup, &pod).await;
    let ip = pod_ip(&cri, &sandbox_id).await;
    let status = cri.pod_sandbox_status(&sandbox_id).await.expect("PodSandboxStatus");
    assert_eq!(PodIdentity::from_labels(&status.labels).as_ref(), Some(&pod.identity));
    assert!(labels::is_managed(&status.labels));
    assert_eq!(status.annotations.get("nodelet.test/annotation").map(String::as_str), Some("yes"));

    // Sandbox list filters.
    let mine = SandboxFilter::managed().label(TEST_RUN_LABEL, pod.run_label.clone());
    let listed = cri.list_pod_sandboxes(&mine).await.expect("ListPodSandbox");
    assert_eq!(listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec![sandbox_id.as_str()]);
    let ready = mine.clone().state(PodSandboxState::SandboxReady);
    assert_eq!(cri.list_pod_sandboxes(&ready).await.expect("ListPodSandbox(ready)").len(), 1);
    let not_ready = mine.clone().state(PodSandboxState::SandboxNotready);
    assert!(cri.list_pod_sandboxes(&not_ready).await.expect("ListPodSandbox(notready)").is_empty());
    let by_id = SandboxFilter::all().id(sandbox_id.clone());
    assert_eq!(cri.list_pod_sandboxes(&by_id).await.expect("ListPodSandbox(id)").len(), 1);
    // The lean listing carries the same sandbox, field for field.
    let lean = cri.list_sandbox_items(&mine).await.expect("ListPodSandbox (lean)");
    assert_eq!(lean.len(), 1);
    let (full, lean) = (&listed[0], &lean[0]);
    assert_eq!(
        (lean.id.as_str(), lean.state, lean.created_at, lean.runtime_handler.as_str()),
        (full.id.as_str(), full.state, full.created_at, full.runtime_handler.as_str())
    );
    let (lean_meta, full_meta) =
        (lean.metadata.as_ref().expect("metadata"), full.metadata.as_ref().expect("metadata"));
    assert_eq!(
        (lean_meta.name.as_str(), lean_meta.uid.as_str(), lean_meta.namespace.as_str(), lean_meta.attempt),
        (full_meta.name.as_str(), full_meta.uid.as_str(), full_meta.namespace.as_str(), full_meta.attempt)
    );
    assert_eq!(entries(&lean.labels), full.labels);
    assert_eq!(entries(&lean.annotations), full.annotations);
    assert_eq!(PodIdentity::from_labels(&lean.labels).as_ref(), Some(&pod.identity));

    // Container.
    let config = container_config(&env, &pod, &httpd_command());
    let container_id = create_and_start(&cri, &sandbox_id, &pod, config).await;
    wait_event(
        &mut events,
        Duration::from_secs(10),
        "ContainerStarted",
        |e| matches!(e, RuntimeEvent::ContainerStarted { id, .. } if *id == container_id),
    )
    .await;
    let status = cri.container_status(&container_id).await.expect("ContainerStatus");
    assert_eq!(status.state(), ContainerState::ContainerRunning, "{status:?}");
    assert_eq!(labels::restart_count(&status.annotations), Some(0));
    assert_eq!(labels::spec_hash(&status.annotations), Some(0x00c0_ffee));
    assert_eq!(status.labels.get(labels::CONTAINER_NAME).map(String::as_str), Some("web"));

    // Container list filters.
    let in_pod = ContainerFilter::managed().pod_sandbox_id(sandbox_id.clone());
    let listed = cri.list_containers(&in_pod).await.expect("ListContainers");
    assert_eq!(listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), vec![container_id.as_str()]);
    let running = in_pod.clone().state(ContainerState::ContainerRunning);
    assert_eq!(cri.list_containers(&running).await.expect("ListContainers(running)").len(), 1);
    let exited = in_pod.clone().state(ContainerState::ContainerExited);
    assert!(cri.list_containers(&exited).await.expect("ListContainers(exited)").is_empty());
    let by_label = ContainerFilter::managed().label(TEST_RUN_LABEL, pod.run_label.clone());
    assert_eq!(cri.list_containers(&by_label).await.expect("ListContainers(label)").len(), 1);
    let lean = cri.list_container_items(&in_pod).await.expect("ListContainers (lean)");
    assert_eq!(lean.len(), 1);
    let (full, lean) = (&listed[0], &lean[0]);
    assert_eq!(
        (
            lean.id.as_str(),
            lean.pod_sandbox_id.as_str(),
            lean.image_ref.as_str(),
            lean.state,
            lean.created_at
        ),
        (
            full.id.as_str(),
            full.pod_sandbox_id.as_str(),
            full.image_ref.as_str(),
            full.state,
            full.created_at
        )
    );
    let (lean_meta, full_meta) =
        (lean.metadata.as_ref().expect("metadata"), full.metadata.as_ref().expect("metadata"));
    assert_eq!((lean_meta.name.as_str(), lean_meta.attempt), (full_meta.name.as_str(), full_meta.attempt));
    assert_eq!(lean.image.as_ref().map(|i| i.image.as_str()), full.image.as_ref().map(|i| i.image.as_str()));
    assert_eq!(entries(&lean.labels), full.labels);
    assert_eq!(entries(&lean.annotations), full.annotations);
    assert_eq!(labels::spec_hash(&lean.annotations), Some(0x00c0_ffee));
    assert!(cri.list_container_items(&exited).await.expect("ListContainers(exited, lean)").is_empty());

    // HTTP from the host to the pod.
    let index = exec(&cri, &container_id, &["cat", "/var/www/index.html"]).await;
    assert!(index.success() && !index.stdout.is_empty(), "{index:?}");
    let (code, body, _) = http_get(SocketAddr::new(IpAddr::V4(ip), HTTPD_PORT)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, index.stdout_lossy());

    // ExecSync.
    let hostname = exec(&cri, &container_id, &["cat", "/etc/hostname"]).await;
    assert!(hostname.success(), "{hostname:?}");
    assert_eq!(hostname.stdout_lossy().trim(), pod.config.hostname);
    let resolv = exec(&cri, &container_id, &["cat", "/etc/resolv.conf"]).await;
    assert!(resolv.stdout_lossy().contains("nameserver 127.0.0.1"), "{}", resolv.stdout_lossy());
    let failing = exec(&cri, &container_id, &["sh", "-c", "echo oops >&2; exit 3"]).await;
    assert_eq!((failing.exit_code, failing.stderr_lossy().as_str()), (3, "oops\n"));

    // Logs in CRI format.
    assert_eq!(Path::new(&status.log_path), pod.log_dir.join("web/0.log"));
    check_cri_log(&pod.log_dir.join("web/0.log"), LOG_MARKER).await;

    // Stats.
    let stats = cri.container_stats(&container_id).await.expect("ContainerStats");
    assert!(stats.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref()).is_some(), "{stats:?}");
    assert!(stats.cpu.is_some(), "{stats:?}");
    let all_stats = cri.list_container_stats(&in_pod).await.expect("ListContainerStats");
    assert_eq!(all_stats.len(), 1, "{all_stats:?}");
    let pod_stats = cri.list_pod_sandbox_stats(&SandboxFilter::all().id(sandbox_id.clone())).await;
    let pod_stats = pod_stats.expect("ListPodSandboxStats");
    assert_eq!(pod_stats.len(), 1, "{pod_stats:?}");

    // Stop with a grace period. Depending on how the image's shell runs httpd, SIGTERM ends it (143) or is
    // ignored by PID 1 until the grace period runs out and SIGKILL follows (137).
    let stop_started = Instant::now();
    cri.stop_container(&container_id, Duration::from_secs(1)).await.expect("StopContainer");
    let stop_took = stop_started.elapsed();
    let exited_event = wait_event(
        &mut events,
        Duration::from_secs(10),
        "ContainerExited",
        |e| matches!(e, RuntimeEvent::ContainerExited { id, .. } if *id == container_id),
    )
    .await;
    match &exited_event {
        RuntimeEvent::ContainerExited { exit_status, exited_at, .. } => {
            assert!(exit_status.is_some_and(|s| [137, 143].contains(&s)), "{exited_event:?}");
            assert!(exited_at.is_some(), "{exited_event:?}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let status = wait_exited(&cri, &container_id).await;
    let event_status = match exited_event {
        RuntimeEvent::ContainerExited { exit_status, .. } => exit_status.map_or(-1, i64::from),
        _ => -1,
    };
    assert_eq!(i64::from(status.exit_code), event_status, "CRI status and event disagree: {status:?}");
    cri.stop_container(&container_id, Duration::ZERO).await.expect("StopContainer is idempotent");

    cri.remove_container(&container_id).await.expect("RemoveContainer");
    let err = cri.container_status(&container_id).await.expect_err("removed container");
    assert!(err.is_not_found(), "{err:?}");
    wait_event(
        &mut events,
        Duration::from_secs(10),
        "ContainerRemoved",
        |e| matches!(e, RuntimeEvent::ContainerRemoved { id } if *id == container_id),
    )
    .await;

    // Sandbox teardown: its pause task exits too.
    cri.stop_pod_sandbox(&sandbox_id).await.expect("StopPodSandbox");
    wait_event(
        &mut events,
        Duration::from_secs(10),
        "sandbox exit",
        |e| matches!(e, RuntimeEvent::ContainerExited { id, .. } if *id == sandbox_id),
    )
    .await;
    let status = cri.pod_sandbox_status(&sandbox_id).await.expect("PodSandboxStatus");
    assert_eq!(status.state(), PodSandboxState::SandboxNotready);
    cleanup.run(&cri).await;
    assert!(cri.list_pod_sandboxes(&mine).await.expect("ListPodSandbox").is_empty());
    eprintln!(
        "pod_round_trip: {:?} (StopContainer with 1 s grace took {stop_took:?})",
        test_started.elapsed()
    );
}

#[tokio::test]
async fn host_port_pod() {
    let env = env_or_skip!("host_port_pod");
    let started = Instant::now();
    let cri = connect(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let host_port = fastrand::u16(20_000..30_000);
    let mapping = proto::PortMapping {
        protocol: proto::Protocol::Tcp as i32,
        container_port: i32::from(HTTPD_PORT),
        host_port: i32::from(host_port),
        host_ip: String::new(),
    };
    let pod = test_pod(&env, &mut cleanup, "host-port", true, vec![mapping]);
    let sandbox_id = run_sandbox(&cri, &mut cleanup, &pod).await;
    let ip = pod_ip(&cri, &sandbox_id).await;
    let container_id =
        create_and_start(&cri, &sandbox_id, &pod, container_config(&env, &pod, &httpd_command())).await;

    // Directly to the pod; the connection's local address is the host's address on the pod bridge.
    let (code, direct_body, local) = http_get(SocketAddr::new(IpAddr::V4(ip), HTTPD_PORT)).await;
    assert_eq!(code, 200, "{direct_body}");
    let host_ip = local.ip();
    assert!(in_pod_network(host_ip), "host address {host_ip} on the pod bridge is outside 198.18.0.0/16");

    // Through the hostPort DNAT on that host address.
    let (code, body, _) = http_get(SocketAddr::new(host_ip, host_port)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, direct_body);

    cri.stop_container(&container_id, Duration::ZERO).await.expect("StopContainer");
    cleanup.run(&cri).await;
    eprintln!("host_port_pod: {host_ip}:{host_port} -> {ip}:{HTTPD_PORT} ok in {:?}", started.elapsed());
}

#[tokio::test]
async fn exit_event_and_exec_timeout() {
    let env = env_or_skip!("exit_event_and_exec_timeout");
    let started = Instant::now();
    let cri = connect(&env).await;
    let mut cleanup = Cleanup::new(&env);
    let mut events = subscribed_events(&cri).await;

    let pod = test_pod(&env, &mut cleanup, "exit", true, Vec::new());
    let sandbox_id = run_sandbox(&cri, &mut cleanup, &pod).await;
    let command = ["sh", "-c", "sleep 4; exit 3"];
    let container_id =
        create_and_start(&cri, &sandbox_id, &pod, container_config(&env, &pod, &command)).await;

    // A command outliving its timeout fails with a timeout error, well before the client's own deadline.
    let exec_started = Instant::now();
    let err = cri
        .exec_sync(&container_id, vec!["sleep".into(), "30".into()], Duration::from_secs(1))
        .await
        .expect_err("exec must time out");
    let exec_took = exec_started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    assert!(exec_took < Duration::from_secs(8), "exec timeout took {exec_took:?}");
    eprintln!("exec timeout error after {exec_took:?}: {err}");

    // The client's own deadline: a command without a runtime-side timeout is cut at runtime_request_timeout,
    // and the error names the call.
    let impatient = CriClient::from_channel(
        cri.channel(),
        client_config(&env).with_runtime_request_timeout(Duration::from_millis(300)),
    );
    let err = impatient
        .exec_sync(&container_id, vec!["sleep".into(), "30".into()], Duration::ZERO)
        .await
        .expect_err("client deadline");
    assert!(matches!(err, CriError::Timeout { call: "ExecSync", .. }), "{err:?}");
    assert_eq!(err.to_string(), "CRI ExecSync timed out after 300ms");

    // The container exits by itself; exec processes' exits are not reported as container exits.
    let event = wait_event(
        &mut events,
        Duration::from_secs(15),
        "ContainerExited",
        |e| matches!(e, RuntimeEvent::ContainerExited { id, .. } if *id == container_id),
    )
    .await;
    assert!(matches!(event, RuntimeEvent::ContainerExited { exit_status: Some(3), .. }), "{event:?}");
    let status = wait_exited(&cri, &container_id).await;
    assert_eq!(status.exit_code, 3, "{status:?}");
    assert!(status.finished_at > status.started_at, "{status:?}");

    cleanup.run(&cri).await;
    eprintln!("exit_event_and_exec_timeout: exec timeout after {exec_took:?}; total {:?}", started.elapsed());
}

/// A caller that stops waiting for an `ExecSync` leaves the command to run to its end: the call is not
/// cancelled, which would kill the command in containerd (and, in a narrow window while the process starts,
/// hold the container for 30 s in containerd 1.6).
#[tokio::test]
async fn a_dropped_exec_sync_runs_to_its_end() {
    let env = env_or_skip!("a_dropped_exec_sync_runs_to_its_end");
    let started = Instant::now();
    let cri = connect(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let pod = test_pod(&env, &mut cleanup, "exec-drop", true, Vec::new());
    let sandbox_id = run_sandbox(&cri, &mut cleanup, &pod).await;
    let container_id =
        create_and_start(&cri, &sandbox_id, &pod, container_config(&env, &pod, &["sleep", "3600"])).await;

    // The caller gives up after 300 ms, while the command sleeps.
    // Written aside and renamed: the check below never reads the file between its creation and the write.
    let command = ["sh", "-c", "sleep 1; echo done > /exec-ran.tmp && mv /exec-ran.tmp /exec-ran"]
        .map(str::to_owned)
        .to_vec();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        cri.exec_sync(&container_id, command, Duration::from_secs(10)),
    )
    .await;
    assert!(gave_up.is_err(), "the command cannot end within 300 ms: {gave_up:?}");

    // The command still ran to its end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = exec(&cri, &container_id, &["cat", "/exec-ran"]).await;
        if out.success() {
            assert_eq!(out.stdout_lossy(), "done\n");
            break;
        }
        assert!(Instant::now() < deadline, "the dropped command did not run to its end: {out:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    cri.stop_container(&container_id, Duration::ZERO).await.expect("StopContainer");
    cleanup.run(&cri).await;
    eprintln!("a_dropped_exec_sync_runs_to_its_end: ok in {:?}", started.elapsed());
}

#[tokio::test]
async fn list_filters_by_managed_label() {
    let env = env_or_skip!("list_filters_by_managed_label");
    let started = Instant::now();
    let cri = connect(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let managed = test_pod(&env, &mut cleanup, "managed", true, Vec::new());
    let mut foreign = test_pod(&env, &mut cleanup, "foreign", false, Vec::new());
    // Same run label on both, so the only difference is the nodelet marker.
    foreign.run_label = managed.run_label.clone();
    foreign.config.labels.insert(TEST_RUN_LABEL.to_owned(), managed.run_label.clone());
    let managed_id = run_sandbox(&cri, &mut cleanup, &managed).await;
    let foreign_id = run_sandbox(&cri, &mut cleanup, &foreign).await;

    let run = SandboxFilter::all().label(TEST_RUN_LABEL, managed.run_label.clone());
    let mut all: Vec<String> =
        cri.list_pod_sandboxes(&run).await.expect("ListPodSandbox").into_iter().map(|s| s.id).collect();
    all.sort();
    let mut expected = vec![managed_id.clone(), foreign_id.clone()];
    expected.sort();
    assert_eq!(all, expected);

    let mine = SandboxFilter::managed().label(TEST_RUN_LABEL, managed.run_label.clone());
    let listed = cri.list_pod_sandboxes(&mine).await.expect("ListPodSandbox(managed)");
    assert_eq!(listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec![managed_id.as_str()]);
    assert!(listed.iter().all(|s| labels::is_managed(&s.labels)));

    // Containers: the marker is on the managed pod's container only.
    let c1 =
        create_and_start(&cri, &managed_id, &managed, container_config(&env, &managed, &["sleep", "3600"]))
            .await;
    let mut foreign_container = container_config(&env, &foreign, &["sleep", "3600"]);
    foreign_container.labels.remove(labels::MANAGED);
    let c2 = create_and_start(&cri, &foreign_id, &foreign, foreign_container).await;
    let run = ContainerFilter::all().label(TEST_RUN_LABEL, managed.run_label.clone());
    assert_eq!(cri.list_containers(&run).await.expect("ListContainers").len(), 2);
    let mine = ContainerFilter::managed().label(TEST_RUN_LABEL, managed.run_label.clone());
    let listed = cri.list_containers(&mine).await.expect("ListContainers(managed)");
    assert_eq!(listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), vec![c1.as_str()]);
    assert_ne!(c1, c2);

    // StopPodSandbox kills the containers without a grace period; RemovePodSandbox removes them.
    cleanup.run(&cri).await;
    assert!(cri.list_containers(&run).await.expect("ListContainers").is_empty());
    eprintln!("list_filters_by_managed_label: {:?}", started.elapsed());
}

#[tokio::test]
async fn events_reconnect_after_connection_loss() {
    let env = env_or_skip!("events_reconnect_after_connection_loss");
    let started = Instant::now();
    let cri = connect(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let upstream = match nodelet_cri::parse_endpoint(&env.endpoint) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let proxy = SocketProxy::start(upstream);
    let proxied = CriClient::connect(CriConfig::new(proxy.path.to_string_lossy().into_owned())).await;
    let proxied = proxied.expect("connect through the proxy");
    let mut events = subscribed_events(&proxied).await;

    // Lose the connection: the stream says so, reconnects by itself and says so again.
    assert!(proxy.sever() >= 1, "no connection went through the proxy");
    let lost = Instant::now();
    wait_event(&mut events, Duration::from_secs(10), "Disconnected", |e| {
        matches!(e, RuntimeEvent::Disconnected { .. })
    })
    .await;
    wait_event(&mut events, Duration::from_secs(15), "Reconnected", |e| {
        matches!(e, RuntimeEvent::Reconnected { .. })
    })
    .await;
    let recovered = lost.elapsed();

    // Events flow again on the new subscription: the sandbox's pause task starts.
    let pod = test_pod(&env, &mut cleanup, "reconnect", true, Vec::new());
    let sandbox_id = run_sandbox(&cri, &mut cleanup, &pod).await;
    wait_event(
        &mut events,
        Duration::from_secs(10),
        "sandbox start",
        |e| matches!(e, RuntimeEvent::ContainerStarted { id, .. } if *id == sandbox_id),
    )
    .await;
    // The CRI client on the same (reconnected) channel works too.
    proxied.version().await.expect("Version through the reconnected channel");

    cleanup.run(&cri).await;
    eprintln!(
        "events_reconnect_after_connection_loss: resubscribed {recovered:?} after the loss; total {:?}",
        started.elapsed()
    );
}

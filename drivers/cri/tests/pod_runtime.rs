//! Integration tests of [`CriPodRuntime`] (nodelet's `PodRuntime` on CRI) against a REAL containerd.
//!
//! Environment (written by `scripts/runtime-up.sh` into `/tmp/nodelet-test/env.sh`):
//!
//! | variable | use |
//! |---|---|
//! | `NODELET_TEST_CRI_ENDPOINT` | the runtime; unset → the tests print a skip note and pass, unless `NODELET_REQUIRE_RUNTIME=1`, then they panic |
//! | `NODELET_TEST_BUSYBOX_IMAGE` | a busybox image already present in the runtime (with `/var/www/index.html`) |
//! | `NODELET_TEST_LOG_DIR` | the pod log root |
//! | `NODELET_TEST_RESOLV_CONF` | the node resolv.conf pods get (nameserver 127.0.0.1: the host resolver is off limits) |
//! | `NODELET_TEST_CGROUP_PARENT` | the cgroup root; each pod gets `<root>/pod<uid>` |
//! | `NODELET_TEST_REGISTRY_BUSYBOX2` | an image only in the local registry (the pull test) |
//!
//! Traffic goes only to the pod network 198.18.0.0/16 and to loopback, which [`http_get`] asserts. Every test
//! tears its pods down even when it fails ([`Cleanup`]).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodDNSConfig,
    PodDNSConfigOption, PodSpec, ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodelet_cri::{CriClient, CriConfig, CriPodRuntime, CriPodRuntimeConfig, RuntimeEvent};
use nodelet_resources::model::actual::{
    ContainerRecord, ContainerState, ListedPod, PodActual, SandboxRecord,
};
use nodelet_resources::model::cgroup::CgroupResources;
use nodelet_resources::model::pod::{DesiredPod, PodSource};
use nodelet_resources::pod::driver::{ContainerKind, PodRuntime, container_hash};
use nodelet_resources::sandbox::desired::SandboxSpec;
use nodelet_resources::sandbox::driver::SandboxRuntime;
use tokio::time::{Instant, sleep};

use common::{allowed_destination, http_get, lock_busybox2, random_hex, random_uid, required, short, var};

const NAMESPACE: &str = "nodelet-pod-runtime-test";
const HTTPD_PORT: u16 = 8080;

// ------------------------------------------------------------------------------------------------ environment

#[derive(Debug, Clone)]
struct TestEnv {
    endpoint: String,
    busybox: String,
    log_dir: PathBuf,
    resolv_conf: PathBuf,
    cgroup_parent: Option<String>,
    busybox2: Option<String>,
    /// The pods' files (their `/etc/hosts`, termination messages) go under the test runtime's base, never
    /// under the host's `/var/lib/nodelet`.
    root_dir: PathBuf,
}

fn test_env(test: &str) -> Option<TestEnv> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let Some(endpoint) = var("NODELET_TEST_CRI_ENDPOINT") else {
        if var("NODELET_REQUIRE_RUNTIME").as_deref() == Some("1") {
            panic!(
                "NODELET_REQUIRE_RUNTIME=1 but NODELET_TEST_CRI_ENDPOINT is unset: run scripts/runtime-up.sh"
            );
        }
        eprintln!("SKIP {test}: NODELET_TEST_CRI_ENDPOINT is unset (no container runtime to test against)");
        return None;
    };
    Some(TestEnv {
        endpoint,
        busybox: required("NODELET_TEST_BUSYBOX_IMAGE"),
        log_dir: PathBuf::from(required("NODELET_TEST_LOG_DIR")),
        resolv_conf: PathBuf::from(required("NODELET_TEST_RESOLV_CONF")),
        cgroup_parent: var("NODELET_TEST_CGROUP_PARENT"),
        busybox2: var("NODELET_TEST_REGISTRY_BUSYBOX2"),
        root_dir: PathBuf::from(required("NODELET_TEST_BASE")).join("cri-pod-runtime"),
    })
}

macro_rules! env_or_skip {
    ($test:expr) => {
        match test_env($test) {
            Some(env) => env,
            None => return,
        }
    };
}

fn client_config(env: &TestEnv) -> CriConfig {
    CriConfig::new(env.endpoint.clone())
        .with_runtime_request_timeout(Duration::from_secs(60))
        .with_image_pull_timeout(Some(Duration::from_secs(120)))
}

fn runtime_config(env: &TestEnv) -> CriPodRuntimeConfig {
    CriPodRuntimeConfig::default()
        .with_root_dir(env.root_dir.clone())
        .with_pod_log_root(env.log_dir.clone())
        .with_cgroup_root(env.cgroup_parent.clone())
        .with_resolv_conf(Some(env.resolv_conf.clone()))
}

async fn runtime_with(env: &TestEnv, config: CriPodRuntimeConfig) -> CriPodRuntime {
    match CriClient::connect(client_config(env)).await {
        Ok(client) => CriPodRuntime::new(client, config),
        Err(e) => panic!("cannot connect to {}: {e}", env.endpoint),
    }
}

async fn runtime(env: &TestEnv) -> CriPodRuntime {
    runtime_with(env, runtime_config(env)).await
}

// ------------------------------------------------------------------------------------------------ cleanup

/// Stops and removes everything the runtime has for `uid` through the `PodRuntime` interface, then the pod's
/// logs and cgroups; returns what failed.
async fn teardown(rt: &CriPodRuntime, uid: &str, namespace: &str, name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    match rt.pod_state(uid).await {
        Ok(Some(listed)) => {
            let (pod, sandboxes) = (&listed.pod, sandboxes_of(&listed));
            for c in pod.containers.iter().filter(|c| c.state != ContainerState::Exited) {
                if let Err(e) = rt.stop_container(&c.id, Duration::ZERO).await {
                    errors.push(format!("stop container {}: {e}", c.id));
                }
            }
            for s in sandboxes {
                if let Err(e) = rt.stop_sandbox(&s.id).await {
                    errors.push(format!("stop sandbox {}: {e}", s.id));
                }
            }
            for c in &pod.containers {
                if let Err(e) = rt.remove_container(&c.id).await {
                    errors.push(format!("remove container {}: {e}", c.id));
                }
            }
            for s in sandboxes {
                if let Err(e) = rt.remove_sandbox(&s.id).await {
                    errors.push(format!("remove sandbox {}: {e}", s.id));
                }
            }
        }
        Ok(None) => {}
        Err(e) => errors.push(format!("pod_state {uid}: {e}")),
    }
    if let Err(e) = rt.remove_pod_logs(namespace, name, uid).await {
        errors.push(format!("remove pod logs: {e}"));
    }
    rt.remove_pod_cgroups(uid).await;
    errors
}

/// Tears the test's pods down (and removes pulled images) when dropped, also when the test panics. The
/// happy path calls [`Cleanup::run`], which asserts that everything went away.
struct Cleanup {
    env: TestEnv,
    pods: Vec<(String, String, String)>,
    images: Vec<String>,
}

impl Cleanup {
    fn new(env: &TestEnv) -> Self {
        Cleanup { env: env.clone(), pods: Vec::new(), images: Vec::new() }
    }

    fn track(&mut self, pod: &DesiredPod) {
        self.pods.push((pod.uid().to_owned(), pod.namespace().to_owned(), pod.name().to_owned()));
    }

    async fn remove_all(
        rt: &CriPodRuntime,
        pods: &[(String, String, String)],
        images: &[String],
    ) -> Vec<String> {
        let mut errors = Vec::new();
        for (uid, namespace, name) in pods {
            errors.extend(teardown(rt, uid, namespace, name).await);
        }
        for image in images {
            if let Err(e) = rt.client().remove_image(image).await {
                errors.push(format!("remove image {image}: {e}"));
            }
        }
        errors
    }

    /// Happy-path cleanup: everything must go away, and nothing of the pods may be left in the runtime, in the
    /// log root or in the cgroup hierarchies.
    async fn run(mut self, rt: &CriPodRuntime) {
        let pods = std::mem::take(&mut self.pods);
        let images = std::mem::take(&mut self.images);
        let errors = Self::remove_all(rt, &pods, &images).await;
        assert!(errors.is_empty(), "cleanup failed: {errors:?}");
        for (uid, namespace, name) in &pods {
            let listed = rt.list_pods().await.expect("list_pods");
            assert!(!listed.contains_key(uid), "pod {uid} still listed: {:?}", listed.get(uid));
            let log_dir = rt.pod_log_dir(namespace, name, uid).expect("log dir");
            assert!(!log_dir.exists(), "{} still there", log_dir.display());
            if let Some(cgroup) = rt.pod_cgroup(uid) {
                let left = cgroup_dirs(&cgroup);
                assert!(left.is_empty(), "pod cgroup left behind: {left:?}");
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.pods.is_empty() && self.images.is_empty() {
            return;
        }
        let env = self.env.clone();
        let pods = std::mem::take(&mut self.pods);
        let images = std::mem::take(&mut self.images);
        eprintln!("cleanup guard: tearing down pods {pods:?}");
        // The test's runtime may be unwinding: use a fresh runtime and connection on a separate thread.
        let worker = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return vec![format!("cannot build a runtime for cleanup: {e}")],
            };
            rt.block_on(async move {
                match CriClient::connect(client_config(&env)).await {
                    Ok(client) => {
                        let pods_rt = CriPodRuntime::new(client, runtime_config(&env));
                        Cleanup::remove_all(&pods_rt, &pods, &images).await
                    }
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

/// The directories of cgroup `rel` that exist, in any hierarchy.
fn cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    let rel = rel.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let mut candidates = vec![root.join(rel)];
    if let Ok(entries) = std::fs::read_dir(root) {
        candidates.extend(entries.flatten().map(|e| e.path().join(rel)));
    }
    candidates.into_iter().filter(|p| p.is_dir()).collect()
}

// ------------------------------------------------------------------------------------------------ pods

fn container(name: &str, image: &str, command: &[&str]) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
        ..Default::default()
    }
}

fn httpd(env: &TestEnv, name: &str) -> Container {
    container(name, &env.busybox, &["httpd", "-f", "-p", "8080", "-h", "/var/www"])
}

fn desired(prefix: &str, spec: PodSpec) -> DesiredPod {
    DesiredPod {
        pod: Pod {
            metadata: ObjectMeta {
                name: Some(format!("{prefix}-{}", random_hex(6))),
                namespace: Some(NAMESPACE.to_owned()),
                uid: Some(random_uid()),
                labels: Some(BTreeMap::from([("app".to_owned(), prefix.to_owned())])),
                ..Default::default()
            },
            spec: Some(PodSpec { termination_grace_period_seconds: Some(5), ..spec }),
            ..Default::default()
        },
        source: PodSource::Http,
    }
}

async fn run_sandbox(rt: &CriPodRuntime, cleanup: &mut Cleanup, pod: &DesiredPod) -> String {
    cleanup.track(pod);
    let started = Instant::now();
    match rt.run_sandbox(&SandboxSpec::of(std::sync::Arc::new(pod.clone())), 0).await {
        Ok(id) => {
            eprintln!("run_sandbox {} in {:?}", short(&id), started.elapsed());
            id
        }
        Err(e) => panic!("run_sandbox: {e}"),
    }
}

async fn start(
    rt: &CriPodRuntime,
    pod: &DesiredPod,
    sandbox: &str,
    c: &Container,
    kind: ContainerKind,
    n: u32,
) -> String {
    let never = nodelet_resources::pod::driver::CancellationToken::new();
    match rt.start_container(pod, sandbox, c, kind, n, 0, &Default::default(), &never).await {
        Ok(id) => id,
        Err(e) => panic!("start_container {}: {e}", c.name),
    }
}

/// What `pod_state` reads of the pod `uid`: its containers and its sandboxes.
async fn listed_state(rt: &CriPodRuntime, uid: &str) -> ListedPod {
    match rt.pod_state(uid).await {
        Ok(Some(listed)) => listed,
        other => panic!("pod_state {uid}: {other:?}"),
    }
}

/// The pod `uid`'s containers as `pod_state` reads them.
async fn pod_state(rt: &CriPodRuntime, uid: &str) -> PodActual {
    Arc::unwrap_or_clone(listed_state(rt, uid).await.pod)
}

/// A read's sandboxes, newest first.
fn sandboxes_of(listed: &ListedPod) -> &[SandboxRecord] {
    listed.sandboxes.as_ref().map_or(&[], |s| s.sandboxes.as_slice())
}

/// The pod `uid`'s newest sandbox as `pod_state` reads it.
async fn newest_sandbox(rt: &CriPodRuntime, uid: &str) -> Option<SandboxRecord> {
    sandboxes_of(&listed_state(rt, uid).await).first().cloned()
}

/// Polls `pod_state` until the container with `id` satisfies `pred`.
async fn wait_container(
    rt: &CriPodRuntime,
    uid: &str,
    id: &str,
    what: &str,
    pred: impl Fn(&ContainerRecord) -> bool,
) -> ContainerRecord {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pod = pod_state(rt, uid).await;
        let record = pod.containers.iter().find(|c| c.id == id).cloned();
        match record {
            Some(c) if pred(&c) => return c,
            other if Instant::now() >= deadline => panic!("container {id} never {what}: {other:?}"),
            _ => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn exec(rt: &CriPodRuntime, id: &str, cmd: &[&str]) -> String {
    let cmd: Vec<String> = cmd.iter().map(|s| (*s).to_owned()).collect();
    match rt.client().exec_sync(id, cmd.clone(), Duration::from_secs(10)).await {
        Ok(out) if out.success() => out.stdout_lossy(),
        other => panic!("ExecSync {cmd:?}: {other:?}"),
    }
}

/// Waits for a CRI-format line (`<RFC 3339> <stream> F <text>`) whose text is `text` in the log at `path`.
async fn wait_log_line(path: &Path, stream: &str, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let content = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = content.lines().find(|l| l.ends_with(text)) {
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            assert_eq!(fields.len(), 4, "not a CRI log line: {line:?}");
            assert!(fields[0].len() >= 20 && fields[0].contains('T'), "bad timestamp in {line:?}");
            assert_eq!((fields[1], fields[2], fields[3]), (stream, "F", text), "{line:?}");
            return;
        }
        assert!(Instant::now() < deadline, "no line {text:?} in {}: {content:?}", path.display());
        sleep(Duration::from_millis(50)).await;
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.to_owned(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn limits(cpu: &str, memory: &str) -> Option<ResourceRequirements> {
    Some(ResourceRequirements {
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        ..Default::default()
    })
}

/// Reads a cgroup file of the container, v1 (`<controller>/<parent>/<id>/<file>`) or v2.
fn cgroup_value(cgroup_parent: &str, id: &str, v1: (&str, &str), v2: &str) -> Option<String> {
    let rel = format!("{}/{id}", cgroup_parent.trim_start_matches('/'));
    let v1_path = Path::new("/sys/fs/cgroup").join(v1.0).join(&rel).join(v1.1);
    let v2_path = Path::new("/sys/fs/cgroup").join(&rel).join(v2);
    std::fs::read_to_string(v1_path)
        .or_else(|_| std::fs::read_to_string(v2_path))
        .ok()
        .map(|s| s.trim().to_owned())
}

// ------------------------------------------------------------------------------------------------ tests

#[tokio::test]
async fn app_pod_runs_serves_logs_and_tears_down() {
    let env = env_or_skip!("app_pod_runs_serves_logs_and_tears_down");
    let test_started = Instant::now();
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let mut web = httpd(&env, "web");
    web.command = Some(vec!["sh".into()]);
    web.args = Some(vec![
        "-c".into(),
        "echo 'nodelet-test: pod=$(POD_NAME) greeting=$(GREETING) literal=$$(POD_NAME)'; \
         exec httpd -f -p 8080 -h /var/www"
            .into(),
    ]);
    web.env = Some(vec![
        field_env("POD_NAME", "metadata.name"),
        EnvVar { name: "GREETING".into(), value: Some("hello-$(POD_NAME)".into()), ..Default::default() },
        field_env("POD_IP", "status.podIP"),
    ]);
    web.resources = limits("200m", "64Mi");
    web.ports = Some(vec![ContainerPort { container_port: 8080, ..Default::default() }]);
    let pod = desired(
        "web",
        PodSpec {
            containers: vec![web.clone()],
            dns_config: Some(PodDNSConfig {
                searches: Some(vec!["example.test".into()]),
                options: Some(vec![PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("2".into()),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let (uid, name) = (pod.uid().to_owned(), pod.name().to_owned());

    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let log_dir = rt.pod_log_dir(NAMESPACE, &name, &uid).expect("log dir");
    assert_eq!(log_dir, env.log_dir.join(format!("{NAMESPACE}_{name}_{uid}")));
    assert!(log_dir.is_dir(), "run_sandbox did not create {}", log_dir.display());
    let started = Instant::now();
    let id = start(&rt, &pod, &sandbox_id, &web, ContainerKind::App, 0).await;
    eprintln!("start_container {} in {:?}", short(&id), started.elapsed());

    // list_pods finds the pod by UID, with what nodelet needs to carry on after a restart.
    let listed = rt.list_pods().await.expect("list_pods");
    let listed = listed.get(&uid).unwrap_or_else(|| panic!("pod {uid} not listed"));
    let actual = &listed.pod;
    assert_eq!(
        (actual.uid.as_str(), actual.namespace.as_str(), actual.name.as_str()),
        (uid.as_str(), NAMESPACE, name.as_str())
    );
    assert_eq!(actual.termination_grace_secs, Some(5));
    let listed_sandboxes = listed.sandboxes.as_deref().expect("the pod's sandboxes listed");
    assert_eq!(
        (listed_sandboxes.uid.as_str(), listed_sandboxes.namespace.as_str(), listed_sandboxes.name.as_str()),
        (uid.as_str(), NAMESPACE, name.as_str())
    );
    let sandbox = listed_sandboxes.newest().expect("sandbox");
    assert_eq!((sandbox.id.as_str(), sandbox.ready, sandbox.attempt), (sandbox_id.as_str(), true, 0));
    let ip: Ipv4Addr = sandbox.ip.as_deref().unwrap_or_default().parse().expect("pod IPv4");
    assert!(allowed_destination(IpAddr::V4(ip)) && !ip.is_loopback(), "pod IP {ip}");
    assert!(!sandbox.host_network, "a pod network of its own: {sandbox:?}");
    // The sandbox pair's listings: the same sandbox, found by pod UID.
    let of = rt.sandboxes_of(&uid).await.expect("sandboxes_of").expect("the pod's sandboxes");
    assert_eq!(&of, listed_sandboxes);
    let all = rt.list_sandboxes().await.expect("list_sandboxes");
    assert_eq!(all.get(&uid), Some(listed_sandboxes));
    let record = wait_container(&rt, &uid, &id, "running", |c| c.state == ContainerState::Running).await;
    assert_eq!(
        (record.name.as_str(), record.restart_count, record.sandbox_id.as_str()),
        ("web", 0, sandbox_id.as_str())
    );
    assert_eq!(record.spec_hash, Some(container_hash(&web)));
    assert_eq!(record.image, env.busybox);
    assert!(!record.image_ref.is_empty(), "{record:?}");
    assert!(record.created_at > 0 && record.started_at >= record.created_at, "{record:?}");
    assert_eq!(PathBuf::from(&record.log_path), log_dir.join("web/0.log"));

    // HTTP from the host to the pod IP.
    let (code, body, _) = http_get(SocketAddr::new(IpAddr::V4(ip), HTTPD_PORT)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, exec(&rt, &id, &["cat", "/var/www/index.html"]).await);

    // Hostname, DNS (node resolv.conf + the pod's dnsConfig) and environment.
    assert_eq!(exec(&rt, &id, &["hostname"]).await.trim(), name);
    let resolv = exec(&rt, &id, &["cat", "/etc/resolv.conf"]).await;
    assert!(resolv.contains("nameserver 127.0.0.1"), "{resolv}");
    assert!(resolv.lines().any(|l| l.starts_with("search") && l.contains("example.test")), "{resolv}");
    assert!(resolv.lines().any(|l| l.starts_with("options") && l.contains("ndots:2")), "{resolv}");
    let environment = exec(&rt, &id, &["env"]).await;
    assert!(environment.lines().any(|l| l == format!("POD_IP={ip}")), "{environment}");
    assert!(environment.lines().any(|l| l == format!("GREETING=hello-{name}")), "{environment}");

    // The log, at the kubelet's path, in CRI format, with $(VAR) expanded as Kubernetes does.
    let marker = format!("nodelet-test: pod={name} greeting=hello-{name} literal=$(POD_NAME)");
    wait_log_line(&log_dir.join("web/0.log"), "stdout", &marker).await;

    // Resources reach the container's cgroup under the pod cgroup.
    if let Some(root) = &env.cgroup_parent {
        let parent = rt.pod_cgroup(&uid).expect("pod cgroup");
        assert_eq!(parent, format!("{}/pod{uid}", root.trim_end_matches('/')));
        let memory = cgroup_value(&parent, &id, ("memory", "memory.limit_in_bytes"), "memory.max");
        assert_eq!(memory.as_deref(), Some("67108864"), "memory limit of {parent}/{id}");
        let quota = cgroup_value(&parent, &id, ("cpu", "cpu.cfs_quota_us"), "cpu.max");
        assert!(quota.as_deref().is_some_and(|q| q.starts_with("20000")), "cpu quota {quota:?}");
    }

    // A relist in steady state is cheap and says the same.
    let relist_started = Instant::now();
    let again = rt.pod_state(&uid).await.expect("pod_state").expect("pod");
    eprintln!("steady-state pod_state in {:?}", relist_started.elapsed());
    assert_eq!(again.pod.containers, pod_state(&rt, &uid).await.containers);
    assert_eq!(rt.pod_state("no-such-uid").await.expect("pod_state"), None);
    // Whose a container or sandbox is (for a runtime event that no store can place yet).
    let state = listed_state(&rt, &uid).await;
    let container = state.pod.containers.first().map(|c| c.id.clone()).expect("a container");
    let sandbox = sandboxes_of(&state).first().map(|s| s.id.clone()).expect("a sandbox");
    assert_eq!(rt.pod_of(&container).await.expect("pod_of").as_deref(), Some(uid.as_str()));
    assert_eq!(rt.pod_of(&sandbox).await.expect("pod_of").as_deref(), Some(uid.as_str()));
    assert_eq!(rt.pod_of("no-such-container").await.expect("pod_of"), None);
    let another_node = runtime_with(&env, runtime_config(&env).with_node_name("another-node")).await;
    assert_eq!(another_node.pod_of(&container).await.expect("pod_of"), None, "another node's runtime");
    // A pod unchanged since the last listing is handed out again, not built anew.
    let first = rt.list_pods().await.expect("list_pods").remove(&uid).expect("pod listed");
    let second = rt.list_pods().await.expect("list_pods").remove(&uid).expect("pod listed");
    assert!(first.same(&second), "an unchanged pod was built again");
    assert_eq!(first, again);

    // Teardown through the interface: the container's log goes with it; the pod's cgroup too.
    rt.stop_container(&id, Duration::from_secs(1)).await.expect("stop_container");
    let stopped = wait_container(&rt, &uid, &id, "exited", |c| c.state == ContainerState::Exited).await;
    assert!(stopped.finished_at >= stopped.started_at, "{stopped:?}");
    // The change shows in a whole listing too, though the pod was unchanged there before.
    let relisted = rt.list_pods().await.expect("list_pods").remove(&uid).expect("pod listed");
    assert!(!Arc::ptr_eq(&relisted.pod, &first.pod));
    assert!(relisted.sandboxes.as_ref().zip(first.sandboxes.as_ref()).is_some_and(|(a, b)| a == b));
    assert_eq!(relisted.pod.containers.iter().find(|c| c.id == id), Some(&stopped));
    rt.stop_container(&id, Duration::ZERO).await.expect("stopping an exited container succeeds");
    rt.stop_sandbox(&sandbox_id).await.expect("stop_sandbox");
    rt.stop_sandbox(&sandbox_id).await.expect("stop_sandbox again");
    let pod_now = newest_sandbox(&rt, &uid).await;
    assert!(pod_now.as_ref().is_some_and(|s| !s.ready), "{pod_now:?}");
    rt.remove_container(&id).await.expect("remove_container");
    assert!(!log_dir.join("web/0.log").exists(), "the container's log survived its removal");
    rt.remove_container(&id).await.expect("removing a missing container succeeds");
    rt.remove_sandbox(&sandbox_id).await.expect("remove_sandbox");
    rt.remove_sandbox(&sandbox_id).await.expect("removing a missing sandbox succeeds");
    assert!(rt.pod_state(&uid).await.expect("pod_state").is_none());
    assert_eq!(rt.sandboxes_of(&uid).await.expect("sandboxes_of"), None);
    assert!(log_dir.is_dir(), "sandbox removal must keep the pod's logs");
    if let Some(cgroup) = rt.pod_cgroup(&uid) {
        assert_eq!(cgroup_dirs(&cgroup), Vec::<PathBuf>::new(), "pod cgroup left behind");
    }
    rt.remove_pod_logs(NAMESPACE, &name, &uid).await.expect("remove_pod_logs");
    assert!(!log_dir.exists());
    cleanup.run(&rt).await;
    eprintln!("app_pod_runs_serves_logs_and_tears_down: {:?}", test_started.elapsed());
}

#[tokio::test]
async fn exited_container_reports_exit_code_reason_and_log() {
    let env = env_or_skip!("exited_container_reports_exit_code_reason_and_log");
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let init =
        container("setup", &env.busybox, &["sh", "-c", "echo init-marker; echo init-error >&2; exit 3"]);
    let pod = desired(
        "init",
        PodSpec {
            init_containers: Some(vec![init.clone()]),
            containers: vec![httpd(&env, "web")],
            restart_policy: Some("Never".into()),
            ..Default::default()
        },
    );
    let uid = pod.uid().to_owned();
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let first = start(&rt, &pod, &sandbox_id, &init, ContainerKind::Init, 0).await;
    let exited = wait_container(&rt, &uid, &first, "exited", |c| c.state == ContainerState::Exited).await;
    assert_eq!((exited.exit_code, exited.reason.as_str()), (3, "Error"), "{exited:?}");
    // containerd stamps `started_at` when its start call returns, which can be after a quick process exited:
    // only the order against creation is certain.
    assert!(exited.started_at >= exited.created_at && exited.finished_at >= exited.created_at, "{exited:?}");
    let log_dir = rt.pod_log_dir(NAMESPACE, pod.name(), &uid).expect("log dir");
    assert_eq!(PathBuf::from(&exited.log_path), log_dir.join("setup/0.log"));
    wait_log_line(&log_dir.join("setup/0.log"), "stdout", "init-marker").await;
    wait_log_line(&log_dir.join("setup/0.log"), "stderr", "init-error").await;

    // A second attempt: both are listed, newest first; removing the first removes only its log.
    let second = start(&rt, &pod, &sandbox_id, &init, ContainerKind::Init, 1).await;
    wait_container(&rt, &uid, &second, "exited", |c| c.state == ContainerState::Exited && c.exit_code == 3)
        .await;
    let actual = pod_state(&rt, &uid).await;
    let attempts: Vec<(&str, u32)> =
        actual.containers.iter().map(|c| (c.id.as_str(), c.restart_count)).collect();
    assert_eq!(attempts, [(second.as_str(), 1), (first.as_str(), 0)]);
    assert_eq!(actual.container("setup").map(|c| c.id.as_str()), Some(second.as_str()));
    assert_eq!(actual.previous("setup").map(|c| c.id.as_str()), Some(first.as_str()));
    rt.remove_container(&first).await.expect("remove_container");
    assert!(!log_dir.join("setup/0.log").exists());
    assert!(log_dir.join("setup/1.log").exists());
    let actual = pod_state(&rt, &uid).await;
    assert_eq!(actual.containers.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), [second.as_str()]);

    // Exit 0 is Completed.
    let ok = container("done", &env.busybox, &["true"]);
    let done = start(&rt, &pod, &sandbox_id, &ok, ContainerKind::Init, 0).await;
    let record = wait_container(&rt, &uid, &done, "exited", |c| c.state == ContainerState::Exited).await;
    assert_eq!((record.exit_code, record.reason.as_str()), (0, "Completed"));
    cleanup.run(&rt).await;
}

#[tokio::test]
async fn host_network_pod() {
    let env = env_or_skip!("host_network_pod");
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let port = fastrand::u16(30_000..40_000);
    let listen = format!("127.0.0.1:{port}");
    let web = container("web", &env.busybox, &["httpd", "-f", "-p", &listen, "-h", "/var/www"]);
    let pod = desired(
        "hostnet",
        PodSpec { containers: vec![web.clone()], host_network: Some(true), ..Default::default() },
    );
    let uid = pod.uid().to_owned();
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let id = start(&rt, &pod, &sandbox_id, &web, ContainerKind::App, 0).await;

    let sandbox = newest_sandbox(&rt, &uid).await;
    assert_eq!(sandbox.as_ref().map(|s| s.ip.clone()), Some(None), "a host-network pod has no IP of its own");
    assert_eq!(sandbox.map(|s| s.host_network), Some(true), "the sandbox is in the node's network");
    wait_container(&rt, &uid, &id, "running", |c| c.state == ContainerState::Running).await;
    let (code, body, _) = http_get(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)).await;
    assert_eq!(code, 200, "{body}");
    let node_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(exec(&rt, &id, &["hostname"]).await.trim(), node_hostname.trim());
    cleanup.run(&rt).await;
}

#[tokio::test]
async fn host_port_reaches_the_pod() {
    let env = env_or_skip!("host_port_reaches_the_pod");
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let host_port = fastrand::u16(20_000..30_000);
    let mut web = httpd(&env, "web");
    web.ports = Some(vec![ContainerPort {
        container_port: i32::from(HTTPD_PORT),
        host_port: Some(i32::from(host_port)),
        ..Default::default()
    }]);
    let pod = desired("hostport", PodSpec { containers: vec![web.clone()], ..Default::default() });
    let uid = pod.uid().to_owned();
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    start(&rt, &pod, &sandbox_id, &web, ContainerKind::App, 0).await;
    let ip = newest_sandbox(&rt, &uid).await.and_then(|s| s.ip).expect("pod IP");
    let ip: IpAddr = ip.parse().expect("pod IP");

    // Directly, then through the hostPort on the host's address on the pod bridge (the portmap plugin does not
    // DNAT loopback without route_localnet, and nothing else is an allowed destination).
    let (code, direct, local) = http_get(SocketAddr::new(ip, HTTPD_PORT)).await;
    assert_eq!(code, 200, "{direct}");
    let (code, mapped, _) = http_get(SocketAddr::new(local.ip(), host_port)).await;
    assert_eq!((code, mapped), (200, direct));
    eprintln!("host_port_reaches_the_pod: {}:{host_port} -> {ip}:{HTTPD_PORT}", local.ip());
    cleanup.run(&rt).await;
}

#[tokio::test]
async fn start_failures_have_kubelet_reasons() {
    let env = env_or_skip!("start_failures_have_kubelet_reasons");
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let mut root = httpd(&env, "root");
    root.security_context = Some(SecurityContext { privileged: Some(true), ..Default::default() });
    let mut never = httpd(&env, "never");
    never.image = Some("localhost/nodelet/no-such-image:v1".into());
    never.image_pull_policy = Some("Never".into());
    let mut invalid = httpd(&env, "invalid");
    invalid.image = Some("Not A/Valid:Image!".into());
    let mut missing = httpd(&env, "missing");
    missing.image = Some(format!(
        "{}/nodelet/no-such-image:v1",
        var("NODELET_TEST_REGISTRY").unwrap_or_else(|| "127.0.0.1:5000".into())
    ));
    let mut env_ref = httpd(&env, "envref");
    env_ref.env = Some(vec![field_env("NODE_IP", "status.hostIP")]);
    let pod = desired(
        "failures",
        PodSpec {
            containers: vec![
                httpd(&env, "web"),
                root.clone(),
                never.clone(),
                invalid.clone(),
                missing.clone(),
                env_ref.clone(),
            ],
            ..Default::default()
        },
    );
    let uid = pod.uid().to_owned();
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;

    let err = rt
        .start_container(
            &pod,
            &sandbox_id,
            &root,
            ContainerKind::App,
            0,
            0,
            &Default::default(),
            &Default::default(),
        )
        .await
        .expect_err("privileged");
    assert_eq!(err.reason, "CreateContainerConfigError", "{err}");
    assert!(
        err.message.contains("\"root\"")
            && err.message.contains("spec.containers[1].securityContext.privileged"),
        "{err}"
    );

    let err = rt
        .start_container(
            &pod,
            &sandbox_id,
            &never,
            ContainerKind::App,
            0,
            0,
            &Default::default(),
            &Default::default(),
        )
        .await
        .expect_err("never");
    assert_eq!(err.reason, "ErrImageNeverPull", "{err}");
    assert!(err.message.contains("localhost/nodelet/no-such-image:v1"), "{err}");

    let err = rt
        .start_container(
            &pod,
            &sandbox_id,
            &invalid,
            ContainerKind::App,
            0,
            0,
            &Default::default(),
            &Default::default(),
        )
        .await
        .expect_err("invalid");
    assert_eq!(err.reason, "InvalidImageName", "{err}");

    let err = rt
        .start_container(
            &pod,
            &sandbox_id,
            &missing,
            ContainerKind::App,
            0,
            0,
            &Default::default(),
            &Default::default(),
        )
        .await
        .expect_err("missing");
    assert_eq!(err.reason, "ErrImagePull", "{err}");

    let err = rt
        .start_container(
            &pod,
            &sandbox_id,
            &env_ref,
            ContainerKind::App,
            0,
            0,
            &Default::default(),
            &Default::default(),
        )
        .await
        .expect_err("host IP");
    assert_eq!(err.reason, "CreateContainerConfigError", "{err}");
    assert!(err.message.contains("spec.containers[5].env[0].valueFrom.fieldRef.fieldPath"), "{err}");

    // Nothing was created for any of them; the sandbox is fine.
    let actual = listed_state(&rt, &uid).await;
    assert!(actual.pod.containers.is_empty(), "{:?}", actual.pod.containers);
    assert!(sandboxes_of(&actual).first().is_some_and(|s| s.ready));

    // Allowed, the privileged container runs.
    let permissive = runtime_with(&env, runtime_config(&env).with_allow_privileged(true)).await;
    let id = start(&permissive, &pod, &sandbox_id, &root, ContainerKind::App, 0).await;
    let record =
        wait_container(&permissive, &uid, &id, "running", |c| c.state == ContainerState::Running).await;
    assert_eq!(record.name, "root");
    cleanup.run(&rt).await;
}

#[tokio::test]
async fn if_not_present_pulls_a_missing_image() {
    let env = env_or_skip!("if_not_present_pulls_a_missing_image");
    let image = env.busybox2.clone().unwrap_or_else(|| required("NODELET_TEST_REGISTRY_BUSYBOX2"));
    let rt = runtime(&env).await;
    // Blocks this test's thread while another process holds the lock: nothing else runs on it meanwhile.
    let _lock = lock_busybox2();
    let mut cleanup = Cleanup::new(&env);

    rt.client().remove_image(&image).await.expect("RemoveImage (pre-clean)");
    assert!(rt.client().image_status(&image).await.expect("ImageStatus").is_none());
    cleanup.images.push(image.clone());

    let mut v2 = container("v2", &image, &["sleep", "3600"]);
    v2.image_pull_policy = None; // defaulted from the tag: IfNotPresent for :v2
    let pod = desired("pull", PodSpec { containers: vec![v2.clone()], ..Default::default() });
    let uid = pod.uid().to_owned();
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let pull_started = Instant::now();
    let id = start(&rt, &pod, &sandbox_id, &v2, ContainerKind::App, 0).await;
    eprintln!("pull + start in {:?}", pull_started.elapsed());
    assert!(rt.client().image_status(&image).await.expect("ImageStatus").is_some(), "not pulled");
    let record = wait_container(&rt, &uid, &id, "running", |c| c.state == ContainerState::Running).await;
    assert_eq!(record.image, image);
    assert_eq!(exec(&rt, &id, &["cat", "/etc/nodelet-image-version"]).await.trim(), "v2");

    // Present now: a second container starts without pulling (no registry involved with Never).
    let mut again = v2.clone();
    again.name = "again".into();
    again.image_pull_policy = Some("Never".into());
    start(&rt, &pod, &sandbox_id, &again, ContainerKind::App, 0).await;
    cleanup.run(&rt).await;
    assert!(rt.client().image_status(&image).await.expect("ImageStatus").is_none(), "image left behind");
}

#[tokio::test]
async fn stop_honours_the_grace_period() {
    let env = env_or_skip!("stop_honours_the_grace_period");
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let polite = container(
        "polite",
        &env.busybox,
        &["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
    );
    let stubborn =
        container("stubborn", &env.busybox, &["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]);
    let pod = desired(
        "grace",
        PodSpec { containers: vec![polite.clone(), stubborn.clone()], ..Default::default() },
    );
    let uid = pod.uid().to_owned();
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let polite_id = start(&rt, &pod, &sandbox_id, &polite, ContainerKind::App, 0).await;
    let stubborn_id = start(&rt, &pod, &sandbox_id, &stubborn, ContainerKind::App, 0).await;
    for id in [&polite_id, &stubborn_id] {
        wait_container(&rt, &uid, id, "running", |c| c.state == ContainerState::Running).await;
    }
    // Let the shells install their traps.
    sleep(Duration::from_millis(300)).await;

    let t = Instant::now();
    rt.stop_container(&polite_id, Duration::from_secs(10)).await.expect("stop polite");
    let polite_took = t.elapsed();
    let record = wait_container(&rt, &uid, &polite_id, "exited", |c| c.state == ContainerState::Exited).await;
    assert_eq!((record.exit_code, record.reason.as_str()), (0, "Completed"), "{record:?}");
    assert!(polite_took < Duration::from_secs(5), "a container that exits on TERM took {polite_took:?}");

    let grace = Duration::from_millis(1500);
    let t = Instant::now();
    rt.stop_container(&stubborn_id, grace).await.expect("stop stubborn");
    let stubborn_took = t.elapsed();
    let record =
        wait_container(&rt, &uid, &stubborn_id, "exited", |c| c.state == ContainerState::Exited).await;
    assert_eq!(record.exit_code, 137, "{record:?}");
    // The grace period is rounded up to whole seconds (2 s), then SIGKILL.
    assert!(
        stubborn_took >= Duration::from_secs(2) && stubborn_took < Duration::from_secs(10),
        "a container ignoring TERM was stopped after {stubborn_took:?} with a {grace:?} grace period"
    );
    eprintln!("stop: polite {polite_took:?}, stubborn {stubborn_took:?}");
    cleanup.run(&rt).await;
}

#[tokio::test]
async fn the_runtimes_events_about_what_nodelet_stops_and_removes_are_its_own_and_other_exits_are_not() {
    let env = env_or_skip!("the_runtimes_events_about_what_nodelet_stops_and_removes_are_its_own");
    let rt = runtime(&env).await;
    let own = rt.own_changes();
    let client = CriClient::connect(client_config(&env)).await.expect("connect");
    let mut events = common::subscribed_events(&client).await;
    let mut cleanup = Cleanup::new(&env);

    let stopped = container(
        "stopped",
        &env.busybox,
        &["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"],
    );
    let quitter = container("quitter", &env.busybox, &["sh", "-c", "sleep 1; exit 3"]);
    let pod =
        desired("own", PodSpec { containers: vec![stopped.clone(), quitter.clone()], ..Default::default() });
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let stopped_id = start(&rt, &pod, &sandbox_id, &stopped, ContainerKind::App, 0).await;
    let quitter_id = start(&rt, &pod, &sandbox_id, &quitter, ContainerKind::App, 0).await;

    // A container that exits by itself: its event is not nodelet's.
    let within = Duration::from_secs(20);
    let exited = |id: &str| {
        let id = id.to_owned();
        move |e: &RuntimeEvent| matches!(e, RuntimeEvent::ContainerExited { id: got, .. } if *got == id)
    };
    common::wait_event(&mut events, within, "the quitter's exit", exited(&quitter_id)).await;
    assert!(!own.caused(&quitter_id), "an exit nodelet did not cause is followed");

    // One nodelet stops, then removes: each event is its own (the ID the runtime reports is the one marked).
    sleep(Duration::from_millis(300)).await;
    rt.stop_container(&stopped_id, Duration::from_secs(10)).await.expect("stop_container");
    common::wait_event(&mut events, within, "the stopped container's exit", exited(&stopped_id)).await;
    assert!(own.caused(&stopped_id), "the exit of a container nodelet stopped is its own");
    rt.remove_container(&stopped_id).await.expect("remove_container");
    let removed = stopped_id.clone();
    common::wait_event(
        &mut events,
        within,
        "the removal",
        move |e| matches!(e, RuntimeEvent::ContainerRemoved { id } if *id == removed),
    )
    .await;
    assert!(own.caused(&stopped_id), "and so is its removal");
    assert!(
        !own.caused(&sandbox_id),
        "sandboxes are never marked: the sandbox pair reads only its own store"
    );
    cleanup.run(&rt).await;
}

#[tokio::test]
async fn container_resources_are_reported_and_updated_in_place() {
    let env = env_or_skip!("container_resources_are_reported_and_updated_in_place");
    let rt = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);
    let mut app = httpd(&env, "app");
    app.command = Some(vec!["sleep".into(), "60".into()]);
    app.resources = limits("200m", "64Mi");
    let pod = desired("resize", PodSpec { containers: vec![app.clone()], ..Default::default() });
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let id = start(&rt, &pod, &sandbox_id, &app, ContainerKind::App, 0).await;
    let running =
        wait_container(&rt, pod.uid(), &id, "running", |c| c.state == ContainerState::Running).await;
    assert_eq!(running.applied, Some(CgroupResources::of(&app)), "the runtime reports what the spec asks");
    let wanted =
        CgroupResources { cpu_shares: 512, cpu_quota: 50_000, cpu_period: 100_000, memory_limit: 128 << 20 };
    if let Err(e) = rt.update_container_resources(&id, &wanted).await {
        panic!("update_container_resources: {e}");
    }
    let state = pod_state(&rt, pod.uid()).await;
    let record = state.containers.iter().find(|c| c.id == id).expect("the container");
    assert_eq!(record.applied, Some(wanted));
    assert_eq!(record.state, ContainerState::Running, "still the same running container");
    let _ = teardown(&rt, pod.uid(), NAMESPACE, pod.name()).await;
}

/// How many calls of `operation_type` the client has counted in `registry`.
fn calls(registry: &prometheus::Registry, operation_type: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == "kubelet_runtime_operations_total")
        .flat_map(|family| family.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.name() == "operation_type" && l.value() == operation_type))
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// The listings the client has made so far.
fn listings(registry: &prometheus::Registry) -> u64 {
    calls(registry, "list_podsandbox") + calls(registry, "list_containers")
}

#[tokio::test]
async fn one_pods_state_is_read_without_listings_once_the_node_was_listed_and_matches_a_listing() {
    let env = env_or_skip!(
        "one_pods_state_is_read_without_listings_once_the_node_was_listed_and_matches_a_listing"
    );
    let rt = runtime(&env).await;
    let registry = prometheus::Registry::new();
    assert!(rt.client().set_metrics(nodelet_cri::CriMetrics::new(&registry).expect("metrics")));
    // Another runtime, whose reads are listings (it never listed the node), to compare with.
    let lister = runtime(&env).await;
    let mut cleanup = Cleanup::new(&env);

    let init = container("setup", &env.busybox, &["sh", "-c", "exit 3"]);
    let pod = desired(
        "index",
        PodSpec {
            init_containers: Some(vec![init.clone()]),
            containers: vec![httpd(&env, "web")],
            ..Default::default()
        },
    );
    let uid = pod.uid().to_owned();
    // Before the first full listing, a pod's state comes from listings.
    let sandbox_id = run_sandbox(&rt, &mut cleanup, &pod).await;
    let before = listings(&registry);
    assert_eq!(sandboxes_of(&listed_state(&rt, &uid).await).len(), 1);
    assert_eq!(listings(&registry), before + 2, "ListPodSandbox and ListContainers");

    rt.list_pods().await.expect("list_pods");
    let listed = listings(&registry);
    let first = start(&rt, &pod, &sandbox_id, &init, ContainerKind::Init, 0).await;
    wait_container(&rt, &uid, &first, "exited", |c| c.state == ContainerState::Exited).await;
    let web = start(&rt, &pod, &sandbox_id, &httpd(&env, "web"), ContainerKind::App, 0).await;
    wait_container(&rt, &uid, &web, "running", |c| c.state == ContainerState::Running).await;
    let read = listed_state(&rt, &uid).await;
    let sandboxes = rt.sandboxes_of(&uid).await.expect("sandboxes_of");
    assert_eq!(listings(&registry), listed, "reads of one pod made listings");
    assert!(calls(&registry, "container_status") > 0 && calls(&registry, "podsandbox_status") > 0);

    // What was read is what a listing shows.
    assert_eq!(read, listed_state(&lister, &uid).await);
    assert_eq!(sandboxes, lister.sandboxes_of(&uid).await.expect("sandboxes_of"));
    assert_eq!(sandboxes.as_ref(), read.sandboxes.as_deref(), "the sandbox pair's read and the pod's agree");
    assert_eq!(read.pod.containers.len(), 2, "{read:?}");
    let listed_node = lister.list_pods().await.expect("list_pods");
    assert_eq!(Some(&read), listed_node.get(&uid));

    // A container removed behind nodelet's back is gone from the next read.
    lister.client().remove_container(&first).await.expect("RemoveContainer");
    let read = pod_state(&rt, &uid).await;
    assert_eq!(read.containers.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), [web.as_str()]);
    assert_eq!(listings(&registry), listed, "a gone object needs no listing");
    // Another pod, unknown to the runtime: nothing, without a call.
    let calls_before: u64 =
        ["container_status", "podsandbox_status"].iter().map(|c| calls(&registry, c)).sum();
    assert_eq!(rt.pod_state(&random_uid()).await.expect("pod_state"), None);
    let calls_after: u64 =
        ["container_status", "podsandbox_status"].iter().map(|c| calls(&registry, c)).sum();
    assert_eq!((calls_after, listings(&registry)), (calls_before, listed));
    cleanup.run(&rt).await;
}

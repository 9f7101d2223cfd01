//! The test fixture: a real `nodelet` daemon in a temporary directory, on the real containerd.
//!
//! [`Nodelet::start`] spawns the binary with its own root, manifest and log directories, free loopback
//! ports, a unique node name (static pods are named `<name>-<node>`, so parallel tests never share a pod),
//! a config file with a short crash-loop back-off and a bearer token for the main port. Its stdout and stderr
//! go to `nodelet.log` in the temporary directory, printed when a test fails, after the runtime's log lines
//! about what the pods left behind. nodelet logs with its default filter; `NODELET_TEST_RUST_LOG`, when
//! set, is its `RUST_LOG` (e.g. `info,nodelet_cri=trace` shows every CRI call).
//!
//! Teardown always runs: [`Nodelet::shutdown`] on the happy path (it also asserts that nodelet removed every
//! pod from the runtime), the [`Drop`] guard when a test panics. Both remove every manifest, wait until
//! `/pods` is empty and the runtime holds no sandbox of this node (force-removing what is left), and only
//! then stop nodelet with SIGTERM: pods keep running after nodelet exits, as with the kubelet.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};
use nodelet_cri::labels;
use nodelet_cri::proto;
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep};

/// How often the `wait_for` helpers poll.
pub(crate) const POLL: Duration = Duration::from_millis(150);
/// The crash-loop back-off the fixture configures: first delay and cap.
pub(crate) const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// The cap of the fixture's crash-loop back-off.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(4);
/// The bearer token accepted on the main port (user `e2e-user`, group `system:masters`).
pub(crate) const TOKEN: &str = "e2e-token-0123456789abcdef";
/// Another user's bearer token (user `e2e-other`, group `system:masters`), for per-user limits.
pub(crate) const OTHER_TOKEN: &str = "e2e-other-token-fedcba9876543210";
/// Prefix of every node name the fixture makes up (the leftover sweep only touches these).
const NODE_PREFIX: &str = "e2e-";
/// How long teardown waits for nodelet to remove the pods before removing them itself.
const TEARDOWN_WAIT: Duration = Duration::from_secs(30);
/// How long nodelet gets to exit after SIGTERM.
const EXIT_WAIT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------------------------------------ environment

/// The real runtime the tests run against (from `/tmp/nodelet-test/env.sh`).
#[derive(Debug, Clone)]
pub(crate) struct Env {
    /// `unix:///…/containerd.sock`.
    pub(crate) endpoint: String,
    /// A busybox image present in the runtime.
    pub(crate) busybox: String,
    /// The cgroup under which pod cgroups go.
    pub(crate) cgroup_parent: String,
    /// The resolv.conf pods get (nameserver 127.0.0.1).
    pub(crate) resolv_conf: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn required(name: &str) -> String {
    var(name).unwrap_or_else(|| {
        panic!("NODELET_TEST_CRI_ENDPOINT is set but {name} is not: source /tmp/nodelet-test/env.sh")
    })
}

/// The runtime to test against; `None` (after a skip note) when none is configured, unless
/// `NODELET_REQUIRE_RUNTIME=1`, then it panics.
pub(crate) fn runtime_env(test: &str) -> Option<Env> {
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
    Some(Env {
        endpoint,
        busybox: required("NODELET_TEST_BUSYBOX_IMAGE"),
        cgroup_parent: required("NODELET_TEST_CGROUP_PARENT"),
        resolv_conf: required("NODELET_TEST_RESOLV_CONF"),
    })
}

/// The major version of the test runtime's containerd (`NODELET_TEST_CONTAINERD_VERSION`, which the runtime
/// set-up exports), to decide which features the runtime must have (e.g. CRI events from 2 on).
pub(crate) fn containerd_major() -> u32 {
    let version = required("NODELET_TEST_CONTAINERD_VERSION");
    let major = version.trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok());
    major.unwrap_or_else(|| panic!("NODELET_TEST_CONTAINERD_VERSION={version:?} is not a version"))
}

/// `let env = env_or_skip!("name");`: the runtime, or return from the test after a skip note.
macro_rules! env_or_skip {
    ($test:expr) => {
        match $crate::support::runtime_env($test) {
            Some(env) => env,
            None => return,
        }
    };
}
pub(crate) use env_or_skip;

fn cri_config(endpoint: &str) -> CriConfig {
    CriConfig::new(endpoint.to_owned()).with_runtime_request_timeout(Duration::from_secs(30))
}

// ------------------------------------------------------------------------------------------------ the fixture

/// The loopback ports of one nodelet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    /// Unauthenticated HTTP (`--read-only-port`).
    pub(crate) read_only: u16,
    /// HTTPS with authentication (`--port`).
    pub(crate) main: u16,
    /// `/healthz` (`--healthz-port`).
    pub(crate) healthz: u16,
}

impl Ports {
    fn free() -> Ports {
        // Hold all three at once so they differ; nodelet binds them right after.
        let bind = || match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) {
            Ok(l) => l,
            Err(e) => panic!("cannot find a free port: {e}"),
        };
        let (a, b, c) = (bind(), bind(), bind());
        let port = |l: &TcpListener| match l.local_addr() {
            Ok(a) => a.port(),
            Err(e) => panic!("no local address: {e}"),
        };
        Ports { read_only: port(&a), main: port(&b), healthz: port(&c) }
    }
}

/// How [`Nodelet::start_with`] differs from [`Nodelet::start`].
#[derive(Debug, Clone, Default)]
pub(crate) struct StartOptions {
    /// KubeletConfiguration fields (YAML, top level, one per line) added to the config file.
    pub(crate) config_extra: String,
    /// Fields under `nodelet:` (YAML, one per line, unindented) added to the config file.
    pub(crate) nodelet_extra: String,
    /// `--root-dir` instead of `<tmp>/root` (e.g. a small filesystem the test mounted).
    pub(crate) root_dir: Option<PathBuf>,
    /// Run nodelet's own containerd under the root directory (no `--container-runtime-endpoint`),
    /// importing the image archives of this directory (`--preload-images`).
    pub(crate) embedded_runtime: Option<PathBuf>,
    /// More command-line arguments, appended after the fixture's own (e.g. `--kubeconfig`, `--node-ip`).
    pub(crate) extra_args: Vec<String>,
    /// The node name instead of a new [`node_name`] (e.g. one a node kubeconfig was minted for).
    pub(crate) node_name: Option<String>,
    /// Another nodelet binary (e.g. one built with an extension) instead of this package's `nodelet`.
    pub(crate) binary: Option<PathBuf>,
    /// Environment variables of the daemon.
    pub(crate) env: Vec<(String, String)>,
    /// No `--cgroup-root` (nodelet's default: no pod cgroups, sandboxes without a cgroup parent).
    pub(crate) no_cgroup_root: bool,
}

/// This package's `nodelet` binary (`nodelet` from `PATH` in a package without one: pass
/// [`StartOptions::binary`] there). `NODELET_TEST_BINARY` names another copy of it: with a target
/// directory that several checkouts share, `target/debug/nodelet` is whichever was built last.
pub(crate) fn nodelet_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NODELET_TEST_BINARY").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    PathBuf::from(option_env!("CARGO_BIN_EXE_nodelet").unwrap_or("nodelet"))
}

/// A running nodelet daemon and everything it owns; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Nodelet {
    env: Env,
    node: String,
    dir: tempfile::TempDir,
    ports: Ports,
    child: Option<Child>,
    http: reqwest::Client,
    cri: CriClient,
    torn_down: bool,
    options: StartOptions,
}

static NEXT_NODE: AtomicU32 = AtomicU32::new(0);

/// A new node name for the test `hint`: `e2e-<hint>-<pid>-<n>` (unique, and recognised by the leftover
/// sweep).
pub(crate) fn node_name(hint: &str) -> String {
    let n = NEXT_NODE.fetch_add(1, Ordering::Relaxed);
    format!("{NODE_PREFIX}{hint}-{}-{n}", std::process::id())
}

impl Nodelet {
    /// Starts nodelet for the test `hint` (part of the node name) and waits until it is healthy.
    pub(crate) async fn start(env: &Env, hint: &str) -> Nodelet {
        Nodelet::start_with(env, hint, StartOptions::default()).await
    }

    /// [`start`](Self::start) with other settings.
    pub(crate) async fn start_with(env: &Env, hint: &str, options: StartOptions) -> Nodelet {
        sweep_leftovers(&env.endpoint).await;
        let mut env = env.clone();
        let node = options.node_name.clone().unwrap_or_else(|| node_name(hint));
        let dir = match tempfile::Builder::new().prefix("nodelet-e2e-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("cannot create a temporary directory: {e}"),
        };
        for sub in ["root", "manifests", "logs"] {
            mkdir(&dir.path().join(sub));
        }
        write_file(
            &dir.path().join("tokens.csv"),
            &format!(
                "{TOKEN},e2e-user,1001,\"system:masters\"\n{OTHER_TOKEN},e2e-other,1002,\"system:masters\"\n"
            ),
        );
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n\
             kind: KubeletConfiguration\n\
             nodelet:\n  \
               tokenAuthFile: tokens.csv\n  \
               containerRestartBackOff: {{initial: {}ms, max: {}ms, resetAfter: 10m}}\n  \
               imagePullBackOff: {{initial: 1s, max: 4s}}\n{}{}",
            BACKOFF_INITIAL.as_millis(),
            BACKOFF_MAX.as_millis(),
            options.nodelet_extra.lines().map(|l| format!("  {l}\n")).collect::<String>(),
            options.config_extra.lines().map(|l| format!("{l}\n")).collect::<String>(),
        );
        // The tests share one runtime on a disk that may be nearly full: no disk-pressure eviction (it
        // would refuse every pod) and no image garbage collection (it would remove images other tests
        // use), unless a test asks for them.
        let mut config = config;
        if !options.config_extra.contains("evictionHard:") {
            config.push_str("evictionHard: {memory.available: 100Mi}\n");
        }
        if !options.config_extra.contains("imageGCHighThresholdPercent:") {
            config.push_str("imageGCHighThresholdPercent: 100\n");
        }
        if options.embedded_runtime.is_some() {
            let root = options.root_dir.clone().unwrap_or_else(|| dir.path().join("root"));
            env.endpoint = format!("unix://{}", root.join("containerd/containerd.sock").display());
        }
        write_file(&dir.path().join("config.yaml"), &config);
        let http = match reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(2))
            .build()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot build an HTTP client: {e}"),
        };
        let cri = match CriClient::connect_lazy(cri_config(&env.endpoint)) {
            Ok(c) => c,
            Err(e) => panic!("bad CRI endpoint {}: {e}", env.endpoint),
        };
        let mut nodelet = Nodelet {
            env: env.clone(),
            node,
            dir,
            ports: Ports::free(),
            child: None,
            http,
            cri,
            torn_down: false,
            options,
        };
        nodelet.launch().await;
        nodelet
    }

    /// Spawns the binary and waits until `/healthz` answers; new ports when one was taken meanwhile.
    async fn launch(&mut self) {
        for attempt in 0..3 {
            let log = match std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()) {
                Ok(f) => f,
                Err(e) => panic!("cannot open {}: {e}", self.log_path().display()),
            };
            let stderr = match log.try_clone() {
                Ok(f) => f,
                Err(e) => panic!("cannot duplicate the log file: {e}"),
            };
            let binary = self.options.binary.clone().unwrap_or_else(nodelet_binary);
            let child = Command::new(&binary)
                .args(self.daemon_args())
                .envs(self.options.env.iter().map(|(k, v)| (k, v)))
                .env_remove("RUST_LOG")
                .envs(std::env::var("NODELET_TEST_RUST_LOG").ok().map(|v| ("RUST_LOG", v)))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(stderr)
                .spawn();
            match child {
                Ok(c) => self.child = Some(c),
                Err(e) => panic!("cannot start {}: {e}", binary.display()),
            }
            match self.wait_healthy(Duration::from_secs(20)).await {
                Ok(()) => return,
                Err(status) if attempt < 2 && self.log().contains("in use") => {
                    eprintln!("nodelet exited ({status}): a port was taken; retrying with other ports");
                    self.ports = Ports::free();
                }
                Err(status) => panic!("nodelet did not become healthy ({status}); its log:\n{}", self.log()),
            }
        }
    }

    /// The daemon's command line.
    fn daemon_args(&self) -> Vec<String> {
        let d = self.dir.path();
        let path = |p: &str| d.join(p).display().to_string();
        [
            ("--config", path("config.yaml")),
            ("--root-dir", self.root_dir().display().to_string()),
            ("--pod-manifest-path", path("manifests")),
            ("--pod-logs-dir", path("logs")),
            match &self.options.embedded_runtime {
                Some(images) => ("--preload-images", images.display().to_string()),
                None => ("--container-runtime-endpoint", self.env.endpoint.clone()),
            },
            ("--hostname-override", self.node.clone()),
            ("--address", "127.0.0.1".to_owned()),
            ("--read-only-port", self.ports.read_only.to_string()),
            ("--port", self.ports.main.to_string()),
            ("--healthz-port", self.ports.healthz.to_string()),
            ("--cgroup-root", self.env.cgroup_parent.clone()),
            ("--resolv-conf", self.env.resolv_conf.clone()),
            ("--v", "2".to_owned()),
        ]
        .into_iter()
        .filter(|(flag, _)| !(self.options.no_cgroup_root && *flag == "--cgroup-root"))
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .chain(self.options.extra_args.iter().cloned())
        .collect()
    }

    async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let url = format!("http://127.0.0.1:{}/healthz", self.ports.healthz);
        loop {
            if let Some(status) = self.exited() {
                return Err(format!("exited with {status}"));
            }
            if let Ok(r) = self.http.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no healthy /healthz within {timeout:?}"));
            }
            sleep(POLL).await;
        }
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// How nodelet exited, if it is no longer running (`None` while it runs).
    pub(crate) fn exit_status(&mut self) -> Option<ExitStatus> {
        self.exited()
    }

    /// The daemon's process ID (while it runs).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The test's temporary directory (nodelet's directories and log are in it; tests may add their own).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node name (`--hostname-override`).
    /// The test's own client of the runtime this nodelet uses.
    pub(crate) fn cri(&self) -> &CriClient {
        &self.cri
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The name nodelet gives the static pod `name`: `<name>-<node>`.
    pub(crate) fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.node)
    }

    /// The ports.
    pub(crate) fn ports(&self) -> Ports {
        self.ports
    }

    /// A plain HTTP client (no proxy, 5 s timeout).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `--pod-logs-dir`.
    pub(crate) fn logs_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// `--root-dir`.
    pub(crate) fn root_dir(&self) -> PathBuf {
        self.options.root_dir.clone().unwrap_or_else(|| self.dir.path().join("root"))
    }

    /// The config file (`--config`); a change applies at the next [`start_again`](Self::start_again).
    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// The runtime this nodelet uses (its own containerd's socket with an embedded runtime).
    pub(crate) fn endpoint(&self) -> &str {
        &self.env.endpoint
    }

    /// The bearer token of the manifest HTTP endpoint (`--manifest-http-addr`), from
    /// `<root-dir>/http-source/token`.
    pub(crate) fn manifest_token(&self) -> String {
        let path = self.root_dir().join("http-source/token");
        match std::fs::read_to_string(&path) {
            Ok(t) => t.trim().to_owned(),
            Err(e) => panic!("cannot read {}: {e}", path.display()),
        }
    }

    /// `--pod-manifest-path`.
    pub(crate) fn manifest_dir(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nodelet.log")
    }

    /// nodelet's output so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read(self.log_path()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// The last `lines` lines of nodelet's output.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    // -------------------------------------------------------------------------------------------- manifests

    /// A pod manifest: `spec` plus the fixture's defaults (DNS to 127.0.0.1 only; every container gets the
    /// busybox image with `IfNotPresent` unless it sets its own).
    pub(crate) fn pod_manifest(&self, name: &str, mut spec: Value) -> Value {
        let image = self.env.busybox.clone();
        if let Some(spec) = spec.as_object_mut() {
            spec.entry("dnsPolicy").or_insert_with(|| json!("None"));
            spec.entry("dnsConfig").or_insert_with(|| json!({"nameservers": ["127.0.0.1"]}));
            for list in ["initContainers", "containers"] {
                for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
                    if let Some(c) = c.as_object_mut() {
                        c.entry("image").or_insert_with(|| json!(image));
                        c.entry("imagePullPolicy").or_insert_with(|| json!("IfNotPresent"));
                    }
                }
            }
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        })
    }

    /// Writes `manifest` (JSON, which is YAML) as `file` in the manifest directory, atomically.
    pub(crate) fn write_manifest(&self, file: &str, manifest: &Value) {
        let text = match serde_json::to_string_pretty(manifest) {
            Ok(t) => t,
            Err(e) => panic!("cannot encode the manifest: {e}"),
        };
        self.write_manifest_text(file, &text);
    }

    /// Writes `text` as `file` in the manifest directory, atomically (through a dotfile nodelet ignores).
    pub(crate) fn write_manifest_text(&self, file: &str, text: &str) {
        let dir = self.manifest_dir();
        let tmp = dir.join(format!(".{file}.tmp"));
        write_file(&tmp, text);
        if let Err(e) = std::fs::rename(&tmp, dir.join(file)) {
            panic!("cannot rename {} into place: {e}", tmp.display());
        }
    }

    /// Removes `file` from the manifest directory.
    pub(crate) fn remove_manifest(&self, file: &str) {
        let path = self.manifest_dir().join(file);
        if let Err(e) = std::fs::remove_file(&path) {
            panic!("cannot remove {}: {e}", path.display());
        }
    }

    // -------------------------------------------------------------------------------------------- the API

    /// `GET /pods` on the read-only port.
    pub(crate) async fn pods(&self) -> List<Pod> {
        let url = format!("http://127.0.0.1:{}/pods", self.ports.read_only);
        let response = match self.http.get(&url).send().await {
            Ok(r) => r,
            Err(e) => panic!("GET {url}: {e}\nnodelet log:\n{}", self.log()),
        };
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        assert!(status.is_success(), "GET {url}: {status}: {}", String::from_utf8_lossy(&body));
        match serde_json::from_slice(&body) {
            Ok(list) => list,
            Err(e) => panic!("GET {url}: not a PodList: {e}: {}", String::from_utf8_lossy(&body)),
        }
    }

    /// The static pod `name` (`<name>-<node>`) as `/pods` shows it now.
    pub(crate) async fn pod(&self, name: &str) -> Option<Pod> {
        let full = self.pod_name(name);
        self.pods().await.items.into_iter().find(|p| p.metadata.name.as_deref() == Some(full.as_str()))
    }

    /// Polls `check` every [`POLL`] until it returns `Some`, for at most `timeout`; panics naming `what`,
    /// with `/pods` and nodelet's log, when it does not.
    pub(crate) async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            if Instant::now() >= deadline {
                let pods = serde_json::to_string_pretty(&self.pods().await).unwrap_or_default();
                let (sandboxes, containers) = node_objects(&self.cri, &self.node).await;
                let runtime = runtime_log_of(&sandboxes, &containers);
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{runtime}/pods:\n{pods}\nnodelet log:\n{}",
                    self.log()
                );
            }
            sleep(POLL).await;
        }
    }

    /// Waits until the static pod `name` satisfies `pred`; returns it.
    pub(crate) async fn wait_for_pod(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Pod) -> bool,
    ) -> Pod {
        let what = format!("pod {}: {what}", self.pod_name(name));
        self.wait_for(&what, timeout, async || self.pod(name).await.filter(|p| pred(p))).await
    }

    /// Waits until the static pod `name` is Running and Ready.
    pub(crate) async fn wait_running(&self, name: &str) -> Pod {
        self.wait_for_pod(name, "Running and Ready", Duration::from_secs(30), |p| {
            phase(p) == "Running" && condition(p, "Ready").is_some_and(|c| c.status == "True")
        })
        .await
    }

    /// An HTTPS client for the main port, trusting nodelet's self-signed certificate.
    pub(crate) fn main_client(&self) -> reqwest::Client {
        let cert_path = self.root_dir().join("pki").join("nodelet.crt");
        let pem = match std::fs::read(&cert_path) {
            Ok(p) => p,
            Err(e) => panic!("cannot read nodelet's certificate {}: {e}", cert_path.display()),
        };
        let cert = match reqwest::Certificate::from_pem(&pem) {
            Ok(c) => c,
            Err(e) => panic!("bad certificate {}: {e}", cert_path.display()),
        };
        match reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .add_root_certificate(cert)
            .build()
        {
            Ok(c) => c,
            Err(e) => panic!("cannot build an HTTPS client: {e}"),
        }
    }

    /// `https://127.0.0.1:<port><path>`.
    pub(crate) fn main_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.ports.main)
    }

    /// `GET <path>` on the main port with the fixture's token: the body of the answer, whatever its status;
    /// `None` when nothing answered. nodelet's own lists (events, nodes, volumes, storage classes, CSI nodes)
    /// are served there only, not on the read-only port.
    pub(crate) async fn main_get_text(&self, path: &str) -> Option<String> {
        let response = self.main_client().get(self.main_url(path)).bearer_auth(TOKEN).send().await.ok()?;
        response.text().await.ok()
    }

    /// `nodelet ARGS… --server <main port> --certificate-authority <its certificate> --token <token>`: the
    /// client commands against the main port (see [`nodelet_cli`]).
    pub(crate) async fn cli_main(&self, args: &[&str]) -> String {
        let server = self.main_url("");
        let ca = self.root_dir().join("pki").join("nodelet.crt");
        let ca = ca.display().to_string();
        let mut all = args.to_vec();
        all.extend(["--server", server.as_str(), "--certificate-authority", ca.as_str(), "--token", TOKEN]);
        nodelet_cli(&all).await
    }

    // -------------------------------------------------------------------------------------------- the runtime

    /// Every sandbox of this node in the runtime (its pods' names end with `-<node>`).
    pub(crate) async fn sandboxes(&self) -> Vec<proto::PodSandbox> {
        match self.cri.list_pod_sandboxes(&SandboxFilter::all()).await {
            Ok(all) => all.into_iter().filter(|s| of_node(&s.labels, &self.node)).collect(),
            Err(e) => panic!("cannot list sandboxes: {e}"),
        }
    }

    /// Every container of this node in the runtime.
    pub(crate) async fn containers(&self) -> Vec<proto::Container> {
        match self.cri.list_containers(&ContainerFilter::all()).await {
            Ok(all) => all.into_iter().filter(|c| of_node(&c.labels, &self.node)).collect(),
            Err(e) => panic!("cannot list containers: {e}"),
        }
    }

    /// The containers of the pod with this UID in the runtime.
    pub(crate) async fn containers_of(&self, uid: &str) -> Vec<proto::Container> {
        match self.cri.list_containers(&ContainerFilter::all().label(labels::POD_UID, uid)).await {
            Ok(all) => all,
            Err(e) => panic!("cannot list containers: {e}"),
        }
    }

    /// The sandboxes of the pod with this UID in the runtime.
    pub(crate) async fn sandboxes_of(&self, uid: &str) -> Vec<proto::PodSandbox> {
        match self.cri.list_pod_sandboxes(&SandboxFilter::all().label(labels::POD_UID, uid)).await {
            Ok(all) => all,
            Err(e) => panic!("cannot list sandboxes: {e}"),
        }
    }

    /// Where the sandbox `id`'s network lives (containerd's verbose `PodSandboxStatus`): its network
    /// namespace file, or `None` for the host's network or when the runtime does not say.
    pub(crate) async fn sandbox_netns(&self, id: &str) -> Option<PathBuf> {
        match self.cri.sandbox_network(id).await {
            Ok(Some(nodelet_cri::SandboxNetwork::Namespace(path))) => Some(path),
            Ok(_) => None,
            Err(e) => panic!("cannot get the network of sandbox {id}: {e}"),
        }
    }

    /// The runtime's status of a container (nanosecond timestamps, exit code).
    pub(crate) async fn container_status(&self, id: &str) -> proto::ContainerStatus {
        match self.cri.container_status(id).await {
            Ok(s) => s,
            Err(e) => panic!("cannot get the status of container {id}: {e}"),
        }
    }

    // -------------------------------------------------------------------------------------------- restart, teardown

    /// Stops nodelet with SIGTERM (its pods keep running) and waits for it to exit; returns how it exited.
    pub(crate) async fn stop(&mut self) -> ExitStatus {
        let Some(child) = self.child.take() else { panic!("nodelet is not running") };
        match terminate(child).await {
            Ok(status) => status,
            Err(e) => panic!("{e}\nnodelet log:\n{}", self.log()),
        }
    }

    /// Kills nodelet with SIGKILL (no cleanup of any kind) and waits for it to exit.
    pub(crate) async fn kill9(&mut self) {
        let Some(mut child) = self.child.take() else { panic!("nodelet is not running") };
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Runs `cmd` in the container `id` (CRI ExecSync, 10 s); returns (exit code, stdout + stderr).
    pub(crate) async fn exec(&self, id: &str, cmd: &[&str]) -> (i32, String) {
        let cmd = cmd.iter().map(|s| (*s).to_owned()).collect();
        match self.cri.exec_sync(id, cmd, Duration::from_secs(10)).await {
            Ok(out) => (out.exit_code, format!("{}{}", out.stdout_lossy(), out.stderr_lossy())),
            Err(e) => panic!("exec in container {id}: {e}"),
        }
    }

    /// Starts nodelet again with the same directories, node name and ports (after [`stop`](Self::stop)).
    pub(crate) async fn start_again(&mut self) {
        assert!(self.child.is_none(), "nodelet is still running");
        self.launch().await;
    }

    /// Tears everything down (see the [module docs](self)) and asserts that nodelet itself removed every pod
    /// of this node from the runtime once its manifest was gone.
    pub(crate) async fn shutdown(mut self) {
        self.torn_down = true;
        let report = teardown(self.teardown_input(), self.child.take()).await;
        if let Some(problem) = report {
            panic!("teardown: {problem}\nnodelet log:\n{}", self.log());
        }
    }

    fn teardown_input(&self) -> TeardownInput {
        TeardownInput {
            node: self.node.clone(),
            endpoint: self.env.endpoint.clone(),
            manifests: self.manifest_dir(),
            read_only_port: self.ports.read_only,
        }
    }
}

impl Drop for Nodelet {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        if std::thread::panicking() {
            eprintln!("---- nodelet log ({}):\n{}\n---- end of nodelet log", self.node, self.log());
        }
        let input = self.teardown_input();
        let child = self.child.take();
        // The test's runtime is blocked here (and may be unwinding): a fresh one on another thread.
        let worker = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return Some(format!("cannot build a runtime for the teardown: {e}")),
            };
            rt.block_on(teardown(input, child))
        });
        match worker.join() {
            Ok(None) => {}
            Ok(Some(problem)) => eprintln!("teardown guard: {problem}"),
            Err(_) => eprintln!("teardown guard: the teardown thread panicked"),
        }
    }
}

/// What [`teardown`] needs, owned (it may run on another thread and runtime).
struct TeardownInput {
    node: String,
    endpoint: String,
    manifests: PathBuf,
    read_only_port: u16,
}

/// Removes the manifests, waits for nodelet to remove the pods, removes what is left, stops nodelet.
/// Returns what went wrong (leftovers nodelet did not remove, a nodelet that would not stop).
async fn teardown(input: TeardownInput, mut child: Option<Child>) -> Option<String> {
    let mut problems = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&input.manifests) {
        for entry in entries.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let cri = match CriClient::connect(cri_config(&input.endpoint)).await {
        Ok(c) => c,
        Err(e) => return Some(format!("cannot connect to {}: {e}", input.endpoint)),
    };
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(3)).build().ok();
    let alive = |child: &mut Option<Child>| child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)));
    let deadline = Instant::now() + TEARDOWN_WAIT;
    while alive(&mut child) {
        let pods = match &http {
            Some(http) => pods_left(http, input.read_only_port).await,
            None => None,
        };
        let (sandboxes, containers) = node_objects(&cri, &input.node).await;
        if pods == Some(0) && sandboxes.is_empty() && containers.is_empty() {
            break;
        }
        let last = format!(
            "/pods lists {pods:?} pods, the runtime has sandboxes {:?} and containers {:?}",
            sandboxes.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            containers.iter().map(|c| c.id.as_str()).collect::<Vec<_>>()
        );
        if Instant::now() >= deadline {
            let runtime = runtime_log_of(&sandboxes, &containers);
            problems.push(format!("{TEARDOWN_WAIT:?} after the manifests were removed, {last}\n{runtime}"));
            break;
        }
        sleep(Duration::from_millis(200)).await;
    }
    if child.is_none() {
        problems.push("nodelet was not running at teardown".to_owned());
    } else if !alive(&mut child) {
        problems.push("nodelet exited before teardown".to_owned());
    }
    // Stop nodelet first, so that it does not start again what is removed next.
    if let Some(c) = child
        && let Err(e) = terminate(c).await
    {
        problems.push(e);
    }
    let left = force_remove(&cri, &input.node).await;
    if !left.is_empty() && problems.is_empty() {
        problems.push(format!("nodelet left {left:?} behind"));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// How many pods `/pods` lists; `None` if it cannot be read.
async fn pods_left(http: &reqwest::Client, port: u16) -> Option<usize> {
    let response = http.get(format!("http://127.0.0.1:{port}/pods")).send().await.ok()?;
    let list: List<Pod> = serde_json::from_slice(&response.bytes().await.ok()?).ok()?;
    Some(list.items.len())
}

/// What the runtime's log (`NODELET_TEST_CONTAINERD_LOG`) says of `sandboxes` and `containers`: its last
/// lines that name one, for a failure message (it comes before nodelet's log, which is long). Empty when
/// there are none or no log.
fn runtime_log_of(sandboxes: &[proto::PodSandbox], containers: &[proto::Container]) -> String {
    use std::io::BufRead;
    const LINES: usize = 30;
    let ids: Vec<&str> =
        sandboxes.iter().map(|s| s.id.as_str()).chain(containers.iter().map(|c| c.id.as_str())).collect();
    if ids.is_empty() {
        return String::new();
    }
    let Some(path) = var("NODELET_TEST_CONTAINERD_LOG") else { return String::new() };
    let Ok(file) = std::fs::File::open(&path) else { return String::new() };
    let mut last = std::collections::VecDeque::with_capacity(LINES);
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        if ids.iter().any(|id| line.contains(id)) {
            if last.len() == LINES {
                last.pop_front();
            }
            last.push_back(line.chars().take(400).collect::<String>());
        }
    }
    let mut out = format!("the runtime's log ({path}) of what is left, last {LINES} lines:\n");
    for line in last {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The sandboxes and containers of `node` in the runtime (empty if the runtime cannot be asked).
async fn node_objects(cri: &CriClient, node: &str) -> (Vec<proto::PodSandbox>, Vec<proto::Container>) {
    let sandboxes = cri.list_pod_sandboxes(&SandboxFilter::all()).await.unwrap_or_default();
    let containers = cri.list_containers(&ContainerFilter::all()).await.unwrap_or_default();
    (
        sandboxes.into_iter().filter(|s| of_node(&s.labels, node)).collect(),
        containers.into_iter().filter(|c| of_node(&c.labels, node)).collect(),
    )
}

/// Removes every container and sandbox of `node`; returns the IDs it removed.
async fn force_remove(cri: &CriClient, node: &str) -> Vec<String> {
    let (sandboxes, containers) = node_objects(cri, node).await;
    let mut removed = Vec::new();
    for c in containers {
        let _ = cri.stop_container(&c.id, Duration::ZERO).await;
        let _ = cri.remove_container(&c.id).await;
        removed.push(format!("container {}", c.id));
    }
    for s in sandboxes {
        let _ = cri.stop_pod_sandbox(&s.id).await;
        let _ = cri.remove_pod_sandbox(&s.id).await;
        removed.push(format!("sandbox {}", s.id));
    }
    removed
}

/// SIGTERM, then SIGKILL after [`EXIT_WAIT`]; waits for the exit.
async fn terminate(mut child: Child) -> Result<ExitStatus, String> {
    if let Ok(Some(status)) = child.try_wait() {
        return Ok(status);
    }
    let pid = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => sleep(Duration::from_millis(50)).await,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("nodelet did not exit within {EXIT_WAIT:?} of SIGTERM; killed it"));
            }
            Err(e) => return Err(format!("cannot wait for nodelet: {e}")),
        }
    }
}

/// Whether labels name a pod of `node`: static pods are named `<name>-<node>`; pods from the API server
/// (cluster tests) are recognised by nodelet's node label.
fn of_node(labels: &HashMap<String, String>, node: &str) -> bool {
    labels.get(labels::POD_NAME).is_some_and(|name| name.ends_with(&format!("-{node}")))
        || labels.get(labels::NODE).is_some_and(|n| n == node)
}

/// Removes the pods of fixture nodes whose test process is gone (a test binary killed by a timeout leaves its
/// pods running: nodelet keeps pods across its own exit).
async fn sweep_leftovers(endpoint: &str) {
    let Ok(cri) = CriClient::connect(cri_config(endpoint)).await else { return };
    let Ok(sandboxes) = cri.list_pod_sandboxes(&SandboxFilter::managed()).await else { return };
    for s in sandboxes {
        let Some(node) = s.labels.get(labels::NODE) else { continue };
        let Some(rest) = node.strip_prefix(NODE_PREFIX) else { continue };
        // e2e-<hint>-<pid>-<n>
        let mut parts = rest.rsplit('-');
        let (_n, pid) = (parts.next(), parts.next().and_then(|p| p.parse::<u32>().ok()));
        let Some(pid) = pid else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        eprintln!("removing sandbox {} of node {node}, left behind by a dead test process", s.id);
        if let Ok(containers) =
            cri.list_containers(&ContainerFilter::all().pod_sandbox_id(s.id.clone())).await
        {
            for c in containers {
                let _ = cri.remove_container(&c.id).await;
            }
        }
        let _ = cri.stop_pod_sandbox(&s.id).await;
        let _ = cri.remove_pod_sandbox(&s.id).await;
    }
}

// ------------------------------------------------------------------------------------------------ pod helpers

/// `status.phase` ("" when unset).
pub(crate) fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// The condition `kind` of the pod.
pub(crate) fn condition<'a>(pod: &'a Pod, kind: &str) -> Option<&'a PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind)
}

/// The status of app container `name`.
pub(crate) fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

/// The status of init container `name`.
pub(crate) fn init_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status.as_ref()?.init_container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

/// The pod's UID.
pub(crate) fn uid(pod: &Pod) -> String {
    match pod.metadata.uid.clone() {
        Some(u) if !u.is_empty() => u,
        _ => panic!("pod {:?} has no UID", pod.metadata.name),
    }
}

/// The pod's IP, which must be in the pod network 198.18.0.0/16 (the only network tests may reach).
pub(crate) fn pod_ip(pod: &Pod) -> Ipv4Addr {
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).unwrap_or_default();
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) if v4.octets()[..2] == [198, 18] => v4,
        _ => panic!("pod IP {ip:?} is not in the pod network 198.18.0.0/16"),
    }
}

/// The runtime container ID of a status (`containerd://<id>` → `<id>`).
pub(crate) fn runtime_id(status: &ContainerStatus) -> String {
    let id = status.container_id.as_deref().unwrap_or_default();
    match id.strip_prefix("containerd://") {
        Some(rest) if !rest.is_empty() => rest.to_owned(),
        _ => panic!("container {} has no containerd:// ID: {id:?}", status.name),
    }
}

/// A container's exit, if it terminated: (exit code, reason).
pub(crate) fn terminated(status: &ContainerStatus) -> Option<(i32, String)> {
    let t = status.state.as_ref()?.terminated.as_ref()?;
    Some((t.exit_code, t.reason.clone().unwrap_or_default()))
}

/// The waiting reason and message, if the container waits.
pub(crate) fn waiting(status: &ContainerStatus) -> Option<(String, String)> {
    let w = status.state.as_ref()?.waiting.as_ref()?;
    Some((w.reason.clone().unwrap_or_default(), w.message.clone().unwrap_or_default()))
}

/// The CRI state a container is in, as the enum.
pub(crate) fn cri_state(c: &proto::Container) -> proto::ContainerState {
    proto::ContainerState::try_from(c.state).unwrap_or(proto::ContainerState::ContainerUnknown)
}

/// A command that runs until SIGTERM and then exits at once (PID 1 ignores signals it has no handler for).
pub(crate) fn sleep_until_term(prefix: &str) -> Value {
    json!(["sh", "-c", format!("{prefix}trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done")])
}

/// Runs `nodelet ARGS…`; returns its stdout, asserting success.
pub(crate) async fn nodelet_cli(args: &[&str]) -> String {
    let output = tokio::process::Command::new(nodelet_binary())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("NODELET_POD_LOGS_DIR")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run nodelet {args:?}: {e}"));
    assert!(
        output.status.success(),
        "nodelet {args:?}: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn mkdir(path: &Path) {
    if let Err(e) = std::fs::create_dir_all(path) {
        panic!("cannot create {}: {e}", path.display());
    }
}

fn write_file(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("cannot write {}: {e}", path.display());
    }
}

// ------------------------------------------------------------------------------------------------ hostile input

/// VmHWM (peak resident set size) of the process `pid` in KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM for pid {pid}"))
}

impl Nodelet {
    /// What every hostile-input case asserts of the daemon at its end: it still runs, and its peak RSS
    /// (VmHWM, since this process started) stayed under `bound_mib`. Returns the peak in KiB.
    pub(crate) fn assert_alive_within(&mut self, bound_mib: u64, case: &str) -> u64 {
        if let Some(status) = self.exit_status() {
            panic!("{case}: nodelet exited ({status})\n{}", self.log_tail(40));
        }
        let pid = self.pid().unwrap_or_else(|| panic!("{case}: nodelet has no pid"));
        let peak = peak_rss_kib(pid);
        eprintln!("{case}: nodelet's peak RSS {:.1} MiB (bound {bound_mib} MiB)", peak as f64 / 1024.0);
        assert!(
            peak < bound_mib * 1024,
            "{case}: nodelet's peak RSS reached {:.1} MiB (bound {bound_mib} MiB)",
            peak as f64 / 1024.0
        );
        peak
    }

    /// Whether the runtime's image filesystem (which holds the containers' writable layers) is another
    /// filesystem than nodelet's root directory, found as nodelet finds it: the mountpoint CRI
    /// `ImageFsInfo` gives for the container (else the image) filesystem, compared by device.
    pub(crate) async fn dedicated_image_fs(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let info = self.cri.image_fs_info().await.unwrap_or_else(|e| panic!("ImageFsInfo: {e}"));
        let fs = info.container_filesystems.first().or(info.image_filesystems.first());
        let mountpoint = fs
            .and_then(|f| f.fs_id.as_ref())
            .map(|id| PathBuf::from(&id.mountpoint))
            .unwrap_or_else(|| panic!("ImageFsInfo names no filesystem: {info:?}"));
        let device = |p: &Path| match std::fs::metadata(p) {
            Ok(m) => m.dev(),
            Err(e) => panic!("{}: {e}", p.display()),
        };
        device(&mountpoint) != device(&self.root_dir())
    }

    /// Asserts that the static pod `name` still runs as `before` showed it: the same UID, the same
    /// containers (runtime IDs) and no restart.
    pub(crate) async fn assert_untouched(&self, name: &str, before: &Pod) {
        let after = self.pod(name).await.unwrap_or_else(|| panic!("the healthy pod {name} is gone"));
        assert_eq!(phase(&after), "Running", "the healthy pod {name}: {:?}", after.status);
        assert_eq!(uid(&after), uid(before), "the healthy pod {name} was replaced");
        let ids = |p: &Pod| -> Vec<(String, String, i32)> {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| cs.iter().map(|c| (c.name.clone(), runtime_id(c), c.restart_count)).collect())
                .unwrap_or_default()
        };
        let now = ids(&after);
        assert_eq!(now, ids(before), "the healthy pod {name}'s containers changed");
        assert!(
            now.iter().all(|(_, _, restarts)| *restarts == 0),
            "the healthy pod {name} restarted: {now:?}"
        );
    }
}

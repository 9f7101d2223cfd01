//! The cluster-mode fixture: a real nodelet ([`Nodelet`]) registered with a real Kubernetes v1.28.7 control
//! plane (envtest: etcd + kube-apiserver, with `ENVTEST_CONTROLLERS=1` also kube-controller-manager and
//! kube-scheduler; see `../shared/envtest/README.md`).
//!
//! `scripts/test.sh` starts one control plane for the whole suite and exports:
//!
//! | variable | use |
//! |---|---|
//! | `NODELET_TEST_ENVTEST_ENV` | the `env.sh` that `start.sh` wrote (`APISERVER_URL`, `APISERVER_CA`, `ADMIN_KUBECONFIG`, `KUBEBUILDER_ASSETS`, `ENVTEST_BASE`); unset → the cluster tests print a skip note and pass, unless `NODELET_REQUIRE_CLUSTER=1`, then they panic |
//! | `NODELET_TEST_ENVTEST_SCRIPTS` | the directory of `start.sh`, `stop.sh`, `mint-node-kubeconfig.sh` |
//! | `NODELET_REQUIRE_CLUSTER` | `1`: a missing control plane is a failure |
//!
//! [`ClusterNode::start`] mints a client certificate for `system:node:<node>` (`mint-node-kubeconfig.sh`),
//! starts nodelet with `--kubeconfig` and `--node-ip 127.0.0.1` (the API server reaches the node on loopback
//! only) and a fast lease / status cadence, and creates a namespace of the test's own (named like the node).
//! Every API read of the tests goes through an admin client.
//!
//! Teardown (happy path: [`ClusterNode::shutdown`], on a panic: the [`Drop`] guard): delete the namespace's
//! Deployments, ReplicaSets and pods (grace 0) and wait until the API lists none, then the fixture's normal
//! teardown (it waits until nodelet removed every pod from the runtime, then stops nodelet), then delete what
//! a stopped nodelet leaves in the API: pods still bound to the node (mirror pods), the Node, its Lease and
//! the namespace. The shared control plane so never accumulates Ready nodes that would get other tests' pods.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsFd;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::time::{Instant, sleep};

use crate::support::{Env, Nodelet, StartOptions, node_name};

/// How often the cluster `wait` helpers poll the API server.
pub(crate) const API_POLL: Duration = Duration::from_millis(300);
/// `nodeLeaseDurationSeconds` of every cluster test's nodelet (renewals every quarter of it).
pub(crate) const LEASE_DURATION_SECONDS: i32 = 8;
/// `nodeStatusUpdateFrequency` of every cluster test's nodelet.
pub(crate) const STATUS_UPDATE_FREQUENCY: &str = "2s";
/// How many lines of nodelet's log a failure message quotes.
const LOG_TAIL: usize = 120;
/// How long teardown waits for the API server to list no pod of the test namespace.
const API_TEARDOWN_WAIT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------------------------------------ environment

/// A control plane to test against (from the `env.sh` that envtest's `start.sh` writes). Its `Debug`
/// leaves the admin token out.
#[derive(Clone)]
pub(crate) struct ClusterEnv {
    /// `ENVTEST_BASE`: the control plane's state, PKI, pid files, logs.
    pub(crate) base: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub(crate) apiserver_url: String,
    /// The CA of the API server's certificate.
    pub(crate) ca: PathBuf,
    /// A kubeconfig of a `system:masters` user.
    pub(crate) admin_kubeconfig: PathBuf,
    /// `ADMIN_TOKEN`: a static bearer token of the API server, user `admin` in group `system:masters`.
    pub(crate) admin_token: String,
    /// `KUBEBUILDER_ASSETS`: kube-apiserver, etcd, kubectl (and maybe the controller manager and scheduler).
    pub(crate) assets: PathBuf,
    /// The envtest scripts (`start.sh`, `stop.sh`, `mint-node-kubeconfig.sh`).
    pub(crate) scripts: PathBuf,
}

impl std::fmt::Debug for ClusterEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterEnv")
            .field("base", &self.base)
            .field("apiserver_url", &self.apiserver_url)
            .field("ca", &self.ca)
            .field("admin_kubeconfig", &self.admin_kubeconfig)
            .field("assets", &self.assets)
            .field("scripts", &self.scripts)
            .finish_non_exhaustive()
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The `export K="V"` lines of an `env.sh` (no shell involved; values without quotes are taken as they are).
pub(crate) fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("export ") else { continue };
        let Some((key, value)) = rest.split_once('=') else { continue };
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        vars.insert(key.trim().to_owned(), value.to_owned());
    }
    vars
}

impl ClusterEnv {
    /// Reads the `env.sh` at `path`; panics when it cannot be read or lacks a variable.
    pub(crate) fn from_env_file(path: &Path, scripts: PathBuf) -> ClusterEnv {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => panic!("cannot read the envtest env file {}: {e}", path.display()),
        };
        let vars = parse_env_file(&text);
        let get = |k: &str| match vars.get(k) {
            Some(v) if !v.is_empty() => v.clone(),
            _ => panic!("{} does not export {k}:\n{text}", path.display()),
        };
        let env = ClusterEnv {
            base: PathBuf::from(get("ENVTEST_BASE")),
            apiserver_url: get("APISERVER_URL"),
            ca: PathBuf::from(get("APISERVER_CA")),
            admin_kubeconfig: PathBuf::from(get("ADMIN_KUBECONFIG")),
            admin_token: get("ADMIN_TOKEN"),
            assets: PathBuf::from(get("KUBEBUILDER_ASSETS")),
            scripts,
        };
        // The tests talk to loopback only.
        assert!(
            env.apiserver_url.starts_with("https://127.0.0.1:"),
            "{}: APISERVER_URL {} is not on loopback",
            path.display(),
            env.apiserver_url
        );
        for file in [&env.ca, &env.admin_kubeconfig] {
            assert!(file.is_file(), "{}: {} does not exist", path.display(), file.display());
        }
        env
    }

    /// `$KUBEBUILDER_ASSETS/kubectl`.
    pub(crate) fn kubectl(&self) -> PathBuf {
        self.assets.join("kubectl")
    }

    /// Whether this control plane runs kube-controller-manager and kube-scheduler (alive per their pid
    /// files); `Err` says what is missing.
    pub(crate) fn controllers_running(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        for name in ["kube-controller-manager", "kube-scheduler"] {
            let pid_file = self.base.join("run").join(format!("{name}.pid"));
            let pid = std::fs::read_to_string(&pid_file).unwrap_or_default();
            let pid = pid.trim();
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let alive = !pid.is_empty() && exe.file_name().is_some_and(|f| f == name);
            if !alive {
                missing.push(format!("{name} (pid file {}: {pid:?})", pid_file.display()));
            }
        }
        if missing.is_empty() { Ok(()) } else { Err(format!("not running: {}", missing.join(", "))) }
    }
}

/// The control plane to test against; `None` (after a skip note) when none is configured, unless
/// `NODELET_REQUIRE_CLUSTER=1`, then it panics.
pub(crate) fn cluster_env(test: &str) -> Option<ClusterEnv> {
    let Some(file) = var("NODELET_TEST_ENVTEST_ENV") else {
        if var("NODELET_REQUIRE_CLUSTER").as_deref() == Some("1") {
            panic!(
                "NODELET_REQUIRE_CLUSTER=1 but NODELET_TEST_ENVTEST_ENV is unset: start a control plane with \
                 ../shared/envtest/start.sh (scripts/test.sh does) and export NODELET_TEST_ENVTEST_ENV=<its env.sh>"
            );
        }
        eprintln!(
            "SKIP {test}: NODELET_TEST_ENVTEST_ENV is unset (no Kubernetes control plane to test against; \
             scripts/test.sh starts one when envtest assets exist)"
        );
        return None;
    };
    let Some(scripts) = var("NODELET_TEST_ENVTEST_SCRIPTS") else {
        panic!(
            "NODELET_TEST_ENVTEST_ENV is set but NODELET_TEST_ENVTEST_SCRIPTS is not: set it to the directory of \
             envtest's start.sh and mint-node-kubeconfig.sh"
        );
    };
    Some(ClusterEnv::from_env_file(Path::new(&file), PathBuf::from(scripts)))
}

/// `let (env, cluster) = cluster_or_skip!("name");`: the runtime and the control plane, or return from the
/// test after a skip note (each one panics instead when required).
macro_rules! cluster_or_skip {
    ($test:expr) => {
        match ($crate::support::runtime_env($test), $crate::cluster_support::cluster_env($test)) {
            (Some(env), Some(cluster)) => (env, cluster),
            _ => return,
        }
    };
}
pub(crate) use cluster_or_skip;

/// A client of the control plane with the admin kubeconfig.
pub(crate) async fn try_admin_client(env: &ClusterEnv) -> Result<kube::Client, String> {
    let path = &env.admin_kubeconfig;
    let kubeconfig =
        Kubeconfig::read_from(path).map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("bad kubeconfig {}: {e}", path.display()))?;
    kube::Client::try_from(config).map_err(|e| format!("cannot build a client from {}: {e}", path.display()))
}

/// [`try_admin_client`], panicking on failure.
pub(crate) async fn admin_client(env: &ClusterEnv) -> kube::Client {
    match try_admin_client(env).await {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// Writes a kubeconfig for `system:node:<node>` to `out` with envtest's `mint-node-kubeconfig.sh`.
///
/// The script signs with `openssl x509 -CAcreateserial`, which rewrites `pki/ca.srl` of the control plane:
/// parallel tests take turns through an advisory lock on `$ENVTEST_BASE/mint.lock`.
pub(crate) async fn mint_node_kubeconfig(env: &ClusterEnv, node: &str, out: &Path) {
    let script = env.scripts.join("mint-node-kubeconfig.sh");
    let lock_path = env.base.join("mint.lock");
    let lock = match std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path) {
        Ok(f) => f,
        Err(e) => panic!("cannot open {}: {e}", lock_path.display()),
    };
    let locked = tokio::task::spawn_blocking(move || {
        rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive).map(|()| lock)
    })
    .await;
    let _lock = match locked {
        Ok(Ok(lock)) => lock,
        Ok(Err(e)) => panic!("cannot lock {}: {e}", lock_path.display()),
        Err(e) => panic!("the lock task failed: {e}"),
    };
    let output = tokio::process::Command::new(&script)
        .arg(node)
        .arg(out)
        .env("ENVTEST_BASE", &env.base)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success() && out.is_file(),
        "{} {node} {}: {}: {}",
        script.display(),
        out.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Start options that let the API server reach the node's main port as the kubelet allows it (for
/// `kubectl exec`, `logs`, `port-forward`): its kubelet client certificate is signed by envtest's CA,
/// nodelet's client CA; other callers go through TokenReview and SubjectAccessReview.
pub(crate) fn api_server_client_options(cluster: &ClusterEnv) -> crate::support::StartOptions {
    crate::support::StartOptions {
        config_extra: format!(
            "authentication:\n  x509: {{clientCAFile: {}}}\n  webhook: {{enabled: true, cacheTTL: 30s}}\n\
             authorization:\n  mode: Webhook\n  webhook: {{cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 1s}}",
            cluster.ca.display()
        ),
        ..crate::support::StartOptions::default()
    }
}

/// Runs `kubectl --kubeconfig <admin> ARGS…` (stdin from `input` when given); returns (success, stdout,
/// stderr). Proxy variables are removed: it talks to the loopback API server only.
pub(crate) async fn kubectl(env: &ClusterEnv, args: &[&str], input: Option<&str>) -> (bool, String, String) {
    let kubectl = env.kubectl();
    let mut cmd = tokio::process::Command::new(&kubectl);
    cmd.arg("--kubeconfig").arg(&env.admin_kubeconfig).args(args).env_remove("KUBECONFIG");
    for proxy in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        cmd.env_remove(proxy);
    }
    cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("cannot run {} {args:?}: {e}", kubectl.display()),
    };
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        if let Err(e) = stdin.write_all(text.as_bytes()).await {
            panic!("cannot write to kubectl's stdin: {e}");
        }
        drop(stdin);
    }
    let output = match tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => panic!("kubectl {args:?}: {e}"),
        Err(_) => panic!("kubectl {args:?} did not finish within 60 s"),
    };
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs an interactive `kubectl --kubeconfig <admin> ARGS…` (`attach`, `debug -i`): writes `input` to its
/// stdin and keeps stdin open until its stdout shows `until` (60 s at most), then closes it (containerd
/// 1.6 ends an attach session as soon as the client's stdin ends, losing output still on its way); returns
/// (success, stdout, stderr).
pub(crate) async fn kubectl_holding_stdin(
    env: &ClusterEnv,
    args: &[&str],
    input: &str,
    until: &str,
) -> (bool, String, String) {
    use tokio::io::AsyncReadExt as _;
    let kubectl = env.kubectl();
    let mut cmd = tokio::process::Command::new(&kubectl);
    cmd.arg("--kubeconfig").arg(&env.admin_kubeconfig).args(args).env_remove("KUBECONFIG");
    for proxy in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        cmd.env_remove(proxy);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("cannot run {} {args:?}: {e}", kubectl.display()),
    };
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        panic!("kubectl {args:?}: no pipes");
    };
    if let Err(e) = stdin.write_all(input.as_bytes()).await {
        panic!("cannot write to kubectl's stdin: {e}");
    }
    let errors = tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text).await;
        String::from_utf8_lossy(&text).into_owned()
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut stdin = Some(stdin);
    loop {
        if stdin.is_some() && String::from_utf8_lossy(&out).contains(until) {
            stdin = None;
        }
        match tokio::time::timeout_at(deadline, stdout.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "kubectl {args:?} did not finish within 60 s; stdout so far {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    drop(stdin);
    let status = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => panic!("kubectl {args:?}: {e}"),
        Err(_) => panic!("kubectl {args:?} did not exit within 60 s"),
    };
    let err = errors.await.unwrap_or_default();
    (status.success(), String::from_utf8_lossy(&out).into_owned(), err)
}

/// The API error's HTTP code, if it is an error status of the API server.
pub(crate) fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// An object as pretty JSON without `metadata.managedFields`, for failure messages.
pub(crate) fn pretty<T: serde::Serialize>(value: &T) -> String {
    let mut json = match serde_json::to_value(value) {
        Ok(v) => v,
        Err(e) => return format!("<cannot encode: {e}>"),
    };
    let strip = |v: &mut Value| {
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    };
    strip(&mut json);
    for item in json.as_array_mut().into_iter().flatten() {
        strip(item);
    }
    serde_json::to_string_pretty(&json).unwrap_or_else(|e| format!("<cannot encode: {e}>"))
}

// ------------------------------------------------------------------------------------------------ the fixture

/// A nodelet in cluster mode, registered as Node `<node>` with its own identity; dereferences to the
/// [`Nodelet`] fixture. See the [module docs](self).
pub(crate) struct ClusterNode {
    nodelet: Option<Nodelet>,
    cluster: ClusterEnv,
    client: kube::Client,
    namespace: String,
    /// Holds the node's kubeconfig.
    _secrets: tempfile::TempDir,
    torn_down: bool,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("nodelet", &self.nodelet)
            .field("cluster", &self.cluster)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Deref for ClusterNode {
    type Target = Nodelet;
    fn deref(&self) -> &Nodelet {
        match &self.nodelet {
            Some(n) => n,
            None => panic!("the nodelet fixture is gone (after teardown)"),
        }
    }
}

impl DerefMut for ClusterNode {
    fn deref_mut(&mut self) -> &mut Nodelet {
        match &mut self.nodelet {
            Some(n) => n,
            None => panic!("the nodelet fixture is gone (after teardown)"),
        }
    }
}

impl ClusterNode {
    /// Starts nodelet in cluster mode for the test `hint` against `cluster`.
    pub(crate) async fn start(env: &Env, cluster: &ClusterEnv, hint: &str) -> ClusterNode {
        ClusterNode::start_with(env, cluster, hint, StartOptions::default()).await
    }

    /// [`start`](Self::start) with more settings (`extra_args` come after the cluster ones).
    pub(crate) async fn start_with(
        env: &Env,
        cluster: &ClusterEnv,
        hint: &str,
        options: StartOptions,
    ) -> ClusterNode {
        ClusterNode::start_with_credentials(env, cluster, hint, options, async |cluster, node, dir| {
            let kubeconfig = dir.join("node.kubeconfig");
            mint_node_kubeconfig(cluster, node, &kubeconfig).await;
            vec!["--kubeconfig".to_owned(), kubeconfig.display().to_string()]
        })
        .await
    }

    /// [`start_with`](Self::start_with), the credential flags (`--kubeconfig`, `--bootstrap-kubeconfig`)
    /// from `credentials(cluster, node, secrets_dir)` instead of a minted node kubeconfig.
    pub(crate) async fn start_with_credentials(
        env: &Env,
        cluster: &ClusterEnv,
        hint: &str,
        mut options: StartOptions,
        credentials: impl AsyncFnOnce(&ClusterEnv, &str, &Path) -> Vec<String>,
    ) -> ClusterNode {
        let node = options.node_name.clone().unwrap_or_else(|| node_name(hint));
        let secrets = match tempfile::Builder::new().prefix("nodelet-e2e-kubeconfig-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("cannot create a temporary directory: {e}"),
        };
        let client = admin_client(cluster).await;
        let mut args = credentials(cluster, &node, secrets.path()).await;
        args.extend(["--node-ip".to_owned(), "127.0.0.1".to_owned()]);
        args.append(&mut options.extra_args);
        options.extra_args = args;
        options.config_extra = format!(
            "nodeLeaseDurationSeconds: {LEASE_DURATION_SECONDS}\nnodeStatusUpdateFrequency: \
             {STATUS_UPDATE_FREQUENCY}\n{}",
            options.config_extra
        );
        options.node_name = Some(node.clone());
        let nodelet = Nodelet::start_with(env, hint, options).await;
        let fixture = ClusterNode {
            nodelet: Some(nodelet),
            cluster: cluster.clone(),
            client,
            namespace: node,
            _secrets: secrets,
            torn_down: false,
        };
        fixture.create_namespace().await;
        fixture
    }

    async fn create_namespace(&self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = match serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {"e2e.nodelet.io/node": self.node()}},
        })) {
            Ok(ns) => ns,
            Err(e) => panic!("bad namespace object: {e}"),
        };
        if let Err(e) = namespaces.create(&PostParams::default(), &ns).await {
            panic!("cannot create namespace {}: {e}", self.namespace);
        }
        // The ServiceAccount admission plugin refuses pods whose service account does not exist; without a
        // controller manager nobody else creates `default` (and with one, it may come late).
        let sa: ServiceAccount = match serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": self.namespace},
        })) {
            Ok(sa) => sa,
            Err(e) => panic!("bad service account object: {e}"),
        };
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace);
        match accounts.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(409) => {}
            Err(e) => panic!("cannot create service account {}/default: {e}", self.namespace),
        }
    }

    /// The admin client.
    pub(crate) fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The control plane this node belongs to.
    pub(crate) fn cluster(&self) -> &ClusterEnv {
        &self.cluster
    }

    /// An HTTPS client for nodelet's main port (trusting its self-signed certificate) that presents the
    /// client certificate and key of `identity_pem` (PEM: key and certificate), or none.
    pub(crate) fn main_client_with(&self, identity_pem: Option<&[u8]>) -> reqwest::Client {
        let cert_path = self.root_dir().join("pki").join("nodelet.crt");
        let pem = match std::fs::read(&cert_path) {
            Ok(p) => p,
            Err(e) => panic!("cannot read nodelet's certificate {}: {e}", cert_path.display()),
        };
        let cert = match reqwest::Certificate::from_pem(&pem) {
            Ok(c) => c,
            Err(e) => panic!("bad certificate {}: {e}", cert_path.display()),
        };
        let mut builder =
            reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).add_root_certificate(cert);
        if let Some(identity) = identity_pem {
            match reqwest::Identity::from_pem(identity) {
                Ok(id) => builder = builder.identity(id),
                Err(e) => panic!("bad client identity: {e}"),
            }
        }
        match builder.build() {
            Ok(c) => c,
            Err(e) => panic!("cannot build an HTTPS client: {e}"),
        }
    }

    /// The test's namespace (named like the node).
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Pods of the test's namespace.
    pub(crate) fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// `kubectl` with the admin kubeconfig.
    pub(crate) async fn kubectl(&self, args: &[&str], input: Option<&str>) -> (bool, String, String) {
        kubectl(&self.cluster, args, input).await
    }

    /// The tail of nodelet's log, for failure messages.
    pub(crate) fn tail(&self) -> String {
        format!("---- last {LOG_TAIL} lines of nodelet.log:\n{}\n---- end", self.log_tail(LOG_TAIL))
    }

    /// A pod for the test's namespace, bound to this node: the fixture's defaults (busybox image,
    /// `IfNotPresent`, DNS 127.0.0.1 only), `automountServiceAccountToken: false` (unless `spec` sets it:
    /// most tests need no token) and a grace period of 2 s unless `spec` sets them.
    pub(crate) fn api_pod_manifest(&self, name: &str, spec: Value) -> Value {
        let mut manifest = self.pod_manifest(name, spec);
        manifest["metadata"]["namespace"] = json!(self.namespace);
        if let Some(spec) = manifest["spec"].as_object_mut() {
            spec.entry("nodeName").or_insert_with(|| json!(self.node()));
            spec.entry("automountServiceAccountToken").or_insert_with(|| json!(false));
            spec.entry("terminationGracePeriodSeconds").or_insert_with(|| json!(2));
        }
        manifest
    }

    /// Creates `manifest` (a Pod, JSON) through the API in the test's namespace; returns the created pod.
    pub(crate) async fn create_pod(&self, manifest: &Value) -> Pod {
        let pod: Pod = match serde_json::from_value(manifest.clone()) {
            Ok(p) => p,
            Err(e) => panic!("not a Pod: {e}: {manifest}"),
        };
        match self.pods_api().create(&PostParams::default(), &pod).await {
            Ok(p) => p,
            Err(e) => panic!("cannot create pod {}: {e}\n{}", pretty(manifest), self.tail()),
        }
    }

    /// The pod `name` of the test's namespace, as the API server has it now.
    pub(crate) async fn api_pod(&self, name: &str) -> Option<Pod> {
        match self.pods_api().get_opt(name).await {
            Ok(p) => p,
            Err(e) => panic!("GET pod {}/{name}: {e}", self.namespace),
        }
    }

    /// The Node object of this nodelet, if it exists.
    pub(crate) async fn node_object(&self) -> Option<Node> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        match nodes.get_opt(self.node()).await {
            Ok(n) => n,
            Err(e) => panic!("GET node {}: {e}", self.node()),
        }
    }

    /// The Lease `kube-node-lease/<node>`, if it exists.
    pub(crate) async fn lease(&self) -> Option<Lease> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        match leases.get_opt(self.node()).await {
            Ok(l) => l,
            Err(e) => panic!("GET lease kube-node-lease/{}: {e}", self.node()),
        }
    }

    /// Polls `check` every [`API_POLL`] until it returns `Ok`, for at most `timeout`; `Err` describes what it
    /// saw last (e.g. the API object), which the panic quotes with the tail of nodelet's log.
    pub(crate) async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl AsyncFnMut() -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match check().await {
                Ok(v) => return v,
                Err(last) => last,
            };
            if Instant::now() >= deadline {
                panic!("timed out after {timeout:?} waiting for {what}\nlast seen: {last}\n{}", self.tail());
            }
            sleep(API_POLL).await;
        }
    }

    /// Waits until the API's pod `name` (test namespace) satisfies `pred`; returns it.
    pub(crate) async fn wait_api_pod(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Pod) -> bool,
    ) -> Pod {
        let what = format!("pod {}/{name} in the API: {what}", self.namespace);
        self.wait_until(&what, timeout, async || match self.api_pod(name).await {
            Some(p) if pred(&p) => Ok(p),
            Some(p) => Err(pretty(&p)),
            None => Err("no such pod".to_owned()),
        })
        .await
    }

    /// Waits (60 s) until the API's pod `name` is Running with condition Ready=True.
    pub(crate) async fn wait_api_running(&self, name: &str) -> Pod {
        self.wait_api_pod(name, "phase Running and Ready=True", Duration::from_secs(60), |p| {
            crate::support::phase(p) == "Running"
                && crate::support::condition(p, "Ready").is_some_and(|c| c.status == "True")
        })
        .await
    }

    /// Waits until the API has no pod `name` in the test namespace.
    pub(crate) async fn wait_api_pod_gone(&self, name: &str, timeout: Duration) {
        let what = format!("pod {}/{name} to be gone from the API", self.namespace);
        self.wait_until(&what, timeout, async || match self.api_pod(name).await {
            None => Ok(()),
            Some(p) => Err(pretty(&p)),
        })
        .await;
    }

    /// Waits until the runtime holds no sandbox and no container of the pod with this UID.
    pub(crate) async fn wait_runtime_clear_of(&self, uid: &str, timeout: Duration) {
        let what = format!("the runtime to hold no sandbox or container of pod UID {uid}");
        self.wait_until(&what, timeout, async || {
            let sandboxes = self.sandboxes_of(uid).await;
            let containers = self.containers_of(uid).await;
            if sandboxes.is_empty() && containers.is_empty() {
                return Ok(());
            }
            Err(format!(
                "sandboxes {:?}, containers {:?}",
                sandboxes.iter().map(|s| (s.id.as_str(), s.state)).collect::<Vec<_>>(),
                containers.iter().map(|c| (c.id.as_str(), c.state)).collect::<Vec<_>>()
            ))
        })
        .await;
    }

    /// Whether `/healthz` answers with success now.
    pub(crate) async fn healthz_ok(&self) -> Result<(), String> {
        let url = format!("http://127.0.0.1:{}/healthz", self.ports().healthz);
        match self.http().get(&url).send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("GET {url}: {}", r.status())),
            Err(e) => Err(format!("GET {url}: {e}")),
        }
    }

    /// Panics when nodelet's log has a line saying the API server refused a request (`Forbidden`,
    /// `forbidden`): with NodeRestriction, nodelet must only ask for what its own node may.
    pub(crate) fn assert_no_forbidden_in_log(&self) {
        let log = self.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.to_ascii_lowercase().contains("forbidden")).collect();
        assert!(
            lines.is_empty(),
            "nodelet's log has {} line(s) with 'forbidden' (requests the API server refused to \
             system:node:{}):\n{}\n{}",
            lines.len(),
            self.node(),
            lines.join("\n"),
            self.tail()
        );
    }

    /// Tears everything down (see the [module docs](self)); panics with what went wrong.
    pub(crate) async fn shutdown(mut self) {
        self.torn_down = true;
        let mut problems = Vec::new();
        if let Err(p) = delete_namespace_workloads(&self.client, &self.namespace).await {
            problems.push(p);
        }
        let Some(nodelet) = self.nodelet.take() else { panic!("the nodelet fixture is gone") };
        let node = nodelet.node().to_owned();
        // The fixture's normal teardown: waits until nodelet removed every pod from the runtime.
        let outcome = AssertUnwindSafe(nodelet.shutdown()).catch_unwind().await;
        if let Err(p) = delete_node_objects(&self.client, &node, &self.namespace).await {
            problems.push(p);
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        assert!(problems.is_empty(), "cluster teardown of node {node}: {}", problems.join("; "));
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        let Some(nodelet) = self.nodelet.take() else { return };
        let node = nodelet.node().to_owned();
        let (cluster, namespace) = (self.cluster.clone(), self.namespace.clone());
        // The test's runtime is blocked here (and a kube client is bound to it): fresh ones on another thread.
        let run = |what: &'static str, node: String, cluster: ClusterEnv, namespace: String| {
            let worker = std::thread::spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => return Err(format!("cannot build a runtime: {e}")),
                };
                rt.block_on(async {
                    let client = try_admin_client(&cluster).await?;
                    match what {
                        "workloads" => delete_namespace_workloads(&client, &namespace).await,
                        _ => delete_node_objects(&client, &node, &namespace).await,
                    }
                })
            });
            match worker.join() {
                Ok(Ok(())) => {}
                Ok(Err(problem)) => eprintln!("cluster teardown guard ({what}): {problem}"),
                Err(_) => eprintln!("cluster teardown guard ({what}): the teardown thread panicked"),
            }
        };
        run("workloads", node.clone(), cluster.clone(), namespace.clone());
        // The fixture's guard: prints nodelet's log when the test panicked, removes the pods, stops nodelet.
        drop(nodelet);
        run("node", node, cluster, namespace);
    }
}

/// Deletes the Deployments, ReplicaSets and pods (grace 0) of `namespace` and waits until the API lists no
/// pod there.
async fn delete_namespace_workloads(client: &kube::Client, namespace: &str) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let all = ListParams::default();
    let _ = deployments.delete_collection(&DeleteParams::background(), &all).await;
    let _ = replica_sets.delete_collection(&DeleteParams::background(), &all).await;
    let deadline = Instant::now() + API_TEARDOWN_WAIT;
    loop {
        let last = match pods.list(&all).await {
            Ok(list) if list.items.is_empty() => return Ok(()),
            Ok(list) => {
                let _ = pods.delete_collection(&DeleteParams::default().grace_period(0), &all).await;
                let names: Vec<_> = list.items.iter().filter_map(|p| p.metadata.name.clone()).collect();
                format!("pods {names:?}")
            }
            Err(e) => format!("cannot list pods: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{API_TEARDOWN_WAIT:?} after deleting them, namespace {namespace} still has {last}"
            ));
        }
        sleep(Duration::from_millis(500)).await;
    }
}

/// After nodelet stopped: deletes the pods still bound to `node` (grace 0; mirror pods), the Node, its
/// Lease and `namespace`.
async fn delete_node_objects(client: &kube::Client, node: &str, namespace: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    let pods: Api<Pod> = Api::all(client.clone());
    match pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await {
        Ok(list) => {
            for p in list.items {
                let (Some(name), Some(ns)) = (p.metadata.name, p.metadata.namespace) else { continue };
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                match api.delete(&name, &DeleteParams::default().grace_period(0)).await {
                    Ok(_) => {}
                    Err(e) if api_code(&e) == Some(404) => {}
                    Err(e) => problems.push(format!("cannot delete pod {ns}/{name}: {e}")),
                }
            }
        }
        Err(e) => problems.push(format!("cannot list the pods of node {node}: {e}")),
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for (what, result) in [
        (format!("node {node}"), nodes.delete(node, &DeleteParams::default()).await.map(|_| ())),
        (
            format!("lease kube-node-lease/{node}"),
            leases.delete(node, &DeleteParams::default()).await.map(|_| ()),
        ),
        (
            format!("namespace {namespace}"),
            namespaces.delete(namespace, &DeleteParams::default()).await.map(|_| ()),
        ),
    ] {
        match result {
            Ok(()) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => problems.push(format!("cannot delete {what}: {e}")),
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

// ------------------------------------------------------------------------------------------------ own control plane

/// A control plane of one test's own (for tests that stop and start the API server): envtest's scripts with
/// `ENVTEST_BASE` in a temporary directory and free loopback ports. Dropping it runs `stop.sh --purge`.
#[derive(Debug)]
pub(crate) struct ControlPlane {
    dir: tempfile::TempDir,
    scripts: PathBuf,
    assets: PathBuf,
    api_port: u16,
    etcd_port: u16,
    /// Also kube-controller-manager and kube-scheduler (`ENVTEST_CONTROLLERS=1`).
    controllers: bool,
}

/// A free loopback port `p` whose `p + 1` is free too (etcd's client and peer ports), and another one, all
/// below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`) and drawn at random there. A port the
/// kernel hands out (`bind` to port 0) can be handed out again, to any outgoing connection of the tests
/// running beside this one, in the seconds before etcd binds it: in CI etcd's peer port, free when chosen,
/// was taken by then. Ports below the range are never given to outgoing connections.
fn free_ports() -> (u16, u16) {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // 10,000 ports below the range's start (the fixed ports of the test runtimes and the benches are
    // checked as any other: they are bound, so not free)
    let (from, to) = (low.saturating_sub(10_000).max(1024), low.saturating_sub(1));
    let free = |port: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok();
    let draw = || fastrand::u16(from..to);
    let api = (0..1000).map(|_| draw()).find(|&p| free(p));
    let etcd =
        (0..1000).map(|_| draw()).find(|&p| Some(p) != api && Some(p + 1) != api && free(p) && free(p + 1));
    match (api, etcd) {
        (Some(api), Some(etcd)) => (api, etcd),
        _ => panic!("cannot find free loopback ports in {from}..{to} (below the ephemeral range)"),
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (no controllers) with the assets and scripts of `suite`.
    pub(crate) async fn start(suite: &ClusterEnv) -> ControlPlane {
        Self::start_inner(suite, false).await
    }

    /// [`start`](Self::start) with kube-controller-manager and kube-scheduler too.
    pub(crate) async fn start_with_controllers(suite: &ClusterEnv) -> ControlPlane {
        Self::start_inner(suite, true).await
    }

    async fn start_inner(suite: &ClusterEnv, controllers: bool) -> ControlPlane {
        let dir = match tempfile::Builder::new().prefix("nodelet-e2e-envtest-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("cannot create a temporary directory: {e}"),
        };
        let (api_port, etcd_port) = free_ports();
        let plane = ControlPlane {
            dir,
            scripts: suite.scripts.clone(),
            assets: suite.assets.clone(),
            api_port,
            etcd_port,
            controllers,
        };
        plane.start_again().await;
        plane
    }

    /// `ENVTEST_BASE`.
    pub(crate) fn base(&self) -> PathBuf {
        self.dir.path().join("envtest")
    }

    /// The environment `start.sh` wrote.
    pub(crate) fn env(&self) -> ClusterEnv {
        ClusterEnv::from_env_file(&self.base().join("env.sh"), self.scripts.clone())
    }

    fn script(&self, name: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.scripts.join(name));
        cmd.env("ENVTEST_BASE", self.base())
            .env("ENVTEST_APISERVER_PORT", self.api_port.to_string())
            .env("ENVTEST_ETCD_PORT", self.etcd_port.to_string())
            .env("KUBEBUILDER_ASSETS", &self.assets)
            .env("ENVTEST_CONTROLLERS", if self.controllers { "1" } else { "0" })
            .env_remove("ENVTEST_APISERVER_ARGS")
            .env_remove("ENVTEST_KCM_ARGS")
            .env_remove("ENVTEST_EXTRA_TOKENS")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `start.sh` (it starts what is not running: everything at first, the API server after
    /// [`stop_apiserver`](Self::stop_apiserver)).
    pub(crate) async fn start_again(&self) {
        let mut cmd = tokio::process::Command::from(self.script("start.sh"));
        let output =
            match tokio::time::timeout(Duration::from_secs(180), cmd.kill_on_drop(true).output()).await {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => panic!("cannot run {}/start.sh: {e}", self.scripts.display()),
                Err(_) => panic!("{}/start.sh did not finish within 180 s", self.scripts.display()),
            };
        assert!(
            output.status.success(),
            "start.sh (ENVTEST_BASE {}, API port {}, etcd port {}): {}: {}",
            self.base().display(),
            self.api_port,
            self.etcd_port,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Stops kube-apiserver only, the way `stop.sh` stops it (SIGTERM by its pid file, SIGKILL after 10 s,
    /// pid file removed); etcd keeps running, so the cluster's state survives (`start.sh` wipes etcd's data
    /// when it has to start etcd).
    pub(crate) async fn stop_apiserver(&self) {
        let pid_file = self.base().join("run/kube-apiserver.pid");
        let pid_text = match std::fs::read_to_string(&pid_file) {
            Ok(t) => t,
            Err(e) => panic!("cannot read {}: {e}", pid_file.display()),
        };
        let raw: i32 = match pid_text.trim().parse() {
            Ok(p) => p,
            Err(e) => panic!("bad pid in {}: {pid_text:?}: {e}", pid_file.display()),
        };
        let exe = std::fs::read_link(format!("/proc/{raw}/exe")).unwrap_or_default();
        assert!(
            exe.file_name().is_some_and(|f| f == "kube-apiserver"),
            "pid {raw} of {} is not a kube-apiserver ({})",
            pid_file.display(),
            exe.display()
        );
        let Some(pid) = rustix::process::Pid::from_raw(raw) else { panic!("bad pid {raw}") };
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let gone = || !Path::new(&format!("/proc/{raw}")).exists() || zombie(raw);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone() && Instant::now() < deadline {
            sleep(Duration::from_millis(100)).await;
        }
        if !gone() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            sleep(Duration::from_millis(500)).await;
        }
        let _ = std::fs::remove_file(&pid_file);
    }
}

/// Whether the process is a zombie (exited, not yet reaped).
fn zombie(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        match self.script("stop.sh").arg("--purge").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("stop.sh --purge ({}): {}", o.status, String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("cannot run stop.sh: {e}"),
        }
    }
}

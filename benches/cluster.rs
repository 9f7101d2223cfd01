//! Cluster mode benchmark: pods from the API server against static pods, the API requests of an idle node,
//! and nodelet's memory, with a real Kubernetes v1.28.7 control plane (envtest) and a real containerd.
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! (`scripts/runtime-up.sh`; `. /tmp/nodelet-test/env.sh` exports what is read here), the envtest binaries
//! and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench cluster
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` (no runtime) or without envtest binaries (`$KUBEBUILDER_ASSETS` unset
//! and `../shared/envtest/install.sh` missing or failing) it prints a note and exits 0
//! (`NODELET_REQUIRE_RUNTIME=1` / `NODELET_REQUIRE_CLUSTER=1` make those errors).
//!
//! It starts a control plane of its own (etcd + kube-apiserver, no controller manager or scheduler, so the
//! only API clients are nodelet, the bench and the API server itself) with envtest's `start.sh`
//! (`$NODELET_TEST_ENVTEST_SCRIPTS`, else `../shared/envtest`), its `ENVTEST_BASE` in a temporary directory,
//! free loopback ports, and an audit log (metadata only) that tells whose requests are whose. Then one nodelet
//! (the binary cargo builds for this bench, with the release optimisations) in cluster mode (`--kubeconfig`
//! with a `system:node:<node>` client certificate, default lease and status cadence) on the external
//! runtime, and measures, with the same nodelet process throughout:
//!
//! 1. Paired rounds of N pods (busybox `sleep 3600`, `IfNotPresent`):
//!    - **static**: N manifests written at once into nodelet's manifest directory → all N `Running` (every
//!      container running) in `/pods` on the read-only port, polled every 20 ms (as `benches/pods.rs`);
//!      then the manifests removed and the pods gone from `/pods`, the runtime and the API (mirror pods);
//!    - **API**: N pods bound to the node (`spec.nodeName`) created through the API server, 8 at a time
//!      (creation counts) → all N `phase: Running` with every container status running *in the API*
//!      (a list of the namespace every 50 ms); then deleted (grace 0) and gone from the API, `/pods` and the
//!      runtime.
//!
//!    The audit log of each phase (start to gone) gives nodelet's API requests per pod, per (verb, resource,
//!    subresource): the API work a pod's life costs (status patches, mirror pods, events), printed last.
//! 2. **Steady state**: N API pods Running, 15 s to settle, then the API server's `apiserver_request_total`
//!    (`/metrics`) over a window, per (verb, resource, subresource), non-resource requests (the bench's own
//!    `/metrics` scrapes) left out; the audit log of the same window splits the requests by client (nodelet,
//!    the API server's own loopback client, the bench). nodelet's rate is compared with the kubelet's budget
//!    for the same work: a Lease renewal every 10 s and a node status patch every 5 min (6.2 per minute).
//! 3. **Memory**: nodelet's VmRSS, VmHWM and RssAnon at the end of that window (N API pods, idle).
//!
//! Environment: `NODELET_BENCH_PODS` (N, default 30), `NODELET_BENCH_ROUNDS` (paired rounds, default 3),
//! `NODELET_BENCH_STEADY_SECS` (the steady-state window, default 60), `NODELET_BENCH_KEEP_LOG=1` (keep
//! nodelet's log and the audit log, and print where), `NODELET_BENCH_LOG` (nodelet's `RUST_LOG`).
//!
//! Teardown, also after an error: the API pods deleted and the manifests removed, then nodelet stopped once
//! the runtime holds none of its pods (leftovers swept through the CRI), then `stop.sh --purge`.

#[path = "common/mod.rs"]
mod common;
use common::{USER_HZ, cpu_ticks, cpus, env_number, free_port, loadavg, median, ms, sweep};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter, labels};
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

/// How often `/pods` is polled.
const POLL: Duration = Duration::from_millis(20);
/// How often the API is polled while pods start.
const API_POLL: Duration = Duration::from_millis(50);
/// How long a start or a teardown may take before the bench gives up.
const DEADLINE: Duration = Duration::from_secs(180);
/// How many API pods are created at once.
const CREATE_PARALLELISM: usize = 8;
/// How long the node idles with its API pods before the steady-state window.
const SETTLE: Duration = Duration::from_secs(15);
/// The bench's namespace (the control plane is the bench's own).
const NAMESPACE: &str = "nodelet-bench";
/// Label of the bench's API pods.
const API_LABEL: &str = "nodelet-bench/kind";
/// The kubelet's API requests per minute for the same work: a Lease renewal every 10 s (6/min) and a node
/// status patch per `nodeStatusReportFrequency` (5 min: 0.2/min); no lists.
const KUBELET_BUDGET_PER_MIN: f64 = 6.2;

// ------------------------------------------------------------------------------------------------ settings

/// What the test runtime's `env.sh` exports.
#[derive(Debug, Clone)]
struct Env {
    endpoint: String,
    busybox: String,
    cgroup_parent: String,
    resolv_conf: String,
}

impl Env {
    fn from_env() -> anyhow::Result<Option<Env>> {
        let Ok(endpoint) = std::env::var("NODELET_TEST_CRI_ENDPOINT") else {
            if std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1") {
                bail!("NODELET_TEST_CRI_ENDPOINT is unset (run `. /tmp/nodelet-test/env.sh` first)");
            }
            return Ok(None);
        };
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        Ok(Some(Env {
            endpoint,
            busybox: var("NODELET_TEST_BUSYBOX_IMAGE", "localhost/nodelet/busybox:latest"),
            cgroup_parent: var("NODELET_TEST_CGROUP_PARENT", "/nodelet-test"),
            resolv_conf: var("NODELET_TEST_RESOLV_CONF", ""),
        }))
    }
}

/// Settings from the environment.
#[derive(Debug, Clone)]
struct Settings {
    pods: usize,
    rounds: usize,
    steady: Duration,
    keep_log: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let number = env_number;
        let settings = Settings {
            pods: number("NODELET_BENCH_PODS", 30)?,
            rounds: number("NODELET_BENCH_ROUNDS", 3)?,
            steady: Duration::from_secs(number("NODELET_BENCH_STEADY_SECS", 60)? as u64),
            keep_log: std::env::var("NODELET_BENCH_KEEP_LOG").as_deref() == Ok("1"),
        };
        if settings.pods == 0 || settings.rounds == 0 || settings.steady.is_zero() {
            bail!("pods, rounds and the steady-state window must be at least 1");
        }
        Ok(settings)
    }
}

/// Where the envtest binaries and scripts are.
#[derive(Debug, Clone)]
struct Envtest {
    assets: PathBuf,
    scripts: PathBuf,
}

impl Envtest {
    /// `$KUBEBUILDER_ASSETS`, else what `../shared/envtest/install.sh` unpacks; `Err` says why there is none.
    fn locate() -> Result<Envtest, String> {
        let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/envtest");
        let scripts = std::env::var_os("NODELET_TEST_ENVTEST_SCRIPTS")
            .filter(|v| !v.is_empty())
            .map_or_else(|| shared.clone(), PathBuf::from);
        for script in ["start.sh", "stop.sh", "mint-node-kubeconfig.sh"] {
            if !scripts.join(script).is_file() {
                return Err(format!("no {script} in {}", scripts.display()));
            }
        }
        let assets = match std::env::var_os("KUBEBUILDER_ASSETS").filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let install = shared.join("install.sh");
                if !install.is_file() {
                    return Err(format!("KUBEBUILDER_ASSETS is unset and there is no {}", install.display()));
                }
                let output = std::process::Command::new(&install)
                    .stdin(Stdio::null())
                    .stderr(Stdio::inherit())
                    .output()
                    .map_err(|e| format!("cannot run {}: {e}", install.display()))?;
                if !output.status.success() {
                    return Err(format!("{} failed ({})", install.display(), output.status));
                }
                let stdout = String::from_utf8_lossy(&output.stdout);
                let last = stdout.lines().last().unwrap_or_default().trim();
                PathBuf::from(last)
            }
        };
        for binary in ["kube-apiserver", "etcd"] {
            if !assets.join(binary).exists() {
                return Err(format!("no {binary} in {}", assets.display()));
            }
        }
        Ok(Envtest { assets, scripts })
    }
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let Some(env) = Env::from_env()? else {
        println!(
            "cluster bench: skipped (NODELET_TEST_CRI_ENDPOINT unset; run `. /tmp/nodelet-test/env.sh`)"
        );
        return Ok(());
    };
    let settings = Settings::from_env()?;
    let envtest = match Envtest::locate() {
        Ok(e) => e,
        Err(why) if std::env::var("NODELET_REQUIRE_CLUSTER").as_deref() == Ok("1") => {
            bail!("no Kubernetes control plane binaries: {why}")
        }
        Err(why) => {
            println!("cluster bench: skipped (no Kubernetes control plane binaries: {why})");
            return Ok(());
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(env, envtest, settings))
}

async fn run(env: Env, envtest: Envtest, settings: Settings) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("nodelet-cluster-bench-").tempdir()?;
    let node = format!("cluster-bench-{}", std::process::id());
    println!(
        "cluster bench: runtime {}, envtest {}, node {node}, {} pods, {} paired rounds, steady window {} s",
        env.endpoint,
        envtest.assets.display(),
        settings.pods,
        settings.rounds,
        settings.steady.as_secs()
    );
    println!("machine: {} CPUs, load average {}", cpus(), loadavg());

    let plane = ControlPlane::new(&envtest, dir.path())?;
    let started = Instant::now();
    let result = match plane.start().await {
        Ok(()) => {
            println!("control plane: ready in {} (API server {})", ms(started.elapsed()), plane.url());
            with_plane(&env, &plane, &settings, dir.path(), &node).await
        }
        Err(e) => Err(e),
    };
    if settings.keep_log {
        let kept = dir.keep();
        println!("nodelet's log: {}", kept.join("nodelet.log").display());
        println!("API server's audit log: {}", kept.join("audit.log").display());
    }
    // Dropping the control plane runs `stop.sh --purge`.
    drop(plane);
    result
}

/// Everything that needs the control plane: nodelet's start, the measurements, nodelet's teardown.
async fn with_plane(
    env: &Env,
    plane: &ControlPlane,
    settings: &Settings,
    dir: &Path,
    node: &str,
) -> anyhow::Result<()> {
    let vars = plane.env_file()?;
    let api = ApiServer::connect(&vars, &plane.audit_log).await?;
    api.create_namespace().await?;
    let kubeconfig = dir.join("node.kubeconfig");
    plane.mint_node_kubeconfig(node, &kubeconfig).await?;

    let cri = CriClient::connect(CriConfig::new(env.endpoint.clone()))
        .await
        .with_context(|| format!("cannot connect to {}", env.endpoint))?;
    let mut nodelet = Nodelet::start(env, dir, node, &kubeconfig, settings.pods).await?;
    let result = async {
        let started = Instant::now();
        api.wait_node_ready(node, &mut nodelet).await?;
        println!("nodelet: Node {node} Ready and its Lease there {} after start", ms(started.elapsed()));
        measure(&mut nodelet, &api, env, settings).await
    }
    .await;

    // Teardown: the API pods and the static pods go, nodelet removes them from the runtime, then it stops.
    let names = static_names(settings.pods);
    let teardown = async {
        api.delete_api_pods().await?;
        nodelet.remove_manifests(&names)?;
        nodelet.wait_runtime_clear(&api).await
    }
    .await;
    if let Err(e) = &teardown {
        eprintln!("teardown: {e:#}");
    }
    let stopped = nodelet.stop().await;
    let swept = sweep(&cri, SandboxFilter::managed().label(labels::NODE, node.to_owned())).await;
    if swept > 0 {
        println!("removed {swept} leftover sandbox(es) of node {node}");
    }
    result?;
    teardown?;
    stopped
}

// ------------------------------------------------------------------------------------------------ measuring

/// Request counts per (verb, group/resource, subresource).
type Counts<T> = BTreeMap<(String, String, String), T>;
/// Request counts per client, then per (verb, group/resource, subresource).
type ByClient = BTreeMap<String, Counts<u64>>;
/// A stretch of time in the audit log: from, to.
type Window = (k8s_openapi::jiff::Timestamp, k8s_openapi::jiff::Timestamp);

/// One start of N pods: wall time and nodelet's CPU time meanwhile.
#[derive(Debug, Clone, Copy, Default)]
struct Start {
    took: Duration,
    nodelet_cpu: Duration,
}

/// The steady-state figures.
#[derive(Debug, Default)]
struct Steady {
    secs: f64,
    /// `apiserver_request_total` deltas per (verb, group/resource, subresource), resource requests only.
    metrics: Counts<f64>,
    /// Audit events in the window per client, then per (verb, group/resource, subresource).
    audit: ByClient,
    rss_kib: u64,
    hwm_kib: u64,
    anon_kib: u64,
    idle_cpu: f64,
}

async fn measure(
    nodelet: &mut Nodelet,
    api: &ApiServer,
    env: &Env,
    settings: &Settings,
) -> anyhow::Result<()> {
    let n = settings.pods;
    let statics = static_names(n);
    let mut rounds: Vec<(Start, Start)> = Vec::new();
    // the audit windows of each round's static and API phases (start to gone), for nodelet's requests per pod
    let mut windows: Vec<(Window, Window)> = Vec::new();
    for round in 1..=settings.rounds {
        // static pods
        let from = k8s_openapi::jiff::Timestamp::now();
        let cpu0 = nodelet.cpu()?;
        let took = nodelet.start_static(&statics, &env.busybox).await?;
        let static_start = Start { took, nodelet_cpu: nodelet.cpu()?.saturating_sub(cpu0) };
        let removed = nodelet.remove_static(&statics, api).await?;
        let static_window = (from, k8s_openapi::jiff::Timestamp::now());
        sleep(Duration::from_secs(1)).await;

        // API pods
        let from = k8s_openapi::jiff::Timestamp::now();
        let cpu0 = nodelet.cpu()?;
        let took = api.start_pods(n, &env.busybox, nodelet).await?;
        let api_start = Start { took, nodelet_cpu: nodelet.cpu()?.saturating_sub(cpu0) };
        let deleted = api.remove_pods(nodelet).await?;
        windows.push((static_window, (from, k8s_openapi::jiff::Timestamp::now())));
        println!(
            "round {round}: {n} pods: static {} (nodelet CPU {}), API {} (nodelet CPU {}) = {:.2}×; \
             teardown: static {}, API {}",
            ms(static_start.took),
            ms(static_start.nodelet_cpu),
            ms(api_start.took),
            ms(api_start.nodelet_cpu),
            api_start.took.as_secs_f64() / static_start.took.as_secs_f64(),
            ms(removed),
            ms(deleted),
        );
        rounds.push((static_start, api_start));
        sleep(Duration::from_secs(1)).await;
    }

    let per_pod = api.requests_per_pod(&windows, n, nodelet.node())?;

    // steady state with N API pods
    let took = api.start_pods(n, &env.busybox, nodelet).await?;
    println!("steady state: {n} API pods Running in {}; settling for {} s", ms(took), SETTLE.as_secs());
    sleep(SETTLE).await;
    let steady = api.steady_state(nodelet, settings.steady).await?;
    report(&rounds, &steady, n, nodelet.node());
    report_per_pod(&per_pod, n, rounds.len());
    Ok(())
}

/// nodelet's requests per pod started and removed, per (verb, group/resource, subresource): static, API.
fn report_per_pod(per_pod: &Counts<(f64, f64)>, n: usize, rounds: usize) {
    println!();
    println!(
        "nodelet's API requests per pod, from the start of {n} pods until they are gone (audit log, {rounds} \
         round(s) of each kind):"
    );
    println!("| verb | resource | subresource | static pods (mirror pods) | API pods |");
    println!("|---|---|---|---|---|");
    for ((verb, resource, sub), (st, ap)) in per_pod {
        println!("| {verb} | {resource} | {sub} | {st:.2} | {ap:.2} |");
    }
    let (st, ap) = per_pod.values().fold((0.0, 0.0), |(a, b), (st, ap)| (a + st, b + ap));
    println!("| all | | | {st:.2} | {ap:.2} |");
}

fn report(rounds: &[(Start, Start)], s: &Steady, n: usize, node: &str) {
    let static_median = median(&rounds.iter().map(|(st, _)| st.took).collect::<Vec<_>>());
    let api_median = median(&rounds.iter().map(|(_, ap)| ap.took).collect::<Vec<_>>());
    let ratios: Vec<String> = rounds
        .iter()
        .map(|(st, ap)| format!("{:.2}", ap.took.as_secs_f64() / st.took.as_secs_f64()))
        .collect();
    let per_min = |count: f64| count * 60.0 / s.secs;

    println!();
    println!(
        "API server requests over the {:.0} s window (apiserver_request_total, resource requests):",
        s.secs
    );
    println!("| verb | resource | subresource | requests | per minute |");
    println!("|---|---|---|---|---|");
    for ((verb, resource, sub), count) in &s.metrics {
        println!("| {verb} | {resource} | {sub} | {count:.0} | {:.1} |", per_min(*count));
    }
    let metrics_total: f64 = s.metrics.values().sum();
    println!("| all | | | {metrics_total:.0} | {:.1} |", per_min(metrics_total));
    println!();
    println!("The same window by client (audit log, resource requests):");
    println!("| client | verb | resource | subresource | requests | per minute |");
    println!("|---|---|---|---|---|---|");
    for (client, requests) in &s.audit {
        for ((verb, resource, sub), count) in requests {
            println!("| {client} | {verb} | {resource} | {sub} | {count} | {:.1} |", per_min(*count as f64));
        }
    }
    let nodelet_client = format!("nodelet (system:node:{node})");
    let audit_total =
        |client: &str| -> f64 { s.audit.get(client).map_or(0, |r| r.values().sum::<u64>()) as f64 };
    let nodelet_total = audit_total(&nodelet_client);
    let others: f64 = s.audit.keys().filter(|c| **c != nodelet_client).map(|c| audit_total(c)).sum();
    let nodelet_lists = s
        .audit
        .get(&nodelet_client)
        .map_or(0, |r| r.iter().filter(|((verb, _, _), _)| verb == "list").map(|(_, c)| c).sum::<u64>());

    println!();
    println!("| figure | value | goal |");
    println!("|---|---|---|");
    println!(
        "| static: {n} manifests → all Running in /pods (median of {}) | {} | |",
        rounds.len(),
        ms(static_median)
    );
    println!(
        "| API: {n} pods created (8 at a time) → all Running in the API (median of {}) | {} = {:.2}× static \
         (per round: {}) | ≤ 1.15× |",
        rounds.len(),
        ms(api_median),
        api_median.as_secs_f64() / static_median.as_secs_f64(),
        ratios.join(", ")
    );
    println!(
        "| nodelet CPU during the start (median): static / API | {} / {} | |",
        ms(median(&rounds.iter().map(|(st, _)| st.nodelet_cpu).collect::<Vec<_>>())),
        ms(median(&rounds.iter().map(|(_, ap)| ap.nodelet_cpu).collect::<Vec<_>>()))
    );
    println!(
        "| API requests, idle with {n} pods, all clients (metrics; audit: nodelet {nodelet_total:.0} + others \
         {others:.0}) | {metrics_total:.0} in {:.0} s = {:.1}/min | |",
        s.secs,
        per_min(metrics_total)
    );
    println!(
        "| API requests of nodelet, idle with {n} pods (audit; {nodelet_lists} lists) | {:.1}/min = {:.2}× the \
         kubelet's {KUBELET_BUDGET_PER_MIN}/min | |",
        per_min(nodelet_total),
        per_min(nodelet_total) / KUBELET_BUDGET_PER_MIN
    );
    println!(
        "| nodelet idle with {n} API pods: RSS (VmRSS; VmHWM) | {:.1} MiB ({:.1} MiB) | < 30 MiB |",
        s.rss_kib as f64 / 1024.0,
        s.hwm_kib as f64 / 1024.0
    );
    println!(
        "| nodelet idle with {n} API pods: private memory (RssAnon) | {:.1} MiB | |",
        s.anon_kib as f64 / 1024.0
    );
    println!(
        "| nodelet idle with {n} API pods: CPU over {:.0} s | {:.2}% of a core | |",
        s.secs,
        s.idle_cpu * 100.0
    );
}

fn static_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("static-{i}")).collect()
}

// ------------------------------------------------------------------------------------------------ control plane

/// The bench's own control plane: envtest's scripts with `ENVTEST_BASE` in the bench's temporary directory,
/// free loopback ports and an audit log. Dropping it runs `stop.sh --purge`.
#[derive(Debug)]
struct ControlPlane {
    envtest: Envtest,
    base: PathBuf,
    audit_policy: PathBuf,
    audit_log: PathBuf,
    api_port: u16,
    etcd_port: u16,
}

impl ControlPlane {
    fn new(envtest: &Envtest, dir: &Path) -> anyhow::Result<ControlPlane> {
        let (api_port, etcd_port) = free_ports()?;
        let audit_policy = dir.join("audit-policy.yaml");
        // Metadata of every request, once, when it completed (as apiserver_request_total counts it).
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\", \"ResponseStarted\"]\n\
             rules:\n- level: Metadata\n",
        )?;
        Ok(ControlPlane {
            envtest: envtest.clone(),
            base: dir.join("envtest"),
            audit_policy,
            audit_log: dir.join("audit.log"),
            api_port,
            etcd_port,
        })
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    fn script(&self, name: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.envtest.scripts.join(name));
        cmd.env("ENVTEST_BASE", &self.base)
            .env("ENVTEST_APISERVER_PORT", self.api_port.to_string())
            .env("ENVTEST_ETCD_PORT", self.etcd_port.to_string())
            .env("KUBEBUILDER_ASSETS", &self.envtest.assets)
            .env(
                "ENVTEST_APISERVER_ARGS",
                format!(
                    "--audit-policy-file={} --audit-log-path={}",
                    self.audit_policy.display(),
                    self.audit_log.display()
                ),
            )
            .env_remove("ENVTEST_CONTROLLERS")
            .env_remove("ENVTEST_KCM_ARGS")
            .env_remove("ENVTEST_EXTRA_TOKENS")
            .stdin(Stdio::null());
        cmd
    }

    async fn start(&self) -> anyhow::Result<()> {
        let mut cmd = Command::from(self.script("start.sh"));
        let output = tokio::time::timeout(Duration::from_secs(180), cmd.kill_on_drop(true).output())
            .await
            .context("start.sh did not finish within 180 s")?
            .context("cannot run start.sh")?;
        if !output.status.success() {
            bail!(
                "start.sh (ENVTEST_BASE {}, API port {}, etcd port {}): {}: {}",
                self.base.display(),
                self.api_port,
                self.etcd_port,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// The `export K="V"` lines of the `env.sh` that `start.sh` wrote.
    fn env_file(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let path = self.base.join("env.sh");
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut vars = BTreeMap::new();
        for line in text.lines() {
            let Some((key, value)) = line.trim().strip_prefix("export ").and_then(|r| r.split_once('='))
            else {
                continue;
            };
            let value = value.trim();
            let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
            vars.insert(key.trim().to_owned(), value.to_owned());
        }
        let url = vars.get("APISERVER_URL").map(String::as_str).unwrap_or_default();
        if url != self.url() {
            bail!("{}: APISERVER_URL {url:?}, expected {}", path.display(), self.url());
        }
        Ok(vars)
    }

    /// A kubeconfig for `system:node:<node>` (envtest's `mint-node-kubeconfig.sh`).
    async fn mint_node_kubeconfig(&self, node: &str, out: &Path) -> anyhow::Result<()> {
        let output = Command::new(self.envtest.scripts.join("mint-node-kubeconfig.sh"))
            .arg(node)
            .arg(out)
            .env("ENVTEST_BASE", &self.base)
            .stdin(Stdio::null())
            .output()
            .await
            .context("cannot run mint-node-kubeconfig.sh")?;
        if !output.status.success() || !out.is_file() {
            bail!(
                "mint-node-kubeconfig.sh {node}: {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        match self.script("stop.sh").arg("--purge").stderr(Stdio::piped()).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("stop.sh --purge ({}): {}", o.status, String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("cannot run stop.sh: {e}"),
        }
    }
}

/// A free loopback port for the API server, and one `p` for etcd whose `p + 1` (etcd's peer port) is free.
fn free_ports() -> anyhow::Result<(u16, u16)> {
    let bind = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port));
    let api = bind(0)?;
    let api_port = api.local_addr()?.port();
    for _ in 0..100 {
        let first = bind(0)?;
        let p = first.local_addr()?.port();
        if p == u16::MAX || p + 1 == api_port {
            continue;
        }
        if bind(p + 1).is_ok() {
            return Ok((api_port, p));
        }
    }
    bail!("cannot find two adjacent free loopback ports for etcd")
}

// ------------------------------------------------------------------------------------------------ API server

/// The bench's access to the API server: the admin client, and `/metrics` with the admin token.
struct ApiServer {
    client: kube::Client,
    http: reqwest::Client,
    url: String,
    token: String,
    audit_log: PathBuf,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url)
            .field("audit_log", &self.audit_log)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    async fn connect(vars: &BTreeMap<String, String>, audit_log: &Path) -> anyhow::Result<ApiServer> {
        let get = |k: &str| {
            vars.get(k).filter(|v| !v.is_empty()).cloned().with_context(|| format!("env.sh lacks {k}"))
        };
        let url = get("APISERVER_URL")?;
        if !url.starts_with("https://127.0.0.1:") {
            bail!("APISERVER_URL {url} is not on loopback");
        }
        let kubeconfig_path = get("ADMIN_KUBECONFIG")?;
        let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.proxy_url = None;
        let client = kube::Client::try_from(config)?;
        let ca = std::fs::read(get("APISERVER_CA")?)?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
            .build()?;
        Ok(ApiServer { client, http, url, token: get("ADMIN_TOKEN")?, audit_log: audit_log.to_owned() })
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// The bench's namespace and its `default` ServiceAccount (without a controller manager nobody else
    /// creates it, and the ServiceAccount admission plugin refuses pods without it).
    async fn create_namespace(&self) -> anyhow::Result<()> {
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
        }))?;
        Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns).await?;
        let sa: ServiceAccount = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": NAMESPACE},
        }))?;
        match Api::<ServiceAccount>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &sa)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until the Node is Ready and its Lease exists.
    async fn wait_node_ready(&self, node: &str, nodelet: &mut Nodelet) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = nodes.get_opt(node).await?.is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready && leases.get_opt(node).await?.is_some() {
                return Ok(());
            }
            nodelet.check_alive()?;
            if Instant::now() >= deadline {
                bail!("Node {node} not Ready (with its Lease) within 60 s");
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates N pods bound to `node`, `CREATE_PARALLELISM` at a time, and returns the time from the first
    /// create until the API shows all of them Running with every container running.
    async fn start_pods(&self, n: usize, image: &str, nodelet: &mut Nodelet) -> anyhow::Result<Duration> {
        let pods = self.pods();
        let manifests = (0..n)
            .map(|i| serde_json::from_value::<Pod>(api_pod(&format!("api-{i}"), nodelet.node(), image)))
            .collect::<Result<Vec<_>, _>>()?;
        let started = Instant::now();
        futures::stream::iter(manifests)
            .map(|pod| {
                let pods = pods.clone();
                async move { pods.create(&PostParams::default(), &pod).await }
            })
            .buffer_unordered(CREATE_PARALLELISM)
            .try_collect::<Vec<_>>()
            .await
            .context("cannot create the API pods")?;
        let selector = ListParams::default().labels(&format!("{API_LABEL}=api"));
        loop {
            let list = pods.list(&selector).await?;
            let running = list.items.iter().filter(|p| api_running(p)).count();
            if list.items.len() == n && running == n {
                return Ok(started.elapsed());
            }
            if started.elapsed() > DEADLINE {
                bail!("{running} of {n} API pods Running within {DEADLINE:?}");
            }
            nodelet.check_alive()?;
            sleep(API_POLL).await;
        }
    }

    /// Deletes the API pods (grace 0) and waits until they are gone from the API, `/pods` and the runtime.
    async fn remove_pods(&self, nodelet: &mut Nodelet) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.delete_api_pods().await?;
        nodelet.wait_runtime_clear(self).await?;
        Ok(started.elapsed())
    }

    /// Deletes the API pods (grace 0) and waits until the API lists none.
    async fn delete_api_pods(&self) -> anyhow::Result<()> {
        let pods = self.pods();
        let selector = ListParams::default().labels(&format!("{API_LABEL}=api"));
        pods.delete_collection(&DeleteParams::default().grace_period(0), &selector).await?;
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = pods.list(&selector).await?.items.len();
            if left == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{left} API pod(s) still in the API {DEADLINE:?} after their deletion");
            }
            sleep(API_POLL).await;
        }
    }

    /// How many pods of the bench's namespace the API lists (API pods and mirror pods).
    async fn namespace_pods(&self) -> anyhow::Result<usize> {
        Ok(self.pods().list(&ListParams::default()).await?.items.len())
    }

    /// `apiserver_request_total` of resource requests per (verb, group/resource, subresource), summed over
    /// the other labels.
    async fn request_totals(&self) -> anyhow::Result<Counts<f64>> {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .bearer_auth(&self.token)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        let mut totals = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let labels = prometheus_labels(series);
            let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
            if label("resource").is_empty() {
                continue; // non-resource requests: /metrics, /healthz, /version, …
            }
            *totals
                .entry((
                    label("verb"),
                    group_resource(&label("group"), &label("resource")),
                    label("subresource"),
                ))
                .or_insert(0.0) += value;
        }
        Ok(totals)
    }

    /// The requests (audit events) that completed between `from` and `to`, per client and then per (verb,
    /// group/resource, subresource); non-resource requests left out.
    fn audit_window(
        &self,
        from: k8s_openapi::jiff::Timestamp,
        to: k8s_openapi::jiff::Timestamp,
        node: &str,
    ) -> anyhow::Result<ByClient> {
        let text = std::fs::read_to_string(&self.audit_log)
            .with_context(|| format!("cannot read the audit log {}", self.audit_log.display()))?;
        let mut out: ByClient = BTreeMap::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            if event["stage"] != "ResponseComplete" {
                continue;
            }
            let Some(at) =
                event["stageTimestamp"].as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            else {
                continue;
            };
            if at < from || at > to {
                continue;
            }
            let object = &event["objectRef"];
            let Some(resource) = object["resource"].as_str() else { continue };
            let user = event["user"]["username"].as_str().unwrap_or_default();
            let client = if user == format!("system:node:{node}") {
                format!("nodelet ({user})")
            } else if user == "system:apiserver" {
                format!("kube-apiserver itself ({user})")
            } else if user == "admin" {
                format!("the bench ({user})")
            } else {
                user.to_owned()
            };
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let key = (
                text(&event["verb"]),
                group_resource(object["apiGroup"].as_str().unwrap_or_default(), resource),
                text(&object["subresource"]),
            );
            *out.entry(client).or_default().entry(key).or_insert(0) += 1;
        }
        Ok(out)
    }

    /// nodelet's requests per pod in the rounds' windows (static, API), per (verb, group/resource,
    /// subresource).
    fn requests_per_pod(
        &self,
        windows: &[(Window, Window)],
        n: usize,
        node: &str,
    ) -> anyhow::Result<Counts<(f64, f64)>> {
        let client = format!("nodelet (system:node:{node})");
        let pods = (n * windows.len().max(1)) as f64;
        let mut out: Counts<(f64, f64)> = BTreeMap::new();
        for ((s_from, s_to), (a_from, a_to)) in windows {
            for (key, count) in self.audit_window(*s_from, *s_to, node)?.remove(&client).unwrap_or_default() {
                out.entry(key).or_default().0 += count as f64 / pods;
            }
            for (key, count) in self.audit_window(*a_from, *a_to, node)?.remove(&client).unwrap_or_default() {
                out.entry(key).or_default().1 += count as f64 / pods;
            }
        }
        Ok(out)
    }

    /// The steady-state window: request deltas (metrics and audit), nodelet's CPU and memory.
    async fn steady_state(&self, nodelet: &mut Nodelet, window: Duration) -> anyhow::Result<Steady> {
        let before = self.request_totals().await?;
        let (from, t0, cpu0) = (k8s_openapi::jiff::Timestamp::now(), Instant::now(), nodelet.cpu()?);
        sleep(window).await;
        let after = self.request_totals().await?;
        let (to, secs, cpu1) =
            (k8s_openapi::jiff::Timestamp::now(), t0.elapsed().as_secs_f64(), nodelet.cpu()?);
        nodelet.check_alive()?;
        let (rss_kib, hwm_kib, anon_kib) = nodelet.memory()?;
        let mut metrics = BTreeMap::new();
        for (key, value) in &after {
            let delta = value - before.get(key).copied().unwrap_or(0.0);
            if delta > 0.0 {
                metrics.insert(key.clone(), delta);
            }
        }
        // the API server writes an event when the request completed: give the last one a moment
        sleep(Duration::from_millis(500)).await;
        let audit = self.audit_window(from, to, nodelet.node())?;
        Ok(Steady {
            secs,
            metrics,
            audit,
            rss_kib,
            hwm_kib,
            anon_kib,
            idle_cpu: cpu1.saturating_sub(cpu0).as_secs_f64() / secs,
        })
    }
}

/// `resource` or `group/resource`.
fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() { resource.to_owned() } else { format!("{group}/{resource}") }
}

/// The labels of a Prometheus text-format series `name{k="v",…}`.
fn prometheus_labels(series: &str) -> HashMap<String, String> {
    let mut labels = HashMap::new();
    let Some(inner) = series.split_once('{').and_then(|(_, rest)| rest.strip_suffix('}')) else {
        return labels;
    };
    let mut rest = inner;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        value.push(if e == 'n' { '\n' } else { e });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').trim().to_owned(), value);
        rest = &after[end..];
    }
    labels
}

/// Whether the API pod is Running with every container running.
fn api_running(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    status.phase.as_deref() == Some("Running")
        && status.container_statuses.as_ref().is_some_and(|cs| {
            !cs.is_empty() && cs.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// A busybox `sleep 3600` pod bound to `node`, for the API.
fn api_pod(name: &str, node: &str, image: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {API_LABEL: "api"}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "containers": [{
                "name": "sleep",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    })
}

/// The same pod as a static manifest.
fn static_manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  dnsPolicy: None\n  \
         dnsConfig:\n    nameservers: [\"127.0.0.1\"]\n  containers:\n  - name: sleep\n    image: {image}\n    \
         imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    )
}

// ------------------------------------------------------------------------------------------------ nodelet

/// The nodelet binary under test, in cluster mode on the external runtime.
#[derive(Debug)]
struct Nodelet {
    child: Child,
    cri: CriClient,
    node: String,
    manifests: PathBuf,
    http: reqwest::Client,
    pods_url: String,
    log: PathBuf,
}

impl Nodelet {
    /// `pods`: how many pods a phase runs at once (`--max-pods` is at least that, at least the default 110).
    async fn start(
        env: &Env,
        dir: &Path,
        node: &str,
        kubeconfig: &Path,
        pods: usize,
    ) -> anyhow::Result<Nodelet> {
        let manifests = dir.join("manifests");
        for sub in ["root", "manifests", "logs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let (read_only, main, healthz) = (free_port()?, free_port()?, free_port()?);
        let log_path = dir.join("nodelet.log");
        let log = std::fs::File::create(&log_path)?;
        let path = |p: &str| dir.join(p).display().to_string();
        let args = [
            ("--kubeconfig", kubeconfig.display().to_string()),
            ("--node-ip", "127.0.0.1".to_owned()),
            ("--hostname-override", node.to_owned()),
            ("--root-dir", path("root")),
            ("--pod-manifest-path", path("manifests")),
            ("--pod-logs-dir", path("logs")),
            ("--container-runtime-endpoint", env.endpoint.clone()),
            ("--address", "127.0.0.1".to_owned()),
            ("--read-only-port", read_only.to_string()),
            ("--port", main.to_string()),
            ("--healthz-port", healthz.to_string()),
            ("--max-pods", pods.max(110).to_string()),
            ("--cgroup-root", env.cgroup_parent.clone()),
            ("--resolv-conf", env.resolv_conf.clone()),
            // The shared test runtime's disk may be nearly full: measure pods, not DiskPressure, and never
            // garbage-collect the test images.
            ("--eviction-hard", "memory.available<100Mi".to_owned()),
            ("--image-gc-high-threshold", "100".to_owned()),
        ];
        let child = Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args(args.iter().flat_map(|(flag, value)| [*flag, value.as_str()]))
            .env_remove("RUST_LOG")
            .envs(std::env::var("NODELET_BENCH_LOG").ok().map(|filter| ("RUST_LOG", filter)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start nodelet")?;
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build()?;
        let cri = CriClient::connect(CriConfig::new(env.endpoint.clone())).await?;
        let mut nodelet = Nodelet {
            child,
            cri,
            node: node.to_owned(),
            manifests,
            http,
            pods_url: format!("http://127.0.0.1:{read_only}/pods"),
            log: log_path,
        };
        let healthz_url = format!("http://127.0.0.1:{healthz}/healthz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            nodelet.check_alive()?;
            if nodelet.http.get(&healthz_url).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() >= deadline {
                bail!("nodelet not healthy within 30 s; see {}", nodelet.log.display());
            }
            sleep(POLL).await;
        }
        Ok(nodelet)
    }

    fn node(&self) -> &str {
        &self.node
    }

    /// An error when nodelet has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("nodelet exited ({status}); the end of its log:\n{}", self.log_tail(40));
        }
        Ok(())
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("nodelet has exited")
    }

    /// utime + stime so far.
    fn cpu(&self) -> anyhow::Result<Duration> {
        Ok(Duration::from_secs_f64(cpu_ticks(self.pid()?)? as f64 / USER_HZ))
    }

    /// Writes one manifest per name (each complete before it appears: written aside, then renamed), and
    /// returns the time from the first write until every pod is Running in `/pods`.
    async fn start_static(&mut self, names: &[String], image: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        for name in names {
            let tmp = self.manifests.join(format!(".{name}.yaml.tmp"));
            std::fs::write(&tmp, static_manifest(name, image))?;
            std::fs::rename(&tmp, self.manifests.join(format!("{name}.yaml")))?;
        }
        let wanted: Vec<String> = names.iter().map(|n| format!("{n}-{}", self.node)).collect();
        loop {
            let pods = self.pods().await?;
            if wanted.iter().all(|w| pods.get(w).is_some_and(|running| *running)) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > DEADLINE {
                bail!("static pods not Running within {DEADLINE:?}: {pods:?}");
            }
            self.check_alive()?;
            sleep(POLL).await;
        }
    }

    /// Deletes the manifests and waits until the pods are gone from `/pods`, the runtime and the API
    /// (their mirror pods).
    async fn remove_static(&mut self, names: &[String], api: &ApiServer) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.remove_manifests(names)?;
        self.wait_runtime_clear(api).await?;
        Ok(started.elapsed())
    }

    /// Removes those of the manifests that exist.
    fn remove_manifests(&self, names: &[String]) -> anyhow::Result<()> {
        for name in names {
            match std::fs::remove_file(self.manifests.join(format!("{name}.yaml"))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// Waits until `/pods`, the runtime (this node's sandboxes and containers) and the bench's namespace in
    /// the API are empty.
    async fn wait_runtime_clear(&mut self, api: &ApiServer) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let pods = self.pods().await?;
            let sandboxes = self
                .cri
                .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node.clone()))
                .await?;
            let containers = self
                .cri
                .list_containers(&ContainerFilter::managed().label(labels::NODE, self.node.clone()))
                .await?;
            let in_api = api.namespace_pods().await?;
            if pods.is_empty() && sandboxes.is_empty() && containers.is_empty() && in_api == 0 {
                return Ok(());
            }
            if started.elapsed() > DEADLINE {
                bail!(
                    "pods not removed within {DEADLINE:?}: {} in /pods, {} sandboxes, {} containers, {in_api} in \
                     the API",
                    pods.len(),
                    sandboxes.len(),
                    containers.len()
                );
            }
            self.check_alive()?;
            sleep(POLL).await;
        }
    }

    /// `/pods` as pod name → whether it is Running with every container running.
    async fn pods(&self) -> anyhow::Result<HashMap<String, bool>> {
        let body = self.http.get(&self.pods_url).send().await?.error_for_status()?.bytes().await?;
        let list: serde_json::Value = serde_json::from_slice(&body)?;
        let mut pods = HashMap::new();
        for pod in list["items"].as_array().into_iter().flatten() {
            let Some(name) = pod["metadata"]["name"].as_str() else { continue };
            let status = &pod["status"];
            let statuses = status["containerStatuses"].as_array();
            let running = status["phase"] == "Running"
                && statuses
                    .is_some_and(|s| !s.is_empty() && s.iter().all(|c| c["state"]["running"].is_object()));
            pods.insert(name.to_owned(), running);
        }
        Ok(pods)
    }

    /// VmRSS, VmHWM and RssAnon in KiB.
    fn memory(&self) -> anyhow::Result<(u64, u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            let line = status.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name}"))?;
            let kib = line.split_whitespace().nth(1).with_context(|| format!("bad {name} line"))?;
            Ok(kib.parse()?)
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?, field("RssAnon:")?))
    }

    /// SIGTERM, then wait (SIGKILL after 20 s).
    async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(pid) = self.child.id() else {
            let status = self.child.wait().await?;
            bail!("nodelet had exited before its stop ({status})");
        };
        let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw).context("bad pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        match tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await {
            Ok(status) => {
                status?;
            }
            Err(_) => {
                self.child.start_kill()?;
                self.child.wait().await?;
                bail!("nodelet did not stop within 20 s of SIGTERM");
            }
        }
        Ok(())
    }
}

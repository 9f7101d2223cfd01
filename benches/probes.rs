//! Prober idle-cost benchmark: nodelet's idle CPU with N pods (default 100) without probes, then with three
//! probes each (startup `exec`, liveness `httpGet`, readiness `tcpSocket`, kubelet default periods of 10 s),
//! in the same run on the same machine; prints both and their ratio.
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench probes
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` it prints a note and exits 0 (`NODELET_REQUIRE_RUNTIME=1` makes that an
//! error). Environment: `NODELET_BENCH_PROBE_PODS` (N, default 100), `NODELET_BENCH_IDLE_SECS` (the window
//! CPU is measured over, default 30), `NODELET_BENCH_SETTLE_SECS` (wait after the pods are up, default 15).
//! Every pod is busybox `httpd` (so that the probes have something to answer them) and is removed at the end.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter, labels};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

const POLL: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_secs(600);
const USER_HZ: f64 = 100.0;

fn number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let Ok(endpoint) = std::env::var("NODELET_TEST_CRI_ENDPOINT") else {
        if std::env::var("NODELET_REQUIRE_RUNTIME").as_deref() == Ok("1") {
            bail!("NODELET_TEST_CRI_ENDPOINT is unset (run `. /tmp/nodelet-test/env.sh` first)");
        }
        println!("probes bench: skipped (NODELET_TEST_CRI_ENDPOINT unset; run `. /tmp/nodelet-test/env.sh`)");
        return Ok(());
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(endpoint))
}

async fn run(endpoint: String) -> anyhow::Result<()> {
    let pods = usize::try_from(number("NODELET_BENCH_PROBE_PODS", 100)?)?;
    let idle = Duration::from_secs(number("NODELET_BENCH_IDLE_SECS", 30)?);
    let settle = Duration::from_secs(number("NODELET_BENCH_SETTLE_SECS", 15)?);
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let image = var("NODELET_TEST_BUSYBOX_IMAGE", "localhost/nodelet/busybox:latest");
    let dir = tempfile::Builder::new().prefix("nodelet-probe-bench-").tempdir()?;
    let node = format!("bench-probes-{}", std::process::id());
    let cri = CriClient::connect(CriConfig::new(endpoint.clone())).await?;
    println!("probes bench: {pods} pods, idle window {idle:?}, settle {settle:?}");
    println!(
        "machine: {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let mut nodelet = Nodelet::start(&endpoint, &var, dir.path(), &node).await?;
    let result = async {
        let mut figures = Vec::new();
        for probes in [false, true] {
            let names: Vec<String> = (0..pods).map(|i| format!("p{i:03}")).collect();
            let took = nodelet.start_pods(&names, &image, probes).await?;
            println!("{pods} pods up (probes: {probes}); settling for {settle:?}, then measuring");
            sleep(settle).await;
            let before = nodelet.probe_runs().await?;
            let cpu = nodelet.cpu_over(idle).await?;
            let runs = nodelet.probe_runs().await? - before;
            let failed = nodelet.probe_runs_with("result=\"failed\"").await?
                + nodelet.probe_runs_with("result=\"unknown\"").await?;
            if failed > 0.0 {
                bail!("{failed} probe runs failed: the figures would include container restarts");
            }
            let (rss, _) = nodelet.memory()?;
            let label = if probes { "with 3 probes each" } else { "without probes" };
            println!(
                "{pods} pods {label}: started in {:.1} s; idle CPU {:.2}% of a core over {:.0} s; {:.1} probe runs/s; VmRSS {:.1} MiB",
                took.as_secs_f64(),
                cpu * 100.0,
                idle.as_secs_f64(),
                runs / idle.as_secs_f64(),
                rss as f64 / 1024.0
            );
            figures.push(cpu);
            nodelet.remove_pods(&names).await?;
        }
        let ratio = figures[1] / figures[0].max(1e-9);
        println!(
            "idle CPU with probes / without: {:.2}% / {:.2}% = {ratio:.2}x ({:+.2} percentage points of a core)",
            figures[1] * 100.0,
            figures[0] * 100.0,
            (figures[1] - figures[0]) * 100.0
        );
        anyhow::Ok(())
    }
    .await;
    let stopped = nodelet.stop().await;
    // Whatever happened: nothing of this run stays on the runtime.
    let leftovers = cri
        .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, node.clone()))
        .await
        .unwrap_or_default();
    for c in cri
        .list_containers(&ContainerFilter::managed().label(labels::NODE, node.clone()))
        .await
        .unwrap_or_default()
    {
        let _ = cri.stop_container(&c.id, Duration::ZERO).await;
        let _ = cri.remove_container(&c.id).await;
    }
    for s in &leftovers {
        let _ = cri.stop_pod_sandbox(&s.id).await;
        let _ = cri.remove_pod_sandbox(&s.id).await;
    }
    result.and(stopped)
}

struct Nodelet {
    child: Child,
    cri: CriClient,
    node: String,
    dir: std::path::PathBuf,
    http: reqwest::Client,
    base: String,
}

impl Nodelet {
    async fn start(
        endpoint: &str,
        var: &impl Fn(&str, &str) -> String,
        dir: &Path,
        node: &str,
    ) -> anyhow::Result<Nodelet> {
        for sub in ["root", "manifests", "logs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let port = |()| -> anyhow::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
        };
        let (read_only, main, healthz) = (port(())?, port(())?, port(())?);
        let log = std::fs::File::create(dir.join("nodelet.log"))?;
        let path = |p: &str| dir.join(p).display().to_string();
        let args = [
            ("--root-dir", path("root")),
            ("--pod-manifest-path", path("manifests")),
            ("--pod-logs-dir", path("logs")),
            ("--container-runtime-endpoint", endpoint.to_owned()),
            ("--hostname-override", node.to_owned()),
            ("--address", "127.0.0.1".to_owned()),
            ("--read-only-port", read_only.to_string()),
            ("--port", main.to_string()),
            ("--healthz-port", healthz.to_string()),
            ("--cgroup-root", var("NODELET_TEST_CGROUP_PARENT", "/nodelet-test")),
            ("--resolv-conf", var("NODELET_TEST_RESOLV_CONF", "")),
            // The shared test runtime's disk may be nearly full: measure pods, not DiskPressure, and never
            // garbage-collect the test images.
            ("--eviction-hard", "memory.available<100Mi".to_owned()),
            ("--image-gc-high-threshold", "100".to_owned()),
        ];
        let child = Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args(args.iter().flat_map(|(flag, value)| [*flag, value.as_str()]))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start nodelet")?;
        // No connection reuse: an idle connection the server closes meanwhile would fail the next request.
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10))
            .build()?;
        let cri = CriClient::connect(CriConfig::new(endpoint.to_owned())).await?;
        let mut nodelet = Nodelet {
            child,
            cri,
            node: node.to_owned(),
            dir: dir.to_owned(),
            http,
            base: format!("http://127.0.0.1:{read_only}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = nodelet.child.try_wait()? {
                bail!("nodelet exited during start-up ({status}); see {}", dir.join("nodelet.log").display());
            }
            let url = format!("http://127.0.0.1:{healthz}/healthz");
            if nodelet.http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                return Ok(nodelet);
            }
            if Instant::now() >= deadline {
                bail!("nodelet not healthy within 30 s");
            }
            sleep(POLL).await;
        }
    }

    /// Writes the manifests; returns the time until every pod is Running and Ready.
    async fn start_pods(&mut self, names: &[String], image: &str, probes: bool) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let manifests = self.dir.join("manifests");
        for name in names {
            let tmp = manifests.join(format!(".{name}.yaml.tmp"));
            std::fs::write(&tmp, manifest(name, image, probes))?;
            std::fs::rename(&tmp, manifests.join(format!("{name}.yaml")))?;
        }
        let wanted: Vec<String> = names.iter().map(|n| format!("{n}-{}", self.node)).collect();
        loop {
            let ready = self.ready_pods().await?;
            if wanted.iter().all(|w| ready.get(w).copied().unwrap_or(false)) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > DEADLINE {
                bail!("pods not Ready within {DEADLINE:?}");
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("nodelet exited ({status})");
            }
            sleep(POLL).await;
        }
    }

    async fn remove_pods(&mut self, names: &[String]) -> anyhow::Result<()> {
        for name in names {
            std::fs::remove_file(self.dir.join("manifests").join(format!("{name}.yaml")))?;
        }
        let started = Instant::now();
        loop {
            let sandboxes = self
                .cri
                .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node.clone()))
                .await?;
            if self.ready_pods().await?.is_empty() && sandboxes.is_empty() {
                return Ok(());
            }
            if started.elapsed() > DEADLINE {
                bail!("pods not removed within {DEADLINE:?}");
            }
            sleep(POLL).await;
        }
    }

    /// `/pods`: name → whether the pod's `Ready` condition is True.
    async fn ready_pods(&self) -> anyhow::Result<HashMap<String, bool>> {
        let body =
            self.http.get(format!("{}/pods", self.base)).send().await?.error_for_status()?.bytes().await?;
        let list: serde_json::Value = serde_json::from_slice(&body)?;
        let mut pods = HashMap::new();
        for pod in list["items"].as_array().into_iter().flatten() {
            let Some(name) = pod["metadata"]["name"].as_str() else { continue };
            let ready = pod["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            pods.insert(name.to_owned(), ready);
        }
        Ok(pods)
    }

    /// The sum of `prober_probe_total` (all results, or those with `result`).
    async fn probe_runs(&self) -> anyhow::Result<f64> {
        self.probe_runs_with("").await
    }

    /// The sum of `prober_probe_total` series whose labels contain `filter`.
    async fn probe_runs_with(&self, filter: &str) -> anyhow::Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics/probes", self.base))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("prober_probe_total{") && l.contains(filter))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum())
    }

    /// nodelet's CPU use over `window`, in cores.
    async fn cpu_over(&self, window: Duration) -> anyhow::Result<f64> {
        let pid = self.child.id().context("nodelet has exited")?;
        let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
        sleep(window).await;
        let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
        Ok(c1.saturating_sub(c0) as f64 / USER_HZ / (t1 - t0).as_secs_f64())
    }

    /// VmRSS and VmHWM in KiB.
    fn memory(&self) -> anyhow::Result<(u64, u64)> {
        let pid = self.child.id().context("nodelet has exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            let line = status.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name}"))?;
            Ok(line.split_whitespace().nth(1).with_context(|| format!("bad {name} line"))?.parse()?)
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("nodelet has exited")?;
        let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw).context("bad pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            self.child.start_kill()?;
            self.child.wait().await?;
            bail!("nodelet did not stop within 20 s of SIGTERM");
        }
        Ok(())
    }
}

/// A busybox `httpd` pod; with `probes`: startup `exec`, liveness `httpGet`, readiness `tcpSocket`, each with
/// the kubelet's default period (10 s) and timeout (1 s).
fn manifest(name: &str, image: &str, probes: bool) -> String {
    let probes = if probes {
        "    startupProbe: {exec: {command: [\"true\"]}}\n    \
         livenessProbe: {httpGet: {port: 8080, path: /}}\n    \
         readinessProbe: {tcpSocket: {port: 8080}}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  dnsPolicy: None\n  dnsConfig:\n    nameservers: [\"127.0.0.1\"]\n  \
         containers:\n  - name: web\n    image: {image}\n    imagePullPolicy: IfNotPresent\n    \
         command: [\"sh\", \"-c\", \"mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n{probes}"
    )
}

/// utime + stime of `pid` in USER_HZ ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("bad /proc/pid/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

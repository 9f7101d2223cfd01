//! Soak benchmark: one nodelet for a long time (default 60 minutes) under pod churn plus API traffic, on the
//! real runtime, loopback only. It prints what nodelet and the node hold at the start (after one warm-up
//! cycle) and at the end, and their growth: nodelet's RSS and open file descriptors, and, for the pods of
//! this run, mounts, network namespaces, cgroups and runtime objects. The goal is no growth beyond noise.
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench soak
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` it prints a note and exits 0 (`NODELET_REQUIRE_RUNTIME=1` makes that an
//! error). Environment: `NODELET_SOAK_MINUTES` (60), `NODELET_SOAK_PODS` (pods per churn cycle, 5),
//! `NODELET_SOAK_SAMPLE_SECS` (how often a sample line is printed, 300).
//!
//! Each cycle writes the manifests of `NODELET_SOAK_PODS` pods (busybox `httpd` with a readiness probe and an
//! emptyDir volume), waits until all are Ready, deletes them and waits until their sandboxes are gone.
//! Meanwhile a client reads `/pods`, `/metrics`, `/metrics/probes`, `/metrics/cadvisor` and `/stats/summary`
//! on the read-only port in a loop (one request at a time, no pause).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter, labels};
use tokio::time::Instant;

mod fixture;
use fixture::{Nodelet, number};

fn main() -> anyhow::Result<()> {
    fixture::with_runtime("soak", run)
}

/// What is counted at each sample.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    rss_kib: u64,
    /// RssAnon: the private memory, without the binary's pages (which grow as code paths are first used).
    anon_kib: u64,
    fds: u64,
    mounts: u64,
    netns: u64,
    cgroups: u64,
    sandboxes: u64,
    containers: u64,
}

impl Sample {
    fn rows(&self) -> [(&'static str, u64); 8] {
        [
            ("nodelet RSS (KiB)", self.rss_kib),
            ("nodelet private memory, RssAnon (KiB)", self.anon_kib),
            ("nodelet open file descriptors", self.fds),
            ("mounts of this run (its directories, its sandboxes and containers)", self.mounts),
            ("network namespace files of this run's sandboxes still there", self.netns),
            ("cgroups under the run's cgroup root (memory controller)", self.cgroups),
            ("sandboxes of this node in the runtime", self.sandboxes),
            ("containers of this node in the runtime", self.containers),
        ]
    }
}

struct Counters<'a> {
    cri: &'a CriClient,
    node: &'a str,
    dir: &'a Path,
    cgroup_root: &'a str,
    /// Every sandbox and container ID of this run, and the network namespace files of its sandboxes.
    seen: std::sync::Mutex<(BTreeSet<String>, BTreeSet<PathBuf>)>,
}

impl Counters<'_> {
    /// Notes the runtime objects of this node now (while pods run).
    async fn note(&self) -> anyhow::Result<()> {
        let sandboxes =
            self.cri.list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node)).await?;
        let containers =
            self.cri.list_containers(&ContainerFilter::managed().label(labels::NODE, self.node)).await?;
        let mut netns = Vec::new();
        for s in &sandboxes {
            if let Ok(Some(nodelet_cri::SandboxNetwork::Namespace(path))) =
                self.cri.sandbox_network(&s.id).await
            {
                netns.push(path);
            }
        }
        let mut seen = self.seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        seen.0.extend(sandboxes.into_iter().map(|s| s.id).chain(containers.into_iter().map(|c| c.id)));
        seen.1.extend(netns);
        Ok(())
    }

    async fn sample(&self, nodelet: &Nodelet) -> anyhow::Result<Sample> {
        let pid = nodelet.pid()?;
        let (rss_kib, _) = nodelet.memory()?;
        let anon_kib = rss_anon_kib(pid)?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
        let dir = self.dir.display().to_string();
        let (ids, netns_files) = self.seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")?
            .lines()
            .filter(|l| l.contains(&dir) || ids.iter().any(|id| l.contains(id.as_str())))
            .count() as u64;
        let netns = netns_files.iter().filter(|p| p.exists()).count() as u64;
        let sandboxes =
            self.cri.list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node)).await?;
        let containers =
            self.cri.list_containers(&ContainerFilter::managed().label(labels::NODE, self.node)).await?;
        let cgroups =
            count_dirs(&Path::new("/sys/fs/cgroup/memory").join(self.cgroup_root.trim_start_matches('/')));
        Ok(Sample {
            rss_kib,
            anon_kib,
            fds,
            mounts,
            netns,
            cgroups,
            sandboxes: sandboxes.len() as u64,
            containers: containers.len() as u64,
        })
    }
}

/// Directories below `root` (itself not counted; 0 if it does not exist).
fn count_dirs(root: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(root) else { return 0 };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| 1 + count_dirs(&e.path()))
        .sum()
}

async fn run(endpoint: String) -> anyhow::Result<()> {
    let minutes = number("NODELET_SOAK_MINUTES", 60)?;
    let pods = usize::try_from(number("NODELET_SOAK_PODS", 5)?)?;
    let sample_every = Duration::from_secs(number("NODELET_SOAK_SAMPLE_SECS", 300)?);
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let image = var("NODELET_TEST_BUSYBOX_IMAGE", "localhost/nodelet/busybox:latest");
    let dir = tempfile::Builder::new().prefix("nodelet-soak-").tempdir()?;
    let node = format!("bench-soak-{}", std::process::id());
    let cgroup_root = format!("/nodelet-soak-{}", std::process::id());
    let cri = CriClient::connect(CriConfig::new(endpoint.clone())).await?;
    println!("soak bench: {minutes} min, {pods} pods per cycle, a sample every {sample_every:?}");
    println!(
        "machine: {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let mut nodelet =
        Nodelet::start(&endpoint, &var, dir.path(), &node, &[("--cgroup-root", cgroup_root.clone())]).await?;
    let counters = Counters {
        cri: &cri,
        node: &node,
        dir: dir.path(),
        cgroup_root: &cgroup_root,
        seen: Default::default(),
    };
    let result = async {
        let names: Vec<String> = (0..pods).map(|i| format!("s{i:02}")).collect();
        let manifest = |name: &str| manifest(name, &image);
        // Warm-up: one cycle, then the baseline with no pods.
        nodelet.start_pods(&names, manifest).await?;
        counters.note().await?;
        nodelet.remove_pods(&names).await?;
        let start = counters.sample(&nodelet).await?;
        let requests = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let traffic = tokio::spawn(api_traffic(nodelet.base().to_owned(), requests.clone(), failures.clone()));
        let began = Instant::now();
        let end = began + Duration::from_secs(minutes * 60);
        let mut next_sample = began + sample_every;
        let (mut cycles, mut peak) = (0u64, start);
        let mut cycle_times = Vec::new();
        println!(
            "{:>7} {:>7} {:>9} {:>8} {:>5} {:>7} {:>8}",
            "minute", "cycles", "RSS MiB", "anon MiB", "fds", "mounts", "requests"
        );
        while Instant::now() < end {
            let t = Instant::now();
            nodelet.start_pods(&names, manifest).await?;
            counters.note().await?;
            let during = counters.sample(&nodelet).await?;
            peak.rss_kib = peak.rss_kib.max(during.rss_kib);
            peak.fds = peak.fds.max(during.fds);
            nodelet.remove_pods(&names).await?;
            cycle_times.push(t.elapsed());
            cycles += 1;
            if Instant::now() >= next_sample {
                next_sample += sample_every;
                let s = counters.sample(&nodelet).await?;
                println!(
                    "{:>7.1} {cycles:>7} {:>9.1} {:>8.1} {:>5} {:>7} {:>8}",
                    began.elapsed().as_secs_f64() / 60.0,
                    s.rss_kib as f64 / 1024.0,
                    s.anon_kib as f64 / 1024.0,
                    s.fds,
                    s.mounts,
                    requests.load(Ordering::Relaxed)
                );
            }
        }
        traffic.abort();
        // Let the last teardown's background work settle before the final count.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let finish = counters.sample(&nodelet).await?;
        cycle_times.sort();
        let median = cycle_times.get(cycle_times.len() / 2).copied().unwrap_or_default();
        println!(
            "\n{cycles} cycles of {pods} pods in {:.1} min (median cycle {:.1} s); {} API requests, {} failed",
            began.elapsed().as_secs_f64() / 60.0,
            median.as_secs_f64(),
            requests.load(Ordering::Relaxed),
            failures.load(Ordering::Relaxed)
        );
        println!("\n| with no pods running | start | end | growth |\n|---|--:|--:|--:|");
        for ((name, a), (_, b)) in start.rows().iter().zip(finish.rows().iter()) {
            println!("| {name} | {a} | {b} | {:+} |", i128::from(*b) - i128::from(*a));
        }
        println!(
            "\npeak while {pods} pods ran: RSS {:.1} MiB, {} file descriptors",
            peak.rss_kib as f64 / 1024.0,
            peak.fds
        );
        anyhow::Ok(())
    }
    .await;
    let stopped = nodelet.stop().await;
    for c in cri
        .list_containers(&ContainerFilter::managed().label(labels::NODE, node.clone()))
        .await
        .unwrap_or_default()
    {
        let _ = cri.stop_container(&c.id, Duration::ZERO).await;
        let _ = cri.remove_container(&c.id).await;
    }
    for s in cri
        .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, node.clone()))
        .await
        .unwrap_or_default()
    {
        let _ = cri.stop_pod_sandbox(&s.id).await;
        let _ = cri.remove_pod_sandbox(&s.id).await;
    }
    result.and(stopped)
}

/// Reads the read-only port's endpoints in a loop, one request at a time.
async fn api_traffic(base: String, requests: Arc<AtomicU64>, failures: Arc<AtomicU64>) {
    let Ok(http) = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build() else {
        failures.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let paths = ["/pods", "/metrics", "/metrics/probes", "/metrics/cadvisor", "/stats/summary"];
    for path in paths.iter().cycle() {
        let ok = match http.get(format!("{base}{path}")).send().await {
            Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
            Err(_) => false,
        };
        requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A busybox `httpd` pod with a readiness probe and an emptyDir volume.
fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  dnsPolicy: None\n  dnsConfig:\n    nameservers: [\"127.0.0.1\"]\n  \
         volumes: [{{name: data, emptyDir: {{}}}}]\n  \
         containers:\n  - name: web\n    image: {image}\n    imagePullPolicy: IfNotPresent\n    \
         volumeMounts: [{{name: data, mountPath: /www}}]\n    \
         command: [\"sh\", \"-c\", \"echo ok > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n    \
         readinessProbe: {{httpGet: {{port: 8080, path: /}}, periodSeconds: 1}}\n"
    )
}

/// RssAnon of `pid` in KiB.
fn rss_anon_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line =
        status.lines().find(|l| l.starts_with("RssAnon:")).ok_or_else(|| anyhow::anyhow!("no RssAnon"))?;
    Ok(line.split_whitespace().nth(1).ok_or_else(|| anyhow::anyhow!("bad RssAnon line"))?.parse()?)
}

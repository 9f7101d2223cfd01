//! Pod start benchmark: nodelet against a minimal direct CRI client, on a real containerd.
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! (`scripts/runtime-up.sh`; `. /tmp/nodelet-test/env.sh` exports what is read here) and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench pods
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` it prints a note and exits 0 (`NODELET_REQUIRE_RUNTIME=1` makes that an
//! error). What it measures, each on the same runtime and the same busybox `sleep 3600` pods:
//!
//! 1. **Floor**: a direct [`CriClient`] doing RunPodSandbox + CreateContainer + StartContainer for N pods at
//!    parallelism 1, 4 and 8, then StopPodSandbox + RemovePodSandbox; the best parallelism is the floor's.
//! 2. **nodelet** (the binary cargo builds for this bench, with the release optimisations), started with an
//!    empty manifest directory on the external runtime, in rounds paired with the floor (floor at its best
//!    parallelism, then nodelet, so both see the same machine load): N manifests written at once, then
//!    the time until all N are `Running` (every container running) in `/pods` on the read-only port, polled
//!    every 20 ms; the manifests removed and the pods gone (from `/pods` and from the runtime). The CPU time
//!    containerd and nodelet spend during each start is recorded. After the first round, nodelet's RSS
//!    (VmRSS) and CPU (utime + stime) while idle with N pods.
//! 3. One pod, several rounds, floor and nodelet paired (medians): manifest written → `Running` in `/pods`.
//!
//! Environment: `NODELET_BENCH_PODS` (N, default 30), `NODELET_BENCH_MANY_ROUNDS` (N-pod rounds, default 5),
//! `NODELET_BENCH_ROUNDS` (single-pod rounds, default 5), `NODELET_BENCH_IDLE_SECS` (default 30),
//! `NODELET_BENCH_PARALLELISM` (floor parallelisms, default `1,4,8`), `NODELET_BENCH_KEEP_LOG=1` (print and
//! keep nodelet's log directory), `NODELET_BENCH_LOG` (nodelet's `RUST_LOG`, e.g.
//! `info,nodelet::sources=debug,reconcile_engine=debug` to see where the time goes).
//!
//! Every pod it creates is removed at the end, also after an error: the floor's by their run label, nodelet's
//! by nodelet itself (manifests removed) and then by its node label.

#[path = "common/mod.rs"]
mod common;
use common::{USER_HZ, cpu_ticks, cpus, env_number, free_port, loadavg, median, ms, sweep};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use nodelet_cri::{ContainerFilter, CriClient, CriConfig, SandboxFilter, labels, proto};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

/// How often `/pods` is polled.
const POLL: Duration = Duration::from_millis(20);
/// How long a start or a teardown may take before the bench gives up.
const DEADLINE: Duration = Duration::from_secs(180);
/// Label on the floor's sandboxes and containers: the run they belong to.
const RUN_LABEL: &str = "io.nodelet.bench.run";

/// What the test runtime's `env.sh` exports.
#[derive(Debug, Clone)]
struct Env {
    endpoint: String,
    busybox: String,
    cgroup_parent: String,
    resolv_conf: String,
    base: Option<PathBuf>,
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
            base: std::env::var_os("NODELET_TEST_BASE").map(PathBuf::from),
        }))
    }

    /// The test runtime's containerd (`$NODELET_TEST_BASE/run/containerd.pid`), for its CPU time.
    fn containerd_pid(&self) -> Option<u32> {
        let base = self.base.as_ref()?;
        std::fs::read_to_string(base.join("run/containerd.pid")).ok()?.trim().parse().ok()
    }
}

/// Settings from the environment.
#[derive(Debug, Clone)]
struct Settings {
    pods: usize,
    many_rounds: usize,
    rounds: usize,
    idle: Duration,
    parallelism: Vec<usize>,
    keep_log: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let number = env_number;
        let parallelism = match std::env::var("NODELET_BENCH_PARALLELISM") {
            Ok(v) => v
                .split(',')
                .map(|p| p.trim().parse::<usize>().with_context(|| format!("bad parallelism {p:?}")))
                .collect::<anyhow::Result<Vec<_>>>()?,
            Err(_) => vec![1, 4, 8],
        };
        let settings = Settings {
            pods: number("NODELET_BENCH_PODS", 30)?,
            many_rounds: number("NODELET_BENCH_MANY_ROUNDS", 5)?,
            rounds: number("NODELET_BENCH_ROUNDS", 5)?,
            idle: Duration::from_secs(number("NODELET_BENCH_IDLE_SECS", 30)? as u64),
            parallelism,
            keep_log: std::env::var("NODELET_BENCH_KEEP_LOG").as_deref() == Ok("1"),
        };
        if settings.pods == 0
            || settings.rounds == 0
            || settings.many_rounds == 0
            || settings.parallelism.contains(&0)
        {
            bail!("pods, rounds and parallelism must be at least 1");
        }
        Ok(settings)
    }
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let Some(env) = Env::from_env()? else {
        println!("pods bench: skipped (NODELET_TEST_CRI_ENDPOINT unset; run `. /tmp/nodelet-test/env.sh`)");
        return Ok(());
    };
    let settings = Settings::from_env()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run(env, settings))
}

async fn run(env: Env, settings: Settings) -> anyhow::Result<()> {
    let cri = CriClient::connect(CriConfig::new(env.endpoint.clone()))
        .await
        .with_context(|| format!("cannot connect to {}", env.endpoint))?;
    let run_id = format!("bench-{}", std::process::id());
    let dir = tempfile::Builder::new().prefix("nodelet-bench-").tempdir()?;
    println!(
        "pods bench: runtime {}, {} pods, {} single-pod rounds",
        env.endpoint, settings.pods, settings.rounds
    );
    println!("machine: {} CPUs, load average {}", cpus(), loadavg());

    let floor = Floor {
        cri: cri.clone(),
        env: env.clone(),
        run_id: run_id.clone(),
        log_root: dir.path().join("floor"),
    };
    let result = measure(&floor, &env, &settings, dir.path(), &run_id).await;
    // Whatever happened: nothing of this run stays on the runtime.
    let swept = sweep(&cri, SandboxFilter::all().label(RUN_LABEL, run_id.clone())).await
        + sweep(&cri, SandboxFilter::managed().label(labels::NODE, run_id.clone())).await;
    if swept > 0 {
        println!("removed {swept} leftover sandbox(es)");
    }
    // The runtime removes the containers' cgroups but not the floor's pod cgroups (the kubelet's job).
    remove_pod_cgroups(&env.cgroup_parent, &format!("pod{run_id}-"));
    if settings.keep_log {
        let kept = dir.keep();
        println!("nodelet's log: {}", kept.join("nodelet.log").display());
    }
    result
}

/// The figures.
#[derive(Debug, Default)]
struct Figures {
    /// Parallelism sweep of the floor: (parallelism, wall time).
    floor_sweep: Vec<(usize, Duration)>,
    /// Paired rounds of N pods: (floor at the best parallelism, nodelet).
    many: Vec<(Start, Start)>,
    floor_one: Vec<Duration>,
    nodelet_one: Vec<Duration>,
    rss_kib: u64,
    anon_kib: u64,
    hwm_kib: u64,
    idle_cpu: f64,
    idle_secs: f64,
}

/// One start of N pods: wall time, and the CPU time containerd and nodelet used meanwhile.
#[derive(Debug, Clone, Copy, Default)]
struct Start {
    took: Duration,
    containerd_cpu: Duration,
    nodelet_cpu: Duration,
}

async fn measure(
    floor: &Floor,
    env: &Env,
    settings: &Settings,
    dir: &Path,
    run_id: &str,
) -> anyhow::Result<()> {
    let mut figures = Figures::default();
    let n = settings.pods;
    let containerd = env.containerd_pid();

    // ---- floor: N pods at each parallelism; the best one is the floor
    for &p in &settings.parallelism {
        let took = floor.start_many(n, p).await?;
        let (removed, teardown) = floor.teardown().await?;
        println!(
            "floor: {n} pods at parallelism {p}: {} (teardown of {removed}: {})",
            ms(took),
            ms(teardown)
        );
        figures.floor_sweep.push((p, took));
    }
    let best = figures.floor_sweep.iter().min_by_key(|(_, d)| *d).map_or(1, |(p, _)| *p);

    // ---- nodelet, in rounds paired with the floor (the machine's load changes over minutes)
    let mut nodelet = Nodelet::start(env, dir, run_id).await?;
    let result = measure_nodelet(&mut nodelet, floor, best, containerd, settings, &mut figures).await;
    let stopped = nodelet.stop().await;
    result?;
    stopped?;
    report(&figures, n, best);
    Ok(())
}

async fn measure_nodelet(
    nodelet: &mut Nodelet,
    floor: &Floor,
    best: usize,
    containerd: Option<u32>,
    settings: &Settings,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let n = settings.pods;
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
    let cpu = |pid: Option<u32>| pid.and_then(|p| cpu_ticks(p).ok()).unwrap_or(0);
    let ticks = |t: u64| Duration::from_secs_f64(t as f64 / USER_HZ);
    for round in 0..settings.many_rounds {
        // the floor
        let c0 = cpu(containerd);
        let took = floor.start_many(n, best).await?;
        let floor_start =
            Start { took, containerd_cpu: ticks(cpu(containerd) - c0), nodelet_cpu: Duration::ZERO };
        floor.teardown().await?;
        sleep(Duration::from_secs(1)).await;

        // nodelet
        let (c0, n0, metrics0) = (cpu(containerd), cpu(Some(nodelet.pid()?)), nodelet.metrics().await?);
        let took = nodelet.start_pods(&names).await?;
        let (c1, n1, metrics1) = (cpu(containerd), cpu(Some(nodelet.pid()?)), nodelet.metrics().await?);
        let delta = |name: &str| {
            metrics1.get(name).copied().unwrap_or(0.0) - metrics0.get(name).copied().unwrap_or(0.0)
        };
        let start = Start { took, containerd_cpu: ticks(c1 - c0), nodelet_cpu: ticks(n1 - n0) };
        println!(
            "round {}: {n} pods: floor {} (containerd CPU {}), nodelet {} (containerd CPU {}, nodelet CPU {}; \
             {} PLEG relists, {} operations) = {:.2}×",
            round + 1,
            ms(floor_start.took),
            ms(floor_start.containerd_cpu),
            ms(start.took),
            ms(start.containerd_cpu),
            ms(start.nodelet_cpu),
            delta("kubelet_pleg_relist_duration_seconds_count"),
            delta("reconcile_engine_operations_total"),
            start.took.as_secs_f64() / floor_start.took.as_secs_f64(),
        );
        figures.many.push((floor_start, start));

        if round == 0 {
            // idle with N pods: let the start settle, then sample
            sleep(Duration::from_secs(3)).await;
            let (cpu, secs) = nodelet.cpu_over(settings.idle).await?;
            let (rss, hwm, anon) = nodelet.memory()?;
            println!(
                "nodelet: idle with {n} pods for {secs:.0} s: {:.2}% of a core, VmRSS {:.1} MiB (VmHWM {:.1} MiB, \
                 private RssAnon {:.1} MiB)",
                cpu * 100.0,
                rss as f64 / 1024.0,
                hwm as f64 / 1024.0,
                anon as f64 / 1024.0
            );
            figures.anon_kib = anon;
            figures.idle_cpu = cpu;
            figures.idle_secs = secs;
            figures.rss_kib = rss;
            figures.hwm_kib = hwm;
        }
        let took = nodelet.remove_pods(&names).await?;
        println!(
            "nodelet: {n} pods removed (manifests deleted → gone from /pods and the runtime): {}",
            ms(took)
        );
        sleep(Duration::from_secs(1)).await;
    }

    for round in 0..settings.rounds {
        let floor_took = floor.start_many(1, 1).await?;
        floor.teardown().await?;
        let name = vec![format!("single-{round}")];
        let took = nodelet.start_pods(&name).await?;
        nodelet.remove_pods(&name).await?;
        println!("one pod, round {}: floor {}, nodelet {}", round + 1, ms(floor_took), ms(took));
        figures.floor_one.push(floor_took);
        figures.nodelet_one.push(took);
    }
    Ok(())
}

fn report(f: &Figures, n: usize, best: usize) {
    let floor_many = median(&f.many.iter().map(|(fl, _)| fl.took).collect::<Vec<_>>());
    let nodelet_many = median(&f.many.iter().map(|(_, nd)| nd.took).collect::<Vec<_>>());
    let ratios: Vec<String> = f
        .many
        .iter()
        .map(|(fl, nd)| format!("{:.2}", nd.took.as_secs_f64() / fl.took.as_secs_f64()))
        .collect();
    let floor_one = median(&f.floor_one);
    let nodelet_one = median(&f.nodelet_one);
    println!();
    println!("| figure | value | goal |");
    println!("|---|---|---|");
    for (p, d) in &f.floor_sweep {
        println!("| floor: {n} pods, direct CRI, parallelism {p} | {} | |", ms(*d));
    }
    println!(
        "| floor: {n} pods at parallelism {best} (median of {} rounds) | {} | |",
        f.many.len(),
        ms(floor_many)
    );
    println!(
        "| nodelet: {n} manifests → all Running in /pods (median of {} rounds) | {} = {:.2}× the floor (per round: {}) | ≤ 1.10× |",
        f.many.len(),
        ms(nodelet_many),
        nodelet_many.as_secs_f64() / floor_many.as_secs_f64(),
        ratios.join(", ")
    );
    let containerd_floor = median(&f.many.iter().map(|(fl, _)| fl.containerd_cpu).collect::<Vec<_>>());
    let containerd_nodelet = median(&f.many.iter().map(|(_, nd)| nd.containerd_cpu).collect::<Vec<_>>());
    let nodelet_cpu = median(&f.many.iter().map(|(_, nd)| nd.nodelet_cpu).collect::<Vec<_>>());
    println!(
        "| CPU during the {n}-pod start (median): containerd with the floor / with nodelet; nodelet | {} / {}; {} | |",
        ms(containerd_floor),
        ms(containerd_nodelet),
        ms(nodelet_cpu)
    );
    let extra = median(
        &f.floor_one.iter().zip(&f.nodelet_one).map(|(fl, nd)| nd.saturating_sub(*fl)).collect::<Vec<_>>(),
    );
    println!("| floor: one pod (median of {}) | {} | |", f.floor_one.len(), ms(floor_one));
    println!(
        "| nodelet: one manifest → Running (median of {}; min {}, max {}) | {} = floor + {} (median of the \
         per-round differences: + {}) | floor + 50 ms |",
        f.nodelet_one.len(),
        ms(f.nodelet_one.iter().min().copied().unwrap_or_default()),
        ms(f.nodelet_one.iter().max().copied().unwrap_or_default()),
        ms(nodelet_one),
        ms(nodelet_one.saturating_sub(floor_one)),
        ms(extra)
    );
    println!(
        "| nodelet idle with {n} pods: RSS (VmRSS; VmHWM) | {:.1} MiB ({:.1} MiB) | < 20 MiB |",
        f.rss_kib as f64 / 1024.0,
        f.hwm_kib as f64 / 1024.0
    );
    println!(
        "| nodelet idle with {n} pods: private memory (RssAnon; the rest of VmRSS is the binary's code) | {:.1} MiB | |",
        f.anon_kib as f64 / 1024.0
    );
    println!(
        "| nodelet idle with {n} pods: CPU over {:.0} s | {:.2}% of a core | < 1% |",
        f.idle_secs,
        f.idle_cpu * 100.0
    );
}

// ------------------------------------------------------------------------------------------------ floor

/// The minimal direct CRI client.
#[derive(Debug)]
struct Floor {
    cri: CriClient,
    env: Env,
    run_id: String,
    log_root: PathBuf,
}

impl Floor {
    /// Starts `n` pods with at most `parallelism` in flight; the wall time until every StartContainer returned.
    async fn start_many(&self, n: usize, parallelism: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
            .map(|i| self.start_one(i))
            .buffer_unordered(parallelism)
            .collect()
            .await;
        let took = started.elapsed();
        results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        Ok(took)
    }

    async fn start_one(&self, i: usize) -> anyhow::Result<()> {
        let uid = format!("{}-{i}-{}", self.run_id, fastrand_suffix());
        let name = format!("floor-{i}");
        let log_dir = self.log_root.join(&uid);
        tokio::fs::create_dir_all(log_dir.join("sleep")).await?;
        let labels = HashMap::from([(RUN_LABEL.to_owned(), self.run_id.clone())]);
        let sandbox = proto::PodSandboxConfig {
            metadata: Some(proto::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.clone(),
                namespace: "default".to_owned(),
                attempt: 0,
            }),
            hostname: name,
            log_directory: log_dir.display().to_string(),
            dns_config: Some(proto::DnsConfig {
                servers: vec!["127.0.0.1".to_owned()],
                ..Default::default()
            }),
            labels: labels.clone(),
            linux: Some(proto::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{uid}", self.env.cgroup_parent.trim_end_matches('/')),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self.cri.run_pod_sandbox(sandbox.clone(), "").await.context("RunPodSandbox")?;
        let container = proto::ContainerConfig {
            metadata: Some(proto::ContainerMetadata { name: "sleep".to_owned(), attempt: 0 }),
            image: Some(proto::ImageSpec { image: self.env.busybox.clone(), ..Default::default() }),
            command: vec!["sleep".to_owned(), "3600".to_owned()],
            log_path: "sleep/0.log".to_owned(),
            labels,
            ..Default::default()
        };
        let cid = self.cri.create_container(&id, container, sandbox).await.context("CreateContainer")?;
        self.cri.start_container(&cid).await.context("StartContainer")?;
        Ok(())
    }

    /// Stops and removes every pod of this run: how many, and how long it took.
    async fn teardown(&self) -> anyhow::Result<(usize, Duration)> {
        let started = Instant::now();
        let n = sweep(&self.cri, SandboxFilter::all().label(RUN_LABEL, self.run_id.clone())).await;
        let left =
            self.cri.list_pod_sandboxes(&SandboxFilter::all().label(RUN_LABEL, self.run_id.clone())).await?;
        if !left.is_empty() {
            bail!("{} floor sandbox(es) could not be removed", left.len());
        }
        Ok((n, started.elapsed()))
    }
}

/// A unique-enough suffix for pod UIDs (the process id is in the run id; this separates rounds).
fn fastrand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

/// Removes the (empty) cgroups `<hierarchy>/<parent>/<prefix>*` in every cgroup hierarchy (v1 and v2).
fn remove_pod_cgroups(parent: &str, prefix: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    let mut dirs: Vec<PathBuf> = vec![PathBuf::from("/sys/fs/cgroup")];
    dirs.extend(hierarchies.flatten().map(|e| e.path()).filter(|p| p.is_dir() && !p.is_symlink()));
    for hierarchy in dirs {
        let Ok(entries) = std::fs::read_dir(hierarchy.join(parent.trim_matches('/'))) else { continue };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------ nodelet

/// The nodelet binary under test, on the external runtime.
#[derive(Debug)]
struct Nodelet {
    child: Child,
    cri: CriClient,
    node: String,
    manifests: PathBuf,
    http: reqwest::Client,
    pods_url: String,
}

impl Nodelet {
    async fn start(env: &Env, dir: &Path, node: &str) -> anyhow::Result<Nodelet> {
        let manifests = dir.join("manifests");
        for sub in ["root", "manifests", "logs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let (read_only, main, healthz) = (free_port()?, free_port()?, free_port()?);
        let log = std::fs::File::create(dir.join("nodelet.log"))?;
        let path = |p: &str| dir.join(p).display().to_string();
        let args = [
            ("--root-dir", path("root")),
            ("--pod-manifest-path", path("manifests")),
            ("--pod-logs-dir", path("logs")),
            ("--container-runtime-endpoint", env.endpoint.clone()),
            ("--hostname-override", node.to_owned()),
            ("--address", "127.0.0.1".to_owned()),
            ("--read-only-port", read_only.to_string()),
            ("--port", main.to_string()),
            ("--healthz-port", healthz.to_string()),
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
        };
        let healthz_url = format!("http://127.0.0.1:{healthz}/healthz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = nodelet.child.try_wait()? {
                bail!("nodelet exited during start-up ({status}); see {}", dir.join("nodelet.log").display());
            }
            if nodelet.http.get(&healthz_url).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() >= deadline {
                bail!("nodelet not healthy within 30 s");
            }
            sleep(POLL).await;
        }
        Ok(nodelet)
    }

    /// The pid (for /proc).
    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("nodelet has exited")
    }

    /// Writes one manifest per name (each complete before it appears: written aside, then renamed), and
    /// returns the time from the first write until every pod is Running in `/pods`.
    async fn start_pods(&mut self, names: &[String]) -> anyhow::Result<Duration> {
        let started = Instant::now();
        for name in names {
            let tmp = self.manifests.join(format!(".{name}.yaml.tmp"));
            std::fs::write(&tmp, manifest(name))?;
            std::fs::rename(&tmp, self.manifests.join(format!("{name}.yaml")))?;
        }
        let wanted: Vec<String> = names.iter().map(|n| format!("{n}-{}", self.node)).collect();
        loop {
            let pods = self.pods().await?;
            if wanted.iter().all(|w| pods.get(w).is_some_and(|running| *running)) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > DEADLINE {
                bail!("pods not Running within {DEADLINE:?}: {pods:?}");
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("nodelet exited ({status})");
            }
            sleep(POLL).await;
        }
    }

    /// Deletes the manifests and waits until the pods are gone from `/pods` and from the runtime.
    async fn remove_pods(&mut self, names: &[String]) -> anyhow::Result<Duration> {
        let started = Instant::now();
        for name in names {
            std::fs::remove_file(self.manifests.join(format!("{name}.yaml")))?;
        }
        let wanted: Vec<String> = names.iter().map(|n| format!("{n}-{}", self.node)).collect();
        loop {
            let pods = self.pods().await?;
            let in_runtime = self
                .cri
                .list_pod_sandboxes(&SandboxFilter::managed().label(labels::NODE, self.node.clone()))
                .await?;
            let containers = self
                .cri
                .list_containers(&ContainerFilter::managed().label(labels::NODE, self.node.clone()))
                .await?;
            if !wanted.iter().any(|w| pods.contains_key(w)) && in_runtime.is_empty() && containers.is_empty()
            {
                return Ok(started.elapsed());
            }
            if started.elapsed() > DEADLINE {
                bail!("pods not removed within {DEADLINE:?}");
            }
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

    /// `/metrics` on the read-only port: each metric name → the sum of its samples.
    async fn metrics(&self) -> anyhow::Result<HashMap<String, f64>> {
        let url = self.pods_url.replace("/pods", "/metrics");
        let text = self.http.get(&url).send().await?.error_for_status()?.text().await?;
        let mut sums = HashMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let name = series.split('{').next().unwrap_or(series);
            if let Ok(v) = value.parse::<f64>() {
                *sums.entry(name.to_owned()).or_insert(0.0) += v;
            }
        }
        Ok(sums)
    }

    /// nodelet's CPU use over `window` (cores) and the window's length in seconds.
    async fn cpu_over(&self, window: Duration) -> anyhow::Result<(f64, f64)> {
        let pid = self.pid()?;
        let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
        sleep(window).await;
        let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
        let secs = (t1 - t0).as_secs_f64();
        Ok(((c1.saturating_sub(c0)) as f64 / USER_HZ / secs, secs))
    }

    /// VmRSS, VmHWM and RssAnon (private memory; the rest of VmRSS is clean, shared file pages: the
    /// binary's code) in KiB.
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
        let pid = self.pid()?;
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

/// A busybox `sleep 3600` static pod.
fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  dnsPolicy: None\n  dnsConfig:\n    nameservers: [\"127.0.0.1\"]\n  \
         containers:\n  - name: sleep\n    image: localhost/nodelet/busybox:latest\n    \
         imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    )
}

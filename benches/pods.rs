//! Pod start benchmark at scale: nodelet against a minimal direct CRI client, on a real containerd, for
//! a series of pod counts (10, 30, 110 and 250 by default).
//!
//! A program that prints figures (`harness = false`), not a timed test. It needs the real-runtime test set-up
//! (`scripts/runtime-up.sh`; `. /tmp/nodelet-test/env.sh` exports what is read here) and root:
//!
//! ```text
//! . /tmp/nodelet-test/env.sh && cargo bench --bench pods
//! ```
//!
//! Without `NODELET_TEST_CRI_ENDPOINT` it prints a note and exits 0 (`NODELET_REQUIRE_RUNTIME=1` makes that an
//! error). Every pod is the same busybox pod on both sides: `sh` (exits on SIGTERM) running `httpd` on port
//! 8080; nodelet's pods also have an HTTP readiness probe every 10 s. For each pod count N:
//!
//! 1. **Floor**: a direct [`CriClient`] doing RunPodSandbox + CreateContainer + StartContainer for N pods at
//!    each parallelism of `NODELET_BENCH_PARALLELISM`; the fastest is the floor's for N. Its teardown is
//!    StopContainer (1 s grace) + StopPodSandbox + RemovePodSandbox, 8 pods at a time.
//! 2. **nodelet** (the binary cargo builds for this bench, release optimisations; one process for the whole
//!    series, `--max-pods` the largest N), in rounds paired with the floor (floor, then nodelet, so both see the
//!    same machine load): N manifests written at once, then the time until all N are `Running` (every
//!    container running) in `/pods` on the read-only port, polled every 20 ms or, when an answer takes longer
//!    than 2 ms, ten times its time apart (the polls cost nodelet CPU). A pod's start latency is the
//!    time from the first manifest write (the floor: from its first call) until it is first seen running (the
//!    floor: its StartContainer returned). Removal: the manifests deleted → the pods gone from `/pods` and
//!    from the runtime (sandboxes included), against the floor's teardown of the same round.
//! 3. After the first round, idle with N pods: nodelet's VmRSS, RssAnon and CPU over
//!    `NODELET_BENCH_IDLE_SECS` and how many PLEG relists the window held; then the PLEG relist on the idle
//!    node: while the runtime's events come nodelet relists only every 60–66 s, so the bench waits (up to 70 s
//!    each) for the next relists and times each (`kubelet_pleg_relist_duration_seconds`, scraped every 250 ms): one at each pod
//!    count, `NODELET_BENCH_RELISTS` (default 3) at the largest, where the median is taken; beside it its
//!    floor, the median of 20 bare relists through the bench's own [`CriClient`] (ListPodSandbox and
//!    ListContainers at once, with nodelet's filters, on the same N pods, decoded lean as nodelet decodes them
//!    (`nodelet_cri::listing`): the gRPC round trip and the decoding without nodelet's work; 50 ms apart, so
//!    all but the first run warm: the first is printed too), and
//!    between them as many listings by nodelet's own listing code (`CriPodRuntime::list_pods`) in the bench's
//!    process, which tell the driver's share of a relist from the daemon's; then
//!    `/pods` and `/stats/summary` each requested 20 times in a row (latency to
//!    the last byte).
//! 4. After the series: one pod, several rounds, floor and nodelet paired (medians).
//!
//! Each figure of a round series is the median, with the spread (min–max) beside it. At the end the figures are
//! printed as a table, each per-pod cost as a line fitted over the series (`a + b × N`), and, unless
//! `NODELET_BENCH_OUT` is empty, written to `<out>/pods-scale.md` and plotted in `<out>/pods-scale.svg`
//! (default `<out>`: the repository's `docs/`).
//!
//! Environment: `NODELET_BENCH_PODS` (the series, default `10,30,110,250`), `NODELET_BENCH_MANY_ROUNDS` (N-pod
//! rounds, default 3), `NODELET_BENCH_ROUNDS` (single-pod rounds, default 5), `NODELET_BENCH_IDLE_SECS` (default
//! 30), `NODELET_BENCH_RELISTS` (relists timed at the largest pod count, default 3),
//! `NODELET_BENCH_PARALLELISM` (floor parallelisms, default `4,8`), `NODELET_BENCH_OUT`,
//! `NODELET_BENCH_CONFIG` (a KubeletConfiguration file nodelet is started with, `--config`; the bench's flags
//! win over it),
//! `NODELET_BENCH_KEEP_LOG=1` (print and keep nodelet's log directory), `NODELET_BENCH_LOG` (nodelet's
//! `RUST_LOG`, e.g. `info,nodelet_sources=debug,reconcile_engine=debug` to see where the time goes).
//!
//! Every pod it creates is removed at the end, also after an error: the floor's by their run label, nodelet's
//! by nodelet itself (manifests removed) and then by its node label.

#[path = "common/mod.rs"]
mod common;
use common::{USER_HZ, cpu_ticks, cpus, env_number, free_port, loadavg, median, ms, sweep};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use nodelet_cri::{
    ContainerFilter, CriClient, CriConfig, CriPodRuntime, CriPodRuntimeConfig, SandboxFilter, labels, proto,
};
use nodelet_resources::pod::driver::PodRuntime;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

/// How often `/pods` is polled at most.
const POLL: Duration = Duration::from_millis(20);
/// The pause after a `/pods` poll is at least this many times the poll's own time, so that the bench's
/// polling takes at most about a tenth of a core from nodelet (and from containerd beside it). At 110
/// and 250 pods, polling every 20 ms whatever the answer cost took 1.5–7 s of nodelet's CPU during a
/// start: most of what was counted as nodelet's cost of starting the pods (see docs/benchmarks.md).
const POLL_COST_FACTOR: u32 = 10;

/// The pause after a poll that took `took`.
fn poll_pause(took: Duration) -> Duration {
    took.saturating_mul(POLL_COST_FACTOR).max(POLL)
}
/// How long a start or a teardown may take before the bench gives up.
const DEADLINE: Duration = Duration::from_secs(300);
/// Label on the floor's sandboxes and containers: the run they belong to.
const RUN_LABEL: &str = "io.nodelet.bench.run";
/// How many times `/pods` and `/stats/summary` are requested for their latency.
const LATENCY_REQUESTS: usize = 20;
/// How long the idle measurement waits for each relist it times: while the runtime's events come the
/// PLEG relists every 60 s plus up to a tenth of that at random (`EVENTED_RELIST_JITTER`), so up to
/// 66 s apart, and the relist itself takes a moment. (65 s, before, missed every relist drawn more than
/// 5 s late: run G timed 5 of the 7 it asked for.) The assertion below keeps it past that.
const IDLE_RELIST_WAIT: Duration = Duration::from_secs(70);
const _: () = assert!(
    IDLE_RELIST_WAIT.as_secs_f64()
        > nodelet_resources::pod::pleg::DEFAULT_EVENTED_RELIST_PERIOD.as_secs_f64()
            * (1.0 + nodelet_resources::pod::pleg::EVENTED_RELIST_JITTER),
    "the wait for a relist must outlast the longest evented relist period"
);

/// How many bare relists make the relist floor.
const RELIST_FLOOR_ROUNDS: usize = 20;
/// The pod's command (both sides): `httpd` serving a page, `sh` ending on SIGTERM.
const POD_SCRIPT: &str =
    "mkdir -p /www; echo ok > /www/index.html; trap 'exit 0' TERM; httpd -f -p 8080 -h /www & wait";

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
    series: Vec<usize>,
    many_rounds: usize,
    rounds: usize,
    idle: Duration,
    /// How many idle relists are timed at the largest pod count (one at the others).
    relists: usize,
    parallelism: Vec<usize>,
    keep_log: bool,
    out: Option<PathBuf>,
}

/// A comma-separated list of numbers from the environment variable `name`, else `default`.
fn env_list(name: &str, default: &[usize]) -> anyhow::Result<Vec<usize>> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .map(|p| p.trim().parse::<usize>().with_context(|| format!("{name}: bad number {p:?}")))
            .collect(),
        Err(_) => Ok(default.to_vec()),
    }
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let out = match std::env::var("NODELET_BENCH_OUT") {
            Ok(v) if v.is_empty() => None,
            Ok(v) => Some(PathBuf::from(v)),
            Err(_) => Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")),
        };
        let mut series = env_list("NODELET_BENCH_PODS", &[10, 30, 110, 250])?;
        series.sort_unstable();
        series.dedup();
        let settings = Settings {
            series,
            many_rounds: env_number("NODELET_BENCH_MANY_ROUNDS", 3)?,
            rounds: env_number("NODELET_BENCH_ROUNDS", 5)?,
            idle: Duration::from_secs(env_number("NODELET_BENCH_IDLE_SECS", 30)? as u64),
            relists: env_number("NODELET_BENCH_RELISTS", 3)?,
            parallelism: env_list("NODELET_BENCH_PARALLELISM", &[4, 8])?,
            keep_log: std::env::var("NODELET_BENCH_KEEP_LOG").as_deref() == Ok("1"),
            out,
        };
        if settings.series.is_empty()
            || settings.series.contains(&0)
            || settings.rounds == 0
            || settings.many_rounds == 0
            || settings.relists == 0
            || settings.parallelism.is_empty()
            || settings.parallelism.contains(&0)
        {
            bail!("pod counts, rounds and parallelism must be at least 1");
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
        "pods bench: runtime {}, pod counts {:?}, {} rounds each, {} single-pod rounds",
        env.endpoint, settings.series, settings.many_rounds, settings.rounds
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

/// One start of N pods: wall time, each pod's latency, and the CPU time containerd and nodelet used.
#[derive(Debug, Clone, Default)]
struct Start {
    took: Duration,
    per_pod: Vec<Duration>,
    containerd_cpu: Duration,
    nodelet_cpu: Duration,
}

/// One paired round: the floor's start and teardown, nodelet's start and removal.
#[derive(Debug, Clone, Default)]
struct Round {
    floor: Start,
    floor_teardown: Duration,
    nodelet: Start,
    nodelet_removal: Duration,
}

/// The figures of one pod count.
#[derive(Debug, Default)]
struct Scale {
    n: usize,
    /// Parallelism sweep of the floor: (parallelism, wall time).
    floor_sweep: Vec<(usize, Duration)>,
    best: usize,
    rounds: Vec<Round>,
    rss_kib: u64,
    anon_kib: u64,
    hwm_kib: u64,
    idle_cpu: f64,
    idle_secs: f64,
    /// The PLEG relists timed on the idle node.
    pleg_relist: Vec<Duration>,
    /// How many relists the idle window held.
    idle_relists: f64,
    /// The evented PLEG's pod reads over every round's start and removal: how many, and their total time.
    pod_reads: (f64, f64),
    /// Its floor: the time of each bare relist through the bench's client.
    relist_floor: Vec<Duration>,
    /// nodelet's listing code (the CRI pod runtime's `list_pods`) run in the bench's process between
    /// the bare relists: the driver's share of a relist without the daemon around it.
    driver_relist: Vec<Duration>,
    pods_latency: Vec<Duration>,
    summary_latency: Vec<Duration>,
    /// Bytes of the `/pods` and `/stats/summary` answers.
    pods_bytes: usize,
    summary_bytes: usize,
}

/// The whole run.
#[derive(Debug, Default)]
struct Figures {
    /// `/proc/loadavg` when the run began (the table is written after 250 pods came and went, when the load
    /// average still counts their processes).
    load_at_start: String,
    scales: Vec<Scale>,
    floor_one: Vec<Duration>,
    nodelet_one: Vec<Duration>,
}

async fn measure(
    floor: &Floor,
    env: &Env,
    settings: &Settings,
    dir: &Path,
    run_id: &str,
) -> anyhow::Result<()> {
    let mut figures = Figures { load_at_start: loadavg(), ..Figures::default() };
    let containerd = env.containerd_pid();
    let max_pods = settings.series.iter().copied().max().unwrap_or(110).max(110);
    let mut nodelet = Nodelet::start(env, dir, run_id, max_pods).await?;
    let result = measure_series(&mut nodelet, floor, containerd, settings, &mut figures).await;
    let stopped = nodelet.stop().await;
    result?;
    stopped?;
    report(&figures, settings)
}

async fn measure_series(
    nodelet: &mut Nodelet,
    floor: &Floor,
    containerd: Option<u32>,
    settings: &Settings,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    for &n in &settings.series {
        let mut scale = Scale { n, ..Scale::default() };
        // ---- floor: N pods at each parallelism; the fastest is the floor's
        for &p in &settings.parallelism {
            let (start, _) = floor.start_many(n, p).await?;
            let (removed, teardown) = floor.teardown().await?;
            println!(
                "floor: {n} pods at parallelism {p}: {} (teardown of {removed}: {})",
                ms(start),
                ms(teardown)
            );
            scale.floor_sweep.push((p, start));
        }
        scale.best = scale.floor_sweep.iter().min_by_key(|(_, d)| *d).map_or(1, |(p, _)| *p);
        measure_scale(nodelet, floor, containerd, settings, &mut scale).await?;
        print_scale(&scale);
        figures.scales.push(scale);
    }

    for round in 0..settings.rounds {
        let (floor_took, _) = floor.start_many(1, 1).await?;
        floor.teardown().await?;
        let name = vec![format!("single-{round}")];
        let (took, _) = nodelet.start_pods(&name).await?;
        nodelet.remove_pods(&name).await?;
        println!("one pod, round {}: floor {}, nodelet {}", round + 1, ms(floor_took), ms(took));
        figures.floor_one.push(floor_took);
        figures.nodelet_one.push(took);
    }
    Ok(())
}

/// The paired rounds of one pod count, and the idle figures after the first.
async fn measure_scale(
    nodelet: &mut Nodelet,
    floor: &Floor,
    containerd: Option<u32>,
    settings: &Settings,
    scale: &mut Scale,
) -> anyhow::Result<()> {
    let n = scale.n;
    let names: Vec<String> = (0..n).map(|i| format!("bench-{n}-{i}")).collect();
    let cpu = |pid: Option<u32>| pid.and_then(|p| cpu_ticks(p).ok()).unwrap_or(0);
    let ticks = |t: u64| Duration::from_secs_f64(t as f64 / USER_HZ);
    for round in 0..settings.many_rounds {
        // the floor
        let c0 = cpu(containerd);
        let (took, per_pod) = floor.start_many(n, scale.best).await?;
        let floor_start = Start {
            took,
            per_pod,
            containerd_cpu: ticks(cpu(containerd).saturating_sub(c0)),
            nodelet_cpu: Duration::ZERO,
        };
        let (_, floor_teardown) = floor.teardown().await?;
        sleep(Duration::from_secs(1)).await;

        // nodelet
        let (c0, n0, metrics0) = (cpu(containerd), cpu(Some(nodelet.pid()?)), nodelet.metrics().await?);
        let (took, per_pod) = nodelet.start_pods(&names).await?;
        let (c1, n1, metrics1) = (cpu(containerd), cpu(Some(nodelet.pid()?)), nodelet.metrics().await?);
        let delta = |name: &str| {
            metrics1.get(name).copied().unwrap_or(0.0) - metrics0.get(name).copied().unwrap_or(0.0)
        };
        let start = Start {
            took,
            per_pod,
            containerd_cpu: ticks(c1.saturating_sub(c0)),
            nodelet_cpu: ticks(n1.saturating_sub(n0)),
        };
        println!(
            "{n} pods, round {}: floor {} (containerd CPU {}), nodelet {} (containerd CPU {}, nodelet CPU {}; \
             {} PLEG relists, {} PLEG pod reads, {} operations) = {:.2}×",
            round + 1,
            ms(floor_start.took),
            ms(floor_start.containerd_cpu),
            ms(start.took),
            ms(start.containerd_cpu),
            ms(start.nodelet_cpu),
            delta("kubelet_pleg_relist_duration_seconds_count"),
            delta("nodelet_pleg_pod_read_duration_seconds_count"),
            delta("reconcile_engine_operations_total"),
            start.took.as_secs_f64() / floor_start.took.as_secs_f64(),
        );

        println!("{n} pods, round {}: nodelet's CRI calls: {}", round + 1, cri_calls(&metrics0, &metrics1));

        if round == 0 {
            measure_idle(nodelet, settings, scale).await?;
        }
        let removal = nodelet.remove_pods(&names).await?;
        let metrics2 = nodelet.metrics().await?;
        let reads = |name: &str| {
            metrics2.get(name).copied().unwrap_or(0.0) - metrics0.get(name).copied().unwrap_or(0.0)
        };
        scale.pod_reads.0 += reads("nodelet_pleg_pod_read_duration_seconds_count");
        scale.pod_reads.1 += reads("nodelet_pleg_pod_read_duration_seconds_sum");
        println!(
            "{n} pods, round {}: removed (manifests deleted → gone from /pods and the runtime) in {}; floor \
             teardown {}",
            round + 1,
            ms(removal),
            ms(floor_teardown)
        );
        scale.rounds.push(Round {
            floor: floor_start,
            floor_teardown,
            nodelet: start,
            nodelet_removal: removal,
        });
        sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// nodelet's CRI calls (`kubelet_runtime_operations_total`).
const CRI_CALLS: &str = "kubelet_runtime_operations_total";

/// The CRI calls made between the scrapes `before` and `after`, most frequent first: `"list_containers 512, …"`.
fn cri_calls(before: &HashMap<String, f64>, after: &HashMap<String, f64>) -> String {
    let mut calls: Vec<(String, f64)> = after
        .iter()
        .filter_map(|(series, v)| {
            let labels = series.strip_prefix(CRI_CALLS)?.strip_prefix('{')?;
            let op = labels.split("operation_type=\"").nth(1)?.split('"').next()?;
            Some((op.to_owned(), v - before.get(series).copied().unwrap_or(0.0)))
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    calls.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let calls: Vec<String> = calls.iter().map(|(op, n)| format!("{op} {n}")).collect();
    calls.join(", ")
}

/// Idle with N pods (readiness probes every 10 s): memory, CPU, PLEG relists, `/pods` and `/stats/summary`.
async fn measure_idle(nodelet: &Nodelet, settings: &Settings, scale: &mut Scale) -> anyhow::Result<()> {
    // let the start settle (and the first summary be gathered), then sample
    sleep(Duration::from_secs(5)).await;
    let m0 = nodelet.metrics().await?;
    let (cpu, secs) = nodelet.cpu_over(settings.idle).await?;
    let m1 = nodelet.metrics().await?;
    let delta = |name: &str| m1.get(name).copied().unwrap_or(0.0) - m0.get(name).copied().unwrap_or(0.0);
    let relists = delta("kubelet_pleg_relist_duration_seconds_count");
    // while the runtime's events come the PLEG relists once a minute: time the next relists on the
    // idle node, each alone (not the mean over nodelet's life, which holds relists made under load)
    let wanted = if Some(&scale.n) == settings.series.last() { settings.relists } else { 1 };
    let waiting = Instant::now();
    scale.pleg_relist = nodelet.next_relists(wanted, IDLE_RELIST_WAIT).await?;
    let waited = waiting.elapsed();
    scale.idle_relists = relists;
    (scale.relist_floor, scale.driver_relist) = nodelet.relist_floor(RELIST_FLOOR_ROUNDS).await?;
    let (rss, hwm, anon) = nodelet.memory()?;
    (scale.rss_kib, scale.hwm_kib, scale.anon_kib) = (rss, hwm, anon);
    (scale.idle_cpu, scale.idle_secs) = (cpu, secs);
    let (pods, pods_bytes) = nodelet.latency("/pods", LATENCY_REQUESTS).await?;
    let (summary, summary_bytes) = nodelet.latency("/stats/summary", LATENCY_REQUESTS).await?;
    (scale.pods_latency, scale.pods_bytes) = (pods, pods_bytes);
    (scale.summary_latency, scale.summary_bytes) = (summary, summary_bytes);
    println!(
        "{} pods idle for {secs:.0} s: {:.2}% of a core, VmRSS {:.1} MiB (VmHWM {:.1} MiB, RssAnon {:.1} MiB), \
         PLEG relist {} ({relists} relists in the window; {} timed over the next {:.0} s; floor {}, the first {}; \
         nodelet's listing code in the bench's process {}); \
         /pods {} ({} KiB), /stats/summary {} ({} KiB)",
        scale.n,
        cpu * 100.0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        anon as f64 / 1024.0,
        relist_figure(&scale.pleg_relist),
        scale.pleg_relist.len(),
        waited.as_secs_f64(),
        spread(&scale.relist_floor),
        scale.relist_floor.first().map_or("-".to_owned(), |d| us(*d)),
        spread(&scale.driver_relist),
        spread(&scale.pods_latency),
        pods_bytes / 1024,
        spread(&scale.summary_latency),
        summary_bytes / 1024,
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------------ report

fn us(d: Duration) -> String {
    if d < Duration::from_millis(10) { format!("{:.2} ms", d.as_secs_f64() * 1000.0) } else { ms(d) }
}

/// The relists timed: one alone, several as their median with the spread; `-` when none came.
fn relist_figure(v: &[Duration]) -> String {
    match v {
        [] => "-".to_owned(),
        [one] => us(*one),
        _ => spread(v),
    }
}

/// Each of `v`, in order.
fn list_us(v: &[Duration]) -> String {
    v.iter().map(|d| us(*d)).collect::<Vec<_>>().join(", ")
}

/// The median, with the spread: `median (min–max)`.
fn spread(v: &[Duration]) -> String {
    let (min, max) =
        (v.iter().min().copied().unwrap_or_default(), v.iter().max().copied().unwrap_or_default());
    format!("{} ({}–{})", us(median(v)), us(min), us(max))
}

/// The `q`-quantile (0..=1) by the nearest-rank method.
fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Ratios nodelet / floor per round, and their median.
fn ratios(rounds: &[Round], pick: impl Fn(&Round) -> (Duration, Duration)) -> (f64, Vec<f64>) {
    let all: Vec<f64> = rounds
        .iter()
        .map(|r| {
            let (floor, nodelet) = pick(r);
            nodelet.as_secs_f64() / floor.as_secs_f64().max(1e-9)
        })
        .collect();
    let mut sorted = all.clone();
    sorted.sort_by(f64::total_cmp);
    (sorted.get(sorted.len() / 2).copied().unwrap_or(0.0), all)
}

fn print_scale(s: &Scale) {
    let floor: Vec<Duration> = s.rounds.iter().map(|r| r.floor.took).collect();
    let nodelet: Vec<Duration> = s.rounds.iter().map(|r| r.nodelet.took).collect();
    let (ratio, all) = ratios(&s.rounds, |r| (r.floor.took, r.nodelet.took));
    println!(
        "{} pods: floor {} at parallelism {}, nodelet {}: {ratio:.2}× (rounds {})",
        s.n,
        spread(&floor),
        s.best,
        spread(&nodelet),
        all.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ")
    );
}

/// A least-squares line `a + b x` through the points.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| {
        let b = sxy / sxx;
        (my - b * mx, b)
    })
}

/// The goals of issue 15 for N pods: start ratio, removal ratio, RSS (MiB).
fn goals(n: usize) -> (Option<f64>, Option<f64>, Option<f64>) {
    match n {
        110 => (Some(1.10), Some(1.2), Some(30.0)),
        250 => (Some(1.15), None, Some(45.0)),
        _ => (None, None, None),
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

/// The table (markdown), the per-pod lines, and the plot.
fn report(f: &Figures, settings: &Settings) -> anyhow::Result<()> {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| pods | floor start (par.) | nodelet start | / floor | per-pod latency p50 / p99 (floor p50 / p99) | \
         removal (floor teardown) | / floor | RSS (RssAnon) | idle CPU | PLEG relist (floor), relists idle | /pods | /stats/summary |"
    );
    let _ = writeln!(t, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let mut notes = Vec::new();
    for s in &f.scales {
        let floor: Vec<Duration> = s.rounds.iter().map(|r| r.floor.took).collect();
        let nodelet: Vec<Duration> = s.rounds.iter().map(|r| r.nodelet.took).collect();
        let (start_ratio, start_all) = ratios(&s.rounds, |r| (r.floor.took, r.nodelet.took));
        let (removal_ratio, removal_all) = ratios(&s.rounds, |r| (r.floor_teardown, r.nodelet_removal));
        let nodelet_pods: Vec<Duration> = s.rounds.iter().flat_map(|r| r.nodelet.per_pod.clone()).collect();
        let floor_pods: Vec<Duration> = s.rounds.iter().flat_map(|r| r.floor.per_pod.clone()).collect();
        let removal: Vec<Duration> = s.rounds.iter().map(|r| r.nodelet_removal).collect();
        let teardown: Vec<Duration> = s.rounds.iter().map(|r| r.floor_teardown).collect();
        let list = |v: &[f64]| v.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(
            t,
            "| {} | {} ({}) | {} | {start_ratio:.2}× ({}) | {} / {} ({} / {}) | {} ({}) | {removal_ratio:.2}× ({}) | \
             {:.1} MiB ({:.1}) | {:.2}% | {} ({}), {:.0} in {:.0} s | {} | {} |",
            s.n,
            spread(&floor),
            s.best,
            spread(&nodelet),
            list(&start_all),
            ms(quantile(&nodelet_pods, 0.5)),
            ms(quantile(&nodelet_pods, 0.99)),
            ms(quantile(&floor_pods, 0.5)),
            ms(quantile(&floor_pods, 0.99)),
            spread(&removal),
            spread(&teardown),
            list(&removal_all),
            s.rss_kib as f64 / 1024.0,
            s.anon_kib as f64 / 1024.0,
            s.idle_cpu * 100.0,
            relist_figure(&s.pleg_relist),
            us(median(&s.relist_floor)),
            s.idle_relists,
            s.idle_secs,
            spread(&s.pods_latency),
            spread(&s.summary_latency),
        );
        let (start_goal, removal_goal, rss_goal) = goals(s.n);
        if let Some(g) = start_goal {
            notes.push(format!(
                "{} pods: start {start_ratio:.2}× the floor, goal ≤ {g:.2}×: {}",
                s.n,
                verdict(start_ratio <= g)
            ));
            let p99 = quantile(&nodelet_pods, 0.99);
            notes.push(format!(
                "{} pods: per-pod p99 {}, SLO ≤ 5 s: {}",
                s.n,
                ms(p99),
                verdict(p99 <= Duration::from_secs(5))
            ));
        }
        if let Some(g) = removal_goal {
            notes.push(format!(
                "{} pods: removal {removal_ratio:.2}× the floor's teardown, goal ≤ {g:.1}×: {}",
                s.n,
                verdict(removal_ratio <= g)
            ));
        }
        if let Some(g) = rss_goal {
            let mib = s.rss_kib as f64 / 1024.0;
            notes.push(format!("{} pods: RSS {mib:.1} MiB, goal < {g:.0} MiB: {}", s.n, verdict(mib < g)));
        }
        if s.n == 110 {
            notes.push(format!(
                "110 pods: idle CPU {:.2}% of a core, goal < 2%: {}",
                s.idle_cpu * 100.0,
                verdict(s.idle_cpu < 0.02)
            ));
            for (what, v) in [("/pods", &s.pods_latency), ("/stats/summary", &s.summary_latency)] {
                let m = median(v);
                notes.push(format!(
                    "110 pods: {what} {}, goal < 50 ms: {}",
                    us(m),
                    verdict(m < Duration::from_millis(50))
                ));
            }
        }
        if s.n == 250 && !s.pleg_relist.is_empty() {
            let p = median(&s.pleg_relist);
            notes.push(format!(
                "250 pods: PLEG relist {} (median of {}: {}; floor {}, its first bare relist {}; nodelet's listing \
                 code in the bench's process {}), goal < 5 ms: {}",
                us(p),
                s.pleg_relist.len(),
                list_us(&s.pleg_relist),
                us(median(&s.relist_floor)),
                s.relist_floor.first().map_or("-".to_owned(), |d| us(*d)),
                us(median(&s.driver_relist)),
                verdict(p < Duration::from_millis(5))
            ));
        }
        if s.pod_reads.0 > 0.0 {
            notes.push(format!(
                "{} pods: the evented PLEG's pod reads (runtime events between relists) took {} on average, {} reads \
                 over the rounds' starts and removals",
                s.n,
                us(Duration::from_secs_f64(s.pod_reads.1 / s.pod_reads.0)),
                s.pod_reads.0
            ));
        }
    }
    let floor_one = median(&f.floor_one);
    let nodelet_one = median(&f.nodelet_one);
    notes.push(format!(
        "one pod (median of {}): floor {}, nodelet {} (floor + {})",
        f.floor_one.len(),
        ms(floor_one),
        ms(nodelet_one),
        ms(nodelet_one.saturating_sub(floor_one))
    ));

    // per-pod costs: a line through the series
    let line = |name: &str, unit: &str, scale: f64, y: &dyn Fn(&Scale) -> f64| -> String {
        let points: Vec<(f64, f64)> = f.scales.iter().map(|s| (s.n as f64, y(s))).collect();
        match fit(&points) {
            Some((a, b)) => format!("{name}: {:.3} {unit} + {:.4} {unit} per pod", a * scale, b * scale),
            None => format!("{name}: (needs two pod counts)"),
        }
    };
    let lines = [
        line("RSS (VmRSS)", "MiB", 1.0 / 1024.0, &|s| s.rss_kib as f64),
        line("private memory (RssAnon)", "MiB", 1.0 / 1024.0, &|s| s.anon_kib as f64),
        line("idle CPU (readiness probe every 10 s)", "% of a core", 100.0, &|s| s.idle_cpu),
        line("nodelet CPU to start the pods", "ms", 1000.0, &|s| {
            median(&s.rounds.iter().map(|r| r.nodelet.nodelet_cpu).collect::<Vec<_>>()).as_secs_f64()
        }),
        line("/pods latency", "ms", 1000.0, &|s| median(&s.pods_latency).as_secs_f64()),
        line("/stats/summary latency", "ms", 1000.0, &|s| median(&s.summary_latency).as_secs_f64()),
        line("PLEG relist", "ms", 1000.0, &|s| median(&s.pleg_relist).as_secs_f64()),
        line("PLEG relist floor (bare list calls)", "ms", 1000.0, &|s| median(&s.relist_floor).as_secs_f64()),
    ];

    println!();
    print!("{t}");
    println!();
    for l in &lines {
        println!("- {l}");
    }
    println!();
    for n in &notes {
        println!("- {n}");
    }

    if let Some(out) = &settings.out {
        std::fs::create_dir_all(out)?;
        let mut md = format!(
            "<!-- written by `cargo bench --bench pods`; see docs/benchmarks.md -->\n\n\
             Run on {} CPUs, load average {} at its start and {} at its end; medians of {} rounds with \
             (min–max).\n\n",
            cpus(),
            f.load_at_start,
            loadavg(),
            settings.many_rounds
        );
        md.push_str(&t);
        md.push_str("\nPer-pod cost, a least-squares line over the series:\n\n");
        for l in &lines {
            let _ = writeln!(md, "- {l}");
        }
        md.push_str("\nGoals:\n\n");
        for n in &notes {
            let _ = writeln!(md, "- {n}");
        }
        let table = out.join("pods-scale.md");
        std::fs::write(&table, md)?;
        let svg = out.join("pods-scale.svg");
        plot(f, &svg)?;
        println!("\nwrote {} and {}", table.display(), svg.display());
    }
    Ok(())
}

/// Three panels over the pod count: start time (nodelet and floor), RSS, idle CPU.
fn plot(f: &Figures, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1200, 380)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let panels = root.split_evenly((1, 3));
    let xs: Vec<f64> = f.scales.iter().map(|s| s.n as f64).collect();
    let x_max = xs.iter().copied().fold(1.0, f64::max) * 1.05;
    let series = |y: &dyn Fn(&Scale) -> f64| -> Vec<(f64, f64)> {
        f.scales.iter().map(|s| (s.n as f64, y(s))).collect()
    };
    let med = |v: Vec<Duration>| median(&v).as_secs_f64();
    /// A plotted line: its name, colour and points.
    type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);
    let panels_data: [(&str, &str, Vec<Line<'_>>); 3] = [
        (
            "Start of N pods (s, median)",
            "s",
            vec![
                ("nodelet", RED, series(&|s| med(s.rounds.iter().map(|r| r.nodelet.took).collect()))),
                ("direct CRI floor", BLUE, series(&|s| med(s.rounds.iter().map(|r| r.floor.took).collect()))),
                (
                    "nodelet removal",
                    MAGENTA,
                    series(&|s| med(s.rounds.iter().map(|r| r.nodelet_removal).collect())),
                ),
                (
                    "floor teardown",
                    CYAN,
                    series(&|s| med(s.rounds.iter().map(|r| r.floor_teardown).collect())),
                ),
            ],
        ),
        (
            "nodelet memory (MiB)",
            "MiB",
            vec![
                ("VmRSS", RED, series(&|s| s.rss_kib as f64 / 1024.0)),
                ("RssAnon", BLUE, series(&|s| s.anon_kib as f64 / 1024.0)),
            ],
        ),
        (
            "nodelet idle CPU (% of a core)",
            "%",
            vec![("readiness probe every 10 s", RED, series(&|s| s.idle_cpu * 100.0))],
        ),
    ];
    for (area, (title, _unit, lines)) in panels.iter().zip(panels_data) {
        let y_max =
            lines.iter().flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y)).fold(0.0, f64::max) * 1.15 + 1e-3;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart.configure_mesh().x_desc("pods").draw().map_err(|e| anyhow::anyhow!("{e}"))?;
        for (name, color, points) in lines {
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
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
    /// Starts `n` pods with at most `parallelism` in flight: the wall time until every StartContainer
    /// returned, and each pod's time from the start until its StartContainer returned.
    async fn start_many(&self, n: usize, parallelism: usize) -> anyhow::Result<(Duration, Vec<Duration>)> {
        let started = Instant::now();
        let results: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..n)
            .map(|i| async move {
                self.start_one(i).await?;
                Ok(started.elapsed())
            })
            .buffer_unordered(parallelism)
            .collect()
            .await;
        let took = started.elapsed();
        let per_pod = results.into_iter().collect::<anyhow::Result<Vec<Duration>>>()?;
        Ok((took, per_pod))
    }

    async fn start_one(&self, i: usize) -> anyhow::Result<()> {
        let uid = format!("{}-{i}-{}", self.run_id, fastrand_suffix());
        let name = format!("floor-{i}");
        let log_dir = self.log_root.join(&uid);
        tokio::fs::create_dir_all(log_dir.join("web")).await?;
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
            metadata: Some(proto::ContainerMetadata { name: "web".to_owned(), attempt: 0 }),
            image: Some(proto::ImageSpec { image: self.env.busybox.clone(), ..Default::default() }),
            command: vec!["sh".to_owned(), "-c".to_owned(), POD_SCRIPT.to_owned()],
            log_path: "web/0.log".to_owned(),
            labels,
            ..Default::default()
        };
        let cid = self.cri.create_container(&id, container, sandbox).await.context("CreateContainer")?;
        self.cri.start_container(&cid).await.context("StartContainer")?;
        Ok(())
    }

    /// Stops (StopContainer with nodelet's 1 s grace, then StopPodSandbox) and removes every pod of this run,
    /// 8 at a time: how many, and how long it took.
    async fn teardown(&self) -> anyhow::Result<(usize, Duration)> {
        let started = Instant::now();
        let filter = SandboxFilter::all().label(RUN_LABEL, self.run_id.clone());
        let sandboxes = self.cri.list_pod_sandboxes(&filter).await?;
        let n = sandboxes.len();
        let cri = &self.cri;
        futures::stream::iter(sandboxes)
            .for_each_concurrent(8, |s| async move {
                let containers = cri
                    .list_containers(&ContainerFilter::all().pod_sandbox_id(s.id.clone()))
                    .await
                    .unwrap_or_default();
                for c in containers {
                    if let Err(e) = cri.stop_container(&c.id, Duration::from_secs(1)).await {
                        eprintln!("StopContainer {}: {e}", c.id);
                    }
                }
                if let Err(e) = cri.stop_pod_sandbox(&s.id).await {
                    eprintln!("StopPodSandbox {}: {e}", s.id);
                }
                if let Err(e) = cri.remove_pod_sandbox(&s.id).await {
                    eprintln!("RemovePodSandbox {}: {e}", s.id);
                }
            })
            .await;
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
    async fn start(env: &Env, dir: &Path, node: &str, max_pods: usize) -> anyhow::Result<Nodelet> {
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
            ("--max-pods", max_pods.to_string()),
        ];
        let config = std::env::var("NODELET_BENCH_CONFIG").ok().filter(|c| !c.is_empty());
        let child = Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args(args.iter().flat_map(|(flag, value)| [*flag, value.as_str()]))
            .args(config.iter().flat_map(|file| ["--config", file.as_str()]))
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

    /// The relist floor: `rounds` bare relists (ListPodSandbox and ListContainers at once, with the filters
    /// nodelet's PLEG uses, decoded lean as nodelet's are), 50 ms apart; each one's time. Between them, as
    /// many listings by nodelet's own listing code ([`CriPodRuntime::list_pods`] on the bench's client, after
    /// one to fill its caches), each one's time: the second list.
    async fn relist_floor(&self, rounds: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
        let sandboxes = SandboxFilter::managed().label(labels::NODE, self.node.clone());
        let containers = ContainerFilter::managed().label(labels::NODE, self.node.clone());
        let driver = CriPodRuntime::new(
            self.cri.clone(),
            CriPodRuntimeConfig::default().with_node_name(self.node.clone()),
        );
        let mut took = Vec::with_capacity(rounds);
        let mut driver_took = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            let (s, c) = futures::join!(
                self.cri.list_sandbox_items(&sandboxes),
                self.cri.list_container_items(&containers)
            );
            took.push(started.elapsed());
            s?;
            c?;
            sleep(Duration::from_millis(25)).await;
            let started = Instant::now();
            let pods = driver.list_pods().await.map_err(|e| anyhow::anyhow!("list_pods: {e}"))?;
            driver_took.push(started.elapsed());
            drop(pods);
            sleep(Duration::from_millis(25)).await;
        }
        // the first listing fetched every container's status: not a relist of a running node
        driver_took.remove(0);
        Ok((took, driver_took))
    }

    /// The pid (for /proc).
    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("nodelet has exited")
    }

    /// Writes one manifest per name (each complete before it appears: written aside, then renamed), and
    /// returns the time from the first write until every pod is Running in `/pods`, and each pod's time
    /// from the first write until it was first seen Running.
    async fn start_pods(&mut self, names: &[String]) -> anyhow::Result<(Duration, Vec<Duration>)> {
        let started = Instant::now();
        for name in names {
            let tmp = self.manifests.join(format!(".{name}.yaml.tmp"));
            std::fs::write(&tmp, manifest(name))?;
            std::fs::rename(&tmp, self.manifests.join(format!("{name}.yaml")))?;
        }
        let wanted: Vec<String> = names.iter().map(|n| format!("{n}-{}", self.node)).collect();
        let mut seen: HashMap<String, Duration> = HashMap::new();
        loop {
            let asked = Instant::now();
            let pods = self.pods().await?;
            let took = asked.elapsed();
            let now = started.elapsed();
            for w in &wanted {
                if pods.get(w).is_some_and(|running| *running) {
                    seen.entry(w.clone()).or_insert(now);
                }
            }
            if seen.len() == wanted.len() {
                return Ok((now, seen.into_values().collect()));
            }
            if started.elapsed() > DEADLINE {
                bail!("pods not Running within {DEADLINE:?}: {pods:?}");
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("nodelet exited ({status})");
            }
            sleep(poll_pause(took)).await;
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
            let asked = Instant::now();
            let pods = self.pods().await?;
            let took = asked.elapsed();
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
            sleep(poll_pause(took)).await;
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

    /// Waits for the PLEG's next `wanted` relists (each at most `limit` away) and returns the time of
    /// each: a scrape every 250 ms, a relist's time the growth of the histogram's sum with its count
    /// (when two came between scrapes, each their mean). Fewer when one did not come in time.
    async fn next_relists(&self, wanted: usize, limit: Duration) -> anyhow::Result<Vec<Duration>> {
        let read = |m: &HashMap<String, f64>| {
            let value = |name: &str| m.get(name).copied().unwrap_or(0.0);
            (
                value("kubelet_pleg_relist_duration_seconds_count"),
                value("kubelet_pleg_relist_duration_seconds_sum"),
            )
        };
        let (mut count, mut sum) = read(&self.metrics().await?);
        let mut timed = Vec::with_capacity(wanted);
        let mut since = Instant::now();
        while timed.len() < wanted && since.elapsed() < limit {
            sleep(Duration::from_millis(250)).await;
            let (now_count, now_sum) = read(&self.metrics().await?);
            let came = now_count - count;
            if came >= 1.0 {
                let each = Duration::from_secs_f64(((now_sum - sum) / came).max(0.0));
                timed.extend(std::iter::repeat_n(each, came as usize));
                (count, sum, since) = (now_count, now_sum, Instant::now());
            }
        }
        timed.truncate(wanted);
        Ok(timed)
    }

    /// `/metrics` on the read-only port: each metric name → the sum of its samples, and each series of
    /// [`CRI_CALLS`] (with its labels) → its value.
    async fn metrics(&self) -> anyhow::Result<HashMap<String, f64>> {
        let url = self.pods_url.replace("/pods", "/metrics");
        let text = self.http.get(&url).send().await?.error_for_status()?.text().await?;
        let mut sums = HashMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let name = series.split('{').next().unwrap_or(series);
            if let Ok(v) = value.parse::<f64>() {
                *sums.entry(name.to_owned()).or_insert(0.0) += v;
                if name == CRI_CALLS {
                    // and each call's own series, for the calls a start makes
                    sums.insert(series.to_owned(), v);
                }
            }
        }
        Ok(sums)
    }

    /// `requests` GETs of `path` on the read-only port in a row: the time of each (to the last byte), and the
    /// answer's size.
    async fn latency(&self, path: &str, requests: usize) -> anyhow::Result<(Vec<Duration>, usize)> {
        let url = self.pods_url.replace("/pods", path);
        let mut times = Vec::with_capacity(requests);
        let mut size = 0;
        for _ in 0..requests {
            let started = Instant::now();
            let body = self.http.get(&url).send().await?.error_for_status()?.bytes().await?;
            times.push(started.elapsed());
            size = body.len();
        }
        Ok((times, size))
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

/// A busybox static pod running [`POD_SCRIPT`], with an HTTP readiness probe every 10 s.
fn manifest(name: &str) -> String {
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "containers": [{
                "name": "web",
                "image": "localhost/nodelet/busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", POD_SCRIPT],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 10},
            }],
        },
    });
    // JSON is YAML
    pod.to_string()
}

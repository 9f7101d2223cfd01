//! Benchmarks of reconcile-engine, side by side with kube-runtime's controller machinery.
//!
//! Prints one table of figures (it is not a timed test). Run it in release mode:
//!
//! ```text
//! cargo run --release -p reconcile-engine-bench
//! ```
//!
//! What it measures, all on one synthetic workload (keys like `namespace-07/pod-name-012345`,
//! a 24-byte value, one `apply` operation per key, a driver that finishes every operation at
//! once):
//!
//! 1. **No-op reconcile pass** over 100k keys whose desired and actual states are equal (the
//!    actual state comes from the driver's reconstruction, so nothing runs): the per-key work by
//!    hand (two store lookups and the decision), the engine's own planning pass from its
//!    `reconcile_engine_loop_duration_seconds` histogram after forced resyncs, and the cold start
//!    from `run` to the end of the first pass.
//! 2. **Operation throughput** of the bare `Executor` (100k submits, every completion drained)
//!    and of the whole `Engine` (100k desired keys, until the actual store holds all of them), on
//!    a current-thread runtime and on a multi-thread runtime with 2 workers.
//! 3. **Bytes per key** of a `Store<String, PodState>` with 100k and 1M entries: resident memory
//!    of a fresh child process before and after filling it, and the size from the layout.
//! 4. **kube-runtime** 5's `applier` over an in-memory reflector store of as many ConfigMaps,
//!    triggered once per object, with a reconciler that returns at once: same N, same runtime
//!    flavor, same concurrency bound. The engine/kube-runtime throughput ratio is printed.
//!
//! Each throughput figure is the median of three runs (`--runs N` for more), with the spread.
//!
//! Options: `--concurrency N` sets the common concurrency bound (default 64, the engine's
//! default; `0` = unbounded for all three). `--runs N` sets the runs per throughput figure. `--profile pass|executor|engine|kube` runs one
//! measurement five times on a current-thread runtime, for a profiler such as `perf record`.

mod clock;
mod domain;
mod engine_bench;
mod kube_bench;
mod memory;
mod report;

use std::future::Future;
use std::time::Duration;

use clock::Timed;
use report::{Machine, Table, grouped};

/// Keys of the pass and throughput measurements.
const N: usize = 100_000;
/// The default concurrency bound of the executor, the engine and kube-runtime's applier alike
/// (the engine's default).
const DEFAULT_CONCURRENCY: u16 = 64;
/// Runs of each throughput measurement by default (`--runs` changes it); the median is reported,
/// with the spread (fastest–slowest run).
const DEFAULT_RUNS: usize = 3;
/// Forced resyncs in the no-op pass measurement, and their period.
const RESYNCS: u64 = 3;
const RESYNC_PERIOD: Duration = Duration::from_millis(200);
/// Store sizes of the memory measurement.
const MEMORY_SIZES: [usize; 2] = [100_000, 1_000_000];
/// A measurement that takes longer than this is broken, not slow.
const GUARD: Duration = Duration::from_secs(120);
/// Goals stated by the issues: executor overhead per operation (issue 4), the whole engine path
/// per operation and its throughput over kube-runtime's (issue 13).
const GOAL_OVERHEAD_US: f64 = 5.0;
const GOAL_ENGINE_US: f64 = 2.0;
const GOAL_RATIO: f64 = 3.0;

const USAGE: &str =
    "usage: reconcile-engine-bench [--concurrency N] [--runs N] [--profile pass|executor|engine|kube]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    CurrentThread,
    MultiThread2,
}

impl Flavor {
    fn label(self) -> &'static str {
        match self {
            Flavor::CurrentThread => "current_thread",
            Flavor::MultiThread2 => "multi_thread(2)",
        }
    }

    fn runtime(self) -> tokio::runtime::Runtime {
        let mut builder = match self {
            Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
            Flavor::MultiThread2 => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                builder.worker_threads(2);
                builder
            }
        };
        builder.enable_all().build().expect("building a tokio runtime")
    }
}

/// Runs `fut` as a task of `rt` (on a worker thread for the multi-thread flavor) and waits for it.
fn run_task<F>(rt: &tokio::runtime::Runtime, fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.block_on(async move {
        tokio::time::timeout(GUARD, tokio::spawn(fut))
            .await
            .expect("a measurement did not finish within its guard time")
            .expect("a measurement task panicked")
    })
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// The median wall time of `samples` with their spread (fastest and slowest), and the median
/// CPU time and run-queue wait.
#[derive(Debug, Clone, Copy)]
struct Sampled {
    median: Duration,
    min: Duration,
    max: Duration,
    cpu: Option<Duration>,
    waited: Option<Duration>,
}

impl Sampled {
    fn of(samples: &[Timed]) -> Self {
        let walls: Vec<Duration> = samples.iter().map(|t| t.wall).collect();
        let min = walls.iter().copied().min().unwrap_or_default();
        let max = walls.iter().copied().max().unwrap_or_default();
        let cpu: Option<Vec<Duration>> = samples.iter().map(|t| t.cpu).collect();
        let waited: Option<Vec<Duration>> = samples.iter().map(|t| t.waited).collect();
        Self { median: median(walls), min, max, cpu: cpu.map(median), waited: waited.map(median) }
    }
}

fn ns_per_key(d: Duration, n: usize) -> String {
    format!("{:.0}", d.as_nanos() as f64 / n as f64)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn us_per_op(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

/// Command-line options.
#[derive(Debug)]
enum Mode {
    /// The full benchmark.
    Report { concurrency: u16, runs: usize },
    /// One measurement, repeated, for a profiler.
    Profile { what: String, concurrency: u16 },
    /// The memory-measuring child process.
    RssChild { entries: usize },
}

fn parse_args() -> Result<Mode, String> {
    let mut args = std::env::args().skip(1);
    let mut concurrency = DEFAULT_CONCURRENCY;
    let mut profile = None;
    let mut runs = DEFAULT_RUNS;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            memory::CHILD_ARG => {
                let entries = args.next().and_then(|n| n.parse().ok()).ok_or("--rss-child needs a count")?;
                return Ok(Mode::RssChild { entries });
            }
            "--concurrency" => {
                concurrency =
                    args.next().and_then(|n| n.parse().ok()).ok_or("--concurrency needs 0..=65535")?;
            }
            "--runs" => {
                runs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--runs needs 1 or more")?;
            }
            "--profile" => profile = Some(args.next().ok_or("--profile needs a measurement name")?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(match profile {
        Some(what) => Mode::Profile { what, concurrency },
        None => Mode::Report { concurrency, runs },
    })
}

fn main() {
    let mode = parse_args().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2);
    });
    match mode {
        Mode::RssChild { entries } => {
            if let Err(e) = memory::child(entries) {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
        Mode::Profile { what, concurrency } => profile(&what, concurrency),
        Mode::Report { concurrency, runs } => report(concurrency, runs),
    }
}

/// Time of one run of each throughput measurement, per flavor: median and spread.
#[derive(Debug, Clone, Copy)]
struct Throughput {
    executor: Sampled,
    engine: Sampled,
    kube: Sampled,
    /// kube-runtime's wall time over the engine's, run by run: median, lowest, highest.
    engine_ratio: (f64, f64, f64),
    /// The same for CPU time, if it was readable.
    engine_cpu_ratio: Option<(f64, f64, f64)>,
}

/// Median, lowest and highest of `ratios`.
fn spread(mut ratios: Vec<f64>) -> (f64, f64, f64) {
    ratios.sort_by(f64::total_cmp);
    (ratios[ratios.len() / 2], ratios[0], ratios[ratios.len() - 1])
}

/// Runs the three throughput measurements `runs` times each, interleaved, so that a slow phase
/// of a shared machine hits all three alike.
fn throughput(flavor: Flavor, keys: &[String], concurrency: u16, runs: usize) -> Throughput {
    let rt = flavor.runtime();
    let (mut executor, mut engine, mut kube) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        executor.push(run_task(&rt, engine_bench::executor_throughput(keys.to_vec(), concurrency.into())));
        engine.push(run_task(&rt, engine_bench::engine_throughput(keys.to_vec(), concurrency.into())));
        let (elapsed, ok) = run_task(&rt, kube_bench::applier_throughput(keys.len(), concurrency));
        assert_eq!(ok, keys.len(), "kube-runtime's applier should report every reconcile");
        kube.push(elapsed);
    }
    let engine_ratio =
        spread(kube.iter().zip(&engine).map(|(k, e)| k.wall.as_secs_f64() / e.wall.as_secs_f64()).collect());
    let cpu_ratios: Option<Vec<f64>> =
        kube.iter().zip(&engine).map(|(k, e)| Some(k.cpu?.as_secs_f64() / e.cpu?.as_secs_f64())).collect();
    Throughput {
        executor: Sampled::of(&executor),
        engine: Sampled::of(&engine),
        kube: Sampled::of(&kube),
        engine_ratio,
        engine_cpu_ratio: cpu_ratios.map(spread),
    }
}

fn per_op_rows(table: &mut Table, what: &str, flavor: Flavor, s: Sampled, n: usize) {
    let d = s.median;
    let ops = n as f64 / d.as_secs_f64();
    let label = format!("{what}, {}", flavor.label());
    table.row(
        &label,
        format!("{:.2}", us_per_op(d, n)),
        "µs/op",
        format!(
            "{} ms for {n} operations; spread {:.2}–{:.2} µs/op",
            ms(d),
            us_per_op(s.min, n),
            us_per_op(s.max, n)
        ),
    );
    table.row(&label, grouped(ops), "ops/s", "");
    if let (Some(cpu), Some(waited)) = (s.cpu, s.waited) {
        table.row(
            &label,
            format!("{:.2}", us_per_op(cpu, n)),
            "CPU µs/op",
            format!(
                "median CPU time of all threads; threads waited {:.2} µs/op for a core",
                us_per_op(waited, n)
            ),
        );
    }
}

fn report(concurrency: u16, runs: usize) {
    let machine = Machine::detect();
    let bound = if concurrency == 0 { "unbounded".to_string() } else { concurrency.to_string() };
    println!("reconcile-engine benchmark, {}", machine.date);
    println!("machine: {} cores (nproc), {}", machine.cores, machine.cpu);
    println!(
        "terms: N = {N} keys; concurrency bound {bound} for the executor, the engine and kube-runtime's applier; \
         driver and reconcilers return at once; throughput figures are the median of {runs} runs\n"
    );

    let keys = domain::keys(N);
    let mut table = Table::default();

    // 1. No-op passes.
    let shuffled = engine_bench::shuffled(N);
    let in_order: Vec<usize> = (0..N).collect();
    let manual = median((0..runs).map(|_| engine_bench::manual_pass(&keys, &shuffled)).collect());
    let manual_in_order = median((0..runs).map(|_| engine_bench::manual_pass(&keys, &in_order)).collect());
    let rt = Flavor::MultiThread2.runtime();
    let pass_keys = keys.clone();
    let passes =
        run_task(&rt, async move { engine_bench::engine_passes(&pass_keys, RESYNC_PERIOD, RESYNCS).await });
    drop(rt);
    assert_eq!(passes.operations, 0, "a no-op pass should run no operation");
    table.row(
        "1. no-op pass by hand: 2 lookups + decision",
        ns_per_key(manual, N),
        "ns/key",
        format!(
            "{} ms; keys in hash-like order ({} ns/key in insertion order)",
            ms(manual),
            ns_per_key(manual_in_order, N)
        ),
    );
    table.row(
        "1. no-op pass, engine planning pass (resync)",
        ns_per_key(passes.resync_pass, N),
        "ns/key",
        format!(
            "{} ms; loop_duration histogram, mean of {} resyncs, multi_thread(2)",
            ms(passes.resync_pass),
            passes.resyncs
        ),
    );
    table.row(
        "1. no-op pass, engine first planning pass",
        ns_per_key(passes.first_pass, N),
        "ns/key",
        format!("{} ms; loop_duration histogram, first observation", ms(passes.first_pass)),
    );
    table.row(
        "1. no-op pass, engine resync tick → pass done",
        ns_per_key(passes.resync_wall, N),
        "ns/key",
        format!("{} ms; adds marking every key dirty; ±1 ms timer granularity", ms(passes.resync_wall)),
    );
    table.row(
        "1. engine cold start: run → first pass done",
        ns_per_key(passes.cold_start, N),
        "ns/key",
        format!("{} ms; reconstruct {N} entries, mark dirty, plan; 0 operations run", ms(passes.cold_start)),
    );

    // 2 and 4. Throughput, engine and kube-runtime on equal terms.
    let mut goals = Vec::new();
    for flavor in [Flavor::CurrentThread, Flavor::MultiThread2] {
        let t = throughput(flavor, &keys, concurrency, runs);
        per_op_rows(&mut table, "2. executor alone", flavor, t.executor, N);
        per_op_rows(&mut table, "2. engine, desired → actual", flavor, t.engine, N);
        per_op_rows(&mut table, "4. kube-runtime applier", flavor, t.kube, N);
        let engine_ratio = t.kube.median.as_secs_f64() / t.engine.median.as_secs_f64();
        let executor_ratio = t.kube.median.as_secs_f64() / t.executor.median.as_secs_f64();
        let (run_median, run_min, run_max) = t.engine_ratio;
        table.row(
            format!("4. throughput engine / kube-runtime, {}", flavor.label()),
            format!("{engine_ratio:.2}"),
            "×",
            format!("of the medians; run by run {run_median:.2} ({run_min:.2}–{run_max:.2})"),
        );
        if let Some((cpu_median, cpu_min, cpu_max)) = t.engine_cpu_ratio {
            table.row(
                format!("4. CPU time kube-runtime / engine, {}", flavor.label()),
                format!("{cpu_median:.2}"),
                "×",
                format!("run by run ({cpu_min:.2}–{cpu_max:.2})"),
            );
        }
        table.row(
            format!("4. throughput executor / kube-runtime, {}", flavor.label()),
            format!("{executor_ratio:.2}"),
            "×",
            "",
        );
        let (executor_us, engine_us) = (us_per_op(t.executor.median, N), us_per_op(t.engine.median, N));
        goals.push(format!(
            "{}: executor {executor_us:.2} µs/op (< {GOAL_OVERHEAD_US} µs: {}); engine {engine_us:.2} µs/op \
             (< {GOAL_ENGINE_US} µs: {}); engine/kube-runtime {engine_ratio:.2}× (≥ {GOAL_RATIO}×: {})",
            flavor.label(),
            verdict(executor_us < GOAL_OVERHEAD_US),
            verdict(engine_us < GOAL_ENGINE_US),
            verdict(engine_ratio >= GOAL_RATIO),
        ));
    }

    // 3. Memory.
    for entries in MEMORY_SIZES {
        let m = memory::measure(entries);
        let label = format!("3. Store<String, PodState>, {} entries", grouped(entries as f64));
        let measured = m.measured_per_key().map_or_else(|| "n/a".to_string(), |b| format!("{b:.0}"));
        let delta = m.rss_delta.map_or_else(
            || "RSS not readable".to_string(),
            |d| format!("measured: RSS +{:.1} MiB in a fresh process", d as f64 / 1_048_576.0),
        );
        table.row(&label, measured, "B/key", delta);
        table.row(
            &label,
            format!("{:.0}", m.theoretical),
            "B/key",
            format!("layout: {}", memory::layout_note()),
        );
    }

    print!("{}", table.render());
    println!();
    for goal in goals {
        println!("goal check, {goal}");
    }
    println!(
        "\nnote: per key the engine plans twice (before the operation and after its completion) and writes \
         the actual store; kube-runtime's applier calls its reconciler once and writes nothing."
    );
}

/// Runs one measurement five times on a current-thread runtime, for a profiler to watch.
fn profile(what: &str, concurrency: u16) {
    let keys = domain::keys(N);
    let rt = Flavor::CurrentThread.runtime();
    for _ in 0..5 {
        let timed = match what {
            "pass" => {
                let pass_keys = keys.clone();
                let pass = run_task(&rt, async move {
                    engine_bench::engine_passes(&pass_keys, RESYNC_PERIOD, RESYNCS).await
                })
                .resync_pass;
                Timed { wall: pass, cpu: None, waited: None }
            }
            "executor" => run_task(&rt, engine_bench::executor_throughput(keys.clone(), concurrency.into())),
            "engine" => run_task(&rt, engine_bench::engine_throughput(keys.clone(), concurrency.into())),
            "kube" => run_task(&rt, kube_bench::applier_throughput(N, concurrency)).0,
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        };
        let cpu = timed.cpu.map_or_else(|| "n/a".to_string(), ms);
        println!("{what}: {} ms wall, {cpu} ms CPU", ms(timed.wall));
    }
}

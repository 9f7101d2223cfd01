//! Wall time and CPU time of a measured region.
//!
//! The machine the benchmark runs on is often shared with builds, so wall time also counts the
//! time the benchmark's threads waited for a core. CPU time (what the process's threads ran,
//! from `/proc/self/task/*/schedstat`) leaves that out, and so does the run-queue wait next to it.

use std::time::{Duration, Instant};

/// Time on a core and time waiting for one, summed over the process's threads, from the first
/// two fields of `/proc/self/task/<tid>/schedstat` (nanoseconds). `None` where it is not readable.
fn schedstat() -> Option<(Duration, Duration)> {
    let mut on_cpu = 0u64;
    let mut waiting = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        let mut fields = text.split_whitespace().map(str::parse::<u64>);
        on_cpu += fields.next()?.ok()?;
        waiting += fields.next()?.ok()?;
    }
    Some((Duration::from_nanos(on_cpu), Duration::from_nanos(waiting)))
}

/// Wall, CPU and run-queue wait time of one measured region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timed {
    pub(crate) wall: Duration,
    /// CPU time of every thread of the process; `None` if `/proc` was not readable.
    pub(crate) cpu: Option<Duration>,
    /// Time the process's threads were runnable but waited for a core.
    pub(crate) waited: Option<Duration>,
}

/// Started at the beginning of a measured region.
#[derive(Debug)]
pub(crate) struct Stopwatch {
    wall: Instant,
    sched: Option<(Duration, Duration)>,
}

impl Stopwatch {
    pub(crate) fn start() -> Self {
        let sched = schedstat();
        Self { wall: Instant::now(), sched }
    }

    pub(crate) fn stop(&self) -> Timed {
        let wall = self.wall.elapsed();
        let now = schedstat();
        let delta = self
            .sched
            .zip(now)
            .map(|((cpu0, wait0), (cpu1, wait1))| (cpu1.saturating_sub(cpu0), wait1.saturating_sub(wait0)));
        Timed { wall, cpu: delta.map(|d| d.0), waited: delta.map(|d| d.1) }
    }
}

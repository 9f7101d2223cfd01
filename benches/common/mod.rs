//! Helpers both program benchmarks (`pods`, `cluster`) use: CPU time and load of processes, free
//! loopback ports, medians, the runtime sweep.

use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use nodelet_cri::{CriClient, SandboxFilter};

/// `/proc/<pid>/stat` times are in USER_HZ, which is 100 on Linux.
pub(crate) const USER_HZ: f64 = 100.0;

/// Stops and removes the sandboxes `filter` selects (their containers with them), 8 at a time; how many.
pub(crate) async fn sweep(cri: &CriClient, filter: SandboxFilter) -> usize {
    let Ok(sandboxes) = cri.list_pod_sandboxes(&filter).await else { return 0 };
    let n = sandboxes.len();
    futures::stream::iter(sandboxes)
        .for_each_concurrent(8, |s| async move {
            if let Err(e) = cri.stop_pod_sandbox(&s.id).await {
                eprintln!("StopPodSandbox {}: {e}", s.id);
            }
            if let Err(e) = cri.remove_pod_sandbox(&s.id).await {
                eprintln!("RemovePodSandbox {}: {e}", s.id);
            }
        })
        .await;
    n
}

/// utime + stime of `pid` in USER_HZ ticks.
pub(crate) fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // the command name may contain spaces: fields after the last ')'
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("bad /proc/pid/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // after ')': state is field 3, so utime (14) and stime (15) are at indexes 11 and 12
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

/// The number in the environment variable `name`, else `default`; an unparsable value is an error.
pub(crate) fn env_number(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

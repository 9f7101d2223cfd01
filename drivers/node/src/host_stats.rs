//! Readers of the host's own numbers: `/proc`, cgroups (v1 and v2), `statvfs` and disk usage of
//! directories. Every reader takes its root (`/proc`, `/sys/fs/cgroup`) so the tests can point it at a
//! directory of their own; every reader returns `None` for what it cannot read.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The cgroup hierarchy in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// One hierarchy per controller (`<fs>/memory`, `<fs>/cpuacct`, `<fs>/pids`).
    V1,
    /// The unified hierarchy (`<fs>/cgroup.controllers` exists).
    V2,
}

impl CgroupVersion {
    /// The version mounted at `fs`.
    pub fn detect(fs: &Path) -> Self {
        if fs.join("cgroup.controllers").is_file() { Self::V2 } else { Self::V1 }
    }
}

/// One cgroup's memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemorySample {
    /// All memory charged, page cache included.
    pub usage: u64,
    /// `usage` minus inactive file pages.
    pub working_set: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub rss: Option<u64>,
    /// Cumulative page faults.
    pub page_faults: Option<u64>,
    /// Cumulative major page faults.
    pub major_page_faults: Option<u64>,
    /// The cgroup's limit, when it has one below the machine's memory.
    pub limit: Option<u64>,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (memory.stat, cpu.stat, pids files) as a map.
fn read_flat_keyed(path: &Path) -> Option<HashMap<String, u64>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((it.next()?.to_owned(), it.next()?.parse().ok()?))
            })
            .collect(),
    )
}

/// The directory of cgroup `rel` (`/a/b`, or `/` for the root) in hierarchy `controller` (v1; ignored on
/// v2). `None` when `rel` tries to leave the hierarchy.
pub fn cgroup_dir(fs: &Path, version: CgroupVersion, controller: &str, rel: &str) -> Option<PathBuf> {
    let rel = rel.trim_matches('/');
    if rel.split('/').any(|c| c == ".." || c == ".") {
        return None;
    }
    let base = match version {
        CgroupVersion::V2 => fs.to_path_buf(),
        CgroupVersion::V1 => {
            // cpuacct may be mounted alone or joined with cpu.
            let joined = ["cpu,cpuacct", "cpuacct,cpu"];
            let direct = fs.join(controller);
            if controller == "cpuacct" && !direct.is_dir() {
                joined.iter().map(|j| fs.join(j)).find(|p| p.is_dir()).unwrap_or(direct)
            } else {
                direct
            }
        }
    };
    Some(if rel.is_empty() { base } else { base.join(rel) })
}

/// Cumulative CPU time of cgroup `rel`, in nanoseconds.
pub fn cpu_usage_ns(fs: &Path, version: CgroupVersion, rel: &str) -> Option<u64> {
    let dir = cgroup_dir(fs, version, "cpuacct", rel)?;
    match version {
        CgroupVersion::V1 => read_u64(&dir.join("cpuacct.usage")),
        CgroupVersion::V2 => read_flat_keyed(&dir.join("cpu.stat"))?.get("usage_usec")?.checked_mul(1000),
    }
}

/// Memory of cgroup `rel` (not the root: see [`node_memory`]).
pub fn cgroup_memory(fs: &Path, version: CgroupVersion, rel: &str) -> Option<MemorySample> {
    let dir = cgroup_dir(fs, version, "memory", rel)?;
    match version {
        CgroupVersion::V1 => {
            let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
            let stat = read_flat_keyed(&dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat.get("total_inactive_file").copied().unwrap_or(0);
            Some(MemorySample {
                usage,
                working_set: usage.saturating_sub(inactive),
                rss: stat.get("total_rss").copied(),
                page_faults: stat.get("total_pgfault").copied(),
                major_page_faults: stat.get("total_pgmajfault").copied(),
                // v1 writes "no limit" as a huge page-aligned number.
                limit: read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < (1 << 62)),
            })
        }
        CgroupVersion::V2 => {
            let usage = read_u64(&dir.join("memory.current"))?;
            let stat = read_flat_keyed(&dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat.get("inactive_file").copied().unwrap_or(0);
            Some(MemorySample {
                usage,
                working_set: usage.saturating_sub(inactive),
                rss: stat.get("anon").copied(),
                page_faults: stat.get("pgfault").copied(),
                major_page_faults: stat.get("pgmajfault").copied(),
                limit: read_u64(&dir.join("memory.max")), // "max" does not parse: no limit
            })
        }
    }
}

/// `/proc/meminfo` in bytes, by field name (`MemTotal`, `MemFree`, `Inactive(file)`…).
pub fn meminfo(proc_fs: &Path) -> Option<HashMap<String, u64>> {
    let text = std::fs::read_to_string(proc_fs.join("meminfo")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let (key, rest) = l.split_once(':')?;
                let mut it = rest.split_whitespace();
                let n: u64 = it.next()?.parse().ok()?;
                let n = if it.next() == Some("kB") { n.checked_mul(1024)? } else { n };
                Some((key.trim().to_owned(), n))
            })
            .collect(),
    )
}

/// The machine's memory capacity and use, as the kubelet computes `memory.available`:
/// capacity (`MemTotal`) minus the root cgroup's working set (usage minus inactive file pages). On cgroup
/// v1 the root memory cgroup has the usage; on v2 the root has no `memory.current`, so usage is
/// `MemTotal - MemFree` and inactive file pages come from the root `memory.stat` (or `/proc/meminfo`).
pub fn node_memory(proc_fs: &Path, fs: &Path, version: CgroupVersion) -> Option<(u64, MemorySample)> {
    let info = meminfo(proc_fs)?;
    let capacity = *info.get("MemTotal")?;
    let sample = match version {
        CgroupVersion::V1 => cgroup_memory(fs, version, "/")?,
        CgroupVersion::V2 => {
            let usage = capacity.saturating_sub(*info.get("MemFree")?);
            let stat = read_flat_keyed(&fs.join("memory.stat"));
            let inactive = stat
                .as_ref()
                .and_then(|s| s.get("inactive_file").copied())
                .or_else(|| info.get("Inactive(file)").copied())
                .unwrap_or(0);
            let vmstat = read_flat_keyed(&proc_fs.join("vmstat")).unwrap_or_default();
            MemorySample {
                usage,
                working_set: usage.saturating_sub(inactive),
                rss: stat
                    .as_ref()
                    .and_then(|s| s.get("anon").copied())
                    .or_else(|| info.get("AnonPages").copied()),
                page_faults: vmstat.get("pgfault").copied(),
                major_page_faults: vmstat.get("pgmajfault").copied(),
                limit: None,
            }
        }
    };
    Some((capacity, sample))
}

/// The machine's cumulative CPU time in nanoseconds: the root cgroup's, or the busy time of `/proc/stat`.
pub fn node_cpu_usage_ns(proc_fs: &Path, fs: &Path, version: CgroupVersion) -> Option<u64> {
    if let Some(ns) = cpu_usage_ns(fs, version, "/") {
        return Some(ns);
    }
    let text = std::fs::read_to_string(proc_fs.join("stat")).ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| *v)
        .fold(0, u64::saturating_add);
    // USER_HZ is 100 on every Linux architecture nodelet runs on.
    busy.checked_mul(10_000_000)
}

/// Boot time, nanoseconds since the epoch (`btime` of `/proc/stat`).
pub fn boot_time_ns(proc_fs: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(proc_fs.join("stat")).ok()?;
    let secs: i64 = text.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    secs.checked_mul(1_000_000_000)
}

/// The process ID limit (the smaller of `kernel.pid_max` and `kernel.threads-max`, as the kubelet) and the
/// number of tasks that exist (the fourth field of `/proc/loadavg`, `running/total`).
pub fn pids(proc_fs: &Path) -> (Option<i64>, Option<i64>) {
    let read =
        |p: &str| -> Option<i64> { std::fs::read_to_string(proc_fs.join(p)).ok()?.trim().parse().ok() };
    let max = match (read("sys/kernel/pid_max"), read("sys/kernel/threads-max")) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let cur = std::fs::read_to_string(proc_fs.join("loadavg"))
        .ok()
        .and_then(|t| t.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok());
    (max, cur)
}

/// Processes in cgroup `rel` (`pids.current`).
pub fn cgroup_pids(fs: &Path, version: CgroupVersion, rel: &str) -> Option<u64> {
    read_u64(&cgroup_dir(fs, version, "pids", rel)?.join("pids.current"))
}

/// One interface of `/proc/net/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDev {
    /// Interface name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Send errors.
    pub tx_errors: u64,
}

/// The interfaces of `/proc/net/dev` but `lo`, and the one the default route uses (`/proc/net/route`).
pub fn net_devices(proc_fs: &Path) -> (Vec<NetDev>, Option<String>) {
    let devs = std::fs::read_to_string(proc_fs.join("net/dev"))
        .map(|text| {
            text.lines()
                .skip(2)
                .filter_map(|l| {
                    let (name, rest) = l.split_once(':')?;
                    let f: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
                    Some(NetDev {
                        name: name.trim().to_owned(),
                        rx_bytes: *f.first()?,
                        rx_errors: *f.get(2)?,
                        tx_bytes: *f.get(8)?,
                        tx_errors: *f.get(10)?,
                    })
                })
                .filter(|d| d.name != "lo")
                .collect()
        })
        .unwrap_or_default();
    let default = std::fs::read_to_string(proc_fs.join("net/route")).ok().and_then(|text| {
        text.lines().skip(1).find_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            (it.next()? == "00000000").then(|| name.to_owned())
        })
    });
    (devs, default)
}

/// The interfaces of the network namespace of the first process of cgroup `rel` (its `cgroup.procs`),
/// read from `<proc_fs>/<pid>/net/dev` as [`net_devices`] reads the node's: for a pod, the cgroup of its
/// sandbox's pause process. `None` when the cgroup has no process or it went away.
pub fn cgroup_net_devices(
    proc_fs: &Path,
    fs: &Path,
    version: CgroupVersion,
    rel: &str,
) -> Option<(Vec<NetDev>, Option<String>)> {
    let procs = std::fs::read_to_string(cgroup_dir(fs, version, "pids", rel)?.join("cgroup.procs")).ok()?;
    let pid: u32 = procs.lines().next()?.trim().parse().ok()?;
    let dir = proc_fs.join(pid.to_string());
    // A process that exited between the two reads leaves no `net/dev`: nothing rather than empty.
    dir.join("net/dev").exists().then(|| net_devices(&dir))
}

/// Capacity and use of the filesystem holding `path` (`statvfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsInfo {
    /// Size in bytes.
    pub capacity: u64,
    /// Bytes free for unprivileged users.
    pub available: u64,
    /// Bytes in use (size minus all free blocks).
    pub used: u64,
    /// Inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// `statvfs(path)`.
pub fn statvfs(path: &Path) -> Option<FsInfo> {
    let s = rustix::fs::statvfs(path).ok()?;
    let frsize = s.f_frsize;
    Some(FsInfo {
        capacity: s.f_blocks.saturating_mul(frsize),
        available: s.f_bavail.saturating_mul(frsize),
        used: s.f_blocks.saturating_sub(s.f_bfree).saturating_mul(frsize),
        inodes: s.f_files,
        inodes_free: s.f_ffree,
    })
}

/// Disk usage of a directory tree: bytes of allocated blocks and inodes, as `du -x` counts them (not
/// following symbolic links, not crossing into other filesystems, each hard-linked inode once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskUsage {
    /// Bytes of allocated blocks.
    pub bytes: u64,
    /// Inodes (files, directories, links).
    pub inodes: u64,
}

/// How deep [`disk_usage`] descends; deeper trees are counted to this depth.
const MAX_DEPTH: usize = 64;

/// The [`DiskUsage`] of `path` (a file or a directory); `None` when `path` does not exist.
pub fn disk_usage(path: &Path) -> Option<DiskUsage> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let mut usage = DiskUsage::default();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![(path.to_path_buf(), meta, 0_usize)];
    let dev = stack[0].1.dev();
    while let Some((p, m, depth)) = stack.pop() {
        if m.dev() != dev || (m.nlink() > 1 && !m.is_dir() && !seen.insert(m.ino())) {
            continue;
        }
        usage.bytes = usage.bytes.saturating_add(m.blocks().saturating_mul(512));
        usage.inodes += 1;
        if m.is_dir() && depth < MAX_DEPTH {
            let Ok(entries) = std::fs::read_dir(&p) else { continue };
            for entry in entries.flatten() {
                // `DirEntry::metadata` does not follow symbolic links.
                if let Ok(em) = entry.metadata() {
                    stack.push((entry.path(), em, depth + 1));
                }
            }
        }
    }
    Some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn a_cgroups_network_is_that_of_its_first_process() {
        let d = tempfile::tempdir().unwrap();
        let (fs, proc_fs) = (d.path().join("cgroup"), d.path().join("proc"));
        write(&fs, "kubepods/podu/sandbox/cgroup.procs", "4242\n4243\n");
        write(
            &proc_fs,
            "4242/net/dev",
            "Inter-|   Receive                            |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  \
             eth0:    5000      40    2    0    0     0          0         0     3000      30    1    0    0     0       0          0\n",
        );
        write(&proc_fs, "4242/net/route", "Iface\tDestination\tGateway\neth0\t00000000\t0100C6C6\n");
        let (devs, default) =
            cgroup_net_devices(&proc_fs, &fs, CgroupVersion::V2, "/kubepods/podu/sandbox").expect("read");
        assert_eq!(
            devs,
            vec![NetDev { name: "eth0".into(), rx_bytes: 5000, rx_errors: 2, tx_bytes: 3000, tx_errors: 1 }]
        );
        assert_eq!(default.as_deref(), Some("eth0"));
        // No process, or one that is gone: nothing.
        write(&fs, "kubepods/podu/empty/cgroup.procs", "");
        assert_eq!(cgroup_net_devices(&proc_fs, &fs, CgroupVersion::V2, "/kubepods/podu/empty"), None);
        write(&fs, "kubepods/podu/gone/cgroup.procs", "9999\n");
        assert_eq!(cgroup_net_devices(&proc_fs, &fs, CgroupVersion::V2, "/kubepods/podu/gone"), None);
        assert_eq!(cgroup_net_devices(&proc_fs, &fs, CgroupVersion::V2, "/kubepods/../etc"), None);
    }

    #[test]
    fn v1_memory_is_usage_minus_inactive_file() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "memory/kube/pod1/memory.usage_in_bytes", "1000\n");
        write(
            d.path(),
            "memory/kube/pod1/memory.stat",
            "cache 5\ntotal_inactive_file 300\ntotal_rss 600\ntotal_pgfault 9\ntotal_pgmajfault 1\n",
        );
        write(d.path(), "memory/kube/pod1/memory.limit_in_bytes", "9223372036854771712\n");
        let m = cgroup_memory(d.path(), CgroupVersion::V1, "/kube/pod1").unwrap();
        assert_eq!((m.usage, m.working_set, m.rss, m.limit), (1000, 700, Some(600), None));
        assert_eq!((m.page_faults, m.major_page_faults), (Some(9), Some(1)));
        assert!(cgroup_memory(d.path(), CgroupVersion::V1, "/kube/../etc").is_none());
    }

    #[test]
    fn v2_cgroups_and_root_memory_from_meminfo() {
        let d = tempfile::tempdir().unwrap();
        let (proc_fs, fs) = (d.path().join("proc"), d.path().join("cg"));
        write(&fs, "cgroup.controllers", "cpu memory pids\n");
        write(&fs, "memory.stat", "anon 100\ninactive_file 2048\n");
        write(&fs, "cpu.stat", "usage_usec 5\nuser_usec 3\n");
        write(&fs, "p/memory.current", "4096\n");
        write(&fs, "p/memory.stat", "anon 10\ninactive_file 1024\npgfault 4\npgmajfault 2\n");
        write(&fs, "p/memory.max", "max\n");
        write(&fs, "p/pids.current", "3\n");
        write(&proc_fs, "meminfo", "MemTotal:  10 kB\nMemFree:  4 kB\nInactive(file):  1 kB\n");
        write(&proc_fs, "vmstat", "pgfault 77\npgmajfault 7\n");
        let v = CgroupVersion::detect(&fs);
        assert_eq!(v, CgroupVersion::V2);
        let m = cgroup_memory(&fs, v, "/p").unwrap();
        assert_eq!((m.usage, m.working_set, m.rss, m.limit), (4096, 3072, Some(10), None));
        assert_eq!(cgroup_pids(&fs, v, "/p"), Some(3));
        assert_eq!(cpu_usage_ns(&fs, v, "/"), Some(5000));
        let (capacity, node) = node_memory(&proc_fs, &fs, v).unwrap();
        assert_eq!(capacity, 10 * 1024);
        // usage = MemTotal - MemFree = 6 KiB; inactive_file from the root memory.stat (2 KiB).
        assert_eq!((node.usage, node.working_set, node.rss), (6 * 1024, 4 * 1024, Some(100)));
        assert_eq!(node.page_faults, Some(77));
    }

    #[test]
    fn proc_files() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "stat", "cpu  100 0 50 1000 20 0 0 0 0 0\nbtime 1700000000\n");
        write(d.path(), "sys/kernel/pid_max", "4194304\n");
        write(d.path(), "sys/kernel/threads-max", "30000\n");
        write(d.path(), "loadavg", "0.10 0.20 0.30 2/345 6789\n");
        write(
            d.path(),
            "net/dev",
            "Inter-|   Receive  |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    lo: 9 1 0 0 0 0 0 0 9 1 0 0 0 0 0 0\n  eth0: 100 2 3 0 0 0 0 0 200 4 5 0 0 0 0 0\n",
        );
        write(d.path(), "net/route", "Iface\tDestination\tGateway\n eth0\t00000000\t0102A8C0\n");
        assert_eq!(boot_time_ns(d.path()), Some(1_700_000_000_000_000_000));
        assert_eq!(pids(d.path()), (Some(30000), Some(345)));
        // No cgroup there: the busy jiffies of /proc/stat (100 + 50) at 100 Hz.
        assert_eq!(node_cpu_usage_ns(d.path(), d.path(), CgroupVersion::V1), Some(1_500_000_000));
        // Counters at the top of their range saturate: no number rather than a wrapped one.
        let max = u64::MAX;
        write(d.path(), "stat", &format!("cpu  {max} {max} {max} 0 0 {max} 0 0 0 0\n"));
        assert_eq!(node_cpu_usage_ns(d.path(), d.path(), CgroupVersion::V1), None);
        write(d.path(), "stat", "cpu  100 0 50 1000 20 0 0 0 0 0\nbtime 1700000000\n");
        let (devs, default) = net_devices(d.path());
        assert_eq!(default.as_deref(), Some("eth0"));
        assert_eq!(
            devs,
            vec![NetDev { name: "eth0".into(), rx_bytes: 100, rx_errors: 3, tx_bytes: 200, tx_errors: 5 }]
        );
    }

    #[test]
    fn disk_usage_counts_blocks_once_and_skips_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let data = vec![7_u8; 256 * 1024];
        write(d.path(), "a/big", "");
        std::fs::write(d.path().join("a/big"), &data).unwrap();
        std::fs::hard_link(d.path().join("a/big"), d.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("a/usr")).unwrap();
        let u = disk_usage(&d.path().join("a")).unwrap();
        assert!(u.bytes >= 256 * 1024 && u.bytes < 2 * 256 * 1024, "{u:?}");
        assert_eq!(u.inodes, 3); // the directory, the file (once), the symlink
        assert!(disk_usage(&d.path().join("missing")).is_none());
        let fs = statvfs(d.path()).unwrap();
        assert!(fs.capacity >= fs.available && fs.inodes >= fs.inodes_free && fs.capacity > 0);
    }
}

//! What the v1 `Node` shows of the machine, read once at start-up: capacity and allocatable resources,
//! addresses and system information, as a kubelet reports them in its `Node` status.
//!
//! | field | source |
//! | --- | --- |
//! | `capacity.cpu` | CPUs this process may run on: `Cpus_allowed_list` of `/proc/self/status` ∩ `/sys/devices/system/cpu/online` (what `nproc` counts) |
//! | `capacity.memory` | `MemTotal` of `/proc/meminfo` |
//! | `capacity.pods` | `maxPods` |
//! | `capacity.ephemeral-storage` | `statvfs` size of the filesystem holding `--root-dir` (none without `localStorageCapacityIsolation`) |
//! | `capacity.hugepages-<size>` | `nr_hugepages` × size of `/sys/kernel/mm/hugepages/hugepages-<n>kB` (else `HugePages_Total` × `Hugepagesize` of `/proc/meminfo`) |
//! | `allocatable` | capacity minus the hard eviction thresholds of `memory.available` and `nodefs.available` (percentages of the capacity), memory also minus the huge pages; never negative |
//! | `addresses` | `InternalIP`: `address` when it names one address (not loopback), else the host's IPv4 address on the interface of the default route (`/proc/net/route`, `/proc/net/fib_trie`), else its first global IPv4 address; `Hostname`: the node name; `--node-ip` replaces the InternalIP in cluster mode |
//! | `nodeInfo` | `/proc/sys/kernel/osrelease`, `PRETTY_NAME` of `/etc/os-release`, `/etc/machine-id`, `/proc/sys/kernel/random/boot_id`, `/sys/class/dmi/id/product_uuid`, CRI `Version` |
//!
//! nodelet has no `systemReserved`/`kubeReserved` (the config file ignores them), so only the eviction
//! thresholds are taken off the capacity.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use nodelet_resources::eviction::signal::Amount as ThresholdValue;

/// A hard eviction threshold: a signal (`memory.available`, `nodefs.available`, …) and its amount.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionThreshold {
    /// The signal.
    pub signal: String,
    /// Evict when the signal falls below this.
    pub value: ThresholdValue,
}

/// What of the daemon's configuration the facts depend on.
#[derive(Debug, Clone, PartialEq)]
pub struct FactsConfig {
    /// `--root-dir`: its filesystem is the node's ephemeral storage.
    pub root_dir: PathBuf,
    /// The node's name (the `Hostname` address).
    pub node_name: String,
    /// `maxPods`.
    pub max_pods: u32,
    /// `evictionHard`: what it reserves is taken off the allocatable memory and ephemeral storage.
    pub hard_eviction: Vec<EvictionThreshold>,
    /// `address` (the main port's): a specific address is the `InternalIP`.
    pub address: IpAddr,
    /// `--node-ip`: when set, the `InternalIP` addresses.
    pub node_ips: Vec<IpAddr>,
    /// The main port.
    pub kubelet_port: u16,
    /// `localStorageCapacityIsolation`: without it the node reports no `ephemeral-storage`.
    pub local_storage_capacity_isolation: bool,
}

/// How long the start-up CRI `Version` call may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The machine's facts for the `Node` status, computed once at start-up.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    /// `status.capacity`.
    pub capacity: BTreeMap<String, Quantity>,
    /// `status.allocatable`.
    pub allocatable: BTreeMap<String, Quantity>,
    /// `status.addresses`: `InternalIP` (when one is found), then `Hostname`.
    pub addresses: Vec<NodeAddress>,
    /// `nodeInfo.kernelVersion`: the kernel release (`uname -r`).
    pub kernel_version: String,
    /// `nodeInfo.osImage`: `PRETTY_NAME` of os-release, `Linux` without one.
    pub os_image: String,
    /// `nodeInfo.machineID`.
    pub machine_id: String,
    /// `nodeInfo.bootID`.
    pub boot_id: String,
    /// `nodeInfo.systemUUID` (empty when the firmware does not tell).
    pub system_uuid: String,
    /// `nodeInfo.containerRuntimeVersion`: `<runtime>://<version>`, `remote` when the runtime did not say.
    pub container_runtime_version: String,
    /// `daemonEndpoints.kubeletEndpoint.Port`: the main port.
    pub kubelet_port: u16,
}

impl NodeFacts {
    /// The `InternalIP` addresses.
    pub fn internal_ips(&self) -> Vec<String> {
        self.addresses.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect()
    }

    /// What admission checks new pods against: allocatable cpu and memory, and `max_pods`.
    pub fn admission_resources(&self, max_pods: u32) -> nodelet_resources::eviction::verdict::NodeResources {
        let get = |name: &str, scale: i64| {
            self.allocatable
                .get(name)
                .and_then(|q| nodelet_resources::quantity::Quantity::parse(&q.0))
                .map_or(i64::MAX, |q| q.scaled_ceil(scale))
        };
        nodelet_resources::eviction::verdict::NodeResources {
            cpu_milli: get("cpu", 1000),
            memory_bytes: get("memory", 1),
            max_pods: usize::try_from(max_pods).unwrap_or(usize::MAX),
        }
    }

    /// Reads the facts of this machine for `config`; `runtime_version` from [`runtime_version`].
    pub fn detect(config: &FactsConfig, runtime_version: String) -> NodeFacts {
        Self::detect_in(Path::new("/"), config, runtime_version)
    }

    /// [`detect`](Self::detect) with `/proc`, `/sys` and `/etc` under `root` (tests use a fake tree);
    /// the ephemeral storage is always the filesystem of `config.root_dir`, reported only with
    /// `localStorageCapacityIsolation`, as the kubelet does.
    fn detect_in(root: &Path, config: &FactsConfig, runtime_version: String) -> NodeFacts {
        let read = |p: &str| read_trimmed(&root.join(p));
        let meminfo = crate::host_stats::meminfo(&root.join("proc"));
        let memory = meminfo.as_ref().and_then(|m| m.get("MemTotal").copied());
        if memory.is_none() {
            tracing::warn!("no MemTotal in /proc/meminfo: the node shows no memory capacity");
        }
        let isolation = config.local_storage_capacity_isolation;
        let ephemeral_storage =
            isolation.then(|| crate::host_stats::statvfs(&config.root_dir).map(|fs| fs.capacity)).flatten();
        if isolation && ephemeral_storage.is_none() {
            tracing::warn!(root = %config.root_dir.display(), "cannot statvfs the root directory");
        }
        let capacity = Capacity {
            cpu: online_cpus(root),
            memory,
            pods: u64::from(config.max_pods),
            ephemeral_storage,
            hugepages: hugepages(root, meminfo.as_ref()),
        };
        let reserved = hard_eviction_reservation(&config.hard_eviction, &capacity);
        let allocatable = allocatable(&capacity, &reserved);

        let internal_ip = internal_ip(
            config.address,
            read("proc/net/route").as_deref(),
            read("proc/net/fib_trie").as_deref(),
        );
        let mut addresses = Vec::new();
        // `--node-ip` (cluster mode) names them; otherwise one is detected.
        if !config.node_ips.is_empty() {
            addresses.extend(config.node_ips.iter().map(|ip| address("InternalIP", ip.to_string())));
        } else {
            match internal_ip {
                Some(ip) => addresses.push(address("InternalIP", ip.to_string())),
                None => {
                    tracing::warn!("no IP address found for the node: status.addresses has no InternalIP")
                }
            }
        }
        addresses.push(address("Hostname", config.node_name.clone()));

        let os_image = ["etc/os-release", "usr/lib/os-release"]
            .into_iter()
            .find_map(|p| std::fs::read_to_string(root.join(p)).ok())
            .and_then(|text| os_release_pretty_name(&text))
            .unwrap_or_else(|| "Linux".to_owned());
        NodeFacts {
            capacity: capacity.resource_list(),
            allocatable: allocatable.resource_list(),
            addresses,
            kernel_version: read("proc/sys/kernel/osrelease").unwrap_or_default(),
            os_image,
            machine_id: read("etc/machine-id")
                .or_else(|| read("var/lib/dbus/machine-id"))
                .unwrap_or_default(),
            boot_id: read("proc/sys/kernel/random/boot_id").unwrap_or_default(),
            system_uuid: read("sys/class/dmi/id/product_uuid").unwrap_or_default(),
            container_runtime_version: runtime_version,
            kubelet_port: config.kubelet_port,
        }
    }
}

/// `nodeInfo.containerRuntimeVersion` as the kubelet shows it: `<name>://<version>` from CRI `Version`
/// (e.g. `containerd://1.7.24`); `remote` when the runtime does not answer within 10 s.
pub async fn runtime_version(cri: &nodelet_cri::CriClient) -> String {
    match tokio::time::timeout(VERSION_TIMEOUT, cri.version()).await {
        Ok(Ok(v)) if !v.runtime_name.is_empty() => format!("{}://{}", v.runtime_name, v.runtime_version),
        Ok(Ok(_)) => "remote".to_owned(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "CRI Version failed: the node shows the runtime as \"remote\"");
            "remote".to_owned()
        }
        Err(_) => {
            tracing::warn!("CRI Version timed out: the node shows the runtime as \"remote\"");
            "remote".to_owned()
        }
    }
}

fn address(type_: &str, address: String) -> NodeAddress {
    NodeAddress { address, type_: type_.to_owned() }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

// ---------------------------------------------------------------------------------------------- resources

/// Amounts of the node's resources, in CPUs, bytes and pods.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Capacity {
    cpu: u64,
    /// Bytes; `None` when unknown (left out of the lists).
    memory: Option<u64>,
    pods: u64,
    /// Bytes; `None` when unknown.
    ephemeral_storage: Option<u64>,
    /// Page size in bytes → bytes of huge pages of that size.
    hugepages: BTreeMap<u64, u64>,
}

impl Capacity {
    /// As a v1 `ResourceList`, each amount in the canonical form the API server would give it.
    fn resource_list(&self) -> BTreeMap<String, Quantity> {
        let mut out = BTreeMap::new();
        out.insert("cpu".to_owned(), Quantity(decimal_si(self.cpu)));
        if let Some(m) = self.memory {
            out.insert("memory".to_owned(), Quantity(binary_si(m)));
        }
        out.insert("pods".to_owned(), Quantity(decimal_si(self.pods)));
        if let Some(e) = self.ephemeral_storage {
            out.insert("ephemeral-storage".to_owned(), Quantity(binary_si(e)));
        }
        for (size, bytes) in &self.hugepages {
            out.insert(format!("hugepages-{}", binary_si(*size)), Quantity(binary_si(*bytes)));
        }
        out
    }
}

/// What is taken off the capacity for allocatable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Reserved {
    memory: u64,
    ephemeral_storage: u64,
}

/// The kubelet's `hardEvictionReservation`: the hard `memory.available` threshold reserves memory, the
/// hard `nodefs.available` threshold reserves ephemeral storage; a percentage is of the capacity.
fn hard_eviction_reservation(hard: &[EvictionThreshold], capacity: &Capacity) -> Reserved {
    let mut r = Reserved::default();
    for t in hard {
        match t.signal.as_str() {
            "memory.available" => r.memory = threshold_bytes(&t.value, capacity.memory.unwrap_or(0)),
            "nodefs.available" => {
                r.ephemeral_storage = threshold_bytes(&t.value, capacity.ephemeral_storage.unwrap_or(0));
            }
            _ => {}
        }
    }
    r
}

/// A threshold in bytes: a quantity as is, a percentage of `capacity` as the kubelet computes it
/// (`GetThresholdQuantity`: the percentage parsed as a float32 fraction, the product truncated).
fn threshold_bytes(value: &ThresholdValue, capacity: u64) -> u64 {
    match value {
        ThresholdValue::Quantity(q) => *q,
        ThresholdValue::Percentage(p) => {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            {
                let fraction = f64::from(p.clamp(0.0, 100.0) as f32 / 100.0);
                (capacity as f64 * fraction) as u64
            }
        }
    }
}

/// Capacity minus what is reserved, never below zero; memory also minus the huge pages (they are part of
/// `MemTotal` but not available to pods as memory), as the kubelet's node status does.
fn allocatable(capacity: &Capacity, reserved: &Reserved) -> Capacity {
    let hugepages: u64 = capacity.hugepages.values().fold(0, |a, b| a.saturating_add(*b));
    Capacity {
        memory: capacity.memory.map(|m| m.saturating_sub(reserved.memory).saturating_sub(hugepages)),
        ephemeral_storage: capacity.ephemeral_storage.map(|e| e.saturating_sub(reserved.ephemeral_storage)),
        ..capacity.clone()
    }
}

/// `n` as a canonical decimal-SI quantity: `110`, `1k`, `2M`.
fn decimal_si(n: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    let (mut n, mut i) = (n, 0);
    while n != 0 && n % 1000 == 0 && i + 1 < SUFFIXES.len() {
        n /= 1000;
        i += 1;
    }
    format!("{n}{}", SUFFIXES[i])
}

/// `bytes` as a canonical binary-SI quantity: `16389712Ki`, `2Mi`, `1536`; like Kubernetes, an amount
/// under 1Ki is written in decimal SI (`1000` is `1k`).
fn binary_si(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return decimal_si(bytes);
    }
    let (mut n, mut i) = (bytes, 0);
    while n % 1024 == 0 && i + 1 < SUFFIXES.len() {
        n /= 1024;
        i += 1;
    }
    format!("{n}{}", SUFFIXES[i])
}

/// A kernel CPU list (`0-3,8,10-11`); `None` when malformed.
fn parse_cpu_list(text: &str) -> Option<BTreeSet<u32>> {
    /// More CPUs than any kernel supports: a bound for a malformed range.
    const MAX_CPUS: u32 = 1 << 16;
    let mut cpus = BTreeSet::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse::<u32>().ok()?, hi.trim().parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if lo > hi || hi >= MAX_CPUS {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// The CPUs this process may run on that are online (what `nproc` counts); at least 1.
fn online_cpus(root: &Path) -> u64 {
    let allowed = std::fs::read_to_string(root.join("proc/self/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(parse_cpu_list));
    let online = std::fs::read_to_string(root.join("sys/devices/system/cpu/online"))
        .ok()
        .and_then(|s| parse_cpu_list(&s));
    let n = match (allowed, online) {
        (Some(a), Some(o)) => a.intersection(&o).count(),
        (Some(s), None) | (None, Some(s)) => s.len(),
        (None, None) => 0,
    };
    if n > 0 {
        u64::try_from(n).unwrap_or(u64::MAX)
    } else {
        std::thread::available_parallelism().map_or(1, |n| u64::try_from(n.get()).unwrap_or(1))
    }
}

/// Huge pages by page size (bytes → bytes reserved): every size `/sys/kernel/mm/hugepages` offers, else
/// the default size of `/proc/meminfo` (`meminfo` in bytes, as [`crate::host_stats::meminfo`] gives it).
fn hugepages(root: &Path, meminfo: Option<&std::collections::HashMap<String, u64>>) -> BTreeMap<u64, u64> {
    let dir = root.join("sys/kernel/mm/hugepages");
    let mut out = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(kib) = name
                .to_str()
                .and_then(|n| n.strip_prefix("hugepages-"))
                .and_then(|n| n.strip_suffix("kB"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let pages = read_trimmed(&e.path().join("nr_hugepages")).and_then(|s| s.parse::<u64>().ok());
            let size = kib.saturating_mul(1024);
            out.insert(size, pages.unwrap_or(0).saturating_mul(size));
        }
    }
    if out.is_empty()
        && let Some(m) = meminfo
        && let (Some(size), Some(total)) = (m.get("Hugepagesize"), m.get("HugePages_Total"))
        && *size > 0
    {
        out.insert(*size, total.saturating_mul(*size));
    }
    out
}

// ---------------------------------------------------------------------------------------------- addresses

/// The `InternalIP`: `configured` (`address`) when it names one non-loopback address; else the host's
/// address in a directly connected network of the default route's interface (the kubelet's choice
/// without `--node-ip`); else the first of the host's global IPv4 addresses.
fn internal_ip(configured: IpAddr, route: Option<&str>, fib_trie: Option<&str>) -> Option<IpAddr> {
    if !configured.is_unspecified() && !configured.is_loopback() {
        return Some(configured);
    }
    let locals: Vec<Ipv4Addr> = fib_trie
        .map(local_ipv4_addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified() && !ip.is_multicast())
        .collect();
    let routes = route.map(parse_routes).unwrap_or_default();
    let default_ifaces: Vec<&str> =
        routes.iter().filter(|r| r.destination == 0 && r.mask == 0).map(|r| r.iface.as_str()).collect();
    let on_default = routes
        .iter()
        .filter(|r| r.gateway == 0 && r.mask != 0 && default_ifaces.contains(&r.iface.as_str()))
        .find_map(|r| {
            locals.iter().find(|ip| u32::from_ne_bytes(ip.octets()) & r.mask == r.destination & r.mask)
        });
    on_default.or(locals.first()).map(|ip| IpAddr::V4(*ip))
}

/// One IPv4 route of `/proc/net/route`; addresses as the kernel prints them (network byte order read as
/// a native integer).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    iface: String,
    destination: u32,
    gateway: u32,
    mask: u32,
}

fn parse_routes(text: &str) -> Vec<Route> {
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            Some(Route {
                iface: f[0].to_owned(),
                destination: hex(f[1])?,
                gateway: hex(f[2])?,
                mask: hex(f[7])?,
            })
        })
        .collect()
}

/// The host's own IPv4 addresses: the `/32 host LOCAL` leaves of `/proc/net/fib_trie`, in order, once each.
fn local_ipv4_addresses(fib_trie: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim();
        if let Some(ip) = t.strip_prefix("|-- ") {
            last = ip.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL")
            && let Some(ip) = last
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------- os-release

/// `PRETTY_NAME` of an os-release file (shell-style quoting: `"…"` with `\` escapes, or `'…'`).
fn os_release_pretty_name(text: &str) -> Option<String> {
    let value = text.lines().find_map(|l| l.trim().strip_prefix("PRETTY_NAME="))?.trim();
    let unquoted = if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.extend(chars.next()),
                c => out.push(c),
            }
        }
        out
    } else if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        inner.to_owned()
    } else {
        value.to_owned()
    };
    Some(unquoted).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn fake_root() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("tempdir: {e}"),
        }
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let path: PathBuf = root.join(rel);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = std::fs::write(&path, text) {
            panic!("write {}: {e}", path.display());
        }
    }

    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    fn threshold(signal: &str, value: ThresholdValue) -> EvictionThreshold {
        EvictionThreshold { signal: signal.to_owned(), value }
    }

    fn capacity(memory: u64, storage: u64) -> Capacity {
        Capacity {
            cpu: 4,
            memory: Some(memory),
            pods: 110,
            ephemeral_storage: Some(storage),
            hugepages: BTreeMap::new(),
        }
    }

    #[test]
    fn quantities_are_written_in_canonical_form() {
        assert_eq!(binary_si(16_389_712 * 1024), "16389712Ki");
        assert_eq!(binary_si(2 * MI), "2Mi");
        assert_eq!(binary_si(GI), "1Gi");
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(1536), "1536");
        assert_eq!(binary_si(1_000_000_014), "1000000014");
        assert_eq!(binary_si(1000), "1k", "under 1Ki Kubernetes writes decimal SI");
        assert_eq!(decimal_si(110), "110");
        assert_eq!(decimal_si(1000), "1k");
        assert_eq!(decimal_si(2), "2");
        assert_eq!(decimal_si(0), "0");
    }

    #[test]
    fn allocatable_takes_absolute_and_percentage_hard_thresholds_off_the_capacity() {
        let cap = capacity(8 * GI, 100 * GI);
        let hard = [
            threshold("memory.available", ThresholdValue::Quantity(100 * MI)),
            threshold("nodefs.available", ThresholdValue::Percentage(10.0)),
            // Other signals reserve nothing.
            threshold("imagefs.available", ThresholdValue::Percentage(15.0)),
            threshold("nodefs.inodesFree", ThresholdValue::Percentage(5.0)),
        ];
        let reserved = hard_eviction_reservation(&hard, &cap);
        // 10% as the kubelet computes it: float32 0.1 times the capacity, truncated.
        let ten_percent = (100.0 * GI as f64 * f64::from(0.1_f32)) as u64;
        assert_eq!(ten_percent, 10_737_418_400, "160 bytes over 10 GiB, like the kubelet");
        assert_eq!(reserved, Reserved { memory: 100 * MI, ephemeral_storage: ten_percent });
        let alloc = allocatable(&cap, &reserved);
        assert_eq!(alloc.memory, Some(8 * GI - 100 * MI));
        assert_eq!(alloc.ephemeral_storage, Some(100 * GI - ten_percent));
        assert_eq!((alloc.cpu, alloc.pods), (4, 110));
        let list = alloc.resource_list();
        assert_eq!(list.get("memory"), Some(&q("8092Mi")));
        assert_eq!(list.get("ephemeral-storage"), Some(&q(&(100 * GI - ten_percent).to_string())));
        assert_eq!(list.get("cpu"), Some(&q("4")));
        assert_eq!(list.get("pods"), Some(&q("110")));
    }

    #[test]
    fn a_memory_percentage_is_of_the_memory_capacity() {
        let cap = capacity(16 * GI, GI);
        let hard = [threshold("memory.available", ThresholdValue::Percentage(50.0))];
        let alloc = allocatable(&cap, &hard_eviction_reservation(&hard, &cap));
        assert_eq!(alloc.memory, Some(8 * GI));
        assert_eq!(alloc.ephemeral_storage, Some(GI), "no nodefs threshold: nothing reserved");
    }

    #[test]
    fn allocatable_is_never_negative() {
        let mut cap = capacity(64 * MI, 10 * MI);
        cap.hugepages.insert(2 * MI, 32 * MI);
        let hard = [
            threshold("memory.available", ThresholdValue::Quantity(100 * MI)),
            threshold("nodefs.available", ThresholdValue::Quantity(u64::MAX)),
        ];
        let alloc = allocatable(&cap, &hard_eviction_reservation(&hard, &cap));
        assert_eq!((alloc.memory, alloc.ephemeral_storage), (Some(0), Some(0)));
        let list = alloc.resource_list();
        assert_eq!(list.get("memory"), Some(&q("0")));
        assert_eq!(list.get("ephemeral-storage"), Some(&q("0")));
        let hard = [threshold("nodefs.available", ThresholdValue::Percentage(100.0))];
        let alloc = allocatable(&cap, &hard_eviction_reservation(&hard, &cap));
        assert_eq!(alloc.ephemeral_storage, Some(0), "100% reserves everything, no more");
    }

    #[test]
    fn huge_pages_are_capacity_of_their_own_and_not_allocatable_memory() {
        let mut cap = capacity(8 * GI, GI);
        cap.hugepages.insert(2 * MI, 512 * MI);
        cap.hugepages.insert(GI, 0);
        let hard = [threshold("memory.available", ThresholdValue::Quantity(100 * MI))];
        let alloc = allocatable(&cap, &hard_eviction_reservation(&hard, &cap));
        assert_eq!(alloc.memory, Some(8 * GI - 100 * MI - 512 * MI));
        let list = alloc.resource_list();
        assert_eq!(list.get("hugepages-2Mi"), Some(&q("512Mi")));
        assert_eq!(list.get("hugepages-1Gi"), Some(&q("0")));
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1\n"), Some([0, 1].into()));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some([0, 2, 3, 4, 7].into()));
        assert_eq!(parse_cpu_list(""), Some(BTreeSet::new()));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-99999999"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn os_release_pretty_name_is_unquoted() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n";
        assert_eq!(os_release_pretty_name(text).as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(
            os_release_pretty_name("PRETTY_NAME='Alpine Linux v3.20'").as_deref(),
            Some("Alpine Linux v3.20")
        );
        assert_eq!(os_release_pretty_name("PRETTY_NAME=Plain").as_deref(), Some("Plain"));
        assert_eq!(
            os_release_pretty_name("PRETTY_NAME=\"a \\\"b\\\" \\\\c\"").as_deref(),
            Some("a \"b\" \\c")
        );
        assert_eq!(os_release_pretty_name("NAME=x\n"), None);
        assert_eq!(os_release_pretty_name("PRETTY_NAME=\"\""), None);
    }

    /// `/proc/net/route` text for routes given as dotted addresses (the kernel's native-order hex).
    fn route_table(routes: &[(&str, &str, &str, &str)]) -> String {
        let hex = |s: &str| {
            let ip: Ipv4Addr = s.parse().unwrap_or(Ipv4Addr::UNSPECIFIED);
            format!("{:08X}", u32::from_ne_bytes(ip.octets()))
        };
        let mut out = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
            .to_owned();
        for (iface, dest, gw, mask) in routes {
            out.push_str(&format!(
                "{iface}\t{}\t{}\t0003\t0\t0\t0\t{}\t0\t0\t0\n",
                hex(dest),
                hex(gw),
                hex(mask)
            ));
        }
        out
    }

    const FIB_TRIE: &str = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     \
        +-- 127.0.0.0/8 2 0 2\n        |-- 127.0.0.1\n           /32 host LOCAL\n     \
        +-- 10.1.0.0/16 2 0 2\n        |-- 10.1.0.0\n           /16 link UNICAST\n        \
        |-- 10.1.0.1\n           /32 host LOCAL\n        |-- 10.1.255.255\n           /32 link BROADCAST\n     \
        |-- 169.254.1.1\n        /32 host LOCAL\n     \
        |-- 192.0.2.7\n        /32 host LOCAL\n\
        Local:\n  |-- 127.0.0.1\n     /32 host LOCAL\n  |-- 192.0.2.7\n     /32 host LOCAL\n";

    #[test]
    fn the_host_addresses_are_the_local_leaves_of_the_fib_trie() {
        let ips: Vec<String> = local_ipv4_addresses(FIB_TRIE).iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["127.0.0.1", "10.1.0.1", "169.254.1.1", "192.0.2.7"]);
    }

    #[test]
    fn the_internal_ip_is_on_the_default_route_interface() {
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let routes = route_table(&[
            ("eth0", "0.0.0.0", "192.0.2.1", "0.0.0.0"),
            ("eth0", "192.0.2.0", "0.0.0.0", "255.255.255.0"),
            ("br0", "10.1.0.0", "0.0.0.0", "255.255.0.0"),
        ]);
        let ip = internal_ip(any, Some(&routes), Some(FIB_TRIE));
        assert_eq!(
            ip,
            Some("192.0.2.7".parse().unwrap_or(any)),
            "not the bridge's 10.1.0.1, which sorts first"
        );
        // No default route: the first global address (not loopback, not link-local).
        let routes = route_table(&[("br0", "10.1.0.0", "0.0.0.0", "255.255.0.0")]);
        assert_eq!(internal_ip(any, Some(&routes), Some(FIB_TRIE)), Some("10.1.0.1".parse().unwrap_or(any)));
        // A specific `address` wins; loopback does not count.
        let configured: IpAddr = "192.0.2.99".parse().unwrap_or(any);
        assert_eq!(internal_ip(configured, None, None), Some(configured));
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(internal_ip(lo, None, Some(FIB_TRIE)), Some("10.1.0.1".parse().unwrap_or(any)));
        // Nothing but loopback: no InternalIP.
        assert_eq!(internal_ip(any, None, Some("Local:\n  |-- 127.0.0.1\n     /32 host LOCAL\n")), None);
    }

    /// The configuration's defaults: `maxPods` 110, `evictionHard` memory.available 100Mi and
    /// nodefs.available 10%, address 0.0.0.0, port 10250.
    fn test_config(root_dir: &Path) -> FactsConfig {
        FactsConfig {
            root_dir: root_dir.to_owned(),
            node_name: "node-a".into(),
            max_pods: 110,
            hard_eviction: vec![
                threshold("memory.available", ThresholdValue::Quantity(100 * MI)),
                threshold("nodefs.available", ThresholdValue::Percentage(10.0)),
            ],
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            node_ips: Vec::new(),
            kubelet_port: 10250,
            local_storage_capacity_isolation: true,
        }
    }

    #[test]
    fn facts_are_read_from_proc_sys_and_etc() {
        let root = fake_root();
        let r = root.path();
        write(
            r,
            "proc/meminfo",
            "MemTotal:       16389712 kB\nMemFree: 1 kB\nHugePages_Total: 4\nHugepagesize: 2048 kB\n",
        );
        write(r, "proc/self/status", "Name:\tnodelet\nCpus_allowed_list:\t0-3,6\n");
        write(r, "sys/devices/system/cpu/online", "0-5\n");
        write(r, "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "4\n");
        write(r, "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n");
        write(r, "proc/sys/kernel/osrelease", "6.1.0-test\n");
        write(r, "proc/sys/kernel/random/boot_id", "b0075e1d-0000-4000-8000-000000000001\n");
        write(r, "etc/os-release", "PRETTY_NAME=\"Test OS 1\"\n");
        write(r, "etc/machine-id", "abc123\n");
        write(
            r,
            "proc/net/route",
            &route_table(&[
                ("eth0", "0.0.0.0", "192.0.2.1", "0.0.0.0"),
                ("eth0", "192.0.2.0", "0.0.0.0", "255.255.255.0"),
            ]),
        );
        write(r, "proc/net/fib_trie", FIB_TRIE);
        let state = fake_root();
        let config = test_config(state.path());
        let facts = NodeFacts::detect_in(r, &config, "containerd://1.7.0".into());
        let storage = crate::host_stats::statvfs(state.path()).map(|f| f.capacity).unwrap_or(0);
        assert!(storage > 0);
        let cap = &facts.capacity;
        assert_eq!(cap.get("cpu"), Some(&q("4")), "CPUs 0-3 are allowed and online, 6 is offline");
        assert_eq!(cap.get("memory"), Some(&q("16389712Ki")));
        assert_eq!(cap.get("pods"), Some(&q("110")));
        assert_eq!(cap.get("ephemeral-storage"), Some(&q(&binary_si(storage))));
        assert_eq!(cap.get("hugepages-2Mi"), Some(&q("8Mi")));
        assert_eq!(cap.get("hugepages-1Gi"), Some(&q("0")));
        // The default evictionHard: memory.available 100Mi, nodefs.available 10%.
        let alloc = &facts.allocatable;
        assert_eq!(alloc.get("memory"), Some(&q(&binary_si(16_389_712 * 1024 - 100 * MI - 8 * MI))));
        let ten_percent = (storage as f64 * f64::from(0.1_f32)) as u64;
        assert_eq!(alloc.get("ephemeral-storage"), Some(&q(&binary_si(storage - ten_percent))));
        assert_eq!(alloc.get("cpu"), Some(&q("4")));
        assert_eq!(alloc.get("hugepages-2Mi"), Some(&q("8Mi")));
        let addresses: Vec<(&str, &str)> =
            facts.addresses.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
        assert_eq!(addresses, [("InternalIP", "192.0.2.7"), ("Hostname", "node-a")]);
        assert_eq!(facts.kernel_version, "6.1.0-test");
        assert_eq!(facts.os_image, "Test OS 1");
        assert_eq!(facts.machine_id, "abc123");
        assert_eq!(facts.boot_id, "b0075e1d-0000-4000-8000-000000000001");
        assert_eq!(facts.system_uuid, "", "no DMI: empty");
        assert_eq!(facts.container_runtime_version, "containerd://1.7.0");
        assert_eq!(facts.kubelet_port, 10250);
    }

    #[test]
    fn without_sysfs_huge_pages_come_from_meminfo_and_without_os_release_the_image_is_linux() {
        let root = fake_root();
        let r = root.path();
        write(r, "proc/meminfo", "MemTotal: 1048576 kB\nHugePages_Total: 2\nHugepagesize: 1048576 kB\n");
        let state = fake_root();
        let facts = NodeFacts::detect_in(r, &test_config(state.path()), "remote".into());
        assert_eq!(facts.capacity.get("hugepages-1Gi"), Some(&q("2Gi")));
        assert_eq!(facts.capacity.get("hugepages-2Mi"), None);
        assert_eq!(facts.allocatable.get("memory"), Some(&q("0")), "1Gi - 100Mi - 2Gi of huge pages");
        assert_eq!(facts.os_image, "Linux");
        let mut no_isolation = test_config(state.path());
        no_isolation.local_storage_capacity_isolation = false;
        let without = NodeFacts::detect_in(r, &no_isolation, "remote".into());
        assert!(facts.capacity.contains_key("ephemeral-storage"));
        assert!(
            !without.capacity.contains_key("ephemeral-storage")
                && !without.allocatable.contains_key("ephemeral-storage"),
            "without localStorageCapacityIsolation the kubelet reports no ephemeral storage"
        );
        let cpus = facts.capacity.get("cpu").map(|c| c.0.clone()).unwrap_or_default();
        let expected = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        assert_eq!(cpus, expected.to_string(), "no CPU lists: the available parallelism");
    }
}

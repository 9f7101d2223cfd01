//! The kubelet's Summary API (`k8s.io/kubelet/pkg/apis/stats/v1alpha1`), served on `/stats/summary`:
//! the same JSON field names, units (bytes, nanoseconds of CPU, nanocores) and omission rules, so that
//! metrics-server, the OpenTelemetry kubeletstats receiver and other readers work unchanged.
//!
//! Optional values are `Option`s (the kubelet's pointers): `None` is left out of the JSON.

use serde::Serialize;

/// A point in time, nanoseconds since the Unix epoch; serialized as the kubelet's `metav1.Time`
/// (RFC 3339, whole seconds, UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time(pub i64);

impl Time {
    /// Whole seconds since the epoch (rounded down).
    pub fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1_000_000_000)
    }

    /// Milliseconds since the epoch (rounded down), for Prometheus sample timestamps.
    pub fn unix_millis(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }

    /// RFC 3339 with whole seconds in UTC, e.g. `2024-05-01T12:00:00Z`.
    pub fn rfc3339(self) -> String {
        match time::OffsetDateTime::from_unix_timestamp(self.unix_seconds()) {
            Ok(t) => format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            ),
            Err(_) => "1970-01-01T00:00:00Z".to_owned(),
        }
    }
}

impl Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.rfc3339())
    }
}

/// The whole summary: the node and its pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// Every pod with a sandbox on the node.
    pub pods: Vec<PodStats>,
}

/// The node's stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// System containers (`pods`: the cgroup every pod runs under).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// When the node booted.
    pub start_time: Time,
    /// CPU of the whole machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the whole machine; `availableBytes` is what eviction calls `memory.available`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The default interface and all others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the root directory (`--root-dir`): eviction's `nodefs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The runtime's image and container filesystems: eviction's `imagefs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process IDs: eviction's `pid.available` is `maxpid - curproc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// The runtime's filesystems.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Where images live (`usedBytes`: what the images take).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// Where container writable layers live (the image filesystem unless the runtime splits them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// Process ID limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RlimitStats {
    /// When sampled.
    pub time: Time,
    /// The largest number of processes: the smaller of `kernel.pid_max` and `kernel.threads-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    /// Processes (tasks) that exist now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

/// A pod's stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When its sandbox was created.
    pub start_time: Time,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// The pod cgroup's CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// The pod cgroup's memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The pod's network namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its volumes that report usage (not hostPath).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    /// Local ephemeral storage: container writable layers, logs and the local volumes.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    /// How many processes the pod has.
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
    /// The pod's cgroup (`<cgroup root>/pod<uid>`), when nodelet manages one; not in the JSON
    /// (the `id` label of `/metrics/cadvisor`).
    #[serde(skip)]
    pub cgroup: Option<String>,
}

/// Names a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// A pod's process count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessStats {
    /// Processes in the pod's cgroup.
    #[serde(rename = "process_count", skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

/// A container's stats (or a system container's).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name in the pod spec (or the system container's: `pods`).
    pub name: String,
    /// When the container was created.
    pub start_time: Time,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The writable layer (`usedBytes`) on the container filesystem (capacity, available).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// The container's log files (`usedBytes`) on the log filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    /// What the runtime calls the container, its image and its cgroup; not in the JSON (the
    /// labels of `/metrics/cadvisor`). Empty for system containers.
    #[serde(skip)]
    pub runtime: ContainerRuntimeInfo,
}

/// A container as the runtime knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerRuntimeInfo {
    /// The runtime's container ID.
    pub id: String,
    /// The image, as the runtime names it (a reference such as `docker.io/library/busybox:1.36`
    /// when it gives one, else the image ID).
    pub image: String,
    /// The container's cgroup (`<pod cgroup>/<id>`), when nodelet manages the pod's cgroup.
    pub cgroup: Option<String>,
}

/// CPU usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When sampled.
    pub time: Time,
    /// Usage over the last sampling interval, in billionths of a core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time, in core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When sampled.
    pub time: Time,
    /// Limit (or capacity) minus the working set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// All memory in use, page cache included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages: what the OOM killer and eviction look at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory and swap cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Cumulative page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Cumulative major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// Network usage: the default interface (flattened) and every interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NetworkStats {
    /// When sampled.
    pub time: Time,
    /// The default interface.
    #[serde(flatten)]
    pub default: InterfaceStats,
    /// Every interface.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// One network interface, cumulative counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// Its name.
    pub name: String,
    /// Bytes received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Send errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// Filesystem usage, in bytes and inodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When sampled.
    pub time: Time,
    /// Free bytes for unprivileged users.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used (by the whole filesystem, or by the thing these stats describe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Total inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used (by the whole filesystem, or by the thing these stats describe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// A pod volume's usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// Usage (`usedBytes`, `inodesUsed`: the volume's own; the rest: its filesystem's).
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    pub name: String,
    /// The claim behind it, for `persistentVolumeClaim` volumes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

/// Names a PersistentVolumeClaim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PvcReference {
    /// Claim name.
    pub name: String,
    /// Claim namespace.
    pub namespace: String,
}

impl Summary {
    /// The summary with CPU and memory only (`/stats/summary?only_cpu_and_memory=true`, as the kubelet).
    pub fn only_cpu_and_memory(mut self) -> Self {
        let strip = |c: &mut ContainerStats| {
            c.rootfs = None;
            c.logs = None;
        };
        self.node.network = None;
        self.node.fs = None;
        self.node.runtime = None;
        self.node.rlimit = None;
        self.node.system_containers.iter_mut().for_each(strip);
        for pod in &mut self.pods {
            pod.network = None;
            pod.volume.clear();
            pod.ephemeral_storage = None;
            pod.process_stats = None;
            pod.containers.iter_mut().for_each(strip);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_the_kubelet_field_names() {
        let pod = PodStats {
            pod_ref: PodReference { name: "p".into(), namespace: "ns".into(), uid: "u".into() },
            start_time: Time(1_700_000_000_123_456_789),
            containers: vec![ContainerStats {
                name: "c".into(),
                rootfs: Some(FsStats { used_bytes: Some(5), ..FsStats::default() }),
                ..ContainerStats::default()
            }],
            volume: vec![VolumeStats {
                fs: FsStats { used_bytes: Some(7), ..FsStats::default() },
                name: "data".into(),
                pvc_ref: Some(PvcReference { name: "claim".into(), namespace: "ns".into() }),
            }],
            ephemeral_storage: Some(FsStats { used_bytes: Some(12), ..FsStats::default() }),
            process_stats: Some(ProcessStats { process_count: Some(3) }),
            network: Some(NetworkStats {
                default: InterfaceStats { name: "eth0".into(), rx_bytes: Some(1), ..Default::default() },
                ..Default::default()
            }),
            ..PodStats::default()
        };
        let json =
            serde_json::to_value(Summary { pods: vec![pod], ..Summary::default() }).unwrap_or_default();
        let p = &json["pods"][0];
        assert_eq!(p["podRef"]["uid"], "u");
        assert_eq!(p["startTime"], "2023-11-14T22:13:20Z");
        assert_eq!(p["containers"][0]["rootfs"]["usedBytes"], 5);
        assert_eq!(p["volume"][0]["usedBytes"], 7);
        assert_eq!(p["volume"][0]["pvcRef"]["name"], "claim");
        assert_eq!(p["ephemeral-storage"]["usedBytes"], 12);
        assert_eq!(p["process_stats"]["process_count"], 3);
        assert_eq!(p["network"]["name"], "eth0");
        assert_eq!(p["network"]["rxBytes"], 1);
        assert!(p.get("cpu").is_none(), "None is left out: {p}");
        assert!(p["containers"][0]["rootfs"].get("capacityBytes").is_none());
        assert_eq!(json["node"]["startTime"], "1970-01-01T00:00:00Z");
        assert!(json["node"].get("systemContainers").is_none());
    }

    #[test]
    fn only_cpu_and_memory_drops_the_rest() {
        let s = Summary {
            node: NodeStats { fs: Some(FsStats::default()), ..NodeStats::default() },
            pods: vec![PodStats {
                memory: Some(MemoryStats::default()),
                volume: vec![VolumeStats::default()],
                ..PodStats::default()
            }],
        }
        .only_cpu_and_memory();
        assert!(s.node.fs.is_none());
        assert!(s.pods[0].volume.is_empty());
        assert!(s.pods[0].memory.is_some());
    }
}

//! Node, pod and container statistics: the numbers behind `/stats/summary`, `/metrics/resource`,
//! `/metrics/cadvisor` (both computed from the summary: [`resource`], [`cadvisor`]) and the eviction
//! signals.
//!
//! | What | Where from |
//! |---|---|
//! | node CPU | the root cgroup's cumulative CPU time (`/proc/stat` busy time without one) |
//! | node memory | `MemTotal` minus the root cgroup's working set (usage minus inactive file pages), as the kubelet computes `memory.available`; on cgroup v2 usage is `MemTotal - MemFree` |
//! | nodefs | `statvfs` of `--root-dir` |
//! | imagefs | CRI `ImageFsInfo` (bytes and inodes the images use) plus `statvfs` of its mountpoint |
//! | PIDs | `min(kernel.pid_max, kernel.threads-max)` and the task count of `/proc/loadavg` |
//! | pod CPU, memory, network, processes | CRI `ListPodSandboxStats` with a cgroup root where the runtime may be asked (containerd 2.x; not containerd before 1.6.22: `CriClient::sandbox_stats_are_safe`; not for a back-off of 1 min doubling up to 1 h after a failed call, for good when the runtime lacks the call: `sandbox_stats_backoff`); the pod cgroup `<cgroupRoot>/pod<uid>` and the network namespace of the sandbox's process where the runtime gives nothing or is not asked; without a cgroup root (sandboxes without a cgroup parent, which containerd 2.x cannot measure) the sums of the containers' CPU and memory, and the sandbox's network namespace |
//! | container CPU, memory | the runtime's: `ListPodSandboxStats`'s containers (containerd 1.7, 2.x), CRI `ListContainerStats` in a gathering that asks for it (below) and always without a cgroup root; else the container cgroup `<pod cgroup>/<id>` |
//! | container writable layer | CRI `ListContainerStats`, asked every `volumeStatsAggPeriod` by housekeeping and by every fresh gathering; the newest answer in between |
//! | container logs | disk usage of `<podLogsDir>/<ns>_<pod>_<uid>/<container>/` |
//! | volumes | the background volume measurement ([`volume_usage`], every `volumeStatsAggPeriod`) and `statvfs` of the volume's filesystem (not hostPath) |
//!
//! CPU `usageNanoCores` is the runtime's when it gives one, else the rate since the previous sample of
//! the same cgroup (absent on the first). The runtime reads the same cgroup files (cumulative CPU time;
//! working set = usage minus inactive file pages), so the numbers are the same whichever gives them: the
//! daemon test `pod_cpu_and_memory_are_the_cgroups_numbers_from_the_runtime_or_the_cgroups` holds both
//! against the kernel's files.
//!
//! The pods' part is costly at scale (containerd asks every container's shim for
//! `ListContainerStats`: half a second of its CPU at 250 pods; and logs are walked on disk), so the
//! runtime's container stats are asked for only as often as the volumes are measured (their
//! writable layers are disk usage too), and the summary is gathered in the background every
//! housekeeping interval ([`StatsProvider::housekeeping`], the kubelet's
//! `--housekeeping-interval`, 10 s) and requests are served the newest one: `/stats/summary` and
//! `/metrics/resource` read it without touching the runtime or the disk. Only when no summary younger than
//! two intervals exists (before the first round, or with no housekeeping running) does a request gather one
//! itself (the host numbers through the readers of [`nodelet_node::host_stats`]). The volumes are never
//! walked by a gathering: their usage is the newest background measurement ([`volume_usage`], as the
//! kubelet's volume stats are cached for `volumeStatsAggPeriod`), which the local storage check reads too.
//! [`StatsProvider::node`], the eviction pair's node signals, is read fresh: `/proc`, `statvfs`
//! and one CRI call; the pods' usage, which the eviction pair asks for only when it is about to evict,
//! is gathered fresh too ([`StatsProvider::refresh`], after a fresh round of [`StatsProvider::measure_volumes`]).
//!
//! This crate (`nodelet-stats`) is a leaf of the daemon: it imports the drivers (`nodelet-cri`,
//! `nodelet-host`, `nodelet-node`), the pairs' model (`nodelet-resources`), the engine's `Store` and the
//! configuration's defaults (`nodelet-config`), never the daemon, the servers, the pod sources or the
//! cluster client; they read it (the servers' `/stats` and `/metrics` routes, the pressure pair, the node).

pub mod cadvisor;
pub mod local_storage;
pub mod resource;
mod sandbox_stats_backoff;
pub mod summary;
pub mod volume_usage;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nodelet_cri::labels::{self, Lookup};
use nodelet_cri::listing::{ListedContainer, ListedSandbox};
use nodelet_cri::proto as v1;
use nodelet_cri::{ContainerFilter, CriPodRuntime, SandboxFilter};
use nodelet_resources::common::clock::Clock;
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{VolumeKey, split_key};
use reconcile_engine::Store;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use nodelet_node::host_stats::{self as host, CgroupVersion, FsInfo, MemorySample};
use summary::{
    ContainerRuntimeInfo, ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats,
    NodeStats, PodReference, PodStats, ProcessStats, PvcReference, RlimitStats, RuntimeStats, Summary, Time,
    VolumeStats,
};

/// Why stats could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// A CRI call the summary cannot do without (listing sandboxes or containers) failed.
    #[error("container runtime: {0}")]
    Runtime(#[from] nodelet_cri::CriError),
    /// The host's memory could not be read (`/proc/meminfo`, the root memory cgroup).
    #[error("cannot read the node's memory from {0}")]
    Memory(String),
    /// The blocking task reading the host failed.
    #[error("stats task failed: {0}")]
    Task(String),
}

/// Where the provider reads from.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    /// The node's name (`nodeName` of the summary; nodelet's sandboxes are labelled with it).
    pub node_name: String,
    /// `--root-dir`: its filesystem is nodefs.
    pub root_dir: PathBuf,
    /// `podLogsDir`: container logs.
    pub pod_logs_dir: PathBuf,
    /// Where `/proc` is (tests point it elsewhere).
    pub proc_fs: PathBuf,
}

impl StatsConfig {
    /// Reads the real `/proc`.
    pub fn new(node_name: impl Into<String>, root_dir: &Path, pod_logs_dir: &Path) -> Self {
        Self {
            node_name: node_name.into(),
            root_dir: root_dir.to_path_buf(),
            pod_logs_dir: pod_logs_dir.to_path_buf(),
            proc_fs: PathBuf::from("/proc"),
        }
    }
}

/// Gathers node and pod statistics on demand. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct StatsProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StatsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsProvider").field("node", &self.inner.config.node_name).finish_non_exhaustive()
    }
}

struct Inner {
    runtime: Arc<CriPodRuntime>,
    config: StatsConfig,
    cgroup_fs: PathBuf,
    cgroup_version: CgroupVersion,
    clock: Clock,
    pods: Option<Store<PodUid, DesiredPod>>,
    volumes: Option<Store<VolumeKey, VolumeActual>>,
    /// The previous CPU sample of each cgroup (`node`, pod UID, container ID): (time, cumulative ns).
    cpu_samples: Mutex<HashMap<String, (i64, u64)>>,
    /// How often [`StatsProvider::housekeeping`] gathers the summary.
    housekeeping_interval: Duration,
    /// How often housekeeping asks the runtime for the containers' stats (`ListContainerStats`) for their
    /// writable layers, when their CPU and memory can be read from their cgroups.
    container_fs_interval: Duration,
    /// The containers' writable layers from the newest `ListContainerStats`, and when it was answered.
    writable_layers: Mutex<Option<(Instant, WritableLayers)>>,
    /// The newest summary and when it was gathered.
    cache: Mutex<Option<(Instant, Arc<Summary>)>>,
    /// Held while a summary is gathered: one gathering at a time.
    gathering: tokio::sync::Mutex<()>,
    /// The newest local storage measurement ([`local_storage`]).
    local_storage: Mutex<Arc<nodelet_resources::eviction::local_storage::LocalStorage>>,
    /// Where the next local storage measurement starts in the list of pods.
    local_storage_cursor: std::sync::atomic::AtomicUsize,
    /// The local storage walks under way, by the path they measure, resumed by the next measurement.
    local_storage_walks: Mutex<local_storage::Walks>,
    /// The newest measurement of the pods' volumes ([`volume_usage`]).
    volume_usage: Mutex<Arc<volume_usage::VolumeUsages>>,
    /// Where the next volume measurement starts in the list of volumes.
    volume_cursor: std::sync::atomic::AtomicUsize,
    /// When to ask for sandbox stats again after `ListPodSandboxStats` failed.
    sandbox_stats_backoff: Mutex<sandbox_stats_backoff::SandboxStatsBackoff>,
}

/// Each container's writable layer usage, by container ID.
type WritableLayers = Arc<HashMap<String, v1::FilesystemUsage>>;

/// One reading of the node, before it is turned into [`NodeStats`].
struct NodeSample {
    boot: Option<i64>,
    cpu: Option<u64>,
    memory: Option<(u64, MemorySample)>,
    nodefs: Option<FsInfo>,
    /// The filesystem of the pod logs.
    logfs: Option<FsInfo>,
    pids: (Option<i64>, Option<i64>),
    net: (Vec<host::NetDev>, Option<String>),
    /// `pods` system container: the cgroup root's CPU and memory.
    pods_cpu: Option<u64>,
    pods_memory: Option<MemorySample>,
}

/// One volume's usage, from the background measurement.
struct VolumeDisk {
    name: String,
    usage: volume_usage::VolumeUsage,
    fs: Option<FsInfo>,
    claim: Option<PvcReference>,
    /// Counts as the pod's local ephemeral storage (not a persistent volume).
    ephemeral: bool,
}

/// What a pod's files take, read off the disk.
#[derive(Default)]
struct PodDisk {
    /// Per container name: its logs.
    logs: HashMap<String, host::DiskUsage>,
    /// The volumes that report usage.
    volumes: Vec<VolumeDisk>,
    /// Cgroup fallbacks: pod CPU, memory, processes; container CPU and memory by ID.
    cpu: Option<u64>,
    memory: Option<MemorySample>,
    processes: Option<u64>,
    /// The pod's interfaces, from its sandbox's network namespace, and the default route's.
    network: Option<(Vec<host::NetDev>, Option<String>)>,
    containers: HashMap<String, (Option<u64>, Option<MemorySample>)>,
}

impl StatsProvider {
    /// A provider over the runtime's CRI client and its pod cgroups.
    pub fn new(runtime: Arc<CriPodRuntime>, config: StatsConfig, clock: Clock) -> Self {
        let cgroup_fs = runtime.config().cgroup_fs.clone();
        let cgroup_version = CgroupVersion::detect(&cgroup_fs);
        Self {
            inner: Arc::new(Inner {
                runtime,
                config,
                cgroup_fs,
                cgroup_version,
                clock,
                pods: None,
                volumes: None,
                cpu_samples: Mutex::default(),
                housekeeping_interval: nodelet_config::DEFAULT_HOUSEKEEPING_INTERVAL,
                container_fs_interval: nodelet_config::DEFAULT_VOLUME_STATS_AGG_PERIOD,
                writable_layers: Mutex::default(),
                cache: Mutex::default(),
                gathering: tokio::sync::Mutex::const_new(()),
                local_storage: Mutex::default(),
                local_storage_cursor: std::sync::atomic::AtomicUsize::new(0),
                local_storage_walks: Mutex::default(),
                volume_usage: Mutex::default(),
                volume_cursor: std::sync::atomic::AtomicUsize::new(0),
                sandbox_stats_backoff: Mutex::default(),
            }),
        }
    }

    /// Gathers the summary every `interval` (see [`housekeeping`](Self::housekeeping)) instead of the
    /// default 10 s. Call before cloning.
    pub fn with_housekeeping_interval(mut self, interval: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.housekeeping_interval = interval;
        }
        self
    }

    /// Asks the runtime for the containers' stats only every `interval` in housekeeping (their writable
    /// layers' usage; CPU and memory are read from their cgroups) instead of every minute (the default,
    /// `volumeStatsAggPeriod`'s). Call before cloning.
    pub fn with_container_fs_interval(mut self, interval: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.container_fs_interval = interval;
        }
        self
    }

    /// Gathers the summary now and every housekeeping interval after, until `shutdown`; requests are
    /// served the newest one. A failed round keeps the previous summary (it is served until it is two
    /// intervals old). With a cgroup root, a round reads the containers' CPU and memory from their
    /// cgroups and asks the runtime for the containers' stats (`ListContainerStats`, which containerd
    /// answers by asking every container's shim) only when the writable layers' usage it has is a
    /// container fs interval old: at 250 pods that call took half a second of containerd's CPU.
    pub async fn housekeeping(self, shutdown: CancellationToken) {
        every(self.inner.housekeeping_interval, &shutdown, || async {
            let started = Instant::now();
            let gathered = {
                let _one_at_a_time = self.inner.gathering.lock().await;
                self.gather_and_keep(false).await
            };
            match gathered {
                Ok(summary) => tracing::trace!(
                    pods = summary.pods.len(),
                    took = ?started.elapsed(),
                    "stats summary gathered"
                ),
                Err(e) => tracing::debug!(error = %e, "cannot gather the stats summary"),
            }
        })
        .await;
    }

    /// The newest summary if it is younger than two housekeeping intervals.
    fn fresh(&self) -> Option<Arc<Summary>> {
        let cache = self.inner.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let max_age = self.inner.housekeeping_interval.saturating_mul(2);
        cache.as_ref().filter(|(at, _)| at.elapsed() <= max_age).map(|(_, s)| s.clone())
    }

    /// Gathers a summary now (after any gathering under way), with the runtime's container stats of
    /// now, and keeps it as the newest.
    pub async fn refresh(&self) -> Result<Arc<Summary>, StatsError> {
        let _one_at_a_time = self.inner.gathering.lock().await;
        self.gather_and_keep(true).await
    }

    /// Gathers a summary and keeps it; `fresh_runtime_stats`: with the runtime's container stats of now
    /// whatever their age.
    async fn gather_and_keep(&self, fresh_runtime_stats: bool) -> Result<Arc<Summary>, StatsError> {
        let summary = Arc::new(self.gather(fresh_runtime_stats).await?);
        let mut cache = self.inner.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *cache = Some((Instant::now(), summary.clone()));
        Ok(summary)
    }

    /// The newest summary (see the [module docs](self)): the one housekeeping gathered last, or one gathered
    /// now when none is younger than two housekeeping intervals.
    pub(crate) async fn cached_summary(&self) -> Result<Arc<Summary>, StatsError> {
        if let Some(summary) = self.fresh() {
            return Ok(summary);
        }
        let _one_at_a_time = self.inner.gathering.lock().await;
        // Whoever held the lock may have just gathered one.
        if let Some(summary) = self.fresh() {
            return Ok(summary);
        }
        self.gather_and_keep(true).await
    }

    /// The whole Summary API document (a copy of `cached_summary`): the node and
    /// every pod with a sandbox of this node.
    pub async fn summary(&self) -> Result<Summary, StatsError> {
        Ok(Summary::clone(&*self.cached_summary().await?))
    }

    /// Also reports the pods' volumes: their claims from the pod specs in `pods`, their paths from
    /// `volumes`. Call before cloning.
    pub fn with_volumes(
        mut self,
        pods: Store<PodUid, DesiredPod>,
        volumes: Store<VolumeKey, VolumeActual>,
    ) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.pods = Some(pods);
            inner.volumes = Some(volumes);
        }
        self
    }

    /// The node's stats: CPU, memory (with `availableBytes` = capacity minus working set), nodefs,
    /// imagefs and container fs, PIDs, network. Fails only when the node's memory cannot be read; a
    /// runtime that does not answer `ImageFsInfo` leaves `runtime` out.
    pub async fn node(&self) -> Result<NodeStats, StatsError> {
        let (sample, image_fs) = tokio::join!(self.node_sample(), self.image_fs());
        let sample = sample?;
        Ok(self.node_stats(sample, image_fs))
    }

    /// Whether this gathering asks the runtime for the containers' stats: when asked to, when the
    /// containers' cgroups cannot be found (no cgroup root), and when the writable layers' usage is a
    /// container fs interval old.
    fn asks_for_container_stats(&self, fresh: bool) -> bool {
        let inner = &self.inner;
        fresh
            || inner.runtime.config().cgroup_root.is_none()
            || inner
                .writable_layers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .is_none_or(|(at, _)| at.elapsed() >= inner.container_fs_interval)
    }

    /// Whether this gathering asks the runtime for the pods' stats (`ListPodSandboxStats`): only where the
    /// runtime can be asked safely (not containerd before 1.6.22, see `CriClient::sandbox_stats_are_safe`)
    /// and can answer: with a cgroup root, nodelet's sandboxes have a cgroup parent (the pod cgroup).
    /// Without one, containerd 2.x fails the whole call ("failed to decode sandbox container metrics …
    /// because cgroupPath is empty", for each sandbox), so the pods' CPU and memory are then the sums of
    /// their containers' (`ListContainerStats`) and their network is read from the sandboxes' network
    /// namespaces.
    async fn asks_for_sandbox_stats(&self) -> bool {
        self.inner.runtime.config().cgroup_root.is_some()
            && self.inner.runtime.client().sandbox_stats_are_safe().await
    }

    /// The writable layers' usage of the newest `ListContainerStats`.
    fn last_writable_layers(&self) -> WritableLayers {
        let layers = self.inner.writable_layers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        layers.as_ref().map(|(_, l)| l.clone()).unwrap_or_default()
    }

    /// Gathers the whole Summary API document from the runtime, the host and the disk: the node and every
    /// pod with a sandbox of this node; with the runtime's container stats when
    /// [`asks_for_container_stats`](Self::asks_for_container_stats).
    async fn gather(&self, fresh_runtime_stats: bool) -> Result<Summary, StatsError> {
        let ask = self.asks_for_container_stats(fresh_runtime_stats);
        let cri = self.inner.runtime.client();
        let node = &self.inner.config.node_name;
        let (mut sandbox_filter, mut container_filter) =
            (SandboxFilter::managed(), ContainerFilter::managed());
        if !node.is_empty() {
            sandbox_filter = sandbox_filter.label(labels::NODE, node.clone());
            container_filter = container_filter.label(labels::NODE, node.clone());
        }
        let (sandboxes, containers, container_stats, sandbox_stats, node_sample, image_fs) = tokio::join!(
            cri.list_sandbox_items(&sandbox_filter),
            cri.list_container_items(&container_filter),
            async { if ask { cri.list_container_stats(&container_filter).await } else { Ok(Vec::new()) } },
            async {
                // Not on every runtime, nor while failing lately (sandbox_stats_backoff): then the pod
                // cgroups and the sandboxes' network namespaces.
                let backoff = &self.inner.sandbox_stats_backoff;
                let lock = || backoff.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if self.asks_for_sandbox_stats().await && lock().may_ask(Instant::now()) {
                    let stats = cri.list_pod_sandbox_stats(&sandbox_filter).await;
                    match &stats {
                        Ok(_) => lock().succeeded(),
                        Err(e) => {
                            lock().failed(e, Instant::now());
                        }
                    }
                    stats
                } else {
                    Ok(Vec::new())
                }
            },
            self.node_sample(),
            self.image_fs(),
        );
        let (sandboxes, containers) = (sandboxes?, containers?);
        let container_stats: HashMap<String, v1::ContainerStats> = match container_stats {
            Ok(stats) => {
                let stats: HashMap<String, v1::ContainerStats> =
                    stats.into_iter().filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s))).collect();
                if ask {
                    let layers = stats
                        .iter()
                        .filter_map(|(id, s)| Some((id.clone(), s.writable_layer.clone()?)))
                        .collect();
                    *self.inner.writable_layers.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some((Instant::now(), Arc::new(layers)));
                }
                stats
            }
            Err(e) => {
                tracing::debug!(error = %e, "ListContainerStats failed; reading cgroups");
                HashMap::new()
            }
        };
        // Between two asks, the writable layers as the last one gave them.
        let layers = self.last_writable_layers();
        let sandbox_stats: HashMap<String, v1::LinuxPodSandboxStats> = sandbox_stats
            .inspect_err(|e| tracing::debug!(error = %e, "ListPodSandboxStats failed; reading cgroups"))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| Some((s.attributes?.id, s.linux?)))
            .collect();
        let container_stats = with_sandbox_containers(container_stats, &sandbox_stats);
        let node_sample = node_sample?;
        let log_fs = node_sample.logfs.map(|f| FsStats {
            available_bytes: Some(f.available),
            capacity_bytes: Some(f.capacity),
            inodes_free: Some(f.inodes_free),
            inodes: Some(f.inodes),
            ..FsStats::default()
        });
        let node_fs = node_sample.nodefs.map(|f| FsStats {
            available_bytes: Some(f.available),
            capacity_bytes: Some(f.capacity),
            inodes_free: Some(f.inodes_free),
            inodes: Some(f.inodes),
            ..FsStats::default()
        });
        let node_stats = self.node_stats(node_sample, image_fs);

        // The newest sandbox of each pod, and the running containers in it (newest attempt per name).
        let mut newest: HashMap<String, &ListedSandbox> = HashMap::new();
        for s in &sandboxes {
            let Some(uid) = s.labels.value(labels::POD_UID) else { continue };
            let entry = newest.entry(uid.to_owned()).or_insert(s);
            if s.created_at > entry.created_at {
                *entry = s;
            }
        }
        let mut running: HashMap<String, Vec<&ListedContainer>> = HashMap::new();
        let mut newest_attempt: HashMap<(&str, &str), &ListedContainer> = HashMap::new();
        for c in &containers {
            let (Some(uid), Some(name)) =
                (c.labels.value(labels::POD_UID), c.labels.value(labels::CONTAINER_NAME))
            else {
                continue;
            };
            let entry = newest_attempt.entry((uid, name)).or_insert(c);
            if c.created_at > entry.created_at {
                *entry = c;
            }
        }
        for ((uid, _), c) in newest_attempt {
            if c.state == v1::ContainerState::ContainerRunning as i32 {
                running.entry(uid.to_owned()).or_default().push(c);
            }
        }

        // Disk usage and cgroup fallbacks, off the async threads.
        let mut wanted = Vec::new();
        for (uid, sandbox) in &newest {
            let Some(id) = labels::PodIdentity::from_labels(&sandbox.labels) else { continue };
            let mine = running.get(uid).map(Vec::as_slice).unwrap_or_default();
            let names: Vec<String> = mine
                .iter()
                .filter_map(|c| c.labels.value(labels::CONTAINER_NAME).map(str::to_owned))
                .collect();
            let need_cgroup: Vec<String> = mine
                .iter()
                .filter(|c| {
                    container_stats.get(c.id.as_str()).is_none_or(|s| s.cpu.is_none() || s.memory.is_none())
                })
                .map(|c| c.id.as_str().to_owned())
                .collect();
            let sstats = sandbox_stats.get(sandbox.id.as_str());
            let pod_cgroup_needed =
                sstats.is_none_or(|s| s.cpu.is_none() || s.memory.is_none() || s.process.is_none());
            let network_needed = sstats.is_none_or(|s| s.network.is_none()).then(|| sandbox.id.clone());
            wanted.push((id, names, need_cgroup, pod_cgroup_needed, network_needed));
        }
        let this = self.clone();
        let disks = tokio::task::spawn_blocking(move || {
            wanted
                .into_iter()
                .map(|(id, names, ids, pod_cg, network_of)| {
                    let disk = this.pod_disk(&id, &names, &ids, pod_cg, network_of.as_deref());
                    (id.uid.clone(), (id, disk))
                })
                .collect::<HashMap<_, _>>()
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?;

        let now = (self.inner.clock)();
        let container_fs = node_stats.runtime.as_ref().and_then(|r| r.container_fs.clone());
        // Exact capacities: the summary is kept until the next round (a `Vec` grown by `push` keeps room
        // for up to four `ContainerStats` of a pod's one container, hundreds of bytes each).
        let mut pods = Vec::with_capacity(disks.len());
        for (uid, (identity, disk)) in disks {
            let Some(sandbox) = newest.get(&uid) else { continue };
            let sstats = sandbox_stats.get(sandbox.id.as_str());
            let pod_cgroup = self.inner.runtime.pod_cgroup(&uid);
            let mut ephemeral_used = 0_u64;
            let mut ephemeral_inodes = 0_u64;
            let running_here = running.get(&uid).map(Vec::as_slice).unwrap_or_default();
            let mut container_list = Vec::with_capacity(running_here.len());
            let mut sum_cpu: Option<u64> = None;
            let mut sum_ws: Option<u64> = None;
            for c in running_here {
                let name = c.labels.value(labels::CONTAINER_NAME).unwrap_or_default().to_owned();
                let cs = container_stats.get(c.id.as_str());
                let fallback = disk.containers.get(c.id.as_str());
                let cpu = cs
                    .and_then(|s| s.cpu.as_ref())
                    .and_then(|u| self.cpu_from_cri(&c.id, u))
                    .or_else(|| fallback.and_then(|f| f.0).map(|ns| self.cpu_from_total(&c.id, now, ns)));
                let memory = cs
                    .and_then(|s| s.memory.as_ref())
                    .and_then(memory_from_cri)
                    .or_else(|| fallback.and_then(|f| f.1).map(|m| memory_from_sample(now, &m, None)));
                let rootfs = cs
                    .and_then(|s| s.writable_layer.as_ref())
                    .or_else(|| layers.get(c.id.as_str()))
                    .map(|w| {
                        let used = w.used_bytes.as_ref().map(|v| v.value);
                        let inodes = w.inodes_used.as_ref().map(|v| v.value);
                        ephemeral_used = ephemeral_used.saturating_add(used.unwrap_or(0));
                        ephemeral_inodes = ephemeral_inodes.saturating_add(inodes.unwrap_or(0));
                        FsStats {
                            time: Time(if w.timestamp > 0 { w.timestamp } else { now }),
                            used_bytes: used,
                            inodes_used: inodes,
                            ..share_of(container_fs.as_ref())
                        }
                    });
                let logs = disk.logs.get(&name).map(|u| {
                    ephemeral_used = ephemeral_used.saturating_add(u.bytes);
                    ephemeral_inodes = ephemeral_inodes.saturating_add(u.inodes);
                    FsStats {
                        time: Time(now),
                        used_bytes: Some(u.bytes),
                        inodes_used: Some(u.inodes),
                        ..share_of(log_fs.as_ref())
                    }
                });
                if let Some(ns) = cpu.as_ref().and_then(|c| c.usage_core_nano_seconds) {
                    sum_cpu = Some(sum_cpu.unwrap_or(0).saturating_add(ns));
                }
                if let Some(ws) = memory.as_ref().and_then(|m| m.working_set_bytes) {
                    sum_ws = Some(sum_ws.unwrap_or(0).saturating_add(ws));
                }
                // The image as the pod spec (and pod status) names it; the runtime has only the ID.
                let image = c
                    .annotations
                    .value(labels::CONTAINER_IMAGE)
                    .filter(|i| !i.is_empty())
                    .map(str::to_owned)
                    .or_else(|| c.image.as_ref().map(|i| i.image.as_str().to_owned()))
                    .unwrap_or_default();
                container_list.push(ContainerStats {
                    name,
                    start_time: Time(c.created_at),
                    cpu,
                    memory,
                    rootfs,
                    logs,
                    runtime: ContainerRuntimeInfo {
                        id: c.id.as_str().to_owned(),
                        image,
                        cgroup: pod_cgroup.as_ref().map(|p| format!("{p}/{}", c.id)),
                    },
                });
            }
            container_list.sort_by(|a, b| a.name.cmp(&b.name));
            let mut volumes = Vec::with_capacity(disk.volumes.len());
            for VolumeDisk { name, usage, fs, claim, ephemeral } in &disk.volumes {
                if *ephemeral {
                    ephemeral_used = ephemeral_used.saturating_add(usage.bytes);
                    ephemeral_inodes = ephemeral_inodes.saturating_add(usage.inodes);
                }
                volumes.push(VolumeStats {
                    fs: FsStats {
                        time: Time(usage.time),
                        available_bytes: fs.map(|f| f.available),
                        capacity_bytes: fs.map(|f| f.capacity),
                        used_bytes: Some(usage.bytes),
                        inodes_free: fs.map(|f| f.inodes_free),
                        inodes: fs.map(|f| f.inodes),
                        inodes_used: Some(usage.inodes),
                    },
                    name: name.clone(),
                    pvc_ref: claim.clone(),
                });
            }
            volumes.sort_by(|a, b| a.name.cmp(&b.name));
            let cpu = sstats
                .and_then(|s| s.cpu.as_ref())
                .and_then(|u| self.cpu_from_cri(&format!("pod/{uid}"), u))
                .or_else(|| disk.cpu.map(|ns| self.cpu_from_total(&format!("pod/{uid}"), now, ns)))
                .or_else(|| {
                    sum_cpu.map(|ns| CpuStats {
                        time: Time(now),
                        usage_nano_cores: None,
                        usage_core_nano_seconds: Some(ns),
                    })
                });
            let memory = sstats
                .and_then(|s| s.memory.as_ref())
                .and_then(memory_from_cri)
                .or_else(|| disk.memory.map(|m| memory_from_sample(now, &m, None)))
                .or_else(|| {
                    sum_ws.map(|ws| MemoryStats {
                        time: Time(now),
                        working_set_bytes: Some(ws),
                        ..MemoryStats::default()
                    })
                });
            let network =
                sstats.and_then(|s| s.network.as_ref()).map(|n| network_from_cri(n, now)).or_else(|| {
                    disk.network.as_ref().map(|(devs, default)| network_from_devices(now, devs, default))
                });
            let processes = sstats
                .and_then(|s| s.process.as_ref())
                .and_then(|p| p.process_count.as_ref().map(|v| v.value))
                .or(disk.processes);
            pods.push(PodStats {
                pod_ref: PodReference { name: identity.name, namespace: identity.namespace, uid },
                start_time: Time(sandbox.created_at),
                containers: container_list,
                cpu,
                memory,
                network,
                volume: volumes,
                ephemeral_storage: Some(FsStats {
                    time: Time(now),
                    used_bytes: Some(ephemeral_used),
                    inodes_used: Some(ephemeral_inodes),
                    ..share_of(node_fs.as_ref())
                }),
                process_stats: processes.map(|n| ProcessStats { process_count: Some(n) }),
                cgroup: pod_cgroup,
            });
        }
        pods.sort_by(|a, b| {
            (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
        });
        self.forget_old_samples(now);
        Ok(Summary { node: node_stats, pods })
    }

    async fn node_sample(&self) -> Result<NodeSample, StatsError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let i = &this.inner;
            let (proc_fs, fs, v) = (&i.config.proc_fs, &i.cgroup_fs, i.cgroup_version);
            let memory = host::node_memory(proc_fs, fs, v)
                .ok_or_else(|| StatsError::Memory(proc_fs.join("meminfo").display().to_string()))?;
            let pods_cgroup = i.runtime.config().cgroup_root.clone();
            Ok(NodeSample {
                boot: host::boot_time_ns(proc_fs),
                cpu: host::node_cpu_usage_ns(proc_fs, fs, v),
                memory: Some(memory),
                nodefs: host::statvfs(&i.config.root_dir),
                logfs: host::statvfs(&i.config.pod_logs_dir),
                pids: host::pids(proc_fs),
                net: host::net_devices(proc_fs),
                pods_cpu: pods_cgroup.as_deref().and_then(|c| host::cpu_usage_ns(fs, v, c)),
                pods_memory: pods_cgroup.as_deref().and_then(|c| host::cgroup_memory(fs, v, c)),
            })
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?
    }

    /// The image filesystem (CRI `ImageFsInfo` + `statvfs` of its mountpoint) and the container
    /// filesystem (the runtime's own entry, else the image filesystem).
    async fn image_fs(&self) -> Option<RuntimeStats> {
        let info = match self.inner.runtime.client().image_fs_info().await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "ImageFsInfo failed");
                return None;
            }
        };
        let now = (self.inner.clock)();
        let convert = |usage: &v1::FilesystemUsage| {
            let mountpoint = usage.fs_id.as_ref().map(|f| PathBuf::from(&f.mountpoint));
            let fs = mountpoint.as_deref().filter(|p| p.is_absolute()).and_then(host::statvfs);
            FsStats {
                time: Time(if usage.timestamp > 0 { usage.timestamp } else { now }),
                available_bytes: fs.map(|f| f.available),
                capacity_bytes: fs.map(|f| f.capacity),
                used_bytes: usage.used_bytes.as_ref().map(|v| v.value),
                inodes_free: fs.map(|f| f.inodes_free),
                inodes: fs.map(|f| f.inodes),
                inodes_used: usage.inodes_used.as_ref().map(|v| v.value),
            }
        };
        let image_fs = info.image_filesystems.first().map(convert);
        let container_fs = info.container_filesystems.first().map(convert).or_else(|| image_fs.clone());
        Some(RuntimeStats { image_fs, container_fs })
    }

    fn node_stats(&self, s: NodeSample, runtime: Option<RuntimeStats>) -> NodeStats {
        let now = (self.inner.clock)();
        let cpu = s.cpu.map(|ns| self.cpu_from_total("node", now, ns));
        let memory = s.memory.map(|(capacity, m)| memory_from_sample(now, &m, Some(capacity)));
        let fs = s.nodefs.map(|f| FsStats {
            time: Time(now),
            available_bytes: Some(f.available),
            capacity_bytes: Some(f.capacity),
            used_bytes: Some(f.used),
            inodes_free: Some(f.inodes_free),
            inodes: Some(f.inodes),
            inodes_used: Some(f.inodes.saturating_sub(f.inodes_free)),
        });
        let (devs, default) = s.net;
        let network = (!devs.is_empty()).then(|| network_from_devices(now, &devs, &default));
        let mut system_containers = Vec::new();
        if s.pods_cpu.is_some() || s.pods_memory.is_some() {
            system_containers.push(ContainerStats {
                name: "pods".to_owned(),
                start_time: Time(s.boot.unwrap_or(0)),
                cpu: s.pods_cpu.map(|ns| self.cpu_from_total("pods", now, ns)),
                memory: s.pods_memory.map(|m| {
                    let capacity = s.memory.map(|(c, _)| c);
                    memory_from_sample(now, &m, m.limit.or(capacity))
                }),
                ..ContainerStats::default()
            });
        }
        NodeStats {
            node_name: self.inner.config.node_name.clone(),
            system_containers,
            start_time: Time(s.boot.unwrap_or(0)),
            cpu,
            memory,
            network,
            fs,
            runtime,
            rlimit: Some(RlimitStats { time: Time(now), maxpid: s.pids.0, curproc: s.pids.1 }),
        }
    }

    /// Log and volume disk usage and cgroup readings of one pod (blocking).
    fn pod_disk(
        &self,
        id: &labels::PodIdentity,
        names: &[String],
        ids: &[String],
        pod_cgroup: bool,
        network_of: Option<&str>,
    ) -> PodDisk {
        let i = &self.inner;
        let mut disk = PodDisk::default();
        if let Some(dir) = i.runtime.pod_log_dir(&id.namespace, &id.name, &id.uid) {
            for name in names.iter().filter(|n| is_path_segment(n)) {
                if let Some(u) = host::disk_usage(&dir.join(name)) {
                    disk.logs.insert(name.clone(), u);
                }
            }
        }
        if let Some(volumes) = &i.volumes {
            let spec = i.pods.as_ref().and_then(|p| p.get(&id.uid));
            let measured = self.volume_usage();
            for (key, volume) in volumes.entries() {
                let Some((uid, name)) = split_key(&key) else { continue };
                if uid != id.uid || volume.plugin == Plugin::HostPath {
                    continue;
                }
                // Measured in the background; a volume not measured yet reports nothing.
                let Some(usage) = measured.volumes.get(&key).copied() else { continue };
                let claim = spec.as_ref().and_then(|p| {
                    let v = p.spec().volumes.as_ref()?.iter().find(|v| v.name == name)?;
                    Some(PvcReference {
                        name: v.persistent_volume_claim.as_ref()?.claim_name.clone(),
                        namespace: id.namespace.clone(),
                    })
                });
                // A tmpfs (a Memory emptyDir, a secret, downwardAPI or projected volume) is memory, not
                // local storage.
                let ephemeral = claim.is_none()
                    && !volume.tmpfs
                    && !matches!(volume.plugin, Plugin::LocalVolume | Plugin::Csi);
                let fs = host::statvfs(&volume.path);
                disk.volumes.push(VolumeDisk { name: name.to_owned(), usage, fs, claim, ephemeral });
            }
        }
        if let Some(cgroup) = i.runtime.pod_cgroup(&id.uid) {
            let (fs, v) = (&i.cgroup_fs, i.cgroup_version);
            if pod_cgroup {
                disk.cpu = host::cpu_usage_ns(fs, v, &cgroup);
                disk.memory = host::cgroup_memory(fs, v, &cgroup);
                disk.processes = host::cgroup_pids(fs, v, &cgroup);
            }
            if let Some(sandbox) = network_of.filter(|s| is_path_segment(s)) {
                disk.network =
                    host::cgroup_net_devices(&i.config.proc_fs, fs, v, &format!("{cgroup}/{sandbox}"));
            }
            for cid in ids.iter().filter(|c| is_path_segment(c)) {
                let rel = format!("{cgroup}/{cid}");
                disk.containers
                    .insert(cid.clone(), (host::cpu_usage_ns(fs, v, &rel), host::cgroup_memory(fs, v, &rel)));
            }
        }
        disk
    }

    /// CPU from the runtime; the rate from our own samples when it gives only the total.
    fn cpu_from_cri(&self, key: &str, u: &v1::CpuUsage) -> Option<CpuStats> {
        let total = u.usage_core_nano_seconds.as_ref().map(|v| v.value)?;
        let time = if u.timestamp > 0 { u.timestamp } else { (self.inner.clock)() };
        let mut stats = self.cpu_from_total(key, time, total);
        if let Some(rate) = &u.usage_nano_cores {
            stats.usage_nano_cores = Some(rate.value);
        }
        Some(stats)
    }

    /// CPU stats from a cumulative total, with the rate since the previous sample of `key`.
    fn cpu_from_total(&self, key: &str, now: i64, total: u64) -> CpuStats {
        let mut samples = self.inner.cpu_samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let rate = samples.get(key).and_then(|(t, prev)| {
            let dt = u64::try_from(now.checked_sub(*t)?).ok().filter(|dt| *dt > 0)?;
            let used = total.checked_sub(*prev)?;
            u64::try_from(u128::from(used) * 1_000_000_000 / u128::from(dt)).ok()
        });
        if samples.get(key).is_none_or(|(t, _)| *t != now) {
            samples.insert(key.to_owned(), (now, total));
        }
        CpuStats { time: Time(now), usage_nano_cores: rate, usage_core_nano_seconds: Some(total) }
    }

    /// Drops CPU samples not refreshed for ten minutes (containers and pods that are gone).
    fn forget_old_samples(&self, now: i64) {
        const TEN_MINUTES_NS: i64 = 600 * 1_000_000_000;
        let mut samples = self.inner.cpu_samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        samples.retain(|_, (t, _)| now.saturating_sub(*t) < TEN_MINUTES_NS);
    }
}

/// The runtime's container stats by container ID: `ListContainerStats`'s, and for the containers it did not
/// give (it is asked only every container fs interval when there is a cgroup root), the ones
/// `ListPodSandboxStats` gave with their pod (containerd 1.7 and 2.x fill `linux.containers`: CPU and memory,
/// read at the same moment as the pod's).
fn with_sandbox_containers(
    mut containers: HashMap<String, v1::ContainerStats>,
    sandboxes: &HashMap<String, v1::LinuxPodSandboxStats>,
) -> HashMap<String, v1::ContainerStats> {
    for stats in sandboxes.values().flat_map(|s| &s.containers) {
        let Some(id) = stats.attributes.as_ref().map(|a| a.id.clone()) else { continue };
        containers.entry(id).or_insert_with(|| stats.clone());
    }
    containers
}

/// Whether `s` is one plain path component.
fn is_path_segment(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// Capacity and availability of a filesystem, without usage (the container's own usage goes in).
fn share_of(fs: Option<&FsStats>) -> FsStats {
    FsStats {
        available_bytes: fs.and_then(|f| f.available_bytes),
        capacity_bytes: fs.and_then(|f| f.capacity_bytes),
        inodes_free: fs.and_then(|f| f.inodes_free),
        inodes: fs.and_then(|f| f.inodes),
        ..FsStats::default()
    }
}

fn memory_from_cri(m: &v1::MemoryUsage) -> Option<MemoryStats> {
    let value = |v: &Option<v1::UInt64Value>| v.as_ref().map(|v| v.value);
    let working_set = value(&m.working_set_bytes)?;
    Some(MemoryStats {
        time: Time(m.timestamp),
        // containerd reports 0 for a cgroup without a memory limit: leave it out rather than say "none left".
        available_bytes: value(&m.available_bytes).filter(|v| *v > 0),
        usage_bytes: value(&m.usage_bytes),
        working_set_bytes: Some(working_set),
        rss_bytes: value(&m.rss_bytes),
        page_faults: value(&m.page_faults),
        major_page_faults: value(&m.major_page_faults),
    })
}

/// Memory stats of a sample; `availableBytes` is `limit - workingSet` when there is a limit.
fn memory_from_sample(now: i64, m: &MemorySample, limit: Option<u64>) -> MemoryStats {
    MemoryStats {
        time: Time(now),
        available_bytes: limit.or(m.limit).map(|l| l.saturating_sub(m.working_set)),
        usage_bytes: Some(m.usage),
        working_set_bytes: Some(m.working_set),
        rss_bytes: m.rss,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
    }
}

/// Network stats from `/proc/…/net/dev` interfaces and the default route's interface (the first one
/// when there is no default route).
fn network_from_devices(now: i64, devs: &[host::NetDev], default: &Option<String>) -> NetworkStats {
    let iface = |d: &host::NetDev| InterfaceStats {
        name: d.name.clone(),
        rx_bytes: Some(d.rx_bytes),
        rx_errors: Some(d.rx_errors),
        tx_bytes: Some(d.tx_bytes),
        tx_errors: Some(d.tx_errors),
    };
    NetworkStats {
        time: Time(now),
        default: devs
            .iter()
            .find(|d| Some(&d.name) == default.as_ref())
            .or(devs.first())
            .map(iface)
            .unwrap_or_default(),
        interfaces: devs.iter().map(iface).collect(),
    }
}

fn network_from_cri(n: &v1::NetworkUsage, now: i64) -> NetworkStats {
    let iface = |i: &v1::NetworkInterfaceUsage| InterfaceStats {
        name: i.name.clone(),
        rx_bytes: i.rx_bytes.as_ref().map(|v| v.value),
        rx_errors: i.rx_errors.as_ref().map(|v| v.value),
        tx_bytes: i.tx_bytes.as_ref().map(|v| v.value),
        tx_errors: i.tx_errors.as_ref().map(|v| v.value),
    };
    NetworkStats {
        time: Time(if n.timestamp > 0 { n.timestamp } else { now }),
        default: n.default_interface.as_ref().map(iface).unwrap_or_default(),
        interfaces: n.interfaces.iter().map(iface).collect(),
    }
}

/// Runs `round` now and every `period` after (a late round delays the next), until `shutdown`; a
/// round under way when `shutdown` comes is dropped, so that no walk or runtime call holds up the
/// node's stop.
async fn every<F, Fut>(period: Duration, shutdown: &CancellationToken, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Boxed: a round's state (a summary being gathered) is held only while it runs.
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = Box::pin(round()) => {}
        }
    }
}

#[cfg(test)]
mod every_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rounds_run_each_period_and_a_round_under_way_does_not_hold_up_the_stop() {
        let shutdown = CancellationToken::new();
        let rounds = std::sync::atomic::AtomicU32::new(0);
        let stop = shutdown.clone();
        let run = every(Duration::from_secs(10), &shutdown, || async {
            // The third round never ends, as a runtime call that hangs.
            if rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 2 {
                std::future::pending::<()>().await;
            }
        });
        let stopper = async {
            tokio::time::sleep(Duration::from_secs(25)).await;
            stop.cancel();
        };
        let started = tokio::time::Instant::now();
        tokio::join!(run, stopper);
        assert_eq!(rounds.load(std::sync::atomic::Ordering::Relaxed), 3);
        assert_eq!(started.elapsed(), Duration::from_secs(25));
    }
}

#[cfg(test)]
mod sandbox_container_tests {
    use super::*;

    fn stats(id: &str, cpu_ns: u64) -> v1::ContainerStats {
        v1::ContainerStats {
            attributes: Some(v1::ContainerAttributes { id: id.into(), ..Default::default() }),
            cpu: Some(v1::CpuUsage {
                usage_core_nano_seconds: Some(v1::UInt64Value { value: cpu_ns }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn cpu(s: Option<&v1::ContainerStats>) -> Option<u64> {
        s?.cpu.as_ref()?.usage_core_nano_seconds.as_ref().map(|v| v.value)
    }

    #[test]
    fn the_pods_container_stats_fill_in_what_list_container_stats_did_not_give() {
        let listed: HashMap<String, v1::ContainerStats> = [("a".to_owned(), stats("a", 1))].into();
        let pod = v1::LinuxPodSandboxStats {
            containers: vec![stats("a", 100), stats("b", 200), v1::ContainerStats::default()],
            ..Default::default()
        };
        let sandboxes: HashMap<String, v1::LinuxPodSandboxStats> = [("sb".to_owned(), pod)].into();
        let merged = with_sandbox_containers(listed, &sandboxes);
        // ListContainerStats's entry stays; the pod's adds the container it did not list; one without
        // attributes is dropped.
        assert_eq!(merged.len(), 2, "{merged:?}");
        assert_eq!(cpu(merged.get("a")), Some(1));
        assert_eq!(cpu(merged.get("b")), Some(200));
        // Without sandbox stats (the runtime is not asked), nothing changes.
        let listed: HashMap<String, v1::ContainerStats> = [("a".to_owned(), stats("a", 1))].into();
        assert_eq!(with_sandbox_containers(listed.clone(), &HashMap::new()), listed);
    }
}

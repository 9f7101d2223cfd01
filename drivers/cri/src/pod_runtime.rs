//! [`CriPodRuntime`]: nodelet's [`PodRuntime`] and (in [`sandbox`]) [`SandboxRuntime`](nodelet_resources::sandbox::driver::SandboxRuntime) on a CRI v1 runtime (containerd), taking the steps the
//! kubelet takes (`pkg/kubelet/kuberuntime`), with the kubelet's labels, annotations and log layout so that
//! `crictl` and log collectors see nodelet's pods as they would the kubelet's.
//!
//! What it keeps in memory is a cache, never the truth: every fact is rebuilt from the runtime after a
//! restart (labels, annotations, sandbox metadata).
//!
//! * Sandbox facts (attempt, IPs, network mode) per sandbox ID: they never change for a sandbox.
//! * Container status per container ID and state: `ListContainers` lacks start and finish times, exit code,
//!   reason and the resolved image, so `ContainerStatus` is called once when a container is first seen
//!   running and once when first seen exited; a steady-state relist makes no per-container calls.
//! * Each pod's sandbox and container IDs (`index`): one pod's state (read after each operation, and by the
//!   PLEG on runtime events) comes from a `PodSandboxStatus` and a `ContainerStatus` per object it has
//!   rather than from filtered listings, which containerd answers at the cost of a full one. A pod the index
//!   cannot answer for (before the first full listing, or after a creation whose result is unknown) is read
//!   through filtered listings.
//!
//! A pod's `runtimeClassName` is looked up at every sandbox creation (see
//! [`CriPodRuntimeConfig::runtime_classes`]); its class's `handler` is passed to `RunPodSandbox`.
//!
//! Pods with `hostUsers: false` run in their own user namespace (see [`crate::userns`]): the runtime
//! handler must report the feature, the range is allocated before the sandbox is created and freed once
//! the pod's last sandbox is removed.
//!
//! Not done yet: raw block `volumeDevices` (a container with one fails with `CreateContainerConfigError`
//! naming the volume rather than running without it), the kubelet-managed `/etc/hosts`, image pull
//! secrets, the systemd cgroup driver's slice names.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_cri::v1;
use k8s_openapi::api::core::v1::Container;
use nodelet_resources::common::runtime_class::{self, RuntimeClasses};
use nodelet_resources::model::actual::{
    ContainerRecord, ContainerState, ListedPod, PodActual, PodSandboxes, SandboxRecord,
};
use nodelet_resources::model::cgroup::CgroupResources;
use nodelet_resources::model::pod::DesiredPod;
use nodelet_resources::model::runtime::{RuntimeError, RuntimeResult};
use nodelet_resources::model::volumes::PodVolumes;
use nodelet_resources::pod::driver::{CancellationToken, ContainerKind, PodRuntime};

use crate::client::CriClient;
use crate::dns::{self, NodeDns, ResolvConf};
use crate::error::CriError;
use crate::filter::{ContainerFilter, SandboxFilter};
use crate::images::{self, PullPolicy};
use crate::labels::{self, Lookup, PodIdentity};
use crate::listing::{Entry, ListedContainer, ListedSandbox};
use crate::probe::{self, CriProber};
use crate::spec::{self, ContainerInputs, SpecError};
use crate::{etc_hosts, termination};

mod index;
mod memo;
mod own;
mod sandbox;

pub use own::OwnChanges;

/// Default root of pod log directories (the kubelet's `podLogsDir`).
pub const DEFAULT_POD_LOG_ROOT: &str = "/var/log/pods";
/// Default resolv.conf for `Default` and `ClusterFirst` DNS (the kubelet's `resolvConf`).
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
/// Default cluster domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// Default directory of `Localhost` seccomp profiles (the kubelet's `<root-dir>/seccomp`).
pub const DEFAULT_SECCOMP_PROFILE_ROOT: &str = "/var/lib/kubelet/seccomp";
/// Where cgroup hierarchies are mounted.
pub const DEFAULT_CGROUP_FS: &str = "/sys/fs/cgroup";
/// How many `ContainerStatus`/`PodSandboxStatus` calls a relist makes at once.
const STATUS_CONCURRENCY: usize = 16;

/// Configuration of a [`CriPodRuntime`]; [`Default`] has the kubelet's defaults.
///
/// ```
/// use nodelet_cri::CriPodRuntimeConfig;
/// let config = CriPodRuntimeConfig::default()
///     .with_pod_log_root("/tmp/pods")
///     .with_cgroup_root(Some("/nodelet".into()))
///     .with_resolv_conf(Some("/etc/nodelet/resolv.conf".into()));
/// assert!(!config.allow_privileged);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CriPodRuntimeConfig {
    /// Root of the pod log directories `<root>/<namespace>_<name>_<uid>/<container>/<restart>.log`.
    pub pod_log_root: PathBuf,
    /// Parent of the pod cgroups (cgroupfs syntax): each pod's sandbox gets `<root>/pod<uid>`. `None` lets
    /// the runtime choose.
    pub cgroup_root: Option<String>,
    /// Where the cgroup hierarchies are mounted (for the pod cgroups' process limit and for removing pod
    /// cgroups the runtime leaves behind).
    pub cgroup_fs: PathBuf,
    /// `podPidsLimit`: the most processes (and threads) a pod may have, written to its pod cgroup's
    /// `pids.max` before the sandbox starts (see [`crate::pod_cgroup`]). Needs
    /// [`cgroup_root`](Self::cgroup_root): without one there is no pod cgroup and sandboxes fail to start.
    /// `None`: no limit.
    pub pod_pids_limit: Option<u64>,
    /// The resolv.conf whose nameservers, search domains and options `Default` (and, without cluster DNS,
    /// `ClusterFirst`) pods get. `None` is the kubelet's `--resolv-conf=""`: DNS to 127.0.0.1 only.
    pub resolv_conf: Option<PathBuf>,
    /// Cluster DNS server addresses for `ClusterFirst` pods (empty: they get the node's DNS).
    pub cluster_dns: Vec<String>,
    /// The cluster domain, for `ClusterFirst` search paths and `setHostnameAsFQDN`.
    pub cluster_domain: String,
    /// Whether privileged containers may run. Off: they fail with `CreateContainerConfigError`.
    pub allow_privileged: bool,
    /// The CRI runtime handler for sandboxes of pods without a `runtimeClassName` (`""`: the
    /// runtime's default).
    pub runtime_handler: String,
    /// Where pods' `runtimeClassName`s are looked up (their class's `handler` runs their sandbox).
    /// None: a pod that names a class fails to get a sandbox.
    pub runtime_classes: RuntimeClassLookup,
    /// The node's name, for `spec.nodeName` env references of pods that do not set it. When set, sandboxes and
    /// containers carry it as [`labels::NODE`] and relists see only those (another nodelet's pods on the same
    /// runtime are left alone).
    pub node_name: String,
    /// The node's IPs, for `status.hostIP(s)` env references and host-network pods' `status.podIP(s)`.
    pub node_ips: Vec<String>,
    /// Directory of `Localhost` seccomp profiles.
    pub seccomp_profile_root: PathBuf,
    /// `seccompDefault`: containers (and sandboxes) without a seccomp profile run with the runtime's default
    /// profile (`RuntimeDefault`) instead of `Unconfined`.
    pub seccomp_default: bool,
    /// Whether the node can enforce AppArmor profiles (the kernel has AppArmor on, see [`apparmor_enabled`]).
    /// Off: a container asking for a profile other than `unconfined` fails with `CreateContainerConfigError`
    /// instead of running without it.
    pub apparmor_enabled: bool,
    /// The node's memory, for Burstable containers' `oom_score_adj` and unset `limits.memory` env
    /// references. `None`: read from `/proc/meminfo` when the runtime is created.
    pub memory_capacity_bytes: Option<u64>,
    /// The node's allocatable resources (`cpu`, `memory`, `ephemeral-storage`, as the `Node` status shows them):
    /// what a `resourceFieldRef` to an unset or zero `limits.*` reads, as the kubelet's
    /// `MergeContainerResourceLimits` fills them in. Empty: the machine's CPUs and
    /// [`memory_capacity_bytes`](Self::memory_capacity_bytes).
    pub allocatable: std::collections::BTreeMap<String, nodelet_resources::quantity::Quantity>,
    /// nodelet's root directory (`--root-dir`): subPath binds go under `<root>/pods/<uid>/volume-subpaths`.
    pub root_dir: PathBuf,
    /// Where `env`/`envFrom` references to ConfigMaps and Secrets are looked up, by the kind of pod (none:
    /// such references are errors unless optional).
    pub objects: EnvObjects,
    /// Where the Services of service environment variables are listed ([`crate::service_env`]);
    /// none (standalone mode): containers get no such variables.
    pub services: ServiceLookup,
}

/// The Services of service environment variables (see [`CriPodRuntimeConfig::services`]); equal
/// when both are unset or the same lister.
#[derive(Clone, Default)]
pub struct ServiceLookup(pub Option<std::sync::Arc<dyn crate::service_env::ServiceLister>>);

impl std::fmt::Debug for ServiceLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ServiceLookup(Some(..))" } else { "ServiceLookup(None)" })
    }
}

impl PartialEq for ServiceLookup {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for ServiceLookup {}

/// The ConfigMaps and Secrets environment variables may refer to (see [`CriPodRuntimeConfig::objects`]), by
/// the kind of pod: objects do not cross sources, an API pod reads the API server's objects only and a static
/// pod (file, URL, HTTP) the manifest directory's only. Equal when both lookups are the same (or unset).
#[derive(Clone, Default)]
pub struct EnvObjects {
    /// Static pods' objects (the manifest directory's).
    pub local: Option<std::sync::Arc<dyn nodelet_host::files::ObjectLookup + Send + Sync>>,
    /// API pods' objects (the API server's).
    pub api: Option<std::sync::Arc<dyn nodelet_host::files::ObjectLookup + Send + Sync>>,
}

impl EnvObjects {
    /// The lookup of `pod`'s kind, if there is one.
    pub fn for_pod(
        &self,
        pod: &DesiredPod,
    ) -> Option<&(dyn nodelet_host::files::ObjectLookup + Send + Sync)> {
        match pod.source {
            nodelet_resources::model::pod::PodSource::Api => self.api.as_deref(),
            _ => self.local.as_deref(),
        }
    }
}

impl std::fmt::Debug for EnvObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvObjects")
            .field("local", &self.local.is_some())
            .field("api", &self.api.is_some())
            .finish()
    }
}

impl PartialEq for EnvObjects {
    fn eq(&self, other: &Self) -> bool {
        fn same(
            a: &Option<std::sync::Arc<dyn nodelet_host::files::ObjectLookup + Send + Sync>>,
            b: &Option<std::sync::Arc<dyn nodelet_host::files::ObjectLookup + Send + Sync>>,
        ) -> bool {
            match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
                _ => false,
            }
        }
        same(&self.local, &other.local) && same(&self.api, &other.api)
    }
}

impl Eq for EnvObjects {}

/// The RuntimeClasses pods may name (see [`CriPodRuntimeConfig::runtime_classes`]); equal when both
/// are unset or the same lookup.
#[derive(Clone, Default)]
pub struct RuntimeClassLookup(pub Option<std::sync::Arc<dyn RuntimeClasses>>);

impl std::fmt::Debug for RuntimeClassLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "RuntimeClassLookup(Some(..))"
        } else {
            "RuntimeClassLookup(None)"
        })
    }
}

impl PartialEq for RuntimeClassLookup {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for RuntimeClassLookup {}

impl Default for CriPodRuntimeConfig {
    fn default() -> Self {
        CriPodRuntimeConfig {
            pod_log_root: PathBuf::from(DEFAULT_POD_LOG_ROOT),
            cgroup_root: None,
            cgroup_fs: PathBuf::from(DEFAULT_CGROUP_FS),
            pod_pids_limit: None,
            resolv_conf: Some(PathBuf::from(DEFAULT_RESOLV_CONF)),
            cluster_dns: Vec::new(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
            allow_privileged: false,
            runtime_handler: String::new(),
            runtime_classes: RuntimeClassLookup::default(),
            node_name: String::new(),
            node_ips: Vec::new(),
            seccomp_profile_root: PathBuf::from(DEFAULT_SECCOMP_PROFILE_ROOT),
            seccomp_default: false,
            apparmor_enabled: false,
            memory_capacity_bytes: None,
            allocatable: std::collections::BTreeMap::new(),
            objects: EnvObjects::default(),
            services: ServiceLookup::default(),
            root_dir: PathBuf::from(DEFAULT_ROOT_DIR),
        }
    }
}

/// Whether this machine's kernel enforces AppArmor: `/sys/module/apparmor/parameters/enabled` reads `Y` (as the
/// kubelet checks it). A missing file means no AppArmor.
pub fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim_start().starts_with('Y'))
}

/// The default [`CriPodRuntimeConfig::root_dir`].
const DEFAULT_ROOT_DIR: &str = "/var/lib/nodelet";

impl CriPodRuntimeConfig {
    /// Sets [`root_dir`](Self::root_dir).
    pub fn with_root_dir(mut self, root: impl Into<PathBuf>) -> Self {
        self.root_dir = root.into();
        self
    }

    /// Sets [`pod_log_root`](Self::pod_log_root).
    pub fn with_pod_log_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.pod_log_root = root.into();
        self
    }

    /// Sets [`cgroup_root`](Self::cgroup_root).
    pub fn with_cgroup_root(mut self, root: Option<String>) -> Self {
        self.cgroup_root = root.filter(|r| !r.trim_matches('/').is_empty() || r == "/");
        self
    }

    /// Sets [`cgroup_fs`](Self::cgroup_fs).
    pub fn with_cgroup_fs(mut self, path: impl Into<PathBuf>) -> Self {
        self.cgroup_fs = path.into();
        self
    }

    /// Sets [`pod_pids_limit`](Self::pod_pids_limit).
    pub fn with_pod_pids_limit(mut self, limit: Option<u64>) -> Self {
        self.pod_pids_limit = limit;
        self
    }

    /// Sets [`resolv_conf`](Self::resolv_conf).
    pub fn with_resolv_conf(mut self, path: Option<PathBuf>) -> Self {
        self.resolv_conf = path;
        self
    }

    /// Sets the static pods' [`objects`](Self::objects) (the manifest directory's).
    pub fn with_objects(
        mut self,
        objects: std::sync::Arc<dyn nodelet_host::files::ObjectLookup + Send + Sync>,
    ) -> Self {
        self.objects.local = Some(objects);
        self
    }

    /// Sets the API pods' [`objects`](Self::objects) (the API server's).
    pub fn with_api_objects(
        mut self,
        objects: std::sync::Arc<dyn nodelet_host::files::ObjectLookup + Send + Sync>,
    ) -> Self {
        self.objects.api = Some(objects);
        self
    }

    /// Sets [`services`](Self::services).
    pub fn with_services(mut self, services: std::sync::Arc<dyn crate::service_env::ServiceLister>) -> Self {
        self.services = ServiceLookup(Some(services));
        self
    }

    /// Sets [`cluster_dns`](Self::cluster_dns).
    pub fn with_cluster_dns(mut self, servers: Vec<String>) -> Self {
        self.cluster_dns = servers;
        self
    }

    /// Sets [`cluster_domain`](Self::cluster_domain).
    pub fn with_cluster_domain(mut self, domain: impl Into<String>) -> Self {
        self.cluster_domain = domain.into();
        self
    }

    /// Sets [`allow_privileged`](Self::allow_privileged).
    pub fn with_allow_privileged(mut self, allow: bool) -> Self {
        self.allow_privileged = allow;
        self
    }

    /// Sets [`runtime_classes`](Self::runtime_classes).
    pub fn with_runtime_classes(mut self, classes: std::sync::Arc<dyn RuntimeClasses>) -> Self {
        self.runtime_classes = RuntimeClassLookup(Some(classes));
        self
    }

    /// Sets [`runtime_handler`](Self::runtime_handler).
    pub fn with_runtime_handler(mut self, handler: impl Into<String>) -> Self {
        self.runtime_handler = handler.into();
        self
    }

    /// Sets [`node_name`](Self::node_name).
    pub fn with_node_name(mut self, name: impl Into<String>) -> Self {
        self.node_name = name.into();
        self
    }

    /// Sets [`node_ips`](Self::node_ips).
    pub fn with_node_ips(mut self, ips: Vec<String>) -> Self {
        self.node_ips = ips;
        self
    }

    /// Sets [`seccomp_profile_root`](Self::seccomp_profile_root).
    pub fn with_seccomp_profile_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.seccomp_profile_root = root.into();
        self
    }

    /// Sets [`seccomp_default`](Self::seccomp_default).
    pub fn with_seccomp_default(mut self, on: bool) -> Self {
        self.seccomp_default = on;
        self
    }

    /// Sets [`apparmor_enabled`](Self::apparmor_enabled).
    pub fn with_apparmor_enabled(mut self, on: bool) -> Self {
        self.apparmor_enabled = on;
        self
    }

    /// Sets [`memory_capacity_bytes`](Self::memory_capacity_bytes).
    pub fn with_memory_capacity_bytes(mut self, bytes: Option<u64>) -> Self {
        self.memory_capacity_bytes = bytes;
        self
    }

    /// Sets [`allocatable`](Self::allocatable).
    pub fn with_allocatable(
        mut self,
        allocatable: std::collections::BTreeMap<String, nodelet_resources::quantity::Quantity>,
    ) -> Self {
        self.allocatable = allocatable;
        self
    }
}

/// What never changes for a sandbox.
#[derive(Debug, Clone)]
struct SandboxFacts {
    attempt: u32,
    ips: Vec<String>,
    /// In the node's network namespace (a `hostNetwork` pod's).
    host_network: bool,
}

impl SandboxFacts {
    fn of(status: &v1::PodSandboxStatus) -> Self {
        SandboxFacts {
            attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
            ips: sandbox_ips(status),
            host_network: status
                .linux
                .as_ref()
                .and_then(|l| l.namespaces.as_ref())
                .and_then(|n| n.options.as_ref())
                .is_some_and(|o| o.network == v1::NamespaceMode::Node as i32),
        }
    }
}

/// Sandboxes and containers as a listing shows them, with the statuses of the containers read one
/// by one (empty after a listing).
struct Listed {
    sandboxes: Vec<ListedSandbox>,
    containers: Vec<ListedContainer>,
    statuses: HashMap<String, v1::ContainerStatus>,
}

/// The part of `ContainerStatus` that `ListContainers` lacks, as seen in `state`.
#[derive(Debug, Clone)]
struct StatusFacts {
    state: ContainerState,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    image_ref: String,
    log_path: String,
    /// The CPU and memory cgroup settings the runtime reports (containerd ≥ 1.6 does).
    applied: Option<CgroupResources>,
    /// Which fetch or change these facts are (see [`Caches::next_version`]): part of the pod's
    /// signature.
    version: u64,
}

/// The cgroup settings in a CRI status, if reported.
fn applied_resources(resources: Option<&v1::ContainerResources>) -> Option<CgroupResources> {
    let linux = resources?.linux.as_ref()?;
    Some(CgroupResources {
        cpu_shares: linux.cpu_shares,
        cpu_quota: linux.cpu_quota,
        cpu_period: linux.cpu_period,
        memory_limit: linux.memory_limit_in_bytes,
    })
}

#[derive(Debug, Default)]
struct Caches {
    sandboxes: foldhash::HashMap<String, SandboxFacts>,
    containers: foldhash::HashMap<String, StatusFacts>,
    /// How many times container facts were fetched or changed (see [`Caches::next_version`]).
    facts_fetched: u64,
    /// The pods built by earlier listings.
    memo: memo::Memo,
    /// Each pod's sandboxes and containers, for reading one pod without a listing.
    index: index::PodIndex,
}

impl Caches {
    /// A new version number for a container's facts: each fetch or change gets one, and a pod is
    /// built anew when one of its containers' facts has another version than at its last build.
    fn next_version(&mut self) -> u64 {
        self.facts_fetched += 1;
        self.facts_fetched
    }
}

#[derive(Debug)]
struct Inner {
    client: CriClient,
    config: CriPodRuntimeConfig,
    caches: Mutex<Caches>,
    /// Runs lifecycle hooks.
    prober: CriProber,
    /// What happened to each container's image (the `Pulling`/`Pulled` events).
    pulls: images::PullRecords,
    /// The containers nodelet is stopping or removing, or just did.
    own: OwnChanges,
    /// The user namespace ranges of `hostUsers: false` pods, read from `<root>/pods` on first use.
    userns: std::sync::OnceLock<Arc<crate::userns::UsernsAllocator>>,
    /// Whether the ranges of pods without a sandbox were freed (once, at the first start-up adoption).
    userns_adopted: std::sync::atomic::AtomicBool,
}

/// nodelet's [`PodRuntime`] on CRI. Cheap to clone (one `Arc`); clones share the client and the caches.
///
/// ```no_run
/// use nodelet_cri::{CriClient, CriConfig, CriPodRuntime, CriPodRuntimeConfig};
/// use nodelet_resources::pod::driver::PodRuntime;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = CriClient::connect(CriConfig::new("unix:///run/containerd/containerd.sock")).await?;
/// let config = CriPodRuntimeConfig::default().with_cgroup_root(Some("/nodelet".into()));
/// let runtime = CriPodRuntime::new(client, config);
/// for (uid, listed) in runtime.list_pods().await? {
///     let (pod, sandboxes) = (&listed.pod, listed.sandboxes.as_ref().map_or(0, |s| s.sandboxes.len()));
///     println!("{uid}: {}/{} with {} containers, {sandboxes} sandboxes", pod.namespace, pod.name, pod.containers.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CriPodRuntime {
    inner: Arc<Inner>,
}

/// A runtime error of `reason` for a failed CRI call; an unreachable runtime is `RuntimeUnavailable`.
fn cri_error(reason: &'static str, what: impl std::fmt::Display, e: &CriError) -> RuntimeError {
    let reason = if e.is_unavailable() { "RuntimeUnavailable" } else { reason };
    RuntimeError { reason, message: format!("{what}: {e}"), not_found: e.is_not_found() }
}

fn spec_error(e: SpecError) -> RuntimeError {
    RuntimeError::new(e.reason(), e.to_string())
}

fn container_state(state: i32) -> ContainerState {
    match v1::ContainerState::try_from(state) {
        Ok(v1::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(v1::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(v1::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

fn sandbox_ips(status: &v1::PodSandboxStatus) -> Vec<String> {
    let Some(network) = &status.network else { return Vec::new() };
    std::iter::once(network.ip.clone())
        .chain(network.additional_ips.iter().map(|ip| ip.ip.clone()))
        .filter(|ip| !ip.is_empty())
        .collect()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn read_memory_capacity() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Whether `path` is strictly inside `root`, judged by its components (no `..`, no `.`).
fn is_inside(path: &Path, root: &Path) -> bool {
    path.is_absolute()
        && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.starts_with(root)
        && path != root
}

/// Removes `dir` and every cgroup below it that has no processes, deepest first; returns how many
/// directories were removed. A cgroup in use stays (the kernel refuses with `EBUSY`).
fn remove_cgroup_tree(dir: &Path, depth: usize) -> usize {
    let mut removed = 0;
    if depth < 16
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for entry in entries.flatten() {
            // `file_type` does not follow symlinks: only real child cgroups are descended into.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                removed += remove_cgroup_tree(&entry.path(), depth + 1);
            }
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => removed + 1,
        Err(e) if e.kind() == io::ErrorKind::NotFound => removed,
        Err(e) => {
            tracing::debug!(cgroup = %dir.display(), error = %e, "cgroup not removed");
            removed
        }
    }
}

/// Removes the cgroup `rel` (cgroupfs path) in the unified hierarchy at `cgroup_fs` and in every hierarchy
/// mounted below it (cgroup v1 controllers, `unified`, `systemd`).
fn remove_cgroup_everywhere(cgroup_fs: &Path, rel: &str) -> usize {
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        return 0;
    }
    let mut roots = vec![cgroup_fs.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(cgroup_fs) {
        roots.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
    }
    roots.iter().map(|root| root.join(rel)).filter(|p| p.is_dir()).map(|p| remove_cgroup_tree(&p, 0)).sum()
}

impl CriPodRuntime {
    /// A runtime over `client` with `config`. Reads the node's memory from `/proc/meminfo` when the
    /// configuration does not say.
    pub fn new(client: CriClient, mut config: CriPodRuntimeConfig) -> Self {
        if config.memory_capacity_bytes.is_none() {
            config.memory_capacity_bytes = read_memory_capacity();
        }
        let prober = CriProber::new(client.clone());
        CriPodRuntime {
            inner: Arc::new(Inner {
                client,
                config,
                caches: Mutex::default(),
                prober,
                pulls: images::PullRecords::default(),
                own: OwnChanges::default(),
                userns: std::sync::OnceLock::new(),
                userns_adopted: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The containers nodelet is stopping or removing, or just did (shared): the runtime event
    /// forwarder leaves their exits and removals to the operations that made them.
    pub fn own_changes(&self) -> OwnChanges {
        self.inner.own.clone()
    }

    /// What happened to each container's image the last time it was made sure of (shared: the node
    /// view reports them as the kubelet's `Pulling` and `Pulled` events).
    pub fn pull_records(&self) -> images::PullRecords {
        self.inner.pulls.clone()
    }

    /// The user namespace ranges of `hostUsers: false` pods (see [`crate::userns`]), read from
    /// `<root>/pods` on first use.
    pub fn userns(&self) -> Arc<crate::userns::UsernsAllocator> {
        self.inner
            .userns
            .get_or_init(|| Arc::new(crate::userns::UsernsAllocator::load(&self.inner.config.root_dir)))
            .clone()
    }

    /// The user namespace of `pod`'s sandbox and containers: `None` for a pod with the host's users, else
    /// its range (allocated when `allocate`, else the one it has, which must exist). Blocking work runs
    /// on the blocking pool.
    pub(crate) async fn pod_userns(
        &self,
        pod: &DesiredPod,
        allocate: bool,
        reason: &'static str,
    ) -> RuntimeResult<Option<v1::UserNamespace>> {
        if pod.spec().host_users != Some(false) {
            return Ok(None);
        }
        let allocator = self.userns();
        let uid = pod.uid().to_owned();
        let got = tokio::task::spawn_blocking(move || {
            if allocate { allocator.get_or_allocate(&uid).map(Some) } else { allocator.get(&uid) }
        })
        .await
        .map_err(|e| RuntimeError::new(reason, format!("user namespace task failed: {e}")))?;
        match got {
            Ok(Some(ns)) => Ok(Some(ns)),
            Ok(None) => Err(RuntimeError::new(
                reason,
                format!(
                    "pod {}/{}: spec.hostUsers is false and the pod has no user namespace allocated",
                    pod.namespace(),
                    pod.name()
                ),
            )),
            Err(e) => Err(RuntimeError::new(
                reason,
                format!("pod {}/{}: spec.hostUsers: {e}", pod.namespace(), pod.name()),
            )),
        }
    }

    /// Whether the pod `uid` has a user namespace range (or an untrusted allocation file) recorded; false
    /// without reading the allocations when no pod used one yet.
    pub(crate) fn userns_in_use(&self, uid: Option<&str>) -> bool {
        let (Some(uid), Some(allocator)) = (uid, self.inner.userns.get()) else { return false };
        !matches!(allocator.get(uid), Ok(None))
    }

    /// Frees the user namespace range of the pod `uid`, which has no sandbox left. The sandbox pair
    /// removes a desired pod's sandboxes only beyond its newest one, and all of them once the pod is gone,
    /// so a pod whose sandbox is replaced keeps its range.
    pub(crate) async fn release_userns(&self, uid: &str) {
        if !self.userns_in_use(Some(uid)) {
            return;
        }
        let allocator = self.userns();
        let owned = uid.to_owned();
        if let Err(e) = tokio::task::spawn_blocking(move || allocator.release(&owned)).await {
            tracing::warn!(pod = %uid, error = %e, "the user namespace release task failed");
        }
    }

    /// The CRI client.
    pub fn client(&self) -> &CriClient {
        &self.inner.client
    }

    /// The probe and lifecycle-hook runner (the same one the hooks of this runtime use).
    pub fn prober(&self) -> &CriProber {
        &self.inner.prober
    }

    /// The configuration.
    pub fn config(&self) -> &CriPodRuntimeConfig {
        &self.inner.config
    }

    fn caches(&self) -> MutexGuard<'_, Caches> {
        self.inner.caches.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pod's log directory, `<pod log root>/<namespace>_<name>_<uid>`; `None` if a part is empty or
    /// not usable in a path.
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> Option<PathBuf> {
        if !spec::is_path_segment(namespace) || !spec::is_path_segment(name) || !spec::is_safe_uid(uid) {
            return None;
        }
        Some(spec::pod_log_dir(&self.inner.config.pod_log_root, &PodIdentity::new(name, namespace, uid)))
    }

    /// The cgroup parent of the pod's sandbox, `<cgroup root>/pod<uid>`; `None` without a cgroup root or
    /// for an unsafe UID.
    pub fn pod_cgroup(&self, uid: &str) -> Option<String> {
        let root = self.inner.config.cgroup_root.as_deref()?;
        spec::is_safe_uid(uid).then(|| spec::cgroup_parent(Some(root), uid))
    }

    /// Removes the pod's log directory and everything in it (nodelet's pod teardown calls this once the pod
    /// is gone for good; sandbox removal keeps the logs). A missing directory is fine.
    pub async fn remove_pod_logs(&self, namespace: &str, name: &str, uid: &str) -> io::Result<()> {
        let dir = self.pod_log_dir(namespace, name, uid).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unusable pod identity {namespace}/{name} ({uid})"),
            )
        })?;
        match tokio::fs::remove_dir_all(&dir).await {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => {
                tracing::debug!(dir = %dir.display(), "removed pod logs");
                Ok(())
            }
        }
    }

    /// Removes the pod's cgroup `<cgroup root>/pod<uid>` (and empty cgroups below it) in every hierarchy,
    /// where the runtime left them; cgroups with processes stay. Returns how many directories went away.
    pub async fn remove_pod_cgroups(&self, uid: &str) -> usize {
        let Some(cgroup) = self.pod_cgroup(uid) else { return 0 };
        let cgroup_fs = self.inner.config.cgroup_fs.clone();
        let removed =
            tokio::task::spawn_blocking(move || remove_cgroup_everywhere(&cgroup_fs, &cgroup)).await;
        removed.unwrap_or_else(|e| {
            tracing::warn!(uid, error = %e, "cgroup removal task failed");
            0
        })
    }

    /// The node's DNS config for `pod` (reads the configured resolv.conf).
    async fn dns_config(&self, pod: &DesiredPod) -> RuntimeResult<v1::DnsConfig> {
        let config = &self.inner.config;
        let spec = pod.spec();
        let kind = dns::dns_kind(spec.dns_policy.as_deref(), pod.host_network())
            .map_err(|unknown| RuntimeError::new("CreatePodSandboxError", unknown.to_string()))?;
        let host = match (&config.resolv_conf, kind) {
            (_, dns::DnsKind::None) | (None, _) => None,
            (Some(path), _) => match tokio::fs::read_to_string(path).await {
                Ok(text) => Some(ResolvConf::parse(&text)),
                Err(e) => {
                    return Err(RuntimeError::new(
                        "CreatePodSandboxError",
                        format!("cannot read the node's resolv.conf {}: {e}", path.display()),
                    ));
                }
            },
        };
        let node = NodeDns {
            host: host.as_ref(),
            cluster_dns: &config.cluster_dns,
            cluster_domain: &config.cluster_domain,
        };
        Ok(dns::pod_dns_config(kind, pod.namespace(), spec.dns_config.as_ref(), node))
    }

    /// The sandbox's attempt and IPs, from the cache or `PodSandboxStatus`.
    async fn sandbox_facts(&self, sandbox_id: &str) -> Result<SandboxFacts, CriError> {
        if let Some(facts) = self.caches().sandboxes.get(sandbox_id) {
            return Ok(facts.clone());
        }
        let status = self.inner.client.pod_sandbox_status(sandbox_id).await?;
        let facts = SandboxFacts::of(&status);
        self.caches().sandboxes.insert(sandbox_id.to_owned(), facts.clone());
        Ok(facts)
    }

    /// The filters of nodelet's sandboxes and containers: this node's (another nodelet on the same
    /// runtime owns the others), and only the pod `uid`'s when given.
    fn filters(&self, uid: Option<&str>) -> (SandboxFilter, ContainerFilter) {
        let mut sandbox_filter = SandboxFilter::managed();
        let mut container_filter = ContainerFilter::managed();
        let node = &self.inner.config.node_name;
        if !node.is_empty() {
            sandbox_filter = sandbox_filter.label(labels::NODE, node.clone());
            container_filter = container_filter.label(labels::NODE, node.clone());
        }
        if let Some(uid) = uid {
            sandbox_filter = sandbox_filter.label(labels::POD_UID, uid);
            container_filter = container_filter.label(labels::POD_UID, uid);
        }
        (sandbox_filter, container_filter)
    }

    /// Whether an object with `labels` is one this runtime manages: nodelet's, and this node's when
    /// a node name is set (the same test as [`filters`](Self::filters)).
    fn owns(&self, labels: &(impl Lookup + ?Sized)) -> bool {
        let node = &self.inner.config.node_name;
        labels::is_managed(labels) && (node.is_empty() || labels.value(labels::NODE) == Some(node.as_str()))
    }

    /// Reads the facts (`PodSandboxStatus`) of the listed sandboxes not seen yet into the cache; a
    /// sandbox that went away meanwhile is left out.
    async fn learn_sandboxes(&self, sandboxes: &[ListedSandbox]) -> RuntimeResult<()> {
        let unknown: Vec<String> = {
            let caches = self.caches();
            sandboxes
                .iter()
                .filter(|s| !caches.sandboxes.contains_key(s.id.as_str()))
                .map(|s| s.id.as_str().to_owned())
                .collect()
        };
        if unknown.is_empty() {
            return Ok(());
        }
        let fetched: Vec<(String, Result<SandboxFacts, CriError>)> = futures::stream::iter(unknown)
            .map(|id| async move {
                let facts = self.sandbox_facts(&id).await;
                (id, facts)
            })
            .buffer_unordered(STATUS_CONCURRENCY)
            .collect()
            .await;
        for (id, result) in fetched {
            match result {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {
                    tracing::debug!(sandbox = %id, "sandbox went away during relist")
                }
                Err(e) => return Err(cri_error("RuntimeUnavailable", format!("status of sandbox {id}"), &e)),
            }
        }
        Ok(())
    }

    /// The pod `uid`'s sandboxes alone (without its containers): the sandbox pair's state read after
    /// each of its operations. A `PodSandboxStatus` per sandbox the index knows, else one listing.
    async fn collect_sandboxes(&self, uid: &str) -> RuntimeResult<Option<PodSandboxes>> {
        let known = self.caches().index.objects(uid);
        let sandboxes = match known {
            Some(objects) => {
                let objects = index::PodObjects { containers: Vec::new(), ..objects };
                self.read_objects(objects).await?.sandboxes
            }
            None => {
                let (filter, _) = self.filters(Some(uid));
                self.inner
                    .client
                    .list_sandbox_items(&filter)
                    .await
                    .map_err(|e| cri_error("RuntimeUnavailable", "listing pod sandboxes", &e))?
            }
        };
        self.learn_sandboxes(&sandboxes).await?;
        let caches = self.caches();
        let mut pod: Option<PodSandboxes> = None;
        for sandbox in &sandboxes {
            let Some(identity) = PodIdentity::from_labels(&sandbox.labels) else { continue };
            let Some(facts) = caches.sandboxes.get(sandbox.id.as_str()) else { continue };
            if identity.uid != uid {
                continue;
            }
            pod.get_or_insert_with(|| no_sandboxes(&identity)).sandboxes.push(sandbox_record(sandbox, facts));
        }
        if let Some(pod) = &mut pod {
            sort_sandboxes(&mut pod.sandboxes);
        }
        Ok(pod)
    }

    /// Lists nodelet's sandboxes and containers (of the pod `uid` only, when given) and tells the
    /// index what it found.
    async fn list(&self, uid: Option<&str>) -> RuntimeResult<Listed> {
        let client = &self.inner.client;
        let (sandbox_filter, container_filter) = self.filters(uid);
        let start = self.caches().index.start_listing();
        let (sandboxes, containers) = futures::join!(
            client.list_sandbox_items(&sandbox_filter),
            client.list_container_items(&container_filter)
        );
        let sandboxes =
            sandboxes.map_err(|e| cri_error("RuntimeUnavailable", "listing pod sandboxes", &e))?;
        let containers = containers.map_err(|e| cri_error("RuntimeUnavailable", "listing containers", &e))?;
        self.caches().index.listed(start, uid, &sandboxes, &containers);
        Ok(Listed { sandboxes, containers, statuses: HashMap::new() })
    }

    /// Reads the objects the index names with a status call each, as a listing would show them (with
    /// the container statuses beside). An object that is gone is left out and forgotten.
    async fn read_objects(&self, objects: index::PodObjects) -> RuntimeResult<Listed> {
        let client = &self.inner.client;
        let sandbox_reads = futures::stream::iter(objects.sandboxes)
            .map(|id| async move {
                let status = client.pod_sandbox_status(&id).await;
                (id, status)
            })
            .buffer_unordered(STATUS_CONCURRENCY)
            .collect::<Vec<_>>();
        let container_reads = futures::stream::iter(objects.containers)
            .map(|(id, sandbox)| async move {
                let status = client.container_status(&id).await;
                (id, sandbox, status)
            })
            .buffer_unordered(STATUS_CONCURRENCY)
            .collect::<Vec<_>>();
        let (sandbox_reads, container_reads) = futures::join!(sandbox_reads, container_reads);
        let mut listed = Listed {
            sandboxes: Vec::with_capacity(sandbox_reads.len()),
            containers: Vec::with_capacity(container_reads.len()),
            statuses: HashMap::with_capacity(container_reads.len()),
        };
        let mut gone = Vec::new();
        for (id, read) in sandbox_reads {
            match read {
                Ok(status) => listed.sandboxes.push(self.listed_sandbox(status)),
                Err(e) if e.is_not_found() => gone.push(id),
                Err(e) => return Err(cri_error("RuntimeUnavailable", format!("status of sandbox {id}"), &e)),
            }
        }
        for (id, sandbox, read) in container_reads {
            match read {
                Ok(status) => {
                    listed.containers.push(ListedContainer::from_status(&status, sandbox));
                    listed.statuses.insert(id, status);
                }
                Err(e) if e.is_not_found() => gone.push(id),
                Err(e) => {
                    return Err(cri_error("RuntimeUnavailable", format!("status of container {id}"), &e));
                }
            }
        }
        if !gone.is_empty() {
            let mut caches = self.caches();
            for id in &gone {
                caches.index.remove(id);
            }
        }
        Ok(listed)
    }

    /// A sandbox's status as its listing item; its facts are cached on the way.
    fn listed_sandbox(&self, status: v1::PodSandboxStatus) -> ListedSandbox {
        let mut caches = self.caches();
        if !caches.sandboxes.contains_key(&status.id) {
            caches.sandboxes.insert(status.id.clone(), SandboxFacts::of(&status));
        }
        ListedSandbox::from_status(status)
    }

    /// Everything nodelet manages, or only the pod `uid`'s, grouped by pod UID: each pod's containers
    /// and its sandboxes apart.
    async fn collect(&self, uid: Option<&str>) -> RuntimeResult<HashMap<String, ListedPod>> {
        let client = &self.inner.client;
        let known = uid.and_then(|uid| self.caches().index.objects(uid));
        let Listed { sandboxes, containers, mut statuses } = match known {
            Some(objects) => self.read_objects(objects).await?,
            None => self.list(uid).await?,
        };
        self.learn_sandboxes(&sandboxes).await?;

        // Container statuses for containers first seen running or exited.
        let stale: Vec<(String, ContainerState)> = {
            let caches = self.caches();
            containers
                .iter()
                .filter(|c| {
                    let state = container_state(c.state);
                    matches!(state, ContainerState::Running | ContainerState::Exited)
                        && caches.containers.get(c.id.as_str()).is_none_or(|f| f.state != state)
                })
                .map(|c| (c.id.as_str().to_owned(), container_state(c.state)))
                .collect()
        };
        // Those read just now (the pod's objects read one by one) need no second call.
        let (read, unread): (Vec<_>, Vec<_>) =
            stale.into_iter().partition(|(id, _)| statuses.contains_key(id));
        let mut fetched: Vec<(String, Result<v1::ContainerStatus, CriError>)> = futures::stream::iter(unread)
            .map(|(id, _)| async move {
                let status = client.container_status(&id).await;
                (id, status)
            })
            .buffer_unordered(STATUS_CONCURRENCY)
            .collect()
            .await;
        fetched.extend(read.into_iter().filter_map(|(id, _)| {
            let status = statuses.remove(&id)?;
            Some((id, Ok(status)))
        }));
        drop(statuses);
        let statuses = fetched;
        let mut gone: HashSet<String> = HashSet::new();
        {
            let mut caches = self.caches();
            for (id, result) in statuses {
                match result {
                    Ok(s) => {
                        // An exited container's termination message (file, or log tail) comes first.
                        let message = match container_state(s.state) {
                            ContainerState::Exited => termination::message(&s).unwrap_or(s.message),
                            _ => s.message,
                        };
                        let facts = StatusFacts {
                            applied: applied_resources(s.resources.as_ref()),
                            state: container_state(s.state),
                            started_at: s.started_at,
                            finished_at: s.finished_at,
                            exit_code: s.exit_code,
                            reason: s.reason,
                            message,
                            image_ref: s.image_ref,
                            log_path: s.log_path,
                            version: caches.next_version(),
                        };
                        caches.containers.insert(id, facts);
                    }
                    Err(e) if e.is_not_found() => {
                        gone.insert(id);
                    }
                    Err(e) => {
                        return Err(cri_error("RuntimeUnavailable", format!("status of container {id}"), &e));
                    }
                }
            }
        }

        let mut caches = self.caches();
        // How many listed items have facts cached: when the caches hold no others, a whole
        // listing has nothing of them to forget.
        let (sandbox_hits, container_hits) = (Cell::new(0), Cell::new(0));
        let signatures = memo::signatures(
            &sandboxes,
            &containers,
            |id| {
                let hit = caches.sandboxes.contains_key(id);
                sandbox_hits.set(sandbox_hits.get() + usize::from(hit));
                hit
            },
            |id| {
                let version = caches.containers.get(id).map(|f| f.version);
                container_hits.set(container_hits.get() + usize::from(version.is_some()));
                version
            },
            |id| gone.contains(id),
        );
        // The pods that are as they were at an earlier listing; only the others are built.
        let mut reused: HashMap<String, ListedPod> = HashMap::with_capacity(signatures.len());
        for (uid, signature) in &signatures {
            if let Some(pod) = caches.memo.get(uid, *signature) {
                reused.insert((*uid).to_owned(), pod);
            }
        }
        let all_reused = reused.len() == signatures.len();
        let is_reused =
            |labels: &[Entry]| labels.value(labels::POD_UID).is_some_and(|uid| reused.contains_key(uid));
        let mut pods: HashMap<String, PodActual> = HashMap::new();
        let mut pod_sandboxes: HashMap<String, PodSandboxes> = HashMap::new();
        let mut graces: HashMap<&str, u64> = HashMap::new();
        let log_root = &self.inner.config.pod_log_root;
        // On a quiet node every pod is reused: nothing to build.
        let to_build: (&[ListedSandbox], &[ListedContainer]) =
            if all_reused { (&[], &[]) } else { (&sandboxes, &containers) };
        for sandbox in to_build.0 {
            if is_reused(&sandbox.labels) {
                continue;
            }
            let Some(identity) = PodIdentity::from_labels(&sandbox.labels) else { continue };
            let Some(facts) = caches.sandboxes.get(sandbox.id.as_str()) else { continue };
            pods.entry(identity.uid.clone()).or_insert_with(|| PodActual {
                uid: identity.uid.clone(),
                namespace: identity.namespace.clone(),
                name: identity.name.clone(),
                ..PodActual::default()
            });
            pod_sandboxes
                .entry(identity.uid.clone())
                .or_insert_with(|| no_sandboxes(&identity))
                .sandboxes
                .push(sandbox_record(sandbox, facts));
        }
        for c in to_build.1 {
            if gone.contains(c.id.as_str()) || is_reused(&c.labels) {
                continue;
            }
            let Some(identity) = PodIdentity::from_labels(&c.labels) else { continue };
            let name = c
                .labels
                .value(labels::CONTAINER_NAME)
                .map(str::to_owned)
                .or_else(|| c.metadata.as_ref().map(|m| m.name.as_str().to_owned()))
                .unwrap_or_default();
            let restart_count = labels::restart_count(&c.annotations)
                .or_else(|| c.metadata.as_ref().map(|m| m.attempt))
                .unwrap_or(0);
            let facts = caches.containers.get(c.id.as_str());
            let computed_log = || {
                spec::is_path_segment(&name).then(|| {
                    spec::pod_log_dir(log_root, &identity)
                        .join(spec::container_log_path(&name, restart_count))
                        .to_string_lossy()
                        .into_owned()
                })
            };
            let record = ContainerRecord {
                id: c.id.as_str().to_owned(),
                sandbox_id: c.pod_sandbox_id.as_str().to_owned(),
                restart_count,
                backoff_since: labels::backoff_since(&c.annotations),
                spec_hash: c.annotations.value(labels::CONTAINER_HASH).map(str::to_owned),
                spec_hash_without_resources: c
                    .annotations
                    .value(labels::CONTAINER_HASH_WITHOUT_RESOURCES)
                    .map(str::to_owned),
                applied: facts.and_then(|f| f.applied),
                sidecar: labels::sidecar_index(&c.annotations),
                // A status fetched during this relist may be newer than the list; otherwise the list is.
                state: match (container_state(c.state), facts) {
                    (ContainerState::Running | ContainerState::Exited, Some(f)) => f.state,
                    (listed, _) => listed,
                },
                image: c
                    .annotations
                    .value(labels::CONTAINER_IMAGE)
                    .map(str::to_owned)
                    .or_else(|| c.image.as_ref().map(|i| i.image.as_str().to_owned()))
                    .unwrap_or_default(),
                image_ref: facts
                    .map(|f| f.image_ref.clone())
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| c.image_ref.as_str().to_owned()),
                created_at: c.created_at,
                started_at: facts.map_or(0, |f| f.started_at),
                finished_at: facts.map_or(0, |f| f.finished_at),
                exit_code: facts.map_or(0, |f| f.exit_code),
                reason: facts.map(|f| f.reason.clone()).unwrap_or_default(),
                message: facts.map(|f| f.message.clone()).unwrap_or_default(),
                log_path: facts
                    .map(|f| f.log_path.clone())
                    .filter(|p| !p.is_empty())
                    .or_else(computed_log)
                    .unwrap_or_default(),
                name,
            };
            if let Some(grace) =
                labels::termination_grace_period_secs(&c.annotations).and_then(|g| u64::try_from(g).ok())
            {
                graces.insert(c.id.as_str(), grace);
            }
            pods.entry(identity.uid.clone())
                .or_insert_with(|| PodActual {
                    uid: identity.uid.clone(),
                    namespace: identity.namespace.clone(),
                    name: identity.name.clone(),
                    ..PodActual::default()
                })
                .containers
                .push(record);
        }
        for pod in pod_sandboxes.values_mut() {
            sort_sandboxes(&mut pod.sandboxes);
        }
        for pod in pods.values_mut() {
            pod.containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
            // The newest container's annotation, else the newest sandbox's.
            pod.termination_grace_secs =
                pod.containers.iter().find_map(|c| graces.get(c.id.as_str()).copied()).or_else(|| {
                    let newest = pod_sandboxes.get(&pod.uid)?.newest()?;
                    let sandbox = sandboxes.iter().find(|s| s.id == newest.id)?;
                    labels::termination_grace_period_secs(&sandbox.annotations)
                        .and_then(|g| u64::try_from(g).ok())
                });
        }

        let mut built: HashMap<String, ListedPod> = reused;
        built.reserve(pods.len());
        for (pod_uid, pod) in pods {
            let sandboxes = pod_sandboxes.remove(&pod_uid).map(Arc::new);
            let listed = ListedPod { pod: Arc::new(pod), sandboxes };
            if let Some(signature) = signatures.get(pod_uid.as_str()) {
                caches.memo.insert(&pod_uid, *signature, listed.clone());
            }
            built.insert(pod_uid, listed);
        }
        match uid {
            None => {
                // Forget what the runtime no longer has. The runtime's IDs are unique: caches that
                // hold as many entries as the listed items they had hold no others (a quiet node).
                if caches.sandboxes.len() != sandbox_hits.get() {
                    let sandbox_ids: foldhash::HashSet<&str> =
                        sandboxes.iter().map(|s| s.id.as_str()).collect();
                    caches.sandboxes.retain(|id, _| sandbox_ids.contains(id.as_str()));
                }
                if caches.containers.len() != container_hits.get() {
                    let container_ids: foldhash::HashSet<&str> =
                        containers.iter().map(|c| c.id.as_str()).collect();
                    caches.containers.retain(|id, _| container_ids.contains(id.as_str()));
                }
                // Every pod reused and no other remembered: the memo is as it should be.
                if !(all_reused && caches.memo.len() == built.len()) {
                    caches.memo.retain(|uid| built.contains_key(uid));
                }
            }
            Some(uid) if !built.contains_key(uid) => caches.memo.remove(uid),
            Some(_) => {}
        }
        Ok(built)
    }

    /// Stops the container `container_id`: its preStop hook first, within `grace`, then
    /// `StopContainer` with what is left of it; a container already gone is stopped.
    async fn stop(&self, container_id: &str, grace: Duration) -> RuntimeResult<()> {
        let grace = probe::pre_stop(&self.inner.prober, container_id, grace).await;
        match self.inner.client.stop_container(container_id, grace).await {
            Err(e) if !e.is_not_found() => {
                Err(cri_error("KillContainerError", format!("StopContainer {container_id}"), &e))
            }
            _ => Ok(()),
        }
    }

    /// For an ephemeral container with a `targetContainerName`: the runtime ID of the target's
    /// newest container in the sandbox, as the kubelet's `getTargetID` (an error while it has none).
    async fn pid_target(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
    ) -> RuntimeResult<Option<String>> {
        if kind != ContainerKind::Ephemeral {
            return Ok(None);
        }
        let Some(target) = pod.ephemeral_target(&container.name) else { return Ok(None) };
        let state = self
            .collect(Some(pod.uid()))
            .await?
            .remove(pod.uid())
            .map(|listed| Arc::unwrap_or_clone(listed.pod))
            .unwrap_or_default();
        match state.container(target).filter(|c| c.sandbox_id == sandbox_id) {
            Some(c) => Ok(Some(c.id.clone())),
            None => Err(RuntimeError::new(
                "CreateContainerConfigError",
                format!("container {:?}: unable to find target container {target:?}", container.name),
            )),
        }
    }

    #[allow(clippy::too_many_arguments)] // PodRuntime::start_container's
    async fn start(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        backoff_since: u32,
        volumes: &PodVolumes,
        cancel: &CancellationToken,
    ) -> RuntimeResult<String> {
        let config = &self.inner.config;
        let client = &self.inner.client;
        let path = spec::container_field_path(pod, &container.name, kind);
        spec::check_privileged(pod, container, kind, config).map_err(spec_error)?;

        let image_name = container.image.as_deref().unwrap_or_default();
        let policy =
            PullPolicy::resolve(container.image_pull_policy.as_deref(), image_name).ok_or_else(|| {
                RuntimeError::new(
                    "CreateContainerConfigError",
                    format!(
                        "container {:?}: {path}.imagePullPolicy: unsupported value {:?}",
                        container.name, container.image_pull_policy
                    ),
                )
            })?;

        let facts = self.sandbox_facts(sandbox_id).await.map_err(|e| {
            cri_error(
                "CreateContainerError",
                format!("container {:?}: status of sandbox {sandbox_id}", container.name),
                &e,
            )
        })?;
        let userns = self.pod_userns(pod, false, "CreateContainerConfigError").await?;
        let sandbox_config =
            spec::sandbox_config(pod, facts.attempt, config, None, userns.as_ref()).map_err(spec_error)?;

        let image = images::ensure_image_recorded(
            client,
            image_name,
            policy,
            Some(&sandbox_config),
            (&self.inner.pulls, pod.uid(), &container.name),
        )
        .await
        .map_err(|e| {
            let reason = if e.cri_error().is_some_and(CriError::is_unavailable) {
                "RuntimeUnavailable"
            } else {
                e.reason()
            };
            RuntimeError::new(reason, format!("container {:?}: {e}", container.name))
        })?;

        let pid_target = self.pid_target(pod, sandbox_id, container, kind).await?;
        let inputs = ContainerInputs {
            kind,
            restart_count,
            backoff_since,
            image: &image,
            pod_ips: &facts.ips,
            volumes,
            mounts: &[],
            pid_target: pid_target.as_deref(),
            userns: userns.as_ref(),
        };
        let pod_dir = config.root_dir.join("pods").join(pod.uid());
        let (mut mounts, binds) =
            spec::container_mounts(pod, container, &inputs, config, &pod_dir).map_err(spec_error)?;
        bind_sub_paths(&container.name, binds).await?;
        // The kubelet-managed /etc/hosts, once the pod's IPs are known.
        if !facts.ips.is_empty() && !etc_hosts::mounts_own(container) {
            let file = self.write_etc_hosts(pod, &facts.ips).await.map_err(|why| {
                RuntimeError::new(
                    "CreateContainerConfigError",
                    format!("container {:?}: cannot write the pod's hosts file: {why}", container.name),
                )
            })?;
            mounts.push(v1::Mount {
                container_path: etc_hosts::ETC_HOSTS_PATH.to_owned(),
                host_path: file.display().to_string(),
                selinux_relabel: true,
                ..v1::Mount::default()
            });
        }
        // The termination message file, at `terminationMessagePath`.
        if let Some(path) = container.termination_message_path.as_deref().filter(|p| !p.is_empty()) {
            let (root, uid, name) = (config.root_dir.clone(), pod.uid().to_owned(), container.name.clone());
            let file = tokio::task::spawn_blocking(move || {
                termination::create_file(&root, &uid, &name, restart_count)
            })
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
            .map_err(|e| {
                RuntimeError::new(
                    "CreateContainerConfigError",
                    format!(
                        "container {:?}: cannot create its termination message file: {e}",
                        container.name
                    ),
                )
            })?;
            mounts.push(v1::Mount {
                container_path: path.to_owned(),
                host_path: file.display().to_string(),
                ..v1::Mount::default()
            });
        }
        let inputs = ContainerInputs { mounts: &mounts, ..inputs };
        let container_config = spec::container_config(pod, container, &inputs, config).map_err(spec_error)?;

        // The kubelet creates the container's log directory; the runtime only opens the file.
        let log_dir = Path::new(&sandbox_config.log_directory).join(&container.name);
        if let Err(e) = tokio::fs::DirBuilder::new().recursive(true).mode(0o755).create(&log_dir).await {
            return Err(RuntimeError::new(
                "CreateContainerConfigError",
                format!(
                    "container {:?}: cannot create log directory {}: {e}",
                    container.name,
                    log_dir.display()
                ),
            ));
        }

        let created = client.create_container(sandbox_id, container_config, sandbox_config).await;
        {
            let mut caches = self.caches();
            match &created {
                Ok(id) => caches.index.add_container(pod.uid(), id, sandbox_id),
                Err(_) => caches.index.creation_failed(pod.uid()),
            }
        }
        let id = created.map_err(|e| {
            cri_error("CreateContainerError", format!("container {:?}: CreateContainer", container.name), &e)
        })?;
        if let Err(e) = client.start_container(&id).await {
            let error =
                cri_error("RunContainerError", format!("container {:?}: StartContainer", container.name), &e);
            if let Err(remove) = client.remove_container(&id).await {
                tracing::warn!(container = %id, error = %remove, "cannot remove the unstarted container");
            }
            return Err(RuntimeError { not_found: false, ..error });
        }
        // postStart right after the start; its failure kills the container, as the kubelet does. So does
        // the cancellation of the start, which fires only when the pod is being terminated (deleted,
        // evicted, …): a hook that never returns cannot hold the pod, as the kubelet's pod worker gives
        // up the hook when the pod terminates, while any other change of the pod waits for the hook.
        let pod_ip = facts.ips.first().map(String::as_str);
        // A container without a hook has nothing to give up: a start cancelled after it succeeded is
        // still a started container. A hook that has finished wins over a cancellation.
        let has_hook = container.lifecycle.as_ref().is_some_and(|l| l.post_start.is_some());
        let hook = tokio::select! {
            biased;
            result = probe::post_start(&self.inner.prober, container, &id, pod_ip) => result,
            () = cancel.cancelled(), if has_hook => Err(RuntimeError::new(
                "PostStartHookError",
                format!(
                    "container {:?}: postStart hook abandoned: the pod no longer wants this start",
                    container.name
                ),
            )),
        };
        if let Err(e) = hook {
            // (a failed start reads no state: the exit is the PLEG's to find, as any other)
            if let Err(stop) = self.stop(&id, pod.grace_period()).await {
                tracing::warn!(container = %id, error = %stop, "cannot kill the container whose postStart failed");
            }
            return Err(e);
        }
        tracing::info!(
            pod = %pod.uid(), container = %container.name, id = %id, restart_count, image = %image.id,
            "container started"
        );
        Ok(id)
    }
}

/// A listed sandbox as the pod and sandbox stores keep it.
fn sandbox_record(sandbox: &ListedSandbox, facts: &SandboxFacts) -> SandboxRecord {
    SandboxRecord {
        id: sandbox.id.as_str().to_owned(),
        ready: sandbox.state == v1::PodSandboxState::SandboxReady as i32,
        ip: facts.ips.first().cloned(),
        created_at: sandbox.created_at,
        attempt: sandbox.metadata.as_ref().map_or(facts.attempt, |m| m.attempt),
        host_network: facts.host_network,
        runtime_handler: sandbox.runtime_handler.as_str().to_owned(),
    }
}

/// The sandbox record of the pod `identity` names, with no sandbox yet.
fn no_sandboxes(identity: &PodIdentity) -> PodSandboxes {
    PodSandboxes {
        uid: identity.uid.clone(),
        namespace: identity.namespace.clone(),
        name: identity.name.clone(),
        sandboxes: Vec::new(),
        needs_refresh: false,
    }
}

/// A pod's sandboxes newest first (by creation, then attempt).
fn sort_sandboxes(sandboxes: &mut [SandboxRecord]) {
    sandboxes.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.attempt.cmp(&a.attempt)));
}

/// Makes a container's subPath binds (safely, beneath each volume: `nodelet_host::subpath`), replacing binds
/// an earlier attempt of the container left.
async fn bind_sub_paths(container: &str, binds: Vec<spec::SubPathBind>) -> RuntimeResult<()> {
    if binds.is_empty() {
        return Ok(());
    }
    let container = container.to_owned();
    let joined = tokio::task::spawn_blocking(move || {
        for bind in &binds {
            nodelet_host::subpath::unbind_sub_paths(&bind.target).map_err(|e| {
                format!(
                    "container {container:?}: removing the old subPath bind {}: {e}",
                    bind.target.display()
                )
            })?;
            nodelet_host::subpath::bind_sub_path(&bind.volume_root, &bind.sub_path, &bind.target)
                .map_err(|e| format!("container {container:?}: subPath {:?}: {e}", bind.sub_path))?;
        }
        Ok::<(), String>(())
    })
    .await;
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(RuntimeError::new("CreateContainerConfigError", message)),
        Err(e) => {
            Err(RuntimeError::new("CreateContainerConfigError", format!("subPath binding task failed: {e}")))
        }
    }
}

/// Why the pod's `/etc/hosts` could not be written.
#[derive(Debug, thiserror::Error)]
enum HostsFileError {
    /// The pod's host name or domain is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The node's hosts file (copied for a host-network pod) could not be read.
    #[error("reading the node's {}: {source}", etc_hosts::ETC_HOSTS_PATH)]
    ReadNode {
        /// Why.
        source: io::Error,
    },
    /// Writing the file failed.
    #[error(transparent)]
    Write(io::Error),
    /// The blocking task that writes it failed.
    #[error("hosts file task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl CriPodRuntime {
    /// Writes the pod's `/etc/hosts` ([`etc_hosts`]) for its IPs `ips`; returns the file's path.
    async fn write_etc_hosts(&self, pod: &DesiredPod, ips: &[String]) -> Result<PathBuf, HostsFileError> {
        let config = &self.inner.config;
        let (host, domain) = spec::host_name_and_domain(pod, config)?;
        let aliases = pod.spec().host_aliases.clone().unwrap_or_default();
        let (root, uid, ips, host_network) =
            (config.root_dir.clone(), pod.uid().to_owned(), ips.to_vec(), pod.host_network());
        tokio::task::spawn_blocking(move || {
            let content = if host_network {
                let node = etc_hosts::read_node_hosts(Path::new(etc_hosts::ETC_HOSTS_PATH))
                    .map_err(|source| HostsFileError::ReadNode { source })?;
                etc_hosts::node_content(&node, &aliases)
            } else {
                etc_hosts::managed_content(&ips, &host, &domain, &aliases)
            };
            etc_hosts::write(&root, &uid, &content).map_err(HostsFileError::Write)
        })
        .await?
    }
}

impl PodRuntime for CriPodRuntime {
    async fn remove_pod_leftovers(&self, namespace: &str, name: &str, uid: &str) -> RuntimeResult<()> {
        // The pod is gone: its user namespace range goes now if it has no sandbox left (else with the
        // last one, in `remove_sandbox`).
        if self.userns_in_use(Some(uid)) {
            let known = self.caches().index.objects(uid).map(|o| o.sandboxes.len());
            let left = match known {
                Some(n) => Ok(n),
                None => {
                    let mine = SandboxFilter::managed().label(labels::POD_UID, uid.to_owned());
                    self.inner.client.list_sandbox_items(&mine).await.map(|left| left.len())
                }
            };
            if matches!(left, Ok(0)) {
                self.release_userns(uid).await;
            }
        }
        // The termination message files and the hosts file (and the pod directory, when nothing
        // else is left in it).
        if !uid.is_empty() && !uid.contains('/') && uid != "." && uid != ".." {
            let (root, owned_uid) = (self.inner.config.root_dir.clone(), uid.to_owned());
            let removed = tokio::task::spawn_blocking(move || etc_hosts::remove(&root, &owned_uid))
                .await
                .map_err(io::Error::other)
                .and_then(|r| r);
            if let Err(e) = removed {
                return Err(RuntimeError::new(
                    "KillPodSandboxError",
                    format!("removing the hosts file of pod {uid}: {e}"),
                ));
            }
            let dir = termination::pod_containers_dir(&self.inner.config.root_dir, uid);
            match tokio::fs::remove_dir_all(&dir).await {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(RuntimeError::new(
                        "KillPodSandboxError",
                        format!("removing {}: {e}", dir.display()),
                    ));
                }
                _ => {
                    if let Some(pod_dir) = dir.parent() {
                        let _ = tokio::fs::remove_dir(pod_dir).await;
                    }
                }
            }
        }
        match self.remove_pod_logs(namespace, name, uid).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::new("KillPodSandboxError", format!("removing the pod's logs: {e}"))),
        }
    }

    async fn start_container(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        backoff_since: u32,
        volumes: &PodVolumes,
        cancel: &CancellationToken,
    ) -> RuntimeResult<String> {
        self.start(pod, sandbox_id, container, kind, restart_count, backoff_since, volumes, cancel).await.inspect_err(|e| {
            let (pod, container) = (pod.uid(), &container.name);
            tracing::debug!(pod, container, reason = e.reason, error = %e.message, "container start failed");
        })
    }

    async fn stop_container(&self, container_id: &str, grace: Duration) -> RuntimeResult<()> {
        // The pod driver reads the pod's state after every stop it makes: its exit is nodelet's own.
        let change = self.inner.own.begin(container_id);
        let stopped = self.stop(container_id, grace).await;
        if stopped.is_ok() {
            change.done();
        }
        stopped
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &CgroupResources,
    ) -> RuntimeResult<()> {
        let client = &self.inner.client;
        let err = |e: &CriError| {
            cri_error("UpdateContainerResourcesError", format!("UpdateContainerResources {container_id}"), e)
        };
        // Only CPU and memory change: the rest (oom_score_adj, cpusets, hugepages) stays as it is.
        let current = client.container_status(container_id).await.map_err(|e| err(&e))?;
        let mut linux = current.resources.and_then(|r| r.linux).unwrap_or_default();
        linux.cpu_shares = resources.cpu_shares;
        linux.cpu_quota = resources.cpu_quota;
        linux.cpu_period = resources.cpu_period;
        linux.memory_limit_in_bytes = resources.memory_limit;
        linux.memory_swap_limit_in_bytes = resources.memory_limit;
        client.update_container_resources(container_id, linux).await.map_err(|e| err(&e))?;
        // What the runtime now reports is the container's actual state.
        let status = client.container_status(container_id).await.map_err(|e| err(&e))?;
        let applied = applied_resources(status.resources.as_ref());
        let mut caches = self.caches();
        let version = caches.next_version();
        if let Some(facts) = caches.containers.get_mut(container_id) {
            // Changed facts: the pod is built anew at its next listing.
            facts.applied = applied;
            facts.version = version;
        }
        drop(caches);
        match applied {
            Some(a) if a.cpu_differs(resources) || a.memory_differs(resources) => Err(RuntimeError::new(
                "UpdateContainerResourcesError",
                format!(
                    "container {container_id}: the runtime reports {a:?} after an update to {resources:?}"
                ),
            )),
            _ => Ok(()),
        }
    }

    async fn remove_container(&self, container_id: &str) -> RuntimeResult<()> {
        let client = &self.inner.client;
        let log_path = match client.container_status(container_id).await {
            Ok(status) => Some(PathBuf::from(status.log_path)),
            Err(e) if e.is_not_found() => {
                let mut caches = self.caches();
                caches.containers.remove(container_id);
                caches.index.remove(container_id);
                return Ok(());
            }
            Err(e) => {
                tracing::debug!(container = %container_id, error = %e, "no status: its log stays");
                None
            }
        };
        let change = self.inner.own.begin(container_id);
        if let Err(e) = client.remove_container(container_id).await
            && !e.is_not_found()
        {
            return Err(cri_error("KillContainerError", format!("RemoveContainer {container_id}"), &e));
        }
        change.done();
        {
            let mut caches = self.caches();
            caches.containers.remove(container_id);
            caches.index.remove(container_id);
        }
        if let Some(path) = log_path.filter(|p| !p.as_os_str().is_empty()) {
            let log = path.display();
            if !is_inside(&path, &self.inner.config.pod_log_root) {
                tracing::warn!(container = %container_id, %log, "log outside the log root: kept");
            } else if let Err(e) = tokio::fs::remove_file(&path).await
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(container = %container_id, %log, error = %e, "cannot remove log");
            }
        }
        Ok(())
    }

    async fn list_pods(&self) -> RuntimeResult<HashMap<String, ListedPod>> {
        self.collect(None).await
    }

    async fn pod_state(&self, uid: &str) -> RuntimeResult<Option<ListedPod>> {
        Ok(self.collect(Some(uid)).await?.remove(uid))
    }

    async fn pod_of(&self, id: &str) -> RuntimeResult<Option<String>> {
        let client = &self.inner.client;
        let labels = match client.container_status(id).await {
            Ok(status) => status.labels,
            Err(e) if e.is_not_found() => match client.pod_sandbox_status(id).await {
                Ok(status) => status.labels,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => {
                    return Err(cri_error("RuntimeUnavailable", format_args!("reading sandbox {id}"), &e));
                }
            },
            Err(e) => {
                return Err(cri_error("RuntimeUnavailable", format_args!("reading container {id}"), &e));
            }
        };
        Ok(self.owns(&labels).then(|| labels.get(labels::POD_UID).cloned()).flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_paths_must_stay_inside_the_root() {
        let root = Path::new("/var/log/pods");
        assert!(is_inside(Path::new("/var/log/pods/ns_p_u/c/0.log"), root));
        assert!(!is_inside(Path::new("/var/log/pods"), root));
        assert!(!is_inside(Path::new("/var/log/pods/../../etc/passwd"), root));
        assert!(!is_inside(Path::new("/var/log/podsX/a"), root));
        assert!(!is_inside(Path::new("var/log/pods/a"), root));
    }

    #[test]
    fn config_builders() {
        let c = CriPodRuntimeConfig::default();
        assert_eq!(c.pod_log_root, Path::new("/var/log/pods"));
        assert_eq!(c.resolv_conf.as_deref(), Some(Path::new("/etc/resolv.conf")));
        assert_eq!(c.cgroup_root, None);
        assert_eq!(c.with_cgroup_root(Some(String::new())).cgroup_root, None);
        assert_eq!(
            CriPodRuntimeConfig::default().with_cgroup_root(Some("/".into())).cgroup_root.as_deref(),
            Some("/")
        );
    }

    #[test]
    fn cgroup_trees_are_removed_bottom_up_when_empty() {
        let base = std::env::temp_dir().join(format!("nodelet-cgroup-test-{}", fastrand::u64(..)));
        let hierarchy = base.join("memory");
        let pod = hierarchy.join("nodelet/poduid");
        let nested = pod.join("sandbox");
        let result =
            std::fs::create_dir_all(&nested).and_then(|()| std::fs::write(pod.join("memory.limit"), "1"));
        assert!(result.is_ok(), "{result:?}");
        // A regular file in the pod directory keeps it (as tasks keep a cgroup): only the empty child goes.
        assert_eq!(remove_cgroup_everywhere(&base, "/nodelet/poduid"), 1);
        assert!(!nested.exists() && pod.exists());
        let _ = std::fs::remove_file(pod.join("memory.limit"));
        assert_eq!(remove_cgroup_everywhere(&base, "/nodelet/poduid"), 1);
        assert!(!pod.exists() && hierarchy.join("nodelet").exists());
        assert_eq!(remove_cgroup_everywhere(&base, "/nodelet/poduid"), 0, "absence is fine");
        let _ = std::fs::remove_dir_all(&base);
    }
}

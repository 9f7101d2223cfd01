//! The extension API: a crate outside nodelet adds its own reconcilers to the node, and the node adds its
//! own pairs the same way.
//!
//! An [`Extension`] is registered with [`NodeBuilder::with_extension`](super::NodeBuilder::with_extension).
//! After the standard pairs have started, the daemon calls [`Extension::start`] with an
//! [`ExtensionContext`]: read-only [`Store`]s of the node's pods (desired and actual), their sandboxes,
//! the admission and eviction verdicts, volumes (desired and actual), its pressure conditions, the node's
//! stats ([`StatsProvider`]), the shared engine [`Metrics`] (give the engine its own name and its
//! series carry it as their `reconciler` label), the `/metrics` registry for its own series (each type of
//! metrics made once per registry through [`ExtensionContext::metrics`]), the [`Supervisor`] to spawn its
//! tasks on, the shutdown token, the container runtime's CRI client, the node's event log ([`NodeEvents`]), its
//! wall clock ([`Clock`]) and the list of node-level [`Reclaimer`]s the eviction pair tries under disk
//! pressure ([`Reclaimers`]).
//!
//! nodelet's own pairs are [`Extension`]s too (`super::builtin`): the claim pair, the volume pair, the
//! sandbox pair, the pod pair, the image pair (image garbage collection) and the eviction pair (with the
//! verdict populator). The daemon first makes every standard pair's stores (an engine's actual store
//! exists before the engine is built), builds the [`ExtensionContext`] from them, then starts each of its
//! pairs through [`Extension::start`] with that context, in that order (the eviction pair tries the
//! reclaimers the pod pair and the image pair add), before the third parties' extensions.
//!
//! Its status: [`Extension::start`] may return a [`StatusTable`]; the main and read-only ports serve it
//! as a `meta.k8s.io/v1` `Table` on `/extensions/{name}`, and `nodelet get {name}` prints it like the
//! other `get` tables. `docs/extensions.md` walks through writing one.

use std::path::Path;
use std::sync::Arc;

use nodelet_resources::common::clock::Clock;
use nodelet_resources::common::events::NodeEvents;
use nodelet_resources::eviction::status::PressureView;
use nodelet_resources::model::actual::{PodActual, PodSandboxes};
use nodelet_resources::model::pod::{DesiredPod, PodUid};
#[cfg(doc)]
use nodelet_resources::model::pressure::Reclaimer;
use nodelet_resources::model::pressure::Reclaimers;
use nodelet_resources::model::verdict::Verdict;
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeKey};
use nodelet_stats::StatsProvider;
use reconcile_engine::{CancellationToken, Metrics, Store, WallClock};

use super::supervisor::Supervisor;

/// Any error an extension returns from [`Extension::start`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A crate's addition to the node: started once, after the standard pairs, before the servers (nodelet's
/// own pairs are extensions too, started the same way, each at its place in the node's start order).
pub trait Extension: Send + 'static {
    /// Its name: a lowercase DNS label (`prepull`). The name of `/extensions/{name}` and `nodelet get
    /// {name}`; a good default for its engine's `reconciler` label.
    fn name(&self) -> &str;

    /// Starts its engine(s) and tasks on `ctx.supervisor()`; returns its status table, if it has one.
    /// An error stops the daemon before it serves (a broken extension is not half-started).
    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError>;
}

/// An extension's status as a table (crate `nodelet-server`, which serves it on `/extensions/{name}`).
pub use nodelet_server::StatusTable;
/// The started extensions' status tables, by name.
pub(crate) use nodelet_server::StatusTables;

/// What an extension reads and uses of the node.
#[derive(Clone)]
pub struct ExtensionContext {
    pub(crate) node_name: String,
    pub(crate) root_dir: std::path::PathBuf,
    pub(crate) pods_desired: Store<PodUid, DesiredPod>,
    pub(crate) pods_actual: Store<PodUid, PodActual>,
    pub(crate) sandboxes_actual: Store<PodUid, PodSandboxes>,
    pub(crate) verdicts: Store<PodUid, Verdict>,
    pub(crate) volumes_desired: Store<VolumeKey, DesiredVolume>,
    pub(crate) volumes_actual: Store<VolumeKey, VolumeActual>,
    pub(crate) pressure: PressureView,
    pub(crate) stats: StatsProvider,
    pub(crate) engine_metrics: Metrics,
    pub(crate) metrics: super::MetricFamilies,
    pub(crate) supervisor: Supervisor,
    pub(crate) cri: nodelet_cri::CriClient,
    pub(crate) events: NodeEvents,
    pub(crate) clock: Clock,
    pub(crate) reclaimers: Reclaimers,
}

impl std::fmt::Debug for ExtensionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtensionContext")
            .field("node_name", &self.node_name)
            .field("root_dir", &self.root_dir)
            .field("supervisor", &self.supervisor)
            .field("reclaimers", &self.reclaimers)
            .finish_non_exhaustive()
    }
}

impl ExtensionContext {
    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }
    /// nodelet's root directory (`--root-dir`); an extension keeps its state under `<root>/<name>`.
    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }
    /// The pods the node should run, by UID (read-only).
    pub fn pods_desired(&self) -> Store<PodUid, DesiredPod> {
        self.pods_desired.clone()
    }
    /// The pods as the runtime runs them, by UID (read-only).
    pub fn pods_actual(&self) -> Store<PodUid, PodActual> {
        self.pods_actual.clone()
    }
    /// The pods' sandboxes as the runtime runs them, by pod UID (read-only; the sandbox pair's actual
    /// store).
    pub fn sandboxes_actual(&self) -> Store<PodUid, PodSandboxes> {
        self.sandboxes_actual.clone()
    }
    /// The admission and eviction verdicts of the pods, by UID (read-only; the verdict populator, which
    /// the eviction pair runs, writes them; the pod pair stops a pod whose verdict says so).
    pub fn verdicts(&self) -> Store<PodUid, Verdict> {
        self.verdicts.clone()
    }
    /// The volumes the pods need (read-only).
    pub fn volumes_desired(&self) -> Store<VolumeKey, DesiredVolume> {
        self.volumes_desired.clone()
    }
    /// The volumes as set up on the node (read-only).
    pub fn volumes_actual(&self) -> Store<VolumeKey, VolumeActual> {
        self.volumes_actual.clone()
    }
    /// The node's pressure conditions (MemoryPressure, DiskPressure, PIDPressure).
    pub fn pressure(&self) -> PressureView {
        self.pressure.clone()
    }
    /// The node's stats: what `/stats/summary` serves, gathered on demand or from the newest
    /// housekeeping (the eviction pair's signals come from here).
    pub fn stats(&self) -> &StatsProvider {
        &self.stats
    }
    /// The engine metrics every engine reports to: pass them to
    /// [`EngineBuilder::metrics`](reconcile_engine::EngineBuilder::metrics); the engine's name is its
    /// `reconciler` label on `/metrics`.
    pub fn engine_metrics(&self) -> &Metrics {
        &self.engine_metrics
    }
    /// The `/metrics` registry, for the extension's own series (see also [`metrics`](Self::metrics)).
    pub fn registry(&self) -> &prometheus::Registry {
        self.metrics.registry()
    }
    /// The extension's metrics of type `T`: made by `make` in the `/metrics` [`registry`](Self::registry)
    /// the first time, the same metrics every later time (so `make` registers its families once: hollow
    /// nodes of one process share their registry, see [`MetricFamilies`](super::MetricFamilies)). An error
    /// of `make` is returned; the next call tries again.
    pub fn metrics<T, F>(&self, make: F) -> Result<T, prometheus::Error>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce(&prometheus::Registry) -> Result<T, prometheus::Error>,
    {
        self.metrics.get(make)
    }
    /// Spawns and watches the extension's tasks.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }
    /// Cancelled when the daemon stops.
    pub fn shutdown(&self) -> &CancellationToken {
        self.supervisor.shutdown()
    }
    /// The container runtime's CRI client (its calls count in `kubelet_runtime_operations_*`).
    pub fn cri(&self) -> &nodelet_cri::CriClient {
        &self.cri
    }
    /// The node's event log (served on `/api/v1/events`, posted to the API server in cluster mode): the
    /// eviction pair and image garbage collection record theirs here.
    pub fn events(&self) -> &NodeEvents {
        &self.events
    }
    /// The node's wall clock (nanoseconds since the Unix epoch), for the timestamps of events and
    /// records; the one the standard pairs use.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
    /// The node's wall clock as an engine's: pass it to
    /// [`EngineBuilder::wall_clock`](reconcile_engine::EngineBuilder::wall_clock) so a reconciler reads
    /// ([`View::wall`](reconcile_engine::View::wall)) the clock that stamped what it compares.
    pub fn wall_clock(&self) -> WallClock {
        nodelet_resources::common::clock::wall_clock(&self.clock)
    }
    /// The node-level reclaimers the eviction pair tries, in the order added, before it evicts pods for a
    /// disk signal (container garbage collection, then image garbage collection, then the extensions'):
    /// [`Reclaimers::add`] one that frees disk space. The eviction pair reads the list whenever it plans a
    /// reclaim and at every reclaim, so a reclaimer added by an extension, which starts after the eviction
    /// pair, is planned for and tried too.
    pub fn reclaimers(&self) -> &Reclaimers {
        &self.reclaimers
    }
}

/// Why a name cannot be an extension's name (checked when [`Node`](super::Node) is built).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is not a lowercase RFC 1123 label.
    #[error("extension name {0:?} is not a lowercase DNS label")]
    NotLabel(String),
    /// The name is one of `nodelet get`'s own resource types.
    #[error("extension name {0:?} is one of nodelet get's own resource types")]
    OwnType(String),
    /// Two extensions have this name.
    #[error("two extensions are named {0:?}")]
    Duplicate(String),
}

/// Whether `name` can be an extension's name: a lowercase RFC 1123 label, not one of `get`'s own types.
pub(crate) fn check_name(name: &str) -> Result<(), NameError> {
    let label = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !label {
        return Err(NameError::NotLabel(name.to_owned()));
    }
    if nodelet_shared::GET_TYPES.contains(&name) {
        return Err(NameError::OwnType(name.to_owned()));
    }
    Ok(())
}

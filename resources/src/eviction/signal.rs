//! Eviction signals, thresholds and what is observed of them.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::local_storage::LocalStorage;

/// A node-pressure eviction signal, with the kubelet's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `memory.available`: capacity − working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable − the pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes of the filesystem holding the root directory and logs.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes of the runtime's image filesystem.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `containerfs.available`: the writable layers' filesystem (nodefs or imagefs here).
    ContainerFsAvailable,
    /// `containerfs.inodesFree`.
    ContainerFsInodesFree,
    /// `pid.available`: the process ID limit − processes.
    PidAvailable,
}

impl Signal {
    /// Every signal.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The kubelet's name (`memory.available`).
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The signal named `name`, if the kubelet knows it.
    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The node condition the signal reports through.
    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Condition::MemoryPressure,
            Signal::PidAvailable => Condition::PidPressure,
            _ => Condition::DiskPressure,
        }
    }

    /// The resource the signal measures, as the kubelet names it in eviction messages (`memory`,
    /// `ephemeral-storage`, `inodes`, `pids`).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                "ephemeral-storage"
            }
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::ContainerFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// Whether the signal measures a filesystem (reclaimable by garbage collection first).
    pub fn is_disk(self) -> bool {
        self.condition() == Condition::DiskPressure
    }

    /// The order in which thresholds are handled when several are met: memory first, then
    /// disk, then PIDs (the kubelet's `byEvictionPriority`).
    pub(crate) fn priority(self) -> u8 {
        match self.condition() {
            Condition::MemoryPressure => 0,
            Condition::DiskPressure => 1,
            Condition::PidPressure => 2,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node condition reporting pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Condition {
    /// `MemoryPressure`.
    MemoryPressure,
    /// `DiskPressure`.
    DiskPressure,
    /// `PIDPressure`.
    PidPressure,
}

impl Condition {
    /// Every condition, in the order the kubelet lists them.
    pub const ALL: [Condition; 3] =
        [Condition::MemoryPressure, Condition::DiskPressure, Condition::PidPressure];

    /// The condition type (`MemoryPressure`, `DiskPressure`, `PIDPressure`).
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PidPressure => "PIDPressure",
        }
    }

    /// The kubelet's (reason, message) for the condition when it is `True` or `False`.
    pub fn reason_and_message(self, pressure: bool) -> (&'static str, &'static str) {
        match (self, pressure) {
            (Condition::MemoryPressure, true) => {
                ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available")
            }
            (Condition::MemoryPressure, false) => {
                ("KubeletHasSufficientMemory", "kubelet has sufficient memory available")
            }
            (Condition::DiskPressure, true) => ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            (Condition::DiskPressure, false) => ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            (Condition::PidPressure, true) => {
                ("KubeletHasInsufficientPID", "kubelet has insufficient PID available")
            }
            (Condition::PidPressure, false) => {
                ("KubeletHasSufficientPID", "kubelet has sufficient PID available")
            }
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A threshold amount: absolute (bytes, inodes, PIDs) or a percentage of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// An absolute amount.
    Quantity(u64),
    /// A percentage of the capacity, 0–100.
    Percentage(f64),
}

impl Amount {
    /// The absolute amount for a resource of `capacity`.
    pub fn resolve(self, capacity: u64) -> u64 {
        match self {
            Amount::Quantity(q) => q,
            Amount::Percentage(p) => {
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss
                )]
                let v = (capacity as f64 * p.clamp(0.0, 100.0) / 100.0).ceil() as u64;
                v
            }
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Quantity(q) => write!(f, "{q}"),
            Amount::Percentage(p) => write!(f, "{p}%"),
        }
    }
}

/// One eviction threshold: `signal < value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// Met when the signal's available amount falls below this.
    pub value: Amount,
    /// `None` for a hard threshold; for a soft one, how long it must stay met before pods are
    /// evicted (`evictionSoftGracePeriod`).
    pub grace_period: Option<Duration>,
    /// `evictionMinimumReclaim`: once met, the threshold stays met until the signal is this much
    /// above the threshold.
    pub min_reclaim: Option<Amount>,
}

impl Threshold {
    /// A hard threshold.
    pub fn hard(signal: Signal, value: Amount) -> Self {
        Self { signal, value, grace_period: None, min_reclaim: None }
    }

    /// A soft threshold with its grace period.
    pub fn soft(signal: Signal, value: Amount, grace_period: Duration) -> Self {
        Self { signal, value, grace_period: Some(grace_period), min_reclaim: None }
    }

    /// With a minimum reclaim.
    pub fn with_min_reclaim(mut self, min_reclaim: Amount) -> Self {
        self.min_reclaim = Some(min_reclaim);
        self
    }

    /// Whether this is a hard threshold.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_none()
    }

    /// The amount below which the threshold is met, for a resource of `capacity`; with
    /// `reclaiming`, raised by the minimum reclaim.
    pub fn limit(&self, capacity: u64, reclaiming: bool) -> u64 {
        let base = self.value.resolve(capacity);
        match (reclaiming, self.min_reclaim) {
            (true, Some(m)) => base.saturating_add(m.resolve(capacity)),
            _ => base,
        }
    }
}

/// What was observed of one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available amount (bytes, inodes, PIDs).
    pub available: u64,
    /// Capacity of the resource.
    pub capacity: u64,
}

/// The signals observed in one pass; a signal that could not be measured is absent.
pub type Observations = BTreeMap<Signal, Observation>;

/// What one pod uses, for ranking pods under pressure. `None` when the stats are missing (the
/// kubelet ranks such pods first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// Memory working set, bytes.
    pub memory: Option<u64>,
    /// Local disk usage (writable layers, logs, local volumes), bytes.
    pub disk: Option<u64>,
    /// Local inodes used.
    pub inodes: Option<u64>,
    /// Processes.
    pub processes: Option<u64>,
}

/// Why the signals could not be read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SignalError(pub String);

/// A boxed future (the traits here are object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where the eviction manager reads the node's signals and the pods' usage: the node's stats
/// provider implements it.
pub trait SignalSource: Send + Sync + 'static {
    /// The node-level signals now.
    fn observe(&self) -> BoxFuture<'_, Result<Observations, SignalError>>;

    /// Each pod's usage now, by pod UID (pods without stats may be missing).
    fn pod_usage(&self) -> BoxFuture<'_, Result<BTreeMap<String, PodUsage>, SignalError>>;

    /// The newest measurement of the pods' local ephemeral storage, for local storage capacity
    /// isolation (taken in the background; pods without limits may be missing). The default
    /// measures nothing.
    fn local_storage(&self) -> BoxFuture<'_, Result<LocalStorage, SignalError>> {
        Box::pin(async { Ok(LocalStorage::default()) })
    }
}

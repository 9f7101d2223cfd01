//! Node pressure as the pairs share it: the eviction signals ([`Signal`]) and the node conditions they report
//! through ([`Condition`]), and node-level reclaim ([`Reclaimer`], collected in [`Reclaimers`]): what the
//! eviction pair asks of the image and container garbage collectors before it evicts pods for a disk signal.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;

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

/// Node-level reclaim (image garbage collection, container garbage collection), tried before
/// pods are evicted for a disk signal.
pub trait Reclaimer: Send + Sync + 'static {
    /// Its name, for logs.
    fn name(&self) -> &'static str;

    /// Frees what it can towards `bytes` for `signal`; returns the bytes freed.
    fn reclaim(&self, signal: Signal, bytes: u64) -> BoxFuture<'_, Result<u64, ReclaimError>>;
}

/// The node-level reclaimers the eviction pair tries for a disk signal, in the order added: one list shared
/// by whoever adds to it (the container GC, the image pair, extensions) and the eviction pair's driver,
/// which reads it at every reclaim, so a reclaimer added after the driver was built is tried too. Cheap to
/// clone (the clones share the list).
#[derive(Clone, Default)]
pub struct Reclaimers(Arc<Mutex<Vec<Arc<dyn Reclaimer>>>>);

impl fmt::Debug for Reclaimers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.list().iter().map(|r| r.name())).finish()
    }
}

impl Reclaimers {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `reclaimer`, tried after those added before it.
    pub fn add(&self, reclaimer: Arc<dyn Reclaimer>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(reclaimer);
    }

    /// The reclaimers now, in the order added.
    pub fn list(&self) -> Vec<Arc<dyn Reclaimer>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether none was added.
    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }
}

/// Why node-level reclaim failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReclaimError {
    /// The collector that frees the space is not running.
    #[error("{0} is not running")]
    Stopped(&'static str),
    /// The collector did not answer in time.
    #[error("{collector} did not answer within {timeout:?}")]
    Timeout {
        /// The collector.
        collector: &'static str,
        /// How long it was waited for.
        timeout: Duration,
    },
}

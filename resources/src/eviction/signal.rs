//! Eviction signals, thresholds and what is observed of them.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::local_storage::LocalStorage;
use crate::model::pressure::Signal;

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

/// Where the eviction pair reads the node's signals and the pods' usage: the node's stats
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

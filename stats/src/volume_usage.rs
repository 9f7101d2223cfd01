//! The pods' volume usage, measured in the background every `volumeStatsAggPeriod` (the kubelet's
//! volume stats calculator, default 1 m) and kept as state: `/stats/summary` (its `volume` entries
//! and the volumes' part of `ephemeral-storage`) and the local storage check of the eviction pair
//! ([`local_storage`](super::local_storage)) read it; neither walks a volume per request.
//!
//! Every volume nodelet set up for a pod is measured (hostPath volumes are the host's own and are
//! not), a tmpfs too (its own filesystem: the walk starts at its root). The walks
//! ([`nodelet_host::usage`]) never follow a symlink, never cross a mount, and share a budget of
//! [`local_storage::ENTRY_BUDGET`](super::local_storage::ENTRY_BUDGET) entries per round; volumes are taken in
//! turn from a rotating start so that a budget spent on one volume's tree reaches the others next
//! time. A volume cut short is kept as a lower bound ([`VolumeUsage::complete`] is false).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nodelet_host::usage::{Budget, End, measure};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::desired::{VolumeKey, split_key};
use tokio_util::sync::CancellationToken;

use super::local_storage::ENTRY_BUDGET;
use super::{StatsError, StatsProvider, every};

/// One volume's usage as a walk counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeUsage {
    /// Bytes of allocated blocks.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
    /// Whether the whole tree was counted (else `bytes` and `inodes` are lower bounds).
    pub complete: bool,
    /// When it was measured (the provider's clock, ns).
    pub time: i64,
}

/// The newest measurement of the pods' volumes, by volume key (`<pod uid>/<volume name>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeUsages {
    /// Each measured volume.
    pub volumes: HashMap<VolumeKey, VolumeUsage>,
}

impl StatsProvider {
    /// Measures the pods' volumes now and every `period` (`volumeStatsAggPeriod`) until `shutdown`.
    pub async fn measure_volumes_every(self, period: Duration, shutdown: CancellationToken) {
        every(period, &shutdown, || async {
            if let Err(e) = self.measure_volumes().await {
                tracing::debug!(error = %e, "cannot measure the pods' volumes");
            }
        })
        .await;
    }

    /// The newest volume measurement (empty before the first).
    pub(crate) fn volume_usage(&self) -> Arc<VolumeUsages> {
        self.inner.volume_usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Measures every pod volume (not hostPath) and keeps the result as the newest. A volume whose
    /// walk fails keeps its previous value; a volume that is gone is dropped.
    pub async fn measure_volumes(&self) -> Result<Arc<VolumeUsages>, StatsError> {
        let i = &self.inner;
        let mut wanted: Vec<(VolumeKey, PathBuf)> = i
            .volumes
            .as_ref()
            .map(|v| v.entries())
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, v)| split_key(key).is_some() && measured_plugin(v.plugin) && v.path.is_absolute())
            .map(|(key, v)| (key, v.path.clone()))
            .collect();
        if !wanted.is_empty() {
            let start = i.volume_cursor.fetch_add(1, Ordering::Relaxed) % wanted.len();
            wanted.rotate_left(start);
        }
        let previous = self.volume_usage();
        let clock = i.clock.clone();
        let measured = tokio::task::spawn_blocking(move || {
            let mut budget = Budget::new(ENTRY_BUDGET);
            let mut volumes = HashMap::with_capacity(wanted.len());
            for (key, path) in wanted {
                let kept = previous.volumes.get(&key).copied();
                match walk(&path, &mut budget, clock()) {
                    Ok(Some(u)) => {
                        volumes.insert(key, u);
                    }
                    Ok(None) => {}
                    Err(()) => {
                        if let Some(kept) = kept {
                            volumes.insert(key, kept);
                        }
                    }
                }
            }
            VolumeUsages { volumes }
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?;
        let measured = Arc::new(measured);
        *i.volume_usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = measured.clone();
        Ok(measured)
    }

    /// Keeps fresh measurements of some volumes (taken outside the round, complete ones only) in the
    /// newest measurement.
    pub(crate) fn update_volume_usage(&self, fresh: impl IntoIterator<Item = (VolumeKey, VolumeUsage)>) {
        let mut newest = self.inner.volume_usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut updated = VolumeUsages::clone(&newest);
        let mut changed = false;
        for (key, usage) in fresh.into_iter().filter(|(_, u)| u.complete) {
            updated.volumes.insert(key, usage);
            changed = true;
        }
        if changed {
            *newest = Arc::new(updated);
        }
    }
}

/// Whether volumes of `plugin` are measured: all that nodelet sets up for the pod (a hostPath
/// volume is the host's own directory).
fn measured_plugin(plugin: Plugin) -> bool {
    plugin != Plugin::HostPath
}

/// One volume's usage (blocking): `Ok(None)` when it is gone, `Err` when it cannot be measured.
fn walk(path: &std::path::Path, budget: &mut Budget, now: i64) -> Result<Option<VolumeUsage>, ()> {
    match measure(path, None, budget) {
        Ok(m) => Ok(m.map(|m| VolumeUsage {
            bytes: m.usage.bytes,
            inodes: m.usage.inodes,
            complete: m.end == End::Complete,
            time: now,
        })),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "cannot measure a volume");
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_counts_the_tree_and_says_when_the_budget_cut_it_short() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), vec![1_u8; 8192])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let mut budget = Budget::new(1000);
        let full = walk(dir.path(), &mut budget, 7)
            .unwrap_or_else(|()| panic!("walk"))
            .unwrap_or_else(|| panic!("the directory exists"));
        assert!(full.complete);
        assert!(full.bytes >= 10 * 8192, "{full:?}");
        assert_eq!(full.inodes, 11);
        assert_eq!(full.time, 7);
        let mut small = Budget::new(3);
        let cut = walk(dir.path(), &mut small, 8)
            .unwrap_or_else(|()| panic!("walk"))
            .unwrap_or_else(|| panic!("the directory exists"));
        assert!(!cut.complete);
        assert!(cut.bytes < full.bytes, "{cut:?} < {full:?}");
        assert_eq!(walk(&dir.path().join("gone"), &mut budget, 9), Ok(None));
    }

    #[test]
    fn host_paths_are_not_measured() {
        assert!(!measured_plugin(Plugin::HostPath));
        for p in Plugin::ALL.into_iter().filter(|p| *p != Plugin::HostPath) {
            assert!(measured_plugin(p), "{p:?}");
        }
    }
}

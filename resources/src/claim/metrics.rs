//! Claim metrics: the PV controller's binding counts, and the kubelet's
//! `kubelet_volume_stats_*` gauges for claim-backed volumes (fed by whoever mounts them, through
//! [`ClaimMetrics::set_volume_stats`] and [`ClaimMetrics::retain_volume_stats`]).

use std::collections::{BTreeMap, BTreeSet};

use prometheus::{IntGaugeVec, Opts, Registry};
use reconcile_engine::Store;

use super::actual::{ClaimActual, ClaimPhase, VolumePhase};
use super::desired::{ClaimDesired, ClaimKey};

/// Usage of a mounted filesystem (as `statvfs` reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStats {
    /// Size in bytes.
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// Inodes in use.
    pub inodes_used: u64,
}

/// The claim metrics.
#[derive(Debug, Clone)]
pub struct ClaimMetrics {
    /// `pv_collector_bound_pv_count{storage_class}`.
    pub bound_pv: IntGaugeVec,
    /// `pv_collector_unbound_pv_count{storage_class}`.
    pub unbound_pv: IntGaugeVec,
    /// `pv_collector_bound_pvc_count{namespace}`.
    pub bound_pvc: IntGaugeVec,
    /// `pv_collector_unbound_pvc_count{namespace}`.
    pub unbound_pvc: IntGaugeVec,
    /// `kubelet_volume_stats_capacity_bytes{namespace,persistentvolumeclaim}`.
    pub capacity_bytes: IntGaugeVec,
    /// `kubelet_volume_stats_available_bytes{namespace,persistentvolumeclaim}`.
    pub available_bytes: IntGaugeVec,
    /// `kubelet_volume_stats_used_bytes{namespace,persistentvolumeclaim}`.
    pub used_bytes: IntGaugeVec,
    /// `kubelet_volume_stats_inodes{namespace,persistentvolumeclaim}`.
    pub inodes: IntGaugeVec,
    /// `kubelet_volume_stats_inodes_free{namespace,persistentvolumeclaim}`.
    pub inodes_free: IntGaugeVec,
    /// `kubelet_volume_stats_inodes_used{namespace,persistentvolumeclaim}`.
    pub inodes_used: IntGaugeVec,
    /// `kubelet_volume_stats_health_status_abnormal{namespace,persistentvolumeclaim}`: 1 when the
    /// volume's CSI driver reports it abnormal, 0 when it reports it healthy (absent when the
    /// driver does not report volume conditions).
    pub health_abnormal: IntGaugeVec,
    stats_keys: std::sync::Arc<std::sync::Mutex<BTreeSet<(String, String)>>>,
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, prometheus::Error> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl ClaimMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let stats = ["namespace", "persistentvolumeclaim"];
        let m = Self {
            bound_pv: gauge(
                "pv_collector_bound_pv_count",
                "Gauge measuring number of persistent volume currently bound",
                &["storage_class"],
            )?,
            unbound_pv: gauge(
                "pv_collector_unbound_pv_count",
                "Gauge measuring number of persistent volume currently unbound",
                &["storage_class"],
            )?,
            bound_pvc: gauge(
                "pv_collector_bound_pvc_count",
                "Gauge measuring number of persistent volume claim currently bound",
                &["namespace"],
            )?,
            unbound_pvc: gauge(
                "pv_collector_unbound_pvc_count",
                "Gauge measuring number of persistent volume claim currently unbound",
                &["namespace"],
            )?,
            capacity_bytes: gauge(
                "kubelet_volume_stats_capacity_bytes",
                "Capacity in bytes of the volume",
                &stats,
            )?,
            available_bytes: gauge(
                "kubelet_volume_stats_available_bytes",
                "Number of available bytes in the volume",
                &stats,
            )?,
            used_bytes: gauge(
                "kubelet_volume_stats_used_bytes",
                "Number of used bytes in the volume",
                &stats,
            )?,
            inodes: gauge("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", &stats)?,
            inodes_free: gauge(
                "kubelet_volume_stats_inodes_free",
                "Number of free inodes in the volume",
                &stats,
            )?,
            inodes_used: gauge(
                "kubelet_volume_stats_inodes_used",
                "Number of used inodes in the volume",
                &stats,
            )?,
            health_abnormal: gauge(
                "kubelet_volume_stats_health_status_abnormal",
                "Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy and 0 indicates volume is healthy",
                &stats,
            )?,
            stats_keys: Default::default(),
        };
        for g in [
            &m.bound_pv,
            &m.unbound_pv,
            &m.bound_pvc,
            &m.unbound_pvc,
            &m.capacity_bytes,
            &m.available_bytes,
            &m.used_bytes,
            &m.inodes,
            &m.inodes_free,
            &m.inodes_used,
            &m.health_abnormal,
        ] {
            registry.register(Box::new(g.clone()))?;
        }
        Ok(m)
    }

    /// Metrics registered nowhere (for tests).
    pub fn unregistered() -> Self {
        Self::new(&Registry::new()).unwrap_or_else(|e| unreachable!("fresh registry rejected metrics: {e}"))
    }

    /// Sets the binding counts from the stores (call before a scrape).
    pub fn refresh(&self, desired: &Store<ClaimKey, ClaimDesired>, actual: &Store<ClaimKey, ClaimActual>) {
        let mut pv: BTreeMap<(String, bool), i64> = BTreeMap::new();
        let mut pvc: BTreeMap<(String, bool), i64> = BTreeMap::new();
        desired.for_each(|key, d| match d {
            ClaimDesired::Volume(v) => {
                let bound = actual
                    .get(key)
                    .is_some_and(|a| a.as_volume().is_some_and(|a| a.phase == VolumePhase::Bound));
                *pv.entry((v.class().to_owned(), bound)).or_default() += 1;
            }
            ClaimDesired::Claim(c) => {
                let bound = actual.get(key).is_some_and(|a| {
                    a.as_claim().is_some_and(|a| a.uid == c.uid && a.phase == ClaimPhase::Bound)
                });
                *pvc.entry((c.namespace().to_owned(), bound)).or_default() += 1;
            }
            ClaimDesired::Class(_) => {}
        });
        for g in [&self.bound_pv, &self.unbound_pv, &self.bound_pvc, &self.unbound_pvc] {
            g.reset();
        }
        for ((class, bound), n) in pv {
            let g = if bound { &self.bound_pv } else { &self.unbound_pv };
            g.with_label_values(&[class.as_str()]).set(n);
        }
        for ((ns, bound), n) in pvc {
            let g = if bound { &self.bound_pvc } else { &self.unbound_pvc };
            g.with_label_values(&[ns.as_str()]).set(n);
        }
    }

    /// Sets `kubelet_volume_stats_*` of claim `namespace/claim` (a mounted claim-backed volume).
    pub fn set_volume_stats(&self, namespace: &str, claim: &str, stats: &FsStats) {
        let labels = [namespace, claim];
        self.capacity_bytes.with_label_values(&labels).set(clamp(stats.capacity_bytes));
        self.available_bytes.with_label_values(&labels).set(clamp(stats.available_bytes));
        self.used_bytes.with_label_values(&labels).set(clamp(stats.used_bytes));
        self.inodes.with_label_values(&labels).set(clamp(stats.inodes));
        self.inodes_free.with_label_values(&labels).set(clamp(stats.inodes_free));
        self.inodes_used.with_label_values(&labels).set(clamp(stats.inodes_used));
        if let Ok(mut keys) = self.stats_keys.lock() {
            keys.insert((namespace.to_owned(), claim.to_owned()));
        }
    }

    /// Sets `kubelet_volume_stats_health_status_abnormal` of claim `namespace/claim` (call after
    /// [`set_volume_stats`](Self::set_volume_stats), which keeps the series' key).
    pub fn set_volume_health(&self, namespace: &str, claim: &str, abnormal: bool) {
        self.health_abnormal.with_label_values(&[namespace, claim]).set(i64::from(abnormal));
    }

    /// Drops the `kubelet_volume_stats_*` series of every claim not in `mounted` (claims no
    /// longer mounted by any pod).
    pub fn retain_volume_stats(&self, mounted: &BTreeSet<(String, String)>) {
        let Ok(mut keys) = self.stats_keys.lock() else { return };
        keys.retain(|(ns, claim)| {
            if mounted.contains(&(ns.clone(), claim.clone())) {
                return true;
            }
            let labels = [ns.as_str(), claim.as_str()];
            for g in [
                &self.capacity_bytes,
                &self.available_bytes,
                &self.used_bytes,
                &self.inodes,
                &self.inodes_free,
                &self.inodes_used,
                &self.health_abnormal,
            ] {
                let _ = g.remove_label_values(&labels);
            }
            false
        });
    }
}

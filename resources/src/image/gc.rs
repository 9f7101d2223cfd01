//! The image garbage collector: every period it refreshes the image pair and removes what the
//! plan says; the eviction manager calls it as a [`Reclaimer`] under disk pressure.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use reconcile_engine::Store;
use tracing::{debug, info, warn};

use super::driver::{ImageGcDriver, ImageGcError};
use super::plan::{GcPlan, ImageGcPolicy, PlanError, Removal, plan, plan_reclaim};
use super::state::{InUse, Inventory};
use crate::eviction::events::{Involved, NodeEvents};
use crate::eviction::manager::Reclaimer;
use crate::eviction::signal::{BoxFuture, Signal};
use crate::pod::actual::PodActual;
use crate::pod::desired::{DesiredPod, PodUid};
use crate::pod::reconciler::Clock;

/// `kubelet_image_garbage_collected_total{reason}`.
#[derive(Debug, Clone)]
pub struct ImageGcMetrics {
    /// Images removed, by reason (`age`, `space`).
    pub collected: IntCounterVec,
}

impl ImageGcMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let collected = IntCounterVec::new(
            Opts::new(
                "kubelet_image_garbage_collected_total",
                "Total number of images garbage collected by the kubelet, whether through disk usage or image \
                 age.",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(collected.clone()))?;
        Ok(Self { collected })
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GcReport {
    /// The plan.
    pub plan: GcPlan,
    /// IDs of the images removed.
    pub removed: Vec<String>,
    /// Bytes freed.
    pub freed: u64,
}

/// The image garbage collector over the pod stores and a runtime driver.
pub struct ImageGc {
    policy: ImageGcPolicy,
    driver: Arc<dyn ImageGcDriver>,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    inventory: Mutex<Inventory>,
    metrics: ImageGcMetrics,
    events: NodeEvents,
    clock: Clock,
    /// Images never removed (the sandbox image), as references.
    pinned: Vec<String>,
    /// One pass at a time (the periodic one, or reclaim for the eviction manager).
    running: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ImageGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGc").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl ImageGc {
    /// A collector with `policy`.
    pub fn new(
        policy: ImageGcPolicy,
        driver: Arc<dyn ImageGcDriver>,
        desired: Store<PodUid, DesiredPod>,
        actual: Store<PodUid, PodActual>,
        metrics: ImageGcMetrics,
        events: NodeEvents,
        clock: Clock,
    ) -> Self {
        Self {
            policy,
            driver,
            desired,
            actual,
            inventory: Mutex::default(),
            metrics,
            events,
            clock,
            pinned: Vec::new(),
            running: tokio::sync::Mutex::new(()),
        }
    }

    /// Never removes the images `references` name (the sandbox image: it is in use by every pod
    /// sandbox, which CRI does not list as containers, and runtimes do not always pin it).
    pub fn with_pinned(mut self, references: Vec<String>) -> Self {
        self.pinned = references;
        self
    }

    /// The images known now (refreshed by every pass).
    pub fn inventory(&self) -> Inventory {
        self.inventory.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Lists the runtime's images and containers and updates the inventory; returns what is in use.
    async fn refresh(&self) -> Result<InUse, ImageGcError> {
        let (images, containers) = tokio::join!(self.driver.list_images(), self.driver.list_containers());
        let (images, containers) = (images?, containers?);
        let desired = self.desired.entries();
        let actual = self.actual.entries();
        let mut in_use = InUse::compute(
            desired.iter().map(|(_, p)| p.as_ref()),
            actual.iter().map(|(_, a)| a.as_ref()),
            &containers,
        );
        in_use.references.extend(self.pinned.iter().cloned());
        let now = (self.clock)();
        self.inventory.lock().unwrap_or_else(PoisonError::into_inner).update(
            images,
            &containers,
            &in_use,
            now,
        );
        Ok(in_use)
    }

    async fn remove(&self, removals: &[Removal], report: &mut GcReport) {
        for r in removals {
            match self.driver.remove_image(&r.id).await {
                Ok(()) => {
                    info!(image = %r.id, size = r.size, reason = r.reason.as_str(), "removed unused image");
                    self.metrics.collected.with_label_values(&[r.reason.as_str()]).inc();
                    self.inventory.lock().unwrap_or_else(PoisonError::into_inner).images.remove(&r.id);
                    report.removed.push(r.id.clone());
                    report.freed = report.freed.saturating_add(r.size);
                }
                Err(e) => {
                    warn!(image = %r.id, error = %e, "cannot remove image");
                    self.events.record(
                        Involved::Node,
                        "Warning",
                        "ImageGCFailed",
                        format!("failed to remove image {:?}: {e}", r.id),
                        (self.clock)(),
                    );
                }
            }
        }
    }

    /// One periodic pass.
    pub async fn pass(&self) -> Result<GcReport, ImageGcError> {
        let _one = self.running.lock().await;
        let in_use = self.refresh().await?;
        let fs = self.driver.image_fs().await?;
        let now = (self.clock)();
        let planned = {
            let inventory = self.inventory.lock().unwrap_or_else(PoisonError::into_inner);
            plan(&self.policy, &inventory, &in_use, fs, now)
        };
        let planned = match planned {
            Ok(p) => p,
            Err(e @ PlanError::InvalidDiskCapacity) => {
                self.events.record(Involved::Node, "Warning", "InvalidDiskCapacity", e.to_string(), now);
                return Err(ImageGcError(e.to_string()));
            }
        };
        debug!(removals = planned.removals.len(), to_free = planned.to_free, "image GC pass");
        let mut report = GcReport { plan: planned.clone(), ..GcReport::default() };
        self.remove(&planned.removals, &mut report).await;
        if planned.to_free > 0 && report.freed < planned.to_free {
            let eligible: u64 = planned.removals.iter().map(|r| r.size).sum();
            self.events.record(
                Involved::Node,
                "Warning",
                "FreeDiskSpaceFailed",
                format!(
                    "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only \
                     found {eligible} bytes eligible to free.",
                    planned.to_free
                ),
                (self.clock)(),
            );
        }
        Ok(report)
    }

    /// Removes every unused image that may be removed (disk pressure).
    pub async fn reclaim_all(&self) -> Result<GcReport, ImageGcError> {
        let _one = self.running.lock().await;
        let in_use = self.refresh().await?;
        let removals = {
            let inventory = self.inventory.lock().unwrap_or_else(PoisonError::into_inner);
            plan_reclaim(&self.policy, &inventory, &in_use, (self.clock)())
        };
        let mut report = GcReport::default();
        self.remove(&removals, &mut report).await;
        Ok(report)
    }

    /// Runs a pass now and every `period` until `shutdown` completes.
    pub async fn run(self: Arc<Self>, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                r = self.pass() => if let Err(e) = r {
                    warn!(error = %e, "image garbage collection failed");
                },
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(period) => {}
            }
        }
    }
}

/// Image GC as node-level reclaim for the eviction manager.
#[derive(Debug, Clone)]
pub struct ImageReclaimer(pub Arc<ImageGc>);

impl Reclaimer for ImageReclaimer {
    fn name(&self) -> &'static str {
        "image-gc"
    }

    fn reclaim(&self, signal: Signal, _bytes: u64) -> BoxFuture<'_, Result<u64, String>> {
        Box::pin(async move {
            if !signal.is_disk() {
                return Ok(0);
            }
            self.0.reclaim_all().await.map(|r| r.freed).map_err(|e| e.to_string())
        })
    }
}

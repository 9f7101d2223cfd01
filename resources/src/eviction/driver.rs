//! The eviction pair's driver: carries out the steps the
//! [`EvictionReconciler`](super::reconciler::EvictionReconciler) plans.
//!
//! - [`Assess`](EvictionOp::Assess): the pressure conditions go to the node's status
//!   ([`PressureView`]), to admission (a `watch` channel the verdict populator reads), to
//!   `nodelet_node_pressure`, and each change to an event (`NodeHasMemoryPressure`,
//!   `NodeHasSufficientMemory`, ...); a threshold acted on is announced (`EvictionThresholdMet`).
//! - [`Reclaim`](EvictionOp::Reclaim): the node-level [`Reclaimer`]s of its [`Reclaimers`] list in the
//!   order added (on a node: container then image garbage collection, then the extensions'), then the
//!   signals observed again.
//! - [`MeasureUsage`](EvictionOp::MeasureUsage): the pods' usage of now, for ranking.
//! - [`Evict`](EvictionOp::Evict): each pod's eviction is sent to the
//!   [`VerdictPopulator`](super::populator::VerdictPopulator) through an [`EvictionSink`] (its verdict
//!   becomes `Evicted` and the pod pair kills it), counted in `kubelet_evictions_total` and
//!   recorded as an `Evicted` event; then the driver waits, at most the cleanup timeout per pod,
//!   until the pod runs nothing and its other resources (volumes) are released: the kubelet's
//!   `podCleanedUpFunc`, so that one eviction's effect is seen before the next pass.
//!
//! Failures of the world (signals unreadable, a reclaimer failing) are logged and the pass goes on
//! as the kubelet's eviction manager does: no step fails.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{CancellationToken, Driver, Outcome, Store, Update};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::metrics::EvictionMetrics;
use super::populator::{Eviction, EvictionSink};
use super::reconciler::{EvictionActual, EvictionKey, EvictionOp, PodEviction, Stage};
use super::signal::SignalSource;
use super::state::{Met, still_met};
use super::status::PressureView;
use crate::common::clock::Clock;
use crate::common::events::{Involved, NodeEvents};
use crate::model::actual::PodActual;
use crate::model::pod::PodUid;
use crate::model::pressure::{Condition, Reclaimer, Reclaimers};

/// Whether everything of the pod with this UID besides its containers (its volumes) is released.
pub type CleanedUp = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The eviction pair's driver.
pub struct EvictionDriver {
    source: Arc<dyn SignalSource>,
    reclaimers: Reclaimers,
    sink: EvictionSink,
    pod_actual: Store<PodUid, PodActual>,
    cleaned_up: Option<CleanedUp>,
    conditions: tokio::sync::watch::Sender<BTreeSet<Condition>>,
    metrics: EvictionMetrics,
    pressure: PressureView,
    events: NodeEvents,
    clock: Clock,
}

impl std::fmt::Debug for EvictionDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictionDriver").field("reclaimers", &self.reclaimers).finish_non_exhaustive()
    }
}

impl EvictionDriver {
    /// A driver reading `source`, sending evictions to `sink`, watching `pod_actual` for evicted
    /// pods to stop; timestamps (conditions, events, verdicts) from the wall clock `clock`.
    pub fn new(
        source: Arc<dyn SignalSource>,
        sink: EvictionSink,
        pod_actual: Store<PodUid, PodActual>,
        metrics: EvictionMetrics,
        events: NodeEvents,
        clock: Clock,
    ) -> Self {
        Self {
            source,
            reclaimers: Reclaimers::new(),
            sink,
            pod_actual,
            cleaned_up: None,
            conditions: tokio::sync::watch::Sender::new(BTreeSet::new()),
            metrics,
            pressure: PressureView::new(clock()),
            events,
            clock,
        }
    }

    /// After evicting a pod, also waits (within the cleanup timeout) until `cleaned_up` says the
    /// pod's resources are released, e.g. its emptyDir volumes removed.
    #[must_use]
    pub fn with_cleanup_check(mut self, cleaned_up: CleanedUp) -> Self {
        self.cleaned_up = Some(cleaned_up);
        self
    }

    /// Adds a node-level reclaimer to its list ([`reclaimers`](Self::reclaimers)), tried in the order added.
    #[must_use]
    pub fn with_reclaimer(self, reclaimer: Arc<dyn Reclaimer>) -> Self {
        self.reclaimers.add(reclaimer);
        self
    }

    /// Tries the reclaimers of the shared list `reclaimers` (in place of its own, and of those added to it
    /// before): whatever is added to that list later, before or while the driver runs, is tried too.
    #[must_use]
    pub fn with_reclaimers(mut self, reclaimers: Reclaimers) -> Self {
        self.reclaimers = reclaimers;
        self
    }

    /// Shows the pressure conditions in `view` (in place of its own, all `False` since it was made): a view
    /// handed out before the driver was built.
    #[must_use]
    pub fn with_pressure(mut self, view: PressureView) -> Self {
        self.pressure = view;
        self
    }

    /// The list of node-level reclaimers it tries (shared: adding to it adds to the driver's); the
    /// reconciler reads the same list ([`EvictionInputs::reclaimers`](super::reconciler::EvictionInputs::reclaimers)).
    pub fn reclaimers(&self) -> &Reclaimers {
        &self.reclaimers
    }

    /// The node's pressure conditions, updated at every pass.
    pub fn pressure(&self) -> PressureView {
        self.pressure.clone()
    }

    /// The pressure conditions as admission applies them, updated at every pass.
    pub fn conditions(&self) -> tokio::sync::watch::Receiver<BTreeSet<Condition>> {
        self.conditions.subscribe()
    }

    /// The metrics it updates.
    pub fn metrics(&self) -> &EvictionMetrics {
        &self.metrics
    }

    /// Publishes a pass's conditions.
    fn publish(&self, conditions: &BTreeSet<Condition>, acted_on: Option<&Met>) {
        let now = (self.clock)();
        for (condition, pressure) in self.pressure.update(conditions, now) {
            let what = condition.as_str().trim_end_matches("Pressure");
            let (reason, message) = if pressure {
                (format!("NodeHas{what}Pressure"), format!("Node status is now: NodeHas{what}Pressure"))
            } else if condition == Condition::DiskPressure {
                ("NodeHasNoDiskPressure".to_string(), "Node status is now: NodeHasNoDiskPressure".to_string())
            } else {
                (format!("NodeHasSufficient{what}"), format!("Node status is now: NodeHasSufficient{what}"))
            };
            info!(condition = %condition, pressure, "node condition changed");
            self.events.record(Involved::Node, "Normal", &reason, message, now);
        }
        self.metrics.set_pressure(conditions);
        self.conditions.send_if_modified(|c| {
            let changed = c != conditions;
            c.clone_from(conditions);
            changed
        });
        if let Some(met) = acted_on {
            let signal = met.threshold.signal;
            self.events.record(
                Involved::Node,
                "Warning",
                "EvictionThresholdMet",
                format!("Attempting to reclaim {}", signal.resource()),
                now,
            );
            debug!(%signal, available = met.observed.available, limit = met.limit(), "eviction threshold met");
        }
    }

    /// Node-level reclaim for `met`, then the signals again: the bytes freed and the signals.
    async fn reclaim(&self, met: &Met) -> Stage {
        let signal = met.threshold.signal;
        let mut freed = 0;
        for r in self.reclaimers.list() {
            match r.reclaim(signal, met.to_reclaim()).await {
                Ok(n) => {
                    freed += n;
                    debug!(reclaimer = r.name(), freed = n, "node-level reclaim");
                }
                Err(e) => warn!(reclaimer = r.name(), error = %e, "node-level reclaim failed"),
            }
        }
        let after = match self.source.observe().await {
            Ok(after) => Some(after),
            Err(e) => {
                warn!(error = %e, "cannot read the node's signals after reclaim");
                None
            }
        };
        if after.as_ref().is_some_and(|a| !still_met(&met.threshold, a)) {
            info!(%signal, freed, "node-level reclaim relieved the pressure; no pod evicted");
        }
        Stage::Reclaimed { freed, after }
    }

    /// The pods' usage of now (none when it cannot be read: ranking goes on without it).
    async fn measure(&self) -> Stage {
        let usage = self.source.pod_usage().await.unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the pods' usage; ranking without it");
            BTreeMap::new()
        });
        Stage::Measured { usage }
    }

    /// Sends the evictions, counts them and records their events.
    fn evict(&self, pods: &[PodEviction], over_limit: bool) {
        for p in pods {
            let now = (self.clock)();
            if over_limit {
                info!(pod = %p.name, namespace = %p.namespace, signal = p.signal, message = %p.message,
                    "evicting pod over its local storage limit");
            } else {
                info!(pod = %p.name, namespace = %p.namespace, signal = p.signal, grace = ?p.grace, "evicting pod");
            }
            let eviction = Eviction {
                uid: p.uid.clone(),
                message: p.message.clone(),
                grace: p.grace,
                at: now,
                over_limit,
            };
            if !self.sink.evict(eviction) {
                warn!(pod = %p.uid, "the verdict populator is gone; the eviction is not applied");
            }
            self.metrics.evictions.with_label_values(&[p.signal]).inc();
            let involved =
                Involved::Pod { namespace: p.namespace.clone(), name: p.name.clone(), uid: p.uid.clone() };
            self.events.record(involved, "Warning", "Evicted", p.message.clone(), now);
        }
    }

    /// Waits until the evicted pod runs nothing any more, at most `timeout`.
    async fn wait_for_cleanup(&self, uid: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let running = self.pod_actual.get(&uid.to_string()).is_some_and(|a| a.any_running());
            if !running && self.cleaned_up.as_ref().is_none_or(|f| f(uid)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        warn!(pod = %uid, "evicted pod did not stop within the cleanup timeout");
    }
}

impl Driver<EvictionKey, EvictionOp, EvictionActual> for EvictionDriver {
    type Error = Infallible;

    async fn execute(
        &self,
        _key: &EvictionKey,
        op: &EvictionOp,
        cancel: &CancellationToken,
    ) -> Outcome<EvictionActual, Infallible> {
        let mut next = op.next().clone();
        let stage = match op {
            EvictionOp::Assess { announce, .. } => {
                let met = next.pass.as_ref().and_then(|p| p.act_on.as_ref()).filter(|_| *announce);
                self.publish(&next.conditions, met);
                None
            }
            EvictionOp::Reclaim { met, .. } => Some(self.reclaim(met).await),
            EvictionOp::MeasureUsage { .. } => Some(self.measure().await),
            EvictionOp::Evict { pods, over_limit, cleanup_timeout, .. } => {
                self.evict(pods, *over_limit);
                for p in pods {
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = self.wait_for_cleanup(&p.uid, *cleanup_timeout) => {}
                    }
                }
                None
            }
        };
        if let (Some(stage), Some(pass)) = (stage, next.pass.as_mut()) {
            pass.stage = stage;
        }
        next.updated_at = Some(Instant::now());
        Outcome::Done(Update::Set(EvictionActual::Node(Box::new(next))))
    }
}

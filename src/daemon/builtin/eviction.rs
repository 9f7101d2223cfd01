//! The eviction pair (node pressure) as an [`Extension`]: [`EvictionPair`] builds, through
//! [`pressure::start`], the eviction engine (`eviction`) with its signal sampler and the verdict
//! populator, and spawns their tasks on the supervisor, all critical: `local-storage-measure` (with
//! `localStorageCapacityIsolation`, not on a hollow node), `verdict-populator`, `eviction-engine`,
//! `eviction-sampler`. A hollow node's eviction pair reads no signal (`pressure::SignalOrigin::Hollow`).
//!
//! Everything it reads of the node comes from the [`ExtensionContext`]: the node's stats, the pod,
//! sandbox, volume and verdict stores, the pressure conditions it updates, the event log it records
//! evictions in, the clock, the metrics and the reclaimers it tries under disk pressure (container GC's,
//! the image pair's, the extensions'). What only this pair may hold it is given when built: the verdict
//! store's writer (the verdict populator is its only writer) and admission. It has no status table.

use std::sync::Arc;

use nodelet_resources::eviction::verdict::Admission;
use nodelet_resources::model::pod::PodUid;
use nodelet_resources::model::verdict::Verdict;
use reconcile_engine::Writer;

use crate::config;
use crate::daemon::extension::{BoxError, Extension, ExtensionContext, StatusTable};
use crate::daemon::supervisor::spawn_tasks;
use crate::pressure;

/// The eviction pair and the verdict populator, with what only they hold.
pub(crate) struct EvictionPair {
    /// The node's configuration (`eviction*`, `localStorageCapacityIsolation`).
    config: Arc<config::Config>,
    /// The verdict store's writer, for the verdict populator.
    verdict_writer: Writer<PodUid, Verdict>,
    /// What admission checks pods against.
    admission: Admission,
    /// Where the signals come from (none on a hollow node).
    signals: pressure::SignalOrigin,
}

impl EvictionPair {
    /// The pair as `config` sets it, with the verdict store's writer and admission (made with the pod
    /// pair's stores, `topology::pod_stores`: the pod pair reads the verdicts), reading its signals from
    /// `signals`.
    pub(crate) fn new(
        config: Arc<config::Config>,
        verdict_writer: Writer<PodUid, Verdict>,
        admission: Admission,
        signals: pressure::SignalOrigin,
    ) -> Self {
        Self { config, verdict_writer, admission, signals }
    }
}

impl Extension for EvictionPair {
    fn name(&self) -> &str {
        "eviction"
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let EvictionPair { config, verdict_writer, admission, signals } = *self;
        let tasks = pressure::start(
            pressure::Wiring {
                config: &config,
                signals,
                stats: ctx.stats().clone(),
                desired: ctx.pods_desired(),
                actual: ctx.pods_actual(),
                sandboxes: ctx.sandboxes_actual(),
                volumes: ctx.volumes_actual(),
                verdicts: ctx.verdicts(),
                verdict_writer,
                admission,
                reclaimers: ctx.reclaimers().clone(),
                pressure: ctx.pressure(),
                events: ctx.events().clone(),
                metrics: ctx.metrics(nodelet_resources::eviction::metrics::EvictionMetrics::new)?,
                engine_metrics: ctx.engine_metrics(),
                clock: ctx.clock().clone(),
            },
            ctx.shutdown(),
        )?;
        spawn_tasks(ctx.supervisor(), tasks);
        Ok(None)
    }
}

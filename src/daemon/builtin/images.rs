//! The image pair (image garbage collection) as an [`Extension`]: [`ImageGc`] builds its engine (`images`,
//! with its relations on the pod stores) and its populator, spawns them on the supervisor (tasks
//! `image-populator`, then `image-engine`, both critical) and adds the eviction pair's image reclaimer
//! ([`ImagePairReclaimer`]: under disk pressure, remove every unused image that may go) to the node's
//! reclaimers. It has no status table.

use std::sync::Arc;
use std::time::Duration;

use nodelet_resources::image::driver::ImageDriver;
use nodelet_resources::image::metrics::ImageGcMetrics;
use nodelet_resources::image::plan::ImageGcPolicy;
use nodelet_resources::image::populator::{ImagePopulator, ImageStores};
use nodelet_resources::image::reclaim::{DEFAULT_RECLAIM_TIMEOUT, ImagePairReclaimer};
use nodelet_resources::image::reconciler::{ImageReconciler, PodImages, removals_on_pod_change};
use nodelet_resources::image::status::free_space;
use reconcile_engine::Engine;

use crate::config;
use crate::daemon::extension::{BoxError, Extension, ExtensionContext, StatusTable};
use crate::daemon::supervisor::Policy;

/// Image garbage collection: what the configuration sets of it.
#[derive(Debug, Clone)]
pub(crate) struct ImageGc {
    /// When images are removed (thresholds, ages).
    policy: ImageGcPolicy,
    /// Images never removed (the pod infra container image).
    pinned: Vec<String>,
    /// How often the populator reads the runtime's images and the image filesystem.
    period: Duration,
}

impl ImageGc {
    /// Image GC as `config` sets it (`imageGC*`, `nodelet.imageGCPeriod`), the pause image pinned.
    pub(crate) fn new(config: &config::Config) -> Self {
        ImageGc {
            policy: image_gc_policy(&config.image_gc),
            pinned: vec![config.runtime.pod_infra_container_image.clone()],
            period: config.image_gc.period,
        }
    }
}

/// The image GC policy from the configuration.
fn image_gc_policy(c: &config::ImageGcConfig) -> ImageGcPolicy {
    ImageGcPolicy {
        high_threshold_percent: c.high_threshold_percent,
        low_threshold_percent: c.low_threshold_percent,
        minimum_age: c.minimum_age,
        maximum_age: c.maximum_age,
    }
}

impl Extension for ImageGc {
    fn name(&self) -> &str {
        "images"
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let ImageGc { policy, pinned, period } = *self;
        let runtime = Arc::new(nodelet_cri::image_gc::CriImageGc::new(ctx.cri().clone()));
        let pods = PodImages { desired: ctx.pods_desired(), actual: ctx.pods_actual() };
        let (image_desired, image_desired_writer) = reconcile_engine::store();
        let mut engine = Engine::builder(
            "images",
            ImageReconciler::new(pinned.clone(), policy.minimum_age),
            Arc::new(ImageDriver::new(
                runtime.clone(),
                ctx.metrics(ImageGcMetrics::new)?,
                ctx.events().clone(),
                ctx.clock().clone(),
            )),
            image_desired.clone(),
        )
        .metrics(ctx.engine_metrics())
        .wall_clock(ctx.wall_clock())
        // A pod appeared, changed or went: plan again every image to be removed (a pod that uses it
        // keeps it).
        .watches("pods-desired", pods.desired.clone(), removals_on_pod_change(image_desired.clone()))
        .watches("pods-actual", pods.actual.clone(), removals_on_pod_change(image_desired.clone()))
        .build_with(pods.clone());
        let (free, requests) = free_space();
        let populator = ImagePopulator::new(
            policy,
            runtime,
            pods,
            ImageStores {
                desired: image_desired_writer,
                actual: engine.actual(),
                observer: engine.observer(),
                failures: engine.op_status(),
            },
            requests,
            ctx.events().clone(),
            ctx.clock().clone(),
        )
        .with_pinned(pinned);
        ctx.supervisor().spawn(
            "image-populator",
            Policy::Critical,
            populator.run(period, ctx.shutdown().clone().cancelled_owned()),
        );
        let stop = ctx.shutdown().clone();
        ctx.supervisor().spawn("image-engine", Policy::Critical, async move {
            engine.run(stop.cancelled_owned()).await;
        });
        // Under disk pressure the eviction pair asks the image pair to free space, after container GC.
        ctx.reclaimers().add(Arc::new(ImagePairReclaimer::new(free, DEFAULT_RECLAIM_TIMEOUT)));
        Ok(None)
    }
}

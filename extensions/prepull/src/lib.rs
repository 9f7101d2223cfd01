//! An example nodelet extension: keeps the images named by the manifests of a directory pulled on the node,
//! so that pods using them start without waiting for a pull.
//!
//! A desired/actual pair on `reconcile-engine`, like nodelet's own:
//! - **desired**: the images the `ImagePrepull` manifests of the directory name ([`manifest`]), written by
//!   the [`populator::Populator`], which reads the directory every poll interval;
//! - **actual**: the images present in the container runtime (CRI `ListImages` at start and on every
//!   relist; a pull's outcome in between);
//! - **operation**: `pull` through the [`driver::ImageService`] trait ([`driver::CriImages`] in production),
//!   retried with the engine's per-key back-off;
//! - **status**: [`status::PrepullStatus`], served on `/extensions/prepull` and printed by
//!   `nodelet get prepull`;
//! - **metrics**: the engine's `reconcile_engine_*` series with `reconciler="prepull"`, and
//!   `nodelet_prepull_manifest_errors` (files of the directory that are not valid manifests).
//!
//! Register it with the node builder; a daemon without the client commands (the `nodelet-prepull` binary of
//! this crate adds them, see `src/main.rs`):
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use nodelet::{Invocation, Node};
//! use nodelet_prepull::Prepull;
//!
//! match Invocation::from_args()? {
//!     Invocation::Daemon(config) => {
//!         let prepull = Prepull::new("/etc/nodelet/prepull.d");
//!         Node::builder(config).with_extension(prepull).build()?.run()?
//!     }
//!     Invocation::Builtin(command) => command.run(),
//! }
//! # Ok(())
//! # }
//! ```

/// The guide chapter `docs/extensions.md` (its code blocks are compiled as doc tests).
#[doc = include_str!("../../../docs/extensions.md")]
pub mod guide {}

pub mod driver;
pub mod manifest;
pub mod populator;
pub mod reconciler;
pub mod status;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nodelet::daemon::{BoxError, Extension, ExtensionContext, Policy, StatusTable};
use reconcile_engine::{BackoffConfig, Engine, Update};

use crate::driver::{CriImages, ImageService, PrepullDriver};
use crate::reconciler::PrepullReconciler;

/// The extension's name: `/extensions/prepull`, `nodelet get prepull`, `reconciler="prepull"`.
pub const NAME: &str = "prepull";

/// The pre-pull extension; see the [crate docs](crate).
#[derive(Debug, Clone)]
pub struct Prepull {
    dir: PathBuf,
    poll_interval: Duration,
    backoff: BackoffConfig,
}

impl Prepull {
    /// Pre-pulls the images of the manifests in `dir`, read every 5 s; pulls back off from 1 s to 5 min.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Prepull {
            dir: dir.into(),
            poll_interval: Duration::from_secs(5),
            backoff: BackoffConfig::default()
                .with_initial(Duration::from_secs(1))
                .with_max(Duration::from_secs(300)),
        }
    }

    /// How often the directory is read and the runtime's images listed.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The back-off of failed pulls, per image.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }
}

impl Extension for Prepull {
    fn name(&self) -> &str {
        NAME
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let images = CriImages(ctx.cri().clone());
        // Desired: the populator is the only writer.
        let (desired, writer) = reconcile_engine::store();
        let errors = prometheus::IntGauge::new(
            "nodelet_prepull_manifest_errors",
            "Files of the pre-pull directory that are not valid ImagePrepull manifests",
        )?;
        ctx.registry().register(Box::new(errors.clone()))?;
        let problems = populator::Problems::default();
        let populator =
            populator::Populator::new(self.dir.clone(), self.poll_interval, writer, problems.clone(), errors);
        ctx.supervisor().spawn("prepull-populator", Policy::Critical, populator.run(ctx.shutdown().clone()));

        // The engine: its name is its `reconciler` label on /metrics.
        let mut engine = Engine::builder(
            NAME,
            PrepullReconciler,
            Arc::new(PrepullDriver(images.clone())),
            desired.clone(),
        )
        .metrics(ctx.engine_metrics())
        .backoff(self.backoff)
        .build();
        let actual = engine.actual();
        let failures = engine.op_status();

        // Images removed (or pulled) behind the engine's back: a relist, like the PLEG's.
        let (observer, relist_desired, relist_actual, stop, period) =
            (engine.observer(), desired.clone(), actual.clone(), ctx.shutdown().clone(), self.poll_interval);
        ctx.supervisor().spawn_restartable("prepull-relist", move || {
            relist(
                images.clone(),
                observer.clone(),
                relist_desired.clone(),
                relist_actual.clone(),
                period,
                stop.clone(),
            )
        });
        let stop = ctx.shutdown().clone();
        ctx.supervisor().spawn("prepull-engine", Policy::Critical, async move {
            let report = engine.run(stop.cancelled_owned()).await;
            tracing::info!(operations = report.operations, "prepull engine stopped");
        });
        tracing::info!(dir = %self.dir.display(), "pre-pulling the images of the manifests");
        Ok(Some(Arc::new(status::PrepullStatus {
            desired,
            actual,
            failures,
            problems,
            // The status reads the node's desired pods when asked (pod → the images of its containers).
            pods: ctx.pods_desired(),
        })))
    }
}

/// Every `period`: reports to the engine each wanted image whose presence in the runtime differs from the
/// actual store.
async fn relist<S: ImageService>(
    images: S,
    observer: reconcile_engine::Observer<String, reconciler::ImagePresent>,
    desired: reconcile_engine::Store<String, reconciler::WantedImage>,
    actual: reconcile_engine::Store<String, reconciler::ImagePresent>,
    period: Duration,
    stop: reconcile_engine::CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        let at = tokio::time::Instant::now();
        let present = match images.list().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the runtime's images");
                continue;
            }
        };
        for image in desired.keys() {
            match (present.get(&image), actual.get(&image)) {
                (Some(id), None) => {
                    observer.observe(image, Update::Set(reconciler::ImagePresent { id: id.clone() }), at);
                }
                (None, Some(_)) => {
                    tracing::info!(image = %image, "a pre-pulled image was removed; pulling it again");
                    observer.observe(image, Update::Remove, at);
                }
                _ => {}
            }
        }
    }
}

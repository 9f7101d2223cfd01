//! The image reconciler: a removal runs only when the desired state says `Remove`, the image is
//! not pinned, no pod uses it now (the pod stores, read as side inputs, are checked again here, so a
//! pod that appears after the populator's decision wins) and it is older than `imageMinimumGCAge`.
//!
//! Side inputs ([`PodImages`]): the pod desired and actual stores; the image engine watches both,
//! and a change of any pod plans again every image the desired state says to remove
//! ([`removals_on_pod_change`]). The age of an image is measured with the engine's wall clock
//! ([`View::wall`]).

use std::fmt;
use std::time::Duration;

use reconcile_engine::{Plan, Reconciler, Store, Update, View};

use super::actual::{ImageActual, ImageId};
use super::desired::DesiredImage;
use super::driver::RuntimeImage;
use super::ops::ImageOp;
use crate::model::actual::PodActual;
use crate::model::pod::{DesiredPod, PodUid};

/// The pods' stores, read-only: an image a pod names or runs is never removed.
#[derive(Debug, Clone)]
pub struct PodImages {
    /// The desired pods.
    pub desired: Store<PodUid, DesiredPod>,
    /// What the runtime runs of them.
    pub actual: Store<PodUid, PodActual>,
}

impl PodImages {
    /// Whether a pod names `image` in its spec or runs a container of it.
    pub fn uses(&self, image: &RuntimeImage) -> bool {
        let mut used = false;
        self.desired.for_each(|_, pod| {
            used = used
                || pod
                    .init_containers()
                    .iter()
                    .chain(pod.containers())
                    .filter_map(|c| c.image.as_deref())
                    .any(|r| !r.is_empty() && image.matches(r));
        });
        if used {
            return true;
        }
        self.actual.for_each(|_, pod| {
            used = used
                || pod
                    .containers
                    .iter()
                    .any(|c| [&c.image, &c.image_ref].into_iter().any(|r| !r.is_empty() && image.matches(r)));
        });
        used
    }
}

/// The image reconciler.
pub struct ImageReconciler {
    pinned: Vec<String>,
    minimum_age: Duration,
}

impl fmt::Debug for ImageReconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageReconciler")
            .field("pinned", &self.pinned)
            .field("minimum_age", &self.minimum_age)
            .finish_non_exhaustive()
    }
}

impl ImageReconciler {
    /// A reconciler that never removes what the pods (its side inputs) use or `pinned` (references)
    /// name, nor an image first seen less than `minimum_age` ago by the engine's wall clock.
    pub fn new(pinned: Vec<String>, minimum_age: Duration) -> Self {
        Self { pinned, minimum_age }
    }
}

/// The mapper of the image engine's relations on the pod stores: whatever pod changed, every image
/// the desired store `images` says to remove, so the reconciler checks again that no pod uses it (a
/// pod that appears after the decision keeps its image).
pub fn removals_on_pod_change<V>(
    images: Store<ImageId, DesiredImage>,
) -> impl Fn(&PodUid, Option<&V>) -> Vec<ImageId> + Send + Sync + 'static {
    move |_, _| {
        let mut out = Vec::new();
        images.for_each(|id, value| {
            if matches!(value, DesiredImage::Remove(_)) {
                out.push(id.clone());
            }
        });
        out
    }
}

impl Reconciler<DesiredImage, ImageActual> for ImageReconciler {
    type Key = ImageId;
    type Op = ImageOp;
    type Inputs = PodImages;

    fn reconcile(&self, view: &View<'_, ImageId, DesiredImage, ImageActual, PodImages>) -> Plan<ImageOp> {
        let (Some(DesiredImage::Remove(reason)), Some(actual)) = (view.desired, view.actual) else {
            return Plan::Idle;
        };
        let image = &actual.image;
        let pods = view.inputs;
        if image.pinned || self.pinned.iter().any(|r| image.matches(r)) || pods.uses(image) {
            return Plan::Idle;
        }
        let age = reconcile_engine::unix_nanos(view.wall).saturating_sub(actual.first_seen);
        let minimum = i64::try_from(self.minimum_age.as_nanos()).unwrap_or(i64::MAX);
        if age < minimum {
            return Plan::RecheckAfter(Duration::from_nanos(u64::try_from(minimum - age).unwrap_or(0)));
        }
        Plan::Run(ImageOp::Remove { reason: *reason, size: image.size })
    }

    fn uncertain(&self, _key: &ImageId, _op: &ImageOp, _actual: Option<&ImageActual>) -> Update<ImageActual> {
        // Whether the image is gone shows in the populator's next listing.
        Update::Keep
    }
}

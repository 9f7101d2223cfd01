//! The image reconciler: a removal runs only when the desired state says `Remove`, the image is
//! not pinned, no pod uses it now (the pod stores, read as side inputs, are checked again here, so a
//! pod that appears after the populator's decision wins) and it is older than `imageMinimumGCAge`.

use std::fmt;
use std::time::Duration;

use reconcile_engine::{Plan, Reconciler, Store, Update, View};

use super::actual::{ImageActual, ImageId};
use super::desired::DesiredImage;
use super::driver::RuntimeImage;
use super::ops::ImageOp;
use crate::pod::actual::PodActual;
use crate::pod::desired::{DesiredPod, PodUid};
use crate::pod::reconciler::Clock;

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
    // relation: watches the pod desired and actual stores; any change maps to every image key whose
    // desired value is `Remove` (see `populator::wake_on_pod_changes`).
    pods: PodImages,
    pinned: Vec<String>,
    minimum_age: Duration,
    clock: Clock,
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
    /// A reconciler that never removes what `pods` use or `pinned` (references) name, nor an image
    /// first seen less than `minimum_age` ago by the wall clock `clock`.
    pub fn new(pods: PodImages, pinned: Vec<String>, minimum_age: Duration, clock: Clock) -> Self {
        Self { pods, pinned, minimum_age, clock }
    }
}

impl Reconciler<DesiredImage, ImageActual> for ImageReconciler {
    type Key = ImageId;
    type Op = ImageOp;

    fn reconcile(&self, view: &View<'_, ImageId, DesiredImage, ImageActual>) -> Plan<ImageOp> {
        let (Some(DesiredImage::Remove(reason)), Some(actual)) = (view.desired, view.actual) else {
            return Plan::Idle;
        };
        let image = &actual.image;
        if image.pinned || self.pinned.iter().any(|r| image.matches(r)) || self.pods.uses(image) {
            return Plan::Idle;
        }
        let age = (self.clock)().saturating_sub(actual.first_seen);
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

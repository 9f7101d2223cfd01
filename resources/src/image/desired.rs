//! The image pair's desired state: for each image the runtime has (keyed by image ID), keep it or
//! remove it and why. Only the [populator](super::populator) writes it, from the policy, the pods'
//! images, the disk usage and outstanding requests to free space.

use std::collections::BTreeSet;

use super::driver::RuntimeImage;
use super::plan::Reason;
use crate::model::actual::PodActual;
use crate::model::pod::DesiredPod;

/// What should become of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DesiredImage {
    /// It stays.
    Keep,
    /// It goes (unless a pod uses it by the time the removal is planned: the reconciler checks).
    Remove(Reason),
}

/// The images that must stay: those the desired pods' containers name and those containers in
/// the runtime use (any state, any pod). Image references as written or resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InUse {
    /// Image references (tags, digests, IDs).
    pub references: BTreeSet<String>,
}

impl InUse {
    /// From the desired pods, their runtime records and every container in the runtime.
    pub fn compute<'a>(
        desired: impl IntoIterator<Item = &'a DesiredPod>,
        actual: impl IntoIterator<Item = &'a PodActual>,
        containers: &[super::driver::ContainerImage],
    ) -> Self {
        let mut out = Self::of_pods(desired, actual);
        for c in containers {
            out.references
                .extend([c.image.clone(), c.image_ref.clone()].into_iter().filter(|s| !s.is_empty()));
        }
        out
    }

    /// The images the pods use: named by a desired pod's containers, or run by a pod's containers.
    pub fn of_pods<'a>(
        desired: impl IntoIterator<Item = &'a DesiredPod>,
        actual: impl IntoIterator<Item = &'a PodActual>,
    ) -> Self {
        let mut references = BTreeSet::new();
        for pod in desired {
            for c in pod.init_containers().iter().chain(pod.containers()) {
                if let Some(image) = c.image.as_deref().filter(|i| !i.is_empty()) {
                    references.insert(image.to_string());
                }
            }
        }
        for pod in actual {
            for c in &pod.containers {
                references
                    .extend([c.image.clone(), c.image_ref.clone()].into_iter().filter(|s| !s.is_empty()));
            }
        }
        Self { references }
    }

    /// Whether `image` is in use.
    pub fn contains(&self, image: &RuntimeImage) -> bool {
        self.references.iter().any(|r| image.matches(r))
    }
}

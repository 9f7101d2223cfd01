//! The image pair: which images must stay (desired) and which the runtime has, with sizes and
//! when each was first seen and last used (actual, kept in memory as the kubelet does).

use std::collections::{BTreeMap, BTreeSet};

use super::driver::{ContainerImage, RuntimeImage};
use crate::pod::actual::PodActual;
use crate::pod::desired::DesiredPod;

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
        containers: &[ContainerImage],
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
        for c in containers {
            references.extend([c.image.clone(), c.image_ref.clone()].into_iter().filter(|s| !s.is_empty()));
        }
        Self { references }
    }

    /// Whether `image` is in use.
    pub fn contains(&self, image: &RuntimeImage) -> bool {
        self.references.iter().any(|r| image.matches(r))
    }
}

/// What is known of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRecord {
    /// The runtime's view.
    pub image: RuntimeImage,
    /// When nodelet first saw it, nanoseconds since the Unix epoch.
    pub first_seen: i64,
    /// When a container last used it (created with it, or ran it); `first_seen` until then.
    pub last_used: i64,
}

/// The images in the runtime, by ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The records.
    pub images: BTreeMap<String, ImageRecord>,
}

impl Inventory {
    /// Updates the records from a listing at `now`: new images are first seen now, removed
    /// ones are forgotten, images in use (and those containers were created from) are used now
    /// or at the container's creation.
    pub fn update(
        &mut self,
        listed: Vec<RuntimeImage>,
        containers: &[ContainerImage],
        in_use: &InUse,
        now: i64,
    ) {
        let ids: BTreeSet<String> = listed.iter().map(|i| i.id.clone()).collect();
        self.images.retain(|id, _| ids.contains(id));
        for image in listed {
            let record = self.images.entry(image.id.clone()).or_insert_with(|| ImageRecord {
                image: image.clone(),
                first_seen: now,
                last_used: now,
            });
            record.image = image;
            for c in containers {
                if record.image.matches(&c.image_ref) || record.image.matches(&c.image) {
                    let t = if c.running { now } else { c.created_at };
                    record.last_used = record.last_used.max(t);
                }
            }
            if in_use.contains(&record.image) {
                record.last_used = now;
            }
        }
    }
}

//! The image pair's actual state: the runtime's images, keyed by image ID, with their size, when
//! nodelet first saw each and when a container last used it (kept in memory, as the kubelet does).
//!
//! Filled by the driver's reconstruction (a `ListImages` at start-up), by the populator's
//! listing every pass (reported through the engine's [`Observer`](reconcile_engine::Observer)),
//! and by the outcome of each removal.

use std::collections::{BTreeMap, BTreeSet};

use super::desired::InUse;
use super::driver::{ContainerImage, RuntimeImage};

/// An image ID (`sha256:…`): the key of the image pair.
pub type ImageId = String;

/// What is known of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageActual {
    /// The runtime's view.
    pub image: RuntimeImage,
    /// When nodelet first saw it, nanoseconds since the Unix epoch.
    pub first_seen: i64,
    /// When a container last used it (created with it, or ran it); `first_seen` until then.
    pub last_used: i64,
}

/// A snapshot of the actual store: the images by ID. What the populator plans over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The records.
    pub images: BTreeMap<ImageId, ImageActual>,
}

impl Inventory {
    /// The snapshot of `entries` (the actual store's).
    pub fn of<'a>(entries: impl IntoIterator<Item = (&'a ImageId, &'a ImageActual)>) -> Self {
        Self { images: entries.into_iter().map(|(k, v)| (k.clone(), v.clone())).collect() }
    }

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
            let record = self.images.entry(image.id.clone()).or_insert_with(|| ImageActual {
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn image(id: &str, tag: &str) -> RuntimeImage {
        RuntimeImage { id: id.into(), tags: vec![tag.into()], digests: vec![], size: 1, pinned: false }
    }

    #[test]
    fn last_use_comes_from_containers_and_the_desired_pods() {
        let mut inv = Inventory::default();
        let listed = vec![image("a", "r/a:1"), image("b", "r/b:1")];
        let containers = vec![ContainerImage {
            image: "r/b:1".into(),
            image_ref: "b".into(),
            created_at: 50 * S,
            running: false,
        }];
        inv.update(listed.clone(), &containers, &InUse::default(), 10 * S);
        assert_eq!(inv.images["b"].last_used, 50 * S, "an exited container's creation is its last use");
        assert_eq!(inv.images["a"].last_used, 10 * S);
        let in_use = InUse { references: ["r/a:1".to_owned()].into() };
        inv.update(listed[..1].to_vec(), &[], &in_use, 70 * S);
        assert_eq!(inv.images["a"].last_used, 70 * S, "in use now");
        assert_eq!(inv.images["a"].first_seen, 10 * S);
        assert!(!inv.images.contains_key("b"), "removed images are forgotten");
    }
}

//! The image pair's driver: the narrow runtime interface ([`ImageGcDriver`]: CRI `ListImages`,
//! `ListContainers`, `ImageFsInfo`, `RemoveImage`; nodelet-cri implements it) and the engine
//! [`Driver`] on top of it ([`ImageDriver`]), which removes images, counts them in
//! `kubelet_image_garbage_collected_total` and records `ImageGCFailed` events.

use std::sync::Arc;

use reconcile_engine::{CancellationToken, Driver, Outcome, Update};
use tracing::{info, warn};

use super::actual::{ImageActual, ImageId};
use super::metrics::ImageGcMetrics;
use super::ops::ImageOp;
use crate::common::clock::Clock;
use crate::common::events::{Involved, NodeEvents};
use futures::future::BoxFuture;

/// An image the runtime has.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeImage {
    /// The image ID (`sha256:…`).
    pub id: String,
    /// Its tags (`registry/name:tag`).
    pub tags: Vec<String>,
    /// Its digests (`registry/name@sha256:…`).
    pub digests: Vec<String>,
    /// Size in bytes.
    pub size: u64,
    /// Pinned by the runtime (the sandbox image): never removed.
    pub pinned: bool,
}

impl RuntimeImage {
    /// Whether `reference` (an ID, a tag or a digest reference) names this image.
    pub fn matches(&self, reference: &str) -> bool {
        if self.id == reference
            || self.tags.iter().any(|t| t == reference)
            || self.digests.iter().any(|d| d == reference)
        {
            return true;
        }
        let full = normalize(reference);
        self.tags.iter().chain(&self.digests).any(|t| *t == full)
    }
}

/// A reference as the runtime records it: `busybox` → `docker.io/library/busybox:latest`.
pub fn normalize(reference: &str) -> String {
    let (name, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    let (name, tag) = match last.split_once(':') {
        Some((_, t)) => (&name[..name.len() - t.len() - 1], Some(t)),
        None => (name, None),
    };
    let first = name.split('/').next().unwrap_or(name);
    let has_domain =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let name = match (has_domain, name.contains('/')) {
        (true, _) => name.to_string(),
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    match (digest, tag) {
        (Some(d), _) => format!("{name}@{d}"),
        (None, Some(t)) => format!("{name}:{t}"),
        (None, None) => format!("{name}:latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalized_like_the_runtime_records_them() {
        assert_eq!(normalize("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalize("org/app:1"), "docker.io/org/app:1");
        assert_eq!(normalize("127.0.0.1:5000/busybox"), "127.0.0.1:5000/busybox:latest");
        assert_eq!(normalize("localhost/nodelet/pause:3.9"), "localhost/nodelet/pause:3.9");
        assert_eq!(normalize("r.io/a@sha256:00"), "r.io/a@sha256:00");
        let image = RuntimeImage {
            id: "sha256:1".into(),
            tags: vec!["docker.io/library/busybox:latest".into()],
            ..Default::default()
        };
        assert!(image.matches("busybox") && image.matches("sha256:1") && !image.matches("busybox:1"));
    }
}

/// A container in the runtime (of any pod, any node sharing the runtime): the image it uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerImage {
    /// The image as the container was created with (tag or ID).
    pub image: String,
    /// The image ID the runtime resolved.
    pub image_ref: String,
    /// When the container was created, nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// Whether it runs now.
    pub running: bool,
}

/// The image filesystem's size and free space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImageFs {
    /// Size in bytes.
    pub capacity: u64,
    /// Free bytes.
    pub available: u64,
}

/// Why a runtime call of image GC failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ImageGcError(pub String);

/// What image GC needs of the runtime.
pub trait ImageGcDriver: Send + Sync + 'static {
    /// Every image.
    fn list_images(&self) -> BoxFuture<'_, Result<Vec<RuntimeImage>, ImageGcError>>;
    /// Every container (running or not), whatever pod or node it belongs to.
    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerImage>, ImageGcError>>;
    /// The image filesystem's capacity and free space.
    fn image_fs(&self) -> BoxFuture<'_, Result<ImageFs, ImageGcError>>;
    /// Removes the image `id`.
    fn remove_image(&self, id: &str) -> BoxFuture<'_, Result<(), ImageGcError>>;
}

/// The engine driver of the image pair over a runtime's [`ImageGcDriver`].
pub struct ImageDriver {
    runtime: Arc<dyn ImageGcDriver>,
    metrics: ImageGcMetrics,
    events: NodeEvents,
    clock: Clock,
}

impl std::fmt::Debug for ImageDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageDriver").finish_non_exhaustive()
    }
}

impl ImageDriver {
    /// A driver over `runtime`; `clock` stamps events and the images found at start-up.
    pub fn new(
        runtime: Arc<dyn ImageGcDriver>,
        metrics: ImageGcMetrics,
        events: NodeEvents,
        clock: Clock,
    ) -> Self {
        Self { runtime, metrics, events, clock }
    }
}

impl Driver<ImageId, ImageOp, ImageActual> for ImageDriver {
    type Error = ImageGcError;

    async fn execute(
        &self,
        id: &ImageId,
        op: &ImageOp,
        _cancel: &CancellationToken,
    ) -> Outcome<ImageActual, ImageGcError> {
        let ImageOp::Remove { reason, size } = op;
        match self.runtime.remove_image(id).await {
            Ok(()) => {
                info!(image = %id, size, reason = reason.as_str(), "removed unused image");
                self.metrics.collected.with_label_values(&[reason.as_str()]).inc();
                Outcome::Done(Update::Remove)
            }
            Err(e) => {
                warn!(image = %id, error = %e, "cannot remove image");
                self.events.record(
                    Involved::Node,
                    "Warning",
                    "ImageGCFailed",
                    format!("failed to remove image {id:?}: {e}"),
                    (self.clock)(),
                );
                Outcome::Failed(e)
            }
        }
    }

    /// The images the runtime has, first seen (and last used) now.
    async fn reconstruct(&self) -> Result<Vec<(ImageId, ImageActual)>, ImageGcError> {
        let now = (self.clock)();
        let images = self.runtime.list_images().await?;
        Ok(images
            .into_iter()
            .map(|image| (image.id.clone(), ImageActual { image, first_seen: now, last_used: now }))
            .collect())
    }
}

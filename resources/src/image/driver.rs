//! The narrow runtime interface image garbage collection uses (CRI `ListImages`,
//! `ListContainers`, `ImageFsInfo`, `RemoveImage`).

use crate::eviction::signal::BoxFuture;

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

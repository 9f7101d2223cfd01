//! [`ImageGcDriver`] over CRI: `ListImages`, `ListContainers` (every container in the runtime,
//! whatever pod or node it belongs to, so images other users of a shared runtime run are kept),
//! `ImageFsInfo` plus `statvfs` of its mountpoint, and `RemoveImage`.

use std::path::Path;

use nodelet_resources::eviction::signal::BoxFuture;
use nodelet_resources::image::driver::{ContainerImage, ImageFs, ImageGcDriver, ImageGcError, RuntimeImage};

use crate::client::CriClient;
use crate::filter::ContainerFilter;
use k8s_cri::v1;

/// Image GC's runtime interface on a CRI client.
#[derive(Debug, Clone)]
pub struct CriImageGc {
    cri: CriClient,
}

impl CriImageGc {
    /// Over `cri`.
    pub fn new(cri: CriClient) -> Self {
        Self { cri }
    }
}

fn err(e: impl std::fmt::Display) -> ImageGcError {
    ImageGcError(e.to_string())
}

/// Capacity and free bytes (for unprivileged users, as `df` shows) of the filesystem at `path`.
pub fn fs_space(path: &Path) -> Option<ImageFs> {
    let s = rustix::fs::statvfs(path).ok()?;
    let frsize = if s.f_frsize > 0 { s.f_frsize } else { s.f_bsize };
    Some(ImageFs {
        capacity: s.f_blocks.saturating_mul(frsize),
        available: s.f_bavail.saturating_mul(frsize),
    })
}

impl ImageGcDriver for CriImageGc {
    fn list_images(&self) -> BoxFuture<'_, Result<Vec<RuntimeImage>, ImageGcError>> {
        Box::pin(async move {
            let images = self.cri.list_images(None).await.map_err(err)?;
            Ok(images
                .into_iter()
                .map(|i: v1::Image| RuntimeImage {
                    id: i.id,
                    tags: i.repo_tags,
                    digests: i.repo_digests,
                    size: i.size,
                    pinned: i.pinned,
                })
                .collect())
        })
    }

    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerImage>, ImageGcError>> {
        Box::pin(async move {
            let containers = self.cri.list_containers(&ContainerFilter::all()).await.map_err(err)?;
            Ok(containers
                .into_iter()
                .map(|c| ContainerImage {
                    image: c.image.map(|s| s.image).unwrap_or_default(),
                    image_ref: c.image_ref,
                    created_at: c.created_at,
                    running: c.state == v1::ContainerState::ContainerRunning as i32,
                })
                .collect())
        })
    }

    fn image_fs(&self) -> BoxFuture<'_, Result<ImageFs, ImageGcError>> {
        Box::pin(async move {
            let info = self.cri.image_fs_info().await.map_err(err)?;
            let mountpoint = info
                .image_filesystems
                .first()
                .and_then(|f| f.fs_id.as_ref())
                .map(|id| id.mountpoint.clone())
                .filter(|m| !m.is_empty())
                .ok_or_else(|| err("the runtime reported no image filesystem"))?;
            let path = std::path::PathBuf::from(&mountpoint);
            tokio::task::spawn_blocking(move || fs_space(&path))
                .await
                .map_err(err)?
                .ok_or_else(|| err(format!("cannot statvfs the image filesystem {mountpoint}")))
        })
    }

    fn remove_image(&self, id: &str) -> BoxFuture<'_, Result<(), ImageGcError>> {
        let id = id.to_string();
        Box::pin(async move { self.cri.remove_image(&id).await.map_err(err) })
    }
}

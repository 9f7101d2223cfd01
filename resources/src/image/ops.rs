//! The image pair's operation: removing one image.

use std::time::Duration;

use reconcile_engine::Operation;

use super::plan::Reason;

/// One step on one image. At most one runs per image at a time (the engine's per-key guarantee).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageOp {
    /// Remove the image (CRI `RemoveImage`).
    Remove {
        /// Why: the label of `kubelet_image_garbage_collected_total`.
        reason: Reason,
        /// Its size, as last listed (what removing it frees).
        size: u64,
    },
}

impl Operation for ImageOp {
    fn kind(&self) -> &'static str {
        match self {
            ImageOp::Remove { .. } => "remove_image",
        }
    }

    /// Held until the populator has decided once (no removal before the pods are known).
    fn is_teardown(&self) -> bool {
        true
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(120))
    }
}

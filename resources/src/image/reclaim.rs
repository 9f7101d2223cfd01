//! Image GC as node-level reclaim for the eviction pair: under disk pressure it asks the image
//! pair to free space (a request its populator reads) and waits, bounded, for the bytes freed.

use std::time::Duration;

use super::status::{FreeSpace, FreeSpaceError};
use crate::model::pressure::{ReclaimError, Reclaimer, Signal};
use futures::future::BoxFuture;

/// How long the eviction pair waits for the image pair by default.
pub const DEFAULT_RECLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// A [`Reclaimer`] that asks the image pair to remove every unused image that may be removed (the
/// kubelet's `DeleteUnusedImages` under disk pressure).
#[derive(Debug, Clone)]
pub struct ImagePairReclaimer {
    free: FreeSpace,
    timeout: Duration,
}

impl ImagePairReclaimer {
    /// A reclaimer asking through `free`, waiting at most `timeout` for the answer.
    pub fn new(free: FreeSpace, timeout: Duration) -> Self {
        Self { free, timeout }
    }
}

impl Reclaimer for ImagePairReclaimer {
    fn name(&self) -> &'static str {
        "image-gc"
    }

    fn reclaim(&self, signal: Signal, _bytes: u64) -> BoxFuture<'_, Result<u64, ReclaimError>> {
        Box::pin(async move {
            if !signal.is_disk() {
                return Ok(0);
            }
            self.free.free(None, self.timeout).await.map_err(|e| match e {
                FreeSpaceError::Stopped => ReclaimError::Stopped("image garbage collection"),
                FreeSpaceError::Timeout(timeout) => {
                    ReclaimError::Timeout { collector: "image garbage collection", timeout }
                }
            })
        })
    }
}

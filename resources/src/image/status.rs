//! What the image pair reports: the outcome of each populator pass ([`PassReport`]), and the
//! channel through which others (the eviction pair) ask it to free space ([`FreeSpace`]) and
//! wait for the answer. A request is state the populator reads, never a call into the runtime.

use std::time::Duration;

use tokio::sync::watch;

use super::plan::Removal;

/// The latest request to free space. Requests that arrive while one is outstanding merge into
/// it (the larger amount wins; `None`, everything unused, wins over any amount).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FreeRequest {
    /// Increases with every request; 0: none yet.
    pub seq: u64,
    /// Bytes to free; `None`: every unused image that may be removed.
    pub bytes: Option<u64>,
}

/// What one populator pass decided and what the removals freed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PassReport {
    /// The request this pass answered ([`FreeRequest::seq`]); earlier requests are answered too.
    pub request: u64,
    /// Bytes that had to be freed to reach the low threshold (0 below the high threshold, and for
    /// requests).
    pub to_free: u64,
    /// The images chosen, in order.
    pub planned: Vec<Removal>,
    /// IDs of the chosen images the runtime no longer has after the pass.
    pub removed: Vec<String>,
    /// Their sizes added up.
    pub freed: u64,
}

/// Why a request to free space got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreeSpaceError {
    /// The image pair is not running.
    #[error("image garbage collection is not running")]
    Stopped,
    /// No pass answered within the time allowed.
    #[error("image garbage collection did not answer within {0:?}")]
    Timeout(Duration),
}

/// Asks the image pair to free space and waits for its report. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FreeSpace {
    requests: std::sync::Arc<watch::Sender<FreeRequest>>,
    reports: watch::Receiver<PassReport>,
}

/// The populator's side of [`FreeSpace`].
#[derive(Debug)]
pub struct FreeSpaceRequests {
    /// The latest request.
    pub requests: watch::Receiver<FreeRequest>,
    /// Where each pass's report goes.
    pub reports: watch::Sender<PassReport>,
}

/// A connected pair of [`FreeSpace`] (for requesters) and [`FreeSpaceRequests`] (for the populator).
pub fn free_space() -> (FreeSpace, FreeSpaceRequests) {
    let (req_tx, req_rx) = watch::channel(FreeRequest::default());
    let (rep_tx, rep_rx) = watch::channel(PassReport::default());
    (
        FreeSpace { requests: std::sync::Arc::new(req_tx), reports: rep_rx },
        FreeSpaceRequests { requests: req_rx, reports: rep_tx },
    )
}

impl FreeSpace {
    /// Asks for `bytes` to be freed (`None`: every unused image that may go) and waits, at most
    /// `timeout`, for the pass that answers; returns the bytes its removals freed.
    pub async fn free(&self, bytes: Option<u64>, timeout: Duration) -> Result<u64, FreeSpaceError> {
        let mut seq = 0;
        let answered = self.reports.borrow().request;
        self.requests.send_modify(|r| {
            r.bytes = match (r.seq > answered, r.bytes, bytes) {
                (false, _, b) => b,
                (true, Some(a), Some(b)) => Some(a.max(b)),
                (true, _, _) => None,
            };
            r.seq += 1;
            seq = r.seq;
        });
        let mut reports = self.reports.clone();
        match tokio::time::timeout(timeout, reports.wait_for(|r| r.request >= seq)).await {
            Ok(Ok(report)) => Ok(report.freed),
            Ok(Err(_)) => Err(FreeSpaceError::Stopped),
            Err(_) => Err(FreeSpaceError::Timeout(timeout)),
        }
    }

    /// The latest pass's report.
    pub fn last_report(&self) -> PassReport {
        self.reports.borrow().clone()
    }
}

//! The image pair's populator: the only writer of its desired state.
//!
//! Every `imageGCPeriod`, and whenever someone asks to free space ([`FreeSpace`](super::status::FreeSpace)),
//! one pass: list the runtime's images and containers, report the images (with sizes and last
//! use) to the actual store through the engine's observer, work out the images in use (the pods'
//! stores, every container in the runtime, the pinned references), and make the batch decision
//! over that one snapshot ([`plan`] for the thresholds and the maximum age,
//! [`plan_free`] for a request: least recently used first until enough bytes).
//! Each chosen image becomes `Remove` in the desired store, every other `Keep`; the engine then runs
//! one removal per image, and the reconciler checks each again against the pods. The pass waits (a
//! bounded time) for those removals to settle and reports the bytes they freed.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{Observer, OpStatus, Store, Update, Writer};
use tracing::{debug, warn};

use super::actual::{ImageActual, ImageId, Inventory};
use super::desired::{DesiredImage, InUse};
use super::driver::{ImageGcDriver, ImageGcError};
use super::ops::ImageOp;
use super::plan::{ImageGcPolicy, PlanError, Removal, plan, plan_free};
use super::reconciler::PodImages;
use super::status::{FreeRequest, FreeSpaceRequests, PassReport};
use crate::common::clock::Clock;
use crate::common::events::{Involved, NodeEvents};

/// How long a pass waits for its removals by default.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);

/// The image pair's stores, as the populator sees them.
#[derive(Debug)]
pub struct ImageStores {
    /// The desired store's writer (the populator is its only writer).
    pub desired: Writer<ImageId, DesiredImage>,
    /// The engine's actual store.
    pub actual: Store<ImageId, ImageActual>,
    /// Reports listings into the actual store.
    pub observer: Observer<ImageId, ImageActual>,
    /// The engine's failed operations.
    pub failures: Store<ImageId, OpStatus<ImageOp, ImageGcError>>,
}

/// The populator. See the module docs.
pub struct ImagePopulator {
    policy: ImageGcPolicy,
    runtime: Arc<dyn ImageGcDriver>,
    pods: PodImages,
    pinned: Vec<String>,
    stores: ImageStores,
    requests: FreeSpaceRequests,
    events: NodeEvents,
    clock: Clock,
    settle: Duration,
}

impl std::fmt::Debug for ImagePopulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImagePopulator").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl ImagePopulator {
    /// A populator deciding by `policy` over `runtime`'s listings and the `pods`; `requests` is
    /// the populator's end of [`free_space`](super::status::free_space).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        policy: ImageGcPolicy,
        runtime: Arc<dyn ImageGcDriver>,
        pods: PodImages,
        stores: ImageStores,
        requests: FreeSpaceRequests,
        events: NodeEvents,
        clock: Clock,
    ) -> Self {
        Self {
            policy,
            runtime,
            pods,
            pinned: Vec::new(),
            stores,
            requests,
            events,
            clock,
            settle: DEFAULT_SETTLE,
        }
    }

    /// Never removes the images `references` name (the sandbox image: it is in use by every pod
    /// sandbox, which CRI does not list as containers, and runtimes do not always pin it).
    pub fn with_pinned(mut self, references: Vec<String>) -> Self {
        self.pinned = references;
        self
    }

    /// How long a pass waits for its removals before it reports.
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// One pass: periodic (`None`) or answering `request`.
    pub async fn pass(&mut self, request: Option<FreeRequest>) -> Result<PassReport, ImageGcError> {
        let observed_at = tokio::time::Instant::now();
        let (images, containers) = tokio::join!(self.runtime.list_images(), self.runtime.list_containers());
        let (images, containers) = (images?, containers?);
        let mut in_use = {
            let desired = self.pods.desired.entries();
            let actual = self.pods.actual.entries();
            InUse::compute(
                desired.iter().map(|(_, p)| p.as_ref()),
                actual.iter().map(|(_, a)| a.as_ref()),
                &containers,
            )
        };
        in_use.references.extend(self.pinned.iter().cloned());
        let now = (self.clock)();
        let entries = self.stores.actual.entries();
        let before = Inventory::of(entries.iter().map(|(k, v)| (k, v.as_ref())));
        let mut inventory = before.clone();
        inventory.update(images, &containers, &in_use, now);
        for (id, record) in &inventory.images {
            if before.images.get(id) != Some(record) {
                self.stores.observer.observe(id.clone(), Update::Set(record.clone()), observed_at);
            }
        }
        for id in before.images.keys().filter(|id| !inventory.images.contains_key(*id)) {
            self.stores.observer.observe(id.clone(), Update::Remove, observed_at);
        }
        let (removals, to_free) = match request {
            Some(r) => (plan_free(&self.policy, &inventory, &in_use, r.bytes, now), 0),
            None => {
                let fs = self.runtime.image_fs().await?;
                match plan(&self.policy, &inventory, &in_use, fs, now) {
                    Ok(p) => (p.removals, p.to_free),
                    Err(e @ PlanError::InvalidDiskCapacity) => {
                        self.events.record(
                            Involved::Node,
                            "Warning",
                            "InvalidDiskCapacity",
                            e.to_string(),
                            now,
                        );
                        return Err(ImageGcError(e.to_string()));
                    }
                }
            }
        };
        debug!(removals = removals.len(), to_free, request = ?request, "image GC pass");
        // Subscribe before the decision is written, so that no outcome is missed.
        let (actual_changes, failure_changes) =
            (self.stores.actual.subscribe(), self.stores.failures.subscribe());
        self.stores.desired.replace_all(inventory.images.keys().map(|id| {
            let value = removals
                .iter()
                .find(|r| &r.id == id)
                .map_or(DesiredImage::Keep, |r| DesiredImage::Remove(r.reason));
            (id.clone(), value)
        }));
        self.stores.desired.mark_synced();
        let removed = self.settle(&removals, &actual_changes, &failure_changes).await;
        let freed =
            removals.iter().filter(|r| removed.contains(&r.id)).map(|r| r.size).fold(0, u64::saturating_add);
        if to_free > 0 && freed < to_free {
            let eligible = removals.iter().map(|r| r.size).fold(0, u64::saturating_add);
            self.events.record(
                Involved::Node,
                "Warning",
                "FreeDiskSpaceFailed",
                format!(
                    "Failed to garbage collect required amount of images. Attempted to free {to_free} bytes, \
                     but only found {eligible} bytes eligible to free."
                ),
                (self.clock)(),
            );
        }
        Ok(PassReport {
            request: request.map_or(0, |r| r.seq),
            to_free,
            planned: removals,
            removed: removed.into_iter().collect(),
            freed,
        })
    }

    /// Waits, at most the settle time, until every removal is done (the image left the actual
    /// store), failed, or will not run (the desired value changed, a pod uses the image); returns
    /// the IDs removed.
    async fn settle(
        &self,
        removals: &[Removal],
        actual_changes: &reconcile_engine::Subscription<ImageId>,
        failure_changes: &reconcile_engine::Subscription<ImageId>,
    ) -> BTreeSet<ImageId> {
        let deadline = tokio::time::Instant::now() + self.settle;
        loop {
            let mut removed = BTreeSet::new();
            let mut pending = false;
            for r in removals {
                match self.stores.actual.get(&r.id) {
                    None => {
                        removed.insert(r.id.clone());
                    }
                    Some(a) => {
                        let settled = self.stores.failures.contains_key(&r.id)
                            || self.stores.desired.reader().get(&r.id).as_deref()
                                != Some(&DesiredImage::Remove(r.reason))
                            || self.pods.uses(&a.image);
                        pending |= !settled;
                    }
                }
            }
            if !pending {
                return removed;
            }
            tokio::select! {
                () = actual_changes.changed() => { actual_changes.drain(); }
                () = failure_changes.changed() => { failure_changes.drain(); }
                () = tokio::time::sleep_until(deadline) => return removed,
            }
        }
    }

    /// Runs a pass now and every `period`, and one for each request, until `shutdown` completes.
    pub async fn run(mut self, period: Duration, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut answered = 0;
        let mut requests_open = true;
        loop {
            let request = tokio::select! {
                () = &mut shutdown => return,
                changed = self.requests.requests.changed(), if requests_open => match changed {
                    Ok(()) => Some(*self.requests.requests.borrow_and_update()),
                    Err(_) => {
                        requests_open = false;
                        continue;
                    }
                },
                _ = tick.tick() => None,
            };
            let result = tokio::select! {
                () = &mut shutdown => return,
                r = self.pass(request) => r,
            };
            let report = match result {
                Ok(report) => report,
                Err(e) => {
                    warn!(error = %e, "image garbage collection failed");
                    PassReport::default()
                }
            };
            answered = request.map_or(answered, |r| r.seq);
            self.requests.reports.send_replace(PassReport { request: answered, ..report });
        }
    }
}

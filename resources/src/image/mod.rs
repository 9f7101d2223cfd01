//! Image garbage collection, as a desired/actual pair on the engine (reconciler name `images`),
//! keyed by image ID.
//!
//! - **Desired** ([`desired::DesiredImage`]): `Keep`, or `Remove` with the reason (`space`,
//!   `age`). Written only by the [`populator`].
//! - **Actual** ([`actual::ImageActual`]): the runtime's images with their size, whether the
//!   runtime pins them, when nodelet first saw them and when a container last used them (kept in
//!   memory, as the kubelet does). Filled by reconstruction, the populator's listings (through
//!   the engine's observer) and the removals' outcomes.
//! - **Populator** ([`populator::ImagePopulator`]): every `imageGCPeriod` (and for each request to
//!   free space) lists images and containers and makes the batch decision over one snapshot
//!   ([`plan`]): when the image filesystem's usage reaches `imageGCHighThresholdPercent`, unused
//!   images, least recently used first, until it is down to `imageGCLowThresholdPercent`; images
//!   unused beyond `imageMaximumGCAge`; for a request, unused images, oldest used first, until
//!   the bytes asked for. Images in use (named by a desired pod, run by any container in the
//!   runtime), pinned images and images seen less than `imageMinimumGCAge` ago are never chosen.
//!   Events `FreeDiskSpaceFailed`, `InvalidDiskCapacity`.
//! - **Reconciler** ([`reconciler::ImageReconciler`]): runs one removal per image the desired
//!   state says to remove, after checking again that no pod uses it, it is not pinned and old
//!   enough, so a pod that appears after the decision keeps its image.
//! - **Operation** ([`ops::ImageOp::Remove`]) and **driver** ([`driver::ImageDriver`] over
//!   [`driver::ImageGcDriver`]: CRI `ListImages`, `ListContainers`, `ImageFsInfo`,
//!   `RemoveImage`, which nodelet-cri implements): `kubelet_image_garbage_collected_total{reason}`
//!   ([`metrics`]) and `ImageGCFailed` events.
//! - **Status** ([`status`]): each pass's report, and the [`status::FreeSpace`] channel through
//!   which the eviction pair's [`reclaim::ImagePairReclaimer`] asks for space and waits for
//!   the bytes freed.

pub mod actual;
pub mod desired;
pub mod driver;
pub mod metrics;
pub mod ops;
pub mod plan;
pub mod populator;
pub mod reclaim;
pub mod reconciler;
pub mod status;

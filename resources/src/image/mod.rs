//! Image garbage collection, as a desired/actual pair.
//!
//! - **Desired** ([`state::InUse`]): the images that must stay: those the desired pods'
//!   containers name and those any container in the runtime uses; pinned images and images
//!   seen less than `imageMinimumGCAge` ago are never candidates.
//! - **Actual** ([`state::Inventory`]): the runtime's images with their sizes, when nodelet
//!   first saw them and when a container last used them (kept in memory, as the kubelet does).
//! - **Reconciler** ([`plan::plan`]): when the image filesystem's usage reaches
//!   `imageGCHighThresholdPercent`, remove unused images, least recently used first, until it
//!   is down to `imageGCLowThresholdPercent`; remove images unused beyond `imageMaximumGCAge`.
//! - **Driver** ([`driver::ImageGcDriver`]): CRI `ListImages`, `ListContainers`,
//!   `ImageFsInfo`, `RemoveImage` (nodelet-cri implements it).
//! - **Runner** ([`gc::ImageGc`]): every 5 minutes (configurable), with events
//!   (`FreeDiskSpaceFailed`, `InvalidDiskCapacity`, `ImageGCFailed`) and
//!   `kubelet_image_garbage_collected_total{reason}`; also the eviction manager's first
//!   reclaimer under disk pressure.

pub mod driver;
pub mod gc;
pub mod plan;
pub mod state;

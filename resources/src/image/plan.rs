//! The image pair's batch decisions, made by the populator over one snapshot: from the images
//! that must stay, the images the runtime has and the image filesystem's usage, which images to
//! remove (least recently used first). Each chosen image then becomes one `Remove` in the desired
//! store and one operation on its own key.

use std::time::Duration;

use super::actual::{ImageActual, Inventory};
use super::desired::InUse;
use super::driver::ImageFs;

/// Image garbage collection settings (the kubelet's `imageGC*` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent`: collect once the disk usage reaches this (85). 100 disables
    /// collection for space.
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent`: collect down to this usage (80).
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge`: an image seen more recently than this is never removed (2 minutes).
    pub minimum_age: Duration,
    /// `imageMaximumGCAge`: an unused image not used for this long is removed whatever the disk
    /// usage (off by default).
    pub maximum_age: Option<Duration>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_age: Duration::from_secs(120),
            maximum_age: None,
        }
    }
}

/// Why an image is removed: the label of `kubelet_image_garbage_collected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Unused for longer than `imageMaximumGCAge`.
    Age,
    /// To bring the disk usage down.
    Space,
}

impl Reason {
    /// The metric label (`age`, `space`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::Space => "space",
        }
    }
}

/// One image to remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// Its ID.
    pub id: String,
    /// Its size.
    pub size: u64,
    /// Why.
    pub reason: Reason,
}

/// What one pass should do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GcPlan {
    /// Images to remove, in order.
    pub removals: Vec<Removal>,
    /// Bytes that must be freed for the disk usage to reach the low threshold (0 when below
    /// the high threshold).
    pub to_free: u64,
    /// Whether the removals free at least `to_free`.
    pub enough: bool,
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The runtime reported an image filesystem of capacity 0 (`InvalidDiskCapacity`).
    #[error("invalid capacity 0 on image filesystem")]
    InvalidDiskCapacity,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Unused images that may be removed at `now`, least recently used first.
fn candidates<'a>(
    policy: &ImageGcPolicy,
    inventory: &'a Inventory,
    in_use: &InUse,
    now: i64,
) -> Vec<&'a ImageActual> {
    let mut list: Vec<_> = inventory
        .images
        .values()
        .filter(|r| !r.image.pinned && !in_use.contains(&r.image))
        .filter(|r| now.saturating_sub(r.first_seen) >= nanos(policy.minimum_age))
        .collect();
    list.sort_by_key(|r| (r.last_used, r.first_seen, r.image.id.clone()));
    list
}

/// Plans a periodic pass: images unused beyond the maximum age, then, when the usage reached
/// the high threshold, unused images (LRU first) until it is down to the low threshold.
pub fn plan(
    policy: &ImageGcPolicy,
    inventory: &Inventory,
    in_use: &InUse,
    fs: ImageFs,
    now: i64,
) -> Result<GcPlan, PlanError> {
    let mut out = GcPlan { enough: true, ..GcPlan::default() };
    let list = candidates(policy, inventory, in_use, now);
    if let Some(max) = policy.maximum_age {
        for r in &list {
            if now.saturating_sub(r.last_used) > nanos(max) {
                out.removals.push(Removal {
                    id: r.image.id.clone(),
                    size: r.image.size,
                    reason: Reason::Age,
                });
            }
        }
    }
    if fs.capacity == 0 {
        return Err(PlanError::InvalidDiskCapacity);
    }
    let used_percent = 100u128 - u128::from(fs.available.min(fs.capacity)) * 100 / u128::from(fs.capacity);
    if policy.high_threshold_percent >= 100 || used_percent < u128::from(policy.high_threshold_percent) {
        return Ok(out);
    }
    let target_available =
        u128::from(fs.capacity) * u128::from(100 - policy.low_threshold_percent.min(100)) / 100;
    let to_free =
        u64::try_from(target_available.saturating_sub(u128::from(fs.available))).unwrap_or(u64::MAX);
    out.to_free = to_free;
    let mut freed = out.removals.iter().map(|r| r.size).fold(0, u64::saturating_add);
    for r in list {
        if freed >= to_free {
            break;
        }
        if out.removals.iter().any(|x| x.id == r.image.id) {
            continue;
        }
        freed = freed.saturating_add(r.image.size);
        out.removals.push(Removal { id: r.image.id.clone(), size: r.image.size, reason: Reason::Space });
    }
    out.enough = freed >= to_free;
    Ok(out)
}

/// Plans a request to free `bytes` (`None`: every unused image that may be removed, the kubelet's
/// `DeleteUnusedImages` under disk pressure): unused images, least recently used first, until
/// their sizes add up to `bytes`.
pub fn plan_free(
    policy: &ImageGcPolicy,
    inventory: &Inventory,
    in_use: &InUse,
    bytes: Option<u64>,
    now: i64,
) -> Vec<Removal> {
    let mut freed: u64 = 0;
    let mut out = Vec::new();
    for r in candidates(policy, inventory, in_use, now) {
        if bytes.is_some_and(|b| freed >= b) {
            break;
        }
        freed = freed.saturating_add(r.image.size);
        out.push(Removal { id: r.image.id.clone(), size: r.image.size, reason: Reason::Space });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::driver::RuntimeImage;
    use super::*;

    const S: i64 = 1_000_000_000;
    const MI: u64 = 1 << 20;

    fn image(id: &str, tag: &str, size: u64) -> RuntimeImage {
        RuntimeImage { id: id.into(), tags: vec![tag.into()], digests: vec![], size, pinned: false }
    }

    fn inventory(entries: &[(RuntimeImage, i64, i64)]) -> Inventory {
        let mut inv = Inventory::default();
        for (img, first, last) in entries {
            inv.images.insert(
                img.id.clone(),
                ImageActual { image: img.clone(), first_seen: *first, last_used: *last },
            );
        }
        inv
    }

    fn in_use(refs: &[&str]) -> InUse {
        InUse { references: refs.iter().map(|s| (*s).to_string()).collect() }
    }

    #[test]
    fn below_the_high_threshold_nothing_is_removed() {
        let inv = inventory(&[(image("a", "r/a:1", 10 * MI), 0, 0)]);
        let fs = ImageFs { capacity: 100 * MI, available: 16 * MI };
        let p = plan(&ImageGcPolicy::default(), &inv, &in_use(&[]), fs, 1000 * S).unwrap_or_default();
        assert_eq!(p.removals, vec![], "84% used is below 85%");
    }

    #[test]
    fn above_it_unused_images_go_lru_first_down_to_the_low_threshold() {
        let inv = inventory(&[
            (image("old", "r/old:1", 3 * MI), 0, 10 * S),
            (image("older", "r/older:1", 3 * MI), 0, 5 * S),
            (image("used", "r/used:1", 50 * MI), 0, 0),
            (image("newest", "r/newest:1", 3 * MI), 0, 20 * S),
            (RuntimeImage { pinned: true, ..image("pause", "r/pause:1", 1) }, 0, 0),
            (image("young", "r/young:1", 30 * MI), 990 * S, 990 * S),
        ]);
        // 90% used: free 10% of 100Mi to get to 80%.
        let fs = ImageFs { capacity: 100 * MI, available: 15 * MI };
        let p =
            plan(&ImageGcPolicy::default(), &inv, &in_use(&["r/used:1"]), fs, 1000 * S).unwrap_or_default();
        let ids: Vec<&str> = p.removals.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["older", "old"], "LRU first, stopping once 5Mi are freed");
        assert_eq!(p.to_free, 5 * MI);
        assert!(p.enough);
        // Needing more than the eligible images hold: all of them, and not enough.
        let fs = ImageFs { capacity: 100 * MI, available: 1 };
        let p =
            plan(&ImageGcPolicy::default(), &inv, &in_use(&["r/used:1"]), fs, 1000 * S).unwrap_or_default();
        let ids: Vec<&str> = p.removals.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            ["older", "old", "newest"],
            "never the one in use, the pinned one or one seen <2m ago"
        );
        assert!(!p.enough);
        assert_eq!(
            plan(&ImageGcPolicy::default(), &inv, &in_use(&[]), ImageFs::default(), 0),
            Err(PlanError::InvalidDiskCapacity)
        );
    }

    #[test]
    fn the_maximum_age_removes_unused_images_whatever_the_usage() {
        let inv = inventory(&[
            (image("stale", "r/stale:1", MI), 0, 0),
            (image("fresh", "r/fresh:1", MI), 0, 900 * S),
        ]);
        let policy =
            ImageGcPolicy { maximum_age: Some(Duration::from_secs(600)), ..ImageGcPolicy::default() };
        let fs = ImageFs { capacity: 100 * MI, available: 90 * MI };
        let p = plan(&policy, &inv, &in_use(&[]), fs, 1000 * S).unwrap_or_default();
        assert_eq!(p.removals, vec![Removal { id: "stale".into(), size: MI, reason: Reason::Age }]);
    }

    #[test]
    fn image_sizes_from_the_runtime_add_up_without_overflowing() {
        let inv = inventory(&[
            (image("huge", "r/huge:1", u64::MAX), 0, 0),
            (image("huger", "r/huger:1", u64::MAX), 0, 0),
            (image("more", "r/more:1", u64::MAX), 0, 10 * S),
        ]);
        let policy =
            ImageGcPolicy { maximum_age: Some(Duration::from_secs(600)), ..ImageGcPolicy::default() };
        let fs = ImageFs { capacity: u64::MAX, available: 0 };
        let p = plan(&policy, &inv, &in_use(&[]), fs, 1000 * S).unwrap_or_default();
        assert_eq!(p.removals.len(), 3, "{p:?}");
        assert!(p.enough);
        assert_eq!(plan_free(&policy, &inv, &in_use(&[]), None, 1000 * S).len(), 3);
    }

    #[test]
    fn a_request_frees_n_bytes_oldest_used_first_or_everything_unused() {
        let inv = inventory(&[
            (image("a", "r/a:1", 3 * MI), 0, 30 * S),
            (image("b", "r/b:1", 3 * MI), 0, 10 * S),
            (image("c", "r/c:1", 3 * MI), 0, 20 * S),
            (image("d", "r/d:1", 3 * MI), 0, 0),
        ]);
        let policy = ImageGcPolicy::default();
        let ids = |r: Vec<Removal>| r.into_iter().map(|r| r.id).collect::<Vec<_>>();
        let used = in_use(&["r/d:1"]);
        assert_eq!(ids(plan_free(&policy, &inv, &used, Some(4 * MI), 1000 * S)), ["b", "c"]);
        assert_eq!(ids(plan_free(&policy, &inv, &used, Some(1), 1000 * S)), ["b"]);
        assert_eq!(ids(plan_free(&policy, &inv, &used, None, 1000 * S)), ["b", "c", "a"]);
        assert!(plan_free(&policy, &inv, &used, None, 60 * S).is_empty(), "all younger than 2 minutes");
    }
}

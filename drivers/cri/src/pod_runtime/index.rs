//! Which sandboxes and containers each pod has, as far as nodelet knows: filled by its listings
//! and by its own creations and removals, so that one pod's state can be read with a status call
//! per object instead of a filtered listing.
//!
//! containerd answers a filtered `ListPodSandbox`/`ListContainers` by converting every object it
//! has and then filtering, so each per-pod read through a listing costs as much as a listing of
//! the whole node; at 250 pods the reads after each operation (and the PLEG's reads on events)
//! made a pod start quadratic in the pods. `PodSandboxStatus` and `ContainerStatus` cost the same
//! whatever the node runs.
//!
//! The index may name objects that are gone (a status call then says so, and they are dropped); it
//! never misses one of a pod it answers for. That holds when:
//! * it has seen a full listing;
//! * every object nodelet created since was added when its creation returned, and a creation whose
//!   result is unknown (it failed) made the pod [`dirty`](PodIndex::dirty) until a listing that
//!   started after that failure;
//! * a listing drops only objects that were known before it started (an object created while it ran
//!   may be missing from it).
//!
//! Objects made by others under nodelet's labels are found by the next full listing (the PLEG's).

use foldhash::{HashMap, HashSet, HashSetExt};

use crate::labels::{self, Lookup};
use crate::listing::{ListedContainer, ListedSandbox};

/// One pod's objects: sandbox IDs, and container IDs with their sandbox's ID, each with the tick
/// it was learnt at.
#[derive(Debug, Default)]
struct PodIds {
    sandboxes: HashMap<String, u64>,
    containers: HashMap<String, (String, u64)>,
    /// A creation for the pod failed at this tick: its result is unknown until a listing started later.
    dirty: Option<u64>,
}

impl PodIds {
    fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty() && self.dirty.is_none()
    }
}

/// The objects of one pod the index answers for (see [`PodIndex::objects`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PodObjects {
    /// Sandbox IDs.
    pub(super) sandboxes: Vec<String>,
    /// Container IDs, each with its sandbox's ID.
    pub(super) containers: Vec<(String, String)>,
}

/// Where a listing started, to apply it with [`PodIndex::listed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ListingStart(u64);

/// The pods' objects (see the module docs).
#[derive(Debug, Default)]
pub(super) struct PodIndex {
    /// A full listing has been applied.
    complete: bool,
    /// Orders listings' starts against creations and failures.
    ticks: u64,
    pods: HashMap<String, PodIds>,
    /// Each indexed object's pod UID.
    owners: HashMap<String, String>,
}

impl PodIndex {
    fn tick(&mut self) -> u64 {
        self.ticks += 1;
        self.ticks
    }

    /// Whether the pod `uid` has a creation whose result is unknown.
    pub(super) fn dirty(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|p| p.dirty.is_some())
    }

    /// The objects of the pod `uid`, when the index can answer for it (complete, and the pod not
    /// dirty); `None` when a listing must.
    pub(super) fn objects(&self, uid: &str) -> Option<PodObjects> {
        if !self.complete || self.dirty(uid) {
            return None;
        }
        let Some(pod) = self.pods.get(uid) else { return Some(PodObjects::default()) };
        Some(PodObjects {
            sandboxes: pod.sandboxes.keys().cloned().collect(),
            containers: pod
                .containers
                .iter()
                .map(|(id, (sandbox, _))| (id.clone(), sandbox.clone()))
                .collect(),
        })
    }

    /// A listing starts now.
    pub(super) fn start_listing(&mut self) -> ListingStart {
        ListingStart(self.tick())
    }

    /// nodelet created the sandbox `id` of the pod `uid`.
    pub(super) fn add_sandbox(&mut self, uid: &str, id: &str) {
        let tick = self.tick();
        self.pods.entry(uid.to_owned()).or_default().sandboxes.insert(id.to_owned(), tick);
        self.owners.insert(id.to_owned(), uid.to_owned());
    }

    /// nodelet created the container `id` of the pod `uid` in the sandbox `sandbox`.
    pub(super) fn add_container(&mut self, uid: &str, id: &str, sandbox: &str) {
        let tick = self.tick();
        self.pods
            .entry(uid.to_owned())
            .or_default()
            .containers
            .insert(id.to_owned(), (sandbox.to_owned(), tick));
        self.owners.insert(id.to_owned(), uid.to_owned());
    }

    /// A creation for the pod `uid` failed: whether it made something is unknown.
    pub(super) fn creation_failed(&mut self, uid: &str) {
        let tick = self.tick();
        self.pods.entry(uid.to_owned()).or_default().dirty = Some(tick);
    }

    /// The object `id` is gone (removed, or a status call found none).
    pub(super) fn remove(&mut self, id: &str) {
        let Some(uid) = self.owners.remove(id) else { return };
        if let Some(pod) = self.pods.get_mut(&uid) {
            pod.sandboxes.remove(id);
            pod.containers.remove(id);
            if pod.is_empty() {
                self.pods.remove(&uid);
            }
        }
    }

    /// Applies a listing that started at `start`: of every pod (`uid` `None`: then the index is
    /// complete) or of the pod `uid`. Listed objects are added; objects known before the start and
    /// not listed are dropped; a failure before the start no longer makes its pod dirty.
    pub(super) fn listed(
        &mut self,
        start: ListingStart,
        uid: Option<&str>,
        sandboxes: &[ListedSandbox],
        containers: &[ListedContainer],
    ) {
        let ListingStart(start) = start;
        // Sandboxes (no sandbox ID beside), then containers (with their sandbox's), of the pod `uid`
        // when given.
        let items = || {
            sandboxes
                .iter()
                .map(|s| (s.id.as_str(), &s.labels, None))
                .chain(containers.iter().map(|c| (c.id.as_str(), &c.labels, Some(c.pod_sandbox_id.as_str()))))
                .filter_map(move |(id, object_labels, sandbox)| {
                    let owner = object_labels.value(labels::POD_UID)?;
                    uid.is_none_or(|u| u == owner).then_some((id, owner, sandbox))
                })
        };
        let (mut listed, mut known) = (0, 0);
        for (id, owner, sandbox) in items() {
            listed += 1;
            // On a steady node every object is known already: look up before copying a key.
            if self.owners.contains_key(id) {
                known += 1;
                continue;
            }
            let pod = self.pods.entry(owner.to_owned()).or_default();
            if let Some(sandbox) = sandbox {
                pod.containers.insert(id.to_owned(), (sandbox.to_owned(), start));
            } else {
                pod.sandboxes.insert(id.to_owned(), start);
            }
            self.owners.insert(id.to_owned(), owner.to_owned());
        }
        // A whole listing that found every object known and the index holding no others (the
        // runtime's IDs are unique) drops nothing: a quiet node's relist skips the comparison.
        let drops_nothing = uid.is_none() && known == listed && self.owners.len() == listed;
        if drops_nothing {
            for pod in self.pods.values_mut() {
                if pod.dirty.is_some_and(|at| at < start) {
                    pod.dirty = None;
                }
            }
        } else {
            let seen: HashSet<&str> = {
                let mut seen = HashSet::with_capacity(listed);
                seen.extend(items().map(|(id, _, _)| id));
                seen
            };
            let owners = &mut self.owners;
            self.pods.retain(|pod_uid, pod| {
                if uid.is_some_and(|u| u != pod_uid) {
                    return true;
                }
                pod.sandboxes.retain(|id, learnt| {
                    let keep = *learnt >= start || seen.contains(id.as_str());
                    if !keep {
                        owners.remove(id);
                    }
                    keep
                });
                pod.containers.retain(|id, (_, learnt)| {
                    let keep = *learnt >= start || seen.contains(id.as_str());
                    if !keep {
                        owners.remove(id);
                    }
                    keep
                });
                if pod.dirty.is_some_and(|at| at < start) {
                    pod.dirty = None;
                }
                !pod.is_empty()
            });
        }
        if uid.is_none() {
            self.complete = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::Entry;

    fn sandbox(id: &str, uid: &str) -> ListedSandbox {
        ListedSandbox {
            id: id.into(),
            labels: vec![Entry { key: labels::POD_UID.into(), value: uid.into() }],
            ..Default::default()
        }
    }

    fn container(id: &str, uid: &str, sandbox: &str) -> ListedContainer {
        ListedContainer {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            labels: vec![Entry { key: labels::POD_UID.into(), value: uid.into() }],
            ..Default::default()
        }
    }

    fn sorted(mut objects: PodObjects) -> PodObjects {
        objects.sandboxes.sort();
        objects.containers.sort();
        objects
    }

    fn objects(sandboxes: &[&str], containers: &[(&str, &str)]) -> PodObjects {
        PodObjects {
            sandboxes: sandboxes.iter().map(|s| (*s).to_owned()).collect(),
            containers: containers.iter().map(|(c, s)| ((*c).to_owned(), (*s).to_owned())).collect(),
        }
    }

    #[test]
    fn answers_only_after_a_full_listing() {
        let mut index = PodIndex::default();
        index.add_sandbox("a", "s1");
        assert_eq!(index.objects("a"), None, "no full listing yet");
        let start = index.start_listing();
        index.listed(start, Some("a"), &[sandbox("s1", "a")], &[]);
        assert_eq!(index.objects("a"), None, "a pod's listing does not make the index complete");
        let start = index.start_listing();
        index.listed(start, None, &[sandbox("s1", "a")], &[container("c1", "a", "s1")]);
        assert!(index.complete);
        assert_eq!(index.objects("a").map(sorted), Some(objects(&["s1"], &[("c1", "s1")])));
        assert_eq!(index.objects("b"), Some(PodObjects::default()), "a pod not listed has nothing");
        assert_eq!(index.owners.get("c1").map(String::as_str), Some("a"));
    }

    #[test]
    fn creations_during_a_listing_survive_it() {
        let mut index = PodIndex::default();
        let start = index.start_listing();
        index.listed(start, None, &[sandbox("s1", "a")], &[]);
        let start = index.start_listing();
        // Created while the listing ran, and missing from it.
        index.add_container("a", "c1", "s1");
        index.listed(start, None, &[sandbox("s1", "a")], &[]);
        assert_eq!(index.objects("a").map(sorted), Some(objects(&["s1"], &[("c1", "s1")])));
        // A later listing that does not have it drops it.
        let start = index.start_listing();
        index.listed(start, None, &[sandbox("s1", "a")], &[]);
        assert_eq!(index.objects("a").map(sorted), Some(objects(&["s1"], &[])));
        assert!(!index.owners.contains_key("c1"));
    }

    #[test]
    fn a_failed_creation_makes_the_pod_unanswerable_until_a_later_listing() {
        let mut index = PodIndex::default();
        let start = index.start_listing();
        index.listed(start, None, &[sandbox("s1", "a")], &[]);
        let early = index.start_listing();
        index.creation_failed("a");
        assert_eq!(index.objects("a"), None);
        assert_eq!(index.objects("b"), Some(PodObjects::default()), "other pods are answered");
        // A listing that started before the failure may have missed what it made.
        index.listed(early, Some("a"), &[sandbox("s1", "a")], &[]);
        assert_eq!(index.objects("a"), None);
        let late = index.start_listing();
        index.listed(late, Some("a"), &[sandbox("s1", "a")], &[container("c9", "a", "s1")]);
        assert_eq!(index.objects("a").map(sorted), Some(objects(&["s1"], &[("c9", "s1")])));
    }

    #[test]
    fn a_listing_that_matches_the_index_keeps_it_and_clears_earlier_failures() {
        let mut index = PodIndex::default();
        let (sandboxes, containers) =
            ([sandbox("s1", "a"), sandbox("s2", "b")], [container("c1", "a", "s1")]);
        let start = index.start_listing();
        index.listed(start, None, &sandboxes, &containers);
        index.creation_failed("b");
        assert_eq!(index.objects("b"), None);
        // Every listed object known, nothing else known: the quiet node's case.
        let start = index.start_listing();
        index.listed(start, None, &sandboxes, &containers);
        assert_eq!(index.objects("a").map(sorted), Some(objects(&["s1"], &[("c1", "s1")])));
        assert_eq!(index.objects("b").map(sorted), Some(objects(&["s2"], &[])), "the failure is older");
        // As many objects listed as known, but one of them new: the one no longer listed goes.
        let start = index.start_listing();
        index.listed(start, None, &sandboxes, &[container("c2", "a", "s1")]);
        assert_eq!(index.objects("a").map(sorted), Some(objects(&["s1"], &[("c2", "s1")])));
        assert!(!index.owners.contains_key("c1"));
    }

    #[test]
    fn a_pods_listing_leaves_the_other_pods_alone() {
        let mut index = PodIndex::default();
        let start = index.start_listing();
        index.listed(start, None, &[sandbox("s1", "a"), sandbox("s2", "b")], &[]);
        let start = index.start_listing();
        index.listed(start, Some("a"), &[], &[]);
        assert_eq!(index.objects("a"), Some(PodObjects::default()));
        assert_eq!(index.objects("b").map(sorted), Some(objects(&["s2"], &[])));
        assert!(!index.owners.contains_key("s1"));
    }

    #[test]
    fn removals_forget_objects_and_empty_pods() {
        let mut index = PodIndex::default();
        let start = index.start_listing();
        index.listed(start, None, &[], &[]);
        index.add_sandbox("a", "s1");
        index.add_container("a", "c1", "s1");
        index.remove("c1");
        index.remove("s1");
        index.remove("unknown");
        assert_eq!(index.objects("a"), Some(PodObjects::default()));
        assert!(index.pods.is_empty() && index.owners.is_empty());
    }
}

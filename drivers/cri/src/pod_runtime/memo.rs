//! Reuse of the pods a listing built last time: a pod's [`ListedPod`] (its `PodActual` and its
//! `PodSandboxes`) is a function of its listed sandboxes and containers (their IDs and states;
//! everything else the listing carries is fixed for an ID) and of the runtime facts cached for them,
//! so a pod whose items and facts are the same as at the previous listing gets the same `Arc`s again
//! instead of new ones.
//!
//! On a quiet node every relist finds every pod unchanged: it builds no record and copies no
//! string, where it built one record per pod per second before (the steady allocation churn
//! that kept the allocator's arenas growing with the pods).

use std::hash::{DefaultHasher, Hash, Hasher};

use foldhash::{HashMap, HashMapExt};
use nodelet_resources::model::actual::ListedPod;

use crate::labels::{self, Lookup};
use crate::listing::{ListedContainer, ListedSandbox};

/// A pod's signature: what its `ListedPod` is built from, as one number. Order-independent, as
/// the runtime lists in no fixed order.
pub(super) type Signature = u64;

/// The last built `ListedPod` of each pod, with the signature it was built from.
#[derive(Debug, Default)]
pub(super) struct Memo {
    pods: HashMap<String, (Signature, ListedPod)>,
}

/// One listed item's part of its pod's signature.
fn item(kind: u8, id: &str, state: i32, facts: Option<u64>) -> Signature {
    let mut h = DefaultHasher::new();
    (kind, id, state, facts).hash(&mut h);
    h.finish()
}

/// The signature of every pod the listing names (by its UID label). `sandbox_facts` says whether
/// facts are cached for a sandbox, `container_facts` which version of a container's facts is cached
/// (`None`: none), `skip` whether a container is left out (gone while the listing was read).
pub(super) fn signatures<'a>(
    sandboxes: &'a [ListedSandbox],
    containers: &'a [ListedContainer],
    sandbox_facts: impl Fn(&str) -> bool,
    container_facts: impl Fn(&str) -> Option<u64>,
    skip: impl Fn(&str) -> bool,
) -> HashMap<&'a str, Signature> {
    let mut signatures: HashMap<&str, Signature> = HashMap::new();
    for s in sandboxes {
        let Some(uid) = s.labels.value(labels::POD_UID) else { continue };
        let part = item(0, &s.id, s.state, sandbox_facts(&s.id).then_some(0));
        let sig = signatures.entry(uid).or_default();
        *sig = sig.wrapping_add(part);
    }
    for c in containers {
        if skip(&c.id) {
            continue;
        }
        let Some(uid) = c.labels.value(labels::POD_UID) else { continue };
        let part = item(1, &c.id, c.state, container_facts(&c.id));
        let sig = signatures.entry(uid).or_default();
        *sig = sig.wrapping_add(part);
    }
    signatures
}

impl Memo {
    /// The pod `uid` as built last time, if it was built from `signature`.
    pub(super) fn get(&self, uid: &str, signature: Signature) -> Option<ListedPod> {
        self.pods.get(uid).filter(|(s, _)| *s == signature).map(|(_, pod)| pod.clone())
    }

    /// Remembers `pod`, built from `signature`.
    pub(super) fn insert(&mut self, uid: &str, signature: Signature, pod: ListedPod) {
        match self.pods.get_mut(uid) {
            Some(entry) => *entry = (signature, pod),
            None => {
                self.pods.insert(uid.to_owned(), (signature, pod));
            }
        }
    }

    /// Forgets the pods `keep` rejects (after a whole listing: the pods the runtime no longer has).
    pub(super) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.pods.retain(|uid, _| keep(uid));
    }

    /// Forgets the pod `uid`.
    pub(super) fn remove(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// How many pods it remembers.
    pub(super) fn len(&self) -> usize {
        self.pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::Entry;
    use k8s_cri::v1;
    use nodelet_resources::model::actual::PodActual;
    use std::sync::Arc;

    fn sandbox(id: &str, uid: &str, state: v1::PodSandboxState) -> ListedSandbox {
        ListedSandbox {
            id: id.into(),
            labels: vec![Entry { key: labels::POD_UID.into(), value: uid.into() }],
            state: state as i32,
            ..Default::default()
        }
    }

    fn container(id: &str, uid: &str, state: v1::ContainerState) -> ListedContainer {
        ListedContainer {
            id: id.into(),
            labels: vec![Entry { key: labels::POD_UID.into(), value: uid.into() }],
            state: state as i32,
            ..Default::default()
        }
    }

    fn sigs<'a>(
        sandboxes: &'a [ListedSandbox],
        containers: &'a [ListedContainer],
        facts: &'a std::collections::HashMap<&str, u64>,
    ) -> HashMap<&'a str, Signature> {
        signatures(sandboxes, containers, |_| true, |id| facts.get(id).copied(), |_| false)
    }

    #[test]
    fn a_signature_changes_with_a_state_an_item_or_a_fact_and_not_with_the_order() {
        let sandboxes = vec![sandbox("s1", "a", v1::PodSandboxState::SandboxReady)];
        let running = v1::ContainerState::ContainerRunning;
        let containers = vec![container("c1", "a", running), container("c2", "a", running)];
        let facts = std::collections::HashMap::from([("c1", 1), ("c2", 2)]);
        let base = sigs(&sandboxes, &containers, &facts)["a"];

        let reversed: Vec<_> = containers.iter().rev().cloned().collect();
        assert_eq!(sigs(&sandboxes, &reversed, &facts)["a"], base, "order must not matter");

        let mut exited = containers.clone();
        exited[1].state = v1::ContainerState::ContainerExited as i32;
        assert_ne!(sigs(&sandboxes, &exited, &facts)["a"], base, "a state change");

        let newer_facts = std::collections::HashMap::from([("c1", 1), ("c2", 3)]);
        assert_ne!(sigs(&sandboxes, &containers, &newer_facts)["a"], base, "refetched facts");

        let fewer = vec![containers[0].clone()];
        assert_ne!(sigs(&sandboxes, &fewer, &facts)["a"], base, "a container gone");

        let not_ready = vec![sandbox("s1", "a", v1::PodSandboxState::SandboxNotready)];
        assert_ne!(sigs(&not_ready, &containers, &facts)["a"], base, "the sandbox stopped");

        let gone_while_listed =
            signatures(&sandboxes, &containers, |_| true, |id| facts.get(id).copied(), |id| id == "c2");
        assert_ne!(gone_while_listed["a"], base, "a skipped container");

        let no_sandbox_facts =
            signatures(&sandboxes, &containers, |_| false, |id| facts.get(id).copied(), |_| false);
        assert_ne!(no_sandbox_facts["a"], base, "sandbox facts not cached yet");
    }

    #[test]
    fn pods_are_signed_apart_and_items_without_a_uid_are_left_out() {
        let ready = v1::PodSandboxState::SandboxReady;
        let sandboxes = vec![sandbox("s1", "a", ready), sandbox("s2", "b", ready), ListedSandbox::default()];
        let facts = std::collections::HashMap::new();
        let signed = sigs(&sandboxes, &[], &facts);
        assert_eq!(signed.len(), 2);
        assert_ne!(signed["a"], signed["b"]);
    }

    #[test]
    fn the_memo_answers_only_for_the_signature_it_was_given() {
        let mut memo = Memo::default();
        let pod = ListedPod {
            pod: Arc::new(PodActual { uid: "a".into(), ..PodActual::default() }),
            ..ListedPod::default()
        };
        memo.insert("a", 7, pod.clone());
        assert!(memo.get("a", 7).is_some_and(|p| p.same(&pod)));
        assert!(memo.get("a", 8).is_none());
        assert!(memo.get("b", 7).is_none());
        memo.insert("b", 1, pod.clone());
        memo.retain(|uid| uid == "b");
        assert_eq!(memo.len(), 1);
        memo.remove("b");
        assert_eq!(memo.len(), 0);
    }
}

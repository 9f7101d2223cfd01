//! Actual state of sandboxes: what the runtime reports for each pod UID.
//!
//! Rebuilt from the runtime (the labels nodelet puts on its sandboxes), so a restarted nodelet
//! finds its sandboxes again.

pub use crate::model::actual::SandboxRecord;

/// The sandboxes of one pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSandboxes {
    /// The pod's UID.
    pub uid: String,
    /// Its namespace, as labelled.
    pub namespace: String,
    /// Its name, as labelled.
    pub name: String,
    /// Its sandboxes, newest first (normally one; more after a sandbox was replaced).
    pub sandboxes: Vec<SandboxRecord>,
    /// An operation ended with an unknown result: read the runtime again before planning.
    pub needs_refresh: bool,
}

impl PodSandboxes {
    /// The newest sandbox, if any.
    pub fn newest(&self) -> Option<&SandboxRecord> {
        self.sandboxes.first()
    }

    /// The newest sandbox if it is ready.
    pub fn ready(&self) -> Option<&SandboxRecord> {
        self.newest().filter(|s| s.ready)
    }

    /// The sandbox part of a pod's runtime listing (`None` if it has no sandbox).
    pub fn of(pod: &crate::model::actual::PodActual) -> Option<Self> {
        (!pod.sandboxes.is_empty()).then(|| Self {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            sandboxes: pod.sandboxes.clone(),
            needs_refresh: false,
        })
    }
}

//! Ephemeral containers that `nodelet debug` added to static pods (`POST /debug/{namespace}/{pod}` on the
//! main port): the API server keeps an API pod's ephemeral containers; for a static pod nodelet keeps them
//! itself, in `<root-dir>/debug/ephemeral-containers.json`, by pod UID.
//!
//! The file is replaced atomically ([`nodelet_node::atomic`]) before the pod config merges the new container into
//! the desired pod, so an added ephemeral container is never lost: after a nodelet restart the pod config
//! merges the file's containers into the static pods again (see [`super::PodConfig::with_debug_state`]),
//! and the pod reconciler, which finds their records in the runtime, does not start them a second time.
//! A static pod whose manifest changes gets a new UID, so, as for an API pod that is recreated, its
//! ephemeral containers go with the old pod; entries of pods no source has any more are dropped once
//! every source has reported.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::EphemeralContainer;
use nodelet_resources::model::pod::PodUid;

use nodelet_node::atomic::{AtomicWriteError, write_atomically};

/// The state file's name under `<root-dir>/debug`.
pub(crate) const STATE_FILE: &str = "ephemeral-containers.json";

/// Why an ephemeral container could not be added (declared by the servers, which answer `POST /debug` with it).
pub use nodelet_server::DebugError;

/// Why the state file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading it failed.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It is not what nodelet writes.
    #[error("cannot parse {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// The file's content.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct StateFile {
    /// The ephemeral containers of each static pod, by UID, in the order they were added.
    pods: BTreeMap<PodUid, Vec<EphemeralContainer>>,
}

/// The ephemeral containers of static pods, as last saved.
#[derive(Debug)]
pub struct DebugState {
    path: PathBuf,
    pods: BTreeMap<PodUid, Vec<EphemeralContainer>>,
}

impl DebugState {
    /// The state kept in `dir` (created if missing): what the file holds, or nothing if there is none.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join(STATE_FILE);
        let read_err = |source| LoadError::Read { path: path.clone(), source };
        std::fs::create_dir_all(dir).map_err(read_err)?;
        let pods = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: StateFile = serde_json::from_slice(&bytes)
                    .map_err(|source| LoadError::Parse { path: path.clone(), source })?;
                file.pods
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(read_err(e)),
        };
        Ok(Self { path, pods })
    }

    /// An empty state that is saved to `path` (for a state file that could not be read: it is replaced
    /// only when a container is added).
    pub fn empty(dir: &Path) -> Self {
        Self { path: dir.join(STATE_FILE), pods: BTreeMap::new() }
    }

    /// The ephemeral containers added to the pod `uid`.
    pub fn containers(&self, uid: &str) -> &[EphemeralContainer] {
        self.pods.get(uid).map_or(&[], Vec::as_slice)
    }

    /// Adds `container` to the pod `uid` and saves; on failure nothing is added.
    pub fn add(&mut self, uid: &str, container: EphemeralContainer) -> Result<(), AtomicWriteError> {
        self.pods.entry(uid.to_owned()).or_default().push(container);
        if let Err(e) = self.save() {
            if let Some(list) = self.pods.get_mut(uid) {
                list.pop();
                if list.is_empty() {
                    self.pods.remove(uid);
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Forgets the pods not in `keep` (saved when something changed).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.pods.len();
        self.pods.retain(|uid, _| keep(uid));
        if self.pods.len() != before
            && let Err(e) = self.save()
        {
            tracing::warn!(error = %e, "cannot save the ephemeral containers of static pods");
        }
    }

    fn save(&self) -> Result<(), AtomicWriteError> {
        let file = StateFile { pods: self.pods.clone() };
        let bytes = serde_json::to_vec_pretty(&file)
            .map_err(|e| AtomicWriteError { path: self.path.clone(), source: std::io::Error::other(e) })?;
        write_atomically(&self.path, &bytes, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debugger(name: &str) -> EphemeralContainer {
        EphemeralContainer { name: name.into(), image: Some("busybox".into()), ..Default::default() }
    }

    #[test]
    fn added_containers_survive_a_reload_and_gone_pods_are_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut state = DebugState::load(dir.path()).expect("load");
        assert!(state.containers("u1").is_empty());
        state.add("u1", debugger("a")).expect("add");
        state.add("u1", debugger("b")).expect("add");
        state.add("u2", debugger("c")).expect("add");
        let mut again = DebugState::load(dir.path()).expect("reload");
        let names: Vec<&str> = again.containers("u1").iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        again.retain(|uid| uid == "u1");
        let third = DebugState::load(dir.path()).expect("reload");
        assert!(third.containers("u2").is_empty());
        assert_eq!(third.containers("u1").len(), 2);
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(STATE_FILE), b"{not json").expect("write");
        assert!(matches!(DebugState::load(dir.path()), Err(LoadError::Parse { .. })));
    }
}

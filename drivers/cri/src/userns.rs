//! User namespaces for pods (`spec.hostUsers: false`, KEP-127), as the kubelet 1.28 allocates them
//! (`pkg/kubelet/userns`): each such pod gets its own range of 65536 host UIDs and GIDs, mapped to 0–65535 in
//! the pod, passed to the runtime as `NamespaceOption.userns_options` (mode `POD`) of its sandbox and its
//! containers.
//!
//! * **Ranges.** The host's 2³² IDs are cut into blocks of 65536; block 0 (the host's own users) and block 1
//!   (kept free by the kubelet) are never given; a pod gets the first free block from 2 on, so its host IDs
//!   start at a multiple of 65536 from 131072 on. At most [`MAX_PODS`] pods (the kubelet's 1024) have one
//!   at a time; the next fails with an error naming the limit.
//! * **Persistence.** The allocation is written, before the sandbox is created, to `<root-dir>/pods/<uid>/userns`
//!   in the kubelet's format (`{"uidMappings":[{"hostId":…,"containerId":0,"length":65536}],"gidMappings":[…]}`,
//!   written to a temporary file, synced, renamed, the directory synced), and read back at start, so a pod keeps
//!   its range across restarts of nodelet.
//! * **Release.** When the pod's last sandbox is removed, the range is freed and the file removed. At start,
//!   [`UsernsAllocator::retain`] frees the ranges of pods that have no sandbox in the runtime (pods removed
//!   while nodelet was down, or that never got a sandbox), so none leaks across restarts.
//! * **A file that does not parse** or holds what nodelet never writes (not exactly one mapping of 65536 from
//!   0, different UID and GID mappings, a reserved or unaligned range, a range another pod has) is not trusted
//!   and not freed: the pod's sandbox and containers fail with an error naming the file, the other pods go
//!   on (the kubelet refuses to start instead). The file stays for the operator; it goes with the pod.
//!
//! Whether the runtime can run such a pod is asked of the runtime, by the CRI alone: `Status`'s
//! `runtime_handlers[].features.user_namespaces` (containerd 2.x reports it from runc's idmapped-mount
//! support, `runc features`). A handler that does not report it (containerd 1.x reports no handlers) gets no
//! such pod: it fails with `CreatePodSandboxError` naming `spec.hostUsers`, and is never run with the host's
//! users instead.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_cri::v1;
use serde::{Deserialize, Serialize};

/// The IDs of one pod's user namespace (the kubelet's `userNsLength`).
pub const RANGE_LENGTH: u32 = 1 << 16;
/// The most pods with a user namespace at once (the kubelet's `maxPods` of its user namespace manager).
pub const MAX_PODS: usize = 1024;
/// The first block given to a pod: blocks 0 (the host's IDs) and 1 (kept free by the kubelet) never are.
const FIRST_BLOCK: u32 = 2;
/// The number of blocks of [`RANGE_LENGTH`] IDs in the 32-bit ID space.
const BLOCKS: u32 = ((u32::MAX as u64 + 1) / RANGE_LENGTH as u64) as u32;
/// The name of the allocation file in a pod's directory (the kubelet's `mappingsFile`).
pub const MAPPINGS_FILE: &str = "userns";

/// Why a pod has no user namespace.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// [`MAX_PODS`] pods have one already (or no block is free).
    #[error("limit on count of pods with user namespaces exceeded (limit is {limit})")]
    Exhausted {
        /// The limit.
        limit: usize,
    },
    /// The pod's allocation file could not be trusted.
    #[error("the user namespace allocation {path} is not usable ({reason}); remove the pod")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The allocation could not be written or read.
    #[error("user namespace allocation {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The pod's UID cannot name a directory.
    #[error("pod UID {0:?} cannot name a pod directory")]
    BadUid(String),
}

/// One mapping in the kubelet's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IdMapping {
    host_id: u32,
    container_id: u32,
    length: u32,
}

/// Why a `userns` file found at startup is not an allocation nodelet (or the kubelet) made.
#[derive(Debug, thiserror::Error)]
enum MappingsFileError {
    /// The file is not the kubelet's JSON.
    #[error("does not parse: {0}")]
    Parse(#[from] serde_json::Error),
    /// Not exactly one UID mapping.
    #[error("exactly one UID mapping expected")]
    NotOneUidMapping,
    /// The GID mapping differs from the UID mapping.
    #[error("the GID mapping must equal the UID mapping")]
    GidDiffers,
    /// The mapping does not start at ID 0 in the pod.
    #[error("the mapping must start at ID 0 in the pod")]
    NotFromZero,
    /// The mapping's length is not the range length.
    #[error("the mapping must have {RANGE_LENGTH} IDs, not {0}")]
    Length(u32),
    /// The host ID is not at the start of a block.
    #[error("host ID {0} is not a multiple of {RANGE_LENGTH}")]
    Unaligned(u32),
    /// The host IDs are in the reserved blocks.
    #[error("host IDs from {0} are reserved")]
    Reserved(u32),
}

/// The kubelet's `userns` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MappingsFile {
    uid_mappings: Vec<IdMapping>,
    gid_mappings: Vec<IdMapping>,
}

impl MappingsFile {
    fn for_block(block: u32) -> Self {
        let mapping = IdMapping { host_id: block * RANGE_LENGTH, container_id: 0, length: RANGE_LENGTH };
        MappingsFile { uid_mappings: vec![mapping], gid_mappings: vec![mapping] }
    }

    /// The block of a file nodelet (or the kubelet) wrote; `Err` with why it is not one.
    fn block(&self) -> Result<u32, MappingsFileError> {
        let [uid] = self.uid_mappings.as_slice() else {
            return Err(MappingsFileError::NotOneUidMapping);
        };
        if self.gid_mappings.as_slice() != [*uid] {
            return Err(MappingsFileError::GidDiffers);
        }
        if uid.container_id != 0 {
            return Err(MappingsFileError::NotFromZero);
        }
        if uid.length != RANGE_LENGTH {
            return Err(MappingsFileError::Length(uid.length));
        }
        if uid.host_id % RANGE_LENGTH != 0 {
            return Err(MappingsFileError::Unaligned(uid.host_id));
        }
        let block = uid.host_id / RANGE_LENGTH;
        if block < FIRST_BLOCK {
            return Err(MappingsFileError::Reserved(uid.host_id));
        }
        Ok(block)
    }
}

/// The CRI form of a pod's range: mode `POD`, the same UID and GID mapping.
pub fn user_namespace(host_id: u32) -> v1::UserNamespace {
    let mapping = v1::IdMapping { host_id, container_id: 0, length: RANGE_LENGTH };
    v1::UserNamespace { mode: v1::NamespaceMode::Pod as i32, uids: vec![mapping], gids: vec![mapping] }
}

#[derive(Debug, Default)]
struct State {
    /// Pod UID → its block.
    by_pod: HashMap<String, u32>,
    /// The blocks given.
    used: BTreeSet<u32>,
    /// Pods whose file is not trusted, with why: never given a range, never freed until [`UsernsAllocator::release`].
    broken: HashMap<String, String>,
}

impl State {
    fn first_free(&self) -> Option<u32> {
        let mut candidate = FIRST_BLOCK;
        for &block in self.used.range(FIRST_BLOCK..) {
            if block != candidate {
                break;
            }
            candidate = candidate.checked_add(1)?;
        }
        (candidate < BLOCKS).then_some(candidate)
    }
}

/// The user namespace ranges of the node's pods; see the [module documentation](self).
#[derive(Debug)]
pub struct UsernsAllocator {
    /// `<root-dir>/pods`.
    pods_dir: PathBuf,
    state: Mutex<State>,
}

/// Whether `uid` can be a directory name under `pods/`.
fn usable_uid(uid: &str) -> bool {
    !uid.is_empty() && uid != "." && uid != ".." && !uid.contains('/') && !uid.contains('\0')
}

impl UsernsAllocator {
    /// Reads the allocations of `<root_dir>/pods/*/userns`. A file that cannot be trusted marks its pod
    /// (see the module documentation) and is reported in the log; a directory that cannot be listed is
    /// an empty one (nothing was allocated yet).
    pub fn load(root_dir: &Path) -> Self {
        let pods_dir = root_dir.join("pods");
        let mut state = State::default();
        let entries = match std::fs::read_dir(&pods_dir) {
            Ok(entries) => entries.flatten().collect::<Vec<_>>(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::error!(dir = %pods_dir.display(), error = %e, "cannot list the pod directories for user namespace allocations");
                Vec::new()
            }
        };
        for entry in entries {
            let Ok(uid) = entry.file_name().into_string() else { continue };
            let path = entry.path().join(MAPPINGS_FILE);
            let text = match std::fs::read(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    state.broken.insert(uid, format!("cannot be read: {e}"));
                    continue;
                }
            };
            let parsed = serde_json::from_slice::<MappingsFile>(&text)
                .map_err(MappingsFileError::from)
                .and_then(|file| file.block());
            match parsed {
                Ok(block) if state.used.contains(&block) => {
                    let other = state.by_pod.iter().find(|(_, b)| **b == block).map(|(u, _)| u.clone());
                    state
                        .broken
                        .insert(uid, format!("its range is also pod {}'s", other.unwrap_or_default()));
                }
                Ok(block) => {
                    state.used.insert(block);
                    state.by_pod.insert(uid, block);
                }
                Err(reason) => {
                    state.broken.insert(uid, reason.to_string());
                }
            }
        }
        for (uid, reason) in &state.broken {
            tracing::error!(pod = %uid, file = %pods_dir.join(uid).join(MAPPINGS_FILE).display(), %reason,
                "a user namespace allocation is not usable: the pod cannot start containers until it is removed");
        }
        if !state.by_pod.is_empty() {
            tracing::info!(pods = state.by_pod.len(), "user namespace allocations restored");
        }
        UsernsAllocator { pods_dir, state: Mutex::new(state) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn file(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid).join(MAPPINGS_FILE)
    }

    /// The pod's range, when it has one: `Ok(None)` when it has none, `Err` when its file is not trusted.
    pub fn get(&self, uid: &str) -> Result<Option<v1::UserNamespace>, UsernsError> {
        let state = self.state();
        if let Some(reason) = state.broken.get(uid) {
            return Err(UsernsError::Corrupt { path: self.file(uid), reason: reason.clone() });
        }
        Ok(state.by_pod.get(uid).map(|block| user_namespace(block * RANGE_LENGTH)))
    }

    /// The pod's range: the one it has, or a new one written to its file first. Blocking (file I/O).
    pub fn get_or_allocate(&self, uid: &str) -> Result<v1::UserNamespace, UsernsError> {
        if !usable_uid(uid) {
            return Err(UsernsError::BadUid(uid.to_owned()));
        }
        let mut state = self.state();
        if let Some(reason) = state.broken.get(uid) {
            return Err(UsernsError::Corrupt { path: self.file(uid), reason: reason.clone() });
        }
        if let Some(block) = state.by_pod.get(uid) {
            return Ok(user_namespace(block * RANGE_LENGTH));
        }
        if state.by_pod.len() >= MAX_PODS {
            return Err(UsernsError::Exhausted { limit: MAX_PODS });
        }
        let block = state.first_free().ok_or(UsernsError::Exhausted { limit: MAX_PODS })?;
        let path = self.file(uid);
        write_file(&path, &MappingsFile::for_block(block))
            .map_err(|source| UsernsError::Io { path, source })?;
        state.used.insert(block);
        state.by_pod.insert(uid.to_owned(), block);
        tracing::info!(pod = %uid, host_id = block * RANGE_LENGTH, length = RANGE_LENGTH, "user namespace allocated");
        Ok(user_namespace(block * RANGE_LENGTH))
    }

    /// Frees the pod's range (or forgets its untrusted file) and removes its file. Blocking (file I/O).
    pub fn release(&self, uid: &str) {
        if !usable_uid(uid) {
            return;
        }
        let mut state = self.state();
        let had_broken = state.broken.remove(uid).is_some();
        let block = state.by_pod.remove(uid);
        if let Some(block) = block {
            state.used.remove(&block);
        }
        if block.is_none() && !had_broken {
            return;
        }
        let path = self.file(uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot remove a freed user namespace allocation")
            }
        }
        tracing::info!(pod = %uid, "user namespace freed");
    }

    /// Frees the ranges of the pods `keep` says no to (at start: the pods without a sandbox in the runtime).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let pods: Vec<String> = {
            let state = self.state();
            state.by_pod.keys().chain(state.broken.keys()).filter(|uid| !keep(uid)).cloned().collect()
        };
        for uid in pods {
            self.release(&uid);
        }
    }

    /// How many pods have a range.
    pub fn len(&self) -> usize {
        self.state().by_pod.len()
    }

    /// Whether no pod has a range.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Writes `file` to `path` atomically and durably (temporary file, fsync, rename, fsync of the directory),
/// making the pod directory (0750, the kubelet's) when it is missing.
fn write_file(path: &Path, file: &MappingsFile) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    let dir = path.parent().ok_or_else(|| io::Error::other("no parent directory"))?;
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir)?;
    let bytes = serde_json::to_vec(file).map_err(io::Error::other)?;
    let tmp = dir.join(format!(".{MAPPINGS_FILE}.tmp"));
    {
        let mut out = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        out.write_all(&bytes)?;
        out.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Why the runtime cannot run a pod in a user namespace ([`handler_supports`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerSupportError {
    /// The runtime reports no handler features at all (containerd 1.x).
    #[error(
        "the container runtime reports no runtime handler features (CRI Status runtime_handlers; \
                    containerd 1.x has none): it cannot run pods in user namespaces"
    )]
    NoFeatures,
    /// The handler is reported without user-namespace support.
    #[error("the container runtime's handler {0:?} does not support user namespaces (with idmapped mounts)")]
    Unsupported(String),
    /// The handler is not reported.
    #[error("the container runtime does not report the handler {0:?}")]
    UnknownHandler(String),
}

/// Whether the runtime handler `handler` (`""`: the default) can run pods in user namespaces, from the
/// runtime's CRI `Status` `runtime_handlers` (see the module documentation). `Err` says why not.
pub fn handler_supports(handlers: &[v1::RuntimeHandler], handler: &str) -> Result<(), HandlerSupportError> {
    if handlers.is_empty() {
        return Err(HandlerSupportError::NoFeatures);
    }
    match handlers.iter().find(|h| h.name == handler) {
        Some(h) if h.features.as_ref().is_some_and(|f| f.user_namespaces) => Ok(()),
        Some(_) => Err(HandlerSupportError::Unsupported(handler.to_owned())),
        None => Err(HandlerSupportError::UnknownHandler(handler.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_id(ns: &v1::UserNamespace) -> u32 {
        assert_eq!(ns.mode, v1::NamespaceMode::Pod as i32);
        assert_eq!(ns.uids, ns.gids);
        assert_eq!(ns.uids.len(), 1);
        assert_eq!((ns.uids[0].container_id, ns.uids[0].length), (0, RANGE_LENGTH));
        ns.uids[0].host_id
    }

    #[test]
    fn ranges_are_first_free_from_the_third_block_and_persist() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = UsernsAllocator::load(root.path());
        assert!(a.is_empty());
        assert_eq!(host_id(&a.get_or_allocate("pod-a").expect("a")), 2 * RANGE_LENGTH);
        assert_eq!(host_id(&a.get_or_allocate("pod-b").expect("b")), 3 * RANGE_LENGTH);
        assert_eq!(host_id(&a.get_or_allocate("pod-a").expect("again")), 2 * RANGE_LENGTH, "kept");
        let text = std::fs::read_to_string(root.path().join("pods/pod-a/userns")).expect("file");
        assert_eq!(
            text,
            r#"{"uidMappings":[{"hostId":131072,"containerId":0,"length":65536}],"gidMappings":[{"hostId":131072,"containerId":0,"length":65536}]}"#
        );

        // A restart reads them back; a freed range is the next one given.
        let b = UsernsAllocator::load(root.path());
        assert_eq!(b.len(), 2);
        assert_eq!(b.get("pod-b").expect("ok").map(|n| host_id(&n)), Some(3 * RANGE_LENGTH));
        b.release("pod-a");
        assert!(!root.path().join("pods/pod-a/userns").exists(), "the file goes with the range");
        assert_eq!(b.get("pod-a").expect("ok"), None);
        assert_eq!(host_id(&b.get_or_allocate("pod-c").expect("c")), 2 * RANGE_LENGTH);
        assert_eq!(host_id(&b.get_or_allocate("pod-d").expect("d")), 4 * RANGE_LENGTH);
    }

    #[test]
    fn the_limit_is_the_kubelets() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = UsernsAllocator::load(root.path());
        for i in 0..MAX_PODS {
            a.get_or_allocate(&format!("pod-{i}")).expect("below the limit");
        }
        let err = a.get_or_allocate("one-more").expect_err("exhausted");
        assert_eq!(err.to_string(), "limit on count of pods with user namespaces exceeded (limit is 1024)");
        assert!(!root.path().join("pods/one-more").exists(), "nothing written for a refused pod");
        a.release("pod-7");
        assert_eq!(host_id(&a.get_or_allocate("one-more").expect("freed")), (7 + 2) * RANGE_LENGTH);
    }

    #[test]
    fn the_id_space_can_run_out() {
        let mut state = State::default();
        state.used.extend(FIRST_BLOCK..BLOCKS);
        assert_eq!(state.first_free(), None);
        state.used.remove(&(BLOCKS - 1));
        assert_eq!(state.first_free(), Some(BLOCKS - 1));
    }

    #[test]
    fn untrusted_files_block_their_pod_only_and_are_never_freed_unseen() {
        let root = tempfile::tempdir().expect("tempdir");
        let write = |uid: &str, text: &str| {
            std::fs::create_dir_all(root.path().join("pods").join(uid)).expect("dir");
            std::fs::write(root.path().join("pods").join(uid).join("userns"), text).expect("write");
        };
        let good = |host: u32| {
            format!(
                r#"{{"uidMappings":[{{"hostId":{host},"containerId":0,"length":65536}}],"gidMappings":[{{"hostId":{host},"containerId":0,"length":65536}}]}}"#
            )
        };
        write("ok", &good(5 * RANGE_LENGTH));
        write("truncated", r#"{"uidMappings":[{"hostId":"#);
        write("reserved", &good(RANGE_LENGTH));
        write("unaligned", &good(5 * RANGE_LENGTH + 1));
        write(
            "different",
            r#"{"uidMappings":[{"hostId":393216,"containerId":0,"length":65536}],"gidMappings":[{"hostId":458752,"containerId":0,"length":65536}]}"#,
        );
        write("short", &good(7 * RANGE_LENGTH).replace("65536}", "100}"));
        let a = UsernsAllocator::load(root.path());
        assert_eq!(a.len(), 1);
        for uid in ["truncated", "reserved", "unaligned", "different", "short"] {
            let err = a.get_or_allocate(uid).expect_err(uid);
            assert!(matches!(err, UsernsError::Corrupt { .. }), "{uid}: {err}");
            assert!(err.to_string().contains(&format!("pods/{uid}/userns")), "{err}");
            assert!(a.get(uid).is_err(), "{uid}");
        }
        // The other pods go on, around the trusted range.
        assert_eq!(host_id(&a.get_or_allocate("new").expect("new")), 2 * RANGE_LENGTH);
        // Removing the pod forgets the untrusted file.
        a.release("truncated");
        assert!(!root.path().join("pods/truncated/userns").exists());
        assert_eq!(host_id(&a.get_or_allocate("truncated").expect("fresh")), 3 * RANGE_LENGTH);
    }

    #[test]
    fn two_pods_with_one_range_are_not_both_trusted() {
        let root = tempfile::tempdir().expect("tempdir");
        let text = r#"{"uidMappings":[{"hostId":327680,"containerId":0,"length":65536}],"gidMappings":[{"hostId":327680,"containerId":0,"length":65536}]}"#;
        for uid in ["one", "two"] {
            std::fs::create_dir_all(root.path().join("pods").join(uid)).expect("dir");
            std::fs::write(root.path().join("pods").join(uid).join("userns"), text).expect("write");
        }
        let a = UsernsAllocator::load(root.path());
        assert_eq!(a.len(), 1);
        let broken = ["one", "two"].into_iter().filter(|u| a.get(u).is_err()).count();
        assert_eq!(broken, 1);
    }

    #[test]
    fn retain_frees_the_pods_without_sandboxes() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = UsernsAllocator::load(root.path());
        for uid in ["kept", "gone"] {
            a.get_or_allocate(uid).expect("allocated");
        }
        a.retain(|uid| uid == "kept");
        assert_eq!(a.len(), 1);
        assert!(root.path().join("pods/kept/userns").exists());
        assert!(!root.path().join("pods/gone/userns").exists());
    }

    #[test]
    fn hostile_uids_name_no_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = UsernsAllocator::load(root.path());
        for uid in ["", ".", "..", "a/b"] {
            assert!(matches!(a.get_or_allocate(uid), Err(UsernsError::BadUid(_))), "{uid:?}");
        }
    }

    #[test]
    fn the_runtime_must_report_the_feature_for_the_handler() {
        let handler = |name: &str, userns: bool| v1::RuntimeHandler {
            name: name.to_owned(),
            features: Some(v1::RuntimeHandlerFeatures { user_namespaces: userns, ..Default::default() }),
        };
        let none = handler_supports(&[], "").expect_err("containerd 1.x").to_string();
        assert!(none.contains("reports no runtime handler features"), "{none}");
        assert_eq!(handler_supports(&[handler("", true), handler("runc", true)], ""), Ok(()));
        let off = handler_supports(&[handler("", true), handler("kata", false)], "kata")
            .expect_err("off")
            .to_string();
        assert!(off.contains("\"kata\" does not support user namespaces"), "{off}");
        let missing = handler_supports(&[handler("", true)], "gvisor").expect_err("absent").to_string();
        assert!(missing.contains("does not report the handler \"gvisor\""), "{missing}");
    }
}

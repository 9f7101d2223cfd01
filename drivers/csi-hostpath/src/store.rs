//! Volumes on disk: `<data-dir>/volumes/<id>/` with a JSON sidecar `<id>.json` holding the name and
//! capacity, a marker `<id>.staged` while the volume is staged and, in attach mode, a marker
//! `<id>.attached` (holding the node ID) while the volume is attached (ControllerPublishVolume).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Prefix of every volume ID this driver makes.
const ID_PREFIX: &str = "hp-";
/// Hex digits of the name hash in a volume ID.
const ID_HASH_LEN: usize = 32;

/// What the sidecar records about a volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct VolumeRecord {
    /// The CreateVolume name.
    pub(crate) name: String,
    /// The volume ID.
    pub(crate) volume_id: String,
    /// The capacity granted, in bytes.
    pub(crate) capacity_bytes: i64,
}

/// The volume store under a data directory.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating) `<data_dir>/volumes`.
    pub(crate) fn open(data_dir: &Path) -> io::Result<Self> {
        let dir = data_dir.join("volumes");
        std::fs::create_dir_all(&dir)?;
        Ok(Store { dir })
    }

    /// The volume ID for a CreateVolume name: deterministic, so creation is idempotent by name even
    /// across restarts, and safe as a path component.
    pub(crate) fn id_for_name(name: &str) -> String {
        let hex: String = Sha256::digest(name.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        format!("{ID_PREFIX}{}", &hex[..ID_HASH_LEN])
    }

    /// Whether `id` has the shape of an ID this driver makes (anything else cannot name one of its volumes,
    /// and must never be joined to a path).
    pub(crate) fn is_valid_id(id: &str) -> bool {
        id.strip_prefix(ID_PREFIX).is_some_and(|hash| {
            hash.len() == ID_HASH_LEN
                && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    }

    /// The directory holding the volume's data.
    pub(crate) fn volume_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    fn sidecar(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The marker that records where the volume is staged.
    pub(crate) fn staged_marker(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.staged"))
    }

    /// The marker that records the node the volume is attached to (attach mode).
    pub(crate) fn attached_marker(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.attached"))
    }

    /// The node the volume is attached to, `None` when it is not attached (or `id` is not a valid ID).
    pub(crate) fn attachment(&self, id: &str) -> io::Result<Option<String>> {
        if !Self::is_valid_id(id) {
            return Ok(None);
        }
        match std::fs::read_to_string(self.attached_marker(id)) {
            Ok(node) => Ok(Some(node)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Records that the volume is attached to `node_id`: written to a temporary file, synced and renamed
    /// over the marker, so the attachment survives a crash or restart of the driver whole or not at all.
    pub(crate) fn attach(&self, id: &str, node_id: &str) -> io::Result<()> {
        if !Self::is_valid_id(id) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid volume ID {id:?}")));
        }
        nodelet_durable::write(&self.attached_marker(id), node_id.as_bytes(), 0o600).map_err(durable_io)
    }

    /// Forgets the attachment (no error if there was none).
    pub(crate) fn detach(&self, id: &str) -> io::Result<()> {
        if !Self::is_valid_id(id) {
            return Ok(());
        }
        ignore_not_found(std::fs::remove_file(self.attached_marker(id)))
    }

    /// The volume's record, `None` if `id` is not a volume of this store.
    pub(crate) fn get(&self, id: &str) -> io::Result<Option<VolumeRecord>> {
        if !Self::is_valid_id(id) {
            return Ok(None);
        }
        match std::fs::read(self.sidecar(id)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates the volume directory (mode 0777, like an emptyDir, so pods running as any user can write)
    /// and then its sidecar (atomically): a volume without a sidecar does not exist.
    pub(crate) fn create(&self, record: &VolumeRecord) -> io::Result<()> {
        let dir = self.volume_dir(&record.volume_id);
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        let sidecar = self.sidecar(&record.volume_id);
        nodelet_durable::write(&sidecar, &serde_json::to_vec(record).map_err(io::Error::other)?, 0o600)
            .map_err(durable_io)
    }

    /// Deletes the sidecar first (so a crash half-way leaves a directory that no longer counts as a
    /// volume), then the data (not following symlinks) and the staged and attached markers.
    pub(crate) fn delete(&self, id: &str) -> io::Result<()> {
        if !Self::is_valid_id(id) {
            return Ok(());
        }
        ignore_not_found(std::fs::remove_file(self.sidecar(id)))?;
        ignore_not_found(std::fs::remove_dir_all(self.volume_dir(id)))?;
        ignore_not_found(std::fs::remove_file(self.staged_marker(id)))?;
        ignore_not_found(std::fs::remove_file(self.attached_marker(id)))
    }
}

/// Maps `NotFound` to success.
pub(crate) fn ignore_not_found(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A [`nodelet_durable::DurableError`] as the `io::Error` the store's callers map to gRPC codes.
fn durable_io(e: nodelet_durable::DurableError) -> io::Error {
    io::Error::new(e.source.kind(), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_deterministic_and_safe() {
        let id = Store::id_for_name("pvc-1");
        assert_eq!(id, Store::id_for_name("pvc-1"));
        assert_ne!(id, Store::id_for_name("pvc-2"));
        assert!(Store::is_valid_id(&id));
        for bad in ["", "hp-", "../etc", "hp-../../../../etc/passwd00000000000", "vol-1", &format!("{id}/x")]
        {
            assert!(!Store::is_valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn create_get_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let id = Store::id_for_name("n");
        assert_eq!(store.get(&id).unwrap(), None);
        let record = VolumeRecord { name: "n".into(), volume_id: id.clone(), capacity_bytes: 42 };
        store.create(&record).unwrap();
        store.create(&record).unwrap();
        assert_eq!(store.get(&id).unwrap(), Some(record));
        std::fs::write(store.volume_dir(&id).join("f"), b"x").unwrap();
        store.delete(&id).unwrap();
        assert_eq!(store.get(&id).unwrap(), None);
        assert!(!store.volume_dir(&id).exists());
        store.delete(&id).unwrap();
    }

    #[test]
    fn attachments_are_recorded_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let id = Store::id_for_name("n");
        store.create(&VolumeRecord { name: "n".into(), volume_id: id.clone(), capacity_bytes: 1 }).unwrap();
        assert_eq!(store.attachment(&id).unwrap(), None);
        store.attach(&id, "node-a").unwrap();
        assert_eq!(store.attachment(&id).unwrap().as_deref(), Some("node-a"));
        // A store opened afresh (a restarted driver) still sees it.
        let reopened = Store::open(tmp.path()).unwrap();
        assert_eq!(reopened.attachment(&id).unwrap().as_deref(), Some("node-a"));
        assert!(!tmp.path().join("volumes").join(format!("{id}.attached.tmp")).exists());
        store.detach(&id).unwrap();
        store.detach(&id).unwrap();
        assert_eq!(store.attachment(&id).unwrap(), None);
        // Never a path outside the store for a hostile ID.
        assert!(store.attach("../../etc/x", "node-a").is_err());
        assert_eq!(store.attachment("../../etc/x").unwrap(), None);
        // Deleting the volume removes a leftover attachment too.
        store.attach(&id, "node-a").unwrap();
        store.delete(&id).unwrap();
        assert!(!store.attached_marker(&id).exists());
    }
}

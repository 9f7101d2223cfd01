//! Binding records and provisioned volumes as JSON files:
//! `<dir>/records/<key>.json` and `<dir>/volumes/<name>.json`, each written durably through
//! [`nodelet_durable::write`] (temporary file, fsync, rename, fsync of the directory). A file that does not
//! parse at load is moved aside (`<name>.corrupt-<seconds>`) and logged as an error, never silently skipped.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;
use nodelet_resources::claim::actual::ClaimActual;
use nodelet_resources::claim::desired::{ClaimKey, is_dns_subdomain};
use nodelet_resources::claim::driver::{ClaimError, ClaimRecords};
use serde::{Deserialize, Serialize};

/// Records under a directory (`<root>/storage` in the daemon).
#[derive(Debug, Clone)]
pub struct FileRecords {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Record {
    key: ClaimKey,
    actual: ClaimActual,
}

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> ClaimError {
    ClaimError::Records(format!("{what} {}: {e}", path.display()))
}

impl FileRecords {
    /// Records under `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, key: &ClaimKey) -> Result<PathBuf, ClaimError> {
        let file = match key {
            ClaimKey::Volume(name) if is_dns_subdomain(name) => format!("pv_{name}.json"),
            ClaimKey::Claim { namespace, name } if is_dns_subdomain(namespace) && is_dns_subdomain(name) => {
                format!("pvc_{namespace}_{name}.json")
            }
            other => return Err(ClaimError::Records(format!("no record for {other}: invalid name"))),
        };
        Ok(self.dir.join("records").join(file))
    }

    fn volume_path(&self, name: &str) -> Result<PathBuf, ClaimError> {
        if !is_dns_subdomain(name) {
            return Err(ClaimError::Records(format!("invalid volume name {name:?}")));
        }
        Ok(self.dir.join("volumes").join(format!("{name}.json")))
    }

    async fn write(path: &Path, data: Vec<u8>) -> Result<(), ClaimError> {
        let parent = path.parent().unwrap_or(Path::new("/"));
        tokio::fs::create_dir_all(parent).await.map_err(|e| err("create", parent, e))?;
        nodelet_durable::write_async(path.to_owned(), data, 0o600)
            .await
            .map_err(|e| err(e.action, &e.path, e.source))
    }

    async fn remove_file(path: &Path) -> Result<(), ClaimError> {
        match tokio::fs::remove_file(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err("remove", path, e)),
        }
    }

    /// Moves a record that does not parse aside (`<name>.corrupt-<seconds>`), so it is neither read again
    /// nor lost, and says so.
    fn quarantine(path: &Path, what: &str, error: &serde_json::Error) {
        match nodelet_durable::quarantine(path) {
            Ok(aside) => tracing::error!(
                path = %path.display(),
                moved_to = %aside.display(),
                %error,
                "a {what} does not parse; it was moved aside and is not used"
            ),
            Err(e) => {
                tracing::error!(path = %path.display(), %error, "a {what} does not parse and cannot be moved aside: {e}")
            }
        }
    }

    async fn read_all(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, ClaimError> {
        let mut out = Vec::new();
        let mut entries = match tokio::fs::read_dir(dir).await {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(err("read", dir, e)),
        };
        while let Some(entry) = entries.next_entry().await.map_err(|e| err("read", dir, e))? {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json") {
                let data = tokio::fs::read(&path).await.map_err(|e| err("read", &path, e))?;
                out.push((path, data));
            }
        }
        Ok(out)
    }
}

impl ClaimRecords for FileRecords {
    async fn save(&self, key: &ClaimKey, actual: &ClaimActual) -> Result<(), ClaimError> {
        let path = self.record_path(key)?;
        let data = serde_json::to_vec_pretty(&Record { key: key.clone(), actual: actual.clone() })
            .map_err(|e| err("encode", &path, e))?;
        Self::write(&path, data).await
    }

    async fn remove(&self, key: &ClaimKey) -> Result<(), ClaimError> {
        Self::remove_file(&self.record_path(key)?).await
    }

    async fn load(&self) -> Result<Vec<(ClaimKey, ClaimActual)>, ClaimError> {
        let mut out = Vec::new();
        for (path, data) in Self::read_all(&self.dir.join("records")).await? {
            match serde_json::from_slice::<Record>(&data) {
                Ok(r) => out.push((r.key, r.actual)),
                Err(e) => Self::quarantine(&path, "binding record", &e),
            }
        }
        Ok(out)
    }

    async fn save_volume(&self, volume: &PersistentVolume) -> Result<(), ClaimError> {
        let path = self.volume_path(volume.metadata.name.as_deref().unwrap_or_default())?;
        let data = serde_json::to_vec_pretty(volume).map_err(|e| err("encode", &path, e))?;
        Self::write(&path, data).await
    }

    async fn remove_volume(&self, name: &str) -> Result<(), ClaimError> {
        Self::remove_file(&self.volume_path(name)?).await
    }

    async fn load_volumes(&self) -> Result<Vec<PersistentVolume>, ClaimError> {
        let mut out = Vec::new();
        for (path, data) in Self::read_all(&self.dir.join("volumes")).await? {
            match serde_json::from_slice::<PersistentVolume>(&data) {
                Ok(v) => out.push(v),
                Err(e) => Self::quarantine(&path, "provisioned volume record", &e),
            }
        }
        Ok(out)
    }
}

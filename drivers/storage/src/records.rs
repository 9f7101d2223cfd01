//! Binding records and provisioned volumes as JSON files:
//! `<dir>/records/<key>.json` and `<dir>/volumes/<name>.json`, each written atomically
//! (temporary file, fsync, rename).

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
        let tmp = path.with_extension("json.tmp");
        let tmp2 = tmp.clone();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp2)?;
            f.write_all(&data)?;
            f.sync_all()
        })
        .await
        .map_err(|e| err("write", &tmp, e))?
        .map_err(|e| err("write", &tmp, e))?;
        tokio::fs::rename(&tmp, path).await.map_err(|e| err("rename", path, e))
    }

    async fn remove_file(path: &Path) -> Result<(), ClaimError> {
        match tokio::fs::remove_file(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err("remove", path, e)),
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
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable binding record")
                }
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
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable provisioned volume")
                }
            }
        }
        Ok(out)
    }
}

//! Container log rotation, as the kubelet's container log manager does it
//! (`containerLogMaxSize`, `containerLogMaxFiles`, checked every `containerLogMonitorInterval`).
//!
//! For each running container whose log file (`<restart>.log`) has reached the maximum size:
//! 1. leftovers of an interrupted compression (`*.tmp`) are removed;
//! 2. the oldest rotated files are removed so that, with the current file and the one about to be
//!    rotated, at most `max_files` remain;
//! 3. every rotated file but the newest is gzip-compressed (`<restart>.log.<time>.gz`, written to a
//!    temporary name first, then renamed);
//! 4. the current file is renamed `<restart>.log.<UTC time YYYYMMDD-HHMMSS>` and the runtime is told
//!    to reopen the log (CRI `ReopenContainerLog`), so it starts a new file at the same path; if the
//!    runtime refuses, the rename is undone.
//!
//! Files are never followed through symbolic links; paths come from the runtime, not from pod specs.

use std::io;
use std::path::{Path, PathBuf};

use crate::CriClient;

/// How large and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotationPolicy {
    /// Rotate a container's log at this size in bytes (`containerLogMaxSize`).
    pub max_size: u64,
    /// Keep at most this many files per container log, the current one included
    /// (`containerLogMaxFiles`, at least 2).
    pub max_files: u32,
}

/// Why a log could not be rotated.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The runtime did not reopen the log (the rename was undone).
    #[error("ReopenContainerLog of {container}: {source}")]
    Reopen {
        /// The container.
        container: String,
        /// The runtime's error.
        #[source]
        source: crate::CriError,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RotationError + 'a {
    move |source| RotationError::Io { what, path: path.to_owned(), source }
}

/// Rotates the log of container `id` at `log_path` if it reached `policy.max_size`; whether it did.
/// `now` names the rotated file (`YYYYMMDD-HHMMSS`, UTC).
pub async fn rotate_if_needed(
    cri: &CriClient,
    id: &str,
    log_path: &Path,
    policy: LogRotationPolicy,
    now: &str,
) -> Result<bool, RotationError> {
    let path = log_path.to_owned();
    let size = match tokio::fs::symlink_metadata(&path).await {
        Ok(m) if m.is_file() => m.len(),
        // Not there (yet), or not a plain file: nothing to rotate.
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err("reading", &path)(e)),
    };
    if size < policy.max_size {
        return Ok(false);
    }
    let max_files = policy.max_files.max(2);
    let prepared = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || prepare(&path, max_files)).await.map_err(|e| {
            RotationError::Io { what: "rotating", path: log_path.to_owned(), source: io::Error::other(e) }
        })?
    };
    prepared?;
    let rotated = rotated_name(&path, now);
    tokio::fs::rename(&path, &rotated).await.map_err(io_err("renaming", &path))?;
    if let Err(source) = cri.reopen_container_log(id).await {
        // The runtime still writes to the renamed file: give it its name back.
        if let Err(e) = tokio::fs::rename(&rotated, &path).await {
            tracing::warn!(path = %rotated.display(), error = %e, "could not undo a log rotation");
        }
        return Err(RotationError::Reopen { container: id.to_owned(), source });
    }
    tracing::debug!(container = %id, path = %path.display(), size, "rotated a container log");
    Ok(true)
}

/// `<path>.<now>`, or with a counter when that exists already (two rotations within a second).
fn rotated_name(path: &Path, now: &str) -> PathBuf {
    let base = path.as_os_str().to_string_lossy().into_owned();
    let mut candidate = PathBuf::from(format!("{base}.{now}"));
    let mut n = 1;
    while candidate.symlink_metadata().is_ok()
        || PathBuf::from(format!("{}.gz", candidate.display())).symlink_metadata().is_ok()
    {
        candidate = PathBuf::from(format!("{base}.{now}-{n}"));
        n += 1;
    }
    candidate
}

/// The rotated files of `path` (`<name>.<time>[.gz]`), oldest first (their names sort by time).
fn rotated_files(path: &Path) -> Result<Vec<PathBuf>, RotationError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err("listing", dir))? {
        let entry = entry.map_err(io_err("listing", dir))?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with(&prefix) && entry.file_type().is_ok_and(|t| t.is_file()) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Steps 1 to 3 of the rotation (blocking file work).
fn prepare(path: &Path, max_files: u32) -> Result<(), RotationError> {
    let mut files = Vec::new();
    for f in rotated_files(path)? {
        if f.extension().is_some_and(|e| e == "tmp") {
            std::fs::remove_file(&f).map_err(io_err("removing", &f))?;
        } else {
            files.push(f);
        }
    }
    // Room for the current file and the one rotated now.
    let keep = usize::try_from(max_files.saturating_sub(2)).unwrap_or(usize::MAX);
    let excess = files.len().saturating_sub(keep);
    for f in files.drain(..excess) {
        std::fs::remove_file(&f).map_err(io_err("removing", &f))?;
    }
    // Compress all but the newest rotated file.
    files.pop();
    for f in files.iter().filter(|f| f.extension().is_none_or(|e| e != "gz")) {
        compress(f)?;
    }
    Ok(())
}

/// `f` → `f.gz` (through `f.gz.tmp`), then removes `f`.
fn compress(f: &Path) -> Result<(), RotationError> {
    let gz = PathBuf::from(format!("{}.gz", f.display()));
    let tmp = PathBuf::from(format!("{}.gz.tmp", f.display()));
    let mut input = std::fs::File::open(f).map_err(io_err("opening", f))?;
    let output = std::fs::File::create(&tmp).map_err(io_err("creating", &tmp))?;
    let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
    io::copy(&mut input, &mut encoder).map_err(io_err("compressing", f))?;
    let output = encoder.finish().map_err(io_err("compressing", f))?;
    output.sync_all().map_err(io_err("syncing", &tmp))?;
    drop(output);
    std::fs::rename(&tmp, &gz).map_err(io_err("renaming", &tmp))?;
    std::fs::remove_file(f).map_err(io_err("removing", f))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn prepare_removes_excess_and_temporary_files_and_compresses_all_but_the_newest() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let log = dir.path().join("0.log");
        write(&log, "current\n");
        write(&dir.path().join("0.log.20260101-000001.gz"), "x");
        write(&dir.path().join("0.log.20260101-000002"), "second\n");
        write(&dir.path().join("0.log.20260101-000003"), "third\n");
        write(&dir.path().join("0.log.20260101-000002.gz.tmp"), "half");
        write(&dir.path().join("1.log"), "another instance\n");
        prepare(&log, 4).unwrap_or_else(|e| panic!("prepare: {e}"));
        // max 4: current + the one rotated next + 2 kept; the oldest went, the older kept one is compressed.
        assert_eq!(
            names(dir.path()),
            ["0.log", "0.log.20260101-000002.gz", "0.log.20260101-000003", "1.log"]
        );
        let gz = std::fs::File::open(dir.path().join("0.log.20260101-000002.gz"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut text = String::new();
        io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(text, "second\n");
    }

    #[test]
    fn two_files_keep_only_the_current_and_the_rotated_one() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let log = dir.path().join("3.log");
        write(&log, "current\n");
        write(&dir.path().join("3.log.20260101-000001"), "old\n");
        prepare(&log, 2).unwrap_or_else(|e| panic!("prepare: {e}"));
        assert_eq!(names(dir.path()), ["3.log"]);
        assert_eq!(rotated_name(&log, "20260101-000002"), dir.path().join("3.log.20260101-000002"));
        write(&dir.path().join("3.log.20260101-000002"), "x");
        assert_eq!(rotated_name(&log, "20260101-000002"), dir.path().join("3.log.20260101-000002-1"));
    }
}

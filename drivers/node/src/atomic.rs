//! The daemon's files written atomically and durably, through the project's one writer
//! ([`nodelet_durable`]): a temporary file beside the target (created with its final mode, never following
//! a symlink), written, fsynced, renamed over the target, the directory fsynced; symlinks replaced the same
//! way. A reader sees the old or the new content, never a part. This module gives the daemon's error type.

use std::path::{Path, PathBuf};

/// A file or symlink that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {source}", path.display())]
pub struct AtomicWriteError {
    /// The file (or its temporary name).
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: std::io::Error,
}

impl From<nodelet_durable::DurableError> for AtomicWriteError {
    fn from(e: nodelet_durable::DurableError) -> Self {
        Self { path: e.path, source: e.source }
    }
}

/// Writes `contents` to `path` with `mode` through [`nodelet_durable::write`] (temporary file, fsync,
/// rename, fsync of the directory).
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    Ok(nodelet_durable::write(path, contents, mode)?)
}

/// Points the symlink `link` at `target` (as given, e.g. a file name relative to the link's directory)
/// through [`nodelet_durable::replace_symlink`].
pub fn replace_symlink(link: &Path, target: &Path) -> Result<(), AtomicWriteError> {
    Ok(nodelet_durable::replace_symlink(link, target)?)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn writes_with_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("f.pem");
        write_atomically(&p, b"one", 0o600).unwrap_or_else(|e| panic!("{e}"));
        write_atomically(&p, b"two", 0o600).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read(&p).unwrap_or_default(), b"two");
        let mode = fs::metadata(&p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
        assert_eq!(mode, 0o600);
        assert!(!nodelet_durable::tmp_path(&p).exists());
    }

    #[test]
    fn symlink_is_replaced() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let link = dir.path().join("current.pem");
        fs::write(dir.path().join("a.pem"), "a").unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.path().join("b.pem"), "b").unwrap_or_else(|e| panic!("{e}"));
        replace_symlink(&link, Path::new("a.pem")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&link).unwrap_or_default(), "a");
        replace_symlink(&link, Path::new("b.pem")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&link).unwrap_or_default(), "b");
        assert_eq!(fs::read_link(&link).unwrap_or_default(), PathBuf::from("b.pem"));
    }
}

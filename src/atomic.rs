//! Files written atomically: a temporary file beside the target (created with its final mode, never
//! following a symlink), written, fsynced and renamed over the target; and symlinks replaced the same way
//! (a symlink under a temporary name renamed over the old one). A reader sees the old or the new content,
//! never a part.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// A file or symlink that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {source}", path.display())]
pub(crate) struct AtomicWriteError {
    /// The file (or its temporary name).
    pub(crate) path: PathBuf,
    /// The operating system's error.
    #[source]
    pub(crate) source: std::io::Error,
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    PathBuf::from(tmp_name)
}

fn remove_if_there(path: &Path) -> Result<(), AtomicWriteError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(AtomicWriteError { path: path.to_owned(), source }),
    }
}

/// Writes `contents` to a fresh temporary file with `mode`, syncs it and renames it over `path`.
pub(crate) fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    let tmp = tmp_path(path);
    let err = |p: &Path| {
        let p = p.to_owned();
        move |source| AtomicWriteError { path: p, source }
    };
    remove_if_there(&tmp)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(err(&tmp))?;
    file.write_all(contents).map_err(err(&tmp))?;
    file.sync_all().map_err(err(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(err(path))?;
    sync_dir(path);
    Ok(())
}

/// Points the symlink `link` at `target` (as given, e.g. a file name relative to the link's directory):
/// a symlink under a temporary name, renamed over `link`.
pub(crate) fn replace_symlink(link: &Path, target: &Path) -> Result<(), AtomicWriteError> {
    let tmp = tmp_path(link);
    remove_if_there(&tmp)?;
    std::os::unix::fs::symlink(target, &tmp)
        .map_err(|source| AtomicWriteError { path: tmp.clone(), source })?;
    fs::rename(&tmp, link).map_err(|source| AtomicWriteError { path: link.to_owned(), source })?;
    sync_dir(link);
    Ok(())
}

/// Best effort: the rename reaches the disk with the directory's entry.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(d) = fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
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
        assert!(!tmp_path(&p).exists());
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

//! The one way nodelet writes a file it reads back (records, CSI `vol_data.json`, certificates, state,
//! configuration it generates), and what it does with one it cannot read.
//!
//! [`write()`] puts the content in a temporary file beside the target (`<name>.tmp`, created anew with its
//! final mode, never through a symlink), syncs it, renames it over the target and syncs the directory. A
//! reader, or nodelet after a crash or power loss at any point, finds the old content or the new, never a
//! part, and once [`write()`] returns the new content is on disk. [`write_async`] does the same off the async
//! runtime's threads.
//!
//! [`quarantine`] moves a file that does not parse aside (`<name>.corrupt-<unix seconds>`) so that it is
//! neither read again nor lost: the caller reports it, and an operator can look at it.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A file that could not be written or moved.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {source}", path.display())]
pub struct DurableError {
    /// What failed: `create`, `write`, `sync`, `rename`, `remove`.
    pub action: &'static str,
    /// The file (or its temporary name).
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: std::io::Error,
}

fn error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DurableError {
    let path = path.to_owned();
    move |source| DurableError { action, path, source }
}

/// The temporary name [`write()`] uses for `path`: `<path>.tmp`.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Removes `path` if it is there (a file or symlink; never follows it).
pub fn remove_if_there(path: &Path) -> Result<(), DurableError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(error("remove", path)(e)),
    }
}

/// Writes `contents` to `path` durably with permission bits `mode`; see the [crate docs](crate).
pub fn write(path: &Path, contents: &[u8], mode: u32) -> Result<(), DurableError> {
    let tmp = tmp_path(path);
    // A temporary file left by a crash (or planted as a symlink) is replaced, never written through.
    remove_if_there(&tmp)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(error("create", &tmp))?;
    file.write_all(contents).map_err(error("write", &tmp))?;
    file.sync_all().map_err(error("sync", &tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(error("rename", path))?;
    sync_parent(path)
}

/// [`write()`] on a blocking thread, for async callers.
pub async fn write_async(path: PathBuf, contents: Vec<u8>, mode: u32) -> Result<(), DurableError> {
    let at = path.clone();
    match tokio::task::spawn_blocking(move || write(&path, &contents, mode)).await {
        Ok(result) => result,
        Err(join) => Err(DurableError { action: "write", path: at, source: std::io::Error::other(join) }),
    }
}

/// Points the symlink `link` at `target` durably: a symlink under the temporary name, renamed over `link`,
/// the directory synced.
pub fn replace_symlink(link: &Path, target: &Path) -> Result<(), DurableError> {
    let tmp = tmp_path(link);
    remove_if_there(&tmp)?;
    std::os::unix::fs::symlink(target, &tmp).map_err(error("create", &tmp))?;
    fs::rename(&tmp, link).map_err(error("rename", link))?;
    sync_parent(link)
}

/// Syncs the directory that holds `path`, so that a rename or removal in it is on disk.
pub fn sync_parent(path: &Path) -> Result<(), DurableError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let handle = fs::File::open(dir).map_err(error("open", dir))?;
    handle.sync_all().map_err(error("sync", dir))
}

/// Moves a file that cannot be read as what it should be out of the way, to `<path>.corrupt-<unix
/// seconds>` (the directory synced), and returns the new name. The caller reports the file and why; the
/// content stays for an operator to look at.
pub fn quarantine(path: &Path) -> Result<PathBuf, DurableError> {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".corrupt-{seconds}"));
    let aside = PathBuf::from(name);
    fs::rename(path, &aside).map_err(error("rename", path))?;
    sync_parent(&aside)?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    #[test]
    fn writes_with_its_mode_replaces_and_leaves_no_temporary_file() {
        let d = dir();
        let p = d.path().join("record.json");
        write(&p, b"one", 0o600).unwrap_or_else(|e| panic!("{e}"));
        write(&p, b"two", 0o640).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read(&p).unwrap_or_default(), b"two");
        let mode = fs::metadata(&p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
        assert_eq!(mode, 0o640);
        assert!(!tmp_path(&p).exists());
    }

    #[test]
    fn a_stale_temporary_file_or_a_planted_symlink_is_replaced_not_followed() {
        let d = dir();
        let p = d.path().join("record.json");
        let victim = d.path().join("victim");
        fs::write(&victim, "keep").unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&victim, tmp_path(&p)).unwrap_or_else(|e| panic!("{e}"));
        write(&p, b"new", 0o600).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&victim).unwrap_or_default(), "keep", "the symlink was not followed");
        assert_eq!(fs::read(&p).unwrap_or_default(), b"new");
    }

    #[test]
    fn an_error_names_the_file_and_the_action() {
        let d = dir();
        let p = d.path().join("missing-dir").join("record.json");
        let e = write(&p, b"x", 0o600).expect_err("no directory");
        assert_eq!(e.action, "create");
        assert!(e.to_string().contains("missing-dir/record.json.tmp"), "{e}");
    }

    #[tokio::test]
    async fn the_async_writer_writes() {
        let d = dir();
        let p = d.path().join("vol_data.json");
        write_async(p.clone(), b"{}".to_vec(), 0o600).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read(&p).unwrap_or_default(), b"{}");
    }

    #[test]
    fn symlinks_are_replaced() {
        let d = dir();
        let link = d.path().join("current.pem");
        fs::write(d.path().join("a.pem"), "a").unwrap_or_else(|e| panic!("{e}"));
        fs::write(d.path().join("b.pem"), "b").unwrap_or_else(|e| panic!("{e}"));
        replace_symlink(&link, Path::new("a.pem")).unwrap_or_else(|e| panic!("{e}"));
        replace_symlink(&link, Path::new("b.pem")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&link).unwrap_or_default(), "b");
        assert_eq!(fs::read_link(&link).unwrap_or_default(), PathBuf::from("b.pem"));
    }

    #[test]
    fn quarantine_moves_the_file_aside_with_its_content() {
        let d = dir();
        let p = d.path().join("binding.json");
        fs::write(&p, "{trunc").unwrap_or_else(|e| panic!("{e}"));
        let aside = quarantine(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.exists());
        assert!(aside.to_string_lossy().contains("binding.json.corrupt-"), "{}", aside.display());
        assert_eq!(fs::read_to_string(&aside).unwrap_or_default(), "{trunc");
    }
}

//! Shared file system helpers: descriptor-relative tree removal that never follows symlinks, mount-root
//! checks on descriptors, and the relative-path rules of volume content.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, Stat, StatxAttributes, StatxFlags};
use rustix::io::Errno;

/// Longest relative path accepted for a volume file (the kubelet's AtomicWriter limit).
pub(crate) const MAX_PATH_LEN: usize = 4096;
/// Longest path element accepted for a volume file.
pub(crate) const MAX_NAME_LEN: usize = 255;

/// Validates a relative path for a file inside a volume and returns its clean form (`a//./b` → `a/b`).
///
/// The rules are the API server's for `items[].path` plus the AtomicWriter's: not empty, relative, no
/// `..` element, not starting with `..` (which would collide with `..data`), no NUL, bounded lengths.
/// The error is the reason, for the caller to name the field.
pub(crate) fn clean_relative_path(path: &str) -> Result<String, &'static str> {
    if path.is_empty() {
        return Err("must not be empty");
    }
    if path.contains('\0') {
        return Err("must not contain NUL");
    }
    if path.starts_with('/') {
        return Err("must be a relative path");
    }
    if path.split('/').any(|element| element == "..") {
        return Err("must not contain \"..\"");
    }
    if path.starts_with("..") {
        return Err("must not start with \"..\"");
    }
    if path.len() > MAX_PATH_LEN {
        return Err("must be at most 4096 bytes");
    }
    let elements: Vec<&str> = path.split('/').filter(|e| !e.is_empty() && *e != ".").collect();
    if elements.iter().any(|e| e.len() > MAX_NAME_LEN) {
        return Err("path elements must be at most 255 bytes");
    }
    let clean = elements.join("/");
    if clean.is_empty() {
        return Err("must name a file, not the volume root");
    }
    if clean.starts_with("..") {
        return Err("must not start with \"..\"");
    }
    Ok(clean)
}

/// `(st_dev, st_ino)` of a stat result.
#[allow(clippy::useless_conversion)]
pub(crate) fn dev_ino(st: &Stat) -> (u64, u64) {
    (u64::from(st.st_dev), u64::from(st.st_ino))
}

/// Whether the object behind `fd` is the root of a mount (`STATX_ATTR_MOUNT_ROOT`); `None` when the
/// kernel does not report the attribute.
pub(crate) fn fd_is_mount_root(fd: impl AsFd) -> Result<Option<bool>, Errno> {
    let st = fs::statx(fd, "", AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS)?;
    let known = StatxAttributes::from_bits_retain(st.stx_attributes_mask.bits());
    if !known.contains(StatxAttributes::MOUNT_ROOT) {
        return Ok(None);
    }
    Ok(Some(
        StatxAttributes::from_bits_retain(st.stx_attributes.bits()).contains(StatxAttributes::MOUNT_ROOT),
    ))
}

/// Opens a directory for reading entries, refusing a symlink as the final component.
pub(crate) fn open_dir_nofollow(dir: impl AsFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Why [`remove_tree`] stopped.
#[derive(Debug)]
pub(crate) enum RemoveError {
    /// A system call failed.
    Io { path: PathBuf, op: &'static str, source: std::io::Error },
    /// A mount point (or a different file system) was found inside the tree; nothing beneath it was touched.
    MountPoint { path: PathBuf },
    /// A directory was moved while the tree was being removed (its `..` is no longer the recorded parent).
    Moved { path: PathBuf },
}

fn io_err(path: &Path, op: &'static str, errno: Errno) -> RemoveError {
    RemoveError::Io { path: path.to_path_buf(), op, source: errno.into() }
}

fn display_path(top: &Path, names: &[OsString]) -> PathBuf {
    let mut p = top.to_path_buf();
    p.extend(names);
    p
}

/// Removes `name` inside the directory `parent` (shown as `display` in errors) and everything beneath
/// it, without following any symlink: every step is relative to a descriptor opened with `O_NOFOLLOW`,
/// and symlinks are unlinked, never resolved. With `guard_mounts`, a directory that is a mount root or
/// on another device stops the removal with [`RemoveError::MountPoint`] before anything beneath it is
/// touched (a file bind mount makes its `unlink` fail with `EBUSY`, reported the same way).
///
/// Arbitrary depth with a constant number of descriptors: the walk goes back up through `..` and checks
/// that it arrives at the recorded `(dev, ino)` of the parent, so a directory renamed during the walk
/// cannot lead it elsewhere. A missing `name` is success.
pub(crate) fn remove_tree(
    parent: impl AsFd,
    name: &OsStr,
    display: &Path,
    guard_mounts: bool,
) -> Result<(), RemoveError> {
    let parent = parent.as_fd();
    let st = match fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_err(display, "lstat", e)),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return match fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(Errno::BUSY) => Err(RemoveError::MountPoint { path: display.to_path_buf() }),
            Err(e) => Err(io_err(display, "unlink", e)),
        };
    }
    let top = match open_dir_nofollow(parent, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_err(display, "open", e)),
    };
    let top_stat = fs::fstat(&top).map_err(|e| io_err(display, "fstat", e))?;
    let (top_dev, _) = dev_ino(&top_stat);
    if guard_mounts && fd_is_mount_root(&top).map_err(|e| io_err(display, "statx", e))? == Some(true) {
        return Err(RemoveError::MountPoint { path: display.to_path_buf() });
    }
    let mut names: Vec<OsString> = Vec::new();
    let mut ids: Vec<(u64, u64)> = vec![dev_ino(&top_stat)];
    let mut cur = top;
    loop {
        let here = display_path(display, &names);
        let mut descend: Option<OsString> = None;
        let mut entries = fs::Dir::read_from(&cur).map_err(|e| io_err(&here, "opendir", e))?;
        for entry in entries.by_ref() {
            let entry = entry.map_err(|e| io_err(&here, "readdir", e))?;
            let entry_name = OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
            if entry_name == "." || entry_name == ".." {
                continue;
            }
            let mut file_type = entry.file_type();
            if file_type == FileType::Unknown {
                file_type = match fs::statat(&cur, &entry_name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(io_err(&here.join(&entry_name), "lstat", e)),
                };
            }
            if file_type == FileType::Directory {
                descend = Some(entry_name);
                break;
            }
            match fs::unlinkat(&cur, &entry_name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(Errno::BUSY) => return Err(RemoveError::MountPoint { path: here.join(&entry_name) }),
                Err(e) => return Err(io_err(&here.join(&entry_name), "unlink", e)),
            }
        }
        drop(entries);
        match descend {
            Some(child) => {
                let child_path = here.join(&child);
                let fd = match open_dir_nofollow(&cur, &child) {
                    Ok(fd) => fd,
                    // Gone or replaced by a non-directory since the scan: the next scan handles it.
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                    Err(e) => return Err(io_err(&child_path, "open", e)),
                };
                let st = fs::fstat(&fd).map_err(|e| io_err(&child_path, "fstat", e))?;
                if guard_mounts {
                    let root = fd_is_mount_root(&fd).map_err(|e| io_err(&child_path, "statx", e))?;
                    if dev_ino(&st).0 != top_dev || root == Some(true) {
                        return Err(RemoveError::MountPoint { path: child_path });
                    }
                }
                ids.push(dev_ino(&st));
                names.push(child);
                cur = fd;
            }
            None => {
                let Some(child) = names.pop() else { break };
                ids.pop();
                let expected = ids.last().copied();
                let up = fs::openat(
                    &cur,
                    "..",
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io_err(&here, "open ..", e))?;
                let st = fs::fstat(&up).map_err(|e| io_err(&here, "fstat ..", e))?;
                if Some(dev_ino(&st)) != expected {
                    return Err(RemoveError::Moved { path: here });
                }
                match fs::unlinkat(&up, &child, AtFlags::REMOVEDIR) {
                    // NOTEMPTY: something was added meanwhile; the next scan of the parent descends again.
                    Ok(()) | Err(Errno::NOENT | Errno::NOTEMPTY) => {}
                    Err(Errno::BUSY) => return Err(RemoveError::MountPoint { path: here }),
                    Err(e) => return Err(io_err(&here, "rmdir", e)),
                }
                cur = up;
            }
        }
    }
    drop(cur);
    match fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::BUSY) => Err(RemoveError::MountPoint { path: display.to_path_buf() }),
        Err(e) => Err(io_err(display, "rmdir", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths() {
        assert_eq!(clean_relative_path("a"), Ok("a".to_string()));
        assert_eq!(clean_relative_path("a//./b/"), Ok("a/b".to_string()));
        assert_eq!(clean_relative_path("./a"), Ok("a".to_string()));
        assert_eq!(clean_relative_path("a/..b"), Ok("a/..b".to_string()));
        assert_eq!(clean_relative_path(""), Err("must not be empty"));
        assert_eq!(clean_relative_path("/etc"), Err("must be a relative path"));
        assert_eq!(clean_relative_path("../x"), Err("must not contain \"..\""));
        assert_eq!(clean_relative_path("a/../../x"), Err("must not contain \"..\""));
        assert_eq!(clean_relative_path("..data"), Err("must not start with \"..\""));
        assert_eq!(clean_relative_path("./..data"), Err("must not start with \"..\""));
        assert_eq!(clean_relative_path("."), Err("must name a file, not the volume root"));
        assert_eq!(clean_relative_path("a\0b"), Err("must not contain NUL"));
        assert!(clean_relative_path(&"x".repeat(256)).is_err());
        assert!(clean_relative_path(&"x/".repeat(2100)).is_err());
    }

    #[test]
    fn remove_tree_does_not_follow_symlinks_and_handles_depth() -> std::io::Result<()> {
        let outside = tempfile::tempdir()?;
        std::fs::write(outside.path().join("keep"), b"precious")?;
        let base = tempfile::tempdir()?;
        let victim = base.path().join("victim");
        let mut deep = victim.clone();
        for _ in 0..300 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep)?;
        std::fs::write(deep.join("f"), b"x")?;
        std::os::unix::fs::symlink(outside.path(), victim.join("link"))?;
        std::os::unix::fs::symlink(outside.path(), deep.join("link"))?;
        let parent =
            fs::open(base.path(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        remove_tree(&parent, OsStr::new("victim"), &victim, true)
            .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        assert!(!victim.exists());
        assert_eq!(std::fs::read(outside.path().join("keep"))?, b"precious");
        // Missing is fine.
        remove_tree(&parent, OsStr::new("victim"), &victim, true)
            .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        Ok(())
    }
}

//! Mounts: tmpfs for `emptyDir.medium: Memory`, unmounting, mount-point queries from
//! `/proc/self/mountinfo` (for reconstruction after a restart and leak checks), and
//! [`remove_dir_beneath`], a tree removal that refuses to delete anything through a leftover mount.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{self, AtFlags, Mode, OFlags, StatxAttributes, StatxFlags};
use rustix::io::Errno;
use rustix::mount::{self as rmount, MountFlags, UnmountFlags};

use crate::fsutil::{self, RemoveError};

/// Where the kernel lists this process's mounts.
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Errors of the mount primitives; each names the path concerned.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A system call failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// The operation (`mount tmpfs`, `umount`, `statx`, ...).
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The path is not absolute.
    #[error("{path:?}: must be an absolute path")]
    NotAbsolute {
        /// The offending path.
        path: PathBuf,
    },
    /// Mounting onto a path that is already a mount point (it would stack a second mount).
    #[error("{path:?} is already a mount point")]
    AlreadyMounted {
        /// The mount target.
        path: PathBuf,
    },
    /// The mount target is not a directory (or is a symlink, which is never followed).
    #[error("{path:?}: mount target must be a directory, not a symlink or other file")]
    NotADirectory {
        /// The mount target.
        path: PathBuf,
    },
    /// A directory removal found mounts beneath the directory and removed nothing.
    #[error("refusing to remove {path:?}: mount points beneath it: {mounts:?}")]
    MountsBeneath {
        /// The directory to remove.
        path: PathBuf,
        /// The mount points found (deepest first).
        mounts: Vec<PathBuf>,
    },
    /// A directory was moved while it was being removed; the removal stopped.
    #[error("refusing to continue removing {path:?}: it was moved during the removal")]
    Moved {
        /// The directory that moved.
        path: PathBuf,
    },
    /// A line of `/proc/self/mountinfo` could not be parsed.
    #[error("{MOUNTINFO}: cannot parse line {line}")]
    Mountinfo {
        /// The 1-based line number.
        line: usize,
    },
}

fn io(op: &'static str, path: &Path, errno: Errno) -> MountError {
    MountError::Io { op, path: path.to_path_buf(), source: errno.into() }
}

fn require_absolute(path: &Path) -> Result<(), MountError> {
    if path.is_absolute() { Ok(()) } else { Err(MountError::NotAbsolute { path: path.to_path_buf() }) }
}

/// Mounts a new tmpfs on the directory `target` with the root mode `mode` (e.g. `0o777` for an
/// emptyDir) and, when `size_bytes` is `Some(n)` with `n > 0`, a size limit of `n` bytes (rounded up
/// to pages by the kernel); writes past it fail with `ENOSPC`. `Some(0)` means no limit, as the
/// kubelet passes no `size=` option for a zero `sizeLimit` (tmpfs then defaults to half of RAM).
///
/// The mount is `nosuid,nodev` (the kubelet passes neither; a pod has no business with set-uid
/// binaries or device nodes in an emptyDir). `target` must be an existing directory, not a symlink
/// (it is opened with `O_NOFOLLOW` and the mount is made onto the open descriptor), and must not
/// already be a mount point: a second mount would hide the first, so this returns
/// [`MountError::AlreadyMounted`] instead (reconstruction after a restart checks
/// [`is_mount_point`] first).
pub fn mount_tmpfs(target: &Path, size_bytes: Option<u64>, mode: u32) -> Result<(), MountError> {
    require_absolute(target)?;
    let fd = match fs::open(
        target,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOTDIR | Errno::LOOP) => {
            return Err(MountError::NotADirectory { path: target.to_path_buf() });
        }
        Err(e) => return Err(io("open", target, e)),
    };
    if fsutil::fd_is_mount_root(&fd).map_err(|e| io("statx", target, e))? == Some(true) {
        return Err(MountError::AlreadyMounted { path: target.to_path_buf() });
    }
    let mut data = format!("mode={:o}", mode & 0o7777);
    if let Some(size) = size_bytes.filter(|s| *s > 0) {
        data.push_str(&format!(",size={size}"));
    }
    // A formatted string of digits and ASCII letters has no NUL.
    let data = CString::new(data).map_err(|_| io("mount tmpfs", target, Errno::INVAL))?;
    let via = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&fd));
    rmount::mount("tmpfs", via.as_str(), "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, data.as_c_str())
        .map_err(|e| io("mount tmpfs", target, e))?;
    tracing::debug!(target = %target.display(), ?size_bytes, mode = format_args!("{mode:o}"), "mounted tmpfs");
    Ok(())
}

/// Bind-mounts the directory `source` (an administrator's path: a `local` PersistentVolume) onto the
/// directory `target`, read-only when asked. Neither path may end in a symlink; `target` must not be a
/// mount point already (nothing is mounted twice).
pub fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
    require_absolute(source)?;
    require_absolute(target)?;
    let open_dir = |path: &Path| match fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOTDIR | Errno::LOOP) => Err(MountError::NotADirectory { path: path.to_path_buf() }),
        Err(e) => Err(io("open", path, e)),
    };
    let from = open_dir(source)?;
    let to = open_dir(target)?;
    if fsutil::fd_is_mount_root(&to).map_err(|e| io("statx", target, e))? == Some(true) {
        return Err(MountError::AlreadyMounted { path: target.to_path_buf() });
    }
    let from_via = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&from));
    let to_via = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&to));
    rmount::mount_bind(from_via.as_str(), to_via.as_str()).map_err(|e| io("bind mount", target, e))?;
    if read_only {
        let flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
        if let Err(e) = rmount::mount_remount(target, flags, "") {
            let _ = unmount(target);
            return Err(io("remount read-only", target, e));
        }
    }
    tracing::debug!(source = %source.display(), target = %target.display(), read_only, "bind-mounted");
    Ok(())
}

/// Unmounts the mount at `target` (the topmost one if several are stacked), without following a
/// final symlink (`UMOUNT_NOFOLLOW`) and without lazy detach: a busy mount is an error, not hidden.
/// A missing path (`ENOENT`) or a path that is not a mount point (`EINVAL`) is success, so the call is
/// idempotent.
pub fn unmount(target: &Path) -> Result<(), MountError> {
    unmount_with(target, UnmountFlags::NOFOLLOW)
}

/// Like [`unmount`] but with `MNT_DETACH`: the mount disappears from the namespace at once and is
/// released when no longer busy. For a last-resort cleanup only; the normal path is [`unmount`].
pub fn unmount_detach(target: &Path) -> Result<(), MountError> {
    unmount_with(target, UnmountFlags::NOFOLLOW | UnmountFlags::DETACH)
}

fn unmount_with(target: &Path, flags: UnmountFlags) -> Result<(), MountError> {
    require_absolute(target)?;
    match rmount::unmount(target, flags) {
        Ok(()) => {
            tracing::debug!(target = %target.display(), "unmounted");
            Ok(())
        }
        Err(Errno::NOENT | Errno::INVAL) => Ok(()),
        Err(e) => Err(io("umount", target, e)),
    }
}

/// Whether `path` is the root of a mount (including a bind mount of a directory or a file on the same
/// file system), from `statx`'s `STATX_ATTR_MOUNT_ROOT`, falling back to `/proc/self/mountinfo` on
/// kernels without it. A final symlink is not followed (a symlink is never a mount point); a missing
/// path is `Ok(false)`.
pub fn is_mount_point(path: &Path) -> Result<bool, MountError> {
    require_absolute(path)?;
    let st = match fs::statx(
        fs::CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::BASIC_STATS,
    ) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(io("statx", path, e)),
    };
    let known = StatxAttributes::from_bits_retain(st.stx_attributes_mask.bits());
    if known.contains(StatxAttributes::MOUNT_ROOT) {
        return Ok(
            StatxAttributes::from_bits_retain(st.stx_attributes.bits()).contains(StatxAttributes::MOUNT_ROOT)
        );
    }
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(read_mount_points()?.contains(&real))
}

/// The mount points at or beneath `dir`, deepest first (and, at the same depth, the most recent mount
/// first, so unmounting in this order takes stacked mounts off from the top). From
/// `/proc/self/mountinfo`, with its octal escapes (`\040` for a space, ...) decoded.
///
/// `/proc/self/mountinfo` shows resolved paths, so `dir` is canonicalized first when it exists (its
/// symlinks are resolved: `dir` is a path nodelet owns, not one from a pod); the returned paths are
/// the kernel's. Used to reconstruct the mounts of pods after a restart and to check for leaks.
pub fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, MountError> {
    require_absolute(dir)?;
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| lexical_clean(dir));
    let mut found: Vec<(usize, usize, PathBuf)> = read_mount_points()?
        .into_iter()
        .enumerate()
        .filter(|(_, m)| m.starts_with(&real))
        .map(|(i, m)| (m.components().count(), i, m))
        .collect();
    found.sort_by_key(|(depth, index, _)| std::cmp::Reverse((*depth, *index)));
    Ok(found.into_iter().map(|(_, _, m)| m).collect())
}

/// `a//b/./c/` → `a/b/c` (no `..` handling: callers pass absolute paths they own).
fn lexical_clean(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

/// Every mount point of this process's mount namespace, in mountinfo order.
fn read_mount_points() -> Result<Vec<PathBuf>, MountError> {
    let raw = std::fs::read(MOUNTINFO).map_err(|e| MountError::Io {
        op: "read",
        path: PathBuf::from(MOUNTINFO),
        source: e,
    })?;
    parse_mountinfo(&raw)
}

/// Parses the mount point column (the fifth) of mountinfo lines.
fn parse_mountinfo(raw: &[u8]) -> Result<Vec<PathBuf>, MountError> {
    let mut out = Vec::new();
    for (index, line) in raw.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let field = line.split(|b| *b == b' ').nth(4).ok_or(MountError::Mountinfo { line: index + 1 })?;
        out.push(PathBuf::from(OsString::from_vec(unescape_octal(field))));
    }
    Ok(out)
}

/// Decodes the kernel's `\ooo` escapes (space, tab, newline and backslash in mount paths).
fn unescape_octal(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(digits) = field.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// Removes the directory tree at `path` without following symlinks (symlinks inside are unlinked,
/// never resolved; a symlink at `path` itself is unlinked), refusing with
/// [`MountError::MountsBeneath`] — and removing nothing — if any mount point is at or beneath `path`.
/// A mount that appears during the removal is still never descended into: every directory is checked
/// to be on the same device and not a mount root before its entries are touched. So a teardown never
/// deletes a host directory's content through a leftover bind mount. A missing `path` is success.
pub fn remove_dir_beneath(path: &Path) -> Result<(), MountError> {
    require_absolute(path)?;
    let mounts = mounts_under(path)?;
    if !mounts.is_empty() {
        return Err(MountError::MountsBeneath { path: path.to_path_buf(), mounts });
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(MountError::NotAbsolute { path: path.to_path_buf() });
    };
    let parent_fd = match fs::open(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
    {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io("open", parent, e)),
    };
    fsutil::remove_tree(&parent_fd, OsStr::from_bytes(name.as_bytes()), path, true).map_err(|e| match e {
        RemoveError::Io { path, op, source } => MountError::Io { op, path, source },
        RemoveError::MountPoint { path: at } => {
            MountError::MountsBeneath { path: path.to_path_buf(), mounts: vec![at] }
        }
        RemoveError::Moved { path } => MountError::Moved { path },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_unescapes_mountinfo() -> Result<(), MountError> {
        let raw = b"22 27 0:21 / /proc rw,relatime - proc proc rw\n\
            36 35 98:0 /mnt1 /a\\040b\\011c\\134d rw,noatime master:1 - ext3 /dev/root rw\n\n";
        let points = parse_mountinfo(raw)?;
        assert_eq!(points, vec![PathBuf::from("/proc"), PathBuf::from("/a b\tc\\d")]);
        assert!(matches!(parse_mountinfo(b"1 2 3 /\n"), Err(MountError::Mountinfo { line: 1 })));
        assert_eq!(unescape_octal(b"x\\04"), b"x\\04".to_vec(), "short escapes stay literal");
        assert_eq!(unescape_octal(b"\\777"), b"\\777".to_vec(), "out-of-range escapes stay literal");
        Ok(())
    }

    #[test]
    fn relative_paths_are_rejected() {
        assert!(matches!(unmount(Path::new("rel")), Err(MountError::NotAbsolute { .. })));
        assert!(matches!(mounts_under(Path::new("rel")), Err(MountError::NotAbsolute { .. })));
        assert!(matches!(is_mount_point(Path::new("rel")), Err(MountError::NotAbsolute { .. })));
    }

    #[test]
    fn proc_is_a_mount_point_and_listed() -> Result<(), MountError> {
        assert!(is_mount_point(Path::new("/proc"))?);
        assert!(!is_mount_point(Path::new("/nonexistent-nodelet-host-test"))?);
        assert!(mounts_under(Path::new("/proc"))?.contains(&PathBuf::from("/proc")));
        Ok(())
    }
}

//! The kubelet's `SetVolumeOwnership` (`pkg/volume/volume_linux.go`): gives every file and
//! directory of a volume the pod's `fsGroup` and the group permissions its containers need.
//!
//! For each entry beneath the volume's root and then the root itself (children first, as the
//! kubelet's `walkDeep`):
//!
//! - the group becomes `gid` (`lchown(-1, gid)`; a symlink's own group, never its target's);
//! - symlinks keep their mode; other entries get their mode OR'ed with `0440` (read-only volumes)
//!   or `0660`; directories also with `0110` (search) and the setgid bit, so that files made later
//!   inherit the group.
//!
//! As in the kubelet, a failed `chown` or `chmod` of one entry is logged and the walk goes on; a
//! directory that cannot be read stops it with an error. Entries are never reached through a
//! symlink: every step is relative to a directory descriptor opened with `O_NOFOLLOW`, and each
//! entry is changed through an `O_PATH | O_NOFOLLOW` descriptor of the inode that was inspected
//! (a container that swaps an entry for a symlink mid-walk changes the link, not its target). The
//! walk does not cross into other mounts below the root (the kubelet's does; a volume's content
//! has none of the volume's own).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Gid, Mode, OFlags};
use rustix::io::Errno;

use crate::fsutil;

/// Group read and write, for writable volumes.
const RW_MASK: u32 = 0o660;
/// Group read, for read-only volumes.
const RO_MASK: u32 = 0o440;
/// Search permission added on directories.
const EXEC_MASK: u32 = 0o110;
/// The setgid bit, added on directories.
const SETGID: u32 = 0o2000;
/// The deepest directory nesting walked (each level holds one descriptor open).
const MAX_DEPTH: usize = 512;

/// Why [`set_volume_ownership`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// A system call on a directory of the walk failed.
    #[error("{path:?}: {op}: {source}")]
    Io {
        /// The entry concerned.
        path: PathBuf,
        /// The operation.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The root is not a directory, or a symlink.
    #[error("{path:?}: not a directory")]
    NotADirectory {
        /// The volume root.
        path: PathBuf,
    },
    /// The volume's directories nest deeper than the walk goes.
    #[error("{path:?}: directories nested deeper than {MAX_DEPTH} levels")]
    TooDeep {
        /// The directory at the limit.
        path: PathBuf,
    },
}

fn io(path: &Path, op: &'static str, e: Errno) -> OwnershipError {
    OwnershipError::Io { path: path.to_path_buf(), op, source: e.into() }
}

/// The mode an entry of `file_type` and mode `mode` (permission and special bits) gets.
pub fn owned_mode(file_type: FileType, mode: u32, read_only: bool) -> u32 {
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if file_type == FileType::Directory {
        mask |= SETGID | EXEC_MASK;
    }
    (mode & 0o7777) | mask
}

/// Whether the volume root `dir` needs the walk under `fsGroupChangePolicy: OnRootMismatch` (the
/// kubelet's `requiresPermissionChange`): its group is not `gid`, or it lacks a bit of the mask
/// (`rw`/`r` and search for the group), or the setgid bit. An unreadable root needs it.
pub fn requires_change(dir: &Path, gid: u32, read_only: bool) -> bool {
    let Ok(st) = fs::stat(dir) else { return true };
    if st.st_gid != gid || FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return true;
    }
    let want = if read_only { RO_MASK } else { RW_MASK } | EXEC_MASK;
    let perm = st.st_mode & 0o777;
    perm & want != want || st.st_mode & SETGID == 0
}

/// Applies `gid` to the volume directory `dir` and everything beneath it, as described in the
/// [module docs](self). `dir` itself must not be a symlink.
pub fn set_volume_ownership(dir: &Path, gid: u32, read_only: bool) -> Result<(), OwnershipError> {
    let root =
        fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| match e {
                Errno::NOTDIR | Errno::LOOP => OwnershipError::NotADirectory { path: dir.to_path_buf() },
                e => io(dir, "open", e),
            })?;
    let root_stat = fs::fstat(&root).map_err(|e| io(dir, "fstat", e))?;
    let (dev, _) = fsutil::dev_ino(&root_stat);
    let walker = Walker { gid: Gid::from_raw(gid), read_only, dev };
    walker.walk_dir(&root, dir, 0)?;
    walker.change_fd(root.as_fd(), dir);
    Ok(())
}

struct Walker {
    gid: Gid,
    read_only: bool,
    dev: u64,
}

impl Walker {
    /// Changes every entry beneath the directory `fd` (shown as `path`), depth first.
    fn walk_dir(&self, fd: &OwnedFd, path: &Path, depth: usize) -> Result<(), OwnershipError> {
        if depth >= MAX_DEPTH {
            return Err(OwnershipError::TooDeep { path: path.to_path_buf() });
        }
        for name in entry_names(fd, path)? {
            let child_path = path.join(&name);
            let child =
                match fs::openat(fd, &name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                {
                    Ok(child) => child,
                    // Gone since the listing.
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(io(&child_path, "open", e)),
                };
            let st = fs::fstat(&child).map_err(|e| io(&child_path, "fstat", e))?;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory
                && fsutil::dev_ino(&st).0 == self.dev
            {
                match fsutil::open_dir_nofollow(fd, &name) {
                    Ok(dir) => {
                        // The same inode that was inspected (not a replacement).
                        let again = fs::fstat(&dir).map_err(|e| io(&child_path, "fstat", e))?;
                        if fsutil::dev_ino(&again) == fsutil::dev_ino(&st) {
                            self.walk_dir(&dir, &child_path, depth + 1)?;
                        }
                    }
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                    Err(e) => return Err(io(&child_path, "open", e)),
                }
            }
            self.change_fd(child.as_fd(), &child_path);
        }
        Ok(())
    }

    /// Changes the group and mode of the inode behind `fd` (an `O_PATH | O_NOFOLLOW` or directory
    /// descriptor); failures are logged, as the kubelet logs them.
    fn change_fd(&self, fd: BorrowedFd<'_>, path: &Path) {
        if let Err(e) =
            fs::chownat(fd, "", None, Some(self.gid), AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
        {
            tracing::error!(path = %path.display(), error = %e, "fsGroup: lchown failed");
        }
        let st = match fs::fstat(fd) {
            Ok(st) => st,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "fsGroup: stat failed");
                return;
            }
        };
        let file_type = FileType::from_raw_mode(st.st_mode);
        // A symlink's mode means nothing (and chmod would reach its target).
        if file_type == FileType::Symlink {
            return;
        }
        let mode = Mode::from_raw_mode(owned_mode(file_type, st.st_mode, self.read_only));
        // An O_PATH descriptor takes no fchmod; its /proc/self/fd entry names exactly its inode.
        let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Err(e) = fs::chmod(via.as_str(), mode) {
            tracing::error!(path = %path.display(), error = %e, "fsGroup: chmod failed");
        }
    }
}

/// The names in the directory `fd` (without `.` and `..`).
fn entry_names(fd: &OwnedFd, path: &Path) -> Result<Vec<OsString>, OwnershipError> {
    let mut out = Vec::new();
    let dir = fs::Dir::read_from(fd).map_err(|e| io(path, "opendir", e))?;
    for entry in dir {
        let entry = entry.map_err(|e| io(path, "readdir", e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push(OsStr::from_bytes(name).to_os_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_the_kubelets_masks() {
        assert_eq!(owned_mode(FileType::RegularFile, 0o400, true), 0o440);
        assert_eq!(owned_mode(FileType::RegularFile, 0o400, false), 0o660);
        assert_eq!(owned_mode(FileType::RegularFile, 0o644, true), 0o644);
        assert_eq!(owned_mode(FileType::Directory, 0o755, true), 0o2755);
        assert_eq!(owned_mode(FileType::Directory, 0o1777, true), 0o3777);
        assert_eq!(owned_mode(FileType::Directory, 0o700, false), 0o2770);
        // The file type bits of st_mode are not mode bits.
        assert_eq!(owned_mode(FileType::RegularFile, 0o100600, true), 0o640);
    }
}

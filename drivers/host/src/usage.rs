//! Disk usage of a directory tree, measured as `du -x` counts it, with bounds: the walk never follows a
//! symlink (every step is relative to a descriptor opened with `O_NOFOLLOW`), never crosses into another
//! mount (another device, or a mount root of the same device), counts allocated blocks and inodes (each
//! hard-linked inode once), stops as soon as the usage is over a given limit, and does at most a given
//! number of entries per [`Budget`], so one pod's million files cannot hold up the node.
//!
//! Used by the node's background volume measurement (the volumes of `/stats/summary`) and the eviction
//! manager's local storage capacity isolation (emptyDir `sizeLimit`, containers' `ephemeral-storage`
//! limits). Blocking: run it on a blocking thread.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::OwnedFd;
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::fsutil::{dev_ino, fd_is_mount_root, open_dir_nofollow};

/// How deep the walk descends (directories deeper than this are counted, not entered): it bounds the
/// descriptors held open at once.
pub const MAX_DEPTH: usize = 128;

/// Why a tree could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The top of the tree could not be examined.
    #[error("cannot {op} {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What failed (`lstat`, `open`).
        op: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Bytes of allocated blocks and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes of allocated blocks (`st_blocks` × 512).
    pub bytes: u64,
    /// Inodes (files, directories, symlinks), the top included.
    pub inodes: u64,
}

/// How a measurement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The whole tree was counted.
    Complete,
    /// The usage went over the limit; the rest was not counted.
    OverLimit,
    /// The budget ran out; the rest was not counted.
    OutOfBudget,
}

/// A measurement: the usage counted, exact when [`End::Complete`], a lower bound otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// What was counted.
    pub usage: Usage,
    /// Why the walk ended.
    pub end: End,
}

/// How many entries the walks sharing it may still examine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    entries: u64,
}

impl Budget {
    /// A budget of `entries` directory entries.
    pub fn new(entries: u64) -> Self {
        Self { entries }
    }

    /// Entries left.
    pub fn remaining(&self) -> u64 {
        self.entries
    }

    /// Whether nothing is left.
    pub fn is_exhausted(&self) -> bool {
        self.entries == 0
    }

    fn take(&mut self) -> bool {
        if self.entries == 0 {
            return false;
        }
        self.entries -= 1;
        true
    }
}

fn io(path: &Path, op: &'static str, e: Errno) -> UsageError {
    UsageError::Io { path: path.to_path_buf(), op, source: e.into() }
}

fn blocks(st: &Stat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// The names in the directory `fd` (without `.` and `..`), at most `max` (one more than the budget, so
/// that a walk that runs out of budget knows it).
fn names(fd: &OwnedFd, max: u64) -> Vec<OsString> {
    let Ok(dir) = fs::Dir::read_from(fd) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir {
        let Ok(entry) = entry else { break };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if out.len() as u64 >= max {
            break;
        }
        out.push(std::ffi::OsStr::from_bytes(name).to_os_string());
    }
    out
}

/// Measures `path` (a directory or a file). `limit`: stop once the bytes counted are over it.
/// `Ok(None)` when `path` does not exist. Each entry below the top takes one from `budget`.
pub fn measure(path: &Path, limit: Option<u64>, budget: &mut Budget) -> Result<Option<Measured>, UsageError> {
    let top = match fs::lstat(path) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io(path, "lstat", e)),
    };
    let mut usage = Usage { bytes: blocks(&top), inodes: 1 };
    let over = |u: &Usage| limit.is_some_and(|l| u.bytes > l);
    let done = |usage, end| Ok(Some(Measured { usage, end }));
    if over(&usage) {
        return done(usage, End::OverLimit);
    }
    if FileType::from_raw_mode(top.st_mode) != FileType::Directory {
        return done(usage, End::Complete);
    }
    let root = match fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io(path, "open", e)),
    };
    let (dev, _) = dev_ino(&top);
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let first = names(&root, budget.remaining().saturating_add(1));
    let mut stack: Vec<(OwnedFd, Vec<OsString>)> = vec![(root, first)];
    loop {
        let depth = stack.len();
        let Some((fd, pending)) = stack.last_mut() else { break };
        let Some(name) = pending.pop() else {
            stack.pop();
            continue;
        };
        if !budget.take() {
            return done(usage, End::OutOfBudget);
        }
        let st = match fs::statat(&*fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since it was listed, or unreadable: not counted.
            Err(_) => continue,
        };
        let (d, ino) = dev_ino(&st);
        if d != dev {
            continue;
        }
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if !is_dir && st.st_nlink > 1 && !seen.insert((d, ino)) {
            continue;
        }
        if is_dir && depth < MAX_DEPTH {
            let Ok(child) = open_dir_nofollow(&*fd, &name) else { continue };
            // A bind mount from the same device is another mount all the same.
            if fd_is_mount_root(&child).ok().flatten() == Some(true) {
                continue;
            }
            usage.bytes = usage.bytes.saturating_add(blocks(&st));
            usage.inodes = usage.inodes.saturating_add(1);
            if over(&usage) {
                return done(usage, End::OverLimit);
            }
            let entries = names(&child, budget.remaining().saturating_add(1));
            stack.push((child, entries));
            continue;
        }
        usage.bytes = usage.bytes.saturating_add(blocks(&st));
        usage.inodes = usage.inodes.saturating_add(1);
        if over(&usage) {
            return done(usage, End::OverLimit);
        }
    }
    done(usage, End::Complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    fn write(path: &Path, bytes: usize) {
        if let Err(e) = std::fs::write(path, vec![1_u8; bytes]) {
            panic!("write {}: {e}", path.display());
        }
    }

    fn unlimited() -> Budget {
        Budget::new(u64::MAX)
    }

    fn measured(path: &Path, limit: Option<u64>, budget: &mut Budget) -> Measured {
        match measure(path, limit, budget) {
            Ok(Some(m)) => m,
            other => panic!("measure {}: {other:?}", path.display()),
        }
    }

    #[test]
    fn counts_blocks_and_inodes_like_du_and_hard_links_once() {
        let d = tmp();
        let sub = d.path().join("a/b");
        std::fs::create_dir_all(&sub).unwrap_or_else(|e| panic!("{e}"));
        write(&sub.join("f"), 1 << 20);
        std::fs::hard_link(sub.join("f"), d.path().join("link")).unwrap_or_else(|e| panic!("{e}"));
        let m = measured(d.path(), None, &mut unlimited());
        assert_eq!(m.end, End::Complete);
        assert_eq!(m.usage.inodes, 4, "the top, a, a/b, f (the hard link once)");
        assert!(m.usage.bytes >= 1 << 20 && m.usage.bytes < (1 << 20) + 64 * 1024, "{m:?}");
    }

    #[test]
    fn never_follows_a_symlink() {
        let d = tmp();
        let outside = tmp();
        write(&outside.path().join("big"), 4 << 20);
        let inside = d.path().join("vol");
        std::fs::create_dir(&inside).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(outside.path(), inside.join("escape")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(outside.path().join("big"), inside.join("file"))
            .unwrap_or_else(|e| panic!("{e}"));
        let m = measured(&inside, None, &mut unlimited());
        assert!(m.usage.bytes < 1 << 20, "the symlinks' targets are not counted: {m:?}");
        assert_eq!(m.usage.inodes, 3);
        // A symlink as the top is counted as itself.
        let m = measured(&inside.join("escape"), None, &mut unlimited());
        assert!(m.usage.bytes < 1 << 20, "{m:?}");
    }

    #[test]
    fn stops_once_over_the_limit() {
        let d = tmp();
        for i in 0..50 {
            write(&d.path().join(format!("f{i}")), 64 * 1024);
        }
        let mut budget = unlimited();
        let m = measured(d.path(), Some(1 << 20), &mut budget);
        assert_eq!(m.end, End::OverLimit);
        assert!(m.usage.bytes > 1 << 20, "{m:?}");
        assert!(m.usage.inodes < 30, "stopped early: {m:?}");
        let m = measured(d.path(), Some(100 << 20), &mut unlimited());
        assert_eq!(m.end, End::Complete);
        assert_eq!(m.usage.inodes, 51);
    }

    #[test]
    fn a_budget_bounds_the_work_of_every_walk_sharing_it() {
        let d = tmp();
        for i in 0..20 {
            write(&d.path().join(format!("f{i}")), 10);
        }
        let mut budget = Budget::new(15);
        let m = measured(d.path(), None, &mut budget);
        assert_eq!(m.end, End::OutOfBudget);
        assert_eq!(m.usage.inodes, 16, "the top and 15 entries");
        assert!(budget.is_exhausted());
        let m = measured(d.path(), None, &mut budget);
        assert_eq!((m.end, m.usage.inodes), (End::OutOfBudget, 1), "nothing left for a second walk");
    }

    #[test]
    fn a_missing_path_is_none_and_a_file_is_itself() {
        let d = tmp();
        assert!(matches!(measure(&d.path().join("nope"), None, &mut unlimited()), Ok(None)));
        write(&d.path().join("f"), 8192);
        let m = measured(&d.path().join("f"), None, &mut unlimited());
        assert_eq!((m.end, m.usage.inodes), (End::Complete, 1));
        assert!(m.usage.bytes >= 8192);
    }
}

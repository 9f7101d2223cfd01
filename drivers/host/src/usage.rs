//! Disk usage of a directory tree, measured as `du -x` counts it, with bounds: the walk never follows a
//! symlink (every step is relative to a descriptor opened with `O_NOFOLLOW`), never crosses into another
//! mount (another device, or a mount root of the same device), counts allocated blocks and inodes (each
//! hard-linked inode once), stops as soon as the usage is over a given limit, and does at most a given
//! number of entries per [`Budget`], so one pod's million files cannot hold up the node. A [`Walk`]
//! kept between passes resumes where the budget stopped it, so a tree with more entries than one
//! budget is still counted whole, over several passes (more files cannot hide usage).
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

/// A walk of one tree that resumes where the previous pass stopped when a [`Budget`] runs out, so
/// that a tree with more entries than one budget is still counted whole, over several passes.
///
/// The state kept between passes is the path from the top to the directory being read, as names,
/// each with the directory's inode and the position (the `getdents` cookie, `d_off`) to read on
/// from, plus the usage counted so far and the hard-linked inodes seen: memory bounded by the
/// tree's depth ([`MAX_DEPTH`]) and its hard links, not by its number of entries. Each pass opens
/// that path again from the top, one component at a time with `O_NOFOLLOW` (never a symlink),
/// checks that each directory is still the same inode on the same device and not a mount root;
/// a directory that vanished or was replaced since is skipped (its part already counted stays
/// counted). While a walk is incomplete the usage reported is the larger of the last finished
/// walk's and the partial sum, so the figure never drops below what was already seen.
#[derive(Debug, Default)]
pub struct Walk {
    /// The top's `(st_dev, st_ino)` while a walk is under way.
    top: Option<(u64, u64)>,
    /// The directories being read, from the top's child down.
    frames: Vec<Frame>,
    /// Where to read on in the top directory.
    top_offset: i64,
    /// What this walk counted so far.
    partial: Usage,
    /// Hard-linked inodes this walk counted.
    seen: HashSet<(u64, u64)>,
    /// The figure of the last walk that ended (complete, or over the limit).
    last: Option<Usage>,
}

/// One directory of a walk in progress.
#[derive(Debug)]
struct Frame {
    /// Its name in its parent.
    name: OsString,
    /// Its inode (a directory replaced under the same name is not resumed).
    ino: u64,
    /// Where to read on.
    offset: i64,
}

impl Walk {
    /// A walk not started yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a walk is under way (a previous pass ran out of budget in it).
    pub fn in_progress(&self) -> bool {
        self.top.is_some()
    }

    /// Forgets the walk under way; the next pass starts at the top.
    fn restart(&mut self) {
        self.top = None;
        self.frames.clear();
        self.top_offset = 0;
        self.partial = Usage::default();
        self.seen.clear();
    }

    /// The figure to report while the walk is incomplete.
    fn lower_bound(&self) -> Usage {
        let last = self.last.unwrap_or_default();
        Usage { bytes: last.bytes.max(self.partial.bytes), inodes: last.inodes.max(self.partial.inodes) }
    }

    /// Ends the walk with its partial count as the figure.
    fn finish(&mut self, end: End) -> Result<Option<Measured>, UsageError> {
        let usage = self.partial;
        self.last = Some(usage);
        self.restart();
        Ok(Some(Measured { usage, end }))
    }

    /// One pass over `path` (a directory or a file): goes on with the walk under way, or starts one.
    /// `limit`: stop once the bytes counted are over it (the walk ends there, [`End::OverLimit`]).
    /// Each entry below the top takes one from `budget`; when it runs out, the walk is kept for the
    /// next pass and the usage returned is a lower bound ([`End::OutOfBudget`]). `Ok(None)` when
    /// `path` does not exist (the walk is forgotten).
    pub fn step(
        &mut self,
        path: &Path,
        limit: Option<u64>,
        budget: &mut Budget,
    ) -> Result<Option<Measured>, UsageError> {
        let top = match fs::lstat(path) {
            Ok(st) => st,
            Err(Errno::NOENT) => {
                self.restart();
                self.last = None;
                return Ok(None);
            }
            Err(e) => return Err(io(path, "lstat", e)),
        };
        let over = |u: &Usage| limit.is_some_and(|l| u.bytes > l);
        let top_id = dev_ino(&top);
        if self.top != Some(top_id) {
            // Not started, or the top was replaced: start again.
            self.restart();
        }
        if self.top.is_none() {
            self.partial = Usage { bytes: blocks(&top), inodes: 1 };
            if over(&self.partial) {
                return self.finish(End::OverLimit);
            }
            if FileType::from_raw_mode(top.st_mode) != FileType::Directory {
                return self.finish(End::Complete);
            }
        }
        let root = match fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                self.restart();
                self.last = None;
                return Ok(None);
            }
            Err(e) => {
                self.restart();
                return Err(io(path, "open", e));
            }
        };
        // The top opened is the top examined (not swapped in between).
        match fs::fstat(&root) {
            Ok(st) if dev_ino(&st) == top_id => {}
            _ => {
                self.restart();
                return Ok(Some(Measured { usage: self.lower_bound(), end: End::OutOfBudget }));
            }
        }
        self.top = Some(top_id);
        let dev = top_id.0;
        let Some(mut dirs) = self.reopen(root, dev) else {
            return Ok(Some(Measured { usage: self.lower_bound(), end: End::OutOfBudget }));
        };
        loop {
            let depth = dirs.len();
            let Some(dir) = dirs.last_mut() else { break };
            let entry = match dir.read() {
                Some(Ok(entry)) => entry,
                // The end of the directory, or it cannot be read on: done with it.
                Some(Err(_)) | None => {
                    dirs.pop();
                    self.frames.pop();
                    continue;
                }
            };
            let name = entry.file_name().to_bytes();
            let next = entry.offset();
            if name == b"." || name == b".." {
                self.set_offset(next);
                continue;
            }
            if !budget.take() {
                // This entry is read again by the next pass.
                return Ok(Some(Measured { usage: self.lower_bound(), end: End::OutOfBudget }));
            }
            self.set_offset(next);
            let name = std::ffi::OsStr::from_bytes(name).to_os_string();
            let Ok(parent) = dir.fd() else { continue };
            let st = match fs::statat(parent, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Gone since it was listed, or unreadable: not counted.
                Err(_) => continue,
            };
            let (d, ino) = dev_ino(&st);
            if d != dev {
                continue;
            }
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            if !is_dir && st.st_nlink > 1 && !self.seen.insert((d, ino)) {
                continue;
            }
            let mut child = None;
            if is_dir && depth < MAX_DEPTH {
                let Ok(fd) = open_dir_nofollow(parent, &name) else { continue };
                // A bind mount from the same device is another mount all the same.
                if fd_is_mount_root(&fd).ok().flatten() == Some(true) {
                    continue;
                }
                let Ok(d) = fs::Dir::new(fd) else { continue };
                child = Some(d);
            }
            self.partial.bytes = self.partial.bytes.saturating_add(blocks(&st));
            self.partial.inodes = self.partial.inodes.saturating_add(1);
            if over(&self.partial) {
                return self.finish(End::OverLimit);
            }
            if let Some(child) = child {
                dirs.push(child);
                self.frames.push(Frame { name, ino, offset: 0 });
            }
        }
        self.finish(End::Complete)
    }

    /// Records where the innermost directory is read on from.
    fn set_offset(&mut self, offset: i64) {
        match self.frames.last_mut() {
            Some(f) => f.offset = offset,
            None => self.top_offset = offset,
        }
    }

    /// The directories of the walk under way, opened again from `root` without following a link,
    /// each at its position. The frames below a directory that vanished, was replaced or became a
    /// mount are dropped (the walk goes on in its parent). `None` when the top cannot be read.
    fn reopen(&mut self, root: OwnedFd, dev: u64) -> Option<Vec<fs::Dir>> {
        let mut top = fs::Dir::new(root).ok()?;
        if self.top_offset != 0 && top.seek(self.top_offset).is_err() {
            return None;
        }
        let mut dirs = vec![top];
        let mut kept = 0;
        for frame in &self.frames {
            let Some(parent) = dirs.last().and_then(|d| d.fd().ok()) else { break };
            let Ok(fd) = open_dir_nofollow(parent, &frame.name) else { break };
            match fs::fstat(&fd) {
                Ok(st) if dev_ino(&st) == (dev, frame.ino) => {}
                _ => break,
            }
            if fd_is_mount_root(&fd).ok().flatten() == Some(true) {
                break;
            }
            let Ok(mut dir) = fs::Dir::new(fd) else { break };
            if frame.offset != 0 && dir.seek(frame.offset).is_err() {
                break;
            }
            dirs.push(dir);
            kept += 1;
        }
        self.frames.truncate(kept);
        Some(dirs)
    }
}

/// Measures `path` (a directory or a file) in one pass: a fresh [`Walk`]. `limit`: stop once the
/// bytes counted are over it. `Ok(None)` when `path` does not exist. Each entry below the top takes
/// one from `budget`.
pub fn measure(path: &Path, limit: Option<u64>, budget: &mut Budget) -> Result<Option<Measured>, UsageError> {
    Walk::new().step(path, limit, budget)
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

    fn step(walk: &mut Walk, path: &Path, budget: u64) -> Measured {
        match walk.step(path, None, &mut Budget::new(budget)) {
            Ok(Some(m)) => m,
            other => panic!("step {}: {other:?}", path.display()),
        }
    }

    /// `dirs` directories of `files` files of 4 KiB each under `top`, nested two deep.
    fn tree(top: &Path, dirs: usize, files: usize) {
        for d in 0..dirs {
            let dir = top.join(format!("d{d}")).join("inner");
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
            for f in 0..files {
                write(&dir.join(format!("f{f}")), 4096);
            }
        }
    }

    #[test]
    fn a_tree_larger_than_the_budget_is_counted_whole_over_several_passes() {
        let d = tmp();
        tree(d.path(), 4, 25);
        std::fs::hard_link(d.path().join("d0/inner/f0"), d.path().join("d3/inner/link"))
            .unwrap_or_else(|e| panic!("{e}"));
        let whole = measured(d.path(), None, &mut unlimited());
        assert_eq!((whole.end, whole.usage.inodes), (End::Complete, 1 + 4 * 2 + 4 * 25));
        let mut walk = Walk::new();
        let mut reported = Vec::new();
        let last = loop {
            let m = step(&mut walk, d.path(), 7);
            reported.push(m.usage);
            if m.end == End::Complete {
                break m;
            }
            assert_eq!(m.end, End::OutOfBudget);
            assert!(walk.in_progress());
            assert!(reported.len() < 100, "the walk makes progress: {reported:?}");
        };
        assert_eq!(last.usage, whole.usage, "the same count as one unbounded walk, the hard link once");
        assert_eq!(reported.len(), 109_usize.div_ceil(7), "7 entries a pass, 109 entries");
        assert!(
            reported.windows(2).all(|w| w[0].bytes <= w[1].bytes && w[0].inodes <= w[1].inodes),
            "{reported:?}"
        );
        assert!(!walk.in_progress());

        // The next walk starts fresh; while it is incomplete it reports no less than the last total,
        // even when files were removed in between; once complete, the new total.
        std::fs::remove_dir_all(d.path().join("d1")).unwrap_or_else(|e| panic!("{e}"));
        let m = step(&mut walk, d.path(), 7);
        assert_eq!((m.end, m.usage), (End::OutOfBudget, whole.usage), "the last total while below it");
        let again = loop {
            let m = step(&mut walk, d.path(), 7);
            assert!(m.end == End::Complete || m.usage == whole.usage, "{m:?}");
            if m.end == End::Complete {
                break m;
            }
        };
        assert_eq!(again.usage.inodes, whole.usage.inodes - 27, "d1, d1/inner and its 25 files are gone");
    }

    #[test]
    fn a_partial_sum_above_the_last_total_is_reported_and_a_resumed_walk_stops_over_the_limit() {
        let d = tmp();
        tree(d.path(), 1, 5);
        let mut walk = Walk::new();
        let small = step(&mut walk, d.path(), 1000);
        assert_eq!(small.end, End::Complete);
        tree(d.path(), 3, 40);
        let mut previous = small.usage;
        loop {
            let m = match walk.step(d.path(), Some(300 * 1024), &mut Budget::new(10)) {
                Ok(Some(m)) => m,
                other => panic!("{other:?}"),
            };
            assert!(m.usage.bytes >= previous.bytes, "never below what was reported: {m:?} {previous:?}");
            previous = m.usage;
            if m.end != End::OutOfBudget {
                assert_eq!(m.end, End::OverLimit, "{m:?}");
                assert!(m.usage.bytes > 300 * 1024);
                break;
            }
        }
        assert!(!walk.in_progress(), "a walk over the limit ends");
    }

    #[test]
    fn a_directory_vanishing_or_turning_into_a_symlink_mid_walk_is_skipped() {
        let d = tmp();
        let outside = tmp();
        write(&outside.path().join("big"), 4 << 20);
        tree(d.path(), 3, 20);
        let mut walk = Walk::new();
        // Stop inside the first directory the walk enters.
        let first = step(&mut walk, d.path(), 5);
        assert_eq!(first.end, End::OutOfBudget);
        let entered = walk.frames.first().map(|f| f.name.clone()).unwrap_or_else(|| panic!("{walk:?}"));
        std::fs::remove_dir_all(d.path().join(&entered)).unwrap_or_else(|e| panic!("{e}"));
        // The same name comes back as a symlink out of the tree: not followed.
        std::os::unix::fs::symlink(outside.path(), d.path().join(&entered)).unwrap_or_else(|e| panic!("{e}"));
        let m = loop {
            let m = step(&mut walk, d.path(), 5);
            if m.end == End::Complete {
                break m;
            }
        };
        assert!(m.usage.bytes < 4 << 20, "the symlink's target is not counted: {m:?}");
        // The two directories left are counted whole (2 × 21 entries, plus the top and what was
        // counted of the vanished one before it went).
        assert!((45..=50).contains(&m.usage.inodes), "{m:?}");
        // The top itself vanishing ends the walk.
        let mut walk = Walk::new();
        assert_eq!(step(&mut walk, d.path(), 3).end, End::OutOfBudget);
        let top = d.path().to_path_buf();
        drop(d);
        assert!(matches!(walk.step(&top, None, &mut unlimited()), Ok(None)));
        assert!(!walk.in_progress());
    }
}

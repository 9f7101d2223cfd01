//! The kubelet's AtomicWriter (`pkg/volume/util/atomic_writer.go`): writes a [`FileSet`] into a
//! volume directory so that a reader sees either the whole old or the whole new content.
//!
//! Layout (exactly the kubelet's):
//!
//! ```text
//! <dir>/..2024_05_01_10_00_00.123456789/   the content, files with their modes (dirs 0755)
//! <dir>/..data -> ..2024_05_01_10_00_00.123456789
//! <dir>/<name> -> ..data/<name>            one symlink per top-level name of the content
//! ```
//!
//! An update writes a new timestamped directory, points a temporary symlink `..data_tmp` at it and
//! renames that over `..data` (an atomic switch), creates the missing top-level symlinks, removes the
//! top-level symlinks no longer in the content, and removes the old timestamped directory (and any
//! left behind by a crash). Identical content and modes are a no-op.
//!
//! Safety: every operation is relative to a descriptor of `dir`; files are created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` inside the freshly made timestamped directory only; removals never
//! follow symlinks and only touch entries this layout owns (a `..data` pointing elsewhere is
//! replaced, never followed into; an unexpected regular file with a content name is an error, not
//! deleted). The volume must be mounted read-only into containers (CVE-2017-1002102).
//!
//! Differences from the kubelet: modes are compared too (the kubelet compares content only, so a
//! `defaultMode` change alone would not be applied), and a removed path always produces a new
//! timestamped directory (the kubelet keeps the old one when the remaining files are unchanged).
//! Ownership (`fsGroup`) is not handled here.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::files::FileSet;
use crate::fsutil::{self, RemoveError};

/// The symlink naming the current timestamped directory.
pub const DATA_DIR_NAME: &str = "..data";
/// The temporary symlink renamed over [`DATA_DIR_NAME`].
pub const DATA_DIR_TMP_NAME: &str = "..data_tmp";

/// Errors of [`write_atomic`]; each names the volume directory.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// A file path of the content is not acceptable.
    #[error("{dir:?}: file {path:?}: {reason}")]
    InvalidPath {
        /// The volume directory.
        dir: PathBuf,
        /// The offending path.
        path: String,
        /// Why.
        reason: String,
    },
    /// A file mode is outside 0..=0o777.
    #[error("{dir:?}: file {path:?}: mode {mode:#o} must be between 0 and 0777")]
    InvalidMode {
        /// The volume directory.
        dir: PathBuf,
        /// The file.
        path: String,
        /// The mode.
        mode: u32,
    },
    /// An entry of the volume directory that this layout does not own has a content name.
    #[error("{dir:?}: {name:?} exists and is not a symlink to \"..data/{name}\"; refusing to replace it")]
    Occupied {
        /// The volume directory.
        dir: PathBuf,
        /// The entry.
        name: String,
    },
    /// A system call failed.
    #[error("{dir:?}: {op} {name:?}: {source}")]
    Io {
        /// The volume directory.
        dir: PathBuf,
        /// The operation.
        op: &'static str,
        /// The entry concerned (relative to the volume directory).
        name: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Writes `files` into the directory `dir` (which must exist) with the AtomicWriter layout described
/// in the [module docs](self), and returns whether anything in `dir` changed (`false`: content, modes
/// and symlinks were already exactly `files`).
pub fn write_atomic(dir: &Path, files: &FileSet) -> Result<bool, AtomicError> {
    let w = Writer { dir: dir.to_path_buf() };
    w.validate(files)?;
    let dir_fd = fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| w.io("open", "", e))?;
    let top_level: BTreeSet<&str> = files.keys().map(|k| k.split('/').next().unwrap_or(k.as_str())).collect();

    // Pre-flight: every user-visible name is free or already ours, so the switch below cannot be
    // followed by a refusal.
    for name in &top_level {
        match fs::readlinkat(&dir_fd, *name, Vec::new()) {
            Ok(_) | Err(Errno::NOENT) => {}
            Err(Errno::INVAL) => {
                return Err(AtomicError::Occupied { dir: w.dir.clone(), name: (*name).to_string() });
            }
            Err(e) => return Err(w.io("readlink", name, e)),
        }
    }

    let old_ts = w.current_ts_dir(&dir_fd)?;
    let same = match &old_ts {
        Some(ts) => w.tree_matches(&dir_fd, ts, files)?,
        None => false,
    };
    let mut changed = false;
    let current_ts = if same {
        old_ts.clone().unwrap_or_default()
    } else {
        let ts = w.write_ts_dir(&dir_fd, files)?;
        w.switch_data_link(&dir_fd, &ts)?;
        changed = true;
        tracing::debug!(dir = %dir.display(), ts, files = files.len(), "atomic writer: switched ..data");
        ts
    };

    // User-visible symlinks.
    for name in &top_level {
        let want = format!("{DATA_DIR_NAME}/{name}");
        match fs::readlinkat(&dir_fd, *name, Vec::new()) {
            Ok(target) if target.as_bytes() == want.as_bytes() => {}
            Ok(_) => {
                fs::unlinkat(&dir_fd, *name, AtFlags::empty()).map_err(|e| w.io("unlink", name, e))?;
                fs::symlinkat(want.as_str(), &dir_fd, *name).map_err(|e| w.io("symlink", name, e))?;
                changed = true;
            }
            Err(Errno::NOENT) => {
                fs::symlinkat(want.as_str(), &dir_fd, *name).map_err(|e| w.io("symlink", name, e))?;
                changed = true;
            }
            Err(Errno::INVAL) => {
                return Err(AtomicError::Occupied { dir: w.dir.clone(), name: (*name).to_string() });
            }
            Err(e) => return Err(w.io("readlink", name, e)),
        }
    }

    // Stale entries: our symlinks for names no longer present, old and crash-left timestamped dirs,
    // a leftover `..data_tmp`.
    for entry in fs::Dir::read_from(&dir_fd).map_err(|e| w.io("readdir", "", e))? {
        let entry = entry.map_err(|e| w.io("readdir", "", e))?;
        let Ok(name) = std::str::from_utf8(entry.file_name().to_bytes()).map(str::to_string) else {
            continue;
        };
        if name == "." || name == ".." || name == DATA_DIR_NAME {
            continue;
        }
        if name == DATA_DIR_TMP_NAME {
            if is_symlink(&dir_fd, &name) {
                fs::unlinkat(&dir_fd, name.as_str(), AtFlags::empty())
                    .map_err(|e| w.io("unlink", &name, e))?;
                changed = true;
            }
        } else if is_ts_dir_name(&name) {
            if name != current_ts {
                w.remove(&dir_fd, &name)?;
                changed = true;
            }
        } else if !name.starts_with("..") && !top_level.contains(name.as_str()) {
            let ours = fs::readlinkat(&dir_fd, name.as_str(), Vec::new())
                .is_ok_and(|t| t.as_bytes().starts_with(format!("{DATA_DIR_NAME}/").as_bytes()));
            if ours {
                fs::unlinkat(&dir_fd, name.as_str(), AtFlags::empty())
                    .map_err(|e| w.io("unlink", &name, e))?;
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// `..<digit>...`: the kubelet's timestamped directory names (`..2006_01_02_15_04_05.<random>`).
fn is_ts_dir_name(name: &str) -> bool {
    name.len() > 2
        && name.starts_with("..")
        && name.as_bytes()[2].is_ascii_digit()
        && !name[2..].contains('/')
}

fn is_symlink(dir: impl AsFd, name: &str) -> bool {
    fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
}

struct Writer {
    dir: PathBuf,
}

impl Writer {
    fn io(&self, op: &'static str, name: &str, errno: Errno) -> AtomicError {
        AtomicError::Io { dir: self.dir.clone(), op, name: name.to_string(), source: errno.into() }
    }

    fn validate(&self, files: &FileSet) -> Result<(), AtomicError> {
        for (path, entry) in files {
            let invalid = |reason: String| AtomicError::InvalidPath {
                dir: self.dir.clone(),
                path: path.clone(),
                reason,
            };
            match fsutil::clean_relative_path(path) {
                Ok(clean) if clean == *path => {}
                Ok(clean) => return Err(invalid(format!("not in clean form (expected {clean:?})"))),
                Err(reason) => return Err(invalid(reason.to_string())),
            }
            if entry.mode > 0o777 {
                return Err(AtomicError::InvalidMode {
                    dir: self.dir.clone(),
                    path: path.clone(),
                    mode: entry.mode,
                });
            }
            let mut prefix = String::new();
            for element in path.split('/') {
                if !prefix.is_empty() {
                    if files.contains_key(&prefix) {
                        return Err(invalid(format!("conflicts with the file {prefix:?}")));
                    }
                    prefix.push('/');
                }
                prefix.push_str(element);
            }
        }
        Ok(())
    }

    /// The timestamped directory `..data` names, if it is a well-formed one that exists as a directory.
    fn current_ts_dir(&self, dir_fd: &OwnedFd) -> Result<Option<String>, AtomicError> {
        let target = match fs::readlinkat(dir_fd, DATA_DIR_NAME, Vec::new()) {
            Ok(t) => t,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::INVAL) => {
                return Err(AtomicError::Occupied { dir: self.dir.clone(), name: DATA_DIR_NAME.to_string() });
            }
            Err(e) => return Err(self.io("readlink", DATA_DIR_NAME, e)),
        };
        let Ok(name) = target.into_string() else { return Ok(None) };
        let is_dir = fs::statat(dir_fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
        Ok((is_ts_dir_name(&name) && is_dir).then_some(name))
    }

    /// Whether the timestamped directory `ts` holds exactly `files` (paths, content and modes), read
    /// without following symlinks.
    fn tree_matches(&self, dir_fd: &OwnedFd, ts: &str, files: &FileSet) -> Result<bool, AtomicError> {
        let mut found: BTreeMap<String, ()> = BTreeMap::new();
        let root = match fsutil::open_dir_nofollow(dir_fd, OsStr::new(ts)) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(false),
            Err(e) => return Err(self.io("open", ts, e)),
        };
        let mut pending: Vec<(OwnedFd, String)> = vec![(root, String::new())];
        while let Some((fd, prefix)) = pending.pop() {
            for entry in fs::Dir::read_from(&fd).map_err(|e| self.io("readdir", ts, e))? {
                let entry = entry.map_err(|e| self.io("readdir", ts, e))?;
                let Ok(name) = std::str::from_utf8(entry.file_name().to_bytes()) else { return Ok(false) };
                if name == "." || name == ".." {
                    continue;
                }
                let rel = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
                let st = match fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    Err(_) => return Ok(false),
                };
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => {
                        if files.contains_key(&rel) {
                            return Ok(false);
                        }
                        match fsutil::open_dir_nofollow(&fd, OsStr::new(name)) {
                            Ok(sub) => pending.push((sub, rel)),
                            Err(_) => return Ok(false),
                        }
                    }
                    FileType::RegularFile => {
                        let Some(want) = files.get(&rel) else { return Ok(false) };
                        if st.st_mode & 0o7777 != want.mode
                            || u64::try_from(st.st_size).ok() != u64::try_from(want.data.len()).ok()
                        {
                            return Ok(false);
                        }
                        let file = match fs::openat(
                            &fd,
                            name,
                            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        ) {
                            Ok(f) => f,
                            Err(_) => return Ok(false),
                        };
                        let mut content = Vec::with_capacity(want.data.len());
                        if std::fs::File::from(file).read_to_end(&mut content).is_err()
                            || content != want.data
                        {
                            return Ok(false);
                        }
                        found.insert(rel, ());
                    }
                    _ => return Ok(false),
                }
            }
        }
        Ok(found.len() == files.len())
    }

    /// Creates a new timestamped directory holding `files`; returns its name. Removes it on failure.
    fn write_ts_dir(&self, dir_fd: &OwnedFd, files: &FileSet) -> Result<String, AtomicError> {
        let now = time::OffsetDateTime::now_utc();
        let stamp = format!(
            "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second()
        );
        let mut attempt = 0;
        let name = loop {
            let name = format!("{stamp}{}", fastrand::u32(..));
            match fs::mkdirat(dir_fd, name.as_str(), Mode::from_raw_mode(0o755)) {
                Ok(()) => break name,
                Err(Errno::EXIST) if attempt < 16 => attempt += 1,
                Err(e) => return Err(self.io("mkdir", &name, e)),
            }
        };
        let result = self.fill_ts_dir(dir_fd, &name, files);
        if let Err(e) = result {
            if let Err(cleanup) = fsutil::remove_tree(dir_fd, OsStr::new(&name), &self.dir.join(&name), true)
            {
                tracing::warn!(dir = %self.dir.display(), ts = name, error = ?cleanup, "cannot remove a partial timestamped dir");
            }
            return Err(e);
        }
        Ok(name)
    }

    fn fill_ts_dir(&self, dir_fd: &OwnedFd, name: &str, files: &FileSet) -> Result<(), AtomicError> {
        let ts = fsutil::open_dir_nofollow(dir_fd, OsStr::new(name)).map_err(|e| self.io("open", name, e))?;
        fs::fchmod(&ts, Mode::from_raw_mode(0o755)).map_err(|e| self.io("chmod", name, e))?;
        for (path, entry) in files {
            let shown = format!("{name}/{path}");
            let mut elements: Vec<&str> = path.split('/').collect();
            let file_name = elements.pop().unwrap_or(path.as_str());
            let mut parent =
                fs::openat(&ts, ".", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                    .map_err(|e| self.io("open", name, e))?;
            for element in elements {
                match fs::mkdirat(&parent, element, Mode::from_raw_mode(0o755)) {
                    // Exactly 0755 whatever the umask; the directory was just made inside the fresh
                    // timestamped directory, which nothing else writes to.
                    Ok(()) => fs::chmodat(&parent, element, Mode::from_raw_mode(0o755), AtFlags::empty())
                        .map_err(|e| self.io("chmod", &shown, e))?,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(self.io("mkdir", &shown, e)),
                }
                parent = fs::openat(
                    &parent,
                    element,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| self.io("open", &shown, e))?;
            }
            let fd = fs::openat(
                &parent,
                file_name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(entry.mode),
            )
            .map_err(|e| self.io("create", &shown, e))?;
            fs::fchmod(&fd, Mode::from_raw_mode(entry.mode)).map_err(|e| self.io("chmod", &shown, e))?;
            std::fs::File::from(fd).write_all(&entry.data).map_err(|e| AtomicError::Io {
                dir: self.dir.clone(),
                op: "write",
                name: shown.clone(),
                source: e,
            })?;
        }
        Ok(())
    }

    /// Points `..data` at `ts` by renaming a fresh `..data_tmp` symlink over it.
    fn switch_data_link(&self, dir_fd: &OwnedFd, ts: &str) -> Result<(), AtomicError> {
        match fs::unlinkat(dir_fd, DATA_DIR_TMP_NAME, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(self.io("unlink", DATA_DIR_TMP_NAME, e)),
        }
        fs::symlinkat(ts, dir_fd, DATA_DIR_TMP_NAME).map_err(|e| self.io("symlink", DATA_DIR_TMP_NAME, e))?;
        fs::renameat(dir_fd, DATA_DIR_TMP_NAME, dir_fd, DATA_DIR_NAME)
            .map_err(|e| self.io("rename", DATA_DIR_NAME, e))
    }

    fn remove(&self, dir_fd: &OwnedFd, name: &str) -> Result<(), AtomicError> {
        fsutil::remove_tree(dir_fd, OsStr::new(name), &self.dir.join(name), true).map_err(|e| match e {
            RemoveError::Io { op, source, .. } => {
                AtomicError::Io { dir: self.dir.clone(), op, name: name.to_string(), source }
            }
            RemoveError::MountPoint { path } | RemoveError::Moved { path } => AtomicError::Io {
                dir: self.dir.clone(),
                op: "remove",
                name: path.display().to_string(),
                source: std::io::Error::other("a mount point or a moved directory inside; left in place"),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::FileEntry;

    fn set(entries: &[(&str, &str, u32)]) -> FileSet {
        entries
            .iter()
            .map(|(p, d, m)| (p.to_string(), FileEntry { data: d.as_bytes().to_vec().into(), mode: *m }))
            .collect()
    }

    #[test]
    fn validation() {
        let w = Writer { dir: PathBuf::from("/v") };
        assert!(w.validate(&set(&[("a", "", 0o644), ("b/c", "", 0o600)])).is_ok());
        for bad in ["a//b", "./a", "../a", "..data", "/abs", ""] {
            let err = w.validate(&set(&[(bad, "", 0o644)])).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(&format!("file {bad:?}")), "{bad}: {err}");
        }
        let err = w.validate(&set(&[("a", "", 0o644), ("a/b", "", 0o644)])).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("\"/v\": file \"a/b\": conflicts with the file \"a\""));
        let err = w.validate(&set(&[("a", "", 0o4755)])).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("\"/v\": file \"a\": mode 0o4755 must be between 0 and 0777"));
    }

    #[test]
    fn ts_names() {
        assert!(is_ts_dir_name("..2024_01_02_03_04_05.123"));
        assert!(!is_ts_dir_name("..data"));
        assert!(!is_ts_dir_name("..data_tmp"));
        assert!(!is_ts_dir_name(".."));
        assert!(!is_ts_dir_name("a2024"));
    }
}

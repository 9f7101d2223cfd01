//! Safe `subPath` and `subPathExpr` (the CVE-2017-1002101 and CVE-2021-25741 classes).
//!
//! A container controls the content of many volumes (an emptyDir, a writable hostPath), so it can plant
//! symlinks there and swap them while nodelet works. [`bind_sub_path`] therefore never resolves a
//! subPath through a path string on the host:
//!
//! 1. The volume root is opened (`O_PATH|O_DIRECTORY`); the subPath is then resolved **by the kernel
//!    beneath that descriptor**: `openat2(root, sub_path, O_PATH, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
//!    | RESOLVE_NO_XDEV)`. A symlink is followed only while it stays inside the volume (the kubelet's
//!    semantics: it resolves symlinks and requires the result to be within the volume, which is what
//!    makes `subPath: key` on a configMap volume work, its keys being `..data/key` symlinks); an absolute
//!    symlink, one leading out through `..`, a `/proc` magic link or crossing into another mount fails,
//!    and the error names the component. Crossing mounts is refused too (the kubelet allows it): a
//!    container with mount propagation could otherwise mount host paths inside the volume.
//! 2. Missing directories are created one by one with `mkdirat(parent_fd, name, 0750)` in the parent
//!    just resolved the same way (the kubelet's `SafeMakeDir`); `mkdirat` never follows a symlink.
//! 3. `/proc/self/fd/<fd>` of the resolved descriptor is bind-mounted onto the target (an empty file or
//!    directory created to match), so a symlink swapped in after the resolution cannot redirect the
//!    bind: the kernel binds the already-open inode.
//! 4. The bind is verified: the target's `(dev, ino)` must be the descriptor's.
//!
//! On kernels without `openat2` (before 5.6) the resolution falls back to a component-by-component
//! walk with `O_NOFOLLOW` that refuses every symlink and every mount crossing.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::fsutil;
use crate::mounts::{self, MountError};

/// Errors of subPath handling; each names the subPath (and the component, where one is at fault).
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// The subPath (or the expansion of a subPathExpr) is not acceptable.
    #[error("subPath {sub_path:?}: {reason}")]
    Invalid {
        /// The subPath.
        sub_path: String,
        /// Why.
        reason: &'static str,
    },
    /// A subPathExpr references variables that are unset or empty in the container's environment.
    #[error("subPathExpr {expr:?}: missing value for {}", vars.join(", "))]
    MissingVars {
        /// The expression.
        expr: String,
        /// The variables without a value, sorted.
        vars: Vec<String>,
    },
    /// A component of the subPath cannot be used (a symlink leading out of the volume, a mount point,
    /// not a directory, ...).
    #[error("subPath {sub_path:?}: component {component:?} {reason}")]
    Unsafe {
        /// The subPath.
        sub_path: String,
        /// The offending component (the subPath up to and including it).
        component: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The bind target cannot be used.
    #[error("subPath bind target {target:?}: {reason}")]
    Target {
        /// The target.
        target: PathBuf,
        /// Why.
        reason: String,
    },
    /// A system call failed.
    #[error("subPath {sub_path:?}: {op} {path:?}: {source}")]
    Io {
        /// The subPath.
        sub_path: String,
        /// The operation.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A mount operation failed.
    #[error(transparent)]
    Mount(#[from] MountError),
}

/// Validates a `subPath` as the API server and kubelet do: not empty, relative, no `..` element; and no
/// NUL byte.
pub fn validate_sub_path(sub_path: &str) -> Result<(), SubPathError> {
    let invalid = |reason| Err(SubPathError::Invalid { sub_path: sub_path.to_string(), reason });
    if sub_path.is_empty() {
        return invalid("must not be empty");
    }
    if sub_path.contains('\0') {
        return invalid("must not contain NUL");
    }
    if sub_path.starts_with('/') {
        return invalid("must be a relative path");
    }
    if sub_path.split('/').any(|e| e == "..") {
        return invalid("must not contain \"..\"");
    }
    Ok(())
}

/// Expands a `subPathExpr` as the kubelet does (`ExpandContainerVolumeMounts`, the `$(VAR)` syntax of
/// command arguments): `$(VAR)` is replaced by `env[VAR]`, `$$` is a literal `$`, any other `$` is kept
/// as is. A referenced variable that is unset **or empty** is an error naming it (the kubelet's
/// "missing value for ..."), and the result is then validated with [`validate_sub_path`].
///
/// One difference: a `$` followed by a non-ASCII character keeps the character intact (Go's code
/// copies its first byte as a Latin-1 rune, corrupting it).
pub fn expand_sub_path_expr(expr: &str, env: &BTreeMap<String, String>) -> Result<String, SubPathError> {
    let mut missing = BTreeSet::new();
    let expanded = expand_vars(expr, |name| match env.get(name) {
        Some(value) if !value.is_empty() => value.clone(),
        _ => {
            missing.insert(name.to_string());
            String::new()
        }
    });
    if !missing.is_empty() {
        return Err(SubPathError::MissingVars {
            expr: expr.to_string(),
            vars: missing.into_iter().collect(),
        });
    }
    validate_sub_path(&expanded)?;
    Ok(expanded)
}

/// The kubelet's `third_party/forked/golang/expansion.Expand`: `$(NAME)` becomes `mapping(NAME)`, `$$` a
/// literal `$`, any other `$` stays (also used for command, args and env expansion).
pub fn expand_vars(input: &str, mut mapping: impl FnMut(&str) -> String) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest[1..].find(')') {
                    Some(close) => {
                        out.push_str(&mapping(&rest[1..close + 1]));
                        close + 2
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    let c = rest.chars().next().unwrap_or('$');
                    out.push('$');
                    out.push(c);
                    c.len_utf8()
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

const RESOLVE: ResolveFlags =
    ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS).union(ResolveFlags::NO_XDEV);

/// Opens `path` (relative, clean) beneath `root` with the kernel confining the resolution (see the
/// module docs); `O_PATH`, following in-volume symlinks.
fn open_beneath(root: &OwnedFd, path: &str) -> Result<OwnedFd, Errno> {
    let mut attempts = 0;
    loop {
        match fs::openat2(root, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), RESOLVE) {
            // A concurrent rename or mount anywhere makes RESOLVE_BENEATH give up with EAGAIN.
            Err(Errno::AGAIN) if attempts < 64 => attempts += 1,
            Err(Errno::NOSYS) => return open_strict(root, path),
            other => return other,
        }
    }
}

/// The fallback without `openat2`: every component opened with `O_NOFOLLOW`; any symlink is `ELOOP`,
/// any mount root `EXDEV`.
fn open_strict(root: &OwnedFd, path: &str) -> Result<OwnedFd, Errno> {
    let mut cur = fs::openat(root, ".", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    for component in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        let next =
            fs::openat(&cur, component, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        if FileType::from_raw_mode(fs::fstat(&next)?.st_mode) == FileType::Symlink {
            return Err(Errno::LOOP);
        }
        if fsutil::fd_is_mount_root(&next)? == Some(true) {
            return Err(Errno::XDEV);
        }
        cur = next;
    }
    Ok(cur)
}

struct Resolver<'a> {
    root: OwnedFd,
    root_path: &'a Path,
    sub_path: &'a str,
    components: Vec<&'a str>,
}

impl Resolver<'_> {
    fn prefix(&self, upto: usize) -> String {
        if upto == 0 { ".".to_string() } else { self.components[..upto].join("/") }
    }

    fn io(&self, op: &'static str, rel: &str, errno: Errno) -> SubPathError {
        SubPathError::Io {
            sub_path: self.sub_path.to_string(),
            op,
            path: self.root_path.join(rel),
            source: errno.into(),
        }
    }

    fn unsafe_component(&self, upto: usize, reason: String) -> SubPathError {
        SubPathError::Unsafe { sub_path: self.sub_path.to_string(), component: self.prefix(upto), reason }
    }

    /// Resolves the whole subPath, creating missing directories; returns the `O_PATH` descriptor.
    fn resolve(&self) -> Result<OwnedFd, SubPathError> {
        let n = self.components.len();
        match open_beneath(&self.root, &self.prefix(n)) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(self.diagnose(e)),
        }
        let mut parent = open_beneath(&self.root, ".").map_err(|e| self.io("open", ".", e))?;
        for i in 0..n {
            let prefix = self.prefix(i + 1);
            parent = match open_beneath(&self.root, &prefix) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match fs::mkdirat(&parent, self.components[i], Mode::from_raw_mode(0o750)) {
                        Ok(()) => {
                            tracing::debug!(volume = %self.root_path.display(), dir = prefix, "subPath: created directory")
                        }
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.io("mkdir", &prefix, e)),
                    }
                    match open_beneath(&self.root, &prefix) {
                        Ok(fd) => fd,
                        Err(Errno::NOENT) => {
                            return Err(self.unsafe_component(i + 1, "is a dangling symlink".to_string()));
                        }
                        Err(e) => return Err(self.diagnose(e)),
                    }
                }
                Err(e) => return Err(self.diagnose(e)),
            };
        }
        Ok(parent)
    }

    /// Turns a failed resolution into an error naming the first component at fault.
    fn diagnose(&self, errno: Errno) -> SubPathError {
        for i in 0..self.components.len() {
            let prefix = self.prefix(i + 1);
            let failed = match open_beneath(&self.root, &prefix) {
                Ok(_) => continue,
                Err(e) => e,
            };
            let Ok(parent) = open_beneath(&self.root, &self.prefix(i)) else { break };
            let Ok(fd) = fs::openat(
                &parent,
                self.components[i],
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                break;
            };
            let is_symlink =
                fs::fstat(&fd).is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
            let reason = if is_symlink {
                let target = fs::readlinkat(&fd, "", Vec::new())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if target.starts_with('/') {
                    format!(
                        "is a symlink to the absolute path {target:?}; symlinks must stay inside the volume"
                    )
                } else if failed == Errno::LOOP {
                    format!("is a symlink to {target:?} in a symlink loop")
                } else if failed == Errno::NOTDIR {
                    format!("is a symlink to {target:?}, which is not a directory")
                } else {
                    format!("is a symlink to {target:?}, which leads outside the volume or across a mount")
                }
            } else if failed == Errno::XDEV {
                "is a mount point; a subPath must not cross mounts".to_string()
            } else if failed == Errno::NOTDIR {
                "is not a directory".to_string()
            } else {
                format!("cannot be opened: {}", std::io::Error::from(failed))
            };
            return self.unsafe_component(i + 1, reason);
        }
        // Every prefix resolves now: the path changed between the failed resolution and this diagnosis.
        self.unsafe_component(
            self.components.len(),
            format!("changed while being resolved ({}); refusing it", std::io::Error::from(errno)),
        )
    }
}

/// Bind-mounts `sub_path` of the volume at `volume_root` onto `target`, safely (see the module docs).
/// Missing directories of `sub_path` are created (0750); `target` and its missing parents are created
/// to match (an empty directory or file). If `target` is already a bind of the same inode (after a
/// restart), this is a no-op; a different mount there is an error.
pub fn bind_sub_path(volume_root: &Path, sub_path: &str, target: &Path) -> Result<(), SubPathError> {
    validate_sub_path(sub_path)?;
    if !target.is_absolute() {
        return Err(SubPathError::Target {
            target: target.to_path_buf(),
            reason: "must be an absolute path".into(),
        });
    }
    let root = fs::open(volume_root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SubPathError::Io {
            sub_path: sub_path.to_string(),
            op: "open volume root",
            path: volume_root.to_path_buf(),
            source: e.into(),
        })?;
    let resolver = Resolver {
        root,
        root_path: volume_root,
        sub_path,
        components: sub_path.split('/').filter(|c| !c.is_empty() && *c != ".").collect(),
    };
    let source = resolver.resolve()?;
    let source_stat = fs::fstat(&source).map_err(|e| resolver.io("fstat", sub_path, e))?;
    let source_id = fsutil::dev_ino(&source_stat);
    let is_dir = FileType::from_raw_mode(source_stat.st_mode) == FileType::Directory;

    if mounts::is_mount_point(target)? {
        let st =
            fs::statat(fs::CWD, target, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| resolver.io("stat", "", e))?;
        if fsutil::dev_ino(&st) == source_id {
            return Ok(());
        }
        return Err(SubPathError::Target {
            target: target.to_path_buf(),
            reason: "already a mount point of something else".into(),
        });
    }
    let target_fd = prepare_target(target, is_dir)?;
    let from = format!("/proc/self/fd/{}", source.as_raw_fd());
    let onto = format!("/proc/self/fd/{}", target_fd.as_raw_fd());
    rustix::mount::mount_bind(from.as_str(), onto.as_str()).map_err(|e| SubPathError::Io {
        sub_path: sub_path.to_string(),
        op: "bind mount",
        path: target.to_path_buf(),
        source: e.into(),
    })?;
    let bound = fs::statat(fs::CWD, target, AtFlags::SYMLINK_NOFOLLOW).map(|st| fsutil::dev_ino(&st));
    if bound != Ok(source_id) || !mounts::is_mount_point(target)? {
        mounts::unmount(target)?;
        return Err(SubPathError::Target {
            target: target.to_path_buf(),
            reason: "after the bind mount the target is not the resolved subPath; unmounted".into(),
        });
    }
    tracing::debug!(volume = %volume_root.display(), sub_path, target = %target.display(), "subPath bound");
    Ok(())
}

/// Bind-mounts (recursively: mounts beneath it come along) what the `O_PATH` descriptor `source` resolved to
/// onto `target`, created to match (an empty directory or file), through `/proc/self/fd`: a symlink swapped
/// in after the resolution cannot redirect the bind. Verified as [`bind_sub_path`] does. A `target` that is
/// already a mount of the same inode (after a restart) is left as it is. Used for hostPaths resolved beneath
/// an allowed prefix ([`crate::hostpath::resolve_beneath_prefix`]).
pub fn bind_descriptor(source: &OwnedFd, target: &Path) -> Result<(), SubPathError> {
    let fail = |reason: String| SubPathError::Target { target: target.to_path_buf(), reason };
    let source_stat = fs::fstat(source).map_err(|e| fail(format!("fstat of the source: {e}")))?;
    let source_id = fsutil::dev_ino(&source_stat);
    if mounts::is_mount_point(target)? {
        let st =
            fs::statat(fs::CWD, target, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| fail(format!("stat: {e}")))?;
        if fsutil::dev_ino(&st) == source_id {
            return Ok(());
        }
        return Err(fail("already a mount point of something else".into()));
    }
    let is_dir = FileType::from_raw_mode(source_stat.st_mode) == FileType::Directory;
    let target_fd = prepare_target(target, is_dir)?;
    let from = format!("/proc/self/fd/{}", source.as_raw_fd());
    let onto = format!("/proc/self/fd/{}", target_fd.as_raw_fd());
    rustix::mount::mount_bind_recursive(from.as_str(), onto.as_str())
        .map_err(|e| fail(format!("bind mount: {}", std::io::Error::from(e))))?;
    let bound = fs::statat(fs::CWD, target, AtFlags::SYMLINK_NOFOLLOW).map(|st| fsutil::dev_ino(&st));
    if bound != Ok(source_id) || !mounts::is_mount_point(target)? {
        mounts::unmount(target)?;
        return Err(fail("after the bind mount the target is not what was resolved; unmounted".into()));
    }
    Ok(())
}

/// Creates `target` (an empty directory or file, replacing a leftover of the other kind) and opens it
/// with `O_PATH|O_NOFOLLOW`.
fn prepare_target(target: &Path, is_dir: bool) -> Result<OwnedFd, SubPathError> {
    let fail = |reason: String| SubPathError::Target { target: target.to_path_buf(), reason };
    if let Some(parent) = target.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(|e| fail(format!("cannot create the parent directory: {e}")))?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() && is_dir || m.is_file() && !is_dir => {}
        Ok(m) => {
            let removed = if m.is_dir() { std::fs::remove_dir(target) } else { std::fs::remove_file(target) };
            removed.map_err(|e| fail(format!("cannot replace the leftover: {e}")))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(format!("cannot stat: {e}"))),
    }
    let created = if is_dir {
        std::fs::DirBuilder::new().mode(0o750).create(target)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .custom_flags(i32::try_from(OFlags::NOFOLLOW.bits()).unwrap_or(0))
            .open(target)
            .map(drop)
    };
    match created {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create: {e}"))),
    }
    let fd = fs::open(target, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| fail(format!("cannot open: {}", std::io::Error::from(e))))?;
    let kind = fs::fstat(&fd).map(|st| FileType::from_raw_mode(st.st_mode));
    let want = if is_dir { FileType::Directory } else { FileType::RegularFile };
    if kind != Ok(want) {
        return Err(fail(format!("is a {kind:?} after creation, expected a {want:?}")));
    }
    Ok(fd)
}

/// Unmounts every bind mount beneath `dir` (deepest first) and removes `dir` and everything in it
/// without following symlinks ([`mounts::remove_dir_beneath`], which refuses if a mount is left). The
/// volume reconciler keeps a container's subPath binds at
/// `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`. A missing `dir` is success.
pub fn unbind_sub_paths(dir: &Path) -> Result<(), SubPathError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        _ => {}
    }
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    for mount in mounts::mounts_under(dir)? {
        if mount != real {
            mounts::unmount(&mount)?;
        }
    }
    mounts::remove_dir_beneath(dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn validation() {
        assert!(validate_sub_path("a/b").is_ok());
        assert!(validate_sub_path("a/..b").is_ok());
        for (bad, reason) in [
            ("", "must not be empty"),
            ("/etc", "must be a relative path"),
            ("../../etc", "must not contain \"..\""),
            ("a/../../etc", "must not contain \"..\""),
            ("a\0b", "must not contain NUL"),
        ] {
            match validate_sub_path(bad) {
                Err(SubPathError::Invalid { reason: r, .. }) => assert_eq!(r, reason, "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn expansion_like_the_kubelet() -> Result<(), SubPathError> {
        let e = env(&[("POD_NAME", "web-0"), ("NS", "prod"), ("EMPTY", "")]);
        assert_eq!(expand_sub_path_expr("logs/$(POD_NAME)", &e)?, "logs/web-0");
        assert_eq!(expand_sub_path_expr("$(NS)/$(POD_NAME)/x", &e)?, "prod/web-0/x");
        assert_eq!(expand_sub_path_expr("a$$(POD_NAME)", &e)?, "a$(POD_NAME)");
        assert_eq!(expand_sub_path_expr("a$b", &e)?, "a$b");
        assert_eq!(expand_sub_path_expr("a$", &e)?, "a$");
        assert_eq!(expand_sub_path_expr("a$(POD_NAME", &e)?, "a$(POD_NAME");
        assert_eq!(expand_sub_path_expr("x$\u{e9}y", &e)?, "x$\u{e9}y");
        match expand_sub_path_expr("$(B)/$(A)/$(EMPTY)/$(POD_NAME)", &e) {
            Err(SubPathError::MissingVars { vars, .. }) => assert_eq!(vars, ["A", "B", "EMPTY"]),
            other => panic!("{other:?}"),
        }
        let e2 = env(&[("UP", ".."), ("ABS", "/etc")]);
        assert!(matches!(expand_sub_path_expr("$(UP)/x", &e2), Err(SubPathError::Invalid { .. })));
        assert!(matches!(expand_sub_path_expr("$(ABS)", &e2), Err(SubPathError::Invalid { .. })));
        let msg = expand_sub_path_expr("$(X)", &e).err().map(|e| e.to_string());
        assert_eq!(msg.as_deref(), Some("subPathExpr \"$(X)\": missing value for X"));
        Ok(())
    }
}

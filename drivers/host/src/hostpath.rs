//! The kubelet's `hostPath` `type` checks (`pkg/volume/hostpath/host_path.go`, `checkType`).
//!
//! Like the kubelet, the type checks use `stat`, which **follows symlinks**: a `Directory` hostPath
//! may be a symlink to a directory (the runtime's bind mount follows it too). Differences from the
//! kubelet, all on the safe side: the path must be absolute and free of `..` elements;
//! `FileOrCreate` creates with `O_EXCL|O_NOFOLLOW` (the kubelet's `O_CREATE` would create the target
//! of a dangling symlink anywhere on the host; here a dangling symlink is "not a file"); created
//! directories and files get exactly 0755 / 0644, whatever the process umask.
//!
//! **Under an allowed prefix** (`nodelet.allowedHostPaths`), a hostPath is resolved by the kernel beneath the
//! prefix ([`resolve_beneath_prefix`]: `openat2(prefix, rest, O_PATH, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`),
//! so a symlink planted under `/srv/data` that points at `/` (or anywhere outside the prefix) is refused with an
//! error naming the component, instead of handing the runtime a path string it would follow out of the prefix.
//! Symlinks that stay beneath the prefix are followed. Missing directories (`DirectoryOrCreate`, and an unset
//! type, for which the runtime would create a directory) and a missing file (`FileOrCreate`) are created one
//! component at a time with `mkdirat`/`openat(O_EXCL|O_NOFOLLOW)` in the parent just resolved. The type is
//! checked on the resolved descriptor. The volume driver then bind-mounts that descriptor at a directory of the
//! pod's own (see [`crate::driver`]), which is what the runtime mounts: a symlink swapped in after the
//! resolution cannot redirect it.

use std::fmt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fd::OwnedFd;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Errors of the hostPath checks; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum HostPathError {
    /// `hostPath.type` is not one of the known types.
    #[error(
        "hostPath type {0:?} is not supported (one of \"\", DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice)"
    )]
    InvalidType(String),
    /// The path is not acceptable (relative, `..`, NUL).
    #[error("hostPath {path:?}: {reason}")]
    InvalidPath {
        /// The path.
        path: PathBuf,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// Nothing exists at the path (for the types that do not create).
    #[error("hostPath type check failed: {path:?} does not exist (type {kind})")]
    NotFound {
        /// The path.
        path: PathBuf,
        /// The requested type.
        kind: HostPathType,
    },
    /// Something of another type exists at the path.
    #[error("hostPath type check failed: {path:?} is not a {expected} (it is a {found})")]
    WrongType {
        /// The path.
        path: PathBuf,
        /// What the type requires (`directory`, `file`, `socket file`, ...).
        expected: &'static str,
        /// What was found.
        found: &'static str,
    },
    /// `FileOrCreate` needs the parent directory to exist (as the kubelet does).
    #[error("hostPath {path:?}: cannot create the file: parent directory does not exist")]
    ParentMissing {
        /// The path.
        path: PathBuf,
    },
    /// A component of a hostPath under an allowed prefix leads out of the prefix (a symlink to an absolute
    /// path or through `..`, a magic link) or cannot be resolved beneath it.
    #[error(
        "hostPath {path:?}: {component:?} {reason}; a hostPath under the allowed prefix {prefix:?} must resolve beneath it"
    )]
    Escapes {
        /// The path.
        path: PathBuf,
        /// The allowed prefix it is under.
        prefix: PathBuf,
        /// The offending component (the path up to and including it).
        component: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Creating or inspecting the path failed.
    #[error("hostPath {path:?}: {op}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// `hostPath.type` (core/v1 `HostPathType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostPathType {
    /// `""` (or absent): no check at all.
    Unset,
    /// Create the directory (and its parents) with 0755 if nothing exists; then it must be a directory.
    DirectoryOrCreate,
    /// Must be an existing directory.
    Directory,
    /// Create an empty file with 0644 if nothing exists (the parent must exist); then it must be a file.
    FileOrCreate,
    /// Must be an existing regular file.
    File,
    /// Must be an existing UNIX socket.
    Socket,
    /// Must be an existing character device.
    CharDevice,
    /// Must be an existing block device.
    BlockDevice,
}

impl HostPathType {
    /// Parses `hostPath.type`; `None` and `""` are [`HostPathType::Unset`]. Case-sensitive, as the API.
    pub fn parse(value: Option<&str>) -> Result<HostPathType, HostPathError> {
        Ok(match value.unwrap_or("") {
            "" => HostPathType::Unset,
            "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
            "Directory" => HostPathType::Directory,
            "FileOrCreate" => HostPathType::FileOrCreate,
            "File" => HostPathType::File,
            "Socket" => HostPathType::Socket,
            "CharDevice" => HostPathType::CharDevice,
            "BlockDevice" => HostPathType::BlockDevice,
            other => return Err(HostPathError::InvalidType(other.to_string())),
        })
    }

    /// The API spelling (`""` for [`HostPathType::Unset`]).
    pub fn as_str(self) -> &'static str {
        match self {
            HostPathType::Unset => "",
            HostPathType::DirectoryOrCreate => "DirectoryOrCreate",
            HostPathType::Directory => "Directory",
            HostPathType::FileOrCreate => "FileOrCreate",
            HostPathType::File => "File",
            HostPathType::Socket => "Socket",
            HostPathType::CharDevice => "CharDevice",
            HostPathType::BlockDevice => "BlockDevice",
        }
    }
}

impl fmt::Display for HostPathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

fn describe(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "file"
    } else if ft.is_socket() {
        "socket file"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_fifo() {
        "named pipe"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "file of unknown type"
    }
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> HostPathError {
    HostPathError::Io { op, path: path.to_path_buf(), source }
}

/// Checks (and for the `...OrCreate` types, creates) the hostPath at `path` as the kubelet does before
/// mounting it. [`HostPathType::Unset`] checks nothing (not even existence), like the kubelet.
/// The type checks follow symlinks (`stat`), like the kubelet.
pub fn check_host_path(path: &Path, kind: HostPathType) -> Result<(), HostPathError> {
    if !path.is_absolute() {
        return Err(HostPathError::InvalidPath {
            path: path.to_path_buf(),
            reason: "must be an absolute path",
        });
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(HostPathError::InvalidPath {
            path: path.to_path_buf(),
            reason: "must not contain \"..\"",
        });
    }
    if std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).contains(&0) {
        return Err(HostPathError::InvalidPath { path: path.to_path_buf(), reason: "must not contain NUL" });
    }
    let stat = || match std::fs::metadata(path) {
        Ok(m) => Ok(Some(m.file_type())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("stat", path, e)),
    };
    let (expected, matches): (&'static str, fn(&std::fs::FileType) -> bool) = match kind {
        HostPathType::Unset => return Ok(()),
        HostPathType::DirectoryOrCreate => {
            if stat()?.is_none() {
                return make_dir(path);
            }
            ("directory", std::fs::FileType::is_dir)
        }
        HostPathType::Directory => ("directory", std::fs::FileType::is_dir),
        HostPathType::FileOrCreate => {
            if stat()?.is_none() {
                match make_file(path) {
                    Ok(()) => return Ok(()),
                    // A dangling symlink (or a racing creator): fall through to the type check.
                    Err(HostPathError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
            ("file", std::fs::FileType::is_file)
        }
        HostPathType::File => ("file", std::fs::FileType::is_file),
        HostPathType::Socket => ("socket file", FileTypeExt::is_socket),
        HostPathType::CharDevice => ("character device", FileTypeExt::is_char_device),
        HostPathType::BlockDevice => ("block device", FileTypeExt::is_block_device),
    };
    match stat()? {
        None => Err(HostPathError::NotFound { path: path.to_path_buf(), kind }),
        Some(ft) if matches(&ft) => Ok(()),
        Some(ft) => Err(HostPathError::WrongType { path: path.to_path_buf(), expected, found: describe(ft) }),
    }
}

/// How a hostPath under an allowed prefix is resolved: beneath the prefix, without magic links. (Mounts under
/// the prefix are the operator's and may be crossed.)
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// The longest of `prefixes` that `path` is under (component-wise), if any.
pub fn allowed_prefix<'a>(path: &Path, prefixes: &'a [PathBuf]) -> Option<&'a Path> {
    prefixes
        .iter()
        .filter(|p| path.starts_with(p))
        .max_by_key(|p| p.components().count())
        .map(PathBuf::as_path)
}

/// Resolves `path`, which lies under one of `prefixes`, beneath that prefix (see the [module docs](self)),
/// creating what its `kind` creates, and checks its type: an `O_PATH` descriptor of what the hostPath is.
/// `Ok(None)` when `path` is under no prefix (it is then used as the kubelet uses it, through
/// [`check_host_path`]).
pub fn resolve_beneath_prefix(
    path: &Path,
    prefixes: &[PathBuf],
    kind: HostPathType,
) -> Result<Option<OwnedFd>, HostPathError> {
    let Some(prefix) = allowed_prefix(path, prefixes) else { return Ok(None) };
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(HostPathError::InvalidPath {
            path: path.to_path_buf(),
            reason: "must not contain \"..\"",
        });
    }
    let io_err = |op: &'static str, at: &Path, e: Errno| io(op, at, e.into());
    // The prefix itself is the operator's: opened as configured.
    let root = rustix::fs::open(prefix, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| io_err("open the allowed prefix", prefix, e))?;
    let rest = path.strip_prefix(prefix).unwrap_or(Path::new(""));
    let components: Vec<&std::ffi::OsStr> = rest
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let escape = |upto: usize, reason: String| HostPathError::Escapes {
        path: path.to_path_buf(),
        prefix: prefix.to_path_buf(),
        component: components[..upto].iter().fold(prefix.to_path_buf(), |p, c| p.join(c)),
        reason,
    };
    let mut current =
        rustix::fs::openat(&root, ".", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| io_err("open the allowed prefix", prefix, e))?;
    for i in 0..components.len() {
        let rel: PathBuf = components[..=i].iter().collect();
        let last = i + 1 == components.len();
        current = match open_beneath(&root, &rel) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                let name = components[i];
                let at = prefix.join(&rel);
                match kind {
                    HostPathType::DirectoryOrCreate | HostPathType::Unset => {
                        match rustix::fs::mkdirat(&current, name, Mode::from_raw_mode(0o755)) {
                            Ok(()) | Err(Errno::EXIST) => {}
                            Err(e) => return Err(io_err("mkdir", &at, e)),
                        }
                        // Exactly 0755, whatever the umask (through the directory just made, not a path).
                        let made = rustix::fs::openat(
                            &current,
                            name,
                            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(|e| io_err("open", &at, e))?;
                        rustix::fs::fchmod(&made, Mode::from_raw_mode(0o755))
                            .map_err(|e| io_err("chmod", &at, e))?;
                        tracing::debug!(path = %at.display(), "created hostPath directory beneath its allowed prefix");
                    }
                    HostPathType::FileOrCreate if last => {
                        let made = rustix::fs::openat(
                            &current,
                            name,
                            OFlags::WRONLY
                                | OFlags::CREATE
                                | OFlags::EXCL
                                | OFlags::NOFOLLOW
                                | OFlags::CLOEXEC,
                            Mode::from_raw_mode(0o644),
                        );
                        match made {
                            Ok(file) => rustix::fs::fchmod(&file, Mode::from_raw_mode(0o644))
                                .map_err(|e| io_err("chmod", &at, e))?,
                            Err(Errno::EXIST) => {}
                            Err(e) => return Err(io_err("create", &at, e)),
                        }
                        tracing::debug!(path = %at.display(), "created hostPath file beneath its allowed prefix");
                    }
                    HostPathType::FileOrCreate => {
                        return Err(HostPathError::ParentMissing { path: path.to_path_buf() });
                    }
                    _ => return Err(HostPathError::NotFound { path: path.to_path_buf(), kind }),
                }
                match open_beneath(&root, &rel) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT) => return Err(escape(i + 1, "is a dangling symlink".to_owned())),
                    Err(e) => return Err(escape(i + 1, reason_of(&current, name, e))),
                }
            }
            Err(e) => return Err(escape(i + 1, reason_of(&current, components[i], e))),
        };
    }
    let stat = rustix::fs::fstat(&current).map_err(|e| io_err("stat", path, e))?;
    let found = FileType::from_raw_mode(stat.st_mode);
    let (expected, matches) = match kind {
        HostPathType::Unset => return Ok(Some(current)),
        HostPathType::DirectoryOrCreate | HostPathType::Directory => {
            ("directory", found == FileType::Directory)
        }
        HostPathType::FileOrCreate | HostPathType::File => ("file", found == FileType::RegularFile),
        HostPathType::Socket => ("socket file", found == FileType::Socket),
        HostPathType::CharDevice => ("character device", found == FileType::CharacterDevice),
        HostPathType::BlockDevice => ("block device", found == FileType::BlockDevice),
    };
    if !matches {
        let found = match found {
            FileType::Directory => "directory",
            FileType::RegularFile => "file",
            FileType::Socket => "socket file",
            FileType::CharacterDevice => "character device",
            FileType::BlockDevice => "block device",
            _ => "file of unknown type",
        };
        return Err(HostPathError::WrongType { path: path.to_path_buf(), expected, found });
    }
    Ok(Some(current))
}

/// `openat2(root, rel, O_PATH, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, retried when a concurrent rename makes
/// the kernel give up (`EAGAIN`); without `openat2` (before Linux 5.6), every component is opened with
/// `O_NOFOLLOW` and any symlink is refused (`ELOOP`).
fn open_beneath(root: &OwnedFd, rel: &Path) -> Result<OwnedFd, Errno> {
    let mut attempts = 0;
    loop {
        match rustix::fs::openat2(root, rel, OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), RESOLVE) {
            Err(Errno::AGAIN) if attempts < 64 => attempts += 1,
            Err(Errno::NOSYS) => {
                let mut cur = rustix::fs::openat(root, ".", OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
                for component in rel.components() {
                    cur = rustix::fs::openat(
                        &cur,
                        component.as_os_str(),
                        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?;
                    if FileType::from_raw_mode(rustix::fs::fstat(&cur)?.st_mode) == FileType::Symlink {
                        return Err(Errno::LOOP);
                    }
                }
                return Ok(cur);
            }
            other => return other,
        }
    }
}

/// Why `name` in `parent` failed to resolve beneath the prefix with `errno`, for people.
fn reason_of(parent: &OwnedFd, name: &std::ffi::OsStr, errno: Errno) -> String {
    let link =
        rustix::fs::readlinkat(parent, name, Vec::new()).ok().map(|t| t.to_string_lossy().into_owned());
    match (link, errno) {
        (Some(target), _) if target.starts_with('/') => {
            format!("is a symlink to the absolute path {target:?}, which leads out of the allowed prefix")
        }
        (Some(target), Errno::LOOP) => format!("is a symlink to {target:?} in a symlink loop"),
        (Some(target), _) => format!("is a symlink to {target:?}, which leads out of the allowed prefix"),
        (None, Errno::XDEV) => "leads out of the allowed prefix".to_owned(),
        (None, Errno::NOTDIR) => "is not a directory".to_owned(),
        (None, e) => format!("cannot be opened: {}", std::io::Error::from(e)),
    }
}

/// Creates `path` and its missing parents with exactly 0755; an existing directory is fine.
fn make_dir(path: &Path) -> Result<(), HostPathError> {
    let missing: Vec<&Path> = path
        .ancestors()
        .take_while(|p| std::fs::symlink_metadata(p).is_err() && p.parent().is_some())
        .collect();
    for dir in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io("chmod", dir, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("mkdir", dir, e)),
        }
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            tracing::debug!(path = %path.display(), "created hostPath directory");
            Ok(())
        }
        Ok(m) => Err(HostPathError::WrongType {
            path: path.to_path_buf(),
            expected: "directory",
            found: describe(m.file_type()),
        }),
        Err(e) => Err(io("stat", path, e)),
    }
}

/// Creates an empty file with exactly 0644, never through a symlink and never over an existing file.
fn make_file(path: &Path) -> Result<(), HostPathError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).unwrap_or(0))
        .open(path);
    match file {
        Ok(f) => {
            f.set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(|e| io("chmod", path, e))?;
            tracing::debug!(path = %path.display(), "created hostPath file");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(HostPathError::ParentMissing { path: path.to_path_buf() })
        }
        Err(e) => Err(io("create", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_types() {
        assert_eq!(HostPathType::parse(None).ok(), Some(HostPathType::Unset));
        assert_eq!(HostPathType::parse(Some("")).ok(), Some(HostPathType::Unset));
        for kind in [
            HostPathType::DirectoryOrCreate,
            HostPathType::Directory,
            HostPathType::FileOrCreate,
            HostPathType::File,
            HostPathType::Socket,
            HostPathType::CharDevice,
            HostPathType::BlockDevice,
        ] {
            assert_eq!(HostPathType::parse(Some(kind.as_str())).ok(), Some(kind));
        }
        let err = HostPathType::parse(Some("directory")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with("hostPath type \"directory\" is not supported"), "{err}");
    }

    #[test]
    fn rejects_relative_and_backstep_paths() {
        for bad in ["rel/x", "/a/../etc"] {
            let err = check_host_path(Path::new(bad), HostPathType::Unset);
            assert!(matches!(err, Err(HostPathError::InvalidPath { .. })), "{bad}: {err:?}");
        }
    }
}

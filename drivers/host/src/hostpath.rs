//! The kubelet's `hostPath` `type` checks (`pkg/volume/hostpath/host_path.go`, `checkType`).
//!
//! Like the kubelet, the type checks use `stat`, which **follows symlinks**: a `Directory` hostPath
//! may be a symlink to a directory (the runtime's bind mount follows it too). Differences from the
//! kubelet, all on the safe side: the path must be absolute and free of `..` elements;
//! `FileOrCreate` creates with `O_EXCL|O_NOFOLLOW` (the kubelet's `O_CREATE` would create the target
//! of a dangling symlink anywhere on the host; here a dangling symlink is "not a file"); created
//! directories and files get exactly 0755 / 0644, whatever the process umask.

use std::fmt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

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

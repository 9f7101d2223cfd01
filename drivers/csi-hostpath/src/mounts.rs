//! Mount table look-ups and bind mounts (rustix, no `unsafe`).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

/// How many times a stacked mount point is unmounted before giving up.
const MAX_UNMOUNTS: usize = 16;

/// One line of `/proc/self/mountinfo`, the fields this driver needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Field 5: where it is mounted (unescaped).
    pub(crate) mount_point: PathBuf,
    /// Field 6: the per-mount options (`ro`/`rw`, …).
    pub(crate) options: String,
}

/// Undoes the octal escapes (`\040` for a space, …) of mountinfo path fields.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let mount_point = fields.nth(4)?;
            let options = fields.next()?;
            Some(MountEntry {
                mount_point: PathBuf::from(unescape(mount_point)),
                options: options.to_owned(),
            })
        })
        .collect()
}

/// The current mount table of this process's mount namespace.
pub(crate) fn mount_table() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The topmost mount at exactly `path` (which must be canonical), if any.
pub(crate) fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mount_table()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// `path` and `other` are the same directory (same device and inode): after a bind mount, the mount point
/// shows the source's root inode.
pub(crate) fn same_dir(path: &Path, other: &Path) -> io::Result<bool> {
    let (a, b) = (std::fs::metadata(path)?, std::fs::metadata(other)?);
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// Whether per-mount options say read-only.
pub(crate) fn is_read_only(entry: &MountEntry) -> bool {
    entry.options.split(',').any(|o| o == "ro")
}

/// Bind-mounts `source` onto `target`, read-only if asked (a bind mount is made read-only by a remount).
pub(crate) fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    rustix::mount::mount_bind(source, target)?;
    if read_only
        && let Err(e) = rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")
    {
        // Never leave a writable mount behind where a read-only one was asked for.
        let _ = rustix::mount::unmount(target, UnmountFlags::DETACH);
        return Err(e.into());
    }
    Ok(())
}

/// Unmounts everything stacked at `path` (canonical). Returns how many mounts were removed.
pub(crate) fn unmount_all(path: &Path) -> io::Result<usize> {
    let mut removed = 0;
    while mount_at(path)?.is_some() {
        if removed == MAX_UNMOUNTS {
            return Err(io::Error::other(format!(
                "{} still mounted after {removed} unmounts",
                path.display()
            )));
        }
        rustix::mount::unmount(path, UnmountFlags::empty())?;
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    99 22 8:1 /data/vol /tmp/a\\040b ro,relatime shared:1 - ext4 /dev/sda1 rw\n";
        let entries = parse_mountinfo(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].mount_point, PathBuf::from("/tmp/a b"));
        assert!(is_read_only(&entries[1]));
        assert!(!is_read_only(&entries[0]));
        assert_eq!(unescape("a\\134b\\011c"), "a\\b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }
}

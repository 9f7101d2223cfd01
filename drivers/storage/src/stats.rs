//! File-system statistics of a mounted volume (`statvfs`), as the kubelet reports them for
//! claim-backed volumes.

use std::path::Path;

use nodelet_resources::claim::metrics::FsStats;

/// `statvfs` of the file system holding `path`: capacity = blocks × fragment size, available =
/// blocks available to unprivileged users, used = blocks − free blocks; inodes likewise.
pub fn fs_stats(path: &Path) -> std::io::Result<FsStats> {
    let st = rustix::fs::statvfs(path)?;
    let frsize = st.f_frsize;
    Ok(FsStats {
        capacity_bytes: st.f_blocks.saturating_mul(frsize),
        available_bytes: st.f_bavail.saturating_mul(frsize),
        used_bytes: st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(frsize),
        inodes: st.f_files,
        inodes_free: st.f_ffree,
        inodes_used: st.f_files.saturating_sub(st.f_ffree),
    })
}

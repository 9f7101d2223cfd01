//! Shared helpers of the integration tests: the root check and a mount guard.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Whether the tests that mount can run: they need root. Without root they print a skip note and
/// return, unless `NODELET_REQUIRE_ROOT=1`, which makes them fail.
pub(crate) fn have_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("NODELET_REQUIRE_ROOT").as_deref() != Ok("1"),
        "{test}: needs root (NODELET_REQUIRE_ROOT=1)"
    );
    eprintln!("skipping {test}: needs root to mount");
    false
}

/// Unmounts (lazily, repeatedly) everything at and under its path when dropped, so a failing test
/// leaks no mount.
pub(crate) struct MountGuard(pub(crate) PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        for _ in 0..16 {
            let Ok(mounts) = nodelet_host::mounts::mounts_under(&self.0) else { return };
            if mounts.is_empty() {
                return;
            }
            for m in mounts {
                let _ = nodelet_host::mounts::unmount_detach(&m);
            }
        }
    }
}

/// A temporary directory whose mounts are cleaned up before it is removed; if a mount cannot be
/// removed, the directory is left in place rather than removed through the mount.
pub(crate) struct TestDir {
    path: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl TestDir {
    pub(crate) fn new() -> TestDir {
        let dir = tempfile::Builder::new().prefix("nodelet-host-").tempdir().expect("tempdir in /tmp");
        // Canonical, as mountinfo shows paths.
        let path = std::fs::canonicalize(dir.path()).expect("canonicalize tempdir");
        TestDir { path, dir: Some(dir) }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        drop(MountGuard(self.path.clone()));
        let clean = nodelet_host::mounts::mounts_under(&self.path).is_ok_and(|m| m.is_empty());
        if let Some(dir) = self.dir.take()
            && !clean
        {
            eprintln!("leaving {} in place: mounts remain beneath it", dir.keep().display());
        }
    }
}

/// The mode bits of a path (not following a final symlink).
pub(crate) fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(u32::MAX)
}

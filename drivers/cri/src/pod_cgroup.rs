//! The pod-level cgroup `<cgroupRoot>/pod<uid>` and its process limit (`podPidsLimit`): made before the
//! pod's sandbox starts, with `pids.max` written, as the kubelet's pod container manager does; the pod
//! cgroups of pods that already run get the node's current limit (or `max`) when nodelet adopts them.
//! The runtime then puts the sandbox and every container below it (their cgroup parent), so the limit
//! counts every process and thread of the pod.
//!
//! Both hierarchies are handled: cgroup v2 (the unified hierarchy at the cgroup mount, `cgroup.controllers`
//! present there; the `pids` controller is enabled on the way down through `cgroup.subtree_control`) and
//! cgroup v1 (the `pids` hierarchy at `<mount>/pids`, including hybrid setups where only the empty unified
//! hierarchy is mounted at `<mount>/unified`).

use std::io;
use std::path::{Component, Path, PathBuf};

/// Why the pod cgroup could not be made or limited.
#[derive(Debug, thiserror::Error)]
pub enum PodCgroupError {
    /// The cgroup path is not an absolute path of plain segments.
    #[error("invalid pod cgroup path {0:?}")]
    InvalidPath(String),
    /// Neither a cgroup v2 hierarchy nor a v1 `pids` hierarchy is mounted at the cgroup mount.
    #[error("no pids controller under {0}: neither a cgroup v2 hierarchy nor a cgroup v1 pids hierarchy")]
    NoPidsController(PathBuf),
    /// A cgroup file could not be created or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PodCgroupError + '_ {
    move |source| PodCgroupError::Io { path: path.to_path_buf(), source }
}

/// Where the `pids` controller of a cgroup mount lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidsHierarchy {
    /// cgroup v2: the unified hierarchy's root directory.
    V2(PathBuf),
    /// cgroup v1: the `pids` hierarchy's root directory.
    V1(PathBuf),
}

impl PidsHierarchy {
    /// The hierarchy carrying the `pids` controller under the cgroup mount `cgroup_fs`
    /// (`/sys/fs/cgroup`), if any.
    pub fn detect(cgroup_fs: &Path) -> Option<Self> {
        if cgroup_fs.join("cgroup.controllers").is_file() {
            return Some(Self::V2(cgroup_fs.to_path_buf()));
        }
        let v1 = cgroup_fs.join("pids");
        v1.join("cgroup.procs").is_file().then_some(Self::V1(v1))
    }

    /// The directory of the cgroup `rel` (`/a/pod<uid>`) in this hierarchy.
    pub fn dir(&self, rel: &str) -> Result<PathBuf, PodCgroupError> {
        let root = match self {
            Self::V2(root) | Self::V1(root) => root,
        };
        Ok(root.join(relative(rel)?))
    }
}

/// `rel` (absolute, cgroupfs syntax) as a relative path of plain segments.
fn relative(rel: &str) -> Result<PathBuf, PodCgroupError> {
    let trimmed = rel.trim_start_matches('/');
    let path = Path::new(trimmed);
    if !rel.starts_with('/')
        || trimmed.is_empty()
        || !path.components().all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(PodCgroupError::InvalidPath(rel.to_owned()));
    }
    Ok(path.to_path_buf())
}

/// Makes the cgroup `rel` under the cgroup mount `cgroup_fs` (with its parents) and sets its `pids.max`
/// to `limit`; returns the `pids.max` file written. Idempotent: an existing cgroup gets the limit again.
pub fn set_pids_limit(cgroup_fs: &Path, rel: &str, limit: u64) -> Result<PathBuf, PodCgroupError> {
    let hierarchy =
        PidsHierarchy::detect(cgroup_fs).ok_or_else(|| PodCgroupError::NoPidsController(cgroup_fs.into()))?;
    let dir = hierarchy.dir(rel)?;
    if let PidsHierarchy::V2(root) = &hierarchy {
        // Each cgroup above the pod's delegates `pids` to its children.
        let mut parent = root.clone();
        for segment in relative(rel)?.components() {
            let control = parent.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&control).map_err(io_err(&control))?;
            if !enabled.split_whitespace().any(|c| c == "pids") {
                std::fs::write(&control, "+pids").map_err(io_err(&control))?;
            }
            parent.push(segment);
            match std::fs::create_dir(&parent) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io_err(&parent)(e)),
                _ => {}
            }
        }
    } else {
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    }
    let max = dir.join("pids.max");
    std::fs::write(&max, limit.to_string()).map_err(io_err(&max))?;
    Ok(max)
}

/// Sets the `pids.max` of the cgroup `rel` under `cgroup_fs` to `limit` (`None`: `max`) if the cgroup
/// exists and has the file, without making anything; returns whether it changed the value. For the pod
/// cgroups of pods that already run, when the node's `podPidsLimit` is not what it was when they started.
pub fn update_pids_limit(cgroup_fs: &Path, rel: &str, limit: Option<u64>) -> Result<bool, PodCgroupError> {
    let Some(hierarchy) = PidsHierarchy::detect(cgroup_fs) else { return Ok(false) };
    let max = hierarchy.dir(rel)?.join("pids.max");
    let wanted = limit.map_or_else(|| "max".to_owned(), |n| n.to_string());
    match std::fs::read_to_string(&max) {
        Ok(now) if now.trim() == wanted => Ok(false),
        Ok(_) => {
            std::fs::write(&max, &wanted).map_err(io_err(&max))?;
            Ok(true)
        }
        // No such cgroup (the runtime made none yet, or it is gone), or `pids` not delegated to it.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(&max)(e)),
    }
}

/// The `pids.max` of the cgroup `rel` under `cgroup_fs`: `Some(None)` for `max` (no limit), `None` when
/// the cgroup or the controller is absent or the file unreadable.
pub fn pids_limit(cgroup_fs: &Path, rel: &str) -> Option<Option<u64>> {
    let dir = PidsHierarchy::detect(cgroup_fs)?.dir(rel).ok()?;
    let text = std::fs::read_to_string(dir.join("pids.max")).ok()?;
    match text.trim() {
        "max" => Some(None),
        n => n.parse().ok().map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn v1_pod_cgroups_get_their_pids_max_below_the_pids_hierarchy() {
        let d = tempfile::tempdir().expect("tempdir");
        write(&d.path().join("pids/cgroup.procs"), "");
        assert_eq!(PidsHierarchy::detect(d.path()), Some(PidsHierarchy::V1(d.path().join("pids"))));
        let max = set_pids_limit(d.path(), "/nodelet/podu1", 64).expect("set");
        assert_eq!(max, d.path().join("pids/nodelet/podu1/pids.max"));
        assert_eq!(std::fs::read_to_string(&max).expect("read"), "64");
        assert_eq!(pids_limit(d.path(), "/nodelet/podu1"), Some(Some(64)));
        // Again (a new sandbox of the same pod): the same cgroup, the new value.
        set_pids_limit(d.path(), "/nodelet/podu1", 32).expect("set again");
        assert_eq!(pids_limit(d.path(), "/nodelet/podu1"), Some(Some(32)));
        write(&max, "max\n");
        assert_eq!(pids_limit(d.path(), "/nodelet/podu1"), Some(None));
    }

    #[test]
    fn v2_enables_the_pids_controller_down_to_the_pod_cgroup() {
        let d = tempfile::tempdir().expect("tempdir");
        write(&d.path().join("cgroup.controllers"), "cpu memory pids\n");
        write(&d.path().join("cgroup.subtree_control"), "memory\n");
        // The parent exists already, with pids delegated: left as it is.
        write(&d.path().join("nodelet/cgroup.subtree_control"), "memory pids\n");
        let max = set_pids_limit(d.path(), "/nodelet/podu1", 100).expect("set");
        assert_eq!(max, d.path().join("nodelet/podu1/pids.max"));
        assert_eq!(std::fs::read_to_string(&max).expect("read"), "100");
        // A plain file stands in for the kernel's: the write replaces its content.
        assert_eq!(std::fs::read_to_string(d.path().join("cgroup.subtree_control")).expect("read"), "+pids");
        assert_eq!(
            std::fs::read_to_string(d.path().join("nodelet/cgroup.subtree_control")).expect("read"),
            "memory pids\n"
        );
    }

    #[test]
    fn an_existing_pod_cgroup_gets_the_new_limit_and_nothing_is_made_for_a_missing_one() {
        let d = tempfile::tempdir().expect("tempdir");
        write(&d.path().join("cgroup.controllers"), "cpu memory pids\n");
        write(&d.path().join("nodelet/podu1/pids.max"), "16\n");
        assert_eq!(update_pids_limit(d.path(), "/nodelet/podu1", Some(32)).ok(), Some(true));
        assert_eq!(pids_limit(d.path(), "/nodelet/podu1"), Some(Some(32)));
        assert_eq!(update_pids_limit(d.path(), "/nodelet/podu1", Some(32)).ok(), Some(false), "unchanged");
        assert_eq!(update_pids_limit(d.path(), "/nodelet/podu1", None).ok(), Some(true));
        assert_eq!(pids_limit(d.path(), "/nodelet/podu1"), Some(None));
        assert_eq!(update_pids_limit(d.path(), "/nodelet/podu2", Some(8)).ok(), Some(false));
        assert!(!d.path().join("nodelet/podu2").exists(), "no cgroup made");
        assert!(matches!(
            update_pids_limit(d.path(), "/a/../b", Some(8)),
            Err(PodCgroupError::InvalidPath(_))
        ));
    }

    #[test]
    fn no_pids_controller_and_bad_paths_are_errors() {
        let d = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            set_pids_limit(d.path(), "/nodelet/podu1", 1),
            Err(PodCgroupError::NoPidsController(_))
        ));
        write(&d.path().join("pids/cgroup.procs"), "");
        for bad in ["nodelet/podu1", "/", "/a/../b"] {
            assert!(
                matches!(set_pids_limit(d.path(), bad, 1), Err(PodCgroupError::InvalidPath(_))),
                "{bad:?} accepted"
            );
        }
        assert_eq!(pids_limit(d.path(), "/absent"), None);
    }
}

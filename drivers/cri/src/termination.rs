//! Termination messages, as the kubelet handles them: each container gets a file of its own,
//! `<root>/pods/<uid>/containers/<container>/<restart count>` (created empty, mode 0666 so a non-root
//! process can write it), bind-mounted at its `terminationMessagePath`. When the container has
//! exited, the file (at most 4096 bytes) is its `state.terminated.message`; with
//! `terminationMessagePolicy: FallbackToLogsOnError`, an empty file and a failure, the tail of its log
//! is (the last 80 lines, at most 2048 bytes). Files are opened without following symbolic links.

use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use k8s_cri::v1;

use crate::labels;

/// The most of the file that becomes the message (the kubelet's `MaxContainerTerminationMessageLength`).
pub(crate) const MAX_MESSAGE_BYTES: u64 = 4096;
/// With `FallbackToLogsOnError`: at most this many lines of the log…
const FALLBACK_LINES: usize = 80;
/// …and at most this many bytes (the kubelet's `MaxContainerTerminationMessageLogLength`).
const FALLBACK_BYTES: usize = 2048;

/// The directory of a pod's termination message files.
pub(crate) fn pod_containers_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid).join("containers")
}

/// Creates the (empty) termination message file of container `name`, attempt `restart_count`, of pod
/// `uid` under `root`, and returns its path.
pub(crate) fn create_file(root: &Path, uid: &str, name: &str, restart_count: u32) -> io::Result<PathBuf> {
    let dir = pod_containers_dir(root, uid).join(name);
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(&dir)?;
    let path = dir.join(restart_count.to_string());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    Ok(path)
}

/// Opens `path` for reading without following a final symbolic link; a regular file only.
fn open(path: &Path) -> io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// The termination message of an exited container, from its status (mounts, annotations, exit code,
/// log path); `None` when there is none.
pub(crate) fn message(status: &v1::ContainerStatus) -> Option<String> {
    let path = status.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)?;
    let mut text = String::new();
    if let Some(mount) = status.mounts.iter().find(|m| &m.container_path == path)
        && let Ok(file) = open(Path::new(&mount.host_path))
    {
        let mut bytes = Vec::new();
        if file.take(MAX_MESSAGE_BYTES).read_to_end(&mut bytes).is_ok() {
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    let fallback = status.annotations.get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY).map(String::as_str)
        == Some("FallbackToLogsOnError");
    if text.is_empty() && fallback && status.exit_code != 0 && !status.log_path.is_empty() {
        text = log_tail(Path::new(&status.log_path)).unwrap_or_default();
    }
    (!text.is_empty()).then_some(text)
}

/// The output in the last lines of a CRI log file (bounded reads from the end).
fn log_tail(path: &Path) -> io::Result<String> {
    let mut file = open(path)?;
    let len = file.metadata()?.len();
    // CRI lines carry a ~40-byte prefix; 64 KiB from the end is plenty for 80 lines of 2 KiB output.
    let start = len.saturating_sub(64 * 1024);
    file.seek(SeekFrom::Start(start))?;
    let mut raw = Vec::new();
    file.take(64 * 1024).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0); // maybe cut in the middle
    }
    let mut out = String::new();
    for line in &lines[lines.len().saturating_sub(FALLBACK_LINES)..] {
        // `<time> <stream> <P|F> <content>`: the content, with a newline after full lines.
        let mut parts = line.splitn(4, ' ');
        let (Some(_), Some(_), Some(tag), content) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        out.push_str(content.unwrap_or_default());
        if tag != "P" {
            out.push('\n');
        }
    }
    if out.len() > FALLBACK_BYTES {
        let mut cut = out.len() - FALLBACK_BYTES;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out.drain(..cut);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(dir: &Path, file: &str, policy: &str, exit_code: i32) -> v1::ContainerStatus {
        v1::ContainerStatus {
            exit_code,
            log_path: dir.join("0.log").display().to_string(),
            mounts: vec![v1::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: dir.join(file).display().to_string(),
                ..v1::Mount::default()
            }],
            annotations: [
                (labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_owned(), "/dev/termination-log".to_owned()),
                (labels::CONTAINER_TERMINATION_MESSAGE_POLICY.to_owned(), policy.to_owned()),
            ]
            .into(),
            ..v1::ContainerStatus::default()
        }
    }

    #[test]
    fn the_file_is_the_message_capped_and_the_log_is_the_fallback_on_failure_only() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = create_file(dir.path(), "uid", "app", 2).unwrap_or_else(|e| panic!("create: {e}"));
        assert_eq!(path, dir.path().join("pods/uid/containers/app/2"));
        assert_eq!(std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777).ok(), Some(0o666));
        let files = path.parent().unwrap_or(dir.path()).to_owned();
        std::fs::write(files.join("2"), "x".repeat(5000)).unwrap_or_else(|e| panic!("{e}"));
        let got = message(&status(&files, "2", "File", 1)).unwrap_or_default();
        assert_eq!(got.len(), 4096, "capped");
        std::fs::write(files.join("0.log"), "2026-01-01T00:00:00Z stderr P par\n2026-01-01T00:00:00Z stderr F tial\n2026-01-01T00:00:01Z stdout F boom\n")
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(files.join("2"), "").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(message(&status(&files, "2", "File", 1)), None, "File: no fallback");
        assert_eq!(message(&status(&files, "2", "FallbackToLogsOnError", 0)), None, "success: no fallback");
        assert_eq!(
            message(&status(&files, "2", "FallbackToLogsOnError", 2)).as_deref(),
            Some("partial\nboom\n")
        );
        std::os::unix::fs::symlink("/etc/hostname", files.join("link")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(message(&status(&files, "link", "File", 1)), None, "symbolic links are not followed");
    }
}

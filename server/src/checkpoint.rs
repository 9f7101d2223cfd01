//! `POST /checkpoint/{namespace}/{pod}/{container}`: the kubelet's container checkpoint API (KEP-2008,
//! `pkg/kubelet/server/server.go` `checkpoint`), on CRI `CheckpointContainer`.
//!
//! The pod must be on this node and have a container (app, init or ephemeral) of that name, which must be
//! running. The runtime writes the archive to `<root-dir>/checkpoints/checkpoint-<pod>_<namespace>-
//! <container>-<RFC 3339 time, UTC>.tar`, the kubelet's name, and the answer is the kubelet's:
//!
//! | case | answer |
//! |---|---|
//! | done | 200 `{"items":["<archive path>"]}` |
//! | no such pod | 404 `pod does not exist` |
//! | no container of that name in the pod's spec | 404 `container <name> does not exist` |
//! | `?timeout=` not an integer (the last one counts) | 404 `cannot parse value of timeout parameter` (sic, the kubelet's code) |
//! | container not running, negative timeout, the runtime failed or does not implement it (containerd 1.x: `UNIMPLEMENTED`, CRIU missing or failing) | 500 `checkpointing of <ns>/<pod>/<container> failed (<reason>)` |
//! | a checkpoint of the same container is already being written | 409 (nodelet-only bound) |
//! | no container runtime configured | 503 |
//!
//! Error bodies are `Status` objects like nodelet's other errors (the kubelet writes the same message as
//! plain text). Authorization is the main port's: resource `nodes`, subresource `checkpoint`, verb `create`
//! (see `webhook.rs`), the kubelet's mapping; a role that may exec (`nodes/proxy`) may not checkpoint.
//! `?timeout=` (seconds) is passed to the runtime and is the call's deadline when it is longer than
//! `runtimeRequestTimeout`, as the kubelet's remote runtime does. The archive directory is created 0700
//! (and made 0700 if it was not); a directory that is a symbolic link, or not a directory, is refused.
//! The archive's name comes from the resolved pod (its name and namespace are validated DNS names) and the
//! container's name, never from the raw URL. The kubelet has this endpoint behind the `ContainerCheckpoint`
//! feature gate (alpha, off in 1.28); nodelet has no feature gates and serves it always, behind the same
//! authentication and authorization as every other main-port endpoint.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

use super::routes::Shared;
use super::{NodeView, status};

/// The directory under `--root-dir` where checkpoint archives go (the kubelet's `checkpoints`).
pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";

/// Why [`NodeView::checkpoint_target`] found no container to checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointTargetError {
    /// No such pod on this node.
    #[error("pod does not exist")]
    PodNotFound,
    /// The pod's spec has no container (app, init or ephemeral) of that name.
    #[error("container does not exist")]
    NoSuchContainer,
    /// The container is in the spec but has no running instance in the runtime.
    #[error("container not found")]
    NotRunning,
}

/// What a checkpoint request resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointTarget {
    /// The pod's UID (the key of `InProgress`, with the container name).
    pub pod_uid: String,
    /// The running container's runtime ID.
    pub container_id: String,
}

/// The containers whose checkpoint is being written: at most one per container at a time.
#[derive(Debug, Default)]
pub(crate) struct InProgress(Mutex<HashSet<(String, String)>>);

impl InProgress {
    /// Takes the slot of `(pod_uid, container)`; `None` when it is taken.
    fn start(self: &Arc<Self>, pod_uid: &str, container: &str) -> Option<Slot> {
        let key = (pod_uid.to_owned(), container.to_owned());
        let mut taken = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        taken.insert(key.clone()).then(|| Slot { owner: self.clone(), key })
    }
}

/// A taken slot of [`InProgress`], given back on drop (also when the request is dropped mid-way).
#[derive(Debug)]
struct Slot {
    owner: Arc<InProgress>,
    key: (String, String),
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut taken = self.owner.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        taken.remove(&self.key);
    }
}

/// The path parameters.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct CheckpointPath {
    namespace: String,
    pod: String,
    container: String,
}

/// The kubelet's `?timeout=`: the last value, in seconds. `Ok(None)` without one; `Err` when the last
/// one is not a (64-bit) integer.
fn parse_timeout(query: &[(String, String)]) -> Result<Option<i64>, ()> {
    match query.iter().rev().find(|(k, _)| k == "timeout") {
        None => Ok(None),
        Some((_, v)) => v.parse::<i64>().map(Some).map_err(|_| ()),
    }
}

/// `checkpoint-<pod>_<namespace>-<container>-<time>.tar`, the kubelet's name (`podFullName` is
/// `<name>_<namespace>`; the time is RFC 3339, here in UTC).
pub(crate) fn archive_name(namespace: &str, pod: &str, container: &str, unix_seconds: i64) -> String {
    let time = k8s_openapi::jiff::Timestamp::from_second(unix_seconds)
        .map_or_else(|_| "1970-01-01T00:00:00Z".to_owned(), |t| t.to_string());
    format!("checkpoint-{pod}_{namespace}-{container}-{time}.tar")
}

/// Whether `name` can be part of a file name as is: a DNS-1123 label or subdomain (what pod, namespace and
/// container names are once validated), so no `/`, no `..` and nothing outside `[a-z0-9.-]`.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name.starts_with('.')
        && !name.contains("..")
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Makes `<root>/checkpoints` (0700), or checks the one there: a real directory (not a symbolic link),
/// made 0700 when it had other bits.
pub(crate) fn ensure_dir(root: &Path) -> io::Result<PathBuf> {
    let dir = root.join(CHECKPOINTS_DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o755).create(root)?;
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        }
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.file_type().is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    if meta.permissions().mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

fn failed(path: &CheckpointPath, reason: impl std::fmt::Display) -> Response {
    status::failure(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("checkpointing of {}/{}/{} failed ({reason})", path.namespace, path.pod, path.container),
    )
}

/// `POST /checkpoint/{namespace}/{pod}/{container}[?timeout=SECONDS]` (see the module documentation).
pub(crate) async fn checkpoint<V: NodeView>(
    State(shared): State<Arc<Shared<V>>>,
    UrlPath(path): UrlPath<CheckpointPath>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    // The kubelet's order: the pod, the container in its spec, the timeout, then the running container.
    let target = match shared.view.checkpoint_target(&path.namespace, &path.pod, &path.container) {
        Err(CheckpointTargetError::PodNotFound) => {
            return status::failure(StatusCode::NOT_FOUND, "pod does not exist");
        }
        Err(CheckpointTargetError::NoSuchContainer) => {
            return status::failure(
                StatusCode::NOT_FOUND,
                format!("container {} does not exist", path.container),
            );
        }
        other => other,
    };
    // The names were resolved against the node's pods, which were validated; checked again because they
    // become a file name.
    if ![&path.namespace, &path.pod, &path.container].into_iter().all(|n| is_plain_name(n)) {
        return status::failure(StatusCode::NOT_FOUND, "pod does not exist");
    }
    let timeout = match parse_timeout(&query) {
        Ok(t) => t,
        Err(()) => return status::failure(StatusCode::NOT_FOUND, "cannot parse value of timeout parameter"),
    };
    let Ok(target) = target else {
        return failed(&path, format_args!("container {} not found", path.container));
    };
    let timeout = match timeout {
        Some(t) if t < 0 => return failed(&path, "CheckpointContainer requires the timeout value to be > 0"),
        Some(t) => Duration::from_secs(u64::try_from(t).unwrap_or(0)),
        None => Duration::ZERO,
    };
    let Some(runtime) = shared.runtime.clone() else {
        return status::failure(StatusCode::SERVICE_UNAVAILABLE, "no container runtime is configured");
    };
    let Some(_slot) = shared.checkpoints.start(&target.pod_uid, &path.container) else {
        return status::failure(
            StatusCode::CONFLICT,
            format!(
                "a checkpoint of {}/{}/{} is already being written",
                path.namespace, path.pod, path.container
            ),
        );
    };
    let root = shared.root_dir.clone();
    let dir = match tokio::task::spawn_blocking(move || ensure_dir(&root)).await {
        Ok(Ok(dir)) => dir,
        Ok(Err(e)) => return failed(&path, format_args!("cannot create the checkpoint directory: {e}")),
        Err(e) => return failed(&path, format_args!("cannot create the checkpoint directory: {e}")),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
    let location = dir.join(archive_name(&path.namespace, &path.pod, &path.container, now));
    let location = location.to_string_lossy().into_owned();
    let started = tokio::time::Instant::now();
    match runtime.checkpoint_container(&target.container_id, &location, timeout).await {
        Ok(()) => {
            info!(pod = %format!("{}/{}", path.namespace, path.pod), container = %path.container,
                  archive = %location, elapsed_ms = started.elapsed().as_millis(), "container checkpointed");
            let body = serde_json::json!({ "items": [location] }).to_string();
            let mut response = (StatusCode::OK, Body::from(body)).into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(e) => {
            warn!(pod = %format!("{}/{}", path.namespace, path.pod), container = %path.container, error = %e,
                  "container checkpoint failed");
            failed(&path, e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_are_the_kubelets() {
        assert_eq!(
            archive_name("default", "web", "app", 1_764_921_600),
            "checkpoint-web_default-app-2025-12-05T08:00:00Z.tar"
        );
    }

    #[test]
    fn the_last_timeout_counts_and_must_be_an_integer() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        assert_eq!(parse_timeout(&q(&[])), Ok(None));
        assert_eq!(parse_timeout(&q(&[("timeout", "5"), ("timeout", "30")])), Ok(Some(30)));
        assert_eq!(parse_timeout(&q(&[("timeout", "-1")])), Ok(Some(-1)));
        assert_eq!(parse_timeout(&q(&[("timeout", "30"), ("timeout", "1m")])), Err(()));
    }

    #[test]
    fn only_plain_names_become_file_names() {
        for ok in ["web", "web-1", "a.b", "kube-system"] {
            assert!(is_plain_name(ok), "{ok}");
        }
        for bad in ["", "..", "a/b", "../x", ".hidden", "A", "a b", "a\0b", "x..y"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_directory_is_made_0700_and_a_link_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = ensure_dir(root.path()).expect("made");
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_dir(root.path()).expect("again");
        let mode = std::fs::metadata(&dir).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "a wider directory is narrowed");

        let other = tempfile::tempdir().expect("tempdir");
        let elsewhere = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(elsewhere.path(), other.path().join(CHECKPOINTS_DIR)).expect("link");
        let err = ensure_dir(other.path()).expect_err("a link is refused");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn one_checkpoint_per_container_at_a_time() {
        let slots = Arc::new(InProgress::default());
        let first = slots.start("uid", "app").expect("free");
        assert!(slots.start("uid", "app").is_none(), "taken");
        assert!(slots.start("uid", "other").is_some(), "another container is free");
        drop(first);
        assert!(slots.start("uid", "app").is_some(), "given back on drop");
    }
}

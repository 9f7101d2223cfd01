//! Client configuration and endpoint parsing.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{CriError, Result};

/// Default per-call deadline, the kubelet's `--runtime-request-timeout` default.
pub const DEFAULT_RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Default deadline of `PullImage`. Pulls of large images over slow links take long; the kubelet sets none.
pub const DEFAULT_IMAGE_PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default extra time given to `ExecSync` on top of the command's own timeout, so that the runtime can
/// report the command timeout itself (and clean up) before this client gives up.
pub const DEFAULT_EXEC_SYNC_MARGIN: Duration = Duration::from_secs(30);
/// Default timeout of the initial socket connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default maximum gRPC message size, as the kubelet (16 MiB). Large nodes' `ListContainers` exceed tonic's
/// 4 MiB default.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;
/// The containerd namespace the CRI plugin uses.
pub const DEFAULT_CONTAINERD_NAMESPACE: &str = "k8s.io";

/// Configuration of a [`CriClient`](crate::CriClient).
///
/// Construct with [`CriConfig::new`] and adjust fields or use the `with_*` builders:
///
/// ```
/// use std::time::Duration;
/// let config = nodelet_cri::CriConfig::new("unix:///run/containerd/containerd.sock")
///     .with_runtime_request_timeout(Duration::from_secs(60))
///     .with_image_pull_timeout(None);
/// assert_eq!(config.socket_path().unwrap().to_str(), Some("/run/containerd/containerd.sock"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CriConfig {
    /// The runtime endpoint: `unix:///path/to/socket` or a plain socket path.
    pub endpoint: String,
    /// Deadline of the initial connection ([`CriClient::connect`](crate::CriClient::connect)).
    pub connect_timeout: Duration,
    /// Deadline of every call except `PullImage`, `ExecSync` and `StopContainer` (which adds the grace period).
    pub runtime_request_timeout: Duration,
    /// Deadline of `PullImage`; `None` waits as long as the runtime takes.
    pub image_pull_timeout: Option<Duration>,
    /// Extra time on top of an `ExecSync` command's timeout.
    pub exec_sync_margin: Duration,
    /// Maximum encoded/decoded gRPC message size in bytes.
    pub max_message_size: usize,
    /// The containerd namespace whose native events are subscribed to (the CRI plugin's, `k8s.io`).
    pub containerd_namespace: String,
}

impl CriConfig {
    /// A configuration with the defaults for everything but the endpoint.
    pub fn new(endpoint: impl Into<String>) -> Self {
        CriConfig {
            endpoint: endpoint.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            runtime_request_timeout: DEFAULT_RUNTIME_REQUEST_TIMEOUT,
            image_pull_timeout: Some(DEFAULT_IMAGE_PULL_TIMEOUT),
            exec_sync_margin: DEFAULT_EXEC_SYNC_MARGIN,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            containerd_namespace: DEFAULT_CONTAINERD_NAMESPACE.to_owned(),
        }
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`runtime_request_timeout`](Self::runtime_request_timeout).
    pub fn with_runtime_request_timeout(mut self, timeout: Duration) -> Self {
        self.runtime_request_timeout = timeout;
        self
    }

    /// Sets [`image_pull_timeout`](Self::image_pull_timeout).
    pub fn with_image_pull_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.image_pull_timeout = timeout;
        self
    }

    /// Sets [`exec_sync_margin`](Self::exec_sync_margin).
    pub fn with_exec_sync_margin(mut self, margin: Duration) -> Self {
        self.exec_sync_margin = margin;
        self
    }

    /// Sets [`containerd_namespace`](Self::containerd_namespace).
    pub fn with_containerd_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.containerd_namespace = namespace.into();
        self
    }

    /// The unix socket path the endpoint designates.
    pub fn socket_path(&self) -> Result<PathBuf> {
        parse_endpoint(&self.endpoint)
    }
}

/// Parses a CRI endpoint into a unix socket path.
///
/// Accepts `unix:///abs/path`, `unix:/abs/path` and plain paths (absolute or relative). Rejects other schemes
/// (`tcp://`, `npipe://`, …) and empty paths.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf> {
    let invalid =
        |reason: &str| CriError::InvalidEndpoint { endpoint: endpoint.to_owned(), reason: reason.to_owned() };
    let trimmed = endpoint.trim();
    let path = if let Some(rest) = trimmed.strip_prefix("unix://") {
        if !rest.is_empty() && !rest.starts_with('/') {
            // `unix://host/path` has an authority, which a unix socket cannot have.
            return Err(invalid("expected unix:///absolute/path (three slashes)"));
        }
        rest
    } else if let Some(rest) = trimmed.strip_prefix("unix:") {
        rest
    } else if let Some((scheme, _)) = trimmed.split_once("://") {
        return Err(invalid(&format!("unsupported scheme {scheme:?}, only unix sockets are supported")));
    } else {
        trimmed
    };
    if path.is_empty() {
        return Err(invalid("empty socket path"));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let ok = |e: &str| parse_endpoint(e).map(|p| p.to_string_lossy().into_owned());
        assert_eq!(
            ok("unix:///run/containerd/containerd.sock").ok().as_deref(),
            Some("/run/containerd/containerd.sock")
        );
        assert_eq!(
            ok("/run/containerd/containerd.sock").ok().as_deref(),
            Some("/run/containerd/containerd.sock")
        );
        assert_eq!(ok("unix:/run/c.sock").ok().as_deref(), Some("/run/c.sock"));
        assert_eq!(ok("  unix:///x.sock ").ok().as_deref(), Some("/x.sock"));
        assert_eq!(ok("relative.sock").ok().as_deref(), Some("relative.sock"));
        for bad in ["", "unix://", "unix:", "tcp://127.0.0.1:1234", "http://[::]:50051", "unix://host/x.sock"]
        {
            let err = parse_endpoint(bad).err();
            assert!(matches!(err, Some(CriError::InvalidEndpoint { .. })), "{bad:?} accepted");
        }
    }

    #[test]
    fn defaults() {
        let c = CriConfig::new("/x.sock");
        assert_eq!(c.runtime_request_timeout, Duration::from_secs(120));
        assert!(c.image_pull_timeout.is_some_and(|t| t > c.runtime_request_timeout));
        assert_eq!(c.containerd_namespace, "k8s.io");
    }
}

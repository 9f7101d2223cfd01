//! TCP connections to `localhost:PORT` inside a pod sandbox's network namespace: what CRI `PortForward`
//! does in the runtime, without the runtime's streaming server.
//!
//! * [`CriClient::sandbox_network`](crate::CriClient::sandbox_network) finds where a sandbox's network lives
//!   ([`SandboxNetwork`]): the host's (a `hostNetwork` pod, from the sandbox status's namespace options) or a
//!   network namespace file, from containerd's verbose `PodSandboxStatus` (`info` JSON: the runtime spec's
//!   network namespace path, else `/proc/<sandbox pid>/ns/net`).
//! * [`NetnsDialer::dial`] connects to `127.0.0.1:PORT` there. In a namespace, a dedicated OS thread (never
//!   a tokio worker) opens the namespace file, enters it with `setns(CLONE_NEWNET)`
//!   ([`rustix::thread::move_into_link_name_space`]), connects with a timeout and hands the socket back; the
//!   socket stays in the namespace it was created in, and the thread ends (its namespace with it). At most
//!   [`NetnsDialer::new`]'s `max_threads` such threads run at once; further dials wait for a slot. On the
//!   host's network the connect is an ordinary tokio connect with the same timeout.
//!
//! Like containerd (`localhost` dialled as `tcp4`), only IPv4 loopback is dialled, so a listener bound to
//! `127.0.0.1` (or any address) inside the pod is reached. Entering a network namespace needs
//! `CAP_SYS_ADMIN`; without it [`NetnsError::Enter`] says so, and the caller can fall back to CRI
//! `PortForward`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, oneshot};

/// Default bound of dialer threads running at once.
pub const DEFAULT_DIAL_THREADS: usize = 16;
/// Default connect timeout of a dial.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a sandbox's network lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxNetwork {
    /// The host's network (`hostNetwork: true`): dial the host's loopback.
    Host,
    /// A network namespace file (`/var/run/netns/cni-…` or `/proc/<pid>/ns/net`).
    Namespace(PathBuf),
}

impl std::fmt::Display for SandboxNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host => f.write_str("host"),
            Self::Namespace(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Why a dial failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file could not be opened (the sandbox is gone, or no permission).
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `setns` failed (typically `EPERM`: no `CAP_SYS_ADMIN`).
    #[error("cannot enter network namespace {path}: {source}")]
    Enter {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The connect failed or timed out (a refused port is this).
    #[error("dial tcp4 {addr}: {}", go_style(source))]
    Connect {
        /// The address dialled (`127.0.0.1:PORT`).
        addr: SocketAddr,
        /// Why (`ConnectionRefused`, `TimedOut`, …).
        #[source]
        source: io::Error,
    },
    /// The dialer thread could not be started or ended without an answer.
    #[error("network namespace dialer thread: {0}")]
    Thread(String),
}

impl NetnsError {
    /// Whether the namespace itself could not be used (open or enter failed, no thread): a reason to fall back
    /// to the runtime's port-forward, unlike a refused or timed-out connect.
    pub fn is_namespace_unusable(&self) -> bool {
        !matches!(self, Self::Connect { .. })
    }
}

/// An I/O error as Go's `net` package words it (`connect: connection refused`), as containerd's port-forward
/// errors read.
fn go_style(e: &io::Error) -> String {
    let text = match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::TimedOut => "i/o timeout".to_owned(),
        _ => {
            let s = e.to_string();
            let s = s.split(" (os error").next().unwrap_or_default().to_owned();
            let mut chars = s.chars();
            chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or(s)
        }
    };
    format!("connect: {text}")
}

/// Opens TCP connections to loopback ports inside network namespaces, with a bounded number of dialer
/// threads; cheap to clone (the bound is shared).
#[derive(Debug, Clone)]
pub struct NetnsDialer {
    threads: Arc<Semaphore>,
    timeout: Duration,
}

impl Default for NetnsDialer {
    fn default() -> Self {
        Self::new(DEFAULT_DIAL_THREADS, DEFAULT_DIAL_TIMEOUT)
    }
}

impl NetnsDialer {
    /// A dialer running at most `max_threads` (at least 1) namespace threads at once, each connect bounded by
    /// `timeout`.
    pub fn new(max_threads: usize, timeout: Duration) -> Self {
        Self { threads: Arc::new(Semaphore::new(max_threads.max(1))), timeout }
    }

    /// Connects to `127.0.0.1:port` in `network`; the stream has `TCP_NODELAY` set (as Go's dialer does)
    /// and is registered with the current tokio runtime.
    pub async fn dial(&self, network: &SandboxNetwork, port: u16) -> Result<TcpStream, NetnsError> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let connect_error = |source| NetnsError::Connect { addr, source };
        let stream = match network {
            SandboxNetwork::Host => tokio::time::timeout(self.timeout, TcpStream::connect(addr))
                .await
                .map_err(|_| connect_error(io::ErrorKind::TimedOut.into()))?
                .map_err(connect_error)?,
            SandboxNetwork::Namespace(path) => {
                let std_stream = self.dial_in_namespace(path.clone(), addr).await?;
                std_stream.set_nonblocking(true).map_err(connect_error)?;
                TcpStream::from_std(std_stream).map_err(connect_error)?
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY on a port-forward connection");
        }
        Ok(stream)
    }

    async fn dial_in_namespace(
        &self,
        path: PathBuf,
        addr: SocketAddr,
    ) -> Result<std::net::TcpStream, NetnsError> {
        // The permit moves into the thread: a dial whose caller went away still counts until its thread ends.
        let permit = self
            .threads
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| NetnsError::Thread("the dialer is closed".to_owned()))?;
        let (tx, rx) = oneshot::channel();
        let timeout = self.timeout;
        std::thread::Builder::new()
            .name("netns-dial".to_owned())
            .spawn(move || {
                let _permit = permit;
                let _ = tx.send(connect_in(&path, addr, timeout));
            })
            .map_err(|e| NetnsError::Thread(e.to_string()))?;
        rx.await.map_err(|_| NetnsError::Thread("the thread ended without an answer".to_owned()))?
    }
}

/// On a thread of its own (which this changes for good): enters `path`'s network namespace and connects.
fn connect_in(path: &Path, addr: SocketAddr, timeout: Duration) -> Result<std::net::TcpStream, NetnsError> {
    let file =
        std::fs::File::open(path).map_err(|source| NetnsError::Open { path: path.to_owned(), source })?;
    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| NetnsError::Enter { path: path.to_owned(), source: e.into() })?;
    std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|source| NetnsError::Connect { addr, source })
}

/// The network of a sandbox from its CRI status and containerd's verbose `info` JSON: `Host` when the
/// sandbox's network namespace mode is `NODE`, else the runtime spec's network namespace path, else
/// `/proc/<pid>/ns/net`; `None` when neither is known.
pub(crate) fn network_from_status(
    status: &k8s_cri::v1::PodSandboxStatus,
    info: &std::collections::HashMap<String, String>,
) -> Option<SandboxNetwork> {
    let node = k8s_cri::v1::NamespaceMode::Node as i32;
    let host = status
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network == node);
    if host {
        return Some(SandboxNetwork::Host);
    }
    let json: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    let spec_path = json
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .find(|ns| ns.get("type").and_then(|t| t.as_str()) == Some("network"))
        .and_then(|ns| ns.get("path"))
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty());
    if let Some(path) = spec_path {
        return Some(SandboxNetwork::Namespace(PathBuf::from(path)));
    }
    let pid = json.get("pid").and_then(|p| p.as_u64()).filter(|&p| p > 0)?;
    Some(SandboxNetwork::Namespace(PathBuf::from(format!("/proc/{pid}/ns/net"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(network: k8s_cri::v1::NamespaceMode) -> k8s_cri::v1::PodSandboxStatus {
        k8s_cri::v1::PodSandboxStatus {
            linux: Some(k8s_cri::v1::LinuxPodSandboxStatus {
                namespaces: Some(k8s_cri::v1::Namespace {
                    options: Some(k8s_cri::v1::NamespaceOption {
                        network: network as i32,
                        ..Default::default()
                    }),
                }),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_network_comes_from_the_namespace_mode_the_spec_or_the_pid() {
        use k8s_cri::v1::NamespaceMode;
        let info = |json: &str| [("info".to_owned(), json.to_owned())].into_iter().collect();
        assert_eq!(
            network_from_status(&status(NamespaceMode::Node), &info("{}")),
            Some(SandboxNetwork::Host)
        );
        let spec = r#"{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [
            {"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]}}}"#;
        assert_eq!(
            network_from_status(&status(NamespaceMode::Pod), &info(spec)),
            Some(SandboxNetwork::Namespace("/var/run/netns/cni-1".into()))
        );
        assert_eq!(
            network_from_status(&status(NamespaceMode::Pod), &info(r#"{"pid": 42}"#)),
            Some(SandboxNetwork::Namespace("/proc/42/ns/net".into()))
        );
        assert_eq!(network_from_status(&status(NamespaceMode::Pod), &info(r#"{"pid": 0}"#)), None);
        assert_eq!(network_from_status(&status(NamespaceMode::Pod), &info("not json")), None);
        assert_eq!(network_from_status(&status(NamespaceMode::Pod), &Default::default()), None);
    }

    #[test]
    fn errors_read_like_containerds() {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 9999));
        let e = NetnsError::Connect { addr, source: io::ErrorKind::ConnectionRefused.into() };
        assert_eq!(e.to_string(), "dial tcp4 127.0.0.1:9999: connect: connection refused");
        assert!(!e.is_namespace_unusable());
        let e = NetnsError::Connect { addr, source: io::Error::from_raw_os_error(113) };
        assert_eq!(e.to_string(), "dial tcp4 127.0.0.1:9999: connect: no route to host");
    }

    #[tokio::test]
    async fn host_network_dials_loopback_and_reports_refusals() {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let dialer = NetnsDialer::default();
        let stream = dialer.dial(&SandboxNetwork::Host, port).await.expect("dial");
        assert_eq!(stream.peer_addr().expect("peer").port(), port);
        drop(listener);
        let e = dialer.dial(&SandboxNetwork::Host, port).await.expect_err("nothing listens any more");
        assert!(e.to_string().ends_with("connection refused"), "{e}");
        // a namespace file that does not exist: the namespace is unusable (fall back)
        let e = dialer
            .dial(&SandboxNetwork::Namespace("/nonexistent/ns/net".into()), port)
            .await
            .expect_err("no such namespace");
        assert!(e.is_namespace_unusable(), "{e}");
    }
}

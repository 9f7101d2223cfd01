//! `nodelet-csi-hostpath`: a small but real CSI driver (Identity, Controller, Node) on a unix socket.
//!
//! Volumes are directories under `--data-dir/volumes`, created by `CreateVolume` (idempotent by name,
//! capacity recorded in a JSON sidecar, not enforced), staged by bind-mounting the directory onto the
//! staging path and published by bind-mounting the staging path onto the target (read-only on request).
//! `NodeGetVolumeStats` reports the file system's `statvfs` and the volume's own usage from a directory
//! walk. Every call can be recorded as a JSON line (`--call-log`), so tests can check the order of calls.
//!
//! With `--attach` the driver also needs attaching, like a network block device would:
//! ControllerGetCapabilities adds `PUBLISH_UNPUBLISH_VOLUME`, and ControllerPublishVolume (to this node
//! only) records the attachment in the data dir (`volumes/<id>.attached`, holding the node ID) and
//! returns the publish context `{"hostpath.csi.nodelet.dev/device": "<volume_id>"}`. NodeStageVolume and
//! NodePublishVolume then fail with FAILED_PRECONDITION unless the volume is attached and the request
//! carries that exact context; ControllerUnpublishVolume refuses (FAILED_PRECONDITION) while the volume
//! is staged, DeleteVolume while it is attached. This lets a CO's attach/detach path be tested end to
//! end. Without `--attach`, ControllerPublishVolume/ControllerUnpublishVolume answer UNIMPLEMENTED.
//!
//! With `--topology KEY=VALUE` (repeatable), NodeGetInfo reports those segments as the node's accessible
//! topology (a CO puts them on its Node as labels).
//!
//! It needs root (mounts) and serves one node: nodelet's tests use it end to end, and it can back a
//! StorageClass on a single-node setup.

mod calllog;
mod mounts;
mod service;
mod store;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;
use nodelet_proto::csi::v1::controller_server::ControllerServer;
use nodelet_proto::csi::v1::identity_server::IdentityServer;
use nodelet_proto::csi::v1::node_server::NodeServer;
use tokio::net::UnixListener;

use crate::calllog::CallLog;
use crate::service::{Config, HostPath};
use crate::store::Store;

/// A CSI driver that provisions directories on this node and bind-mounts them.
#[derive(Debug, Parser)]
#[command(name = "nodelet-csi-hostpath", version)]
struct Args {
    /// CSI endpoint: `unix:///path/to/csi.sock` (or an absolute path).
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// Directory holding the volumes.
    #[arg(long)]
    data_dir: PathBuf,
    /// Node ID reported by NodeGetInfo.
    #[arg(long)]
    node_id: String,
    /// Driver name reported by GetPluginInfo.
    #[arg(long, default_value = "hostpath.csi.nodelet.dev")]
    name: String,
    /// NodeGetInfo `max_volumes_per_node` (0: no limit).
    #[arg(long, default_value_t = 100)]
    max_volumes_per_node: i64,
    /// Capacity of a volume created without a capacity range, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    default_volume_bytes: i64,
    /// Largest volume capacity, in bytes (CreateVolume answers OUT_OF_RANGE above it).
    #[arg(long, default_value_t = 1 << 40)]
    max_volume_bytes: i64,
    /// Append one JSON line per call (`{"method","volume_id","code"}`) to this file.
    #[arg(long)]
    call_log: Option<PathBuf>,
    /// Attach mode: offer ControllerPublishVolume/ControllerUnpublishVolume and require the attachment and
    /// its publish context for NodeStageVolume and NodePublishVolume.
    #[arg(long)]
    attach: bool,
    /// A topology segment `KEY=VALUE` NodeGetInfo reports as the node's accessible topology (repeatable).
    #[arg(long = "topology", value_name = "KEY=VALUE", value_parser = parse_segment)]
    topology: Vec<(String, String)>,
}

/// `KEY=VALUE` of `--topology`.
fn parse_segment(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// The socket path of a `unix://` endpoint.
fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path =
        endpoint.strip_prefix("unix://").or_else(|| endpoint.strip_prefix("unix:")).unwrap_or(endpoint);
    if path.contains("://") || !path.starts_with('/') {
        bail!("--endpoint {endpoint:?} must be unix:///absolute/path.sock");
    }
    Ok(PathBuf::from(path))
}

/// Removes a stale socket left by a previous run; refuses to remove anything that is not a socket.
fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("checking {}", path.display())),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.node_id.is_empty() {
        bail!("--node-id must not be empty");
    }
    nodelet_name_check(&args.name)?;
    if args.default_volume_bytes <= 0 || args.max_volume_bytes <= 0 {
        bail!("volume sizes must be positive");
    }

    let socket = socket_path(&args.endpoint)?;
    let store = Store::open(&args.data_dir)
        .with_context(|| format!("opening data dir {}", args.data_dir.display()))?;
    let log = CallLog::open(args.call_log.as_deref()).context("opening the call log")?;
    let config = Config {
        name: args.name.clone(),
        node_id: args.node_id.clone(),
        max_volumes_per_node: args.max_volumes_per_node,
        default_volume_bytes: args.default_volume_bytes,
        max_volume_bytes: args.max_volume_bytes,
        attach: args.attach,
        topology: args.topology.iter().cloned().collect(),
    };
    let driver = HostPath::new(config, store, log);

    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    remove_stale_socket(&socket)?;
    let listener =
        UnixListener::bind(&socket).with_context(|| format!("listening on {}", socket.display()))?;
    tracing::info!(
        name = %args.name,
        node_id = %args.node_id,
        attach = args.attach,
        socket = %socket.display(),
        "CSI driver serving"
    );

    let incoming = futures::stream::unfold(listener, |listener| async move {
        let conn = listener.accept().await.map(|(stream, _)| stream);
        Some((conn, listener))
    });
    let served = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(driver.clone()))
        .add_service(ControllerServer::new(driver.clone()))
        .add_service(NodeServer::new(driver))
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await;
    if let Err(e) = std::fs::remove_file(&socket) {
        tracing::warn!(error = %e, socket = %socket.display(), "cannot remove the socket");
    }
    served.context("serving CSI")?;
    tracing::info!("CSI driver stopped");
    Ok(())
}

/// The driver name must be a valid CSI name (GetPluginInfo's rules).
fn nodelet_name_check(name: &str) -> anyhow::Result<()> {
    let bytes = name.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    if bytes.len() > 63
        || !edge_ok(bytes.first())
        || !edge_ok(bytes.last())
        || !bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
    {
        bail!("--name {name:?} is not a valid CSI driver name");
    }
    Ok(())
}

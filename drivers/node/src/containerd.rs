//! The embedded container runtime: nodelet starts, supervises and stops its own containerd, as k3s does.
//!
//! When no `--container-runtime-endpoint` is given and `containerd` is on PATH, the daemon calls
//! [`EmbeddedContainerd::start`]. Everything lives under `<root-dir>/containerd/`:
//!
//! | path | what |
//! |---|---|
//! | `config.toml` | generated at every start in the format the binary reads (table below); `--containerd-config-extra` is merged over it through containerd's `imports` (containerd replaces a plugin's whole table when the extra file has one: copy nodelet's table for that plugin and change it) |
//! | `containerd.sock` (+ `.ttrpc`) | the gRPC socket: the CRI endpoint `unix://<root-dir>/containerd/containerd.sock` |
//! | `containerd.log` | containerd's stdout and stderr (rotated to `containerd.log.1` past 10 MiB at a start) |
//! | `containerd.pid` | the running containerd's pid, for operators |
//! | `root/`, `state/`, `opt/`, `runc/` | containerd's root and state directories, its opt dir, runc's state |
//! | `certs.d/<host>/hosts.toml` | registry hosts: `127.0.0.1:5000` and `localhost:5000` are reached over plain HTTP |
//!
//! Which configuration is written: at every start nodelet runs `<containerd> config default` (at most
//! [`CONFIG_DEFAULT_TIMEOUT`]) and reads its top-level `version` ([`detect_config_version`]):
//!
//! | containerd | `config default` prints | nodelet writes |
//! |---|---|---|
//! | 1.6, 1.7 | `version = 2` | version 2: one CRI plugin `io.containerd.grpc.v1.cri` (sandbox image, CNI, runc runtime, registry) |
//! | 2.0, 2.1 | `version = 3` | version 3: `io.containerd.cri.v1.images` (snapshotter, pinned sandbox image, registry), `io.containerd.cri.v1.runtime` (CNI `bin_dirs`, runc runtime), `io.containerd.grpc.v1.cri` (streaming server only); `[grpc]`/`[ttrpc]` addresses |
//! | 2.2 and later | `version = 4` | as version 3, with the socket addresses in `plugins."io.containerd.server.v1.grpc"` / `.ttrpc` |
//!
//! Any other answer is an error naming the binary ([`ContainerdError::ConfigVersion`]). The settings are the
//! same as `scripts/containerd-config.sh --config-version N` writes for the test runtime. containerd runs
//! with its own directory first on PATH: it finds the shim of its release there, and the shim finds runc on
//! that PATH (a `runc` beside containerd, else nodelet's PATH; [`EmbeddedContainerdConfig::runc_path`]
//! names another one). Image imports use the `ctr` beside containerd when there is one.
//!
//! The CNI network is configured in `<root-dir>/cni/net.d`: when that directory holds no other network
//! configuration, nodelet writes `10-nodelet.conflist`: a bridge (`nodelet0`) with host-local IPAM on the pod
//! CIDR (`198.18.0.0/16`), the bridge as gateway but no default route in pods (nothing leaves the host), no
//! masquerading, and portmap for hostPorts. portmap runs with `snat: false`, so a hostPort is reached through
//! the bridge address (`198.18.0.1:<hostPort>`) or a host address, not through 127.0.0.1: SNAT of localhost
//! traffic needs `route_localnet=1` on the bridge, which lets pods reach the host's loopback services
//! (CVE-2020-8558).
//!
//! Supervision: containerd runs as a child process in its own process group (a Ctrl-C on nodelet's terminal
//! does not reach it); if it exits, it is restarted after a back-off (1 s, doubling, at most 30 s; reset
//! after 60 s of uptime). That supervision is a future, [`ContainerdSupervision`], which
//! [`EmbeddedContainerd::start`] hands to its caller to run (the daemon runs it on a supervisor that
//! outlives every other task): this crate spawns no task. Running containers survive a containerd restart (their shims are independent).
//! [`EmbeddedContainerd::shutdown`] sends SIGTERM, waits, then SIGKILL. A containerd left running by a
//! nodelet that was killed is found by its config path at the next start and stopped first.

use std::fmt::Write as _;
use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nodelet_cri::{CriClient, CriConfig};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep, timeout};
use tracing::{debug, info, warn};

use crate::cidr::Ipv4Cidr;

/// Where the CNI plugins are (Debian's containernetworking-plugins).
pub const DEFAULT_CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The containerd binary (looked up on PATH).
pub const DEFAULT_CONTAINERD_PATH: &str = "containerd";
/// The generated network's Linux bridge.
pub const DEFAULT_CNI_BRIDGE: &str = "nodelet0";
/// The generated CNI network's name.
pub const CNI_NETWORK_NAME: &str = "nodelet";
/// The generated CNI network's file in the CNI config directory.
pub const CNI_CONFLIST_NAME: &str = "10-nodelet.conflist";
/// Registries reached over plain HTTP (the local registry the quick start and tests use).
pub const DEFAULT_PLAIN_HTTP_REGISTRIES: &[&str] = &["127.0.0.1:5000", "localhost:5000"];
/// How long containerd may take to answer CRI `Version` after being started.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long containerd may take to exit after SIGTERM before it gets SIGKILL.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// First delay before restarting a containerd that exited.
pub const DEFAULT_RESTART_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Largest delay between restarts.
pub const DEFAULT_RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Uptime after which the restart delay starts over at the initial value.
pub const DEFAULT_HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// How long one `ctr images import` may take.
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long CRI may take to show the images an import stored (containerd 2.x's CRI plugin learns of them
/// from the image events, after `ctr images import` returned).
pub const IMPORT_VISIBLE_TIMEOUT: Duration = Duration::from_secs(30);
/// containerd.log is rotated at a start when it is larger than this.
const LOG_ROTATE_BYTES: u64 = 10 << 20;
/// Longest path a unix socket can have (sun_path is 108 bytes with the NUL).
const SOCKET_PATH_MAX: usize = 107;
/// Interval of the readiness poll.
const READY_POLL: Duration = Duration::from_millis(100);

/// Why the embedded runtime could not be set up, started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// The containerd (or ctr) binary was not found.
    #[error(
        "{what} binary {path:?} not found (looked on PATH and in /usr/sbin, /sbin); install containerd or \
             pass --container-runtime-endpoint"
    )]
    NotFound {
        /// `containerd` or `ctr`.
        what: &'static str,
        /// The configured path or name.
        path: PathBuf,
    },
    /// A path is too long for a unix socket.
    #[error(
        "socket path {path} is {len} bytes long, unix sockets allow {SOCKET_PATH_MAX}: use a shorter --root-dir"
    )]
    SocketPathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// A setting cannot be used.
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// The setting.
        what: &'static str,
        /// Its value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// The configuration version the binary reads could not be found out, or nodelet cannot write it.
    #[error("cannot tell which configuration version {path} reads: {reason}")]
    ConfigVersion {
        /// The containerd binary.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A file or directory operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// containerd could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// containerd exited before it was ready.
    #[error("containerd exited during startup ({status}); last lines of {log}:\n{tail}")]
    ExitedDuringStartup {
        /// How it exited.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// containerd did not answer in time.
    #[error(
        "containerd did not answer CRI Version within {after:?} ({last_error}); last lines of {log}:\n{tail}"
    )]
    NotReady {
        /// The timeout.
        after: Duration,
        /// The last connection or call error.
        last_error: String,
        /// Its log file.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// A containerd left over from a previous nodelet could not be stopped.
    #[error("a containerd left by a previous nodelet (pid {pid}) still runs with {config}: {reason}")]
    Stale {
        /// Its pid.
        pid: u32,
        /// Our config path it runs with.
        config: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Importing an image archive failed.
    #[error("cannot import image archive {archive}: {message}")]
    Import {
        /// The archive.
        archive: PathBuf,
        /// ctr's message.
        message: String,
    },
    /// The supervision ([`ContainerdSupervision`]) ended before it stopped containerd: it panicked, or it
    /// was dropped without running to its end.
    #[error("the containerd supervisor task failed: {0}")]
    Task(String),
}

type Result<T, E = ContainerdError> = std::result::Result<T, E>;

/// The generated CNI bridge network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniNetwork {
    /// CNI network name.
    pub name: String,
    /// Linux bridge name (at most 15 characters).
    pub bridge: String,
    /// Pod subnet; the bridge gets its first address.
    pub subnet: Ipv4Cidr,
    /// host-local IPAM's data directory.
    pub ipam_dir: PathBuf,
}

/// Settings of the embedded containerd. [`Self::new`] has the defaults (the daemon applies its
/// configuration over them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedContainerdConfig {
    /// containerd binary (a bare name is looked up on PATH).
    pub containerd_path: PathBuf,
    /// ctr binary, for image imports (a bare name is looked up in containerd's directory, then on PATH).
    pub ctr_path: PathBuf,
    /// runc for the `runc` runtime (the shim's `BinaryName`); `None`: runc on containerd's PATH (containerd's
    /// own directory first, then nodelet's PATH).
    pub runc_path: Option<PathBuf>,
    /// containerd's directory (`<root-dir>/containerd`).
    pub dir: PathBuf,
    /// The CRI plugin's `sandbox_image`.
    pub sandbox_image: String,
    /// containerd's log level.
    pub log_level: String,
    /// TOML merged over the generated config (containerd `imports`).
    pub config_extra: Option<PathBuf>,
    /// CNI plugin binaries.
    pub cni_bin_dir: PathBuf,
    /// CNI configuration directory (`<root-dir>/cni/net.d`).
    pub cni_conf_dir: PathBuf,
    /// The network to generate there when the directory has no other network; `None`: never write one.
    pub cni_network: Option<CniNetwork>,
    /// `host:port` of registries reached over plain HTTP.
    pub plain_http_registries: Vec<String>,
    /// Directory of image archives (`*.tar`) imported into namespace k8s.io before `start` returns.
    pub preload_images: Option<PathBuf>,
    /// See [`DEFAULT_READY_TIMEOUT`].
    pub ready_timeout: Duration,
    /// See [`DEFAULT_STOP_TIMEOUT`].
    pub stop_timeout: Duration,
    /// See [`DEFAULT_RESTART_BACKOFF_INITIAL`].
    pub restart_backoff_initial: Duration,
    /// See [`DEFAULT_RESTART_BACKOFF_MAX`].
    pub restart_backoff_max: Duration,
    /// See [`DEFAULT_HEALTHY_AFTER`].
    pub healthy_after: Duration,
}

impl EmbeddedContainerdConfig {
    /// The defaults for a nodelet whose root directory is `root_dir` and whose pods' sandbox image is
    /// `sandbox_image`.
    pub fn new(root_dir: &Path, sandbox_image: &str) -> Self {
        let cni_root = root_dir.join("cni");
        EmbeddedContainerdConfig {
            containerd_path: PathBuf::from(DEFAULT_CONTAINERD_PATH),
            ctr_path: PathBuf::from("ctr"),
            runc_path: None,
            dir: root_dir.join("containerd"),
            sandbox_image: sandbox_image.to_owned(),
            log_level: "info".to_owned(),
            config_extra: None,
            cni_bin_dir: PathBuf::from(DEFAULT_CNI_BIN_DIR),
            cni_conf_dir: cni_root.join("net.d"),
            cni_network: Some(CniNetwork {
                name: CNI_NETWORK_NAME.to_owned(),
                bridge: DEFAULT_CNI_BRIDGE.to_owned(),
                subnet: crate::cidr::default_pod_cidr(),
                ipam_dir: cni_root.join("ipam"),
            }),
            plain_http_registries: DEFAULT_PLAIN_HTTP_REGISTRIES.iter().map(|s| (*s).to_owned()).collect(),
            preload_images: None,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            restart_backoff_initial: DEFAULT_RESTART_BACKOFF_INITIAL,
            restart_backoff_max: DEFAULT_RESTART_BACKOFF_MAX,
            healthy_after: DEFAULT_HEALTHY_AFTER,
        }
    }

    /// `<dir>/config.toml`.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    /// `<dir>/containerd.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    /// `unix://<dir>/containerd.sock`: the CRI endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket_path().display())
    }
    /// `<dir>/containerd.log`.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    /// `<dir>/containerd.pid`.
    pub fn pid_path(&self) -> PathBuf {
        self.dir.join("containerd.pid")
    }
}

/// Finds an executable: a path with a `/` is taken as is; a bare name is looked up on PATH, then in
/// `/usr/local/sbin`, `/usr/sbin` and `/sbin` (root's PATH sometimes lacks them).
pub fn find_executable(name: &Path) -> Option<PathBuf> {
    let is_exec =
        |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.components().count() > 1 || name.is_absolute() {
        return is_exec(name).then(|| name.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
                .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| is_exec(p))
}

/// Escapes `s` as a TOML basic string (with the quotes).
fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_path(p: &Path) -> String {
    toml_str(&p.to_string_lossy())
}

/// The configuration format a containerd binary reads: the top-level `version` of `containerd config
/// default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigVersion {
    /// containerd 1.5–1.7: one CRI plugin `io.containerd.grpc.v1.cri`.
    V2,
    /// containerd 2.0/2.1: the CRI plugin split into `io.containerd.cri.v1.images` and
    /// `io.containerd.cri.v1.runtime`.
    V3,
    /// containerd 2.2 and later: as version 3, with the socket addresses in the
    /// `io.containerd.server.v1.grpc` / `.ttrpc` plugins.
    V4,
}

impl ConfigVersion {
    /// The version for the number `containerd config default` prints; `None` for one nodelet cannot write.
    pub fn from_number(n: u64) -> Option<Self> {
        match n {
            2 => Some(ConfigVersion::V2),
            3 => Some(ConfigVersion::V3),
            4 => Some(ConfigVersion::V4),
            _ => None,
        }
    }

    /// The number written as `version = N`.
    pub fn number(self) -> u32 {
        match self {
            ConfigVersion::V2 => 2,
            ConfigVersion::V3 => 3,
            ConfigVersion::V4 => 4,
        }
    }
}

/// How long `containerd config default` may take.
pub const CONFIG_DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The top-level `version = N` of a containerd configuration (keys before the first table; containerd 1.6
/// prints other keys first, 2.x prints the version on the first line). `None` when there is none.
pub fn parse_config_version(config: &str) -> Option<u64> {
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            return None;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        if key.trim() == "version" {
            let value = value.split('#').next().unwrap_or("").trim();
            return value.parse().ok();
        }
    }
    None
}

/// The configuration version `containerd` reads: runs `<containerd> config default` (with a timeout) and
/// parses its top-level `version`.
pub async fn detect_config_version(containerd: &Path) -> Result<ConfigVersion> {
    let fail = |reason: String| ContainerdError::ConfigVersion { path: containerd.to_owned(), reason };
    let mut cmd = Command::new(containerd);
    cmd.args(["config", "default"]).stdin(Stdio::null()).kill_on_drop(true);
    let output = match timeout(CONFIG_DEFAULT_TIMEOUT, cmd.output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(fail(format!("cannot run `config default`: {e}"))),
        Err(_) => {
            return Err(fail(format!("`config default` did not finish within {CONFIG_DEFAULT_TIMEOUT:?}")));
        }
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr.trim().chars().take(500).collect();
        return Err(fail(format!("`config default` failed ({}): {tail}", output.status)));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    match parse_config_version(&text) {
        Some(n) => ConfigVersion::from_number(n).ok_or_else(|| {
            fail(format!(
                "it reads config version {n}; nodelet writes versions 2 (containerd 1.6/1.7), 3 and 4 (2.x)"
            ))
        }),
        None => Err(fail("`config default` printed no top-level `version`".into())),
    }
}

/// The containerd configuration for `cfg` in the format `version` (see the module docs). Same settings as
/// `scripts/containerd-config.sh --config-version N`.
pub fn render_config(cfg: &EmbeddedContainerdConfig, version: ConfigVersion) -> String {
    let d = &cfg.dir;
    let socket = cfg.socket_path();
    let ttrpc = PathBuf::from(format!("{}.ttrpc", socket.display()));
    let imports = match &cfg.config_extra {
        Some(p) => format!("imports = [{}]\n", toml_path(p)),
        None => String::new(),
    };
    let binary_name = match &cfg.runc_path {
        Some(p) => format!("\n        BinaryName = {}", toml_path(p)),
        None => String::new(),
    };
    let root = toml_path(&d.join("root"));
    let state = toml_path(&d.join("state"));
    let socket = toml_path(&socket);
    let ttrpc = toml_path(&ttrpc);
    let level = toml_str(&cfg.log_level);
    let opt = toml_path(&d.join("opt"));
    let sandbox = toml_str(&cfg.sandbox_image);
    let cni_bin = toml_path(&cfg.cni_bin_dir);
    let cni_conf = toml_path(&cfg.cni_conf_dir);
    let runc = toml_path(&d.join("runc"));
    let certs = toml_path(&d.join("certs.d"));
    let (grpc, ttrpc_table) = match version {
        ConfigVersion::V2 => {
            return render_config_v2(&RenderV2 {
                imports,
                binary_name,
                root,
                state,
                socket,
                ttrpc,
                level,
                opt,
                sandbox,
                cni_bin,
                cni_conf,
                runc,
                certs,
            });
        }
        ConfigVersion::V3 => ("[grpc]", "[ttrpc]"),
        ConfigVersion::V4 => {
            ("[plugins.\"io.containerd.server.v1.grpc\"]", "[plugins.\"io.containerd.server.v1.ttrpc\"]")
        }
    };
    let n = version.number();
    format!(
        r#"# generated by nodelet at every start (containerd 2.x); do not edit: use --containerd-config-extra
version = {n}
root = {root}
state = {state}
oom_score = 0
{imports}
{grpc}
  address = {socket}
  uid = 0
  gid = 0

{ttrpc_table}
  address = {ttrpc}

[debug]
  level = {level}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  discard_unpacked_layers = false
  stats_collect_period = 10

  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {sandbox}

  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {certs}

[plugins."io.containerd.cri.v1.runtime"]
  # pod network namespaces are bind-mounted under the state dir, not /var/run/netns
  netns_mounts_under_state_dir = true
  # The target machines' root lacks CAP_SYS_RESOURCE: runc cannot set the negative oom_score_adj CRI gives
  # sandboxes (-998), so clamp every oom_score_adj to >= containerd's own (0).
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{cni_bin}]
    conf_dir = {cni_conf}
    max_conf_num = 1

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        # cgroupfs driver (no systemd on the target machines)
        SystemdCgroup = false
        Root = {runc}{binary_name}

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

# image pulls through the transfer service read the same registry hosts
[plugins."io.containerd.transfer.v1.local"]
  config_path = {certs}
"#
    )
}

/// The rendered values of a version 2 configuration.
struct RenderV2 {
    imports: String,
    binary_name: String,
    root: String,
    state: String,
    socket: String,
    ttrpc: String,
    level: String,
    opt: String,
    sandbox: String,
    cni_bin: String,
    cni_conf: String,
    runc: String,
    certs: String,
}

/// Version 2 (containerd 1.6/1.7): one CRI plugin.
fn render_config_v2(v: &RenderV2) -> String {
    let RenderV2 {
        imports,
        binary_name,
        root,
        state,
        socket,
        ttrpc,
        level,
        opt,
        sandbox,
        cni_bin,
        cni_conf,
        runc,
        certs,
    } = v;
    format!(
        r#"# generated by nodelet at every start; do not edit: use --containerd-config-extra (merged over this)
version = 2
root = {root}
state = {state}
oom_score = 0
{imports}
[grpc]
  address = {socket}
  uid = 0
  gid = 0

[ttrpc]
  address = {ttrpc}

[debug]
  level = {level}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {sandbox}
  # pod network namespaces are bind-mounted under the state dir, not /var/run/netns
  netns_mounts_under_state_dir = true
  systemd_cgroup = false
  disable_tcp_service = true
  # The target machines' root lacks CAP_SYS_RESOURCE: runc cannot set the negative oom_score_adj CRI gives
  # sandboxes (-998), so clamp every oom_score_adj to >= containerd's own (0).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  stats_collect_period = 10
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs driver (no systemd on the target machines)
        SystemdCgroup = false
        Root = {runc}{binary_name}

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {certs}
"#
    )
}

/// The generated CNI network configuration (JSON).
pub fn render_cni_conflist(net: &CniNetwork) -> String {
    let v = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": net.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": net.ipam_dir,
                    "ranges": [[{ "subnet": net.subnet.to_string(), "gateway": net.subnet.first_host().to_string() }]]
                }
            },
            { "type": "portmap", "capabilities": { "portMappings": true }, "snat": false }
        ]
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

/// `hosts.toml` for a registry reached over plain HTTP.
pub fn render_registry_hosts(host: &str) -> String {
    format!(
        "# generated by nodelet\nserver = {server}\n\n[host.{server}]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n",
        server = toml_str(&format!("http://{host}"))
    )
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ContainerdError + 'a {
    move |source| ContainerdError::Io { action, path: path.to_owned(), source }
}

/// Writes `content` to `path` (atomically) unless it already holds exactly that. Returns whether it wrote.
fn write_if_changed(path: &Path, content: &str) -> Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == content.as_bytes()) {
        return Ok(false);
    }
    crate::atomic::write_atomically(path, content.as_bytes(), 0o644).map_err(|e| ContainerdError::Io {
        action: "write",
        path: e.path,
        source: e.source,
    })?;
    Ok(true)
}

/// Checks the settings and writes the configuration files: containerd's config (in the format `version`),
/// registry hosts and (when the directory has no other network) the CNI network.
pub fn prepare(cfg: &EmbeddedContainerdConfig, version: ConfigVersion) -> Result<()> {
    let socket = cfg.socket_path();
    let ttrpc_len = socket.as_os_str().len() + ".ttrpc".len();
    if ttrpc_len > SOCKET_PATH_MAX {
        return Err(ContainerdError::SocketPathTooLong { path: socket, len: ttrpc_len });
    }
    if cfg.sandbox_image.is_empty() || cfg.sandbox_image.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ContainerdError::Invalid {
            what: "sandbox image",
            value: cfg.sandbox_image.clone(),
            reason: "not an image reference",
        });
    }
    for dir in [
        cfg.dir.clone(),
        cfg.dir.join("root"),
        cfg.dir.join("state"),
        cfg.dir.join("opt"),
        cfg.dir.join("runc"),
        cfg.dir.join("certs.d"),
        cfg.cni_conf_dir.clone(),
    ] {
        std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
    }
    std::fs::set_permissions(&cfg.dir, std::fs::Permissions::from_mode(0o711))
        .map_err(io_err("set permissions of", &cfg.dir))?;
    for host in &cfg.plain_http_registries {
        let valid = !host.is_empty()
            && host.len() <= 255
            && host.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c));
        if !valid {
            return Err(ContainerdError::Invalid {
                what: "registry host",
                value: host.clone(),
                reason: "expected HOST:PORT",
            });
        }
        let dir = cfg.dir.join("certs.d").join(host);
        std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        write_if_changed(&dir.join("hosts.toml"), &render_registry_hosts(host))?;
    }
    if let Some(net) = &cfg.cni_network {
        ensure_cni_network(&cfg.cni_conf_dir, net)?;
    }
    if let Some(runc) = &cfg.runc_path
        && !runc.is_absolute()
    {
        return Err(ContainerdError::Invalid {
            what: "runc path",
            value: runc.to_string_lossy().into_owned(),
            reason: "must be an absolute path",
        });
    }
    if write_if_changed(&cfg.config_path(), &render_config(cfg, version))? {
        info!(path = %cfg.config_path().display(), version = version.number(), "wrote containerd configuration");
    }
    Ok(())
}

/// Writes the generated network into `conf_dir` unless another network configuration is there; in that case
/// a previously generated one is removed, so the operator's network is the one containerd loads.
fn ensure_cni_network(conf_dir: &Path, net: &CniNetwork) -> Result<()> {
    let ours = conf_dir.join(CNI_CONFLIST_NAME);
    let entries = std::fs::read_dir(conf_dir).map_err(io_err("read directory", conf_dir))?;
    let mut others = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("read directory", conf_dir))?;
        let path = entry.path();
        let is_conf = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "conf" | "conflist" | "json"));
        if is_conf && path != ours {
            others.push(path);
        }
    }
    if !others.is_empty() {
        others.sort();
        info!(files = ?others, "using the CNI network configuration found in {}", conf_dir.display());
        if ours.exists() {
            std::fs::remove_file(&ours).map_err(io_err("remove", &ours))?;
        }
        return Ok(());
    }
    std::fs::create_dir_all(&net.ipam_dir).map_err(io_err("create directory", &net.ipam_dir))?;
    if write_if_changed(&ours, &render_cni_conflist(net))? {
        info!(path = %ours.display(), bridge = %net.bridge, subnet = %net.subnet, "wrote CNI network configuration");
    }
    Ok(())
}

/// The last lines (at most ~4 KiB) of a log file.
fn log_tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::from("(no log)") };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn describe_exit(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("wait failed: {e}"),
    }
}

/// Whether a process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) -> std::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid pid"))?;
    rustix::process::kill_process(pid, sig).map_err(std::io::Error::from)
}

/// Pids of containerd processes started with `config` (left by a nodelet that died without stopping them).
fn find_stale(config: &Path) -> Vec<u32> {
    let want = config.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        if !cmdline.split(|b| *b == 0).any(|arg| arg == want) {
            continue;
        }
        let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
        let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.trim_end_matches(" (deleted)") == "containerd" && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Stops a process that is not our child: SIGTERM, wait, SIGKILL.
async fn stop_foreign(pid: u32, config: &Path, grace: Duration) -> Result<()> {
    warn!(pid, "stopping a containerd left running by a previous nodelet");
    if let Err(e) = signal(pid, rustix::process::Signal::TERM) {
        if !alive(pid) {
            return Ok(());
        }
        return Err(ContainerdError::Stale {
            pid,
            config: config.to_owned(),
            reason: format!("SIGTERM: {e}"),
        });
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !alive(pid) {
            return Ok(());
        }
        sleep(READY_POLL).await;
    }
    warn!(pid, "containerd did not stop within {grace:?}, sending SIGKILL");
    let _ = signal(pid, rustix::process::Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !alive(pid) {
            return Ok(());
        }
        sleep(READY_POLL).await;
    }
    Err(ContainerdError::Stale { pid, config: config.to_owned(), reason: "it survived SIGKILL".into() })
}

/// Starts containerd once (log file prepared, stale sockets removed); does not wait for readiness.
fn spawn(cfg: &EmbeddedContainerdConfig, containerd: &Path, start_no: u32) -> Result<Child> {
    let log_path = cfg.log_path();
    if std::fs::metadata(&log_path).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
        let old = cfg.dir.join("containerd.log.1");
        std::fs::rename(&log_path, &old).map_err(io_err("rotate", &log_path))?;
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io_err("open", &log_path))?;
    let now = crate::wall_clock();
    writeln!(log, "\n=== {now} nodelet: starting {} (start #{start_no})", containerd.display())
        .map_err(io_err("write", &log_path))?;
    let log2 = log.try_clone().map_err(io_err("open", &log_path))?;
    let socket = cfg.socket_path();
    for s in [socket.clone(), PathBuf::from(format!("{}.ttrpc", socket.display()))] {
        match std::fs::remove_file(&s) {
            Ok(()) => debug!(path = %s.display(), "removed stale socket"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ContainerdError::Io { action: "remove stale socket", path: s, source: e }),
        }
    }
    let mut cmd = Command::new(containerd);
    if let Some(path) = child_path(containerd) {
        cmd.env("PATH", path);
    }
    cmd.arg("--config")
        .arg(cfg.config_path())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2))
        .process_group(0)
        .kill_on_drop(true);
    let child =
        cmd.spawn().map_err(|source| ContainerdError::Spawn { path: containerd.to_owned(), source })?;
    if let Some(pid) = child.id() {
        let pid_path = cfg.pid_path();
        std::fs::write(&pid_path, format!("{pid}\n")).map_err(io_err("write", &pid_path))?;
        info!(pid, log = %log_path.display(), "started containerd");
    }
    Ok(child)
}

/// containerd's PATH: the binary's own directory first (containerd finds its shim there, and the shim finds
/// runc on the same PATH), then nodelet's PATH. `None` when the directory is already first.
fn child_path(containerd: &Path) -> Option<std::ffi::OsString> {
    let dir = containerd.parent().filter(|d| !d.as_os_str().is_empty())?;
    let current = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&current).collect();
    if dirs.first().is_some_and(|d| d == dir) {
        return None;
    }
    dirs.insert(0, dir.to_owned());
    std::env::join_paths(dirs).ok()
}

/// The ctr for image imports: a bare name is looked up in containerd's directory first (the ctr of the same
/// release), then on PATH.
fn find_ctr(ctr: &Path, containerd: &Path) -> Option<PathBuf> {
    if ctr.components().count() == 1
        && let Some(beside) = containerd.parent().map(|d| d.join(ctr))
        && let Some(found) = find_executable(&beside)
    {
        return Some(found);
    }
    find_executable(ctr)
}

/// Waits until containerd answers CRI `Version`, or fails if it exits or the timeout passes.
async fn wait_ready(cfg: &EmbeddedContainerdConfig, child: &mut Child) -> Result<String> {
    let started = Instant::now();
    let socket = cfg.socket_path();
    let mut last_error = String::from("socket not created yet");
    loop {
        if let Some(status) = child.try_wait().map_err(io_err("wait for", &cfg.containerd_path))? {
            return Err(ContainerdError::ExitedDuringStartup {
                status: status.to_string(),
                log: cfg.log_path(),
                tail: log_tail(&cfg.log_path()),
            });
        }
        if socket.exists() {
            let cri_cfg = CriConfig::new(cfg.endpoint())
                .with_connect_timeout(Duration::from_secs(2))
                .with_runtime_request_timeout(Duration::from_secs(5));
            match CriClient::connect(cri_cfg).await {
                Ok(client) => match client.version().await {
                    Ok(v) => return Ok(format!("{} {}", v.runtime_name, v.runtime_version)),
                    Err(e) => last_error = e.to_string(),
                },
                Err(e) => last_error = e.to_string(),
            }
        }
        if started.elapsed() >= cfg.ready_timeout {
            return Err(ContainerdError::NotReady {
                after: cfg.ready_timeout,
                last_error,
                log: cfg.log_path(),
                tail: log_tail(&cfg.log_path()),
            });
        }
        sleep(READY_POLL).await;
    }
}

/// Stops our child: SIGTERM, wait up to `grace`, SIGKILL.
async fn stop_child(child: &mut Child, grace: Duration) {
    let Some(pid) = child.id() else { return };
    info!(pid, "stopping containerd");
    if let Err(e) = signal(pid, rustix::process::Signal::TERM) {
        warn!(pid, error = %e, "cannot send SIGTERM to containerd");
    }
    match timeout(grace, child.wait()).await {
        Ok(status) => info!(pid, status = %describe_exit(status), "containerd stopped"),
        Err(_) => {
            warn!(pid, "containerd did not stop within {grace:?}, sending SIGKILL");
            if let Err(e) = child.kill().await {
                warn!(pid, error = %e, "cannot kill containerd");
            }
        }
    }
}

/// Starts containerd and waits for it; kills it if it does not become ready.
async fn start_once(
    cfg: &EmbeddedContainerdConfig,
    containerd: &Path,
    start_no: u32,
) -> Result<(Child, String)> {
    let mut child = spawn(cfg, containerd, start_no)?;
    match wait_ready(cfg, &mut child).await {
        Ok(version) => Ok((child, version)),
        Err(e) => {
            stop_child(&mut child, Duration::from_secs(2)).await;
            Err(e)
        }
    }
}

/// What the supervisor reports about containerd.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerdStatus {
    /// The running containerd's pid; `None` while it is down.
    pub pid: Option<u32>,
    /// Whether it answered CRI `Version` since it was (re)started.
    pub ready: bool,
    /// How many times it was restarted after exiting.
    pub restarts: u32,
    /// How the last containerd exited.
    pub last_exit: Option<String>,
}

/// A running containerd, supervised by the [`ContainerdSupervision`] its caller runs. Stop it with
/// [`Self::shutdown`]; dropping it stops it too (the supervision stops containerd and ends).
#[derive(Debug)]
pub struct EmbeddedContainerd {
    endpoint: String,
    socket: PathBuf,
    pid_path: PathBuf,
    status: watch::Receiver<ContainerdStatus>,
    stop: Option<oneshot::Sender<()>>,
    /// Resolves when the supervision has stopped containerd.
    done: Option<oneshot::Receiver<()>>,
}

/// The supervision of a started containerd: restarts it with back-off when it exits, stops it when
/// [`EmbeddedContainerd::shutdown`] asks (or the handle is dropped), then ends. The caller runs it (spawns
/// it) from [`EmbeddedContainerd::start`] until then.
pub struct ContainerdSupervision(Pin<Box<dyn Future<Output = ()> + Send + 'static>>);

impl std::fmt::Debug for ContainerdSupervision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ContainerdSupervision")
    }
}

impl Future for ContainerdSupervision {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl EmbeddedContainerd {
    /// Writes the configuration, stops a containerd left by a previous nodelet, starts containerd, waits until
    /// it answers CRI `Version` and imports the preload images. Returns the handle and the supervision, which
    /// the caller runs from then on (until [`shutdown`](Self::shutdown) has returned).
    pub async fn start(cfg: EmbeddedContainerdConfig) -> Result<(Self, ContainerdSupervision)> {
        let containerd = find_executable(&cfg.containerd_path).ok_or_else(|| ContainerdError::NotFound {
            what: "containerd",
            path: cfg.containerd_path.clone(),
        })?;
        let version = detect_config_version(&containerd).await?;
        prepare(&cfg, version)?;
        for pid in find_stale(&cfg.config_path()) {
            stop_foreign(pid, &cfg.config_path(), cfg.stop_timeout).await?;
        }
        let (mut child, version) = start_once(&cfg, &containerd, 1).await?;
        let pid = child.id();
        info!(pid, endpoint = %cfg.endpoint(), runtime = %version, "containerd is ready");
        if let Some(dir) = &cfg.preload_images {
            let imported = match find_ctr(&cfg.ctr_path, &containerd) {
                Some(ctr) => import_images(&ctr, &cfg.socket_path(), dir).await,
                None => Err(ContainerdError::NotFound { what: "ctr", path: cfg.ctr_path.clone() }),
            };
            if let Err(e) = imported {
                stop_child(&mut child, cfg.stop_timeout).await;
                return Err(e);
            }
        }
        let (status_tx, status) =
            watch::channel(ContainerdStatus { pid, ready: true, restarts: 0, last_exit: None });
        let (stop, stop_rx) = oneshot::channel();
        let endpoint = cfg.endpoint();
        let socket = cfg.socket_path();
        let pid_path = cfg.pid_path();
        let (done_tx, done) = oneshot::channel();
        let supervision = ContainerdSupervision(Box::pin(async move {
            supervise(cfg, containerd, child, status_tx, stop_rx).await;
            let _ = done_tx.send(());
        }));
        let handle =
            EmbeddedContainerd { endpoint, socket, pid_path, status, stop: Some(stop), done: Some(done) };
        Ok((handle, supervision))
    }

    /// The CRI endpoint: `unix://<root-dir>/containerd/containerd.sock`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The current status.
    pub fn status(&self) -> ContainerdStatus {
        self.status.borrow().clone()
    }

    /// A receiver that sees every status change (e.g. for node readiness and metrics).
    pub fn watch_status(&self) -> watch::Receiver<ContainerdStatus> {
        self.status.clone()
    }

    /// Stops containerd (SIGTERM, then SIGKILL after the stop timeout) and waits until the supervision has
    /// (it must be running). Running containers keep running (their shims are independent of containerd).
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            done.await.map_err(|_| {
                ContainerdError::Task(
                    "it ended before stopping containerd (it panicked or was not run)".into(),
                )
            })?;
        }
        for p in [
            self.socket.clone(),
            PathBuf::from(format!("{}.ttrpc", self.socket.display())),
            self.pid_path.clone(),
        ] {
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }
}

impl Drop for EmbeddedContainerd {
    fn drop(&mut self) {
        // the supervisor sees the closed channel and stops containerd
        drop(self.stop.take());
    }
}

/// Watches the child; restarts it with back-off when it exits; stops it when asked (or when the handle is
/// dropped).
async fn supervise(
    cfg: EmbeddedContainerdConfig,
    containerd: PathBuf,
    mut child: Child,
    status: watch::Sender<ContainerdStatus>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut started_at = Instant::now();
    let mut delay = cfg.restart_backoff_initial;
    let mut starts: u32 = 1;
    loop {
        tokio::select! {
            _ = &mut stop => {
                stop_child(&mut child, cfg.stop_timeout).await;
                status.send_modify(|s| { s.pid = None; s.ready = false; });
                return;
            }
            exit = child.wait() => {
                let exit = describe_exit(exit);
                if started_at.elapsed() >= cfg.healthy_after {
                    delay = cfg.restart_backoff_initial;
                }
                warn!(status = %exit, log = %cfg.log_path().display(), restart_in = ?delay,
                      "containerd exited; restarting it");
                status.send_modify(|s| { s.pid = None; s.ready = false; s.last_exit = Some(exit); });
            }
        }
        // restart with back-off until one start succeeds or we are asked to stop
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = sleep(delay) => {}
            }
            delay = (delay * 2).min(cfg.restart_backoff_max);
            starts += 1;
            let attempt = tokio::select! {
                _ = &mut stop => return,
                r = start_once(&cfg, &containerd, starts) => r,
            };
            status.send_modify(|s| s.restarts += 1);
            match attempt {
                Ok((new_child, version)) => {
                    child = new_child;
                    started_at = Instant::now();
                    let pid = child.id();
                    info!(pid, runtime = %version, "containerd is ready again");
                    status.send_modify(|s| {
                        s.pid = pid;
                        s.ready = true;
                    });
                    break;
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?delay, "containerd restart failed");
                }
            }
        }
    }
}

/// Imports every `*.tar` image archive (OCI or docker format) in `dir`, in name order, into containerd's
/// `k8s.io` namespace with `ctr images import` (unpacked for the overlayfs snapshotter, so CRI can use them),
/// then waits (at most [`IMPORT_VISIBLE_TIMEOUT`]) until CRI `ListImages` shows every named image of the
/// namespace: containerd 2.x's CRI plugin learns of imported images asynchronously, and a pod started
/// before would try to pull its image. Returns the archives imported.
pub async fn import_images(ctr: &Path, socket: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(io_err("read directory", dir))?;
    let mut archives = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("read directory", dir))?;
        let path = entry.path();
        let is_tar = path.extension().is_some_and(|e| e == "tar");
        // symlinks to archives are fine (the operator put them there); directories are not
        if is_tar && std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            archives.push(path);
        }
    }
    archives.sort();
    if archives.is_empty() {
        warn!(dir = %dir.display(), "no *.tar image archives to preload");
    }
    for archive in &archives {
        let started = Instant::now();
        let mut cmd = Command::new(ctr);
        cmd.arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(archive)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = match timeout(IMPORT_TIMEOUT, cmd.output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                return Err(ContainerdError::Import { archive: archive.clone(), message: e.to_string() });
            }
            Err(_) => {
                return Err(ContainerdError::Import {
                    archive: archive.clone(),
                    message: format!("timed out after {IMPORT_TIMEOUT:?}"),
                });
            }
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(ContainerdError::Import {
                archive: archive.clone(),
                message: format!("ctr {}: {}", output.status, stderr.trim()),
            });
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        info!(archive = %archive.display(), took = ?started.elapsed(), images = %stdout.trim().replace('\n', "; "),
              "imported image archive");
    }
    if !archives.is_empty() {
        wait_until_cri_shows_images(ctr, socket).await;
    }
    Ok(archives)
}

/// Waits until CRI `ListImages` has, as a tag or digest reference, every image name `ctr images ls -q` lists
/// in namespace `k8s.io` (names that are bare `sha256:` IDs aside). Logs a warning and returns when that does
/// not happen within [`IMPORT_VISIBLE_TIMEOUT`] (pods whose image is missing then pull it).
async fn wait_until_cri_shows_images(ctr: &Path, socket: &Path) {
    let mut cmd = Command::new(ctr);
    cmd.arg("--address").arg(socket).args(["--namespace", "k8s.io", "images", "ls", "-q"]);
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let names: Vec<String> = match timeout(IMPORT_TIMEOUT, cmd.output()).await {
        Ok(Ok(o)) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty() && !n.starts_with("sha256:"))
            .map(str::to_owned)
            .collect(),
        other => {
            warn!(result = ?other.map(|r| r.map(|o| o.status)), "cannot list the imported images with ctr");
            return;
        }
    };
    let endpoint = format!("unix://{}", socket.display());
    let cri = match CriClient::connect(CriConfig::new(&endpoint)).await {
        Ok(cri) => cri,
        Err(e) => {
            warn!(error = %e, "cannot ask CRI for the imported images");
            return;
        }
    };
    let started = Instant::now();
    let mut missing = names.clone();
    while started.elapsed() < IMPORT_VISIBLE_TIMEOUT {
        if let Ok(images) = cri.list_images(None).await {
            let known: std::collections::HashSet<&str> = images
                .iter()
                .flat_map(|i| i.repo_tags.iter().chain(i.repo_digests.iter()))
                .map(String::as_str)
                .collect();
            missing.retain(|n| !known.contains(n.as_str()));
            if missing.is_empty() {
                debug!(images = names.len(), waited = ?started.elapsed(), "CRI shows the imported images");
                return;
            }
        }
        sleep(READY_POLL).await;
    }
    warn!(
        ?missing,
        "CRI does not show these imported images after {IMPORT_VISIBLE_TIMEOUT:?}: pods will pull them"
    );
}

#[cfg(test)]
mod tests;

//! nodelet's configuration (crate `nodelet-config`): the daemon's command line ([`cli`]) and a
//! KubeletConfiguration file, merged into one validated [`Config`]. The daemon (crate `nodelet`) reads it as
//! `nodelet::config` and `nodelet::cli`; this crate depends on no daemon code, only on the crates whose
//! value syntaxes it checks (quantities and Pod Security levels of `nodelet-resources`, CRI endpoints of
//! `nodelet-cri`, pod CIDRs and containerd defaults of `nodelet-node`, LVM names of `nodelet-storage`) and on
//! `nodelet-shared` (YAML, Go durations, the `-v` flag). The defaults and limits the daemon's parts share with
//! it are constants here (e.g. [`MAX_STREAMING_SESSIONS`], [`DEFAULT_STREAMING_IDLE_TIMEOUT`], [`LogFormat`]);
//! what a part derives from the configuration (the pod sources' security policies) is that part's code.
//!
//! Precedence is the kubelet's: a flag given explicitly wins over the file's field, which wins over the
//! default. Field names are the kubelet's (kubelet.config.k8s.io/v1beta1); nodelet's own settings sit under
//! the file's top-level `nodelet:` key. Every field nodelet does not act on is reported as a
//! [`ConfigWarning`]: unknown fields (typos), kubelet fields nodelet ignores, and fields parsed now but
//! enforced only by later work ([`NOT_YET_ENFORCED`]). A value of the wrong type or out of range is a
//! [`ConfigError`] naming the field (or flag) and the file.
//!
//! Relative paths are resolved like the kubelet does: in the file, against the file's directory; on the
//! command line, against the current directory.
//!
//! The stages, raw to validated, one section at a time: [`ConfigFile::parse`] reads the file into its raw
//! form (`raw.rs`, every field optional) and collects the warnings about unknown and ignored fields;
//! [`Config::resolve`] puts the flags ([`cli::RunArgs`]) over it and builds each section of [`Config`] with
//! one `Merger` method per section (`sections.rs`; cluster mode and the pods' DNS in `cluster_mode.rs`),
//! which validates its values and returns the section or a [`ConfigError`]. The value checkers return
//! [`ValueError`] (and `cluster_mode`'s own error types), which `Merger` wraps into [`ConfigError::Invalid`]
//! with the flag or field the value came from. Value syntaxes shared with the kubelet (Go durations,
//! quantities) are in [`units`]; `/configz`'s view of the result is in [`configz`].

pub mod cli;
mod cluster_mode;
pub mod configz;
mod raw;
mod sections;
pub mod units;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use cluster_mode::check_node_label;
#[cfg(test)]
pub use units::format_go_duration;
pub use units::{GoDuration, ThresholdValue, parse_go_duration, parse_quantity};

use nodelet_resources::pod::security::Level;

use crate::cli::RunArgs;
use nodelet_shared::yaml;
use raw::{KUBELET_FIELDS, RawBackOff, RawKubeletConfiguration};
use sections::Periods;

/// The only accepted `apiVersion`.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only accepted `kind`.
pub const KIND: &str = "KubeletConfiguration";

/// `--root-dir`: nodelet's state (like the kubelet's /var/lib/kubelet).
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/nodelet";
/// `address`: the main and read-only ports listen on every address, like the kubelet.
pub const DEFAULT_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
/// `port`: the kubelet's HTTPS port.
pub const DEFAULT_PORT: u16 = 10250;
/// `readOnlyPort`: disabled, as in the kubelet's config-file defaults (10255 when enabled by convention).
pub const DEFAULT_READ_ONLY_PORT: u16 = 0;
/// `healthzPort`.
pub const DEFAULT_HEALTHZ_PORT: u16 = 10248;
/// `healthzBindAddress`: loopback only.
pub const DEFAULT_HEALTHZ_BIND_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// `authentication.webhook.cacheTTL`: the kubelet's 2m.
pub const DEFAULT_TOKEN_WEBHOOK_CACHE_TTL: Duration = Duration::from_secs(120);
/// `authorization.webhook.cacheAuthorizedTTL`: the kubelet's 5m.
pub const DEFAULT_AUTHORIZED_CACHE_TTL: Duration = Duration::from_secs(300);
/// `authorization.webhook.cacheUnauthorizedTTL`: the kubelet's 30s.
pub const DEFAULT_UNAUTHORIZED_CACHE_TTL: Duration = Duration::from_secs(30);
/// `resolvConf`.
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
/// The one namespace pods of the manifest URL, the HTTP endpoint and untrusted files may use by default
/// (`nodelet.httpPodNamespaces`).
pub const DEFAULT_HTTP_POD_NAMESPACE: &str = "default";
/// `runtimeRequestTimeout`: the kubelet's 2m.
pub const DEFAULT_RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// `syncFrequency`: the kubelet's 1m.
pub const DEFAULT_SYNC_FREQUENCY: Duration = Duration::from_secs(60);
/// `fileCheckFrequency`: the kubelet's 20s.
pub const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// `httpCheckFrequency`: the kubelet's 20s.
pub const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// `podLogsDir`.
pub const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";
/// `volumeStatsAggPeriod`: the kubelet's 1 minute.
pub const DEFAULT_VOLUME_STATS_AGG_PERIOD: Duration = Duration::from_secs(60);
/// `maxPods`: the kubelet's 110.
pub const DEFAULT_MAX_PODS: u32 = 110;
/// `nodelet.podInfraContainerImage`: the pause image `scripts/build-images.sh` builds (no registry needed);
/// a node with registry access may use `registry.k8s.io/pause:3.9`.
pub const DEFAULT_POD_INFRA_CONTAINER_IMAGE: &str = "localhost/nodelet/pause:3.9";
#[cfg(test)]
/// `podCIDR` of the embedded runtime's bridge network: RFC 2544's benchmark range, unlikely to clash with a
/// real network.
pub const DEFAULT_POD_CIDR: &str = "198.18.0.0/16";
/// `nodelet.cniBridge`.
pub const DEFAULT_CNI_BRIDGE: &str = nodelet_node::containerd::DEFAULT_CNI_BRIDGE;
/// `nodelet.containerdPath`: looked up on PATH.
pub const DEFAULT_CONTAINERD_PATH: &str = nodelet_node::containerd::DEFAULT_CONTAINERD_PATH;
/// How often the PLEG relists the runtime: the kubelet's 1 s.
pub const DEFAULT_PLEG_RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How often the PLEG relists the runtime while the runtime's events come.
pub const DEFAULT_PLEG_EVENTED_RELIST_PERIOD: Duration =
    nodelet_resources::pod::pleg::DEFAULT_EVENTED_RELIST_PERIOD;
/// `nodelet.housekeepingInterval`: how often the stats behind `/stats/summary` are gathered (the
/// kubelet's `--housekeeping-interval`, 10 s).
pub const DEFAULT_HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);
/// Container restart back-off: the kubelet's 10s, doubling up to 300s, forgotten after 10 minutes.
pub const DEFAULT_CONTAINER_RESTART_BACKOFF: BackOff = BackOff {
    initial: Duration::from_secs(10),
    max: Duration::from_secs(300),
    reset_after: Duration::from_secs(600),
};
/// Image pull back-off: the kubelet's 10s to 300s.
pub const DEFAULT_IMAGE_PULL_BACKOFF: BackOff = BackOff {
    initial: Duration::from_secs(10),
    max: Duration::from_secs(300),
    reset_after: Duration::from_secs(600),
};
/// `evictionPressureTransitionPeriod`: 5m.
pub const DEFAULT_EVICTION_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// `imageGCHighThresholdPercent`.
pub const DEFAULT_IMAGE_GC_HIGH_THRESHOLD_PERCENT: u8 = 85;
/// `imageGCLowThresholdPercent`.
pub const DEFAULT_IMAGE_GC_LOW_THRESHOLD_PERCENT: u8 = 80;
/// `imageMinimumGCAge`: 2m.
pub const DEFAULT_IMAGE_MINIMUM_GC_AGE: Duration = Duration::from_secs(120);
/// `containerLogMaxSize`: 10Mi.
pub const DEFAULT_CONTAINER_LOG_MAX_SIZE: u64 = 10 << 20;
/// `containerLogMaxFiles`.
pub const DEFAULT_CONTAINER_LOG_MAX_FILES: u32 = 5;
/// `containerLogMonitorInterval`: the kubelet's 10 s.
pub const DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL: Duration = Duration::from_secs(10);
/// The shortest `containerLogMonitorInterval` the kubelet accepts.
const MIN_CONTAINER_LOG_MONITOR_INTERVAL: Duration = Duration::from_secs(3);
/// The kubelet's Linux `evictionHard` defaults.
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];
/// Eviction signals the kubelet knows.
pub const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];
/// `nodelet.imageGCPeriod`: how often image garbage collection runs (the kubelet's fixed 5m).
pub const DEFAULT_IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);
/// `nodelet.evictionMonitoringPeriod`: how often the eviction pair samples the signals (the
/// kubelet's fixed 10s housekeeping interval).
pub const DEFAULT_EVICTION_MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// `nodelet.localStorageEntryBudget`: directory entries the local storage measurement examines per
/// pass, in all (a few hundred milliseconds of `fstatat` at most); a walk it cuts short resumes on the
/// next pass.
pub const DEFAULT_LOCAL_STORAGE_ENTRY_BUDGET: u64 = 200_000;
/// `registerNode`: the kubelet registers its node by default.
pub const DEFAULT_REGISTER_NODE: bool = true;
/// `kubeAPIQPS`: the kubelet's 50 (an explicit 0 means this default too).
pub const DEFAULT_KUBE_API_QPS: f64 = 50.0;
/// `kubeAPIBurst`: the kubelet's 100.
pub const DEFAULT_KUBE_API_BURST: u32 = 100;
/// `nodeStatusUpdateFrequency`: the kubelet's 10s.
pub const DEFAULT_NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
/// `nodeStatusReportFrequency`: the kubelet's 5m, unless `nodeStatusUpdateFrequency` is set explicitly
/// (then it is that).
pub const DEFAULT_NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
/// `nodeLeaseDurationSeconds`: the kubelet's 40.
pub const DEFAULT_NODE_LEASE_DURATION: Duration = Duration::from_secs(40);
/// `clusterDomain`: the kubelet's empty default (no cluster domain).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "";
/// Streaming sessions (exec, attach, port-forward) the servers hold open at once; more get 429. The upper
/// bound of `nodelet.maxStreamingSessionsPerUser`.
pub const MAX_STREAMING_SESSIONS: usize = 256;
/// `nodelet.maxStreamingSessionsPerUser`: half of [`MAX_STREAMING_SESSIONS`], so that no single identity can
/// hold every slot. The API server's sessions (every `kubectl exec`, `attach`, `port-forward` of the cluster)
/// come as one user, its kubelet client.
pub const DEFAULT_MAX_STREAMING_SESSIONS_PER_USER: usize = MAX_STREAMING_SESSIONS / 2;
/// `streamingConnectionIdleTimeout`: the kubelet's 4 h.
pub const DEFAULT_STREAMING_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// File fields nodelet parses and validates but does not act on yet; setting one gives a warning.
pub const NOT_YET_ENFORCED: &[&str] = &["serializeImagePulls", "maxParallelImagePulls"];

/// The validated configuration of the daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The `--config` file, if any.
    pub config_file: Option<PathBuf>,
    /// This node's name: `--hostname-override`, else the machine's hostname; lower-cased, a DNS subdomain.
    pub node_name: String,
    /// `--root-dir`: nodelet's state directory (absolute).
    pub root_dir: PathBuf,
    /// Where pods come from.
    pub sources: SourcesConfig,
    /// `syncFrequency`: maximum time between two syncs of a running pod.
    pub sync_frequency: Duration,
    /// `nodelet.plegRelistPeriod`: how often the runtime is relisted while its event stream is not
    /// connected (the kubelet's fixed 1 s).
    pub pleg_relist_period: Duration,
    /// `nodelet.plegEventedRelistPeriod`: how often the runtime is relisted while its event stream is
    /// connected (60 s, plus up to a tenth at random; the events make the PLEG read the pods they name
    /// in between). Never shorter than `plegRelistPeriod`.
    pub pleg_evented_relist_period: Duration,
    /// `nodelet.housekeepingInterval`: how often the pods' stats (`/stats/summary`, `/metrics/resource`)
    /// are gathered in the background (the kubelet's `--housekeeping-interval`, 10 s).
    pub housekeeping_interval: Duration,
    /// The HTTP(S) endpoints.
    pub server: ServerConfig,
    /// The container runtime.
    pub runtime: RuntimeConfig,
    /// Settings applied to every pod.
    pub pods: PodsConfig,
    /// Retry delays.
    pub backoff: BackOffConfig,
    /// Node-pressure eviction.
    pub eviction: EvictionConfig,
    /// Image garbage collection.
    pub image_gc: ImageGcConfig,
    /// Container log rotation.
    pub container_logs: ContainerLogConfig,
    /// Image pull parallelism (parsed; see [`NOT_YET_ENFORCED`]).
    pub image_pulls: ImagePullConfig,
    /// `nodelet.storage`: the volume provisioners.
    pub storage: StorageConfig,
    /// `nodelet.containerGC`: dead container garbage collection.
    pub container_gc: nodelet_resources::pod::gc::ContainerGcPolicy,
    /// Cluster mode: `Some` when `--kubeconfig` is given.
    pub cluster: Option<ClusterConfig>,
    /// How the daemon logs.
    pub logging: LoggingConfig,
}

/// `--logging-format` / `logging.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line (the daemon's `logging` module documents the fields).
    Json,
}

/// A log format that is neither `text` nor `json` (the kubelet's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unsupported value: {value:?}: supported values: {}", LogFormat::supported())]
pub struct UnsupportedFormat {
    /// The format asked for.
    pub value: String,
}

impl LogFormat {
    /// The formats, as the kubelet names them.
    pub const NAMES: [&'static str; 2] = ["json", "text"];

    /// `text` or `json`; anything else is refused with the kubelet's words.
    pub fn parse(s: &str) -> Result<Self, UnsupportedFormat> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnsupportedFormat { value: other.to_owned() }),
        }
    }

    /// The names, quoted and comma-separated, for messages.
    fn supported() -> String {
        let quoted: Vec<String> = Self::NAMES.iter().map(|n| format!("{n:?}")).collect();
        quoted.join(", ")
    }

    /// The name written in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// `logging:` / `--logging-format` and `-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoggingConfig {
    /// `logging.format` / `--logging-format`: `text` (default) or `json`.
    pub format: LogFormat,
    /// `logging.verbosity` / `-v`: `None` when neither is given (info).
    pub verbosity: Option<u8>,
}

/// How nodelet joins a Kubernetes cluster (`--kubeconfig` and the settings that go with it).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// `--kubeconfig` (absolute).
    pub kubeconfig: PathBuf,
    /// `--node-ip`: the node's InternalIP addresses (empty: detected).
    pub node_ips: Vec<IpAddr>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `registerNode`.
    pub register_node: bool,
    /// `registerWithTaints`.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `kubeAPIQPS`.
    pub kube_api_qps: f64,
    /// `kubeAPIBurst`.
    pub kube_api_burst: u32,
    /// `nodeStatusUpdateFrequency`.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`.
    pub node_lease_duration: Duration,
    /// `--bootstrap-kubeconfig` (absolute): TLS bootstrap when `kubeconfig` has no valid client certificate.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `rotateCertificates` (default false, the kubelet's): renew the client certificate before it expires.
    /// Rotation happens too whenever `bootstrap_kubeconfig` is given.
    pub rotate_certificates: bool,
    /// `serverTLSBootstrap` (default false): the main port's certificate comes from the cluster.
    pub server_tls_bootstrap: bool,
    /// Where the certificates from the cluster are kept: `<root-dir>/pki`.
    pub cert_dir: PathBuf,
}

/// `nodelet.storage`: where the provisioners put volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// `nodelet.storage.localPath.basePath`: the local-directory provisioner's directory.
    /// Default `<root-dir>/storage/local`.
    pub local_base_path: PathBuf,
    /// `nodelet.storage.lvm.volumeGroup`: the LVM provisioner's volume group. Default unset (no
    /// LVM provisioner).
    pub lvm_volume_group: Option<String>,
    /// `nodelet.storage.csi.pluginDir`: where CSI drivers register their sockets. Default
    /// `<root-dir>/plugins_registry`.
    pub csi_plugin_dir: PathBuf,
    /// `volumeStatsAggPeriod`: how often the `kubelet_volume_stats_*` of claim-backed volumes are
    /// measured again (they are also measured whenever volumes are set up or torn down). Default 1m.
    pub volume_stats_agg_period: Duration,
}

/// Pod sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcesConfig {
    /// `staticPodPath` / `--pod-manifest-path`: a directory or a file of manifests (absolute).
    pub static_pod_path: Option<PathBuf>,
    /// `staticPodURL` / `--manifest-url`: an http(s) URL.
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader` / `--manifest-url-header`: (name, value) pairs, in order; a name may repeat.
    pub static_pod_url_headers: Vec<(String, String)>,
    /// `fileCheckFrequency`.
    pub file_check_frequency: Duration,
    /// `httpCheckFrequency`.
    pub http_check_frequency: Duration,
    /// `--manifest-http-addr` / `nodelet.manifestHTTPAddress`: nodelet's manifest-accepting HTTP endpoint.
    pub manifest_http_addr: Option<SocketAddr>,
}

/// The HTTP(S) endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `enableServer`: serve the main port at all.
    pub enabled: bool,
    /// `address` / `--address`.
    pub address: IpAddr,
    /// `port` / `--port` (HTTPS, authenticated).
    pub port: u16,
    /// `readOnlyPort` / `--read-only-port`; `None` when 0 (disabled).
    pub read_only_port: Option<u16>,
    /// `healthzBindAddress:healthzPort`; `None` when the port is 0.
    pub healthz: Option<SocketAddr>,
    /// `tlsCertFile` + `tlsPrivateKeyFile`; `None`: a self-signed certificate under [`Self::cert_dir`].
    pub tls: Option<TlsFiles>,
    /// Where a self-signed certificate lives: `<root-dir>/pki` (`nodelet.crt`, `nodelet.key`).
    pub cert_dir: PathBuf,
    /// Who may use the main port.
    pub auth: AuthConfig,
    /// `streamingConnectionIdleTimeout` / `--streaming-connection-idle-timeout`: an exec, attach or
    /// port-forward session with no traffic for this long is closed (default 4h, as the kubelet).
    pub streaming_connection_idle_timeout: Duration,
    /// `nodelet.maxStreamingSessionsPerUser`: streaming sessions one user may have open at once.
    pub max_streaming_sessions_per_user: usize,
}

/// A certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// Authentication and authorization of the main port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// `authentication.x509.clientCAFile` / `--client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
    /// `nodelet.tokenAuthFile` / `--token-auth-file`: static bearer tokens.
    pub token_auth_file: Option<PathBuf>,
    /// `authentication.anonymous.enabled` / `--anonymous-auth` (default false).
    pub anonymous: bool,
    /// `authentication.webhook.enabled` / `--authentication-token-webhook` (cluster mode only; default true
    /// with a config file, false with flags alone, as the kubelet): `Some` when bearer tokens not in the
    /// token file are checked with a TokenReview.
    pub token_webhook: Option<TokenWebhookConfig>,
    /// `authorization.mode` / `--authorization-mode` (default `Webhook` in cluster mode, else `AlwaysAllow`).
    pub authorization: AuthorizationMode,
}

/// `authentication.webhook`: TokenReview authentication of bearer tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenWebhookConfig {
    /// `cacheTTL` / `--authentication-token-webhook-cache-ttl`: how long an answer (authenticated or not) is
    /// kept; zero: not cached. Default 2m.
    pub cache_ttl: Duration,
}

/// `authorization.mode`: who may do what on the main port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed (the default standalone; in cluster mode only with
    /// `--insecure-always-allow-authorization` when a cluster-wide authenticator is on).
    AlwaysAllow,
    /// A SubjectAccessReview for each request (cluster mode only).
    Webhook {
        /// `authorization.webhook.cacheAuthorizedTTL`: how long an allowing answer is kept (default 5m).
        cache_authorized_ttl: Duration,
        /// `authorization.webhook.cacheUnauthorizedTTL`: how long a denying answer is kept (default 30s).
        cache_unauthorized_ttl: Duration,
    },
}

/// The container runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// `containerRuntimeEndpoint` / `--container-runtime-endpoint`; `None`: run the embedded containerd.
    pub endpoint: Option<String>,
    /// `runtimeRequestTimeout`.
    pub request_timeout: Duration,
    /// The sandbox image (the embedded containerd's `sandbox_image`).
    pub pod_infra_container_image: String,
    /// The embedded containerd (used when [`Self::endpoint`] is `None`).
    pub embedded: EmbeddedRuntimeConfig,
    /// `--preload-images` / `nodelet.preloadImages`: image archives imported at start.
    pub preload_images: Option<PathBuf>,
}

/// Settings of the embedded containerd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedRuntimeConfig {
    /// `--containerd-path`: the binary (a bare name is looked up on PATH).
    pub containerd_path: PathBuf,
    /// `--containerd-config-extra`: TOML merged over the generated config.
    pub config_extra: Option<PathBuf>,
    /// `podCIDR` / `--pod-cidr`: the bridge network's subnet.
    pub pod_cidr: Ipv4Cidr,
    /// `nodelet.cniBridge`: the Linux bridge's name.
    pub cni_bridge: String,
}

/// Settings applied to every pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodsConfig {
    /// `podLogsDir`: where CRI log files go (absolute).
    pub pod_logs_dir: PathBuf,
    /// `resolvConf`; `None` when set to `""` (pods get no DNS from the host).
    pub resolv_conf: Option<PathBuf>,
    /// `cgroupRoot`; `None`: the root cgroup.
    pub cgroup_root: Option<String>,
    /// `maxPods`.
    pub max_pods: u32,
    /// `podPidsLimit`; `None`: no limit (-1 or 0). Set only with a [`Self::cgroup_root`]: it is written to
    /// each pod cgroup's `pids.max`.
    pub pod_pids_limit: Option<i64>,
    /// `--max-termination-grace-period` / `nodelet.maxTerminationGracePeriodSeconds`: the longest grace
    /// period any pod gets (`None`: no bound).
    pub max_grace_period: Option<Duration>,
    /// `--allow-privileged` / `nodelet.allowPrivileged` (default true, as the kubelet's flag). `false` holds
    /// every source to `baseline` at least, and refuses host namespaces, added capabilities beyond the
    /// runtime's default set, hostPath volumes outside [`Self::allowed_host_paths`] and host ports of
    /// nodelet's own ports with messages naming the flag.
    pub allow_privileged: bool,
    /// `nodelet.allowedHostPaths`: with `--allow-privileged=false`, directories the hostPath volumes of
    /// the sources whose level is `privileged` may still use.
    pub allowed_host_paths: Vec<PathBuf>,
    /// `nodelet.podSecurity`: the Pod Security Standards level per source.
    pub pod_security: PodSecurityLevels,
    /// `nodelet.httpPodNamespaces`: the namespaces pods from the manifest URL, the HTTP endpoint and
    /// manifest files not owned by root may use (default: `default`).
    pub http_pod_namespaces: Vec<String>,
    /// `nodelet.httpPodLabels`: the label keys those pods may carry (default: none).
    pub http_pod_labels: Vec<String>,
    /// `seccompDefault`: containers without a seccomp profile run with `RuntimeDefault`.
    pub seccomp_default: bool,
    /// `allowedUnsafeSysctls` / `--allowed-unsafe-sysctls`: the sysctls (names, or prefixes ending in `*`)
    /// pods may set besides the safe ones; checked when the configuration is read.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `clusterDNS` / `--cluster-dns`: DNS servers of ClusterFirst pods (empty: the node's resolv.conf).
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// `clusterDomain` / `--cluster-domain`: the cluster's DNS domain ("" for none).
    pub cluster_domain: String,
}

impl PodsConfig {
    /// The bound on every pod's grace periods.
    pub fn grace_cap(&self) -> nodelet_resources::pod::grace::GraceCap {
        self.max_grace_period.map_or(
            nodelet_resources::pod::grace::GraceCap::NONE,
            nodelet_resources::pod::grace::GraceCap::at_most,
        )
    }
}

/// `nodelet.podSecurity`: the Pod Security Standards level enforced on each pod source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodSecurityLevels {
    /// `file` (default `privileged`: static pods from root's own files are trusted; other files get
    /// `baseline` at least, see nodelet's `sources::admission`).
    pub file: Level,
    /// `url` (default `baseline`).
    pub url: Level,
    /// `http` (default `baseline`).
    pub http: Level,
    /// `api` (default `privileged`: the API server's own admission decides).
    pub api: Level,
}

impl Default for PodSecurityLevels {
    fn default() -> Self {
        PodSecurityLevels {
            file: Level::Privileged,
            url: Level::Baseline,
            http: Level::Baseline,
            api: Level::Privileged,
        }
    }
}

/// Retry delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackOffConfig {
    /// CrashLoopBackOff (`nodelet.containerRestartBackOff`; the max also from
    /// `crashLoopBackOff.maxContainerRestartPeriod`).
    pub container_restart: BackOff,
    /// ImagePullBackOff (`nodelet.imagePullBackOff`).
    pub image_pull: BackOff,
}

/// An exponential back-off: `initial`, doubling, capped at `max`; forgotten after `reset_after` without a
/// new failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackOff {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Quiet time after which the next failure starts again at `initial`.
    pub reset_after: Duration,
}

/// One eviction threshold.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionThreshold {
    /// A signal from [`EVICTION_SIGNALS`].
    pub signal: String,
    /// Evict when the signal falls below this.
    pub value: ThresholdValue,
}

/// Node-pressure eviction settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// `evictionHard` (kubelet defaults when unset; with `mergeDefaultEvictionSettings`, merged over them).
    pub hard: Vec<EvictionThreshold>,
    /// `evictionSoft`.
    pub soft: Vec<EvictionThreshold>,
    /// `evictionSoftGracePeriod`, one per soft signal.
    pub soft_grace_period: BTreeMap<String, Duration>,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (seconds).
    pub max_pod_grace_period: i32,
    /// `evictionMinimumReclaim`.
    pub minimum_reclaim: BTreeMap<String, ThresholdValue>,
    /// `nodelet.evictionMonitoringPeriod`: how often the signals are checked.
    pub monitoring_period: Duration,
    /// `localStorageCapacityIsolation` (default true): pods over their emptyDir `sizeLimit` or their
    /// containers' `ephemeral-storage` limits are evicted.
    pub local_storage_capacity_isolation: bool,
    /// `nodelet.localStorageEntryBudget`: directory entries the local storage measurement examines
    /// per pass (positive).
    pub local_storage_entry_budget: u64,
}

/// Image garbage collection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcConfig {
    /// `imageGCHighThresholdPercent` (100 disables image GC).
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent`.
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge`.
    pub minimum_age: Duration,
    /// `imageMaximumGCAge`; `None` when 0.
    pub maximum_age: Option<Duration>,
    /// `nodelet.imageGCPeriod`: how often image garbage collection runs.
    pub period: Duration,
}

/// Container log rotation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerLogConfig {
    /// `containerLogMaxSize` in bytes.
    pub max_size: u64,
    /// `containerLogMaxFiles` (≥ 2).
    pub max_files: u32,
    /// `containerLogMonitorInterval` (≥ 3 s): how often log sizes are checked.
    pub monitor_interval: Duration,
}

/// Image pull settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagePullConfig {
    /// `serializeImagePulls`.
    pub serialize: bool,
    /// `maxParallelImagePulls`.
    pub max_parallel: Option<u32>,
}

pub use nodelet_node::cidr::{Ipv4Cidr, default_pod_cidr};

/// Something in the configuration nodelet does not act on, or that looks dangerous. Log every one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The file field (dotted path) or flag it is about.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML/JSON, or a field has the wrong type.
    #[error("config file {path}: {field}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The dotted field path (`.` for the document itself).
        field: String,
        /// The parser's message.
        message: String,
    },
    /// `apiVersion` / `kind` are missing or not KubeletConfiguration's.
    #[error("config file {path}: {message}")]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid {origin}: {message}")]
    Invalid {
        /// The flag (`--port`) or file field (`port in /etc/nodelet/config.yaml`).
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// The machine's hostname could not be read.
    #[error("cannot determine the node name (set --hostname-override): {0}")]
    Hostname(#[source] std::io::Error),
}

/// Result of [`Config::load`].
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// Everything to log at warning level, in the order found.
    pub warnings: Vec<ConfigWarning>,
}

/// A parsed, not yet merged config file.
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    raw: RawKubeletConfiguration,
    warnings: Vec<ConfigWarning>,
}

impl ConfigFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(path, &text)
    }

    /// Parses `text` as the content of `path`: checks apiVersion/kind, types, and collects warnings for
    /// unknown and ignored fields.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let parse_err =
            |field: String, message: String| ConfigError::Parse { path: path.to_owned(), field, message };
        if text.trim().is_empty() {
            return Err(parse_err(".".into(), "the file is empty".into()));
        }
        let mut ignored = Vec::new();
        let mut field = None;
        let decoded = {
            let mut record = |p: serde_ignored::Path<'_>| ignored.push(dotted(&p));
            serde_saphyr::with_deserializer_from_str_with_options(text, yaml::options(text.len()), |doc| {
                let de = serde_ignored::Deserializer::new(doc, &mut record);
                serde_path_to_error::deserialize::<_, RawKubeletConfiguration>(de).map_err(|e| {
                    field = Some(e.path().to_string());
                    e.into_inner()
                })
            })
        };
        let raw = match decoded {
            Ok(raw) => raw,
            Err(e) => {
                let error = yaml::DecodeError::new(&e, text.len());
                let field = match &error {
                    yaml::DecodeError::Invalid { .. } => field.unwrap_or_else(|| ".".into()),
                    _ => ".".into(),
                };
                let message = match error {
                    yaml::DecodeError::MultipleDocuments { .. } => {
                        "holds more than one YAML document; nodelet reads exactly one".into()
                    }
                    other => other.to_string(),
                };
                return Err(parse_err(field, message));
            }
        };
        let wrong_kind = |message: String| ConfigError::WrongKind { path: path.to_owned(), message };
        match raw.api_version.as_deref() {
            Some(API_VERSION) => {}
            Some(other) => {
                return Err(wrong_kind(format!("apiVersion {other:?} is not supported, use {API_VERSION}")));
            }
            None => return Err(wrong_kind(format!("apiVersion is missing (want {API_VERSION})"))),
        }
        match raw.kind.as_deref() {
            Some(KIND) => {}
            Some(other) => return Err(wrong_kind(format!("kind {other:?} is not {KIND}"))),
            None => return Err(wrong_kind(format!("kind is missing (want {KIND})"))),
        }
        let mut warnings = Vec::new();
        for field in ignored {
            let top = field.split('.').next().unwrap_or(&field);
            let message = if field.starts_with("nodelet.") {
                "unknown nodelet field (typo?); ignored".to_owned()
            } else if KUBELET_FIELDS.contains(&field.as_str())
                || (KUBELET_FIELDS.contains(&top) && !is_read(top))
            {
                "kubelet field not supported by nodelet; ignored".to_owned()
            } else {
                "unknown field (typo?); ignored".to_owned()
            };
            warnings.push(ConfigWarning { field, message });
        }
        Ok(ConfigFile { path: path.to_owned(), raw, warnings })
    }
}

/// `a.b[0].c` for a serde_ignored path (without its `?` markers for options).
fn dotted(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        Path::Map { parent, key } => {
            let head = dotted(parent);
            if head.is_empty() { key.clone() } else { format!("{head}.{key}") }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => {
            dotted(parent)
        }
    }
}

/// Top-level fields nodelet reads (a sub-field of one of these that serde ignored is unknown, not ignored).
fn is_read(top: &str) -> bool {
    matches!(top, "authentication" | "authorization" | "crashLoopBackOff" | "logging" | "nodelet")
}

/// Facts about the machine the configuration depends on (injected by tests).
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// The machine's hostname.
    pub hostname: Result<String, std::sync::Arc<std::io::Error>>,
    /// The current directory, for relative flag paths.
    pub cwd: PathBuf,
}

impl HostFacts {
    /// The real machine: `/proc/sys/kernel/hostname` and the current directory.
    pub fn detect() -> Self {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|s| s.trim().to_owned())
            .map_err(std::sync::Arc::new);
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        HostFacts { hostname, cwd }
    }
}

impl Config {
    /// Loads the configuration from the flags and the `--config` file they name.
    pub fn load(args: &RunArgs) -> Result<Loaded, ConfigError> {
        let file = args.config.as_deref().map(ConfigFile::read).transpose()?;
        Self::resolve(args, file, &HostFacts::detect())
    }

    /// Merges flags over a parsed file over the defaults, and validates.
    pub fn resolve(
        args: &RunArgs,
        file: Option<ConfigFile>,
        host: &HostFacts,
    ) -> Result<Loaded, ConfigError> {
        let (mut raw, file_path, mut warnings) = match file {
            Some(f) => (f.raw, Some(f.path), f.warnings),
            None => (RawKubeletConfiguration::default(), None, Vec::new()),
        };
        let m = Merger { file: file_path.as_deref(), cwd: &host.cwd };
        field_flags(args, &mut raw)?;
        let (node_name, root_dir) = m.node(args, host)?;
        let nodelet = raw.nodelet.take().unwrap_or_default();
        let (sources, periods) = m.sources(args, &raw, &nodelet, &mut warnings)?;
        let server = m.server(args, &raw, &nodelet, &root_dir, &mut warnings)?;
        let runtime = m.runtime(args, &raw, &nodelet, &mut warnings)?;
        let storage = m.storage(&raw, &nodelet, &root_dir)?;
        let pods = m.pods(args, &raw, &nodelet)?;
        let cluster = m.cluster(args, &raw, &server.cert_dir, server.tls.is_some(), &mut warnings)?;
        let backoff = m.backoffs(&raw, &nodelet)?;
        let eviction = m.eviction_config(args, &mut raw, &nodelet)?;
        let image_gc = m.image_gc_config(&raw, &nodelet)?;
        let container_gc = m.container_gc(nodelet.container_gc.as_ref())?;
        let container_logs = m.container_logs(&raw)?;
        let image_pulls = m.image_pulls(&raw, &mut warnings)?;
        let logging = m.logging(args, &raw)?;
        let Periods { sync_frequency, pleg_relist_period, pleg_evented_relist_period, housekeeping_interval } =
            periods;
        let config = Config {
            config_file: file_path,
            node_name,
            root_dir,
            sources,
            sync_frequency,
            pleg_relist_period,
            pleg_evented_relist_period,
            housekeeping_interval,
            server,
            runtime,
            pods,
            backoff,
            eviction,
            image_gc,
            container_logs,
            image_pulls,
            storage,
            container_gc,
            cluster,
            logging,
        };
        Ok(Loaded { config, warnings })
    }
}

fn raw_field_set(raw: &RawKubeletConfiguration, field: &str) -> bool {
    match field {
        "evictionHard" => raw.eviction_hard.is_some(),
        "evictionSoft" => raw.eviction_soft.is_some(),
        "evictionSoftGracePeriod" => raw.eviction_soft_grace_period.is_some(),
        "evictionPressureTransitionPeriod" => raw.eviction_pressure_transition_period.is_some(),
        "evictionMaxPodGracePeriod" => raw.eviction_max_pod_grace_period.is_some(),
        "evictionMinimumReclaim" => raw.eviction_minimum_reclaim.is_some(),
        "mergeDefaultEvictionSettings" => raw.merge_default_eviction_settings.is_some(),
        "imageGCHighThresholdPercent" => raw.image_gc_high_threshold_percent.is_some(),
        "imageGCLowThresholdPercent" => raw.image_gc_low_threshold_percent.is_some(),
        "imageMinimumGCAge" => raw.image_minimum_gc_age.is_some(),
        "imageMaximumGCAge" => raw.image_maximum_gc_age.is_some(),
        "containerLogMaxSize" => raw.container_log_max_size.is_some(),
        "containerLogMaxFiles" => raw.container_log_max_files.is_some(),
        "serializeImagePulls" => raw.serialize_image_pulls.is_some(),
        "maxParallelImagePulls" => raw.max_parallel_image_pulls.is_some(),
        _ => false,
    }
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

/// Merging helpers: origins, path resolution, typed picks.
struct Merger<'a> {
    file: Option<&'a Path>,
    cwd: &'a Path,
}

impl Merger<'_> {
    /// `--logging-format` over `logging.format`, `-v` over `logging.verbosity`.
    fn logging(&self, args: &RunArgs, raw: &RawKubeletConfiguration) -> Result<LoggingConfig, ConfigError> {
        let logging = raw.logging.as_ref();
        let format = match (&args.logging_format, logging.and_then(|l| l.format.as_deref())) {
            (Some(f), _) => {
                LogFormat::parse(f).map_err(|e| self.flag_err("--logging-format", e.to_string()))?
            }
            (None, Some(f)) if !f.is_empty() => {
                LogFormat::parse(f).map_err(|e| self.file_err("logging.format", e.to_string()))?
            }
            _ => LogFormat::Text,
        };
        let verbosity = match (args.log.verbosity, logging.and_then(|l| l.verbosity)) {
            (Some(v), _) => Some(v),
            (None, Some(v)) => Some(u8::try_from(v).map_err(|_| {
                self.file_err("logging.verbosity", format!("{v} is not between 0 and {}", u8::MAX))
            })?),
            (None, None) => None,
        };
        Ok(LoggingConfig { format, verbosity })
    }

    fn flag_origin(&self, flag: &str) -> String {
        flag.to_owned()
    }
    fn file_origin(&self, field: &str) -> String {
        match self.file {
            Some(p) => format!("{field} in {}", p.display()),
            None => field.to_owned(),
        }
    }
    fn flag_err(&self, flag: &str, message: String) -> ConfigError {
        ConfigError::Invalid { origin: self.flag_origin(flag), message }
    }
    fn file_err(&self, field: &str, message: String) -> ConfigError {
        ConfigError::Invalid { origin: self.file_origin(field), message }
    }
    fn origin_err(&self, from_flag: bool, flag: &str, field: &str, message: String) -> ConfigError {
        if from_flag { self.flag_err(flag, message) } else { self.file_err(field, message) }
    }

    fn flag_path(&self, flag: &str, p: &Path) -> Result<PathBuf, ConfigError> {
        check_path(p).map_err(|e| self.flag_err(flag, e.to_string()))?;
        Ok(if p.is_absolute() { p.to_owned() } else { self.cwd.join(p) })
    }
    fn file_path(&self, field: &str, p: &Path) -> Result<PathBuf, ConfigError> {
        check_path(p).map_err(|e| self.file_err(field, e.to_string()))?;
        if p.is_absolute() {
            return Ok(p.to_owned());
        }
        let base = self.file.and_then(Path::parent).filter(|d| !d.as_os_str().is_empty());
        Ok(match base {
            Some(dir) if dir.is_absolute() => dir.join(p),
            Some(dir) => self.cwd.join(dir).join(p),
            None => self.cwd.join(p),
        })
    }
    fn path_opt(
        &self,
        flag: Option<&Path>,
        flag_name: &str,
        file: Option<&str>,
        field: &str,
    ) -> Result<Option<PathBuf>, ConfigError> {
        match (flag, file) {
            (Some(p), _) => self.flag_path(flag_name, p).map(Some),
            (None, Some(s)) if !s.is_empty() => self.file_path(field, Path::new(s)).map(Some),
            _ => Ok(None),
        }
    }
    /// `authentication.webhook` and `authorization` (flags over the file over the defaults). Both webhooks need
    /// cluster mode (`--kubeconfig`): without it enabling either is an error. Cache lifetimes given for a
    /// webhook that is off are reported as ignored.
    ///
    /// Defaults, as the kubelet's where it can be: in cluster mode with a config file, the file format's
    /// (v1beta1) defaults: TokenReview on, Webhook authorization, and a cache lifetime of 0s or unset in the
    /// file means the kubelet's default (2m, 5m, 30s). Without a file, the kubelet's command-line defaults
    /// (TokenReview off), except authorization: Webhook in cluster mode, where the kubelet's command line
    /// says AlwaysAllow. Standalone (no API server to ask), AlwaysAllow and no TokenReview.
    fn webhooks(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<(Option<TokenWebhookConfig>, AuthorizationMode), ConfigError> {
        let cluster_mode = args.kubeconfig.is_some();
        let file_defaults = cluster_mode && self.file.is_some();
        // A file's 0s is the kubelet's default (v1beta1 defaulting cannot tell it from unset); a flag's 0 is 0.
        let file_ttl =
            |value: Option<GoDuration>, field: &str, default: Duration, warnings: &mut Vec<_>| match value {
                Some(d) if d.0.is_zero() => {
                    warnings.push(ConfigWarning {
                        field: field.to_owned(),
                        message: format!(
                            "0s in a config file means the default, {} (as the kubelet); use the flag to \
                             turn the cache off",
                            GoDuration(default)
                        ),
                    });
                    None
                }
                other => other,
            };
        let authn = raw.authentication.as_ref().and_then(|a| a.webhook.as_ref());
        let (enabled, from_flag) = match (args.authentication_token_webhook, authn.and_then(|w| w.enabled)) {
            (Some(e), _) => (e, true),
            (None, Some(e)) => (e, false),
            (None, None) => (file_defaults, false),
        };
        let ttl_flag = args.authentication_token_webhook_cache_ttl;
        let ttl_file = authn.and_then(|w| w.cache_ttl);
        let token_webhook = if enabled {
            if !cluster_mode {
                return Err(self.origin_err(
                    from_flag,
                    "--authentication-token-webhook",
                    "authentication.webhook.enabled",
                    "TokenReview authentication needs cluster mode (--kubeconfig): the reviews go to its API \
                     server"
                        .into(),
                ));
            }
            let ttl_file = file_ttl(
                ttl_file,
                "authentication.webhook.cacheTTL",
                DEFAULT_TOKEN_WEBHOOK_CACHE_TTL,
                warnings,
            );
            let cache_ttl = ttl_flag.or(ttl_file).map_or(DEFAULT_TOKEN_WEBHOOK_CACHE_TTL, |d| d.0);
            Some(TokenWebhookConfig { cache_ttl })
        } else {
            if ttl_flag.is_some() || ttl_file.is_some() {
                warnings.push(ConfigWarning {
                    field: "authentication.webhook.cacheTTL".into(),
                    message: "TokenReview authentication is off (authentication.webhook.enabled); ignored"
                        .into(),
                });
            }
            None
        };

        let authz = raw.authorization.as_ref();
        let (mode, from_flag) = match (&args.authorization_mode, authz.and_then(|a| a.mode.as_deref())) {
            (Some(m), _) => (m.as_str(), true),
            (None, Some(m)) if !m.is_empty() => (m, false),
            (None, _) if cluster_mode => ("Webhook", false),
            (None, _) => ("AlwaysAllow", false),
        };
        let hook = authz.and_then(|a| a.webhook.as_ref());
        let authorized_flag = args.authorization_webhook_cache_authorized_ttl;
        let unauthorized_flag = args.authorization_webhook_cache_unauthorized_ttl;
        let authorized_file = hook.and_then(|h| h.cache_authorized_ttl);
        let unauthorized_file = hook.and_then(|h| h.cache_unauthorized_ttl);
        let authorization = match mode {
            "AlwaysAllow" => {
                for (set, field) in [
                    (authorized_flag.is_some() || authorized_file.is_some(), "cacheAuthorizedTTL"),
                    (unauthorized_flag.is_some() || unauthorized_file.is_some(), "cacheUnauthorizedTTL"),
                ] {
                    if set {
                        warnings.push(ConfigWarning {
                            field: format!("authorization.webhook.{field}"),
                            message: "authorization.mode is AlwaysAllow; ignored".into(),
                        });
                    }
                }
                AuthorizationMode::AlwaysAllow
            }
            "Webhook" => {
                if !cluster_mode {
                    return Err(self.origin_err(
                        from_flag,
                        "--authorization-mode",
                        "authorization.mode",
                        "Webhook authorization needs cluster mode (--kubeconfig): the SubjectAccessReviews go \
                         to its API server"
                            .into(),
                    ));
                }
                let authorized_file = file_ttl(
                    authorized_file,
                    "authorization.webhook.cacheAuthorizedTTL",
                    DEFAULT_AUTHORIZED_CACHE_TTL,
                    warnings,
                );
                let unauthorized_file = file_ttl(
                    unauthorized_file,
                    "authorization.webhook.cacheUnauthorizedTTL",
                    DEFAULT_UNAUTHORIZED_CACHE_TTL,
                    warnings,
                );
                AuthorizationMode::Webhook {
                    cache_authorized_ttl: authorized_flag
                        .or(authorized_file)
                        .map_or(DEFAULT_AUTHORIZED_CACHE_TTL, |d| d.0),
                    cache_unauthorized_ttl: unauthorized_flag
                        .or(unauthorized_file)
                        .map_or(DEFAULT_UNAUTHORIZED_CACHE_TTL, |d| d.0),
                }
            }
            other => {
                return Err(self.origin_err(
                    from_flag,
                    "--authorization-mode",
                    "authorization.mode",
                    format!("{other:?} is not AlwaysAllow or Webhook"),
                ));
            }
        };
        Ok((token_webhook, authorization))
    }

    fn positive_duration(
        &self,
        flag: Option<GoDuration>,
        flag_name: &str,
        file: Option<GoDuration>,
        field: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let (d, from_flag) = match (flag, file) {
            (Some(d), _) => (d.0, true),
            (None, Some(d)) => (d.0, false),
            (None, None) => return Ok(default),
        };
        if d.is_zero() {
            return Err(self.origin_err(from_flag, flag_name, field, "must be greater than 0".into()));
        }
        Ok(d)
    }
    fn port(
        &self,
        flag: Option<u16>,
        _flag_name: &str,
        file: Option<i64>,
        field: &str,
        default: u16,
    ) -> Result<u16, ConfigError> {
        match (flag, file) {
            (Some(p), _) => Ok(p),
            (None, Some(p)) => {
                u16::try_from(p).map_err(|_| self.file_err(field, format!("{p} is not between 0 and 65535")))
            }
            (None, None) => Ok(default),
        }
    }
    fn ip(
        &self,
        flag: Option<IpAddr>,
        _flag_name: &str,
        file: Option<&str>,
        field: &str,
        default: IpAddr,
    ) -> Result<IpAddr, ConfigError> {
        match (flag, file) {
            (Some(ip), _) => Ok(ip),
            (None, Some(s)) if !s.is_empty() => {
                s.parse().map_err(|_| self.file_err(field, format!("{s:?} is not an IP address")))
            }
            _ => Ok(default),
        }
    }
    fn backoff(
        &self,
        raw: Option<&RawBackOff>,
        field: &str,
        default: BackOff,
        kubelet_max: Option<Duration>,
    ) -> Result<BackOff, ConfigError> {
        let raw_max = raw.and_then(|r| r.max).map(|d| d.0);
        if let (Some(a), Some(b)) = (raw_max, kubelet_max)
            && a != b
        {
            return Err(self.file_err(
                &format!("{field}.max"),
                "conflicts with crashLoopBackOff.maxContainerRestartPeriod; set only one".into(),
            ));
        }
        let max = raw_max.or(kubelet_max).unwrap_or(default.max);
        let initial = raw.and_then(|r| r.initial).map_or(default.initial.min(max), |d| d.0);
        let reset_after = raw.and_then(|r| r.reset_after).map_or(default.reset_after, |d| d.0);
        if initial.is_zero() {
            return Err(self.file_err(&format!("{field}.initial"), "must be greater than 0".into()));
        }
        if max < initial {
            return Err(
                self.file_err(&format!("{field}.max"), format!("{} is below initial", GoDuration(max)))
            );
        }
        if reset_after.is_zero() {
            return Err(self.file_err(&format!("{field}.resetAfter"), "must be greater than 0".into()));
        }
        Ok(BackOff { initial, max, reset_after })
    }

    fn thresholds(
        &self,
        field: &str,
        map: &BTreeMap<String, String>,
    ) -> Result<Vec<EvictionThreshold>, ConfigError> {
        map.iter()
            .map(|(signal, value)| {
                check_signal(signal).map_err(|e| self.file_err(field, e.to_string()))?;
                let value = value
                    .parse::<ThresholdValue>()
                    .map_err(|e| self.file_err(&format!("{field}.{signal}"), e.to_string()))?;
                Ok(EvictionThreshold { signal: signal.clone(), value })
            })
            .collect()
    }

    fn eviction(&self, raw: &RawKubeletConfiguration) -> Result<EvictionConfig, ConfigError> {
        let defaults: BTreeMap<String, String> =
            DEFAULT_EVICTION_HARD.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let hard_map = match &raw.eviction_hard {
            Some(m) if raw.merge_default_eviction_settings == Some(true) => {
                let mut merged = defaults;
                merged.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
                merged
            }
            Some(m) => m.clone(),
            None => defaults,
        };
        let hard = self.thresholds("evictionHard", &hard_map)?;
        let soft = self.thresholds("evictionSoft", raw.eviction_soft.as_ref().unwrap_or(&BTreeMap::new()))?;
        let mut soft_grace_period = BTreeMap::new();
        for (signal, d) in raw.eviction_soft_grace_period.iter().flatten() {
            check_signal(signal).map_err(|e| self.file_err("evictionSoftGracePeriod", e.to_string()))?;
            let d = parse_go_duration(d)
                .map_err(|e| self.file_err(&format!("evictionSoftGracePeriod.{signal}"), e.to_string()))?;
            soft_grace_period.insert(signal.clone(), d);
        }
        for t in &soft {
            if !soft_grace_period.contains_key(&t.signal) {
                return Err(self.file_err(
                    &format!("evictionSoft.{}", t.signal),
                    "needs a grace period in evictionSoftGracePeriod".into(),
                ));
            }
        }
        for signal in soft_grace_period.keys() {
            if !soft.iter().any(|t| &t.signal == signal) {
                return Err(self.file_err(
                    &format!("evictionSoftGracePeriod.{signal}"),
                    "has no threshold in evictionSoft".into(),
                ));
            }
        }
        let mut minimum_reclaim = BTreeMap::new();
        for (signal, v) in raw.eviction_minimum_reclaim.iter().flatten() {
            check_signal(signal).map_err(|e| self.file_err("evictionMinimumReclaim", e.to_string()))?;
            let v = v
                .parse::<ThresholdValue>()
                .map_err(|e| self.file_err(&format!("evictionMinimumReclaim.{signal}"), e.to_string()))?;
            minimum_reclaim.insert(signal.clone(), v);
        }
        let max_pod_grace_period = match raw.eviction_max_pod_grace_period {
            Some(n) => i32::try_from(n)
                .map_err(|_| self.file_err("evictionMaxPodGracePeriod", format!("{n} is out of range")))?,
            None => 0,
        };
        Ok(EvictionConfig {
            hard,
            soft,
            soft_grace_period,
            pressure_transition_period: raw
                .eviction_pressure_transition_period
                .map_or(DEFAULT_EVICTION_PRESSURE_TRANSITION_PERIOD, |d| d.0),
            max_pod_grace_period,
            minimum_reclaim,
            monitoring_period: DEFAULT_EVICTION_MONITORING_PERIOD,
            local_storage_capacity_isolation: raw.local_storage_capacity_isolation.unwrap_or(true),
            local_storage_entry_budget: DEFAULT_LOCAL_STORAGE_ENTRY_BUDGET,
        })
    }

    fn image_gc(&self, raw: &RawKubeletConfiguration) -> Result<ImageGcConfig, ConfigError> {
        let percent = |v: Option<i64>, field: &str, default: u8| -> Result<u8, ConfigError> {
            match v {
                Some(n) => u8::try_from(n)
                    .ok()
                    .filter(|n| *n <= 100)
                    .ok_or_else(|| self.file_err(field, format!("{n} is not between 0 and 100"))),
                None => Ok(default),
            }
        };
        let high = percent(
            raw.image_gc_high_threshold_percent,
            "imageGCHighThresholdPercent",
            DEFAULT_IMAGE_GC_HIGH_THRESHOLD_PERCENT,
        )?;
        let low = percent(
            raw.image_gc_low_threshold_percent,
            "imageGCLowThresholdPercent",
            DEFAULT_IMAGE_GC_LOW_THRESHOLD_PERCENT,
        )?;
        if low >= high {
            return Err(self.file_err(
                "imageGCLowThresholdPercent",
                format!("{low} must be less than imageGCHighThresholdPercent ({high})"),
            ));
        }
        Ok(ImageGcConfig {
            high_threshold_percent: high,
            low_threshold_percent: low,
            minimum_age: raw.image_minimum_gc_age.map_or(DEFAULT_IMAGE_MINIMUM_GC_AGE, |d| d.0),
            maximum_age: raw.image_maximum_gc_age.map(|d| d.0).filter(|d| !d.is_zero()),
            period: DEFAULT_IMAGE_GC_PERIOD,
        })
    }
}

impl Merger<'_> {
    /// `nodelet.containerGC`: `period` (1m), `minAge` (0), `maxPerPodContainer` (1, at least 1: pod
    /// status shows the previous attempt), `maxContainers` (-1: no limit).
    fn container_gc(
        &self,
        raw: Option<&raw::RawContainerGc>,
    ) -> Result<nodelet_resources::pod::gc::ContainerGcPolicy, ConfigError> {
        let mut policy = nodelet_resources::pod::gc::ContainerGcPolicy::default();
        let Some(raw) = raw else { return Ok(policy) };
        policy.period =
            self.positive_duration(None, "", raw.period, "nodelet.containerGC.period", policy.period)?;
        policy.min_age = raw.min_age.map_or(policy.min_age, |d| d.0);
        if let Some(n) = raw.max_per_pod_container {
            policy.max_per_pod_container = u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                self.file_err(
                    "nodelet.containerGC.maxPerPodContainer",
                    format!("{n} must be at least 1 (pod status shows the previous attempt)"),
                )
            })?;
        }
        if let Some(n) = raw.max_containers {
            policy.max_containers = match n {
                n if n < 0 => None,
                n => Some(u32::try_from(n).map_err(|_| {
                    self.file_err("nodelet.containerGC.maxContainers", format!("{n} is too large"))
                })?),
            };
        }
        Ok(policy)
    }
}

/// Puts the eviction and image GC flags over the file's fields (a flag replaces the whole field, as
/// with the kubelet), after checking them so that errors name the flag.
fn eviction_flags(args: &RunArgs, raw: &mut RawKubeletConfiguration) -> Result<(), ConfigError> {
    let flag_err = |flag: &str, message: String| ConfigError::Invalid { origin: flag.to_owned(), message };
    let value_err = |flag: &str, e: ValueError| flag_err(flag, e.to_string());
    // `signal<value,...` (--eviction-hard, --eviction-soft) or `signal=value,...` (the others).
    let parse_map = |flag: &str, text: &str, sep: char| -> Result<BTreeMap<String, String>, ConfigError> {
        let mut map = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once(sep)
                .ok_or_else(|| flag_err(flag, format!("{pair:?} is not signal{sep}value")))?;
            let (k, v) = (k.trim(), v.trim());
            check_signal(k).map_err(|e| value_err(flag, e))?;
            map.insert(k.to_owned(), v.to_owned());
        }
        Ok(map)
    };
    let thresholds = |flag: &str, map: &BTreeMap<String, String>| -> Result<(), ConfigError> {
        for v in map.values() {
            v.parse::<ThresholdValue>().map_err(|e| flag_err(flag, e.to_string()))?;
        }
        Ok(())
    };
    if let Some(text) = &args.eviction_hard {
        let map = parse_map("--eviction-hard", text, '<')?;
        thresholds("--eviction-hard", &map)?;
        raw.eviction_hard = Some(map);
    }
    if let Some(text) = &args.eviction_soft {
        let map = parse_map("--eviction-soft", text, '<')?;
        thresholds("--eviction-soft", &map)?;
        raw.eviction_soft = Some(map);
    }
    if let Some(text) = &args.eviction_soft_grace_period {
        let map = parse_map("--eviction-soft-grace-period", text, '=')?;
        for v in map.values() {
            parse_go_duration(v).map_err(|e| flag_err("--eviction-soft-grace-period", e.to_string()))?;
        }
        raw.eviction_soft_grace_period = Some(map);
    }
    if let Some(text) = &args.eviction_minimum_reclaim {
        let map = parse_map("--eviction-minimum-reclaim", text, '=')?;
        thresholds("--eviction-minimum-reclaim", &map)?;
        raw.eviction_minimum_reclaim = Some(map);
    }
    if let Some(d) = args.eviction_pressure_transition_period {
        raw.eviction_pressure_transition_period = Some(d);
    }
    for (flag, value, field) in [
        ("--image-gc-high-threshold", args.image_gc_high_threshold, &mut raw.image_gc_high_threshold_percent),
        ("--image-gc-low-threshold", args.image_gc_low_threshold, &mut raw.image_gc_low_threshold_percent),
    ] {
        if let Some(n) = value {
            if !(0..=100).contains(&n) {
                return Err(flag_err(flag, format!("{n} is not between 0 and 100")));
            }
            *field = Some(n);
        }
    }
    if let Some(d) = args.minimum_image_ttl_duration {
        raw.image_minimum_gc_age = Some(d);
    }
    Ok(())
}

/// In cluster mode, `AlwaysAllow` together with an authenticator that admits identities of the whole cluster
/// (a client CA, which signs every node's certificate; TokenReview, which accepts every pod's ServiceAccount
/// token; anonymous requests) would let each of them exec into, attach to and port-forward every pod on this
/// node: refused unless `--insecure-always-allow-authorization` is given, and then warned about at every
/// start. A static token file alone is not such an authenticator (its users are named one by one on this
/// node). The flag without that combination is reported as ignored.
fn always_allow_in_a_cluster(
    args: &RunArgs,
    authorization: AuthorizationMode,
    client_ca: bool,
    token_reviews: bool,
    anonymous: bool,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<(), ConfigError> {
    let insecure_flag = "--insecure-always-allow-authorization";
    let cluster_wide: Vec<&str> = [
        (client_ca, "client certificates (authentication.x509.clientCAFile)"),
        (token_reviews, "TokenReview (authentication.webhook.enabled)"),
        (anonymous, "anonymous requests (authentication.anonymous.enabled)"),
    ]
    .into_iter()
    .filter_map(|(on, what)| on.then_some(what))
    .collect();
    if args.kubeconfig.is_none() || authorization != AuthorizationMode::AlwaysAllow || cluster_wide.is_empty()
    {
        if args.insecure_always_allow_authorization {
            warnings.push(ConfigWarning {
                field: insecure_flag.to_owned(),
                message: "only matters in cluster mode with authorization.mode AlwaysAllow and client \
                          certificates, TokenReview or anonymous requests; ignored"
                    .to_owned(),
            });
        }
        return Ok(());
    }
    let danger = format!(
        "authorization.mode AlwaysAllow in cluster mode with {}: every node's client certificate and every \
         ServiceAccount token of the cluster may exec into, attach to and port-forward every pod on this node",
        cluster_wide.join(", ")
    );
    if !args.insecure_always_allow_authorization {
        return Err(ConfigError::Invalid {
            origin: "--authorization-mode / authorization.mode".to_owned(),
            message: format!(
                "{danger}; use Webhook (the default in cluster mode), or pass {insecure_flag} to accept that"
            ),
        });
    }
    warnings.push(ConfigWarning {
        field: "authorization.mode".to_owned(),
        message: format!("INSECURE ({insecure_flag}): {danger}"),
    });
    Ok(())
}

/// Puts the flags that stand for one file field each (`--enable-server` for `enableServer`, ...) over the
/// file's fields, as the kubelet applies its flags over its config file, after checking each value so
/// that errors name the flag.
fn field_flags(args: &RunArgs, raw: &mut RawKubeletConfiguration) -> Result<(), ConfigError> {
    let flag_err = |flag: &str, message: String| ConfigError::Invalid { origin: flag.to_owned(), message };
    let positive = |flag: &str, d: GoDuration| -> Result<GoDuration, ConfigError> {
        if d.0.is_zero() { Err(flag_err(flag, "must be greater than 0".into())) } else { Ok(d) }
    };
    if let Some(b) = args.enable_server {
        raw.enable_server = Some(b);
    }
    if let Some(b) = args.seccomp_default {
        raw.seccomp_default = Some(b);
    }
    if let Some(b) = args.rotate_certificates {
        raw.rotate_certificates = Some(b);
    }
    if let Some(b) = args.rotate_server_certificates {
        raw.server_tls_bootstrap = Some(b);
    }
    if let Some(b) = args.local_storage_capacity_isolation {
        raw.local_storage_capacity_isolation = Some(b);
    }
    if let Some(d) = args.volume_stats_agg_period {
        raw.volume_stats_agg_period = Some(positive("--volume-stats-agg-period", d)?);
    }
    if let Some(size) = &args.container_log_max_size {
        parse_quantity(size).map_err(|e| flag_err("--container-log-max-size", e.to_string()))?;
        raw.container_log_max_size = Some(size.clone());
    }
    if let Some(n) = args.container_log_max_files {
        if u32::try_from(n).ok().filter(|n| *n >= 2).is_none() {
            return Err(flag_err("--container-log-max-files", format!("{n} must be at least 2")));
        }
        raw.container_log_max_files = Some(n);
    }
    if let Some(n) = args.eviction_max_pod_grace_period {
        if i32::try_from(n).is_err() {
            return Err(flag_err("--eviction-max-pod-grace-period", format!("{n} is out of range")));
        }
        raw.eviction_max_pod_grace_period = Some(n);
    }
    if let Some(d) = args.housekeeping_interval {
        raw.nodelet.get_or_insert_default().housekeeping_interval =
            Some(positive("--housekeeping-interval", d)?);
    }
    if let Some(d) = args.minimum_container_ttl_duration {
        raw.nodelet.get_or_insert_default().container_gc.get_or_insert_default().min_age = Some(d);
    }
    if let Some(n) = args.maximum_dead_containers_per_container {
        if u32::try_from(n).ok().filter(|n| *n >= 1).is_none() {
            return Err(flag_err(
                "--maximum-dead-containers-per-container",
                format!("{n} must be at least 1 (pod status shows the previous attempt)"),
            ));
        }
        raw.nodelet.get_or_insert_default().container_gc.get_or_insert_default().max_per_pod_container =
            Some(n);
    }
    if let Some(n) = args.maximum_dead_containers {
        if n >= 0 && u32::try_from(n).is_err() {
            return Err(flag_err("--maximum-dead-containers", format!("{n} is too large")));
        }
        raw.nodelet.get_or_insert_default().container_gc.get_or_insert_default().max_containers = Some(n);
    }
    Ok(())
}

/// Why a single value (a path, URL, header, name, ...) is not valid; `Merger` wraps it in
/// [`ConfigError::Invalid`] with the flag or field it came from.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    /// An eviction signal nodelet does not know.
    #[error("unknown eviction signal {signal:?} (known: {})", EVICTION_SIGNALS.join(", "))]
    UnknownSignal {
        /// The signal given.
        signal: String,
    },
    /// An empty path.
    #[error("empty path")]
    EmptyPath,
    /// A path with control characters.
    #[error("path {path:?} contains control characters")]
    PathControlChars {
        /// The path, lossily decoded.
        path: String,
    },
    /// A node name that is not a DNS-1123 subdomain.
    #[error(
        "{name:?} is not a valid node name (lower-case letters, digits, '-' and '.', at most 253, starting and \
         ending with a letter or digit)"
    )]
    NodeName {
        /// The name given.
        name: String,
    },
    /// A URL that is not http:// or https://.
    #[error("{shown:?} is not an http:// or https:// URL")]
    NotHttpUrl {
        /// The URL, its credential redacted.
        shown: String,
    },
    /// A URL with whitespace or control characters.
    #[error("{shown:?} contains whitespace or control characters")]
    UrlChars {
        /// The URL, its credential redacted.
        shown: String,
    },
    /// A `--manifest-url-header` item without `:`.
    #[error("{pair:?} is not key:value")]
    NotKeyValue {
        /// The item.
        pair: String,
    },
    /// An HTTP header name that is not a token.
    #[error("{name:?} is not a valid HTTP header name")]
    HeaderName {
        /// The name.
        name: String,
    },
    /// An HTTP header value with control characters.
    #[error("the value of header {name:?} contains control characters")]
    HeaderValue {
        /// The header's name.
        name: String,
    },
    /// A CRI endpoint that is not a unix socket.
    #[error(transparent)]
    Endpoint(#[from] nodelet_cri::CriError),
    /// Not an image reference.
    #[error("{image:?} is not an image reference")]
    ImageRef {
        /// The reference given.
        image: String,
    },
    /// Not an absolute cgroup path.
    #[error("{cgroup:?} is not an absolute cgroup path like /nodelet (segments of [A-Za-z0-9_.-])")]
    Cgroup {
        /// The path given.
        cgroup: String,
    },
}

fn check_signal(signal: &str) -> Result<(), ValueError> {
    if EVICTION_SIGNALS.contains(&signal) {
        Ok(())
    } else {
        Err(ValueError::UnknownSignal { signal: signal.to_owned() })
    }
}

fn check_path(p: &Path) -> Result<(), ValueError> {
    let s = p.as_os_str().to_string_lossy();
    if s.is_empty() {
        return Err(ValueError::EmptyPath);
    }
    if s.chars().any(char::is_control) {
        return Err(ValueError::PathControlChars { path: s.into_owned() });
    }
    Ok(())
}

/// Lower-cases and checks a node name: a DNS-1123 subdomain.
pub fn validate_node_name(name: &str) -> Result<String, ValueError> {
    let n = name.trim().to_lowercase();
    if is_dns_subdomain(&n) { Ok(n) } else { Err(ValueError::NodeName { name: name.to_owned() }) }
}

pub use nodelet_resources::common::names::is_dns_subdomain;

/// Whether `key` is a label key: an optional DNS subdomain prefix and `/`, then a name of 1 to 63
/// characters of `[A-Za-z0-9_.-]` that starts and ends alphanumeric.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

fn validate_url(u: &str) -> Result<String, ValueError> {
    // The URL may hold a credential: errors show it redacted.
    let shown = || configz::redact_url(u);
    let lower = u.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(ValueError::NotHttpUrl { shown: shown() });
    }
    if u.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ValueError::UrlChars { shown: shown() });
    }
    Ok(u.to_owned())
}

/// `a:1,b:2` → [(a, 1), (b, 2)], like the kubelet's `--manifest-url-header`.
fn parse_header_flag(s: &str) -> Result<Vec<(String, String)>, ValueError> {
    let mut out = Vec::new();
    for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = pair.split_once(':').ok_or_else(|| ValueError::NotKeyValue { pair: pair.to_owned() })?;
        let (k, v) = (k.trim(), v.trim());
        validate_header(k, v)?;
        out.push((k.to_owned(), v.to_owned()));
    }
    Ok(out)
}

fn validate_header(name: &str, value: &str) -> Result<(), ValueError> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(ValueError::HeaderName { name: name.to_owned() });
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ValueError::HeaderValue { name: name.to_owned() });
    }
    Ok(())
}

fn validate_endpoint(e: &str) -> Result<String, ValueError> {
    nodelet_cri::parse_endpoint(e)?;
    Ok(e.to_owned())
}

fn validate_image_ref(image: &str) -> Result<(), ValueError> {
    if image.is_empty() || image.len() > 4096 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValueError::ImageRef { image: image.to_owned() });
    }
    Ok(())
}

fn validate_cgroup(c: &str) -> Result<Option<String>, ValueError> {
    if c.is_empty() || c == "/" {
        return Ok(None);
    }
    let ok = c.starts_with('/')
        && c[1..].split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch))
        });
    if ok {
        Ok(Some(c.trim_end_matches('/').to_owned()))
    } else {
        Err(ValueError::Cgroup { cgroup: c.to_owned() })
    }
}

fn valid_ifname(s: &str) -> bool {
    (1..=15).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

#[cfg(test)]
mod tests;

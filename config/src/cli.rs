//! The `nodelet` command line: the daemon's flags (named like the kubelet's), `hollow`, `completion`
//! (clap_complete) and the hidden `man` (clap_mangen), both generated from the whole command line, and the
//! place where a binary's client commands join them: [`Commands`] takes them as a type parameter (the
//! `nodelet` binary passes `nodelet_cli::Command`, whose `get`, `describe`, `logs`, `exec`, `attach`, `cp`,
//! `debug` and `port-forward` come between `run` and `hollow`; [`NoClient`] adds none).
//!
//! `nodelet` alone (or `nodelet run`) runs the daemon. Every daemon flag is optional here: a flag given
//! explicitly overrides the `--config` file, which overrides the default ([`crate::Config::load`]
//! does the merge). The defaults written in the help texts are checked against the constants in
//! the crate's root by a unit test.

// The field docs below are the command-line help texts: plain text with <placeholders>, not HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand};
use nodelet_shared::log::LogArgs;

use crate::GoDuration;

pub mod kubelet_flags;

/// Runs Kubernetes pods on this machine: static pods from a directory or a URL, on containerd.
#[derive(Debug, Parser)]
#[command(
    name = "nodelet",
    version,
    about = "Runs Kubernetes pods on this machine by reconciling desired against actual state",
    long_about = "Runs Kubernetes pods on this machine by reconciling desired against actual state.\n\n\
        Without a command, runs the node agent (same as `nodelet run`). Flags are named like the kubelet's \
        and override the fields of the --config file (a KubeletConfiguration, kubelet.config.k8s.io/v1beta1). \
        A kubelet flag nodelet does not act on is refused with a message naming its config field \
        (docs/kubelet-flags.md lists them all).\n\n\
        With --kubeconfig, nodelet registers this node with the cluster's API server (cluster mode); without \
        it, it runs static pods only (standalone mode).\n\n\
        Without --container-runtime-endpoint, nodelet starts and supervises its own containerd under \
        <root-dir>/containerd (the containerd binary must be on PATH).",
    args_conflicts_with_subcommands = true,
    after_help = "Logging: -v/--v LEVEL sets the verbosity (0-1 info, 2-3 info with more detail from nodelet, \
        4-5 debug, 6+ trace); RUST_LOG, when set, takes precedence (tracing EnvFilter syntax)."
)]
pub struct TopLevel<C: Subcommand> {
    /// What to do; the daemon when absent.
    #[command(subcommand)]
    pub command: Option<Commands<C>>,
    /// The daemon's flags when no command is given.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The command line without client commands (the daemon's tests parse with it).
pub type Cli = TopLevel<NoClient>;

/// The commands without client commands.
pub type Command = Commands<NoClient>;

impl<C: Subcommand> TopLevel<C> {
    /// The command to execute: the explicit subcommand, or `run` with the top-level flags.
    pub fn into_command(self) -> Commands<C> {
        self.command.unwrap_or(Commands::Run(Box::new(self.run)))
    }
}

/// The whole command line with the client commands `C`: [`TopLevel`] plus, for the daemon (top level and
/// `run`), the kubelet flags nodelet refuses, as hidden arguments (see [`kubelet_flags`]).
pub fn command_with<C: Subcommand>() -> clap::Command {
    use clap::CommandFactory;
    TopLevel::<C>::command()
        .args(kubelet_flags::refused_args())
        .mut_subcommand("run", |run| run.args(kubelet_flags::refused_args()))
}

/// [`command_with`] without client commands.
pub fn command() -> clap::Command {
    command_with::<NoClient>()
}

/// [`try_parse_with`] without client commands.
pub fn try_parse_from<I, T>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    try_parse_with::<NoClient, _, _>(args)
}

/// Parses a command line (`args` starts with the program name) with the client commands `C`. A kubelet flag
/// nodelet does not support is an error naming its KubeletConfiguration field; the kubelet's deprecation
/// lines for the deprecated kubelet flags given go to [`RunArgs::deprecation_warnings`].
pub fn try_parse_with<C, I, T>(args: I) -> Result<Commands<C>, clap::Error>
where
    C: Subcommand,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::FromArgMatches;
    let mut cmd = command_with::<C>();
    let mut matches = cmd.try_get_matches_from_mut(args)?;
    let (refused, warnings) = {
        // the daemon's flags: at the top level, or those of `run`
        let daemon = match matches.subcommand() {
            None => Some((&cmd, &matches)),
            Some(("run", m)) => cmd.find_subcommand("run").map(|c| (c, m)),
            Some(_) => None,
        };
        match daemon {
            Some((c, m)) => (kubelet_flags::refusals(m), kubelet_flags::deprecation_warnings(c, m)),
            None => (Vec::new(), Vec::new()),
        }
    };
    if !refused.is_empty() {
        // one `error: …` line per refused flag
        return Err(cmd.error(clap::error::ErrorKind::ArgumentConflict, refused.join("\nerror: ")));
    }
    let mut command = TopLevel::<C>::from_arg_matches_mut(&mut matches)?.into_command();
    if let Commands::Run(run) = &mut command {
        run.deprecation_warnings = warnings;
    }
    Ok(command)
}

/// nodelet's commands, with the client commands `C` between `run` and `hollow`.
#[derive(Debug, Subcommand)]
pub enum Commands<C: Subcommand> {
    /// Run the node agent (the default when no command is given).
    Run(Box<RunArgs>),
    /// The client commands of the binary.
    #[command(flatten)]
    Client(C),
    /// Run N hollow nodes in this process against one API server: the real node code over a fake
    /// runtime that runs nothing and a host that mounts nothing, for measuring the control plane's load.
    Hollow(HollowArgs),
    /// Print a shell completion script: `source <(nodelet completion bash)`.
    Completion(CompletionArgs),
    /// Print nodelet's man page (roff), or write one page per command into a directory.
    #[command(hide = true)]
    Man(ManArgs),
}

/// No client commands: the command line of a binary built without `nodelet-cli` (`run`, `hollow`,
/// `completion`, `man`). It has no value, so `nodelet::Invocation::Client` cannot occur.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoClient {}

impl clap::FromArgMatches for NoClient {
    fn from_arg_matches(_: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand))
    }

    fn update_from_arg_matches(&mut self, _: &clap::ArgMatches) -> Result<(), clap::Error> {
        match *self {}
    }
}

impl Subcommand for NoClient {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        cmd
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }

    fn has_subcommand(_: &str) -> bool {
        false
    }
}

/// `nodelet hollow`: many hollow nodes in one process (see `docs/scale.md`).
#[derive(Debug, Clone, Args)]
pub struct HollowArgs {
    /// How many hollow nodes to run
    #[arg(long, value_name = "N")]
    pub nodes: u32,
    /// Directory of the nodes' kubeconfigs: node NAME reads NAME.kubeconfig (its own identity, e.g. a client
    /// certificate for system:node:NAME)
    #[arg(long, value_name = "DIR")]
    pub kubeconfig_dir: PathBuf,
    /// The nodes are named PREFIX<i> for i from --first-index
    #[arg(long, value_name = "PREFIX", default_value = "hollow-node-")]
    pub name_prefix: String,
    /// The index of the first node (its pods' made-up IPs are in 10.(64 + i / 256).(i % 256).0/24)
    #[arg(long, value_name = "I", default_value_t = 0)]
    pub first_index: u32,
    /// Each node keeps its files (certificates, pod directories, the fake runtime's socket) in DIR/NAME
    #[arg(long, value_name = "DIR", default_value = "/var/lib/nodelet-hollow")]
    pub root_dir: PathBuf,
    /// KubeletConfiguration file every node reads, as `nodelet run --config`
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
}

/// The daemon's flags. Every flag is optional: unset means "the config file's value, else the default".
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1). Flags given explicitly override its fields;
    /// relative paths inside it are relative to the file's directory.
    #[arg(long, value_name = "FILE", help_heading = "Configuration")]
    pub config: Option<PathBuf>,

    /// Directory (or single file) of static pod manifests, re-read every --file-check-frequency and on change
    /// [config: staticPodPath]
    #[arg(long, value_name = "PATH", help_heading = "Pod sources")]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL of a pod manifest (a Pod or a PodList), fetched every --http-check-frequency [config: staticPodURL]
    #[arg(long, value_name = "URL", help_heading = "Pod sources")]
    pub manifest_url: Option<String>,
    /// HTTP header(s) for --manifest-url requests, as 'key:value[,key:value...]'; repeatable
    /// [config: staticPodURLHeader]
    #[arg(long, value_name = "KEY:VALUE", action = ArgAction::Append, help_heading = "Pod sources")]
    pub manifest_url_header: Vec<String>,
    /// How often the manifest path is re-listed [default: 20s] [config: fileCheckFrequency]
    #[arg(long, value_name = "DURATION", help_heading = "Pod sources")]
    pub file_check_frequency: Option<GoDuration>,
    /// How often the manifest URL is fetched [default: 20s] [config: httpCheckFrequency]
    #[arg(long, value_name = "DURATION", help_heading = "Pod sources")]
    pub http_check_frequency: Option<GoDuration>,
    /// Maximum time between two syncs of a running pod [default: 1m] [config: syncFrequency]
    #[arg(long, value_name = "DURATION", help_heading = "Pod sources")]
    pub sync_frequency: Option<GoDuration>,
    /// How often the pods' stats (/stats/summary, /metrics/resource) are gathered [default: 10s]
    /// [config: nodelet.housekeepingInterval]
    #[arg(long, value_name = "DURATION", help_heading = "Pod sources")]
    pub housekeeping_interval: Option<GoDuration>,
    /// nodelet only: loopback address (e.g. 127.0.0.1:10260) of an endpoint accepting pod manifests (POST /pods,
    /// DELETE /pods/NS/NAME) with the bearer token of <root-dir>/http-source/token; off by default
    /// [config: nodelet.manifestHTTPAddress]
    #[arg(long, value_name = "IP:PORT", help_heading = "Pod sources")]
    pub manifest_http_addr: Option<SocketAddr>,

    /// Node name instead of the machine's hostname (static pods are named <pod>-<node>)
    #[arg(long, value_name = "NAME", help_heading = "Node")]
    pub hostname_override: Option<String>,
    /// Directory for nodelet's state: pod volumes, certificates, the embedded containerd
    /// [default: /var/lib/nodelet]
    #[arg(long, value_name = "DIR", help_heading = "Node")]
    pub root_dir: Option<PathBuf>,
    /// Directory of the containers' CRI log files [default: /var/log/pods] [config: podLogsDir]
    #[arg(long, value_name = "DIR", help_heading = "Node")]
    pub pod_logs_dir: Option<PathBuf>,
    /// Resolver configuration given to pods with dnsPolicy Default/ClusterFirst; '' disables
    /// [default: /etc/resolv.conf] [config: resolvConf]
    #[arg(long, value_name = "FILE", help_heading = "Node")]
    pub resolv_conf: Option<String>,
    /// Cgroup under which pod cgroups are created [default: the root cgroup] [config: cgroupRoot]
    #[arg(long, value_name = "CGROUP", help_heading = "Node")]
    pub cgroup_root: Option<String>,
    /// Maximum number of pods on this node [default: 110] [config: maxPods]
    #[arg(long, value_name = "N", help_heading = "Node")]
    pub max_pods: Option<u32>,
    /// Maximum number of processes per pod, set as its pod cgroup's pids.max (needs --cgroup-root); -1 for
    /// no limit [default: -1] [config: podPidsLimit]
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = "Node")]
    pub pod_max_pids: Option<i64>,
    /// Longest grace period any pod gets to stop, in seconds: terminationGracePeriodSeconds, deletion
    /// and probe grace periods above it are lowered to it [default: no bound]
    /// [config: nodelet.maxTerminationGracePeriodSeconds]
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, help_heading = "Node")]
    pub max_termination_grace_period: Option<i64>,
    /// Unsafe sysctls pods may set besides the safe ones, comma-separated; repeatable. Names or prefixes
    /// ending in '*' (e.g. 'kernel.msg*,net.core.somaxconn'), each of the IPC or network namespace
    /// [config: allowedUnsafeSysctls]
    #[arg(long, value_name = "SYSCTL,...", action = ArgAction::Append, help_heading = "Node")]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Allow containers to request privileged mode; false holds every pod source to the baseline Pod Security
    /// level [default: true] [config: nodelet.allowPrivileged]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Node")]
    pub allow_privileged: Option<bool>,
    /// Give every container without a seccomp profile the runtime's default (RuntimeDefault) instead of
    /// Unconfined [default: false] [config: seccompDefault]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Node")]
    pub seccomp_default: Option<bool>,
    /// How often the disk usage of volumes and container filesystems is measured [default: 1m]
    /// [config: volumeStatsAggPeriod]
    #[arg(long, value_name = "DURATION", help_heading = "Node")]
    pub volume_stats_agg_period: Option<GoDuration>,

    /// Kubeconfig of the API server to register this node with; enables cluster mode (without it nodelet
    /// runs static pods only, standalone). With --bootstrap-kubeconfig it may be missing: TLS bootstrap
    /// writes it
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// TLS bootstrap: when --kubeconfig is missing or its client certificate is missing or expired, ask the
    /// cluster for one (a CertificateSigningRequest) with these credentials (e.g. a bootstrap token), store it
    /// under <root-dir>/pki and write --kubeconfig; the client certificate is then rotated before it expires
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// The node's InternalIP address(es): one IP, or an IPv4 and an IPv6 address separated by a comma
    /// [default: detected]
    #[arg(long, value_name = "IP[,IP]", help_heading = "Cluster")]
    pub node_ip: Option<String>,
    /// Labels of the Node object, 'key=value[,key=value...]'; repeatable. Keys in the kubernetes.io and
    /// k8s.io namespaces are refused except the kubelet's own (kubernetes.io/hostname, ...) and the
    /// kubelet.kubernetes.io and node.kubernetes.io namespaces
    #[arg(long, value_name = "KEY=VALUE,...", action = ArgAction::Append, help_heading = "Cluster")]
    pub node_labels: Vec<String>,
    /// Register this node with the API server [default: true] [config: registerNode]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Cluster")]
    pub register_node: Option<bool>,
    /// Taints the node is registered with, 'key[=value]:Effect[,...]' (Effect: NoSchedule,
    /// PreferNoSchedule or NoExecute) [config: registerWithTaints]
    #[arg(long, value_name = "KEY[=VALUE]:EFFECT,...", help_heading = "Cluster")]
    pub register_with_taints: Option<String>,
    /// Queries per second to the API server; 0 means the default [default: 50] [config: kubeAPIQPS]
    #[arg(long, value_name = "QPS", allow_negative_numbers = true, help_heading = "Cluster")]
    pub kube_api_qps: Option<f64>,
    /// Burst of queries to the API server [default: 100] [config: kubeAPIBurst]
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = "Cluster")]
    pub kube_api_burst: Option<i64>,
    /// How often the node's status is computed, and posted when it changed [default: 10s]
    /// [config: nodeStatusUpdateFrequency]
    #[arg(long, value_name = "DURATION", help_heading = "Cluster")]
    pub node_status_update_frequency: Option<GoDuration>,
    /// DNS server IP(s) of pods with dnsPolicy ClusterFirst, comma-separated; repeatable. Without it they
    /// get the node's resolv.conf (also in standalone mode) [config: clusterDNS]
    #[arg(long, value_name = "IP,...", action = ArgAction::Append, help_heading = "Cluster")]
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain (e.g. cluster.local), searched by ClusterFirst pods; empty for none
    /// (also in standalone mode) [config: clusterDomain]
    #[arg(long, value_name = "DOMAIN", help_heading = "Cluster")]
    pub cluster_domain: Option<String>,
    /// Renew the client certificate (from --bootstrap-kubeconfig's TLS bootstrap) before it expires
    /// [default: false] [config: rotateCertificates]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Cluster")]
    pub rotate_certificates: Option<bool>,
    /// Get the main port's serving certificate from the cluster (a CertificateSigningRequest) and renew it
    /// before it expires [default: false] [config: serverTLSBootstrap]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Cluster")]
    pub rotate_server_certificates: Option<bool>,

    /// CRI endpoint of an external runtime (unix:///path.sock); without it nodelet runs its own containerd
    /// [config: containerRuntimeEndpoint]
    #[arg(long, value_name = "ENDPOINT", help_heading = "Container runtime")]
    pub container_runtime_endpoint: Option<String>,
    /// Timeout of each runtime call, except long-running ones (pull, logs, exec, attach) [default: 2m]
    /// [config: runtimeRequestTimeout]
    #[arg(long, value_name = "DURATION", help_heading = "Container runtime")]
    pub runtime_request_timeout: Option<GoDuration>,
    /// Sandbox ("pause") image of the embedded containerd [default: localhost/nodelet/pause:3.9]
    /// [config: nodelet.podInfraContainerImage]
    #[arg(long, value_name = "IMAGE", help_heading = "Container runtime")]
    pub pod_infra_container_image: Option<String>,
    /// Pod network of the embedded runtime's CNI bridge (used when <root-dir>/cni/net.d has no other
    /// network) [default: 198.18.0.0/16] [config: podCIDR]
    #[arg(long, value_name = "CIDR", help_heading = "Container runtime")]
    pub pod_cidr: Option<String>,
    /// nodelet only: containerd binary for the embedded runtime (1.6, 1.7 or 2.x: the config written follows
    /// its version; it runs with its own directory first on PATH) [default: containerd, looked up on PATH]
    /// [config: nodelet.containerdPath]
    #[arg(long, value_name = "PATH", help_heading = "Container runtime")]
    pub containerd_path: Option<PathBuf>,
    /// nodelet only: TOML file merged over the embedded containerd's generated config (containerd
    /// `imports`: a plugin table in it replaces the generated one for that plugin)
    /// [config: nodelet.containerdConfigExtra]
    #[arg(long, value_name = "FILE", help_heading = "Container runtime")]
    pub containerd_config_extra: Option<PathBuf>,
    /// nodelet only: directory of OCI/docker image archives (*.tar) imported into the runtime at start,
    /// before any pod starts [config: nodelet.preloadImages]
    #[arg(long, value_name = "DIR", help_heading = "Container runtime")]
    pub preload_images: Option<PathBuf>,

    /// IP address of the main (HTTPS) and read-only ports [default: 0.0.0.0] [config: address]
    #[arg(long, value_name = "IP", help_heading = "Serving")]
    pub address: Option<IpAddr>,
    /// Run the HTTP(S) servers: the main port, the read-only port and /healthz; false runs none
    /// [default: true] [config: enableServer]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Serving")]
    pub enable_server: Option<bool>,
    /// Main HTTPS port (authenticated: /pods, /metrics, /stats/summary, /containerLogs) [default: 10250]
    /// [config: port]
    #[arg(long, value_name = "PORT", help_heading = "Serving")]
    pub port: Option<u16>,
    /// Unauthenticated read-only HTTP port (/pods, /metrics, /healthz); 0 disables [default: 0]
    /// [config: readOnlyPort]
    #[arg(long, value_name = "PORT", help_heading = "Serving")]
    pub read_only_port: Option<u16>,
    /// Close an exec, attach or port-forward session after this long without traffic either way; must be
    /// greater than 0 [default: 4h] [config: streamingConnectionIdleTimeout]
    #[arg(long, value_name = "DURATION", help_heading = "Serving")]
    pub streaming_connection_idle_timeout: Option<GoDuration>,
    /// Port of the plain-HTTP /healthz endpoint; 0 disables [default: 10248] [config: healthzPort]
    #[arg(long, value_name = "PORT", help_heading = "Serving")]
    pub healthz_port: Option<u16>,
    /// IP address of the /healthz endpoint [default: 127.0.0.1] [config: healthzBindAddress]
    #[arg(long, value_name = "IP", help_heading = "Serving")]
    pub healthz_bind_address: Option<IpAddr>,
    /// Certificate (PEM, may include intermediates) of the main port; without it a self-signed one is
    /// generated under <root-dir>/pki [config: tlsCertFile]
    #[arg(long, value_name = "FILE", help_heading = "Serving")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) matching --tls-cert-file [config: tlsPrivateKeyFile]
    #[arg(long, value_name = "FILE", help_heading = "Serving")]
    pub tls_private_key_file: Option<PathBuf>,

    /// CA bundle (PEM) that client certificates on the main port must chain to
    /// [config: authentication.x509.clientCAFile]
    #[arg(long, value_name = "FILE", help_heading = "Authentication")]
    pub client_ca_file: Option<PathBuf>,
    /// nodelet only: static bearer tokens for the main port, CSV lines 'token,user,uid[,"group1,group2"]'
    /// [config: nodelet.tokenAuthFile]
    #[arg(long, value_name = "FILE", help_heading = "Authentication")]
    pub token_auth_file: Option<PathBuf>,
    /// Allow unauthenticated requests on the main port. Default false: safer than the kubelet, whose
    /// command-line default is true [default: false] [config: authentication.anonymous.enabled]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Authentication")]
    pub anonymous_auth: Option<bool>,
    /// Cluster mode only: check bearer tokens that are not in --token-auth-file with a TokenReview through
    /// the API server. Default: true in cluster mode with a --config file (the KubeletConfiguration file
    /// default), false otherwise (the kubelet's command-line default)
    /// [default: true with --config and --kubeconfig, else false] [config: authentication.webhook.enabled]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Authentication")]
    pub authentication_token_webhook: Option<bool>,
    /// How long TokenReview answers (authenticated or not) are cached; 0 disables the cache [default: 2m]
    /// [config: authentication.webhook.cacheTTL]
    #[arg(long, value_name = "DURATION", help_heading = "Authentication")]
    pub authentication_token_webhook_cache_ttl: Option<GoDuration>,
    /// Authorization of the main port: AlwaysAllow, or Webhook (cluster mode only: a SubjectAccessReview
    /// for each request, as the kubelet). In cluster mode the default is Webhook (the kubelet's command line
    /// defaults to AlwaysAllow), and AlwaysAllow with client certificates, TokenReview or anonymous requests
    /// needs --insecure-always-allow-authorization [default: Webhook with --kubeconfig, else AlwaysAllow]
    /// [config: authorization.mode]
    #[arg(long, value_name = "MODE", help_heading = "Authentication")]
    pub authorization_mode: Option<String>,
    /// nodelet only: accept --authorization-mode AlwaysAllow in cluster mode together with client
    /// certificates, TokenReview or anonymous requests, which lets every node's certificate and every
    /// ServiceAccount token of the cluster exec into every pod here. Refused without this flag; with it,
    /// a warning at every start
    #[arg(long, help_heading = "Authentication")]
    pub insecure_always_allow_authorization: bool,
    /// How long an allowing SubjectAccessReview answer is cached; 0 disables [default: 5m]
    /// [config: authorization.webhook.cacheAuthorizedTTL]
    #[arg(long, value_name = "DURATION", help_heading = "Authentication")]
    pub authorization_webhook_cache_authorized_ttl: Option<GoDuration>,
    /// How long a denying SubjectAccessReview answer is cached; 0 disables [default: 30s]
    /// [config: authorization.webhook.cacheUnauthorizedTTL]
    #[arg(long, value_name = "DURATION", help_heading = "Authentication")]
    pub authorization_webhook_cache_unauthorized_ttl: Option<GoDuration>,

    /// Hard eviction thresholds, 'signal<value' pairs separated by commas, e.g.
    /// 'memory.available<100Mi,nodefs.available<10%'; setting one drops the other defaults
    /// [default: memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%]
    /// [config: evictionHard]
    #[arg(long, value_name = "SIGNAL<VALUE,...", help_heading = "Eviction and garbage collection")]
    pub eviction_hard: Option<String>,
    /// Soft eviction thresholds, 'signal<value' pairs; each needs --eviction-soft-grace-period
    /// [config: evictionSoft]
    #[arg(long, value_name = "SIGNAL<VALUE,...", help_heading = "Eviction and garbage collection")]
    pub eviction_soft: Option<String>,
    /// How long each soft threshold must be met before pods are evicted, 'signal=duration' pairs
    /// [config: evictionSoftGracePeriod]
    #[arg(long, value_name = "SIGNAL=DURATION,...", help_heading = "Eviction and garbage collection")]
    pub eviction_soft_grace_period: Option<String>,
    /// Minimum amount reclaimed beyond a met threshold, 'signal=quantity' pairs
    /// [config: evictionMinimumReclaim]
    #[arg(long, value_name = "SIGNAL=VALUE,...", help_heading = "Eviction and garbage collection")]
    pub eviction_minimum_reclaim: Option<String>,
    /// How long a pressure condition stays true after its thresholds were last met [default: 5m]
    /// [config: evictionPressureTransitionPeriod]
    #[arg(long, value_name = "DURATION", help_heading = "Eviction and garbage collection")]
    pub eviction_pressure_transition_period: Option<GoDuration>,
    /// Image filesystem usage (percent) at which image garbage collection starts; 100 disables it
    /// [default: 85] [config: imageGCHighThresholdPercent]
    #[arg(long, value_name = "PERCENT", help_heading = "Eviction and garbage collection")]
    pub image_gc_high_threshold: Option<i64>,
    /// Image filesystem usage (percent) image garbage collection brings it down to [default: 80]
    /// [config: imageGCLowThresholdPercent]
    #[arg(long, value_name = "PERCENT", help_heading = "Eviction and garbage collection")]
    pub image_gc_low_threshold: Option<i64>,
    /// Minimum age of an unused image before it may be removed [default: 2m] [config: imageMinimumGCAge]
    #[arg(long, value_name = "DURATION", help_heading = "Eviction and garbage collection")]
    pub minimum_image_ttl_duration: Option<GoDuration>,
    /// Longest grace period (seconds) given to a pod evicted for a soft threshold (its own when shorter)
    /// [default: 0] [config: evictionMaxPodGracePeriod]
    #[arg(
        long,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        help_heading = "Eviction and garbage collection"
    )]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Count the pods' local ephemeral storage (emptyDir, logs, writable layers) against their limits and
    /// evict pods that exceed them [default: true] [config: localStorageCapacityIsolation]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = "Eviction and garbage collection")]
    pub local_storage_capacity_isolation: Option<bool>,
    /// Minimum age of a dead container before it may be removed [default: 0s]
    /// [config: nodelet.containerGC.minAge]
    #[arg(long, value_name = "DURATION", help_heading = "Eviction and garbage collection")]
    pub minimum_container_ttl_duration: Option<GoDuration>,
    /// Dead containers kept per container of a pod, at least 1 [default: 1]
    /// [config: nodelet.containerGC.maxPerPodContainer]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Eviction and garbage collection"
    )]
    pub maximum_dead_containers_per_container: Option<i64>,
    /// Dead containers kept on the node in all; -1 for no limit [default: -1]
    /// [config: nodelet.containerGC.maxContainers]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Eviction and garbage collection"
    )]
    pub maximum_dead_containers: Option<i64>,
    /// Size (e.g. 10Mi) at which a container's log file is rotated [default: 10Mi] [config: containerLogMaxSize]
    #[arg(long, value_name = "QUANTITY", help_heading = "Eviction and garbage collection")]
    pub container_log_max_size: Option<String>,
    /// Log files kept per container, at least 2 [default: 5] [config: containerLogMaxFiles]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        help_heading = "Eviction and garbage collection"
    )]
    pub container_log_max_files: Option<i64>,

    /// Log line format: text or json (the kubelet's JSON keys ts, caller, msg, v, err) [default: text]
    /// [config: logging.format]
    #[arg(long, value_name = "FORMAT", help_heading = "Logging")]
    pub logging_format: Option<String>,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
    /// The kubelet's deprecation lines for the deprecated kubelet flags given, logged at start (set by
    /// [`try_parse_from`]).
    #[arg(skip)]
    pub deprecation_warnings: Vec<String>,
}

/// `nodelet completion SHELL`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "bash: `source <(nodelet completion bash)`, or save it as \
    /etc/bash_completion.d/nodelet. zsh: `nodelet completion zsh > \"${fpath[1]}/_nodelet\"`. fish: \
    `nodelet completion fish > ~/.config/fish/completions/nodelet.fish`.")]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_name = "SHELL", value_parser = ["bash", "zsh", "fish"])]
    pub shell: String,
}

/// `nodelet man [--dir DIR]`.
#[derive(Debug, Clone, Args)]
pub struct ManArgs {
    /// Write nodelet.1 and one nodelet-COMMAND.1 per command into this directory instead of printing
    /// nodelet.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// A shell `nodelet completion` has no script for.
#[derive(Debug, thiserror::Error)]
#[error("unsupported shell type {0:?}")]
pub struct UnsupportedShell(String);

/// `nodelet completion SHELL`: the completion script of `shell` (`bash`, `zsh` or `fish`) for the command
/// line `cmd` ([`command_with`]), generated by clap_complete.
pub fn completion(
    cmd: &mut clap::Command,
    shell: &str,
    out: &mut dyn std::io::Write,
) -> Result<(), UnsupportedShell> {
    use clap_complete::Shell;
    let shell = match shell {
        "bash" => Shell::Bash,
        "zsh" => Shell::Zsh,
        "fish" => Shell::Fish,
        other => return Err(UnsupportedShell(other.to_owned())),
    };
    clap_complete::generate(shell, cmd, "nodelet", out);
    Ok(())
}

/// `nodelet man`: one roff page (section 1) for nodelet and all its commands (`cmd`, [`command_with`]):
/// the top-level page that clap_mangen makes, then a section per command with its synopsis, description
/// and options.
pub fn man_page(cmd: clap::Command, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    clap_mangen::Man::new(cmd.clone()).render(out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let page = clap_mangen::Man::new(sub.clone());
        let mut buf = Vec::new();
        page.render_synopsis_section(&mut buf)?;
        page.render_description_section(&mut buf)?;
        page.render_options_section(&mut buf)?;
        if sub.get_after_help().is_some() {
            page.render_extra_section(&mut buf)?;
        }
        let text = String::from_utf8_lossy(&buf);
        let name = sub.get_bin_name().unwrap_or(sub.get_name()).to_uppercase();
        writeln!(out, ".SH \"COMMAND: {name}\"")?;
        for line in text.lines() {
            match line.strip_prefix(".SH ") {
                Some(heading) => writeln!(out, ".SS {heading}")?,
                None => writeln!(out, "{line}")?,
            }
        }
    }
    Ok(())
}

/// `nodelet man --dir DIR`: writes nodelet.1 and nodelet-COMMAND.1 for every command of `cmd` into `dir`.
pub fn man_pages_to(cmd: clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(cmd, dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate as config;
    use clap::CommandFactory;

    /// The `nodelet` binary's command line: with the client commands of `nodelet-cli`.
    type Full = TopLevel<nodelet_cli::Command>;

    fn parse(args: &[&str]) -> Command {
        let mut v = vec!["nodelet"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}")).into_command()
    }

    fn run(args: &[&str]) -> RunArgs {
        match parse(args) {
            Command::Run(r) => *r,
            other => panic!("expected run, got {other:?}"),
        }
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_command_runs_the_daemon_with_the_top_level_flags() {
        let r = run(&["--port", "11250", "--pod-manifest-path", "/etc/nodelet/manifests", "--v", "4"]);
        assert_eq!(r.port, Some(11250));
        assert_eq!(r.pod_manifest_path, Some(PathBuf::from("/etc/nodelet/manifests")));
        assert_eq!(r.log.verbosity, Some(4));
        let r = run(&["run", "--read-only-port", "10255", "-v", "2"]);
        assert_eq!(r.read_only_port, Some(10255));
        assert_eq!(r.log.verbosity, Some(2));
        let r = run(&[]);
        assert_eq!(r.port, None, "unset flags stay unset so the config file can apply");
    }

    #[test]
    fn durations_and_booleans_parse_like_the_kubelets() {
        let r = run(&["--runtime-request-timeout", "1m30s", "--sync-frequency=500ms", "--anonymous-auth"]);
        assert_eq!(r.runtime_request_timeout.map(|d| d.0), Some(std::time::Duration::from_secs(90)));
        assert_eq!(r.sync_frequency.map(|d| d.0), Some(std::time::Duration::from_millis(500)));
        assert_eq!(r.anonymous_auth, Some(true));
        let r = run(&["--anonymous-auth=false", "--allow-privileged=true"]);
        assert_eq!(r.anonymous_auth, Some(false));
        assert_eq!(r.allow_privileged, Some(true));
        let err = Cli::try_parse_from(["nodelet", "--sync-frequency", "10"]).expect_err("missing unit");
        assert!(err.to_string().contains("--sync-frequency"), "{err}");
        let err = Cli::try_parse_from(["nodelet", "--port", "http"]).expect_err("not a port");
        assert!(err.to_string().contains("--port"), "{err}");
    }

    #[test]
    fn manifest_url_header_is_repeatable() {
        let r = run(&["--manifest-url-header", "a:1,b:2", "--manifest-url-header", "b:3"]);
        assert_eq!(r.manifest_url_header, vec!["a:1,b:2".to_owned(), "b:3".to_owned()]);
    }

    #[test]
    fn daemon_flags_are_not_accepted_by_the_client_commands() {
        assert!(Full::try_parse_from(["nodelet", "--port", "1", "get", "pods"]).is_err());
        assert!(Full::try_parse_from(["nodelet", "get", "pods"]).is_ok());
    }

    /// The client commands come between `run` and `hollow`; without them (an extension's binary built
    /// without `nodelet-cli`) `get` is an unknown command.
    #[test]
    fn the_client_commands_join_between_run_and_hollow() {
        // in the order `nodelet --help` lists them
        let names = |cmd: clap::Command| {
            let mut subs: Vec<_> = cmd.get_subcommands().collect();
            subs.sort_by_key(|s| s.get_display_order());
            subs.iter().map(|s| s.get_name().to_owned()).collect::<Vec<_>>()
        };
        assert_eq!(
            names(command_with::<nodelet_cli::Command>()),
            [
                "run",
                "get",
                "logs",
                "exec",
                "attach",
                "cp",
                "debug",
                "port-forward",
                "describe",
                "hollow",
                "completion",
                "man"
            ]
        );
        assert_eq!(names(command()), ["run", "hollow", "completion", "man"]);
        assert!(try_parse_from(["nodelet", "get", "pods"]).is_err());
        assert!(matches!(
            try_parse_with::<nodelet_cli::Command, _, _>(["nodelet", "get", "pods"]),
            Ok(Commands::Client(nodelet_cli::Command::Get(_)))
        ));
    }

    /// The help texts state the defaults; they must be the ones the config module applies.
    #[test]
    fn help_shows_the_defaults_config_applies() {
        let mut cmd = Cli::command();
        let help = cmd.render_long_help().to_string();
        let expect = [
            ("--port", format!("[default: {}]", config::DEFAULT_PORT)),
            ("--read-only-port", format!("[default: {}]", config::DEFAULT_READ_ONLY_PORT)),
            ("--healthz-port", format!("[default: {}]", config::DEFAULT_HEALTHZ_PORT)),
            ("--healthz-bind-address", format!("[default: {}]", config::DEFAULT_HEALTHZ_BIND_ADDRESS)),
            ("--address", format!("[default: {}]", config::DEFAULT_ADDRESS)),
            ("--root-dir", format!("[default: {}]", config::DEFAULT_ROOT_DIR)),
            ("--pod-logs-dir", format!("[default: {}]", config::DEFAULT_POD_LOGS_DIR)),
            ("--resolv-conf", format!("[default: {}]", config::DEFAULT_RESOLV_CONF)),
            ("--max-pods", format!("[default: {}]", config::DEFAULT_MAX_PODS)),
            (
                "--pod-infra-container-image",
                format!("[default: {}]", config::DEFAULT_POD_INFRA_CONTAINER_IMAGE),
            ),
            ("--pod-cidr", format!("[default: {}]", config::DEFAULT_POD_CIDR)),
            (
                "--runtime-request-timeout",
                format!("[default: {}]", short_go(config::DEFAULT_RUNTIME_REQUEST_TIMEOUT)),
            ),
            ("--sync-frequency", format!("[default: {}]", short_go(config::DEFAULT_SYNC_FREQUENCY))),
            (
                "--file-check-frequency",
                format!("[default: {}]", short_go(config::DEFAULT_FILE_CHECK_FREQUENCY)),
            ),
            (
                "--http-check-frequency",
                format!("[default: {}]", short_go(config::DEFAULT_HTTP_CHECK_FREQUENCY)),
            ),
            ("--register-node", format!("[default: {}]", config::DEFAULT_REGISTER_NODE)),
            ("--kube-api-qps", format!("[default: {}]", config::DEFAULT_KUBE_API_QPS)),
            ("--kube-api-burst", format!("[default: {}]", config::DEFAULT_KUBE_API_BURST)),
            (
                "--node-status-update-frequency",
                format!("[default: {}]", short_go(config::DEFAULT_NODE_STATUS_UPDATE_FREQUENCY)),
            ),
            ("--anonymous-auth", "[default: false]".to_owned()),
            (
                "--authentication-token-webhook",
                "[default: true with --config and --kubeconfig, else false]".to_owned(),
            ),
            (
                "--authentication-token-webhook-cache-ttl",
                format!("[default: {}]", short_go(config::DEFAULT_TOKEN_WEBHOOK_CACHE_TTL)),
            ),
            ("--authorization-mode", "[default: Webhook with --kubeconfig, else AlwaysAllow]".to_owned()),
            (
                "--authorization-webhook-cache-authorized-ttl",
                format!("[default: {}]", short_go(config::DEFAULT_AUTHORIZED_CACHE_TTL)),
            ),
            (
                "--authorization-webhook-cache-unauthorized-ttl",
                format!("[default: {}]", short_go(config::DEFAULT_UNAUTHORIZED_CACHE_TTL)),
            ),
            ("--allow-privileged", "[default: true]".to_owned()),
            (
                "--volume-stats-agg-period",
                format!("[default: {}]", short_go(config::DEFAULT_VOLUME_STATS_AGG_PERIOD)),
            ),
            (
                "--housekeeping-interval",
                format!("[default: {}]", short_go(config::DEFAULT_HOUSEKEEPING_INTERVAL)),
            ),
            ("--container-log-max-files", format!("[default: {}]", config::DEFAULT_CONTAINER_LOG_MAX_FILES)),
            ("--enable-server", "[default: true]".to_owned()),
        ];
        for (flag, default) in expect {
            // the flag's own entry: from its line to the next flag's line
            let lines: Vec<&str> = help.lines().collect();
            let start = lines
                .iter()
                .position(|l| {
                    let t = l.trim_start();
                    t.strip_prefix(flag).is_some_and(|rest| rest.starts_with([' ', '[', '=']))
                })
                .unwrap_or_else(|| panic!("{flag} missing from help:\n{help}"));
            let end = lines[start + 1..]
                .iter()
                .position(|l| l.trim_start().starts_with('-'))
                .map_or(lines.len(), |i| start + 1 + i);
            let text = lines[start..end].join(" ").split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(text.contains(&default), "help of {flag} should state {default}: {text}");
        }
        assert!(help.contains("safer than the kubelet"), "the anonymous-auth difference is explained");
    }

    /// `2m0s` → `2m`, `20s` → `20s`: the short form written in help texts.
    fn short_go(d: std::time::Duration) -> String {
        let s = config::format_go_duration(d);
        s.strip_suffix("m0s").map(|m| format!("{m}m")).unwrap_or(s)
    }

    /// The man page names every visible command and every flag of each.
    #[test]
    fn the_man_page_names_every_command_and_flag() {
        let mut page = Vec::new();
        man_page(command_with::<nodelet_cli::Command>(), &mut page).expect("render");
        let page = String::from_utf8(page).expect("utf8");
        assert!(page.contains("\n.TH nodelet 1 "), "{}", &page[..page.len().min(200)]);
        let roff = |s: &str| s.replace('-', "\\-");
        let mut cmd = Full::command().disable_help_subcommand(true);
        cmd.build();
        let mut checked = 0;
        for sub in std::iter::once(&cmd).chain(cmd.get_subcommands().filter(|s| !s.is_hide_set())) {
            if sub.get_name() != "nodelet" {
                assert!(
                    page.contains(&format!("COMMAND: NODELET {}", sub.get_name().to_uppercase())),
                    "{}",
                    sub.get_name()
                );
            }
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(long) = arg.get_long() {
                    assert!(
                        page.contains(&roff(&format!("--{long}"))),
                        "--{long} of {} missing",
                        sub.get_name()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 80, "only {checked} flags");
        assert!(!page.contains("COMMAND: NODELET MAN"), "the hidden man command stays out");
        let dir = tempfile::tempdir().expect("tempdir");
        man_pages_to(command_with::<nodelet_cli::Command>(), dir.path()).expect("write pages");
        for name in ["nodelet.1", "nodelet-get.1", "nodelet-describe.1", "nodelet-completion.1"] {
            assert!(dir.path().join(name).is_file(), "{name}");
        }
    }

    #[test]
    fn completion_scripts_cover_the_commands() {
        for shell in ["bash", "zsh", "fish"] {
            let mut out = Vec::new();
            completion(&mut command_with::<nodelet_cli::Command>(), shell, &mut out).expect(shell);
            let text = String::from_utf8(out).expect("utf8");
            let words: &[&str] = if shell == "fish" {
                &["describe", "-l selector", "-l pod-manifest-path"]
            } else {
                &["describe", "--selector", "--pod-manifest-path"]
            };
            for word in words {
                assert!(text.contains(word), "{shell} completion lacks {word}");
            }
        }
        assert!(completion(&mut command(), "tcsh", &mut Vec::new()).is_err());
        assert!(Cli::try_parse_from(["nodelet", "completion", "tcsh"]).is_err());
    }
}

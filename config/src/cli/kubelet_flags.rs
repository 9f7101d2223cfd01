//! Every command-line flag of the kubelet v1.28, and what nodelet does with it: one table, [`KUBELET_FLAGS`].
//!
//! A flag nodelet acts on is a field of [`super::RunArgs`] (with the kubelet's meaning); when the kubelet
//! deprecates it, nodelet logs the kubelet's own deprecation line at start ([`deprecation_warnings`]). Every
//! other kubelet flag is refused before nodelet starts, with a message naming its KubeletConfiguration field
//! and saying why nodelet does not support it ([`refusals`]): the parser knows these flags (as hidden
//! arguments generated from the table by [`refused_args`]), so a kubelet unit file fails with that message
//! and not with an "unexpected argument". `docs/kubelet-flags.md` is generated from the table
//! (`markdown`).

use clap::{Arg, ArgAction, ArgMatches, Command};

/// What nodelet does with a kubelet flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Accepted and acted on, with the kubelet's meaning (a field of [`super::RunArgs`]).
    Accepted,
    /// Refused before start: the reason says why nodelet does not support it.
    Refused(&'static str),
}

/// How the kubelet parses a flag's value (pflag), which the generated argument of a refused flag mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A boolean: `--flag` or `--flag=false`.
    Bool,
    /// A value: `--flag VALUE` or `--flag=VALUE`.
    One,
}

/// One kubelet flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletFlag {
    /// The long name, without `--`.
    pub name: &'static str,
    /// Accepted or refused.
    pub handling: Handling,
    /// The config file field the flag stands for (dotted; nodelet's own settings start with `nodelet.`), or
    /// `None` when neither the kubelet nor nodelet has one.
    pub field: Option<&'static str>,
    /// The kubelet's deprecation message (`Flag --NAME has been deprecated, MESSAGE`), if it deprecates it.
    pub deprecated: Option<&'static str>,
    /// How the value is given.
    pub value: Value,
    /// How nodelet's handling differs from the kubelet's, if it does (for the documentation).
    pub note: &'static str,
}

impl KubeletFlag {
    /// The line the kubelet prints for a deprecated flag given on the command line, if it is deprecated.
    pub fn deprecation_warning(&self) -> Option<String> {
        self.deprecated.map(|m| format!("Flag --{} has been deprecated, {m}", self.name))
    }

    /// The error for a refused flag given on the command line (`None` for an accepted flag).
    pub fn refusal(&self) -> Option<String> {
        let Handling::Refused(reason) = self.handling else { return None };
        Some(match self.field {
            Some(field) => format!(
                "the kubelet flag --{} is not supported by nodelet, nor its KubeletConfiguration field {field}: \
                 {reason}",
                self.name
            ),
            None => format!("the kubelet flag --{} is not supported by nodelet: {reason}", self.name),
        })
    }
}

/// The kubelet's message for the flags of its KubeletConfiguration fields.
const CONFIG_FILE: &str = "This parameter should be set via the config file specified by the Kubelet's --config \
    flag. See https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information.";
/// The kubelet's message for the cAdvisor flags it registers.
const CADVISOR: &str = "This is a cadvisor flag that was mistakenly registered with the Kubelet. Due to legacy \
    concerns, it will follow the standard CLI deprecation timeline before being removed.";
/// The kubelet's message for its cloud provider flags.
const CLOUD: &str =
    "will be removed in 1.25 or later, in favor of removing cloud provider code from Kubelet.";
/// The kubelet's message for its container garbage collection flags.
const CONTAINER_GC: &str =
    "Use --eviction-hard or --eviction-soft instead. Will be removed in a future version.";

/// Why nodelet refuses the cAdvisor flags.
const NO_CADVISOR: &str = "nodelet has no cAdvisor: it reads container statistics from the container runtime \
    (CRI) and the cgroup filesystem";
/// Why nodelet refuses the resource manager flags.
const NO_RESOURCE_MANAGERS: &str = "nodelet has no CPU, memory or topology manager: containers get the CPUs and \
    memory the runtime gives them";
/// Why nodelet refuses the node allocatable flags.
const NO_ALLOCATABLE: &str = "nodelet does not reserve resources for system daemons: node allocatable equals \
    capacity";
/// Why nodelet refuses the event rate flags.
const FIXED_EVENT_RATE: &str = "nodelet posts at most 100 events per 2 seconds (the kubelet's default eventRecordQPS \
    of 50), a fixed rate, within the API client's rate limit (--kube-api-qps, --kube-api-burst)";
/// Why nodelet refuses the cgroup hierarchy flags.
const NO_CGROUP_LAYOUT: &str = "nodelet does not manage a QoS or system cgroup hierarchy: pod cgroups are created \
    under cgroupRoot (--cgroup-root) only";

/// An accepted flag the kubelet does not deprecate.
const fn accepted(name: &'static str, field: Option<&'static str>, note: &'static str) -> KubeletFlag {
    KubeletFlag { name, handling: Handling::Accepted, field, deprecated: None, value: Value::One, note }
}

/// An accepted flag the kubelet deprecates because it stands for a config file field.
const fn config_flag(name: &'static str, field: &'static str, note: &'static str) -> KubeletFlag {
    KubeletFlag {
        name,
        handling: Handling::Accepted,
        field: Some(field),
        deprecated: Some(CONFIG_FILE),
        value: Value::One,
        note,
    }
}

/// A refused flag the kubelet deprecates because it stands for a config file field nodelet does not support.
const fn refused_field(name: &'static str, field: &'static str, reason: &'static str) -> KubeletFlag {
    KubeletFlag {
        name,
        handling: Handling::Refused(reason),
        field: Some(field),
        deprecated: Some(CONFIG_FILE),
        value: Value::One,
        note: "",
    }
}

/// A refused cAdvisor flag.
const fn cadvisor(name: &'static str) -> KubeletFlag {
    KubeletFlag {
        name,
        handling: Handling::Refused(NO_CADVISOR),
        field: None,
        deprecated: Some(CADVISOR),
        value: Value::One,
        note: "",
    }
}

/// A refused flag without a config field.
const fn refused(name: &'static str, deprecated: Option<&'static str>, reason: &'static str) -> KubeletFlag {
    KubeletFlag {
        name,
        handling: Handling::Refused(reason),
        field: None,
        deprecated,
        value: Value::One,
        note: "",
    }
}

impl KubeletFlag {
    /// The same flag, a boolean.
    const fn bool(self) -> Self {
        KubeletFlag { value: Value::Bool, ..self }
    }
    /// The same flag, deprecated with `message`.
    const fn deprecated(self, message: &'static str) -> Self {
        KubeletFlag { deprecated: Some(message), ..self }
    }
    /// The same flag, not deprecated by the kubelet.
    const fn not_deprecated(self) -> Self {
        KubeletFlag { deprecated: None, ..self }
    }
}

/// Every flag `kubelet --help` lists in v1.28 (`kubelet-v1.28.7-flags.tsv` is that list; a test compares the
/// two), in its order.
pub const KUBELET_FLAGS: &[KubeletFlag] = &[
    config_flag("address", "address", ""),
    config_flag(
        "allowed-unsafe-sysctls",
        "allowedUnsafeSysctls",
        "names or `prefix*` patterns; a pod with any other sysctl outside the safe set is refused at admission \
         (SysctlForbidden)",
    ),
    config_flag(
        "anonymous-auth",
        "authentication.anonymous.enabled",
        "nodelet's default is false (the kubelet's command-line default is true)",
    )
    .bool(),
    cadvisor("application-metrics-count-limit"),
    config_flag(
        "authentication-token-webhook",
        "authentication.webhook.enabled",
        "cluster mode (--kubeconfig) only; as the kubelet, true by default with a --config file, false with \
         flags alone",
    )
    .bool(),
    config_flag("authentication-token-webhook-cache-ttl", "authentication.webhook.cacheTTL", ""),
    config_flag(
        "authorization-mode",
        "authorization.mode",
        "AlwaysAllow or Webhook (cluster mode only). Default Webhook in cluster mode, also with flags alone \
         (the kubelet's command-line default is AlwaysAllow); AlwaysAllow in cluster mode with client \
         certificates, TokenReview or anonymous requests needs nodelet's --insecure-always-allow-authorization",
    ),
    config_flag("authorization-webhook-cache-authorized-ttl", "authorization.webhook.cacheAuthorizedTTL", ""),
    config_flag("authorization-webhook-cache-unauthorized-ttl", "authorization.webhook.cacheUnauthorizedTTL", ""),
    cadvisor("boot-id-file"),
    accepted(
        "bootstrap-kubeconfig",
        None,
        "the client certificate and key are stored under <root-dir>/pki (the kubelet's --cert-dir)",
    ),
    refused(
        "cert-dir",
        None,
        "nodelet keeps its certificates under <root-dir>/pki; set --root-dir, or --tls-cert-file and \
         --tls-private-key-file for the serving certificate",
    ),
    refused_field(
        "cgroup-driver",
        "cgroupDriver",
        "nodelet uses the cgroupfs driver only (its embedded containerd too); the systemd driver's slice \
         names are not supported",
    ),
    config_flag(
        "cgroup-root",
        "cgroupRoot",
        "nodelet creates pod<uid> cgroups under it (needed for --pod-max-pids); unset, the runtime places \
         containers",
    ),
    refused_field("cgroups-per-qos", "cgroupsPerQOS", NO_CGROUP_LAYOUT).bool(),
    config_flag("client-ca-file", "authentication.x509.clientCAFile", ""),
    refused(
        "cloud-config",
        Some(CLOUD),
        "nodelet has no cloud provider integration (the node's addresses come from --node-ip or the host)",
    ),
    refused(
        "cloud-provider",
        Some(CLOUD),
        "nodelet has no cloud provider integration: it neither taints the node as uninitialized for an \
         external cloud controller nor asks a cloud for the node's name and addresses",
    ),
    config_flag("cluster-dns", "clusterDNS", "repeatable, comma-separated"),
    config_flag("cluster-domain", "clusterDomain", ""),
    accepted(
        "config",
        None,
        "relative paths inside the file are relative to the file's directory, as in the kubelet",
    ),
    refused(
        "config-dir",
        None,
        "nodelet reads a single config file (--config); merge the drop-ins into it",
    ),
    cadvisor("container-hints"),
    config_flag("container-log-max-files", "containerLogMaxFiles", ""),
    config_flag("container-log-max-size", "containerLogMaxSize", ""),
    config_flag(
        "container-runtime-endpoint",
        "containerRuntimeEndpoint",
        "without it nodelet runs its own containerd (the kubelet's default is unix:///run/containerd/containerd.sock)",
    ),
    cadvisor("containerd"),
    cadvisor("containerd-namespace"),
    refused_field(
        "contention-profiling",
        "enableContentionProfiling",
        "nodelet has no profiling handlers",
    )
    .bool(),
    refused_field(
        "cpu-cfs-quota",
        "cpuCFSQuota",
        "the CPU limits of containers are always enforced with a CFS quota by the runtime",
    )
    .bool(),
    refused_field(
        "cpu-cfs-quota-period",
        "cpuCFSQuotaPeriod",
        "nodelet gives the runtime the kernel's default CFS period (100ms)",
    ),
    refused_field("cpu-manager-policy", "cpuManagerPolicy", NO_RESOURCE_MANAGERS),
    refused_field("cpu-manager-policy-options", "cpuManagerPolicyOptions", NO_RESOURCE_MANAGERS),
    refused_field("cpu-manager-reconcile-period", "cpuManagerReconcilePeriod", NO_RESOURCE_MANAGERS),
    refused_field(
        "enable-controller-attach-detach",
        "enableControllerAttachDetach",
        "nodelet always attaches and detaches CSI volumes itself (ControllerPublishVolume), as the kubelet does \
         with false; it does not leave them to the attach/detach controller",
    )
    .bool(),
    refused_field(
        "enable-debugging-handlers",
        "enableDebuggingHandlers",
        "nodelet always serves logs, exec, attach and port-forward on its main port, behind authentication \
         and authorization",
    )
    .bool(),
    cadvisor("enable-load-reader").bool(),
    config_flag("enable-server", "enableServer", "false runs no server: no main, read-only or healthz port")
        .bool(),
    refused_field("enforce-node-allocatable", "enforceNodeAllocatable", NO_ALLOCATABLE),
    refused_field("event-burst", "eventBurst", FIXED_EVENT_RATE),
    refused_field("event-qps", "eventRecordQPS", FIXED_EVENT_RATE),
    cadvisor("event-storage-age-limit"),
    cadvisor("event-storage-event-limit"),
    config_flag("eviction-hard", "evictionHard", ""),
    config_flag("eviction-max-pod-grace-period", "evictionMaxPodGracePeriod", ""),
    config_flag("eviction-minimum-reclaim", "evictionMinimumReclaim", ""),
    config_flag("eviction-pressure-transition-period", "evictionPressureTransitionPeriod", ""),
    config_flag("eviction-soft", "evictionSoft", ""),
    config_flag("eviction-soft-grace-period", "evictionSoftGracePeriod", ""),
    refused(
        "exit-on-lock-contention",
        None,
        "nodelet takes no lock file (see --lock-file); run one nodelet per --root-dir",
    )
    .bool(),
    refused(
        "experimental-allocatable-ignore-eviction",
        Some("will be removed in 1.25 or later."),
        "node allocatable equals capacity in nodelet: there is no eviction reserve to ignore",
    )
    .bool(),
    refused(
        "experimental-mounter-path",
        Some("will be removed in 1.25 or later. in favor of using CSI."),
        "nodelet has no external mounter: it mounts with the mount system call, and other volume types come \
         from CSI drivers",
    ),
    refused_field(
        "fail-swap-on",
        "failSwapOn",
        "nodelet does not check for swap and does not limit the swap use of containers",
    )
    .bool(),
    refused_field(
        "feature-gates",
        "featureGates",
        "nodelet has no feature gates: each feature it has is on, or set by its own field",
    ),
    config_flag("file-check-frequency", "fileCheckFrequency", ""),
    cadvisor("global-housekeeping-interval"),
    refused_field(
        "hairpin-mode",
        "hairpinMode",
        "the CNI network (the embedded runtime's bridge, or the external runtime's) decides hairpin traffic",
    ),
    config_flag("healthz-bind-address", "healthzBindAddress", ""),
    config_flag("healthz-port", "healthzPort", ""),
    accepted("help", None, "-h, as in the kubelet").bool(),
    accepted(
        "hostname-override",
        None,
        "the node name is lower-cased and must be a DNS subdomain, as in the kubelet",
    ),
    accepted(
        "housekeeping-interval",
        Some("nodelet.housekeepingInterval"),
        "how often pod statistics are gathered; the kubelet has no config field for it",
    ),
    config_flag("http-check-frequency", "httpCheckFrequency", ""),
    refused(
        "image-credential-provider-bin-dir",
        None,
        "nodelet has no credential provider plugins",
    ),
    refused(
        "image-credential-provider-config",
        None,
        "nodelet has no credential provider plugins",
    ),
    config_flag("image-gc-high-threshold", "imageGCHighThresholdPercent", ""),
    config_flag("image-gc-low-threshold", "imageGCLowThresholdPercent", ""),
    refused_field(
        "image-service-endpoint",
        "imageServiceEndpoint",
        "nodelet manages images through the runtime endpoint (--container-runtime-endpoint); a separate \
         image service is not supported",
    ),
    refused(
        "keep-terminated-pod-volumes",
        Some("will be removed in a future version"),
        "nodelet has no option to keep the volumes of terminated pods mounted",
    )
    .bool(),
    refused_field(
        "kernel-memcg-notification",
        "kernelMemcgNotification",
        "nodelet polls the memory signal every eviction monitoring period (nodelet.evictionMonitoringPeriod)",
    )
    .bool(),
    config_flag("kube-api-burst", "kubeAPIBurst", ""),
    refused_field(
        "kube-api-content-type",
        "contentType",
        "nodelet talks JSON to the API server (application/json); protobuf is not supported",
    ),
    config_flag("kube-api-qps", "kubeAPIQPS", ""),
    refused_field("kube-reserved", "kubeReserved", NO_ALLOCATABLE),
    refused_field("kube-reserved-cgroup", "kubeReservedCgroup", NO_ALLOCATABLE),
    accepted("kubeconfig", None, "enables cluster mode; without it nodelet runs static pods only"),
    refused_field("kubelet-cgroups", "kubeletCgroups", NO_CGROUP_LAYOUT),
    config_flag(
        "local-storage-capacity-isolation",
        "localStorageCapacityIsolation",
        "",
    )
    .bool(),
    refused(
        "lock-file",
        None,
        "nodelet takes no lock file; run one nodelet per --root-dir",
    ),
    cadvisor("log-cadvisor-usage").bool(),
    refused(
        "log-flush-frequency",
        None,
        "nodelet writes each log line at once (no buffer to flush); the kubelet's field is logging.flushFrequency, \
         which nodelet does not read",
    ),
    refused_field(
        "log-json-info-buffer-size",
        "logging.options.json.infoBufferSize",
        "nodelet's JSON log (--logging-format=json) is not buffered",
    ),
    refused_field(
        "log-json-split-stream",
        "logging.options.json.splitStream",
        "nodelet writes every log line to stderr",
    )
    .bool(),
    config_flag("logging-format", "logging.format", "text or json"),
    cadvisor("machine-id-file"),
    refused_field(
        "make-iptables-util-chains",
        "makeIPTablesUtilChains",
        "nodelet does not write iptables rules",
    )
    .bool(),
    config_flag("manifest-url", "staticPodURL", ""),
    config_flag("manifest-url-header", "staticPodURLHeader", "repeatable"),
    refused_field(
        "max-open-files",
        "maxOpenFiles",
        "nodelet does not change its own open file limit; set LimitNOFILE in its systemd unit",
    ),
    config_flag("max-pods", "maxPods", ""),
    KubeletFlag {
        name: "maximum-dead-containers",
        handling: Handling::Accepted,
        field: Some("nodelet.containerGC.maxContainers"),
        deprecated: Some(CONTAINER_GC),
        value: Value::One,
        note: "the kubelet has no config field for it",
    },
    KubeletFlag {
        name: "maximum-dead-containers-per-container",
        handling: Handling::Accepted,
        field: Some("nodelet.containerGC.maxPerPodContainer"),
        deprecated: Some(CONTAINER_GC),
        value: Value::One,
        note: "at least 1 (pod status shows the previous attempt); the kubelet has no config field for it",
    },
    refused_field("memory-manager-policy", "memoryManagerPolicy", NO_RESOURCE_MANAGERS),
    KubeletFlag {
        name: "minimum-container-ttl-duration",
        handling: Handling::Accepted,
        field: Some("nodelet.containerGC.minAge"),
        deprecated: Some(CONTAINER_GC),
        value: Value::One,
        note: "the kubelet has no config field for it",
    },
    config_flag("minimum-image-ttl-duration", "imageMinimumGCAge", ""),
    accepted("node-ip", None, "one IP, or an IPv4 and an IPv6 address; cluster mode only"),
    accepted("node-labels", None, "repeatable; the kubelet's rules for kubernetes.io labels"),
    refused_field(
        "node-status-max-images",
        "nodeStatusMaxImages",
        "nodelet lists at most 50 images (the kubelet's default) in the Node's status; the number is fixed",
    ),
    config_flag("node-status-update-frequency", "nodeStatusUpdateFrequency", ""),
    refused_field(
        "oom-score-adj",
        "oomScoreAdj",
        "nodelet does not change its own OOM score; set OOMScoreAdjust in its systemd unit",
    ),
    config_flag(
        "pod-cidr",
        "podCIDR",
        "the network of the embedded runtime's CNI bridge (when nodelet runs its own containerd)",
    ),
    accepted(
        "pod-infra-container-image",
        Some("nodelet.podInfraContainerImage"),
        "the sandbox image of the embedded containerd; the kubelet has no config field for it",
    )
    .deprecated(
        "will be removed in a future release. Image garbage collector will get sandbox image information from \
         CRI.",
    ),
    config_flag("pod-manifest-path", "staticPodPath", ""),
    config_flag(
        "pod-max-pids",
        "podPidsLimit",
        "needs --cgroup-root (the limit is the pod cgroup's pids.max)",
    ),
    refused_field(
        "pods-per-core",
        "podsPerCore",
        "nodelet bounds the pods of the node with maxPods (--max-pods) only",
    ),
    config_flag("port", "port", ""),
    refused_field(
        "protect-kernel-defaults",
        "protectKernelDefaults",
        "nodelet neither checks nor changes kernel tunables",
    )
    .bool(),
    refused_field(
        "provider-id",
        "providerID",
        "nodelet does not set the Node's spec.providerID (it has no cloud provider integration)",
    )
    .not_deprecated(),
    refused_field("qos-reserved", "qosReserved", NO_CGROUP_LAYOUT),
    config_flag("read-only-port", "readOnlyPort", "nodelet's default is 0 (off)"),
    config_flag("register-node", "registerNode", "cluster mode only").bool(),
    refused(
        "register-schedulable",
        Some("will be removed in a future version"),
        "nodelet registers the node schedulable; to keep pods off it, use --register-with-taints \
         node.kubernetes.io/unschedulable:NoSchedule",
    )
    .bool(),
    config_flag("register-with-taints", "registerWithTaints", "cluster mode only"),
    refused_field(
        "registry-burst",
        "registryBurst",
        "nodelet does not rate-limit image pulls",
    ),
    refused_field(
        "registry-qps",
        "registryPullQPS",
        "nodelet does not rate-limit image pulls",
    ),
    refused_field("reserved-cpus", "reservedSystemCPUs", NO_RESOURCE_MANAGERS),
    refused_field("reserved-memory", "reservedMemory", NO_RESOURCE_MANAGERS),
    config_flag("resolv-conf", "resolvConf", ""),
    accepted("root-dir", None, "nodelet's default is /var/lib/nodelet"),
    config_flag(
        "rotate-certificates",
        "rotateCertificates",
        "renews the client certificate of TLS bootstrap (--bootstrap-kubeconfig); cluster mode only",
    )
    .bool(),
    config_flag(
        "rotate-server-certificates",
        "serverTLSBootstrap",
        "the serving certificate comes from a CertificateSigningRequest; cluster mode only",
    )
    .bool(),
    refused_field(
        "runonce",
        "runOnce",
        "nodelet has no run-once mode: it runs until stopped",
    )
    .bool(),
    refused(
        "runtime-cgroups",
        None,
        "nodelet does not move the container runtime into a cgroup; set Slice= in the runtime's systemd unit",
    ),
    config_flag("runtime-request-timeout", "runtimeRequestTimeout", ""),
    KubeletFlag {
        name: "seccomp-default",
        handling: Handling::Accepted,
        field: Some("seccompDefault"),
        deprecated: None,
        value: Value::Bool,
        note: "",
    },
    refused_field(
        "serialize-image-pulls",
        "serializeImagePulls",
        "nodelet parses the field but does not enforce it yet",
    )
    .bool(),
    cadvisor("storage-driver-buffer-duration"),
    cadvisor("storage-driver-db"),
    cadvisor("storage-driver-host"),
    cadvisor("storage-driver-password"),
    cadvisor("storage-driver-secure").bool(),
    cadvisor("storage-driver-table"),
    cadvisor("storage-driver-user"),
    config_flag(
        "streaming-connection-idle-timeout",
        "streamingConnectionIdleTimeout",
        "closes exec, attach and port-forward sessions idle that long (4h by default, as the kubelet); 0 is \
         refused (the kubelet's 0 turns the timeout off)",
    ),
    config_flag("sync-frequency", "syncFrequency", ""),
    refused_field("system-cgroups", "systemCgroups", NO_CGROUP_LAYOUT),
    refused_field("system-reserved", "systemReserved", NO_ALLOCATABLE),
    refused_field("system-reserved-cgroup", "systemReservedCgroup", NO_ALLOCATABLE),
    config_flag("tls-cert-file", "tlsCertFile", ""),
    refused_field(
        "tls-cipher-suites",
        "tlsCipherSuites",
        "nodelet's TLS library (rustls) offers its own fixed set of modern cipher suites",
    ),
    refused_field(
        "tls-min-version",
        "tlsMinVersion",
        "nodelet always serves TLS 1.2 and 1.3 (rustls's safe defaults)",
    ),
    config_flag("tls-private-key-file", "tlsPrivateKeyFile", ""),
    refused_field("topology-manager-policy", "topologyManagerPolicy", NO_RESOURCE_MANAGERS),
    refused_field("topology-manager-policy-options", "topologyManagerPolicyOptions", NO_RESOURCE_MANAGERS),
    refused_field("topology-manager-scope", "topologyManagerScope", NO_RESOURCE_MANAGERS),
    accepted(
        "v",
        Some("logging.verbosity"),
        "-v, as in the kubelet: 0-1 info, 2-3 more detail, 4-5 debug, 6+ trace; RUST_LOG takes precedence",
    ),
    accepted(
        "version",
        None,
        "prints nodelet's version (-V); the kubelet's --version=raw and --version=vX.Y.Z are not supported",
    )
    .bool(),
    refused(
        "vmodule",
        None,
        "nodelet's per-module log levels are set with RUST_LOG (e.g. RUST_LOG=info,nodelet_cluster=debug); the \
         kubelet's field is logging.vmodule, which nodelet does not read",
    ),
    refused_field(
        "volume-plugin-dir",
        "volumePluginDir",
        "nodelet has no FlexVolume plugins; use CSI drivers",
    ),
    config_flag("volume-stats-agg-period", "volumeStatsAggPeriod", "must be greater than 0"),
];

/// The table entry of kubelet flag `name` (without `--`).
#[cfg(test)]
pub fn lookup(name: &str) -> Option<&'static KubeletFlag> {
    KUBELET_FLAGS.iter().find(|f| f.name == name)
}

/// The refused flags as hidden arguments, so that the parser takes their values the way the kubelet does and
/// [`refusals`] can name them. Their ids are their names: a field of [`super::RunArgs`] for the same flag
/// would be a duplicate, which clap's checks refuse.
pub fn refused_args() -> impl Iterator<Item = Arg> {
    KUBELET_FLAGS.iter().filter(|f| matches!(f.handling, Handling::Refused(_))).map(|f| {
        let arg = Arg::new(f.name).long(f.name).hide(true).action(ArgAction::Append);
        match f.value {
            Value::Bool => {
                arg.num_args(0..=1).require_equals(true).default_missing_value("true").value_name("BOOL")
            }
            Value::One => arg.num_args(1).value_name("VALUE").allow_hyphen_values(true),
        }
    })
}

/// The error messages of the refused kubelet flags given in `matches` (the daemon's), in the table's order.
pub fn refusals(matches: &ArgMatches) -> Vec<String> {
    KUBELET_FLAGS
        .iter()
        .filter(|f| {
            matches!(f.handling, Handling::Refused(_)) && matches.try_contains_id(f.name).unwrap_or(false)
        })
        .filter_map(KubeletFlag::refusal)
        .collect()
}

/// The kubelet's deprecation lines for the accepted deprecated flags given on the command line in `matches`
/// (parsed by `command`, the daemon's), in the table's order.
pub fn deprecation_warnings(command: &Command, matches: &ArgMatches) -> Vec<String> {
    KUBELET_FLAGS
        .iter()
        .filter(|f| f.handling == Handling::Accepted && f.deprecated.is_some())
        .filter(|f| {
            command.get_arguments().find(|a| a.get_long() == Some(f.name)).is_some_and(|a| {
                matches.value_source(a.get_id().as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
        })
        .filter_map(KubeletFlag::deprecation_warning)
        .collect()
}

/// `docs/kubelet-flags.md`: the table as Markdown (written by the test `kubelet_flags_doc_is_current`).
#[cfg(test)]
pub fn markdown() -> String {
    use std::fmt::Write as _;
    let count = |accepted: bool, deprecated: bool| {
        KUBELET_FLAGS
            .iter()
            .filter(|f| (f.handling == Handling::Accepted) == accepted)
            .filter(|f| !accepted || f.deprecated.is_some() == deprecated)
            .count()
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "# The kubelet's flags in nodelet\n\n\
         <!-- Generated from config/src/cli/kubelet_flags.rs by the test `kubelet_flags_doc_is_current`; do not edit. \
         Regenerate: NODELET_UPDATE_DOCS=1 cargo nextest run -p nodelet-config -E 'test(kubelet_flags_doc_is_current)' -->\n\n\
         Every flag of the kubelet v1.28 (`kubelet --help`), and what nodelet does with it: {} flags, {} accepted, \
         {} accepted and deprecated (nodelet logs the kubelet's deprecation line, `Flag --NAME has been \
         deprecated, …`, at start), {} refused.\n\n\
         - **accepted**: nodelet acts on the flag with the kubelet's meaning. A flag given explicitly wins over \
         the `--config` file's field, which wins over the default, as in the kubelet.\n\
         - **accepted, deprecated**: the same, and the kubelet deprecates the flag: nodelet logs the kubelet's \
         warning. Prefer the field in the `--config` file.\n\
         - **refused**: nodelet does not support the flag (nor its field): it exits before starting, with a \
         message naming the field and why (exit code 2). Remove the flag from the command line.\n\n\
         The field is the KubeletConfiguration (kubelet.config.k8s.io/v1beta1) field the flag stands for; \
         `nodelet.…` fields are nodelet's own (the kubelet has none for that flag). nodelet's flags that the \
         kubelet does not have are in `nodelet --help`.\n\n\
         | flag | nodelet | field | notes |\n|---|---|---|---|\n",
        KUBELET_FLAGS.len(),
        count(true, false),
        count(true, true),
        count(false, false),
    );
    for f in KUBELET_FLAGS {
        let handling = match (f.handling, f.deprecated) {
            (Handling::Accepted, None) => "accepted",
            (Handling::Accepted, Some(_)) => "accepted, deprecated",
            (Handling::Refused(_), _) => "refused",
        };
        let notes = match f.handling {
            Handling::Accepted => f.note,
            Handling::Refused(reason) => reason,
        };
        let field = f.field.map_or_else(|| "—".to_owned(), |field| format!("`{field}`"));
        let notes = notes.replace('|', "\\|").replace('<', "&lt;").replace('>', "&gt;");
        let _ = writeln!(out, "| `--{}` | {handling} | {field} | {notes} |", f.name);
    }
    out
}

#[cfg(test)]
mod tests;

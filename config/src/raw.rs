//! The KubeletConfiguration file as written (serde), before merging with flags and validation.
//!
//! Every field is optional: absent means "not set in the file", so a flag or the default applies. Field names
//! are the kubelet's (kubelet.config.k8s.io/v1beta1); nodelet's own settings live under the top-level
//! `nodelet:` key so a reader can tell them apart.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::units::GoDuration;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawKubeletConfiguration {
    pub(super) api_version: Option<String>,
    pub(super) kind: Option<String>,

    // pod sources
    pub(super) static_pod_path: Option<String>,
    #[serde(rename = "staticPodURL")]
    pub(super) static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    pub(super) static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    pub(super) file_check_frequency: Option<GoDuration>,
    pub(super) http_check_frequency: Option<GoDuration>,
    pub(super) sync_frequency: Option<GoDuration>,
    pub(super) volume_stats_agg_period: Option<GoDuration>,

    // serving
    pub(super) enable_server: Option<bool>,
    pub(super) address: Option<String>,
    pub(super) port: Option<i64>,
    pub(super) read_only_port: Option<i64>,
    pub(super) healthz_port: Option<i64>,
    pub(super) healthz_bind_address: Option<String>,
    pub(super) tls_cert_file: Option<String>,
    pub(super) tls_private_key_file: Option<String>,
    pub(super) rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    pub(super) server_tls_bootstrap: Option<bool>,
    pub(super) authentication: Option<RawAuthentication>,
    pub(super) authorization: Option<RawAuthorization>,
    pub(super) streaming_connection_idle_timeout: Option<GoDuration>,

    // runtime
    pub(super) container_runtime_endpoint: Option<String>,
    pub(super) image_service_endpoint: Option<String>,
    pub(super) runtime_request_timeout: Option<GoDuration>,
    pub(super) pod_logs_dir: Option<String>,
    pub(super) cgroup_root: Option<String>,
    #[serde(rename = "podCIDR")]
    pub(super) pod_cidr: Option<String>,
    pub(super) resolv_conf: Option<String>,
    pub(super) max_pods: Option<i64>,
    pub(super) seccomp_default: Option<bool>,
    pub(super) pod_pids_limit: Option<i64>,
    pub(super) allowed_unsafe_sysctls: Option<Vec<String>>,
    pub(super) crash_loop_back_off: Option<RawCrashLoopBackOff>,

    // DNS of ClusterFirst pods
    pub(super) cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub(super) cluster_dns: Option<Vec<String>>,

    // cluster mode (with --kubeconfig)
    pub(super) register_node: Option<bool>,
    pub(super) register_with_taints: Option<Vec<RawTaint>>,
    #[serde(rename = "kubeAPIQPS")]
    pub(super) kube_api_qps: Option<f64>,
    #[serde(rename = "kubeAPIBurst")]
    pub(super) kube_api_burst: Option<i64>,
    pub(super) node_status_update_frequency: Option<GoDuration>,
    pub(super) node_status_report_frequency: Option<GoDuration>,
    pub(super) node_lease_duration_seconds: Option<i64>,

    // parsed for later: eviction, image GC, log rotation, pulls
    pub(super) eviction_hard: Option<BTreeMap<String, String>>,
    pub(super) eviction_soft: Option<BTreeMap<String, String>>,
    pub(super) eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    pub(super) eviction_pressure_transition_period: Option<GoDuration>,
    pub(super) eviction_max_pod_grace_period: Option<i64>,
    pub(super) eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    pub(super) merge_default_eviction_settings: Option<bool>,
    pub(super) local_storage_capacity_isolation: Option<bool>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub(super) image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub(super) image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    pub(super) image_minimum_gc_age: Option<GoDuration>,
    #[serde(rename = "imageMaximumGCAge")]
    pub(super) image_maximum_gc_age: Option<GoDuration>,
    pub(super) container_log_max_size: Option<String>,
    pub(super) container_log_max_files: Option<i64>,
    pub(super) container_log_monitor_interval: Option<GoDuration>,
    pub(super) serialize_image_pulls: Option<bool>,
    pub(super) max_parallel_image_pulls: Option<i64>,

    /// `logging:` (component-base's LoggingConfiguration; `format` and `verbosity` are read).
    pub(super) logging: Option<RawLogging>,

    /// nodelet's own settings.
    pub(super) nodelet: Option<RawNodelet>,
}

/// `logging:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawLogging {
    pub(super) format: Option<String>,
    pub(super) verbosity: Option<i64>,
}

/// `authentication:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawAuthentication {
    pub(super) x509: Option<RawX509>,
    pub(super) webhook: Option<RawWebhookAuthn>,
    pub(super) anonymous: Option<RawAnonymous>,
}

/// `authentication.x509:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawX509 {
    #[serde(rename = "clientCAFile")]
    pub(super) client_ca_file: Option<String>,
}

/// `authentication.webhook:` (TokenReview through the cluster client; cluster mode only).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawWebhookAuthn {
    pub(super) enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub(super) cache_ttl: Option<GoDuration>,
}

/// `authentication.anonymous:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawAnonymous {
    pub(super) enabled: Option<bool>,
}

/// `authorization:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawAuthorization {
    pub(super) mode: Option<String>,
    pub(super) webhook: Option<RawWebhookAuthz>,
}

/// `authorization.webhook:` (SubjectAccessReview cache lifetimes).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawWebhookAuthz {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub(super) cache_authorized_ttl: Option<GoDuration>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub(super) cache_unauthorized_ttl: Option<GoDuration>,
}

/// One `registerWithTaints:` entry (a core/v1 Taint; `timeAdded` is not read).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawTaint {
    pub(super) key: Option<String>,
    pub(super) value: Option<String>,
    pub(super) effect: Option<String>,
}

/// `crashLoopBackOff:` (kubelet 1.32+, gate `KubeletCrashLoopBackOffMax`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawCrashLoopBackOff {
    pub(super) max_container_restart_period: Option<GoDuration>,
}

/// `nodelet:`: settings the kubelet does not have.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawNodelet {
    pub(super) allow_privileged: Option<bool>,
    pub(super) allowed_host_paths: Option<Vec<String>>,
    pub(super) max_termination_grace_period_seconds: Option<i64>,
    pub(super) pod_security: Option<RawPodSecurity>,
    pub(super) http_pod_namespaces: Option<Vec<String>>,
    pub(super) http_pod_labels: Option<Vec<String>>,
    pub(super) token_auth_file: Option<String>,
    pub(super) max_streaming_sessions_per_user: Option<i64>,
    #[serde(rename = "manifestHTTPAddress")]
    pub(super) manifest_http_address: Option<String>,
    pub(super) pod_infra_container_image: Option<String>,
    pub(super) containerd_path: Option<String>,
    pub(super) containerd_config_extra: Option<String>,
    pub(super) preload_images: Option<String>,
    pub(super) cni_bridge: Option<String>,
    pub(super) container_restart_back_off: Option<RawBackOff>,
    pub(super) image_pull_back_off: Option<RawBackOff>,
    pub(super) pleg_relist_period: Option<GoDuration>,
    pub(super) pleg_evented_relist_period: Option<GoDuration>,
    pub(super) housekeeping_interval: Option<GoDuration>,
    pub(super) storage: Option<RawStorage>,
    #[serde(rename = "imageGCPeriod")]
    pub(super) image_gc_period: Option<GoDuration>,
    pub(super) eviction_monitoring_period: Option<GoDuration>,
    pub(super) local_storage_entry_budget: Option<u64>,
    #[serde(rename = "containerGC")]
    pub(super) container_gc: Option<RawContainerGc>,
}

/// `nodelet.podSecurity:`: the Pod Security Standards level enforced per pod source.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawPodSecurity {
    pub(super) file: Option<String>,
    pub(super) url: Option<String>,
    pub(super) http: Option<String>,
    pub(super) api: Option<String>,
}

/// `nodelet.containerGC:`: dead container garbage collection (the kubelet's GC policy).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawContainerGc {
    pub(super) period: Option<GoDuration>,
    pub(super) min_age: Option<GoDuration>,
    pub(super) max_per_pod_container: Option<i64>,
    pub(super) max_containers: Option<i64>,
}

/// `nodelet.storage:`: the volume provisioners.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawStorage {
    pub(super) local_path: Option<RawLocalPath>,
    pub(super) lvm: Option<RawLvm>,
    pub(super) csi: Option<RawCsi>,
}

/// `nodelet.storage.localPath:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawLocalPath {
    pub(super) base_path: Option<String>,
}

/// `nodelet.storage.lvm:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawLvm {
    pub(super) volume_group: Option<String>,
}

/// `nodelet.storage.csi:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawCsi {
    pub(super) plugin_dir: Option<String>,
}

/// A back-off policy: first delay, cap, and how long a success must last for the delay to start over.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawBackOff {
    pub(super) initial: Option<GoDuration>,
    pub(super) max: Option<GoDuration>,
    pub(super) reset_after: Option<GoDuration>,
}

/// Every field of kubelet.config.k8s.io/v1beta1 KubeletConfiguration (top level and the nested structs nodelet
/// reads), so an ignored field can be told apart from a typo. Paths as serde_ignored reports them.
pub(super) const KUBELET_FIELDS: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authentication.x509",
    "authentication.webhook",
    "authentication.anonymous",
    "authorization",
    "authorization.mode",
    "authorization.webhook",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "kubeletCgroups",
    "systemCgroups",
    "cgroupRoot",
    "cgroupsPerQOS",
    "cgroupDriver",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "runtimeRequestTimeout",
    "hairpinMode",
    "maxPods",
    "podCIDR",
    "podPidsLimit",
    "resolvConf",
    "runOnce",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "failSwapOn",
    "failCgroupV1",
    "memorySwap",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReserved",
    "kubeReserved",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "enforceNodeAllocatable",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "logging.flushFrequency",
    "logging.vmodule",
    "logging.options",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "memoryThrottlingFactor",
    "registerWithTaints",
    "registerNode",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failSwapOn",
    "userNamespaces",
    "podHousekeepingPeriod",
];

//! Merging each section of [`Config`](super::Config) from its raw inputs: the command-line flags
//! ([`RunArgs`]), the parsed config file ([`RawKubeletConfiguration`]) and the host's facts. Each function
//! validates one section and returns it or the first [`ConfigError`];
//! [`Config::resolve`](super::Config::resolve) composes them in a fixed order, so errors and warnings come out
//! in the same order for the same input.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodelet_resources::pod::security::UnknownLevel;

use super::raw::{RawKubeletConfiguration, RawNodelet};
use super::{
    AuthConfig, BackOffConfig, ConfigError, ConfigWarning, ContainerLogConfig, DEFAULT_ADDRESS,
    DEFAULT_CNI_BRIDGE, DEFAULT_CONTAINER_LOG_MAX_FILES, DEFAULT_CONTAINER_LOG_MAX_SIZE,
    DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL, DEFAULT_CONTAINER_RESTART_BACKOFF, DEFAULT_CONTAINERD_PATH,
    DEFAULT_EVICTION_MONITORING_PERIOD, DEFAULT_FILE_CHECK_FREQUENCY, DEFAULT_HEALTHZ_BIND_ADDRESS,
    DEFAULT_HEALTHZ_PORT, DEFAULT_HOUSEKEEPING_INTERVAL, DEFAULT_HTTP_CHECK_FREQUENCY,
    DEFAULT_HTTP_POD_NAMESPACE, DEFAULT_IMAGE_GC_PERIOD, DEFAULT_IMAGE_PULL_BACKOFF, DEFAULT_MAX_PODS,
    DEFAULT_PLEG_EVENTED_RELIST_PERIOD, DEFAULT_PLEG_RELIST_PERIOD, DEFAULT_POD_INFRA_CONTAINER_IMAGE,
    DEFAULT_POD_LOGS_DIR, DEFAULT_PORT, DEFAULT_READ_ONLY_PORT, DEFAULT_RESOLV_CONF, DEFAULT_ROOT_DIR,
    DEFAULT_RUNTIME_REQUEST_TIMEOUT, DEFAULT_SYNC_FREQUENCY, DEFAULT_VOLUME_STATS_AGG_PERIOD,
    EmbeddedRuntimeConfig, EvictionConfig, GoDuration, HostFacts, ImageGcConfig, ImagePullConfig,
    MIN_CONTAINER_LOG_MONITOR_INTERVAL, Merger, NOT_YET_ENFORCED, PodSecurityLevels, PodsConfig,
    RuntimeConfig, ServerConfig, SourcesConfig, StorageConfig, TlsFiles, always_allow_in_a_cluster, clone_io,
    default_pod_cidr, eviction_flags, parse_header_flag, parse_quantity, raw_field_set, valid_ifname,
    validate_cgroup, validate_endpoint, validate_header, validate_image_ref, validate_node_name,
    validate_url,
};
use crate::cli::RunArgs;

/// The periods of the node's loops, top-level fields of [`Config`](super::Config).
#[derive(Debug, Clone, Copy)]
pub(super) struct Periods {
    /// `syncFrequency`.
    pub(super) sync_frequency: Duration,
    /// `nodelet.plegRelistPeriod`.
    pub(super) pleg_relist_period: Duration,
    /// `nodelet.plegEventedRelistPeriod`.
    pub(super) pleg_evented_relist_period: Duration,
    /// `nodelet.housekeepingInterval`.
    pub(super) housekeeping_interval: Duration,
}

impl Merger<'_> {
    /// The node's name (`--hostname-override`, else the machine's hostname) and `--root-dir`.
    pub(super) fn node(&self, args: &RunArgs, host: &HostFacts) -> Result<(String, PathBuf), ConfigError> {
        let node_name = match &args.hostname_override {
            Some(h) => {
                validate_node_name(h).map_err(|e| self.flag_err("--hostname-override", e.to_string()))?
            }
            None => {
                let h = host.hostname.as_ref().map_err(|e| ConfigError::Hostname(clone_io(e)))?;
                validate_node_name(h).map_err(|msg| ConfigError::Invalid {
                    origin: "hostname".into(),
                    message: format!("{msg}; set --hostname-override"),
                })?
            }
        };
        let root_dir = match &args.root_dir {
            Some(p) => self.flag_path("--root-dir", p)?,
            None => PathBuf::from(DEFAULT_ROOT_DIR),
        };
        Ok((node_name, root_dir))
    }

    /// The pod sources (`staticPodPath`, `staticPodURL` and its headers, the check frequencies, nodelet's
    /// manifest endpoint) and the periods of the pod workers, PLEG and housekeeping.
    pub(super) fn sources(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<(SourcesConfig, Periods), ConfigError> {
        let static_pod_path = self.path_opt(
            args.pod_manifest_path.as_deref(),
            "--pod-manifest-path",
            raw.static_pod_path.as_deref(),
            "staticPodPath",
        )?;
        let static_pod_url = match (&args.manifest_url, &raw.static_pod_url) {
            (Some(u), _) => Some((u.clone(), self.flag_origin("--manifest-url"))),
            (None, Some(u)) if !u.is_empty() => Some((u.clone(), self.file_origin("staticPodURL"))),
            _ => None,
        };
        let static_pod_url = match static_pod_url {
            Some((u, origin)) => {
                Some(validate_url(&u).map_err(|e| ConfigError::Invalid { origin, message: e.to_string() })?)
            }
            None => None,
        };
        let static_pod_url_headers = if !args.manifest_url_header.is_empty() {
            let mut out = Vec::new();
            for h in &args.manifest_url_header {
                out.extend(
                    parse_header_flag(h)
                        .map_err(|e| self.flag_err("--manifest-url-header", e.to_string()))?,
                );
            }
            out
        } else {
            let mut out = Vec::new();
            for (name, values) in raw.static_pod_url_header.iter().flatten() {
                for v in values {
                    validate_header(name, v)
                        .map_err(|e| self.file_err("staticPodURLHeader", e.to_string()))?;
                    out.push((name.clone(), v.clone()));
                }
            }
            out
        };
        if static_pod_url.is_none() && !static_pod_url_headers.is_empty() {
            warnings.push(ConfigWarning {
                field: "staticPodURLHeader".into(),
                message: "headers given without a manifest URL; ignored".into(),
            });
        }
        let file_check_frequency = self.positive_duration(
            args.file_check_frequency,
            "--file-check-frequency",
            raw.file_check_frequency,
            "fileCheckFrequency",
            DEFAULT_FILE_CHECK_FREQUENCY,
        )?;
        let http_check_frequency = self.positive_duration(
            args.http_check_frequency,
            "--http-check-frequency",
            raw.http_check_frequency,
            "httpCheckFrequency",
            DEFAULT_HTTP_CHECK_FREQUENCY,
        )?;
        let sync_frequency = self.positive_duration(
            args.sync_frequency,
            "--sync-frequency",
            raw.sync_frequency,
            "syncFrequency",
            DEFAULT_SYNC_FREQUENCY,
        )?;
        let pleg_relist_period = self.positive_duration(
            None,
            "",
            nodelet.pleg_relist_period,
            "nodelet.plegRelistPeriod",
            DEFAULT_PLEG_RELIST_PERIOD,
        )?;
        let pleg_evented_relist_period = self.positive_duration(
            None,
            "",
            nodelet.pleg_evented_relist_period,
            "nodelet.plegEventedRelistPeriod",
            DEFAULT_PLEG_EVENTED_RELIST_PERIOD,
        )?;
        let housekeeping_interval = self.positive_duration(
            None,
            "",
            nodelet.housekeeping_interval,
            "nodelet.housekeepingInterval",
            DEFAULT_HOUSEKEEPING_INTERVAL,
        )?;
        let manifest_http_addr = match (args.manifest_http_addr, &nodelet.manifest_http_address) {
            (Some(a), _) => Some(a),
            (None, Some(s)) if !s.is_empty() => Some(s.parse::<SocketAddr>().map_err(|_| {
                self.file_err("nodelet.manifestHTTPAddress", format!("{s:?} is not an IP:PORT address"))
            })?),
            _ => None,
        };

        if let Some(addr) = manifest_http_addr
            && !addr.ip().is_loopback()
        {
            warnings.push(ConfigWarning {
                field: "nodelet.manifestHTTPAddress".into(),
                message: format!(
                    "the manifest endpoint {addr} is for local use (whoever has its token can run pods); bind it to \
                     127.0.0.1"
                ),
            });
        }
        Ok((
            SourcesConfig {
                static_pod_path,
                static_pod_url,
                static_pod_url_headers,
                file_check_frequency,
                http_check_frequency,
                manifest_http_addr,
            },
            Periods { sync_frequency, pleg_relist_period, pleg_evented_relist_period, housekeeping_interval },
        ))
    }

    /// The kubelet API server: listen addresses and ports, TLS files, authentication and authorization,
    /// streaming sessions. Warns about exposed unauthenticated or anonymous ports.
    pub(super) fn server(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
        root_dir: &Path,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<ServerConfig, ConfigError> {
        let address =
            self.ip(args.address, "--address", raw.address.as_deref(), "address", DEFAULT_ADDRESS)?;
        let port = self.port(args.port, "--port", raw.port, "port", DEFAULT_PORT)?;
        if port == 0 {
            return Err(self.origin_err(
                args.port.is_some(),
                "--port",
                "port",
                "must be between 1 and 65535".into(),
            ));
        }
        let read_only_port = self.port(
            args.read_only_port,
            "--read-only-port",
            raw.read_only_port,
            "readOnlyPort",
            DEFAULT_READ_ONLY_PORT,
        )?;
        let healthz_port = self.port(
            args.healthz_port,
            "--healthz-port",
            raw.healthz_port,
            "healthzPort",
            DEFAULT_HEALTHZ_PORT,
        )?;
        let healthz_ip = self.ip(
            args.healthz_bind_address,
            "--healthz-bind-address",
            raw.healthz_bind_address.as_deref(),
            "healthzBindAddress",
            DEFAULT_HEALTHZ_BIND_ADDRESS,
        )?;
        let cert = self.path_opt(
            args.tls_cert_file.as_deref(),
            "--tls-cert-file",
            raw.tls_cert_file.as_deref(),
            "tlsCertFile",
        )?;
        let key = self.path_opt(
            args.tls_private_key_file.as_deref(),
            "--tls-private-key-file",
            raw.tls_private_key_file.as_deref(),
            "tlsPrivateKeyFile",
        )?;
        let tls = match (cert, key) {
            (Some(cert_file), Some(key_file)) => Some(TlsFiles { cert_file, key_file }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Invalid {
                    origin: "--tls-cert-file / tlsCertFile".into(),
                    message:
                        "a certificate needs its private key (--tls-private-key-file / tlsPrivateKeyFile)"
                            .into(),
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Invalid {
                    origin: "--tls-private-key-file / tlsPrivateKeyFile".into(),
                    message: "a private key needs its certificate (--tls-cert-file / tlsCertFile)".into(),
                });
            }
        };
        let authn = raw.authentication.as_ref();
        let client_ca_file = self.path_opt(
            args.client_ca_file.as_deref(),
            "--client-ca-file",
            authn.and_then(|a| a.x509.as_ref()).and_then(|x| x.client_ca_file.as_deref()),
            "authentication.x509.clientCAFile",
        )?;
        let token_auth_file = self.path_opt(
            args.token_auth_file.as_deref(),
            "--token-auth-file",
            nodelet.token_auth_file.as_deref(),
            "nodelet.tokenAuthFile",
        )?;
        let anonymous = args
            .anonymous_auth
            .or(authn.and_then(|a| a.anonymous.as_ref()).and_then(|a| a.enabled))
            .unwrap_or(false);
        let (token_webhook, authorization) = self.webhooks(args, raw, warnings)?;
        always_allow_in_a_cluster(
            args,
            authorization,
            client_ca_file.is_some(),
            token_webhook.is_some(),
            anonymous,
            warnings,
        )?;
        let enabled = raw.enable_server.unwrap_or(true);
        if enabled
            && !anonymous
            && client_ca_file.is_none()
            && token_auth_file.is_none()
            && token_webhook.is_none()
        {
            warnings.push(ConfigWarning {
                field: "authentication".into(),
                message: format!(
                    "no authenticator configured: port {port} will refuse every request; set --client-ca-file, \
                     --token-auth-file or --authentication-token-webhook (or --read-only-port for local \
                     unauthenticated reads)"
                ),
            });
        }
        if enabled && anonymous && !address.is_loopback() {
            warnings.push(ConfigWarning {
                field: "authentication.anonymous.enabled".into(),
                message: format!(
                    "anonymous requests are allowed on {address}:{port}: anyone who reaches it can read pods and \
                     logs"
                ),
            });
        }
        if read_only_port != 0 && !address.is_loopback() {
            warnings.push(ConfigWarning {
                field: "readOnlyPort".into(),
                message: format!(
                    "the read-only port {read_only_port} serves pod specs without authentication on {address}; \
                     prefer --address 127.0.0.1 or port 0"
                ),
            });
        }
        let streaming_connection_idle_timeout =
            match (args.streaming_connection_idle_timeout, raw.streaming_connection_idle_timeout) {
                (Some(d), _) if d.0.is_zero() => {
                    return Err(self.flag_err(
                        "--streaming-connection-idle-timeout",
                        "must be greater than 0: nodelet always closes idle streaming sessions".into(),
                    ));
                }
                (Some(d), _) => d.0,
                (None, Some(d)) if d.0.is_zero() => {
                    warnings.push(ConfigWarning {
                        field: "streamingConnectionIdleTimeout".into(),
                        message: format!(
                            "0s in a config file means the default, {} (as the kubelet)",
                            GoDuration(crate::DEFAULT_STREAMING_IDLE_TIMEOUT)
                        ),
                    });
                    crate::DEFAULT_STREAMING_IDLE_TIMEOUT
                }
                (None, Some(d)) => d.0,
                (None, None) => crate::DEFAULT_STREAMING_IDLE_TIMEOUT,
            };
        let max_sessions = crate::MAX_STREAMING_SESSIONS;
        let max_streaming_sessions_per_user = match nodelet.max_streaming_sessions_per_user {
            None => crate::DEFAULT_MAX_STREAMING_SESSIONS_PER_USER,
            Some(n) => {
                usize::try_from(n).ok().filter(|n| (1..=max_sessions).contains(n)).ok_or_else(|| {
                    self.file_err(
                        "nodelet.maxStreamingSessionsPerUser",
                        format!(
                            "{n} is not between 1 and {max_sessions} (the node's limit of streaming sessions)"
                        ),
                    )
                })?
            }
        };
        let server = ServerConfig {
            enabled,
            address,
            port,
            read_only_port: (read_only_port != 0).then_some(read_only_port),
            healthz: (healthz_port != 0).then_some(SocketAddr::new(healthz_ip, healthz_port)),
            tls,
            cert_dir: root_dir.join("pki"),
            auth: AuthConfig { client_ca_file, token_auth_file, anonymous, token_webhook, authorization },
            streaming_connection_idle_timeout,
            max_streaming_sessions_per_user,
        };
        Ok(server)
    }

    /// The container runtime: the CRI endpoint (or the embedded containerd and its pod network), the
    /// request timeout, the sandbox image and the images to preload.
    pub(super) fn runtime(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<RuntimeConfig, ConfigError> {
        let endpoint = match (&args.container_runtime_endpoint, &raw.container_runtime_endpoint) {
            (Some(e), _) => Some(
                validate_endpoint(e)
                    .map_err(|e| self.flag_err("--container-runtime-endpoint", e.to_string()))?,
            ),
            (None, Some(e)) if !e.is_empty() => Some(
                validate_endpoint(e).map_err(|e| self.file_err("containerRuntimeEndpoint", e.to_string()))?,
            ),
            _ => None,
        };
        if let Some(image_ep) = raw.image_service_endpoint.as_deref().filter(|e| !e.is_empty())
            && Some(image_ep) != endpoint.as_deref()
        {
            warnings.push(ConfigWarning {
                field: "imageServiceEndpoint".into(),
                message: "a separate image service is not supported: images are managed through the runtime \
                          endpoint; ignored"
                    .into(),
            });
        }
        let request_timeout = self.positive_duration(
            args.runtime_request_timeout,
            "--runtime-request-timeout",
            raw.runtime_request_timeout,
            "runtimeRequestTimeout",
            DEFAULT_RUNTIME_REQUEST_TIMEOUT,
        )?;
        let (image, image_origin) =
            match (&args.pod_infra_container_image, &nodelet.pod_infra_container_image) {
                (Some(i), _) => (i.clone(), self.flag_origin("--pod-infra-container-image")),
                (None, Some(i)) => (i.clone(), self.file_origin("nodelet.podInfraContainerImage")),
                (None, None) => (DEFAULT_POD_INFRA_CONTAINER_IMAGE.to_owned(), String::new()),
            };
        validate_image_ref(&image)
            .map_err(|e| ConfigError::Invalid { origin: image_origin, message: e.to_string() })?;
        let (cidr, cidr_origin) = match (&args.pod_cidr, &raw.pod_cidr) {
            (Some(c), _) => (c.clone(), self.flag_origin("--pod-cidr")),
            (None, Some(c)) if !c.is_empty() => (c.clone(), self.file_origin("podCIDR")),
            _ => (String::new(), String::new()),
        };
        let pod_cidr = if cidr.is_empty() {
            default_pod_cidr()
        } else {
            cidr.parse().map_err(|e: nodelet_node::cidr::CidrError| ConfigError::Invalid {
                origin: cidr_origin,
                message: e.to_string(),
            })?
        };
        let cni_bridge = nodelet.cni_bridge.clone().unwrap_or_else(|| DEFAULT_CNI_BRIDGE.to_owned());
        if !valid_ifname(&cni_bridge) {
            return Err(self.file_err(
                "nodelet.cniBridge",
                format!("{cni_bridge:?} is not a network interface name (1-15 of [A-Za-z0-9_.-])"),
            ));
        }
        let containerd_path = match (&args.containerd_path, &nodelet.containerd_path) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) if !p.is_empty() => {
                let p = PathBuf::from(p);
                // a bare name is looked up on PATH; a path with a slash is relative to the file
                if p.components().count() > 1 { self.file_path("nodelet.containerdPath", &p)? } else { p }
            }
            _ => PathBuf::from(DEFAULT_CONTAINERD_PATH),
        };
        let config_extra = self.path_opt(
            args.containerd_config_extra.as_deref(),
            "--containerd-config-extra",
            nodelet.containerd_config_extra.as_deref(),
            "nodelet.containerdConfigExtra",
        )?;
        let preload_images = self.path_opt(
            args.preload_images.as_deref(),
            "--preload-images",
            nodelet.preload_images.as_deref(),
            "nodelet.preloadImages",
        )?;
        let runtime = RuntimeConfig {
            endpoint,
            request_timeout,
            pod_infra_container_image: image,
            embedded: EmbeddedRuntimeConfig { containerd_path, config_extra, pod_cidr, cni_bridge },
            preload_images,
        };
        Ok(runtime)
    }

    /// `nodelet.storage` (the volume provisioners) and `volumeStatsAggPeriod`.
    pub(super) fn storage(
        &self,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
        root_dir: &Path,
    ) -> Result<StorageConfig, ConfigError> {
        let raw_storage = nodelet.storage.as_ref();
        let local_base_path = match raw_storage
            .and_then(|s| s.local_path.as_ref())
            .and_then(|l| l.base_path.as_deref())
        {
            Some(p) if !p.is_empty() => self.file_path("nodelet.storage.localPath.basePath", Path::new(p))?,
            _ => root_dir.join("storage").join("local"),
        };
        let lvm_volume_group =
            match raw_storage.and_then(|s| s.lvm.as_ref()).and_then(|l| l.volume_group.clone()) {
                Some(vg) if vg.is_empty() => None,
                Some(vg) if !nodelet_storage::lvm::valid_lvm_name(&vg) => {
                    return Err(self.file_err(
                    "nodelet.storage.lvm.volumeGroup",
                    format!(
                        "{vg:?} is not a valid LVM volume group name ([A-Za-z0-9+_.-], not starting with '-')"
                    ),
                ));
                }
                other => other,
            };
        let csi_plugin_dir =
            match raw_storage.and_then(|s| s.csi.as_ref()).and_then(|c| c.plugin_dir.as_deref()) {
                Some(p) if !p.is_empty() => self.file_path("nodelet.storage.csi.pluginDir", Path::new(p))?,
                _ => root_dir.join("plugins_registry"),
            };
        let volume_stats_agg_period = self.positive_duration(
            None,
            "",
            raw.volume_stats_agg_period,
            "volumeStatsAggPeriod",
            DEFAULT_VOLUME_STATS_AGG_PERIOD,
        )?;
        let storage =
            StorageConfig { local_base_path, lvm_volume_group, csi_plugin_dir, volume_stats_agg_period };
        Ok(storage)
    }

    /// What pods may do and get: log and cgroup directories, DNS, limits, privileges, the pod security
    /// level of each source and the namespaces and labels of HTTP pods.
    pub(super) fn pods(
        &self,
        args: &RunArgs,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
    ) -> Result<PodsConfig, ConfigError> {
        let pod_logs_dir = self
            .path_opt(
                args.pod_logs_dir.as_deref(),
                "--pod-logs-dir",
                raw.pod_logs_dir.as_deref(),
                "podLogsDir",
            )?
            .unwrap_or_else(|| PathBuf::from(DEFAULT_POD_LOGS_DIR));
        let resolv_conf = match (&args.resolv_conf, &raw.resolv_conf) {
            (Some(s), _) if s.is_empty() => None,
            (Some(s), _) => Some(self.flag_path("--resolv-conf", Path::new(s))?),
            (None, Some(s)) if s.is_empty() => None,
            (None, Some(s)) => Some(self.file_path("resolvConf", Path::new(s))?),
            (None, None) => Some(PathBuf::from(DEFAULT_RESOLV_CONF)),
        };
        let cgroup_root = match (&args.cgroup_root, &raw.cgroup_root) {
            (Some(c), _) => validate_cgroup(c).map_err(|e| self.flag_err("--cgroup-root", e.to_string()))?,
            (None, Some(c)) => validate_cgroup(c).map_err(|e| self.file_err("cgroupRoot", e.to_string()))?,
            (None, None) => None,
        };
        let max_pods = match (args.max_pods, raw.max_pods) {
            (Some(n), _) => {
                if n == 0 {
                    return Err(self.flag_err("--max-pods", "must be at least 1".into()));
                }
                n
            }
            (None, Some(n)) => u32::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| self.file_err("maxPods", format!("{n} is not between 1 and {}", u32::MAX)))?,
            (None, None) => DEFAULT_MAX_PODS,
        };
        let pod_pids_limit = match (args.pod_max_pids, raw.pod_pids_limit) {
            (Some(n), _) if n < -1 => return Err(self.flag_err("--pod-max-pids", format!("{n} is below -1"))),
            (None, Some(n)) if n < -1 => {
                return Err(self.file_err("podPidsLimit", format!("{n} is below -1")));
            }
            (Some(n), _) | (None, Some(n)) => (n > 0).then_some(n),
            (None, None) => None,
        };
        // The limit is the pod cgroup's pids.max: without a cgroup root the runtime puts every container in
        // a cgroup of its own and there is no pod cgroup to limit.
        if let Some(n) = pod_pids_limit
            && cgroup_root.is_none()
        {
            return Err(self.origin_err(
                args.pod_max_pids.is_some(),
                "--pod-max-pids",
                "podPidsLimit",
                format!(
                    "{n} needs a pod cgroup: set cgroupRoot (--cgroup-root) to a cgroup like /nodelet, under \
                     which each pod gets pod<uid> with this limit"
                ),
            ));
        }
        let max_grace_period =
            match (args.max_termination_grace_period, nodelet.max_termination_grace_period_seconds) {
                (Some(n), _) if n < 0 => {
                    return Err(self.flag_err("--max-termination-grace-period", format!("{n} is negative")));
                }
                (None, Some(n)) if n < 0 => {
                    return Err(
                        self.file_err("nodelet.maxTerminationGracePeriodSeconds", format!("{n} is negative"))
                    );
                }
                (Some(n), _) | (None, Some(n)) => Some(Duration::from_secs(n.unsigned_abs())),
                (None, None) => None,
            };
        let allow_privileged = args.allow_privileged.or(nodelet.allow_privileged).unwrap_or(true);
        let mut allowed_host_paths = Vec::new();
        for (i, p) in nodelet.allowed_host_paths.iter().flatten().enumerate() {
            let path = PathBuf::from(p);
            if !path.is_absolute() || path.components().any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(self.file_err(
                    &format!("nodelet.allowedHostPaths[{i}]"),
                    format!("{p:?} must be an absolute path without `..`"),
                ));
            }
            allowed_host_paths.push(path);
        }
        let mut pod_security = PodSecurityLevels::default();
        if let Some(levels) = &nodelet.pod_security {
            for (name, value, slot) in [
                ("file", &levels.file, &mut pod_security.file),
                ("url", &levels.url, &mut pod_security.url),
                ("http", &levels.http, &mut pod_security.http),
                ("api", &levels.api, &mut pod_security.api),
            ] {
                if let Some(value) = value {
                    *slot = value.parse().map_err(|e: UnknownLevel| {
                        self.file_err(&format!("nodelet.podSecurity.{name}"), e.to_string())
                    })?;
                }
            }
        }
        let http_pod_namespaces = nodelet
            .http_pod_namespaces
            .clone()
            .unwrap_or_else(|| vec![DEFAULT_HTTP_POD_NAMESPACE.to_owned()]);
        for (i, namespace) in http_pod_namespaces.iter().enumerate() {
            if !nodelet_resources::common::names::is_dns_label(namespace) {
                return Err(self.file_err(
                    &format!("nodelet.httpPodNamespaces[{i}]"),
                    format!("{namespace:?} is not a namespace name (an RFC 1123 label)"),
                ));
            }
        }
        let http_pod_labels = nodelet.http_pod_labels.clone().unwrap_or_default();
        for (i, key) in http_pod_labels.iter().enumerate() {
            if !crate::is_label_key(key) {
                return Err(self.file_err(
                    &format!("nodelet.httpPodLabels[{i}]"),
                    format!("{key:?} is not a label key ([prefix/]name)"),
                ));
            }
        }
        let seccomp_default = raw.seccomp_default.unwrap_or(false);
        let allowed_unsafe_sysctls: Vec<String> = if args.allowed_unsafe_sysctls.is_empty() {
            raw.allowed_unsafe_sysctls.clone().unwrap_or_default()
        } else {
            args.allowed_unsafe_sysctls
                .iter()
                .flat_map(|s| s.split(','))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        if let Err(e) = nodelet_resources::common::sysctl::SysctlAllowlist::new(&allowed_unsafe_sysctls) {
            return Err(self.origin_err(
                !args.allowed_unsafe_sysctls.is_empty(),
                "--allowed-unsafe-sysctls",
                "allowedUnsafeSysctls",
                e.to_string(),
            ));
        }
        let cluster_dns = self.cluster_dns(args, raw)?;
        let cluster_domain = self.cluster_domain(args, raw)?;
        let pods = PodsConfig {
            pod_logs_dir,
            resolv_conf,
            cgroup_root,
            max_pods,
            pod_pids_limit,
            max_grace_period,
            allow_privileged,
            allowed_host_paths,
            pod_security,
            http_pod_namespaces,
            http_pod_labels,
            seccomp_default,
            allowed_unsafe_sysctls,
            cluster_dns,
            cluster_domain,
        };
        Ok(pods)
    }

    /// The retry delays of crashed containers and failed image pulls.
    pub(super) fn backoffs(
        &self,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
    ) -> Result<BackOffConfig, ConfigError> {
        let kubelet_max = raw.crash_loop_back_off.as_ref().and_then(|c| c.max_container_restart_period);
        if let Some(max) = kubelet_max
            && !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&max.0)
        {
            return Err(self.file_err(
                "crashLoopBackOff.maxContainerRestartPeriod",
                format!("{max} is not between 1s and 300s"),
            ));
        }
        let container_restart = self.backoff(
            nodelet.container_restart_back_off.as_ref(),
            "nodelet.containerRestartBackOff",
            DEFAULT_CONTAINER_RESTART_BACKOFF,
            kubelet_max.map(|d| d.0),
        )?;
        let image_pull = self.backoff(
            nodelet.image_pull_back_off.as_ref(),
            "nodelet.imagePullBackOff",
            DEFAULT_IMAGE_PULL_BACKOFF,
            None,
        )?;
        let backoff = BackOffConfig { container_restart, image_pull };
        Ok(backoff)
    }

    /// Node-pressure eviction: the `--eviction-*` flags merged into the file's thresholds, the monitoring
    /// period and the local storage entry budget.
    pub(super) fn eviction_config(
        &self,
        args: &RunArgs,
        raw: &mut RawKubeletConfiguration,
        nodelet: &RawNodelet,
    ) -> Result<EvictionConfig, ConfigError> {
        eviction_flags(args, raw)?;
        let mut eviction = self.eviction(raw)?;
        eviction.monitoring_period = self.positive_duration(
            None,
            "",
            nodelet.eviction_monitoring_period,
            "nodelet.evictionMonitoringPeriod",
            DEFAULT_EVICTION_MONITORING_PERIOD,
        )?;
        if let Some(budget) = nodelet.local_storage_entry_budget {
            if budget == 0 {
                return Err(self.file_err("nodelet.localStorageEntryBudget", "must be positive".into()));
            }
            eviction.local_storage_entry_budget = budget;
        }
        Ok(eviction)
    }

    /// Image garbage collection: the file's thresholds and `nodelet.imageGCPeriod`.
    pub(super) fn image_gc_config(
        &self,
        raw: &RawKubeletConfiguration,
        nodelet: &RawNodelet,
    ) -> Result<ImageGcConfig, ConfigError> {
        let mut image_gc = self.image_gc(raw)?;
        image_gc.period = self.positive_duration(
            None,
            "",
            nodelet.image_gc_period,
            "nodelet.imageGCPeriod",
            DEFAULT_IMAGE_GC_PERIOD,
        )?;
        Ok(image_gc)
    }

    /// Container log rotation.
    pub(super) fn container_logs(
        &self,
        raw: &RawKubeletConfiguration,
    ) -> Result<ContainerLogConfig, ConfigError> {
        let container_logs = ContainerLogConfig {
            max_size: match &raw.container_log_max_size {
                Some(s) => {
                    parse_quantity(s).map_err(|e| self.file_err("containerLogMaxSize", e.to_string()))?
                }
                None => DEFAULT_CONTAINER_LOG_MAX_SIZE,
            },
            max_files: match raw.container_log_max_files {
                Some(n) => u32::try_from(n).ok().filter(|n| *n >= 2).ok_or_else(|| {
                    self.file_err("containerLogMaxFiles", format!("{n} must be at least 2"))
                })?,
                None => DEFAULT_CONTAINER_LOG_MAX_FILES,
            },
            monitor_interval: match raw.container_log_monitor_interval {
                Some(d) if d.0 < MIN_CONTAINER_LOG_MONITOR_INTERVAL => {
                    return Err(self
                        .file_err("containerLogMonitorInterval", format!("{:?} must be at least 3s", d.0)));
                }
                Some(d) => d.0,
                None => DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL,
            },
        };
        Ok(container_logs)
    }

    /// Image pull parallelism; warns about the fields parsed but not enforced yet ([`NOT_YET_ENFORCED`]).
    pub(super) fn image_pulls(
        &self,
        raw: &RawKubeletConfiguration,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<ImagePullConfig, ConfigError> {
        let serialize = raw.serialize_image_pulls.unwrap_or(true);
        let max_parallel =
            match raw.max_parallel_image_pulls {
                Some(n) => Some(u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                    self.file_err("maxParallelImagePulls", format!("{n} must be at least 1"))
                })?),
                None => None,
            };
        if serialize && max_parallel.is_some_and(|n| n > 1) {
            return Err(self.file_err(
                "maxParallelImagePulls",
                "must be unset or 1 when serializeImagePulls is true".into(),
            ));
        }
        let image_pulls = ImagePullConfig { serialize, max_parallel };
        for field in NOT_YET_ENFORCED {
            if self.file.is_some() && raw_field_set(raw, field) {
                warnings.push(ConfigWarning {
                    field: (*field).to_owned(),
                    message: "parsed and validated, but not enforced yet by this nodelet version".into(),
                });
            }
        }
        Ok(image_pulls)
    }
}
